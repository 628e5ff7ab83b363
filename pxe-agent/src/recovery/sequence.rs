//! [`Sequencer`]: storm-aware ordering of BMC actions across hosts. Owns
//! the queue between the controller and the executor, the limit on
//! actions running at once, the rate of power-ups, and holding power-ups
//! while the boot chain is busy (too many hosts awaiting a stage, or the
//! DHCP slow path receiving more than a threshold); and the counts of
//! why power-ups waited. Powering a rack at once makes every host DHCP,
//! TFTP and fetch its kernel in the same minute; sequencing keeps a
//! recovery of hundreds of hosts from being the outage it repairs.
//!
//! Several agents (`--peers kube`) keep the limits for the fleet, not
//! each for itself ([`Sequencer::set_fleet`]): the concurrency limit is
//! divided among the live agents, and power-ups go in turns: time is cut
//! into cells of `power_up_burst / power_ups_per_second`, cell `k` belongs
//! to the agent of rank `k mod n`, and an agent starts at most
//! `power_up_burst` power-ups in the first tenth of a cell of its own.
//! Over the fleet that is the rate and burst of one agent, with bursts at
//! least nine tenths of a cell apart, as long as the nodes' clocks agree
//! to well within a cell (NTP). The awaiting gate counts the fleet's hosts
//! already: the controller holds every host's record, its own and those
//! the owners share.
//!
//! Like the controller it is pure: `now_ms` is passed in, nothing sleeps.
//! It does not know what actions do beyond [`ActionKind::is_power`].

use std::collections::{BTreeMap, VecDeque};

use super::{Action, ActionKind};
use crate::mac::MacAddr;

/// The sequencing knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SequencePolicy {
    /// Actions running at once, across all BMCs.
    pub max_in_flight: usize,
    /// Power-ups per second, on average.
    pub power_ups_per_second: f64,
    /// Power-ups allowed back to back before the rate applies.
    pub power_up_burst: u32,
    /// Hold power-ups while this many hosts are awaiting a boot stage
    /// (power-ups running count too: their hosts are about to be).
    pub max_awaiting: usize,
    /// Hold power-ups while the DHCP slow path receives more requests per
    /// second than this.
    pub max_slow_path_rate: f64,
}

impl Default for SequencePolicy {
    fn default() -> Self {
        SequencePolicy {
            max_in_flight: 16,
            power_ups_per_second: 2.0,
            power_up_burst: 1,
            max_awaiting: 64,
            max_slow_path_rate: 2000.0,
        }
    }
}

/// What the agent measures that the sequencer cannot.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Load {
    /// Hosts in an `awaiting-*` state ([`Controller::awaiting`](super::Controller::awaiting)).
    pub awaiting: usize,
    /// Requests per second reaching the DHCP slow path, recently.
    pub slow_path_rate: f64,
}

/// Why a queued action waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Gate {
    /// `max_in_flight` actions were running.
    Concurrency,
    /// The power-up rate was used up.
    Rate,
    /// Too many hosts were awaiting a boot stage.
    Awaiting,
    /// The slow path was too busy.
    SlowPath,
}

impl Gate {
    pub const ALL: [Gate; 4] = [
        Gate::Concurrency,
        Gate::Rate,
        Gate::Awaiting,
        Gate::SlowPath,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Gate::Concurrency => "concurrency",
            Gate::Rate => "rate",
            Gate::Awaiting => "awaiting",
            Gate::SlowPath => "slow-path",
        }
    }
}

/// Counters for metrics.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SequenceStats {
    pub queued: usize,
    pub in_flight: usize,
    /// Actions that waited, by the gate that held them (each action counts
    /// once per gate).
    pub waits: BTreeMap<Gate, u64>,
    /// Milliseconds released actions spent queued, in total.
    pub wait_ms_total: u64,
    /// Actions released.
    pub released: u64,
}

#[derive(Debug)]
struct Queued {
    action: Action,
    since_ms: u64,
    /// Gates that have held it, so each counts once.
    held: Vec<Gate>,
}

/// The queue of actions waiting to run. See the module documentation.
#[derive(Debug)]
pub struct Sequencer {
    policy: SequencePolicy,
    queue: VecDeque<Queued>,
    /// Running actions by host (at most one per host).
    running: BTreeMap<MacAddr, ActionKind>,
    /// Generic cell rate algorithm: the theoretical time, in microseconds,
    /// at which the next power-up conforms (RFC 2697's token bucket
    /// expressed as a schedule, exact with integers).
    tat_us: u64,
    /// This agent's rank among the live agents and how many are live.
    fleet: (usize, usize),
    /// With peers: the power-up cell last used and the power-ups started
    /// in it.
    cell: (u64, u32),
    stats: SequenceStats,
}

impl Sequencer {
    pub fn new(policy: SequencePolicy) -> Sequencer {
        Sequencer {
            policy,
            queue: VecDeque::new(),
            running: BTreeMap::new(),
            tat_us: 0,
            fleet: (0, 1),
            cell: (u64::MAX, 0),
            stats: SequenceStats::default(),
        }
    }

    /// This agent is `rank` of `live` agents sharing the limits (see the
    /// module documentation); `(0, 1)` alone.
    pub fn set_fleet(&mut self, rank: usize, live: usize) {
        let live = live.max(1);
        self.fleet = (rank.min(live - 1), live);
    }

    /// Actions this agent may run at once: its part of `max_in_flight`,
    /// the remainder going to the lowest ranks, and at least one, so that
    /// an agent never stops acting (with more agents than the limit, the
    /// fleet runs one an agent).
    pub fn max_in_flight(&self) -> usize {
        let (rank, n) = self.fleet;
        let max = self.policy.max_in_flight;
        (max / n + usize::from(rank < max % n)).max(1)
    }

    /// How far ahead of the rate a burst may go, in microseconds.
    fn tolerance_us(&self) -> u64 {
        self.interval_us()
            .saturating_mul(u64::from(self.policy.power_up_burst.max(1) - 1))
    }

    /// Microseconds of one power-up cell with peers.
    fn cell_us(&self) -> u64 {
        self.interval_us()
            .saturating_mul(u64::from(self.policy.power_up_burst.max(1)))
    }

    /// Whether a power-up may start at `now_us` as far as the rate goes.
    fn rate_allows(&self, now_us: u64) -> bool {
        let (rank, n) = self.fleet;
        if n <= 1 {
            return self.tat_us <= now_us.saturating_add(self.tolerance_us());
        }
        let cell = self.cell_us();
        let k = now_us / cell;
        k % n as u64 == rank as u64
            && now_us % cell < cell / 10
            && (self.cell.0 != k || self.cell.1 < self.policy.power_up_burst.max(1))
    }

    /// Takes the rate's part of a power-up started at `now_us`.
    fn rate_take(&mut self, now_us: u64) {
        if self.fleet.1 <= 1 {
            self.tat_us = self.tat_us.max(now_us).saturating_add(self.interval_us());
            return;
        }
        let k = now_us / self.cell_us();
        self.cell = if self.cell.0 == k {
            (k, self.cell.1 + 1)
        } else {
            (k, 1)
        };
    }

    pub fn policy(&self) -> &SequencePolicy {
        &self.policy
    }

    /// Microseconds between power-ups at the configured rate.
    fn interval_us(&self) -> u64 {
        let rate = self.policy.power_ups_per_second;
        if rate.is_finite() && rate > 0.0 {
            // Truncation is fine: sub-microsecond precision is noise.
            (1_000_000.0 / rate).ceil() as u64
        } else {
            u64::MAX / 4
        }
    }

    /// Queues `action` behind those already waiting.
    pub fn push(&mut self, action: Action, now_ms: u64) {
        self.queue.push_back(Queued {
            action,
            since_ms: now_ms,
            held: Vec::new(),
        });
    }

    /// Returns the actions that may start now, in queue order, and marks
    /// them running. Actions `wanted` says no to are dropped. Actions that
    /// are not power-ups only wait for the concurrency limit; power-ups also
    /// wait for the rate and for the boot chain to calm down, and keep
    /// their order among themselves.
    pub fn release(
        &mut self,
        now_ms: u64,
        load: Load,
        mut wanted: impl FnMut(&Action) -> bool,
    ) -> Vec<Action> {
        self.queue.retain(|q| wanted(&q.action));
        let policy = self.policy;
        let now_us = now_ms.saturating_mul(1000);
        let max_in_flight = self.max_in_flight();
        let mut power_running = self.running.values().filter(|k| k.is_power()).count();
        let mut out = Vec::new();
        // The gate holding the first held power-up: every later one waits
        // behind it, for the same reason, so that they keep their order.
        let mut power_held: Option<Gate> = None;
        let mut keep = VecDeque::with_capacity(self.queue.len());
        while let Some(mut q) = self.queue.pop_front() {
            let is_power = q.action.kind.is_power();
            let gate = if self.running.len() >= max_in_flight {
                Some(Gate::Concurrency)
            } else if self.running.contains_key(&q.action.mac) {
                // Not a limit, only one call at a time per BMC: not counted.
                keep.push_back(q);
                continue;
            } else if !is_power {
                None
            } else if power_held.is_some() {
                power_held
            } else if load.awaiting + power_running >= policy.max_awaiting {
                Some(Gate::Awaiting)
            } else if load.slow_path_rate > policy.max_slow_path_rate {
                Some(Gate::SlowPath)
            } else if !self.rate_allows(now_us) {
                Some(Gate::Rate)
            } else {
                None
            };
            if let Some(gate) = gate {
                if !q.held.contains(&gate) {
                    q.held.push(gate);
                    *self.stats.waits.entry(gate).or_default() += 1;
                }
                if is_power {
                    power_held = Some(gate);
                }
                keep.push_back(q);
                continue;
            }
            if q.action.kind.is_power() {
                self.rate_take(now_us);
                power_running += 1;
            }
            self.running.insert(q.action.mac, q.action.kind);
            self.stats.wait_ms_total += now_ms.saturating_sub(q.since_ms);
            self.stats.released += 1;
            out.push(q.action);
        }
        self.queue = keep;
        out
    }

    /// `action` finished (whatever its result): its slot is free.
    pub fn finished(&mut self, action: &Action) {
        self.running.remove(&action.mac);
    }

    /// When a power-up held only by the rate may go, unix milliseconds
    /// after `now_ms`: a timer for the agent's loop. `None` when no
    /// power-up is queued, or when the rate already allows one at `now_ms`:
    /// then another limit holds it, and the event that lifts that limit
    /// (an action finishing, a host leaving an awaiting state, a poll of
    /// the slow path) wakes the loop; a time in the past would only make
    /// it spin.
    pub fn next_release_ms(&self, now_ms: u64) -> Option<u64> {
        if !self.queue.iter().any(|q| q.action.kind.is_power()) {
            return None;
        }
        let (rank, n) = self.fleet;
        let at = if n <= 1 {
            self.tat_us
                .saturating_sub(self.tolerance_us())
                .div_ceil(1000)
        } else {
            let now_us = now_ms.saturating_mul(1000);
            if self.rate_allows(now_us) {
                return None;
            }
            // The start of our next cell after this one.
            let (n, rank) = (n as u64, rank as u64);
            let k = now_us / self.cell_us() + 1;
            let ours = k + (rank + n - k % n) % n;
            ours.saturating_mul(self.cell_us()).div_ceil(1000)
        };
        (at > now_ms).then_some(at)
    }

    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    pub fn in_flight(&self) -> usize {
        self.running.len()
    }

    pub fn stats(&self) -> SequenceStats {
        SequenceStats {
            queued: self.queue.len(),
            in_flight: self.running.len(),
            ..self.stats.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bmc::{BootDevice, BootTarget};

    fn mac(n: u16) -> MacAddr {
        let [a, b] = n.to_be_bytes();
        MacAddr([2, 0, 0, 0, a, b])
    }

    fn power(n: u16) -> Action {
        Action {
            mac: mac(n),
            kind: ActionKind::PowerUp,
            epoch: 1,
        }
    }

    fn boot_device(n: u16) -> Action {
        Action {
            mac: mac(n),
            kind: ActionKind::SetBootDevice(BootTarget {
                device: BootDevice::Pxe,
                persistent: false,
                efi: false,
            }),
            epoch: 1,
        }
    }

    fn policy() -> SequencePolicy {
        SequencePolicy {
            max_in_flight: 100,
            power_ups_per_second: 2.0,
            power_up_burst: 1,
            max_awaiting: 1000,
            max_slow_path_rate: 100.0,
        }
    }

    /// Runs the fake clock from 0 in steps of `step_ms` until `end_ms`,
    /// finishing every action at once, and returns (time, action) of each
    /// release.
    fn run(
        seq: &mut Sequencer,
        end_ms: u64,
        step_ms: u64,
        mut load: impl FnMut(u64, usize) -> Load,
    ) -> Vec<(u64, Action)> {
        let mut released = Vec::new();
        let mut now = 0;
        while now <= end_ms {
            let powered = released
                .iter()
                .filter(|(_, a): &&(u64, Action)| a.kind.is_power())
                .count();
            for action in seq.release(now, load(now, powered), |_| true) {
                seq.finished(&action);
                released.push((now, action));
            }
            now += step_ms;
        }
        released
    }

    #[test]
    fn power_ups_keep_to_the_rate() {
        let mut seq = Sequencer::new(policy());
        for n in 0..10 {
            seq.push(power(n), 0);
        }
        let times: Vec<u64> = run(&mut seq, 10_000, 10, |_, _| Load::default())
            .iter()
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(
            times,
            [0, 500, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500]
        );
        assert_eq!(seq.stats().waits.get(&Gate::Rate), Some(&9));
        assert_eq!(
            seq.stats().wait_ms_total,
            (0..10u64).map(|n| n * 500).sum::<u64>()
        );
    }

    #[test]
    fn a_burst_goes_at_once_then_the_rate_applies() {
        let mut seq = Sequencer::new(SequencePolicy {
            power_up_burst: 3,
            power_ups_per_second: 1.0,
            ..policy()
        });
        for n in 0..5 {
            seq.push(power(n), 0);
        }
        let times: Vec<u64> = run(&mut seq, 10_000, 100, |_, _| Load::default())
            .iter()
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(times, [0, 0, 0, 1000, 2000]);
    }

    #[test]
    fn in_any_window_no_more_power_ups_than_the_rate_allows() {
        let mut seq = Sequencer::new(SequencePolicy {
            power_ups_per_second: 5.0,
            ..policy()
        });
        // Arrivals spread unevenly over the run.
        let mut now = 0;
        let mut times = Vec::new();
        let mut next = 0u16;
        while now <= 20_000 {
            if now % 700 == 0 && next < 60 {
                for _ in 0..3 {
                    seq.push(power(next), now);
                    next += 1;
                }
            }
            for action in seq.release(now, Load::default(), |_| true) {
                seq.finished(&action);
                times.push(now);
            }
            now += 7;
        }
        assert_eq!(times.len(), 60);
        for pair in times.windows(2) {
            assert!(pair[1] - pair[0] >= 200, "{pair:?}");
        }
    }

    #[test]
    fn the_release_timer_is_set_only_while_the_rate_holds() {
        let mut seq = Sequencer::new(SequencePolicy {
            max_awaiting: 1,
            ..policy()
        });
        assert_eq!(seq.next_release_ms(0), None, "nothing queued");
        seq.push(power(0), 0);
        seq.push(power(1), 0);
        seq.push(power(2), 0);
        assert_eq!(seq.release(0, Load::default(), |_| true), [power(0)]);
        // power(0) runs: the awaiting limit (1) holds the rest, and the
        // rate's slot at 500 ms is still ahead.
        assert_eq!(seq.next_release_ms(100), Some(500));
        assert!(seq.release(600, Load::default(), |_| true).is_empty());
        // The rate allows one now; only the awaiting limit holds it.
        assert_eq!(seq.next_release_ms(600), None);
        seq.finished(&power(0));
        assert_eq!(seq.release(700, Load::default(), |_| true), [power(1)]);
        assert_eq!(seq.next_release_ms(700), Some(1200));
    }

    #[test]
    fn concurrency_limit_holds_actions_until_one_finishes() {
        let mut seq = Sequencer::new(SequencePolicy {
            max_in_flight: 2,
            ..policy()
        });
        for n in 0..4 {
            seq.push(boot_device(n), 0);
        }
        let first = seq.release(0, Load::default(), |_| true);
        assert_eq!(first, [boot_device(0), boot_device(1)]);
        assert!(seq.release(10, Load::default(), |_| true).is_empty());
        assert_eq!(seq.in_flight(), 2);
        seq.finished(&first[0]);
        assert_eq!(seq.release(20, Load::default(), |_| true), [boot_device(2)]);
        assert_eq!(seq.stats().waits.get(&Gate::Concurrency), Some(&2));
        assert_eq!(seq.queue_len(), 1);
    }

    #[test]
    fn power_ups_wait_while_too_many_hosts_are_awaiting() {
        let mut seq = Sequencer::new(SequencePolicy {
            max_awaiting: 3,
            power_ups_per_second: 1000.0,
            power_up_burst: 10,
            ..policy()
        });
        for n in 0..6 {
            seq.push(power(n), 0);
        }
        // Every powered host awaits its boot for 5 s, then is done.
        let released = run(&mut seq, 20_000, 100, |now, _| {
            Load {
                awaiting: 0,
                slow_path_rate: 0.0,
            }
            .with_awaiting(now)
        });
        let times: Vec<u64> = released.iter().map(|(t, _)| *t).collect();
        assert_eq!(times, [0, 0, 0, 5000, 5000, 5000]);
        assert_eq!(seq.stats().waits.get(&Gate::Awaiting), Some(&3));
    }

    impl Load {
        /// Three hosts awaiting from 0 to 5 s, none after.
        fn with_awaiting(self, now: u64) -> Load {
            Load {
                awaiting: if (1..5000).contains(&now) { 3 } else { 0 },
                ..self
            }
        }
    }

    #[test]
    fn power_ups_wait_while_the_slow_path_is_busy_but_others_do_not() {
        let mut seq = Sequencer::new(policy());
        seq.push(power(1), 0);
        seq.push(boot_device(2), 0);
        let busy = Load {
            awaiting: 0,
            slow_path_rate: 500.0,
        };
        assert_eq!(seq.release(0, busy, |_| true), [boot_device(2)]);
        assert!(seq.release(1000, busy, |_| true).is_empty());
        assert_eq!(
            seq.release(2000, Load::default(), |_| true),
            [power(1)],
            "released once the slow path calmed down"
        );
        assert_eq!(seq.stats().waits.get(&Gate::SlowPath), Some(&1));
        assert_eq!(seq.stats().wait_ms_total, 2000);
    }

    #[test]
    fn power_ups_keep_their_order_and_unwanted_ones_are_dropped() {
        let mut seq = Sequencer::new(policy());
        for n in 0..3 {
            seq.push(power(n), 0);
        }
        let order: Vec<MacAddr> = run(&mut seq, 5000, 50, |_, _| Load::default())
            .iter()
            .map(|(_, a)| a.mac)
            .collect();
        assert_eq!(order, [mac(0), mac(1), mac(2)]);
        let mut seq = Sequencer::new(policy());
        seq.push(power(0), 0);
        seq.push(power(1), 0);
        assert!(
            seq.release(0, Load::default(), |a| a.mac != mac(0))
                .iter()
                .all(|a| a.mac == mac(1))
        );
        assert_eq!(seq.queue_len(), 0);
    }

    #[test]
    fn one_action_per_host_at_a_time() {
        let mut seq = Sequencer::new(policy());
        seq.push(boot_device(1), 0);
        seq.push(boot_device(1), 0);
        let first = seq.release(0, Load::default(), |_| true);
        assert_eq!(first.len(), 1);
        assert!(seq.release(1, Load::default(), |_| true).is_empty());
        seq.finished(&first[0]);
        assert_eq!(seq.release(2, Load::default(), |_| true).len(), 1);
    }

    #[test]
    fn two_agents_keep_the_fleet_rate_and_concurrency() {
        let policy = SequencePolicy {
            max_in_flight: 3,
            power_up_burst: 2,
            ..policy()
        };
        let mut agents = [Sequencer::new(policy), Sequencer::new(policy)];
        for (rank, seq) in agents.iter_mut().enumerate() {
            seq.set_fleet(rank, 2);
            for n in 0..20 {
                seq.push(power(n + 100 * rank as u16), 0);
            }
        }
        // Concurrency: 2 + 1, the remainder to rank 0.
        assert_eq!(agents[0].max_in_flight(), 2);
        assert_eq!(agents[1].max_in_flight(), 1);
        // Both run on one clock, each finishing its actions at once.
        let mut times = Vec::new();
        let mut now = 0;
        while now <= 12_000 {
            for seq in &mut agents {
                for action in seq.release(now, Load::default(), |_| true) {
                    seq.finished(&action);
                    times.push(now);
                }
                if let Some(at) = seq.next_release_ms(now) {
                    assert!(at > now);
                }
            }
            now += 10;
        }
        assert!(times.len() >= 20, "{times:?}");
        // Fleet-wide, in any window of T ms: at most burst + T * rate.
        for (i, &start) in times.iter().enumerate() {
            for window in [1u64, 500, 1000, 3000] {
                let n = times[i..]
                    .iter()
                    .take_while(|&&t| t < start + window)
                    .count();
                let allowed = 2 + (window as f64 * 2.0 / 1000.0).floor() as usize;
                assert!(
                    n <= allowed,
                    "{n} power-ups in {window} ms from {start}: {times:?}"
                );
            }
        }
        // Turns: rank 0 in cells 0, 2, ...; rank 1 in 1, 3, ... (cells of
        // 1 s); rank 1 runs one at a time, so its second waits a step.
        assert_eq!(&times[..4], &[0, 0, 1000, 1010]);
        // Three agents with a limit of one run one each: never none.
        let mut lone = Sequencer::new(SequencePolicy {
            max_in_flight: 1,
            ..policy
        });
        lone.set_fleet(2, 3);
        assert_eq!(lone.max_in_flight(), 1);
    }
}

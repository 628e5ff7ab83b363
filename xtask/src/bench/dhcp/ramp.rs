//! The measurement of one server under one load: a bounded ramp of fixed
//! rates, a few seconds each, up to the first rate that drops more than 1%
//! of its exchanges (or that the generator cannot send), then one run as
//! fast as the generator can send, which is the clean rate when it drops
//! no more than 1% either.
//!
//! Loads that need a fresh server per run (the pool load) restart it, with
//! an empty lease database, before every run and wait until it answers.
//!
//! Owns the ramp's rules and the progress lines; single runs belong to
//! [`super::load`].

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicU64, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{
    cpu,
    hosts::Setup,
    load::{CLEAN_DROP_PCT, LoadKind, Runner, Sample},
    reply6,
    server::{Server, ServerKind},
};

/// Between runs, so queues left by an overloaded step are gone.
const SETTLE: Duration = Duration::from_millis(300);
/// Other work on the machine (cores' worth) that makes a run noisy: it is
/// waited out before a run, and a run that met it anyway is repeated.
pub const NOISE: f64 = 0.2;
const QUIET_WAIT: Duration = Duration::from_secs(20);
/// All the waiting and repeating one bench run may spend on noise.
pub const NOISE_BUDGET: Duration = Duration::from_secs(150);
/// Rates tried, highest first, when the ramp's first rate is not clean.
const BELOW_RAMP: [u32; 4] = [500, 200, 100, 50];
/// Runs of one step at most, when the machine stays noisy.
pub const ATTEMPTS: usize = 3;

/// Rates and durations of one benchmark run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Reservation counts for the fast-path loads (direct, relayed).
    pub hosts: Vec<usize>,
    /// Reservation counts for the slow-path loads (pool, iPXE).
    pub slow_hosts: Vec<usize>,
    pub servers: Vec<ServerKind>,
    pub loads: Vec<LoadKind>,
    /// The direct load's ramp, and the iPXE load's.
    pub direct_rates: Vec<u32>,
    /// perfdhcp's ramp, DHCPv4 and DHCPv6.
    pub relayed_rates: Vec<u32>,
    /// The direct ramp up to the rates whose runs fit in the pool.
    pub pool_rates: Vec<u32>,
    /// Whole seconds (perfdhcp's period has no fraction).
    pub step: Duration,
    pub max_run: Duration,
}

impl Plan {
    pub fn rates(&self, load: LoadKind) -> &[u32] {
        match load {
            LoadKind::Direct | LoadKind::RelayedLoadgen | LoadKind::Ipxe => &self.direct_rates,
            LoadKind::Relayed | LoadKind::Dhcpv6 => &self.relayed_rates,
            LoadKind::Pool => &self.pool_rates,
        }
    }

    /// Every reservation count measured, smallest first.
    pub fn all_hosts(&self) -> Vec<usize> {
        let mut all: Vec<usize> = self.hosts.iter().chain(&self.slow_hosts).copied().collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// The loads measured with `hosts` reservations in `setup`.
    pub fn loads_for(&self, hosts: usize, setup: Setup) -> Vec<LoadKind> {
        self.loads
            .iter()
            .copied()
            .filter(|l| l.setup() == setup)
            .filter(|l| {
                let counts = if l.at_slow_hosts() {
                    &self.slow_hosts
                } else {
                    &self.hosts
                };
                counts.contains(&hosts)
            })
            .collect()
    }
}

/// Why the ramp stopped.
#[derive(Clone, Debug, PartialEq)]
pub enum Stop {
    /// This rate dropped more than [`CLEAN_DROP_PCT`].
    Drops { rate: u32, drop_pct: f64 },
    /// At this rate the generator, not the server, was the limit.
    GeneratorBound { rate: u32, why: String },
    /// Every rate of the plan was clean.
    EndOfRamp,
    /// Even the run as fast as the generator can send was clean, and it
    /// answered more than any step: it is the clean rate, and the
    /// generator is the limit.
    FlatOutClean,
}

/// One server × host count × load.
#[derive(Clone, Debug)]
pub struct Measurement {
    pub hosts: usize,
    pub server: ServerKind,
    pub load: LoadKind,
    /// The highest clean step, or the flat-out run when it was clean.
    pub clean: Option<Sample>,
    pub stop: Option<Stop>,
    /// Every fixed-rate step, in the order run.
    pub steps: Vec<Sample>,
    /// The run as fast as the generator can send.
    pub max: Option<Sample>,
    pub error: Option<String>,
    /// The DHCPv6 load: what the server's answers carried in a check run.
    pub check: Option<reply6::Check>,
}

impl Measurement {
    pub fn new(hosts: usize, server: ServerKind, load: LoadKind) -> Measurement {
        Measurement {
            hosts,
            server,
            load,
            clean: None,
            stop: None,
            steps: Vec::new(),
            max: None,
            error: None,
            check: None,
        }
    }

    pub fn failed(hosts: usize, server: ServerKind, load: LoadKind, error: String) -> Measurement {
        Measurement {
            error: Some(error),
            ..Measurement::new(hosts, server, load)
        }
    }

    /// The clean step at `rate`, if the ramp ran one.
    pub fn clean_at(&self, rate: u32) -> Option<&Sample> {
        self.steps
            .iter()
            .find(|s| s.rate == Some(rate) && s.drop_pct() <= CLEAN_DROP_PCT)
    }

    /// The step that stopped the ramp was disturbed by other work on the
    /// machine, so the clean rate may be too low.
    pub fn stopped_by_noise(&self) -> bool {
        let stopped = matches!(
            self.stop,
            Some(Stop::Drops { .. } | Stop::GeneratorBound { .. })
        );
        stopped && self.steps.last().is_some_and(noisy)
    }

    /// The clean rate is the generator's limit, not the server's.
    pub fn clean_generator_bound(&self) -> bool {
        matches!(
            self.stop,
            Some(Stop::GeneratorBound { .. } | Stop::FlatOutClean)
        ) && self.clean.is_some()
    }

    /// The clean rate is the top of the ramp: the server may do more.
    pub fn clean_at_top(&self) -> bool {
        self.stop == Some(Stop::EndOfRamp) && self.clean.is_some()
    }

    /// pxe-agent's counters summed over every run of the measurement;
    /// `None` for the peers.
    pub fn agent_counters(&self) -> Option<BTreeMap<String, u64>> {
        let mut sum: Option<BTreeMap<String, u64>> = None;
        for agent in self
            .steps
            .iter()
            .chain(&self.max)
            .filter_map(|s| s.agent.as_ref())
        {
            let sum = sum.get_or_insert_with(BTreeMap::new);
            for (name, value) in agent {
                *sum.entry(name.clone()).or_default() += value;
            }
        }
        sum
    }

    /// Flat out, the server answered nearly all the generator sent, or
    /// the drops were the client's own.
    pub fn max_generator_bound(&self) -> bool {
        self.max
            .as_ref()
            .is_some_and(|max| max.drop_pct() <= CLEAN_DROP_PCT || max.generator_limit().is_some())
    }
}

/// Ramps `load` against `server`, then runs it flat out.
pub fn measure(
    runner: &Runner<'_>,
    server: &mut Server,
    plan: &Plan,
    hosts: usize,
    load: LoadKind,
) -> Measurement {
    let mut m = Measurement::new(hosts, server.kind, load);
    let result = ramp_up(runner, server, plan, &mut m)
        .and_then(|()| {
            let first_failed = m.clean.is_none() && matches!(m.stop, Some(Stop::Drops { .. }));
            if first_failed {
                descend(runner, server, plan, load, &mut m)
            } else {
                Ok(())
            }
        })
        .and_then(|()| {
            let sample = step(runner, server, load, None, plan.max_run)?;
            progress(&m, &sample);
            let above = m
                .clean
                .as_ref()
                .is_none_or(|c| sample.exchanges_per_s() > c.exchanges_per_s());
            if sample.drop_pct() <= CLEAN_DROP_PCT && above {
                m.clean = Some(sample.clone());
                m.stop = Some(Stop::FlatOutClean);
            }
            m.max = Some(sample);
            Ok(())
        });
    if let Err(err) = result {
        m.error = Some(format!("{err:#}"));
    }
    m
}

/// Steps up the plan's rates until one is not clean or the generator is
/// the limit; records the highest clean step and why the ramp stopped.
fn ramp_up(
    runner: &Runner<'_>,
    server: &mut Server,
    plan: &Plan,
    m: &mut Measurement,
) -> anyhow::Result<()> {
    for &rate in plan.rates(m.load) {
        let sample = step(runner, server, m.load, Some(rate), plan.step)?;
        progress(m, &sample);
        m.steps.push(sample.clone());
        let limit = sample.generator_limit();
        if sample.drop_pct() > CLEAN_DROP_PCT {
            m.stop = Some(match limit {
                Some(why) => Stop::GeneratorBound { rate, why },
                None => Stop::Drops {
                    rate,
                    drop_pct: sample.drop_pct(),
                },
            });
            return Ok(());
        }
        m.clean = Some(sample);
        if let Some(why) = limit {
            m.stop = Some(Stop::GeneratorBound { rate, why });
            return Ok(());
        }
    }
    m.stop = Some(Stop::EndOfRamp);
    Ok(())
}

/// When even the ramp's first rate drops too much, tries lower ones
/// ([`BELOW_RAMP`]) until one is clean.
fn descend(
    runner: &Runner<'_>,
    server: &mut Server,
    plan: &Plan,
    load: LoadKind,
    m: &mut Measurement,
) -> anyhow::Result<()> {
    let first = plan.rates(load).first().copied().unwrap_or(0);
    for &rate in BELOW_RAMP.iter().filter(|&&r| r < first) {
        let sample = step(runner, server, load, Some(rate), plan.step)?;
        progress(m, &sample);
        m.steps.push(sample.clone());
        if sample.drop_pct() <= CLEAN_DROP_PCT {
            m.clean = Some(sample);
            return Ok(());
        }
        m.stop = Some(Stop::Drops {
            rate,
            drop_pct: sample.drop_pct(),
        });
    }
    Ok(())
}

/// One run at `rate`; repeated while other work on the machine disturbed
/// it, keeping the least disturbed.
fn step(
    runner: &Runner<'_>,
    server: &mut Server,
    load: LoadKind,
    rate: Option<u32>,
    duration: Duration,
) -> anyhow::Result<Sample> {
    let mut best: Option<Sample> = None;
    for attempt in 1..=ATTEMPTS {
        if load.fresh_server_per_run() {
            server.restart(runner.bed, runner.bins)?;
            wait_answering(runner, server, false)?;
        }
        thread::sleep(SETTLE);
        wait_quiet()?;
        server.check_alive()?;
        runner.bed.check_peer()?;
        let started = Instant::now();
        let sample = runner.run(server, load, rate, duration)?;
        server.check_alive()?;
        let noisy = noisy(&sample);
        let retry = noisy && attempt < ATTEMPTS && spend_noise_budget(started.elapsed());
        if noisy {
            println!(
                "bench: other work used {:.0}% of a core during that run{}",
                sample.other_load() * 100.0,
                if retry { "; repeating it" } else { "" }
            );
        }
        if best
            .as_ref()
            .is_none_or(|b| sample.other_load() < b.other_load())
        {
            best = Some(sample);
        }
        if !retry {
            break;
        }
    }
    best.context("no run")
}

/// Probes until the server completes an exchange: a server can be up, and
/// its port bound, long before it answers (dnsmasq loading 50,000 hosts).
pub fn wait_answering(runner: &Runner<'_>, server: &mut Server, say: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    let timeout = server.kind.answer_timeout();
    loop {
        server.check_alive()?;
        if runner.probe(server.setup())? {
            if say {
                println!(
                    "bench: {} answers ({:.1} s after start)",
                    server.kind.name(),
                    started.elapsed().as_secs_f64()
                );
            }
            return Ok(());
        }
        if started.elapsed() >= timeout {
            bail!(
                "{} did not answer within {} s; log:\n{}",
                server.kind.name(),
                timeout.as_secs(),
                server.log_tail()
            );
        }
        thread::sleep(Duration::from_millis(500));
    }
}

/// Time this process has spent waiting out and repeating noisy runs, in
/// milliseconds; past [`NOISE_BUDGET`] it does neither, so a busy machine
/// cannot stretch a run without bound.
static NOISE_SPENT_MS: AtomicU64 = AtomicU64::new(0);

/// Charges `spent` to the noise budget; false once it is used up.
fn spend_noise_budget(spent: Duration) -> bool {
    let ms = u64::try_from(spent.as_millis()).unwrap_or(u64::MAX);
    let before = NOISE_SPENT_MS.fetch_add(ms, Ordering::Relaxed);
    u128::from(before) < NOISE_BUDGET.as_millis()
}

/// Waits for a quiet machine, within the noise budget.
fn wait_quiet() -> anyhow::Result<()> {
    let left = NOISE_BUDGET
        .saturating_sub(Duration::from_millis(
            NOISE_SPENT_MS.load(Ordering::Relaxed),
        ))
        .min(QUIET_WAIT);
    let started = Instant::now();
    let quiet = cpu::wait_quiet(NOISE, left)?;
    spend_noise_budget(started.elapsed());
    if !quiet {
        println!("bench: the machine stayed busy; running anyway");
    }
    Ok(())
}

/// More than [`NOISE`] of other work ran alongside.
pub fn noisy(sample: &Sample) -> bool {
    sample.other_load() > NOISE
}

fn progress(m: &Measurement, s: &Sample) {
    let rate = s
        .rate
        .map_or_else(|| "max".to_owned(), |r| format!("{r}/s"));
    let per_1k = |cpu| s.per_1k(cpu).map_or("-".to_owned(), |v| format!("{v:.4}"));
    println!(
        "bench: {:>6} hosts {:<9} {:<7} {:>8}: sent {:>8.0}/s answered {:>8.0}/s drops {:>6.2}% \
         avg {:>8.0} µs max {:>8.0} µs | CPU s/1k server {} (process {}) machine-client {} | \
         load: client {:.0}% server {:.0}% other {:.0}%",
        m.hosts,
        m.server.name(),
        m.load.short(),
        rate,
        s.discovers_per_s(),
        s.exchanges_per_s(),
        s.drop_pct(),
        s.avg_latency.as_secs_f64() * 1e6,
        s.max_latency.as_secs_f64() * 1e6,
        per_1k(s.server_cpu()),
        per_1k(s.server_process_cpu),
        per_1k(s.machine_minus_client()),
        s.client_load() * 100.0,
        s.server_load() * 100.0,
        s.other_load() * 100.0,
    );
}

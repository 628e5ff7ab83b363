//! Recovery scenarios against the fake BMC: the controller, sequencer and
//! executor driven together by a fake clock.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use super::*;
use crate::{
    bmc::{
        BmcError, BootDevice, BootFlags, PowerAction, PowerState,
        fake::{Boot, Call, FakeBmc, Seen},
    },
    inventory::{AfterBoot, RecoverySettings, StageDeadlines},
};

const T0: u64 = 1_700_000_000_000;
const MIN: u64 = 60_000;
const SEC: u64 = 1000;

fn mac(n: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0, 0, 0, n])
}

/// A directory under the temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("pxe-recovery-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn settings() -> RecoverySettings {
    RecoverySettings {
        max_attempts: 3,
        ..RecoverySettings::default()
    }
}

fn plan(settings: RecoverySettings) -> Plan {
    Plan {
        settings,
        efi: false,
        network: BootDevice::Pxe,
    }
}

fn open(dir: &TempDir) -> Controller {
    Controller::new(
        RecoveryStore::open_in(&dir.0).expect("open store"),
        Policy::default(),
    )
    .expect("load")
}

/// Controller, sequencer and executor with one fake BMC per host, and the
/// clock they share.
struct Lab {
    dir: TempDir,
    ctl: Controller,
    seq: Sequencer,
    exec: Executor<FakeBmc>,
    bmcs: BTreeMap<MacAddr, FakeBmc>,
    plans: Vec<(MacAddr, Plan)>,
    now: u64,
}

impl Lab {
    fn new(name: &str, hosts: &[(MacAddr, RecoverySettings, PowerState)]) -> Lab {
        let dir = TempDir::new(name);
        let mut ctl = open(&dir);
        let plans: Vec<(MacAddr, Plan)> = hosts.iter().map(|(m, s, _)| (*m, plan(*s))).collect();
        ctl.set_hosts(plans.clone(), T0);
        let bmcs: BTreeMap<MacAddr, FakeBmc> = hosts
            .iter()
            .map(|(m, _, power)| (*m, FakeBmc::new(format!("bmc-{m}:623"), *power)))
            .collect();
        let mut exec = Executor::new();
        exec.set_bmcs(bmcs.iter().map(|(m, b)| (*m, Arc::new(b.clone()))));
        Lab {
            dir,
            ctl,
            seq: Sequencer::new(SequencePolicy {
                power_ups_per_second: 1000.0,
                power_up_burst: 100,
                ..SequencePolicy::default()
            }),
            exec,
            bmcs,
            plans,
            now: T0,
        }
    }

    fn bmc(&self, mac: MacAddr) -> &FakeBmc {
        &self.bmcs[&mac]
    }

    fn state(&self, mac: MacAddr) -> State {
        self.ctl.status(mac).expect("known host").state
    }

    fn attempt(&self, mac: MacAddr) -> u32 {
        self.ctl.status(mac).expect("known host").attempt
    }

    /// Queues what the controller wants and starts what the sequencer
    /// releases.
    fn dispatch(&mut self) {
        for action in self.ctl.tick(self.now) {
            self.seq.push(action, self.now);
        }
        let load = Load {
            awaiting: self.ctl.awaiting(),
            slow_path_rate: 0.0,
        };
        let ctl = &self.ctl;
        for action in self.seq.release(self.now, load, |a| ctl.is_current(a)) {
            self.exec.start(action);
        }
    }

    fn feed(&mut self, done: Completion) {
        self.seq.finished(&done.action);
        self.ctl.complete(&done.action, done.result, self.now);
    }

    /// Runs ticks and BMC calls until nothing is left to do at `now`.
    async fn settle(&mut self) {
        loop {
            self.dispatch();
            if self.exec.is_idle() {
                break;
            }
            while let Some(done) = self.exec.next().await {
                self.feed(done);
            }
        }
    }

    async fn advance(&mut self, ms: u64) {
        self.now += ms;
        self.settle().await;
    }

    async fn observe(&mut self, mac: MacAddr, observation: Observation) {
        self.ctl.observe(mac, observation, self.now);
        self.settle().await;
    }

    fn path(&self) -> Vec<(State, State, Reason)> {
        self.ctl
            .snapshot()
            .iter()
            .filter_map(|s| s.last_transition)
            .map(|t| (t.from, t.to, t.reason))
            .collect()
    }
}

fn reasons(transitions: &[Transition]) -> Vec<(State, Reason)> {
    transitions.iter().map(|t| (t.to, t.reason)).collect()
}

const PXE_LEGACY: Boot = Boot {
    device: Some(BootDevice::Pxe),
    efi: false,
};

#[tokio::test(start_paused = true)]
async fn requested_recovery_of_a_running_host_reaches_booted_and_leaves_disk_persistent() {
    let host = mac(1);
    let mut lab = Lab::new("happy", &[(host, settings(), PowerState::On)]);
    lab.ctl.request(host, lab.now).expect("managed and idle");
    lab.settle().await;
    assert_eq!(lab.state(host), State::AwaitingDhcp);
    assert_eq!(
        lab.bmc(host).calls()[..2],
        [
            Seen::SetBootDevice(BootTarget {
                device: BootDevice::Pxe,
                persistent: false,
                efi: false
            }),
            Seen::PowerStatus,
        ]
    );
    assert_eq!(lab.bmc(host).calls()[2], Seen::Power(PowerAction::Cycle));
    assert_eq!(lab.bmc(host).boots(), [PXE_LEGACY], "one-time PXE used");
    assert!(!lab.bmc(host).flags().valid, "the one-time flag is cleared");

    lab.advance(40 * SEC).await;
    lab.observe(host, Observation::Dhcp).await;
    assert_eq!(lab.state(host), State::AwaitingBootFile);
    lab.observe(host, Observation::BootFile).await;
    lab.observe(host, Observation::Script).await;
    assert_eq!(lab.state(host), State::AwaitingPhoneHome);
    lab.observe(host, Observation::Artifacts).await;
    assert_eq!(lab.state(host), State::AwaitingPhoneHome);
    lab.advance(5 * MIN).await;
    lab.observe(host, Observation::PhoneHome).await;
    assert_eq!(lab.state(host), State::Booted);

    assert_eq!(
        lab.bmc(host).flags(),
        BootFlags {
            valid: true,
            persistent: true,
            efi: false,
            selector: BootDevice::Disk.selector()
        },
        "after_boot: disk, persistent, so a reboot does not reinstall"
    );
    assert!(!lab.ctl.status(host).unwrap().after_boot_pending);
    let transitions = lab.ctl.take_transitions();
    assert_eq!(
        reasons(&transitions),
        [
            (State::Recovering, Reason::Requested),
            (State::AwaitingDhcp, Reason::PowerCycled),
            (State::AwaitingBootFile, Reason::DhcpSeen),
            (State::AwaitingScript, Reason::BootFileSeen),
            (State::AwaitingPhoneHome, Reason::ScriptSeen),
            (State::Booted, Reason::PhoneHome),
        ]
    );
    assert_eq!(transitions[0].at_ms, T0);
    assert_eq!(transitions[5].at_ms, T0 + 40 * SEC + 5 * MIN);
    assert!(lab.ctl.take_transitions().is_empty(), "drained");
}

#[tokio::test(start_paused = true)]
async fn a_host_that_is_off_is_powered_on_not_cycled() {
    let host = mac(1);
    let mut lab = Lab::new("off", &[(host, settings(), PowerState::Off)]);
    lab.ctl.request(host, lab.now).unwrap();
    lab.settle().await;
    assert_eq!(lab.state(host), State::AwaitingDhcp);
    assert!(
        lab.bmc(host)
            .calls()
            .contains(&Seen::Power(PowerAction::On))
    );
    assert_eq!(
        lab.path(),
        [(State::Recovering, State::AwaitingDhcp, Reason::PoweredOn)]
    );
    assert_eq!(lab.bmc(host).boots(), [PXE_LEGACY]);
}

#[tokio::test(start_paused = true)]
async fn uefi_hosts_get_the_efi_bit() {
    let host = mac(1);
    let mut lab = Lab::new("uefi", &[(host, settings(), PowerState::On)]);
    lab.plans[0].1.efi = true;
    lab.ctl.set_hosts(lab.plans.clone(), lab.now);
    lab.ctl.request(host, lab.now).unwrap();
    lab.settle().await;
    assert_eq!(
        lab.bmc(host).boots(),
        [Boot {
            device: Some(BootDevice::Pxe),
            efi: true
        }]
    );
}

#[tokio::test(start_paused = true)]
async fn a_failing_boot_is_retried_with_doubling_backoff_then_failed() {
    let host = mac(1);
    let mut lab = Lab::new("retries", &[(host, settings(), PowerState::On)]);
    lab.ctl.request(host, lab.now).unwrap();
    lab.settle().await;
    // Attempt 1: no DHCP within 3 minutes.
    lab.advance(3 * MIN - 1).await;
    assert_eq!(lab.state(host), State::AwaitingDhcp);
    lab.advance(1).await;
    assert_eq!(lab.state(host), State::Backoff);
    assert_eq!(
        lab.ctl.status(host).unwrap().deadline_ms,
        Some(T0 + 3 * MIN + 30 * SEC),
        "first back-off is 30 s"
    );
    lab.advance(30 * SEC).await;
    assert_eq!(
        (lab.state(host), lab.attempt(host)),
        (State::AwaitingDhcp, 2)
    );
    // Attempt 2 gets further: DHCP, then no boot file.
    lab.observe(host, Observation::Dhcp).await;
    lab.advance(2 * MIN).await;
    assert_eq!(lab.state(host), State::Backoff);
    let backoff_end = lab.ctl.status(host).unwrap().deadline_ms.unwrap();
    assert_eq!(backoff_end - lab.now, 60 * SEC, "doubled");
    lab.advance(60 * SEC - 1).await;
    assert_eq!(lab.state(host), State::Backoff);
    lab.advance(1).await;
    assert_eq!(
        (lab.state(host), lab.attempt(host)),
        (State::AwaitingDhcp, 3)
    );
    // Attempt 3 of 3.
    lab.advance(3 * MIN).await;
    assert_eq!(lab.state(host), State::Failed);
    lab.advance(60 * MIN).await;
    assert_eq!(lab.state(host), State::Failed, "stays failed");
    assert_eq!(lab.bmc(host).boots().len(), 3, "one power-up per attempt");
    assert_eq!(
        reasons(&lab.ctl.take_transitions()),
        [
            (State::Recovering, Reason::Requested),
            (State::AwaitingDhcp, Reason::PowerCycled),
            (State::Backoff, Reason::DhcpTimeout),
            (State::Recovering, Reason::Retry),
            (State::AwaitingDhcp, Reason::PowerCycled),
            (State::AwaitingBootFile, Reason::DhcpSeen),
            (State::Backoff, Reason::BootFileTimeout),
            (State::Recovering, Reason::Retry),
            (State::AwaitingDhcp, Reason::PowerCycled),
            (State::Failed, Reason::DhcpTimeout),
        ]
    );
    // A failed host is recovered again on request, from attempt 1.
    lab.ctl.request(host, lab.now).unwrap();
    assert_eq!((lab.state(host), lab.attempt(host)), (State::Recovering, 1));
}

#[tokio::test(start_paused = true)]
async fn a_host_is_stalled_in_the_stage_whose_deadline_passed_until_it_gets_past_it() {
    let host = mac(1);
    let mut lab = Lab::new("stalled", &[(host, settings(), PowerState::On)]);
    let stalled = |lab: &Lab| lab.ctl.status(host).unwrap().stalled;
    let count = |lab: &Lab, stage| lab.ctl.stalled_per_stage()[&stage];
    lab.ctl.request(host, lab.now).unwrap();
    lab.settle().await;
    lab.observe(host, Observation::Dhcp).await;
    assert_eq!(lab.state(host), State::AwaitingBootFile);
    assert_eq!(stalled(&lab), None, "before its deadline");
    lab.advance(2 * MIN).await;
    assert_eq!(lab.state(host), State::Backoff);
    assert_eq!(stalled(&lab), Some(State::AwaitingBootFile));
    assert_eq!(count(&lab, State::AwaitingBootFile), 1);
    assert_eq!(count(&lab, State::AwaitingDhcp), 0);
    // The next attempt gets as far: still stuck there.
    lab.advance(30 * SEC).await;
    lab.observe(host, Observation::Dhcp).await;
    assert_eq!(lab.state(host), State::AwaitingBootFile);
    assert_eq!(stalled(&lab), Some(State::AwaitingBootFile));
    // Past it: no longer stuck.
    lab.observe(host, Observation::BootFile).await;
    assert_eq!(lab.state(host), State::AwaitingScript);
    assert_eq!(stalled(&lab), None);
    assert_eq!(count(&lab, State::AwaitingBootFile), 0);
    // The record keeps it across a restart.
    lab.advance(2 * MIN).await;
    assert_eq!(stalled(&lab), Some(State::AwaitingScript));
    drop(lab.ctl);
    let mut ctl = open(&lab.dir);
    ctl.set_hosts(lab.plans.clone(), lab.now);
    assert_eq!(
        ctl.status(host).unwrap().stalled,
        Some(State::AwaitingScript)
    );
}

#[test]
fn named_series_list_stuck_and_failed_hosts_by_name() {
    assert_eq!(
        super::metrics::render_named(&[("node-1", State::AwaitingBootFile)], &["node-2"]),
        "# HELP pxe_recovery_stalled_host_info A host stuck in a stage past its deadline (see pxe_recovery_stalled_hosts), 1 per host.\n\
         # TYPE pxe_recovery_stalled_host_info gauge\n\
         pxe_recovery_stalled_host_info{host=\"node-1\",stage=\"awaiting-boot-file\"} 1\n\
         # HELP pxe_recovery_failed_host_info A host whose recovery failed (see pxe_recovery_hosts{state=\"failed\"}), 1 per host.\n\
         # TYPE pxe_recovery_failed_host_info gauge\n\
         pxe_recovery_failed_host_info{host=\"node-2\"} 1\n"
    );
}

#[tokio::test(start_paused = true)]
async fn phone_home_deadline_is_the_recovery_deadline() {
    let host = mac(1);
    let s = RecoverySettings {
        deadline: Duration::from_secs(20 * 60),
        max_attempts: 1,
        ..settings()
    };
    let mut lab = Lab::new("phone-home", &[(host, s, PowerState::On)]);
    lab.ctl.request(host, lab.now).unwrap();
    lab.settle().await;
    lab.observe(host, Observation::Script).await;
    assert_eq!(lab.state(host), State::AwaitingPhoneHome, "skips ahead");
    lab.advance(20 * MIN - 1).await;
    assert_eq!(lab.state(host), State::AwaitingPhoneHome);
    lab.advance(1).await;
    assert_eq!(lab.state(host), State::Failed);
    assert_eq!(
        lab.path(),
        [(
            State::AwaitingPhoneHome,
            State::Failed,
            Reason::PhoneHomeTimeout
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn earlier_stages_seen_again_do_not_move_a_host_back() {
    let host = mac(1);
    let mut lab = Lab::new("no-back", &[(host, settings(), PowerState::On)]);
    lab.ctl.request(host, lab.now).unwrap();
    lab.settle().await;
    lab.observe(host, Observation::BootFile).await;
    let deadline = lab.ctl.status(host).unwrap().deadline_ms;
    lab.advance(SEC).await;
    lab.observe(host, Observation::Dhcp).await;
    assert_eq!(lab.state(host), State::AwaitingScript);
    assert_eq!(lab.ctl.status(host).unwrap().deadline_ms, deadline);
}

#[tokio::test(start_paused = true)]
async fn a_booted_host_that_stops_phoning_home_is_recovered_by_the_watchdog() {
    let host = mac(1);
    let s = RecoverySettings {
        heartbeat: Some(Duration::from_secs(5 * 60)),
        ..settings()
    };
    let mut lab = Lab::new("watchdog", &[(host, s, PowerState::On)]);
    lab.observe(host, Observation::PhoneHome).await;
    assert_eq!(lab.state(host), State::Booted);
    assert!(
        lab.bmc(host).calls().is_empty(),
        "a host that booted by itself gets no after-boot change"
    );
    for _ in 0..3 {
        lab.advance(4 * MIN).await;
        lab.observe(host, Observation::PhoneHome).await;
        assert_eq!(lab.state(host), State::Booted);
    }
    lab.advance(5 * MIN - 1).await;
    assert_eq!(lab.state(host), State::Booted);
    lab.advance(1).await;
    assert_eq!(lab.state(host), State::AwaitingDhcp);
    assert_eq!(
        reasons(&lab.ctl.take_transitions())[1],
        (State::Recovering, Reason::HeartbeatLost)
    );
    assert_eq!(lab.bmc(host).boots(), [PXE_LEGACY]);
}

#[tokio::test(start_paused = true)]
async fn an_expect_boot_host_that_does_not_phone_home_in_time_is_recovered() {
    let (late, punctual, unwatched) = (mac(1), mac(2), mac(3));
    let expect = RecoverySettings {
        expect_boot: true,
        ..settings()
    };
    let mut lab = Lab::new(
        "expect-boot",
        &[
            (late, expect, PowerState::Off),
            (punctual, expect, PowerState::On),
            (unwatched, settings(), PowerState::Off),
        ],
    );
    // Added now: the BMCs say whether the hosts run.
    lab.settle().await;
    lab.advance(9 * MIN).await;
    lab.observe(punctual, Observation::PhoneHome).await;
    lab.advance(MIN - 1).await;
    assert_eq!(lab.state(late), State::Idle);
    lab.advance(1).await;
    assert_eq!(lab.state(late), State::AwaitingDhcp);
    assert_eq!(
        reasons(&lab.ctl.take_transitions()),
        [
            (State::Booted, Reason::PhoneHome),
            (State::Recovering, Reason::NoPhoneHome),
            (State::AwaitingDhcp, Reason::PoweredOn),
        ]
    );
    assert_eq!(lab.state(punctual), State::Booted);
    // Asked whether it ran when added, and never acted on.
    assert_eq!(lab.bmc(punctual).calls(), [Seen::PowerStatus]);
    lab.advance(60 * MIN).await;
    assert_eq!(
        lab.state(unwatched),
        State::Idle,
        "no expect_boot, no watch"
    );
    assert!(lab.bmc(unwatched).calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_host_running_when_added_is_never_power_cycled_for_it() {
    let (running, requested, mute) = (mac(1), mac(2), mac(3));
    let expect = RecoverySettings {
        expect_boot: true,
        ..settings()
    };
    let mut lab = Lab::new(
        "running-when-added",
        &[
            (running, expect, PowerState::On),
            (requested, expect, PowerState::On),
            (mute, expect, PowerState::On),
        ],
    );
    lab.bmc(mute)
        .fail_next(Call::PowerStatus, lab.bmc(mute).timeout());
    lab.settle().await;
    let watch = |lab: &Lab, mac| lab.ctl.status(mac).expect("known").watch;
    assert_eq!(watch(&lab, running), Watch::UntilBootActivity);
    // A BMC that cannot say: nothing is cycled on a guess; it is asked
    // again later.
    let status = lab.ctl.status(mute).expect("known");
    assert_eq!(status.watch, Watch::CheckingPower);
    assert_eq!(
        status.deadline_ms,
        Some(T0 + ms(lab.ctl.policy().backoff_max))
    );
    assert!(status.last_error.is_some());

    // Hours later, no deadline has run: none was power-cycled.
    lab.advance(5 * 60 * MIN).await;
    for host in [running, requested, mute] {
        assert_eq!(lab.state(host), State::Idle);
        assert!(
            lab.bmc(host)
                .calls()
                .iter()
                .all(|c| *c == Seen::PowerStatus),
            "{:?}",
            lab.bmc(host).calls()
        );
    }
    // Asked again, it said the host runs.
    assert_eq!(lab.bmc(mute).calls().len(), 2);
    assert_eq!(watch(&lab, mute), Watch::UntilBootActivity);
    assert_eq!(lab.ctl.status(mute).expect("known").last_error, None);
    // An operator's request acts at once, as for any host.
    lab.ctl.request(requested, lab.now).expect("idle");
    lab.settle().await;
    assert_eq!(lab.state(requested), State::AwaitingDhcp);

    // Boot activity starts the watch: the host rebooted into the network
    // boot, so it is expected to phone home within its deadline.
    lab.observe(running, Observation::Dhcp).await;
    assert_eq!(watch(&lab, running), Watch::Counting);
    lab.advance(10 * MIN - 1).await;
    assert_eq!(lab.state(running), State::Idle);
    lab.advance(1).await;
    assert_eq!(lab.state(running), State::AwaitingDhcp);
    assert_eq!(
        lab.ctl
            .status(running)
            .expect("known")
            .last_transition
            .map(|t| t.reason),
        Some(Reason::PowerCycled)
    );
}

/// An off host whose BMC did not answer is asked again, never acted on
/// before it said; one whose BMC refuses for good is left alone.
#[tokio::test(start_paused = true)]
async fn a_host_whose_bmc_cannot_say_is_asked_again_not_cycled() {
    let (off, refused) = (mac(1), mac(2));
    let expect = RecoverySettings {
        expect_boot: true,
        ..settings()
    };
    let mut lab = Lab::new(
        "unknown-power",
        &[
            (off, expect, PowerState::Off),
            (refused, expect, PowerState::Off),
        ],
    );
    let backoff = ms(lab.ctl.policy().backoff_max);
    lab.bmc(off).fail_always(lab.bmc(off).timeout());
    lab.bmc(refused).fail_always(BmcError::AuthFailed {
        bmc: lab.bmc(refused).name().to_owned(),
        user: "admin".into(),
    });
    lab.settle().await;
    let watch = |lab: &Lab, mac| lab.ctl.status(mac).expect("known").watch;
    assert_eq!(watch(&lab, off), Watch::CheckingPower);
    assert_eq!(watch(&lab, refused), Watch::UntilBootActivity);
    // Past the deadline: still only asked, once per back-off.
    lab.advance(backoff - 1).await;
    assert_eq!(lab.bmc(off).calls(), [Seen::PowerStatus]);
    lab.advance(1).await;
    assert_eq!(lab.bmc(off).calls(), [Seen::PowerStatus, Seen::PowerStatus]);
    assert_eq!(lab.ctl.next_deadline(), Some(lab.now + backoff));
    // The BMC answers: off, so the watch counts from then, and the host
    // is recovered as any host that does not phone home in time.
    lab.bmc(off).heal();
    lab.advance(backoff).await;
    assert_eq!(watch(&lab, off), Watch::Counting);
    assert_eq!(lab.state(off), State::Idle);
    lab.advance(ms(expect.deadline)).await;
    assert_eq!(lab.state(off), State::AwaitingDhcp);
    assert_eq!(
        lab.ctl
            .status(off)
            .expect("known")
            .last_transition
            .map(|t| t.reason),
        Some(Reason::PoweredOn)
    );
    assert_eq!(lab.state(refused), State::Idle);
    assert_eq!(lab.bmc(refused).calls(), [Seen::PowerStatus]);
}

#[tokio::test(start_paused = true)]
async fn a_restart_keeps_a_running_host_unwatched() {
    let host = mac(1);
    let expect = RecoverySettings {
        expect_boot: true,
        ..settings()
    };
    let mut lab = Lab::new("running-restart", &[(host, expect, PowerState::On)]);
    lab.settle().await;
    assert_eq!(
        lab.ctl.status(host).expect("known").watch,
        Watch::UntilBootActivity
    );
    // The agent restarts: the record says the host ran when added.
    let Lab {
        dir, ctl, plans, ..
    } = lab;
    let now = T0;
    drop(ctl);
    let mut again = open(&dir);
    again.set_hosts(plans, now + 5 * MIN);
    let status = again.status(host).expect("known");
    assert_eq!(
        (status.watch, status.deadline_ms),
        (Watch::UntilBootActivity, None)
    );
    assert!(again.tick(now + 60 * MIN).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_slow_failing_bmc_does_not_hold_up_another_host() {
    let (broken, healthy) = (mac(1), mac(2));
    let mut lab = Lab::new(
        "isolation",
        &[
            (broken, settings(), PowerState::On),
            (healthy, settings(), PowerState::On),
        ],
    );
    let bmc = lab.bmc(broken).clone();
    bmc.delay(Call::SetBootDevice, Duration::from_secs(15));
    bmc.fail_always(bmc.timeout());
    lab.ctl.request(broken, lab.now).unwrap();
    lab.ctl.request(healthy, lab.now).unwrap();
    lab.dispatch();
    assert_eq!(lab.exec.in_flight(), 2);
    // The healthy BMC answers while the broken one still hangs.
    let start = tokio::time::Instant::now();
    let first = lab.exec.next().await.expect("a completion");
    assert_eq!(first.action.mac, healthy);
    assert!(start.elapsed() < Duration::from_secs(1));
    lab.feed(first);
    lab.dispatch();
    let power = lab.exec.next().await.expect("the healthy power-up");
    assert_eq!(power.action.mac, healthy);
    lab.feed(power);
    assert_eq!(lab.state(healthy), State::AwaitingDhcp);
    assert_eq!(lab.state(broken), State::Recovering);
    let failed = lab.exec.next().await.expect("the broken one, eventually");
    assert_eq!(failed.action.mac, broken);
    assert!(matches!(
        failed.result,
        Err(ActionError::Bmc(BmcError::Timeout { .. }))
    ));
    lab.feed(failed);
    assert_eq!(lab.state(broken), State::Backoff);
    let status = lab.ctl.status(broken).unwrap();
    assert!(
        status
            .last_error
            .as_deref()
            .unwrap()
            .contains("bmc-52:54:00:00:00:01:623"),
        "{status:?}"
    );
    // Back-off, retry, and the BMC healed meanwhile.
    bmc.heal();
    lab.advance(30 * SEC).await;
    assert_eq!(
        (lab.state(broken), lab.attempt(broken)),
        (State::AwaitingDhcp, 2)
    );
}

#[tokio::test(start_paused = true)]
async fn a_permanent_bmc_error_fails_the_host_without_retrying() {
    let host = mac(1);
    let mut lab = Lab::new("permanent", &[(host, settings(), PowerState::On)]);
    lab.bmc(host).fail_next(
        Call::SetBootDevice,
        BmcError::AuthFailed {
            bmc: "bmc-1:623".into(),
            user: "admin".into(),
        },
    );
    lab.ctl.request(host, lab.now).unwrap();
    lab.settle().await;
    assert_eq!(lab.state(host), State::Failed);
    assert_eq!(
        lab.path(),
        [(State::Recovering, State::Failed, Reason::BmcPermanentError)]
    );
    lab.advance(60 * MIN).await;
    assert_eq!(lab.bmc(host).calls().len(), 1, "no retry storm");
}

#[tokio::test(start_paused = true)]
async fn a_read_back_mismatch_is_retried_like_any_bmc_error() {
    let host = mac(1);
    let mut lab = Lab::new("read-back", &[(host, settings(), PowerState::On)]);
    lab.bmc(host).stale_read_back(BootFlags {
        valid: false,
        persistent: false,
        efi: false,
        selector: 0,
    });
    lab.ctl.request(host, lab.now).unwrap();
    lab.settle().await;
    assert_eq!(lab.state(host), State::Backoff);
    assert!(
        !lab.bmc(host)
            .calls()
            .iter()
            .any(|c| matches!(c, Seen::Power(_))),
        "no power action without the boot device"
    );
    lab.advance(30 * SEC).await;
    assert_eq!(lab.state(host), State::AwaitingDhcp);
}

#[tokio::test(start_paused = true)]
async fn a_lost_power_answer_waits_for_dhcp_instead_of_cycling_again() {
    let host = mac(1);
    let mut lab = Lab::new("unknown", &[(host, settings(), PowerState::On)]);
    lab.bmc(host).fail_next(
        Call::Power,
        BmcError::OutcomeUnknown {
            bmc: "bmc-1:623".into(),
            action: PowerAction::Cycle,
            waited: Duration::from_secs(15),
        },
    );
    lab.ctl.request(host, lab.now).unwrap();
    lab.settle().await;
    assert_eq!(lab.state(host), State::AwaitingDhcp);
    assert_eq!(
        lab.path(),
        [(
            State::Recovering,
            State::AwaitingDhcp,
            Reason::PowerOutcomeUnknown
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn a_phone_home_during_recovery_drops_the_queued_power_up() {
    let host = mac(1);
    let mut lab = Lab::new("stale", &[(host, settings(), PowerState::On)]);
    lab.ctl.request(host, lab.now).unwrap();
    lab.dispatch();
    let set = lab.exec.next().await.unwrap();
    lab.feed(set);
    // The power-up is asked for, but the host phones home before it runs.
    let actions = lab.ctl.tick(lab.now);
    assert_eq!(actions[0].kind, ActionKind::PowerUp);
    lab.ctl.observe(host, Observation::PhoneHome, lab.now);
    assert!(!lab.ctl.is_current(&actions[0]));
    lab.seq.push(actions[0], lab.now);
    let ctl = &lab.ctl;
    assert!(
        lab.seq
            .release(lab.now, Load::default(), |a| ctl.is_current(a))
            .is_empty()
    );
    // A late result of it is ignored.
    lab.ctl
        .complete(&actions[0], Ok(Done::PowerCycled), lab.now);
    assert_eq!(lab.ctl.stale_results(), 1);
    lab.settle().await;
    assert_eq!(lab.state(host), State::Booted);
    assert!(lab.bmc(host).boots().is_empty(), "never power-cycled");
    assert!(
        lab.bmc(host).flags().persistent,
        "the PXE override it had set is replaced by disk"
    );
}

#[tokio::test(start_paused = true)]
async fn requests_are_refused_for_unmanaged_or_busy_hosts_and_cancel_stops() {
    let host = mac(1);
    let mut lab = Lab::new("requests", &[(host, settings(), PowerState::On)]);
    assert_eq!(
        lab.ctl.request(mac(9), lab.now),
        Err(RequestError::NotManaged { mac: mac(9) })
    );
    assert_eq!(
        lab.ctl.cancel(host, lab.now),
        Err(RequestError::NotRecovering {
            mac: host,
            state: State::Idle
        })
    );
    lab.ctl.request(host, lab.now).unwrap();
    lab.settle().await;
    assert_eq!(
        lab.ctl.request(host, lab.now),
        Err(RequestError::InProgress {
            mac: host,
            state: State::AwaitingDhcp
        })
    );
    lab.ctl.cancel(host, lab.now).unwrap();
    lab.advance(60 * MIN).await;
    assert_eq!(lab.state(host), State::Idle);
    assert_eq!(
        lab.path(),
        [(State::AwaitingDhcp, State::Idle, Reason::Cancelled)]
    );
}

#[tokio::test(start_paused = true)]
async fn after_boot_failures_are_retried_then_given_up_without_leaving_booted() {
    let host = mac(1);
    let mut lab = Lab::new("after-boot", &[(host, settings(), PowerState::On)]);
    lab.ctl.request(host, lab.now).unwrap();
    lab.settle().await;
    let bmc = lab.bmc(host).clone();
    bmc.fail_always(bmc.timeout());
    lab.observe(host, Observation::PhoneHome).await;
    assert!(lab.ctl.status(host).unwrap().after_boot_pending);
    lab.advance(30 * SEC).await;
    lab.advance(60 * SEC).await;
    let status = lab.ctl.status(host).unwrap();
    assert_eq!(status.state, State::Booted);
    assert!(!status.after_boot_pending, "gave up after max_attempts");
    let sets = bmc
        .calls()
        .iter()
        .filter(|c| matches!(c, Seen::SetBootDevice(t) if t.device == BootDevice::Disk))
        .count();
    assert_eq!(sets, 3);
}

#[tokio::test(start_paused = true)]
async fn after_boot_none_leaves_the_boot_device_alone() {
    let host = mac(1);
    let s = RecoverySettings {
        after_boot: AfterBoot::None,
        ..settings()
    };
    let mut lab = Lab::new("after-none", &[(host, s, PowerState::On)]);
    lab.ctl.request(host, lab.now).unwrap();
    lab.settle().await;
    let calls = lab.bmc(host).calls().len();
    lab.observe(host, Observation::PhoneHome).await;
    assert_eq!(lab.bmc(host).calls().len(), calls);
}

#[tokio::test(start_paused = true)]
async fn a_restarted_agent_resumes_awaiting_script_with_its_deadline() {
    let host = mac(1);
    let mut lab = Lab::new("restart", &[(host, settings(), PowerState::On)]);
    lab.ctl.request(host, lab.now).unwrap();
    lab.settle().await;
    lab.observe(host, Observation::BootFile).await;
    let before = lab.ctl.status(host).unwrap();
    assert_eq!(before.state, State::AwaitingScript);
    let deadline = before.deadline_ms.unwrap();
    assert_eq!(deadline, lab.now + 2 * MIN);

    // kill -9: no shutdown path runs, and the file is as the last commit
    // left it. A copy taken while the first agent still holds it open is
    // exactly that (redb repairs it on open, as after a crash).
    let crashed = TempDir::new("restart-crashed");
    std::fs::copy(lab.dir.0.join(RECOVERY_FILE), crashed.0.join(RECOVERY_FILE))
        .expect("copy the live file");
    let plans = lab.plans.clone();
    let mut ctl = open(&crashed);
    let loaded = ctl.status(host).expect("loaded");
    assert_eq!((loaded.state, loaded.attempt), (State::AwaitingScript, 1));
    assert_eq!(loaded.deadline_ms, Some(deadline));
    assert!(!loaded.managed, "until the inventory confirms it");
    assert!(ctl.tick(deadline + 1).is_empty(), "inert until then");
    assert_eq!(ctl.status(host).unwrap().state, State::AwaitingScript);
    ctl.set_hosts(plans, deadline - SEC);
    ctl.tick(deadline - 1);
    assert_eq!(ctl.status(host).unwrap().state, State::AwaitingScript);
    ctl.tick(deadline);
    assert_eq!(ctl.status(host).unwrap().state, State::Backoff);
    assert_eq!(
        reasons(&ctl.take_transitions()),
        [(State::Backoff, Reason::ScriptTimeout)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_restart_mid_action_sends_the_action_again() {
    let host = mac(1);
    let mut lab = Lab::new("restart-action", &[(host, settings(), PowerState::On)]);
    lab.ctl.request(host, lab.now).unwrap();
    let issued = lab.ctl.tick(lab.now);
    assert_eq!(issued.len(), 1);
    let Lab {
        dir, ctl, plans, ..
    } = lab;
    drop(ctl);
    let mut ctl = open(&dir);
    ctl.set_hosts(plans, T0 + SEC);
    let again = ctl.tick(T0 + SEC);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].kind, issued[0].kind);
    assert!(ctl.is_current(&again[0]));
}

#[test]
fn watches_restart_after_a_restart_and_removed_hosts_are_forgotten() {
    let dir = TempDir::new("watches");
    let (watched, removed) = (mac(1), mac(2));
    let expect = plan(RecoverySettings {
        expect_boot: true,
        ..settings()
    });
    let mut ctl = open(&dir);
    ctl.set_hosts([(watched, expect), (removed, expect)], T0);
    // Both are asked whether they run; both are off, so their watches
    // count.
    let checks = ctl.tick(T0);
    assert!(checks.iter().all(|a| a.kind == ActionKind::PowerStatus));
    for check in &checks {
        ctl.complete(check, Ok(Done::Power(PowerState::Off)), T0);
    }
    assert_eq!(
        ctl.status(watched).unwrap().deadline_ms,
        Some(T0 + 10 * MIN)
    );
    drop(ctl);
    // The agent was down for an hour: the host's phone-home could not
    // have reached it, so the watch starts again.
    let mut ctl = open(&dir);
    ctl.set_hosts([(watched, expect)], T0 + 60 * MIN);
    assert_eq!(
        ctl.status(watched).unwrap().deadline_ms,
        Some(T0 + 70 * MIN)
    );
    assert!(ctl.status(removed).is_none());
    drop(ctl);
    let ctl = open(&dir);
    assert!(ctl.status(removed).is_none(), "deleted on disk too");
    assert_eq!(ctl.snapshot().len(), 1);
}

#[test]
fn metrics_list_every_state_and_count_transitions() {
    let dir = TempDir::new("metrics");
    let mut ctl = open(&dir);
    ctl.set_hosts([(mac(1), plan(settings())), (mac(2), plan(settings()))], T0);
    ctl.request(mac(1), T0).unwrap();
    let seq = Sequencer::new(SequencePolicy::default());
    let page = metrics::render(&ctl, &seq);
    assert!(
        page.contains(
            "pxe_recovery_transitions_total{from=\"idle\",to=\"recovering\",reason=\"requested\"} 1"
        ),
        "{page}"
    );
    assert!(page.contains("pxe_recovery_hosts{state=\"recovering\"} 1"));
    assert!(page.contains("pxe_recovery_hosts{state=\"idle\"} 1"));
    assert!(page.contains("pxe_recovery_hosts{state=\"awaiting-script\"} 0"));
    assert!(page.contains("pxe_recovery_waits_total{gate=\"slow-path\"} 0"));
    assert!(page.contains("pxe_recovery_queue_length 0"));
    assert!(page.contains("pxe_recovery_stalled_hosts{stage=\"awaiting-boot-file\"} 0"));
    assert_eq!(
        page.matches("# TYPE ").count(),
        8,
        "one header per metric: {page}"
    );
}

#[test]
fn metrics_are_written_as_before() {
    let dir = TempDir::new("metrics-golden");
    let mut ctl = open(&dir);
    ctl.set_hosts([(mac(1), plan(settings())), (mac(2), plan(settings()))], T0);
    ctl.request(mac(1), T0).unwrap();
    let mut seq = Sequencer::new(SequencePolicy::default());
    let power = |n| Action {
        mac: mac(n),
        kind: ActionKind::PowerUp,
        epoch: 1,
    };
    seq.push(power(1), T0);
    let busy = Load {
        awaiting: 0,
        slow_path_rate: f64::MAX,
    };
    assert!(seq.release(T0, busy, |_| true).is_empty());
    assert_eq!(
        seq.release(T0 + 1500, Load::default(), |_| true),
        [power(1)]
    );
    seq.push(power(2), T0 + 1500);
    assert_eq!(
        metrics::render(&ctl, &seq),
        r#"# HELP pxe_recovery_transitions_total Recovery state transitions, by from state, to state and reason.
# TYPE pxe_recovery_transitions_total counter
pxe_recovery_transitions_total{from="idle",to="recovering",reason="requested"} 1
# HELP pxe_recovery_hosts Hosts with a BMC this agent owns (all, without peers), by recovery state.
# TYPE pxe_recovery_hosts gauge
pxe_recovery_hosts{state="idle"} 1
pxe_recovery_hosts{state="recovering"} 1
pxe_recovery_hosts{state="awaiting-dhcp"} 0
pxe_recovery_hosts{state="awaiting-boot-file"} 0
pxe_recovery_hosts{state="awaiting-script"} 0
pxe_recovery_hosts{state="awaiting-phone-home"} 0
pxe_recovery_hosts{state="backoff"} 0
pxe_recovery_hosts{state="booted"} 0
pxe_recovery_hosts{state="failed"} 0
# HELP pxe_recovery_stalled_hosts Hosts this agent owns whose deadline in a stage passed and that have not got past that stage since (back-off, retries and failed included), by stage.
# TYPE pxe_recovery_stalled_hosts gauge
pxe_recovery_stalled_hosts{stage="awaiting-dhcp"} 0
pxe_recovery_stalled_hosts{stage="awaiting-boot-file"} 0
pxe_recovery_stalled_hosts{stage="awaiting-script"} 0
pxe_recovery_stalled_hosts{stage="awaiting-phone-home"} 0
# HELP pxe_recovery_queue_length BMC actions waiting to start.
# TYPE pxe_recovery_queue_length gauge
pxe_recovery_queue_length 1
# HELP pxe_recovery_actions_in_flight BMC actions running.
# TYPE pxe_recovery_actions_in_flight gauge
pxe_recovery_actions_in_flight 1
# HELP pxe_recovery_waits_total BMC actions that had to wait, by the limit that held them.
# TYPE pxe_recovery_waits_total counter
pxe_recovery_waits_total{gate="concurrency"} 0
pxe_recovery_waits_total{gate="rate"} 0
pxe_recovery_waits_total{gate="awaiting"} 0
pxe_recovery_waits_total{gate="slow-path"} 1
# HELP pxe_recovery_wait_seconds_total Seconds that started BMC actions spent queued.
# TYPE pxe_recovery_wait_seconds_total counter
pxe_recovery_wait_seconds_total 1.5
# HELP pxe_recovery_store_errors_total Failed writes of the recovery state file.
# TYPE pxe_recovery_store_errors_total counter
pxe_recovery_store_errors_total 0
"#
    );
}

#[test]
fn backoff_doubles_up_to_its_cap() {
    let policy = Policy::default();
    let secs: Vec<u64> = (1..=7).map(|a| policy.backoff(a).as_secs()).collect();
    assert_eq!(secs, [30, 60, 120, 240, 480, 600, 600]);
    assert_eq!(policy.backoff(u32::MAX), Duration::from_secs(600));
}

#[test]
fn plans_cover_hosts_with_a_bmc_only() {
    let text = "subnets: [{cidr: 10.66.0.0/16}]\nprofiles: [{name: p}]\nhosts:\n\
        - {mac: \"52:54:00:00:00:01\", ip: 10.66.1.1, profile: p}\n";
    let inventory = Inventory::parse(std::path::Path::new("/x.yaml"), text).unwrap();
    assert!(plans(&inventory).is_empty());
    let stages = StageDeadlines::default();
    assert_eq!(stages.dhcp, Duration::from_secs(180));
}

#[test]
fn a_uefi_host_whose_profile_boots_by_http_only_is_recovered_by_uefi_http() {
    let bmc =
        "bmc: {address: \"redfish://10.77.0.2\", username: a, password_env: PATH, boot_mode: uefi}";
    let text = format!(
        "subnets: [{{cidr: 10.66.0.0/16}}]\nprofiles:\n\
         - {{name: web, boot: {{http: \"http://10.66.0.1/boot.efi\"}}}}\n\
         - {{name: pxe, boot: {{uefi: ipxe.efi, http: \"http://10.66.0.1/boot.efi\"}}}}\nhosts:\n\
         - {{mac: \"52:54:00:00:00:01\", ip: 10.66.1.1, profile: web, {bmc}}}\n\
         - {{mac: \"52:54:00:00:00:02\", ip: 10.66.1.2, profile: pxe, {bmc}}}\n"
    );
    let inventory = Inventory::parse(std::path::Path::new("/x.yaml"), &text).unwrap();
    let devices: Vec<BootDevice> = plans(&inventory).iter().map(|(_, p)| p.network).collect();
    assert_eq!(devices, [BootDevice::UefiHttp, BootDevice::Pxe]);
}

#[test]
fn stage_defaults() {
    let stages = StageDeadlines::default();
    assert_eq!(stages.dhcp, Duration::from_secs(180));
}

#[tokio::test(start_paused = true)]
async fn two_agents_one_owner_the_other_follows_and_takes_over_from_the_recorded_stage() {
    let host = mac(1);
    let expect = RecoverySettings {
        expect_boot: true,
        ..settings()
    };
    let mut a = Lab::new("owner", &[(host, expect, PowerState::Off)]);
    let mut b = Lab::new("follower", &[(host, expect, PowerState::Off)]);
    a.ctl.set_owners(|_| true, |_| 2 * SEC, a.now);
    b.ctl.set_owners(|_| false, |_| 2 * SEC, b.now);
    // After its hold the owner asks whether the host runs: it is off.
    a.advance(2 * SEC).await;
    b.advance(2 * SEC).await;
    assert_eq!(a.bmc(host).calls(), [Seen::PowerStatus]);
    // The expect_boot watch runs out on both; only the owner acts.
    a.advance(10 * MIN).await;
    b.advance(10 * MIN).await;
    assert_eq!(a.state(host), State::AwaitingDhcp);
    assert_eq!(b.state(host), State::Idle);
    assert!(b.bmc(host).calls().is_empty(), "{:?}", b.bmc(host).calls());
    assert!(b.ctl.take_changed().is_empty(), "a follower shares nothing");
    // The owner shares its record; the follower takes it.
    let shared = a.ctl.take_changed();
    assert_eq!(shared.len(), 1);
    let (_, record) = shared[0].clone();
    assert!(b.ctl.adopt(host, record.clone(), b.now));
    assert_eq!(b.state(host), State::AwaitingDhcp);
    let mut other = record.clone();
    other.attempt += 1;
    assert!(!a.ctl.adopt(host, other, a.now), "an owner keeps its own");
    // The host takes its DHCP answer 30 s later; the owner records it.
    a.advance(30 * SEC).await;
    b.advance(30 * SEC).await;
    a.ctl.observe(host, Observation::Dhcp, a.now);
    let (_, record) = a.ctl.take_changed().pop().expect("changed");
    assert!(b.ctl.adopt(host, record, b.now));
    assert_eq!(b.state(host), State::AwaitingBootFile);
    assert!(b.bmc(host).calls().is_empty());
    // The owner dies; the follower gains the host, holds it, then goes on
    // from the recorded stage with the steps seen since: no power-up.
    b.advance(5 * SEC).await;
    let boot_file_at = b.now - 2 * SEC;
    b.ctl.set_owners(|_| true, |_| 2 * SEC, b.now);
    b.ctl
        .observe_step(host, Observation::BootFile, boot_file_at, b.now);
    assert_eq!(b.state(host), State::AwaitingBootFile, "held: not yet");
    b.now += 2 * SEC;
    assert_eq!(b.ctl.activate(b.now), [host]);
    b.settle().await;
    // A step older than the stage it is in is not taken.
    b.ctl.observe_step(host, Observation::PhoneHome, T0, b.now);
    assert_eq!(b.state(host), State::AwaitingBootFile);
    b.ctl
        .observe_step(host, Observation::BootFile, boot_file_at, b.now);
    assert_eq!(b.state(host), State::AwaitingScript);
    // Steps fed in one batch: later ones are older than the transition the
    // first made, yet of this boot (after the power-on).
    b.ctl
        .observe_step(host, Observation::Script, boot_file_at + 1, b.now);
    assert_eq!(b.state(host), State::AwaitingPhoneHome);
    b.ctl
        .observe_step(host, Observation::PhoneHome, b.now, b.now);
    b.settle().await;
    assert_eq!(b.state(host), State::Booted);
    assert!(
        !b.bmc(host)
            .calls()
            .iter()
            .any(|c| matches!(c, Seen::Power(_))),
        "{:?}",
        b.bmc(host).calls()
    );
    // Now the owner, it shares what it did.
    assert!(
        b.ctl
            .take_changed()
            .iter()
            .any(|(m, r)| *m == host && r.state == State::Booted)
    );
    assert_eq!(b.ctl.hosts_per_state()[&State::Booted], 1);
    assert_eq!(a.ctl.hosts_per_state()[&State::AwaitingBootFile], 1);
}

#[tokio::test(start_paused = true)]
async fn a_booted_host_gained_keeps_a_fresh_heartbeat_watch_and_a_queued_action_is_dropped() {
    let host = mac(1);
    let watched = RecoverySettings {
        heartbeat: Some(Duration::from_secs(300)),
        ..settings()
    };
    let mut a = Lab::new("hb-owner", &[(host, watched, PowerState::On)]);
    let mut b = Lab::new("hb-follower", &[(host, watched, PowerState::On)]);
    a.ctl.set_owners(|_| true, |_| 0, a.now);
    b.ctl.set_owners(|_| false, |_| 0, b.now);
    a.observe(host, Observation::PhoneHome).await;
    let (_, record) = a.ctl.take_changed().pop().expect("booted");
    assert!(b.ctl.adopt(host, record, b.now));
    // The owner saw heartbeats for an hour; the follower's copy of the
    // watch ran out long ago. Gained, it does not cycle a healthy host.
    b.advance(60 * MIN).await;
    b.ctl.set_owners(|_| true, |_| 2 * SEC, b.now);
    b.now += 2 * SEC;
    assert_eq!(b.ctl.activate(b.now), [host]);
    b.settle().await;
    assert_eq!(b.state(host), State::Booted);
    assert!(b.bmc(host).calls().is_empty(), "{:?}", b.bmc(host).calls());
    let deadline = b.ctl.status(host).unwrap().deadline_ms.unwrap();
    assert_eq!(deadline, b.now + 300 * SEC);
    // A recovery queued, then the host lost before it ran: dropped, and
    // the host takes new actions once it is back.
    b.ctl.request(host, b.now).expect("idle enough");
    let queued = b.ctl.tick(b.now);
    assert_eq!(queued.len(), 1);
    b.ctl.set_owners(|_| false, |_| 0, b.now);
    assert!(!b.ctl.acts_on(host, b.now));
    b.ctl.dropped(&queued[0]);
    b.ctl.set_owners(|_| true, |_| 0, b.now);
    b.ctl.activate(b.now);
    assert_eq!(b.ctl.tick(b.now).len(), 1, "a new action once owned again");
}

#[test]
fn states_serialize_as_their_text() {
    for state in State::ALL {
        assert_eq!(
            serde_json::to_value(state).expect("json"),
            state.as_str(),
            "{state:?}"
        );
    }
}

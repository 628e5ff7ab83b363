//! A fleet-sized inventory reloaded under load: a PXE client looping
//! DISCOVER/REQUEST for a host present before and after gets every answer
//! from the XDP fast path while the inventory is replaced by one with 1,000
//! more hosts, and the new hosts are answered once it is in force. The
//! inventories are those of `cargo xtask bench scale` ([`xtask::fleet`]).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use xtask::fleet::{fleet_inventory, fleet_mac};

use crate::{
    agent::Served,
    loadgen::{self, Options, Report},
    raw::in_netns,
};

/// Hosts in the inventory before the reload. 100,000 hosts with every
/// boot class need the shared-reply map layout: with one map entry per
/// host and boot class they compile to 500,000 replies, past the 262,144
/// the hosts map holds, and the agent refuses the inventory at start. The
/// test was developed and checked at 10,000 and 40,000 hosts.
const FLEET: usize = 100_000;
/// Hosts the reload adds.
const ADDED: usize = 1_000;
/// How long the agent may take to read, compile and write the fleet at
/// start (a debug build on a loaded CI machine).
const LOAD_WITHIN: Duration = Duration::from_secs(45);
/// How long the agent may take to apply the reload (read, compile, sync
/// in a debug build on a loaded CI machine); the test waits no longer than
/// the reload takes.
const RELOAD_WITHIN: Duration = Duration::from_secs(45);
/// Load rounds: each a fixed-length run of the generator, so that one
/// round's report shows whether any exchange of it went unanswered.
const ROUND: Duration = Duration::from_millis(500);

/// `loadgen` options for BIOS PXE clients with `macs` on the lab's client
/// end, at `rate` exchanges a second for `duration`.
fn load(served: &Served, macs: Vec<[u8; 6]>, rate: u32, duration: Duration) -> Options {
    Options {
        iface: served.lab.client_if().to_string(),
        send_iface: None,
        macs,
        rate: Some(rate),
        duration,
        drain: Duration::from_millis(500),
        timeout: Duration::from_millis(500),
        window: 4_096,
        user_class: None,
        relay: None,
    }
}

/// Requests in `report` that got no answer.
fn unanswered(report: &Report) -> u64 {
    (report.discovers + report.requests).saturating_sub(report.offers + report.acks)
}

fn slow_replies(served: &Served) -> u64 {
    served
        .stats()
        .iter()
        .filter(|(name, _)| name.starts_with("pxe_slow_replies_total"))
        .map(|(_, v)| *v)
        .sum()
}

#[test]
fn a_known_host_misses_no_answer_while_1000_hosts_are_added_to_a_fleet() {
    let served = Served::start_within("pxfleet", &fleet_inventory(FLEET, 0), LOAD_WITHIN);
    assert_eq!(
        served.stats().get("pxe_inventory_hosts").copied(),
        Some(FLEET as u64),
        "the fleet is not in force"
    );
    let reloads = |s: &Served| {
        s.stats()
            .get("pxe_inventory_reloads_total{result=\"ok\"}")
            .copied()
            .unwrap_or(0)
    };
    let slow_before = slow_replies(&served);
    // A host in the middle of the fleet: in both versions, unchanged.
    let stayer = fleet_mac(FLEET / 2);
    let stop = Arc::new(AtomicBool::new(false));
    let opts = load(&served, vec![stayer], 1_000, ROUND);
    let ns = served.lab.client_ns().to_string();
    let looping = {
        let stop = stop.clone();
        thread::spawn(move || {
            in_netns(&ns, move || {
                let mut rounds = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    rounds.push(loadgen::run(&opts).expect("load generator"));
                }
                rounds
            })
            .expect("enter client namespace")
        })
    };
    thread::sleep(ROUND);
    let before = reloads(&served);
    served.replace_inventory(&fleet_inventory(FLEET, ADDED));
    let started = Instant::now();
    while reloads(&served) == before {
        assert!(
            started.elapsed() < RELOAD_WITHIN,
            "the reload was not applied within {RELOAD_WITHIN:?}; log:\n{}",
            served.log()
        );
        assert!(!looping.is_finished(), "the load stopped during the reload");
        thread::sleep(Duration::from_millis(50));
    }
    let took = started.elapsed();
    // One more round wholly after the reload.
    thread::sleep(2 * ROUND);
    stop.store(true, Ordering::Relaxed);
    let rounds = looping.join().expect("load thread");
    let sent: u64 = rounds.iter().map(|r| r.discovers + r.requests).sum();
    let missed: u64 = rounds.iter().map(unanswered).sum();
    println!(
        "reload of {FLEET} + {ADDED} hosts in force after {} ms; {} rounds, {sent} requests \
         for {}, {missed} unanswered",
        took.as_millis(),
        rounds.len(),
        fleet_mac(FLEET / 2)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    );
    assert!(
        rounds.len() >= 3 && rounds.iter().all(|r| r.discovers > 0),
        "the load was too thin to say anything: {} rounds",
        rounds.len()
    );
    for (i, round) in rounds.iter().enumerate() {
        assert_eq!(
            unanswered(round),
            0,
            "round {i} of the load went partly unanswered: {}; agent log:\n{}",
            round.line(),
            served.log()
        );
    }
    assert_eq!(
        served.stats().get("pxe_inventory_hosts").copied(),
        Some((FLEET + ADDED) as u64),
        "the grown fleet is not in force"
    );
    assert_eq!(
        slow_replies(&served),
        slow_before,
        "the slow path answered: the fast path declined the known host"
    );

    // The added hosts: each asked at least once, all answered by XDP.
    let tx_before = served.counter("tx_ack");
    let added: Vec<[u8; 6]> = (FLEET..FLEET + ADDED).map(fleet_mac).collect();
    let opts = load(&served, added, 2_000, Duration::from_secs(1));
    let ns = served.lab.client_ns().to_string();
    let report = in_netns(&ns, move || loadgen::run(&opts))
        .expect("enter client namespace")
        .expect("load generator");
    assert!(
        report.discovers >= ADDED as u64,
        "not every added host was asked: {}",
        report.line()
    );
    assert_eq!(
        unanswered(&report),
        0,
        "added hosts went unanswered: {}; agent log:\n{}",
        report.line(),
        served.log()
    );
    assert_eq!(served.counter("tx_ack") - tx_before, report.acks);
    assert_eq!(slow_replies(&served), slow_before);
}

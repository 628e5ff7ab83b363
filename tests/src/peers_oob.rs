//! Two agents with `--peers kube` and 20 hosts behind real IPMI BMCs
//! (OpenIPMI's `ipmi_sim`, record-only): one agent acts on each host, so
//! every BMC sees one PXE set and one power-on however many agents watch
//! it; the fleet keeps one rate and one concurrency limit, read from the
//! simulators' own logs; and when the owner of a host in the middle of its
//! recovery dies, the other agent follows the host through the rest of its
//! boot (a real DHCP client, the iPXE script over HTTP, the phone-home) and
//! marks it booted, with no second power-on.
//!
//! The BMCs listen on the lab's bridge (10.67.0.1..20/24 in its
//! namespace); each agent reaches them through a second address on its
//! own end (10.67.0.251 and .252).

use std::{
    fs, thread,
    time::{Duration, Instant, SystemTime},
};

use serde_json::Value;

use crate::{
    agent::{Scratch, agent_bin},
    bmc_lab::{BmcFleet, bmc_ip},
    bmc_sim::PASSWORD,
    peers::{LEASE_SECS, PeerLab},
    sequence::{most_in_window, most_overlapping, secs},
};

const FLEET: usize = 20;
const RATE: f64 = 2.0;
/// The sequencer's default burst (`pxe-agent run` has no flag for it).
const BURST: usize = 1;
const CONCURRENCY: usize = 4;
/// How far a chassis program's clock reading may trail the agent's release
/// of the call (session set-up, forking the program).
const JITTER: Duration = Duration::from_millis(150);

fn host_mac(i: usize) -> String {
    format!("02:00:00:00:02:{i:02x}")
}

/// 20 hosts with a BMC each, expected to phone home within 3 s of being
/// watched, with a DHCP stage long enough that no retry happens here.
fn inventory(password: &str) -> String {
    let mut inventory = String::from(
        r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.254
    lease_time: 3600
profiles:
  - name: w
    boot: {bios: undionly.kpxe}
    kernel: "http://{server}:8080/artifacts/vmlinuz"
    initrd: ["http://{server}:8080/artifacts/initrd.img"]
hosts:
"#,
    );
    for i in 0..FLEET {
        inventory.push_str(&format!(
            "  - mac: \"{}\"\n    ip: 10.66.2.{}\n    hostname: node-{i:02}\n    profile: w\n    \
             bmc:\n      address: ipmi://{}:623\n      username: admin\n      \
             password_file: {password}\n    \
             recovery: {{expect_boot: true, deadline: 3s, max_attempts: 1, stages: {{dhcp: 10m}}}}\n",
            host_mac(i),
            10 + i,
            bmc_ip(i),
        ));
    }
    inventory
}

/// Host `mac` as agent `i` shows it.
fn host(lab: &PeerLab, i: usize, mac: &str) -> Value {
    lab.get(i, "/api/v1/hosts")
        .and_then(|h| h.as_array()?.iter().find(|h| h["mac"] == mac).cloned())
        .unwrap_or(Value::Null)
}

#[test]
fn two_agents_recover_each_host_once_within_fleet_limits_and_fail_over_mid_recovery() {
    let secrets = Scratch::new("peers-oob");
    let password = secrets.path("bmc.password");
    fs::write(&password, PASSWORD).expect("password file");
    let mut lab = PeerLab::with(
        &inventory(password.to_str().expect("utf-8")),
        true,
        &[
            "--bmc-concurrency",
            "4",
            "--power-ons-per-second",
            "2",
            "--bmc-boot-flag-echo",
            "device-only",
        ],
    );
    for (i, cidr) in ["10.67.0.251/24", "10.67.0.252/24"].iter().enumerate() {
        lab.agent_ns[i].ip(&["addr", "add", cidr, "dev", "pxag0"]);
    }
    let fleet = BmcFleet::start_on(&lab.bridge.0, "pxbr0", &lab.agent_ns[0].0, FLEET);
    // Each chassis call takes 1.2 s: a power-on and its read-back keep a
    // BMC busy ~2.5 s, so at 2 power-ons a second about five calls would
    // overlap without the limit.
    for sim in fleet.sims() {
        sim.set_call_delay(Duration::from_millis(1200));
    }
    let t0 = SystemTime::now();
    for i in 0..2 {
        lab.wait_peers(i, "both slots live", |v| {
            v["serving"] == true && v["live"].as_array().is_some_and(|l| l.len() == 2)
        });
    }

    // (1) One owner per host, the same on both agents.
    let mut owners = [0usize; 2];
    let started = Instant::now();
    for n in 0..FLEET {
        let mac = host_mac(n);
        let seen: Vec<Value> = (0..2)
            .map(|i| host(&lab, i, &mac)["owner"].clone())
            .collect();
        assert!(
            seen[0].is_string() && seen[0] == seen[1],
            "{mac}: owners {seen:?}"
        );
        owners[usize::from(seen[0] == "node-1")] += 1;
    }
    println!("owners: node-0 has {}, node-1 has {}", owners[0], owners[1]);
    // `pxe-agent hosts` names the same owners.
    for i in 0..2 {
        let out = lab.agent_ns[i]
            .cmd(agent_bin())
            .arg("hosts")
            .env("PXE_AGENT_TOKEN_FILE", lab.dir.path("tokens"))
            .output()
            .expect("pxe-agent hosts");
        let table = String::from_utf8_lossy(&out.stdout);
        let header = table.lines().next().unwrap_or_default();
        let at = header
            .find("OWNER")
            .unwrap_or_else(|| panic!("no OWNER column:\n{table}"));
        for n in 0..FLEET {
            let mac = host_mac(n);
            let row = table
                .lines()
                .find(|l| l.starts_with(&mac))
                .unwrap_or_else(|| panic!("{mac} not listed:\n{table}"));
            let shown = row[at..].split_whitespace().next().unwrap_or_default();
            assert_eq!(shown, host(&lab, i, &mac)["owner"], "{table}");
        }
    }
    assert!(owners.iter().all(|&n| n > 0), "{owners:?}");

    // (2) Every host's watch runs out; its owner alone recovers it, once
    // it has held the hosts it gained on start long enough for a call
    // another agent might have started to end (about 32 s here).
    while fleet.sims().iter().any(|s| s.power_ons().is_empty()) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "not every BMC powered on: {:?}\n{}",
            fleet
                .sims()
                .iter()
                .map(|s| s.power_ons().len())
                .collect::<Vec<_>>(),
            lab.logs()
        );
        thread::sleep(Duration::from_millis(200));
    }
    // Long enough for a second agent's calls to show, were there any.
    thread::sleep(Duration::from_secs(2 * LEASE_SECS + 2));
    for (n, sim) in fleet.sims().iter().enumerate() {
        let calls = fs::read_to_string(sim.chassis_dir().join("calls.log")).unwrap_or_default();
        let pxe = calls.lines().filter(|l| l.contains("set boot pxe")).count();
        assert_eq!(
            (pxe, sim.power_ons().len()),
            (1, 1),
            "BMC {n} ({}): one PXE set and one power-on:\n{calls}",
            sim.ip()
        );
    }
    let mut ons: Vec<SystemTime> = fleet.sims().iter().flat_map(|s| s.power_ons()).collect();
    ons.sort();
    let in_a_second = most_in_window(&ons, Duration::from_secs(1));
    let span = secs(ons[FLEET - 1], ons[0]);
    let spans: Vec<_> = fleet.sims().iter().flat_map(|s| s.spans()).collect();
    let overlap = most_overlapping(&spans);
    println!(
        "fleet: 20 power-ons over {span:.2} s (first {:.2} s after start), most in 1 s \
         {in_a_second}, most BMC calls at once {overlap}",
        secs(ons[0], t0)
    );
    assert!(
        in_a_second <= RATE as usize + BURST,
        "{in_a_second} power-ons in one second across the fleet"
    );
    let least = (FLEET - BURST) as f64 / RATE - JITTER.as_secs_f64();
    assert!(span >= least, "{FLEET} power-ons in {span:.2}s");
    assert!(
        overlap <= CONCURRENCY,
        "{overlap} BMC calls overlapped across the fleet: {spans:?}"
    );

    // (3) The owner of host H dies while H awaits DHCP; H then boots
    // through the other agent, which takes H over and finishes it.
    let (h, mac) = (0..FLEET)
        .map(|n| (n, host_mac(n)))
        .find(|(_, mac)| host(&lab, 0, mac)["owner"] == "node-0")
        .expect("a host of node-0");
    let follower = host(&lab, 1, &mac);
    assert_eq!(
        follower["recovery"], "awaiting-dhcp",
        "the follower holds the owner's record: {follower}"
    );
    lab.kill(0);
    let killed = Instant::now();
    let lease = lab.udhcpc(&mac);
    lab.known.ip(&[
        "addr",
        "add",
        &format!("{}/16", lease["ip"]),
        "dev",
        "pxkn0",
    ]);
    assert_eq!(lease["serverid"], "10.66.0.2", "{lease:?}");
    lab.phone_home(1, &mac);
    loop {
        let now = host(&lab, 1, &mac);
        if now["owner"] == "node-1" && now["recovery"] == "booted" {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(8 * LEASE_SECS),
            "node-1 did not take {mac} over: {now}\n{}",
            lab.logs()
        );
        thread::sleep(Duration::from_millis(100));
    }
    println!(
        "fail-over: node-1 owns {mac} and has it booted {:.1} s after node-0's kill -9",
        killed.elapsed().as_secs_f64()
    );
    // The survivor took over every host and repeated no power-on.
    thread::sleep(Duration::from_secs(2));
    for n in 0..FLEET {
        let view = host(&lab, 1, &host_mac(n));
        assert_eq!(view["owner"], "node-1", "{view}");
    }
    for (n, sim) in fleet.sims().iter().enumerate() {
        assert_eq!(
            sim.power_ons().len(),
            1,
            "BMC {n} powered on again after the fail-over{}",
            if n == h {
                " (the host that booted)"
            } else {
                ""
            }
        );
    }
}

//! Two agents with file inventories (no `--peers`) on one segment share
//! nothing: when a client selects the other agent for a host whose netboot
//! (`once`) or recovery (`bmc`) state this agent keeps, this agent warns,
//! once a host, and counts the REQUESTs; the fast path (XDP drops the
//! REQUEST and streams an event) and the slow path (iPXE, passed by XDP)
//! alike. A host with neither is no concern of the warning.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    thread,
    time::{Duration, Instant},
};

use super::{AGENT_IPS, Clients, PeerLab};
use crate::{agent::Scratch, frame::Req, recovery_vm::plain};

/// node-1 and node-4 are `netboot: once`, node-2 has a BMC, node-3 neither.
fn inventory(password: &str) -> String {
    format!(
        r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.254
    lease_time: 3600
profiles:
  - name: worker
    boot: {{bios: undionly.kpxe}}
  - name: installer
    boot: {{bios: undionly.kpxe}}
    netboot: once
hosts:
  - {{mac: "52:54:00:78:00:01", ip: 10.66.1.10, hostname: node-1, profile: installer}}
  - mac: "52:54:00:78:00:02"
    ip: 10.66.1.11
    hostname: node-2
    profile: worker
    bmc: {{address: "ipmi://10.66.9.2", username: admin, password_file: {password}}}
  - {{mac: "52:54:00:78:00:03", ip: 10.66.1.12, hostname: node-3, profile: worker}}
  - {{mac: "52:54:00:78:00:04", ip: 10.66.1.13, hostname: node-4, profile: installer}}
"#
    )
}

fn mac(n: u8) -> [u8; 6] {
    [0x52, 0x54, 0, 0x78, 0, n]
}

fn ip(s: &str) -> Ipv4Addr {
    s.parse().expect("address")
}

/// A SELECTING REQUEST from BIOS PXE firmware that chose `server`; as
/// iPXE (user class, which XDP passes to the slow path) with `ipxe`.
fn selecting(n: u8, host: &str, server: &str, xid: u32, ipxe: bool) -> Req {
    let mut r = Req::discover(mac(n)).pxe(0).request();
    r.xid = xid;
    r.broadcast = true;
    r.server_id = Some(ip(server));
    r.requested_ip = Some(ip(host));
    if ipxe {
        r.user_class = Some(b"\x04iPXE");
    }
    r
}

impl PeerLab {
    /// Agent `i`'s unlabelled samples and those named with labels, by the
    /// whole sample name.
    fn metrics(&self, i: usize) -> BTreeMap<String, f64> {
        self.text(i, "/metrics")
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                Some((name.to_string(), value.parse().ok()?))
            })
            .collect()
    }

    fn wait_ready(&self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.text(i, "/healthz").is_none() {
            assert!(
                Instant::now() < deadline,
                "agent {i} not ready in 30 s\n{}",
                self.logs()
            );
            thread::sleep(Duration::from_millis(100));
        }
        self.assert_as_daemonset(i);
    }
}

/// The lines of agent `i`'s log that warn about `host`.
fn warnings(lab: &PeerLab, i: usize, host: &str) -> Vec<String> {
    plain(&lab.log(i))
        .lines()
        .filter(|l| l.contains("another DHCP server") && l.contains(&format!("answers {host};")))
        .map(str::to_owned)
        .collect()
}

#[test]
fn agents_in_file_mode_warn_once_a_host_when_another_server_answers_it() {
    let secrets = Scratch::new("file-mode-bmc");
    std::fs::write(secrets.path("bmc.password"), "file-mode-test\n").expect("password");
    let password = secrets.path("bmc.password");
    let lab = PeerLab::with(&inventory(&password.display().to_string()), false, &[]);
    for i in 0..2 {
        lab.wait_ready(i);
    }
    let clients = Clients::open(&lab.clients);
    let b = AGENT_IPS[1];

    // Every client selects agent b, twice; node-1 once more as iPXE.
    let mut xid = 0x5100_0000;
    let mut send = |n: u8, host: &str, ipxe: bool| {
        for _ in 0..2 {
            xid += 1;
            clients.send(&selecting(n, host, b, xid, ipxe));
        }
    };
    send(1, "10.66.1.10", false);
    send(2, "10.66.1.11", false);
    send(3, "10.66.1.12", false);
    send(4, "10.66.1.13", true);
    clients.send(&selecting(1, "10.66.1.10", b, 0x5200_0000, true));
    // Agent b acknowledges them: they are its to answer.
    let acks = clients.collect(Duration::from_millis(500));
    for n in 1..=4 {
        assert!(
            acks.iter()
                .any(|s| s.mac == mac(n) && s.server == ip(b) && s.yiaddr != Ipv4Addr::UNSPECIFIED),
            "agent b did not answer node-{n}: {acks:?}\n{}",
            lab.logs()
        );
    }
    assert!(
        acks.iter().all(|s| s.server == ip(b)),
        "agent a answered a REQUEST for b: {acks:?}"
    );

    // Agent a: node-1 (fast path twice, slow path once), node-2 (fast path)
    // and node-4 (slow path) counted; the fast path's events are read
    // every 200 ms.
    let counted = "pxe_dhcp_other_server_requests_total";
    let deadline = Instant::now() + Duration::from_secs(10);
    while lab.metrics(0).get(counted) != Some(&7.0) {
        assert!(
            Instant::now() < deadline,
            "agent a counted {:?} REQUESTs for b, want 7\n{}",
            lab.metrics(0).get(counted),
            lab.logs()
        );
        thread::sleep(Duration::from_millis(100));
    }
    // Nothing more comes.
    thread::sleep(Duration::from_millis(600));
    let m = lab.metrics(0);
    println!(
        "agent a: {} REQUESTs naming agent b, {} hosts; XDP dropped {}, the slow path ignored {}",
        m[counted],
        m["pxe_dhcp_other_server_hosts"],
        m["pxe_xdp_packets_total{outcome=\"drop_other_server\"}"],
        m["pxe_slow_ignored_total{reason=\"drop_other_server\"}"],
    );
    assert_eq!(m[counted], 7.0);
    assert_eq!(m["pxe_dhcp_other_server_hosts"], 3.0);
    // The verdicts did not change: dropped in the kernel (node-1, -2, -3
    // twice each), ignored by the slow path (the iPXE ones).
    assert_eq!(
        m["pxe_xdp_packets_total{outcome=\"drop_other_server\"}"],
        6.0
    );
    assert_eq!(
        m["pxe_slow_ignored_total{reason=\"drop_other_server\"}"],
        3.0
    );
    for host in ["node-1", "node-2", "node-4"] {
        let lines = warnings(&lab, 0, host);
        assert_eq!(
            lines.len(),
            1,
            "agent a warns once about {host}: {lines:?}\n{}",
            lab.logs()
        );
        assert!(
            lines[0].contains(&format!("another DHCP server ({b}) answers {host};"))
                && lines[0].contains(&format!("host={host}"))
                && lines[0].contains(&format!("server={b}")),
            "{lines:?}"
        );
    }
    assert!(
        warnings(&lab, 0, "node-3").is_empty(),
        "node-3 has neither netboot once nor a BMC\n{}",
        lab.log(0)
    );
    assert!(
        !lab.log(0).contains("file-mode-test"),
        "the BMC password is in the log"
    );

    // Agent b was the one named: nothing to warn about there.
    let m = lab.metrics(1);
    assert_eq!(m.get(counted), Some(&0.0), "agent b: {m:?}");
    assert_eq!(m.get("pxe_dhcp_other_server_hosts"), Some(&0.0));
    assert!(
        !lab.log(1).contains("another DHCP server"),
        "agent b warned\n{}",
        lab.log(1)
    );
}

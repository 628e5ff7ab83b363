//! End to end on a veth pair between two namespaces: the agent's XDP program
//! in native mode answers real DHCP clients, and the server's kernel stack
//! never sees their traffic.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use dhcproto::{Decodable as _, Decoder, v4::Message};

use crate::{
    agent::Served,
    frame::{Req, parse_reply},
    raw::{RawSocket, in_netns, is_dhcp_reply},
};

const INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    dns: [10.66.0.1]
    domain: lab.example
    lease_time: 3600
profiles:
  - name: worker
    boot:
      bios: undionly.kpxe
      uefi: ipxe.efi
      http: "http://{server}:8080/ipxe.efi"
hosts:
  - mac: "52:54:00:12:34:56"
    ip: 10.66.1.10
    hostname: node-1
    profile: worker
"#;

const CLIENT_MAC: &str = "52:54:00:12:34:56";

/// Runs `f`, then checks the fast path sent `offers` and `acks` more and the
/// kernel's UDP stack in the server namespace received nothing.
fn served_by_xdp<T>(served: &Served, offers: u64, acks: u64, f: impl FnOnce() -> T) -> T {
    let (o, a, k) = (
        served.counter("tx_offer"),
        served.counter("tx_ack"),
        served.kernel_udp_datagrams(),
    );
    let out = f();
    assert!(
        served.counter("tx_offer") >= o + offers,
        "fewer OFFERs from XDP than expected"
    );
    assert!(
        served.counter("tx_ack") >= a + acks,
        "fewer ACKs from XDP than expected"
    );
    assert_eq!(
        served.kernel_udp_datagrams(),
        k,
        "the kernel's UDP stack saw known-host DHCP traffic"
    );
    out
}

#[test]
fn udhcpc_gets_reservation_and_boot_answer_per_firmware() {
    let served = Served::start("pxe2e", INVENTORY);
    served.set_client_mac(CLIENT_MAC);

    let plain = served_by_xdp(&served, 1, 1, || served.udhcpc(&[]));
    assert_eq!(plain["ip"], "10.66.1.10");
    assert_eq!(plain["serverid"], "10.66.0.1");
    assert_eq!(plain["lease"], "3600");
    assert_eq!(plain["boot_file"], "");

    let bios = served_by_xdp(&served, 1, 1, || {
        served.udhcpc(&["-V", "PXEClient", "-x", "0x5d:0000"])
    });
    assert_eq!(
        (bios["ip"].as_str(), bios["siaddr"].as_str()),
        ("10.66.1.10", "10.66.0.1")
    );
    assert_eq!(bios["boot_file"], "undionly.kpxe");

    let uefi = served_by_xdp(&served, 1, 1, || {
        served.udhcpc(&["-V", "PXEClient:Arch:00007:UNDI:003016", "-x", "0x5d:0007"])
    });
    assert_eq!(uefi["boot_file"], "ipxe.efi");

    let http = served_by_xdp(&served, 1, 1, || {
        served.udhcpc(&["-V", "HTTPClient:Arch:00016:UNDI:003001", "-x", "0x5d:0010"])
    });
    assert_eq!(http["ip"], "10.66.1.10");
    assert_eq!(http["bootfile"], "http://10.66.0.1:8080/ipxe.efi");
    // Started without --boot-root, the agent said what no one will serve.
    let log = served.log();
    assert!(
        log.contains("no --boot-root is given") && log.contains(".boot.bios undionly.kpxe"),
        "no warning of TFTP files without a boot root:\n{log}"
    );
}

#[test]
fn dhclient_gets_reservation() {
    let served = Served::start("pxe2e", INVENTORY);
    served.set_client_mac(CLIENT_MAC);
    let leases = served_by_xdp(&served, 1, 1, || served.dhclient());
    assert!(
        leases.contains("fixed-address 10.66.1.10;"),
        "lease file: {leases}"
    );
    assert!(
        leases.contains("option dhcp-server-identifier 10.66.0.1;"),
        "lease file: {leases}"
    );
}

#[test]
fn dhcpcd_gets_reservation() {
    let served = Served::start("pxe2e", INVENTORY);
    served.set_client_mac(CLIENT_MAC);
    let v = served_by_xdp(&served, 1, 1, || served.dhcpcd());
    assert_eq!(v["ip"], "10.66.1.10");
    assert_eq!(v["server"], "10.66.0.1");
}

/// The reload test's inventory: hosts `a` (kept), `b` (removed later), `d`
/// (address changed later), and optionally `c` (added later).
fn reload_inventory(d_ip: &str, with_b: bool, with_c: bool) -> String {
    let mut hosts = String::from("  - {mac: \"52:54:00:00:aa:01\", ip: 10.66.2.1, profile: p}\n");
    if with_b {
        hosts.push_str("  - {mac: \"52:54:00:00:aa:02\", ip: 10.66.2.2, profile: p}\n");
    }
    if with_c {
        hosts.push_str("  - {mac: \"52:54:00:00:aa:03\", ip: 10.66.2.3, profile: p}\n");
    }
    hosts.push_str(&format!(
        "  - {{mac: \"52:54:00:00:aa:04\", ip: {d_ip}, profile: p}}\n"
    ));
    format!(
        "subnets:\n  - cidr: 10.66.0.0/16\n    lease_time: 600\nprofiles:\n  - name: p\nhosts:\n{hosts}"
    )
}

#[test]
fn inventory_change_is_served_within_a_second_without_missing_kept_hosts() {
    let served = Served::start("pxreload", &reload_inventory("10.66.2.4", true, false));
    let ns = served.lab.client_ns().to_string();
    let iface = served.lab.client_if().to_string();
    let sock = in_netns(&ns, move || RawSocket::open(&iface))
        .expect("netns")
        .expect("raw socket");
    let macs: [[u8; 6]; 4] = [1, 2, 3, 4].map(|i| [0x52, 0x54, 0, 0, 0xaa, i]);

    // One round: a DISCOVER per MAC, then the answers that come within 100 ms.
    let mut xid = 0u32;
    let mut round = || -> [Option<Ipv4Addr>; 4] {
        let mut answers = [None; 4];
        let base = xid;
        for (i, mac) in macs.iter().enumerate() {
            let mut req = Req::discover(*mac);
            req.broadcast = true;
            req.xid = base + i as u32;
            sock.send(&req.frame()).expect("send");
        }
        xid += 4;
        let deadline = Instant::now() + Duration::from_millis(100);
        while Instant::now() < deadline && answers.iter().filter(|a| a.is_some()).count() < 4 {
            let Some(f) = sock.recv(Duration::from_millis(10)).expect("recv") else {
                continue;
            };
            if !is_dhcp_reply(&f) {
                continue;
            }
            let msg = Message::decode(&mut Decoder::new(&parse_reply(&f).payload))
                .expect("reply decodes");
            if let Some(i) = msg.xid().checked_sub(base).filter(|i| *i < 4) {
                answers[i as usize] = Some(msg.yiaddr());
            }
        }
        answers
    };

    let ip = |s: &str| Some(s.parse::<Ipv4Addr>().unwrap());
    for _ in 0..10 {
        assert_eq!(
            round(),
            [ip("10.66.2.1"), ip("10.66.2.2"), None, ip("10.66.2.4")],
            "before the change"
        );
    }
    served.replace_inventory(&reload_inventory("10.66.2.40", false, true));
    let changed = Instant::now();
    let mut settled = None;
    while changed.elapsed() < Duration::from_secs(3) {
        let r = round();
        assert_eq!(
            r[0],
            ip("10.66.2.1"),
            "kept host a missed an answer during the reload"
        );
        assert!(
            r[3] == ip("10.66.2.4") || r[3] == ip("10.66.2.40"),
            "kept host d missed an answer: {r:?}"
        );
        if settled.is_none() && r == [ip("10.66.2.1"), None, ip("10.66.2.3"), ip("10.66.2.40")] {
            settled = Some(changed.elapsed());
        }
        if let Some(t) = settled {
            assert_eq!(
                r,
                [ip("10.66.2.1"), None, ip("10.66.2.3"), ip("10.66.2.40")],
                "flapped after settling at {t:?}"
            );
        }
    }
    let took = settled.expect("new inventory never served");
    println!("inventory change served after {} ms", took.as_millis());
    assert!(
        took < Duration::from_secs(1),
        "new inventory served only after {took:?}"
    );
}

#[test]
fn invalid_inventory_is_refused_and_previous_keeps_serving() {
    let served = Served::start("pxbad", INVENTORY);
    served.set_client_mac(CLIENT_MAC);
    served.replace_inventory(&INVENTORY.replace("10.66.1.10", "10.99.1.10"));
    let deadline = Instant::now() + Duration::from_secs(5);
    while served.stats()["pxe_inventory_reloads_total{result=\"rejected\"}"] == 0 {
        assert!(
            Instant::now() < deadline,
            "bad inventory not refused; log:\n{}",
            served.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = served.log();
    assert!(
        log.contains("inventory.yaml") && log.contains("node-1") && log.contains("field ip"),
        "refusal names file, host and field: {log}"
    );
    assert_eq!(served.udhcpc(&[])["ip"], "10.66.1.10");
}

/// Subnet-wide options, a profile's over them and a host's over both, as
/// real clients read them: the XDP program's replies (known hosts' PXE
/// firmware) and the slow path's (iPXE, a machine from the discovery pool)
/// carry the same layers.
#[test]
fn subnet_profile_and_host_options_reach_udhcpc_on_both_paths() {
    const LAYERED: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    pool: {start: 10.66.200.1, end: 10.66.200.20}
    options: {42: [10.66.0.4, 10.66.0.5], 15: site.example}
discovery: {policy: inspect, profile: inspector}
profiles:
  - name: worker
    boot: {bios: undionly.kpxe}
    options: {15: workers.example}
  - name: inspector
    boot: {bios: undionly.kpxe}
hosts:
  - {mac: "52:54:00:12:34:56", ip: 10.66.1.10, profile: worker}
  - {mac: "52:54:00:12:34:57", ip: 10.66.1.11, profile: worker, options: {42: 10.66.0.9}}
"#;
    let served = Served::start("pxopts", LAYERED);
    let bios = ["-V", "PXEClient", "-x", "0x5d:0000"];
    let ask = |mac: &str, extra: &[&str]| {
        served.set_client_mac(mac);
        served.udhcpc_showing(
            served.lab.client_ns(),
            served.lab.client_if(),
            extra,
            &["ntpsrv", "domain"],
        )
    };
    let slow = |s: &Served| {
        s.stats()
            .get("pxe_slow_replies_total{type=\"ack\"}")
            .copied()
            .unwrap_or(0)
    };

    // Fast path: the subnet's 42 and the profile's 15 over the subnet's.
    let before = slow(&served);
    let node1 = served_by_xdp(&served, 1, 1, || ask("52:54:00:12:34:56", &bios));
    assert_eq!(node1["ip"], "10.66.1.10");
    assert_eq!(node1["ntpsrv"], "10.66.0.4,10.66.0.5");
    assert_eq!(node1["domain"], "workers.example");
    // The host's own 42 over the subnet's.
    let node2 = served_by_xdp(&served, 1, 1, || ask("52:54:00:12:34:57", &bios));
    assert_eq!(node2["ip"], "10.66.1.11");
    assert_eq!(node2["ntpsrv"], "10.66.0.9");
    assert_eq!(node2["domain"], "workers.example");
    assert_eq!(
        slow(&served),
        before,
        "the slow path answered known PXE firmware"
    );

    // Slow path: iPXE of the same hosts, then an unknown machine whose
    // profile sets nothing (the subnet's 15 stays).
    let ipxe = [&bios[..], &["-x", "0x4d:0469505845"]].concat();
    let node1 = ask("52:54:00:12:34:56", &ipxe);
    assert_eq!(
        node1["bootfile"],
        "http://10.66.0.1:8080/boot/52:54:00:12:34:56.ipxe"
    );
    assert_eq!(node1["ntpsrv"], "10.66.0.4,10.66.0.5");
    assert_eq!(node1["domain"], "workers.example");
    let node2 = ask("52:54:00:12:34:57", &ipxe);
    assert_eq!(node2["ntpsrv"], "10.66.0.9");
    let spare = ask("52:54:00:aa:bb:01", &bios);
    assert_eq!(spare["ip"], "10.66.200.1");
    assert_eq!(spare["ntpsrv"], "10.66.0.4,10.66.0.5");
    assert_eq!(spare["domain"], "site.example");
    assert!(
        slow(&served) >= before + 3,
        "the slow path did not answer the iPXE and pool clients"
    );
}

//! The randomized differential test of the one policy: generated requests
//! through the XDP program in the kernel (`BPF_PROG_TEST_RUN`) and through
//! the complete slow path (`decide` and `encode` on the same inventory).
//!
//! Whenever the kernel answers, the slow path's answer must be the same
//! bytes; whenever it drops, the policy must ignore the request for the same
//! reason; whenever it passes, the reason must be one the policy agrees the
//! kernel cannot answer: `fast_path`, the projection of `decide`, names it,
//! or the frame itself shows it (malformed, too many options, no room to
//! grow, addressed to another machine).

use std::{fmt::Write as _, net::Ipv4Addr};

use pxe_agent::dhcp::{Answer, Decision, Request, decide, encode, fast_path};
use pxe_ebpf_common::{Counter, bootp};

use crate::{
    fixture::{Fixture, XDP_DROP, XDP_PASS, XDP_TX},
    frame::{RELAY_MAC, SERVER_IP, SERVER_MAC, parse_reply, udp_frame},
    rng::Rng,
};

/// Profiles of every kind the fast path meets: all boot classes, none,
/// label and arch rules it can compile, and rules it cannot (an arch list
/// that splits a class, a vendor-class prefix longer than the class's);
/// subnet and profile options under a host's own.
const INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    dns: [10.66.0.1]
    domain: lab.example
    lease_time: 3600
    options: {42: [10.66.0.4, 10.66.0.5], 15: site.example, 224: site}
  - cidr: 10.77.0.0/16
    router: 10.77.0.1
    pool: {start: 10.77.100.1, end: 10.77.100.200}
  - {cidr: 10.88.0.0/16, mode: proxy, options: {224: proxy-site}}
discovery: {policy: inspect, profile: worker, lease_time: 600}
profiles:
  - name: worker
    boot:
      bios: undionly.kpxe
      uefi: ipxe.efi
      uefi_arm64: ipxe-arm64.efi
      http: "http://{server}:8080/ipxe.efi"
      http_arm64: "http://{server}:8080/ipxe-arm64.efi"
    options: {15: workers.example, 225: worker}
  - name: bare
  - name: ruled
    boot: {bios: undionly.kpxe, uefi: ipxe.efi, http: "http://{server}/x64.efi"}
    rules:
      - match: {labels: {rack: r1}}
        boot: {bios: rack1.kpxe}
        options: {66: tftp-r1}
      - match: {arch: [7]}
        boot: {uefi: seven.efi}
      - match: {vendor_class: "HTTPClient:Arch:00016"}
        boot: {http: "http://{server}/sixteen.efi"}
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, hostname: node-1, profile: worker, options: {42: 10.66.0.1}}
  - {macs: ["52:54:00:00:00:02", "52:54:00:00:00:06"], ip: 10.66.1.11, hostname: node-2, profile: bare}
  - {mac: "52:54:00:00:00:03", ip: 10.66.1.12, profile: ruled, labels: {rack: r1}}
  - {mac: "52:54:00:00:00:04", ip: 10.77.1.13, profile: worker}
  - {mac: "52:54:00:00:00:05", ip: 10.88.1.14, profile: worker}
  # Own options that fill the host's record (the end option follows it),
  # and a short name with a long padding after it.
  - {mac: "52:54:00:00:00:07", ip: 10.66.1.15, hostname: node-7, profile: worker, options: {17: "/rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr"}}
  - {mac: "52:54:00:00:00:08", ip: 10.66.1.16, hostname: n, profile: bare}
"#;

const MACS: [[u8; 6]; 9] = [
    [0x52, 0x54, 0, 0, 0, 1],
    [0x52, 0x54, 0, 0, 0, 2],
    // node-2's second port.
    [0x52, 0x54, 0, 0, 0, 6],
    [0x52, 0x54, 0, 0, 0, 3],
    [0x52, 0x54, 0, 0, 0, 4],
    // In the proxyDHCP subnet.
    [0x52, 0x54, 0, 0, 0, 5],
    [0x52, 0x54, 0, 0, 0, 7],
    [0x52, 0x54, 0, 0, 0, 8],
    [0x52, 0x54, 0, 0, 0, 0x7f],
];
const ADDRESSES: [Ipv4Addr; 8] = [
    Ipv4Addr::new(10, 66, 1, 10),
    Ipv4Addr::new(10, 66, 1, 11),
    Ipv4Addr::new(10, 66, 1, 12),
    Ipv4Addr::new(10, 77, 1, 13),
    Ipv4Addr::new(10, 88, 1, 14),
    Ipv4Addr::new(10, 66, 1, 15),
    Ipv4Addr::new(10, 66, 1, 16),
    Ipv4Addr::new(10, 66, 1, 99),
];
const GIADDRS: [Ipv4Addr; 4] = [
    Ipv4Addr::new(10, 66, 200, 1),
    Ipv4Addr::new(10, 77, 0, 254),
    Ipv4Addr::new(10, 88, 0, 254),
    Ipv4Addr::new(192, 0, 2, 1),
];

/// Requests generated and sent through both paths.
const REQUESTS: usize = 100_000;

/// How the request reaches the server.
#[derive(Clone, Copy, Debug)]
enum Delivery {
    /// Broadcast from the client.
    Broadcast,
    /// Unicast to the server (a renewal), from the client or a router.
    Unicast,
    /// From a relay at giaddr.
    Relayed,
    /// Broadcast, but to another machine's MAC (a promiscuous port).
    OtherMac,
}

/// One generated request: its DHCP payload and its frame.
struct Generated {
    payload: Vec<u8>,
    frame: Vec<u8>,
    delivery: Delivery,
}

fn option(out: &mut Vec<Vec<u8>>, code: u8, value: &[u8]) {
    let mut o = vec![code, value.len() as u8];
    o.extend_from_slice(value);
    out.push(o);
}

fn generate(rng: &mut Rng) -> Generated {
    let mac = rng.pick(&MACS);
    let mut p = vec![0u8; bootp::OFF_OPTIONS];
    p[0] = bootp::OP_REQUEST;
    p[1] = bootp::HTYPE_ETHER;
    p[2] = bootp::HLEN_ETHER;
    p[4..8].copy_from_slice(&(rng.next_u64() as u32).to_be_bytes());
    if rng.one_in(4) {
        p[bootp::OFF_FLAGS] = 0x80;
    }
    p[bootp::OFF_CHADDR..bootp::OFF_CHADDR + 6].copy_from_slice(&mac);
    p[bootp::OFF_COOKIE..bootp::OFF_OPTIONS].copy_from_slice(&bootp::MAGIC_COOKIE);

    let delivery = match rng.below(8) {
        0 | 1 => Delivery::Relayed,
        2 => Delivery::Unicast,
        3 if rng.one_in(4) => Delivery::OtherMac,
        _ => Delivery::Broadcast,
    };
    let giaddr = match delivery {
        Delivery::Relayed => rng.pick(&GIADDRS),
        _ => Ipv4Addr::UNSPECIFIED,
    };
    p[bootp::OFF_GIADDR..bootp::OFF_GIADDR + 4].copy_from_slice(&giaddr.octets());
    if matches!(delivery, Delivery::Unicast) || rng.one_in(10) {
        let ciaddr = rng.pick(&ADDRESSES);
        p[bootp::OFF_CIADDR..bootp::OFF_CIADDR + 4].copy_from_slice(&ciaddr.octets());
    }

    let mut opts = Vec::new();
    let msg_type = match rng.below(10) {
        0..=4 => bootp::DHCPDISCOVER,
        5..=7 => bootp::DHCPREQUEST,
        8 => rng.pick(&[4u8, 7, 8, 2, 5, 6]),
        _ => rng.next_u64() as u8,
    };
    if !rng.one_in(50) {
        option(&mut opts, bootp::OPT_MESSAGE_TYPE, &[msg_type]);
    }
    if rng.one_in(3) {
        let ip = rng.pick(&ADDRESSES);
        option(&mut opts, bootp::OPT_REQUESTED_IP, &ip.octets());
    }
    if rng.one_in(3) {
        let sid = if rng.one_in(4) {
            Ipv4Addr::new(10, 66, 0, 2)
        } else {
            SERVER_IP
        };
        option(&mut opts, bootp::OPT_SERVER_ID, &sid.octets());
    }
    if !rng.one_in(4) {
        let arch: u16 = rng.pick(&[0, 0, 6, 7, 7, 9, 10, 11, 15, 16, 16, 19, 0x1234]);
        let mut v = arch.to_be_bytes().to_vec();
        if rng.one_in(10) {
            v.extend_from_slice(&[0, 7]);
        }
        option(&mut opts, bootp::OPT_CLIENT_ARCH, &v);
    }
    if !rng.one_in(5) {
        let vendor: &[u8] = rng.pick(&[
            &b"PXEClient:Arch:00000:UNDI:002001"[..],
            b"PXEClient:Arch:00007:UNDI:003016",
            b"PXEClient",
            b"HTTPClient:Arch:00016:UNDI:003001",
            b"HTTPClient:Arch:00019:UNDI:003001",
            b"HTTPClient",
            b"PXE",
            b"MSFT 5.0",
            b"udhcp 1.36.1",
        ]);
        option(&mut opts, bootp::OPT_VENDOR_CLASS, vendor);
    }
    if rng.one_in(8) {
        let class: &[u8] = rng.pick(&[&b"\x04iPXE"[..], b"\x05other", b"iPXE"]);
        option(&mut opts, bootp::OPT_USER_CLASS, class);
    }
    if rng.one_in(12) {
        option(&mut opts, bootp::OPT_IPXE_ENCAP, &[19, 1, 1]);
    }
    if rng.one_in(6) {
        let circuit: &[u8] = rng.pick(&[&b"eth0"[..], b"Gi1/0/7", b""]);
        let mut v = vec![1, circuit.len() as u8];
        v.extend_from_slice(circuit);
        option(&mut opts, bootp::OPT_RELAY_AGENT_INFO, &v);
    }
    if rng.one_in(2) {
        option(&mut opts, 55, &[1, 3, 6, 15, 66, 67]);
    }
    if rng.one_in(4) {
        option(&mut opts, 12, b"client");
    }
    if rng.one_in(4) {
        option(&mut opts, 57, &[5, 192]);
    }
    for _ in 0..rng.below(3) {
        let len = rng.below(40);
        let value: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        option(&mut opts, rng.pick(&[43u8, 61, 97, 94, 224, 250]), &value);
    }
    // Option order as the client chose it.
    for i in (1..opts.len()).rev() {
        opts.swap(i, rng.below(i + 1));
    }
    for o in &opts {
        if rng.one_in(20) {
            p.push(bootp::OPT_PAD);
        }
        p.extend_from_slice(o);
    }
    if !rng.one_in(30) {
        p.push(bootp::OPT_END);
    }
    // Clients pad to 300 bytes or more; some send less.
    let size = rng.pick(&[0usize, 300, 300, 300, 400, 548]);
    if p.len() < size {
        p.resize(size, 0);
    }
    if rng.one_in(40) {
        let keep = bootp::OFF_OPTIONS + rng.below(p.len() - bootp::OFF_OPTIONS + 1);
        p.truncate(keep);
    }

    let frame = match delivery {
        Delivery::Broadcast | Delivery::OtherMac => {
            let dst = if matches!(delivery, Delivery::OtherMac) {
                [0x02, 0, 0, 0, 0, 0x42]
            } else {
                [0xff; 6]
            };
            udp_frame(
                mac,
                dst,
                Ipv4Addr::UNSPECIFIED,
                Ipv4Addr::BROADCAST,
                68,
                67,
                &p,
            )
        }
        Delivery::Unicast => {
            let ciaddr = Ipv4Addr::new(p[12], p[13], p[14], p[15]);
            let src = if rng.one_in(2) { mac } else { RELAY_MAC };
            udp_frame(src, SERVER_MAC, ciaddr, SERVER_IP, 68, 67, &p)
        }
        Delivery::Relayed => udp_frame(RELAY_MAC, SERVER_MAC, giaddr, SERVER_IP, 67, 67, &p),
    };
    Generated {
        payload: p,
        frame,
        delivery,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Whether the option area, walked as the kernel walks it, ends in an end
/// option within the message, in at most 64 options, without overload.
fn kernel_walk(payload: &[u8]) -> Result<(), Counter> {
    let mut at = bootp::OFF_OPTIONS;
    for _ in 0..64 {
        let Some(&code) = payload.get(at) else {
            return Err(Counter::PassMalformed);
        };
        match code {
            bootp::OPT_END => return Ok(()),
            bootp::OPT_PAD => at += 1,
            bootp::OPT_OVERLOAD => return Err(Counter::PassOptions),
            _ => {
                let len = *payload.get(at + 1).ok_or(Counter::PassMalformed)? as usize;
                if at + 2 + len > payload.len() {
                    return Err(Counter::PassMalformed);
                }
                at += 2 + len;
            }
        }
    }
    Err(Counter::PassOptions)
}

/// Why the two paths disagree on `g`, if they do.
fn disagreement(fx: &Fixture, g: &Generated, counters: &mut [u64]) -> Option<String> {
    let before = fx.stats();
    let (action, out) = fx.run(&g.frame);
    let after = fx.stats();
    let moved: Vec<Counter> = Counter::ALL
        .iter()
        .copied()
        .filter(|c| *c != Counter::Rx && after.get(*c) != before.get(*c))
        .collect();
    let [counter] = moved[..] else {
        return Some(format!("counters moved: {moved:?}"));
    };
    counters[counter as usize] += 1;
    let parsed = Request::parse(&g.payload);
    let projection = parsed
        .as_ref()
        .ok()
        .map(|req| fast_path(req, &fx.inv, &fx.server));
    match action {
        XDP_TX => {
            let Ok(req) = &parsed else {
                return Some(format!(
                    "XDP answered what the slow path cannot parse: {parsed:?}"
                ));
            };
            let Answer::Reply(reply) = decide(req, &fx.inv, &fx.server) else {
                return Some(format!(
                    "XDP answered, the slow path decided {:?}",
                    decide(req, &fx.inv, &fx.server)
                ));
            };
            let slow = encode(&reply, req).expect("encodes");
            let fast = parse_reply(&out);
            if !(fast.ip_csum_ok && fast.udp_csum_ok) {
                return Some("XDP reply has a bad checksum".into());
            }
            if fast.payload != slow {
                return Some(format!(
                    "XDP reply differs from the slow path's:\n  xdp  {}\n  slow {}",
                    hex(&fast.payload),
                    hex(&slow)
                ));
            }
            if !matches!(projection, Some(Decision::Reply(_))) {
                return Some(format!("XDP answered, the projection says {projection:?}"));
            }
            None
        }
        XDP_DROP => match (&parsed, projection) {
            (Ok(req), Some(Decision::Drop(c))) if c == counter => {
                let ignored = decide(req, &fx.inv, &fx.server);
                (ignored != Answer::Ignore(c))
                    .then(|| format!("XDP dropped ({c:?}), the slow path decided {ignored:?}"))
            }
            (_, projection) => Some(format!(
                "XDP dropped ({counter:?}), the projection says {projection:?}"
            )),
        },
        XDP_PASS => {
            let shown_by_frame = match counter {
                Counter::PassMalformed => {
                    parsed.is_err() || kernel_walk(&g.payload) == Err(Counter::PassMalformed)
                }
                Counter::PassOptions => kernel_walk(&g.payload) == Err(Counter::PassOptions),
                Counter::PassNotForUs => matches!(g.delivery, Delivery::OtherMac),
                // The frame cannot grow into the reply: only for a request
                // the kernel would answer.
                Counter::PassNoRoom => matches!(projection, Some(Decision::Reply(_))),
                _ => false,
            };
            if shown_by_frame || projection == Some(Decision::Pass(counter)) {
                None
            } else {
                Some(format!(
                    "XDP passed ({counter:?}), the projection says {projection:?}"
                ))
            }
        }
        other => Some(format!("XDP returned action {other}")),
    }
}

#[test]
fn the_kernel_and_the_slow_path_agree_on_a_hundred_thousand_generated_requests() {
    let fx = Fixture::with_inventory(INVENTORY);
    let mut rng = Rng(0x00d1_ff00_5eed);
    let mut counters = vec![0u64; Counter::Count as usize];
    let mut failures = Vec::new();
    for _ in 0..REQUESTS {
        let g = generate(&mut rng);
        if let Some(why) = disagreement(&fx, &g, &mut counters) {
            failures.push(format!("{why}\n  request {}", hex(&g.payload)));
        }
    }
    let answered = counters[Counter::TxOffer as usize]
        + counters[Counter::TxAck as usize]
        + counters[Counter::TxProxyOffer as usize];
    let summary: Vec<String> = Counter::ALL
        .iter()
        .filter(|c| counters[**c as usize] > 0)
        .map(|c| format!("{} {}", c.name(), counters[*c as usize]))
        .collect();
    println!(
        "{REQUESTS} generated requests: XDP answered {answered}; {}",
        summary.join(", ")
    );
    assert!(
        failures.is_empty(),
        "{} of {REQUESTS} requests disagree; the first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
    // The generator must reach the kernel's answers and its main reasons.
    assert!(
        answered > REQUESTS as u64 / 20,
        "too few answered: {summary:?}"
    );
    for c in [
        Counter::PassUnknownHost,
        Counter::PassRelay,
        Counter::PassIpxe,
        Counter::PassUnsupportedClient,
        Counter::PassMessageType,
        Counter::PassRequestMismatch,
        Counter::PassMalformed,
        Counter::PassNotForUs,
        Counter::DropOtherServer,
        Counter::TxProxyOffer,
        Counter::PassClientUuid,
    ] {
        assert!(
            counters[c as usize] > 0,
            "no request hit {c:?}: {summary:?}"
        );
    }
}

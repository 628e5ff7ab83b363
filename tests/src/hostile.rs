//! Hostile input at a running agent over a veth pair: the one frame that
//! used to stop the slow path, and a hundred thousand mutated requests of
//! the shapes real firmware, iPXE and relays send. Afterwards the agent must
//! be alive, healthy, no larger than a stated bound, and still answer a
//! known host byte for byte on both paths.

use std::{
    net::Ipv4Addr,
    path::Path,
    time::{Duration, Instant},
};

use dhcproto::{
    Decodable as _, Decoder,
    v4::{DhcpOption, Message, MessageType, OptionCode},
};
use pxe_agent::{
    dhcp::{Answer, Request, Server, decide, encode},
    inventory::Inventory,
};
use pxe_ebpf_common::bootp;

use crate::{
    agent::Served,
    frame::{RELAY_MAC, Req, SERVER_IP, client_broadcast, parse_reply, udp_frame},
    raw::{RawSocket, in_netns, is_dhcp_reply},
    rng::Rng,
    slow_path::INVENTORY,
};

const KNOWN_MAC: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];
const UNKNOWN_MAC: [u8; 6] = [0x52, 0x54, 0, 0xaa, 0xbb, 0x07];
/// A relay on the server's own subnet, as `dhcrelay` would be.
const GIADDR: Ipv4Addr = Ipv4Addr::new(10, 66, 0, 254);

/// A raw socket on the client end that sees only what arrives.
fn client_socket(served: &Served) -> RawSocket {
    let iface = served.lab.client_if().to_string();
    in_netns(served.lab.client_ns(), move || {
        let sock = RawSocket::open(&iface)?;
        sock.ignore_outgoing()?;
        sock.set_recv_buffer(8 << 20)?;
        Ok::<_, std::io::Error>(sock)
    })
    .expect("enter client namespace")
    .expect("client socket")
}

/// The DHCP payload of the first reply to `xid`, if one comes in `wait`.
fn reply_to(sock: &RawSocket, xid: u32, wait: Duration) -> Option<(Vec<u8>, [u8; 6])> {
    let deadline = Instant::now() + wait;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Some(f) = sock.recv(left).expect("receive") else {
            continue;
        };
        if !is_dhcp_reply(&f) {
            continue;
        }
        let reply = parse_reply(&f);
        let Ok(msg) = Message::decode(&mut Decoder::new(&reply.payload)) else {
            continue;
        };
        if msg.xid() == xid {
            return Some((reply.payload, reply.eth_src));
        }
    }
    None
}

fn message_type(payload: &[u8]) -> Option<MessageType> {
    let msg = Message::decode(&mut Decoder::new(payload)).ok()?;
    match msg.opts().get(OptionCode::MessageType) {
        Some(DhcpOption::MessageType(t)) => Some(*t),
        _ => None,
    }
}

fn healthz(served: &Served) -> String {
    served
        .lab
        .run_in(
            served.lab.server_ns(),
            &[
                "curl",
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "http://127.0.0.1:9464/healthz",
            ],
        )
        .unwrap_or_default()
}

fn metric(served: &Served, name: &str) -> u64 {
    served.stats().get(name).copied().unwrap_or(0)
}

/// What the agent must answer `req` with, computed by the same policy and
/// encoder in this process.
fn expected(req: &Req, server_mac: [u8; 6]) -> Vec<u8> {
    let inv = Inventory::parse(Path::new("inventory.yaml"), INVENTORY).expect("inventory");
    let server = Server {
        ip: SERVER_IP,
        mac: server_mac,
    };
    let parsed = Request::parse(&req.payload()).expect("test request parses");
    match decide(&parsed, &inv, &server) {
        Answer::Reply(reply) => encode(&reply, &parsed).expect("encodes"),
        other => panic!("policy does not answer the probe: {other:?}"),
    }
}

/// The known host's plain PXE DISCOVER (answered by XDP) and its iPXE
/// DISCOVER (answered by the slow path) each get exactly the policy's
/// bytes; an unknown MAC gets a pool offer.
fn assert_still_answers(served: &Served, sock: &RawSocket) {
    let pxe = Req {
        xid: 0x0bad_0001,
        ..Req::discover(KNOWN_MAC).pxe(0)
    };
    let ipxe = Req {
        xid: 0x0bad_0002,
        user_class: Some(b"\x04iPXE"),
        ..Req::discover(KNOWN_MAC).pxe(0)
    };
    let unknown = Req {
        xid: 0x0bad_0003,
        ..Req::discover(UNKNOWN_MAC).pxe(7)
    };
    let tx_before = served.counter("tx_offer");
    for (what, req) in [("plain PXE", &pxe), ("iPXE", &ipxe)] {
        sock.send(&req.frame()).expect("send probe");
        let (payload, server_mac) = reply_to(sock, req.xid, Duration::from_secs(3))
            .unwrap_or_else(|| panic!("no answer to the {what} DISCOVER; log:\n{}", served.log()));
        assert_eq!(
            payload,
            expected(req, server_mac),
            "the {what} answer differs from the policy's"
        );
    }
    assert_eq!(
        served.counter("tx_offer"),
        tx_before + 1,
        "the plain PXE DISCOVER was not answered by XDP"
    );
    sock.send(&unknown.frame()).expect("send probe");
    let (payload, _) = reply_to(sock, unknown.xid, Duration::from_secs(3))
        .unwrap_or_else(|| panic!("no pool offer to an unknown MAC; log:\n{}", served.log()));
    assert_eq!(message_type(&payload), Some(MessageType::Offer));
    assert_eq!(healthz(served), "200", "healthz after the probes");
}

/// The known host's PXE DISCOVER with one header byte changed.
fn known_discover_with(xid: u32, at: usize, value: u8) -> Vec<u8> {
    let mut payload = Req {
        xid,
        ..Req::discover(KNOWN_MAC).pxe(0)
    }
    .payload();
    payload[at] = value;
    client_broadcast(KNOWN_MAC, &payload)
}

#[test]
fn a_request_with_hlen_past_chaddr_does_not_stop_the_slow_path() {
    let served = Served::start("pxhlen", INVENTORY);
    let sock = client_socket(&served);
    assert_eq!(healthz(&served), "200");
    let malformed = metric(&served, "pxe_slow_errors_total{kind=\"malformed\"}");
    // A real PXE DISCOVER with only hlen changed: 87 and 137 were seen to
    // panic dhcproto's chaddr accessor.
    for (i, hlen) in [87u8, 137, 17, 255].into_iter().enumerate() {
        let frame = known_discover_with(0x0bad_1000 + i as u32, bootp::OFF_HLEN, hlen);
        sock.send(&frame).expect("send");
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        metric(&served, "pxe_slow_errors_total{kind=\"malformed\"}") >= malformed + 4,
        "the slow path did not count the frames as malformed"
    );
    assert_eq!(metric(&served, "pxe_slow_errors_total{kind=\"panic\"}"), 0);
    assert_still_answers(&served, &sock);
}

#[test]
fn a_reserved_mac_under_another_hardware_type_gets_no_answer() {
    let served = Served::start("pxhtype", INVENTORY);
    let sock = client_socket(&served);
    for (i, htype) in [141u8, 247, 239, 122].into_iter().enumerate() {
        let xid = 0x0bad_2000 + i as u32;
        sock.send(&known_discover_with(xid, bootp::OFF_HTYPE, htype))
            .expect("send");
        assert_eq!(
            reply_to(&sock, xid, Duration::from_millis(500)),
            None,
            "htype {htype} with a reserved MAC in chaddr was answered"
        );
    }
    assert_still_answers(&served, &sock);
}

/// Requests of the shapes clients send: PXE BIOS and UEFI, UEFI HTTP boot,
/// iPXE (user class and option 175), REQUESTs, relayed with and without
/// option 82, from each of `macs` (known and unknown ones).
pub(crate) fn seeds(macs: &[[u8; 6]]) -> Vec<Req> {
    let mut out = Vec::new();
    for &mac in macs {
        for base in [
            Req::discover(mac).pxe(0),
            Req::discover(mac).pxe(7),
            Req::discover(mac).pxe(11),
            Req::discover(mac).http(),
            Req {
                user_class: Some(b"\x04iPXE"),
                opt175: true,
                ..Req::discover(mac).pxe(7)
            },
            Req {
                requested_ip: Some(Ipv4Addr::new(10, 66, 1, 10)),
                server_id: Some(SERVER_IP),
                ..Req::discover(mac).pxe(0).request()
            },
            Req {
                ciaddr: Ipv4Addr::new(10, 66, 1, 10),
                ..Req::discover(mac).request()
            },
        ] {
            out.push(Req {
                giaddr: GIADDR,
                relay_info: true,
                ..base.clone()
            });
            out.push(Req {
                giaddr: GIADDR,
                ..base.clone()
            });
            out.push(Req {
                relay_info: true,
                ..base.clone()
            });
            out.push(base);
        }
    }
    out
}

/// One mutation of a request's payload: header noise, option lengths that
/// lie, truncation, garbage, or a hardware length or type out of range.
pub(crate) fn mutate(rng: &mut Rng, mut p: Vec<u8>) -> Vec<u8> {
    match rng.below(8) {
        0 => {
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(240);
                p[at] = rng.next_u64() as u8;
            }
        }
        1 => {
            // An option's length byte set to anything.
            let mut at = 240;
            let mut lengths = Vec::new();
            while at + 1 < p.len() && p[at] != 255 {
                if p[at] == 0 {
                    at += 1;
                    continue;
                }
                lengths.push(at + 1);
                at += 2 + usize::from(p[at + 1]);
            }
            if !lengths.is_empty() {
                let at = lengths[rng.below(lengths.len())];
                p[at] = rng.next_u64() as u8;
            }
        }
        2 => p.truncate(rng.below(p.len())),
        3 => {
            for _ in 0..1 + rng.below(32) {
                let at = 240 + rng.below(p.len() - 240);
                p[at] = rng.next_u64() as u8;
            }
        }
        4 => p.extend((0..rng.below(400)).map(|_| rng.next_u64() as u8)),
        5 => p[2] = rng.next_u64() as u8,
        6 => p[1] = rng.next_u64() as u8,
        _ => {
            // Options replaced by random ones of random lengths.
            p.truncate(240);
            for _ in 0..rng.below(40) {
                let len = rng.below(40);
                p.push(rng.next_u64() as u8);
                p.push(len as u8);
                p.extend((0..len).map(|_| rng.next_u64() as u8));
            }
            if rng.below(2) == 0 {
                p.push(255);
            }
        }
    }
    p
}

/// The resident set of process `pid`, KiB.
pub(crate) fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("agent status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

/// Mutated requests sent.
const MUTATED: usize = 100_000;
/// How much the agent may grow: the discovered registry and the storm
/// guard's table are bounded (65,536 entries each, a few MiB together), as
/// is the lease database's cache (16 MiB).
const RSS_GROWTH_BOUND_KIB: u64 = 32 * 1024;

#[test]
fn a_hundred_thousand_mutated_requests_leave_the_agent_serving() {
    let served = Served::start("pxfuzz", INVENTORY);
    let sock = client_socket(&served);
    let pid = served.agent_pid();
    let rss_before = rss_kib(pid);
    let rx_before = metric(&served, "pxe_slow_requests_total");
    let xdp_rx_before = served.counter("rx");
    let seeds = seeds(&[KNOWN_MAC, UNKNOWN_MAC]);
    let server_mac = served.server_mac();
    let mut rng = Rng(0x5eed_f022);
    let started = Instant::now();
    for i in 0..MUTATED {
        let seed = &seeds[i % seeds.len()];
        let payload = mutate(&mut rng, seed.payload());
        let frame = if seed.giaddr.is_unspecified() {
            client_broadcast(seed.mac, &payload)
        } else {
            udp_frame(
                RELAY_MAC,
                server_mac,
                seed.giaddr,
                SERVER_IP,
                67,
                67,
                &payload,
            )
        };
        // Paced so the slow path reads them rather than its socket buffer
        // dropping them: what is tested is what the agent does with each.
        while sock.send(&frame).is_err() {
            std::thread::sleep(Duration::from_micros(200));
        }
        if i % 8 == 7 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let took = started.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        served.agent.id() == pid && std::fs::metadata(format!("/proc/{pid}")).is_ok(),
        "the agent is gone"
    );
    let rss_after = rss_kib(pid);
    let stats = served.stats();
    let get = |name: &str| stats.get(name).copied().unwrap_or(0);
    println!(
        "{MUTATED} mutated requests in {:.1} s; XDP saw {}; slow path read {}, \
         malformed {}, panics {}; RSS {rss_before} -> {rss_after} KiB",
        took.as_secs_f64(),
        served.counter("rx") - xdp_rx_before,
        get("pxe_slow_requests_total") - rx_before,
        get("pxe_slow_errors_total{kind=\"malformed\"}"),
        get("pxe_slow_errors_total{kind=\"panic\"}"),
    );
    assert_eq!(
        get("pxe_slow_errors_total{kind=\"panic\"}"),
        0,
        "a request panicked the slow path; log:\n{}",
        served.log()
    );
    assert_eq!(get("pxe_slow_path_restarts_total"), 0);
    assert!(
        get("pxe_slow_requests_total") - rx_before > MUTATED as u64 / 2,
        "the slow path read too few of the requests to test it"
    );
    let grown = rss_after.saturating_sub(rss_before);
    assert!(
        grown < RSS_GROWTH_BOUND_KIB,
        "agent RSS grew by {grown} KiB ({rss_before} -> {rss_after} KiB)"
    );
    assert_still_answers(&served, &sock);
}

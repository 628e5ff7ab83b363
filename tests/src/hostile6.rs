//! Hostile DHCPv6 at a running agent over a veth pair: a hundred thousand
//! mutated messages of the shapes dhclient, iPXE, UEFI HTTP boot and
//! relays send, multicast to All_DHCP_Relay_Agents_and_Servers from the
//! client's port. Afterwards the agent must be alive, no larger than a
//! stated bound, and still answer a known host byte for byte as the one
//! policy and encoder say.

use std::{
    fs,
    net::{Ipv6Addr, SocketAddrV6, UdpSocket},
    time::{Duration, Instant},
};

use pxe_agent::{
    dhcp::v6::{Answer6, Request6, Server6, decide6, reply::encode6},
    inventory::Inventory,
};

use crate::{
    agent::{Privileges, Served},
    dhcp6::{INVENTORY, SERVER_IP6, add_ipv6, server_duid_bytes},
    hostile::rss_kib,
    raw::in_netns,
    rng::Rng,
};

/// six-1 of [`INVENTORY`].
const KNOWN_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x66, 0x00, 0x01];
const UNKNOWN_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x66, 0x00, 0x77];
const MUTATED: usize = 100_000;
/// How much the agent may grow: DHCPv6 keeps nothing per client (no pool
/// leases yet), so what grows is the progress and trace records of the
/// inventory's hosts and allocator slack.
const RSS_GROWTH_BOUND_KIB: u64 = 16 * 1024;

fn opt(code: u16, data: &[u8]) -> Vec<u8> {
    let mut out = code.to_be_bytes().to_vec();
    out.extend_from_slice(&u16::try_from(data.len()).expect("short").to_be_bytes());
    out.extend_from_slice(data);
    out
}

fn message(kind: u8, xid: u32, options: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend_from_slice(&xid.to_be_bytes()[1..]);
    for o in options {
        out.extend_from_slice(o);
    }
    out
}

fn duid_llt(mac: [u8; 6]) -> Vec<u8> {
    let mut duid = vec![0, 1, 0, 1, 0x2e, 0x6b, 0x1e, 0x0f];
    duid.extend_from_slice(&mac);
    duid
}

fn ia_na(iaid: u32) -> Vec<u8> {
    let mut ia = iaid.to_be_bytes().to_vec();
    ia.extend_from_slice(&[0; 8]);
    opt(3, &ia)
}

/// dhclient's Solicit for `mac`.
fn solicit(mac: [u8; 6], xid: u32) -> Vec<u8> {
    message(
        1,
        xid,
        &[
            opt(1, &duid_llt(mac)),
            opt(8, &[0, 0]),
            ia_na(1),
            opt(6, &[0, 23, 0, 24]),
        ],
    )
}

/// The shapes clients send: dhclient's Solicit and Information-Request,
/// iPXE's and UEFI HTTP boot's Solicit with vendor class, architecture and
/// user class, a Confirm, and a Solicit through two relays.
fn seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (n, mac) in [KNOWN_MAC, UNKNOWN_MAC].into_iter().enumerate() {
        let xid = 0x1000 * (n as u32 + 1);
        out.push(solicit(mac, xid));
        out.push(message(
            11,
            xid + 1,
            &[opt(1, &duid_llt(mac)), opt(6, &[0, 23])],
        ));
        let mut vendor = 343u32.to_be_bytes().to_vec();
        vendor.extend_from_slice(&32u16.to_be_bytes());
        vendor.extend_from_slice(b"PXEClient:Arch:00007:UNDI:003016");
        out.push(message(
            1,
            xid + 2,
            &[
                opt(1, &duid_llt(mac)),
                opt(16, &vendor),
                opt(61, &[0, 7]),
                opt(15, &[0, 4, b'i', b'P', b'X', b'E']),
                opt(6, &[0, 23, 0, 59]),
                ia_na(2),
            ],
        ));
        out.push(message(
            1,
            xid + 3,
            &[
                opt(1, &duid_llt(mac)),
                opt(14, &[]),
                opt(61, &[0, 16]),
                ia_na(3),
            ],
        ));
        let mut addr = "fd00:66::101"
            .parse::<Ipv6Addr>()
            .expect("address")
            .octets()
            .to_vec();
        addr.extend_from_slice(&[0; 8]);
        let mut ia = 4u32.to_be_bytes().to_vec();
        ia.extend_from_slice(&[0; 8]);
        ia.extend_from_slice(&opt(5, &addr));
        out.push(message(4, xid + 4, &[opt(1, &duid_llt(mac)), opt(3, &ia)]));
        let inner = solicit(mac, xid + 5);
        let relay = |hops: u8, inner: &[u8]| {
            let mut r = vec![12, hops];
            r.extend_from_slice(&"fd00:66::2".parse::<Ipv6Addr>().expect("a").octets());
            r.extend_from_slice(&"fe80::1".parse::<Ipv6Addr>().expect("a").octets());
            r.extend_from_slice(&opt(18, b"eth0"));
            r.extend_from_slice(&opt(9, inner));
            r
        };
        out.push(relay(1, &relay(0, &inner)));
    }
    out
}

/// One mutation: bytes flipped anywhere, an option length set to anything,
/// truncation, garbage appended, the message type changed, or options
/// replaced by random ones.
fn mutate(rng: &mut Rng, mut p: Vec<u8>) -> Vec<u8> {
    match rng.below(6) {
        0 => {
            for _ in 0..1 + rng.below(8) {
                let at = rng.below(p.len());
                p[at] = rng.next_u64() as u8;
            }
        }
        1 => {
            // A length field of one of the first options.
            let mut at = 4;
            let mut lengths = Vec::new();
            while at + 4 <= p.len() {
                lengths.push(at + 2);
                at += 4 + usize::from(u16::from_be_bytes([p[at + 2], p[at + 3]]));
            }
            if !lengths.is_empty() {
                let at = lengths[rng.below(lengths.len())];
                let value = rng.next_u64() as u16;
                p[at..at + 2].copy_from_slice(&value.to_be_bytes());
            }
        }
        2 => p.truncate(rng.below(p.len())),
        3 => p.extend((0..rng.below(600)).map(|_| rng.next_u64() as u8)),
        4 => p[0] = rng.next_u64() as u8,
        _ => {
            p.truncate(4);
            for _ in 0..rng.below(30) {
                let len = rng.below(60);
                p.extend_from_slice(&(rng.next_u64() as u16 % 100).to_be_bytes());
                p.extend_from_slice(&(len as u16).to_be_bytes());
                p.extend((0..len).map(|_| rng.next_u64() as u8));
            }
        }
    }
    p
}

/// A socket on the client's port in the client namespace, and where the
/// servers' group is on its link.
fn client_socket(served: &Served) -> (UdpSocket, SocketAddrV6) {
    let iface = served.lab.client_if().to_owned();
    in_netns(served.lab.client_ns(), move || {
        let index = pxe_agent::netdev::index_of(&iface).expect("client interface");
        let sock = UdpSocket::bind(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, 546, 0, 0))
            .expect("bind the client port");
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let to = SocketAddrV6::new("ff02::1:2".parse().expect("group"), 547, 0, index);
        (sock, to)
    })
    .expect("enter client namespace")
}

/// The reply the agent must send to `request`: the one policy's answer,
/// encoded as the server encodes it, with the DUID the agent keeps.
fn expected(served: &Served, request: &[u8]) -> Vec<u8> {
    let inv = Inventory::parse(std::path::Path::new("inventory.yaml"), INVENTORY).expect("valid");
    let server = Server6 {
        ip: SERVER_IP6.parse().expect("address"),
        duid: server_duid_bytes(served),
    };
    let req = Request6::parse(request).expect("a valid request");
    match decide6(&req, "fe80::1234".parse().expect("a"), &inv, &server) {
        Answer6::Reply(reply) => encode6(&reply, &req.relays),
        other => panic!("the policy does not answer the known host: {other:?}"),
    }
}

/// The first datagram that comes in `wait` with transaction id `xid`.
fn reply_to(sock: &UdpSocket, xid: u32, wait: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 1500];
    while Instant::now() < deadline {
        let Ok((len, _)) = sock.recv_from(&mut buf) else {
            continue;
        };
        if len >= 4 && buf[1..4] == xid.to_be_bytes()[1..] {
            return Some(buf[..len].to_vec());
        }
    }
    None
}

#[test]
fn a_hundred_thousand_mutated_dhcpv6_messages_leave_the_agent_answering() {
    let served = Served::start_as_prepared(
        "pxhostile6",
        INVENTORY,
        &[],
        Privileges::DaemonSet,
        add_ipv6,
    );
    let (sock, to) = client_socket(&served);
    let pid = served.agent_pid();
    let rss_before = rss_kib(pid);
    let seeds = seeds();
    let mut rng = Rng(0x5eed_d6c6);
    let started = Instant::now();
    for i in 0..MUTATED {
        let payload = mutate(&mut rng, seeds[i % seeds.len()].clone());
        while sock.send_to(&payload, to).is_err() {
            std::thread::sleep(Duration::from_micros(200));
        }
        // Paced so the agent reads them rather than its socket buffer
        // dropping them: what is tested is what it does with each.
        if i % 8 == 7 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let took = started.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        fs::metadata(format!("/proc/{pid}")).is_ok(),
        "the agent is gone"
    );
    let rss_after = rss_kib(pid);
    let stats = served.stats();
    let get = |name: &str| stats.get(name).copied().unwrap_or(0);
    let read = get(r#"pxe_slow_requests_total{family="ipv6"}"#);
    println!(
        "{MUTATED} mutated DHCPv6 messages in {:.1} s; the agent read {read}, malformed {}, \
         answered {}, panics {}; RSS {rss_before} -> {rss_after} KiB",
        took.as_secs_f64(),
        get(r#"pxe_slow_errors_total{family="ipv6",kind="malformed"}"#),
        get(r#"pxe_slow_replies_total{family="ipv6",type="advertise"}"#)
            + get(r#"pxe_slow_replies_total{family="ipv6",type="reply"}"#),
        get(r#"pxe_slow_errors_total{family="ipv6",kind="panic"}"#),
    );
    assert_eq!(
        get(r#"pxe_slow_errors_total{family="ipv6",kind="panic"}"#),
        0,
        "a message panicked the DHCPv6 path; log:\n{}",
        served.log()
    );
    assert!(
        read > MUTATED as u64 / 2,
        "the agent read too few of the messages to test it"
    );
    let grown = rss_after.saturating_sub(rss_before);
    assert!(
        grown < RSS_GROWTH_BOUND_KIB,
        "agent RSS grew by {grown} KiB ({rss_before} -> {rss_after} KiB)"
    );
    // Still answers the known host, exactly.
    while reply_to(&sock, u32::MAX, Duration::from_millis(300)).is_some() {}
    let xid = 0x00ab_cdef;
    let request = solicit(KNOWN_MAC, xid);
    sock.send_to(&request, to).expect("send");
    let got = reply_to(&sock, xid, Duration::from_secs(5))
        .unwrap_or_else(|| panic!("no answer to the known host; log:\n{}", served.log()));
    assert_eq!(
        got,
        expected(&served, &request),
        "the answer differs from the policy's"
    );
}

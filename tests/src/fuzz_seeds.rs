//! The requests real DHCP clients send, seen on the client end of a veth
//! pair while the agent answers them: each must parse and be answered by
//! the slow path's policy as the fast path answered it, and they are the
//! seeds of the `dhcp_request` fuzz target (`fuzz/corpus/dhcp_request/`).
//!
//! With `PXE_FUZZ_SEEDS_OUT=<dir>` set the test also writes them there, one
//! file per request (docs/fuzzing.md: how the corpus is refreshed); without
//! it the committed files are left alone.

use std::{path::PathBuf, time::Duration};

use pxe_agent::{
    dhcp::{Answer, Request, decide},
    fuzzing,
};

use crate::{
    agent::Served,
    frame::Req,
    raw::{RawSocket, in_netns},
};

const INVENTORY: &str = include_str!("../../examples/inventory.yaml");
/// A reserved host of the example inventory.
const CLIENT_MAC: &str = "52:54:00:12:34:56";
const CLIENT_MAC_BYTES: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];
/// Names the directory the seeds are written to.
const SEEDS_OUT_ENV: &str = "PXE_FUZZ_SEEDS_OUT";

/// Runs one DHCP client against the agent until it is bound.
type Client = dyn Fn(&Served);

/// The DHCP payload of an untagged IPv4/UDP frame to port 67.
fn request_payload(frame: &[u8]) -> Option<&[u8]> {
    if frame.get(12..14)? != [0x08, 0x00] || *frame.get(23)? != 17 {
        return None;
    }
    let ihl = usize::from(frame.get(14)? & 0x0f) * 4;
    let udp = 14 + ihl;
    if frame.get(udp + 2..udp + 4)? != [0, 67] {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([frame[udp + 4], frame[udp + 5]]));
    frame.get(udp + 8..udp + len)
}

/// Every request the client end sent since the last drain.
fn drain(sock: &RawSocket) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(frame) = sock
        .recv(Duration::from_millis(200))
        .expect("read the capture socket")
    {
        if let Some(payload) = request_payload(&frame) {
            out.push(payload.to_vec());
        }
    }
    out
}

#[test]
fn real_client_requests_are_answered_by_policy_and_seed_the_fuzzer() {
    let served = Served::start("pxseed", INVENTORY);
    served.set_client_mac(CLIENT_MAC);
    let iface = served.lab.client_if().to_string();
    let sock = in_netns(served.lab.client_ns(), move || RawSocket::open(&iface))
        .expect("enter the client namespace")
        .expect("capture socket on the client end");
    let inv = pxe_agent::inventory::Inventory::parse(std::path::Path::new("inv.yaml"), INVENTORY)
        .expect("the example inventory is valid");

    let mut seeds: Vec<(String, Vec<u8>)> = Vec::new();
    let clients: [(&str, &Client); 6] = [
        ("udhcpc", &|s| drop(s.udhcpc(&[]))),
        ("udhcpc-pxe-bios", &|s| {
            drop(s.udhcpc(&["-V", "PXEClient", "-x", "0x5d:0000"]))
        }),
        ("udhcpc-pxe-uefi", &|s| {
            drop(s.udhcpc(&["-V", "PXEClient:Arch:00007:UNDI:003016", "-x", "0x5d:0007"]))
        }),
        ("udhcpc-http", &|s| {
            drop(s.udhcpc(&["-V", "HTTPClient:Arch:00016:UNDI:003001", "-x", "0x5d:0010"]))
        }),
        ("dhclient", &|s| drop(s.dhclient())),
        ("dhcpcd", &|s| drop(s.dhcpcd())),
    ];
    for (name, run) in clients {
        drain(&sock);
        run(&served);
        let requests = drain(&sock);
        assert!(!requests.is_empty(), "{name}: no request seen on the wire");
        for (i, payload) in requests.into_iter().enumerate() {
            let req = Request::parse(&payload)
                .unwrap_or_else(|e| panic!("{name} request {i} does not parse: {e}"));
            assert!(
                matches!(decide(&req, &inv, &fuzzing::SERVER), Answer::Reply(_)),
                "{name} request {i} ({:?}) is not answered by policy",
                req.msg_type
            );
            seeds.push((format!("{name}-{i}"), payload));
        }
    }
    // iPXE's own requests need a VM; these are the shapes the fast-path
    // tests build for it (user class and option 175), and a relayed one.
    for (name, req) in [
        (
            "built-ipxe",
            Req {
                user_class: Some(b"\x04iPXE"),
                opt175: true,
                ..Req::discover(CLIENT_MAC_BYTES).pxe(7)
            },
        ),
        (
            "built-relayed-82",
            Req {
                giaddr: std::net::Ipv4Addr::new(10, 66, 0, 254),
                relay_info: true,
                ..Req::discover(CLIENT_MAC_BYTES).pxe(0).request()
            },
        ),
    ] {
        seeds.push((name.to_string(), req.payload()));
    }

    if let Some(dir) = std::env::var_os(SEEDS_OUT_ENV).map(PathBuf::from) {
        std::fs::create_dir_all(&dir).expect("seed directory");
        for (name, payload) in &seeds {
            std::fs::write(dir.join(name), payload).expect("write a seed");
        }
    }
}

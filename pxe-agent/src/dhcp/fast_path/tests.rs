//! The fast path's projection, request by request: which requests the
//! kernel answers itself, which it passes up and under what counter, and
//! which it drops, in mode server and in mode proxy.

use std::net::Ipv4Addr;

use super::*;
use crate::{
    dhcp::fixture::{
        self, BARE, RESERVED, SERVER, WORKER, Want, discover, inv, proxy_inv, pxe, request,
        summarize,
    },
    mac::MacAddr,
};

#[test]
fn decisions_by_firmware_host_relay_and_state() {
    let other = Ipv4Addr::new(10, 66, 0, 2);
    let cases: Vec<(&str, Request, Want)> = vec![
        ("plain client", discover(WORKER), Want::Offer(None)),
        (
            "bios pxe",
            pxe(discover(WORKER), 0),
            Want::Offer(Some("undionly.kpxe".into())),
        ),
        (
            "uefi x64 pxe",
            pxe(discover(WORKER), 7),
            Want::Offer(Some("ipxe.efi".into())),
        ),
        (
            "arm64 without a file",
            pxe(discover(WORKER), 11),
            Want::Pass(Counter::PassUnknownHost),
        ),
        (
            "profile without boot",
            pxe(discover(BARE), 7),
            Want::Offer(None),
        ),
        (
            "unknown mac",
            pxe(discover(MacAddr([9; 6])), 0),
            Want::Pass(Counter::PassUnknownHost),
        ),
        (
            "unknown arch",
            pxe(discover(WORKER), 6),
            Want::Pass(Counter::PassUnsupportedClient),
        ),
        (
            "ipxe",
            Request {
                ipxe: true,
                ..pxe(discover(WORKER), 0)
            },
            Want::Pass(Counter::PassIpxe),
        ),
        (
            "relayed in subnet",
            Request {
                giaddr: Ipv4Addr::new(10, 66, 9, 1),
                ..discover(WORKER)
            },
            Want::Offer(None),
        ),
        (
            "relayed foreign",
            Request {
                giaddr: Ipv4Addr::new(192, 0, 2, 1),
                ..discover(WORKER)
            },
            Want::Pass(Counter::PassRelay),
        ),
        (
            "relayed with option 82",
            Request {
                giaddr: Ipv4Addr::new(10, 66, 9, 1),
                relay_info: true,
                ..discover(WORKER)
            },
            Want::Pass(Counter::PassRelay),
        ),
        (
            // A DHCP-snooping switch inserts option 82 and leaves giaddr 0.
            "option 82 from an l2 relay agent",
            Request {
                relay_info: true,
                ..pxe(discover(WORKER), 0)
            },
            Want::Pass(Counter::PassRelay),
        ),
        (
            "selecting us",
            Request {
                server_id: Some(SERVER.ip),
                requested_ip: Some(RESERVED),
                ..request(discover(WORKER))
            },
            Want::Ack,
        ),
        (
            "selecting another server",
            Request {
                server_id: Some(other),
                requested_ip: Some(RESERVED),
                ..request(discover(WORKER))
            },
            Want::Drop,
        ),
        (
            "init-reboot for reservation",
            Request {
                requested_ip: Some(RESERVED),
                ..request(discover(WORKER))
            },
            Want::Ack,
        ),
        (
            "init-reboot for another address",
            Request {
                requested_ip: Some(other),
                ..request(discover(WORKER))
            },
            Want::Pass(Counter::PassRequestMismatch),
        ),
        (
            "renewing",
            Request {
                ciaddr: RESERVED,
                ..request(discover(WORKER))
            },
            Want::Ack,
        ),
        (
            "renewing another address",
            Request {
                ciaddr: other,
                ..request(discover(WORKER))
            },
            Want::Pass(Counter::PassRequestMismatch),
        ),
        (
            "release",
            Request {
                msg_type: Some(MessageType::Release),
                ..discover(WORKER)
            },
            Want::Pass(Counter::PassMessageType),
        ),
        (
            "bootp without message type",
            Request {
                msg_type: None,
                ..discover(WORKER)
            },
            Want::Pass(Counter::PassMessageType),
        ),
    ];
    let inv = inv();
    for (name, req, want) in cases {
        assert_eq!(summarize(fast_path(&req, &inv, &SERVER)), want, "{name}");
    }
}

#[test]
fn the_kernel_gives_the_proxy_offer_and_leaves_option_97_and_requests_alone() {
    let inv = proxy_inv();
    let req = pxe(discover(WORKER), 0);
    let Decision::Reply(r) = fast_path(&req, &inv, &SERVER) else {
        panic!("no fast-path proxy offer")
    };
    assert_eq!(Answer::Reply(r), decide(&req, &inv, &SERVER));
    let mut with_uuid = req.clone();
    with_uuid.more.client_uuid = Some(vec![0; 17]);
    assert_eq!(
        fast_path(&with_uuid, &inv, &SERVER),
        Decision::Pass(Counter::PassClientUuid)
    );
    let selecting = |sid| Request {
        server_id: Some(sid),
        requested_ip: Some(Ipv4Addr::new(10, 66, 1, 10)),
        ..request(req.clone())
    };
    assert_eq!(
        summarize(fast_path(
            &selecting(Ipv4Addr::new(10, 66, 0, 2)),
            &inv,
            &SERVER
        )),
        Want::Drop
    );
    assert_eq!(
        summarize(fast_path(&selecting(SERVER.ip), &inv, &SERVER)),
        Want::Pass(Counter::PassRequestMismatch)
    );
    // What a subnet in mode server answers is unchanged.
    let Decision::Reply(server_mode) = fast_path(&req, &fixture::inv(), &SERVER) else {
        panic!("no server-mode offer")
    };
    assert!(!server_mode.is_proxy());
    assert_eq!(server_mode.yiaddr, RESERVED);
}

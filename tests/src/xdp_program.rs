//! The XDP program in the kernel (`BPF_PROG_TEST_RUN`) on crafted requests:
//! every answer is checked field by field and against the complete slow
//! path (`decide` and `encode` on the same inventory); every pass and drop
//! against its counter and against `fast_path`, the projection of `decide`
//! that says what the kernel can answer.

use std::net::Ipv4Addr;

use dhcproto::{
    Decodable as _, Decoder,
    v4::{DhcpOption, Message, MessageType, Opcode, OptionCode},
};
use pxe_agent::dhcp::{Answer, Decision, Request, decide, encode, fast_path};
use pxe_ebpf_common::Counter;

use crate::{
    fixture::{BARE_MAC, Fixture, UNKNOWN_MAC, WORKER_MAC, XDP_DROP, XDP_PASS, XDP_TX},
    frame::{
        RELAY_MAC, Req, SERVER_IP, SERVER_MAC, client_broadcast, parse_reply, udp_frame,
        vlan_tagged,
    },
};

const NODE1: Ipv4Addr = Ipv4Addr::new(10, 66, 1, 10);

/// Runs `req`, expects XDP_TX, checks headers and checksums, and checks the
/// DHCP payload is byte for byte what the slow path encodes.
fn expect_reply(fx: &Fixture, req: &Req, counter: Counter) -> (crate::frame::Reply, Message) {
    let before = fx.stats();
    let (action, out) = fx.run(&req.frame());
    assert_eq!(action, XDP_TX, "expected XDP_TX for {req:?}");
    assert_eq!(
        fx.stats().get(counter),
        before.get(counter) + 1,
        "{counter:?} not counted"
    );
    let reply = parse_reply(&out);
    assert!(reply.ip_csum_ok, "bad IPv4 header checksum");
    assert!(reply.udp_csum_ok, "bad UDP checksum");
    assert_eq!(reply.eth_src, SERVER_MAC);
    assert_eq!(reply.ip_src, SERVER_IP);
    assert_eq!(reply.sport, 67);

    let parsed = Request::parse(&req.payload()).expect("request parses");
    match decide(&parsed, &fx.inv, &fx.server) {
        Answer::Reply(r) => {
            let slow = encode(&r, &parsed).expect("slow path encodes");
            assert_eq!(
                slow, reply.payload,
                "XDP reply differs from the slow path's encoding"
            );
        }
        other => panic!("slow path decided {other:?} where XDP answered"),
    }
    let msg = Message::decode(&mut Decoder::new(&reply.payload)).expect("reply decodes");
    assert_eq!(msg.opcode(), Opcode::BootReply);
    assert_eq!(msg.xid(), req.xid);
    assert_eq!(msg.chaddr(), &req.mac);
    assert_eq!(msg.giaddr(), req.giaddr);
    (reply, msg)
}

/// Runs `frame`, expects `action`, and that exactly `counter` moved.
fn expect_verdict(fx: &Fixture, frame: &[u8], action: u32, counter: Counter) {
    let before = fx.stats();
    let (got, _) = fx.run(frame);
    assert_eq!(
        got, action,
        "wrong XDP action, expected counter {counter:?}"
    );
    let after = fx.stats();
    assert_eq!(
        after.get(counter),
        before.get(counter) + 1,
        "{counter:?} not counted"
    );
    assert_eq!(
        after.get(Counter::Rx),
        before.get(Counter::Rx) + 1,
        "rx not counted"
    );
    let moved: u64 = Counter::ALL
        .iter()
        .filter(|c| **c != Counter::Rx)
        .map(|c| after.get(*c) - before.get(*c))
        .sum();
    assert_eq!(moved, 1, "more than one outcome counter moved");
}

/// Like `expect_verdict`, and the slow path's policy agrees.
fn expect_declined(fx: &Fixture, req: &Req, action: u32, counter: Counter) {
    expect_verdict(fx, &req.frame(), action, counter);
    let parsed = Request::parse(&req.payload()).expect("request parses");
    let want = if action == XDP_DROP {
        Decision::Drop(counter)
    } else {
        Decision::Pass(counter)
    };
    assert_eq!(
        fast_path(&parsed, &fx.inv, &fx.server),
        want,
        "the policy's projection disagrees"
    );
}

/// The BOOTP `file` field as text, without its NUL padding.
fn file(msg: &Message) -> Option<&str> {
    let raw = msg.fname()?;
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    Some(std::str::from_utf8(&raw[..end]).expect("file is text")).filter(|f| !f.is_empty())
}

fn opt(msg: &Message, code: OptionCode) -> Option<&DhcpOption> {
    msg.opts().get(code)
}

fn assert_common_options(msg: &Message, kind: MessageType) {
    assert_eq!(
        opt(msg, OptionCode::MessageType),
        Some(&DhcpOption::MessageType(kind))
    );
    assert_eq!(
        opt(msg, OptionCode::ServerIdentifier),
        Some(&DhcpOption::ServerIdentifier(SERVER_IP))
    );
    assert_eq!(
        opt(msg, OptionCode::AddressLeaseTime),
        Some(&DhcpOption::AddressLeaseTime(3600))
    );
    assert_eq!(
        opt(msg, OptionCode::SubnetMask),
        Some(&DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 0, 0)))
    );
    assert_eq!(
        opt(msg, OptionCode::Router),
        Some(&DhcpOption::Router(vec![SERVER_IP]))
    );
}

#[test]
fn bios_pxe_discover_gets_offer_with_tftp_bootfile() {
    let fx = Fixture::new();
    let req = Req::discover(WORKER_MAC).pxe(0);
    let (r, msg) = expect_reply(&fx, &req, Counter::TxOffer);
    assert_common_options(&msg, MessageType::Offer);
    assert_eq!(msg.yiaddr(), NODE1);
    assert_eq!(msg.siaddr(), SERVER_IP);
    assert_eq!(file(&msg), Some("undionly.kpxe"));
    assert_eq!(msg.ciaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(
        opt(&msg, OptionCode::Hostname),
        Some(&DhcpOption::Hostname("node-1".into()))
    );
    // RFC 2131 4.1: no broadcast bit, no ciaddr: unicast to yiaddr and chaddr.
    assert_eq!((r.eth_dst, r.ip_dst, r.dport), (WORKER_MAC, NODE1, 68));
}

#[test]
fn uefi_pxe_discover_gets_uefi_bootfile() {
    let fx = Fixture::new();
    let (_, msg) = expect_reply(&fx, &Req::discover(WORKER_MAC).pxe(7), Counter::TxOffer);
    assert_eq!(file(&msg), Some("ipxe.efi"));
    let (_, msg) = expect_reply(&fx, &Req::discover(WORKER_MAC).pxe(11), Counter::TxOffer);
    assert_eq!(file(&msg), Some("ipxe-arm64.efi"));
}

#[test]
fn uefi_http_boot_gets_url_and_httpclient_echo() {
    let fx = Fixture::new();
    let (_, msg) = expect_reply(&fx, &Req::discover(WORKER_MAC).http(), Counter::TxOffer);
    assert_eq!(
        opt(&msg, OptionCode::BootfileName),
        Some(&DhcpOption::BootfileName(
            b"http://10.66.0.1:8080/ipxe.efi".to_vec()
        ))
    );
    assert_eq!(
        opt(&msg, OptionCode::ClassIdentifier),
        Some(&DhcpOption::ClassIdentifier(b"HTTPClient".to_vec()))
    );
    assert_eq!(file(&msg), None);
}

#[test]
fn broadcast_bit_gets_broadcast_reply() {
    let fx = Fixture::new();
    let mut req = Req::discover(WORKER_MAC).pxe(0);
    req.broadcast = true;
    let (r, msg) = expect_reply(&fx, &req, Counter::TxOffer);
    assert_eq!(
        (r.eth_dst, r.ip_dst, r.dport),
        ([0xff; 6], Ipv4Addr::BROADCAST, 68)
    );
    assert!(msg.flags().broadcast());
}

#[test]
fn plain_client_gets_address_without_boot_answer_and_extra_options() {
    let fx = Fixture::new();
    let (_, msg) = expect_reply(&fx, &Req::discover(WORKER_MAC), Counter::TxOffer);
    assert_eq!(file(&msg), None);
    assert_eq!(msg.siaddr(), Ipv4Addr::UNSPECIFIED);
    assert!(opt(&msg, OptionCode::BootfileName).is_none());
    // The per-host extra option 42 (NTP servers).
    let ntp = msg.opts().get(OptionCode::from(42)).expect("option 42");
    assert_eq!(ntp, &DhcpOption::NtpServers(vec![SERVER_IP]));
}

#[test]
fn profile_without_boot_block_answers_pxe_with_address_only() {
    let fx = Fixture::new();
    let (_, msg) = expect_reply(&fx, &Req::discover(BARE_MAC).pxe(7), Counter::TxOffer);
    assert_eq!(msg.yiaddr(), Ipv4Addr::new(10, 66, 1, 11));
    assert_eq!(file(&msg), None);
}

#[test]
fn selecting_request_for_us_gets_ack() {
    let fx = Fixture::new();
    let mut req = Req::discover(WORKER_MAC).pxe(7).request();
    req.server_id = Some(SERVER_IP);
    req.requested_ip = Some(NODE1);
    let (_, msg) = expect_reply(&fx, &req, Counter::TxAck);
    assert_common_options(&msg, MessageType::Ack);
    assert_eq!(msg.yiaddr(), NODE1);
    assert_eq!(file(&msg), Some("ipxe.efi"));
}

#[test]
fn init_reboot_request_for_reservation_gets_ack() {
    let fx = Fixture::new();
    let mut req = Req::discover(WORKER_MAC).request();
    req.requested_ip = Some(NODE1);
    let (_, msg) = expect_reply(&fx, &req, Counter::TxAck);
    assert_eq!(msg.yiaddr(), NODE1);
}

#[test]
fn renew_with_ciaddr_gets_unicast_ack_echoing_ciaddr() {
    let fx = Fixture::new();
    let mut req = Req::discover(WORKER_MAC).request();
    req.ciaddr = NODE1;
    let (r, msg) = expect_reply(&fx, &req, Counter::TxAck);
    assert_eq!(msg.ciaddr(), NODE1);
    assert_eq!((r.eth_dst, r.ip_dst, r.dport), (WORKER_MAC, NODE1, 68));
}

#[test]
fn relayed_discover_in_subnet_goes_back_to_the_relay() {
    let fx = Fixture::new();
    let mut req = Req::discover(WORKER_MAC).pxe(0);
    req.giaddr = Ipv4Addr::new(10, 66, 200, 1);
    let (r, msg) = expect_reply(&fx, &req, Counter::TxOffer);
    assert_eq!(msg.yiaddr(), NODE1);
    assert_eq!((r.eth_dst, r.ip_dst, r.dport), (RELAY_MAC, req.giaddr, 67));
}

#[test]
fn relayed_with_option_82_is_passed() {
    let fx = Fixture::new();
    let mut req = Req::discover(WORKER_MAC).pxe(0);
    req.giaddr = Ipv4Addr::new(10, 66, 200, 1);
    req.relay_info = true;
    expect_declined(&fx, &req, XDP_PASS, Counter::PassRelay);
}

#[test]
fn option_82_from_a_snooping_switch_without_giaddr_is_passed() {
    // RFC 3046 2.2: the answer must echo option 82, which only the slow
    // path does; a DHCP-snooping switch inserts it and leaves giaddr 0.
    let fx = Fixture::new();
    let mut req = Req::discover(WORKER_MAC).pxe(0);
    req.relay_info = true;
    expect_declined(&fx, &req, XDP_PASS, Counter::PassRelay);
}

#[test]
fn a_routed_renewal_is_answered_to_the_router_it_came_through() {
    // RENEWING behind a router: unicast to us, ciaddr set, giaddr 0, the
    // frame from the router's MAC. The ACK goes back to that MAC.
    let fx = Fixture::new();
    let router = [0xa6, 0x59, 0xb4, 0xcc, 0x64, 0x43];
    let mut req = Req::discover(WORKER_MAC).request();
    req.ciaddr = NODE1;
    let frame = udp_frame(router, SERVER_MAC, NODE1, SERVER_IP, 68, 67, &req.payload());
    let (action, out) = fx.run(&frame);
    assert_eq!(action, XDP_TX);
    let r = parse_reply(&out);
    assert_eq!((r.eth_dst, r.ip_dst, r.dport), (router, NODE1, 68));
}

#[test]
fn frames_addressed_to_another_machine_are_passed() {
    let fx = Fixture::new();
    let req = Req::discover(WORKER_MAC).pxe(0);
    let other_mac = [0x02, 0, 0, 0, 0, 0x42];
    let to_other_mac = udp_frame(
        WORKER_MAC,
        other_mac,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::BROADCAST,
        68,
        67,
        &req.payload(),
    );
    expect_verdict(&fx, &to_other_mac, XDP_PASS, Counter::PassNotForUs);
    let to_other_ip = udp_frame(
        WORKER_MAC,
        SERVER_MAC,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::new(10, 66, 0, 2),
        68,
        67,
        &req.payload(),
    );
    expect_verdict(&fx, &to_other_ip, XDP_PASS, Counter::PassNotForUs);
    // To us by address, and broadcast, are answered.
    let to_us = udp_frame(
        WORKER_MAC,
        SERVER_MAC,
        Ipv4Addr::UNSPECIFIED,
        SERVER_IP,
        68,
        67,
        &req.payload(),
    );
    assert_eq!(fx.run(&to_us).0, XDP_TX);
}

#[test]
fn uefi_http_boot_of_an_architecture_without_a_url_is_left_to_the_slow_path() {
    // The worker profile has an x64 `http` URL only: an arm64 (19) or IA32
    // (15) HTTP-boot client must not be told to fetch it.
    let fx = Fixture::new();
    for arch in [15, 19] {
        let mut req = Req::discover(WORKER_MAC).http();
        req.arch = Some(arch);
        expect_declined(&fx, &req, XDP_PASS, Counter::PassUnknownHost);
        let parsed = Request::parse(&req.payload()).expect("parses");
        let Answer::Reply(reply) = decide(&parsed, &fx.inv, &fx.server) else {
            panic!("the slow path does not answer arch {arch}")
        };
        assert_eq!(reply.file, None);
        assert!(
            reply.options.get(OptionCode::BootfileName).is_none(),
            "arch {arch} was given a boot URL"
        );
    }
}

#[test]
fn relayed_from_foreign_giaddr_is_passed() {
    let fx = Fixture::new();
    let mut req = Req::discover(WORKER_MAC).pxe(0);
    req.giaddr = Ipv4Addr::new(192, 0, 2, 1);
    expect_declined(&fx, &req, XDP_PASS, Counter::PassRelay);
}

#[test]
fn ipxe_user_class_is_passed_to_slow_path() {
    let fx = Fixture::new();
    let mut req = Req::discover(WORKER_MAC).pxe(0);
    req.user_class = Some(b"\x04iPXE");
    expect_declined(&fx, &req, XDP_PASS, Counter::PassIpxe);
}

#[test]
fn ipxe_option_175_is_passed_to_slow_path() {
    let fx = Fixture::new();
    let mut req = Req::discover(WORKER_MAC).pxe(7);
    req.opt175 = true;
    expect_declined(&fx, &req, XDP_PASS, Counter::PassIpxe);
}

#[test]
fn unknown_mac_is_passed_to_stack() {
    let fx = Fixture::new();
    expect_declined(
        &fx,
        &Req::discover(UNKNOWN_MAC).pxe(0),
        XDP_PASS,
        Counter::PassUnknownHost,
    );
}

#[test]
fn unsupported_firmware_arch_is_passed() {
    let fx = Fixture::new();
    expect_declined(
        &fx,
        &Req::discover(WORKER_MAC).pxe(6),
        XDP_PASS,
        Counter::PassUnsupportedClient,
    );
}

#[test]
fn request_selecting_another_server_is_dropped() {
    let fx = Fixture::new();
    let mut req = Req::discover(WORKER_MAC).request();
    req.server_id = Some(Ipv4Addr::new(10, 66, 0, 2));
    req.requested_ip = Some(NODE1);
    expect_declined(&fx, &req, XDP_DROP, Counter::DropOtherServer);
}

#[test]
fn request_for_another_address_is_passed_not_nakked() {
    let fx = Fixture::new();
    let mut req = Req::discover(WORKER_MAC).request();
    req.requested_ip = Some(Ipv4Addr::new(10, 66, 1, 99));
    expect_declined(&fx, &req, XDP_PASS, Counter::PassRequestMismatch);
}

#[test]
fn release_and_inform_are_passed() {
    let fx = Fixture::new();
    let mut req = Req::discover(WORKER_MAC);
    req.msg_type = MessageType::Release;
    expect_declined(&fx, &req, XDP_PASS, Counter::PassMessageType);
    req.msg_type = MessageType::Inform;
    expect_declined(&fx, &req, XDP_PASS, Counter::PassMessageType);
}

#[test]
fn vlan_tagged_request_is_passed() {
    let fx = Fixture::new();
    let frame = vlan_tagged(&Req::discover(WORKER_MAC).pxe(0).frame(), 100);
    expect_verdict(&fx, &frame, XDP_PASS, Counter::PassVlan);
}

#[test]
fn ip_options_and_fragments_are_passed() {
    let fx = Fixture::new();
    let good = Req::discover(WORKER_MAC).pxe(0).frame();
    let mut frag = good.clone();
    frag[14 + 6] = 0x20; // more fragments
    expect_verdict(&fx, &frag, XDP_PASS, Counter::PassIp);
    // ihl 6: one word of IP options (checksum not fixed: the stack's concern).
    let mut opts = good[..34].to_vec();
    opts[14] = 0x46;
    let total = u16::from_be_bytes([good[16], good[17]]) + 4;
    opts[16..18].copy_from_slice(&total.to_be_bytes());
    opts.extend_from_slice(&[1, 1, 1, 0]);
    opts.extend_from_slice(&good[34..]);
    expect_verdict(&fx, &opts, XDP_PASS, Counter::PassIp);
}

#[test]
fn truncated_request_is_passed_as_malformed() {
    let fx = Fixture::new();
    let good = Req::discover(WORKER_MAC).pxe(0).frame();
    // IP claims more than the frame holds.
    expect_verdict(&fx, &good[..200], XDP_PASS, Counter::PassMalformed);
    // Consistent headers but a BOOTP message shorter than its fixed part.
    let short = client_broadcast(WORKER_MAC, &good[42..42 + 200]);
    expect_verdict(&fx, &short, XDP_PASS, Counter::PassMalformed);
}

#[test]
fn missing_end_option_is_passed_as_malformed() {
    let fx = Fixture::new();
    let mut payload = Req::discover(WORKER_MAC).pxe(0).payload();
    let end = payload.iter().rposition(|b| *b == 255).expect("end option");
    payload[end] = 0;
    let frame = client_broadcast(WORKER_MAC, &payload);
    expect_verdict(&fx, &frame, XDP_PASS, Counter::PassMalformed);
}

#[test]
fn option_running_past_the_message_is_passed_as_malformed() {
    let fx = Fixture::new();
    let mut payload = Req::discover(WORKER_MAC).payload();
    payload.truncate(payload.iter().rposition(|b| *b == 255).expect("end option"));
    payload.extend_from_slice(&[224, 200, 1, 2, 3]);
    let frame = client_broadcast(WORKER_MAC, &payload);
    expect_verdict(&fx, &frame, XDP_PASS, Counter::PassMalformed);
}

#[test]
fn oversized_option_list_is_passed() {
    let fx = Fixture::new();
    let mut req = Req::discover(WORKER_MAC).pxe(0);
    // More options than the bounded walk reads.
    req.extra = (0..70)
        .map(|i| (180 + (i % 40) as u8, vec![i as u8]))
        .collect();
    // dhcproto keeps one option per code: 40 distinct codes plus the rest.
    let mut payload = req.payload();
    let end = payload.iter().rposition(|b| *b == 255).expect("end option");
    payload.truncate(end);
    for i in 0..40u8 {
        payload.extend_from_slice(&[230, 1, i]);
    }
    payload.push(255);
    let frame = client_broadcast(WORKER_MAC, &payload);
    expect_verdict(&fx, &frame, XDP_PASS, Counter::PassOptions);
}

#[test]
fn non_dhcp_traffic_is_passed_uncounted() {
    let fx = Fixture::new();
    let frame = udp_frame(
        WORKER_MAC, SERVER_MAC, NODE1, SERVER_IP, 5353, 53, &[0u8; 40],
    );
    let before = fx.stats();
    assert_eq!(fx.run(&frame).0, XDP_PASS);
    assert_eq!(fx.stats(), before);
}

#[test]
fn reply_cost_in_kernel_is_reported() {
    // Not a timed assertion: prints the figure `cargo xtask bench dhcp` tables.
    let fx = Fixture::new();
    let frame = Req::discover(WORKER_MAC).pxe(7).frame();
    assert_eq!(fx.run(&frame).0, XDP_TX);
    let per_run = fx.time_per_run(&frame, 100_000);
    println!(
        "BPF_PROG_TEST_RUN: {} ns per PXE DISCOVER -> OFFER",
        per_run.as_nanos()
    );
}

#[test]
fn rule_the_fast_path_cannot_express_sends_the_class_to_the_slow_path() {
    let fx = Fixture::with_inventory(
        r#"
subnets:
  - {cidr: 10.66.0.0/16, router: 10.66.0.1, lease_time: 3600}
profiles:
  - name: worker
    boot: {bios: undionly.kpxe, uefi: ipxe.efi}
    rules:
      - match: {labels: {rack: r1}}
        boot: {bios: rack1.kpxe}
      # The arch list keeps this rule off the BIOS class, which stays fast.
      - match: {arch: [7, 9], vendor_class: "PXEClient:Arch:00007:UNDI:003016"}
        boot: {uefi: vendor.efi}
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, profile: worker, labels: {rack: r1}}
"#,
    );
    // The label rule is compiled in: BIOS is answered in the kernel.
    let (_, msg) = expect_reply(&fx, &Req::discover(WORKER_MAC).pxe(0), Counter::TxOffer);
    assert_eq!(file(&msg), Some("rack1.kpxe"));
    // The vendor-class rule needs the request: UEFI goes up, and the slow
    // path answers with the rule's file.
    let req = Req::discover(WORKER_MAC).pxe(7);
    expect_verdict(&fx, &req.frame(), XDP_PASS, Counter::PassUnknownHost);
    let parsed = Request::parse(&req.payload()).expect("parses");
    let pxe_agent::dhcp::Answer::Reply(reply) =
        pxe_agent::dhcp::decide(&parsed, &fx.inv, &fx.server)
    else {
        panic!("slow path did not answer")
    };
    assert_eq!(reply.file.as_deref(), Some("vendor.efi"));
}

#[test]
fn a_reload_past_the_maps_capacity_leaves_the_previous_inventory_in_force() {
    use pxe_agent::xdp::SyncError;
    use pxe_ebpf_common::{DEFAULT_HOSTS, MacKey};
    let mut fx = Fixture::new();
    let old = pxe_agent::dhcp::template::compile(&fx.inv, &fx.server).expect("compiles");
    // The fixture's hosts, each changed, and more new ones than fit.
    let mut desired = old.clone();
    let sample = old.hosts.records().next().expect("a host");
    desired.hosts = old
        .hosts
        .iter()
        .map(|(key, mut record)| {
            record.yiaddr = [10, 66, 9, 9];
            (*key, record)
        })
        .chain((0..DEFAULT_HOSTS).map(|n| {
            let [_, a, b, c] = n.to_be_bytes();
            (MacKey::new([0x02, 0x77, 0, a, b, c]), sample)
        }))
        .collect();
    let err = fx
        .fast
        .sync(desired)
        .expect_err("more hosts than the map holds");
    assert!(matches!(err, SyncError::RolledBack { .. }), "{err}");
    let keys: Vec<MacKey> = fx
        .fast
        .maps_mut()
        .hosts
        .keys()
        .map(|k| k.expect("key"))
        .collect();
    assert_eq!(
        keys.len(),
        old.hosts.len(),
        "the map is not the previous inventory"
    );
    assert!(keys.iter().all(|k| old.hosts.contains_key(k)));
    // And the old replies, not the changed ones, are what the kernel sends.
    let (_, msg) = expect_reply(&fx, &Req::discover(WORKER_MAC).pxe(0), Counter::TxOffer);
    assert_eq!(msg.yiaddr(), NODE1);
}

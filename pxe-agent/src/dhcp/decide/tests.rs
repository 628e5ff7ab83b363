//! The policy, request by request: reserved hosts by firmware class and
//! user class, relays and option 82, pool clients alone and with shared
//! pools, declines, several interfaces, proxyDHCP and netboot; where the
//! kernel answers too, its answer is checked against the same cases.

use std::path::Path;

use dhcproto::v4::{DhcpOption, UnknownOption};
use pxe_ebpf_common::VendorClass;

use super::*;
use crate::dhcp::{
    fast_path::{Decision, fast_path},
    fixture::{
        BARE, RESERVED, SERVER, WORKER, Want, discover, inv, proxy_inv, pxe, request, summarize,
    },
    reply::BOOT_OPTIONS,
};

#[test]
fn http_boot_gets_url_with_server_expanded_and_class_echo() {
    let inv = inv();
    let req = Request {
        arch: Some(16),
        vendor: VendorClass::HttpClient,
        ..discover(WORKER)
    };
    let Decision::Reply(r) = fast_path(&req, &inv, &SERVER) else {
        panic!("no reply")
    };
    assert_eq!(
        r.options.get(OptionCode::BootfileName),
        Some(&DhcpOption::BootfileName(
            b"http://10.66.0.1/ipxe.efi".to_vec()
        ))
    );
    assert_eq!(
        r.options.get(OptionCode::ClassIdentifier),
        Some(&DhcpOption::ClassIdentifier(b"HTTPClient".to_vec()))
    );
    assert_eq!(r.file, None);
    assert_eq!(r.siaddr, Ipv4Addr::UNSPECIFIED);
}

#[test]
fn reply_carries_subnet_options_lease_and_server_id() {
    let inv = inv();
    let Decision::Reply(r) = fast_path(&discover(WORKER), &inv, &SERVER) else {
        panic!("no reply")
    };
    assert_eq!(r.yiaddr, RESERVED);
    assert_eq!(
        r.options.get(OptionCode::SubnetMask),
        Some(&DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 0, 0)))
    );
    assert_eq!(
        r.options.get(OptionCode::Router),
        Some(&DhcpOption::Router(vec![SERVER.ip]))
    );
    assert_eq!(
        r.options.get(OptionCode::AddressLeaseTime),
        Some(&DhcpOption::AddressLeaseTime(600))
    );
    assert_eq!(
        r.options.get(OptionCode::ServerIdentifier),
        Some(&DhcpOption::ServerIdentifier(SERVER.ip))
    );
    assert_eq!(
        r.options.get(OptionCode::MessageType),
        Some(&DhcpOption::MessageType(MessageType::Offer))
    );
}

const SLOW_INV: &str = r#"
subnets:
  - {cidr: 10.66.0.0/16, router: 10.66.0.1, pool: {start: 10.66.200.1, end: 10.66.200.9}}
  - {cidr: 10.77.0.0/24, router: 10.77.0.1, pool: {start: 10.77.0.100, end: 10.77.0.120}}
  - {cidr: 10.88.0.0/24, router: 10.88.0.1}
discovery: {policy: inspect, profile: inspector}
profiles:
  - name: worker
    boot: {bios: undionly.kpxe, uefi: ipxe.efi}
    rules:
      - match: {vendor_class: "PXEClient:Arch:00007:UNDI:003016"}
        boot: {uefi: vendor.efi}
  - name: installer
    chain: "http://installer.example/{mac}.ipxe"
  - name: inspector
    boot: {bios: inspect.kpxe, uefi: inspect.efi}
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, profile: worker}
  - {mac: "52:54:00:00:00:03", ip: 10.66.1.12, profile: installer}
"#;

/// An answer reduced to what a table row checks.
#[derive(Debug, PartialEq)]
enum Slow {
    Offer {
        ip: Ipv4Addr,
        file: Option<String>,
        url: Option<String>,
    },
    Ack,
    Nak,
    Pool {
        subnet: usize,
        ack: bool,
        wanted: Option<Ipv4Addr>,
    },
    Ignore(Counter),
    Release(Ipv4Addr),
    NotOurs,
}

fn slow(a: Answer) -> Slow {
    match a {
        Answer::Reply(r) if r.kind == ReplyKind::Nak => Slow::Nak,
        Answer::Reply(r) if r.kind == ReplyKind::Ack => Slow::Ack,
        Answer::Reply(r) => Slow::Offer {
            ip: r.yiaddr,
            file: r.file,
            url: match r.options.get(OptionCode::BootfileName) {
                Some(DhcpOption::BootfileName(u)) => Some(String::from_utf8_lossy(u).into_owned()),
                _ => None,
            },
        },
        Answer::Pool(p) => Slow::Pool {
            subnet: p.subnet,
            ack: p.kind == ReplyKind::Ack,
            wanted: p.wanted,
        },
        Answer::Ignore(c) => Slow::Ignore(c),
        Answer::Release { ip } => Slow::Release(ip),
        Answer::NotOurs => Slow::NotOurs,
        Answer::Decline { .. } | Answer::ReservationDeclined { .. } => {
            panic!("unexpected decline")
        }
    }
}

fn ipxe(mut r: Request) -> Request {
    r.ipxe = true;
    r.more.user_classes = vec![b"iPXE".to_vec()];
    r
}

fn vendor(mut r: Request, v: &[u8]) -> Request {
    r.more.vendor_class = Some(v.to_vec());
    r
}

fn relayed(mut r: Request, giaddr: [u8; 4], option82: bool) -> Request {
    r.giaddr = giaddr.into();
    if option82 {
        r.relay_info = true;
        r.more.relay_agent_info = Some(vec![1, 4, b'p', b'o', b'r', b't']);
    }
    r
}

#[test]
fn slow_path_decisions_by_firmware_user_class_host_and_relay() {
    let inv = Inventory::parse(Path::new("t.yaml"), SLOW_INV).expect("valid");
    let unknown = MacAddr([0x52, 0x54, 0, 0, 0, 0x7f]);
    let installer = MacAddr([0x52, 0x54, 0, 0, 0, 3]);
    let offer = |ip: [u8; 4], file: Option<&str>, url: Option<&str>| Slow::Offer {
        ip: ip.into(),
        file: file.map(Into::into),
        url: url.map(Into::into),
    };
    let cases: Vec<(&str, Request, Slow)> = vec![
        (
            "known bios pxe",
            pxe(discover(WORKER), 0),
            offer([10, 66, 1, 10], Some("undionly.kpxe"), None),
        ),
        (
            "known ipxe chains to its script",
            ipxe(pxe(discover(WORKER), 0)),
            offer(
                [10, 66, 1, 10],
                None,
                Some("http://10.66.0.1:8080/boot/52:54:00:00:00:01.ipxe"),
            ),
        ),
        (
            "profile chain overrides the script",
            ipxe(discover(installer)),
            offer(
                [10, 66, 1, 12],
                None,
                Some("http://installer.example/52:54:00:00:00:03.ipxe"),
            ),
        ),
        (
            "vendor class rule picks its file",
            vendor(
                pxe(discover(WORKER), 7),
                b"PXEClient:Arch:00007:UNDI:003016",
            ),
            offer([10, 66, 1, 10], Some("vendor.efi"), None),
        ),
        (
            "other vendor class keeps the profile's file",
            vendor(
                pxe(discover(WORKER), 7),
                b"PXEClient:Arch:00007:UNDI:003000",
            ),
            offer([10, 66, 1, 10], Some("ipxe.efi"), None),
        ),
        (
            "unsupported firmware still gets its address",
            pxe(discover(WORKER), 6),
            offer([10, 66, 1, 10], None, None),
        ),
        (
            "relayed with option 82 in its subnet",
            relayed(pxe(discover(WORKER), 0), [10, 66, 9, 1], true),
            offer([10, 66, 1, 10], Some("undionly.kpxe"), None),
        ),
        (
            "relayed from another segment",
            relayed(discover(WORKER), [10, 77, 0, 1], true),
            Slow::Ignore(Counter::PassRelay),
        ),
        (
            "wrong address gets a nak",
            Request {
                requested_ip: Some(Ipv4Addr::new(10, 66, 1, 99)),
                ..request(discover(WORKER))
            },
            Slow::Nak,
        ),
        (
            "request for another server is ignored",
            Request {
                server_id: Some(Ipv4Addr::new(10, 66, 0, 2)),
                requested_ip: Some(Ipv4Addr::new(10, 66, 1, 99)),
                ..request(discover(WORKER))
            },
            Slow::Ignore(Counter::DropOtherServer),
        ),
        (
            "reservation renewal",
            Request {
                ciaddr: RESERVED,
                ..request(discover(WORKER))
            },
            Slow::Ack,
        ),
        (
            "unknown direct",
            pxe(discover(unknown), 7),
            Slow::Pool {
                subnet: 0,
                ack: false,
                wanted: None,
            },
        ),
        (
            "unknown selecting us",
            Request {
                server_id: Some(SERVER.ip),
                requested_ip: Some(Ipv4Addr::new(10, 66, 200, 1)),
                ..request(discover(unknown))
            },
            Slow::Pool {
                subnet: 0,
                ack: true,
                wanted: Some(Ipv4Addr::new(10, 66, 200, 1)),
            },
        ),
        (
            "unknown relayed: subnet by giaddr",
            relayed(discover(unknown), [10, 77, 0, 1], true),
            Slow::Pool {
                subnet: 1,
                ack: false,
                wanted: None,
            },
        ),
        (
            "unknown relayed from a subnet without a pool",
            relayed(discover(unknown), [10, 88, 0, 1], false),
            Slow::Ignore(Counter::PassUnknownHost),
        ),
        (
            "unknown release",
            Request {
                msg_type: Some(MessageType::Release),
                ciaddr: Ipv4Addr::new(10, 66, 200, 1),
                ..discover(unknown)
            },
            Slow::Release(Ipv4Addr::new(10, 66, 200, 1)),
        ),
    ];
    for (name, req, want) in cases {
        assert_eq!(slow(decide(&req, &inv, &SERVER)), want, "{name}");
    }
    let mut ignoring = inv.clone();
    ignoring.discovery.policy = DiscoveryPolicy::Ignore;
    assert_eq!(
        slow(decide(&discover(unknown), &ignoring, &SERVER)),
        Slow::Ignore(Counter::PassUnknownHost)
    );
}

#[test]
fn ipxe_answer_disables_proxydhcp_wait_and_echoes_option_82() {
    let inv = Inventory::parse(Path::new("t.yaml"), SLOW_INV).expect("valid");
    let req = relayed(ipxe(discover(WORKER)), [10, 66, 9, 1], true);
    let Answer::Reply(r) = decide(&req, &inv, &SERVER) else {
        panic!("no reply")
    };
    let encap = r.options.get(OptionCode::from(175)).expect("option 175");
    assert_eq!(
        encap,
        &DhcpOption::Unknown(UnknownOption::new(OptionCode::from(175), vec![176, 1, 1]))
    );
    let echoed = r
        .options
        .get(OptionCode::RelayAgentInformation)
        .expect("option 82");
    let mut bytes = Vec::new();
    dhcproto::Encodable::encode(echoed, &mut dhcproto::Encoder::new(&mut bytes)).expect("encodes");
    assert_eq!(bytes, [82, 6, 1, 4, b'p', b'o', b'r', b't']);
}

#[test]
fn configured_user_class_marks_ipxe_clients() {
    let yaml = format!(
        "{SLOW_INV}ipxe: {{user_class: corp-ipxe, script: \"http://{{server}}/s/{{mac}}\"}}\n"
    );
    let inv = Inventory::parse(Path::new("t.yaml"), &yaml).expect("valid");
    let stock = ipxe(discover(WORKER));
    let Answer::Reply(r) = decide(&stock, &inv, &SERVER) else {
        panic!("no reply")
    };
    assert_eq!(
        r.options.get(OptionCode::from(175)),
        None,
        "stock iPXE user class is not the configured one"
    );
    let mut custom = stock.clone();
    custom.more.user_classes = vec![b"corp-ipxe".to_vec()];
    let Answer::Reply(r) = decide(&custom, &inv, &SERVER) else {
        panic!("no reply")
    };
    assert_eq!(
        r.options.get(OptionCode::BootfileName),
        Some(&DhcpOption::BootfileName(
            b"http://10.66.0.1/s/52:54:00:00:00:01".to_vec()
        ))
    );
}

const HTTP_ARCHES: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
profiles:
  - name: worker
    boot:
      http: "http://{server}/x64.efi"
      http_arm64: "http://{server}/arm64.efi"
  - name: x64-only
    boot: {http: "http://{server}/x64.efi"}
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, profile: worker}
  - {mac: "52:54:00:00:00:02", ip: 10.66.1.11, profile: x64-only}
"#;

fn http_boot(mac: MacAddr, arch: u16) -> Request {
    let mut r = discover(mac);
    r.arch = Some(arch);
    r.vendor = VendorClass::HttpClient;
    r.more.vendor_class = Some(b"HTTPClient:Arch:00019:UNDI:003001".to_vec());
    r
}

fn bootfile(answer: Answer) -> Option<Vec<u8>> {
    let Answer::Reply(reply) = answer else {
        panic!("no reply: {answer:?}")
    };
    match reply.options.get(OptionCode::BootfileName) {
        Some(DhcpOption::BootfileName(url)) => Some(url.clone()),
        _ => None,
    }
}

#[test]
fn uefi_http_boot_gets_the_url_of_its_own_architecture_or_an_address_only() {
    let inv = Inventory::parse(Path::new("t.yaml"), HTTP_ARCHES).expect("valid");
    let url = |mac, arch| bootfile(decide(&http_boot(mac, arch), &inv, &SERVER));
    assert_eq!(
        url(WORKER, 16).as_deref(),
        Some(&b"http://10.66.0.1/x64.efi"[..])
    );
    assert_eq!(
        url(WORKER, 19).as_deref(),
        Some(&b"http://10.66.0.1/arm64.efi"[..])
    );
    // No IA32 entry, and none for arm64 on the second host: an address.
    assert_eq!(url(WORKER, 15), None);
    assert_eq!(url(BARE, 19), None);
    // The kernel holds no template for a class the profile does not boot.
    assert_eq!(
        fast_path(&http_boot(BARE, 19), &inv, &SERVER),
        Decision::Pass(Counter::PassUnknownHost)
    );
    assert!(matches!(
        fast_path(&http_boot(WORKER, 19), &inv, &SERVER),
        Decision::Reply(_)
    ));
}

const ROUTED: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
  - cidr: 10.77.0.0/16
    pool: {start: 10.77.100.1, end: 10.77.100.50}
discovery: {policy: inspect, profile: worker}
profiles:
  - name: worker
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, profile: worker}
"#;

#[test]
fn a_renewal_unicast_from_a_routed_pool_client_leases_from_its_own_subnet() {
    let inv = Inventory::parse(Path::new("t.yaml"), ROUTED).expect("valid");
    // RENEWING (RFC 2131 4.3.2): ciaddr set, no server id, giaddr 0.
    let renew = Request {
        ciaddr: Ipv4Addr::new(10, 77, 100, 7),
        ..request(discover(MacAddr([0x52, 0x54, 0, 0, 0, 9])))
    };
    assert_eq!(
        decide(&renew, &inv, &SERVER),
        Answer::Pool(PoolAsk {
            subnet: 1,
            kind: ReplyKind::Ack,
            wanted: Some(Ipv4Addr::new(10, 77, 100, 7)),
            slice: Ipv4Addr::new(10, 77, 100, 1)..=Ipv4Addr::new(10, 77, 100, 50),
        })
    );
}

#[test]
fn a_known_host_behind_an_l2_relay_gets_option_82_echoed() {
    let info = vec![1, 4, b'e', b't', b'h', b'0'];
    let mut req = pxe(discover(WORKER), 0);
    req.relay_info = true;
    req.more.relay_agent_info = Some(info.clone());
    let Answer::Reply(reply) = decide(&req, &inv(), &SERVER) else {
        panic!("no reply")
    };
    assert_eq!(
        reply.options.get(OptionCode::RelayAgentInformation),
        Some(&DhcpOption::Unknown(UnknownOption::new(
            OptionCode::RelayAgentInformation,
            info
        )))
    );
}

#[test]
fn a_reserved_host_declining_its_address_is_a_reservation_conflict() {
    let inv = inv();
    let decline = |mac, ip| Request {
        msg_type: Some(MessageType::Decline),
        requested_ip: ip,
        server_id: Some(SERVER.ip),
        ..discover(mac)
    };
    let cases = [
        (
            "its reserved address",
            decline(WORKER, Some(RESERVED)),
            Answer::ReservationDeclined { ip: RESERVED },
        ),
        (
            "an address not its own",
            decline(WORKER, Some(Ipv4Addr::new(10, 66, 7, 7))),
            Answer::Ignore(Counter::PassRequestMismatch),
        ),
        (
            "no address",
            decline(WORKER, None),
            Answer::Ignore(Counter::PassMalformed),
        ),
        (
            "an unknown MAC declines a pool address",
            decline(MacAddr([9; 6]), Some(RESERVED)),
            Answer::Decline { ip: RESERVED },
        ),
    ];
    for (name, req, want) in cases {
        assert_eq!(decide(&req, &inv, &SERVER), want, "{name}");
    }
    // The kernel passes every DECLINE up, so the slow path sees it.
    assert_eq!(
        fast_path(&decline(WORKER, Some(RESERVED)), &inv, &SERVER),
        Decision::Pass(Counter::PassMessageType)
    );
}

const TWO_SEGMENTS: &str = r#"
subnets:
  - {cidr: 10.66.0.0/16}
  - {cidr: 10.100.0.0/24}
profiles:
  - name: worker
    boot: {bios: undionly.kpxe}
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, profile: worker}
  - {mac: "52:54:00:00:01:00", ip: 10.100.0.50, profile: worker}
"#;

#[test]
fn a_host_is_answered_only_on_the_interface_whose_subnet_holds_it() {
    let mut inv = Inventory::parse(Path::new("t.yaml"), TWO_SEGMENTS).expect("valid");
    let vlan = Server {
        ip: Ipv4Addr::new(10, 100, 0, 1),
        mac: [2, 0, 0, 0, 0, 2],
    };
    // Served on one interface, every host is heard there, relayed or not.
    let tagged = MacAddr([0x52, 0x54, 0, 0, 1, 0]);
    assert!(matches!(
        fast_path(&pxe(discover(tagged), 0), &inv, &SERVER),
        Decision::Reply(_)
    ));
    inv.serve_on(&[SERVER.ip, vlan.ip]);
    let summary = |req: &Request, server: &Server| summarize(fast_path(req, &inv, server));
    let bios = Want::Offer(Some("undionly.kpxe".into()));
    // Each interface answers its own host, with its own address.
    assert_eq!(summary(&pxe(discover(WORKER), 0), &SERVER), bios);
    assert_eq!(summary(&pxe(discover(tagged), 0), &vlan), bios);
    let Answer::Reply(reply) = decide(&discover(tagged), &inv, &vlan) else {
        panic!("no reply on the VLAN")
    };
    assert_eq!(
        (
            reply.options.get(OptionCode::ServerIdentifier),
            reply.yiaddr
        ),
        (
            Some(&DhcpOption::ServerIdentifier(vlan.ip)),
            Ipv4Addr::new(10, 100, 0, 50)
        )
    );
    // And not the other's, heard on its segment.
    assert_eq!(
        summary(&pxe(discover(tagged), 0), &SERVER),
        Want::Pass(Counter::PassUnknownHost)
    );
    assert_eq!(
        decide(&discover(WORKER), &inv, &vlan),
        Answer::Ignore(Counter::PassUnknownHost)
    );
    // Relayed from the host's subnet, any interface answers, from the
    // slow path: the kernel holds the templates of its own segment only.
    let relayed = Request {
        giaddr: Ipv4Addr::new(10, 100, 0, 254),
        ..discover(tagged)
    };
    assert!(matches!(decide(&relayed, &inv, &SERVER), Answer::Reply(_)));
    assert_eq!(
        summary(&relayed, &SERVER),
        Want::Pass(Counter::PassUnknownHost)
    );
    // An address in no subnet (relay-only, or `check`) hears every host.
    let outside = Server {
        ip: Ipv4Addr::new(192, 0, 2, 1),
        ..SERVER
    };
    assert_eq!(summary(&pxe(discover(tagged), 0), &outside), bios);
}

/// Two agents sharing SLOW_INV's first pool (10.66.200.1-9): slot 0
/// leases .1-.5, slot 1 .6-.9.
fn shared(slot: u16, live: &[u16]) -> Share {
    Share::new(slot, 2).unwrap().with_live(live.iter().copied())
}

/// An unknown MAC whose bucket `share` answers, and one it does not.
fn macs_of(share: &Share) -> (MacAddr, MacAddr) {
    let mac = |b| MacAddr([0x52, 0x54, 0, 0, 1, b]);
    let mine = (0..=255).map(mac).find(|m| share.answers(&m.0)).unwrap();
    let theirs = (0..=255).map(mac).find(|m| !share.answers(&m.0)).unwrap();
    (mine, theirs)
}

#[test]
fn shared_pools_answer_each_unknown_mac_from_one_agent_and_its_slice() {
    let inv = Inventory::parse(Path::new("t.yaml"), SLOW_INV).expect("valid");
    let a = shared(0, &[0, 1]);
    let (mine, theirs) = macs_of(&a);
    let decide = |req: &Request, share: &Share, held| {
        slow_pool(decide_shared(req, &inv, &SERVER, &Pools { share, held }))
    };
    let ip = |d| Ipv4Addr::new(10, 66, 200, d);
    let first = ip(1)..=ip(5);
    let second = ip(6)..=ip(9);
    // A DISCOVER: ours from our slice, theirs not answered.
    assert_eq!(decide(&discover(mine), &a, None), Ok(Some(first.clone())));
    assert_eq!(decide(&discover(theirs), &a, None), Err(Slow::NotOurs));
    let b = shared(1, &[0, 1]);
    assert_eq!(
        decide(&discover(theirs), &b, None),
        Ok(Some(second.clone()))
    );
    assert_eq!(decide(&discover(mine), &b, None), Err(Slow::NotOurs));
    // A client our store holds an address of our slice for stays ours.
    assert_eq!(
        decide(&discover(theirs), &a, Some(ip(3))),
        Ok(Some(first.clone()))
    );
    // ... but not for an address outside our slice (a stale record).
    assert_eq!(
        decide(&discover(theirs), &a, Some(ip(7))),
        Err(Slow::NotOurs)
    );
    // Our Lease lapsed (our slot not live): no pool client at all, not
    // even our own, until it is renewed.
    let lapsed = shared(0, &[1]);
    assert_eq!(decide(&discover(mine), &lapsed, None), Err(Slow::NotOurs));
    assert_eq!(
        decide(&discover(mine), &lapsed, Some(ip(2))),
        Err(Slow::NotOurs)
    );
    let renew = Request {
        ciaddr: ip(2),
        ..request(discover(mine))
    };
    assert_eq!(decide(&renew, &lapsed, Some(ip(2))), Err(Slow::NotOurs));

    // REQUESTs without a server id.
    let init_reboot = |mac, want| Request {
        requested_ip: Some(want),
        ..request(discover(mac))
    };
    // For our slice: the store judges.
    assert_eq!(
        decide(&init_reboot(theirs, ip(2)), &a, None),
        Ok(Some(first.clone()))
    );
    // For a live peer's slice: its agent answers, we stay silent.
    assert_eq!(
        decide(&init_reboot(mine, ip(7)), &a, None),
        Err(Slow::NotOurs)
    );
    // The peer died and its buckets are ours: NAK, so the client
    // restarts with a DISCOVER and gets an address of our slice.
    let survivor = shared(0, &[0]);
    let (_, orphan) = macs_of(&a);
    assert!(survivor.answers(&orphan.0));
    assert_eq!(
        decide(&init_reboot(orphan, ip(7)), &survivor, None),
        Err(Slow::Nak)
    );
    assert_eq!(
        decide(&discover(orphan), &survivor, None),
        Ok(Some(first.clone()))
    );
    // Outside the pool altogether: the store's judgement, as alone.
    assert_eq!(
        decide(
            &init_reboot(orphan, Ipv4Addr::new(10, 66, 9, 9)),
            &survivor,
            None
        ),
        Ok(Some(first.clone()))
    );
    // Selecting another server: ignored; selecting us: the store.
    let selecting = |mac, sid| Request {
        server_id: Some(sid),
        requested_ip: Some(ip(7)),
        ..request(discover(mac))
    };
    assert_eq!(
        decide(&selecting(mine, Ipv4Addr::new(10, 66, 0, 2)), &a, None),
        Err(Slow::Ignore(Counter::DropOtherServer))
    );
    assert_eq!(
        decide(&selecting(theirs, SERVER.ip), &a, None),
        Ok(Some(first))
    );
    // Reserved hosts are every agent's, whatever their bucket.
    let installer = MacAddr([0x52, 0x54, 0, 0, 0, 3]);
    for share in [&a, &b, &lapsed] {
        assert!(matches!(
            decide_shared(
                &discover(installer),
                &inv,
                &SERVER,
                &Pools { share, held: None }
            ),
            Answer::Reply(_)
        ));
    }
}

#[test]
fn a_pool_smaller_than_the_slots_leaves_the_last_slots_out() {
    let inv = Inventory::parse(Path::new("t.yaml"), SLOW_INV).expect("valid");
    // Nine addresses, sixteen slots: slots 9.. have no slice.
    let share = Share::new(12, 16).unwrap().with_live([12]);
    let pools = Pools {
        share: &share,
        held: None,
    };
    let req = discover(MacAddr([0x52, 0x54, 0, 0, 1, 1]));
    assert_eq!(decide_shared(&req, &inv, &SERVER, &pools), Answer::NotOurs);
}

/// The slice a pool answer leases from, or what else the answer is.
fn slow_pool(a: Answer) -> Result<Option<RangeInclusive<Ipv4Addr>>, Slow> {
    match a {
        Answer::Pool(p) => Ok(Some(p.slice)),
        other => Err(slow(other)),
    }
}

fn boot_server(mut r: Request, ciaddr: Ipv4Addr) -> Request {
    r.msg_type = Some(MessageType::Request);
    r.boot_server = true;
    r.ciaddr = ciaddr;
    r.server_id = Some(SERVER.ip);
    r
}

fn option(reply: &Reply, code: u8) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    let opt = reply.options.get(OptionCode::from(code))?;
    dhcproto::Encodable::encode(opt, &mut dhcproto::Encoder::new(&mut bytes)).ok()?;
    Some(bytes[2..].to_vec())
}

/// The proxy answer's content: boot information and nothing of an address.
fn assert_proxy_reply(reply: &Reply, kind: ReplyKind) {
    assert_eq!(reply.kind, kind);
    assert_eq!(reply.yiaddr, Ipv4Addr::UNSPECIFIED);
    assert!(reply.is_proxy());
    assert_eq!(option(reply, 54), Some(SERVER.ip.octets().to_vec()));
    assert_eq!(option(reply, 60), Some(b"PXEClient".to_vec()));
    assert_eq!(option(reply, 43), Some(vec![6, 1, 8, 255]));
    for code in [1, 3, 6, 51, 58, 59] {
        assert_eq!(option(reply, code), None, "option {code} in a proxy reply");
    }
}

#[test]
fn proxy_offer_carries_the_boot_file_of_the_class_and_no_address() {
    let inv = proxy_inv();
    for (arch, file) in [(0, "undionly.kpxe"), (7, "ipxe.efi")] {
        let Answer::Reply(r) = decide(&pxe(discover(WORKER), arch), &inv, &SERVER) else {
            panic!("no proxy offer for arch {arch}")
        };
        assert_proxy_reply(&r, ReplyKind::Offer);
        assert_eq!(r.file.as_deref(), Some(file));
        assert_eq!(r.siaddr, SERVER.ip);
        // Option 97 only when the client sent one.
        assert_eq!(option(&r, 97), None);
    }
    let mut with_uuid = pxe(discover(WORKER), 7);
    with_uuid.more.client_uuid = Some(vec![0; 17]);
    let Answer::Reply(r) = decide(&with_uuid, &inv, &SERVER) else {
        panic!("no proxy offer")
    };
    assert_eq!(option(&r, 97), Some(vec![0; 17]));
}

#[test]
fn proxy_answers_the_port_4011_request_and_ignores_port_67_requests() {
    let inv = proxy_inv();
    let at = Ipv4Addr::new(10, 66, 1, 10);
    let Answer::Reply(r) = decide(&boot_server(pxe(discover(WORKER), 7), at), &inv, &SERVER) else {
        panic!("no ACK on port 4011")
    };
    assert_proxy_reply(&r, ReplyKind::Ack);
    assert_eq!(r.file.as_deref(), Some("ipxe.efi"));
    let ignored = |req: Request| match decide(&req, &inv, &SERVER) {
        Answer::Ignore(c) => c,
        other => panic!("answered {req:?}: {other:?}"),
    };
    let selecting = |sid| Request {
        server_id: Some(sid),
        requested_ip: Some(at),
        ..request(pxe(discover(WORKER), 0))
    };
    // The client completing its lease with the address server.
    assert_eq!(
        ignored(selecting(Ipv4Addr::new(10, 66, 0, 2))),
        Counter::DropOtherServer
    );
    assert_eq!(ignored(selecting(SERVER.ip)), Counter::PassRequestMismatch);
    assert_eq!(
        ignored(Request {
            requested_ip: Some(at),
            ..request(pxe(discover(WORKER), 0))
        }),
        Counter::PassRequestMismatch
    );
    // A DISCOVER on port 4011 is no follow-up.
    let mut on_4011 = pxe(discover(WORKER), 0);
    on_4011.boot_server = true;
    assert_eq!(ignored(on_4011), Counter::PassMessageType);
    // A 4011 request naming another proxy.
    let mut other = boot_server(pxe(discover(WORKER), 7), at);
    other.server_id = Some(Ipv4Addr::new(10, 66, 0, 2));
    assert_eq!(ignored(other), Counter::DropOtherServer);
}

#[test]
fn a_provisioned_host_in_a_proxy_subnet_hears_only_the_address_server() {
    let mut inv = proxy_inv();
    inv.profiles[0].netboot = crate::inventory::Netboot::Once;
    let req = pxe(discover(WORKER), 0);
    assert!(matches!(decide(&req, &inv, &SERVER), Answer::Reply(_)));
    inv.provisioned.insert(WORKER);
    let at = Ipv4Addr::new(10, 66, 1, 10);
    for req in [req.clone(), boot_server(req, at)] {
        assert_eq!(
            decide(&req, &inv, &SERVER),
            Answer::Ignore(Counter::PassUnsupportedClient),
            "{req:?}"
        );
    }
    // Nor does the kernel hold a proxy offer for it.
    assert!(matches!(
        fast_path(&pxe(discover(WORKER), 0), &inv, &SERVER),
        Decision::Pass(_)
    ));
}

#[test]
fn proxy_never_answers_clients_that_are_not_pxe_firmware() {
    let inv = proxy_inv();
    let ignored = |req: &Request| match decide(req, &inv, &SERVER) {
        Answer::Ignore(c) => c,
        other => panic!("answered {req:?}: {other:?}"),
    };
    let plain = discover(WORKER);
    let http = http_boot(WORKER, 16);
    let udhcpc = vendor(discover(WORKER), b"udhcp 1.36.1");
    for req in [&plain, &http, &request(plain.clone())] {
        assert_eq!(ignored(req), Counter::IgnoreNotPxe, "{req:?}");
    }
    let mut udhcpc = udhcpc;
    udhcpc.vendor = VendorClass::Other;
    assert_eq!(ignored(&udhcpc), Counter::IgnoreNotPxe);
    // Unknown PXE clients: the address server's, with nothing of ours.
    assert_eq!(
        ignored(&pxe(discover(MacAddr([9; 6])), 0)),
        Counter::PassUnknownHost
    );
    // A profile that boots nothing has nothing to say in proxy mode.
    assert_eq!(
        ignored(&pxe(discover(BARE), 0)),
        Counter::PassUnsupportedClient
    );
    // The kernel holds no template for any of them.
    assert_eq!(
        fast_path(&plain, &inv, &SERVER),
        Decision::Pass(Counter::PassUnknownHost)
    );
    assert_eq!(
        fast_path(&pxe(discover(BARE), 0), &inv, &SERVER),
        Decision::Pass(Counter::PassUnknownHost)
    );
}

#[test]
fn ipxe_in_a_proxy_subnet_gets_its_script_through_proxydhcp() {
    let inv = proxy_inv();
    // Debian's iPXE: "PXEClient:Arch:00000:UNDI:002001", user class iPXE.
    let req = vendor(
        ipxe(pxe(discover(WORKER), 0)),
        b"PXEClient:Arch:00000:UNDI:002001",
    );
    for req in [req.clone(), boot_server(req, Ipv4Addr::new(10, 66, 1, 10))] {
        let Answer::Reply(r) = decide(&req, &inv, &SERVER) else {
            panic!("iPXE not answered")
        };
        assert!(r.is_proxy());
        assert_eq!(
            option(&r, 67),
            Some(b"http://10.66.0.1:8080/boot/52:54:00:00:00:01.ipxe".to_vec())
        );
        // iPXE is not told that there is no proxyDHCP server: this is one.
        assert_eq!(option(&r, 175), None);
        // Without a next server iPXE drops a proxy answer.
        assert_eq!(r.siaddr, SERVER.ip);
    }
}

const NETBOOT: &str = r#"
subnets:
  - {cidr: 10.66.0.0/16, router: 10.66.0.1, dns: [10.66.0.1]}
profiles:
  - name: install
    netboot: once
    boot: {bios: undionly.kpxe, uefi: ipxe.efi, http: "http://{server}/ipxe.efi"}
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, hostname: node-1, profile: install,
     options: {66: tftp.lab.example, 43: "\u0006\u0001\u0008"}}
  - {mac: "52:54:00:00:00:02", ip: 10.66.1.11, profile: install, netboot: never}
  - {mac: "52:54:00:00:00:03", ip: 10.66.1.12, profile: install, netboot: always}
"#;

/// What a reply carries that points at something to boot.
fn boot_data(answer: Answer) -> (Ipv4Addr, Ipv4Addr, Option<String>, Vec<u8>) {
    let Answer::Reply(reply) = answer else {
        panic!("no reply: {answer:?}")
    };
    assert_ne!(reply.kind, ReplyKind::Nak);
    let codes = BOOT_OPTIONS
        .into_iter()
        .filter(|c| reply.options.get(OptionCode::from(*c)).is_some())
        .collect();
    (reply.yiaddr, reply.siaddr, reply.file, codes)
}

#[test]
fn a_provisioned_once_host_gets_its_address_and_nothing_to_boot_on_every_class() {
    let mut inv = Inventory::parse(Path::new("t.yaml"), NETBOOT).expect("valid");
    let node = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
    let ip = Ipv4Addr::new(10, 66, 1, 10);
    let clients = [
        ("bios", pxe(discover(node), 0)),
        ("uefi", pxe(discover(node), 7)),
        ("http", http_boot(node, 16)),
        ("ipxe", ipxe(pxe(discover(node), 0))),
        ("bios ack", request(pxe(discover(node), 0))),
    ];
    let with_ack = |mut r: Request| {
        if r.msg_type == Some(MessageType::Request) {
            r.requested_ip = Some(ip);
        }
        r
    };
    // Armed: every class boots.
    for (name, req) in &clients {
        let (yiaddr, _, file, codes) = boot_data(decide(&with_ack(req.clone()), &inv, &SERVER));
        assert_eq!(yiaddr, ip, "{name}");
        assert!(
            file.is_some() || codes.contains(&67),
            "{name}: nothing to boot"
        );
    }
    inv.provisioned.insert(node);
    for (name, req) in &clients {
        let answer = decide(&with_ack(req.clone()), &inv, &SERVER);
        let Answer::Reply(reply) = &answer else {
            panic!("{name}: {answer:?}")
        };
        assert_eq!(
            reply.options.get(OptionCode::Router),
            Some(&DhcpOption::Router(vec![SERVER.ip])),
            "{name}"
        );
        assert_eq!(
            reply.options.get(OptionCode::Hostname),
            Some(&DhcpOption::Hostname("node-1".into())),
            "{name}"
        );
        assert!(reply.options.get(OptionCode::AddressLeaseTime).is_some());
        assert_eq!(
            boot_data(answer),
            (ip, Ipv4Addr::UNSPECIFIED, None, vec![]),
            "{name}"
        );
    }
    // The fast path answers the PXE classes itself, address only.
    for arch in [0, 7] {
        let Decision::Reply(reply) = fast_path(&pxe(discover(node), arch), &inv, &SERVER) else {
            panic!("arch {arch} passed")
        };
        assert_eq!((reply.yiaddr, reply.file), (ip, None));
    }
    // Reprovisioned: boots again.
    inv.provisioned.remove(&node);
    let (_, siaddr, file, _) = boot_data(decide(&pxe(discover(node), 0), &inv, &SERVER));
    assert_eq!(
        (siaddr, file.as_deref()),
        (SERVER.ip, Some("undionly.kpxe"))
    );
}

#[test]
fn never_withholds_the_boot_file_and_always_ignores_the_done_record() {
    let mut inv = Inventory::parse(Path::new("t.yaml"), NETBOOT).expect("valid");
    let never = MacAddr([0x52, 0x54, 0, 0, 0, 2]);
    let always = MacAddr([0x52, 0x54, 0, 0, 0, 3]);
    inv.provisioned.insert(always);
    let (yiaddr, _, file, codes) = boot_data(decide(&http_boot(never, 16), &inv, &SERVER));
    assert_eq!(
        (yiaddr, file, codes),
        (Ipv4Addr::new(10, 66, 1, 11), None, vec![])
    );
    let (_, _, file, _) = boot_data(decide(&pxe(discover(always), 7), &inv, &SERVER));
    assert_eq!(file.as_deref(), Some("ipxe.efi"));
    assert_eq!(
        inv.netboot_of(&inv.hosts[0]),
        crate::inventory::Netboot::Once
    );
    assert!(inv.withholds_boot(&inv.hosts[1]) && !inv.withholds_boot(&inv.hosts[2]));
}

#[test]
fn a_netboot_typo_is_reported_with_host_and_field() {
    let text = NETBOOT.replace("netboot: never", "netboot: nevr");
    let err = Inventory::parse(Path::new("t.yaml"), &text).expect_err("typo");
    let text = err.to_string();
    assert!(
        text.contains("52:54:00:00:00:02") && text.contains("netboot") && text.contains("nevr"),
        "{text}"
    );
}

#[test]
fn a_host_served_over_ipv6_only_is_left_to_other_dhcpv4_servers_on_both_paths() {
    let text = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
  - cidr: fd00:66::/64
profiles:
  - name: worker
    boot: {bios: undionly.kpxe, uefi: ipxe.efi}
hosts:
  - {mac: "52:54:00:00:00:01", ipv6: "fd00:66::10", profile: worker}
"#;
    let inv = Inventory::parse(Path::new("t.yaml"), text).expect("valid");
    for req in [
        discover(WORKER),
        pxe(discover(WORKER), 7),
        request(pxe(discover(WORKER), 0)),
    ] {
        assert!(
            matches!(
                decide(&req, &inv, &SERVER),
                Answer::Ignore(Counter::PassUnknownHost)
            ),
            "{req:?}"
        );
        // The kernel has no record for it, and passes it as unknown.
        assert_eq!(
            summarize(fast_path(&req, &inv, &SERVER)),
            Want::Pass(Counter::PassUnknownHost)
        );
    }
    let compiled = crate::dhcp::template::compile(&inv, &SERVER).expect("compiles");
    assert_eq!(compiled.replies(), 0);
}

const LAYERED: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    domain: lab.example
    options: {42: 10.66.0.4, 15: site.example, 224: subnet, 225: subnet, 226: subnet}
profiles:
  - name: worker
    boot: {bios: undionly.kpxe, uefi: ipxe.efi}
    options: {224: profile, 225: profile}
    rules:
      - match: {arch: [7, 9]}
        options: {225: rule}
  - name: bare
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, hostname: node-1, profile: worker,
     options: {42: 10.66.0.9, 224: host}}
  - {mac: "52:54:00:00:00:02", ip: 10.66.1.11, profile: worker}
  - {mac: "52:54:00:00:00:03", ip: 10.66.1.12, profile: bare}
"#;

/// Subnet, profile, rule and host options by code, for `mac` asking with
/// option 93 `arch`, from the slow path; the fast path answers with the
/// same reply.
fn layered(inv: &Inventory, mac: u8, arch: u16) -> BTreeMap<u8, Vec<u8>> {
    let req = pxe(discover(MacAddr([0x52, 0x54, 0, 0, 0, mac])), arch);
    let Answer::Reply(reply) = decide(&req, inv, &SERVER) else {
        panic!("no reply")
    };
    let Decision::Reply(kernel) = fast_path(&req, inv, &SERVER) else {
        panic!("the kernel does not answer host {mac} on arch {arch}")
    };
    assert_eq!(kernel, reply, "the fast path's reply is the policy's");
    [3, 15, 42, 224, 225, 226]
        .into_iter()
        .filter_map(|code| Some((code, option(&reply, code)?)))
        .collect()
}

#[test]
fn host_options_replace_the_profiles_and_rules_which_replace_the_subnets() {
    let inv = Inventory::parse(Path::new("t.yaml"), LAYERED).expect("valid");
    let want = |pairs: &[(u8, &[u8])]| -> BTreeMap<u8, Vec<u8>> {
        pairs.iter().map(|(c, v)| (*c, v.to_vec())).collect()
    };
    let subnet_only = want(&[
        (3, &[10, 66, 0, 1]),
        // The subnet's option 15 replaces what its `domain` gives.
        (15, b"site.example"),
        (42, &[10, 66, 0, 4]),
        (224, b"subnet"),
        (225, b"subnet"),
        (226, b"subnet"),
    ]);
    assert_eq!(layered(&inv, 3, 0), subnet_only, "a host of a bare profile");
    let mut profile = subnet_only.clone();
    profile.insert(224, b"profile".to_vec());
    profile.insert(225, b"profile".to_vec());
    assert_eq!(layered(&inv, 2, 0), profile, "the profile over the subnet");
    let mut rule = profile.clone();
    rule.insert(225, b"rule".to_vec());
    assert_eq!(
        layered(&inv, 2, 7),
        rule,
        "a matching rule over the profile"
    );
    let mut host = rule.clone();
    host.insert(42, vec![10, 66, 0, 9]);
    host.insert(224, b"host".to_vec());
    assert_eq!(layered(&inv, 1, 7), host, "the host over all of them");
}

#[test]
fn subnet_options_reach_pool_clients_informs_and_proxy_answers() {
    let yaml = LAYERED.replace(
        "    router: 10.66.0.1\n",
        "    router: 10.66.0.1\n    pool: {start: 10.66.200.1, end: 10.66.200.9}\n",
    ) + "discovery: {policy: inspect, profile: worker}\n";
    let inv = Inventory::parse(Path::new("t.yaml"), &yaml).expect("valid");
    let unknown = pxe(discover(MacAddr([0x52, 0x54, 0, 0, 0, 0x99])), 0);
    let Answer::Pool(ask) = decide(&unknown, &inv, &SERVER) else {
        panic!("not a pool client")
    };
    let reply = pool_reply(&unknown, &inv, &SERVER, &ask, Ipv4Addr::new(10, 66, 200, 1));
    assert_eq!(option(&reply, 42), Some(vec![10, 66, 0, 4]));
    assert_eq!(option(&reply, 224), Some(b"profile".to_vec()));

    let inform = Request {
        msg_type: Some(MessageType::Inform),
        ciaddr: Ipv4Addr::new(10, 66, 1, 11),
        ..discover(MacAddr([0x52, 0x54, 0, 0, 0, 2]))
    };
    let Answer::Reply(reply) = decide(&inform, &inv, &SERVER) else {
        panic!("no answer to the inform")
    };
    assert_eq!(option(&reply, 42), Some(vec![10, 66, 0, 4]));

    let proxy = LAYERED.replace("    router: 10.66.0.1\n", "    mode: proxy\n");
    let inv = Inventory::parse(Path::new("t.yaml"), &proxy).expect("valid");
    let Answer::Reply(reply) = decide(
        &pxe(discover(MacAddr([0x52, 0x54, 0, 0, 0, 2])), 0),
        &inv,
        &SERVER,
    ) else {
        panic!("no proxy answer")
    };
    assert!(reply.is_proxy());
    assert_eq!(option(&reply, 42), Some(vec![10, 66, 0, 4]));
    assert_eq!(option(&reply, 224), Some(b"profile".to_vec()));
}

//! Hosts with several NICs and machines whose client identifier changes
//! between boot stages: the XDP program and the slow path answer each port
//! of a host with the host's one address, the boot progress names the port
//! that booted, a MAC claimed by two hosts is refused while the last good
//! inventory serves, and a discovery-pool machine keeps one address from
//! its PXE ROM through iPXE to the installed system (unless leases are
//! keyed by client identifier).

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use pxe_agent::dhcp::{Answer, Request, decide, encode};
use serde_json::Value;

use crate::{
    agent::Served,
    fixture::{Fixture, XDP_TX},
    frame::{Req, parse_reply},
    slow_path,
};

/// node-1 boots from either of two ports; node-2 has one.
const INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    dns: [10.66.0.1]
    lease_time: 3600
profiles:
  - name: worker
    boot:
      bios: undionly.kpxe
      uefi: ipxe.efi
hosts:
  - macs: ["52:54:00:12:34:56", "52:54:00:12:34:57"]
    ip: 10.66.1.10
    hostname: node-1
    profile: worker
  - mac: "52:54:00:12:34:60"
    ip: 10.66.1.11
    hostname: node-2
    profile: worker
"#;

const PORT_A: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];
const PORT_B: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x57];
const NODE_1: Ipv4Addr = Ipv4Addr::new(10, 66, 1, 10);

#[test]
fn the_xdp_program_answers_every_port_with_the_hosts_address_as_the_slow_path_does() {
    let fx = Fixture::with_inventory(INVENTORY);
    for mac in [PORT_A, PORT_B] {
        let mut renew = Req::discover(mac).pxe(0).request();
        renew.requested_ip = Some(NODE_1);
        for req in [Req::discover(mac).pxe(0), Req::discover(mac).pxe(7), renew] {
            let (action, out) = fx.run(&req.frame());
            assert_eq!(action, XDP_TX, "XDP did not answer {req:?}");
            let fast = parse_reply(&out);
            assert!(fast.ip_csum_ok && fast.udp_csum_ok, "bad checksum");
            assert_eq!(&fast.payload[28..34], &mac, "chaddr is the asking port");
            assert_eq!(
                Ipv4Addr::new(
                    fast.payload[16],
                    fast.payload[17],
                    fast.payload[18],
                    fast.payload[19]
                ),
                NODE_1,
                "yiaddr"
            );
            let parsed = Request::parse(&req.payload()).expect("parses");
            let Answer::Reply(reply) = decide(&parsed, &fx.inv, &fx.server) else {
                panic!("the slow path does not answer {req:?}");
            };
            let slow = encode(&reply, &parsed).expect("encodes");
            assert_eq!(
                fast.payload, slow,
                "XDP and the slow path differ for {req:?}"
            );
        }
    }
    // A MAC one byte off either port is no host's.
    let (action, _) = fx.run(
        &Req::discover([0x52, 0x54, 0, 0x12, 0x34, 0x58])
            .pxe(0)
            .frame(),
    );
    assert_ne!(action, XDP_TX, "an unknown MAC was answered");
}

/// `pxe-agent hosts --output json`, the entry of `hostname`.
fn host_json(served: &Served, hostname: &str) -> Value {
    let list: Value =
        serde_json::from_str(&served.cli(&["hosts", "--format", "json"])).expect("hosts json");
    list.as_array()
        .expect("a list")
        .iter()
        .find(|h| h["hostname"] == hostname)
        .unwrap_or_else(|| panic!("{hostname} not listed: {list}"))
        .clone()
}

#[test]
fn both_ports_get_the_hosts_address_and_hosts_shows_which_port_booted() {
    let served = Served::start("pxnics", INVENTORY);
    let before = host_json(&served, "node-1");
    assert_eq!(
        before["macs"],
        serde_json::json!(["52:54:00:12:34:56", "52:54:00:12:34:57"])
    );
    assert_eq!(before["boot_mac"], Value::Null);

    for port in [
        "52:54:00:12:34:57",
        "52:54:00:12:34:56",
        "52:54:00:12:34:57",
    ] {
        served.set_client_mac(port);
        let acks = served.counter("tx_ack");
        let lease = served.udhcpc(&["-V", "PXEClient:Arch:00000:UNDI:002001", "-x", "0x5d:0000"]);
        assert_eq!(lease["ip"], NODE_1.to_string(), "port {port}");
        assert_eq!(lease["serverid"], "10.66.0.1");
        assert!(
            served.counter("tx_ack") > acks,
            "the fast path did not answer port {port}"
        );
        // The fast path's answers reach the progress through its event
        // ring, a moment after the client has its lease.
        let deadline = Instant::now() + Duration::from_secs(3);
        let host = loop {
            let host = host_json(&served, "node-1");
            if host["boot_mac"] == port || Instant::now() > deadline {
                break host;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(
            host["mac"], "52:54:00:12:34:56",
            "the primary MAC names the host"
        );
        assert_eq!(host["boot_mac"], port, "{host}");
        assert_eq!(host["progress"]["boot_mac"], port);
        assert_eq!(host["stage"], "dhcp");
    }
    let table = served.cli(&["hosts"]);
    let header = table.lines().next().expect("header");
    let at = header
        .find("BOOT MAC")
        .unwrap_or_else(|| panic!("no BOOT MAC column: {table}"));
    let row = table
        .lines()
        .find(|l| l.contains("node-1"))
        .unwrap_or_else(|| panic!("node-1 not in the table: {table}"));
    // Columns start where their titles do, in characters (a cut cell
    // ends in `…`).
    assert!(row.starts_with("52:54:00:12:34:56"), "{row}");
    let boot_mac: String = row.chars().skip(at).take(17).collect();
    assert_eq!(boot_mac, "52:54:00:12:34:57", "{table}");
    // One entry per host, whichever port asked.
    let list: Value =
        serde_json::from_str(&served.cli(&["hosts", "--format", "json"])).expect("json");
    assert_eq!(list.as_array().map(Vec::len), Some(2), "{list}");
}

#[test]
fn a_mac_claimed_by_two_hosts_is_refused_naming_both_and_the_last_good_inventory_serves() {
    let served = Served::start("pxnicsbad", INVENTORY);
    let bad = INVENTORY.replace(
        "  - mac: \"52:54:00:12:34:60\"",
        "  - macs: [\"52:54:00:12:34:60\", \"52-54-00-12-34-57\"]",
    );
    assert_ne!(bad, INVENTORY);
    let rejected = "pxe_inventory_reloads_total{result=\"rejected\"}";
    let before = served.stats().get(rejected).copied().unwrap_or(0);
    served.replace_inventory(&bad);
    let deadline = Instant::now() + Duration::from_secs(5);
    while served.stats().get(rejected).copied().unwrap_or(0) == before {
        assert!(
            Instant::now() < deadline,
            "the inventory was not refused; log:\n{}",
            served.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = served.log();
    assert!(
        log.contains("inventory.yaml")
            && log.contains("node-2 (52:54:00:12:34:60)")
            && log.contains("macs[1]")
            && log.contains(
                "52:54:00:12:34:57 is used by both hosts[0] (node-1) and hosts[1] (node-2)"
            ),
        "the refusal names the file, both hosts and the field: {log}"
    );
    // node-1 keeps both ports; node-2 did not gain one.
    served.set_client_mac("52:54:00:12:34:57");
    assert_eq!(served.udhcpc(&[])["ip"], NODE_1.to_string());
    served.set_client_mac("52:54:00:12:34:60");
    assert_eq!(served.udhcpc(&[])["ip"], "10.66.1.11");
}

/// The discovery-pool machine of the boot-chain tests.
const CHAIN_MAC: &str = "52:54:00:aa:bb:01";
/// Option 61 as a PXE ROM sends it: type 0 and the SMBIOS UUID, which it
/// also sends as option 97.
const ROM_GUID: &str = "4c4c4544001038804eb6c04f51443231";
/// The installed system's DUID-based identifier (RFC 4361): type 255, an
/// IAID and a DUID-LL of another form than iPXE's.
const OS_CLIENT_ID: &str =
    "ff:00:00:00:01:00:04:8a:11:2b:3c:4d:5e:6f:70:81:92:a3:b4:c5:d6:e7:f8:09";

/// The address each stage of one machine's boot chain is given, and the
/// client identifiers its pool lease record held after each stage.
fn boot_chain(served: &Served) -> ([String; 3], Vec<Option<String>>) {
    served.set_client_mac(CHAIN_MAC);
    let mut seen = Vec::new();
    let lease_ids = || {
        let leases: Value =
            serde_json::from_str(&served.cli(&["leases", "--format", "json"])).expect("leases");
        let bound: Vec<&Value> = leases
            .as_array()
            .expect("a list")
            .iter()
            .filter(|l| l["mac"] == CHAIN_MAC && l["state"] == "bound")
            .collect();
        bound
            .iter()
            .map(|l| l["client_id"].as_str().map(str::to_owned))
            .collect::<Vec<_>>()
    };
    // 1. The PXE ROM: vendor class, arch (93), NII (94), UUID (97) and a
    // type-0 client identifier.
    let rom = served.udhcpc(&[
        "-V",
        "PXEClient:Arch:00000:UNDI:002001",
        "-x",
        "0x5d:0000",
        "-x",
        "0x5e:010201",
        "-x",
        &format!("0x61:00{ROM_GUID}"),
        "-x",
        &format!("0x3d:00{ROM_GUID}"),
    ])["ip"]
        .clone();
    seen.extend(lease_ids());
    // 2. iPXE: user class iPXE, client identifier type 1 + MAC (udhcpc's
    // own).
    let ipxe = served.udhcpc(&[
        "-V",
        "PXEClient:Arch:00000:UNDI:002001",
        "-x",
        "0x5d:0000",
        "-x",
        "0x4d:0469505845",
    ])["ip"]
        .clone();
    seen.extend(lease_ids());
    // 3. The installed system: dhcpcd with a DUID-based identifier.
    let os = served.dhcpcd_with(&["-I", OS_CLIENT_ID])["ip"].clone();
    seen.extend(lease_ids());
    ([rom, ipxe, os], seen)
}

#[test]
fn one_machine_keeps_one_pool_address_from_pxe_rom_through_ipxe_to_the_installed_system() {
    let served = Served::start("pxclid", slow_path::INVENTORY);
    let ([rom, ipxe, os], ids) = boot_chain(&served);
    println!("pool addresses by stage: rom {rom}, ipxe {ipxe}, os {os}; lease ids {ids:?}");
    assert!(rom.starts_with("10.66.200."), "not a pool address: {rom}");
    assert_eq!(ipxe, rom, "iPXE got another address than the PXE ROM");
    assert_eq!(os, rom, "the installed system got another address");
    // One lease, which saw each stage's own identifier: the three requests
    // really differed in option 61.
    let rom_id = format!("00:{}", hex_colons(ROM_GUID));
    let ipxe_id = format!("01:{CHAIN_MAC}");
    assert_eq!(
        ids,
        [Some(rom_id), Some(ipxe_id), Some(OS_CLIENT_ID.to_owned())],
        "one bound lease after each stage, with that stage's client identifier"
    );
}

#[test]
fn with_lease_key_client_id_each_boot_stage_is_its_own_client() {
    let inventory = slow_path::INVENTORY.replace(
        "discovery: {policy: inspect, profile: inspector, lease_time: 600}",
        "discovery: {policy: inspect, profile: inspector, lease_time: 600, lease_key: client_id}",
    );
    assert_ne!(inventory, slow_path::INVENTORY);
    let served = Served::start("pxclidkey", &inventory);
    let ([rom, ipxe, os], ids) = boot_chain(&served);
    println!("pool addresses by stage: rom {rom}, ipxe {ipxe}, os {os}");
    assert!(
        rom != ipxe && ipxe != os && rom != os,
        "client-identifier keying gave stages one address: {rom} {ipxe} {os}"
    );
    assert_eq!(
        ids.len(),
        1 + 2 + 3,
        "bound leases after each stage: {ids:?}"
    );
}

fn hex_colons(hex: &str) -> String {
    hex.as_bytes()
        .chunks(2)
        .map(|pair| std::str::from_utf8(pair).expect("ascii"))
        .collect::<Vec<_>>()
        .join(":")
}

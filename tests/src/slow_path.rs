//! End to end through the slow path: what the XDP program passes up (iPXE,
//! unknown MACs) answered by the agent's userspace DHCP server, to real
//! clients on a veth pair.

use crate::agent::{Served, agent_bin};

pub const INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    dns: [10.66.0.1]
    lease_time: 3600
    pool: {start: 10.66.200.1, end: 10.66.200.20}
discovery: {policy: inspect, profile: inspector, lease_time: 600}
profiles:
  - name: worker
    boot:
      bios: undionly.kpxe
      uefi: ipxe.efi
  - name: inspector
    boot:
      bios: undionly.kpxe
      uefi: ipxe.efi
hosts:
  - mac: "52:54:00:12:34:56"
    ip: 10.66.1.10
    hostname: node-1
    profile: worker
"#;

fn slow(served: &Served, name: &str) -> u64 {
    served.stats().get(name).copied().unwrap_or(0)
}

#[test]
fn ipxe_client_of_known_host_chains_to_its_script() {
    let served = Served::start("pxipxe", INVENTORY);
    served.set_client_mac("52:54:00:12:34:56");
    let passed = served.counter("pass_ipxe");
    // User class "iPXE" as iPXE sends it (RFC 3004: length-prefixed).
    let lease = served.udhcpc(&[
        "-V",
        "PXEClient",
        "-x",
        "0x5d:0000",
        "-x",
        "0x4d:0469505845",
    ]);
    assert_eq!(lease["ip"], "10.66.1.10");
    assert_eq!(
        lease["bootfile"],
        "http://10.66.0.1:8080/boot/52:54:00:12:34:56.ipxe"
    );
    assert!(
        served.counter("pass_ipxe") >= passed + 2,
        "XDP did not pass the iPXE requests up"
    );
    assert!(
        slow(&served, "pxe_slow_replies_total{type=\"ack\"}") >= 1,
        "slow path sent no ACK"
    );
}

#[test]
fn unknown_mac_gets_pool_lease_and_is_listed_for_adoption() {
    let served = Served::start("pxdisc", INVENTORY);
    served.set_client_mac("52:54:00:aa:bb:01");
    let lease = served.udhcpc(&[
        "-V",
        "PXEClient:Arch:00007",
        "-x",
        "0x5d:0007",
        "-x",
        "hostname:spare-1",
    ]);
    assert_eq!(lease["ip"], "10.66.200.1");
    assert_eq!(lease["boot_file"], "ipxe.efi");
    assert_eq!(lease["lease"], "600");
    let out = served
        .lab
        .cmd_in(served.lab.server_ns(), agent_bin())
        .args(["hosts", "--discovered"])
        .output()
        .expect("hosts");
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("52:54:00:aa:bb:01"))
        .unwrap_or_else(|| panic!("not listed: {table}"));
    assert!(
        row.contains("10.66.200.1") && row.contains("PXEClient:Arch:00007") && row.contains("   7"),
        "{row}"
    );
    let out = served
        .lab
        .cmd_in(served.lab.server_ns(), agent_bin())
        .arg("leases")
        .output()
        .expect("leases");
    let leases = String::from_utf8_lossy(&out.stdout);
    assert!(
        leases.lines().any(|l| l.starts_with("52:54:00:aa:bb:01")
            && l.contains("10.66.200.1")
            && l.contains("bound")
            && l.contains("spare-1")),
        "{leases}"
    );
}

#[test]
fn reserved_host_declining_its_address_is_logged_counted_and_listed() {
    use crate::{
        frame::{Req, SERVER_IP},
        raw::{RawSocket, in_netns},
    };
    use dhcproto::v4::MessageType;
    use std::time::{Duration, Instant};

    let served = Served::start("pxdecl", INVENTORY);
    let reserved = std::net::Ipv4Addr::new(10, 66, 1, 10);
    // RFC 2131 4.4.1: DECLINE carries the address (option 50) and the
    // server identifier, broadcast from 0.0.0.0.
    let mut decline = Req::discover([0x52, 0x54, 0, 0x12, 0x34, 0x56]);
    decline.msg_type = MessageType::Decline;
    decline.requested_ip = Some(reserved);
    decline.server_id = Some(SERVER_IP);
    decline.xid = 0xdec1_0001;
    let iface = served.lab.client_if().to_string();
    let sock = in_netns(served.lab.client_ns(), move || RawSocket::send_only(&iface))
        .expect("enter client namespace")
        .expect("client socket");
    sock.send(&decline.frame()).expect("send DECLINE");

    let deadline = Instant::now() + Duration::from_secs(5);
    while slow(&served, "pxe_reservation_declines_total") == 0 {
        assert!(
            Instant::now() < deadline,
            "the DECLINE was not counted; agent log:\n{}",
            served.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(slow(&served, "pxe_reservation_declines_total"), 1);
    assert_eq!(served.stats()["pxe_leases{state=\"declined\"}"], 0);
    let log = served.log();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("node-1 (52:54:00:12:34:56)")
            && l.contains("declined its reserved address 10.66.1.10")),
        "no warning naming the host:\n{log}"
    );
    let table = served.cli(&["hosts"]);
    assert!(
        table
            .lines()
            .next()
            .is_some_and(|h| h.ends_with("declined")),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.starts_with("52:54:00:12:34:56"))
        .unwrap_or_else(|| panic!("host not listed:\n{table}"));
    // The last column: when, then the address declined.
    let words: Vec<&str> = row.split_whitespace().collect();
    assert!(
        matches!(words[..], [.., "now" | "ago", "10.66.1.10"]),
        "the decline is not shown: {row}"
    );
}

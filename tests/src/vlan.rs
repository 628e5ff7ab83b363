//! One agent serving several interfaces, each with its own subnet and
//! server address, to real DHCP clients: two veth pairs, and an untagged
//! veth with a tagged VLAN on top of it.
//!
//! ```text
//! server ns                               client ns
//! pxsrv0     10.66.0.1/16  ──── veth ──── pxcli0      52:54:00:12:34:56 (untagged)
//! pxsrv0.100 10.100.0.1/24 ── VLAN 100 ── pxcli0.100  52:54:00:00:01:00 (tagged)
//! ```
//!
//! On the VLAN, the parent's XDP program (native) passes the tagged frames
//! up (`pass_vlan`); the kernel untags them onto `pxsrv0.100`, whose own
//! program (generic mode: a VLAN device has no native XDP) answers from the
//! templates compiled for 10.100.0.1. The VLAN tests need a kernel with
//! 802.1Q support (`CONFIG_VLAN_8021Q`).

use std::{
    thread,
    time::{Duration, Instant},
};

use xtask::{
    ChildGuard, Lab,
    lab::{CLIENT_IF, SERVER_IF},
};

use crate::agent::{Served, agent_bin};

const INVENTORY: &str = r#"
subnets:
  - {cidr: 10.66.0.0/16, router: 10.66.0.1, lease_time: 3600}
  - {cidr: 10.100.0.0/24, router: 10.100.0.1, lease_time: 1800}
profiles:
  - name: worker
    boot: {bios: undionly.kpxe, uefi: ipxe.efi}
hosts:
  - {mac: "52:54:00:12:34:56", ip: 10.66.1.10, hostname: untagged-1, profile: worker}
  - {mac: "52:54:00:00:01:00", ip: 10.100.0.50, hostname: tagged-1, profile: worker}
"#;

const VLAN: &str = "100";
const FIRST_MAC: &str = "52:54:00:12:34:56";
const SECOND_MAC: &str = "52:54:00:00:01:00";
const PXE_BIOS: [&str; 4] = ["-V", "PXEClient", "-x", "0x5d:0000"];

fn vlan_of(iface: &str) -> String {
    format!("{iface}.{VLAN}")
}

fn sample(served: &Served, name: &str) -> u64 {
    served.stats().get(name).copied().unwrap_or(0)
}

/// Checks what each client got: its reservation, its lease time, and the
/// address of its own interface as option 54 and next server.
fn assert_lease(lease: &std::collections::BTreeMap<String, String>, ip: &str, server: &str) {
    assert_eq!(lease["ip"], ip, "{lease:?}");
    assert_eq!(lease["serverid"], server, "option 54: {lease:?}");
    assert_eq!(lease["siaddr"], server, "next server: {lease:?}");
    assert_eq!(lease["boot_file"], "undionly.kpxe", "{lease:?}");
}

/// The second interface's client end, with the pass-through program that
/// lets XDP_TX replies reach it (docs/veth.md). Field order: the program
/// stops before the lab goes.
struct TwoLinks {
    _peer: ChildGuard,
    served: Served,
    second_ns: String,
}

#[test]
fn two_interfaces_each_answer_their_own_hosts_as_their_own_server() {
    let mut second = None;
    let served = Served::start_prepared(
        "pxtwo",
        INVENTORY,
        &["--interface", "pxsrv1"],
        None,
        |lab: &mut Lab| {
            let link = lab.add_client_ns("b").expect("second veth pair");
            lab.run_in(
                lab.server_ns(),
                &["ip", "addr", "add", "10.100.0.1/24", "dev", &link.server_if],
            )
            .expect("second address");
            lab.run_in(
                &link.client_ns,
                &["ip", "link", "set", CLIENT_IF, "address", SECOND_MAC],
            )
            .expect("second client MAC");
            second = Some(link);
        },
    );
    let link = second.expect("set up");
    let peer = ChildGuard::spawn(
        served
            .lab
            .cmd_in(&link.client_ns, agent_bin())
            .args(["veth-peer", "--interface", CLIENT_IF])
            .stderr(std::process::Stdio::null()),
    )
    .expect("spawn the second veth peer");
    let two = TwoLinks {
        _peer: peer,
        served,
        second_ns: link.client_ns,
    };
    wait_for_xdp(&two.served.lab, &two.second_ns, CLIENT_IF);
    let served = &two.served;
    served.set_client_mac(FIRST_MAC);

    let offers = served.counter("tx_offer");
    let first = served.udhcpc(&PXE_BIOS);
    assert_lease(&first, "10.66.1.10", "10.66.0.1");
    assert_eq!(first["lease"], "3600");
    let second = served.udhcpc_on(&two.second_ns, CLIENT_IF, &PXE_BIOS);
    assert_lease(&second, "10.100.0.50", "10.100.0.1");
    assert_eq!(second["lease"], "1800");
    assert!(
        served.counter("tx_offer") >= offers + 2,
        "the fast path did not answer both; log:\n{}",
        served.log()
    );

    // The slow path of each interface answers as that interface (iPXE is
    // always the slow path's), with its address in the script URL.
    let acks = sample(served, "pxe_slow_replies_total{type=\"ack\"}");
    let ipxe = served.udhcpc_on(
        &two.second_ns,
        CLIENT_IF,
        &[
            "-V",
            "PXEClient",
            "-x",
            "0x5d:0000",
            "-x",
            "0x4d:0469505845",
        ],
    );
    assert_eq!(ipxe["serverid"], "10.100.0.1");
    assert_eq!(
        ipxe["bootfile"],
        "http://10.100.0.1:8080/boot/52:54:00:00:01:00.ipxe"
    );
    assert!(sample(served, "pxe_slow_replies_total{type=\"ack\"}") > acks);
}

fn wait_for_xdp(lab: &Lab, ns: &str, iface: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if lab
            .run_in(ns, &["ip", "link", "show", iface])
            .is_ok_and(|out| out.contains("xdp"))
        {
            return;
        }
        thread::sleep(Duration::from_millis(100));
    }
    panic!("no XDP program on {iface} in {ns} after 10 s");
}

/// Starts the agent on the lab's veth and on VLAN 100 over it, with a VLAN
/// sub-interface on the client end too.
fn start_vlan(name: &str) -> Served {
    let server_vlan = vlan_of(SERVER_IF);
    let vlan_arg = format!("--interface={server_vlan}");
    Served::start_prepared(
        name,
        INVENTORY,
        &[&vlan_arg, "--xdp-mode", "auto"],
        None,
        |lab: &mut Lab| {
            let (srv, cli) = (lab.server_ns(), lab.client_ns());
            let client_vlan = vlan_of(CLIENT_IF);
            lab.set_client_mac(FIRST_MAC).expect("client MAC");
            for (ns, link, vlan, addr) in [
                (srv, SERVER_IF, &server_vlan, Some("10.100.0.1/24")),
                (cli, CLIENT_IF, &client_vlan, None),
            ] {
                lab.run_in(
                    ns,
                    &[
                        "ip", "link", "add", "link", link, "name", vlan, "type", "vlan", "id", VLAN,
                    ],
                )
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot create VLAN {vlan} in {ns} (this test needs a kernel with \
                         802.1Q support, CONFIG_VLAN_8021Q): {e:#}"
                    )
                });
                if let Some(addr) = addr {
                    lab.run_in(ns, &["ip", "addr", "add", addr, "dev", vlan])
                        .expect("VLAN address");
                }
            }
            lab.run_in(
                cli,
                &["ip", "link", "set", &client_vlan, "address", SECOND_MAC],
            )
            .expect("tagged client MAC");
            lab.run_in(srv, &["ip", "link", "set", &server_vlan, "up"])
                .expect("server VLAN up");
            lab.run_in(cli, &["ip", "link", "set", &client_vlan, "up"])
                .expect("client VLAN up");
        },
    )
}

#[test]
#[ignore = "needs a kernel with 802.1Q VLAN support (CONFIG_VLAN_8021Q), which the lab \
            machines' kernel lacks; run with --ignored where it has it"]
fn tagged_and_untagged_clients_each_get_their_reservation_from_their_interface() {
    let served = start_vlan("pxvlan");
    let (passed, offers) = (served.counter("pass_vlan"), served.counter("tx_offer"));
    let tagged = served.udhcpc_on(served.lab.client_ns(), &vlan_of(CLIENT_IF), &PXE_BIOS);
    assert_lease(&tagged, "10.100.0.50", "10.100.0.1");
    assert_eq!(tagged["lease"], "1800");
    assert!(
        served.counter("pass_vlan") >= passed + 2,
        "the parent's program did not pass the tagged requests up"
    );
    let fast = served.counter("tx_offer") > offers;
    let slow = sample(&served, "pxe_slow_replies_total{type=\"offer\"}") > 0;
    assert!(
        fast || slow,
        "neither path counted the VLAN's OFFER; log:\n{}",
        served.log()
    );

    let untagged = served.udhcpc(&PXE_BIOS);
    assert_lease(&untagged, "10.66.1.10", "10.66.0.1");
    assert_eq!(untagged["lease"], "3600");
}

#[test]
#[ignore = "needs a kernel with 802.1Q VLAN support (CONFIG_VLAN_8021Q), which the lab \
            machines' kernel lacks; run with --ignored where it has it"]
fn the_slow_path_answers_on_the_vlan_as_the_vlans_server() {
    let served = start_vlan("pxvlans");
    let acks = sample(&served, "pxe_slow_replies_total{type=\"ack\"}");
    // iPXE (user class "iPXE") is always the slow path's.
    let tagged = served.udhcpc_on(
        served.lab.client_ns(),
        &vlan_of(CLIENT_IF),
        &[
            "-V",
            "PXEClient",
            "-x",
            "0x5d:0000",
            "-x",
            "0x4d:0469505845",
        ],
    );
    assert_eq!(tagged["ip"], "10.100.0.50");
    assert_eq!(tagged["serverid"], "10.100.0.1");
    assert_eq!(
        tagged["bootfile"],
        "http://10.100.0.1:8080/boot/52:54:00:00:01:00.ipxe"
    );
    assert!(
        sample(&served, "pxe_slow_replies_total{type=\"ack\"}") > acks,
        "the slow path sent no ACK"
    );
}

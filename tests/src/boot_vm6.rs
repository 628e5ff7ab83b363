//! The boot chain over IPv6 with real firmware under QEMU (TCG): OVMF's
//! PXE over IPv6 (DHCPv6, then TFTP) and OVMF's HTTP boot over IPv6 each
//! load iPXE, which asks DHCPv6 again for its script, and the script
//! loads the Debian kernel and the busybox initramfs, which phones home
//! over IPv6 from the host's address (`pxe.ip6={ipv6}/64` on the kernel
//! command line, the agent filling in the inventory's `ipv6`).
//!
//! The agent runs as the DaemonSet runs it and is the only source of
//! router advertisements (the subnet's `ra:` with M and O): iPXE starts
//! DHCPv6 only after one. The IPv6-only segment is truly so: the agent's
//! interface has no IPv4 address and the inventory's hosts no `ip`. The
//! same checks as the IPv4 boots apply (`boot_vm`): the console shows the
//! chain's steps in order, the guest said `PXE-AGENT-BOOTED` with the
//! host's IPv6 address, and the agent acknowledged its phone-home; a
//! `pxe-agent trace` followed from the start shows how the agent knew
//! the firmware and iPXE (DUID-UUID, or EUI-64 link-local address).
//!
//! Then dual stack: one host boots over IPv4 and then over IPv6 against
//! one agent, and the agent keeps one record of it that saw both.

use std::{net::Ipv6Addr, time::Duration};

use xtask::vm::{
    BootLab, BootLabConfig, Family, Firmware, SERVER_IP, SERVER_IP6, Vm, bootlab::API_ADDR,
    initramfs::PROFILE_CMDLINE6,
};

use crate::{
    agent::{agent_bin, daemonset_wrapper},
    boot_vm::{assert_chain, boot_spec},
    fixture::assert_root,
};

/// PXE over IPv6 phoned home after 35–50 s here, HTTP boot after about
/// 115 s: OVMF tries HTTP boot over IPv4 first and gives its DHCPv4 about
/// 60 s (four Discovers) on a segment that carries no IPv4.
const BOOT_TIMEOUT: Duration = Duration::from_secs(300);

/// Matched by its DUID-UUID against `uuid:`.
const PXE_MAC: &str = "52:54:00:66:10:01";
const PXE_IP6: &str = "fd00:66::20";
/// The SMBIOS system UUID QEMU gives the VM (`-uuid`), as its text reads.
const PXE_UUID: &str = "8a5c2e6b-1e0f-4c1d-9b7a-0123456789ab";

/// Matched by the MAC in its EUI-64 link-local address: no `uuid:`.
const HTTP_MAC: &str = "52:54:00:66:10:02";
const HTTP_IP6: &str = "fd00:66::21";
/// A UUID the inventory does not list.
const HTTP_UUID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

/// Boots over both families.
const DUAL_MAC: &str = "52:54:00:66:10:03";
const DUAL_IP: &str = "10.66.1.22";
const DUAL_IP6: &str = "fd00:66::22";
const DUAL_UUID: &str = "5d0c6f8e-2b1a-4e3d-8c7b-6a5948372615";

/// The IPv6-only segment's inventory: an IPv6 subnet, hosts with `ipv6`
/// and no `ip`.
const INVENTORY6: &str = r#"
subnets:
  - cidr: fd00:66::/64
    lease_time: 3600
    ra: {managed: true, other: true}
profiles:
  - name: worker
    boot:
      uefi: snponly.efi
      http: "http://{server}:8080/ipxe.efi"
    kernel: "http://{server}:8080/artifacts/vmlinuz"
    initrd: ["http://{server}:8080/artifacts/initrd.img"]
    cmdline: "@CMDLINE@"
hosts:
  - mac: "52:54:00:66:10:01"
    ipv6: "fd00:66::20"
    uuid: 8a5c2e6b-1e0f-4c1d-9b7a-0123456789ab
    hostname: six-pxe
    profile: worker
  - mac: "52:54:00:66:10:02"
    ipv6: "fd00:66::21"
    hostname: six-http
    profile: worker
"#;

/// The dual-stack segment's: both subnets, one host with both addresses.
const INVENTORY_DUAL: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    lease_time: 3600
  - cidr: fd00:66::/64
    lease_time: 3600
    ra: {managed: true, other: true}
profiles:
  - name: worker
    boot:
      uefi: snponly.efi
    kernel: "http://{server}:8080/artifacts/vmlinuz"
    initrd: ["http://{server}:8080/artifacts/initrd.img"]
    cmdline: "@CMDLINE@"
hosts:
  - mac: "52:54:00:66:10:03"
    ip: 10.66.1.22
    ipv6: "fd00:66::22"
    uuid: 5d0c6f8e-2b1a-4e3d-8c7b-6a5948372615
    hostname: dual
    profile: worker
"#;

/// A lab for `family`, the agent run as the DaemonSet runs it: IPv6 only
/// on a tap whose server end has no IPv4 address; dual stack on a bridge,
/// whose filter can stop the guest's IPv4.
fn lab(prefix: &str, family: Family) -> BootLab {
    assert_root();
    let dual = family == Family::DualStack;
    let inventory = if dual { INVENTORY_DUAL } else { INVENTORY6 };
    let inventory = inventory.replace("@CMDLINE@", PROFILE_CMDLINE6);
    let mut cfg = BootLabConfig::new(prefix, &agent_bin(), &inventory)
        .wrapper(daemonset_wrapper())
        .family(family);
    if dual {
        cfg = cfg.bridge(1);
    }
    BootLab::start(&cfg).unwrap_or_else(|e| panic!("boot lab {prefix}: {e:#}"))
}

/// Boots `firmware` with `mac` and `uuid` to the end and requires that it
/// phoned home from `ip`.
fn boot(lab: &BootLab, name: &str, mac: &str, uuid: &str, firmware: Firmware, ip: &str) -> Vm {
    let spec = lab.vm_spec(name, mac, firmware, 0).uuid(uuid);
    boot_spec(lab, &spec, BOOT_TIMEOUT, ip).0
}

/// The steps from iPXE's own DHCPv6 on, for `mac` whose script and
/// artifacts come from the agent's IPv6 address.
fn script_steps6(mac: &str, ip6: &str) -> Vec<String> {
    let http = format!("http://[{SERVER_IP6}]:8080");
    vec![
        format!("net0: {ip6}/64"),
        format!("{http}/boot/{mac}.ipxe"),
        format!("{http}/artifacts/vmlinuz"),
        format!("{http}/artifacts/initrd.img"),
        format!("PXE-AGENT-BOOTED {mac}"),
        format!("PXE-AGENT-PHONED-HOME {mac} ok"),
    ]
}

/// `pxe-agent hosts`' row for `mac`, which must show the phone-home.
fn host_row(lab: &BootLab, mac: &str) -> String {
    let table = lab
        .cli(&["hosts"])
        .unwrap_or_else(|e| panic!("pxe-agent hosts: {e:#}"));
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with(mac)).collect();
    assert_eq!(
        rows.len(),
        1,
        "one row for {mac} in `pxe-agent hosts`:\n{table}"
    );
    rows[0].to_owned()
}

/// Follows `mac` with `pxe-agent trace` for the lab's lifetime (its
/// lines in the helper log `trace-<mac>`).
fn follow(lab: &mut BootLab, mac: &str) -> String {
    let name = format!("trace-{}", mac.replace(':', ""));
    let agent = agent_bin();
    let agent = agent.to_str().expect("utf-8 path");
    lab.spawn_helper(&name, &[agent, "trace", mac])
        .unwrap_or_else(|e| panic!("pxe-agent trace {mac}: {e:#}"));
    name
}

/// Every DHCPv6 answer the trace `name` saw says the client was known
/// by `by`; returns them (the firmware's and iPXE's Advertise and Reply).
fn assert_known_by(lab: &BootLab, name: &str, by: &str) -> Vec<String> {
    let log = lab.helper_log(name);
    let answers: Vec<String> = log
        .lines()
        .filter(|l| l.contains("DHCPv6 "))
        .map(str::to_owned)
        .collect();
    eprintln!("DHCPv6 answers traced:\n{}", answers.join("\n"));
    // Solicit and Request from the firmware, and again from iPXE.
    assert!(answers.len() >= 4, "too few DHCPv6 answers traced:\n{log}");
    for answer in &answers {
        assert!(
            answer.contains(&format!("known by {by})")),
            "not known by {by}: {answer}\n{log}"
        );
    }
    answers
}

#[test]
fn uefi_pxe_over_ipv6_known_by_uuid_boots_through_ipxe_and_phones_home() {
    let mut lab = lab("pxv6pxe", Family::V6Only);
    let traced = follow(&mut lab, PXE_MAC);
    let vm = boot(&lab, "pxe6", PXE_MAC, PXE_UUID, Firmware::UefiPxe6, PXE_IP6);
    let mut steps = vec![
        ">>Start PXE over IPv6".to_owned(),
        format!("Station IP address is {}", ovmf_ipv6(PXE_IP6)),
        "NBP filename is snponly.efi".to_owned(),
        "NBP file downloaded successfully".to_owned(),
        "iPXE".to_owned(),
    ];
    steps.extend(script_steps6(PXE_MAC, PXE_IP6));
    assert_chain(&lab, &vm, vm.report(), &steps);
    let row = host_row(&lab, PXE_MAC);
    assert!(row.contains("booted"), "{row}");
    assert_known_by(&lab, &traced, "uuid");
    assert_no_ipv4(&lab);
}

#[test]
fn uefi_http_boot_over_ipv6_known_by_link_local_boots_ipxe_and_phones_home() {
    let mut lab = lab("pxv6http", Family::V6Only);
    let traced = follow(&mut lab, HTTP_MAC);
    let vm = boot(
        &lab,
        "http6",
        HTTP_MAC,
        HTTP_UUID,
        Firmware::UefiHttp6,
        HTTP_IP6,
    );
    let mut steps = vec![
        // Its IPv4 attempt first, which nothing answers.
        ">>Start HTTP Boot over IPv4".to_owned(),
        ">>Start HTTP Boot over IPv6".to_owned(),
        format!("URI: http://[{SERVER_IP6}]:8080/ipxe.efi"),
        "iPXE".to_owned(),
    ];
    steps.extend(script_steps6(HTTP_MAC, HTTP_IP6));
    assert_chain(&lab, &vm, vm.report(), &steps);
    let row = host_row(&lab, HTTP_MAC);
    assert!(row.contains("booted"), "{row}");
    assert_known_by(&lab, &traced, "link-local address");
    assert_no_ipv4(&lab);
}

/// One host, one agent serving both families on one link: OVMF's IPv4
/// PXE and then its IPv6 PXE, the same MAC and system UUID. iPXE asks
/// DHCPv4 and DHCPv6 at once and boots the DHCPv4 answer's script when
/// both come, so for the second boot the segment stops carrying the
/// guest's IPv4 and that boot runs over IPv6 to the end. Both reach
/// `booted`, and the agent keeps one record of the host: its artifact
/// count has both boots' fetches, its phone-home came from the IPv4 and
/// then from the IPv6 address.
#[test]
fn dual_stack_host_boots_over_ipv4_then_ipv6_with_one_record() {
    let lab = lab("pxv6dual", Family::DualStack);
    let vm = boot(
        &lab,
        "dual4",
        DUAL_MAC,
        DUAL_UUID,
        Firmware::UefiPxe,
        DUAL_IP,
    );
    let http4 = format!("http://{SERVER_IP}:8080");
    assert_chain(
        &lab,
        &vm,
        vm.report(),
        &[
            ">>Start PXE over IPv4".to_owned(),
            format!("Station IP address is {DUAL_IP}"),
            "NBP filename is snponly.efi".to_owned(),
            format!("{http4}/boot/{DUAL_MAC}.ipxe"),
            format!("{http4}/artifacts/vmlinuz"),
            format!("PXE-AGENT-PHONED-HOME {DUAL_MAC} ok"),
        ],
    );
    let after_v4 = host_record(&lab, DUAL_MAC);
    assert_eq!(after_v4["progress"]["artifacts_fetched"], 2, "{after_v4:#}");
    drop(vm);

    lab.carry_guest_ipv4(false).expect("IPv6 only from now on");
    let dropped = lab.ipv4_frames_dropped().expect("the filter's counter");
    let vm = boot(
        &lab,
        "dual6",
        DUAL_MAC,
        DUAL_UUID,
        Firmware::UefiPxe6,
        DUAL_IP6,
    );
    let mut steps = vec![
        ">>Start PXE over IPv6".to_owned(),
        format!("Station IP address is {}", ovmf_ipv6(DUAL_IP6)),
        "NBP filename is snponly.efi".to_owned(),
    ];
    steps.extend(script_steps6(DUAL_MAC, DUAL_IP6));
    assert_chain(&lab, &vm, vm.report(), &steps);
    let after_v6 = host_record(&lab, DUAL_MAC);
    let progress = &after_v6["progress"];
    assert_eq!(progress["artifacts_fetched"], 4, "{after_v6:#}");
    assert!(
        progress["booted"]["at_ms"].as_u64() > after_v4["progress"]["booted"]["at_ms"].as_u64(),
        "{after_v6:#}"
    );
    let booted = progress["booted"]["detail"].as_str().unwrap_or_default();
    assert!(booted.contains(DUAL_IP6), "{after_v6:#}");
    let v4_booted = after_v4["progress"]["booted"]["detail"]
        .as_str()
        .unwrap_or_default();
    assert!(v4_booted.contains(DUAL_IP), "{after_v4:#}");
    let dhcp = progress["dhcp"]["detail"].as_str().unwrap_or_default();
    assert!(dhcp.contains("DHCPv6"), "{after_v6:#}");
    // iPXE asked DHCPv4 as well, which the filter kept from the agent.
    assert!(
        lab.ipv4_frames_dropped().expect("the filter's counter") > dropped,
        "the filter dropped nothing"
    );
    assert_eq!(after_v6["ip"], DUAL_IP);
    assert_eq!(after_v6["ipv6"], DUAL_IP6);
}

/// How OVMF prints an IPv6 address: upper case, every group, no `::`.
fn ovmf_ipv6(ip: &str) -> String {
    let ip: Ipv6Addr = ip.parse().expect("an IPv6 address");
    ip.segments()
        .iter()
        .map(|s| format!("{s:X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The segment had no IPv4: the agent's interface has no IPv4 address
/// (and the inventory no IPv4 subnet), so what the guest did it did over
/// IPv6.
fn assert_no_ipv4(lab: &BootLab) {
    let shown = lab
        .cmd("ip")
        .args(["-4", "-o", "addr", "show", "dev", lab.iface()])
        .output()
        .expect("ip addr");
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.trim().is_empty(), "the server has IPv4: {shown}");
}

/// `mac`'s entry in `GET /api/v1/hosts`, the only one.
fn host_record(lab: &BootLab, mac: &str) -> serde_json::Value {
    let out = lab
        .cmd("curl")
        .args(["-sf", "-m", "5", &format!("http://{API_ADDR}/api/v1/hosts")])
        .output()
        .expect("curl");
    assert!(out.status.success(), "GET /api/v1/hosts: {}", out.status);
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let hosts: Vec<&serde_json::Value> = all
        .as_array()
        .or_else(|| all["hosts"].as_array())
        .expect("a list of hosts")
        .iter()
        .filter(|h| h["mac"] == mac)
        .collect();
    assert_eq!(hosts.len(), 1, "one record for {mac}: {all:#}");
    hosts[0].clone()
}

//! DHCPv6 with real clients: ISC dhclient and dhcpcd get their hosts'
//! IPv6 reservations from the agent run as the DaemonSet runs it, on a
//! veth lab whose server end has an IPv6 address beside its IPv4 one;
//! dhcpcd starts DHCPv6 only on the M flag of the agent's own router
//! advertisement; a MAC the inventory does not list gets nothing. Then the
//! rest of the chain from the host's IPv6 address: its boot file over
//! TFTP, its script (whose URLs name the agent's IPv6 address), an
//! artifact and the phone-home, which another address is refused.

use std::{
    fs, thread,
    time::{Duration, Instant},
};

use xtask::Lab;

use crate::agent::{Privileges, Scratch, Served};

/// The server end's IPv6 address and subnet.
pub(crate) const SERVER_IP6: &str = "fd00:66::1";

pub(crate) const INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
  - cidr: fd00:66::/64
    dns: ["fd00:66::53"]
    domain: lab.example
    lease_time: 600
    ra: {}
profiles:
  - name: worker
    boot: {uefi: ipxe.efi, bios: undionly.kpxe}
    kernel: "http://{server}:8080/artifacts/vmlinuz"
    cmdline: console=ttyS0
hosts:
  - mac: "52:54:00:66:00:01"
    ip: 10.66.1.1
    ipv6: "fd00:66::101"
    hostname: six-1
    profile: worker
  - mac: "52:54:00:66:00:02"
    ip: 10.66.1.2
    ipv6: "fd00:66::102"
    hostname: six-2
    profile: worker
"#;

/// Gives the server end its IPv6 address and waits until both ends'
/// addresses have passed duplicate address detection, so that the agent
/// finds its address at start and the clients can send from their
/// link-local ones.
pub(crate) fn add_ipv6(lab: &mut Lab) {
    give_ipv6(
        lab,
        lab.server_ns(),
        lab.server_if(),
        &format!("{SERVER_IP6}/64"),
    )
    .expect("server IPv6 address");
    wait_link_local(lab, lab.server_ns(), lab.server_if());
    wait_link_local(lab, lab.client_ns(), lab.client_if());
}

/// Gives `iface` in `ns` the IPv6 address `cidr` at once (no duplicate
/// address detection), as it is or was there already.
pub(crate) fn give_ipv6(lab: &Lab, ns: &str, iface: &str, cidr: &str) -> anyhow::Result<String> {
    lab.run_in(
        ns,
        &["ip", "-6", "addr", "replace", cidr, "dev", iface, "nodad"],
    )
}

/// Waits until `iface` in `ns` has a link-local address past duplicate
/// address detection.
fn wait_link_local(lab: &Lab, ns: &str, iface: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let shown = lab
            .run_in(ns, &["ip", "-6", "addr", "show", "dev", iface])
            .expect("ip addr");
        if shown.contains("fe80::") && !shown.contains("tentative") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{iface} in {ns} has no usable link-local address:\n{shown}"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// Makes the client a machine with `mac`: its link-local address becomes
/// the one made from that MAC (EUI-64), as a machine's own is, and the
/// server forgets the link-layer address it knew for the old one.
pub(crate) fn become_machine(served: &Served, mac: &str) {
    let lab = &served.lab;
    served.set_client_mac(mac);
    let eui64 = eui64_link_local(mac);
    let (ns, iface) = (lab.client_ns(), lab.client_if());
    lab.run_in(
        ns,
        &["ip", "-6", "addr", "flush", "dev", iface, "scope", "link"],
    )
    .expect("drop the old link-local address");
    lab.run_in(
        ns,
        &["ip", "-6", "addr", "add", &eui64, "dev", iface, "nodad"],
    )
    .expect("the machine's link-local address");
    lab.run_in(
        lab.server_ns(),
        &["ip", "neigh", "flush", "dev", lab.server_if()],
    )
    .expect("flush the server's neighbours");
}

/// The link-local address a machine with `mac` makes for itself (EUI-64),
/// with its prefix length.
pub(crate) fn eui64_link_local(mac: &str) -> String {
    let octets: Vec<u8> = mac
        .split(':')
        .map(|o| u8::from_str_radix(o, 16).expect("hex"))
        .collect();
    format!(
        "fe80::{:02x}{:02x}:{:02x}ff:fe{:02x}:{:02x}{:02x}/64",
        octets[0] ^ 0x02,
        octets[1],
        octets[2],
        octets[3],
        octets[4],
        octets[5]
    )
}

/// Runs `dhclient -6` once in the client namespace (at most `timeout_s`
/// seconds) and stops the daemon it leaves; returns its lease file, empty
/// when it got no lease.
pub(crate) fn dhclient6(served: &Served, tag: &str, timeout_s: u32) -> String {
    let (ns, iface) = (served.lab.client_ns(), served.lab.client_if());
    dhclient6_in(served, ns, iface, tag, timeout_s)
}

/// [`dhclient6`] on `iface` in namespace `ns`.
fn dhclient6_in(served: &Served, ns: &str, iface: &str, tag: &str, timeout_s: u32) -> String {
    dhclient6_run(served, (ns, iface), tag, timeout_s, Run6::default())
}

/// [`dhclient6_command`] in `ns` of the served lab, its files in the
/// test's scratch directory.
pub(crate) fn dhclient6_run(
    served: &Served,
    (ns, iface): (&str, &str),
    tag: &str,
    timeout_s: u32,
    how: Run6,
) -> String {
    let dhclient = served.lab.cmd_in(ns, "dhclient");
    dhclient6_command(dhclient, &served.dir, iface, (tag, timeout_s), how)
}

/// How [`dhclient6_run`] runs dhclient.
#[derive(Clone, Copy, Default)]
pub(crate) struct Run6 {
    /// A DUID-LL made from the interface's MAC (`-D LL`): the same DUID on
    /// every run, whatever the lease file.
    pub(crate) duid_ll: bool,
    /// Release the lease in the tag's lease file (`-r`) instead.
    pub(crate) release: bool,
}

/// Runs `dhclient -6` once on `iface` (`dhclient`: the program, in the
/// namespace of `iface`; at most `timeout_s` seconds), its files in `dir`
/// named after `tag`, and stops the daemon it leaves; returns its lease
/// file, empty when it got no lease.
pub(crate) fn dhclient6_command(
    mut dhclient: std::process::Command,
    dir: &Scratch,
    iface: &str,
    (tag, timeout_s): (&str, u32),
    how: Run6,
) -> String {
    let file = |ext: &str| dir.path(&format!("dhclient6-{tag}.{ext}"));
    let (lease, pid, conf, duid) = (file("leases"), file("pid"), file("conf"), file("duid"));
    fs::write(&conf, format!("timeout {timeout_s};\n")).expect("dhclient config");
    let cmd = &mut dhclient;
    cmd.args(["-6", "-v", "-sf", "/bin/true"]);
    if how.duid_ll {
        cmd.args(["-D", "LL"]);
    }
    cmd.arg(if how.release { "-r" } else { "-1" });
    let out = cmd
        .arg("-cf")
        .arg(&conf)
        .arg("-lf")
        .arg(&lease)
        .arg("-pf")
        .arg(&pid)
        .arg("-df")
        .arg(&duid)
        .arg(iface)
        .output()
        .expect("run dhclient");
    // With a lease, dhclient -1 goes on in the background and writes its
    // PID file from there, maybe after the foreground process returned:
    // waited for, so that the daemon is stopped rather than left behind.
    let bound = fs::read_to_string(&lease).is_ok_and(|l| l.contains("iaaddr"));
    let deadline = Instant::now() + Duration::from_secs(3);
    let daemon = loop {
        let written = fs::read_to_string(&pid)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok());
        if written.is_some() || how.release || !bound || Instant::now() >= deadline {
            break written;
        }
        thread::sleep(Duration::from_millis(50));
    };
    if !how.release
        && let Some(p) = daemon
    {
        // SAFETY: signals the PID our own dhclient wrote.
        unsafe { libc::kill(p, libc::SIGTERM) };
    }
    eprintln!(
        "dhclient -6 ({tag}{}): {}\n{}",
        if how.release { ", release" } else { "" },
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    fs::read_to_string(&lease).unwrap_or_default()
}

/// Runs `dhcpcd -6` once and returns what its hook saw: it solicits a
/// router, and starts stateful DHCPv6 when an advertisement has the M
/// flag.
fn dhcpcd6(served: &Served) -> String {
    let conf = served.dir.path("dhcpcd6.conf");
    fs::write(&conf, "ipv6only\n").expect("dhcpcd config");
    let conf = conf.to_str().expect("utf-8 path");
    served.run_dhcpcd(
        &["-6", "-d", "--oneshot", "--nobackground", "-t", "15", "-f", conf],
        r#"echo "reason=$reason ia=$new_dhcp6_ia_na1_ia_addr1 dns=$new_dhcp6_name_servers ra_flags=$nd1_flags""#,
    )
}

/// The server DUID the agent keeps in its state directory.
pub(crate) fn server_duid_bytes(served: &Served) -> Vec<u8> {
    let hex = fs::read_to_string(served.dir.path("state/dhcpv6-duid")).expect("server DUID file");
    pxe_agent::inventory::decode_hex(hex.trim()).expect("a DUID in hex")
}

/// The agent's server DUID as dhclient prints it in a lease file
/// (`option dhcp6.server-id 0:3:0:1:...;`).
fn server_duid(served: &Served) -> String {
    server_duid_bytes(served)
        .iter()
        .map(|b| format!("{b:x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The agent's DHCPv6 samples, for failure messages.
fn ipv6_samples(served: &Served) -> Vec<(String, u64)> {
    served
        .stats()
        .into_iter()
        .filter(|(name, _)| name.contains("family=\"ipv6\""))
        .collect()
}

fn sample(served: &Served, name: &str) -> u64 {
    served.stats().get(name).copied().unwrap_or(0)
}

#[test]
fn dhclient_and_dhcpcd_get_their_ipv6_reservations_from_the_agent_as_deployed() {
    let served =
        Served::start_as_prepared("pxdhcp6", INVENTORY, &[], Privileges::DaemonSet, add_ipv6);

    become_machine(&served, "52:54:00:66:00:01");
    let lease = dhclient6(&served, "known", 15);
    assert!(
        lease.contains("iaaddr fd00:66::101 {"),
        "dhclient -6 did not get six-1's reservation:\n{lease}\nagent log:\n{}",
        served.log()
    );
    let duid = server_duid(&served);
    assert!(
        lease.contains(&format!("option dhcp6.server-id {duid};")),
        "the lease is not from the agent (server id {duid}):\n{lease}"
    );
    assert!(
        lease.contains("option dhcp6.name-servers fd00:66::53;"),
        "{lease}"
    );
    assert!(lease.contains("max-life 600;"), "{lease}");

    become_machine(&served, "52:54:00:66:00:02");
    let seen = dhcpcd6(&served);
    assert!(
        seen.contains("ia=fd00:66::102"),
        "dhcpcd -6 did not get six-2's reservation:\n{seen}\nagent's DHCPv6 counters: {:#?}\nagent log:\n{}",
        ipv6_samples(&served),
        served.log()
    );
    // It asked for DHCPv6 because the agent's advertisement said M and O.
    assert!(
        seen.contains("reason=ROUTERADVERT") && seen.contains("ra_flags=MO"),
        "{seen}"
    );
    let assigned = served
        .lab
        .run_in(
            served.lab.client_ns(),
            &["ip", "-6", "addr", "show", "dev", served.lab.client_if()],
        )
        .expect("ip addr");
    eprintln!("client addresses after dhcpcd:\n{assigned}");

    // A MAC the inventory does not list is left to other servers.
    let ignored = r#"pxe_slow_ignored_total{family="ipv6",reason="pass_unknown_host"}"#;
    let before = sample(&served, ignored);
    become_machine(&served, "52:54:00:66:00:99");
    let lease = dhclient6(&served, "unknown", 3);
    assert!(
        !lease.contains("iaaddr"),
        "an unknown MAC got a lease:\n{lease}"
    );
    assert!(sample(&served, ignored) > before, "{:#?}", served.stats());

    let replies = r#"pxe_slow_replies_total{family="ipv6",type="reply"}"#;
    let advertises = r#"pxe_slow_replies_total{family="ipv6",type="advertise"}"#;
    assert!(sample(&served, replies) >= 2, "{:#?}", served.stats());
    assert!(sample(&served, advertises) >= 2, "{:#?}", served.stats());
    // Boot progress knows the hosts by their MACs.
    let hosts = served.cli(&["hosts"]);
    assert!(
        hosts.contains("six-1") && hosts.contains("DHCPv6"),
        "{hosts}"
    );
    assert!(
        hosts.contains("IPV6") && hosts.contains("fd00:66::101"),
        "{hosts}"
    );
    // dhclient sends a DUID-LLT: its MAC names the host.
    let json = served.cli(&["hosts", "--format", "json"]);
    assert!(json.contains("known by duid mac"), "{json}");
}

/// curl in the client namespace; its output, and whether it succeeded.
fn curl(served: &Served, args: &[&str]) -> (bool, String) {
    let out = served
        .client_cmd("curl")
        .args(["-s", "--max-time", "10"])
        .args(args)
        .output()
        .expect("run curl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_chain_runs_over_ipv6_from_the_hosts_ipv6_address() {
    let files = Scratch::new("pxdhcp6-files");
    fs::create_dir_all(files.path("boot")).expect("boot root");
    fs::create_dir_all(files.path("artifacts")).expect("artifacts");
    fs::write(files.path("boot/undionly.kpxe"), b"the boot file").expect("boot file");
    fs::write(files.path("artifacts/vmlinuz"), b"the kernel").expect("kernel");
    let (boot, artifacts) = (files.path("boot"), files.path("artifacts"));
    let args = [
        "--boot-root",
        boot.to_str().expect("utf-8"),
        "--artifacts",
        artifacts.to_str().expect("utf-8"),
    ];
    let served = Served::start_as_prepared(
        "pxchain6",
        INVENTORY,
        &args,
        Privileges::DaemonSet,
        add_ipv6,
    );
    become_machine(&served, "52:54:00:66:00:01");
    let lab = &served.lab;
    give_ipv6(lab, lab.client_ns(), lab.client_if(), "fd00:66::101/64")
        .expect("the host's address");

    let (ok, file) = curl(&served, &["tftp://[fd00:66::1]/undionly.kpxe"]);
    assert!(
        ok && file == "the boot file",
        "TFTP over IPv6: {file:?}\n{}",
        served.log()
    );

    let script_url = "http://[fd00:66::1]:8080/boot/52:54:00:66:00:01.ipxe";
    let (ok, script) = curl(&served, &["-f", script_url]);
    assert!(ok, "script over IPv6 refused:\n{}", served.log());
    let kernel = script
        .lines()
        .find(|l| l.starts_with("kernel "))
        .unwrap_or_else(|| panic!("no kernel line:\n{script}"));
    assert!(
        kernel.contains("http://[fd00:66::1]:8080/artifacts/vmlinuz"),
        "the script does not send an IPv6 client to the agent's IPv6 address: {kernel}"
    );
    let token = kernel
        .split_whitespace()
        .find_map(|a| a.strip_prefix("pxe_agent.token="))
        .unwrap_or_else(|| panic!("no token: {kernel}"));

    let (ok, body) = curl(
        &served,
        &["-f", "http://[fd00:66::1]:8080/artifacts/vmlinuz"],
    );
    assert!(ok && body == "the kernel", "artifact over IPv6: {body:?}");

    // Another address on the segment may not fetch the host's script.
    give_ipv6(lab, lab.client_ns(), lab.client_if(), "fd00:66::199/64")
        .expect("a stranger's address");
    let (_, code) = curl(
        &served,
        &[
            "--interface",
            "fd00:66::199",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            script_url,
        ],
    );
    assert_eq!(code, "403", "a script for six-1 went to another address");

    let phone_home =
        format!("http://[fd00:66::1]:8080/api/v1/hosts/52:54:00:66:00:01/booted?token={token}");
    let (_, code) = curl(
        &served,
        &[
            "--interface",
            "fd00:66::101",
            "-X",
            "POST",
            "-d",
            "up",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &phone_home,
        ],
    );
    assert_eq!(code, "204", "phone-home over IPv6:\n{}", served.log());
    let hosts = served.cli(&["hosts"]);
    let row = hosts
        .lines()
        .find(|l| l.starts_with("52:54:00:66:00:01"))
        .unwrap_or_else(|| panic!("six-1 not listed:\n{hosts}"));
    assert!(row.contains("booted"), "{hosts}");
}

/// An IPv6-only provisioning segment: the agent's interface has no IPv4
/// address and the host has only `ipv6:`.
const IPV6_ONLY: &str = r#"
subnets:
  - cidr: fd00:66::/64
    lease_time: 600
    ra: {}
profiles:
  - name: worker
    boot: {uefi: ipxe.efi, bios: undionly.kpxe}
    kernel: "http://{server}:8080/artifacts/vmlinuz"
    cmdline: console=ttyS0
hosts:
  - mac: "52:54:00:66:00:03"
    ipv6: "fd00:66::103"
    hostname: six-only
    profile: worker
"#;

#[test]
fn an_agent_on_an_interface_without_ipv4_serves_an_ipv6_only_host_as_deployed() {
    let served = Served::start_as_prepared(
        "pxv6only",
        IPV6_ONLY,
        &[],
        Privileges::DaemonSet,
        |lab: &mut Lab| {
            add_ipv6(lab);
            lab.run_in(
                lab.server_ns(),
                &["ip", "-4", "addr", "flush", "dev", lab.server_if()],
            )
            .expect("take the server's IPv4 address away");
        },
    );
    // Ready (start_as_prepared waited for it) with no XDP program and no
    // DHCPv4 slow path: the DHCPv6 loop is what readiness follows.
    let log = served.log();
    assert!(
        log.contains("DHCPv4 and the XDP fast path are not served there"),
        "{log}"
    );
    assert!(log.contains("DHCPv6 listening on UDP port 547"), "{log}");

    become_machine(&served, "52:54:00:66:00:03");
    let lease = dhclient6(&served, "v6only", 15);
    assert!(
        lease.contains("iaaddr fd00:66::103 {"),
        "dhclient -6 did not get the IPv6-only host's reservation:\n{lease}\nagent log:\n{}",
        served.log()
    );
    // The address dhclient was given, kept after its daemon stopped.
    let lab = &served.lab;
    give_ipv6(lab, lab.client_ns(), lab.client_if(), "fd00:66::103/64")
        .expect("the host's address");
    let script_url = "http://[fd00:66::1]:8080/boot/52:54:00:66:00:03.ipxe";
    let (ok, script) = curl(&served, &["-f", "--interface", "fd00:66::103", script_url]);
    assert!(ok, "script over IPv6 refused:\n{}", served.log());
    assert!(
        script.contains("kernel http://[fd00:66::1]:8080/artifacts/vmlinuz"),
        "{script}"
    );
    let hosts = served.cli(&["hosts"]);
    let row = hosts
        .lines()
        .find(|l| l.starts_with("52:54:00:66:00:03"))
        .unwrap_or_else(|| panic!("the host is not listed:\n{hosts}"));
    // No IPv4 address: shown as "-"; its IPv6 one beside it.
    assert!(
        row.split_whitespace().nth(1) == Some("-") && row.contains("fd00:66::103"),
        "{hosts}"
    );
}

/// A relayed IPv6 segment: the client behind ISC `dhcrelay -6` (which adds
/// the interface-id), two links from the agent.
///
/// ```text
/// server ns                   relay ns (the lab's client ns)             client ns
/// pxsrv0 fd00:66::1/64 ──── pxcli0 fd00:66::2/64 │ pxrly0 fd00:77::1/64 ──── pxcli0
/// agent                     dhcrelay -6 -l pxrly0 -u fd00:66::1%pxcli0     dhclient -6
/// ```
#[test]
fn a_client_behind_dhcrelay_6_gets_its_reservation_through_the_relay() {
    const RELAYED: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
  - cidr: 10.77.0.0/24
  - cidr: fd00:77::/64
    dns: ["fd00:77::53"]
profiles:
  - name: worker
    boot: {uefi: ipxe.efi}
hosts:
  - mac: "52:54:00:77:00:50"
    ip: 10.77.0.50
    ipv6: "fd00:77::50"
    hostname: rack7-node50
    profile: worker
"#;
    let mut served =
        Served::start_as_prepared("pxrelay6", RELAYED, &[], Privileges::DaemonSet, add_ipv6);
    let relay_ns = served.lab.client_ns().to_owned();
    let relay_up = served.lab.client_if().to_owned();
    let server_ns = served.lab.server_ns().to_owned();
    let link = served
        .lab
        .add_client_ns("client")
        .expect("client namespace");
    let client_ns = link.client_ns.clone();
    let ip = |args: &[&str]| {
        let mut cmd = std::process::Command::new("ip");
        xtask::process::run(cmd.args(args)).unwrap_or_else(|e| panic!("ip {args:?}: {e:#}"));
    };
    // The client hangs off the relay, not off the server.
    ip(&["-n", &server_ns, "link", "del", &link.server_if]);
    ip(&[
        "-n", &relay_ns, "link", "add", "pxrly0", "type", "veth", "peer", "name", "pxcli0",
        "netns", &client_ns,
    ]);
    ip(&[
        "-n",
        &relay_ns,
        "-6",
        "addr",
        "add",
        "fd00:66::2/64",
        "dev",
        &relay_up,
        "nodad",
    ]);
    ip(&[
        "-n",
        &relay_ns,
        "-6",
        "addr",
        "add",
        "fd00:77::1/64",
        "dev",
        "pxrly0",
        "nodad",
    ]);
    ip(&["-n", &relay_ns, "link", "set", "pxrly0", "up"]);
    ip(&[
        "-n",
        &client_ns,
        "link",
        "set",
        "dev",
        "pxcli0",
        "address",
        "52:54:00:77:00:50",
    ]);
    ip(&["-n", &client_ns, "link", "set", "pxcli0", "up"]);
    ip(&[
        "-n",
        &server_ns,
        "-6",
        "route",
        "add",
        "fd00:77::/64",
        "via",
        "fd00:66::2",
    ]);
    served
        .lab
        .run_in(
            &relay_ns,
            &["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"],
        )
        .expect("IPv6 forwarding in the relay namespace");
    wait_link_local(&served.lab, &relay_ns, "pxrly0");
    wait_link_local(&served.lab, &client_ns, "pxcli0");

    let log = served.dir.path("dhcrelay6.log");
    let out = fs::File::create(&log).expect("relay log");
    let _relay = xtask::ChildGuard::spawn(
        served
            .lab
            .cmd_in(&relay_ns, "dhcrelay")
            .args(["-6", "-d", "--no-pid", "-I", "-l", "pxrly0", "-u"])
            .arg(format!("{SERVER_IP6}%{relay_up}"))
            .stdout(out.try_clone().expect("fd"))
            .stderr(out),
    )
    .expect("spawn dhcrelay -6");
    thread::sleep(Duration::from_secs(1));

    let lease = dhclient6_in(&served, &client_ns, "pxcli0", "relayed", 15);
    assert!(
        lease.contains("iaaddr fd00:77::50 {"),
        "dhclient -6 behind the relay did not get its reservation:\n{lease}\nrelay log:\n{}\n\
         agent's DHCPv6 counters: {:#?}\nagent log:\n{}",
        fs::read_to_string(&log).unwrap_or_default(),
        ipv6_samples(&served),
        served.log()
    );
    assert!(
        lease.contains("option dhcp6.name-servers fd00:77::53;"),
        "{lease}"
    );
}

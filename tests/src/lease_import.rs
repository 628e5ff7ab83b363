//! `pxe-agent import leases` with the servers it imports from: real
//! dnsmasq and real kea-dhcp4 (memfile) lease an address to a real client
//! (busybox udhcpc asking for a chosen pool address), are stopped, and
//! their lease files are imported into a state directory; the agent,
//! started on that state directory as the DaemonSet runs it, gives the
//! same MAC (udhcpc, then ISC dhclient, neither asking for an address) the
//! same address, which is not the one it would give a new client.

use std::{fs, path::Path, process::Command};

use xtask::{ChildGuard, Lab};

use crate::{
    agent::{Privileges, Scratch, Served, agent_bin, script},
    slow_path,
};

/// The client of dnsmasq, the address it asks dnsmasq for; the same for
/// Kea. The agent's pool is 10.66.200.1-20 and a new client gets .1.
const DNSMASQ_CLIENT: (&str, &str) = ("52:54:00:aa:77:01", "10.66.200.17");
const KEA_CLIENT: (&str, &str) = ("52:54:00:aa:77:02", "10.66.200.13");

/// busybox udhcpc in the lab's client namespace with `mac`, asking for
/// `ip`: the address it was given.
fn lease_from_original(lab: &Lab, dir: &Path, (mac, ip): (&str, &str), server: &str) -> String {
    lab.set_client_mac(mac).expect("client MAC");
    let hook = script(dir, "bound.sh", r#"[ "$1" = bound ] && echo "ip=$ip""#);
    let out = lab
        .cmd_in(lab.client_ns(), "busybox")
        .args(["udhcpc", "-f", "-q", "-n", "-t", "15", "-T", "1", "-i"])
        .arg(lab.client_if())
        .arg("-s")
        .arg(&hook)
        .args(["-r", ip])
        .output()
        .expect("run udhcpc");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "udhcpc got no lease from {server}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    crate::agent::vars(&text)
        .get("ip")
        .cloned()
        .unwrap_or_else(|| panic!("no address from {server}: {text}"))
}

/// `pxe-agent import leases --from FORMAT FILE --inventory INV --state-dir
/// DIR EXTRA...`: whether it succeeded, and its standard error.
fn try_import_leases(
    format: &str,
    file: &Path,
    inventory: &Path,
    state: &Path,
    extra: &[&str],
) -> (bool, String) {
    let out = Command::new(agent_bin())
        .args(["import", "leases", "--from", format])
        .arg(file)
        .arg("--inventory")
        .arg(inventory)
        .arg("--state-dir")
        .arg(state)
        .args(extra)
        .output()
        .expect("run pxe-agent import leases");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("import leases --from {format} {extra:?}:\n{err}");
    (out.status.success(), err)
}

/// [`try_import_leases`] that must succeed: its standard error.
fn import_leases(format: &str, file: &Path, inventory: &Path, state: &Path) -> String {
    let (ok, err) = try_import_leases(format, file, inventory, state, &[]);
    assert!(ok, "import leases --from {format} failed: {err}");
    err
}

/// dnsmasq serving the agent's pool from the lab's server end, writing
/// its leases to `leases`.
fn dnsmasq(lab: &Lab, dir: &Path, leases: &Path) -> ChildGuard {
    ChildGuard::spawn(
        lab.cmd_in(lab.server_ns(), "dnsmasq")
            .args(["--no-daemon", "--port=0", "--conf-file=/dev/null"])
            .arg(format!("--interface={}", lab.server_if()))
            .args(["--bind-interfaces", "--no-ping", "--dhcp-authoritative"])
            .arg("--dhcp-range=10.66.200.1,10.66.200.20,255.255.0.0,1h")
            .arg(format!("--dhcp-leasefile={}", leases.display()))
            .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    )
    .expect("spawn dnsmasq")
}

/// kea-dhcp4 serving the agent's pool, its memfile at `leases`.
fn kea(lab: &Lab, dir: &Path, leases: &Path) -> ChildGuard {
    let conf = dir.join("kea-dhcp4.conf");
    fs::write(
        &conf,
        format!(
            r#"{{ "Dhcp4": {{
  "interfaces-config": {{ "interfaces": ["{iface}"], "dhcp-socket-type": "raw" }},
  "lease-database": {{ "type": "memfile", "persist": true, "name": "{leases}", "lfc-interval": 0 }},
  "valid-lifetime": 3600,
  "subnet4": [{{ "id": 1, "subnet": "10.66.0.0/16",
                 "pools": [ {{ "pool": "10.66.200.1 - 10.66.200.20" }} ] }}],
  "loggers": [{{ "name": "kea-dhcp4", "output_options": [{{ "output": "{log}" }}], "severity": "WARN" }}]
}} }}"#,
            iface = lab.server_if(),
            leases = leases.display(),
            log = dir.join("kea.log").display()
        ),
    )
    .expect("write kea config");
    ChildGuard::spawn(
        lab.cmd_in(lab.server_ns(), "kea-dhcp4")
            .env("KEA_PIDFILE_DIR", dir)
            .env("KEA_LOCKFILE_DIR", dir)
            .arg("-c")
            .arg(&conf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    )
    .expect("spawn kea-dhcp4")
}

#[test]
fn leases_carried_from_dnsmasq_and_kea_keep_their_addresses_with_real_clients() {
    crate::fixture::assert_root();
    let dir = Scratch::new("lease-import");
    let inventory = dir.path("inventory.yaml");
    fs::write(&inventory, slow_path::INVENTORY).expect("inventory");
    let (from_dnsmasq, from_kea) = (dir.path("from-dnsmasq"), dir.path("from-kea"));
    let (dnsmasq_leases, kea_leases) = (dir.path("dnsmasq.leases"), dir.path("kea-leases4.csv"));
    let mut given = (String::new(), String::new());
    let mut served = Served::start_as_prepared(
        "pxlease",
        slow_path::INVENTORY,
        &["--state-dir", from_dnsmasq.to_str().expect("utf-8 path")],
        Privileges::DaemonSet,
        |lab| {
            let server = dnsmasq(lab, &dir.0, &dnsmasq_leases);
            given.0 = lease_from_original(lab, &dir.0, DNSMASQ_CLIENT, "dnsmasq");
            server.stop().expect("stop dnsmasq");
            let server = kea(lab, &dir.0, &kea_leases);
            given.1 = lease_from_original(lab, &dir.0, KEA_CLIENT, "kea-dhcp4");
            server.stop().expect("stop kea-dhcp4");
            // A dry run writes nothing.
            let (ok, said) = try_import_leases(
                "dnsmasq",
                &dnsmasq_leases,
                &inventory,
                &from_dnsmasq,
                &["--dry-run"],
            );
            assert!(
                ok && said.contains("(--dry-run: nothing written)"),
                "{said}"
            );
            assert!(!from_dnsmasq.exists(), "--dry-run made the state directory");
            // The agent starts on the dnsmasq leases; the Kea ones are for
            // its second start.
            let said = import_leases("dnsmasq", &dnsmasq_leases, &inventory, &from_dnsmasq);
            assert!(
                said.contains("1 leases carried (1 IPv4, 0 IPv6); nothing left out"),
                "{said}"
            );
            let said = import_leases("kea", &kea_leases, &inventory, &from_kea);
            assert!(
                said.contains("1 leases carried (1 IPv4, 0 IPv6); nothing left out"),
                "{said}"
            );
            // A store that holds leases is replaced only with --force.
            let (ok, said) = try_import_leases("kea", &kea_leases, &inventory, &from_kea, &[]);
            assert!(
                !ok && said.contains("holds leases already: nothing written; --force replaces"),
                "{said}"
            );
            let (ok, said) =
                try_import_leases("kea", &kea_leases, &inventory, &from_kea, &["--force"]);
            assert!(ok, "{said}");
        },
    );
    assert_eq!(given.0, DNSMASQ_CLIENT.1, "dnsmasq gave another address");
    assert_eq!(given.1, KEA_CLIENT.1, "kea-dhcp4 gave another address");

    served.set_client_mac(DNSMASQ_CLIENT.0);
    let lease = served.udhcpc(&[]);
    assert_eq!(
        lease["ip"],
        DNSMASQ_CLIENT.1,
        "the dnsmasq client did not keep its address; agent log:\n{}",
        served.log()
    );
    assert_eq!(
        lease["serverid"], "10.66.0.1",
        "the lease is not the agent's"
    );
    // The running agent holds its store: an import is refused, whole.
    let (ok, said) = try_import_leases(
        "dnsmasq",
        &dnsmasq_leases,
        &inventory,
        &from_dnsmasq,
        &["--force"],
    );
    assert!(!ok && said.contains("stop the agent first"), "{said}");

    // The Kea client, on a store carried from Kea's memfile.
    let status = served.signal_agent(libc::SIGTERM);
    assert!(status.success(), "agent did not stop cleanly: {status}");
    served.restart(&["--state-dir", from_kea.to_str().expect("utf-8 path")]);
    served.set_client_mac(KEA_CLIENT.0);
    let file = served.dhclient();
    assert!(
        file.contains(&format!("fixed-address {};", KEA_CLIENT.1)),
        "the Kea client did not keep its address: {file}\nagent log:\n{}",
        served.log()
    );
    assert!(
        file.contains("option dhcp-server-identifier 10.66.0.1;"),
        "dhclient's lease is not from the agent: {file}"
    );
    // A client the old servers never saw gets the pool's first address:
    // the two above were not the agent's own choice.
    served.set_client_mac("52:54:00:aa:77:03");
    assert_eq!(served.udhcpc(&[])["ip"], "10.66.200.1");
}

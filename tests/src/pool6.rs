//! DHCPv6 pool leases with a real client: ISC `dhclient -6`, on a machine
//! the inventory does not list, gets an address of the IPv6 pool from the
//! agent run as the DaemonSet runs it. The binding is in the agent's lease
//! store file (read here while the agent is stopped); after a restart a
//! new machine is not given that address and the same client (same DUID)
//! gets it again. The pool's last address goes, the next client is told
//! NoAddrsAvail (counted), and `dhclient -6 -r` frees the address for it.

use pxe_agent::lease::{LeaseState, LeaseStore};
use serde_json::Value;

use crate::{
    agent::{Privileges, Served},
    dhcp6::{Run6, add_ipv6, become_machine, dhclient6_run, give_ipv6},
};

/// A pool of three addresses, discovery on, no host with an IPv6
/// reservation among the machines here.
const INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    pool: {start: 10.66.200.1, end: 10.66.200.20}
  - cidr: fd00:66::/64
    lease_time: 600
    ra: {}
    pool: {start: "fd00:66::1000", end: "fd00:66::1002"}
discovery: {policy: inspect, profile: inspector}
profiles:
  - name: inspector
    boot: {uefi: ipxe.efi, bios: undionly.kpxe}
hosts:
  - mac: "52:54:00:66:00:01"
    ip: 10.66.1.1
    ipv6: "fd00:66::101"
    profile: inspector
"#;

const FIRST: &str = "fd00:66::1000";

/// `dhclient -6` once as the machine the client end is now, with a
/// DUID-LL made from its MAC; with `release`, it releases the lease instead.
fn dhclient6(served: &Served, tag: &str, timeout_s: u32, release: bool) -> String {
    let at = (served.lab.client_ns(), served.lab.client_if());
    let how = Run6 {
        duid_ll: true,
        release,
    };
    dhclient6_run(served, at, &format!("pool6-{tag}"), timeout_s, how)
}

/// The address of the last `iaaddr` in a dhclient lease file.
fn leased(file: &str) -> Option<String> {
    file.lines()
        .filter_map(|l| l.trim().strip_prefix("iaaddr "))
        .filter_map(|rest| rest.split_whitespace().next())
        .next_back()
        .map(str::to_owned)
}

/// The agent's IPv6 pool leases as `pxe-agent leases --output json` lists
/// them: (address, state, MAC, DUID).
fn leases6(served: &Served) -> Vec<(String, String, String, String)> {
    let list: Value =
        serde_json::from_str(&served.cli(&["leases", "--format", "json"])).expect("lease JSON");
    list.as_array()
        .expect("a list")
        .iter()
        .filter(|l| l["iaid"].is_u64())
        .map(|l| {
            let text = |k: &str| l[k].as_str().unwrap_or_default().to_owned();
            (text("ip"), text("state"), text("mac"), text("duid"))
        })
        .collect()
}

fn sample(served: &Served, name: &str) -> u64 {
    served.stats().get(name).copied().unwrap_or(0)
}

#[test]
fn a_pool_lease_survives_a_restart_in_the_store_file_and_is_released() {
    let mut served =
        Served::start_as_prepared("pxpool6", INVENTORY, &[], Privileges::DaemonSet, add_ipv6);

    // An unknown machine: a pool address, its binding listed under its
    // DUID-LL (which carries its MAC).
    become_machine(&served, "52:54:00:66:00:77");
    let first = dhclient6(&served, "a", 15, false);
    assert_eq!(
        leased(&first).as_deref(),
        Some(FIRST),
        "dhclient -6 got no pool address:\n{first}\nagent log:\n{}",
        served.log()
    );
    let duid = "00:03:00:01:52:54:00:66:00:77";
    let listed = leases6(&served);
    assert!(
        listed.contains(&(
            FIRST.to_owned(),
            "bound".to_owned(),
            "52:54:00:66:00:77".to_owned(),
            duid.to_owned()
        )),
        "{listed:?}"
    );
    let table = served.cli(&["leases"]);
    assert!(
        table.contains(FIRST) && table.contains("52:54:00:66:00:77"),
        "{table}"
    );
    let bound6 = r#"pxe_leases{family="ipv6",state="bound"}"#;
    assert_eq!(sample(&served, bound6), 1, "{:#?}", served.stats());
    // The discovered machine fetches its script from its pool address, and
    // only from there.
    let lab = &served.lab;
    give_ipv6(
        lab,
        lab.client_ns(),
        lab.client_if(),
        &format!("{FIRST}/64"),
    )
    .expect("the leased address");
    let script = "http://[fd00:66::1]:8080/boot/52:54:00:66:00:77.ipxe";
    let code = |from: &str| {
        let out = served
            .client_cmd("curl")
            .args([
                "-s",
                "--max-time",
                "10",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .args(["--interface", from, script])
            .output()
            .expect("run curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(code(FIRST), "200", "{}", served.log());
    give_ipv6(lab, lab.client_ns(), lab.client_if(), "fd00:66::199/64").expect("another address");
    assert_eq!(code("fd00:66::199"), "404");

    // Stopped, the agent's store file holds the binding.
    let status = served.signal_agent(libc::SIGTERM);
    assert!(status.success(), "agent exit {status}:\n{}", served.log());
    {
        let store = LeaseStore::open(&served.dir.path("state/leases.redb")).expect("store file");
        let on_disk = store.list6().expect("IPv6 leases");
        eprintln!("IPv6 leases in the store file: {on_disk:?}");
        assert_eq!(on_disk.len(), 1, "{on_disk:?}");
        let lease = &on_disk[0];
        assert_eq!(lease.ip.to_string(), FIRST);
        assert_eq!(lease.state, LeaseState::Bound);
        assert_eq!(
            lease.duid,
            [0, 3, 0, 1, 0x52, 0x54, 0, 0x66, 0, 0x77],
            "keyed by the client's DUID"
        );
    }
    served.restart(&[]);

    // A new machine first: the restarted agent does not give it the
    // address bound on disk.
    become_machine(&served, "52:54:00:66:00:78");
    let other = leased(&dhclient6(&served, "b", 15, false));
    assert!(
        other.as_deref().is_some_and(|a| a != FIRST),
        "another machine got {other:?} after the restart\n{}",
        served.log()
    );
    // The same client, with no lease file of its own left: the same DUID
    // gets the same address.
    become_machine(&served, "52:54:00:66:00:77");
    let again = dhclient6(&served, "a2", 15, false);
    assert_eq!(
        leased(&again).as_deref(),
        Some(FIRST),
        "the same DUID did not get its address back after the restart:\n{again}\n{}",
        served.log()
    );

    // The last address goes to a third machine; a fourth is told
    // NoAddrsAvail, and it is counted.
    become_machine(&served, "52:54:00:66:00:79");
    let third = leased(&dhclient6(&served, "c", 15, false));
    assert!(third.is_some(), "{}", served.log());
    let exhausted = r#"pxe_slow_errors_total{family="ipv6",kind="pool_exhausted"}"#;
    become_machine(&served, "52:54:00:66:00:7a");
    let none = dhclient6(&served, "d", 3, false);
    assert_eq!(leased(&none), None, "{none}");
    assert!(sample(&served, exhausted) > 0, "{:#?}", served.stats());

    // dhclient -6 -r: the agent frees the address...
    become_machine(&served, "52:54:00:66:00:77");
    dhclient6(&served, "a2", 10, true);
    let listed = leases6(&served);
    assert!(
        listed
            .iter()
            .any(|(ip, state, _, d)| ip == FIRST && state == "released" && d == duid),
        "the release did not free {FIRST}: {listed:?}\n{}",
        served.log()
    );
    // ... and the machine that found the pool empty gets it.
    become_machine(&served, "52:54:00:66:00:7a");
    let freed = dhclient6(&served, "d2", 15, false);
    assert_eq!(
        leased(&freed).as_deref(),
        Some(FIRST),
        "{freed}\n{}",
        served.log()
    );
}

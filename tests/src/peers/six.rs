//! Two agents sharing an IPv6 pool through their slot Leases, as they
//! share IPv4 pools: real `dhclient -6` clients the inventory does not
//! list are each answered by the one agent that owns their DUID's bucket,
//! from that agent's slice of the pool, never with an address the other
//! gave; killing one agent moves its clients to the other.

use std::{collections::BTreeMap, net::Ipv6Addr, thread, time::Duration};

use pxe_agent::share::{Share, bucket};
use serde_json::Value;

use super::PeerLab;
use crate::dhcp6::{Run6, dhclient6_command, eui64_link_local};

/// The agents' IPv6 addresses, in their namespaces.
const AGENT_IP6S: [&str; 2] = ["fd00:66::1", "fd00:66::2"];
/// Machines asking, one after the other: enough that both agents own
/// some (each has about half the buckets).
const CLIENTS: u8 = 12;

fn inventory() -> String {
    r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.254
  - cidr: fd00:66::/64
    lease_time: 600
    ra: {}
    pool: {start: "fd00:66::1000", end: "fd00:66::10ff"}
discovery: {policy: inspect, profile: inspector}
profiles:
  - name: inspector
    boot: {bios: undionly.kpxe, uefi: ipxe.efi}
hosts: []
"#
    .to_owned()
}

/// The DUID-LL `dhclient -6 -D LL` makes from `mac`.
fn duid_ll(mac: [u8; 6]) -> Vec<u8> {
    [&[0, 3, 0, 1][..], &mac].concat()
}

fn mac_text(mac: [u8; 6]) -> String {
    mac.map(|o| format!("{o:02x}")).join(":")
}

/// A `server-id` in a dhclient lease file, as bytes.
fn server_id(lease: &str) -> Vec<u8> {
    let text = lease
        .lines()
        .find_map(|l| l.trim().strip_prefix("option dhcp6.server-id "))
        .unwrap_or_else(|| panic!("no server-id in:\n{lease}"));
    text.trim_end_matches(';')
        .split(':')
        .map(|o| u8::from_str_radix(o, 16).expect("hex"))
        .collect()
}

fn leased(lease: &str) -> Option<Ipv6Addr> {
    lease
        .lines()
        .filter_map(|l| l.trim().strip_prefix("iaaddr "))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .next_back()
}

impl PeerLab {
    /// The client end becomes the machine `mac` (its MAC and EUI-64
    /// link-local address) and runs `dhclient -6` once; its lease file.
    fn dhclient6(&self, mac: [u8; 6], tag: &str) -> String {
        let text = mac_text(mac);
        self.clients
            .ip(&["link", "set", "dev", "pxcl0", "address", &text]);
        self.clients
            .ip(&["-6", "addr", "flush", "dev", "pxcl0", "scope", "link"]);
        self.clients.ip(&[
            "-6",
            "addr",
            "add",
            &eui64_link_local(&text),
            "dev",
            "pxcl0",
            "nodad",
        ]);
        let how = Run6 {
            duid_ll: true,
            release: false,
        };
        dhclient6_command(
            self.clients.cmd("dhclient"),
            &self.dir,
            "pxcl0",
            (tag, 10),
            how,
        )
    }

    /// Agent `i`'s DHCPv6 server DUID, as it keeps it in its state
    /// directory.
    fn server_duid(&self, i: usize) -> Vec<u8> {
        let text = std::fs::read_to_string(self.dir.path(&format!("state{i}/dhcpv6-duid")))
            .expect("the agent keeps its DUID");
        pxe_agent::inventory::decode_hex(text.trim()).expect("hex DUID")
    }
}

#[test]
fn two_agents_share_an_ipv6_pool_by_duid_bucket_and_fail_over() {
    let mut lab = PeerLab::with_prepared(&inventory(), true, &[], |lab| {
        for (ns, ip) in lab.agent_ns.iter().zip(AGENT_IP6S) {
            ns.ip(&[
                "-6",
                "addr",
                "add",
                &format!("{ip}/64"),
                "dev",
                "pxag0",
                "nodad",
            ]);
        }
        // The client end's link-local address must be past DAD before it
        // sends from it.
        lab.clients
            .ip(&["link", "set", "pxcl0", "addrgenmode", "none"]);
    });
    let views: Vec<Value> = (0..2)
        .map(|i| {
            lab.wait_peers(i, "both slots live", |v| {
                v["serving"] == true && v["live"].as_array().is_some_and(|l| l.len() == 2)
            })
        })
        .collect();
    let slot = |i: usize| views[i]["slot"].as_u64().expect("slot") as u16;
    // Each agent's slice of the IPv6 pool, listed after the IPv4 ones.
    let slice6 = |i: usize| {
        let s = views[i]["slices"]
            .as_array()
            .expect("slices")
            .iter()
            .find(|s| s["start"].as_str().is_some_and(|a| a.contains(':')))
            .unwrap_or_else(|| panic!("agent {i} lists no IPv6 slice: {}", views[i]))
            .clone();
        let ip = |k: &str| s[k].as_str().unwrap().parse::<Ipv6Addr>().unwrap();
        ip("start")..=ip("end")
    };
    let duids = [lab.server_duid(0), lab.server_duid(1)];
    let share = Share::new(0, 2).unwrap().with_live([0, 1]);
    let owner = |mac: [u8; 6]| {
        let slot_of = share.owner(bucket(&duid_ll(mac))).unwrap();
        usize::from(slot_of != slot(0))
    };

    let mut given: BTreeMap<Ipv6Addr, [u8; 6]> = BTreeMap::new();
    let mut answered_by = [0; 2];
    for n in 0..CLIENTS {
        let mac = [0x02, 0x5e, 0x66, 0x00, 0x00, n];
        let lease = lab.dhclient6(mac, &format!("peer6-{n}"));
        let ip = leased(&lease)
            .unwrap_or_else(|| panic!("{}: no lease:\n{lease}\n{}", mac_text(mac), lab.logs()));
        let agent = owner(mac);
        assert_eq!(
            server_id(&lease),
            duids[agent],
            "{}: answered by the agent that does not own its DUID's bucket",
            mac_text(mac)
        );
        assert!(
            slice6(agent).contains(&ip),
            "{}: {ip} is outside agent {agent}'s slice {:?}",
            mac_text(mac),
            slice6(agent)
        );
        assert!(
            given.insert(ip, mac).is_none(),
            "{ip} given twice: {given:?}"
        );
        answered_by[agent] += 1;
    }
    println!("answered by agent 0 / agent 1: {answered_by:?}");
    assert!(answered_by.iter().all(|&n| n > 0), "{answered_by:?}");

    // Agent 1 gone: once its slot lapses, agent 0 owns every bucket and
    // answers agent 1's machines, from the whole pool.
    lab.kill(1);
    lab.wait_peers(0, "alone", |v| {
        v["live"].as_array().is_some_and(|l| l.len() == 1)
    });
    thread::sleep(Duration::from_millis(200));
    let moved = (0..CLIENTS)
        .map(|n| [0x02, 0x5e, 0x66, 0x00, 0x01, n])
        .find(|&mac| owner(mac) == 1)
        .expect("a machine agent 1 owned");
    let lease = lab.dhclient6(moved, "peer6-moved");
    assert!(
        leased(&lease).is_some_and(|ip| !given.contains_key(&ip)),
        "{lease}\n{}",
        lab.logs()
    );
    assert_eq!(server_id(&lease), duids[0], "{lease}");
}

//! Live leases of the server the agent replaces: dnsmasq's lease file
//! (`dnsmasq`) and Kea's memfile (`kea`), read and sorted against the
//! inventory the agent will run. Owns which leases the agent can keep
//! serving (an unexpired binding at an address of a pool of the
//! inventory, for a client that is not one of its hosts), and why each
//! other one is left out: counted by reason and reported by file and
//! line. Writing them is the lease store's
//! ([`crate::lease::LeaseStore::replace_all`]); reading the
//! configurations is the rest of `import`.

pub mod dnsmasq;
pub mod kea;

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    net::IpAddr,
};

use super::{Origin, Report, duid, valid_hostname};
use crate::{
    inventory::{DiscoveryPolicy, Inventory},
    lease::{Lease, Lease6, LeaseState},
    mac::MacAddr,
};

/// Whose lease file is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// dnsmasq's `--dhcp-leasefile` (`/var/lib/misc/dnsmasq.leases`).
    Dnsmasq,
    /// Kea's memfile, `kea-leases4.csv` or `kea-leases6.csv`.
    Kea,
}

/// Who a lease was made for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// A DHCPv4 client: its hardware address and client identifier.
    V4 {
        mac: MacAddr,
        client_id: Option<Vec<u8>>,
    },
    /// A DHCPv6 client's IA_NA: its DUID and IAID; the MAC, when the
    /// server recorded one.
    V6 {
        duid: Vec<u8>,
        iaid: u32,
        mac: Option<MacAddr>,
    },
}

/// One lease as the other server's file has it, after the lines that
/// superseded it were applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub origin: Origin,
    pub ip: IpAddr,
    pub holder: Holder,
    /// Unix seconds; `u64::MAX` for a lease that never expires.
    pub expires: u64,
    pub hostname: Option<String>,
    /// Why the server itself no longer counted it as held, if it did not.
    pub ended: Option<Skip>,
}

/// Why a lease, or a line, is not carried. The order is the summary's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Skip {
    /// Its expiry has passed, or the server reclaimed it.
    Expired,
    /// The client declined the address (Kea state 1).
    Declined,
    /// Released or deleted (Kea state 3, or a valid lifetime of 0).
    Released,
    /// No subnet of the inventory holds the address.
    NoSubnet,
    /// The subnet is in `mode: proxy`: the agent leases nothing there.
    Proxy,
    /// The address is in a subnet of the inventory but in no pool of it.
    OutsidePool,
    /// The client is a host of the inventory, which gives it its
    /// reserved address.
    Host,
    /// Another lease of the same client, or at the same address, was kept.
    Duplicate,
    /// A kind of lease the agent does not make: temporary addresses,
    /// prefixes, hardware other than Ethernet, a state it does not know.
    Kind,
    /// The line could not be read.
    Malformed,
}

impl Skip {
    fn says(self) -> &'static str {
        match self {
            Skip::Expired => "expired",
            Skip::Declined => "declined",
            Skip::Released => "released",
            Skip::NoSubnet => "outside every subnet of the inventory",
            Skip::Proxy => "in a mode: proxy subnet",
            Skip::OutsidePool => "outside the pools of the inventory",
            Skip::Host => "of hosts of the inventory (they get their reserved address)",
            Skip::Duplicate => "superseded by another lease of the client or address",
            Skip::Kind => "of a kind the agent does not lease",
            Skip::Malformed => "malformed",
        }
    }
}

/// What the files gave: the leases, latest line per address, and the
/// lines that are not leases the agent can read.
#[derive(Debug, Default)]
pub struct Reading {
    pub found: Vec<Found>,
    /// Lines skipped before any inventory is looked at (malformed, or a
    /// kind the agent does not lease), with why.
    pub skipped: Vec<(Origin, Skip, String)>,
    /// Address -> index in `found`: a later line for an address replaces
    /// the earlier (Kea's memfile appends every change).
    at: HashMap<IpAddr, usize>,
}

impl Reading {
    /// Adds `found`, replacing an earlier lease of the same address.
    pub(crate) fn latest(&mut self, found: Found) {
        match self.at.get(&found.ip) {
            Some(&i) => self.found[i] = found,
            None => {
                self.at.insert(found.ip, self.found.len());
                self.found.push(found);
            }
        }
    }

    /// Drops the lease of `ip` read so far: a later line ended it.
    pub(crate) fn forget(&mut self, ip: IpAddr) {
        if let Some(i) = self.at.remove(&ip) {
            self.found.remove(i);
            for at in self.at.values_mut() {
                if *at > i {
                    *at -= 1;
                }
            }
        }
    }

    pub(crate) fn skip(&mut self, origin: Origin, why: Skip, message: impl Into<String>) {
        self.skipped.push((origin, why, message.into()));
    }

    /// Reads one file of `format` into what was read so far; files are
    /// given oldest first, as a later line for an address wins. A file
    /// that is not of the format at all is an error; a line that cannot
    /// be read is counted and reported, never fatal.
    pub fn read(
        &mut self,
        format: Format,
        path: &std::path::Path,
        text: &str,
    ) -> Result<(), super::ImportError> {
        match format {
            Format::Dnsmasq => {
                dnsmasq::read(self, path, text);
                Ok(())
            }
            Format::Kea => kea::read(self, path, text),
        }
    }
}

/// The leases to write, and what was left out.
#[derive(Debug, Default)]
pub struct Sorted {
    pub leases: Vec<Lease>,
    pub leases6: Vec<Lease6>,
    /// How many were left out, by reason.
    pub left_out: BTreeMap<Skip, usize>,
    /// Each lease or line left out, and each change made to one kept
    /// (a host name dropped), with its file and line.
    pub report: Report,
    /// The inventory answers no unknown machine: the leases are kept but
    /// served only once `discovery.policy` is `inspect`.
    pub discovery_off: bool,
}

impl Sorted {
    fn leave_out(&mut self, origin: &Origin, why: Skip, message: &str) {
        *self.left_out.entry(why).or_default() += 1;
        self.report.add(origin, format!("left out: {message}"));
    }

    /// `N leases carried (A IPv4, B IPv6)`, then how many were left out,
    /// by reason.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "{} leases carried ({} IPv4, {} IPv6)",
            self.leases.len() + self.leases6.len(),
            self.leases.len(),
            self.leases6.len()
        );
        let left: usize = self.left_out.values().sum();
        if left == 0 {
            out.push_str("; nothing left out");
        } else {
            let parts: Vec<String> = self
                .left_out
                .iter()
                .map(|(why, n)| format!("{n} {}", why.says()))
                .collect();
            out.push_str(&format!("; {left} left out: {}", parts.join(", ")));
        }
        out
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Holder::V4 { mac, .. } => write!(f, "{mac}"),
            Holder::V6 { duid, iaid, mac } => {
                let hex: Vec<String> = duid.iter().map(|b| format!("{b:02x}")).collect();
                write!(f, "DUID {} IAID {iaid}", hex.join(":"))?;
                if let Some(mac) = mac {
                    write!(f, " ({mac})")?;
                }
                Ok(())
            }
        }
    }
}

/// The MAC a DHCPv6 lease names: the one the server recorded, else the
/// one of an Ethernet DUID-LL or DUID-LLT.
fn mac6(duid_bytes: &[u8], mac: Option<MacAddr>) -> Option<MacAddr> {
    mac.or_else(|| match duid::read(duid_bytes) {
        Ok(duid::DuidName::Mac(mac)) => Some(mac),
        _ => None,
    })
}

/// Sorts what was read against `inv` at `now` (unix seconds): the leases
/// the agent can keep serving, as bound leases until their expiry, and
/// the rest counted and reported. Of two leases of one client (by the
/// inventory's `discovery.lease_key` over IPv4, by DUID and IAID over
/// IPv6) the one that expires later is kept.
pub fn sort(reading: Reading, inv: &Inventory, now: u64) -> Sorted {
    let mut out = Sorted {
        discovery_off: inv.discovery.policy != DiscoveryPolicy::Inspect,
        ..Sorted::default()
    };
    for (origin, why, message) in &reading.skipped {
        out.leave_out(origin, *why, message);
    }
    let mut kept: Vec<Found> = Vec::new();
    // Client key -> index of its lease in `kept`.
    let mut by_client: HashMap<Vec<u8>, usize> = HashMap::new();
    for found in reading.found {
        let what = format!("{} of {}", found.ip, found.holder);
        if let Some(why) = found.ended {
            out.leave_out(&found.origin, why, &format!("{what}: {}", why.says()));
            continue;
        }
        if found.expires <= now {
            out.leave_out(&found.origin, Skip::Expired, &format!("{what}: expired"));
            continue;
        }
        if let Err((why, message)) = place(&found, inv) {
            out.leave_out(&found.origin, why, &format!("{what}: {message}"));
            continue;
        }
        let key = match &found.holder {
            Holder::V4 { mac, client_id } => {
                let mut key = vec![4];
                key.extend(
                    crate::lease::Client {
                        mac: mac.0,
                        client_id: client_id.as_deref(),
                    }
                    .key(inv.discovery.lease_key),
                );
                key
            }
            Holder::V6 { duid, iaid, .. } => {
                let mut key = vec![6];
                key.extend(
                    crate::lease::Client6 {
                        duid,
                        iaid: *iaid,
                        mac: None,
                    }
                    .key(),
                );
                key
            }
        };
        match by_client.get(&key) {
            Some(&i) => {
                let loser = if found.expires > kept[i].expires {
                    std::mem::replace(&mut kept[i], found)
                } else {
                    found
                };
                let winner = kept[i].ip;
                out.leave_out(
                    &loser.origin,
                    Skip::Duplicate,
                    &format!(
                        "{} of {}: the same client's lease of {winner}, which expires later, is kept",
                        loser.ip, loser.holder
                    ),
                );
            }
            None => {
                by_client.insert(key, kept.len());
                kept.push(found);
            }
        }
    }
    for found in kept {
        let hostname = match found.hostname {
            Some(name) if valid_hostname(&name) => Some(name),
            Some(name) => {
                out.report.add(
                    &found.origin,
                    format!(
                        "host name {:?} of {} not kept: not letters, digits, '-' and '.' (at most 63)",
                        name, found.ip
                    ),
                );
                None
            }
            None => None,
        };
        match (found.ip, found.holder) {
            (IpAddr::V4(ip), Holder::V4 { mac, client_id }) => out.leases.push(Lease {
                mac: mac.0,
                ip,
                state: LeaseState::Bound,
                expires: found.expires,
                hostname,
                client_id,
            }),
            (IpAddr::V6(ip), Holder::V6 { duid, iaid, mac }) => {
                let mac = mac6(&duid, mac);
                out.leases6.push(Lease6 {
                    duid,
                    iaid,
                    mac: mac.map(|m| m.0),
                    ip,
                    state: LeaseState::Bound,
                    expires: found.expires,
                    hostname,
                });
            }
            // The readers pair each family with its holder.
            _ => {}
        }
    }
    out
}

/// Whether the agent, serving `inv`, would lease `found`'s address to its
/// client: a pool of a subnet holds it, the subnet leases addresses, and
/// the client is no host. Else why not.
fn place(found: &Found, inv: &Inventory) -> Result<(), (Skip, String)> {
    match (found.ip, &found.holder) {
        (IpAddr::V4(ip), Holder::V4 { mac, .. }) => {
            if let Some(host) = inv.host_by_mac(*mac) {
                return Err((
                    Skip::Host,
                    format!("the client is host {} of the inventory", host.label()),
                ));
            }
            let Some(subnet) = inv.subnets.iter().find(|s| s.contains(ip)) else {
                return Err((Skip::NoSubnet, "no subnet of the inventory holds it".into()));
            };
            let cidr = format!("{}/{}", subnet.network, subnet.prefix);
            if subnet.is_proxy() {
                return Err((Skip::Proxy, format!("{cidr} is in mode: proxy")));
            }
            if !subnet.pool.is_some_and(|p| p.contains(ip)) {
                return Err((Skip::OutsidePool, format!("outside the pool of {cidr}")));
            }
            Ok(())
        }
        (IpAddr::V6(ip), Holder::V6 { duid, mac, .. }) => {
            if let Some(host) = mac6(duid, *mac).and_then(|m| inv.host_by_mac(m)) {
                return Err((
                    Skip::Host,
                    format!("the client is host {} of the inventory", host.label()),
                ));
            }
            let Some(subnet) = inv.subnets6.iter().find(|s| s.contains(ip)) else {
                return Err((
                    Skip::NoSubnet,
                    "no IPv6 subnet of the inventory holds it".into(),
                ));
            };
            let cidr = format!("{}/{}", subnet.network, subnet.prefix);
            if !subnet.pool.is_some_and(|p| p.contains(ip)) {
                return Err((Skip::OutsidePool, format!("outside the pool of {cidr}")));
            }
            Ok(())
        }
        _ => Err((
            Skip::Malformed,
            "address and client of different families".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    lease_time: 3600
    pool: {start: 10.66.200.1, end: 10.66.200.20}
  - cidr: 10.67.0.0/16
    mode: proxy
  - cidr: "fd00:66::/64"
    pool: {start: "fd00:66::100", end: "fd00:66::1ff"}
discovery: {policy: inspect, profile: inspector, lease_time: 600}
profiles:
  - name: inspector
    boot: {bios: undionly.kpxe}
hosts:
  - {mac: "52:54:00:12:34:56", ip: 10.66.1.10, hostname: node-1, profile: inspector}
"#;

    const NOW: u64 = 1_733_600_000;

    fn sorted(leases: &str, inventory: &str) -> Sorted {
        let inv = Inventory::parse(Path::new("inventory.yaml"), inventory).expect("inventory");
        let mut reading = Reading::default();
        reading
            .read(Format::Dnsmasq, Path::new("dnsmasq.leases"), leases)
            .expect("read");
        sort(reading, &inv, NOW)
    }

    #[test]
    fn only_live_pool_leases_of_unknown_machines_are_carried_and_the_rest_counted_by_reason() {
        let out = sorted(
            "\
1733650000 52:54:00:aa:00:01 10.66.200.17 node-a 01:52:54:00:aa:00:01
1733500000 52:54:00:aa:00:02 10.66.200.18 * *
1733650000 52:54:00:12:34:56 10.66.1.10 node-1 *
1733650000 52:54:00:aa:00:03 10.99.0.5 * *
1733650000 52:54:00:aa:00:04 10.66.1.77 * *
1733650000 52:54:00:aa:00:05 10.67.0.9 * *
1733640000 52:54:00:aa:00:06 10.66.200.3 * *
1733660000 52:54:00:aa:00:06 10.66.200.4 bad_name! *
0 52:54:00:aa:00:07 10.66.200.5 * *
not a lease
duid 00:01:00:01:2c:5e:7a:10:52:54:00:00:00:01
1733650000 7 fd00:66::117 * 00:03:00:01:52:54:00:aa:00:01
1733650000 8 fd00:66::5 * 00:03:00:01:52:54:00:aa:00:08
",
            INVENTORY,
        );
        let v4: Vec<(String, u64, Option<&str>)> = out
            .leases
            .iter()
            .map(|l| (l.ip.to_string(), l.expires, l.hostname.as_deref()))
            .collect();
        assert_eq!(
            v4,
            vec![
                ("10.66.200.17".into(), 1_733_650_000, Some("node-a")),
                ("10.66.200.4".into(), 1_733_660_000, None),
                ("10.66.200.5".into(), u64::MAX, None),
            ]
        );
        assert!(out.leases.iter().all(|l| l.state == LeaseState::Bound));
        assert_eq!(
            out.leases[0].client_id.as_deref(),
            Some(&[1, 0x52, 0x54, 0, 0xaa, 0, 1][..])
        );
        assert_eq!(out.leases6.len(), 1);
        assert_eq!(out.leases6[0].iaid, 7);
        assert_eq!(out.leases6[0].mac, Some([0x52, 0x54, 0, 0xaa, 0, 1]));
        let counts: Vec<(Skip, usize)> = out.left_out.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(
            counts,
            vec![
                (Skip::Expired, 1),
                (Skip::NoSubnet, 1),
                (Skip::Proxy, 1),
                (Skip::OutsidePool, 2),
                (Skip::Host, 1),
                (Skip::Duplicate, 1),
                (Skip::Malformed, 1),
            ]
        );
        let report = out.report.to_string();
        for expected in [
            "dnsmasq.leases:2: left out: 10.66.200.18 of 52:54:00:aa:00:02: expired",
            "dnsmasq.leases:3: left out: 10.66.1.10 of 52:54:00:12:34:56: the client is host node-1",
            "dnsmasq.leases:4: left out: 10.99.0.5 of 52:54:00:aa:00:03: no subnet",
            "dnsmasq.leases:6: left out: 10.67.0.9 of 52:54:00:aa:00:05: 10.67.0.0/16 is in mode: proxy",
            "dnsmasq.leases:7: left out: 10.66.200.3 of 52:54:00:aa:00:06: the same client's lease of 10.66.200.4",
            "dnsmasq.leases:8: host name \"bad_name!\" of 10.66.200.4 not kept",
            "dnsmasq.leases:10: left out: 3 fields",
        ] {
            assert!(report.contains(expected), "{expected:?} not in:\n{report}");
        }
        assert_eq!(
            out.summary(),
            "4 leases carried (3 IPv4, 1 IPv6); 8 left out: 1 expired, \
             1 outside every subnet of the inventory, 1 in a mode: proxy subnet, \
             2 outside the pools of the inventory, \
             1 of hosts of the inventory (they get their reserved address), \
             1 superseded by another lease of the client or address, 1 malformed"
        );
        assert!(!out.discovery_off);
    }

    #[test]
    fn under_client_id_keying_each_identifier_keeps_its_lease_and_discovery_off_is_told() {
        let leases = "\
1733650000 52:54:00:aa:00:06 10.66.200.3 * 01:aa
1733660000 52:54:00:aa:00:06 10.66.200.4 * 01:bb
";
        let by_mac = sorted(leases, INVENTORY);
        assert_eq!(by_mac.leases.len(), 1);
        let by_id = sorted(
            leases,
            &INVENTORY.replace("lease_time: 600}", "lease_time: 600, lease_key: client_id}"),
        );
        assert_eq!(by_id.leases.len(), 2, "{:?}", by_id.report);
        let off = sorted(
            leases,
            &INVENTORY.replace("policy: inspect", "policy: ignore"),
        );
        assert!(off.discovery_off);
    }
}

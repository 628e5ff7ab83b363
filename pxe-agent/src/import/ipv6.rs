//! The IPv6 half of the translation model: IPv6 subnets, the IPv6
//! reservations read apart from a host's IPv4 one (a Kea Dhcp6 file, a
//! dnsmasq `dhcp-host` with an IPv6 address only), how those join the
//! hosts, and what the inventory would refuse of them, dropped into the
//! report as the IPv4 side does in `mod.rs`.
//!
//! An IPv6 reservation joins the host an IPv4 reservation made: the one
//! with the same MAC, or, for a reservation that names a system UUID and
//! no MAC, the one with the same hostname (both servers give the name to
//! one machine). One with a MAC and no IPv4 reservation becomes a host of
//! its own with an `ipv6` and no `ip`; one with neither a MAC nor a host to
//! join is reported, as the inventory names every host by a MAC.

use std::{collections::BTreeMap, net::Ipv6Addr};

use super::{HostOut, Origin, Translation};
use crate::{inventory::uuid_text, mac::MacAddr};

/// An IPv6 subnet, as an IPv6 entry of the inventory's `subnets`.
#[derive(Debug, Clone)]
pub struct Subnet6Out {
    pub network: Ipv6Addr,
    pub prefix: u8,
    pub dns: Vec<Ipv6Addr>,
    pub domain: Option<String>,
    pub lease_time: Option<u32>,
    pub pool: Option<(Ipv6Addr, Ipv6Addr)>,
    /// The agent sends router advertisements on the subnet's link
    /// (`ra: {}`: addresses and other settings from DHCPv6).
    pub ra: bool,
    pub origin: Origin,
}

impl Subnet6Out {
    pub fn new(network: Ipv6Addr, prefix: u8, origin: Origin) -> Subnet6Out {
        Subnet6Out {
            network: masked(network, prefix),
            prefix,
            dns: Vec::new(),
            domain: None,
            lease_time: None,
            pool: None,
            ra: false,
            origin,
        }
    }

    pub fn contains(&self, ip: Ipv6Addr) -> bool {
        masked(ip, self.prefix) == self.network
    }
}

/// `address` with the bits after `prefix` cleared.
pub fn masked(address: Ipv6Addr, prefix: u8) -> Ipv6Addr {
    let mask = match prefix {
        0 => 0,
        p => u128::MAX << (128 - u32::from(p.min(128))),
    };
    Ipv6Addr::from(u128::from(address) & mask)
}

/// Parses `address/len` into network and prefix, refusing host bits.
pub fn parse_cidr6(text: &str) -> Option<(Ipv6Addr, u8)> {
    let (ip, len) = text.trim().split_once('/')?;
    let ip: Ipv6Addr = ip.trim().parse().ok()?;
    let len: u8 = len.trim().parse().ok().filter(|l| *l <= 128)?;
    (masked(ip, len) == ip).then_some((ip, len))
}

/// An IPv6 address reserved for a client, waiting to join the host its
/// IPv4 reservation made.
#[derive(Debug, Clone)]
pub struct Reservation6 {
    /// The MACs it is for: a `hw-address`, the MACs of a dnsmasq line, or
    /// the MAC of a DUID-LL/LLT. Empty when it names a UUID only.
    pub macs: Vec<MacAddr>,
    /// The system UUID of a DUID-UUID, for the host's `uuid`.
    pub uuid: Option<[u8; 16]>,
    pub ip: Ipv6Addr,
    pub hostname: Option<String>,
    pub origin: Origin,
}

/// Why a reservation naming no MAC cannot be a host of its own.
const NO_MAC: &str = "every host of the inventory has a MAC";

impl Reservation6 {
    /// How the report names it: its MAC, else its UUID.
    fn label(&self) -> String {
        match (self.macs.first(), &self.uuid) {
            (Some(mac), _) => mac.to_string(),
            (None, Some(uuid)) => format!("uuid {}", uuid_text(uuid)),
            (None, None) => "a client".to_string(),
        }
    }
}

impl Translation {
    /// Joins each IPv6 reservation to the host with one of its MACs, or,
    /// when it names no MAC, to the one host with its hostname; the rest
    /// are reported.
    pub(super) fn join6(&mut self) {
        for r in std::mem::take(&mut self.reservations6) {
            let by_mac = self
                .hosts
                .iter()
                .position(|h| r.macs.iter().any(|m| h.ports().contains(m)));
            let by_name = || {
                let name = r.hostname.as_deref()?;
                let mut named = self
                    .hosts
                    .iter()
                    .enumerate()
                    .filter(|(_, h)| h.hostname.as_deref() == Some(name));
                match (named.next(), named.next()) {
                    (Some((at, _)), None) => Some(at),
                    _ => None,
                }
            };
            let target = if r.macs.is_empty() { by_name() } else { by_mac };
            let Some(at) = target else {
                if let Some(&mac) = r.macs.first() {
                    // IPv6 only. The servers read here say nothing per
                    // reservation of what to boot, so it boots nothing
                    // until a profile is chosen for it.
                    self.report.add(
                        &r.origin,
                        format!(
                            "host {mac} has an IPv6 reservation only: translated with `ipv6` and \
                             no `ip`, and a profile that boots nothing; choose its profile"
                        ),
                    );
                    self.hosts.push(HostOut {
                        mac,
                        macs: r.macs,
                        ip: None,
                        hostname: r.hostname,
                        boot: super::BootSet::default(),
                        options: BTreeMap::new(),
                        ipv6: Some(r.ip),
                        uuid: r.uuid,
                        origin: r.origin,
                        origin6: None,
                    });
                    continue;
                }
                let why = if let Some(name) = &r.hostname {
                    format!(
                        "it names no MAC, and not exactly one IPv4 reservation is named {name:?}"
                    )
                } else {
                    "it names no MAC and no hostname to find its IPv4 reservation by".to_string()
                };
                self.report.add(
                    &r.origin,
                    format!(
                        "IPv6 reservation {} for {} left out: {why}; {NO_MAC}",
                        r.ip,
                        r.label()
                    ),
                );
                continue;
            };
            let host = &mut self.hosts[at];
            match host.ipv6 {
                Some(ip) if ip != r.ip => {
                    self.report.add(
                        &r.origin,
                        format!(
                            "IPv6 reservation {} for {} left out: host {} already has {ip}; the inventory holds one IPv6 address a host",
                            r.ip,
                            r.label(),
                            host.mac
                        ),
                    );
                    continue;
                }
                _ => host.ipv6 = Some(r.ip),
            }
            match (host.uuid, r.uuid) {
                (Some(had), Some(new)) if had != new => self.report.add(
                    &r.origin,
                    format!(
                        "uuid {} not translated: host {} already has uuid {}",
                        uuid_text(&new),
                        host.mac,
                        uuid_text(&had)
                    ),
                ),
                (None, new) => host.uuid = new,
                _ => {}
            }
            if host.hostname.is_none() {
                host.hostname.clone_from(&r.hostname);
            }
            if host.origin6.is_none() && host.origin != r.origin {
                host.origin6 = Some(r.origin.clone());
            }
        }
    }

    /// Drops what the inventory would refuse of the IPv6 side: an address
    /// outside every IPv6 subnet, a subnet-router anycast address, an
    /// address or UUID given twice, a UUID of a board that has none set,
    /// and pools that hold reserved addresses or are not ranges inside
    /// their subnet. The hosts stay, with their IPv4 side.
    pub(super) fn prune6(&mut self) {
        let mut ips: BTreeMap<Ipv6Addr, MacAddr> = BTreeMap::new();
        let mut uuids: BTreeMap<[u8; 16], MacAddr> = BTreeMap::new();
        for host in &mut self.hosts {
            if let Some(ip) = host.ipv6 {
                let why = match self.subnets6.iter().find(|s| s.contains(ip)) {
                    None => Some("no IPv6 subnet holds it".to_string()),
                    Some(s) if s.network == ip => Some(format!(
                        "it is the subnet-router anycast address of {}/{}",
                        s.network, s.prefix
                    )),
                    Some(_) => ips
                        .get(&ip)
                        .map(|other| format!("it is reserved for {other} too")),
                };
                match why {
                    Some(why) => {
                        drop_field(host, &mut self.report, "IPv6 address", ip.to_string(), &why);
                        host.ipv6 = None;
                    }
                    None => {
                        ips.insert(ip, host.mac);
                    }
                }
            }
            if let Some(uuid) = host.uuid {
                let why = if uuid == [0; 16] || uuid == [0xff; 16] {
                    Some(
                        "it is the UUID of a board that has none set, and names no one machine"
                            .to_string(),
                    )
                } else {
                    uuids
                        .get(&uuid)
                        .map(|other| format!("it is the uuid of {other} too"))
                };
                match why {
                    Some(why) => {
                        drop_field(host, &mut self.report, "uuid", uuid_text(&uuid), &why);
                        host.uuid = None;
                    }
                    None => {
                        uuids.insert(uuid, host.mac);
                    }
                }
            }
        }
        for subnet in &mut self.subnets6 {
            let Some((start, end)) = subnet.pool else {
                continue;
            };
            let why = if let Some((ip, mac)) = ips.range(start..=end).next() {
                format!("it holds reserved addresses ({ip} of {mac})")
            } else if start > end || !subnet.contains(start) || !subnet.contains(end) {
                "it is not a range inside the subnet".to_string()
            } else if start <= subnet.network && subnet.network <= end {
                "it covers the subnet-router anycast address (the network address)".to_string()
            } else {
                continue;
            };
            self.report.add(
                &subnet.origin,
                format!("pool {start}-{end} left out: {why}"),
            );
            subnet.pool = None;
        }
    }
}

fn drop_field(host: &HostOut, report: &mut super::Report, field: &str, value: String, why: &str) {
    let origin = host.origin6.as_ref().unwrap_or(&host.origin);
    report.add(
        origin,
        format!("{field} {value} of host {} not translated: {why}", host.mac),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_and_masks() {
        assert_eq!(
            parse_cidr6("fd00:66::/64"),
            Some(("fd00:66::".parse().unwrap(), 64))
        );
        assert_eq!(parse_cidr6("fd00:66::1/64"), None);
        assert_eq!(parse_cidr6("fd00:66::/129"), None);
        let s = Subnet6Out::new(
            "fd00:66::1".parse().unwrap(),
            64,
            Origin::new("x".as_ref(), 1),
        );
        assert_eq!(s.network, "fd00:66::".parse::<Ipv6Addr>().unwrap());
        assert!(s.contains("fd00:66::ffff".parse().unwrap()));
        assert!(!s.contains("fd00:67::1".parse().unwrap()));
    }
}

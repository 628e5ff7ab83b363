//! Machines that asked for DHCP but are not in the inventory: what each one
//! said about itself, so an operator can adopt it. Bounded: the oldest entry
//! makes room for a new one.

use std::{collections::HashMap, net::Ipv4Addr};

use serde::{Deserialize, Serialize};

use crate::mac::MacAddr;

/// One unknown client as last seen.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Discovered {
    pub mac: MacAddr,
    /// Unix seconds.
    pub first_seen: u64,
    pub last_seen: u64,
    pub requests: u64,
    /// Option 93, first entry.
    pub arch: Option<u16>,
    pub vendor_class: Option<String>,
    pub user_class: Option<String>,
    /// giaddr of the relay it came through.
    pub relay: Option<Ipv4Addr>,
    pub circuit_id: Option<String>,
    /// Option 12.
    pub hostname: Option<String>,
    /// The pool address it was offered or leased, if any.
    pub ip: Option<Ipv4Addr>,
}

/// What one request says about its sender.
#[derive(Clone, Debug, Default)]
pub struct Sighting {
    pub arch: Option<u16>,
    pub vendor_class: Option<String>,
    pub user_class: Option<String>,
    pub relay: Option<Ipv4Addr>,
    pub circuit_id: Option<String>,
    pub hostname: Option<String>,
}

pub struct Registry {
    hosts: HashMap<MacAddr, Discovered>,
    capacity: usize,
}

impl Registry {
    pub fn new(capacity: usize) -> Registry {
        Registry {
            hosts: HashMap::new(),
            capacity,
        }
    }

    /// Records a request from `mac` at `now` (unix seconds).
    pub fn record(&mut self, mac: MacAddr, seen: Sighting, now: u64) {
        if !self.hosts.contains_key(&mac) && self.hosts.len() >= self.capacity {
            self.evict_oldest();
        }
        let entry = self.hosts.entry(mac).or_insert_with(|| Discovered {
            mac,
            first_seen: now,
            last_seen: now,
            requests: 0,
            arch: None,
            vendor_class: None,
            user_class: None,
            relay: None,
            circuit_id: None,
            hostname: None,
            ip: None,
        });
        entry.last_seen = now;
        entry.requests += 1;
        // Keep what earlier requests said when this one is silent.
        entry.arch = seen.arch.or(entry.arch);
        entry.vendor_class = seen.vendor_class.or(entry.vendor_class.take());
        entry.user_class = seen.user_class.or(entry.user_class.take());
        entry.relay = seen.relay.or(entry.relay);
        entry.circuit_id = seen.circuit_id.or(entry.circuit_id.take());
        entry.hostname = seen.hostname.or(entry.hostname.take());
    }

    /// Drops the least recently seen tenth at once, so a flood of new MACs
    /// costs amortised O(1) per request rather than a scan each.
    fn evict_oldest(&mut self) {
        let mut seen: Vec<(u64, MacAddr)> =
            self.hosts.iter().map(|(m, d)| (d.last_seen, *m)).collect();
        let n = (seen.len() / 10).max(1);
        seen.select_nth_unstable(n - 1);
        for (_, m) in &seen[..n] {
            self.hosts.remove(m);
        }
    }

    /// Notes the address `mac` was given.
    pub fn assign(&mut self, mac: MacAddr, ip: Ipv4Addr) {
        if let Some(d) = self.hosts.get_mut(&mac) {
            d.ip = Some(ip);
        }
    }

    /// Forgets every MAC `known` says the inventory now lists: a walk over
    /// the registry, which is bounded, not over the inventory, which may
    /// be a fleet.
    pub fn adopt_known(&mut self, known: impl Fn(MacAddr) -> bool) {
        self.hosts.retain(|mac, _| !known(*mac));
    }

    /// All entries, most recently seen first.
    pub fn list(&self) -> Vec<Discovered> {
        let mut all: Vec<Discovered> = self.hosts.values().cloned().collect();
        all.sort_by(|a, b| {
            b.last_seen
                .cmp(&a.last_seen)
                .then_with(|| a.mac.cmp(&b.mac))
        });
        all
    }

    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(i: u8) -> MacAddr {
        MacAddr([2, 0, 0, 0, 0, i])
    }

    #[test]
    fn records_first_and_last_seen_and_keeps_earlier_details() {
        let mut r = Registry::new(10);
        r.record(
            mac(1),
            Sighting {
                arch: Some(7),
                vendor_class: Some("PXEClient".into()),
                ..Default::default()
            },
            100,
        );
        r.record(
            mac(1),
            Sighting {
                hostname: Some("spare-7".into()),
                ..Default::default()
            },
            130,
        );
        r.assign(mac(1), Ipv4Addr::new(10, 66, 200, 1));
        let d = &r.list()[0];
        assert_eq!((d.first_seen, d.last_seen, d.requests), (100, 130, 2));
        assert_eq!(
            (d.arch, d.vendor_class.as_deref(), d.hostname.as_deref()),
            (Some(7), Some("PXEClient"), Some("spare-7"))
        );
        assert_eq!(d.ip, Some(Ipv4Addr::new(10, 66, 200, 1)));
        assert_eq!(d.mac, mac(1));
        let json = serde_json::to_value(d).expect("json");
        assert_eq!(json["mac"], "02:00:00:00:00:01");
    }

    #[test]
    fn bounded_by_evicting_the_least_recently_seen() {
        let mut r = Registry::new(2);
        r.record(mac(1), Sighting::default(), 1);
        r.record(mac(2), Sighting::default(), 2);
        r.record(mac(1), Sighting::default(), 3);
        r.record(mac(3), Sighting::default(), 4);
        let macs: Vec<MacAddr> = r.list().into_iter().map(|d| d.mac).collect();
        assert_eq!(macs, vec![mac(3), mac(1)]);
    }

    #[test]
    fn adopted_hosts_are_forgotten() {
        let mut r = Registry::new(2);
        r.record(mac(1), Sighting::default(), 1);
        r.adopt_known(|m| m == mac(1));
        assert!(r.is_empty());
        r.record(mac(2), Sighting::default(), 1);
        r.record(mac(3), Sighting::default(), 1);
        r.adopt_known(|m| m == mac(3));
        assert_eq!(r.list().iter().map(|d| d.mac).collect::<Vec<_>>(), [mac(2)]);
    }
}

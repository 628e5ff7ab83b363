//! Leases carried over from another DHCP server (`pxe-agent import
//! leases`): the whole store replaced, in one commit, by the bindings that
//! server had made. Owns only that replacement; reading the other server's
//! files, and deciding which of its leases the inventory can keep, is the
//! importer's.

use super::{LeaseStore, Undo, six::Undo6};
use crate::lease::{
    Lease, Lease6, LeaseError, LeaseState,
    record::{Record, Stored},
};

/// How a carried lease's state is written; offers are never durable.
fn stored(state: LeaseState) -> Option<Stored> {
    match state {
        LeaseState::Bound => Some(Stored::Bound),
        LeaseState::Declined => Some(Stored::Declined),
        LeaseState::Released => Some(Stored::Released),
        LeaseState::Offered => None,
    }
}

impl LeaseStore {
    /// Whether the store holds no record, IPv4 or IPv6.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty() && self.v6.is_empty()
    }

    /// Replaces every record with `leases` and `leases6`, each written in
    /// its state until its `expires`, in one durable commit: after a
    /// failure the store is as it was. Offered leases are left out (offers
    /// are never written). Of two leases for one address the later wins;
    /// a client with two records is indexed as after [`LeaseStore::open`]
    /// (the binding, then the later expiry). Pending offers are dropped.
    /// Returns how many records were written.
    pub fn replace_all(
        &mut self,
        leases: &[Lease],
        leases6: &[Lease6],
    ) -> Result<usize, LeaseError> {
        self.reopen()?;
        let mut undo = Undo::new();
        let mut undo6 = Undo6::new();
        let old: Vec<u32> = self.leases.keys().copied().collect();
        for ip in old {
            self.put(ip, None, &mut undo);
        }
        for ip in self.v6.addresses() {
            self.v6.put(ip, None, &mut undo6);
        }
        let mut written = 0;
        for lease in leases {
            let Some(state) = stored(lease.state) else {
                continue;
            };
            let record = Record {
                mac: lease.mac,
                state,
                expires: lease.expires,
                hostname: lease.hostname.clone(),
                client_id: lease.client_id.clone().filter(|id| !id.is_empty()),
                iaid: None,
            };
            self.put(u32::from(lease.ip), Some(record), &mut undo);
            written += 1;
        }
        for lease in leases6 {
            let Some(state) = stored(lease.state) else {
                continue;
            };
            let record = Record {
                mac: lease.mac.unwrap_or_default(),
                state,
                expires: lease.expires,
                hostname: lease.hostname.clone(),
                client_id: Some(lease.duid.clone()),
                iaid: Some(lease.iaid),
            };
            self.v6.put(u128::from(lease.ip), Some(record), &mut undo6);
            written += 1;
        }
        self.commit_both_or_undo(undo, undo6)?;
        // Rebuilt from what is now committed: the put order above may
        // have pointed a client with two records at the worse one.
        self.rebuild_by_key();
        self.v6.reindex();
        self.offers.by_ip.clear();
        self.offers.of.clear();
        self.v6.clear_offers();
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use crate::lease::{
        Client6, Lease, Lease6, LeaseState, LeaseStore, RequestOutcome,
        tests::{POOL, T0, TempDir, mac},
    };

    fn bound(n: u8, ip: Ipv4Addr, expires: u64) -> Lease {
        Lease {
            mac: mac(n),
            ip,
            state: LeaseState::Bound,
            expires,
            hostname: Some(format!("m{n}")),
            client_id: None,
        }
    }

    #[test]
    fn carried_leases_replace_the_store_and_survive_a_reopen_as_their_clients_addresses() {
        let dir = TempDir::new("carry");
        let mut store = LeaseStore::open(&dir.db()).expect("open");
        assert!(store.is_empty());
        // A lease the carried ones replace.
        store
            .request(mac(9), &POOL, Ipv4Addr::new(10, 0, 0, 10), None, T0)
            .expect("request");
        assert!(!store.is_empty());
        let carried = [
            bound(1, Ipv4Addr::new(10, 0, 0, 150), T0 + 7200),
            bound(2, Ipv4Addr::new(10, 0, 0, 151), u64::MAX),
        ];
        let duid = [0, 3, 0, 1, 0x52, 0x54, 0, 0, 0, 3];
        let carried6 = [Lease6 {
            duid: duid.to_vec(),
            iaid: 7,
            mac: Some(mac(3)),
            ip: "fd00::117".parse::<Ipv6Addr>().expect("ip"),
            state: LeaseState::Bound,
            expires: T0 + 3600,
            hostname: None,
        }];
        assert_eq!(store.replace_all(&carried, &carried6).expect("replace"), 3);
        drop(store);

        let mut store = LeaseStore::open(&dir.db()).expect("reopen");
        assert_eq!(store.list().expect("list"), carried.to_vec());
        assert_eq!(store.list6().expect("list6"), carried6.to_vec());
        // Each client is offered, and bound, its carried address.
        for lease in &carried {
            assert_eq!(
                store.offer(lease.mac, &POOL, None, T0 + 1).expect("offer"),
                Some(lease.ip)
            );
            let acked = store
                .request(lease.mac, &POOL, lease.ip, None, T0 + 1)
                .expect("request");
            assert!(matches!(acked, RequestOutcome::Ack(ref l) if l.ip == lease.ip));
        }
        let client6 = Client6 {
            duid: &duid,
            iaid: 7,
            mac: None,
        };
        assert_eq!(store.lease6_of(client6).map(|l| l.ip), Some(carried6[0].ip));
        // The replaced lease's address went with it: free for another.
        assert_eq!(store.lease_of(mac(9)), None);
    }
}

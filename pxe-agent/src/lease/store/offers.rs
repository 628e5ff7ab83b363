//! The offers a store holds in memory for both families (a DHCPOFFER or a
//! plain Advertise commits nothing): by address, and each client's one.

use std::collections::{BTreeMap, HashMap};

use super::{Key, Offer};

/// Pending offers, addresses of type `A` (`u32` or `u128`).
pub(super) struct Offers<A> {
    /// By address.
    pub(super) by_ip: BTreeMap<A, Offer>,
    /// Client key -> address of its pending offer (at most one).
    pub(super) of: HashMap<Key, A>,
}

impl<A> Default for Offers<A> {
    fn default() -> Offers<A> {
        Offers {
            by_ip: BTreeMap::new(),
            of: HashMap::new(),
        }
    }
}

/// An address as a store keys it, `u32` or `u128`, with the next one up.
pub(super) trait Address: Ord + Copy {
    /// `None` past the last address.
    fn successor(self) -> Option<Self>;
}

impl Address for u32 {
    fn successor(self) -> Option<u32> {
        self.checked_add(1)
    }
}

impl Address for u128 {
    fn successor(self) -> Option<u128> {
        self.checked_add(1)
    }
}

impl<A: Address> Offers<A> {
    /// The first address in `lo..=hi` with neither a record in `records`
    /// nor an offer.
    pub(super) fn first_unused<V>(&self, records: &BTreeMap<A, V>, lo: A, hi: A) -> Option<A> {
        if lo > hi {
            return None;
        }
        let mut records = records.range(lo..=hi).map(|(&ip, _)| ip).peekable();
        let mut offers = self.by_ip.range(lo..=hi).map(|(&ip, _)| ip).peekable();
        let mut next = lo;
        loop {
            let taken = match (records.peek(), offers.peek()) {
                (Some(&a), Some(&b)) => a.min(b),
                (Some(&a), None) => a,
                (None, Some(&b)) => b,
                (None, None) => break,
            };
            if taken > next {
                break;
            }
            // `taken` is at most `hi`: the last address there is taken,
            // so none is free.
            next = taken.successor()?;
            records.next_if_eq(&taken);
            offers.next_if_eq(&taken);
        }
        (next <= hi).then_some(next)
    }
}

impl<A: Ord + Copy> Offers<A> {
    /// Holds `ip` for the client filed under `key` until `until`, in place
    /// of any offer it held.
    pub(super) fn hold(&mut self, key: Key, mac: [u8; 6], ip: A, until: u64) {
        self.unhold(&key);
        self.of.insert(key.clone(), ip);
        self.by_ip.insert(ip, Offer { key, mac, until });
    }

    /// Whether `ip` is held, at `now`, for a client other than `key`'s.
    pub(super) fn held_from(&self, key: &Key, ip: A, now: u64) -> bool {
        self.by_ip
            .get(&ip)
            .is_some_and(|o| &o.key != key && o.until > now)
    }

    /// Drops the offer held for `key`, if any.
    pub(super) fn unhold(&mut self, key: &Key) {
        if let Some(ip) = self.of.remove(key)
            && self.by_ip.get(&ip).is_some_and(|o| &o.key == key)
        {
            self.by_ip.remove(&ip);
        }
    }

    /// Drops the offers that lapsed by `now`.
    pub(super) fn drop_lapsed(&mut self, now: u64) {
        self.by_ip.retain(|_, o| o.until > now);
        let by_ip = &self.by_ip;
        self.of
            .retain(|key, ip| by_ip.get(ip).is_some_and(|o| &o.key == key));
    }
}

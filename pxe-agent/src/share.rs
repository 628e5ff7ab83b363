//! Several agents on one L2 segment sharing the discovery pools: which part
//! of a pool this agent leases from (its slice) and which unknown MACs it
//! answers (the RFC 3074 hash buckets its slot owns among the live slots).
//! The same rendezvous hashing names the one agent that owns each
//! inventory host's out-of-band recovery ([`Share::owns_host`]). It owns
//! only that arithmetic; who is live comes from the membership
//! (`kube::membership`, over Kubernetes Leases), the host records the
//! agents share are `kube::host_records`', and the DHCP policy that applies
//! it is `dhcp::decide` (and `dhcp::v6::decide` for IPv6 pools, sliced
//! the same way, with DHCPv6 clients bucketed by their DUID). Every agent
//! answers reserved hosts' DHCP. See
//! docs/peers.md for the model and its failure behaviour.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{Ipv4Addr, Ipv6Addr},
    ops::RangeInclusive,
};

use crate::mac::MacAddr;

/// RFC 3074 section 6: the "mixing table" of 256 distinct values in
/// pseudo-random order that the load-balancing hash walks.
const MIX: [u8; 256] = [
    251, 175, 119, 215, 81, 14, 79, 191, 103, 49, 181, 143, 186, 157, 0, 232, 31, 32, 55, 60, 152,
    58, 17, 237, 174, 70, 160, 144, 220, 90, 57, 223, 59, 3, 18, 140, 111, 166, 203, 196, 134, 243,
    124, 95, 222, 179, 197, 65, 180, 48, 36, 15, 107, 46, 233, 130, 165, 30, 123, 161, 209, 23, 97,
    16, 40, 91, 219, 61, 100, 10, 210, 109, 250, 127, 22, 138, 29, 108, 244, 67, 207, 9, 178, 204,
    74, 98, 126, 249, 167, 116, 34, 77, 193, 200, 121, 5, 20, 113, 71, 35, 128, 13, 182, 94, 25,
    226, 227, 199, 75, 27, 41, 245, 230, 224, 43, 225, 177, 26, 155, 150, 212, 142, 218, 115, 241,
    73, 88, 105, 39, 114, 62, 255, 192, 201, 145, 214, 168, 158, 221, 148, 154, 122, 12, 84, 82,
    163, 44, 139, 228, 236, 205, 242, 217, 11, 187, 146, 159, 64, 86, 239, 195, 42, 106, 198, 118,
    112, 184, 172, 87, 2, 173, 117, 176, 229, 247, 253, 137, 185, 99, 164, 102, 147, 45, 66, 231,
    52, 141, 211, 194, 206, 246, 238, 56, 110, 78, 248, 63, 240, 189, 93, 92, 51, 53, 183, 19, 171,
    72, 50, 33, 104, 101, 69, 8, 252, 83, 120, 76, 135, 85, 54, 202, 125, 188, 213, 96, 235, 136,
    208, 162, 129, 190, 132, 156, 38, 47, 1, 7, 254, 24, 4, 216, 131, 89, 21, 28, 133, 37, 153,
    149, 80, 170, 68, 6, 169, 234, 151,
];

/// RFC 3074 section 6: the Pearson hash of a client's hardware address
/// (`chaddr`), its hash bucket 0..=255. The RFC walks the key from its
/// last byte to its first, starting from the key's length.
pub fn bucket(chaddr: &[u8]) -> u8 {
    // Hardware addresses are at most 16 bytes (BOOTP `chaddr`).
    let mut hash = chaddr.len() as u8;
    for &b in chaddr.iter().rev() {
        hash = MIX[usize::from(hash ^ b)];
    }
    hash
}

/// The rendezvous (highest-random-weight) weight of `slot` for `bucket`:
/// splitmix64's finalizer, a bijection on u64, so that distinct
/// (bucket, slot) pairs never tie.
fn weight(bucket: u8, slot: u16) -> u64 {
    let mut z = (u64::from(bucket) << 16 | u64::from(slot)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A bad `--pool-slot`/`--pool-slots` pair or membership.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShareError {
    #[error("pool slots must be between 1 and {max}, not {slots}", max = MAX_SLOTS)]
    Slots { slots: u16 },
    #[error("slot {slot} is not one of the {slots} pool slots")]
    Slot { slot: u16, slots: u16 },
}

/// Most slots a pool may be split into.
pub const MAX_SLOTS: u16 = 256;

/// This agent's part in sharing the pools: its slot among `slots` (none
/// until the membership has claimed one), and the slots live now (this one
/// included while its membership is current).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Share {
    slot: Option<u16>,
    slots: u16,
    live: BTreeSet<u16>,
    /// The node holding each live slot, for display only.
    names: BTreeMap<u16, String>,
}

impl Share {
    /// No peers: the whole pool and every unknown MAC are this agent's.
    pub fn alone() -> Share {
        Share {
            slot: Some(0),
            slots: 1,
            live: BTreeSet::from([0]),
            names: BTreeMap::new(),
        }
    }

    /// Slot `slot` of `slots`, with no slot live yet (answers no unknown
    /// MAC until the membership says who is live).
    pub fn new(slot: u16, slots: u16) -> Result<Share, ShareError> {
        if slots == 0 || slots > MAX_SLOTS {
            return Err(ShareError::Slots { slots });
        }
        if slot >= slots {
            return Err(ShareError::Slot { slot, slots });
        }
        Ok(Share {
            slot: Some(slot),
            slots,
            live: BTreeSet::new(),
            names: BTreeMap::new(),
        })
    }

    /// One of `slots` agents that holds no slot yet (or lost it): no
    /// slice, no bucket; it answers only reserved hosts.
    pub fn unclaimed(slots: u16) -> Result<Share, ShareError> {
        Ok(Share {
            slot: None,
            ..Share::new(0, slots)?
        })
    }

    /// The same slot with `live` as the live slots (those outside
    /// `0..slots` are left out).
    pub fn with_live(&self, live: impl IntoIterator<Item = u16>) -> Share {
        Share {
            live: live.into_iter().filter(|&s| s < self.slots).collect(),
            ..self.clone()
        }
    }

    /// The same share with `names`: the node holding each slot, shown as
    /// the owner of the hosts that slot owns.
    pub fn with_names(&self, names: BTreeMap<u16, String>) -> Share {
        Share {
            names,
            ..self.clone()
        }
    }

    pub fn slot(&self) -> Option<u16> {
        self.slot
    }

    pub fn slots(&self) -> u16 {
        self.slots
    }

    pub fn live(&self) -> &BTreeSet<u16> {
        &self.live
    }

    /// Whether the pools are shared at all (`false` for [`Share::alone`]).
    pub fn is_shared(&self) -> bool {
        self.slots > 1
    }

    /// Whether this agent's own slot is live: while it is not (its Lease
    /// lapsed), it answers no unknown MAC by bucket.
    pub fn is_live(&self) -> bool {
        self.slot.is_some_and(|s| self.live.contains(&s))
    }

    /// The slice of the pool `start..=end` this agent leases from.
    pub fn slice(&self, start: Ipv4Addr, end: Ipv4Addr) -> Option<RangeInclusive<Ipv4Addr>> {
        slice_of(self.slot?, self.slots, start, end)
    }

    /// The slot whose slice of `start..=end` holds `ip`, if the pool does.
    pub fn slot_at(&self, start: Ipv4Addr, end: Ipv4Addr, ip: Ipv4Addr) -> Option<u16> {
        slot_at(self.slots, start, end, ip)
    }

    /// The slice of the IPv6 pool `start..=end` this agent leases from.
    pub fn slice6(&self, start: Ipv6Addr, end: Ipv6Addr) -> Option<RangeInclusive<Ipv6Addr>> {
        slice_of6(self.slot?, self.slots, start, end)
    }

    /// The slot whose slice of the IPv6 pool `start..=end` holds `ip`.
    pub fn slot_at6(&self, start: Ipv6Addr, end: Ipv6Addr, ip: Ipv6Addr) -> Option<u16> {
        slot_at6(self.slots, start, end, ip)
    }

    /// The live slot that answers the unknown MACs of `bucket`, if any is
    /// live: the one of highest rendezvous weight, so that a slot leaving
    /// moves only its own buckets, spread over the survivors, and a slot
    /// joining takes buckets only from the others, about 1/n of them.
    pub fn owner(&self, bucket: u8) -> Option<u16> {
        self.live.iter().copied().max_by_key(|&s| weight(bucket, s))
    }

    /// Whether this agent answers the unknown MAC `chaddr`.
    pub fn answers(&self, chaddr: &[u8]) -> bool {
        self.slot.is_some() && self.owner(bucket(chaddr)) == self.slot
    }

    /// The live slot that owns inventory host `mac`'s out-of-band
    /// recovery: the owner of its MAC's bucket, so that ownership moves
    /// with membership exactly as buckets do (only a departed slot's hosts
    /// move). `None` while no slot is live.
    pub fn host_owner(&self, mac: MacAddr) -> Option<u16> {
        self.owner(bucket(&mac.0))
    }

    /// Whether this agent owns `mac`'s recovery: alone it owns every host;
    /// with peers, those of its buckets while its own slot is live, and
    /// none while it holds no slot.
    pub fn owns_host(&self, mac: MacAddr) -> bool {
        self.slot.is_some() && self.host_owner(mac) == self.slot
    }

    /// The node that owns `mac`'s recovery, as the membership named it.
    pub fn host_owner_name(&self, mac: MacAddr) -> Option<&str> {
        self.names.get(&self.host_owner(mac)?).map(String::as_str)
    }

    /// This agent's place among the live slots, for dividing fleet-wide
    /// limits: (its index in slot order, how many are live). `(0, 1)`
    /// alone; `None` while its own slot is not live.
    pub fn rank(&self) -> Option<(usize, usize)> {
        let slot = self.slot?;
        let index = self.live.iter().position(|&s| s == slot)?;
        Some((index, self.live.len()))
    }

    /// How many of the 256 buckets this agent answers now.
    pub fn buckets_owned(&self) -> usize {
        (0..=255u8)
            .filter(|&b| self.slot.is_some() && self.owner(b) == self.slot)
            .count()
    }
}

/// Slice `slot` of `slots` of the pool `start..=end`: the pool cut into
/// `slots` contiguous pieces in slot order, the first `size % slots` one
/// address larger than the rest, so that every address belongs to exactly
/// one slice. A pool smaller than `slots` leaves the last slots empty
/// (`None`).
pub fn slice_of(
    slot: u16,
    slots: u16,
    start: Ipv4Addr,
    end: Ipv4Addr,
) -> Option<RangeInclusive<Ipv4Addr>> {
    let (first, last) = cut(slot, slots, u32::from(start).into(), u32::from(end).into())?;
    // Both lie within start..=end, which are u32.
    Some(Ipv4Addr::from(first as u32)..=Ipv4Addr::from(last as u32))
}

/// The slot whose slice (see [`slice_of`]) holds `ip`.
pub fn slot_at(slots: u16, start: Ipv4Addr, end: Ipv4Addr, ip: Ipv4Addr) -> Option<u16> {
    locate(
        slots,
        u32::from(start).into(),
        u32::from(end).into(),
        u32::from(ip).into(),
    )
}

/// [`slice_of`] for an IPv6 pool: the same cut, so that each slot leases
/// from its own contiguous part of every pool of either family.
pub fn slice_of6(
    slot: u16,
    slots: u16,
    start: Ipv6Addr,
    end: Ipv6Addr,
) -> Option<RangeInclusive<Ipv6Addr>> {
    let (first, last) = cut(slot, slots, start.into(), end.into())?;
    Some(Ipv6Addr::from(first)..=Ipv6Addr::from(last))
}

/// [`slot_at`] for an IPv6 pool.
pub fn slot_at6(slots: u16, start: Ipv6Addr, end: Ipv6Addr, ip: Ipv6Addr) -> Option<u16> {
    locate(slots, start.into(), end.into(), ip.into())
}

/// The arithmetic of [`slice_of`] over addresses as numbers: the first and
/// last of slice `slot`. A range of all 2^128 addresses counts one short,
/// which only moves the boundaries of the slices by one address.
fn cut(slot: u16, slots: u16, lo: u128, hi: u128) -> Option<(u128, u128)> {
    if slots == 0 || slot >= slots || lo > hi {
        return None;
    }
    let size = (hi - lo).saturating_add(1);
    let (n, i) = (u128::from(slots), u128::from(slot));
    let (base, extra) = (size / n, size % n);
    let first = lo + i * base + i.min(extra);
    let len = base + u128::from(i < extra);
    if len == 0 {
        return None;
    }
    Some((first, first + (len - 1)))
}

/// The arithmetic of [`slot_at`]: the slot of [`cut`] that holds `x`.
fn locate(slots: u16, lo: u128, hi: u128, x: u128) -> Option<u16> {
    if slots == 0 || x < lo || x > hi {
        return None;
    }
    let size = (hi - lo).saturating_add(1);
    let n = u128::from(slots);
    let (base, extra) = (size / n, size % n);
    let off = x - lo;
    // The first `extra` slices hold base + 1 addresses each.
    let big = extra * (base + 1);
    let slot = if off < big {
        off / (base + 1)
    } else {
        extra + (off - big) / base
    };
    u16::try_from(slot).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(x: u32) -> Ipv4Addr {
        Ipv4Addr::from(x)
    }

    /// Every address of the pool in exactly one slice, the slices in slot
    /// order and contiguous, and `slot_at` agreeing with `slice_of`.
    fn check_partition(slots: u16, lo: u32, hi: u32) {
        let mut next = u64::from(lo);
        for s in 0..slots {
            let Some(r) = slice_of(s, slots, ip(lo), ip(hi)) else {
                // Only the last slots of a pool smaller than `slots` are empty.
                assert!(
                    u64::from(hi - lo + 1) < u64::from(slots),
                    "{slots} {lo}-{hi}"
                );
                assert!(u64::from(s) >= u64::from(hi - lo + 1));
                continue;
            };
            let (a, b) = (u32::from(*r.start()), u32::from(*r.end()));
            assert_eq!(
                u64::from(a),
                next,
                "slice {s} of {slots} starts where the last ended"
            );
            assert!(a <= b && b <= hi);
            for x in [a, b, a + (b - a) / 2] {
                assert_eq!(slot_at(slots, ip(lo), ip(hi), ip(x)), Some(s));
            }
            next = u64::from(b) + 1;
        }
        assert_eq!(next, u64::from(hi) + 1, "the slices cover the pool");
        // Sizes differ by at most one.
        let sizes: Vec<u64> = (0..slots)
            .filter_map(|s| slice_of(s, slots, ip(lo), ip(hi)))
            .map(|r| u64::from(u32::from(*r.end()) - u32::from(*r.start())) + 1)
            .collect();
        let (min, max) = (sizes.iter().min(), sizes.iter().max());
        assert!(max.unwrap() - min.unwrap() <= 1, "{sizes:?}");
    }

    #[test]
    fn slices_partition_small_pools_exhaustively() {
        let base = u32::from(Ipv4Addr::new(10, 0, 0, 10));
        for slots in 1..=12u16 {
            for size in 1..=40u32 {
                check_partition(slots, base, base + size - 1);
                // Each address exactly once, counted one by one.
                let mut owners = vec![0u32; size as usize];
                for s in 0..slots {
                    if let Some(r) = slice_of(s, slots, ip(base), ip(base + size - 1)) {
                        for x in u32::from(*r.start())..=u32::from(*r.end()) {
                            owners[(x - base) as usize] += 1;
                        }
                    }
                }
                assert!(owners.iter().all(|&n| n == 1), "{slots} slots, {size}");
            }
        }
    }

    #[test]
    fn slices_partition_large_pools() {
        // A fixed xorshift, so a failure names its case.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..2000 {
            let lo = (next() as u32) & 0xfff0_0000;
            let size = (next() % 1_000_000) as u32 + 1;
            let slots = (next() % u64::from(MAX_SLOTS)) as u16 + 1;
            check_partition(slots, lo, lo + size - 1);
        }
        // The very top of the address space.
        check_partition(7, u32::MAX - 100, u32::MAX);
        check_partition(3, 0, u32::MAX);
    }

    #[test]
    fn addresses_outside_the_pool_have_no_slot() {
        let (lo, hi) = (ip(100), ip(199));
        assert_eq!(slot_at(4, lo, hi, ip(99)), None);
        assert_eq!(slot_at(4, lo, hi, ip(200)), None);
        assert_eq!(slot_at(4, lo, hi, ip(100)), Some(0));
        assert_eq!(slot_at(4, lo, hi, ip(199)), Some(3));
    }

    #[test]
    fn mixing_table_is_a_permutation() {
        let mut seen = [false; 256];
        for &v in &MIX {
            assert!(!seen[usize::from(v)], "{v} twice");
            seen[usize::from(v)] = true;
        }
    }

    #[test]
    fn bucket_follows_rfc_3074() {
        // By hand from section 6: hash = len; for i = len..1: hash = T[hash ^ key[i-1]].
        let mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        let mut h = 6u8;
        for &b in mac.iter().rev() {
            h = MIX[usize::from(h ^ b)];
        }
        assert_eq!(bucket(&mac), h);
        assert_eq!(bucket(&[]), 0);
        assert_eq!(bucket(&[0]), MIX[1]);
        // MACs that differ in one byte spread over the buckets.
        let buckets: BTreeSet<u8> = (0..=255u8)
            .map(|b| bucket(&[0x52, 0x54, 0, 0, 0, b]))
            .collect();
        assert_eq!(
            buckets.len(),
            256,
            "one byte's values map to distinct buckets"
        );
    }

    #[test]
    fn alone_answers_everything_from_the_whole_pool() {
        let share = Share::alone();
        assert!(!share.is_shared() && share.is_live());
        assert_eq!(share.slice(ip(10), ip(20)), Some(ip(10)..=ip(20)));
        assert!((0..=255u8).all(|b| share.answers(&[0, 0, 0, 0, 0, b])));
        assert_eq!(share.buckets_owned(), 256);
    }

    #[test]
    fn every_host_has_one_owner_and_only_a_dead_slots_hosts_move() {
        let macs: Vec<MacAddr> = (0..2000u32)
            .map(|i| {
                let b = i.to_be_bytes();
                MacAddr([0x52, 0x54, b[0], b[1], b[2], b[3]])
            })
            .collect();
        let before: Vec<Share> = (0..3)
            .map(|s| Share::new(s, 3).unwrap().with_live([0, 1, 2]))
            .collect();
        let after: Vec<Share> = [0, 2]
            .iter()
            .map(|&s| Share::new(s, 3).unwrap().with_live([0, 2]))
            .collect();
        for &mac in &macs {
            assert_eq!(before.iter().filter(|s| s.owns_host(mac)).count(), 1);
            assert_eq!(after.iter().filter(|s| s.owns_host(mac)).count(), 1);
            // Hosts of the surviving slots stay where they were.
            let was = before[0].host_owner(mac).unwrap();
            if was != 1 {
                assert_eq!(after[0].host_owner(mac), Some(was), "{mac}");
            }
        }
        // Spread: each of three owns roughly a third.
        for s in &before {
            let n = macs.iter().filter(|&&m| s.owns_host(m)).count();
            assert!((500..850).contains(&n), "{n}");
        }
        let alone = Share::alone();
        assert!(macs.iter().all(|&m| alone.owns_host(m)));
        assert_eq!(alone.rank(), Some((0, 1)));
        let unclaimed = Share::unclaimed(3).unwrap().with_live([0, 1]);
        assert!(!macs.iter().any(|&m| unclaimed.owns_host(m)));
        assert_eq!(unclaimed.rank(), None);
        assert_eq!(after[1].rank(), Some((1, 2)));
        // Our own slot lapsed: we own nothing, the live one owns all.
        let lapsed = Share::new(1, 3).unwrap().with_live([0]);
        assert!(!macs.iter().any(|&m| lapsed.owns_host(m)));
        let named = before[0].with_names(BTreeMap::from([
            (0, "node-a".to_string()),
            (1, "node-b".to_string()),
            (2, "node-c".to_string()),
        ]));
        let owner = named.host_owner(macs[0]).unwrap();
        assert_eq!(
            named.host_owner_name(macs[0]),
            Some(["node-a", "node-b", "node-c"][usize::from(owner)])
        );
    }

    #[test]
    fn every_bucket_has_one_live_owner_deterministically() {
        let slots = 8;
        let shares: Vec<Share> = (0..slots)
            .map(|s| Share::new(s, slots).unwrap().with_live([0, 2, 3, 5, 7]))
            .collect();
        for b in 0..=255u8 {
            let owner = shares[0].owner(b).unwrap();
            assert!(shares[0].live().contains(&owner));
            // Every agent computes the same owner.
            assert!(shares.iter().all(|s| s.owner(b) == Some(owner)));
            let mac = [b, 1, 2, 3, 4, 5];
            let answering = shares
                .iter()
                .filter(|s| s.is_live() && s.answers(&mac))
                .count();
            assert_eq!(answering, 1, "bucket {b}");
        }
        let total: usize = shares
            .iter()
            .filter(|s| s.is_live())
            .map(Share::buckets_owned)
            .sum();
        assert_eq!(total, 256);
        // An agent whose slot is not live answers nothing.
        assert_eq!(shares[1].buckets_owned(), 0);
    }

    #[test]
    fn a_slot_leaving_moves_only_its_buckets_spread_over_the_survivors() {
        let all = Share::new(0, 8).unwrap().with_live(0..8);
        for gone in 0..8u16 {
            let fewer = all.with_live((0..8).filter(|&s| s != gone));
            let mut moved_to = [0usize; 8];
            for b in 0..=255u8 {
                let (before, after) = (all.owner(b).unwrap(), fewer.owner(b).unwrap());
                if before == gone {
                    assert_ne!(after, gone);
                    moved_to[usize::from(after)] += 1;
                } else {
                    assert_eq!(before, after, "bucket {b} moved though {before} stayed");
                }
            }
            let owned = (0..=255u8).filter(|&b| all.owner(b) == Some(gone)).count();
            assert_eq!(moved_to.iter().sum::<usize>(), owned);
            // Spread over the survivors, not handed to one of them.
            assert!(
                moved_to.iter().filter(|&&n| n > 0).count() > 1,
                "{moved_to:?}"
            );
        }
    }

    #[test]
    fn buckets_spread_roughly_evenly() {
        for n in [2u16, 3, 4, 8] {
            let share = Share::new(0, n).unwrap().with_live(0..n);
            for s in 0..n {
                let owned = share.with_live(0..n);
                let count = (0..=255u8).filter(|&b| owned.owner(b) == Some(s)).count();
                let fair = 256 / usize::from(n);
                // Rendezvous over 256 buckets: within a factor of two of fair.
                assert!(
                    count > fair / 2 && count < fair * 2,
                    "{n} slots: slot {s} has {count}"
                );
            }
        }
    }

    #[test]
    fn an_unclaimed_agent_has_no_slice_and_no_bucket() {
        let share = Share::unclaimed(4).unwrap().with_live(0..4);
        assert_eq!(share.slice(ip(1), ip(100)), None);
        assert_eq!(share.buckets_owned(), 0);
        assert!(!share.is_live() && !share.answers(&[1, 2, 3, 4, 5, 6]));
    }

    #[test]
    fn bad_slots_are_refused() {
        assert_eq!(Share::new(0, 0), Err(ShareError::Slots { slots: 0 }));
        assert_eq!(
            Share::new(3, 3),
            Err(ShareError::Slot { slot: 3, slots: 3 })
        );
        assert!(Share::new(255, 256).is_ok());
        assert_eq!(Share::new(0, 257), Err(ShareError::Slots { slots: 257 }));
    }

    /// IPv6 pools: every address of the pool in exactly one slot's slice,
    /// the slices in slot order, and `slot_at6` agreeing, for small pools
    /// counted address by address and for a whole /64.
    #[test]
    fn ipv6_slices_partition_the_pool() {
        let base = u128::from("fd00:66::1000".parse::<Ipv6Addr>().unwrap());
        for slots in 1..=6u16 {
            for size in 1..=30u128 {
                let (lo, hi) = (Ipv6Addr::from(base), Ipv6Addr::from(base + size - 1));
                let mut owners = vec![0u32; size as usize];
                let mut next = base;
                for s in 0..slots {
                    let Some(r) = slice_of6(s, slots, lo, hi) else {
                        assert!(u128::from(s) >= size, "{slots} slots, {size}");
                        continue;
                    };
                    assert_eq!(u128::from(*r.start()), next, "contiguous, in slot order");
                    for x in u128::from(*r.start())..=u128::from(*r.end()) {
                        owners[(x - base) as usize] += 1;
                        assert_eq!(slot_at6(slots, lo, hi, x.into()), Some(s));
                    }
                    next = u128::from(*r.end()) + 1;
                }
                assert!(owners.iter().all(|&n| n == 1), "{slots} slots, {size}");
            }
        }
        let (lo, hi): (Ipv6Addr, Ipv6Addr) = (
            "fd00:66::".parse().unwrap(),
            "fd00:66::ffff:ffff:ffff:ffff".parse().unwrap(),
        );
        let slices: Vec<_> = (0..3).map(|s| slice_of6(s, 3, lo, hi).unwrap()).collect();
        assert_eq!(*slices[0].start(), lo);
        assert_eq!(*slices[2].end(), hi);
        for pair in slices.windows(2) {
            assert_eq!(u128::from(*pair[0].end()) + 1, u128::from(*pair[1].start()));
        }
        assert_eq!(slot_at6(3, lo, hi, *slices[1].start()), Some(1));
        assert_eq!(slot_at6(3, lo, hi, "fd00:67::".parse().unwrap()), None);
        let share = Share::new(1, 3).unwrap().with_live([0, 1, 2]);
        assert_eq!(share.slice6(lo, hi), Some(slices[1].clone()));
    }
}

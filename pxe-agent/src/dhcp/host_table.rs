//! The compiled host records as the agent keeps them: sorted by MAC, each
//! host's own options in one shared byte arena, so that a host costs its
//! options' length rather than the kernel record's fixed room for them.
//!
//! Owns the packed layout; a [`HostRecord`] is rebuilt for whoever reads
//! one (the map sync, the tests), byte for byte what was put in.

use pxe_ebpf_common::{HostRecord, MacKey, bootp};

/// Host records by MAC, packed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostTable {
    /// Sorted, no duplicates; `packed[i]` is `keys[i]`'s record.
    keys: Vec<MacKey>,
    packed: Vec<Packed>,
    /// Every record's options, in key order.
    options: Vec<u8>,
}

/// A [`HostRecord`] without its options' room: where they are instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Packed {
    yiaddr: [u8; 4],
    bodies: [u32; 7],
    sum: u16,
    len: u16,
    /// Offset of the options in [`HostTable::options`].
    at: u32,
}

impl HostTable {
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn position(&self, key: &MacKey) -> Option<usize> {
        self.keys.binary_search(key).ok()
    }

    pub fn contains_key(&self, key: &MacKey) -> bool {
        self.position(key).is_some()
    }

    /// `key`'s record.
    pub fn get(&self, key: &MacKey) -> Option<HostRecord> {
        self.position(key).map(|i| self.record(i))
    }

    /// `key`'s record's parts, looked for at `*hint` first and the
    /// position after it left in `*hint`: walking a table's keys in order
    /// (an inventory listed by MAC) finds each without a search.
    pub fn find_near(&self, key: &MacKey, hint: &mut usize) -> Option<RecordRef<'_>> {
        let i = match self.keys.get(*hint) {
            Some(k) if k == key => *hint,
            _ => self.position(key)?,
        };
        *hint = i + 1;
        Some(self.view(i))
    }

    /// The MACs, in order.
    pub fn keys(&self) -> impl Iterator<Item = &MacKey> {
        self.keys.iter()
    }

    /// Every MAC with its record, in MAC order.
    pub fn iter(&self) -> impl Iterator<Item = (&MacKey, HostRecord)> {
        self.keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k, self.record(i)))
    }

    /// Every record, in MAC order.
    pub fn records(&self) -> impl Iterator<Item = HostRecord> + '_ {
        (0..self.keys.len()).map(|i| self.record(i))
    }

    /// Every MAC with its record's parts, borrowed, in MAC order: for
    /// comparing tables without rebuilding records.
    pub fn entries(&self) -> impl Iterator<Item = (&MacKey, RecordRef<'_>)> {
        self.keys.iter().enumerate().map(|(i, k)| (k, self.view(i)))
    }

    fn view(&self, i: usize) -> RecordRef<'_> {
        let p = &self.packed[i];
        let (at, len) = (p.at as usize, p.len as usize);
        RecordRef {
            yiaddr: p.yiaddr,
            bodies: p.bodies,
            sum: p.sum,
            options: &self.options[at..at + len],
        }
    }

    fn record(&self, i: usize) -> HostRecord {
        self.view(i).to_record()
    }
}

/// A record's parts as a [`HostTable`] holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordRef<'a> {
    pub yiaddr: [u8; 4],
    pub bodies: [u32; 7],
    pub sum: u16,
    /// The host's own options (`HostRecord::options[..len]`).
    pub options: &'a [u8],
}

impl<'a> RecordRef<'a> {
    /// A kernel record's parts: its options up to its length.
    pub fn of(record: &'a HostRecord) -> RecordRef<'a> {
        let len = usize::from(record.len).min(bootp::HOST_BYTES);
        RecordRef {
            yiaddr: record.yiaddr,
            bodies: record.bodies,
            sum: record.sum,
            options: &record.options[..len],
        }
    }

    /// The kernel's record: the options, then, when there is room, the end
    /// option, then zeros (see [`HostRecord`]).
    pub fn to_record(&self) -> HostRecord {
        let len = self.options.len();
        let mut record = HostRecord {
            yiaddr: self.yiaddr,
            bodies: self.bodies,
            sum: self.sum,
            len: len as u16,
            options: [0; bootp::HOST_BYTES],
        };
        record.options[..len].copy_from_slice(self.options);
        if let Some(end) = record.options.get_mut(len) {
            *end = bootp::OPT_END;
        }
        record
    }
}

/// Records in the order they were added, packed as a table packs them:
/// what a compile collects before the table is sorted, without a kernel
/// record's fixed room for options per host.
#[derive(Clone, Debug, Default)]
pub struct Records {
    keys: Vec<MacKey>,
    packed: Vec<Packed>,
    options: Vec<u8>,
}

impl Records {
    pub fn with_capacity(records: usize) -> Records {
        Records {
            keys: Vec::with_capacity(records),
            packed: Vec::with_capacity(records),
            options: Vec::new(),
        }
    }

    pub fn push(&mut self, key: MacKey, record: RecordRef<'_>) {
        let len = record.options.len().min(bootp::HOST_BYTES);
        let at = u32::try_from(self.options.len()).expect("under 4 GiB of host options");
        self.options.extend_from_slice(&record.options[..len]);
        self.keys.push(key);
        self.packed.push(Packed {
            yiaddr: record.yiaddr,
            bodies: record.bodies,
            sum: record.sum,
            len: len as u16,
            at,
        });
    }

    /// Every record's body slots, to renumber them.
    pub fn bodies_mut(&mut self) -> impl Iterator<Item = &mut [u32; 7]> {
        self.packed.iter_mut().map(|p| &mut p.bodies)
    }

    /// `other`'s records after these.
    pub fn append(&mut self, other: Records) {
        if self.keys.is_empty() {
            *self = other;
            return;
        }
        let shift = u32::try_from(self.options.len()).expect("under 4 GiB of host options");
        self.options.extend_from_slice(&other.options);
        self.keys.extend_from_slice(&other.keys);
        self.packed.extend(other.packed.into_iter().map(|p| Packed {
            at: p.at + shift,
            ..p
        }));
    }
}

/// Sorted by MAC; of records with the same MAC the last one is kept, as in
/// a map.
impl From<Records> for HostTable {
    fn from(records: Records) -> HostTable {
        let Records {
            keys,
            packed,
            options,
        } = records;
        let sorted = keys.is_sorted_by(|a, b| a < b);
        if sorted {
            // Already a table's layout: no copy.
            return HostTable {
                keys,
                packed,
                options,
            };
        }
        // The order is sorted, not the entries. Stable: of equal MACs the
        // last one is kept below.
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_by_key(|&i| keys[i]);
        let mut table = HostTable {
            keys: Vec::with_capacity(keys.len()),
            packed: Vec::with_capacity(keys.len()),
            options: Vec::with_capacity(options.len()),
        };
        let mut order = order.into_iter().peekable();
        while let Some(i) = order.next() {
            if order.peek().is_some_and(|&next| keys[next] == keys[i]) {
                continue;
            }
            let p = packed[i];
            let (at, len) = (p.at as usize, p.len as usize);
            let moved = u32::try_from(table.options.len()).expect("under 4 GiB of host options");
            table.options.extend_from_slice(&options[at..at + len]);
            table.keys.push(keys[i]);
            table.packed.push(Packed { at: moved, ..p });
        }
        table
    }
}

/// Later records replace earlier ones of the same MAC, as in a map.
impl FromIterator<(MacKey, HostRecord)> for HostTable {
    fn from_iter<I: IntoIterator<Item = (MacKey, HostRecord)>>(entries: I) -> HostTable {
        let entries = entries.into_iter();
        let mut records = Records::with_capacity(entries.size_hint().0);
        for (key, record) in entries {
            records.push(key, RecordRef::of(&record));
        }
        records.into()
    }
}

/// Adds or replaces records (the table is rebuilt: for building, not for
/// a hot path).
impl Extend<(MacKey, HostRecord)> for HostTable {
    fn extend<I: IntoIterator<Item = (MacKey, HostRecord)>>(&mut self, entries: I) {
        let old = std::mem::take(self);
        *self = old.into_iter().chain(entries).collect();
    }
}

impl IntoIterator for HostTable {
    type Item = (MacKey, HostRecord);
    type IntoIter = std::vec::IntoIter<(MacKey, HostRecord)>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
            .map(|(k, r)| (*k, r))
            .collect::<Vec<_>>()
            .into_iter()
    }
}

#[cfg(test)]
mod tests {
    use pxe_ebpf_common::NO_BODY;

    use super::*;

    fn record(n: u8, len: u16) -> HostRecord {
        let mut r = HostRecord::zeroed();
        r.yiaddr = [10, 0, 0, n];
        r.bodies = [u32::from(n), NO_BODY, 2, NO_BODY, NO_BODY, NO_BODY, 7];
        r.len = len;
        r.sum = u16::from(n) * 3;
        for (i, b) in r.options[..len as usize].iter_mut().enumerate() {
            *b = n.wrapping_add(i as u8);
        }
        // The kernel's form: the end option after the options when it fits.
        if let Some(end) = r.options.get_mut(len as usize) {
            *end = bootp::OPT_END;
        }
        r
    }

    fn key(n: u8) -> MacKey {
        MacKey::new([2, 0, 0, 0, 0, n])
    }

    #[test]
    fn records_come_back_byte_for_byte_in_mac_order() {
        let put = [
            (key(9), record(9, 128)),
            (key(1), record(1, 0)),
            (key(5), record(5, 17)),
        ];
        let table: HostTable = put.iter().copied().collect();
        assert_eq!(table.len(), 3);
        for (k, r) in &put {
            assert_eq!(table.get(k), Some(*r));
        }
        assert_eq!(table.get(&key(2)), None);
        let order: Vec<MacKey> = table.keys().copied().collect();
        assert_eq!(order, [key(1), key(5), key(9)]);
        assert_eq!(table.options.len(), 145, "only the bytes in use are kept");
        assert!(table.iter().all(|(k, r)| table.get(k) == Some(r)));
    }

    #[test]
    fn the_last_record_of_a_mac_wins_and_equal_contents_are_equal_tables() {
        let a: HostTable = [(key(1), record(1, 4)), (key(1), record(7, 9))]
            .into_iter()
            .collect();
        assert_eq!(a.len(), 1);
        assert_eq!(a.get(&key(1)), Some(record(7, 9)));
        let b: HostTable = [(key(1), record(7, 9))].into_iter().collect();
        assert_eq!(a, b);
    }
}

//! Applies a compiled inventory to the fast path's maps without a gap, and
//! all of it or none of it.
//!
//! Bodies go first, each into the slot that already holds it or into one
//! no host uses, so nothing a reader can reach changes under it. Then host
//! entries no longer wanted are deleted (freeing room in a map near its
//! capacity), and new and changed ones written (a hash-map update swaps the
//! whole element, so readers see the old record or the new one, never a
//! mix). A host present in both versions is answered throughout. When a
//! write fails midway, the host entries done so far are undone, so the
//! maps hold the previous inventory again and the caller can keep serving
//! it in both paths; bodies written to free slots are unreachable and need
//! no undo.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use aya::maps::{Array, HashMap as BpfHashMap, MapData, MapError};
use pxe_ebpf_common::{BODY_WHOLE, HostRecord, MacKey, NO_BODY, ReplyBody};

use crate::dhcp::{
    host_table::{HostTable, RecordRef},
    template::Compiled,
};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Host entries written.
    pub written: usize,
    /// Host entries deleted.
    pub removed: usize,
    /// Host entries already as wanted.
    pub unchanged: usize,
    /// Body slots written.
    pub bodies: usize,
}

impl SyncReport {
    /// Element writes and deletes made in the kernel's maps.
    pub fn map_writes(&self) -> usize {
        self.written + self.removed + self.bodies
    }

    pub fn add(&mut self, other: &SyncReport) {
        self.written += other.written;
        self.removed += other.removed;
        self.unchanged += other.unchanged;
        self.bodies += other.bodies;
    }
}

/// A sync that failed, and whether the maps are back as they were.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{source}; the map was put back as it was")]
    RolledBack { source: Box<MapError> },
    #[error("{source}; undoing it failed too ({undo}): the map is out of step")]
    Mixed {
        source: Box<MapError>,
        undo: Box<MapError>,
    },
}

impl SyncError {
    /// The write that failed first.
    pub fn into_source(self) -> Box<MapError> {
        match self {
            SyncError::RolledBack { source } | SyncError::Mixed { source, .. } => source,
        }
    }
}

/// Something the fast path's maps can be told to do; a trait so the undo
/// logic is tested without a kernel.
pub trait Entries {
    fn put(&mut self, key: &MacKey, value: &HostRecord) -> Result<(), MapError>;
    fn delete(&mut self, key: &MacKey) -> Result<(), MapError>;
    fn put_body(&mut self, slot: u32, body: &ReplyBody) -> Result<(), MapError>;
    /// Body slots the map has.
    fn body_slots(&self) -> u32;
}

/// The kernel's maps of one fast path.
pub struct Maps {
    pub hosts: BpfHashMap<MapData, MacKey, HostRecord>,
    /// The hosts map's `max_entries`.
    pub hosts_capacity: u32,
    pub bodies: Array<MapData, ReplyBody>,
}

impl Entries for Maps {
    fn put(&mut self, key: &MacKey, value: &HostRecord) -> Result<(), MapError> {
        self.hosts.insert(key, value, 0)
    }

    fn delete(&mut self, key: &MacKey) -> Result<(), MapError> {
        match self.hosts.remove(key) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn put_body(&mut self, slot: u32, body: &ReplyBody) -> Result<(), MapError> {
        self.bodies.set(slot, body, 0)
    }

    fn body_slots(&self) -> u32 {
        self.bodies.len()
    }
}

/// What the maps hold: the compiled inventory last put in force, and the
/// slot each of its bodies is in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Installed {
    /// Shared with a reload compiling beside the running agent.
    compiled: Arc<Compiled>,
    /// `compiled.bodies[i]` is in slot `slot_of[i]`.
    slot_of: Vec<u32>,
}

impl Installed {
    /// What `maps` hold, read back (an adopted pin, or after a failed undo):
    /// the bodies are those the host entries use.
    pub fn read(maps: &Maps) -> Installed {
        let hosts: BTreeMap<MacKey, HostRecord> =
            maps.hosts.iter().filter_map(Result::ok).collect();
        let mut slots: Vec<u32> = hosts.values().flat_map(slots).collect();
        slots.sort_unstable();
        slots.dedup();
        let mut slot_of = Vec::with_capacity(slots.len());
        let mut bodies = Vec::with_capacity(slots.len());
        for slot in slots {
            // A slot that cannot be read leaves its hosts pointing nowhere:
            // the next sync rewrites them.
            if let Ok(body) = maps.bodies.get(&slot, 0) {
                slot_of.push(slot);
                bodies.push(body);
            }
        }
        let index = |slot: u32| slot_of.binary_search(&slot).map_or(NO_BODY, |i| i as u32);
        let hosts = hosts
            .into_iter()
            .map(|(key, mut record)| {
                for b in &mut record.bodies {
                    if *b != NO_BODY {
                        *b = index(*b & !BODY_WHOLE) | (*b & BODY_WHOLE);
                    }
                }
                (key, record)
            })
            .collect();
        Installed {
            compiled: Arc::new(Compiled { hosts, bodies }),
            slot_of,
        }
    }

    /// The compiled inventory the maps hold, for a reload to start from.
    pub fn compiled(&self) -> &Arc<Compiled> {
        &self.compiled
    }

    /// Host entries.
    pub fn len(&self) -> usize {
        self.compiled.hosts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.compiled.hosts.is_empty()
    }

    /// Body slots in use.
    pub fn bodies(&self) -> usize {
        self.slot_of.len()
    }

    /// The record of `key` as the kernel holds it: body slots, not indices.
    pub fn record(&self, key: &MacKey) -> Option<HostRecord> {
        self.compiled
            .hosts
            .get(key)
            .map(|r| resolve(&r, &self.slot_of))
    }
}

/// The body slots a record in the kernel's map uses.
fn slots(record: &HostRecord) -> impl Iterator<Item = u32> + '_ {
    record
        .bodies
        .iter()
        .filter(|b| **b != NO_BODY)
        .map(|b| b & !BODY_WHOLE)
}

/// A compiled record with its body indices turned into slots.
fn resolve(record: &HostRecord, slot_of: &[u32]) -> HostRecord {
    let mut out = *record;
    for b in &mut out.bodies {
        *b = slot_in(*b, slot_of);
    }
    out
}

/// Makes the maps hold exactly `desired`; `current` is what they hold.
/// On success `current` becomes `desired` and the inventory it replaced is
/// returned (to sync back to, should another interface fail); on failure
/// `current` is unchanged.
pub fn sync(
    map: &mut impl Entries,
    current: &mut Installed,
    desired: Arc<Compiled>,
) -> Result<(SyncReport, Arc<Compiled>), SyncError> {
    let mut report = SyncReport::default();
    // Bodies: each into the slot that holds it, or into one no host of the
    // current inventory uses.
    let held: HashMap<&ReplyBody, u32> = current
        .compiled
        .bodies
        .iter()
        .zip(&current.slot_of)
        .map(|(body, slot)| (body, *slot))
        .collect();
    let mut taken: Vec<bool> = Vec::new();
    for slot in &current.slot_of {
        mark(&mut taken, *slot);
    }
    let mut slot_of = Vec::with_capacity(desired.bodies.len());
    let mut free = 0u32;
    for body in &desired.bodies {
        if let Some(slot) = held.get(body) {
            slot_of.push(*slot);
            continue;
        }
        while taken.get(free as usize).copied().unwrap_or(false) {
            free += 1;
        }
        if free >= map.body_slots() {
            return Err(SyncError::RolledBack {
                source: Box::new(MapError::OutOfBounds {
                    index: free,
                    max_entries: map.body_slots(),
                }),
            });
        }
        map.put_body(free, body)
            .map_err(|source| SyncError::RolledBack {
                source: Box::new(source),
            })?;
        report.bodies += 1;
        mark(&mut taken, free);
        slot_of.push(free);
    }
    // What was done to host entries, in order, so that it can be undone.
    let mut done: Vec<&MacKey> = Vec::new();
    let (removed, writes) = changes(
        &current.compiled.hosts,
        &current.slot_of,
        &desired.hosts,
        &slot_of,
    );
    report.unchanged = desired.hosts.len() - writes.len();
    let result = (|| {
        for key in removed {
            map.delete(key)?;
            done.push(key);
            report.removed += 1;
        }
        for (key, record) in writes {
            map.put(key, &resolve(&record.to_record(), &slot_of))?;
            done.push(key);
            report.written += 1;
        }
        Ok(())
    })();
    let Err(source) = result else {
        let previous = std::mem::replace(
            current,
            Installed {
                compiled: desired,
                slot_of,
            },
        );
        return Ok((report, previous.compiled));
    };
    // Newly added keys go first, so that restoring the old ones never
    // meets a full map.
    done.sort_by_key(|k| current.compiled.hosts.contains_key(k));
    for key in done {
        let undone = match current.record(key) {
            Some(old) => map.put(key, &old),
            None => map.delete(key),
        };
        if let Err(undo) = undone {
            return Err(SyncError::Mixed {
                source: Box::new(source),
                undo: Box::new(undo),
            });
        }
    }
    Err(SyncError::RolledBack {
        source: Box::new(source),
    })
}

/// What turns `current` (its bodies in `current_slots`) into `desired`
/// (in `desired_slots`): the keys to delete, and the entries to write, new
/// or different in the kernel's terms (body slots, not indices). One walk
/// of both tables in MAC order; records are compared in place.
fn changes<'a>(
    current: &'a HostTable,
    current_slots: &[u32],
    desired: &'a HostTable,
    desired_slots: &[u32],
) -> (Vec<&'a MacKey>, Vec<(&'a MacKey, RecordRef<'a>)>) {
    let same = |a: &RecordRef, b: &RecordRef| {
        a.yiaddr == b.yiaddr
            && a.sum == b.sum
            && a.options == b.options
            && a.bodies
                .iter()
                .zip(&b.bodies)
                .all(|(x, y)| slot_in(*x, current_slots) == slot_in(*y, desired_slots))
    };
    let (mut removed, mut writes) = (Vec::new(), Vec::new());
    let mut old = current.entries().peekable();
    for (key, record) in desired.entries() {
        while let Some((k, _)) = old.next_if(|(k, _)| *k < key) {
            removed.push(k);
        }
        match old.next_if(|(k, _)| *k == key) {
            Some((_, before)) if same(&before, &record) => {}
            _ => writes.push((key, record)),
        }
    }
    removed.extend(old.map(|(k, _)| k));
    (removed, writes)
}

/// A record's body entry with its index turned into a slot.
fn slot_in(body: u32, slot_of: &[u32]) -> u32 {
    if body == NO_BODY {
        body
    } else {
        slot_of[(body & !BODY_WHOLE) as usize] | (body & BODY_WHOLE)
    }
}

fn mark(taken: &mut Vec<bool>, slot: u32) {
    let i = slot as usize;
    if taken.len() <= i {
        taken.resize(i + 1, false);
    }
    taken[i] = true;
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use pxe_ebpf_common::BootClass;

    use super::*;

    /// Maps with a capacity, failing like the kernel's past it.
    struct Bounded {
        hosts: BTreeMap<MacKey, HostRecord>,
        bodies: Vec<ReplyBody>,
        capacity: usize,
    }

    impl Bounded {
        fn new(capacity: usize, slots: u32) -> Bounded {
            Bounded {
                hosts: BTreeMap::new(),
                bodies: vec![ReplyBody::zeroed(); slots as usize],
                capacity,
            }
        }

        /// The body each host entry gets for BIOS, by the yiaddr it holds.
        fn served(&self) -> BTreeMap<MacKey, (u16, [u8; 4])> {
            self.hosts
                .iter()
                .map(|(k, h)| {
                    let (slot, _) = h.body(BootClass::Bios).expect("bios");
                    (*k, (self.bodies[slot as usize].len, h.yiaddr))
                })
                .collect()
        }
    }

    impl Entries for Bounded {
        fn put(&mut self, key: &MacKey, value: &HostRecord) -> Result<(), MapError> {
            if !self.hosts.contains_key(key) && self.hosts.len() >= self.capacity {
                return Err(MapError::SyscallError(aya::sys::SyscallError {
                    call: "bpf_map_update_elem",
                    io_error: std::io::Error::from_raw_os_error(libc::E2BIG),
                }));
            }
            self.hosts.insert(*key, *value);
            Ok(())
        }

        fn delete(&mut self, key: &MacKey) -> Result<(), MapError> {
            self.hosts.remove(key);
            Ok(())
        }

        fn put_body(&mut self, slot: u32, body: &ReplyBody) -> Result<(), MapError> {
            self.bodies[slot as usize] = *body;
            Ok(())
        }

        fn body_slots(&self) -> u32 {
            self.bodies.len() as u32
        }
    }

    /// Hosts `range` at 10.0.i.`last`, all with one body of length `body`.
    fn compiled(range: std::ops::Range<u8>, last: u8, body: u16) -> Compiled {
        let mut b = ReplyBody::zeroed();
        b.len = body;
        let hosts = range
            .map(|i| {
                let mut r = HostRecord::zeroed();
                r.yiaddr = [10, 0, i, last];
                r.bodies[BootClass::Bios as usize] = 0;
                (MacKey::new([2, 0, 0, 0, 0, i]), r)
            })
            .collect();
        Compiled {
            hosts,
            bodies: vec![b],
        }
    }

    #[test]
    fn a_failed_write_puts_the_whole_previous_inventory_back() {
        let old = compiled(0..8, 1, 300);
        let mut map = Bounded::new(10, 4);
        let mut installed = Installed::default();
        sync(&mut map, &mut installed, Arc::new(old.clone())).expect("fits");
        let before = map.served();
        let snapshot = installed.clone();
        // Hosts 0..4 change, 4..8 go, 8..20 come: past the capacity.
        let mut new = compiled(0..4, 2, 301);
        new.hosts.extend(compiled(8..20, 1, 301).hosts);
        let err = sync(&mut map, &mut installed, Arc::new(new)).expect_err("past capacity");
        assert!(matches!(err, SyncError::RolledBack { .. }), "{err}");
        assert_eq!(
            map.served(),
            before,
            "the map is not the previous inventory"
        );
        assert_eq!(installed, snapshot);
        // What fits applies whole.
        let mut smaller = compiled(0..4, 2, 301);
        smaller.hosts.extend(compiled(8..12, 1, 301).hosts);
        let (report, _) = sync(&mut map, &mut installed, Arc::new(smaller)).expect("fits");
        assert_eq!((report.written, report.removed, report.bodies), (8, 4, 1));
        assert_eq!(map.hosts.len(), 8);
        assert!(map.served().values().all(|(len, _)| *len == 301));
    }

    #[test]
    fn a_new_body_never_goes_into_a_slot_a_host_still_uses() {
        let mut map = Bounded::new(100, 2);
        let mut installed = Installed::default();
        sync(&mut map, &mut installed, Arc::new(compiled(0..4, 1, 300))).expect("fits");
        // Every host moves to a new body: slot 1, while slot 0 is in use.
        let (report, _) =
            sync(&mut map, &mut installed, Arc::new(compiled(0..4, 1, 302))).expect("fits");
        assert_eq!((report.bodies, report.written), (1, 4));
        assert!(map.hosts.values().all(|h| h.bodies[1] == 1));
        assert_eq!(installed.bodies(), 1);
        // Slot 0 is free again; both slots in use would not fit a third.
        let (report, _) =
            sync(&mut map, &mut installed, Arc::new(compiled(0..4, 1, 303))).expect("fits");
        assert_eq!(report.bodies, 1);
        assert!(map.hosts.values().all(|h| h.bodies[1] == 0));
    }

    #[test]
    fn a_change_of_one_host_writes_only_its_entry() {
        let mut map = Bounded::new(100, 4);
        let mut installed = Installed::default();
        sync(&mut map, &mut installed, Arc::new(compiled(0..50, 1, 300))).expect("fits");
        let mut changed = compiled(0..50, 1, 300);
        let key = MacKey::new([2, 0, 0, 0, 0, 7]);
        let mut record = changed.hosts.get(&key).expect("host 7");
        record.yiaddr = [10, 0, 7, 9];
        changed.hosts.extend([(key, record)]);
        let (report, _) = sync(&mut map, &mut installed, Arc::new(changed)).expect("fits");
        assert_eq!(report.map_writes(), 1, "{report:?}");
        assert_eq!(report.unchanged, 49);
    }

    #[test]
    fn bodies_past_the_slots_are_refused_before_any_host_changes() {
        let mut map = Bounded::new(100, 1);
        let mut installed = Installed::default();
        sync(&mut map, &mut installed, Arc::new(compiled(0..4, 1, 300))).expect("fits");
        let err = sync(&mut map, &mut installed, Arc::new(compiled(0..4, 1, 301)))
            .expect_err("no free slot");
        assert!(
            err.to_string().contains("out of bounds")
                || matches!(err, SyncError::RolledBack { .. })
        );
        assert!(map.served().values().all(|(len, _)| *len == 300));
    }
}

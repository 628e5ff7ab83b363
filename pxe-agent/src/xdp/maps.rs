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

use std::collections::{BTreeMap, HashMap};

use aya::maps::{Array, HashMap as BpfHashMap, MapData, MapError};
use pxe_ebpf_common::{BODY_WHOLE, HostRecord, MacKey, NO_BODY, ReplyBody};

use crate::dhcp::template::Compiled;

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

/// What the maps hold: the host entries as written (body slots resolved)
/// and the body in each slot a host uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Installed {
    pub hosts: BTreeMap<MacKey, HostRecord>,
    slots: Vec<Option<ReplyBody>>,
    index: HashMap<ReplyBody, u32>,
}

impl Installed {
    /// What `maps` hold, read back (an adopted pin, or after a failed undo):
    /// the bodies are those the host entries use.
    pub fn read(maps: &Maps) -> Installed {
        let hosts: BTreeMap<MacKey, HostRecord> =
            maps.hosts.iter().filter_map(Result::ok).collect();
        let mut installed = Installed {
            hosts,
            ..Installed::default()
        };
        let used: Vec<u32> = installed.used_slots();
        for slot in used {
            if let Ok(body) = maps.bodies.get(&slot, 0) {
                installed.set_slot(slot, body);
            }
        }
        installed
    }

    /// Host entries.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// Body slots in use.
    pub fn bodies(&self) -> usize {
        self.index.len()
    }

    /// The body in `slot`.
    pub fn body(&self, slot: u32) -> Option<&ReplyBody> {
        self.slots.get(slot as usize)?.as_ref()
    }

    /// The same as a compiled inventory, to sync back to.
    pub fn compiled(&self) -> Compiled {
        let used = self.used_slots();
        let bodies = used
            .iter()
            .filter_map(|slot| self.body(*slot).copied())
            .collect();
        let index = |slot: u32| used.binary_search(&slot).map_or(NO_BODY, |i| i as u32);
        let hosts = self
            .hosts
            .iter()
            .map(|(key, record)| {
                let mut record = *record;
                for b in &mut record.bodies {
                    if *b != NO_BODY {
                        *b = index(*b & !BODY_WHOLE) | (*b & BODY_WHOLE);
                    }
                }
                (*key, record)
            })
            .collect();
        Compiled { hosts, bodies }
    }

    fn used_slots(&self) -> Vec<u32> {
        let mut used: Vec<u32> = self
            .hosts
            .values()
            .flat_map(|h| h.bodies)
            .filter(|b| *b != NO_BODY)
            .map(|b| b & !BODY_WHOLE)
            .collect();
        used.sort_unstable();
        used.dedup();
        used
    }

    fn set_slot(&mut self, slot: u32, body: ReplyBody) {
        let i = slot as usize;
        if self.slots.len() <= i {
            self.slots.resize(i + 1, None);
        }
        self.slots[i] = Some(body);
        self.index.insert(body, slot);
    }

    /// Forgets the bodies no host entry uses: their slots are free for the
    /// next sync.
    fn drop_unused(&mut self) {
        let used = self.used_slots();
        for (slot, body) in self.slots.iter_mut().enumerate() {
            if body.is_some() && used.binary_search(&(slot as u32)).is_err() {
                if let Some(b) = body.take() {
                    self.index.remove(&b);
                }
            }
        }
        while self.slots.last().is_some_and(Option::is_none) {
            self.slots.pop();
        }
    }
}

/// Makes the maps hold exactly `desired`; `current` is what they hold and
/// becomes what they hold after (unchanged on failure).
pub fn sync(
    map: &mut impl Entries,
    current: &mut Installed,
    desired: &Compiled,
) -> Result<SyncReport, SyncError> {
    let mut report = SyncReport::default();
    let mut next = current.clone();
    // Bodies: where each of `desired.bodies` goes.
    let mut slot_of = Vec::with_capacity(desired.bodies.len());
    let mut free = 0u32;
    for body in &desired.bodies {
        if let Some(slot) = next.index.get(body) {
            slot_of.push(*slot);
            continue;
        }
        while next.body(free).is_some() {
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
        next.set_slot(free, *body);
        slot_of.push(free);
    }
    let resolve = |record: &HostRecord| {
        let mut out = *record;
        for b in &mut out.bodies {
            if *b != NO_BODY {
                *b = slot_of[(*b & !BODY_WHOLE) as usize] | (*b & BODY_WHOLE);
            }
        }
        out
    };
    // What was done to host entries, in order, so that it can be undone.
    let mut done: Vec<&MacKey> = Vec::new();
    let result = (|| {
        for key in current
            .hosts
            .keys()
            .filter(|k| !desired.hosts.contains_key(k))
        {
            map.delete(key)?;
            done.push(key);
            report.removed += 1;
        }
        for (key, record) in &desired.hosts {
            let record = resolve(record);
            if current.hosts.get(key) == Some(&record) {
                report.unchanged += 1;
                continue;
            }
            map.put(key, &record)?;
            next.hosts.insert(*key, record);
            done.push(key);
            report.written += 1;
        }
        Ok(())
    })();
    let Err(source) = result else {
        next.hosts.retain(|k, _| desired.hosts.contains_key(k));
        next.drop_unused();
        *current = next;
        return Ok(report);
    };
    // Newly added keys go first, so that restoring the old ones never
    // meets a full map.
    done.sort_by_key(|k| current.hosts.contains_key(k));
    for key in done {
        let undone = match current.hosts.get(key) {
            Some(old) => map.put(key, old),
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
        sync(&mut map, &mut installed, &old).expect("fits");
        let before = map.served();
        let snapshot = installed.clone();
        // Hosts 0..4 change, 4..8 go, 8..20 come: past the capacity.
        let mut new = compiled(0..4, 2, 301);
        new.hosts.extend(compiled(8..20, 1, 301).hosts);
        let err = sync(&mut map, &mut installed, &new).expect_err("past capacity");
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
        let report = sync(&mut map, &mut installed, &smaller).expect("fits");
        assert_eq!((report.written, report.removed, report.bodies), (8, 4, 1));
        assert_eq!(map.hosts.len(), 8);
        assert!(map.served().values().all(|(len, _)| *len == 301));
    }

    #[test]
    fn a_new_body_never_goes_into_a_slot_a_host_still_uses() {
        let mut map = Bounded::new(100, 2);
        let mut installed = Installed::default();
        sync(&mut map, &mut installed, &compiled(0..4, 1, 300)).expect("fits");
        // Every host moves to a new body: slot 1, while slot 0 is in use.
        let report = sync(&mut map, &mut installed, &compiled(0..4, 1, 302)).expect("fits");
        assert_eq!((report.bodies, report.written), (1, 4));
        assert!(map.hosts.values().all(|h| h.bodies[1] == 1));
        assert_eq!(installed.bodies(), 1);
        // Slot 0 is free again; both slots in use would not fit a third.
        let report = sync(&mut map, &mut installed, &compiled(0..4, 1, 303)).expect("fits");
        assert_eq!(report.bodies, 1);
        assert!(map.hosts.values().all(|h| h.bodies[1] == 0));
    }

    #[test]
    fn a_change_of_one_host_writes_only_its_entry() {
        let mut map = Bounded::new(100, 4);
        let mut installed = Installed::default();
        sync(&mut map, &mut installed, &compiled(0..50, 1, 300)).expect("fits");
        let mut changed = compiled(0..50, 1, 300);
        changed
            .hosts
            .get_mut(&MacKey::new([2, 0, 0, 0, 0, 7]))
            .expect("host 7")
            .yiaddr = [10, 0, 7, 9];
        let report = sync(&mut map, &mut installed, &changed).expect("fits");
        assert_eq!(report.map_writes(), 1, "{report:?}");
        assert_eq!(report.unchanged, 49);
    }

    #[test]
    fn bodies_past_the_slots_are_refused_before_any_host_changes() {
        let mut map = Bounded::new(100, 1);
        let mut installed = Installed::default();
        sync(&mut map, &mut installed, &compiled(0..4, 1, 300)).expect("fits");
        let err =
            sync(&mut map, &mut installed, &compiled(0..4, 1, 301)).expect_err("no free slot");
        assert!(
            err.to_string().contains("out of bounds")
                || matches!(err, SyncError::RolledBack { .. })
        );
        assert!(map.served().values().all(|(len, _)| *len == 300));
    }
}

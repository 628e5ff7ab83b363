//! Applies a compiled inventory to the hosts map without a gap, and all of
//! it or none of it.
//!
//! Entries no longer wanted are deleted first (freeing room in a map near
//! its capacity), then new and changed entries are written (a hash-map
//! update swaps the whole element, so readers see the old reply or the new
//! one, never a mix). A host present in both versions is answered
//! throughout. When a write fails midway, everything done so far is undone,
//! so the map holds the previous inventory again and the caller can keep
//! serving it in both paths.

use aya::maps::{HashMap, MapData, MapError};
use pxe_ebpf_common::{HostKey, ReplyTemplate};

use crate::dhcp::template::Templates;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub written: usize,
    pub removed: usize,
    pub unchanged: usize,
}

/// A sync that failed, and whether the map is back as it was.
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

/// Something the hosts map can be told to do; a trait so the undo logic is
/// tested without a kernel.
pub trait Entries {
    fn put(&mut self, key: &HostKey, value: &ReplyTemplate) -> Result<(), MapError>;
    fn delete(&mut self, key: &HostKey) -> Result<(), MapError>;
}

impl Entries for HashMap<MapData, HostKey, ReplyTemplate> {
    fn put(&mut self, key: &HostKey, value: &ReplyTemplate) -> Result<(), MapError> {
        self.insert(key, value, 0)
    }

    fn delete(&mut self, key: &HostKey) -> Result<(), MapError> {
        match self.remove(key) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

pub fn sync(
    map: &mut impl Entries,
    current: &Templates,
    desired: &Templates,
) -> Result<SyncReport, SyncError> {
    let mut report = SyncReport::default();
    // What was done, in order, so that it can be undone.
    let mut done: Vec<&HostKey> = Vec::new();
    let result = (|| {
        for key in current.keys().filter(|k| !desired.contains_key(k)) {
            map.delete(key)?;
            done.push(key);
            report.removed += 1;
        }
        for (key, value) in desired {
            if current.get(key).is_some_and(|old| same(old, value)) {
                report.unchanged += 1;
                continue;
            }
            map.put(key, value)?;
            done.push(key);
            report.written += 1;
        }
        Ok(())
    })();
    let Err(source) = result else {
        return Ok(report);
    };
    // Newly added keys go first, so that restoring the old ones never
    // meets a full map.
    done.sort_by_key(|k| current.contains_key(k));
    for key in done {
        let undone = match current.get(key) {
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

fn same(a: &ReplyTemplate, b: &ReplyTemplate) -> bool {
    a.server_ip == b.server_ip
        && a.yiaddr == b.yiaddr
        && a.subnet == b.subnet
        && a.netmask == b.netmask
        && a.csum_offer == b.csum_offer
        && a.csum_ack == b.csum_ack
        && a.len == b.len
        && a.msg_type_off == b.msg_type_off
        && a.server_mac == b.server_mac
        && a.payload[..a.len as usize] == b.payload[..b.len as usize]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use pxe_ebpf_common::BootClass;

    use super::*;

    /// A map with a capacity, failing like the kernel's past it.
    struct Bounded {
        entries: BTreeMap<HostKey, ReplyTemplate>,
        capacity: usize,
    }

    impl Entries for Bounded {
        fn put(&mut self, key: &HostKey, value: &ReplyTemplate) -> Result<(), MapError> {
            if !self.entries.contains_key(key) && self.entries.len() >= self.capacity {
                return Err(MapError::SyscallError(aya::sys::SyscallError {
                    call: "bpf_map_update_elem",
                    io_error: std::io::Error::from_raw_os_error(libc::E2BIG),
                }));
            }
            self.entries.insert(*key, *value);
            Ok(())
        }

        fn delete(&mut self, key: &HostKey) -> Result<(), MapError> {
            self.entries.remove(key);
            Ok(())
        }
    }

    fn equal(a: &Templates, b: &Templates) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|((ka, va), (kb, vb))| ka == kb && same(va, vb))
    }

    fn templates(range: std::ops::Range<u8>, yiaddr_last: u8) -> Templates {
        range
            .map(|i| {
                let mut t = ReplyTemplate::zeroed();
                t.yiaddr = [10, 0, i, yiaddr_last];
                t.len = 300;
                (HostKey::new([2, 0, 0, 0, 0, i], BootClass::Bios), t)
            })
            .collect()
    }

    #[test]
    fn a_failed_write_puts_the_whole_previous_inventory_back() {
        let old = templates(0..8, 1);
        let mut map = Bounded {
            entries: old.clone(),
            capacity: 10,
        };
        // Hosts 0..4 change, 4..8 go, 8..20 come: past the capacity.
        let mut new = templates(0..4, 2);
        new.extend(templates(8..20, 1));
        let err = sync(&mut map, &old, &new).expect_err("past capacity");
        assert!(matches!(err, SyncError::RolledBack { .. }), "{err}");
        assert!(
            equal(&map.entries, &old),
            "the map is not the previous inventory"
        );
        // What fits applies whole.
        let smaller: Templates = templates(0..4, 2)
            .into_iter()
            .chain(templates(8..12, 1))
            .collect();
        let report = sync(&mut map, &old, &smaller).expect("fits");
        assert!(equal(&map.entries, &smaller));
        assert_eq!((report.written, report.removed), (8, 4));
    }
}

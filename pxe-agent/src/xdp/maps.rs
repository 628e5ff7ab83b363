//! Applies a compiled inventory to the hosts map without a gap.
//!
//! New and changed entries are written first (a hash-map update swaps the
//! whole element, so readers see the old reply or the new one, never a mix),
//! then entries no longer wanted are deleted. A host present in both versions
//! is answered throughout.

use aya::maps::{HashMap, MapData, MapError};
use pxe_ebpf_common::{HostKey, ReplyTemplate};

use crate::dhcp::template::Templates;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub written: usize,
    pub removed: usize,
    pub unchanged: usize,
}

pub fn sync(
    map: &mut HashMap<MapData, HostKey, ReplyTemplate>,
    current: &Templates,
    desired: &Templates,
) -> Result<SyncReport, MapError> {
    let mut report = SyncReport::default();
    for (key, value) in desired {
        if current.get(key).is_some_and(|old| same(old, value)) {
            report.unchanged += 1;
            continue;
        }
        map.insert(key, value, 0)?;
        report.written += 1;
    }
    for key in current.keys().filter(|k| !desired.contains_key(k)) {
        match map.remove(key) {
            Ok(()) | Err(MapError::KeyNotFound) => report.removed += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(report)
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

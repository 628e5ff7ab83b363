//! The kernel side of `pxe-agent trace`: the XDP program's filter of traced
//! MACs (`TRACED`, `TRACE_GATE`) and the reader of its `TRACE` ring, which
//! turns verdict records into trace events.

use std::sync::{Arc, Mutex};

use aya::maps::{Array, HashMap, MapData, RingBuf};
use pxe_ebpf_common::{Counter, TraceKey, TraceRecord};
use tokio::io::unix::AsyncFd;
use tracing::warn;

use crate::{
    clock::Clocks,
    mac::MacAddr,
    shutdown::Shutdown,
    sync::lock,
    trace::{Hub, KernelFilter, TracePath},
};

/// The traced MACs and the gate counting them.
type Maps = (HashMap<MapData, TraceKey, u8>, Array<MapData, u32>);

/// The program's trace maps; the hub calls it as watchers come and go.
pub struct TraceFilter {
    maps: Mutex<Maps>,
}

impl TraceFilter {
    pub fn new(traced: HashMap<MapData, TraceKey, u8>, gate: Array<MapData, u32>) -> TraceFilter {
        TraceFilter {
            maps: Mutex::new((traced, gate)),
        }
    }
}

impl TraceFilter {
    /// Forgets every traced MAC and closes the gate.
    pub fn clear(&self) -> Result<(), aya::maps::MapError> {
        let mut maps = lock(&self.maps);
        let (macs, gate) = &mut *maps;
        gate.set(0, 0, 0)?;
        let keys: Vec<TraceKey> = macs.keys().filter_map(Result::ok).collect();
        for key in keys {
            match macs.remove(&key) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl KernelFilter for TraceFilter {
    fn set(&self, mac: MacAddr, traced: bool, count: usize) -> Result<(), String> {
        let mut maps = lock(&self.maps);
        let (macs, gate) = &mut *maps;
        let key = TraceKey::new(mac.0);
        // The gate opens after the MAC is in and closes before it leaves,
        // so the program never looks for a MAC it was not told about.
        let count = u32::try_from(count).unwrap_or(u32::MAX);
        if traced {
            macs.insert(key, 1, 0).map_err(|e| e.to_string())?;
            gate.set(0, count, 0).map_err(|e| e.to_string())
        } else {
            gate.set(0, count, 0).map_err(|e| e.to_string())?;
            macs.remove(&key).map_err(|e| e.to_string())
        }
    }
}

/// Reads verdict records into `hub` until shutdown.
pub async fn stream(ring: RingBuf<MapData>, hub: Arc<Hub>, mut shutdown: Shutdown) {
    // SAFETY: the ring owns its map's file descriptor, which stays open
    // and unreplaced while the AsyncFd owns the ring.
    let mut ring = match unsafe { AsyncFd::register(ring) } {
        Ok(fd) => fd,
        Err(e) => {
            warn!(error = %e, "cannot poll the XDP trace ring: no XDP verdicts in traces");
            return;
        }
    };
    loop {
        let mut ready = tokio::select! {
            () = shutdown.stopped() => return,
            ready = ring.readable_mut() => match ready {
                Ok(r) => r,
                Err(e) => {
                    warn!(error = %e, "polling the XDP trace ring failed");
                    return;
                }
            },
        };
        let clocks = Clocks::now();
        let ring = ready.get_inner_mut();
        while let Some(item) = ring.next() {
            if let Some(record) = decode(&item) {
                publish(&hub, &record, &clocks);
            }
        }
        ready.clear_ready();
    }
}

fn decode(bytes: &[u8]) -> Option<TraceRecord> {
    if bytes.len() < size_of::<TraceRecord>() {
        return None;
    }
    // SAFETY: TraceRecord is repr(C) plain bytes and the length was checked;
    // read_unaligned makes no alignment assumption.
    Some(unsafe { bytes.as_ptr().cast::<TraceRecord>().read_unaligned() })
}

fn publish(hub: &Hub, r: &TraceRecord, clocks: &Clocks) {
    let counter = Counter::ALL.get(r.counter as usize).copied();
    let what = counter.map_or("unknown", Counter::name);
    hub.publish_at(
        clocks.wall_ms_of(r.at_ns),
        MacAddr(r.mac),
        TracePath::Xdp,
        what,
        || detail(r, counter),
    );
}

/// XDP action values (`enum xdp_action`, include/uapi/linux/bpf.h).
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;

fn detail(r: &TraceRecord, counter: Option<Counter>) -> String {
    let xid = u32::from_be_bytes(r.xid);
    match r.action {
        XDP_TX => {
            let what = if counter == Some(Counter::TxAck) {
                "ack"
            } else {
                "offer"
            };
            format!(
                "XDP_TX {what} {} xid {xid:#010x}",
                std::net::Ipv4Addr::from(r.yiaddr)
            )
        }
        XDP_PASS => format!("XDP_PASS to the slow path, xid {xid:#010x}"),
        XDP_DROP => format!("XDP_DROP, xid {xid:#010x}"),
        other => format!("action {other}, xid {xid:#010x}"),
    }
}

/// The filters of several interfaces' programs, set together. Removing is
/// tried on every interface; adding is all or nothing: when one interface
/// refuses the MAC, those that took it give it back, so no program is left
/// tracing a MAC nobody watches.
impl KernelFilter for Vec<TraceFilter> {
    fn set(&self, mac: MacAddr, traced: bool, count: usize) -> Result<(), String> {
        if !traced {
            let mut first = Ok(());
            for filter in self {
                let result = filter.set(mac, false, count);
                if first.is_ok() {
                    first = result;
                }
            }
            return first;
        }
        for (at, filter) in self.iter().enumerate() {
            if let Err(e) = filter.set(mac, true, count) {
                for done in &self[..at] {
                    let _ = done.set(mac, false, count.saturating_sub(1));
                }
                return Err(e);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(counter: Counter, action: u32) -> TraceRecord {
        TraceRecord {
            at_ns: 0,
            counter: counter as u32,
            action,
            xid: [0xde, 0xad, 0xbe, 0xef],
            yiaddr: [10, 66, 1, 10],
            mac: [0x52, 0x54, 0, 0x12, 0x34, 0x56],
            _pad: [0; 2],
        }
    }

    #[test]
    fn verdicts_read_as_counter_action_and_xid() {
        let tx = record(Counter::TxAck, XDP_TX);
        assert_eq!(
            detail(&tx, Some(Counter::TxAck)),
            "XDP_TX ack 10.66.1.10 xid 0xdeadbeef"
        );
        let pass = record(Counter::PassIpxe, XDP_PASS);
        assert_eq!(
            detail(&pass, Some(Counter::PassIpxe)),
            "XDP_PASS to the slow path, xid 0xdeadbeef"
        );
        // SAFETY: a repr(C) struct of plain bytes viewed as bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts((&raw const tx).cast::<u8>(), size_of::<TraceRecord>())
        };
        assert_eq!(decode(bytes), Some(tx));
        assert_eq!(decode(&bytes[..8]), None);
    }
}

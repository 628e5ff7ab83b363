//! Per-MAC tracing of the fast path's verdicts for `pxe-agent trace`.
//!
//! The agent puts the MACs an operator watches in `TRACED` and their number
//! in `TRACE_GATE`. With nothing traced a request costs one array read
//! here; otherwise the program looks the request's chaddr (then its
//! Ethernet source, which VLAN-tagged or IP-option frames still carry at a
//! fixed place) up in `TRACED` and, on a match, writes a `TraceRecord` to
//! the `TRACE` ring. Owns no decision: the verdict is made before.

use aya_ebpf::{
    helpers::generated::bpf_ktime_get_ns,
    macros::map,
    maps::{Array, HashMap, RingBuf},
    programs::XdpContext,
};
use pxe_ebpf_common::{
    Counter, MAX_TRACED, TRACE_BYTES, TraceKey, TraceRecord,
    bootp::{OFF_CHADDR, OFF_XID, OFF_YIADDR},
};

use crate::parse::{L2L3L4, load};

#[map(name = "TRACED")]
static TRACED: HashMap<TraceKey, u8> = HashMap::with_max_entries(MAX_TRACED, 0);

#[map(name = "TRACE_GATE")]
static TRACE_GATE: Array<u32> = Array::with_max_entries(1, 0);

/// Written with a wake-up (flag 0), unlike `EVENTS`: only traced MACs get
/// here, and a trace is read live.
#[map(name = "TRACE")]
static TRACE: RingBuf = RingBuf::with_byte_size(TRACE_BYTES, 0);

/// Records `counter` and `action` for the request in `ctx` if its MAC is
/// traced; `ctx` holds the reply already when the action is `XDP_TX`
/// (which keeps xid and chaddr in place).
#[inline(always)]
pub fn verdict(ctx: &XdpContext, action: u32, counter: Counter) {
    match TRACE_GATE.get(0) {
        Some(traced) if *traced != 0 => {}
        _ => return,
    }
    // xid .. chaddr of the BOOTP header, when the frame has one.
    let (xid, yiaddr, chaddr) = match load::<{ OFF_CHADDR + 6 }>(ctx, L2L3L4) {
        Some(b) => (
            [b[OFF_XID], b[OFF_XID + 1], b[OFF_XID + 2], b[OFF_XID + 3]],
            [
                b[OFF_YIADDR],
                b[OFF_YIADDR + 1],
                b[OFF_YIADDR + 2],
                b[OFF_YIADDR + 3],
            ],
            Some([
                b[OFF_CHADDR],
                b[OFF_CHADDR + 1],
                b[OFF_CHADDR + 2],
                b[OFF_CHADDR + 3],
                b[OFF_CHADDR + 4],
                b[OFF_CHADDR + 5],
            ]),
        ),
        None => ([0; 4], [0; 4], None),
    };
    let traced = |mac: [u8; 6]| TRACED.get_ptr(&TraceKey::new(mac)).is_some();
    let mac = match chaddr {
        Some(mac) if traced(mac) => mac,
        _ => match load::<6>(ctx, 6) {
            Some(src) if traced(src) => src,
            _ => return,
        },
    };
    let record = TraceRecord {
        // SAFETY: a helper without arguments or side effects.
        at_ns: unsafe { bpf_ktime_get_ns() },
        counter: counter as u32,
        action,
        xid,
        yiaddr,
        mac,
        _pad: [0; 2],
    };
    if TRACE.output::<TraceRecord>(&record, 0).is_err() {
        crate::count(Counter::TraceLost);
    }
}

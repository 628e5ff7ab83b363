//! XDP entry point of the DHCP fast path and its per-exit counters.
//!
//! Answers DHCPDISCOVER and DHCPREQUEST for hosts in `HOSTS` by splicing the
//! reply the agent compiled (a shared body from `BODIES` and the host's own
//! record); everything it cannot answer exactly goes to the
//! kernel stack (`XDP_PASS`) with a counter saying why. Parsing lives in
//! `parse`, the in-place rewrite in `reply`, checksums in `csum`.
#![no_std]
#![no_main]

mod csum;
mod parse;
mod reply;
mod trace;

use aya_ebpf::{
    bindings::xdp_action,
    macros::{map, xdp},
    maps::{Array, DevMap, HashMap, PerCpuArray, RingBuf},
    programs::XdpContext,
};
use pxe_ebpf_common::{
    Counter, DEFAULT_BODIES, DEFAULT_HOSTS, EVENTS_BYTES, HostRecord, MacKey, ReplyBody,
    ServedEvent,
};

/// `BPF_F_NO_PREALLOC`: memory follows the hosts in the map rather than the
/// capacity the agent gave it (headroom for reloads).
const BPF_F_NO_PREALLOC: u32 = 1;

/// One record per host port; the agent sets the capacity at load time.
#[map(name = "HOSTS")]
static HOSTS: HashMap<MacKey, HostRecord> =
    HashMap::with_max_entries(DEFAULT_HOSTS, BPF_F_NO_PREALLOC);

/// The shared reply bodies, by slot; the agent sets the capacity at load
/// time.
#[map(name = "BODIES")]
static BODIES: Array<ReplyBody> = Array::with_max_entries(DEFAULT_BODIES, 0);

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::Count as u32, 0);

/// Replies sent, for the agent's boot-progress view.
#[map(name = "EVENTS")]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// `BPF_RB_NO_WAKEUP`: the agent drains the ring on a timer; waking it for
/// every reply would cost more than the reply itself.
const BPF_RB_NO_WAKEUP: u64 = 1;

/// Streams a sent reply; a full ring loses the event, not the reply.
#[inline(always)]
pub fn served(event: &ServedEvent) {
    if EVENTS
        .output::<ServedEvent>(event, BPF_RB_NO_WAKEUP)
        .is_err()
    {
        count(Counter::EventLost);
    }
}

#[inline(always)]
pub(crate) fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: a per-CPU slot is only touched by this CPU, with preemption off.
        unsafe { *slot += 1 };
    }
}

/// What the fast path did with a frame.
pub enum Outcome {
    /// Not DHCP to a server: the stack's business, not counted.
    NotDhcp,
    /// A reply was written in place.
    Tx(Counter),
    /// Left for the slow path, with the reason.
    Pass(Counter),
    Drop(Counter),
}

#[xdp]
pub fn pxe_xdp(ctx: XdpContext) -> u32 {
    let (action, counter) = match reply::handle(&ctx) {
        Outcome::NotDhcp => return xdp_action::XDP_PASS,
        Outcome::Tx(c) => (xdp_action::XDP_TX, c),
        Outcome::Pass(c) => (xdp_action::XDP_PASS, c),
        Outcome::Drop(c) => (xdp_action::XDP_DROP, c),
    };
    count(Counter::Rx);
    count(counter);
    trace::verdict(&ctx, action, counter);
    action
}

/// Passes everything. Attached to the far end of a veth pair it makes that
/// end run NAPI, without which frames sent there with XDP_TX are lost (seen
/// on 6.18 with GRO on as well); `pxe-agent veth-peer` attaches it.
#[xdp]
pub fn pxe_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

/// The interface [`pxe_redirect`] sends to, in slot 0.
#[map(name = "REDIRECT_TO")]
static REDIRECT_TO: DevMap = DevMap::with_max_entries(1, 0);

/// Sends every frame on to the interface in `REDIRECT_TO`. Frames a veth
/// end receives this way arrive at its peer as XDP frames in page buffers,
/// the way a NIC hands frames to XDP, rather than as socket buffers that
/// veth must copy first; `pxe-agent veth-peer --redirect-to` attaches it.
#[xdp]
pub fn pxe_redirect(_ctx: XdpContext) -> u32 {
    REDIRECT_TO
        .redirect(0, 0)
        .unwrap_or(xdp_action::XDP_ABORTED)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

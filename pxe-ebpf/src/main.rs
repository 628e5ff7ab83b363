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

use core::ptr::write_volatile;

use aya_ebpf::{
    bindings::xdp_action,
    helpers::generated::{bpf_get_smp_processor_id, bpf_jiffies64, bpf_ktime_get_coarse_ns},
    macros::{map, xdp},
    maps::{Array, DevMap, HashMap, PerCpuArray},
    programs::XdpContext,
};
use pxe_ebpf_common::{
    BPF_F_MMAPABLE, Counter, DEFAULT_BODIES, DEFAULT_HOSTS, EVENT_SLOTS, HostRecord, MacKey,
    ReplyBody, ServedEvent,
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

/// Replies sent, for the agent's boot-progress view, and REQUESTs dropped
/// for naming another server (see `ServedEvent`): `EVENT_SLOTS` a CPU;
/// the agent sizes it to the possible CPUs at load time (with room after
/// them for its read marks) and maps it into its memory.
///
/// A slot array rather than a BPF ring buffer: a ring buffer write takes
/// a lock and three helper calls, which cost a fifth of a reply; here an
/// event is a few stores into memory that only this CPU writes. A reader
/// that falls behind loses the oldest events (and counts them) instead of
/// the newest.
#[map(name = "EVENTS")]
static EVENTS: Array<ServedEvent> = Array::with_max_entries(EVENT_SLOTS, BPF_F_MMAPABLE);

/// Events written by each CPU so far; the next goes to slot `head % EVENT_SLOTS`.
#[map(name = "EVENT_HEADS")]
static EVENT_HEADS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Streams a sent reply (or a dropped REQUEST) into this CPU's event slots.
#[inline(always)]
pub fn served(event: &ServedEvent) {
    let Some(head) = EVENT_HEADS.get_ptr_mut(0) else {
        count(Counter::EventLost);
        return;
    };
    // SAFETY: a helper without arguments or side effects (inlined by the
    // verifier).
    let cpu = unsafe { bpf_get_smp_processor_id() };
    // SAFETY: a per-CPU slot is only touched by this CPU, with preemption off.
    let n = unsafe { *head };
    let index = cpu
        .wrapping_mul(EVENT_SLOTS)
        .wrapping_add(n as u32 & (EVENT_SLOTS - 1));
    // A CPU past the slots the agent made room for loses its events.
    let Some(slot) = EVENTS.get_ptr_mut(index) else {
        count(Counter::EventLost);
        return;
    };
    let mut event = *event;
    event.seq = (n as u32).wrapping_add(1);
    // SAFETY: `ServedEvent` is 24 plain bytes, three aligned words.
    let words: [u64; 3] = unsafe { core::mem::transmute(event) };
    let to = slot.cast::<u64>();
    // SAFETY: `slot` is this CPU's map value, 24 bytes and 8-byte aligned.
    // Volatile, in this order: the sequence is cleared first and set by the
    // last store, so a reader never takes a half-written slot for a whole
    // one (see `ServedEvent::seq`).
    unsafe {
        write_volatile(&raw mut (*slot).seq, 0);
        write_volatile(to, words[0]);
        write_volatile(to.add(1), words[1]);
        write_volatile(to.add(2), words[2]);
        *head = n + 1;
    }
}

/// A CPU's last reading of the coarse clock and the jiffy it was taken in.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CoarseClock {
    jiffies: u64,
    ns: u64,
}

#[map(name = "CLOCK")]
static CLOCK: PerCpuArray<CoarseClock> = PerCpuArray::with_max_entries(1, 0);

/// `bpf_ktime_get_coarse_ns`, read at most once a jiffy on each CPU.
///
/// The coarse clock only moves at the tick, so within a jiffy a cached
/// reading is the reading; where a CPU sees the new jiffy before the tick
/// has moved the clock, the cached time is one tick early, within the
/// clock's own resolution. `bpf_jiffies64` is inlined by the verifier; the
/// clock is a helper call, which costs as much as a tenth of a reply.
#[inline(always)]
pub fn coarse_ns() -> u64 {
    // SAFETY: helpers without arguments or side effects.
    let now = unsafe { bpf_jiffies64() };
    let Some(clock) = CLOCK.get_ptr_mut(0) else {
        // SAFETY: as above.
        return unsafe { bpf_ktime_get_coarse_ns() };
    };
    // SAFETY: a per-CPU slot is only touched by this CPU, with preemption off.
    unsafe {
        if (*clock).jiffies != now {
            (*clock).ns = bpf_ktime_get_coarse_ns();
            (*clock).jiffies = now;
        }
        (*clock).ns
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

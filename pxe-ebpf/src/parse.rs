//! Bounds-checked reads of the request: headers through packet pointers,
//! DHCP options copied a chunk at a time by `bpf_xdp_load_bytes` into
//! per-CPU scratch memory and walked there.
//!
//! Owns the bounded option walk; decides nothing.

use core::{
    mem::{MaybeUninit, size_of},
    ptr::{read_volatile, write_volatile},
};

use aya_ebpf::{
    helpers::generated::bpf_xdp_load_bytes, macros::map, maps::PerCpuArray, programs::XdpContext,
};
use pxe_ebpf_common::{VendorClass, bootp::*};

/// Ethernet + IPv4 without options + UDP.
pub const L2L3L4: usize = 14 + 20 + 8;
/// Options walked before giving up; a PXE DISCOVER carries about ten.
const MAX_OPTIONS: usize = 64;

/// Pointer to a `T` at `off`, or `None` when it would end past the packet.
#[inline(always)]
pub fn ptr_at<T>(ctx: &XdpContext, off: usize) -> Option<*mut T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + off + size_of::<T>() > end {
        return None;
    }
    Some((start + off) as *mut T)
}

/// Copies `N` bytes at `off` out of the packet.
///
/// The buffer is not zeroed first: the helper takes uninitialised memory
/// and fills all of it or fails, and zeroing would cost a call to `memset`.
#[inline(always)]
pub fn load<const N: usize>(ctx: &XdpContext, off: usize) -> Option<[u8; N]> {
    let mut buf = MaybeUninit::<[u8; N]>::uninit();
    // SAFETY: the helper bounds-checks against the packet and writes N
    // bytes into `buf`.
    let rc = unsafe { bpf_xdp_load_bytes(ctx.ctx, off as u32, buf.as_mut_ptr().cast(), N as u32) };
    // SAFETY: on success the helper wrote all N bytes.
    if rc == 0 {
        Some(unsafe { buf.assume_init() })
    } else {
        None
    }
}

/// What the fast path needs from the options of a request. Filled in
/// `Scratch`, not on the stack (see there). Eight-byte aligned and sized so
/// that `clear` empties it with three stores.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct Options {
    pub msg_type: u8,
    /// `VendorClass` as a number (see `vendor`).
    vendor: u8,
    /// User class (77) or iPXE's option 175 present.
    pub ipxe: bool,
    /// Relay agent information (82) present.
    pub relay_info: bool,
    has_requested_ip: bool,
    has_server_id: bool,
    has_arch: bool,
    /// Client machine identifier (97) present: a proxy answer echoes it.
    pub client_uuid: bool,
    requested_ip: [u8; 4],
    server_id: [u8; 4],
    arch: u16,
    _pad2: [u8; 6],
}
const _: () = assert!(size_of::<Options>() == 24);

impl Options {
    /// Every field zero: no option seen. Three word stores, where assigning
    /// an empty value compiles to a call to `memset`.
    #[inline(always)]
    fn clear(&mut self) {
        let words = (self as *mut Options).cast::<u64>();
        // SAFETY: `Options` is 24 bytes, 8-byte aligned, and all zeros is a
        // valid value of every field.
        unsafe {
            write_volatile(words, 0);
            write_volatile(words.add(1), 0);
            write_volatile(words.add(2), 0);
        }
    }

    pub fn requested_ip(&self) -> Option<[u8; 4]> {
        self.has_requested_ip.then_some(self.requested_ip)
    }

    pub fn server_id(&self) -> Option<[u8; 4]> {
        self.has_server_id.then_some(self.server_id)
    }

    pub fn arch(&self) -> Option<u16> {
        self.has_arch.then_some(self.arch)
    }

    pub fn vendor(&self) -> VendorClass {
        match self.vendor {
            1 => VendorClass::PxeClient,
            2 => VendorClass::HttpClient,
            3 => VendorClass::Other,
            _ => VendorClass::None,
        }
    }
}

fn vendor_code(v: VendorClass) -> u8 {
    match v {
        VendorClass::None => 0,
        VendorClass::PxeClient => 1,
        VendorClass::HttpClient => 2,
        VendorClass::Other => 3,
    }
}

/// Bytes of options one `bpf_xdp_load_bytes` brings in. A PXE request's
/// options end well inside it, so a walk usually costs one helper call.
const CHUNK: usize = 256;
/// Bytes an option's reading needs from its start: code, length and the
/// longest value prefix looked at (`HTTPClient`).
const REACH: usize = 2 + 10;
/// Where the options start in a frame.
const START: usize = L2L3L4 + OFF_OPTIONS;
// A chunk ending at the message's end starts inside the frame.
const _: () = assert!(CHUNK <= START);

/// Per-CPU working memory of the walk.
///
/// Verifier workaround: the walk's state lives in a map, not on the stack
/// or in registers. Seen options on the stack make every combination a
/// distinct verifier state at the loop head; a position in registers has
/// ranges that decide comparisons, so the verifier tracks it exactly and
/// tells apart every sequence of option lengths. Either blows the
/// 1M-instruction budget. Map memory is not tracked, so the loop body is
/// verified a few times per pass instead.
#[repr(C)]
struct Scratch {
    opts: Options,
    /// Frame offsets: the next option, the start of the window in `buf`,
    /// the end of the message. Read and written volatile (see `Scratch`),
    /// so the compiler does not keep them in registers across passes.
    off: usize,
    base: usize,
    end: usize,
    /// `CHUNK` frame bytes from `base`, then slack: indices are masked to
    /// below `CHUNK`, so a read of up to `REACH` bytes at one stays inside
    /// without a further check.
    buf: [u8; CHUNK + REACH],
}

impl Scratch {
    #[inline(always)]
    fn position(&self) -> (usize, usize, usize) {
        // SAFETY: reads of fields of a live reference.
        unsafe {
            (
                read_volatile(&self.off),
                read_volatile(&self.base),
                read_volatile(&self.end),
            )
        }
    }

    #[inline(always)]
    fn set_position(&mut self, off: usize, base: usize, end: usize) {
        // SAFETY: writes to fields of a live, exclusive reference.
        unsafe {
            write_volatile(&mut self.off, off);
            write_volatile(&mut self.base, base);
            write_volatile(&mut self.end, end);
        }
    }

    /// Copies the `CHUNK` frame bytes at `base` into `buf`.
    ///
    /// The length is a constant: a variable one would need its own bound
    /// proof, and `window` keeps a whole chunk inside the frame.
    #[inline(always)]
    fn fill(&mut self, ctx: &XdpContext, base: usize) -> Result<(), OptionsError> {
        // SAFETY: the helper bounds-checks against the packet and writes
        // CHUNK bytes into `buf`, which holds more.
        let rc = unsafe {
            bpf_xdp_load_bytes(
                ctx.ctx,
                base as u32,
                self.buf.as_mut_ptr().cast(),
                CHUNK as u32,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(OptionsError::Malformed)
        }
    }

    /// The `N` bytes of `buf` at `at`.
    #[inline(always)]
    fn bytes<const N: usize>(&self, at: usize) -> &[u8; N] {
        let Some(b) = self.buf[at..].first_chunk() else {
            unreachable!("`at` is below CHUNK + 2 and N at most REACH - 2");
        };
        b
    }
}

#[map(name = "SCRATCH")]
static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

pub enum OptionsError {
    /// Runs past the message, bad lengths, no end option.
    Malformed,
    /// More options than the walk reads, or option overload (52).
    Unsupported,
}

/// Start of a window holding `off` and what follows it: `off` itself, or
/// `CHUNK` before the message's `end` when that comes sooner, so a whole
/// chunk lies inside the frame (`START` bytes precede the options).
#[inline(always)]
fn window(off: usize, end: usize) -> usize {
    off.min(end - CHUNK)
}

/// Walks the options from `START` to `end` (frame offsets), copying them
/// out of the frame a `CHUNK` at a time.
///
/// The window moves only when an option's first `REACH` bytes would leave
/// it before the message ends, so all that is read of an option is in it.
#[inline(always)]
pub fn walk_options(ctx: &XdpContext, end: usize) -> Result<Options, OptionsError> {
    // What the first pass would find, checked before `window` relies on it.
    if end <= START {
        return Err(OptionsError::Malformed);
    }
    let slot = SCRATCH.get_ptr_mut(0).ok_or(OptionsError::Unsupported)?;
    // SAFETY: a per-CPU slot is only touched by this CPU, with preemption off.
    let s = unsafe { &mut *slot };
    s.opts.clear();
    let base = window(START, end);
    s.fill(ctx, base)?;
    s.set_position(START, base, end);
    for _ in 0..MAX_OPTIONS {
        let (off, mut base, end) = s.position();
        if off >= end {
            return Err(OptionsError::Malformed);
        }
        if off + REACH > base + CHUNK && base + CHUNK < end {
            base = window(off, end);
            s.fill(ctx, base)?;
        }
        // Verifier workaround: the mask bounds the index into `buf`; it
        // changes nothing, as `off` lies in the window.
        let at = (off - base) & (CHUNK - 1);
        let code = s.buf[at];
        if code == OPT_END {
            return Ok(s.opts);
        }
        if code == OPT_PAD {
            s.set_position(off + 1, base, end);
            continue;
        }
        if off + 2 > end {
            return Err(OptionsError::Malformed);
        }
        let len = s.buf[at + 1] as usize;
        if off + 2 + len > end {
            return Err(OptionsError::Malformed);
        }
        s.set_position(off + 2 + len, base, end);
        let value = at + 2;
        match code {
            OPT_MESSAGE_TYPE if len == 1 => s.opts.msg_type = s.buf[value],
            OPT_REQUESTED_IP if len == 4 => {
                s.opts.requested_ip = *s.bytes(value);
                s.opts.has_requested_ip = true;
            }
            OPT_SERVER_ID if len == 4 => {
                s.opts.server_id = *s.bytes(value);
                s.opts.has_server_id = true;
            }
            OPT_CLIENT_ARCH if len >= 2 => {
                s.opts.arch = u16::from_be_bytes(*s.bytes(value));
                s.opts.has_arch = true;
            }
            OPT_VENDOR_CLASS => {
                let v = if len >= HTTP_CLIENT.len() {
                    VendorClass::from_prefix(s.bytes::<10>(value))
                } else if len >= PXE_CLIENT.len() {
                    VendorClass::from_prefix(s.bytes::<9>(value))
                } else {
                    VendorClass::Other
                };
                s.opts.vendor = vendor_code(v);
            }
            OPT_USER_CLASS | OPT_IPXE_ENCAP => s.opts.ipxe = true,
            OPT_RELAY_AGENT_INFO => s.opts.relay_info = true,
            OPT_CLIENT_UUID => s.opts.client_uuid = true,
            OPT_OVERLOAD => return Err(OptionsError::Unsupported),
            // A malformed known option (wrong length) is not ours to guess at.
            OPT_MESSAGE_TYPE | OPT_REQUESTED_IP | OPT_SERVER_ID | OPT_CLIENT_ARCH => {
                return Err(OptionsError::Malformed);
            }
            _ => {}
        }
    }
    Err(OptionsError::Unsupported)
}

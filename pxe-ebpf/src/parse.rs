//! Bounds-checked reads of the request: headers through packet pointers,
//! DHCP options through `bpf_xdp_load_bytes`.
//!
//! Owns the bounded option walk; decides nothing.

use core::mem::size_of;

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
#[inline(always)]
pub fn load<const N: usize>(ctx: &XdpContext, off: usize) -> Option<[u8; N]> {
    let mut buf = [0u8; N];
    // SAFETY: the helper bounds-checks against the packet and writes at most N
    // bytes into `buf`.
    let rc = unsafe { bpf_xdp_load_bytes(ctx.ctx, off as u32, buf.as_mut_ptr().cast(), N as u32) };
    if rc == 0 { Some(buf) } else { None }
}

/// What the fast path needs from the options of a request.
///
/// Lives in a per-CPU scratch map, not on the stack. Verifier workaround:
/// values on the stack make every combination of seen options a distinct
/// verifier state at the loop head and the walk blows the 1M-instruction
/// budget; map memory is not tracked, so the loop body is verified a few
/// times instead of once per combination.
#[repr(C)]
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
    _pad: u8,
    requested_ip: [u8; 4],
    server_id: [u8; 4],
    arch: u16,
    _pad2: [u8; 2],
}

impl Options {
    const EMPTY: Options = Options {
        msg_type: 0,
        vendor: 0,
        ipxe: false,
        relay_info: false,
        has_requested_ip: false,
        has_server_id: false,
        has_arch: false,
        _pad: 0,
        requested_ip: [0; 4],
        server_id: [0; 4],
        arch: 0,
        _pad2: [0; 2],
    };

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

#[map(name = "SCRATCH")]
static SCRATCH: PerCpuArray<Options> = PerCpuArray::with_max_entries(1, 0);

pub enum OptionsError {
    /// Runs past the message, bad lengths, no end option.
    Malformed,
    /// More options than the walk reads, or option overload (52).
    Unsupported,
}

/// Walks the options from `start` to `end` (packet offsets).
///
/// Verifier workaround: offsets are only ever helper arguments, never
/// packet-pointer arithmetic, so the loop needs no per-step range proof.
#[inline(always)]
pub fn walk_options(ctx: &XdpContext, start: usize, end: usize) -> Result<Options, OptionsError> {
    let slot = SCRATCH.get_ptr_mut(0).ok_or(OptionsError::Unsupported)?;
    // SAFETY: a per-CPU slot is only touched by this CPU, with preemption off.
    let o = unsafe { &mut *slot };
    *o = Options::EMPTY;
    let mut off = start;
    for _ in 0..MAX_OPTIONS {
        if off >= end {
            return Err(OptionsError::Malformed);
        }
        let [code] = load::<1>(ctx, off).ok_or(OptionsError::Malformed)?;
        if code == OPT_END {
            return Ok(*o);
        }
        if code == OPT_PAD {
            off += 1;
            continue;
        }
        let [_, len] = load::<2>(ctx, off).ok_or(OptionsError::Malformed)?;
        let value = off + 2;
        let len = len as usize;
        off = value + len;
        if off > end {
            return Err(OptionsError::Malformed);
        }
        match code {
            OPT_MESSAGE_TYPE if len == 1 => {
                o.msg_type = load::<1>(ctx, value).ok_or(OptionsError::Malformed)?[0];
            }
            OPT_REQUESTED_IP if len == 4 => {
                o.requested_ip = load::<4>(ctx, value).ok_or(OptionsError::Malformed)?;
                o.has_requested_ip = true;
            }
            OPT_SERVER_ID if len == 4 => {
                o.server_id = load::<4>(ctx, value).ok_or(OptionsError::Malformed)?;
                o.has_server_id = true;
            }
            OPT_CLIENT_ARCH if len >= 2 => {
                o.arch = u16::from_be_bytes(load::<2>(ctx, value).ok_or(OptionsError::Malformed)?);
                o.has_arch = true;
            }
            OPT_VENDOR_CLASS => {
                let v = if len >= HTTP_CLIENT.len() {
                    VendorClass::from_prefix(
                        &load::<10>(ctx, value).ok_or(OptionsError::Malformed)?,
                    )
                } else if len >= PXE_CLIENT.len() {
                    VendorClass::from_prefix(&load::<9>(ctx, value).ok_or(OptionsError::Malformed)?)
                } else {
                    VendorClass::Other
                };
                o.vendor = vendor_code(v);
            }
            OPT_USER_CLASS | OPT_IPXE_ENCAP => o.ipxe = true,
            OPT_RELAY_AGENT_INFO => o.relay_info = true,
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

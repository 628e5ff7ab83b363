//! Bounds-checked reads of the request: headers through packet pointers,
//! DHCP options through `bpf_xdp_load_bytes`.
//!
//! Owns the bounded option walk; decides nothing.

use core::mem::size_of;

use aya_ebpf::{helpers::generated::bpf_xdp_load_bytes, programs::XdpContext};
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
pub struct Options {
    pub msg_type: u8,
    pub requested_ip: Option<[u8; 4]>,
    pub server_id: Option<[u8; 4]>,
    pub arch: Option<u16>,
    pub vendor: VendorClass,
    /// User class (77) or iPXE's option 175 present.
    pub ipxe: bool,
    /// Relay agent information (82) present.
    pub relay_info: bool,
}

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
    let mut o = Options {
        msg_type: 0,
        requested_ip: None,
        server_id: None,
        arch: None,
        vendor: VendorClass::None,
        ipxe: false,
        relay_info: false,
    };
    let mut off = start;
    for _ in 0..MAX_OPTIONS {
        if off >= end {
            return Err(OptionsError::Malformed);
        }
        let [code] = load::<1>(ctx, off).ok_or(OptionsError::Malformed)?;
        if code == OPT_END {
            return Ok(o);
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
            OPT_REQUESTED_IP if len == 4 => o.requested_ip = load::<4>(ctx, value),
            OPT_SERVER_ID if len == 4 => o.server_id = load::<4>(ctx, value),
            OPT_CLIENT_ARCH if len >= 2 => {
                o.arch = load::<2>(ctx, value).map(u16::from_be_bytes);
            }
            OPT_VENDOR_CLASS => {
                o.vendor = if len >= HTTP_CLIENT.len() {
                    let v = load::<10>(ctx, value).ok_or(OptionsError::Malformed)?;
                    VendorClass::from_prefix(&v)
                } else if len >= PXE_CLIENT.len() {
                    let v = load::<9>(ctx, value).ok_or(OptionsError::Malformed)?;
                    VendorClass::from_prefix(&v)
                } else {
                    VendorClass::Other
                };
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

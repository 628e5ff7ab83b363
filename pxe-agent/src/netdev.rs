//! Facts about the provisioning interface: its addresses and MAC.

use std::{
    ffi::CStr,
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

#[derive(Debug, thiserror::Error)]
pub enum NetdevError {
    #[error("interface {iface} not found: {source}")]
    NotFound {
        iface: String,
        source: std::io::Error,
    },
    #[error("interface {iface} has a malformed MAC address {value:?}")]
    BadMac { iface: String, value: String },
    #[error("interface {iface} has a malformed MTU {value:?}")]
    BadMtu { iface: String, value: String },
    #[error("interface {iface} has no IPv4 address: give --server-ip")]
    NoIpv4 { iface: String },
    #[error("failed to list interface addresses: {0}")]
    Getifaddrs(std::io::Error),
}

/// The MAC address of `iface`, from sysfs.
pub fn mac_of(iface: &str) -> Result<[u8; 6], NetdevError> {
    let raw = fs::read_to_string(format!("/sys/class/net/{iface}/address")).map_err(|source| {
        NetdevError::NotFound {
            iface: iface.to_string(),
            source,
        }
    })?;
    let value = raw.trim();
    let bad = || NetdevError::BadMac {
        iface: iface.to_string(),
        value: value.to_string(),
    };
    let mut mac = [0u8; 6];
    let mut parts = value.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next().ok_or_else(bad)?, 16).map_err(|_| bad())?;
    }
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok(mac)
}

/// The MTU of `iface`, from sysfs.
pub fn mtu_of(iface: &str) -> Result<u32, NetdevError> {
    let raw = fs::read_to_string(format!("/sys/class/net/{iface}/mtu")).map_err(|source| {
        NetdevError::NotFound {
            iface: iface.to_string(),
            source,
        }
    })?;
    raw.trim().parse().map_err(|_| NetdevError::BadMac {
        iface: iface.to_string(),
        value: raw.trim().to_string(),
    })
}

/// The kernel's index of interface `iface`.
pub fn index_of(iface: &str) -> std::io::Result<u32> {
    let name = std::ffi::CString::new(iface)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(index)
}

/// The IPv4 address of `iface` (the first, when it has several).
pub fn ipv4_of(iface: &str) -> Result<Ipv4Addr, NetdevError> {
    addresses_of(iface)?
        .into_iter()
        .find_map(|ip| match ip {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => None,
        })
        .ok_or_else(|| NetdevError::NoIpv4 {
            iface: iface.to_string(),
        })
}

/// The first IPv6 address of `iface` that a URL can name: not link-local
/// (which would need the client's own zone index), not loopback.
pub fn ipv6_of(iface: &str) -> Result<Option<Ipv6Addr>, NetdevError> {
    Ok(addresses_of(iface)?.into_iter().find_map(|ip| match ip {
        IpAddr::V6(ip) if !ip.is_unicast_link_local() && !ip.is_loopback() => Some(ip),
        _ => None,
    }))
}

/// The addresses of `iface`, in the kernel's order.
fn addresses_of(iface: &str) -> Result<Vec<IpAddr>, NetdevError> {
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list that freeifaddrs releases below.
    if unsafe { libc::getifaddrs(&mut addrs) } != 0 {
        return Err(NetdevError::Getifaddrs(std::io::Error::last_os_error()));
    }
    let mut found = Vec::new();
    let mut cur = addrs;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) };
        if !ifa.ifa_addr.is_null() && name.to_bytes() == iface.as_bytes() {
            // SAFETY: ifa_addr is non-null; sa_family says how to read it.
            match i32::from(unsafe { (*ifa.ifa_addr).sa_family }) {
                libc::AF_INET => {
                    // SAFETY: an AF_INET address is a sockaddr_in.
                    let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                    found.push(IpAddr::from(Ipv4Addr::from(u32::from_be(
                        sin.sin_addr.s_addr,
                    ))));
                }
                libc::AF_INET6 => {
                    // SAFETY: an AF_INET6 address is a sockaddr_in6.
                    let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                    found.push(IpAddr::from(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
                }
                _ => {}
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: releases the list allocated above, exactly once.
    unsafe { libc::freeifaddrs(addrs) };
    Ok(found)
}

/// How an XDP program is attached to an interface (`IFLA_XDP_ATTACHED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAttach {
    /// In the driver (`XDP_ATTACHED_DRV`).
    Native,
    /// In the kernel's generic path, after the socket buffer is built
    /// (`XDP_ATTACHED_SKB`).
    Generic,
    /// On the NIC (`XDP_ATTACHED_HW`).
    Offload,
}

impl XdpAttach {
    /// Its name in `/metrics` and the status: native, generic, offload.
    pub fn as_str(self) -> &'static str {
        match self {
            XdpAttach::Native => "native",
            XdpAttach::Generic => "generic",
            XdpAttach::Offload => "offload",
        }
    }
}

/// The id of the XDP program attached to `iface`, if any, as the kernel
/// reports it (rtnetlink `RTM_GETLINK`, attribute `IFLA_XDP`). This sees a
/// program detached behind the agent's back, which its own handles cannot.
pub fn xdp_program_id(iface: &str) -> std::io::Result<Option<u32>> {
    Ok(xdp_attached(iface)?.first().map(|(id, _)| *id))
}

/// The XDP programs attached to `iface` and how, as the kernel reports
/// them (rtnetlink `RTM_GETLINK`, attribute `IFLA_XDP`): none, one, or one
/// per mode when programs run in several.
pub fn xdp_attached(iface: &str) -> std::io::Result<Vec<(u32, XdpAttach)>> {
    use std::io::{Error, ErrorKind};
    const IFLA_XDP: u16 = 43;
    const IFLA_XDP_ATTACHED: u16 = 2;
    let index = index_of(iface)?;
    // SAFETY: plain socket creation; the fd is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(Error::last_os_error());
    }
    // SAFETY: a fresh fd nothing else owns.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let raw = std::os::fd::AsRawFd::as_raw_fd(&sock);
    // nlmsghdr (16 bytes) + ifinfomsg (16 bytes).
    let mut req = [0u8; 32];
    req[0..4].copy_from_slice(&32u32.to_ne_bytes());
    req[4..6].copy_from_slice(&libc::RTM_GETLINK.to_ne_bytes());
    req[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    req[20..24].copy_from_slice(&(index as i32).to_ne_bytes());
    // SAFETY: sends `req` on an open socket; the kernel is the default peer.
    if unsafe { libc::send(raw, req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(Error::last_os_error());
    }
    let mut buf = vec![0u8; 16 << 10];
    // SAFETY: receives into `buf`, at most its length.
    let n = unsafe { libc::recv(raw, buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(Error::last_os_error());
    }
    let msg = &buf[..n as usize];
    let bad = || Error::new(ErrorKind::InvalidData, "malformed rtnetlink answer");
    let kind = u16_at(msg, 4).ok_or_else(bad)?;
    if kind == libc::NLMSG_ERROR as u16 {
        let code = msg.get(16..20).ok_or_else(bad)?;
        let code = i32::from_ne_bytes([code[0], code[1], code[2], code[3]]);
        return Err(Error::from_raw_os_error(-code));
    }
    let len = msg.get(0..4).ok_or_else(bad)?;
    let len = (u32::from_ne_bytes([len[0], len[1], len[2], len[3]]) as usize).min(msg.len());
    let top = attrs(msg.get(32..len).ok_or_else(bad)?);
    let Some((_, xdp)) = top.into_iter().find(|(t, _)| *t == IFLA_XDP) else {
        return Ok(Vec::new());
    };
    let nested = attrs(xdp);
    let attached = nested
        .iter()
        .find(|(t, _)| *t == IFLA_XDP_ATTACHED)
        .and_then(|(_, v)| v.first().copied())
        .unwrap_or(0);
    let id_of = |kind: u16| {
        nested
            .iter()
            .find(|(t, _)| *t == kind)
            .and_then(|(_, v)| v.get(..4))
            .map(|v| u32::from_ne_bytes([v[0], v[1], v[2], v[3]]))
    };
    Ok(xdp_modes(attached, id_of))
}

/// The `(program id, mode)` pairs of an `IFLA_XDP` attribute: its
/// `IFLA_XDP_ATTACHED` value and a lookup of its nested ids. With programs
/// in several modes (`XDP_ATTACHED_MULTI`) the kernel sends one id per mode
/// instead of `IFLA_XDP_PROG_ID`.
fn xdp_modes(attached: u8, id_of: impl Fn(u16) -> Option<u32>) -> Vec<(u32, XdpAttach)> {
    const IFLA_XDP_PROG_ID: u16 = 4;
    const IFLA_XDP_DRV_PROG_ID: u16 = 5;
    const IFLA_XDP_SKB_PROG_ID: u16 = 6;
    const IFLA_XDP_HW_PROG_ID: u16 = 7;
    let one = |mode| id_of(IFLA_XDP_PROG_ID).map(|id| vec![(id, mode)]);
    match attached {
        1 => one(XdpAttach::Native),
        2 => one(XdpAttach::Generic),
        3 => one(XdpAttach::Offload),
        4 => Some(
            [
                (IFLA_XDP_DRV_PROG_ID, XdpAttach::Native),
                (IFLA_XDP_SKB_PROG_ID, XdpAttach::Generic),
                (IFLA_XDP_HW_PROG_ID, XdpAttach::Offload),
            ]
            .into_iter()
            .filter_map(|(kind, mode)| Some((id_of(kind)?, mode)))
            .collect(),
        ),
        _ => None,
    }
    .unwrap_or_default()
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2).map(|v| u16::from_ne_bytes([v[0], v[1]]))
}

/// The netlink attributes in `b`: type (flags masked off) and value.
fn attrs(b: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while let (Some(alen), Some(atype)) = (u16_at(b, at), u16_at(b, at + 2)) {
        let alen = usize::from(alen);
        if alen < 4 || at + alen > b.len() {
            break;
        }
        out.push((atype & 0x3fff, &b[at + 4..at + alen]));
        at += (alen + 3) & !3;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_modes_come_from_the_attached_kind_and_its_ids() {
        // Single mode: IFLA_XDP_PROG_ID (4) carries the id.
        let single = |kind: u16| (kind == 4).then_some(7);
        assert_eq!(xdp_modes(1, single), [(7, XdpAttach::Native)]);
        assert_eq!(xdp_modes(2, single), [(7, XdpAttach::Generic)]);
        assert_eq!(xdp_modes(3, single), [(7, XdpAttach::Offload)]);
        assert!(xdp_modes(0, single).is_empty());
        // Several modes: one id per mode (driver 5, generic 6).
        let multi = |kind: u16| match kind {
            5 => Some(8),
            6 => Some(9),
            _ => None,
        };
        assert_eq!(
            xdp_modes(4, multi),
            [(8, XdpAttach::Native), (9, XdpAttach::Generic)]
        );
    }
}

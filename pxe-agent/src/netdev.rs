//! Facts about the provisioning interface: its IPv4 address and MAC.

use std::{ffi::CStr, fs, net::Ipv4Addr};

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

/// The first IPv4 address of `iface`.
pub fn ipv4_of(iface: &str) -> Result<Ipv4Addr, NetdevError> {
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list that freeifaddrs releases below.
    if unsafe { libc::getifaddrs(&mut addrs) } != 0 {
        return Err(NetdevError::Getifaddrs(std::io::Error::last_os_error()));
    }
    let mut found = None;
    let mut cur = addrs;
    while !cur.is_null() && found.is_none() {
        // SAFETY: `cur` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) };
        if !ifa.ifa_addr.is_null() && name.to_bytes() == iface.as_bytes() {
            // SAFETY: ifa_addr is non-null; sa_family says how to read it.
            if i32::from(unsafe { (*ifa.ifa_addr).sa_family }) == libc::AF_INET {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                found = Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: releases the list allocated above, exactly once.
    unsafe { libc::freeifaddrs(addrs) };
    found.ok_or_else(|| NetdevError::NoIpv4 {
        iface: iface.to_string(),
    })
}

//! Ethernet/IPv4/UDP framing for DHCP replies sent as raw frames, to clients
//! that have no address yet (RFC 2131 section 4.1). Owns header layout and
//! checksums; not the DHCP payload. And how a peer's address off a socket
//! is read ([`canonical`]).

use std::net::{IpAddr, Ipv4Addr};

/// A peer address as policy knows it: an IPv4-mapped IPv6 address (a
/// dual-stack socket's view of an IPv4 peer) is the IPv4 address.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

pub const ETH_HLEN: usize = 14;
pub const IPV4_HLEN: usize = 20;
pub const UDP_HLEN: usize = 8;
const ETH_P_IP: u16 = 0x0800;
const IPPROTO_UDP: u8 = 17;

/// One end of a UDP datagram on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub mac: [u8; 6],
    pub ip: Ipv4Addr,
    pub port: u16,
}

/// An Ethernet frame carrying `payload` in IPv4/UDP, with the IPv4 header
/// checksum and the UDP checksum (RFC 768) filled in.
pub fn udp_frame(src: Endpoint, dst: Endpoint, payload: &[u8]) -> Vec<u8> {
    let udp_len = (UDP_HLEN + payload.len()) as u16;
    let ip_len = IPV4_HLEN as u16 + udp_len;
    let mut f = Vec::with_capacity(ETH_HLEN + usize::from(ip_len));
    f.extend_from_slice(&dst.mac);
    f.extend_from_slice(&src.mac);
    f.extend_from_slice(&ETH_P_IP.to_be_bytes());

    let mut ip = [0u8; IPV4_HLEN];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[8] = 64;
    ip[9] = IPPROTO_UDP;
    ip[12..16].copy_from_slice(&src.ip.octets());
    ip[16..20].copy_from_slice(&dst.ip.octets());
    let ip_sum = !fold(sum(&ip));
    ip[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    f.extend_from_slice(&ip);

    let mut udp = [0u8; UDP_HLEN];
    udp[0..2].copy_from_slice(&src.port.to_be_bytes());
    udp[2..4].copy_from_slice(&dst.port.to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    let pseudo =
        sum(&src.ip.octets()) + sum(&dst.ip.octets()) + u32::from(IPPROTO_UDP) + u32::from(udp_len);
    let udp_sum = match !fold(pseudo + sum(&udp) + sum(payload)) {
        0 => 0xffff,
        s => s,
    };
    udp[6..8].copy_from_slice(&udp_sum.to_be_bytes());
    f.extend_from_slice(&udp);
    f.extend_from_slice(payload);
    f
}

/// Sum of big-endian 16-bit words, an odd last byte padded with zero.
pub fn sum(bytes: &[u8]) -> u32 {
    bytes
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum()
}

/// Folds carries into 16 bits (RFC 1071).
pub fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_verify_to_all_ones() {
        let src = Endpoint {
            mac: [2, 0, 0, 0, 0, 1],
            ip: Ipv4Addr::new(10, 66, 0, 1),
            port: 67,
        };
        let dst = Endpoint {
            mac: [0xff; 6],
            ip: Ipv4Addr::BROADCAST,
            port: 68,
        };
        let f = udp_frame(src, dst, b"odd-length payload!");
        assert_eq!(fold(sum(&f[14..34])), 0xffff);
        let udp_len = f.len() - 34;
        let pseudo = sum(&f[26..34]) + 17 + udp_len as u32;
        assert_eq!(fold(pseudo + sum(&f[34..])), 0xffff);
        assert_eq!(&f[0..6], &[0xff; 6]);
        assert_eq!(u16::from_be_bytes([f[16], f[17]]) as usize, f.len() - 14);
    }
}

//! An `AF_PACKET` socket bound to one interface: how the slow path reaches
//! clients that have no address yet, and how tests and load generators put
//! frames on a link exactly as firmware does.

use std::{
    io,
    os::fd::{AsFd, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    time::Duration,
};

const ETH_P_ALL: u16 = 0x0003;
/// `PACKET_IGNORE_OUTGOING` (Linux 4.20): skip the frames this socket sent.
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

pub struct RawSocket {
    fd: OwnedFd,
}

impl AsFd for RawSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl RawSocket {
    /// A socket on `iface` (in the calling thread's network namespace) that
    /// receives every frame on it.
    pub fn open(iface: &str) -> io::Result<RawSocket> {
        RawSocket::bind(iface, ETH_P_ALL.to_be())
    }

    /// A socket that only sends: bound to no protocol, nothing is queued for
    /// reading, so it costs nothing per received frame.
    pub fn send_only(iface: &str) -> io::Result<RawSocket> {
        RawSocket::bind(iface, 0)
    }

    fn bind(iface: &str, proto: u16) -> io::Result<RawSocket> {
        // SAFETY: plain socket(2); the fd is owned below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let ifindex = crate::netdev::index_of(iface)?;
        // SAFETY: an all-zero sockaddr_ll is valid; fields are set below.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = proto;
        addr.sll_ifindex = ifindex as i32;
        // SAFETY: addr is a valid sockaddr_ll of the size given.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RawSocket { fd })
    }

    /// Stops receiving the frames this socket sends itself.
    pub fn ignore_outgoing(&self) -> io::Result<()> {
        self.set_option(libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    }

    /// Sets the receive buffer, past `rmem_max` (needs CAP_NET_ADMIN).
    pub fn set_recv_buffer(&self, bytes: i32) -> io::Result<()> {
        self.set_option(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, bytes)
    }

    /// Frames the kernel dropped for want of buffer since the last call.
    pub fn drops(&self) -> io::Result<u32> {
        let mut stats = libc::tpacket_stats {
            tp_packets: 0,
            tp_drops: 0,
        };
        let mut len = size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: stats and len describe a writable tpacket_stats.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&raw mut stats).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(stats.tp_drops)
        }
    }

    fn set_option(
        &self,
        level: libc::c_int,
        name: libc::c_int,
        value: libc::c_int,
    ) -> io::Result<()> {
        // SAFETY: value is a c_int of the size given.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                (&raw const value).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: frame is a valid buffer of its length.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Receives one frame, or `None` after `timeout`.
    pub fn recv(&self, timeout: Duration) -> io::Result<Option<Vec<u8>>> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis().max(1) as i32) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        if rc == 0 {
            return Ok(None);
        }
        let mut buf = vec![0u8; 2048];
        // SAFETY: buf is writable for its length.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(Some(buf))
    }
}

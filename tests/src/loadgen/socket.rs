//! The load generator's `AF_PACKET` sockets: non-blocking, listening on one
//! interface and blind to their own frames, sending on the same or another
//! one, in batches (`sendmmsg`, `recvmmsg`) so the generator spends its
//! core on exchanges rather than on system calls.

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::Duration,
};

const ETH_P_ALL: u16 = 0x0003;
/// `PACKET_IGNORE_OUTGOING` (Linux 4.20): the socket skips frames it sent.
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
/// `PACKET_QDISC_BYPASS` (Linux 3.14): frames go straight to the driver.
const PACKET_QDISC_BYPASS: libc::c_int = 20;
const RECV_BUFFER: libc::c_int = 16 << 20;
/// Frames per `sendmmsg` or `recvmmsg` at most.
pub const BATCH: usize = 64;
/// Room for one received frame; DHCP answers are far smaller.
const FRAME_ROOM: usize = 2048;

pub struct PacketSocket {
    /// Receives, and sends unless `send_fd` is set.
    fd: OwnedFd,
    /// Sends on another interface; it receives nothing (protocol 0).
    send_fd: Option<OwnedFd>,
    /// Frames waiting for the next [`PacketSocket::flush`]; only the first
    /// `queued` are live, the rest are reused buffers.
    tx: Vec<Vec<u8>>,
    queued: usize,
    /// The last batch received: `rx_lens[i]` bytes of `rx[i]`.
    rx: Vec<[u8; FRAME_ROOM]>,
    rx_lens: [usize; BATCH],
}

impl PacketSocket {
    /// Listens on `iface`; sends there too, or on `send_iface` if given.
    pub fn open(iface: &str, send_iface: Option<&str>) -> io::Result<PacketSocket> {
        let send_fd = match send_iface {
            Some(send) if send != iface => {
                let fd = open_fd(0)?;
                bind(&fd, send, 0)?;
                set_option(&fd, libc::SOL_PACKET, PACKET_QDISC_BYPASS, 1)?;
                Some(fd)
            }
            _ => None,
        };
        let socket = PacketSocket {
            fd: open_fd(ETH_P_ALL)?,
            send_fd,
            tx: (0..BATCH).map(|_| Vec::with_capacity(1024)).collect(),
            queued: 0,
            rx: vec![[0; FRAME_ROOM]; BATCH],
            rx_lens: [0; BATCH],
        };
        let fd = &socket.fd;
        set_option(fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)?;
        set_option(fd, libc::SOL_PACKET, PACKET_QDISC_BYPASS, 1)?;
        // SO_RCVBUFFORCE goes past rmem_max (CAP_NET_ADMIN); a short burst
        // of answers must not be lost in the generator's own buffer.
        set_option(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, RECV_BUFFER)
            .or_else(|_| set_option(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, RECV_BUFFER))?;
        bind(fd, iface, ETH_P_ALL)?;
        Ok(socket)
    }

    /// Queues one frame, written by `fill` into a cleared buffer; sends the
    /// queue first when it is full.
    pub fn push(&mut self, fill: impl FnOnce(&mut Vec<u8>)) -> io::Result<()> {
        if self.queued == BATCH {
            self.flush()?;
        }
        let buf = &mut self.tx[self.queued];
        buf.clear();
        fill(buf);
        self.queued += 1;
        Ok(())
    }

    /// Sends every queued frame. A full transmit queue loses a frame like a
    /// busy wire would; its exchange then counts as dropped.
    pub fn flush(&mut self) -> io::Result<()> {
        let mut iov: [libc::iovec; BATCH] = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; BATCH];
        // SAFETY: a zeroed mmsghdr is valid (no name, no control data).
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for (i, frame) in self.tx[..self.queued].iter_mut().enumerate() {
            iov[i] = libc::iovec {
                iov_base: frame.as_mut_ptr().cast(),
                iov_len: frame.len(),
            };
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        let mut sent = 0;
        while sent < self.queued {
            // SAFETY: msgs[sent..queued] point at live iovecs over live
            // buffers, all of which outlive the call.
            let n = unsafe {
                libc::sendmmsg(
                    self.send_fd.as_ref().unwrap_or(&self.fd).as_raw_fd(),
                    msgs[sent..].as_mut_ptr(),
                    (self.queued - sent) as libc::c_uint,
                    0,
                )
            };
            if n > 0 {
                sent += n as usize;
                continue;
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::ENOBUFS | libc::EAGAIN | libc::ENOMEM) => sent += 1,
                Some(libc::EINTR) => {}
                _ => return Err(err),
            }
        }
        self.queued = 0;
        Ok(())
    }

    /// Receives the frames already queued, up to [`BATCH`]; returns how
    /// many (read them with [`PacketSocket::received`]).
    pub fn recv_batch(&mut self) -> io::Result<usize> {
        let mut iov: [libc::iovec; BATCH] = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; BATCH];
        // SAFETY: a zeroed mmsghdr is valid (no name, no control data).
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for (i, buf) in self.rx.iter_mut().enumerate() {
            iov[i] = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: every mmsghdr points at a live iovec over a writable
        // buffer of the length given, all outliving the call.
        let n = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            return match err.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(err),
            };
        }
        let n = n as usize;
        for (len, msg) in self.rx_lens.iter_mut().zip(&msgs[..n]) {
            *len = (msg.msg_len as usize).min(FRAME_ROOM);
        }
        Ok(n)
    }

    /// Frame `i` of the last batch received.
    pub fn received(&self, i: usize) -> &[u8] {
        &self.rx[i][..self.rx_lens[i]]
    }

    /// Sleeps until a frame is queued or `timeout` passes (to the nanosecond).
    pub fn wait(&self, timeout: Duration) -> io::Result<()> {
        if timeout.is_zero() {
            return Ok(());
        }
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
        };
        // SAFETY: one valid pollfd and a valid timespec; no signal mask.
        let rc = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
        Ok(())
    }
}

/// A non-blocking raw packet socket for `protocol` (host order; 0 receives
/// nothing).
fn open_fd(protocol: u16) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            i32::from(protocol.to_be()),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn set_option(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: value is a c_int of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn bind(fd: &OwnedFd, iface: &str, protocol: u16) -> io::Result<()> {
    let name = CString::new(iface).map_err(io::Error::other)?;
    // SAFETY: name is NUL-terminated.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a zeroed sockaddr_ll is valid; fields set below.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = protocol.to_be();
    addr.sll_ifindex = ifindex as i32;
    // SAFETY: addr is a valid sockaddr_ll of the given size.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

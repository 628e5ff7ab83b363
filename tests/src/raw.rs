//! A raw Ethernet socket inside a network namespace: how tests (and the load
//! generator) put DHCP frames on a veth exactly as a client's firmware would.

use std::{
    ffi::CString,
    fs::File,
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::Duration,
};

/// Runs `f` on a thread that has entered the named network namespace.
/// Sockets made there stay in that namespace when used from elsewhere.
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = File::open(&path)?;
        // SAFETY: setns on this thread only, with a namespace fd we own.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(f())
    })
    .join()
    .map_err(|_| io::Error::other("netns thread panicked"))?
}

/// An `AF_PACKET` socket bound to one interface.
pub struct RawSocket {
    fd: OwnedFd,
}

const ETH_P_ALL: u16 = 0x0003;

impl RawSocket {
    /// Opens a socket on `iface` of the calling thread's namespace.
    pub fn open(iface: &str) -> io::Result<RawSocket> {
        // SAFETY: plain socket(2); the fd is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW,
                i32::from(ETH_P_ALL.to_be()),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let name = CString::new(iface).map_err(io::Error::other)?;
        // SAFETY: name is NUL-terminated.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: zeroed sockaddr_ll is valid; fields set below.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = ETH_P_ALL.to_be();
        addr.sll_ifindex = ifindex as i32;
        // SAFETY: addr is a valid sockaddr_ll of the given size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RawSocket { fd })
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
        let rc = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
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

/// True when `frame` is IPv4/UDP to the DHCP client port.
pub fn is_dhcp_reply(frame: &[u8]) -> bool {
    frame.len() > 42 && frame[12..14] == [0x08, 0x00] && frame[23] == 17 && frame[36..38] == [0, 68]
}

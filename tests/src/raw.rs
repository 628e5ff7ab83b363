//! A raw Ethernet socket inside a network namespace: how tests (and the load
//! generator) put DHCP frames on a veth exactly as a client's firmware would.

use std::{fs::File, io, os::fd::AsRawFd as _};

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

pub use pxe_agent::rawsock::RawSocket;

/// True when `frame` is IPv4/UDP to the DHCP client port.
pub fn is_dhcp_reply(frame: &[u8]) -> bool {
    frame.len() > 42 && frame[12..14] == [0x08, 0x00] && frame[23] == 17 && frame[36..38] == [0, 68]
}

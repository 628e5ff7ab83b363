//! What the request loop tells a peer's running transfer: a read request
//! from the same peer (a repeated or a new one), or that the server is
//! stopping. It owns that news and the ways it wakes the transfer's thread
//! (see `link`, which waits for it):
//!
//! - the bell, an eventfd the transfer polls together with its socket
//!   until its client has answered;
//! - after that, the socket itself: news shuts the socket's receiving side
//!   down, which ends a blocking `recvfrom(2)` on it. Such news is final
//!   (a new request supersedes the transfer, or the server stops), so the
//!   socket is not needed for receiving afterwards. Packets queued before
//!   are still received first.

use std::{
    io,
    net::{Shutdown, UdpSocket},
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    sync::{Arc, Mutex, MutexGuard},
};

use socket2::SockRef;

use crate::sync::lock;

use super::request::ReadRequest;

/// Where the request loop leaves news for one peer's transfers.
#[derive(Debug)]
pub(super) struct Mailbox {
    inbox: Mutex<Inbox>,
    /// An eventfd, readable from a ring until the transfer opens the
    /// mailbox.
    bell: OwnedFd,
}

#[derive(Debug, Default)]
struct Inbox {
    request: Option<ReadRequest>,
    abandoned: bool,
    /// The socket of a transfer that waits in blocking receives.
    attached: Option<Arc<UdpSocket>>,
}

/// News from the request loop.
#[derive(Debug)]
pub(super) enum Mail {
    /// The server is stopping: end the transfer.
    Abandoned,
    /// A read request from the transfer's peer.
    Request(ReadRequest),
}

impl Mailbox {
    pub fn new() -> io::Result<Mailbox> {
        // SAFETY: eventfd(2) takes no pointers; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a new descriptor that nothing else owns.
        let bell = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Mailbox {
            inbox: Mutex::default(),
            bell,
        })
    }

    /// Leaves a read request from the peer. False when one is already
    /// waiting: `request` is then a retransmission and is dropped.
    pub fn deliver(&self, request: ReadRequest) -> bool {
        let mut inbox = self.inbox();
        if inbox.request.is_some() {
            return false;
        }
        inbox.request = Some(request);
        self.wake(&inbox);
        true
    }

    /// Tells the peer's transfers to stop; for good.
    pub fn abandon(&self) {
        let mut inbox = self.inbox();
        inbox.abandoned = true;
        self.wake(&inbox);
    }

    /// Silences the bell and takes the news, abandonment first. The bell
    /// is silenced before the inbox is read, so news left meanwhile rings
    /// it again.
    pub fn open(&self) -> Option<Mail> {
        let mut count = 0u64;
        // SAFETY: reads the eventfd's 8-byte counter into a live u64. It
        // fails with EAGAIN when the bell has not rung, which is fine.
        unsafe {
            libc::read(
                self.bell.as_raw_fd(),
                (&raw mut count).cast(),
                size_of::<u64>(),
            )
        };
        let mut inbox = self.inbox();
        if inbox.abandoned {
            return Some(Mail::Abandoned);
        }
        inbox.request.take().map(Mail::Request)
    }

    /// The bell, to poll for.
    pub fn bell(&self) -> BorrowedFd<'_> {
        self.bell.as_fd()
    }

    /// From now on news also ends blocking receives on `socket`, the
    /// running transfer's; news already waiting does so at once.
    pub fn attach(&self, socket: &Arc<UdpSocket>) {
        let mut inbox = self.inbox();
        inbox.attached = Some(socket.clone());
        if inbox.abandoned || inbox.request.is_some() {
            self.wake(&inbox);
        }
    }

    /// Lets go of the socket given to [`Mailbox::attach`]: its transfer
    /// has ended.
    pub fn detach(&self) {
        self.inbox().attached = None;
    }

    fn wake(&self, inbox: &Inbox) {
        if let Some(socket) = &inbox.attached {
            // Linux shuts an unconnected UDP socket down, waking its
            // receivers, and then reports ENOTCONN; nothing to handle.
            let _ = SockRef::from(socket.as_ref()).shutdown(Shutdown::Read);
        }
        let one = 1u64;
        // SAFETY: writes a live u64 to the eventfd. It can only fail when
        // the counter would pass 2^64 - 2, which rings cannot reach before
        // the transfer opens the mailbox.
        unsafe {
            libc::write(
                self.bell.as_raw_fd(),
                (&raw const one).cast(),
                size_of::<u64>(),
            )
        };
    }

    fn inbox(&self) -> MutexGuard<'_, Inbox> {
        lock(&self.inbox)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn request(name: &str) -> ReadRequest {
        ReadRequest::octet(name)
    }

    #[test]
    fn one_request_waits_and_abandonment_comes_first() {
        let mailbox = Mailbox::new().expect("mailbox");
        assert!(mailbox.open().is_none());
        assert!(mailbox.deliver(request("a")));
        assert!(!mailbox.deliver(request("b")), "one request waits");
        assert!(matches!(mailbox.open(), Some(Mail::Request(r)) if r.file == "a"));
        assert!(mailbox.open().is_none());
        assert!(mailbox.deliver(request("c")));
        mailbox.abandon();
        assert!(matches!(mailbox.open(), Some(Mail::Abandoned)));
        assert!(matches!(mailbox.open(), Some(Mail::Abandoned)));
    }

    #[test]
    fn news_ends_a_blocking_receive_on_the_attached_socket() {
        let mailbox = Arc::new(Mailbox::new().expect("mailbox"));
        let socket = Arc::new(UdpSocket::bind("127.0.0.1:0").expect("bind"));
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        mailbox.attach(&socket);
        let receiver = socket.clone();
        let started = Instant::now();
        let blocked = std::thread::spawn(move || {
            SockRef::from(receiver.as_ref()).recv(&mut [std::mem::MaybeUninit::uninit(); 16])
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(mailbox.deliver(request("next")));
        let received = blocked.join().expect("receiver");
        assert_eq!(received.expect("receive"), 0, "no packet came");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(matches!(mailbox.open(), Some(Mail::Request(_))));
        mailbox.detach();
        assert!(mailbox.inbox().attached.is_none());
    }
}

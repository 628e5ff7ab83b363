//! A transfer's one way of waiting: for a packet on its socket (from its
//! client or a stranger), for news in its mailbox, or for a deadline,
//! whichever comes first. It owns the socket and how the thread blocks on
//! it.
//!
//! - Until the client has answered, the wait is a `ppoll(2)` on the socket
//!   and the mailbox's bell: the client may repeat its request instead,
//!   which the transfer answers and then goes on.
//! - From the client's first packet on ([`Link::settle`]), news can only
//!   end the transfer, and the wait is a blocking `recvfrom(2)` with what
//!   is left until the deadline as its `SO_RCVTIMEO`: a lock-step block
//!   costs one `recvfrom` and one `sendto`, and one wake-up. News ends that
//!   receive by shutting the socket's receiving side down (see `mailbox`).
//!   Before it blocks, the receive may busy-poll for a short while (see
//!   `spin`), which catches a quick answer without a wake-up.

use std::{
    io,
    mem::MaybeUninit,
    net::{SocketAddr, UdpSocket},
    os::fd::AsRawFd,
    sync::Arc,
    time::{Duration, Instant},
};

use socket2::SockRef;

use super::{
    mailbox::{Mail, Mailbox},
    spin::BusyPoll,
};

/// How far the receive timeout set on the socket may be from what is left
/// until the deadline before it is set again (a system call). The kernel
/// counts it in clock ticks anyway.
const TIMEOUT_SLACK: Duration = Duration::from_millis(1);

/// What ended a wait.
#[derive(Debug)]
pub(super) enum Event {
    /// `len` bytes from `from` are in the buffer.
    Packet {
        len: usize,
        from: SocketAddr,
    },
    Mail(Mail),
    Timeout,
}

/// A transfer's socket and mailbox.
pub(super) struct Link<'a> {
    socket: Arc<UdpSocket>,
    mailbox: &'a Mailbox,
    /// Receives block in `recvfrom`; the mailbox can interrupt them.
    settled: bool,
    /// The `SO_RCVTIMEO` set on the socket, if any.
    timeout: Option<Duration>,
    busy_poll: Option<BusyPoll<'a>>,
}

impl<'a> Link<'a> {
    /// `socket` must be in blocking mode.
    pub fn new(socket: UdpSocket, mailbox: &'a Mailbox) -> Link<'a> {
        Link {
            socket: Arc::new(socket),
            mailbox,
            settled: false,
            timeout: None,
            busy_poll: None,
        }
    }

    /// Busy-polls before each blocking receive (once settled).
    pub fn with_busy_poll(mut self, busy_poll: BusyPoll<'a>) -> Link<'a> {
        self.busy_poll = Some(busy_poll);
        self
    }

    pub fn send_to(&self, pkt: &[u8], to: SocketAddr) -> io::Result<usize> {
        self.socket.send_to(pkt, to)
    }

    /// Switches to blocking receives: the client has answered, so the only
    /// news left ends the transfer.
    pub fn settle(&mut self) {
        if !self.settled {
            self.settled = true;
            self.mailbox.attach(&self.socket);
        }
    }

    /// Waits until `deadline` for a packet (received into `buf`) or news.
    /// A packet already queued comes before news and before a passed
    /// deadline.
    pub fn next(&mut self, buf: &mut [u8], deadline: Instant) -> io::Result<Event> {
        loop {
            let event = if self.settled {
                self.receive(buf, deadline)?
            } else {
                self.poll(buf, deadline)?
            };
            if let Some(event) = event {
                return Ok(event);
            }
        }
    }

    /// One blocking receive; `None` when it ended early with nothing to
    /// report (a timeout shorter than what is left).
    fn receive(&mut self, buf: &mut [u8], deadline: Instant) -> io::Result<Option<Event>> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Some(Event::Timeout));
        }
        if self
            .timeout
            .is_none_or(|timeout| timeout.abs_diff(left) > TIMEOUT_SLACK)
        {
            self.socket.set_read_timeout(Some(left))?;
            self.timeout = Some(left);
        }
        if let Some((len, from)) = self
            .busy_poll
            .and_then(|poll| poll.receive(&self.socket, buf, deadline))
        {
            return Ok(Some(Event::Packet { len, from }));
        }
        match recv_from(&self.socket, buf) {
            Ok(Some((len, from))) if len > 0 => Ok(Some(Event::Packet { len, from })),
            // An empty datagram, the timeout, or news that shut the
            // receiving side down.
            result => {
                if let Some(mail) = self.mailbox.open() {
                    return Ok(Some(Event::Mail(mail)));
                }
                match result {
                    Ok(Some((len, from))) => Ok(Some(Event::Packet { len, from })),
                    Ok(None) => Err(shut_down()),
                    Err(err)
                        if matches!(
                            err.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                    {
                        Ok(None)
                    }
                    Err(err) => Err(err),
                }
            }
        }
    }

    /// One `ppoll` on the socket and the bell; `None` when the bell rang
    /// for nothing (news already taken).
    fn poll(&mut self, buf: &mut [u8], deadline: Instant) -> io::Result<Option<Event>> {
        let mut fds =
            [self.socket.as_raw_fd(), self.mailbox.bell().as_raw_fd()].map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = libc::timespec {
            tv_sec: libc::time_t::try_from(left.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: left.subsec_nanos() as libc::c_long,
        };
        // SAFETY: fds and timeout are live for the call and the length of
        // fds is passed along; no signal mask is given.
        let ready = unsafe {
            libc::ppoll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                &timeout,
                std::ptr::null(),
            )
        };
        if ready < 0 {
            let err = io::Error::last_os_error();
            return match err.kind() {
                io::ErrorKind::Interrupted => Ok(None),
                _ => Err(err),
            };
        }
        if fds[0].revents != 0 {
            let (len, from) = recv_from(&self.socket, buf)?.ok_or_else(shut_down)?;
            Ok(Some(Event::Packet { len, from }))
        } else if fds[1].revents != 0 {
            Ok(self.mailbox.open().map(Event::Mail))
        } else {
            Ok(Some(Event::Timeout))
        }
    }
}

/// `recvfrom(2)` into `buf`: the length and the sender of a datagram, or
/// `None` when there was none because the receiving side is shut down.
fn recv_from(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<Option<(usize, SocketAddr)>> {
    // SAFETY: MaybeUninit<u8> has the layout of u8, and recv only writes
    // initialized bytes, so `buf` stays initialized.
    let uninit = unsafe { &mut *(std::ptr::from_mut(buf) as *mut [MaybeUninit<u8>]) };
    let (len, from) = SockRef::from(socket).recv_from(uninit)?;
    Ok(from.as_socket().map(|from| (len, from)))
}

/// A receive that got nothing, with no news to say why.
fn shut_down() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "the socket's receiving side is shut down",
    )
}

impl Drop for Link<'_> {
    fn drop(&mut self) {
        if self.settled {
            self.mailbox.detach();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tftp::{request::ReadRequest, source::Mode};

    fn request() -> ReadRequest {
        ReadRequest {
            filename: b"f".to_vec(),
            file: "f".into(),
            mode: Mode::Octet,
            options: Vec::new(),
        }
    }

    fn bound() -> UdpSocket {
        UdpSocket::bind("127.0.0.1:0").expect("bind")
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(30)
    }

    /// Packets, news and deadlines, in both ways of waiting.
    #[test]
    fn a_wait_ends_on_a_packet_news_or_the_deadline() {
        let mailbox = Mailbox::new().expect("mailbox");
        let socket = bound();
        let to = socket.local_addr().expect("addr");
        let client = bound();
        let mut link = Link::new(socket, &mailbox);
        let mut buf = [0u8; 16];
        for settled in [false, true] {
            if settled {
                link.settle();
            }
            assert!(matches!(link.next(&mut buf, soon()), Ok(Event::Timeout)));
            client.send_to(b"ack", to).expect("send");
            assert!(matches!(
                link.next(&mut buf, soon()),
                Ok(Event::Packet { len: 3, from }) if from == client.local_addr().expect("addr")
            ));
            // A queued packet comes before news.
            client.send_to(b"x", to).expect("send");
            std::thread::sleep(Duration::from_millis(10));
            assert!(mailbox.deliver(request()));
            assert!(matches!(
                link.next(&mut buf, soon()),
                Ok(Event::Packet { len: 1, .. })
            ));
            assert!(matches!(
                link.next(&mut buf, soon()),
                Ok(Event::Mail(Mail::Request(_)))
            ));
        }
        mailbox.abandon();
        assert!(matches!(
            link.next(&mut buf, soon()),
            Ok(Event::Mail(Mail::Abandoned))
        ));
    }
}

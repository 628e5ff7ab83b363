//! What one client may hold of the boot listener: the connection bound, the
//! request-head and write deadlines, the back-off after failed accepts, and
//! the counters of connections refused a slot or dropped. The connection
//! loop that applies them is `http::sendfile`.

use std::{
    io,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use tracing::{info, warn};

/// Bounds of the boot listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once. Past it, new connections are not
    /// accepted: they wait, handshake done, in the kernel's listen backlog
    /// ([`BACKLOG`]) until a slot frees.
    pub max_connections: usize,
    /// Connections parked for an artifact's turn that give their slot
    /// back meanwhile, each holding its socket; past it, a parked
    /// connection keeps its slot. Counted in the descriptor budget
    /// (`open_files`).
    pub max_parked: usize,
    /// Time a request head has to arrive complete, counted from when the
    /// server starts waiting for it: the accept, or the end of the previous
    /// response on a keep-alive connection. So it also ends idle keep-alive
    /// connections.
    pub header_timeout: Duration,
    /// Longest a response may wait for the client to take more bytes; a
    /// client that stops reading is dropped after it.
    pub write_timeout: Duration,
}

pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_parked: DEFAULT_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
        }
    }
}

/// Listen backlog of the boot listener: where a boot storm past
/// `max_connections` waits. The kernel caps it at `net.core.somaxconn`
/// (4096 by default since Linux 5.4), so the node's setting decides: a
/// room of machines fetching at once needs more than 4096 places, or the
/// ones past it resend their SYN after 1, 3, 7... seconds.
pub const BACKLOG: u32 = 65535;

/// Binds the boot listener with [`BACKLOG`]. The IPv4 wildcard (the
/// default) becomes one dual-stack socket on the IPv6 wildcard, so that
/// IPv6 clients reach the same listener and its bounds; where the host has
/// no IPv6, the IPv4 wildcard as asked.
pub fn bind(addr: std::net::SocketAddr) -> io::Result<tokio::net::TcpListener> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
    if addr.ip() == Ipv4Addr::UNSPECIFIED
        && let Ok(listener) = bind_one(SocketAddr::from((Ipv6Addr::UNSPECIFIED, addr.port())))
    {
        return Ok(listener);
    }
    bind_one(addr)
}

fn bind_one(addr: std::net::SocketAddr) -> io::Result<tokio::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    if addr.is_ipv6() {
        // Dual-stack for the wildcard, whatever the node's bindv6only says.
        sock.set_only_v6(!addr.ip().is_unspecified())?;
    }
    sock.set_reuse_address(true)?;
    sock.set_nonblocking(true)?;
    set_priority(&sock, SMALL_PRIORITY);
    sock.bind(&addr.into())?;
    sock.listen(i32::try_from(BACKLOG).unwrap_or(i32::MAX))?;
    tokio::net::TcpListener::from_std(sock.into())
}

/// Socket priority of the boot listener, which its connections inherit:
/// `TC_PRIO_INTERACTIVE`, the first band of `pfifo_fast` (the queue of a
/// host without `fq_codel`). Handshakes (the SYN-ACK takes the listener's),
/// scripts, grub.cfg and phone-home answers are small and wait on them.
pub const SMALL_PRIORITY: libc::c_int = 6;

/// Socket priority while a file's body is sent: best effort, the second
/// band, behind [`SMALL_PRIORITY`] and with the TFTP transfers.
pub const FILE_PRIORITY: libc::c_int = 0;

/// Sets the socket priority (`SO_PRIORITY`, no privilege needed up to 6)
/// of `sock`; a failure only costs the ordering on the link.
pub fn set_priority(sock: &impl std::os::fd::AsRawFd, priority: libc::c_int) {
    // SAFETY: setsockopt reads one c_int from a valid pointer.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PRIORITY,
            std::ptr::from_ref(&priority).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// A connection counted in [`Stats::parked`] while it waits for its turn.
pub(crate) struct Parked<'a>(&'a Stats);

impl<'a> Parked<'a> {
    /// Counts a parked connection, unless `max` are already.
    pub(crate) fn enter(stats: &'a Stats, max: usize) -> Option<Parked<'a>> {
        stats
            .parked
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < max as u64).then_some(n + 1)
            })
            .ok()
            .map(|_| Parked(stats))
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.parked.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counters of the boot listener, exported on /metrics.
#[derive(Default, Debug)]
pub struct Stats {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections being served now (parked ones included).
    pub open: AtomicU64,
    /// Connections parked for a turn with their slot given back.
    pub parked: AtomicU64,
    /// Times every slot was taken, so new connections waited in the backlog.
    pub at_limit: AtomicU64,
    /// Connections dropped because a request head did not arrive in time.
    pub head_timeouts: AtomicU64,
    /// Connections dropped because the client stopped taking the response.
    pub write_timeouts: AtomicU64,
    /// Connections closed because a file ended before the length announced
    /// in its response head (it shrank while being sent).
    pub short_bodies: AtomicU64,
    /// Failed accepts (EMFILE, ENFILE, ENOBUFS, ...).
    pub accept_errors: AtomicU64,
    /// Phone-homes refused for carrying no token.
    pub phone_home_missing: AtomicU64,
    /// Phone-homes refused for a token that is not the host's current one.
    pub phone_home_mismatch: AtomicU64,
    /// Files (boot files, artifacts) sent whole, and their bytes.
    pub transfers: AtomicU64,
    pub bytes: AtomicU64,
}

/// A copy of [`Stats`] for one scrape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub accepted: u64,
    pub open: u64,
    pub parked: u64,
    pub at_limit: u64,
    pub head_timeouts: u64,
    pub write_timeouts: u64,
    pub short_bodies: u64,
    pub accept_errors: u64,
    pub phone_home_missing: u64,
    pub phone_home_mismatch: u64,
    pub transfers: u64,
    pub bytes: u64,
}

impl Stats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            accepted: load(&self.accepted),
            open: load(&self.open),
            parked: load(&self.parked),
            at_limit: load(&self.at_limit),
            head_timeouts: load(&self.head_timeouts),
            write_timeouts: load(&self.write_timeouts),
            short_bodies: load(&self.short_bodies),
            accept_errors: load(&self.accept_errors),
            phone_home_missing: load(&self.phone_home_missing),
            phone_home_mismatch: load(&self.phone_home_mismatch),
            transfers: load(&self.transfers),
            bytes: load(&self.bytes),
        }
    }

    pub(crate) fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Keeps [`Stats::open`] right however a connection task ends.
pub(crate) struct OpenConnection<'a>(&'a Stats);

impl<'a> OpenConnection<'a> {
    pub(crate) fn new(stats: &'a Stats) -> Self {
        Stats::bump(&stats.accepted);
        Stats::bump(&stats.open);
        OpenConnection(stats)
    }
}

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// First pause after a failed accept.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
/// Longest pause between accepts while they keep failing.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Pauses between failing accepts. A failed accept leaves the connection in
/// the backlog and the listener readable, so retrying at once spins a core
/// until a descriptor frees; this doubles the pause instead, and logs once
/// per episode rather than per attempt.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    /// Failures since the last accept that worked.
    failures: u64,
    next: Duration,
}

impl AcceptBackoff {
    /// Records a failed accept; how long to wait before the next one.
    pub fn failed(&mut self, error: &io::Error) -> Duration {
        if self.failures == 0 {
            warn!(
                %error,
                "boot HTTP accept failed; pausing accepts (up to {} ms) until it succeeds",
                BACKOFF_MAX.as_millis()
            );
            self.next = BACKOFF_FIRST;
        }
        self.failures += 1;
        let pause = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        pause
    }

    /// Records an accept that worked, ending an episode of failures.
    pub fn succeeded(&mut self) {
        if self.failures > 0 {
            info!(failures = self.failures, "boot HTTP accepts work again");
            self.failures = 0;
        }
    }
}

/// True for accept errors that concern only the connection being accepted
/// (it was reset before we took it), after which the next accept can follow
/// at once. Anything else, EMFILE and ENFILE first, is retried after a pause.
pub fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_backoff_doubles_to_a_second_and_starts_over_after_a_success() {
        let emfile = io::Error::from_raw_os_error(libc::EMFILE);
        let mut b = AcceptBackoff::default();
        let pauses: Vec<u128> = (0..7).map(|_| b.failed(&emfile).as_millis()).collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1000, 1000]);
        b.succeeded();
        assert_eq!(b.failed(&emfile), BACKOFF_FIRST);
    }

    #[test]
    fn descriptor_exhaustion_is_not_a_per_connection_error() {
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            assert!(!is_per_connection(&io::Error::from_raw_os_error(errno)));
        }
        assert!(is_per_connection(&io::Error::from_raw_os_error(
            libc::ECONNABORTED
        )));
    }
}

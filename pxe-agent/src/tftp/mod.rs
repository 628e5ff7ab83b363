//! Read-only TFTP server for network boot: serves iPXE binaries, kernels and
//! initrds from one root directory to PXE firmware (RFC 1350, with option
//! negotiation per RFC 2347, `blksize` RFC 2348, `tsize`/`timeout`
//! RFC 2349 and `windowsize` RFC 7440). Write requests are refused.
//!
//! This module owns the TFTP protocol and the root jail. It does not bind
//! sockets or decide where the root is: [`serve`] (or [`Server::serve`])
//! takes an already-bound UDP socket, a [`TftpConfig`] and a
//! [`Shutdown`](crate::shutdown::Shutdown); the agent reports progress from
//! the [`TransferEvent`]s and [`Stats`].
//!
//! - `packet`: wire format, pure.
//! - `option`: option negotiation, pure.
//! - `path`: the root jail (name rules, canonicalization, `openat2`).
//! - `source`: reading blocks, octet or netascii.
//! - `transfer`: one transfer on its own socket (window, retransmission),
//!   blocking.
//! - `link`: how a transfer waits for packets and news at once.
//! - `request`: a read request as the request loop hands it on.
//! - `mailbox`: the news the request loop leaves a running transfer.
//! - `worker`: one peer's thread, running its transfers.
//! - `server`: the request loop (async), the transfer bound and events.
//! - `shared`: what the request loop and the peers' threads share.
//! - `waiting`: requests held past the bound until a slot frees.
//! - `thread`: the server on a thread of its own, for callers without a
//!   tokio runtime.

pub mod generated;
mod link;
mod mailbox;
pub mod option;
pub mod packet;
pub mod path;
mod request;
mod server;
mod shared;
pub mod source;
mod spin;
mod thread;
mod transfer;
mod waiting;
mod worker;

#[cfg(test)]
mod tests;

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, SystemTime},
};

pub use generated::Generated;
pub use path::{PathError, RootError};
pub use server::{Gate, ServeError, Server, serve};
pub use thread::ServerThread;
pub use transfer::TransferError;

/// Bytes of IPv4 (20), UDP (8) and TFTP DATA (4) headers around a block.
const BLOCK_OVERHEAD: u32 = 32;

/// The `max_transfers` of [`TftpConfig::new`].
pub const DEFAULT_MAX_TRANSFERS: usize = 128;

/// The `max_waiting` of [`TftpConfig::new`]: a rack room's worth of
/// machines asking at once, a few hundred bytes each.
pub const DEFAULT_MAX_WAITING: usize = 16_384;

/// The `max_windowsize` of [`TftpConfig::new`].
pub const DEFAULT_MAX_WINDOWSIZE: u16 = 16;

/// Default [`TftpConfig::busy_poll`]: a lock-step round trip without
/// sleeping takes about 15 µs on a loaded VM, so this covers a slow client
/// turnaround and costs at most that much CPU per block.
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(100);

/// How the server runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TftpConfig {
    /// The served directory; nothing outside it is ever opened.
    pub root: PathBuf,
    /// Largest `blksize` granted (RFC 2348: 8..=65464). Use
    /// [`TftpConfig::blksize_for_mtu`] so a block fits one unfragmented
    /// frame on the boot interface.
    pub max_blksize: u16,
    /// Largest `windowsize` granted (1..=64); per-transfer memory is at
    /// most `max_windowsize × max_blksize` bytes of window.
    pub max_windowsize: u16,
    /// Transfers served at once; requests beyond it wait for a slot (see
    /// `max_waiting`).
    pub max_transfers: usize,
    /// Read requests held, first come first served, while `max_transfers`
    /// run; past it, requests get ERROR 0 "server busy". Zero refuses at
    /// once.
    pub max_waiting: usize,
    /// Retransmission timeout when the client does not negotiate `timeout`
    /// (1 ms..=255 s).
    pub timeout: Duration,
    /// Retransmissions of one packet (or window) before the transfer is
    /// abandoned.
    pub retries: u32,
    /// How long a transfer polls its socket for the client's answer before
    /// it sleeps; zero never polls. At most half the CPUs' worth of
    /// transfers poll at once (see `spin`).
    pub busy_poll: Duration,
}

impl TftpConfig {
    /// A configuration serving `root` with defaults for a 1500-byte MTU.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        TftpConfig {
            root: root.into(),
            max_blksize: Self::blksize_for_mtu(1500),
            max_windowsize: DEFAULT_MAX_WINDOWSIZE,
            max_transfers: DEFAULT_MAX_TRANSFERS,
            max_waiting: DEFAULT_MAX_WAITING,
            timeout: Duration::from_secs(1),
            retries: 5,
            busy_poll: DEFAULT_BUSY_POLL,
        }
    }

    /// The largest block that fits an IPv4 frame of `mtu` bytes without
    /// fragmentation: the MTU minus 32 bytes of headers, within 8..=65464.
    pub fn blksize_for_mtu(mtu: u32) -> u16 {
        let size = mtu.saturating_sub(BLOCK_OVERHEAD);
        let (min, max) = (*option::BLKSIZE_RANGE.start(), *option::BLKSIZE_RANGE.end());
        u16::try_from(size).unwrap_or(max).clamp(min, max)
    }

    /// Checks the limits (not the root, which [`Server::new`] opens).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !option::BLKSIZE_RANGE.contains(&self.max_blksize) {
            return Err(ConfigError::Blksize(self.max_blksize));
        }
        if !(1..=option::MAX_WINDOWSIZE).contains(&self.max_windowsize) {
            return Err(ConfigError::Windowsize(self.max_windowsize));
        }
        if self.max_transfers == 0 {
            return Err(ConfigError::Transfers);
        }
        if self.timeout < Duration::from_millis(1) || self.timeout > Duration::from_secs(255) {
            return Err(ConfigError::Timeout(self.timeout));
        }
        Ok(())
    }

    fn limits(&self) -> option::Limits {
        option::Limits {
            max_blksize: self.max_blksize,
            max_windowsize: self.max_windowsize,
            timeout: self.timeout,
        }
    }
}

/// Why a configuration cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("TFTP max_blksize {0} is outside 8..=65464")]
    Blksize(u16),
    #[error("TFTP max_windowsize {0} is outside 1..=64")]
    Windowsize(u16),
    #[error("TFTP max_transfers must be at least 1")]
    Transfers,
    #[error("TFTP timeout {0:?} is outside 1 ms..=255 s")]
    Timeout(Duration),
    #[error(transparent)]
    Root(#[from] RootError),
}

/// One finished (or refused) read request, for recording boot progress.
#[derive(Debug)]
pub struct TransferEvent {
    pub peer: SocketAddr,
    /// The file name as the client sent it (lossy UTF-8).
    pub file: String,
    /// Payload bytes the client acknowledged.
    pub bytes: u64,
    pub outcome: Outcome,
    pub started: SystemTime,
    pub finished: SystemTime,
}

/// How a transfer ended.
#[derive(Debug)]
pub enum Outcome {
    /// The client acknowledged the last block.
    Done,
    Failed(TransferError),
}

/// Counters of the TFTP server, shared with the metrics exporter.
#[derive(Debug, Default)]
pub struct Stats {
    /// Read requests received (including refused and duplicate ones).
    pub requests: AtomicU64,
    /// Transfers whose last block was acknowledged.
    pub done: AtomicU64,
    /// Transfers that started and failed (missing file, refused path,
    /// timeout, client error).
    pub failed: AtomicU64,
    /// Read requests refused because `max_transfers` were running and
    /// `max_waiting` were waiting.
    pub busy: AtomicU64,
    /// Read requests that waited for a slot.
    pub waited: AtomicU64,
    /// Waiting requests forgotten because their peer went silent.
    pub wait_expired: AtomicU64,
    /// Requests waiting now (a gauge).
    pub waiting: AtomicU64,
    /// Requests refused before a transfer: write requests, malformed
    /// packets, unsupported modes.
    pub refused: AtomicU64,
    /// Repeated read requests from a peer whose transfer is running.
    pub duplicates: AtomicU64,
    /// Payload bytes acknowledged by clients.
    pub bytes: AtomicU64,
    /// Packets resent after a timeout.
    pub retransmits: AtomicU64,
    /// Packets the kernel refused to send.
    pub send_errors: AtomicU64,
    /// TransferEvents dropped because the receiver was full or gone.
    pub events_dropped: AtomicU64,
    /// Transfers running now (a gauge).
    pub active: AtomicU64,
}

/// A copy of [`Stats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub requests: u64,
    pub done: u64,
    pub failed: u64,
    pub busy: u64,
    pub waited: u64,
    pub wait_expired: u64,
    pub waiting: u64,
    pub refused: u64,
    pub duplicates: u64,
    pub bytes: u64,
    pub retransmits: u64,
    pub send_errors: u64,
    pub events_dropped: u64,
    pub active: u64,
}

impl Stats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            requests: get(&self.requests),
            done: get(&self.done),
            failed: get(&self.failed),
            busy: get(&self.busy),
            waited: get(&self.waited),
            wait_expired: get(&self.wait_expired),
            waiting: get(&self.waiting),
            refused: get(&self.refused),
            duplicates: get(&self.duplicates),
            bytes: get(&self.bytes),
            retransmits: get(&self.retransmits),
            send_errors: get(&self.send_errors),
            events_dropped: get(&self.events_dropped),
            active: get(&self.active),
        }
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

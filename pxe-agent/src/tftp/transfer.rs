//! One read transfer on its own socket (its TID, RFC 1350 section 4) and its
//! own thread: the optional OACK exchange, then DATA in windows of
//! `windowsize` blocks with retransmission on timeout. It owns the window
//! and the retransmission policy; which file and which options were decided
//! before it starts.
//!
//! - Block numbers are the absolute block index modulo 2^16: after 65535
//!   comes 0, as tftp-hpa does, so files of any size can be sent.
//! - Retransmission timeouts back off exponentially (doubling, at most 8×
//!   the configured timeout; a timeout the client negotiated is kept as
//!   is); a transfer gives up after `retries` retransmissions without
//!   progress.
//! - A duplicate ACK (one for the block before the window) is ignored in
//!   every mode, which avoids the Sorcerer's Apprentice bug (RFC 1123
//!   section 4.2.3.1): answering duplicates doubles every later block once
//!   a single packet was delayed. Packets are resent on a timeout, or at
//!   once when the client repeats its request before answering us.
//! - An ACK inside the window (RFC 7440 section 4: the client saw a gap)
//!   slides the window to it and sends the whole new window, so the missing
//!   blocks go out again at once.
//! - The window holds at most `windowsize` packets of `blksize` bytes, so
//!   memory per transfer is bounded. The file is read ahead in
//!   [`READ_AHEAD`] batches, one `read(2)` per batch.
//! - Everything is blocking, on the transfer's thread; `link` has how it
//!   waits.

use std::{
    collections::VecDeque,
    io::{self, Read},
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use tracing::debug;

use super::{
    Stats, bump,
    link::{Event, Link},
    mailbox::Mail,
    option::Negotiated,
    packet::{self, DATA_HEADER, ErrorCode, Packet},
    path::PathError,
    request::ReadRequest,
    source::{Mode, Source},
};

/// Bytes read from a file at a time, per transfer (so also the bound on
/// read-ahead memory).
pub(super) const READ_AHEAD: usize = 128 * 1024;

/// Why a transfer did not complete.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("server busy: {active} transfers in progress")]
    Busy { active: usize },
    #[error("failed to start the transfer: {0}")]
    Start(#[source] io::Error),
    #[error(transparent)]
    Path(#[from] PathError),
    #[error("no ACK for block {block} after {retries} retransmissions")]
    Timeout { block: u64, retries: u32 },
    #[error("client aborted with error {code}: {message}")]
    Peer { code: u16, message: String },
    #[error("failed to read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("failed to open a transfer socket: {0}")]
    Socket(#[source] io::Error),
    #[error("failed to receive on the transfer socket: {0}")]
    Recv(#[source] io::Error),
    #[error("the client sent a new request (for {file})")]
    Superseded { file: String },
    #[error("abandoned: the server is stopping")]
    Abandoned,
}

/// How one transfer runs.
pub(super) struct Transfer<'a> {
    /// The transfer's socket, and its mailbox: where the request loop
    /// leaves the peer's new requests, and says when the server stops.
    pub link: Link<'a>,
    pub peer: SocketAddr,
    pub params: Negotiated,
    pub retries: u32,
    pub stats: &'a Arc<Stats>,
    /// The file beneath the root, for messages.
    pub path: PathBuf,
    /// Payload bytes the client has acknowledged so far.
    pub acked: u64,
    /// The requested name.
    pub filename: &'a [u8],
    /// Whether the peer has sent this transfer anything yet.
    pub heard: bool,
    /// The request that superseded this transfer, to be served next.
    pub next: Option<ReadRequest>,
}

/// A received ACK, or why none came.
enum Wait {
    Ack(u16),
    Timeout,
    /// The peer repeated its request: our first packet did not arrive.
    Repeat,
}

impl Transfer<'_> {
    /// Sends an ERROR to the peer; best effort, as the transfer ends anyway.
    pub fn send_error(&self, code: ErrorCode, message: &str) {
        self.send(&packet::error(code, message));
    }

    /// Runs the transfer of `input` (a buffered file, or bytes made for
    /// the client) to the final ACK.
    pub fn run(&mut self, input: impl Read, mode: Mode) -> Result<(), TransferError> {
        if !self.params.oack.is_empty() {
            self.negotiate()?;
        }
        self.send_blocks(Source::new(input, mode))
    }

    /// RFC 2347: the client answers the OACK with ACK 0, or with ERROR 8.
    fn negotiate(&mut self) -> Result<(), TransferError> {
        let oack = packet::oack(&self.params.oack);
        let mut retries = 0;
        self.send(&oack);
        let mut deadline = Instant::now() + self.backoff(0);
        loop {
            match self.wait(deadline)? {
                Wait::Ack(0) => return Ok(()),
                Wait::Ack(_) => {}
                Wait::Repeat => {
                    self.send(&oack);
                    deadline = Instant::now() + self.backoff(retries);
                }
                Wait::Timeout => {
                    retries += 1;
                    if retries > self.retries {
                        return Err(TransferError::Timeout {
                            block: 0,
                            retries: self.retries,
                        });
                    }
                    bump(&self.stats.retransmits);
                    self.send(&oack);
                    deadline = Instant::now() + self.backoff(retries);
                }
            }
        }
    }

    fn send_blocks(&mut self, mut source: Source<impl Read>) -> Result<(), TransferError> {
        let mut window = Window::new(self.params.blksize, self.params.windowsize);
        let mut retries = 0;
        loop {
            window
                .refill(&mut source)
                .map_err(|source| TransferError::Read {
                    path: self.path.clone(),
                    source,
                })?;
            if window.blocks.is_empty() {
                return Ok(());
            }
            self.send_window(&window);
            let mut deadline = Instant::now() + self.backoff(0);
            // Wait for an ACK that moves the window, resending on timeouts.
            let advanced = loop {
                match self.wait(deadline)? {
                    Wait::Ack(n) => match window.acknowledged(n) {
                        0 => {
                            debug!(peer = %self.peer, block = n, "ignoring duplicate or stale ACK")
                        }
                        j => break j,
                    },
                    Wait::Repeat => {
                        self.send_window(&window);
                        deadline = Instant::now() + self.backoff(retries);
                    }
                    Wait::Timeout => {
                        retries += 1;
                        if retries > self.retries {
                            return Err(TransferError::Timeout {
                                block: window.base,
                                retries: self.retries,
                            });
                        }
                        self.stats
                            .retransmits
                            .fetch_add(window.blocks.len() as u64, Ordering::Relaxed);
                        self.send_window(&window);
                        deadline = Instant::now() + self.backoff(retries);
                    }
                }
            };
            retries = 0;
            let payload = window.slide(advanced);
            self.acked += payload;
            self.stats.bytes.fetch_add(payload, Ordering::Relaxed);
            if !window.blocks.is_empty() {
                debug!(peer = %self.peer, block = window.base, "client saw a gap; resending from it");
            }
        }
    }

    fn send_window(&self, window: &Window) {
        for block in &window.blocks {
            self.send(block);
        }
    }

    /// How long to wait after the `retry`th consecutive retransmission
    /// (0: after the first send). The server's own timeout doubles per
    /// retry up to [`MAX_BACKOFF`] times it (RFC 1123 section 4.2.3.2);
    /// backing off also lets a client whose timer is longer than ours
    /// speak, which matters for clients that ignore repeated blocks. A
    /// timeout the client chose is used as is (RFC 2349).
    ///
    /// Until the client has answered at all, the timeout stays as it is. A
    /// client that is there and lost our packet repeats its request, which
    /// is answered at once; one that stays silent has most likely given up
    /// (in a storm: while its request waited for a slot), and with backoff
    /// it would hold its slot for half a minute. (Giving up after fewer
    /// resends than `retries` cost machines on the storm lab's lossy link.)
    fn backoff(&self, retry: u32) -> Duration {
        if self.params.client_timeout || !self.heard {
            self.params.timeout
        } else {
            backoff(self.params.timeout, retry)
        }
    }

    /// Waits until `deadline` for an ACK from the peer. Packets from other
    /// ports get ERROR 5 and do not disturb the transfer (RFC 1350 section
    /// 4); an ERROR from the peer ends it, and so does the server stopping.
    ///
    /// A new request from the peer (left in the mailbox by the request
    /// loop) is a retransmission while the peer has not answered and names
    /// the same file: the first packet is sent again at once. Otherwise the
    /// client has moved on (a size probe it aborted, a restart, a lost
    /// final ACK) and the new request supersedes this transfer. Packets
    /// already queued on the socket are read first, so an ERROR the client
    /// sent before its new request ends this transfer before the request is
    /// looked at.
    fn wait(&mut self, deadline: Instant) -> Result<Wait, TransferError> {
        let mut buf = [0u8; 1024];
        loop {
            let (len, from) = match self
                .link
                .next(&mut buf, deadline)
                .map_err(TransferError::Recv)?
            {
                Event::Packet { len, from } => (len, from),
                Event::Timeout => return Ok(Wait::Timeout),
                Event::Mail(Mail::Abandoned) => return Err(TransferError::Abandoned),
                Event::Mail(Mail::Request(request)) => {
                    if !self.heard && request.filename == self.filename {
                        bump(&self.stats.duplicates);
                        return Ok(Wait::Repeat);
                    }
                    let file = request.file.clone();
                    self.next = Some(request);
                    return Err(TransferError::Superseded { file });
                }
            };
            if from != self.peer {
                debug!(peer = %self.peer, %from, "packet from an unknown transfer ID");
                let reply = packet::error(ErrorCode::UnknownTransferId, "unknown transfer ID");
                if let Err(err) = self.link.send_to(&reply, from) {
                    debug!(%from, "failed to send ERROR 5: {err}");
                }
                continue;
            }
            if !self.heard {
                self.heard = true;
                self.link.settle();
            }
            match packet::parse(&buf[..len]) {
                Ok(Packet::Ack { block }) => return Ok(Wait::Ack(block)),
                Ok(Packet::Error { code, message }) => {
                    return Err(TransferError::Peer {
                        code,
                        message: String::from_utf8_lossy(message).into_owned(),
                    });
                }
                Ok(other) => debug!(peer = %self.peer, "ignoring unexpected {other:?}"),
                Err(err) => debug!(peer = %self.peer, "ignoring malformed packet: {err}"),
            }
        }
    }

    /// Sends one packet. A failed send counts as a lost packet: the
    /// retransmission timer deals with it.
    fn send(&self, pkt: &[u8]) {
        if let Err(err) = self.link.send_to(pkt, self.peer) {
            bump(&self.stats.send_errors);
            debug!(peer = %self.peer, "failed to send: {err}");
        }
    }
}

/// Largest multiple of the timeout waited between retransmissions.
pub(super) const MAX_BACKOFF: u32 = 8;

/// The timeout doubled `retry` times, at most [`MAX_BACKOFF`] times it.
pub(super) fn backoff(timeout: Duration, retry: u32) -> Duration {
    timeout * (1u32 << retry.min(MAX_BACKOFF.ilog2()))
}

/// The on-wire block number of absolute block `n` (wraps to 0 after 65535).
pub(super) fn wire(n: u64) -> u16 {
    (n & 0xffff) as u16
}

/// The unacknowledged blocks of a transfer, as DATA packets ready to send.
struct Window {
    blksize: usize,
    size: usize,
    blocks: VecDeque<Vec<u8>>,
    /// Buffers of acknowledged blocks, reused for the next ones.
    spare: Vec<Vec<u8>>,
    /// Absolute index of `blocks[0]` (the first block is 1).
    base: u64,
    /// Absolute index of the next block to read.
    next: u64,
    /// The last (short) block has been read into `blocks`.
    complete: bool,
}

impl Window {
    fn new(blksize: u16, windowsize: u16) -> Window {
        let size = usize::from(windowsize.max(1));
        Window {
            blksize: usize::from(blksize),
            size,
            blocks: VecDeque::with_capacity(size),
            spare: Vec::with_capacity(size),
            base: 1,
            next: 1,
            complete: false,
        }
    }

    /// Reads blocks from `source` until the window is full or holds the
    /// last block.
    fn refill(&mut self, source: &mut Source<impl Read>) -> io::Result<()> {
        while self.blocks.len() < self.size && !self.complete {
            let mut block = self.spare.pop().unwrap_or_default();
            block.clear();
            packet::data_header(&mut block, wire(self.next));
            source.read_block(&mut block, self.blksize)?;
            self.complete = block.len() - DATA_HEADER < self.blksize;
            self.blocks.push_back(block);
            self.next += 1;
        }
        Ok(())
    }

    /// How many blocks an ACK for wire block `n` acknowledges: 0 for one
    /// before the window (a duplicate) or a stray number.
    fn acknowledged(&self, n: u16) -> usize {
        (1..=self.blocks.len())
            .find(|&j| wire(self.base - 1 + j as u64) == n)
            .unwrap_or(0)
    }

    /// Drops the first `count` blocks; returns their payload bytes.
    fn slide(&mut self, count: usize) -> u64 {
        let mut payload = 0;
        for block in self.blocks.drain(..count) {
            payload += (block.len() - DATA_HEADER) as u64;
            self.spare.push(block);
        }
        self.base += count as u64;
        payload
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window_of(blocks: &[(u64, usize)], base: u64) -> Window {
        let mut window = Window::new(8, 4);
        window.base = base;
        for &(n, len) in blocks {
            let mut pkt = Vec::new();
            packet::data_header(&mut pkt, wire(n));
            pkt.resize(DATA_HEADER + len, 0);
            window.blocks.push_back(pkt);
        }
        window
    }

    #[test]
    fn acks_map_onto_the_window_across_the_wrap() {
        let window = window_of(&[(65534, 8), (65535, 8), (65536, 8), (65537, 3)], 65534);
        assert_eq!(window.acknowledged(65533), 0, "duplicate of the ACK before");
        assert_eq!(window.acknowledged(65534), 1);
        assert_eq!(window.acknowledged(0), 3);
        assert_eq!(window.acknowledged(1), 4);
        assert_eq!(window.acknowledged(7), 0, "stray number");
    }

    #[test]
    fn sliding_counts_payload_and_keeps_buffers() {
        let mut window = window_of(&[(1, 8), (2, 8), (3, 3)], 1);
        assert_eq!(window.slide(2), 16);
        assert_eq!(
            (window.base, window.blocks.len(), window.spare.len()),
            (3, 1, 2)
        );
        assert_eq!(window.acknowledged(2), 0);
        assert_eq!(window.acknowledged(3), 1);
    }

    #[test]
    fn refills_stop_at_a_full_window_and_after_the_short_block() {
        let file = [7u8; 8 * 5 + 3];
        let mut source = Source::new(&file[..], Mode::Octet);
        let mut window = Window::new(8, 4);
        window.refill(&mut source).expect("refill");
        let numbers = |w: &Window| -> Vec<(u16, usize)> {
            w.blocks
                .iter()
                .map(|b| (u16::from_be_bytes([b[2], b[3]]), b.len() - DATA_HEADER))
                .collect()
        };
        assert_eq!(numbers(&window), [(1, 8), (2, 8), (3, 8), (4, 8)]);
        window.slide(3);
        window.refill(&mut source).expect("refill");
        assert_eq!(numbers(&window), [(4, 8), (5, 8), (6, 3)]);
        assert!(window.complete);
        window.slide(3);
        window.refill(&mut source).expect("refill");
        assert!(window.blocks.is_empty());
    }

    #[test]
    fn block_numbers_wrap_to_zero() {
        assert_eq!(wire(1), 1);
        assert_eq!(wire(65535), 65535);
        assert_eq!(wire(65536), 0);
        assert_eq!(wire(65537), 1);
    }

    #[test]
    fn retransmissions_back_off_exponentially_up_to_a_cap() {
        let t = Duration::from_millis(100);
        let waits: Vec<u128> = (0..6).map(|n| backoff(t, n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 800, 800]);
    }
}

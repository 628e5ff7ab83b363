//! One read transfer on its own socket (its TID, RFC 1350 section 4): the
//! optional OACK exchange, then DATA in windows of `windowsize` blocks with
//! retransmission on timeout. It owns the window and the retransmission
//! policy; which file and which options were decided before it starts.
//!
//! - Block numbers are the absolute block index modulo 2^16: after 65535
//!   comes 0, as tftp-hpa does, so files of any size can be sent.
//! - Only a timeout resends anything. A duplicate ACK (one for the block
//!   before the window) is ignored in every mode, which avoids the
//!   Sorcerer's Apprentice bug (RFC 1123 section 4.2.3.1): answering
//!   duplicates doubles every later block once a single packet was delayed.
//! - An ACK inside the window (RFC 7440 section 4: the client saw a gap)
//!   slides the window to it and sends the whole new window, so the missing
//!   blocks go out again at once.
//! - The window holds at most `windowsize` packets of `blksize` bytes, so
//!   memory per transfer is bounded; file reads run on the blocking pool,
//!   one per window refill.

use std::{collections::VecDeque, fs::File, io, net::SocketAddr, path::PathBuf, sync::Arc};

use tokio::{net::UdpSocket, time::Instant};
use tracing::debug;

use super::{
    Stats, bump,
    option::Negotiated,
    packet::{self, DATA_HEADER, ErrorCode, Packet},
    path::PathError,
    source::Source,
};

/// Why a transfer did not complete.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("server busy: {active} transfers in progress")]
    Busy { active: usize },
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
    #[error("blocking file task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// How one transfer runs.
pub(super) struct Transfer<'a> {
    pub socket: UdpSocket,
    pub peer: SocketAddr,
    pub params: Negotiated,
    pub retries: u32,
    pub stats: &'a Arc<Stats>,
    /// The file beneath the root, for messages.
    pub path: PathBuf,
    /// Payload bytes the client has acknowledged so far.
    pub acked: u64,
}

/// A received ACK, or why none came.
enum Wait {
    Ack(u16),
    Timeout,
}

impl Transfer<'_> {
    /// Sends an ERROR to the peer; best effort, as the transfer ends anyway.
    pub async fn send_error(&self, code: ErrorCode, message: &str) {
        self.send(&packet::error(code, message)).await;
    }

    /// Runs the transfer to the final ACK.
    pub async fn run(&mut self, source: Source<File>) -> Result<(), TransferError> {
        if !self.params.oack.is_empty() {
            self.negotiate().await?;
        }
        self.send_blocks(source).await
    }

    /// RFC 2347: the client answers the OACK with ACK 0, or with ERROR 8.
    async fn negotiate(&mut self) -> Result<(), TransferError> {
        let oack = packet::oack(&self.params.oack);
        let mut retries = 0;
        self.send(&oack).await;
        let mut deadline = Instant::now() + self.params.timeout;
        loop {
            match self.wait(deadline).await? {
                Wait::Ack(0) => return Ok(()),
                Wait::Ack(_) => {}
                Wait::Timeout => {
                    retries += 1;
                    if retries > self.retries {
                        return Err(TransferError::Timeout {
                            block: 0,
                            retries: self.retries,
                        });
                    }
                    bump(&self.stats.retransmits);
                    self.send(&oack).await;
                    deadline = Instant::now() + self.params.timeout;
                }
            }
        }
    }

    async fn send_blocks(&mut self, mut source: Source<File>) -> Result<(), TransferError> {
        let blksize = usize::from(self.params.blksize);
        let windowsize = usize::from(self.params.windowsize.max(1));
        let mut window: VecDeque<Vec<u8>> = VecDeque::with_capacity(windowsize);
        let mut spare: Vec<Vec<u8>> = Vec::with_capacity(windowsize);
        // Absolute index of window[0], and of the next block to read.
        let mut base: u64 = 1;
        let mut next: u64 = 1;
        let mut last_read = false;
        let mut retries = 0;
        loop {
            if !last_read && window.len() < windowsize {
                let want = windowsize - window.len();
                let bufs = (0..want).map(|_| spare.pop().unwrap_or_default()).collect();
                let (src, blocks, res) = tokio::task::spawn_blocking(move || {
                    let mut source = source;
                    let res = read_blocks(&mut source, bufs, next, blksize);
                    (source, res.0, res.1)
                })
                .await?;
                source = src;
                res.map_err(|source| TransferError::Read {
                    path: self.path.clone(),
                    source,
                })?;
                for block in blocks {
                    last_read = block.len() - DATA_HEADER < blksize;
                    window.push_back(block);
                    next += 1;
                }
            }
            if window.is_empty() {
                return Ok(());
            }
            for block in &window {
                self.send(block).await;
            }
            let mut deadline = Instant::now() + self.params.timeout;
            // Wait for an ACK that moves the window, resending on timeouts.
            let advanced = loop {
                match self.wait(deadline).await? {
                    Wait::Ack(n) => {
                        // j blocks of the window acknowledged; j = 0 is a
                        // duplicate of the ACK before the window.
                        let j = (1..=window.len() as u64)
                            .find(|&j| wire(base - 1 + j) == n)
                            .map_or(0, |j| j as usize);
                        if j > 0 {
                            break j;
                        }
                        debug!(peer = %self.peer, block = n, "ignoring duplicate or stale ACK");
                    }
                    Wait::Timeout => {
                        retries += 1;
                        if retries > self.retries {
                            return Err(TransferError::Timeout {
                                block: base,
                                retries: self.retries,
                            });
                        }
                        for block in &window {
                            bump(&self.stats.retransmits);
                            self.send(block).await;
                        }
                        deadline = Instant::now() + self.params.timeout;
                    }
                }
            };
            retries = 0;
            for block in window.drain(..advanced) {
                let payload = (block.len() - DATA_HEADER) as u64;
                self.acked += payload;
                self.stats
                    .bytes
                    .fetch_add(payload, std::sync::atomic::Ordering::Relaxed);
                spare.push(block);
            }
            base += advanced as u64;
            if advanced < windowsize && !window.is_empty() {
                debug!(peer = %self.peer, block = base, "client saw a gap; resending from it");
            }
        }
    }

    /// Waits until `deadline` for an ACK from the peer. Packets from other
    /// ports get ERROR 5 and do not disturb the transfer (RFC 1350 section
    /// 4); an ERROR from the peer ends it.
    async fn wait(&self, deadline: Instant) -> Result<Wait, TransferError> {
        let mut buf = [0u8; 1024];
        loop {
            let Ok(received) =
                tokio::time::timeout_at(deadline, self.socket.recv_from(&mut buf)).await
            else {
                return Ok(Wait::Timeout);
            };
            let (len, from) = received.map_err(TransferError::Recv)?;
            if from != self.peer {
                debug!(peer = %self.peer, %from, "packet from an unknown transfer ID");
                let reply = packet::error(ErrorCode::UnknownTransferId, "unknown transfer ID");
                if let Err(err) = self.socket.send_to(&reply, from).await {
                    debug!(%from, "failed to send ERROR 5: {err}");
                }
                continue;
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
    async fn send(&self, pkt: &[u8]) {
        if let Err(err) = self.socket.send_to(pkt, self.peer).await {
            bump(&self.stats.send_errors);
            debug!(peer = %self.peer, "failed to send: {err}");
        }
    }
}

/// The on-wire block number of absolute block `n` (wraps to 0 after 65535).
pub(super) fn wire(n: u64) -> u16 {
    (n & 0xffff) as u16
}

/// Reads DATA packets numbered from `first` into `bufs` (reused buffers),
/// stopping after the first short block. Returns the packets read so far
/// and the error that stopped reading, if any.
fn read_blocks(
    source: &mut Source<File>,
    bufs: Vec<Vec<u8>>,
    first: u64,
    blksize: usize,
) -> (Vec<Vec<u8>>, io::Result<()>) {
    let mut blocks = Vec::with_capacity(bufs.len());
    for (n, mut buf) in (first..).zip(bufs) {
        buf.clear();
        packet::data_header(&mut buf, wire(n));
        if let Err(err) = source.read_block(&mut buf, blksize) {
            return (blocks, Err(err));
        }
        let short = buf.len() - DATA_HEADER < blksize;
        blocks.push(buf);
        if short {
            break;
        }
    }
    (blocks, Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_numbers_wrap_to_zero() {
        assert_eq!(wire(1), 1);
        assert_eq!(wire(65535), 65535);
        assert_eq!(wire(65536), 0);
        assert_eq!(wire(65537), 1);
    }
}

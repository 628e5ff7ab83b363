//! One peer's thread: runs the peer's transfers one after the other (a new
//! request from the peer supersedes the running one), each on a fresh
//! socket, and counts, logs and emits an event for each. It owns the
//! peer's claim on the transfer bound ([`Slot`]); the request loop that
//! starts it lives in `server`, the protocol in `transfer`.

use std::{
    io::{self, BufReader},
    net::{IpAddr, SocketAddr, UdpSocket},
    path::PathBuf,
    sync::{Arc, atomic::Ordering},
    time::SystemTime,
};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::OwnedSemaphorePermit;
use tracing::{debug, info};

use crate::clock;

use super::{
    Outcome, TransferEvent, bump,
    link::Link,
    mailbox::{Mail, Mailbox},
    option,
    packet::{self, ErrorCode},
    path::{self, PathError},
    request::ReadRequest,
    shared::{PeerEntry, Shared},
    source::Mode,
    spin::BusyPoll,
    transfer::{READ_AHEAD, Transfer, TransferError},
};

/// A peer's claim on the bound and on its mailbox; released on drop.
pub(super) struct Slot {
    shared: Arc<Shared>,
    peer: SocketAddr,
    /// Tells this slot's entry in the peers map from a later one.
    id: u64,
    mailbox: Arc<Mailbox>,
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    /// Enters `peer` in the peers map as `id`, with `mailbox` for its
    /// new requests, and counts it as active; `permit` is its place in the
    /// bound. Dropping the slot undoes all three.
    pub fn claim(
        shared: Arc<Shared>,
        peer: SocketAddr,
        id: u64,
        mailbox: Arc<Mailbox>,
        permit: OwnedSemaphorePermit,
    ) -> Slot {
        shared.peers().insert(
            peer,
            PeerEntry {
                id,
                mailbox: mailbox.clone(),
            },
        );
        shared.stats.active.fetch_add(1, Ordering::Relaxed);
        Slot {
            shared,
            peer,
            id,
            mailbox,
            _permit: permit,
        }
    }

    /// The request that arrived while the last transfer ended, if any and
    /// the server is not stopping; otherwise gives up the peer's mailbox.
    /// Both under the peers lock, so a request is either taken here or
    /// finds no mailbox and starts a new thread.
    fn take_pending(&self) -> Option<ReadRequest> {
        let mut peers = self.shared.peers();
        if let Some(Mail::Request(request)) = self.mailbox.open() {
            return Some(request);
        }
        if peers.get(&self.peer).is_some_and(|m| m.id == self.id) {
            peers.remove(&self.peer);
        }
        None
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut peers = self.shared.peers();
        if peers.get(&self.peer).is_some_and(|m| m.id == self.id) {
            peers.remove(&self.peer);
        }
        drop(peers);
        self.shared.stats.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The body of a peer's thread, from its first request until no request
/// is left.
pub(super) fn run(slot: Slot, first: ReadRequest) {
    let shared = slot.shared.clone();
    let mailbox = slot.mailbox.clone();
    let peer = slot.peer;
    let mut request = first;
    loop {
        let started = clock::now();
        let (result, bytes, next) = transfer(&shared, &request, peer, &mailbox);
        let next = match result {
            Err(TransferError::Abandoned) => None,
            _ => next.or_else(|| slot.take_pending()),
        };
        match next {
            Some(next) => {
                record(&shared, peer, request, result, bytes, started);
                request = next;
            }
            None => {
                // Free the slot before anyone hears the transfer ended, so
                // a client told it is done can start the next one at once.
                drop(slot);
                record(&shared, peer, request, result, bytes, started);
                return;
            }
        }
    }
}

fn record(
    shared: &Shared,
    peer: SocketAddr,
    request: ReadRequest,
    result: Result<(), TransferError>,
    bytes: u64,
    started: SystemTime,
) {
    let file = &request.file;
    if matches!(result, Err(TransferError::Peer { .. })) && bytes == 0 {
        // A size probe, most likely: the client asks again for the file.
        shared.probed(peer.ip());
    }
    match &result {
        Ok(()) => {
            bump(&shared.stats.done);
            info!(%peer, %file, bytes, "TFTP transfer done");
        }
        Err(err @ (TransferError::Path(_) | TransferError::Superseded { .. })) => {
            bump(&shared.stats.failed);
            debug!(%peer, %file, "TFTP request ended: {err}");
        }
        Err(err) => {
            bump(&shared.stats.failed);
            info!(%peer, %file, bytes, "TFTP transfer failed: {err}");
        }
    }
    shared.emit(TransferEvent {
        peer,
        file: request.file,
        bytes,
        outcome: result.map_or_else(Outcome::Failed, |()| Outcome::Done),
        started,
        finished: clock::now(),
    });
}

/// Runs one transfer: the result, the payload bytes acknowledged, and the
/// request that superseded it.
fn transfer(
    shared: &Shared,
    req: &ReadRequest,
    peer: SocketAddr,
    mailbox: &Mailbox,
) -> (Result<(), TransferError>, u64, Option<ReadRequest>) {
    let mut bytes = 0;
    let mut next = None;
    let result = transfer_into(shared, req, peer, mailbox, &mut bytes, &mut next);
    (result, bytes, next)
}

fn transfer_into(
    shared: &Shared,
    req: &ReadRequest,
    peer: SocketAddr,
    mailbox: &Mailbox,
    bytes: &mut u64,
    next: &mut Option<ReadRequest>,
) -> Result<(), TransferError> {
    let socket = bind_transfer_socket(shared.local_ip, shared.device.as_deref())
        .map_err(TransferError::Socket)?;
    let generated = shared.generated.as_ref().and_then(|g| {
        let name = path::sanitize(&req.filename).ok()?;
        let bytes = g.file(peer.ip(), &name)?;
        Some((name, bytes))
    });
    let opened = match generated {
        Some((path, bytes)) => Opened::Generated { path, bytes },
        None => match shared.root.open_file(&req.filename) {
            Ok(opened) => Opened::File(opened),
            Err(err) => {
                let reply = packet::error(err.code(), client_message(&err));
                if let Err(send) = socket.send_to(&reply, peer) {
                    debug!(%peer, "failed to send: {send}");
                }
                return Err(err.into());
            }
        },
    };
    let (size, path) = match &opened {
        Opened::File(file) => (file.size, file.path.clone()),
        Opened::Generated { path, bytes } => (bytes.len() as u64, path.clone()),
    };
    // The size of a netascii transfer is only known once translated.
    let size = (req.mode == Mode::Octet).then_some(size);
    let options: Vec<(&[u8], &[u8])> = req
        .options
        .iter()
        .map(|(n, v)| (n.as_slice(), v.as_slice()))
        .collect();
    let mut transfer = Transfer {
        link: Link::new(socket, mailbox).with_busy_poll(BusyPoll {
            budget: if shared
                .spin_slots
                .crowded(shared.stats.active.load(Ordering::Relaxed))
            {
                std::time::Duration::ZERO
            } else {
                shared.busy_poll
            },
            slots: &shared.spin_slots,
        }),
        peer,
        params: option::negotiate(&options, shared.limits, size),
        retries: shared.retries,
        stats: &shared.stats,
        path,
        acked: 0,
        filename: &req.filename,
        heard: false,
        next: None,
    };
    debug!(
        %peer,
        file = %req.file,
        blksize = transfer.params.blksize,
        windowsize = transfer.params.windowsize,
        "TFTP transfer starting"
    );
    let result = match opened {
        Opened::File(file) => {
            // No bigger than the file: a storm holds thousands of these.
            let buffer = usize::try_from(file.size).map_or(READ_AHEAD, |s| s.clamp(1, READ_AHEAD));
            transfer.run(BufReader::with_capacity(buffer, file.file), req.mode)
        }
        Opened::Generated { bytes, .. } => transfer.run(io::Cursor::new(bytes), req.mode),
    };
    if let Err(TransferError::Read { .. }) = &result {
        transfer.send_error(ErrorCode::NotDefined, "read error");
    }
    *bytes = transfer.acked;
    *next = transfer.next.take();
    result
}

/// What a transfer sends: a file beneath the root, or bytes made for the
/// client.
enum Opened {
    File(path::Opened),
    Generated { path: PathBuf, bytes: Vec<u8> },
}

/// What the client is told; paths and reasons stay in the server's log.
fn client_message(err: &PathError) -> &'static str {
    match err.code() {
        ErrorCode::FileNotFound => "file not found",
        ErrorCode::AccessViolation => "access violation",
        _ => "cannot open file",
    }
}

/// A fresh blocking socket with an ephemeral port (the transfer's TID), on
/// the listening socket's address and device.
fn bind_transfer_socket(ip: IpAddr, device: Option<&[u8]>) -> io::Result<UdpSocket> {
    let addr = SocketAddr::new(ip, 0);
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if device.is_some() {
        socket.bind_device(device)?;
    }
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

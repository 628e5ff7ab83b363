//! The request loop: reads requests on the listening socket, refuses what
//! is not a read request, enforces the bound on concurrent transfers, and
//! runs each transfer as a task on its own ephemeral socket. It owns the
//! transfer bound, the counters and the events; the protocol of a transfer
//! lives in `transfer`.
//!
//! One task (and one slot of the bound) serves one peer (address and port)
//! at a time. A read request from a peer that has a transfer running is
//! handed to that transfer, which treats it as a retransmission of its own
//! request or as a new request that replaces it; so a retransmitted
//! request never starts a second transfer racing the first for the
//! client's TID, and a client that moves on is never made to wait.
//!
//! Refusals made before a transfer starts (write requests, malformed
//! packets, unknown modes, "server busy") are sent from the listening
//! socket, so a flood of them costs no sockets; everything else comes from
//! the transfer's own port.

use std::{
    collections::HashMap,
    io,
    net::{IpAddr, SocketAddr},
    path::Path,
    sync::{Arc, Mutex, PoisonError, atomic::Ordering},
    time::{Duration, SystemTime},
};

use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::{
    net::UdpSocket,
    sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch},
    task::JoinSet,
    time::Instant,
};
use tracing::{debug, info, warn};

use super::{
    ConfigError, Outcome, Stats, TftpConfig, TransferEvent, bump, option,
    packet::{self, ErrorCode, Packet, Request},
    path::{PathError, Root},
    source::{Mode, Source},
    transfer::{ReadRequest, Transfer, TransferError},
};

/// Largest request read; RFC 2347 keeps requests within 512 bytes.
const REQUEST_BUF: usize = 2048;
/// Minimum time between two "server busy" warnings; refusals in between
/// are counted and reported with the next one.
const BUSY_LOG_EVERY: Duration = Duration::from_secs(1);

/// Why the server stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("failed to read the TFTP socket's address: {0}")]
    LocalAddr(#[source] io::Error),
    #[error("failed to receive TFTP requests: {0}")]
    Recv(#[source] io::Error),
    #[error("failed to start the TFTP server thread: {0}")]
    Thread(#[source] io::Error),
    #[error("the TFTP server thread panicked")]
    Panicked,
}

/// A configured server, ready to serve a socket.
#[derive(Debug)]
pub struct Server {
    cfg: TftpConfig,
    root: Arc<Root>,
    stats: Arc<Stats>,
}

/// Serves `socket` with `cfg` until `shutdown` turns true (or its sender is
/// dropped). Shorthand for [`Server::new`] then [`Server::serve`].
pub async fn serve(
    socket: UdpSocket,
    cfg: TftpConfig,
    events: Option<mpsc::Sender<TransferEvent>>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ServeError> {
    Server::new(cfg)?.serve(socket, events, shutdown).await
}

impl Server {
    /// Validates `cfg` and opens its root directory.
    pub fn new(cfg: TftpConfig) -> Result<Server, ConfigError> {
        cfg.validate()?;
        let root = Root::open(&cfg.root)?;
        Ok(Server {
            cfg,
            root: Arc::new(root),
            stats: Arc::default(),
        })
    }

    /// The counters, live while the server runs.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// The canonical root directory.
    pub fn root(&self) -> &Path {
        self.root.dir()
    }

    /// Serves until `shutdown` turns true (or its sender is dropped); then
    /// stops taking requests and abandons transfers in progress.
    ///
    /// Events are sent with `try_send`: a full or closed channel drops them
    /// (counted in [`Stats::events_dropped`]) rather than stall transfers.
    /// Bind `socket` to the address clients are told to use (the DHCP
    /// next-server): transfer sockets are bound to the same address and
    /// device, so replies come from where the client sent its request.
    pub async fn serve(
        self,
        socket: UdpSocket,
        events: Option<mpsc::Sender<TransferEvent>>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), ServeError> {
        let local = socket.local_addr().map_err(ServeError::LocalAddr)?;
        // A socket bound to a device keeps its transfers on that device.
        let device = SockRef::from(&socket).device().ok().flatten();
        let shared = Arc::new(Shared {
            root: self.root,
            stats: self.stats,
            limits: self.cfg.limits(),
            retries: self.cfg.retries,
            local_ip: local.ip(),
            device,
            events,
            peers: Mutex::default(),
        });
        let permits = Arc::new(Semaphore::new(self.cfg.max_transfers));
        let mut listener = Listener {
            socket,
            shared,
            permits,
            max_transfers: self.cfg.max_transfers,
            tasks: JoinSet::new(),
            busy_log: BusyLog::default(),
            next_id: 0,
        };
        info!(%local, root = %listener.shared.root.dir().display(), "TFTP server listening");
        let mut buf = vec![0u8; REQUEST_BUF];
        loop {
            tokio::select! {
                biased;
                () = stopped(&mut shutdown) => break,
                Some(joined) = listener.tasks.join_next(), if !listener.tasks.is_empty() => {
                    if let Err(err) = joined {
                        warn!("TFTP transfer task failed: {err}");
                    }
                }
                received = listener.socket.recv_from(&mut buf) => match received {
                    Ok((len, peer)) => listener.handle(&buf[..len], peer).await,
                    // An ICMP error for an earlier reply, not a failure of
                    // this socket.
                    Err(err) if matches!(
                        err.kind(),
                        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset
                    ) => debug!("TFTP request socket: {err}"),
                    Err(err) => return Err(ServeError::Recv(err)),
                },
            }
        }
        let abandoned = listener.tasks.len();
        listener.tasks.shutdown().await;
        info!(abandoned, "TFTP server stopped");
        Ok(())
    }
}

/// Resolves once `shutdown` is true or its sender is gone. The watch's
/// guard is dropped here, not held across the loop's awaits, which keeps
/// the serve future `Send`.
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// What the transfer tasks share with the loop.
struct Shared {
    root: Arc<Root>,
    stats: Arc<Stats>,
    limits: option::Limits,
    retries: u32,
    local_ip: IpAddr,
    device: Option<Vec<u8>>,
    events: Option<mpsc::Sender<TransferEvent>>,
    /// Peers with a transfer running, and where to hand their new requests.
    peers: Mutex<HashMap<SocketAddr, Mailbox>>,
}

/// The way to a running transfer's task.
struct Mailbox {
    /// Tells this task's entry from a later one for the same peer.
    id: u64,
    requests: mpsc::Sender<ReadRequest>,
}

impl Shared {
    fn emit(&self, event: TransferEvent) {
        let Some(events) = &self.events else {
            return;
        };
        if events.try_send(event).is_err() {
            bump(&self.stats.events_dropped);
        }
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Mailbox>> {
        self.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct Listener {
    socket: UdpSocket,
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    max_transfers: usize,
    tasks: JoinSet<()>,
    busy_log: BusyLog,
    next_id: u64,
}

impl Listener {
    async fn handle(&mut self, data: &[u8], peer: SocketAddr) {
        match packet::parse(data) {
            Ok(Packet::Rrq(req)) => self.start(req, peer).await,
            Ok(Packet::Wrq(req)) => {
                debug!(%peer, file = %String::from_utf8_lossy(req.filename), "refusing write request");
                self.refuse(
                    peer,
                    ErrorCode::AccessViolation,
                    "access violation: read-only server",
                )
                .await;
            }
            // Never answer an error with an error (RFC 1350 section 7).
            Ok(Packet::Error { .. }) => bump(&self.shared.stats.refused),
            Ok(other) => {
                debug!(%peer, "unexpected packet on the request port: {other:?}");
                self.refuse(peer, ErrorCode::IllegalOperation, "illegal TFTP operation")
                    .await;
            }
            Err(err) => {
                debug!(%peer, "malformed request: {err}");
                self.refuse(peer, ErrorCode::IllegalOperation, "malformed request")
                    .await;
            }
        }
    }

    async fn refuse(&self, peer: SocketAddr, code: ErrorCode, message: &str) {
        bump(&self.shared.stats.refused);
        self.reply(peer, &packet::error(code, message)).await;
    }

    async fn reply(&self, peer: SocketAddr, pkt: &[u8]) {
        if let Err(err) = self.socket.send_to(pkt, peer).await {
            bump(&self.shared.stats.send_errors);
            debug!(%peer, "failed to send: {err}");
        }
    }

    async fn start(&mut self, req: Request<'_>, peer: SocketAddr) {
        let stats = &self.shared.stats;
        bump(&stats.requests);
        let file = String::from_utf8_lossy(req.filename).into_owned();
        let Some(mode) = Mode::from_wire(req.mode) else {
            debug!(%peer, %file, mode = %String::from_utf8_lossy(req.mode), "unsupported mode");
            self.refuse(
                peer,
                ErrorCode::IllegalOperation,
                "unsupported transfer mode",
            )
            .await;
            return;
        };
        let request = ReadRequest {
            filename: req.filename.to_vec(),
            file,
            mode,
            options: req
                .options
                .iter()
                .map(|(n, v)| (n.to_vec(), v.to_vec()))
                .collect(),
        };
        if let Some(request) = self.hand_over(peer, request) {
            self.spawn(peer, request).await;
        }
    }

    /// Gives `request` to the peer's running transfer, if it has one;
    /// otherwise hands it back.
    fn hand_over(&self, peer: SocketAddr, request: ReadRequest) -> Option<ReadRequest> {
        let peers = self.shared.peers();
        let Some(mailbox) = peers.get(&peer) else {
            return Some(request);
        };
        // One request waiting is enough: more are retransmissions.
        if mailbox.requests.try_send(request).is_err() {
            bump(&self.shared.stats.duplicates);
        }
        None
    }

    async fn spawn(&mut self, peer: SocketAddr, request: ReadRequest) {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            self.busy(peer, request.file).await;
            return;
        };
        let (requests, mailbox) = mpsc::channel(1);
        let id = self.next_id;
        self.next_id += 1;
        self.shared.peers().insert(peer, Mailbox { id, requests });
        self.shared.stats.active.fetch_add(1, Ordering::Relaxed);
        let slot = Slot {
            shared: self.shared.clone(),
            peer,
            id,
            _permit: permit,
        };
        self.tasks.spawn(run(slot, request, mailbox));
    }

    async fn busy(&mut self, peer: SocketAddr, file: String) {
        let stats = &self.shared.stats;
        bump(&stats.busy);
        let total = stats.busy.load(Ordering::Relaxed);
        if let Some(suppressed) = self.busy_log.admit(Instant::now()) {
            warn!(
                %peer,
                %file,
                active = self.max_transfers,
                refused_total = total,
                refused_since_last_warning = suppressed,
                "TFTP server busy: {} transfers in progress (max_transfers), refusing request",
                self.max_transfers
            );
        } else {
            debug!(%peer, %file, "TFTP server busy, refusing request");
        }
        self.reply(peer, &packet::error(ErrorCode::NotDefined, "server busy"))
            .await;
        let now = SystemTime::now();
        self.shared.emit(TransferEvent {
            peer,
            file,
            bytes: 0,
            outcome: Outcome::Failed(TransferError::Busy {
                active: self.max_transfers,
            }),
            started: now,
            finished: now,
        });
    }
}

/// Rate limit of the "server busy" warning.
#[derive(Default)]
struct BusyLog {
    last: Option<Instant>,
    suppressed: u64,
}

impl BusyLog {
    /// Whether to warn now; if so, how many refusals went unreported since
    /// the last warning.
    fn admit(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < BUSY_LOG_EVERY)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// A peer's claim on the bound and on its mailbox; released on drop,
/// including when the task is aborted at shutdown.
struct Slot {
    shared: Arc<Shared>,
    peer: SocketAddr,
    id: u64,
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    /// The request that arrived while the last transfer ended, if any;
    /// otherwise gives up the peer's mailbox. Both under the peers lock, so
    /// a request is either taken here or finds no mailbox and starts a new
    /// task.
    fn take_pending(&self, mailbox: &mut mpsc::Receiver<ReadRequest>) -> Option<ReadRequest> {
        let mut peers = self.shared.peers();
        if let Ok(request) = mailbox.try_recv() {
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

/// One peer's task: runs its transfers one after the other (a new request
/// from the peer supersedes the running one), counting, logging and
/// emitting an event for each.
async fn run(slot: Slot, first: ReadRequest, mut mailbox: mpsc::Receiver<ReadRequest>) {
    let shared = slot.shared.clone();
    let peer = slot.peer;
    let mut request = first;
    loop {
        let started = SystemTime::now();
        let (result, bytes, next) = transfer(&shared, &request, peer, &mut mailbox).await;
        match next.or_else(|| slot.take_pending(&mut mailbox)) {
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
        finished: SystemTime::now(),
    });
}

/// Runs one transfer: the result, the payload bytes acknowledged, and the
/// request that superseded it.
async fn transfer(
    shared: &Arc<Shared>,
    req: &ReadRequest,
    peer: SocketAddr,
    mailbox: &mut mpsc::Receiver<ReadRequest>,
) -> (Result<(), TransferError>, u64, Option<ReadRequest>) {
    let mut bytes = 0;
    let mut next = None;
    let result = transfer_into(shared, req, peer, mailbox, &mut bytes, &mut next).await;
    (result, bytes, next)
}

async fn transfer_into(
    shared: &Arc<Shared>,
    req: &ReadRequest,
    peer: SocketAddr,
    mailbox: &mut mpsc::Receiver<ReadRequest>,
    bytes: &mut u64,
    next: &mut Option<ReadRequest>,
) -> Result<(), TransferError> {
    let socket = bind_transfer_socket(shared.local_ip, shared.device.as_deref())
        .map_err(TransferError::Socket)?;
    let root = shared.root.clone();
    let name = req.filename.clone();
    let opened = match tokio::task::spawn_blocking(move || root.open_file(&name)).await? {
        Ok(opened) => opened,
        Err(err) => {
            let reply = packet::error(err.code(), client_message(&err));
            if let Err(send) = socket.send_to(&reply, peer).await {
                debug!(%peer, "failed to send: {send}");
            }
            return Err(err.into());
        }
    };
    // The size of a netascii transfer is only known once translated.
    let size = (req.mode == Mode::Octet).then_some(opened.size);
    let options: Vec<(&[u8], &[u8])> = req
        .options
        .iter()
        .map(|(n, v)| (n.as_slice(), v.as_slice()))
        .collect();
    let mut transfer = Transfer {
        socket,
        peer,
        params: option::negotiate(&options, shared.limits, size),
        retries: shared.retries,
        stats: &shared.stats,
        path: opened.path,
        acked: 0,
        filename: &req.filename,
        mailbox,
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
    let result = transfer.run(Source::new(opened.file, req.mode)).await;
    if let Err(TransferError::Read { .. }) = &result {
        transfer
            .send_error(ErrorCode::NotDefined, "read error")
            .await;
    }
    *bytes = transfer.acked;
    *next = transfer.next.take();
    result
}

/// What the client is told; paths and reasons stay in the server's log.
fn client_message(err: &PathError) -> &'static str {
    match err.code() {
        ErrorCode::FileNotFound => "file not found",
        ErrorCode::AccessViolation => "access violation",
        _ => "cannot open file",
    }
}

/// A fresh socket with an ephemeral port (the transfer's TID), on the
/// listening socket's address and device.
fn bind_transfer_socket(ip: IpAddr, device: Option<&[u8]>) -> io::Result<UdpSocket> {
    let addr = SocketAddr::new(ip, 0);
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if device.is_some() {
        socket.bind_device(device)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    UdpSocket::from_std(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_warnings_are_rate_limited_and_count_what_they_skipped() {
        let mut log = BusyLog::default();
        let t0 = Instant::now();
        assert_eq!(log.admit(t0), Some(0));
        assert_eq!(log.admit(t0 + Duration::from_millis(10)), None);
        assert_eq!(log.admit(t0 + Duration::from_millis(20)), None);
        assert_eq!(log.admit(t0 + Duration::from_millis(1200)), Some(2));
        assert_eq!(log.admit(t0 + Duration::from_millis(1300)), None);
    }
}

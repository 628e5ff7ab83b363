//! The request loop: reads requests on the listening socket, refuses what
//! is not a read request, enforces the bound on concurrent transfers, and
//! starts a thread per peer whose transfers each run on their own
//! ephemeral socket. It owns the transfer bound, the counters and the
//! events; a peer's thread lives in `worker`, the protocol of a transfer in
//! `transfer`.
//!
//! One thread (and one slot of the bound) serves one peer (address and
//! port) at a time, so there are at most `max_transfers` of them; the
//! requests beyond wait in `waiting`, first come first served, and are
//! refused "server busy" only when `max_waiting` already wait. A read
//! request from a peer that has a transfer running is left in that
//! transfer's mailbox; the transfer treats it as a retransmission of its
//! own request or as a new request that replaces it. So a retransmitted
//! request never starts a second transfer racing the first for the
//! client's TID, and a client that moves on is never made to wait.
//!
//! Refusals made before a transfer starts (write requests, malformed
//! packets, unknown modes, "server busy") are sent from the listening
//! socket, so a flood of them costs no sockets; everything else comes from
//! the transfer's own port.

use std::{
    convert::Infallible,
    io,
    net::{IpAddr, SocketAddr},
    path::Path,
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use socket2::SockRef;
use tokio::{
    net::UdpSocket,
    sync::{OwnedSemaphorePermit, Semaphore, mpsc},
    time::Instant,
};
use tracing::{debug, info, warn};

use crate::{admission::Admission, clock, logging::Every, shutdown::Shutdown};

use super::{
    ConfigError, Generated, Outcome, Stats, TftpConfig, TransferEvent, bump,
    mailbox::Mailbox,
    packet::{self, ErrorCode, Packet, Request},
    path::Root,
    request::ReadRequest,
    shared::Shared,
    source::Mode,
    spin::SpinSlots,
    transfer::TransferError,
    waiting::{Offer, Waiting},
    worker::{self, Slot},
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

/// A configured server, ready to serve a socket. Clones share the root and
/// the counters, so one server can serve a socket per interface.
#[derive(Clone)]
pub struct Server {
    cfg: TftpConfig,
    root: Arc<Root>,
    stats: Arc<Stats>,
    generated: Option<Arc<dyn Generated>>,
    gate: Option<Gate>,
    admission: Option<Arc<Admission>>,
}

/// Asked before every read request with the client's address: `Some`
/// refuses it with an access violation carrying that reason (the agent
/// refuses hosts whose `netboot` policy gives them no boot file now).
pub type Gate = Arc<dyn Fn(IpAddr) -> Option<&'static str> + Send + Sync>;

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("cfg", &self.cfg)
            .field("root", &self.root)
            .field("generated", &self.generated.is_some())
            .field("gated", &self.gate.is_some())
            .finish_non_exhaustive()
    }
}

/// Serves `socket` with `cfg` until `shutdown` stops (asked, or its trigger
/// dropped). Shorthand for [`Server::new`] then [`Server::serve`].
pub async fn serve(
    socket: UdpSocket,
    cfg: TftpConfig,
    events: Option<mpsc::Sender<TransferEvent>>,
    shutdown: Shutdown,
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
            generated: None,
            gate: None,
            admission: None,
        })
    }

    /// Asks `generated` for each requested name before the root.
    pub fn with_generated(mut self, generated: Arc<dyn Generated>) -> Server {
        self.generated = Some(generated);
        self
    }

    /// Puts `gate` in front of every read request.
    pub fn with_gate(mut self, gate: Gate) -> Server {
        self.gate = Some(gate);
        self
    }

    /// Gives each client that asks for a file its place in `admission`'s
    /// order (its interface's), where the boot HTTP listener's artifacts
    /// wait: a machine that had its boot file first gets its kernel first.
    pub fn with_admission(mut self, admission: Arc<Admission>) -> Server {
        self.admission = Some(admission);
        self
    }

    /// The counters, live while the server runs.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// The canonical root directory.
    pub fn root(&self) -> &Path {
        self.root.dir()
    }

    /// Serves until `shutdown` stops (asked, or its trigger dropped); then
    /// stops taking requests, abandons transfers in progress and waits for
    /// their threads to end.
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
        mut shutdown: Shutdown,
    ) -> Result<(), ServeError> {
        let local = socket.local_addr().map_err(ServeError::LocalAddr)?;
        // A socket bound to a device keeps its transfers on that device.
        let device = SockRef::from(&socket).device().ok().flatten();
        let shared = Arc::new(Shared {
            root: self.root,
            generated: self.generated,
            stats: self.stats,
            limits: self.cfg.limits(),
            retries: self.cfg.retries,
            local_ip: local.ip(),
            device,
            events,
            peers: Mutex::default(),
            busy_poll: self.cfg.busy_poll,
            spin_slots: SpinSlots::for_this_machine(),
            probed: Mutex::default(),
        });
        let permits = Arc::new(Semaphore::new(self.cfg.max_transfers));
        let (running, mut ended) = mpsc::channel(1);
        let mut listener = Listener {
            socket,
            shared,
            permits,
            max_transfers: self.cfg.max_transfers,
            waiting: Waiting::new(self.cfg.max_waiting),
            published: (0, 0),
            running,
            busy_log: Every::new(BUSY_LOG_EVERY),
            next_id: 0,
            gate: self.gate,
            admission: self.admission,
        };
        info!(%local, root = %listener.shared.root.dir().display(), "TFTP server listening");
        let mut buf = vec![0u8; REQUEST_BUF];
        loop {
            tokio::select! {
                biased;
                () = shutdown.stopped() => break,
                // Before new requests: the waiting ones came first.
                permit = listener.permits.clone().acquire_owned(),
                    if !listener.waiting.is_empty() =>
                {
                    let permit = permit.expect("the transfer bound is never closed");
                    listener.start_waiting(permit).await;
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
        let abandoned = listener.abandon_all();
        listener.waiting.clear();
        listener.sync_waiting();
        // The channel closes once the last peer thread drops its sender.
        drop(listener);
        while ended.recv().await.is_some() {}
        info!(abandoned, "TFTP server stopped");
        Ok(())
    }
}

struct Listener {
    socket: UdpSocket,
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    max_transfers: usize,
    waiting: Waiting,
    /// The queue length and expiries last added to the counters.
    published: (u64, u64),
    /// Cloned into every peer thread, which drops it when it ends;
    /// nothing is ever sent.
    running: mpsc::Sender<Infallible>,
    busy_log: Every,
    next_id: u64,
    gate: Option<Gate>,
    admission: Option<Arc<Admission>>,
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
        if let Some(why) = self.gate.as_ref().and_then(|gate| gate(peer.ip())) {
            debug!(%peer, %file, reason = why, "read request refused");
            self.refuse(peer, ErrorCode::AccessViolation, why).await;
            return;
        }
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
        if let Some(admission) = &self.admission {
            admission.place(peer.ip());
        }
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

    /// Leaves `request` in the mailbox of the peer's running transfer, if
    /// it has one; otherwise hands it back.
    fn hand_over(&self, peer: SocketAddr, request: ReadRequest) -> Option<ReadRequest> {
        let peers = self.shared.peers();
        let Some(entry) = peers.get(&peer) else {
            return Some(request);
        };
        // One request waiting is enough: more are retransmissions.
        if !entry.mailbox.deliver(request) {
            bump(&self.shared.stats.duplicates);
        }
        None
    }

    /// Starts a thread for the peer's first request if the bound allows and
    /// nobody is waiting; otherwise the request waits.
    async fn spawn(&mut self, peer: SocketAddr, request: ReadRequest) {
        let permit = if self.waiting.is_empty() {
            self.permits.clone().try_acquire_owned().ok()
        } else {
            None
        };
        match permit {
            Some(permit) => self.launch(peer, request, permit).await,
            None => self.wait(peer, request).await,
        }
    }

    /// Holds `request` until a slot frees, or refuses it when the queue is
    /// full.
    async fn wait(&mut self, peer: SocketAddr, request: ReadRequest) {
        let stats = self.shared.stats.clone();
        let first = self.shared.follows_probe(peer.ip());
        match self.waiting.offer(peer, request, Instant::now(), first) {
            Offer::Queued => bump(&stats.waited),
            Offer::Refreshed => bump(&stats.duplicates),
            Offer::Full(request) => self.busy(peer, request.file).await,
        }
        self.sync_waiting();
    }

    /// Starts the longest-waiting request with `permit`; a permit nobody is
    /// left to take goes back to the bound.
    async fn start_waiting(&mut self, permit: OwnedSemaphorePermit) {
        let next = self.waiting.next(Instant::now());
        self.sync_waiting();
        if let Some((peer, request)) = next {
            self.launch(peer, request, permit).await;
        }
    }

    /// Adds what the queue's length and expiries did since the last call to
    /// the counters (which the loops of several sockets may share).
    fn sync_waiting(&mut self) {
        let stats = &self.shared.stats;
        let (len, expired) = (self.waiting.len() as u64, self.waiting.expired);
        let (was_len, was_expired) = self.published;
        if len >= was_len {
            stats.waiting.fetch_add(len - was_len, Ordering::Relaxed);
        } else {
            stats.waiting.fetch_sub(was_len - len, Ordering::Relaxed);
        }
        stats
            .wait_expired
            .fetch_add(expired - was_expired, Ordering::Relaxed);
        self.published = (len, expired);
    }

    /// Starts a thread for the peer's request in the slot `permit` holds.
    async fn launch(
        &mut self,
        peer: SocketAddr,
        request: ReadRequest,
        permit: OwnedSemaphorePermit,
    ) {
        let mailbox = match Mailbox::new() {
            Ok(mailbox) => Arc::new(mailbox),
            Err(err) => return self.not_started(peer, request.file, err).await,
        };
        let id = self.next_id;
        self.next_id += 1;
        let slot = Slot::claim(self.shared.clone(), peer, id, mailbox, permit);
        let file = request.file.clone();
        let running = self.running.clone();
        let started = std::thread::Builder::new()
            .name("tftp-transfer".into())
            .spawn(move || {
                worker::run(slot, request);
                drop(running);
            });
        // On failure the closure, and with it the slot, is dropped.
        if let Err(err) = started {
            self.not_started(peer, file, err).await;
        }
    }

    /// Answers a request whose transfer could not be started (no thread or
    /// no eventfd to be had) with ERROR 0, and records it as failed.
    async fn not_started(&self, peer: SocketAddr, file: String, err: io::Error) {
        warn!(%peer, %file, "failed to start a TFTP transfer: {err}");
        bump(&self.shared.stats.failed);
        self.reply(peer, &packet::error(ErrorCode::NotDefined, "server error"))
            .await;
        self.emit_refused(peer, file, TransferError::Start(err));
    }

    /// Records a request answered with an error before any transfer ran.
    fn emit_refused(&self, peer: SocketAddr, file: String, err: TransferError) {
        let now = clock::now();
        self.shared.emit(TransferEvent {
            peer,
            file,
            bytes: 0,
            outcome: Outcome::Failed(err),
            started: now,
            finished: now,
        });
    }

    /// Tells every running transfer to stop; returns how many there were.
    fn abandon_all(&self) -> usize {
        let peers = self.shared.peers();
        for entry in peers.values() {
            entry.mailbox.abandon();
        }
        peers.len()
    }

    async fn busy(&mut self, peer: SocketAddr, file: String) {
        let stats = &self.shared.stats;
        bump(&stats.busy);
        let total = stats.busy.load(Ordering::Relaxed);
        if let Some(suppressed) = self.busy_log.admit(std::time::Instant::now()) {
            warn!(
                %peer,
                %file,
                active = self.max_transfers,
                refused_total = total,
                refused_since_last_warning = suppressed,
                waiting = self.waiting.len(),
                "TFTP server busy: {} transfers in progress (max_transfers) and the wait queue full, refusing request",
                self.max_transfers
            );
        } else {
            debug!(%peer, %file, "TFTP server busy, refusing request");
        }
        self.reply(peer, &packet::error(ErrorCode::NotDefined, "server busy"))
            .await;
        let active = self.max_transfers;
        self.emit_refused(peer, file, TransferError::Busy { active });
    }
}

//! The slow path: userspace DHCP for everything the XDP program passes to the
//! kernel (iPXE clients, unknown MACs, relayed requests with option 82, ...).
//!
//! One thread owns the port-67 socket, reads requests in batches, applies
//! `decide`, settles pool leases for a whole batch in one durable commit, and
//! sends each reply where RFC 2131 section 4.1 says: to the relay, to
//! ciaddr, or as a raw frame to a client that has no address yet. It owns
//! delivery and rate limiting, and counts what it does in the shared
//! state's `SlowPathStats`; policy stays in `decide`. A second instance on
//! the PXE boot server port (4011) reads proxyDHCP clients' follow-up
//! requests and answers each where it came from ([`serve_boot_server`]).

use std::{
    fmt::Write as _,
    io,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    panic::{self, AssertUnwindSafe},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use pxe_ebpf_common::{Counter, ReplyDestination, bootp, reply_destination};
use tracing::{debug, error, warn};

use super::{
    Answer, PoolAsk, Pools, Reply, ReplyKind, Request, Server, decide_shared, encode, nak,
    pool_reply,
};
use crate::{
    clock,
    discovered::{Registry, Sighting},
    inventory::Inventory,
    lease::{
        Client, DeclineOutcome, LeaseRequest, LeaseState, LeaseStore, NakReason, Pool, Quarantine,
        RequestOutcome,
    },
    logging::Every,
    ratelimit::{Limited, Limiter, Rate},
    rawsock::RawSocket,
    state::State,
    sync::{lock, read},
    trace::TracePath,
    wire::{Endpoint, udp_frame},
};

/// Requests read before their pool leases are committed together.
const BATCH: usize = 64;
/// What a DHCPDECLINE may quarantine, and for how long.
const QUARANTINE: Quarantine = Quarantine::DEFAULT;
/// How often a decline refused for a quarantine limit is logged.
const DECLINE_WARN_EVERY: Duration = Duration::from_secs(60);
/// How often a request whose handling panicked is logged.
const PANIC_LOG_EVERY: Duration = Duration::from_secs(60);
/// How often expired leases are swept.
const EXPIRE_EVERY: Duration = Duration::from_secs(10);

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Rates of the storm guard.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub per_mac: Rate,
    pub unknown: Rate,
    pub tracked_macs: usize,
}

/// Serves until `stop` is set; `sock` is bound to port 67 on the interface,
/// `raw` sends frames on it. A panic while handling one request is
/// contained there (see [`SlowPath::handle_batch`]); the caller supervises
/// this loop for anything else.
pub fn serve(
    sock: &UdpSocket,
    raw: &RawSocket,
    server: Server,
    state: Arc<State>,
    limits: Limits,
    stop: &AtomicBool,
) {
    run(sock, raw, server, state, limits, stop, false);
}

/// Serves the PXE boot server port until `stop`: `sock` is bound to UDP
/// 4011 on the interface. Requests read there are proxyDHCP clients'
/// follow-up DHCPREQUESTs (PXE 2.1 section 2.2.3), decided under the same
/// policy and answered to the address and port they came from.
pub fn serve_boot_server(
    sock: &UdpSocket,
    raw: &RawSocket,
    server: Server,
    state: Arc<State>,
    limits: Limits,
    stop: &AtomicBool,
) {
    run(sock, raw, server, state, limits, stop, true);
}

fn run(
    sock: &UdpSocket,
    raw: &RawSocket,
    server: Server,
    state: Arc<State>,
    limits: Limits,
    stop: &AtomicBool,
    boot_server: bool,
) {
    let mut path = SlowPath {
        sock,
        raw,
        boot_server,
        peer: None,
        server,
        limiter: Limiter::new(limits.per_mac, limits.unknown, limits.tracked_macs),
        started: Instant::now(),
        last_expire: Instant::now(),
        decline_warned: None,
        panic_logged: None,
        lease_error_log: Every::new(Duration::from_secs(1)),
        batch_at: Instant::now(),
        state,
    };
    let mut buf = vec![[0u8; 1500]; BATCH];
    while !stop.load(Ordering::Relaxed) {
        // The port-67 loop is the one readiness follows and the one that
        // expires leases (port 4011 leases nothing).
        if !boot_server {
            path.state.health.slow_path_beat();
        }
        let received = path.receive(&mut buf);
        path.handle_batch(&buf, &received);
        if !boot_server {
            path.expire_leases();
        }
    }
}

struct SlowPath<'a> {
    sock: &'a UdpSocket,
    raw: &'a RawSocket,
    /// This instance reads the PXE boot server port (4011).
    boot_server: bool,
    /// Where the request being handled came from: a boot server port
    /// request is answered there.
    peer: Option<SocketAddr>,
    server: Server,
    limiter: Limiter,
    started: Instant,
    last_expire: Instant,
    /// When a decline refused for a quarantine limit was last logged.
    decline_warned: Option<Instant>,
    /// When a request that panicked was last logged.
    panic_logged: Option<Instant>,
    /// A full or failing disk fails every commit: one warning a second.
    lease_error_log: Every,
    /// When the batch being handled was read: a reply's latency counts
    /// from here (its lease commit included).
    batch_at: Instant,
    state: Arc<State>,
}

/// A request waiting for its lease to be committed with the batch.
struct PendingAck {
    req: Request,
    ask: PoolAsk,
    ip: Ipv4Addr,
    pool: Pool,
}

impl SlowPath<'_> {
    /// Waits for a datagram (up to the socket's read timeout), then takes
    /// what else is already queued, up to a batch.
    fn receive(&self, buf: &mut [[u8; 1500]]) -> Vec<(usize, SocketAddr)> {
        let mut got = Vec::new();
        for (i, slot) in buf.iter_mut().enumerate() {
            if i == 1 && self.sock.set_nonblocking(true).is_err() {
                break;
            }
            match self.sock.recv_from(slot) {
                Ok(r) => got.push(r),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    break;
                }
                Err(e) => {
                    warn!(error = %e, "slow path receive failed");
                    break;
                }
            }
        }
        let _ = self.sock.set_nonblocking(false);
        got
    }

    fn handle_batch(&mut self, buf: &[[u8; 1500]], received: &[(usize, SocketAddr)]) {
        if received.is_empty() {
            return;
        }
        self.batch_at = Instant::now();
        let inv = read(&self.state.inventory).clone();
        let (now, mono) = (clock::now_secs(), self.started.elapsed().as_secs_f64());
        let mut pending = Vec::new();
        for (slot, (len, from)) in buf.iter().zip(received) {
            bump(&self.state.stats.rx);
            self.peer = Some(*from);
            let bytes = &slot[..*len];
            // No request may stop the slow path, whatever a parser does
            // with it: a panic ends this request only.
            let handled =
                panic::catch_unwind(AssertUnwindSafe(|| self.handle_one(&inv, bytes, now, mono)));
            match handled {
                Ok(Some(ack)) => pending.push(ack),
                Ok(None) => {}
                Err(_) => {
                    bump(&self.state.stats.panics);
                    // Crafted requests can come in floods: one line a
                    // minute, with the request, and the count on /metrics.
                    if self
                        .panic_logged
                        .is_none_or(|at| at.elapsed() >= PANIC_LOG_EVERY)
                    {
                        self.panic_logged = Some(Instant::now());
                        error!(
                            request = %hex(bytes),
                            "handling a DHCP request panicked; request dropped \
                             (pxe_slow_errors_total{{kind=\"panic\"}} counts them all)"
                        );
                    }
                }
            }
        }
        self.commit(&inv, pending, now);
    }

    /// Parses, admits and answers one request; returns it when its lease
    /// must be committed with the batch.
    fn handle_one(
        &mut self,
        inv: &Inventory,
        bytes: &[u8],
        now: u64,
        mono: f64,
    ) -> Option<PendingAck> {
        let Ok(mut req) = Request::parse(bytes) else {
            bump(&self.state.stats.malformed);
            return None;
        };
        req.boot_server = self.boot_server;
        let known = inv.host_by_mac(req.chaddr).is_some();
        if let Err(limited) = self.limiter.admit(req.chaddr, known, mono) {
            self.trace(&req, "rate_limited", || format!("{limited:?}"));
            let stats = &self.state.stats;
            bump(match limited {
                Limited::Mac => &stats.limited_mac,
                Limited::Unknown => &stats.limited_unknown,
                Limited::Table => &stats.limited_table,
            });
            return None;
        }
        if !known {
            self.discovered().record(req.chaddr, sighting(&req), now);
        }
        self.answer(inv, req, known, now)
    }

    /// Answers one request, or returns it when its lease must be committed.
    fn answer(
        &mut self,
        inv: &Inventory,
        req: Request,
        known: bool,
        now: u64,
    ) -> Option<PendingAck> {
        let share = self.state.share();
        // Only a shared pool asks whose client this is; alone, every one is.
        let held = (share.is_shared() && !known)
            .then(|| self.leases().lease_of(client(&req)))
            .flatten()
            .filter(|l| {
                matches!(l.state, LeaseState::Bound | LeaseState::Offered) && l.expires > now
            })
            .map(|l| l.ip);
        let pools = Pools {
            share: &share,
            held,
        };
        match decide_shared(&req, inv, &self.server, &pools) {
            Answer::Reply(reply) => self.send(&req, &reply),
            Answer::Ignore(reason) => {
                self.trace(&req, "ignore", || reason.name().to_string());
                bump(&self.state.stats.ignored[reason as usize]);
                if let (Counter::DropOtherServer, Some(other)) = (reason, req.server_id) {
                    self.state
                        .other_servers
                        .seen(inv, &share, req.chaddr, other);
                }
            }
            Answer::Pool(ask) => {
                let pool = pool_of(inv, &ask);
                match ask.kind {
                    ReplyKind::Offer => self.offer(inv, &req, &ask, &pool, now),
                    _ => {
                        return Some(PendingAck {
                            ip: ask.wanted?,
                            req,
                            ask,
                            pool,
                        });
                    }
                }
            }
            Answer::Release { ip } => {
                self.trace(&req, "release", || ip.to_string());
                let released = self.leases().release(client(&req), ip, now);
                if let Err(e) = released {
                    self.lease_error(&e);
                }
            }
            Answer::Decline { ip } => {
                self.trace(&req, "decline", || ip.to_string());
                self.decline(inv, &req, ip, now);
            }
            Answer::ReservationDeclined { ip } => {
                self.trace(&req, "reservation declined", || ip.to_string());
                self.reservation_declined(inv, &req, ip);
            }
            Answer::NotOurs => {
                self.trace(&req, "ignore", || {
                    format!(
                        "another agent's (slot {:?} of {})",
                        share.slot(),
                        share.slots()
                    )
                });
                bump(&self.state.stats.not_ours);
            }
        }
        None
    }

    /// A pool client's DHCPDECLINE: quarantines the address within the
    /// lease store's limits, and counts the declines those limits refuse.
    fn decline(&mut self, inv: &Inventory, req: &Request, ip: Ipv4Addr, now: u64) {
        let outcome = match pool_containing(inv, ip) {
            Some(pool) => self
                .leases()
                .decline(client(req), &pool, ip, now, &QUARANTINE),
            None => Ok(DeclineOutcome::NotGiven),
        };
        let stats = &self.state.stats;
        match outcome {
            Ok(DeclineOutcome::Quarantined) => {
                warn!(mac = %req.chaddr, %ip, "address declined by its client: quarantined")
            }
            Ok(DeclineOutcome::NotGiven) => {
                bump(&stats.declines_not_given);
                debug!(mac = %req.chaddr, %ip, "decline of an address not given to this MAC ignored");
            }
            Ok(limited @ (DeclineOutcome::MacLimit | DeclineOutcome::PoolLimit)) => {
                let (counter, what) = if limited == DeclineOutcome::MacLimit {
                    (&stats.declines_mac_limit, "this MAC has")
                } else {
                    (&stats.declines_pool_limit, "the pool has")
                };
                bump(counter);
                // Declines past a limit come in floods: one line a minute.
                if self
                    .decline_warned
                    .is_none_or(|at| at.elapsed() >= DECLINE_WARN_EVERY)
                {
                    self.decline_warned = Some(Instant::now());
                    warn!(
                        mac = %req.chaddr,
                        %ip,
                        "decline ignored: {what} as many addresses in quarantine as allowed \
                         (counted in {})",
                        crate::metrics::SLOW_DECLINES_REFUSED
                    );
                }
            }
            Err(e) => self.lease_error(&e),
        }
    }

    /// A reserved host declined its address: another machine on the link
    /// holds it, and only an operator can settle that. Nothing is
    /// quarantined (the address is the host's alone); the conflict is
    /// logged, counted and shown in the host's progress.
    fn reservation_declined(&self, inv: &Inventory, req: &Request, ip: Ipv4Addr) {
        let host = inv
            .host_by_mac(req.chaddr)
            .map_or_else(|| req.chaddr.to_string(), |h| h.label());
        warn!(
            %host,
            mac = %req.chaddr,
            %ip,
            "host {host} declined its reserved address {ip}: another machine on the link uses it"
        );
        bump(&self.state.stats.reservation_declines);
        self.state
            .progress
            .declined(req.chaddr, clock::now_ms(), ip.to_string());
    }

    fn offer(&mut self, inv: &Inventory, req: &Request, ask: &PoolAsk, pool: &Pool, now: u64) {
        let offered = self.leases().offer(client(req), pool, ask.wanted, now);
        match offered {
            Ok(Some(ip)) => {
                self.discovered().assign(req.chaddr, ip);
                self.send(req, &pool_reply(req, inv, &self.server, ask, ip));
            }
            Ok(None) => {
                self.trace(req, "ignore", || format!("pool {pool} exhausted"));
                bump(&self.state.stats.pool_exhausted);
                warn!(pool = %pool, "discovery pool exhausted");
            }
            Err(e) => self.lease_error(&e),
        }
    }

    /// Binds the batch's pool REQUESTs in one commit, then answers them: the
    /// ACKs go out only once their leases are on disk.
    fn commit(&mut self, inv: &Inventory, pending: Vec<PendingAck>, now: u64) {
        if pending.is_empty() {
            return;
        }
        let requests: Vec<LeaseRequest<'_>> = pending
            .iter()
            .map(|p| LeaseRequest {
                mac: p.req.chaddr.0,
                client_id: p.req.more.client_id.as_deref(),
                pool: &p.pool,
                ip: p.ip,
                hostname: p.req.more.hostname.as_deref(),
            })
            .collect();
        let outcomes = self.leases().request_batch(&requests, now);
        let outcomes = match outcomes {
            Ok(o) => o,
            Err(e) => return self.lease_error(&e),
        };
        self.state.health.set_store(Ok(()));
        for (p, outcome) in pending.iter().zip(outcomes) {
            match outcome {
                RequestOutcome::Ack(lease) => {
                    self.discovered().assign(p.req.chaddr, lease.ip);
                    self.send(
                        &p.req,
                        &pool_reply(&p.req, inv, &self.server, &p.ask, lease.ip),
                    );
                }
                // RFC 2131 4.3.2: NAK an address that is wrong for the client,
                // but stay silent about addresses that may be another
                // server's to judge.
                RequestOutcome::Nak(NakReason::OutsidePool) if p.req.server_id.is_none() => {
                    let why = || format!("{} outside the pool, left to its server", p.ip);
                    self.trace(&p.req, "ignore", why);
                    bump(&self.state.stats.ignored[Counter::PassRequestMismatch as usize]);
                }
                RequestOutcome::Nak(_) => {
                    self.send(&p.req, &nak(&self.server, "address not available"))
                }
            }
        }
    }

    /// Encodes `reply` and sends it where RFC 2131 4.1 says.
    fn send(&self, req: &Request, reply: &Reply) {
        let stats = &self.state.stats;
        let mut req_fields = req.clone();
        if reply.kind == ReplyKind::Nak && !req.giaddr.is_unspecified() {
            // A relay broadcasts a NAK to its segment when asked to.
            req_fields.flags |= bootp::FLAG_BROADCAST;
        }
        let bytes = match encode(reply, &req_fields) {
            Ok(b) => b,
            Err(e) => {
                warn!(mac = %req.chaddr, error = %e, "failed to encode reply");
                return bump(&stats.send_errors);
            }
        };
        let dest = if reply.kind == ReplyKind::Nak && req.giaddr.is_unspecified() {
            ReplyDestination::Broadcast
        } else {
            reply_destination(
                req_fields.flags,
                u32::from(req.ciaddr),
                u32::from(req.giaddr),
                u32::from(reply.yiaddr),
            )
        };
        let sent = match dest {
            // PXE 2.1 section 2.2.3: a boot server answers the address and
            // port the request came from (the client holds its address).
            _ if req.boot_server => match self.peer {
                Some(peer) => self.sock.send_to(&bytes, peer).map(drop),
                None => Err(io::Error::other("no peer to answer")),
            },
            ReplyDestination::Relay => self
                .sock
                .send_to(&bytes, (req.giaddr, bootp::SERVER_PORT))
                .map(drop),
            ReplyDestination::Ciaddr if reply.kind != ReplyKind::Nak => self
                .sock
                .send_to(&bytes, (req.ciaddr, bootp::CLIENT_PORT))
                .map(drop),
            ReplyDestination::Yiaddr => self.frame(&bytes, req.chaddr.0, reply.yiaddr),
            ReplyDestination::Ciaddr | ReplyDestination::Broadcast => {
                self.frame(&bytes, [0xff; 6], Ipv4Addr::BROADCAST)
            }
        };
        match sent {
            Ok(()) => {
                let (counter, what) = match (reply.kind, reply.is_proxy()) {
                    (ReplyKind::Offer, false) => (&stats.offers, "offer"),
                    (ReplyKind::Ack, false) => (&stats.acks, "ack"),
                    (ReplyKind::Offer, true) => (&stats.proxy_offers, "proxy offer"),
                    (ReplyKind::Ack, true) => (&stats.proxy_acks, "proxy ack"),
                    (ReplyKind::Nak, _) => (&stats.naks, "nak"),
                };
                bump(counter);
                stats.reply_seconds.observe(self.batch_at.elapsed());
                let to = || match self.peer.filter(|_| req.boot_server) {
                    Some(peer) => peer.to_string(),
                    None => format!("{dest:?}"),
                };
                let sent = || match &reply.file {
                    Some(file) => format!("{} file {file} to {}", reply.yiaddr, to()),
                    None => format!("{} to {}", reply.yiaddr, to()),
                };
                let traced = || trace_detail(req, sent());
                let detail = format!("{what} {} (slow path)", reply.yiaddr);
                self.state
                    .progress
                    .dhcp_answer(req.chaddr, clock::now_ms(), what, traced, detail);
            }
            Err(e) => {
                debug!(mac = %req.chaddr, error = %e, "failed to send reply");
                self.trace(req, "send_failed", || e.to_string());
                bump(&stats.send_errors);
            }
        }
    }

    /// Publishes a step of `req`'s client that is no answer sent (a request
    /// ignored or limited, a release, a failed send) to the live trace, if
    /// it is traced. An answer sent is a serving event (`send`).
    fn trace(&self, req: &Request, what: &str, detail: impl FnOnce() -> String) {
        let trace = self.state.progress.trace();
        trace.publish(req.chaddr, TracePath::Dhcp, what, || {
            trace_detail(req, detail())
        });
    }

    /// A raw frame to a client without an address (it cannot answer ARP).
    fn frame(&self, payload: &[u8], mac: [u8; 6], ip: Ipv4Addr) -> io::Result<()> {
        let src = Endpoint {
            mac: self.server.mac,
            ip: self.server.ip,
            port: bootp::SERVER_PORT,
        };
        let dst = Endpoint {
            mac,
            ip,
            port: bootp::CLIENT_PORT,
        };
        self.raw.send(&udp_frame(src, dst, payload))
    }

    fn expire_leases(&mut self) {
        if self.last_expire.elapsed() < EXPIRE_EVERY {
            return;
        }
        self.last_expire = Instant::now();
        let expired = self.leases().expire(clock::now_secs());
        if let Err(e) = expired {
            self.lease_error(&e);
        }
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, LeaseStore> {
        lock(&self.state.leases)
    }

    fn discovered(&self) -> std::sync::MutexGuard<'_, Registry> {
        lock(&self.state.discovered)
    }

    fn lease_error(&mut self, e: &crate::lease::LeaseError) {
        if let Some(suppressed) = self.lease_error_log.admit(Instant::now()) {
            warn!(
                error = %e,
                unlogged_since_last_warning = suppressed,
                "lease store failed (counted in {}{{kind=\"lease_store\"}})",
                crate::metrics::SLOW_ERRORS
            );
        }
        bump(&self.state.stats.lease_errors);
        self.state.health.set_store(Err(e.to_string()));
    }
}

/// The lease pool of the subnet `decide` picked.
/// The lease pool of the subnet `decide` picked, narrowed to the slice it
/// leases from.
fn pool_of(inv: &Inventory, ask: &PoolAsk) -> Pool {
    let subnet = &inv.subnets[ask.subnet];
    Pool {
        subnet: subnet.network,
        prefix: subnet.prefix,
        start: *ask.slice.start(),
        end: *ask.slice.end(),
        lease_time: inv.discovery.lease_time_in(subnet),
    }
}

/// The lease pool whose range holds `ip`, if any subnet's does.
fn pool_containing(inv: &Inventory, ip: Ipv4Addr) -> Option<Pool> {
    inv.subnets.iter().enumerate().find_map(|(subnet, s)| {
        let range = s.pool.filter(|r| (r.start..=r.end).contains(&ip))?;
        Some(pool_of(
            inv,
            &PoolAsk {
                subnet,
                kind: ReplyKind::Ack,
                wanted: None,
                slice: range.start..=range.end,
            },
        ))
    })
}

fn sighting(req: &Request) -> Sighting {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let traits = req.traits();
    Sighting {
        arch: req.arch,
        vendor_class: req.more.vendor_class.as_deref().map(text),
        user_class: req.more.user_classes.first().map(|c| text(c)),
        relay: (!req.giaddr.is_unspecified()).then_some(req.giaddr),
        circuit_id: traits.circuit_id.map(text),
        hostname: req.more.hostname.clone(),
    }
}

/// A request as hex, for the log of one that could not be handled.
fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The pool client `req` comes from, as the lease store tells them apart
/// (`discovery.lease_key`).
fn client(req: &Request) -> Client<'_> {
    Client {
        mac: req.chaddr.0,
        client_id: req.more.client_id.as_deref(),
    }
}

/// A live trace event's detail for a step of `req`'s client: the request's
/// message type and xid, then `detail`.
fn trace_detail(req: &Request, detail: String) -> String {
    let kind = req
        .msg_type
        .map_or("bootp".to_string(), |t| format!("{t:?}"));
    format!("{kind} xid {:#010x}: {detail}", req.xid)
}

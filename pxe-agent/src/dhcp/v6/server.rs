//! The DHCPv6 slow path: one socket per interface on UDP 547, joined to
//! All_DHCP_Relay_Agents_and_Servers (ff02::1:2) there, read by one
//! thread that applies `decide6` and answers where each message came from
//! (the client's link-local address and port 546, or the relay's address
//! and port 547; RFC 8415 section 7.2). Counts what it does in the shared
//! state's `Dhcp6Stats` and records answers in boot progress under the
//! client's MAC; policy stays in `decide`. Pool clients' leases are
//! settled here in the lease store shared with IPv4, each binding
//! committed to disk before its Reply goes out.

use std::{
    fs, io,
    net::{Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket},
    panic::{self, AssertUnwindSafe},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use dhcproto::v6::MessageType;
use tracing::{debug, warn};

use super::{
    decide::{
        Answer6, PoolAsk6, PoolKind6, Pools6, Server6, client_mac, decide6_shared, identify,
        pool_ia_status, pool_ia_withdrawn, pool_lease, pool_lease_time6, pool_reply6,
    },
    reply::{IaNaReply, Reply6, StatusCode6, try_encode6},
    request::Request6,
};
use crate::{
    clock,
    dhcp::server::Limits,
    inventory::{Inventory, decode_hex},
    lease::{BindOutcome6, Client6, DeclineOutcome, LeaseError, LeaseState, Pool6, Quarantine},
    mac::MacAddr,
    ratelimit::{Limited, Limiter},
    state::State,
    sync::{lock, read},
    trace::TracePath,
};

/// What a Decline may quarantine, and for how long: as over IPv4.
const QUARANTINE: Quarantine = Quarantine::DEFAULT;

/// The DHCPv6 server port (RFC 8415 section 7.2).
pub const SERVER_PORT: u16 = 547;
/// All_DHCP_Relay_Agents_and_Servers, the link-scoped group clients send to.
pub const ALL_SERVERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);
/// The file in the state directory that keeps the server's DUID.
const DUID_FILE: &str = "dhcpv6-duid";

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Binds UDP 547 on `iface` (index `ifindex`) and joins ff02::1:2 there.
pub fn bind(iface: &str, ifindex: u32) -> io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::IPV6, Type::DGRAM, Some(Protocol::UDP))?;
    sock.set_only_v6(true)?;
    sock.set_reuse_address(true)?;
    sock.bind_device(Some(iface.as_bytes()))?;
    sock.bind(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, SERVER_PORT)).into())?;
    sock.join_multicast_v6(&ALL_SERVERS, ifindex)?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    Ok(sock.into())
}

/// The server's DUID, kept in `dir` so that it stays the same across
/// restarts (clients and relays hold it; RFC 8415 section 11): read from
/// the file, or made once from `mac` (DUID-LL, type 3, Ethernet) and
/// written there.
pub fn load_or_create_duid(dir: &Path, mac: [u8; 6]) -> io::Result<Vec<u8>> {
    let path = dir.join(DUID_FILE);
    match fs::read_to_string(&path) {
        // RFC 8415 section 11.1: a DUID is 2 to 130 bytes; ours are longer
        // than a type alone.
        Ok(text) => decode_hex(text.trim())
            .ok()
            .filter(|duid| (3..=130).contains(&duid.len()))
            .ok_or_else(|| {
                io::Error::other(format!(
                    "{} is not a DUID in hex; remove it to make a new one",
                    path.display()
                ))
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mut duid = vec![0, 3, 0, 1];
            duid.extend_from_slice(&mac);
            let text: String = duid.iter().map(|b| format!("{b:02x}")).collect();
            let tmp = path.with_extension("tmp");
            fs::write(&tmp, format!("{text}\n"))?;
            fs::rename(&tmp, &path)?;
            Ok(duid)
        }
        Err(e) => Err(e),
    }
}

/// Serves until `stop` is set. A panic while handling one message is
/// contained there; the caller supervises the loop for anything else.
/// `limits` is the storm guard's, as over IPv4: a bucket per client and
/// one shared by every client the inventory does not know. With `beats`,
/// this loop is the one readiness follows (an agent with no IPv4
/// interface has no DHCPv4 slow path to follow).
pub fn serve(
    sock: &UdpSocket,
    server: &Server6,
    state: &Arc<State>,
    limits: Limits,
    stop: &AtomicBool,
    beats: bool,
) {
    let mut limiter = Limiter::new(limits.per_mac, limits.unknown, limits.tracked_macs);
    let started = Instant::now();
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::Relaxed) {
        if beats {
            state.health.slow_path_beat();
        }
        let (len, from) = match sock.recv_from(&mut buf) {
            Ok(got) => got,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) => {
                warn!(error = %e, "DHCPv6 receive failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let SocketAddr::V6(from) = from else {
            continue;
        };
        bump(&state.stats6.rx);
        let mono = started.elapsed().as_secs_f64();
        let handled = panic::catch_unwind(AssertUnwindSafe(|| {
            handle(sock, &buf[..len], from, server, state, &mut limiter, mono);
        }));
        if handled.is_err() {
            bump(&state.stats6.panics);
        }
    }
}

fn handle(
    sock: &UdpSocket,
    bytes: &[u8],
    from: SocketAddrV6,
    server: &Server6,
    state: &State,
    limiter: &mut Limiter,
    mono: f64,
) {
    let stats = &state.stats6;
    let req = match Request6::parse(bytes) {
        Ok(req) => req,
        Err(e) => {
            bump(&stats.malformed);
            debug!(from = %from, error = %e, "malformed DHCPv6 message");
            return;
        }
    };
    let inv = read(&state.inventory).clone();
    let source = *from.ip();
    // Progress and traces name a client by its host's MAC when it is known,
    // and say how it was known.
    let known = identify(&req, source, &inv);
    let mac = known
        .map(|(host, _)| host.mac)
        .or_else(|| client_mac(&req, source));
    let by = known.map_or("unknown", |(_, by)| by.as_str());
    // The storm guard, before anything reads the lease store: a pool
    // client may make the agent write to disk.
    if let Err(limited) = limiter.admit(guard_key(&req, mac, source), known.is_some(), mono) {
        bump(match limited {
            Limited::Mac => &stats.limited_mac,
            Limited::Unknown => &stats.limited_unknown,
            Limited::Table => &stats.limited_table,
        });
        return;
    }
    // The detail is made only when someone traces the client.
    let trace = |what: &str, detail: &dyn Fn() -> String| {
        if let Some(mac) = mac {
            state
                .progress
                .trace()
                .publish(mac, TracePath::Dhcp, what, detail);
        }
    };
    let share = state.share();
    let now = clock::now_secs();
    let client6 = |iaid| Client6 {
        duid: req.client_id.as_deref().unwrap_or_default(),
        iaid,
        mac: mac.map(|m| m.0),
    };
    // Only a shared pool asks whose client this is; alone, every one is.
    let held: Vec<Ipv6Addr> = if share.is_shared() && known.is_none() {
        let store = lock(&state.leases);
        req.ia_na
            .iter()
            .filter_map(|ia| store.lease6_of(client6(ia.iaid)))
            .filter(|l| {
                matches!(l.state, LeaseState::Bound | LeaseState::Offered) && l.expires > now
            })
            .map(|l| l.ip)
            .collect()
    } else {
        Vec::new()
    };
    let pools = Pools6 {
        share: &share,
        held: &held,
    };
    let reply = match decide6_shared(&req, known.map(|(host, _)| host), &inv, server, &pools) {
        Answer6::Reply(reply) => reply,
        Answer6::Pool(ask) => {
            let settled = settle(state, &inv, &req, &ask, &client6, now);
            let ia_na = match settled {
                Ok(ia_na) => ia_na,
                Err(e) => {
                    lease_error(state, &e);
                    trace("ignore", &|| format!("lease store failed: {e}"));
                    return;
                }
            };
            if ia_na.iter().any(|ia| {
                ia.status
                    .as_ref()
                    .is_some_and(|s| s.code == StatusCode6::NoAddrsAvail)
            }) {
                warn!(pool = %inv.subnets6[ask.subnet], "IPv6 discovery pool exhausted");
                trace("ignore", &|| "pool exhausted".to_owned());
            }
            Box::new(pool_reply6(&req, source, &inv, server, &ask, ia_na))
        }
        Answer6::PoolRelease(reply) => {
            let mut store = lock(&state.leases);
            for ia in &req.ia_na {
                for &ip in &ia.addrs {
                    trace("release", &|| ip.to_string());
                    if let Err(e) = store.release6(client6(ia.iaid), ip, now) {
                        drop(store);
                        lease_error(state, &e);
                        return;
                    }
                }
            }
            reply
        }
        Answer6::PoolDecline { reply, subnet } => {
            let pool = whole_pool(&inv, subnet);
            for ia in &req.ia_na {
                for &ip in &ia.addrs {
                    trace("decline", &|| ip.to_string());
                    let outcome = match pool {
                        Some(pool) => lock(&state.leases).decline6(
                            client6(ia.iaid),
                            &pool,
                            ip,
                            now,
                            &QUARANTINE,
                        ),
                        None => Ok(DeclineOutcome::NotGiven),
                    };
                    match outcome {
                        Ok(DeclineOutcome::Quarantined) => {
                            warn!(mac = ?mac, %ip, "IPv6 address declined by its client: quarantined");
                        }
                        Ok(DeclineOutcome::NotGiven) => bump(&stats.declines_not_given),
                        Ok(DeclineOutcome::MacLimit) => bump(&stats.declines_mac_limit),
                        Ok(DeclineOutcome::PoolLimit) => bump(&stats.declines_pool_limit),
                        Err(e) => return lease_error(state, &e),
                    }
                }
            }
            reply
        }
        Answer6::NotOurs => {
            bump(&stats.not_ours);
            trace("ignore", &|| {
                format!(
                    "DHCPv6 {:?}: another agent's (slot {:?} of {})",
                    req.msg_type,
                    share.slot(),
                    share.slots()
                )
            });
            return;
        }
        Answer6::ReservationDeclined { reply, ip } => {
            bump(&stats.reservation_declines);
            warn!(mac = ?mac, %ip, "a reserved host declined its IPv6 address: another machine uses it");
            reply
        }
        Answer6::Ignore(reason) => {
            bump(&stats.ignored[reason as usize]);
            trace("ignore", &|| {
                format!("DHCPv6 {:?} ({by}): {}", req.msg_type, reason.name())
            });
            return;
        }
    };
    let Ok(bytes) = try_encode6(&reply, &req.relays) else {
        // Too long for its relays' wrappers, or a value no option holds.
        bump(&stats.send_errors);
        trace("send_failed", &|| "the reply does not encode".to_owned());
        return;
    };
    // Answer where it came from: the client (port 546) or the relay (547),
    // on the link it came in on (the scope of a link-local source).
    match sock.send_to(&bytes, from) {
        Ok(_) => record(state, &reply, &req, mac, by),
        Err(e) => {
            bump(&stats.send_errors);
            trace("send_failed", &|| e.to_string());
        }
    }
}

/// What the storm guard files a message under: its client's MAC when the
/// DUID or the address carries one, else a key made from the DUID (or,
/// without one, the source address), so that a client sending a DUID-EN
/// or DUID-UUID still has a bucket of its own. Made keys are locally
/// administered unicast MACs, which no DUID-LL of a real NIC names.
fn guard_key(req: &Request6, mac: Option<MacAddr>, source: Ipv6Addr) -> MacAddr {
    if let Some(mac) = mac {
        return mac;
    }
    let source = source.octets();
    let bytes = req.client_id.as_deref().unwrap_or(&source);
    // FNV-1a, 64-bit: a stable spread of the DUID over the key.
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let h = hash.to_be_bytes();
    MacAddr([(h[0] | 0x02) & !0x01, h[1], h[2], h[3], h[4], h[5]])
}

/// Settles each IA_NA of a pool client's message in the lease store: an
/// address held (Advertise), bound (Request, rapid commit) or extended
/// (Renew, Rebind), each binding committed before this returns; an IA no
/// address is free for says NoAddrsAvail, and is counted.
fn settle<'a>(
    state: &State,
    inv: &Inventory,
    req: &'a Request6,
    ask: &PoolAsk6,
    client6: &dyn Fn(u32) -> Client6<'a>,
    now: u64,
) -> Result<Vec<IaNaReply>, LeaseError> {
    let subnet = &inv.subnets6[ask.subnet];
    let pool = Pool6 {
        subnet: subnet.network,
        prefix: subnet.prefix,
        start: *ask.slice.start(),
        end: *ask.slice.end(),
        lease_time: pool_lease_time6(inv, subnet),
    };
    let mut store = lock(&state.leases);
    let mut out = Vec::with_capacity(req.ia_na.len());
    let mut committed = false;
    for ia in &req.ia_na {
        let client = client6(ia.iaid);
        let wanted = ia.addrs.first().copied();
        let exhausted = || {
            bump(&state.stats6.pool_exhausted);
            pool_ia_status(ia.iaid, StatusCode6::NoAddrsAvail, "no addresses available")
        };
        let reply = match ask.kind {
            PoolKind6::Advertise => match store.offer6(client, &pool, &ia.addrs, now)? {
                Some(ip) => pool_lease(ia.iaid, ip, pool.lease_time),
                None => exhausted(),
            },
            PoolKind6::Bind | PoolKind6::Extend => {
                let exact = ask.kind == PoolKind6::Extend;
                match store.bind6(client, &pool, wanted, exact, None, now)? {
                    BindOutcome6::Bound(lease) => {
                        committed = true;
                        pool_lease(ia.iaid, lease.ip, pool.lease_time)
                    }
                    BindOutcome6::Exhausted => exhausted(),
                    BindOutcome6::Refused(_) if ia.addrs.is_empty() => {
                        pool_ia_status(ia.iaid, StatusCode6::NoBinding, "no binding")
                    }
                    BindOutcome6::Refused(_) => pool_ia_withdrawn(ia.iaid, &ia.addrs),
                }
            }
        };
        out.push(reply);
    }
    drop(store);
    // A commit went through: the store is writable again (an Advertise
    // writes nothing, so says nothing about it).
    if committed {
        state.health.set_store(Ok(()));
    }
    Ok(out)
}

/// The whole pool of subnet `index` (not this agent's slice): the range a
/// Decline may quarantine in.
fn whole_pool(inv: &Inventory, index: usize) -> Option<Pool6> {
    let subnet = inv.subnets6.get(index)?;
    let range = subnet.pool?;
    Some(Pool6 {
        subnet: subnet.network,
        prefix: subnet.prefix,
        start: range.start,
        end: range.end,
        lease_time: pool_lease_time6(inv, subnet),
    })
}

/// A lease store failure: logged, counted, and shown in health, as over
/// IPv4; the client gets no answer and retries.
fn lease_error(state: &State, e: &LeaseError) {
    // A failing disk fails every request: one line a second at most.
    static LOGGED: AtomicU64 = AtomicU64::new(0);
    let second = clock::now_secs();
    if LOGGED.swap(second, Ordering::Relaxed) != second {
        warn!(
            error = %e,
            "lease store failed for a DHCPv6 pool client (counted in {}{{family=\"ipv6\",kind=\"lease_store\"}})",
            crate::metrics::SLOW_ERRORS
        );
    }
    bump(&state.stats6.lease_errors);
    state.health.set_store(Err(e.to_string()));
}

/// Counts a reply sent and records it in the client's boot progress.
fn record(state: &State, reply: &Reply6, req: &Request6, mac: Option<MacAddr>, by: &str) {
    let (counter, what) = match reply.msg_type {
        MessageType::Advertise => (&state.stats6.advertises, "advertise"),
        _ => (&state.stats6.replies, "reply"),
    };
    bump(counter);
    let Some(mac) = mac else {
        return;
    };
    let address = reply
        .ia_na
        .iter()
        .flat_map(|ia| &ia.addrs)
        .map(|a| a.addr.to_string())
        .next()
        .unwrap_or_else(|| "no address".to_owned());
    let detail = match &reply.boot_url {
        Some(url) => format!(
            "DHCPv6 {what} {address} boot {url} (to {:?}, known by {by})",
            req.msg_type
        ),
        None => format!(
            "DHCPv6 {what} {address} (to {:?}, known by {by})",
            req.msg_type
        ),
    };
    let traced = detail.clone();
    state
        .progress
        .dhcp_answer(mac, clock::now_ms(), what, || traced, detail);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_duid_is_made_once_and_kept() {
        let dir = std::env::temp_dir().join(format!("pxe-agent-duid-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let mac = [0x52, 0x54, 0, 0x12, 0x34, 0x56];
        let duid = load_or_create_duid(&dir, mac).unwrap();
        assert_eq!(duid, [0, 3, 0, 1, 0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        // Another interface's MAC later: the kept DUID stays.
        assert_eq!(load_or_create_duid(&dir, [2; 6]).unwrap(), duid);
        fs::write(dir.join(DUID_FILE), "zz\n").unwrap();
        let err = load_or_create_duid(&dir, mac).unwrap_err();
        fs::remove_dir_all(&dir).unwrap();
        assert!(
            err.to_string().contains("dhcpv6-duid is not a DUID in hex"),
            "{err}"
        );
    }

    #[test]
    fn the_storm_guard_files_a_client_by_its_mac_else_by_its_duid() {
        let mut req = Request6::parse(&[1, 0, 0, 1]).expect("an empty Solicit");
        let source: Ipv6Addr = "fe80::1234:5678:9abc:def0".parse().unwrap();
        let mac = MacAddr([0x52, 0x54, 0, 1, 2, 3]);
        assert_eq!(guard_key(&req, Some(mac), source), mac);
        req.client_id = Some(vec![0, 2, 0, 0, 0x01, 0x37, 1, 2, 3].into());
        let a = guard_key(&req, None, source);
        assert_eq!(a, guard_key(&req, None, "fe80::1".parse().unwrap()));
        assert_eq!(a.0[0] & 0x03, 0x02, "locally administered unicast: {a}");
        req.client_id = Some(vec![0, 2, 0, 0, 0x01, 0x37, 1, 2, 4].into());
        assert_ne!(guard_key(&req, None, source), a);
    }
}

//! The DHCPv6 slow path: one socket per interface on UDP 547, joined to
//! All_DHCP_Relay_Agents_and_Servers (ff02::1:2) there, read by one
//! thread that applies `decide6` and answers where each message came from
//! (the client's link-local address and port 546, or the relay's address
//! and port 547; RFC 8415 section 7.2). Counts what it does in the shared
//! state's `Dhcp6Stats` and records answers in boot progress under the
//! client's MAC; policy stays in `decide`.

use std::{
    fs, io,
    net::{Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket},
    panic::{self, AssertUnwindSafe},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use dhcproto::v6::MessageType;
use tracing::{debug, warn};

use super::{
    decide::{Answer6, Server6, client_mac, decide6, identify},
    reply::{Reply6, try_encode6},
    request::Request6,
};
use crate::{clock, inventory::decode_hex, state::State, sync::read, trace::TracePath};

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
/// With `beats`, this loop is the one readiness follows (an agent with no
/// IPv4 interface has no DHCPv4 slow path to follow).
pub fn serve(
    sock: &UdpSocket,
    server: &Server6,
    state: &Arc<State>,
    stop: &AtomicBool,
    beats: bool,
) {
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
        let handled = panic::catch_unwind(AssertUnwindSafe(|| {
            handle(sock, &buf[..len], from, server, state);
        }));
        if handled.is_err() {
            bump(&state.stats6.panics);
        }
    }
}

fn handle(sock: &UdpSocket, bytes: &[u8], from: SocketAddrV6, server: &Server6, state: &State) {
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
    // The detail is made only when someone traces the client.
    let trace = |what: &str, detail: &dyn Fn() -> String| {
        if let Some(mac) = mac {
            state
                .progress
                .trace()
                .publish(mac, TracePath::Dhcp, what, detail);
        }
    };
    let reply = match decide6(&req, source, &inv, server) {
        Answer6::Reply(reply) => reply,
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

/// Counts a reply sent and records it in the client's boot progress.
fn record(
    state: &State,
    reply: &Reply6,
    req: &Request6,
    mac: Option<crate::mac::MacAddr>,
    by: &str,
) {
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
}

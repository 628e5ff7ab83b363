//! Router advertisements (RFC 4861 section 6.2) for the IPv6 subnets that
//! ask for them (`ra:`): iPXE starts DHCPv6 only after an advertisement
//! with the M or O flag, so an isolated provisioning segment boots with
//! nothing but the agent on it. Sent to all nodes (ff02::1) every
//! [`INTERVAL`] and soon after a router solicitation, from the
//! interface's link-local address with hop limit 255, read from the
//! inventory in force at each send. The agent does not route: router
//! lifetime 0, so no host takes it as its default router.

use std::{
    io,
    mem::MaybeUninit,
    net::{Ipv6Addr, SocketAddrV6},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, Socket, Type};
use tracing::warn;

use crate::{
    inventory::{Inventory, Subnet6},
    state::State,
    sync::read,
};

/// How often an unsolicited advertisement goes out: often enough that a
/// machine powered on between two finds one within its first DHCPv6
/// attempts (iPXE waits for one up to its configuration timeout).
pub const INTERVAL: Duration = Duration::from_secs(10);
/// The least time between two advertisements (RFC 4861's
/// MIN_DELAY_BETWEEN_RAS is 3 s for routers; a boot storm's solicitations
/// are answered by one multicast per this period).
const MIN_DELAY: Duration = Duration::from_millis(500);
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
const ALL_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);
const ROUTER_SOLICITATION: u8 = 133;
const ROUTER_ADVERTISEMENT: u8 = 134;

/// The advertisement for the subnets of `inv` on a link whose agent
/// address is `server` (the subnets that hold it and ask for
/// advertisements), or `None` when none does. `mac` is the interface's,
/// sent as the source link-layer address.
pub fn advertisement(inv: &Inventory, server: Ipv6Addr, mac: [u8; 6]) -> Option<Vec<u8>> {
    let subnets: Vec<&Subnet6> = inv
        .subnets6
        .iter()
        .filter(|s| s.ra.is_some() && s.contains(server))
        .collect();
    if subnets.is_empty() {
        return None;
    }
    let managed = subnets.iter().any(|s| s.ra.is_some_and(|ra| ra.managed));
    let other = subnets.iter().any(|s| s.ra.is_some_and(|ra| ra.other));
    let mut ra = vec![
        ROUTER_ADVERTISEMENT,
        0,
        0,
        0,  // checksum: the kernel's, for an ICMPv6 raw socket
        64, // cur hop limit
        u8::from(managed) << 7 | u8::from(other) << 6,
        0,
        0, // router lifetime 0: not a default router
        0,
        0,
        0,
        0, // reachable time: unspecified
        0,
        0,
        0,
        0, // retrans timer: unspecified
    ];
    // Source link-layer address (type 1, 8 bytes).
    ra.extend_from_slice(&[1, 1]);
    ra.extend_from_slice(&mac);
    for subnet in subnets {
        // Prefix information (type 3, 32 bytes): on-link (L), not for
        // autonomous configuration (A clear), so addresses come from DHCPv6.
        ra.extend_from_slice(&[3, 4, subnet.prefix, 0x80]);
        ra.extend_from_slice(&subnet.lease_time.to_be_bytes());
        ra.extend_from_slice(&subnet.lease_time.to_be_bytes());
        ra.extend_from_slice(&[0; 4]);
        ra.extend_from_slice(&subnet.network.octets());
    }
    Some(ra)
}

/// Opens the ICMPv6 socket on `iface` (index `ifindex`): sends with hop
/// limit 255 (receivers drop neighbour discovery with any other), and
/// hears router solicitations sent to all routers.
pub fn open(iface: &str, ifindex: u32) -> io::Result<Socket> {
    let sock = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
    sock.bind_device(Some(iface.as_bytes()))?;
    sock.set_multicast_hops_v6(255)?;
    sock.set_unicast_hops_v6(255)?;
    sock.set_multicast_if_v6(ifindex)?;
    sock.set_multicast_loop_v6(false)?;
    sock.join_multicast_v6(&ALL_ROUTERS, ifindex)?;
    sock.set_read_timeout(Some(MIN_DELAY))?;
    Ok(sock)
}

/// Advertises until `stop`: every [`INTERVAL`], and at most
/// [`MIN_DELAY`] after a solicitation.
pub fn serve(
    sock: &Socket,
    ifindex: u32,
    server: Ipv6Addr,
    mac: [u8; 6],
    state: &Arc<State>,
    stop: &AtomicBool,
) {
    let to = SocketAddrV6::new(ALL_NODES, 0, 0, ifindex).into();
    let mut last: Option<Instant> = None;
    let mut solicited = false;
    let mut buf = [MaybeUninit::<u8>::uninit(); 1500];
    while !stop.load(Ordering::Relaxed) {
        let due = last
            .is_none_or(|at| at.elapsed() >= INTERVAL || (solicited && at.elapsed() >= MIN_DELAY));
        if due {
            let inv = read(&state.inventory).clone();
            if let Some(ra) = advertisement(&inv, server, mac)
                && let Err(e) = sock.send_to(&ra, &to)
            {
                warn!(error = %e, "router advertisement not sent");
            }
            last = Some(Instant::now());
            solicited = false;
        }
        // The kernel hands a raw ICMPv6 socket the message without its IP
        // header: the type is the first byte.
        if let Ok((len, _)) = sock.recv_from(&mut buf)
            && len > 0
            // SAFETY: recv_from initialised the first `len` bytes.
            && unsafe { buf[0].assume_init() } == ROUTER_SOLICITATION
        {
            solicited = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn an_advertisement_names_the_links_prefixes_and_flags_and_no_default_router() {
        let text = r#"
subnets:
  - cidr: 10.66.0.0/16
  - cidr: fd00:66::/64
    lease_time: 600
    ra: {other: false}
  - cidr: fd00:67::/64
    ra: {}
profiles: []
hosts: []
"#;
        let inv = Inventory::parse(Path::new("hosts.yaml"), text).expect("valid");
        let mac = [0x02, 0, 0, 0, 0, 1];
        let ra = advertisement(&inv, "fd00:66::1".parse().unwrap(), mac).expect("advertised");
        assert_eq!(ra.len(), 16 + 8 + 32);
        assert_eq!(ra[0], ROUTER_ADVERTISEMENT);
        assert_eq!(ra[5], 0x80, "M set, O clear");
        assert_eq!(ra[6..8], [0, 0], "router lifetime");
        assert_eq!(ra[16..24], [1, 1, 0x02, 0, 0, 0, 0, 1]);
        assert_eq!(ra[24..28], [3, 4, 64, 0x80], "on-link, not autonomous");
        assert_eq!(ra[28..32], 600u32.to_be_bytes());
        assert_eq!(
            ra[40..56],
            "fd00:66::".parse::<Ipv6Addr>().unwrap().octets()
        );
        // A link of no subnet that asks for advertisements gets none.
        assert!(advertisement(&inv, "fd00:99::1".parse().unwrap(), mac).is_none());
    }

    #[test]
    fn an_ipv4_subnet_may_not_ask_for_advertisements() {
        let text = "subnets:\n  - cidr: 10.66.0.0/16\n    ra: {}\nprofiles: []\nhosts: []\n";
        let err = Inventory::parse(Path::new("hosts.yaml"), text).unwrap_err();
        assert!(
            err.to_string()
                .contains("field subnets[0].ra: router advertisements are IPv6's"),
            "{err}"
        );
    }
}

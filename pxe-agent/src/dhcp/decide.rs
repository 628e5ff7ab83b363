//! DHCP policy: what to answer a request with, or why not to answer it.
//!
//! Pure functions over the inventory. `decide` is the one policy: the
//! complete answer to any request, including iPXE chainloading and unknown
//! hosts (which need the lease store, so `decide` hands those back as
//! [`Answer::Pool`]). It picks the parts of a reply (address, boot answer,
//! subnet, profile, rule and host options); `reply` assembles them. What the XDP program may
//! answer is the projection of this policy in `fast_path`, and its
//! templates are `decide`'s answers to one request of each boot class
//! (`template`).
//! An agent sharing the discovery pools with peers on the same segment
//! decides with [`decide_shared`], the same policy told which slice of each
//! pool and which unknown MACs are its own ([`crate::share`]); `decide` is
//! that policy for an agent alone. In a subnet in mode proxy, where another
//! server leases the addresses, the same policy answers PXE firmware with
//! boot information only (`proxy`, docs/lifecycle.md "proxyDHCP").

use std::{collections::BTreeMap, net::Ipv4Addr, ops::RangeInclusive, sync::LazyLock};

use dhcproto::v4::{MessageType, OptionCode};
use pxe_ebpf_common::{BootClass, Counter, VendorClass, boot_class};

use super::{
    Request,
    reply::{
        Boot, Reply, ReplyKind, Server, Subject, build, build_proxy, echo_relay_info, nak,
        withhold_boot,
    },
};
use crate::{
    inventory::{
        BootFiles, DiscoveryPolicy, Host, Inventory, MAC_PLACEHOLDER, Profile, SERVER_PLACEHOLDER,
        Subnet,
    },
    mac::MacAddr,
    share::Share,
};

/// The address a DHCPREQUEST asks for (RFC 2131 4.3.2): SELECTING names a
/// server; INIT-REBOOT asks for an address; RENEWING/REBINDING fill ciaddr.
enum Wanted {
    OtherServer,
    Address(Ipv4Addr),
    Nothing,
}

fn requested(req: &Request, server: &Server) -> Wanted {
    match (req.server_id, req.requested_ip) {
        (Some(sid), _) if sid != server.ip => Wanted::OtherServer,
        (Some(_), Some(ip)) => Wanted::Address(ip),
        (Some(_), None) => Wanted::Nothing,
        (None, Some(ip)) if req.ciaddr.is_unspecified() => Wanted::Address(ip),
        (None, _) if !req.ciaddr.is_unspecified() => Wanted::Address(req.ciaddr),
        (None, _) => Wanted::Nothing,
    }
}

/// Picks the boot answer, for both address families: `None` when the
/// profile answers boot requests but not this firmware class (the caller
/// declines). `server` is the server's address as a URL writes it
/// (`10.66.0.1`, `[fd00:66::1]`), which replaces `{server}`.
pub(super) fn boot_answer(
    profile: &Profile,
    boot: Option<&BootFiles>,
    class: BootClass,
    ipxe: Option<&str>,
    mac: MacAddr,
    server: &str,
) -> Option<Boot> {
    let expand = |s: &str| {
        s.replace(SERVER_PLACEHOLDER, server)
            .replace(MAC_PLACEHOLDER, &mac.to_string())
    };
    if let Some(script) = ipxe {
        return Some(Boot::Ipxe(expand(
            profile.chain.as_deref().unwrap_or(script),
        )));
    }
    let Some(boot) = boot else {
        return Some(Boot::None);
    };
    let pick = |name: &Option<String>| name.as_deref().map(expand);
    Some(match class {
        BootClass::Plain => Boot::None,
        BootClass::Bios => Boot::Tftp(pick(&boot.bios)?),
        BootClass::UefiX64 => Boot::Tftp(pick(&boot.uefi)?),
        BootClass::UefiArm64 => Boot::Tftp(pick(&boot.uefi_arm64)?),
        BootClass::Http => Boot::Http(pick(&boot.http)?),
        BootClass::HttpArm64 => Boot::Http(pick(&boot.http_arm64)?),
        BootClass::HttpIa32 => Boot::Http(pick(&boot.http_ia32)?),
    })
}

/// The slow path's answer to a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    Reply(Reply),
    /// No answer; the counter says why.
    Ignore(Counter),
    /// An unknown host under the `inspect` discovery policy: the caller
    /// leases from the pool of `subnet`, then calls [`pool_reply`].
    Pool(PoolAsk),
    /// DHCPRELEASE or DHCPDECLINE of a pool lease.
    Release {
        ip: Ipv4Addr,
    },
    Decline {
        ip: Ipv4Addr,
    },
    /// A reserved host declined its reserved address `ip` (RFC 2131 4.3.3):
    /// it found another machine using it. Nothing to answer or lease; the
    /// caller records the conflict for the operator.
    ReservationDeclined {
        ip: Ipv4Addr,
    },
    /// An unknown host another agent sharing the pool answers (its bucket
    /// is another live slot's), or a request for an address of another
    /// live agent's slice: no answer, so that exactly one agent speaks.
    NotOurs,
}

/// What the lease store must settle before a pool client is answered.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolAsk {
    /// Index into [`Inventory::subnets`].
    pub subnet: usize,
    pub kind: ReplyKind,
    /// For an ACK: the address the client asks for; for an OFFER: a hint.
    pub wanted: Option<Ipv4Addr>,
    /// The part of the subnet's pool this agent leases from: all of it for
    /// an agent alone, its slice when agents share the pool.
    pub slice: RangeInclusive<Ipv4Addr>,
}

/// What the pool policy knows beyond the request and the inventory when
/// agents share the discovery pools.
#[derive(Clone, Copy, Debug)]
pub struct Pools<'a> {
    /// This agent's slot, the slots live, hence its slices and buckets.
    pub share: &'a Share,
    /// The pool address this agent's lease store holds for the client
    /// (bound or offered, not lapsed): a client of ours stays ours for its
    /// renewals whichever slot its bucket belongs to now.
    pub held: Option<Ipv4Addr>,
}

static ALONE: LazyLock<Share> = LazyLock::new(Share::alone);

impl Pools<'_> {
    /// An agent with no peers: the whole pool, every unknown MAC.
    pub fn alone() -> Pools<'static> {
        Pools {
            share: &ALONE,
            held: None,
        }
    }
}

/// The complete policy for an agent alone (see the module doc).
pub fn decide(req: &Request, inv: &Inventory, server: &Server) -> Answer {
    decide_shared(req, inv, server, &Pools::alone())
}

/// The complete policy, for an agent that may share its pools with peers:
/// reserved hosts are answered as by an agent alone (every agent answers
/// them alike); unknown hosts as [`unknown`] says.
pub fn decide_shared(req: &Request, inv: &Inventory, server: &Server, pools: &Pools) -> Answer {
    let Some(msg_type) = req.msg_type else {
        return Answer::Ignore(Counter::PassMessageType);
    };
    let relayed = !req.giaddr.is_unspecified();
    // The segment the client is on: the relay's; for a renewal unicast
    // straight to us (RFC 2131 4.3.2, RENEWING: ciaddr set, no relay),
    // the one its address is in, which may be behind a router; else ours.
    let segment = if relayed {
        req.giaddr
    } else if !req.ciaddr.is_unspecified() {
        req.ciaddr
    } else {
        server.ip
    };
    let host = inv.host_by_mac(req.chaddr);
    if host.is_some_and(|h| h.ip.is_none()) {
        // Served over IPv6 only: other servers answer its DHCPv4, as they
        // answer a MAC the inventory does not list.
        return Answer::Ignore(Counter::PassUnknownHost);
    }
    if proxy_subnet(inv, host, segment).is_some() {
        return proxy(req, inv, server, host, msg_type);
    }
    let kind = match msg_type {
        MessageType::Discover => ReplyKind::Offer,
        MessageType::Request => ReplyKind::Ack,
        MessageType::Release if host.is_none() => return Answer::Release { ip: req.ciaddr },
        MessageType::Decline => {
            return match (host, req.requested_ip) {
                (_, None) => Answer::Ignore(Counter::PassMalformed),
                (None, Some(ip)) => Answer::Decline { ip },
                (Some(h), Some(ip)) if Some(ip) == h.ipv4() => Answer::ReservationDeclined { ip },
                // Not an address we gave it: nothing of ours is in conflict.
                (Some(_), Some(_)) => Answer::Ignore(Counter::PassRequestMismatch),
            };
        }
        MessageType::Inform => return inform(req, inv, server),
        _ => return Answer::Ignore(Counter::PassMessageType),
    };
    let Some(host) = host else {
        return unknown(req, inv, server, kind, segment, pools);
    };
    if relayed && !inv.subnet_of(host).is_some_and(|s| s.contains(req.giaddr)) {
        // Reserved elsewhere: this relay's segment is not where it lives.
        return Answer::Ignore(Counter::PassRelay);
    }
    if !relayed && req.ciaddr.is_unspecified() && !on_segment(inv, host, server) {
        // Another interface's host: its segment is not the one this
        // request was broadcast on.
        return Answer::Ignore(Counter::PassUnknownHost);
    }
    if kind == ReplyKind::Ack {
        match requested(req, server) {
            Wanted::OtherServer => return Answer::Ignore(Counter::DropOtherServer),
            Wanted::Address(ip) if Some(ip) == host.ipv4() => {}
            // RFC 2131 4.3.2: an address wrong for the client gets a NAK; its
            // reservation itself never does.
            Wanted::Address(_) | Wanted::Nothing => {
                return Answer::Reply(nak(server, "not your reserved address"));
            }
        }
    }
    // A firmware with no class of ours still gets its address.
    let class = boot_class(req.arch, req.vendor).unwrap_or(BootClass::Plain);
    let profile = inv.profile_of(host);
    let (boot, rule_options) = profile.boot_for(&host.labels, &req.traits());
    let ipxe = req
        .is_ipxe(&inv.ipxe.user_class)
        .then_some(inv.ipxe.script.as_str());
    let boot = boot_answer(
        profile,
        boot.as_ref(),
        class,
        ipxe,
        host.mac,
        &server.ip.to_string(),
    )
    .unwrap_or(Boot::None);
    let Some(subject) = Subject::host(inv, host) else {
        return Answer::Ignore(Counter::PassUnknownHost);
    };
    let mut reply = build(&subject, kind, boot, &rule_options, server);
    if inv.withholds_boot(host) {
        withhold_boot(&mut reply);
    }
    echo_relay_info(&mut reply, req);
    Answer::Reply(reply)
}

/// The subnet in mode proxy the request belongs to, if it does: a known
/// host's own, an unknown client's by the segment it came from.
fn proxy_subnet<'a>(
    inv: &'a Inventory,
    host: Option<&Host>,
    segment: Ipv4Addr,
) -> Option<&'a Subnet> {
    match host {
        Some(host) => inv.subnet_of(host),
        None => inv.subnets.iter().find(|s| s.contains(segment)),
    }
    .filter(|s| s.is_proxy())
}

/// proxyDHCP (PXE 2.1 section 2.2.3), in a subnet whose addresses another
/// DHCP server leases: PXE firmware (option 60 `PXEClient`, which iPXE
/// sends too) gets its boot answer and no address. A DISCOVER on port 67
/// gets a proxy OFFER; the follow-up DHCPREQUEST on port 4011, which the
/// client sends once it holds its address, the ACK. Nothing else is
/// answered: REQUESTs on port 67 complete the client's lease with the
/// address server, and clients that are not PXE firmware are never
/// answered at all. Only hosts of the inventory are answered: a host's
/// `ip` is the address the address server reserves for it, which its
/// script and phone-home must come from, and an unknown machine has none
/// this agent knows (discovery needs this agent's own pool).
fn proxy(
    req: &Request,
    inv: &Inventory,
    server: &Server,
    host: Option<&Host>,
    msg_type: MessageType,
) -> Answer {
    if req.vendor != VendorClass::PxeClient {
        return Answer::Ignore(Counter::IgnoreNotPxe);
    }
    let Some(host) = host else {
        return Answer::Ignore(Counter::PassUnknownHost);
    };
    // Boot information is all a proxy gives: a host given no boot file now
    // (`netboot`) hears only the address server, as a profile that boots
    // nothing does.
    if inv.withholds_boot(host) {
        return Answer::Ignore(Counter::PassUnsupportedClient);
    }
    let relayed = !req.giaddr.is_unspecified();
    if relayed && !inv.subnet_of(host).is_some_and(|s| s.contains(req.giaddr)) {
        return Answer::Ignore(Counter::PassRelay);
    }
    if !relayed && req.ciaddr.is_unspecified() && !on_segment(inv, host, server) {
        return Answer::Ignore(Counter::PassUnknownHost);
    }
    let kind = match (msg_type, req.boot_server) {
        (MessageType::Request, _) if req.server_id.is_some_and(|id| id != server.ip) => {
            return Answer::Ignore(Counter::DropOtherServer);
        }
        (MessageType::Discover, false) => ReplyKind::Offer,
        (MessageType::Request, true) => ReplyKind::Ack,
        (MessageType::Request, false) => return Answer::Ignore(Counter::PassRequestMismatch),
        _ => return Answer::Ignore(Counter::PassMessageType),
    };
    let Some(class) = boot_class(req.arch, req.vendor) else {
        return Answer::Ignore(Counter::PassUnsupportedClient);
    };
    let profile = inv.profile_of(host);
    let (boot, rule_options) = profile.boot_for(&host.labels, &req.traits());
    let ipxe = req
        .is_ipxe(&inv.ipxe.user_class)
        .then_some(inv.ipxe.script.as_str());
    // Boot information is all a proxy has to give.
    let boot = match boot_answer(
        profile,
        boot.as_ref(),
        class,
        ipxe,
        req.chaddr,
        &server.ip.to_string(),
    ) {
        Some(Boot::None) | None => return Answer::Ignore(Counter::PassUnsupportedClient),
        Some(boot) => boot,
    };
    let no_options = BTreeMap::new();
    let subnet_options = inv.subnet_of(host).map_or(&no_options, |s| &s.options);
    let mut reply = build_proxy(
        kind,
        boot,
        subnet_options,
        &rule_options,
        Some(&host.options),
        req,
        server,
    );
    echo_relay_info(&mut reply, req);
    Answer::Reply(reply)
}

/// Whether the interface of `server` (the one the request came in on)
/// serves `host`: an agent on several interfaces answers each host on the
/// interface whose address its subnet holds, and a host of a subnet that no
/// interface's address is in (a relayed segment) on any. An agent on one
/// interface ([`Inventory::served`] empty) serves every host there, and so
/// does an interface whose address is in no subnet of the inventory.
pub(super) fn on_segment(inv: &Inventory, host: &Host, server: &Server) -> bool {
    let Some(subnet) = inv.subnet_of(host) else {
        return false;
    };
    inv.served.is_empty()
        || subnet.contains(server.ip)
        || !inv.served.iter().any(|ip| subnet.contains(*ip))
        || !inv.subnets.iter().any(|s| s.contains(server.ip))
}

/// An unknown host's DISCOVER or REQUEST. With the pool shared
/// ([`crate::share`]), nothing while our own slot is not live, else:
/// - a DISCOVER is ours when the client's RFC 3074 bucket is our live
///   slot's, or when our store holds an address of our slice for it (so a
///   client keeps its address and server while it renews); we offer only
///   from our slice;
/// - a REQUEST naming another server is ignored (RFC 2131 4.3.2), one
///   naming us goes to the store, which acks only addresses of our slice;
/// - a REQUEST without a server id (INIT-REBOOT, RENEWING, REBINDING) for
///   an address of our slice goes to the store; for an address of another
///   slot's slice it is that slot's agent's while the slot is live (no
///   answer here), and when the slot is not live (its agent died) the
///   agent now answering the client's bucket NAKs it, so the client starts
///   over with a DISCOVER and gets an address of the survivor's slice.
fn unknown(
    req: &Request,
    inv: &Inventory,
    server: &Server,
    kind: ReplyKind,
    segment: Ipv4Addr,
    pools: &Pools,
) -> Answer {
    if inv.discovery.policy == DiscoveryPolicy::Ignore {
        return Answer::Ignore(Counter::PassUnknownHost);
    }
    let Some(subnet) = inv
        .subnets
        .iter()
        .position(|s| s.contains(segment) && s.pool.is_some())
    else {
        return Answer::Ignore(Counter::PassUnknownHost);
    };
    let range = inv.subnets[subnet]
        .pool
        .expect("the subnet picked has a pool");
    let share = pools.share;
    // Our slot's Lease lapsed: another agent may take our buckets now, and
    // our slice once our clients' leases have run out. Nothing we bind or
    // renew from here on may outlive that, so no pool client is answered
    // until the Lease is renewed.
    if !share.is_live() {
        return Answer::NotOurs;
    }
    // A pool smaller than the slots leaves the last slots without a slice.
    let Some(slice) = share.slice(range.start, range.end) else {
        return Answer::NotOurs;
    };
    let ours = pools.held.is_some_and(|ip| slice.contains(&ip)) || share.answers(&req.chaddr.0);
    let wanted = match kind {
        ReplyKind::Offer if !ours => return Answer::NotOurs,
        ReplyKind::Offer => req.requested_ip,
        _ => match requested(req, server) {
            Wanted::OtherServer => return Answer::Ignore(Counter::DropOtherServer),
            Wanted::Address(ip) => {
                if req.server_id.is_none()
                    && !slice.contains(&ip)
                    && let Some(owner) = share.slot_at(range.start, range.end, ip)
                {
                    if share.live().contains(&owner) || !share.answers(&req.chaddr.0) {
                        return Answer::NotOurs;
                    }
                    return Answer::Reply(nak(server, "address of a server that left"));
                }
                Some(ip)
            }
            Wanted::Nothing => return Answer::Ignore(Counter::PassMalformed),
        },
    };
    Answer::Pool(PoolAsk {
        subnet,
        kind,
        wanted,
        slice,
    })
}

/// The reply to a pool client once the lease store gave it `ip`: the
/// discovery profile's boot answer (or the iPXE chain), the pool's lease time.
pub fn pool_reply(
    req: &Request,
    inv: &Inventory,
    server: &Server,
    ask: &PoolAsk,
    ip: Ipv4Addr,
) -> Reply {
    let subnet = &inv.subnets[ask.subnet];
    let subject = Subject {
        ip,
        hostname: None,
        subnet,
        options: None,
        lease_time: inv.discovery.lease_time_in(subnet),
    };
    let class = boot_class(req.arch, req.vendor).unwrap_or(BootClass::Plain);
    let (boot, rule_options) = match inv.discovery_profile() {
        Some(profile) => {
            let (boot, options) = profile.boot_for(&BTreeMap::new(), &req.traits());
            let ipxe = req
                .is_ipxe(&inv.ipxe.user_class)
                .then_some(inv.ipxe.script.as_str());
            (
                boot_answer(
                    profile,
                    boot.as_ref(),
                    class,
                    ipxe,
                    req.chaddr,
                    &server.ip.to_string(),
                ),
                options,
            )
        }
        None => (Some(Boot::None), BTreeMap::new()),
    };
    let mut reply = build(
        &subject,
        ask.kind,
        boot.unwrap_or(Boot::None),
        &rule_options,
        server,
    );
    echo_relay_info(&mut reply, req);
    reply
}

/// DHCPINFORM (RFC 2131 4.3.5): the subnet's options, no address or lease.
fn inform(req: &Request, inv: &Inventory, server: &Server) -> Answer {
    let Some(subnet) = inv.subnets.iter().find(|s| s.contains(req.ciaddr)) else {
        return Answer::Ignore(Counter::PassMessageType);
    };
    let subject = Subject {
        ip: Ipv4Addr::UNSPECIFIED,
        hostname: None,
        subnet,
        options: None,
        lease_time: 0,
    };
    let mut reply = build(
        &subject,
        ReplyKind::Ack,
        Boot::None,
        &BTreeMap::new(),
        server,
    );
    reply.options.remove(OptionCode::AddressLeaseTime);
    Answer::Reply(reply)
}

#[cfg(test)]
mod tests;

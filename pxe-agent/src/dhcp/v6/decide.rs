//! DHCPv6 policy (RFC 8415 section 18.3): which host is asking and what
//! it is told. The boot answer is the one policy's (`dhcp::decide`): the
//! same profile, rules, firmware classes, iPXE chain and `netboot` state
//! as over IPv4; this file owns only the DHCPv6 message flow and how a
//! client is known without a `chaddr`.
//!
//! Which host: a DUID-LL or DUID-LLT carries a MAC; a DUID-UUID is matched
//! against the hosts' `uuid:` (in iPXE's byte order or edk2's); otherwise the MAC of an EUI-64 link-local
//! source address (a client on the agent's link), or the client link-layer
//! address a relay adds (option 79, RFC 6939). The first that names a host
//! of the inventory wins. A client none of them names is unknown.
//!
//! An unknown client, under the `inspect` discovery policy, leases from
//! the pool of its link's IPv6 subnet ([`Answer6::Pool`]: the caller
//! settles the lease store, then calls [`pool_reply6`]) and boots the
//! discovery profile, as over IPv4. With the pools shared among agents
//! ([`crate::share`]) it is answered by the agent whose slot its DUID's
//! bucket belongs to, from that agent's slice of the pool. A host of the
//! inventory without `ipv6:` is not leased a pool address (over IPv4
//! every host has its reservation): it is left to other servers.

use std::{collections::BTreeMap, net::Ipv6Addr, ops::RangeInclusive, sync::LazyLock};

use dhcproto::v6::MessageType;
use pxe_ebpf_common::{BootClass, Counter, VendorClass, boot_class};

use super::{
    identity::{Duid, mac_from_eui64},
    reply::{IaNaReply, Lifetimes, Reply6, Status, StatusCode6},
    request::Request6,
};
use crate::{
    dhcp::{decide::boot_answer, reply::Boot},
    inventory::{DiscoveryPolicy, Host, Inventory, Profile, Subnet6, Traits},
    mac::MacAddr,
    share::Share,
};

/// This agent as a DHCPv6 server on one link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server6 {
    /// The address boot URLs name: the agent's address on the link's
    /// subnet (not its link-local one, which a URL cannot carry usefully).
    pub ip: Ipv6Addr,
    /// The server identifier (option 2), the same across restarts.
    pub duid: Vec<u8>,
}

/// The preference (option 7) of an answer to a reserved host: 255 tells
/// the client to take it at once instead of waiting for other servers'
/// (RFC 8415 section 18.2.1), as a host of the inventory is ours.
const RESERVED_PREFERENCE: u8 = 255;

/// What to do with a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer6 {
    Reply(Box<Reply6>),
    /// No answer; the counter says why (the same reasons as IPv4).
    Ignore(Counter),
    /// A reserved host declined its address (another machine uses it):
    /// answered, and recorded for the operator.
    ReservationDeclined {
        reply: Box<Reply6>,
        ip: Ipv6Addr,
    },
    /// An unknown client's Solicit, Request, Renew or Rebind: the caller
    /// leases from the pool, then answers with [`pool_reply6`].
    Pool(PoolAsk6),
    /// An unknown client's Release: the caller frees the addresses of its
    /// IA_NAs, then sends `reply`.
    PoolRelease(Box<Reply6>),
    /// An unknown client's Decline: the caller quarantines the addresses
    /// of its IA_NAs in the pool of subnet `subnet`, then sends `reply`.
    PoolDecline {
        reply: Box<Reply6>,
        subnet: usize,
    },
    /// An unknown client another agent sharing the pool answers: no
    /// answer, so that exactly one agent speaks.
    NotOurs,
}

/// What the lease store must settle before a pool client is answered.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolAsk6 {
    /// Index into [`Inventory::subnets6`].
    pub subnet: usize,
    pub kind: PoolKind6,
    /// The part of the subnet's pool this agent leases from: all of it
    /// alone, its slice when agents share the pool.
    pub slice: RangeInclusive<Ipv6Addr>,
}

/// What the lease store does for each IA_NA of a pool client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind6 {
    /// A Solicit: an address is picked and held, nothing is committed; the
    /// answer is an Advertise.
    Advertise,
    /// A Request, or a Solicit with rapid commit: an address is bound (the
    /// one asked for if it is free) and committed before the Reply.
    Bind,
    /// A Renew or Rebind: the address the IA holds is bound again, or
    /// answered with lifetimes of zero when it may not be the client's.
    Extend,
}

/// What the pool policy knows beyond the request and the inventory.
#[derive(Clone, Copy, Debug)]
pub struct Pools6<'a> {
    /// This agent's slot and the slots live, hence its slices and buckets.
    pub share: &'a Share,
    /// The pool addresses this agent's lease store holds for the
    /// client's IA_NAs (bound or offered, not lapsed): a client of ours
    /// stays ours for its renewals whichever slot its bucket is now.
    pub held: &'a [Ipv6Addr],
}

static ALONE: LazyLock<Share> = LazyLock::new(Share::alone);

impl Pools6<'_> {
    /// An agent with no peers: the whole pool, every unknown client.
    pub fn alone() -> Pools6<'static> {
        Pools6 {
            share: &ALONE,
            held: &[],
        }
    }
}

/// How a DHCPv6 client was known as a host of the inventory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KnownBy {
    /// The MAC of its DUID-LL or DUID-LLT.
    DuidMac,
    /// Its DUID-UUID, against the host's `uuid`.
    Uuid,
    /// The MAC in its EUI-64 link-local address.
    LinkLocal,
    /// The client link-layer address its relay added (option 79).
    Relay,
}

impl KnownBy {
    /// As progress and traces say it.
    pub fn as_str(self) -> &'static str {
        match self {
            KnownBy::DuidMac => "duid mac",
            KnownBy::Uuid => "uuid",
            KnownBy::LinkLocal => "link-local address",
            KnownBy::Relay => "relay option 79",
        }
    }
}

/// The host `req` comes from, and how it was known. `source` is the
/// address the message came from (the client's link-local address, or the
/// relay's).
pub fn identify<'a>(
    req: &Request6,
    source: Ipv6Addr,
    inv: &'a Inventory,
) -> Option<(&'a Host, KnownBy)> {
    let duid = req.client_id.as_deref().map(Duid::parse);
    let by_duid = || match &duid {
        Some(Duid::LinkLayerTime(mac) | Duid::LinkLayer(mac)) => {
            inv.host_by_mac(*mac).map(|h| (h, KnownBy::DuidMac))
        }
        // As iPXE or as edk2 lays the UUID out (`identity`).
        Some(uuid @ Duid::Uuid(_)) => uuid
            .system_uuids()
            .into_iter()
            .flatten()
            .find_map(|uuid| inv.host_by_uuid(&uuid))
            .map(|h| (h, KnownBy::Uuid)),
        _ => None,
    };
    // The client's own address: the innermost relay's peer address when
    // relayed, else where the message came from.
    let peer = req.relays.last().map_or(source, |hop| hop.peer_addr);
    let by_link_local = || {
        mac_from_eui64(peer)
            .and_then(|mac| inv.host_by_mac(mac))
            .map(|h| (h, KnownBy::LinkLocal))
    };
    let by_relay = || {
        req.relays
            .iter()
            .rev()
            .find_map(|hop| hop.client_link_layer)
            .and_then(|mac| inv.host_by_mac(mac))
            .map(|h| (h, KnownBy::Relay))
    };
    by_duid().or_else(by_link_local).or_else(by_relay)
}

/// A Confirm's answer (RFC 8415 section 18.3.3): whether every address
/// the client holds is on `subnet`'s link; with none to judge, no answer.
fn confirm(mut reply: Reply6, held: &[Ipv6Addr], subnet: &Subnet6) -> Answer6 {
    if held.is_empty() {
        return Answer6::Ignore(Counter::PassMalformed);
    }
    reply.status = Some(if held.iter().all(|a| subnet.contains(*a)) {
        status(StatusCode6::Success, "on link")
    } else {
        status(StatusCode6::NotOnLink, "not on this link")
    });
    Answer6::Reply(Box::new(reply))
}

/// The one policy's answer to a DHCPv6 request from `source`, for an
/// agent alone.
pub fn decide6(req: &Request6, source: Ipv6Addr, inv: &Inventory, server: &Server6) -> Answer6 {
    let host = identify(req, source, inv).map(|(host, _)| host);
    decide6_shared(req, host, inv, server, &Pools6::alone())
}

/// The one policy, for an agent that may share its pools with peers:
/// reserved hosts are answered as by an agent alone, unknown clients as
/// [`unknown`] says. `host` is the one [`identify`] found (the caller has
/// it already, to name the client in progress and traces).
pub fn decide6_shared(
    req: &Request6,
    host: Option<&Host>,
    inv: &Inventory,
    server: &Server6,
    pools: &Pools6,
) -> Answer6 {
    // RFC 8415 section 16: every message but an Information-Request names
    // its client, and a message naming another server is not ours.
    let Some(client_id) = req.client_id.as_deref() else {
        if req.msg_type != MessageType::InformationRequest {
            return Answer6::Ignore(Counter::PassMalformed);
        }
        return information(req, None, inv, server);
    };
    let to_us = match req.server_id.as_deref() {
        Some(id) if id != server.duid.as_slice() => {
            return Answer6::Ignore(Counter::DropOtherServer);
        }
        Some(_) => true,
        None => false,
    };
    let named = matches!(
        req.msg_type,
        MessageType::Request | MessageType::Renew | MessageType::Release | MessageType::Decline
    );
    // Section 16.3-16.10: these must name the server, the others must not.
    if named != to_us && req.msg_type != MessageType::InformationRequest {
        return Answer6::Ignore(Counter::PassMalformed);
    }
    if req.msg_type == MessageType::InformationRequest {
        return information(req, host, inv, server);
    }
    let Some(host) = host else {
        return unknown(req, client_id, inv, server, pools);
    };
    let Some((ip, subnet)) = host.ipv6().zip(inv.subnet6_of(host)) else {
        // Known over IPv4 only: another server may have its IPv6 address.
        return Answer6::Ignore(Counter::PassUnknownHost);
    };
    if let Some(hop) = req.relays.last()
        && !hop.link_addr.is_unspecified()
        && !subnet.contains(hop.link_addr)
    {
        // Reserved elsewhere: this relay's link is not where it lives.
        return Answer6::Ignore(Counter::PassRelay);
    }
    let mut reply = base(req, client_id, server);
    match req.msg_type {
        MessageType::Solicit if req.rapid_commit => {
            reply.msg_type = MessageType::Reply;
            reply.rapid_commit = true;
        }
        MessageType::Solicit => {
            reply.msg_type = MessageType::Advertise;
            reply.preference = Some(RESERVED_PREFERENCE);
        }
        MessageType::Request | MessageType::Renew | MessageType::Rebind => {}
        MessageType::Confirm => {
            let held: Vec<Ipv6Addr> = req.ia_na.iter().flat_map(|ia| ia.addrs.clone()).collect();
            return confirm(reply, &held, subnet);
        }
        MessageType::Release => {
            // A reservation stays the host's; nothing to free.
            reply.status = Some(status(StatusCode6::Success, "released"));
            return Answer6::Reply(Box::new(reply));
        }
        MessageType::Decline => {
            reply.status = Some(status(StatusCode6::Success, "declined"));
            let declined = req.ia_na.iter().flat_map(|ia| &ia.addrs).any(|a| *a == ip);
            return if declined {
                Answer6::ReservationDeclined {
                    reply: Box::new(reply),
                    ip,
                }
            } else {
                Answer6::Reply(Box::new(reply))
            };
        }
        _ => return Answer6::Ignore(Counter::PassMessageType),
    }
    reply.ia_na = req
        .ia_na
        .iter()
        .map(|ia| lease(ia.iaid, ip, subnet))
        .collect();
    options(&mut reply, req, host_boot(inv, host), subnet, inv, server);
    Answer6::Reply(Box::new(reply))
}

/// An unknown client's message, under the `inspect` discovery policy and
/// with a pool in the IPv6 subnet of its link (the relay's link address,
/// else the subnet of this agent's address). With the pool shared, nothing
/// while this agent's slot is not live; else a Solicit (or a Confirm) is
/// ours when the DUID's RFC 3074 bucket is our slot's or our store holds
/// an address of our slice for it; a Request, Renew, Release or Decline
/// names this server, so is ours; a Rebind for an address of another live
/// slot's slice is that agent's, and one for a slot that left is answered
/// by the agent of the client's bucket, with lifetimes of zero, so that
/// the client starts over.
fn unknown(
    req: &Request6,
    client_id: &[u8],
    inv: &Inventory,
    server: &Server6,
    pools: &Pools6,
) -> Answer6 {
    if inv.discovery.policy == DiscoveryPolicy::Ignore {
        return Answer6::Ignore(Counter::PassUnknownHost);
    }
    let link = req
        .relays
        .last()
        .map(|hop| hop.link_addr)
        .filter(|a| !a.is_unspecified())
        .unwrap_or(server.ip);
    let Some(index) = inv
        .subnets6
        .iter()
        .position(|s| s.contains(link) && s.pool.is_some())
    else {
        return Answer6::Ignore(Counter::PassUnknownHost);
    };
    let subnet = &inv.subnets6[index];
    let range = subnet.pool.expect("the subnet picked has a pool");
    let share = pools.share;
    if !share.is_live() {
        return Answer6::NotOurs;
    }
    let Some(slice) = share.slice6(range.start, range.end) else {
        return Answer6::NotOurs;
    };
    let ours = pools.held.iter().any(|ip| slice.contains(ip)) || share.answers(client_id);
    let held: Vec<Ipv6Addr> = req.ia_na.iter().flat_map(|ia| ia.addrs.clone()).collect();
    let mut reply = base(req, client_id, server);
    let kind = match req.msg_type {
        MessageType::Solicit if !ours => return Answer6::NotOurs,
        MessageType::Solicit if req.rapid_commit => PoolKind6::Bind,
        MessageType::Solicit => PoolKind6::Advertise,
        MessageType::Request => PoolKind6::Bind,
        MessageType::Renew => PoolKind6::Extend,
        MessageType::Rebind => {
            let elsewhere = held
                .iter()
                .filter(|ip| range.contains(**ip) && !slice.contains(*ip))
                .find_map(|ip| share.slot_at6(range.start, range.end, *ip));
            match elsewhere {
                Some(owner) if share.live().contains(&owner) || !share.answers(client_id) => {
                    return Answer6::NotOurs;
                }
                Some(_) => {}
                None if !ours && !held.iter().any(|ip| slice.contains(ip)) => {
                    return Answer6::NotOurs;
                }
                None => {}
            }
            PoolKind6::Extend
        }
        MessageType::Confirm => {
            if !ours {
                return Answer6::NotOurs;
            }
            return confirm(reply, &held, subnet);
        }
        MessageType::Release => {
            reply.status = Some(status(StatusCode6::Success, "released"));
            return Answer6::PoolRelease(Box::new(reply));
        }
        MessageType::Decline => {
            reply.status = Some(status(StatusCode6::Success, "declined"));
            return Answer6::PoolDecline {
                reply: Box::new(reply),
                subnet: index,
            };
        }
        _ => return Answer6::Ignore(Counter::PassMessageType),
    };
    Answer6::Pool(PoolAsk6 {
        subnet: index,
        kind,
        slice,
    })
}

/// The lease time of the pool of `subnet`: the discovery policy's, else
/// the subnet's, as over IPv4.
pub fn pool_lease_time6(inv: &Inventory, subnet: &Subnet6) -> u32 {
    inv.discovery.lease_time.unwrap_or(subnet.lease_time)
}

/// The answer to a pool client once the lease store settled each of its
/// IA_NAs (`ia_na`, in the request's order): an Advertise, or a Reply
/// (with rapid commit to a Solicit that asked for it), with the discovery
/// profile's boot answer. When no IA_NA got an address, a Solicit is
/// answered with status NoAddrsAvail alone (RFC 8415 section 18.3.1).
pub fn pool_reply6(
    req: &Request6,
    source: Ipv6Addr,
    inv: &Inventory,
    server: &Server6,
    ask: &PoolAsk6,
    ia_na: Vec<IaNaReply>,
) -> Reply6 {
    let subnet = &inv.subnets6[ask.subnet];
    let mut reply = base(req, req.client_id.as_deref().unwrap_or_default(), server);
    let none = !ia_na.is_empty() && ia_na.iter().all(|ia| ia.addrs.is_empty());
    if req.msg_type == MessageType::Solicit {
        if ask.kind == PoolKind6::Advertise {
            reply.msg_type = MessageType::Advertise;
        } else {
            reply.rapid_commit = true;
        }
        if none {
            reply.msg_type = MessageType::Advertise;
            reply.rapid_commit = false;
            reply.status = Some(status(StatusCode6::NoAddrsAvail, "no addresses available"));
            return reply;
        }
    }
    reply.ia_na = ia_na;
    let mac = client_mac(req, source);
    let boot = inv
        .discovery_profile()
        .map(|profile| (profile, &*NO_LABELS, mac.unwrap_or(MacAddr([0; 6]))));
    options(&mut reply, req, boot, subnet, inv, server);
    reply
}

/// An unknown machine has no labels for the rules to match.
static NO_LABELS: LazyLock<BTreeMap<String, String>> = LazyLock::new(BTreeMap::new);

/// A pool address in the IA `iaid`, valid for `valid` seconds.
pub fn pool_lease(iaid: u32, ip: Ipv6Addr, valid: u32) -> IaNaReply {
    IaNaReply {
        iaid,
        t1: valid / 2,
        t2: valid / 5 * 4,
        addrs: vec![Lifetimes {
            addr: ip,
            preferred: valid,
            valid,
        }],
        status: None,
    }
}

/// The IA `iaid` with no address and status `code`: NoAddrsAvail when the
/// pool is exhausted, NoBinding for a Renew of nothing.
pub fn pool_ia_status(iaid: u32, code: StatusCode6, message: &str) -> IaNaReply {
    IaNaReply {
        iaid,
        t1: 0,
        t2: 0,
        addrs: Vec::new(),
        status: Some(status(code, message)),
    }
}

/// The IA `iaid` with `addrs` at lifetimes of zero: the client may no
/// longer use them (RFC 8415 section 18.3.4).
pub fn pool_ia_withdrawn(iaid: u32, addrs: &[Ipv6Addr]) -> IaNaReply {
    IaNaReply {
        iaid,
        t1: 0,
        t2: 0,
        addrs: addrs
            .iter()
            .map(|&addr| Lifetimes {
                addr,
                preferred: 0,
                valid: 0,
            })
            .collect(),
        status: None,
    }
}

/// An Information-Request (section 18.3.6): the subnet's options and the
/// boot answer, no address. iPXE sends one after a router advertisement
/// with only the O flag.
fn information(req: &Request6, host: Option<&Host>, inv: &Inventory, server: &Server6) -> Answer6 {
    let subnet = host
        .and_then(|h| inv.subnet6_of(h))
        .or_else(|| inv.subnets6.iter().find(|s| s.contains(server.ip)));
    let Some(subnet) = subnet else {
        return Answer6::Ignore(Counter::PassUnknownHost);
    };
    let mut reply = base(req, req.client_id.as_deref().unwrap_or_default(), server);
    if req.client_id.is_none() {
        reply.client_id = None;
    }
    let boot = host.and_then(|h| host_boot(inv, h));
    options(&mut reply, req, boot, subnet, inv, server);
    Answer6::Reply(Box::new(reply))
}

/// A Reply to `req` naming both ends, nothing else yet.
fn base(req: &Request6, client_id: &[u8], server: &Server6) -> Reply6 {
    Reply6 {
        msg_type: MessageType::Reply,
        xid: req.xid,
        server_id: server.duid.clone(),
        client_id: Some(client_id.to_vec()),
        ia_na: Vec::new(),
        status: None,
        preference: None,
        rapid_commit: false,
        dns: Vec::new(),
        domain_search: Vec::new(),
        boot_url: None,
        boot_params: Vec::new(),
        vendor_class: None,
    }
}

/// The host's reservation in the IA the client named: valid for the
/// subnet's lease time, renewed at half and rebound at four fifths of it
/// (RFC 8415 section 21.4's recommended 0.5 and 0.8).
fn lease(iaid: u32, ip: Ipv6Addr, subnet: &Subnet6) -> IaNaReply {
    pool_lease(iaid, ip, subnet.lease_time)
}

fn status(code: StatusCode6, message: &str) -> Status {
    Status::new(code, message)
}

/// A host's boot answer's inputs for [`options`]: none while its netboot
/// state withholds boot.
fn host_boot<'a>(
    inv: &'a Inventory,
    host: &'a Host,
) -> Option<(&'a Profile, &'a BTreeMap<String, String>, MacAddr)> {
    (!inv.withholds_boot(host)).then(|| (inv.profile_of(host), &host.labels, host.mac))
}

/// The subnet's options and, with `boot` (a profile, the labels its rules
/// match, the MAC for `{mac}`), the boot answer: option 59 as a
/// URL (`tftp://[server]/file` for PXE, the HTTP URL for HTTP boot, the
/// script for iPXE), with option 16 echoed to an HTTP boot client (UEFI
/// counts an answer as an HTTP boot offer only then).
fn options(
    reply: &mut Reply6,
    req: &Request6,
    boot: Option<(&Profile, &BTreeMap<String, String>, MacAddr)>,
    subnet: &Subnet6,
    inv: &Inventory,
    server: &Server6,
) {
    reply.dns.clone_from(&subnet.dns);
    reply.domain_search = subnet.domain.iter().cloned().collect();
    let Some((profile, labels, mac)) = boot else {
        return;
    };
    let vendor = req
        .vendor_text()
        .map_or(VendorClass::None, VendorClass::from_prefix);
    let class = boot_class(req.arch, vendor).unwrap_or(BootClass::Plain);
    let traits = Traits {
        arch: req.arch,
        vendor_class: req.vendor_text(),
        user_classes: &req.user_classes,
        circuit_id: None,
    };
    let (boot, _ipv4_options) = profile.boot_for(labels, &traits);
    let ipxe = req
        .has_user_class(inv.ipxe.user_class.as_bytes())
        .then_some(inv.ipxe.script.as_str());
    let address = format!("[{}]", server.ip);
    let boot = boot_answer(profile, boot.as_ref(), class, ipxe, mac, &address);
    reply.boot_url = match boot {
        Some(Boot::Tftp(file)) => {
            Some(format!("tftp://{address}/{}", file.trim_start_matches('/')))
        }
        Some(Boot::Http(url) | Boot::Ipxe(url)) => Some(url),
        Some(Boot::None) | None => None,
    };
    if class == BootClass::Http && reply.boot_url.is_some() {
        reply.vendor_class = req.vendor_class.clone();
    }
}

/// The MAC a request names its client by, for progress and traces: the
/// host's when known, else what its DUID or link-local address carries.
pub fn client_mac(req: &Request6, source: Ipv6Addr) -> Option<MacAddr> {
    match req.client_id.as_deref().map(Duid::parse) {
        Some(Duid::LinkLayerTime(mac) | Duid::LinkLayer(mac)) => Some(mac),
        _ => mac_from_eui64(req.relays.last().map_or(source, |hop| hop.peer_addr)),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::dhcp::v6::{
        identity::eui64_link_local,
        reply::encode6,
        request::{IaNa, RelayHop, VendorClass6},
    };

    const HOST_1: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
    const UUID_2: [u8; 16] = [
        0x8a, 0x5c, 0x2e, 0x6b, 0x1e, 0x0f, 0x4c, 0x1d, 0x9b, 0x7a, 0x01, 0x23, 0x45, 0x67, 0x89,
        0xab,
    ];

    fn inventory(extra: &str) -> Inventory {
        let text = format!(
            r#"
subnets:
  - {{cidr: 10.66.0.0/16, router: 10.66.0.1}}
  - {{cidr: "fd00:66::/64", dns: ["fd00:66::53"], domain: lab.example, lease_time: 600}}
profiles:
  - name: all
    boot: {{bios: undionly.kpxe, uefi: ipxe.efi, http: "http://{{server}}:8080/ipxe.efi"}}
hosts:
  - {{mac: "52:54:00:12:34:56", ip: 10.66.1.10, ipv6: "fd00:66::10", profile: all}}
  - {{mac: "52:54:00:12:34:57", ip: 10.66.1.11, ipv6: "fd00:66::11", profile: all,
     uuid: 8A5C2E6B-1E0F-4C1D-9B7A-0123456789AB}}
  - {{mac: "52:54:00:12:34:58", ip: 10.66.1.12, profile: all}}
{extra}"#
        );
        Inventory::parse(Path::new("hosts.yaml"), &text).expect("valid")
    }

    fn server() -> Server6 {
        Server6 {
            ip: "fd00:66::1".parse().unwrap(),
            duid: vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 1],
        }
    }

    fn duid_llt(mac: MacAddr) -> Box<[u8]> {
        let mut duid = vec![0, 1, 0, 1, 0x2e, 0x6b, 0x1e, 0x0f];
        duid.extend_from_slice(&mac.0);
        duid.into()
    }

    fn duid_uuid(uuid: [u8; 16]) -> Box<[u8]> {
        let mut duid = vec![0, 4];
        duid.extend_from_slice(&uuid);
        duid.into()
    }

    fn solicit(client_id: Box<[u8]>) -> Request6 {
        Request6 {
            msg_type: MessageType::Solicit,
            xid: [1, 2, 3],
            client_id: Some(client_id),
            server_id: None,
            ia_na: vec![IaNa {
                iaid: 7,
                t1: 0,
                t2: 0,
                addrs: Vec::new(),
            }],
            oro: vec![23, 24, 59],
            rapid_commit: false,
            user_classes: Vec::new(),
            vendor_class: None,
            arch: None,
            nii: None,
            relays: Vec::new(),
        }
    }

    fn firmware(mut req: Request6, vendor: &str, arch: u16) -> Request6 {
        req.vendor_class = Some(VendorClass6 {
            enterprise: 343,
            data: vec![vendor.as_bytes().to_vec()],
        });
        req.arch = Some(arch);
        req
    }

    /// Somewhere on the link, not an EUI-64 address.
    fn stranger() -> Ipv6Addr {
        "fe80::1234:5678:9abc:def0".parse().unwrap()
    }

    fn reply(answer: Answer6) -> Reply6 {
        match answer {
            Answer6::Reply(reply) => *reply,
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    fn address(reply: &Reply6) -> Option<Ipv6Addr> {
        reply.ia_na.first()?.addrs.first().map(|l| l.addr)
    }

    #[test]
    fn a_solicit_by_duid_llt_is_advertised_the_reservation_in_its_ia() {
        let inv = inventory("");
        let advertise = reply(decide6(
            &solicit(duid_llt(HOST_1)),
            stranger(),
            &inv,
            &server(),
        ));
        assert_eq!(advertise.msg_type, MessageType::Advertise);
        assert_eq!(advertise.xid, [1, 2, 3]);
        assert_eq!(advertise.preference, Some(255));
        assert_eq!(advertise.server_id, server().duid);
        assert_eq!(advertise.ia_na[0].iaid, 7);
        assert_eq!((advertise.ia_na[0].t1, advertise.ia_na[0].t2), (300, 480));
        assert_eq!(address(&advertise), Some("fd00:66::10".parse().unwrap()));
        assert_eq!(advertise.dns, ["fd00:66::53".parse::<Ipv6Addr>().unwrap()]);
        assert_eq!(advertise.domain_search, ["lab.example"]);
        // A plain client is told no boot file.
        assert_eq!(advertise.boot_url, None);
    }

    #[test]
    fn firmware_is_known_by_its_uuid_and_told_its_boot_file_as_a_url() {
        let inv = inventory("");
        let pxe = firmware(
            solicit(duid_uuid(UUID_2)),
            "PXEClient:Arch:00007:UNDI:003016",
            7,
        );
        let advertise = reply(decide6(&pxe, stranger(), &inv, &server()));
        assert_eq!(address(&advertise), Some("fd00:66::11".parse().unwrap()));
        assert_eq!(
            advertise.boot_url.as_deref(),
            Some("tftp://[fd00:66::1]/ipxe.efi")
        );
        assert_eq!(advertise.vendor_class, None);

        // UEFI HTTP boot with Rapid Commit: a Reply at once, option 16 echoed.
        let mut http = firmware(
            solicit(duid_uuid(UUID_2)),
            "HTTPClient:Arch:00016:UNDI:003000",
            16,
        );
        http.rapid_commit = true;
        let answer = reply(decide6(&http, stranger(), &inv, &server()));
        assert_eq!(answer.msg_type, MessageType::Reply);
        assert!(answer.rapid_commit);
        assert_eq!(
            answer.boot_url.as_deref(),
            Some("http://[fd00:66::1]:8080/ipxe.efi")
        );
        assert_eq!(answer.vendor_class, http.vendor_class);

        // iPXE is sent to its script: the chainload loop ends there.
        let mut ipxe = firmware(
            solicit(duid_uuid(UUID_2)),
            "PXEClient:Arch:00007:UNDI:003016",
            7,
        );
        ipxe.user_classes = vec![b"iPXE".to_vec()];
        let answer = reply(decide6(&ipxe, stranger(), &inv, &server()));
        assert_eq!(
            answer.boot_url.as_deref(),
            Some("http://[fd00:66::1]:8080/boot/52:54:00:12:34:57.ipxe")
        );
    }

    /// Solicits captured on the lab's link (`tests/src/boot_vm6.rs`) from
    /// OVMF (edk2 2022.11) and Debian's iPXE, the machine run with `-uuid
    /// 8a5c2e6b-1e0f-4c1d-9b7a-0123456789ab` (host 2's `uuid`).
    const OVMF_IP6_STACK: &str = "010513290001001200046b2e5c8a0f1e1d4c9b7a0123456789ab00080002\
        00000003000c7e0fdd52ffffffffffffffff000600020017";
    const OVMF_PXE: &str = "010713290001001200046b2e5c8a0f1e1d4c9b7a0123456789ab00080002\
        00000003000ce6ef7573ffffffffffffffff00060008003b003c00170010003e0003010300003d0002\
        000700100026000001570020505845436c69656e743a417263683a30303030373a554e44493a3030\
        33303030";
    const IPXE: &str = "01173e3f0001001200048a5c2e6b1e0f4c1d9b7a0123456789ab0003000cfd4a55a2\
        00000000000000000006000800170018003b003c00100026000001570020505845436c69656e743a\
        417263683a30303030373a554e44493a303033303130003d00020007003e000301030a000f000600\
        0469505845000800020000";
    /// OVMF's HTTP boot with a system UUID no host has.
    const OVMF_HTTP: &str = "01507eb80001001200043c2d1e0f5a4b78698796a5b4c3d2e1f000080002\
        00000003000c31834d71ffffffffffffffff00060008003b003c00170010003e0003010300003d0002\
        00100010002700000157002148545450436c69656e743a417263683a30303031363a554e44493a30\
        3033303030";

    #[test]
    fn what_ovmf_and_ipxe_really_send_is_known_and_answered() {
        let inv = inventory("");
        let parse = |hex: &str| {
            let bytes = crate::inventory::decode_hex(hex).expect("hex");
            Request6::parse(&bytes).expect("parses")
        };
        let host_2 = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x57]);
        // Its link-local address is of another MAC: the UUID names it.
        let source = eui64_link_local(MacAddr([0x52, 0x54, 0x00, 0x66, 0x10, 0x01]));
        let known = |req: &Request6| identify(req, source, &inv).map(|(h, by)| (h.mac, by));

        // OVMF's IPv6 stack, on the advertisement's M flag: the address,
        // in its own IA, and no boot file (no architecture).
        let stack = parse(OVMF_IP6_STACK);
        assert_eq!(known(&stack), Some((host_2, KnownBy::Uuid)));
        let advertise = reply(decide6(&stack, source, &inv, &server()));
        assert_eq!(advertise.msg_type, MessageType::Advertise);
        assert_eq!(advertise.ia_na[0].iaid, 0x7e0f_dd52);
        assert_eq!(address(&advertise), Some("fd00:66::11".parse().unwrap()));
        assert_eq!(advertise.boot_url, None);

        // Its PXE client, in another IA, with T1 and T2 infinite.
        let pxe = parse(OVMF_PXE);
        assert_eq!((pxe.arch, pxe.ia_na[0].t1), (Some(7), u32::MAX));
        let advertise = reply(decide6(&pxe, source, &inv, &server()));
        assert_eq!(advertise.ia_na[0].iaid, 0xe6ef_7573);
        assert_eq!(address(&advertise), Some("fd00:66::11".parse().unwrap()));
        assert_eq!(
            advertise.boot_url.as_deref(),
            Some("tftp://[fd00:66::1]/ipxe.efi")
        );

        // iPXE, the same UUID in the other byte order.
        let ipxe = parse(IPXE);
        assert_eq!(known(&ipxe), Some((host_2, KnownBy::Uuid)));
        let advertise = reply(decide6(&ipxe, source, &inv, &server()));
        assert_eq!(
            advertise.boot_url.as_deref(),
            Some("http://[fd00:66::1]:8080/boot/52:54:00:12:34:57.ipxe")
        );

        // HTTP boot from host 1's link-local address, its UUID unknown.
        let http = parse(OVMF_HTTP);
        let from_1 = eui64_link_local(HOST_1);
        assert_eq!(
            identify(&http, from_1, &inv).map(|(h, by)| (h.mac, by)),
            Some((HOST_1, KnownBy::LinkLocal))
        );
        let advertise = reply(decide6(&http, from_1, &inv, &server()));
        assert_eq!(
            advertise.boot_url.as_deref(),
            Some("http://[fd00:66::1]:8080/ipxe.efi")
        );
        assert_eq!(advertise.vendor_class, http.vendor_class);
        assert!(!encode6(&advertise, &[]).is_empty());
    }

    #[test]
    fn without_a_mac_in_the_duid_the_link_local_address_or_the_relay_names_the_host() {
        let inv = inventory("");
        let unknown_uuid = duid_uuid([7; 16]);
        let req = solicit(unknown_uuid.clone());
        assert_eq!(
            decide6(&req, stranger(), &inv, &server()),
            Answer6::Ignore(Counter::PassUnknownHost)
        );
        let advertise = reply(decide6(&req, eui64_link_local(HOST_1), &inv, &server()));
        assert_eq!(address(&advertise), Some("fd00:66::10".parse().unwrap()));
        let known = |req: &Request6, source| identify(req, source, &inv).map(|(h, by)| (h.mac, by));
        assert_eq!(
            known(&req, eui64_link_local(HOST_1)),
            Some((HOST_1, KnownBy::LinkLocal))
        );
        assert_eq!(
            known(&solicit(duid_llt(HOST_1)), stranger()),
            Some((HOST_1, KnownBy::DuidMac))
        );
        let host_2 = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x57]);
        // iPXE's order and edk2's (the first three fields swapped).
        let mut edk2 = UUID_2;
        edk2[..4].reverse();
        edk2[4..6].reverse();
        edk2[6..8].reverse();
        for uuid in [UUID_2, edk2] {
            assert_eq!(
                known(&solicit(duid_uuid(uuid)), stranger()),
                Some((host_2, KnownBy::Uuid))
            );
        }

        // Relayed: the relay's option 79, from a link in the host's subnet.
        let mut relayed = solicit(unknown_uuid);
        relayed.relays = vec![RelayHop {
            hop_count: 0,
            link_addr: "fd00:66::2".parse().unwrap(),
            peer_addr: stranger(),
            interface_id: Some(b"eth0.66".to_vec()),
            client_link_layer: Some(HOST_1),
        }];
        let relay = "fd00:66::2".parse().unwrap();
        let advertise = reply(decide6(&relayed, relay, &inv, &server()));
        assert_eq!(address(&advertise), Some("fd00:66::10".parse().unwrap()));
        // From a relay on another link, the reservation is not this link's.
        relayed.relays[0].link_addr = "fd00:99::2".parse().unwrap();
        assert_eq!(
            decide6(&relayed, relay, &inv, &server()),
            Answer6::Ignore(Counter::PassRelay)
        );
    }

    #[test]
    fn the_message_flow_follows_rfc_8415() {
        let inv = inventory("");
        let mut request = solicit(duid_llt(HOST_1));
        request.msg_type = MessageType::Request;
        // A Request must name a server, and only this one is answered.
        assert_eq!(
            decide6(&request, stranger(), &inv, &server()),
            Answer6::Ignore(Counter::PassMalformed)
        );
        request.server_id = Some(vec![0, 3, 0, 1, 9, 9, 9, 9, 9, 9].into());
        assert_eq!(
            decide6(&request, stranger(), &inv, &server()),
            Answer6::Ignore(Counter::DropOtherServer)
        );
        request.server_id = Some(server().duid.into());
        let answer = reply(decide6(&request, stranger(), &inv, &server()));
        assert_eq!(answer.msg_type, MessageType::Reply);
        assert_eq!(address(&answer), Some("fd00:66::10".parse().unwrap()));

        // Confirm: on link or not.
        let mut confirm = solicit(duid_llt(HOST_1));
        confirm.msg_type = MessageType::Confirm;
        confirm.ia_na[0].addrs = vec!["fd00:66::10".parse().unwrap()];
        let answer = reply(decide6(&confirm, stranger(), &inv, &server()));
        assert_eq!(answer.status.map(|s| s.code), Some(StatusCode6::Success));
        confirm.ia_na[0].addrs = vec!["fd00:99::10".parse().unwrap()];
        let answer = reply(decide6(&confirm, stranger(), &inv, &server()));
        assert_eq!(answer.status.map(|s| s.code), Some(StatusCode6::NotOnLink));

        // Decline of its own reservation is reported.
        let mut decline = request.clone();
        decline.msg_type = MessageType::Decline;
        decline.ia_na[0].addrs = vec!["fd00:66::10".parse().unwrap()];
        assert!(matches!(
            decide6(&decline, stranger(), &inv, &server()),
            Answer6::ReservationDeclined { ip, .. } if ip == "fd00:66::10".parse::<Ipv6Addr>().unwrap()
        ));

        // An Information-Request from anyone gets the link's settings.
        let mut info = solicit(duid_uuid([7; 16]));
        info.msg_type = MessageType::InformationRequest;
        info.ia_na.clear();
        let answer = reply(decide6(&info, stranger(), &inv, &server()));
        assert!(answer.ia_na.is_empty() && answer.boot_url.is_none());
        assert_eq!(answer.dns, ["fd00:66::53".parse::<Ipv6Addr>().unwrap()]);

        // A host without an IPv6 address is left to other servers.
        let third = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x58]);
        assert_eq!(
            decide6(&solicit(duid_llt(third)), stranger(), &inv, &server()),
            Answer6::Ignore(Counter::PassUnknownHost)
        );
    }

    #[test]
    fn a_host_given_no_boot_file_gets_its_address_only_as_over_ipv4() {
        let inv = inventory(
            "  - {mac: \"52:54:00:12:34:59\", ip: 10.66.1.13, ipv6: \"fd00:66::13\", profile: all, netboot: never}\n",
        );
        let mac = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x59]);
        let pxe = firmware(
            solicit(duid_llt(mac)),
            "PXEClient:Arch:00007:UNDI:003016",
            7,
        );
        let advertise = reply(decide6(&pxe, stranger(), &inv, &server()));
        assert_eq!(address(&advertise), Some("fd00:66::13".parse().unwrap()));
        assert_eq!(advertise.boot_url, None);
    }

    /// The inventory with discovery `policy` and pools on both subnets.
    fn pool_inventory(policy: &str) -> Inventory {
        let text = format!(
            r#"
subnets:
  - {{cidr: 10.66.0.0/16, router: 10.66.0.1, pool: {{start: 10.66.200.1, end: 10.66.200.9}}}}
  - {{cidr: "fd00:66::/64", lease_time: 600,
     pool: {{start: "fd00:66::1000", end: "fd00:66::100f"}}}}
discovery: {{policy: {policy}, profile: inspector, lease_time: 300}}
profiles:
  - name: all
    boot: {{uefi: ipxe.efi}}
  - name: inspector
    boot: {{http: "http://{{server}}:8080/inspect.efi"}}
hosts:
  - {{mac: "52:54:00:12:34:56", ip: 10.66.1.10, ipv6: "fd00:66::10", profile: all}}
  - {{mac: "52:54:00:12:34:58", ip: 10.66.1.12, profile: all}}
"#
        );
        Inventory::parse(Path::new("hosts.yaml"), &text).expect("valid")
    }

    const UNKNOWN: MacAddr = MacAddr([0x52, 0x54, 0x00, 0xaa, 0xbb, 0x01]);

    fn pool_ask(answer: Answer6) -> PoolAsk6 {
        match answer {
            Answer6::Pool(ask) => ask,
            other => panic!("expected a pool lease, got {other:?}"),
        }
    }

    fn to_us(mut req: Request6, msg_type: MessageType, addr: Option<Ipv6Addr>) -> Request6 {
        req.msg_type = msg_type;
        req.server_id = Some(server().duid.into());
        req.ia_na[0].addrs = addr.into_iter().collect();
        req
    }

    #[test]
    fn unknown_clients_lease_from_their_links_pool_under_inspect() {
        let inv = pool_inventory("inspect");
        let whole = "fd00:66::1000".parse().unwrap()..="fd00:66::100f".parse().unwrap();
        let src = stranger();
        let sol = solicit(duid_llt(UNKNOWN));
        let ask = pool_ask(decide6(&sol, src, &inv, &server()));
        assert_eq!((ask.subnet, ask.kind), (0, PoolKind6::Advertise));
        assert_eq!(ask.slice, whole);
        let rapid = Request6 {
            rapid_commit: true,
            ..sol.clone()
        };
        assert_eq!(
            pool_ask(decide6(&rapid, src, &inv, &server())).kind,
            PoolKind6::Bind
        );
        let addr = Some("fd00:66::1000".parse().unwrap());
        for (msg_type, kind) in [
            (MessageType::Request, PoolKind6::Bind),
            (MessageType::Renew, PoolKind6::Extend),
        ] {
            let req = to_us(sol.clone(), msg_type, addr);
            assert_eq!(pool_ask(decide6(&req, src, &inv, &server())).kind, kind);
        }
        let mut rebind = sol.clone();
        rebind.msg_type = MessageType::Rebind;
        rebind.ia_na[0].addrs = addr.into_iter().collect();
        assert_eq!(
            pool_ask(decide6(&rebind, src, &inv, &server())).kind,
            PoolKind6::Extend
        );
        let release = to_us(sol.clone(), MessageType::Release, addr);
        match decide6(&release, src, &inv, &server()) {
            Answer6::PoolRelease(reply) => {
                assert_eq!(reply.status.map(|s| s.code), Some(StatusCode6::Success));
            }
            other => panic!("{other:?}"),
        }
        let decline = to_us(sol.clone(), MessageType::Decline, addr);
        assert!(matches!(
            decide6(&decline, src, &inv, &server()),
            Answer6::PoolDecline { subnet: 0, .. }
        ));
        // Confirm: on link for a pool address, not for one elsewhere.
        let mut confirm = sol.clone();
        confirm.msg_type = MessageType::Confirm;
        confirm.ia_na[0].addrs = addr.into_iter().collect();
        let on = reply(decide6(&confirm, src, &inv, &server()));
        assert_eq!(on.status.map(|s| s.code), Some(StatusCode6::Success));
        confirm.ia_na[0].addrs = vec!["fd00:99::1000".parse().unwrap()];
        let off = reply(decide6(&confirm, src, &inv, &server()));
        assert_eq!(off.status.map(|s| s.code), Some(StatusCode6::NotOnLink));
    }

    #[test]
    fn without_inspect_or_for_a_known_host_without_ipv6_there_is_no_pool_lease() {
        let sol = solicit(duid_llt(UNKNOWN));
        assert_eq!(
            decide6(&sol, stranger(), &pool_inventory("ignore"), &server()),
            Answer6::Ignore(Counter::PassUnknownHost)
        );
        // Known over IPv4 only: left to other servers, as before.
        let known = solicit(duid_llt(MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x58])));
        assert_eq!(
            decide6(&known, stranger(), &pool_inventory("inspect"), &server()),
            Answer6::Ignore(Counter::PassUnknownHost)
        );
    }

    #[test]
    fn pool_answers_carry_the_discovery_profile_and_say_when_the_pool_is_empty() {
        let inv = pool_inventory("inspect");
        let src = stranger();
        let sol = firmware(solicit(duid_llt(UNKNOWN)), "HTTPClient", 16);
        let ask = pool_ask(decide6(&sol, src, &inv, &server()));
        let ip = "fd00:66::1003".parse().unwrap();
        let ia = pool_lease(7, ip, pool_lease_time6(&inv, &inv.subnets6[0]));
        let adv = pool_reply6(&sol, src, &inv, &server(), &ask, vec![ia]);
        assert_eq!(adv.msg_type, MessageType::Advertise);
        assert_eq!(address(&adv), Some(ip));
        // The discovery policy's lease time, as over IPv4.
        assert_eq!(adv.ia_na[0].addrs[0].valid, 300);
        assert_eq!(
            adv.boot_url.as_deref(),
            Some("http://[fd00:66::1]:8080/inspect.efi")
        );
        let none = pool_ia_status(7, StatusCode6::NoAddrsAvail, "no addresses available");
        let empty = pool_reply6(&sol, src, &inv, &server(), &ask, vec![none.clone()]);
        assert_eq!(empty.msg_type, MessageType::Advertise);
        assert!(empty.ia_na.is_empty());
        assert_eq!(
            empty.status.map(|s| s.code),
            Some(StatusCode6::NoAddrsAvail)
        );
        // A Request the pool has nothing for: the IA says so.
        let req = to_us(sol.clone(), MessageType::Request, None);
        let ask = pool_ask(decide6(&req, src, &inv, &server()));
        let reply = pool_reply6(&req, src, &inv, &server(), &ask, vec![none]);
        assert_eq!(reply.msg_type, MessageType::Reply);
        assert_eq!(
            reply.ia_na[0].status.as_ref().map(|s| s.code),
            Some(StatusCode6::NoAddrsAvail)
        );
    }

    /// Two agents sharing the pool: each unknown client's Solicit is
    /// answered by exactly one, from its own slice, and the slices do not
    /// overlap.
    #[test]
    fn shared_pools_answer_each_client_from_one_agent() {
        let inv = pool_inventory("inspect");
        let shares: Vec<Share> = (0..2)
            .map(|slot| Share::new(slot, 2).unwrap().with_live([0, 1]))
            .collect();
        let mut slices = Vec::new();
        for n in 0..=255u8 {
            let sol = solicit(duid_llt(MacAddr([0x52, 0x54, 0, 0xaa, 0xbb, n])));
            let answers: Vec<Answer6> = shares
                .iter()
                .map(|share| {
                    let pools = Pools6 { share, held: &[] };
                    decide6_shared(
                        &sol,
                        identify(&sol, stranger(), &inv).map(|(h, _)| h),
                        &inv,
                        &server(),
                        &pools,
                    )
                })
                .collect();
            let asks: Vec<&PoolAsk6> = answers
                .iter()
                .filter_map(|a| match a {
                    Answer6::Pool(ask) => Some(ask),
                    _ => None,
                })
                .collect();
            assert_eq!(asks.len(), 1, "client {n}: {answers:?}");
            assert!(answers.contains(&Answer6::NotOurs));
            slices.push(asks[0].slice.clone());
        }
        let distinct: std::collections::BTreeSet<_> =
            slices.iter().map(|r| (*r.start(), *r.end())).collect();
        assert_eq!(distinct.len(), 2, "both agents answered some: {distinct:?}");
        let v: Vec<_> = distinct.into_iter().collect();
        assert!(v[0].1 < v[1].0, "the slices do not overlap: {v:?}");
        // A client whose address the store holds stays with that agent.
        let sol = solicit(duid_llt(UNKNOWN));
        let held = [v[1].0];
        let pools = Pools6 {
            share: &shares[1],
            held: &held,
        };
        assert!(matches!(
            decide6_shared(
                &sol,
                identify(&sol, stranger(), &inv).map(|(h, _)| h),
                &inv,
                &server(),
                &pools
            ),
            Answer6::Pool(_)
        ));
        // An agent whose slot is not live answers no pool client.
        let dead = Share::new(0, 2).unwrap().with_live([1]);
        let pools = Pools6 {
            share: &dead,
            held: &[],
        };
        assert_eq!(
            decide6_shared(
                &sol,
                identify(&sol, stranger(), &inv).map(|(h, _)| h),
                &inv,
                &server(),
                &pools
            ),
            Answer6::NotOurs
        );
    }

    /// A relayed unknown client leases from the pool of the relay's link,
    /// and from none when that link's subnet has no pool.
    #[test]
    fn a_relayed_unknown_client_leases_from_its_relays_link() {
        let inv = pool_inventory("inspect");
        let mut relayed = solicit(duid_llt(UNKNOWN));
        relayed.relays = vec![RelayHop {
            hop_count: 0,
            link_addr: "fd00:66::2".parse().unwrap(),
            peer_addr: stranger(),
            interface_id: None,
            client_link_layer: None,
        }];
        let relay = "fd00:66::2".parse().unwrap();
        assert_eq!(
            pool_ask(decide6(&relayed, relay, &inv, &server())).subnet,
            0
        );
        relayed.relays[0].link_addr = "fd00:77::2".parse().unwrap();
        assert_eq!(
            decide6(&relayed, relay, &inv, &server()),
            Answer6::Ignore(Counter::PassUnknownHost)
        );
    }
}

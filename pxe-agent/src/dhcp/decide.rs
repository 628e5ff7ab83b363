//! DHCP policy: what to answer a request with, or why not to answer it.
//!
//! Pure functions over the inventory. The XDP program applies the same rules
//! to the templates compiled from `reply_for`, so every pass and drop reason
//! here is a `Counter` of the fast path.

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, DhcpOptions, MessageType, OptionCode, UnknownOption};
use pxe_ebpf_common::{BootClass, Counter, boot_class, bootp::HTTP_CLIENT};

use super::Request;
use crate::inventory::{Host, Inventory};

/// The server as the replies name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Server {
    /// Source address and server identifier (option 54).
    pub ip: Ipv4Addr,
    /// Ethernet source of replies.
    pub mac: [u8; 6],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyKind {
    Offer,
    Ack,
}

impl ReplyKind {
    pub fn message_type(self) -> MessageType {
        match self {
            ReplyKind::Offer => MessageType::Offer,
            ReplyKind::Ack => MessageType::Ack,
        }
    }
}

/// The content of a reply that does not depend on the request.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub kind: ReplyKind,
    pub yiaddr: Ipv4Addr,
    /// Next server for TFTP (BOOTP `siaddr`).
    pub siaddr: Ipv4Addr,
    /// BOOTP `file`: the TFTP boot file of PXE firmware.
    pub file: Option<String>,
    pub options: DhcpOptions,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    Reply(Reply),
    /// Not answered here; the counter says why.
    Pass(Counter),
    /// Ignored on purpose (RFC 2131: the client chose another server).
    Drop(Counter),
}

/// Decides the answer to `req`.
pub fn decide(req: &Request, inv: &Inventory, server: &Server) -> Decision {
    let Some(msg_type) = req.msg_type else {
        return Decision::Pass(Counter::PassMessageType);
    };
    if req.ipxe {
        return Decision::Pass(Counter::PassIpxe);
    }
    let kind = match msg_type {
        MessageType::Discover => ReplyKind::Offer,
        MessageType::Request => ReplyKind::Ack,
        _ => return Decision::Pass(Counter::PassMessageType),
    };
    let relayed = !req.giaddr.is_unspecified();
    if relayed && req.relay_info {
        return Decision::Pass(Counter::PassRelay);
    }
    let Some(class) = boot_class(req.arch, req.vendor) else {
        return Decision::Pass(Counter::PassUnsupportedClient);
    };
    let Some(reply) = inv
        .host_by_mac(req.chaddr)
        .and_then(|h| reply_for(inv, h, class, kind, server))
    else {
        return Decision::Pass(Counter::PassUnknownHost);
    };
    let host = inv.host_by_mac(req.chaddr).map(|h| inv.subnet_of(h));
    if relayed && !host.is_some_and(|s| s.contains(req.giaddr)) {
        return Decision::Pass(Counter::PassRelay);
    }
    if kind == ReplyKind::Ack {
        // RFC 2131 4.3.2: SELECTING names a server; INIT-REBOOT asks for an
        // address; RENEWING/REBINDING fills ciaddr.
        let wanted = match (req.server_id, req.requested_ip) {
            (Some(sid), _) if sid != server.ip => return Decision::Drop(Counter::DropOtherServer),
            (Some(_), requested) => requested,
            (None, Some(requested)) if req.ciaddr.is_unspecified() => Some(requested),
            (None, _) => Some(req.ciaddr),
        };
        if wanted != Some(reply.yiaddr) {
            return Decision::Pass(Counter::PassRequestMismatch);
        }
    }
    Decision::Reply(reply)
}

/// The reply `host` gets when its firmware is of `class`, or `None` when its
/// profile has boot answers but none for that class (the slow path decides).
pub fn reply_for(
    inv: &Inventory,
    host: &Host,
    class: BootClass,
    kind: ReplyKind,
    server: &Server,
) -> Option<Reply> {
    let subnet = inv.subnet_of(host);
    let profile = inv.profile_of(host);
    let expand = |s: &str| s.replace("{server}", &server.ip.to_string());

    let mut options = DhcpOptions::new();
    options.insert(DhcpOption::SubnetMask(subnet.netmask()));
    if let Some(router) = subnet.router {
        options.insert(DhcpOption::Router(vec![router]));
    }
    if !subnet.dns.is_empty() {
        options.insert(DhcpOption::DomainNameServer(subnet.dns.clone()));
    }
    if let Some(name) = &host.hostname {
        options.insert(DhcpOption::Hostname(name.clone()));
    }
    if let Some(domain) = &subnet.domain {
        options.insert(DhcpOption::DomainName(domain.clone()));
    }
    options.insert(DhcpOption::AddressLeaseTime(subnet.lease_time));
    options.insert(DhcpOption::MessageType(kind.message_type()));
    options.insert(DhcpOption::ServerIdentifier(server.ip));

    let mut siaddr = Ipv4Addr::UNSPECIFIED;
    let mut file = None;
    if let Some(boot) = &profile.boot {
        let tftp = |name: &Option<String>| name.as_deref().map(expand);
        match class {
            BootClass::Plain => {}
            BootClass::Bios => file = Some(tftp(&boot.bios)?),
            BootClass::UefiX64 => file = Some(tftp(&boot.uefi)?),
            BootClass::UefiArm64 => file = Some(tftp(&boot.uefi_arm64)?),
            BootClass::Http => {
                let url = expand(boot.http.as_deref()?);
                // UEFI HTTP boot takes only offers that echo "HTTPClient"
                // (UEFI 2.5 section 24.7.2).
                options.insert(DhcpOption::ClassIdentifier(HTTP_CLIENT.to_vec()));
                options.insert(DhcpOption::BootfileName(url.into_bytes()));
            }
        }
        if file.is_some() {
            siaddr = server.ip;
        }
    }
    for (code, value) in &host.options {
        options.insert(DhcpOption::Unknown(UnknownOption::new(
            OptionCode::from(*code),
            value.clone(),
        )));
    }
    Some(Reply {
        kind,
        yiaddr: host.ip,
        siaddr,
        file,
        options,
    })
}

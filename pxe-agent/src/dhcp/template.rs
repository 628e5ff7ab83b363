//! Compiles the inventory into the fast path's `ReplyTemplate`s.
//!
//! Each template is the slow path's own encoding of a DHCPOFFER, made against
//! a request whose per-request fields are zero; the XDP program splices it and
//! fills those fields in. There is no second reply builder.

use std::collections::BTreeMap;

use pxe_ebpf_common::{BootClass, HostKey, ReplyTemplate, bootp};

use super::{Reply, ReplyKind, Request, Server, encode, reply_for};
use crate::inventory::{Inventory, Problem};

/// Every (host, boot class) the inventory answers, as map entries.
pub type Templates = BTreeMap<HostKey, ReplyTemplate>;

/// Compiles all hosts; reports every host whose reply does not fit.
pub fn compile(inv: &Inventory, server: &Server) -> Result<Templates, Vec<Problem>> {
    let mut out = Templates::new();
    let mut problems = Vec::new();
    for host in &inv.hosts {
        for class in BootClass::ALL {
            let Some(offer) = reply_for(inv, host, class, ReplyKind::Offer, server) else {
                continue;
            };
            match build(&offer, server, inv.subnet_of(host)) {
                Ok(t) => {
                    out.insert(HostKey::new(host.mac.0, class), t);
                }
                Err(message) => problems.push(Problem::new(
                    Some(host.label()),
                    "options",
                    format!("{class:?} reply: {message}"),
                )),
            }
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// One template from an OFFER.
pub fn build(
    offer: &Reply,
    server: &Server,
    subnet: &crate::inventory::Subnet,
) -> Result<ReplyTemplate, String> {
    let skeleton = Request::template_skeleton();
    let bytes = encode(offer, &skeleton).map_err(|e| e.to_string())?;
    if bytes.len() > bootp::MAX_REPLY {
        return Err(format!(
            "{} bytes, more than the {} a DHCP reply may have",
            bytes.len(),
            bootp::MAX_REPLY
        ));
    }
    let msg_type_off = find_option(&bytes, bootp::OPT_MESSAGE_TYPE)
        .ok_or_else(|| "encoder wrote no message type".to_string())?;
    let mut t = ReplyTemplate::zeroed();
    t.server_ip = server.ip.octets();
    t.server_mac = server.mac;
    t.yiaddr = offer.yiaddr.octets();
    t.subnet = subnet.network.octets();
    t.netmask = subnet.netmask().octets();
    t.len = bytes.len() as u16;
    t.msg_type_off = msg_type_off as u16;
    t.payload[..bytes.len()].copy_from_slice(&bytes);
    t.csum_offer = sum16(&bytes);
    let mut ack = bytes;
    ack[msg_type_off] = bootp::DHCPACK;
    t.csum_ack = sum16(&ack);
    Ok(t)
}

/// Offset of the value of option `code` in a BOOTP message.
pub fn find_option(msg: &[u8], code: u8) -> Option<usize> {
    let mut off = bootp::OFF_OPTIONS;
    while off < msg.len() {
        match msg[off] {
            bootp::OPT_PAD => off += 1,
            bootp::OPT_END => return None,
            c => {
                let len = *msg.get(off + 1)? as usize;
                if c == code {
                    return Some(off + 2);
                }
                off += 2 + len;
            }
        }
    }
    None
}

/// One's-complement sum of big-endian 16-bit words, folded (RFC 1071).
pub fn sum16(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

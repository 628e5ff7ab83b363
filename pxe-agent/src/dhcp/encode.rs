//! Encodes a `Reply` to a request into BOOTP bytes with dhcproto.

use std::net::Ipv4Addr;

use dhcproto::{
    Encodable as _, Encoder,
    v4::{Flags, HType, Message, Opcode},
};
use pxe_ebpf_common::bootp::MIN_REPLY;

use super::{Reply, ReplyKind, Request};

#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("failed to encode DHCP reply: {0}")]
    Encode(#[from] dhcproto::error::EncodeError),
    #[error("boot file name of {0} bytes does not fit BOOTP's 128-byte file field")]
    FileTooLong(usize),
}

/// The reply's UDP payload. Per-request fields follow RFC 2131 table 3:
/// xid, flags, giaddr and chaddr are copied, ciaddr only into an ACK.
pub fn encode(reply: &Reply, req: &Request) -> Result<Vec<u8>, EncodeError> {
    let mut msg = Message::default();
    msg.set_opcode(Opcode::BootReply)
        .set_htype(HType::Eth)
        .set_xid(req.xid)
        .set_secs(0)
        .set_flags(Flags::new(req.flags))
        .set_ciaddr(match reply.kind {
            ReplyKind::Ack => req.ciaddr,
            ReplyKind::Offer | ReplyKind::Nak => Ipv4Addr::UNSPECIFIED,
        })
        .set_yiaddr(reply.yiaddr)
        .set_siaddr(reply.siaddr)
        .set_giaddr(req.giaddr)
        .set_chaddr(&req.chaddr.0)
        .set_opts(reply.options.clone());
    if let Some(file) = &reply.file {
        if file.len() > 127 {
            return Err(EncodeError::FileTooLong(file.len()));
        }
        msg.set_fname(file.as_bytes());
    }
    let mut buf = Vec::with_capacity(MIN_REPLY);
    msg.encode(&mut Encoder::new(&mut buf))?;
    if buf.len() < MIN_REPLY {
        buf.resize(MIN_REPLY, 0);
    }
    Ok(buf)
}

//! Encodes a `Reply` to a request into BOOTP bytes with dhcproto.
//!
//! Options go in code order, except that the host's own options (see
//! `Reply::host_codes`) come after the others, and relay agent information
//! (82) last of all (RFC 3046 section 2.1): the fast path keeps what hosts
//! share apart from what is each host's by cutting a reply there.

use std::{net::Ipv4Addr, ops::Range};

use dhcproto::{
    Encodable as _, Encoder,
    v4::{DhcpOptions, Flags, HType, Message, Opcode, OptionCode},
};
use pxe_ebpf_common::bootp::MIN_REPLY;

use super::{
    Request,
    reply::{Reply, ReplyKind},
};

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
    Ok(encode_split(reply, req)?.0)
}

/// [`encode`], and where in the bytes the host's own options are.
pub fn encode_split(reply: &Reply, req: &Request) -> Result<(Vec<u8>, Range<usize>), EncodeError> {
    let mut shared = DhcpOptions::new();
    let mut own = Vec::new();
    let mut relay = None;
    for (code, opt) in reply.options.iter() {
        if *code == OptionCode::RelayAgentInformation {
            relay = Some(opt);
        } else if reply.host_codes.contains(&u8::from(*code)) {
            own.push(opt);
        } else {
            shared.insert(opt.clone());
        }
    }
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
        .set_opts(shared);
    if let Some(file) = &reply.file {
        if file.len() > 127 {
            return Err(EncodeError::FileTooLong(file.len()));
        }
        msg.set_fname(file.as_bytes());
    }
    let mut buf = Vec::with_capacity(MIN_REPLY);
    msg.encode(&mut Encoder::new(&mut buf))?;
    // dhcproto ends the options it wrote; the others go before the end.
    if buf.last() == Some(&u8::from(OptionCode::End)) {
        buf.pop();
    }
    // An encoder writes from the start of its buffer: each option is
    // encoded on its own and appended.
    let start = buf.len();
    for opt in own {
        buf.extend_from_slice(&opt.to_vec()?);
    }
    let end = buf.len();
    if let Some(opt) = relay {
        buf.extend_from_slice(&opt.to_vec()?);
    }
    buf.push(u8::from(OptionCode::End));
    if buf.len() < MIN_REPLY {
        buf.resize(MIN_REPLY, 0);
    }
    Ok((buf, start..end))
}

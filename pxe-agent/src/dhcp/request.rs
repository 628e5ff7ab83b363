//! The fields of a DHCP request that policy looks at, parsed with dhcproto.

use std::net::Ipv4Addr;

use dhcproto::{
    Decodable as _, Decoder,
    v4::{DhcpOption, Message, MessageType, Opcode, OptionCode},
};
use pxe_ebpf_common::VendorClass;

use crate::inventory::MacAddr;

/// A request as policy sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub msg_type: Option<MessageType>,
    pub xid: u32,
    pub flags: u16,
    pub ciaddr: Ipv4Addr,
    pub giaddr: Ipv4Addr,
    pub chaddr: MacAddr,
    pub requested_ip: Option<Ipv4Addr>,
    pub server_id: Option<Ipv4Addr>,
    /// First architecture type of option 93 (RFC 4578 section 2.1).
    pub arch: Option<u16>,
    pub vendor: VendorClass,
    /// User class (77) or iPXE's encapsulated options (175).
    pub ipxe: bool,
    /// Relay agent information (82).
    pub relay_info: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("malformed DHCP message: {0}")]
    Decode(#[from] dhcproto::error::DecodeError),
    #[error("not a BOOTREQUEST from an Ethernet client")]
    NotEthernetRequest,
}

impl Request {
    /// Parses a BOOTP/DHCP message (the UDP payload).
    pub fn parse(bytes: &[u8]) -> Result<Request, ParseError> {
        let msg = Message::decode(&mut Decoder::new(bytes))?;
        Request::from_message(&msg)
    }

    pub fn from_message(msg: &Message) -> Result<Request, ParseError> {
        let chaddr: [u8; 6] = msg
            .chaddr()
            .try_into()
            .map_err(|_| ParseError::NotEthernetRequest)?;
        if msg.opcode() != Opcode::BootRequest {
            return Err(ParseError::NotEthernetRequest);
        }
        let opts = msg.opts();
        let msg_type = match opts.get(OptionCode::MessageType) {
            Some(DhcpOption::MessageType(t)) => Some(*t),
            _ => None,
        };
        let requested_ip = match opts.get(OptionCode::RequestedIpAddress) {
            Some(DhcpOption::RequestedIpAddress(ip)) => Some(*ip),
            _ => None,
        };
        let server_id = match opts.get(OptionCode::ServerIdentifier) {
            Some(DhcpOption::ServerIdentifier(ip)) => Some(*ip),
            _ => None,
        };
        let arch = match opts.get(OptionCode::ClientSystemArchitecture) {
            Some(DhcpOption::ClientSystemArchitecture(a)) => Some(u16::from(*a)),
            _ => None,
        };
        let vendor = match opts.get(OptionCode::ClassIdentifier) {
            Some(DhcpOption::ClassIdentifier(v)) => VendorClass::from_prefix(v),
            _ => VendorClass::None,
        };
        let ipxe = opts.get(OptionCode::UserClass).is_some()
            || opts
                .get(OptionCode::from(pxe_ebpf_common::bootp::OPT_IPXE_ENCAP))
                .is_some();
        let relay_info = opts.get(OptionCode::RelayAgentInformation).is_some();
        Ok(Request {
            msg_type,
            xid: msg.xid(),
            flags: msg.flags().into(),
            ciaddr: msg.ciaddr(),
            giaddr: msg.giaddr(),
            chaddr: MacAddr(chaddr),
            requested_ip,
            server_id,
            arch,
            vendor,
            ipxe,
            relay_info,
        })
    }

    /// A request with every per-request field zero: what templates are
    /// encoded against, so the XDP program can fill those fields in.
    pub fn template_skeleton() -> Request {
        Request {
            msg_type: Some(MessageType::Discover),
            xid: 0,
            flags: 0,
            ciaddr: Ipv4Addr::UNSPECIFIED,
            giaddr: Ipv4Addr::UNSPECIFIED,
            chaddr: MacAddr([0; 6]),
            requested_ip: None,
            server_id: None,
            arch: None,
            vendor: VendorClass::None,
            ipxe: false,
            relay_info: false,
        }
    }
}

//! The fields of a DHCP request that policy looks at, parsed with dhcproto.

use std::net::Ipv4Addr;

use dhcproto::{
    Decodable as _, Decoder, Encodable as _, Encoder,
    v4::{DhcpOption, Message, MessageType, Opcode, OptionCode},
};
use pxe_ebpf_common::{VendorClass, bootp::OPT_RELAY_AGENT_INFO};

use crate::inventory::{MacAddr, Traits, circuit_id, parse_user_classes};

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
    /// User class (77) or iPXE's encapsulated options (175): the fast path
    /// passes both to the slow path.
    pub ipxe: bool,
    /// Relay agent information (82).
    pub relay_info: bool,
    /// What the slow path reads beyond the fast path's fields.
    pub more: Details,
}

/// Request content only the slow path looks at.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Details {
    /// Option 60 as sent.
    pub vendor_class: Option<Vec<u8>>,
    /// Option 77 entries (RFC 3004).
    pub user_classes: Vec<Vec<u8>>,
    /// Option 175 present (iPXE).
    pub ipxe_encap: bool,
    /// Option 82 as sent, echoed back unchanged (RFC 3046 section 2.2).
    pub relay_agent_info: Option<Vec<u8>>,
    /// Option 12.
    pub hostname: Option<String>,
}

impl Request {
    /// What conditional rules look at.
    pub fn traits(&self) -> Traits<'_> {
        Traits {
            arch: self.arch,
            vendor_class: self.more.vendor_class.as_deref(),
            user_classes: &self.more.user_classes,
            circuit_id: self.more.relay_agent_info.as_deref().and_then(circuit_id),
        }
    }

    /// An iPXE client by the configured user class, or by option 175.
    pub fn is_ipxe(&self, user_class: &str) -> bool {
        self.more.ipxe_encap
            || self
                .more
                .user_classes
                .iter()
                .any(|c| c.as_slice() == user_class.as_bytes())
    }
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
        let mut req = Request::from_message(&msg)?;
        // Echo option 82 exactly as the relay wrote it (RFC 3046 2.2), not as
        // re-encoded from its parsed form.
        if req.relay_info {
            req.more.relay_agent_info = super::template::find_option(bytes, OPT_RELAY_AGENT_INFO)
                .and_then(|off| {
                    Some(
                        bytes
                            .get(off..off + usize::from(*bytes.get(off - 1)?))?
                            .to_vec(),
                    )
                });
        }
        Ok(req)
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
        let vendor_class = match opts.get(OptionCode::ClassIdentifier) {
            Some(DhcpOption::ClassIdentifier(v)) => Some(v.clone()),
            _ => None,
        };
        let vendor = vendor_class
            .as_deref()
            .map_or(VendorClass::None, VendorClass::from_prefix);
        let user_classes = match opts.get(OptionCode::UserClass) {
            Some(DhcpOption::UserClass(v)) => parse_user_classes(v),
            _ => Vec::new(),
        };
        let ipxe_encap = opts
            .get(OptionCode::from(pxe_ebpf_common::bootp::OPT_IPXE_ENCAP))
            .is_some();
        let ipxe = opts.get(OptionCode::UserClass).is_some() || ipxe_encap;
        let relay_agent_info = opts.get(OptionCode::RelayAgentInformation).map(raw_value);
        let relay_info = relay_agent_info.is_some();
        let hostname = match opts.get(OptionCode::Hostname) {
            Some(DhcpOption::Hostname(h)) => Some(h.clone()),
            _ => None,
        };
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
            more: Details {
                vendor_class,
                user_classes,
                ipxe_encap,
                relay_agent_info,
                hostname,
            },
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
            more: Details::default(),
        }
    }
}

/// The value bytes of an option as it was on the wire.
fn raw_value(opt: &DhcpOption) -> Vec<u8> {
    let mut buf = Vec::new();
    // Encoding a decoded option gives back code, length and value.
    if opt.encode(&mut Encoder::new(&mut buf)).is_err() || buf.len() < 2 {
        return Vec::new();
    }
    buf.split_off(2)
}

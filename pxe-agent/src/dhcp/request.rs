//! The fields of a DHCP request that policy looks at, and the one parser
//! that reads them off the wire.

use std::net::Ipv4Addr;

use dhcproto::v4::MessageType;
use pxe_ebpf_common::{BootClass, VendorClass, bootp};

use crate::{
    inventory::{Traits, circuit_id, parse_user_classes},
    mac::MacAddr,
};

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
    /// Received on the PXE boot server port (4011) rather than on 67: a
    /// proxyDHCP client's follow-up request. Not on the wire; set by the
    /// socket that read it.
    pub boot_server: bool,
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
    /// Option 97, the client machine identifier (RFC 4578 section 2.3),
    /// as sent: a proxyDHCP answer echoes it.
    pub client_uuid: Option<Vec<u8>>,
    /// Option 61 as sent, when not empty: what a pool lease belongs to
    /// under `discovery.lease_key: client_id`.
    pub client_id: Option<Vec<u8>>,
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

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("shorter than a BOOTP message with options")]
    Truncated,
    #[error("not a BOOTREQUEST from an Ethernet client")]
    NotEthernetRequest,
    #[error("no DHCP magic cookie")]
    NoCookie,
    #[error("option {code} runs past the end of the message")]
    OptionOverrun { code: u8 },
    #[error("option {code} has length {len}, which its format does not allow")]
    OptionLength { code: u8, len: usize },
}

impl Request {
    /// Parses a BOOTP/DHCP request (the UDP payload).
    ///
    /// The options are walked here, by the rules the XDP program walks them
    /// by, rather than by a general decoder: only the options policy reads
    /// are interpreted, the same lengths are refused (RFC 2132 fixes those of
    /// 50, 53 and 54; 93 must hold at least one 16-bit type), and a
    /// repeated option counts as its last occurrence, so that both paths
    /// see the same request. Where the kernel gives up and passes a request
    /// up, this parser reads on: an option area without an end option,
    /// more than 64 options, option overload (52, not honoured here: the
    /// `sname` and `file` fields are not read as options). Nothing here can
    /// panic on any input.
    pub fn parse(bytes: &[u8]) -> Result<Request, ParseError> {
        use bootp::*;
        if bytes.len() <= OFF_OPTIONS {
            return Err(ParseError::Truncated);
        }
        // Checked before chaddr is read: only an Ethernet address can match
        // a MAC reservation.
        if bytes[OFF_OP] != OP_REQUEST
            || bytes[OFF_HTYPE] != HTYPE_ETHER
            || bytes[OFF_HLEN] != HLEN_ETHER
        {
            return Err(ParseError::NotEthernetRequest);
        }
        if bytes[OFF_COOKIE..OFF_OPTIONS] != MAGIC_COOKIE {
            return Err(ParseError::NoCookie);
        }
        let ip_at =
            |at: usize| Ipv4Addr::new(bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]);
        let mut chaddr = [0u8; 6];
        chaddr.copy_from_slice(&bytes[OFF_CHADDR..OFF_CHADDR + 6]);
        let mut req = Request {
            msg_type: None,
            xid: u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
            flags: u16::from_be_bytes([bytes[OFF_FLAGS], bytes[OFF_FLAGS + 1]]),
            ciaddr: ip_at(OFF_CIADDR),
            giaddr: ip_at(OFF_GIADDR),
            chaddr: MacAddr(chaddr),
            ..Request::template_skeleton()
        };
        for (code, value) in options(&bytes[OFF_OPTIONS..]) {
            let (code, value) = (code, value?);
            let wrong = || ParseError::OptionLength {
                code,
                len: value.len(),
            };
            let ipv4 = || -> Result<Ipv4Addr, ParseError> {
                let v: [u8; 4] = value.try_into().map_err(|_| wrong())?;
                Ok(Ipv4Addr::from(v))
            };
            match code {
                OPT_MESSAGE_TYPE => match value {
                    // Type 0 is none at all, in the kernel as here.
                    [t] => req.msg_type = (*t != 0).then(|| MessageType::from(*t)),
                    _ => return Err(wrong()),
                },
                OPT_REQUESTED_IP => req.requested_ip = Some(ipv4()?),
                OPT_SERVER_ID => req.server_id = Some(ipv4()?),
                OPT_CLIENT_ARCH => match value {
                    [hi, lo, ..] => req.arch = Some(u16::from_be_bytes([*hi, *lo])),
                    _ => return Err(wrong()),
                },
                OPT_VENDOR_CLASS => {
                    req.vendor = VendorClass::from_prefix(value);
                    req.more.vendor_class = Some(value.to_vec());
                }
                OPT_USER_CLASS => {
                    req.ipxe = true;
                    req.more.user_classes = parse_user_classes(value);
                }
                OPT_IPXE_ENCAP => {
                    req.ipxe = true;
                    req.more.ipxe_encap = true;
                }
                OPT_RELAY_AGENT_INFO => {
                    req.relay_info = true;
                    // Echoed exactly as the relay wrote it (RFC 3046 2.2).
                    req.more.relay_agent_info = Some(value.to_vec());
                }
                OPT_HOSTNAME => {
                    req.more.hostname = Some(String::from_utf8_lossy(value).into_owned());
                }
                OPT_CLIENT_UUID => req.more.client_uuid = Some(value.to_vec()),
                // Not a length check the kernel makes, so none here either.
                OPT_CLIENT_ID if !value.is_empty() => {
                    req.more.client_id = Some(value.to_vec());
                }
                _ => {}
            }
        }
        Ok(req)
    }

    /// The request of boot class `class` that templates are compiled from:
    /// a DISCOVER (REQUEST for an ACK, asking for `yiaddr`) from `mac` with
    /// the class's first option 93 value and the prefix of option 60 that
    /// puts it in the class, and nothing else.
    pub fn of_class(mac: MacAddr, class: BootClass, ack_for: Option<Ipv4Addr>) -> Request {
        let vendor: &[u8] = match class {
            BootClass::Plain => b"",
            BootClass::Bios | BootClass::UefiX64 | BootClass::UefiArm64 => bootp::PXE_CLIENT,
            BootClass::Http | BootClass::HttpArm64 | BootClass::HttpIa32 => bootp::HTTP_CLIENT,
        };
        let mut req = Request::template_skeleton();
        req.chaddr = mac;
        req.arch = class.arches()[0];
        if !vendor.is_empty() {
            req.vendor = VendorClass::from_prefix(vendor);
            req.more.vendor_class = Some(vendor.to_vec());
        }
        if let Some(ip) = ack_for {
            req.msg_type = Some(MessageType::Request);
            req.requested_ip = Some(ip);
        }
        req
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
            boot_server: false,
            more: Details::default(),
        }
    }
}

/// Host name (RFC 2132 section 3.14).
const OPT_HOSTNAME: u8 = 12;

/// Client identifier (RFC 2132 section 9.14).
const OPT_CLIENT_ID: u8 = 61;

/// The options of a BOOTP message's option area, in order: code and value,
/// or the error that ends the walk. Pad options are skipped; the walk stops
/// at the end option, or at the end of the area.
fn options(area: &[u8]) -> impl Iterator<Item = (u8, Result<&[u8], ParseError>)> {
    let mut rest = Some(area);
    std::iter::from_fn(move || {
        loop {
            let (&code, tail) = rest?.split_first()?;
            match code {
                bootp::OPT_PAD => rest = Some(tail),
                bootp::OPT_END => return None,
                _ => {
                    let value = tail
                        .split_first()
                        .and_then(|(&len, tail)| tail.get(..usize::from(len)).map(|v| (v, len)));
                    return Some(match value {
                        Some((value, len)) => {
                            rest = Some(&tail[1 + usize::from(len)..]);
                            (code, Ok(value))
                        }
                        None => {
                            rest = None;
                            (code, Err(ParseError::OptionOverrun { code }))
                        }
                    });
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use dhcproto::{
        Encodable as _,
        v4::{DhcpOption, Message},
    };

    use super::*;

    fn discover() -> Vec<u8> {
        let z = Ipv4Addr::UNSPECIFIED;
        let mut msg = Message::new(z, z, z, z, &[0x52, 0x54, 0, 0, 0, 1]);
        msg.opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Discover));
        msg.to_vec().expect("encodes")
    }

    #[test]
    fn an_ethernet_discover_parses() {
        let req = Request::parse(&discover()).expect("parses");
        assert_eq!(req.chaddr, MacAddr([0x52, 0x54, 0, 0, 0, 1]));
        assert_eq!(req.msg_type, Some(MessageType::Discover));
    }

    #[test]
    fn hlen_other_than_six_is_refused_without_reading_chaddr() {
        // 87 and 137 run past the 16-byte chaddr field: dhcproto's
        // `Message::chaddr` panics on them.
        for hlen in [0u8, 5, 7, 16, 17, 87, 137, 255] {
            let mut bytes = discover();
            bytes[2] = hlen;
            assert!(
                matches!(Request::parse(&bytes), Err(ParseError::NotEthernetRequest)),
                "hlen {hlen}"
            );
        }
    }

    #[test]
    fn other_hardware_types_are_not_ethernet_requests() {
        for htype in [0u8, 6, 122, 141, 239, 247] {
            let mut bytes = discover();
            bytes[1] = htype;
            assert!(
                matches!(Request::parse(&bytes), Err(ParseError::NotEthernetRequest)),
                "htype {htype}"
            );
        }
    }
}

#[cfg(test)]
mod walk_tests {
    use super::*;

    /// A request with the given option area.
    fn with_options(opts: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; bootp::OFF_OPTIONS];
        b[0] = bootp::OP_REQUEST;
        b[1] = bootp::HTYPE_ETHER;
        b[2] = bootp::HLEN_ETHER;
        b[bootp::OFF_CHADDR..bootp::OFF_CHADDR + 6].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
        b[bootp::OFF_COOKIE..bootp::OFF_OPTIONS].copy_from_slice(&bootp::MAGIC_COOKIE);
        b.extend_from_slice(opts);
        b
    }

    #[test]
    fn options_policy_reads_are_read_and_the_last_occurrence_counts() {
        let req = Request::parse(&with_options(&[
            53, 1, 1, 0, 0, 93, 2, 0, 7, 60, 9, b'P', b'X', b'E', b'C', b'l', b'i', b'e', b'n',
            b't', 77, 5, 4, b'i', b'P', b'X', b'E', 82, 6, 1, 4, b'e', b't', b'h', b'0', 12, 2,
            b'n', b'1', 50, 4, 10, 0, 0, 9, 54, 4, 10, 0, 0, 1, 53, 1, 3, 255, 0xde, 0xad,
        ]))
        .expect("parses");
        assert_eq!(req.msg_type, Some(MessageType::Request));
        assert_eq!(req.arch, Some(7));
        assert_eq!(req.vendor, VendorClass::PxeClient);
        assert!(req.ipxe && req.relay_info);
        assert_eq!(req.more.user_classes, vec![b"iPXE".to_vec()]);
        assert_eq!(req.traits().circuit_id, Some(&b"eth0"[..]));
        assert_eq!(req.more.hostname.as_deref(), Some("n1"));
        assert_eq!(req.requested_ip, Some(Ipv4Addr::new(10, 0, 0, 9)));
        assert_eq!(req.server_id, Some(Ipv4Addr::new(10, 0, 0, 1)));
    }

    #[test]
    fn the_client_identifier_is_read_and_an_empty_one_is_none() {
        let req =
            Request::parse(&with_options(&[53, 1, 1, 61, 3, 0, 0xab, 0xcd, 255])).expect("parses");
        assert_eq!(req.more.client_id.as_deref(), Some(&[0, 0xab, 0xcd][..]));
        let req = Request::parse(&with_options(&[53, 1, 1, 61, 0, 255])).expect("parses");
        assert_eq!(req.more.client_id, None);
        let req = Request::parse(&with_options(&[53, 1, 1, 255])).expect("parses");
        assert_eq!(req.more.client_id, None);
    }

    #[test]
    fn lengths_that_lie_are_refused() {
        for (opts, err) in [
            (
                &[53, 2, 1, 1, 255][..],
                ParseError::OptionLength { code: 53, len: 2 },
            ),
            (
                &[50, 3, 1, 2, 3, 255],
                ParseError::OptionLength { code: 50, len: 3 },
            ),
            (
                &[54, 5, 1, 2, 3, 4, 5, 255],
                ParseError::OptionLength { code: 54, len: 5 },
            ),
            (
                &[93, 1, 0, 255],
                ParseError::OptionLength { code: 93, len: 1 },
            ),
            (
                &[53, 1, 1, 60, 40, b'P'],
                ParseError::OptionOverrun { code: 60 },
            ),
            (&[53, 1, 1, 77], ParseError::OptionOverrun { code: 77 }),
        ] {
            assert_eq!(Request::parse(&with_options(opts)), Err(err), "{opts:?}");
        }
    }

    #[test]
    fn no_input_panics_the_parser() {
        // Every truncation and every single-byte value at every offset of a
        // PXE-like request.
        let base = with_options(&[
            53, 1, 1, 93, 2, 0, 0, 60, 9, b'P', b'X', b'E', b'C', b'l', b'i', b'e', b'n', b't', 255,
        ]);
        for len in 0..=base.len() {
            let _ = Request::parse(&base[..len]);
        }
        for at in 0..base.len() {
            for v in 0..=255u8 {
                let mut b = base.clone();
                b[at] = v;
                let _ = Request::parse(&b);
            }
        }
    }
}

//! The fields of a DHCPv6 client message that policy looks at, the relay
//! hops it came through (RFC 8415 sections 8, 9 and 21), and the one
//! parser that reads both off the wire. What a DUID says about the client
//! is `identity`'s; what to answer is the policy's.

use std::net::Ipv6Addr;

use dhcproto::v6::MessageType;
use pxe_ebpf_common::bootp::{HTTP_CLIENT, PXE_CLIENT};

use super::identity::{self, Duid};
use crate::mac::MacAddr;

/// How many Relay-Forw messages may wrap a client message: a relay drops a
/// message whose hop count has reached this (RFC 8415 section 7.6,
/// HOP_COUNT_LIMIT), so no more than this many can arrive.
pub const HOP_COUNT_LIMIT: usize = 32;

/// A client message as policy sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request6 {
    /// The type of the innermost message, the client's own.
    pub msg_type: MessageType,
    pub xid: [u8; 3],
    /// Client identifier (1): the DUID as sent.
    pub client_id: Option<Box<[u8]>>,
    /// Server identifier (2): the DUID of the server a Request, Renew,
    /// Release or Decline is for.
    pub server_id: Option<Box<[u8]>>,
    /// Every IA_NA (3), in order.
    pub ia_na: Vec<IaNa>,
    /// Option request (6): the codes asked for, in order.
    pub oro: Vec<u16>,
    /// Rapid commit (14): the client takes a Reply to its Solicit
    /// (RFC 8415 section 18.2.1).
    pub rapid_commit: bool,
    /// User class (15) items, of every occurrence, in order.
    pub user_classes: Vec<Vec<u8>>,
    /// The first vendor class (16). A client may send one per enterprise
    /// number; PXE and HTTP boot firmware send one, with enterprise 343.
    pub vendor_class: Option<VendorClass6>,
    /// First architecture type of the client system architecture option
    /// (61, RFC 5970 section 3.3).
    pub arch: Option<u16>,
    /// Client network interface identifier (62, RFC 5970 section 3.4):
    /// interface type, major and minor version.
    pub nii: Option<[u8; 3]>,
    /// The Relay-Forw messages around the client message, outermost (the
    /// one the server received) first; empty when it was not relayed.
    pub relays: Vec<RelayHop>,
}

/// An identity association for non-temporary addresses (RFC 8415 section
/// 21.4): the addresses the client would like, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IaNa {
    pub iaid: u32,
    pub t1: u32,
    pub t2: u32,
    /// The IA Address options (5) inside it; their lifetimes are only
    /// hints (RFC 8415 section 21.6) and are not kept.
    pub addrs: Vec<Ipv6Addr>,
}

/// Vendor class (16, RFC 8415 section 21.16).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VendorClass6 {
    /// IANA enterprise number. PXE and UEFI HTTP boot use 343 (Intel), a
    /// value edk2 took as a placeholder and everyone kept.
    pub enterprise: u32,
    /// The vendor-class-data items, each without its length.
    pub data: Vec<Vec<u8>>,
}

/// One Relay-Forw a client message came through (RFC 8415 section 9.1);
/// what a Relay-Repl back along the same path copies (section 19.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayHop {
    pub hop_count: u8,
    /// An address on the link the client is on, or unspecified.
    pub link_addr: Ipv6Addr,
    /// The address the relay received the message from: the client's, or
    /// the next relay's.
    pub peer_addr: Ipv6Addr,
    /// Interface-id (18), echoed in the Relay-Repl.
    pub interface_id: Option<Vec<u8>>,
    /// Client link-layer address (79, RFC 6939) when it is an Ethernet
    /// address; only the relay next to the client can add it.
    pub client_link_layer: Option<MacAddr>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError6 {
    #[error("a {len}-byte message is shorter than its header (4 bytes, 34 for a relay message)")]
    Truncated { len: usize },
    #[error("relay messages nested deeper than 32 (RFC 8415 HOP_COUNT_LIMIT)")]
    RelayTooDeep,
    #[error("the Relay-Forw at depth {depth} carries no relay message option (9)")]
    RelayWithoutMessage { depth: usize },
    #[error("{0:?} is a message servers send, not one they answer")]
    ServerMessage(MessageType),
    #[error("option {code} runs past the end of the message or option holding it")]
    OptionOverrun { code: u16 },
    #[error("{left} bytes after the last option are too few for an option header")]
    OptionHeader { left: usize },
    #[error("option {code} has length {len}, which its format does not allow")]
    OptionLength { code: u16, len: usize },
}

/// Option codes read or written by hand here and in `reply` (RFC 8415
/// section 21, RFC 3646, RFC 5970, RFC 6939).
pub(super) mod opt {
    pub const CLIENT_ID: u16 = 1;
    pub const SERVER_ID: u16 = 2;
    pub const IA_NA: u16 = 3;
    pub const IAADDR: u16 = 5;
    pub const ORO: u16 = 6;
    pub const PREFERENCE: u16 = 7;
    pub const RELAY_MSG: u16 = 9;
    pub const STATUS_CODE: u16 = 13;
    pub const RAPID_COMMIT: u16 = 14;
    pub const USER_CLASS: u16 = 15;
    pub const VENDOR_CLASS: u16 = 16;
    pub const INTERFACE_ID: u16 = 18;
    pub const DNS_SERVERS: u16 = 23;
    pub const DOMAIN_LIST: u16 = 24;
    pub const BOOTFILE_URL: u16 = 59;
    pub const BOOTFILE_PARAM: u16 = 60;
    pub const CLIENT_ARCH: u16 = 61;
    pub const NII: u16 = 62;
    pub const CLIENT_LINKLAYER_ADDR: u16 = 79;
}

/// Message header lengths: type and transaction id; type, hop count, link
/// and peer address.
const HEADER: usize = 4;
pub(super) const RELAY_HEADER: usize = 34;

impl Request6 {
    /// Parses a client message (the UDP payload), unwrapping the Relay-Forw
    /// messages around it.
    ///
    /// The options are walked here rather than by dhcproto's decoder,
    /// which subtracts from option lengths it has not checked (13, 16, 17
    /// and 11 panic in a debug build on a short value), recurses into
    /// option 9 without a bound, and stops at the first option it cannot
    /// read without saying so. Here every length is checked against what
    /// holds it, every loop consumes input or is bounded by
    /// [`HOP_COUNT_LIMIT`], and nothing can panic on any input.
    ///
    /// An option the server relies on is refused when its length is wrong
    /// (6, 15, 16, 61, 62, 3, 5); one that appears more than once where
    /// RFC 8415 allows one counts as its first occurrence; options policy
    /// does not read are skipped unread.
    pub fn parse(bytes: &[u8]) -> Result<Request6, ParseError6> {
        let mut relays = Vec::new();
        let mut msg = bytes;
        for depth in 0..=HOP_COUNT_LIMIT {
            let Some(&kind) = msg.first() else {
                return Err(ParseError6::Truncated { len: 0 });
            };
            let msg_type = MessageType::from(kind);
            if msg_type != MessageType::RelayForw {
                return client_message(msg_type, msg, relays);
            }
            if depth == HOP_COUNT_LIMIT {
                break;
            }
            let (hop, inner) = relay_hop(msg, depth)?;
            relays.push(hop);
            msg = inner;
        }
        Err(ParseError6::RelayTooDeep)
    }

    /// The first item of the vendor class: `PXEClient:Arch:...` or
    /// `HTTPClient:Arch:...` for boot firmware (UEFI 2.5 section 24.7).
    pub fn vendor_text(&self) -> Option<&[u8]> {
        self.vendor_class.as_ref()?.data.first().map(Vec::as_slice)
    }

    /// UEFI HTTP boot firmware, by its vendor class.
    pub fn is_http_client(&self) -> bool {
        self.vendor_text()
            .is_some_and(|t| t.starts_with(HTTP_CLIENT))
    }

    /// PXE firmware (or iPXE, which names itself the same way), by its
    /// vendor class.
    pub fn is_pxe_client(&self) -> bool {
        self.vendor_text()
            .is_some_and(|t| t.starts_with(PXE_CLIENT))
    }

    /// Whether any user class item is `class` (iPXE sends `iPXE`).
    pub fn has_user_class(&self, class: &[u8]) -> bool {
        self.user_classes.iter().any(|c| c.as_slice() == class)
    }

    /// The client's DUID, read.
    pub fn client_duid(&self) -> Option<Duid> {
        self.client_id.as_deref().map(Duid::parse)
    }

    /// The client's MAC as the relay next to it saw it (option 79 of the
    /// innermost Relay-Forw, the last of [`Request6::relays`]).
    pub fn client_link_layer(&self) -> Option<MacAddr> {
        self.relays.last()?.client_link_layer
    }
}

/// One Relay-Forw: its hop, and the message its relay message option holds.
fn relay_hop(msg: &[u8], depth: usize) -> Result<(RelayHop, &[u8]), ParseError6> {
    let (Some(header), Some(area)) = (msg.get(..RELAY_HEADER), msg.get(RELAY_HEADER..)) else {
        return Err(ParseError6::Truncated { len: msg.len() });
    };
    let addr_at = |at: usize| {
        let mut octets = [0u8; 16];
        octets.copy_from_slice(&header[at..at + 16]);
        Ipv6Addr::from(octets)
    };
    let mut hop = RelayHop {
        hop_count: header[1],
        link_addr: addr_at(2),
        peer_addr: addr_at(18),
        interface_id: None,
        client_link_layer: None,
    };
    let mut inner = None;
    for option in options(area) {
        let (code, value) = option?;
        match code {
            opt::RELAY_MSG if inner.is_none() => inner = Some(value),
            opt::INTERFACE_ID if hop.interface_id.is_none() => {
                hop.interface_id = Some(value.to_vec());
            }
            // Link-layer type, then the address (RFC 6939 section 4). A
            // relay's malformed or non-Ethernet value is not the client's
            // fault: it only goes unread.
            opt::CLIENT_LINKLAYER_ADDR if hop.client_link_layer.is_none() => {
                hop.client_link_layer = match value {
                    [hi, lo, addr @ ..] => identity::ethernet(u16::from_be_bytes([*hi, *lo]), addr),
                    _ => None,
                };
            }
            _ => {}
        }
    }
    let inner = inner.ok_or(ParseError6::RelayWithoutMessage { depth })?;
    Ok((hop, inner))
}

/// The client message `msg`, whose type is `msg_type`.
fn client_message(
    msg_type: MessageType,
    msg: &[u8],
    relays: Vec<RelayHop>,
) -> Result<Request6, ParseError6> {
    use MessageType as M;
    if matches!(
        msg_type,
        M::Advertise
            | M::Reply
            | M::Reconfigure
            | M::RelayRepl
            | M::LeaseQueryReply
            | M::LeaseQueryDone
            | M::LeaseQueryData
            | M::ReconfigureReply
            | M::DHCPv4Response
    ) {
        return Err(ParseError6::ServerMessage(msg_type));
    }
    let (Some(&[_, x0, x1, x2]), Some(area)) = (msg.get(..HEADER), msg.get(HEADER..)) else {
        return Err(ParseError6::Truncated { len: msg.len() });
    };
    let mut req = Request6 {
        msg_type,
        xid: [x0, x1, x2],
        client_id: None,
        server_id: None,
        ia_na: Vec::new(),
        oro: Vec::new(),
        rapid_commit: false,
        user_classes: Vec::new(),
        vendor_class: None,
        arch: None,
        nii: None,
        relays,
    };
    for option in options(area) {
        let (code, value) = option?;
        let wrong = || ParseError6::OptionLength {
            code,
            len: value.len(),
        };
        match code {
            opt::CLIENT_ID if req.client_id.is_none() => req.client_id = Some(value.into()),
            opt::SERVER_ID if req.server_id.is_none() => req.server_id = Some(value.into()),
            opt::IA_NA => req.ia_na.push(ia_na(value).ok_or_else(wrong)??),
            opt::ORO => {
                if !value.len().is_multiple_of(2) {
                    return Err(wrong());
                }
                req.oro.extend(
                    value
                        .chunks_exact(2)
                        .map(|c| u16::from_be_bytes([c[0], c[1]])),
                );
            }
            opt::RAPID_COMMIT => req.rapid_commit = true,
            opt::USER_CLASS => req.user_classes.extend(items(value).ok_or_else(wrong)?),
            opt::VENDOR_CLASS => {
                let (enterprise, data) = value
                    .split_first_chunk::<4>()
                    .and_then(|(num, rest)| Some((u32::from_be_bytes(*num), items(rest)?)))
                    .ok_or_else(wrong)?;
                if req.vendor_class.is_none() {
                    req.vendor_class = Some(VendorClass6 { enterprise, data });
                }
            }
            opt::CLIENT_ARCH => match value {
                [hi, lo, ..] if value.len().is_multiple_of(2) => {
                    req.arch = req.arch.or(Some(u16::from_be_bytes([*hi, *lo])));
                }
                _ => return Err(wrong()),
            },
            opt::NII => {
                let nii: [u8; 3] = value.try_into().map_err(|_| wrong())?;
                req.nii = req.nii.or(Some(nii));
            }
            _ => {}
        }
    }
    Ok(req)
}

/// An IA_NA's value: `None` when it is shorter than its fixed fields, an
/// error when an option inside it is malformed.
fn ia_na(value: &[u8]) -> Option<Result<IaNa, ParseError6>> {
    let (fixed, area) = value.split_first_chunk::<12>()?;
    let word =
        |at: usize| u32::from_be_bytes([fixed[at], fixed[at + 1], fixed[at + 2], fixed[at + 3]]);
    let mut ia = IaNa {
        iaid: word(0),
        t1: word(4),
        t2: word(8),
        addrs: Vec::new(),
    };
    for option in options(area) {
        let (code, value) = match option {
            Ok(option) => option,
            Err(err) => return Some(Err(err)),
        };
        if code == opt::IAADDR {
            // Address, preferred and valid lifetime, then options of its own.
            let Some((addr, _)) = value
                .split_first_chunk::<16>()
                .filter(|_| value.len() >= 24)
            else {
                return Some(Err(ParseError6::OptionLength {
                    code,
                    len: value.len(),
                }));
            };
            ia.addrs.push(Ipv6Addr::from(*addr));
        }
    }
    Some(Ok(ia))
}

/// The items of a user class or the data of a vendor class (RFC 8415
/// sections 21.15 and 21.16): each a 16-bit length and that many bytes,
/// filling `area` exactly; `None` when they do not.
fn items(mut area: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut items = Vec::new();
    while let Some((len, rest)) = area.split_first_chunk::<2>() {
        let (item, rest) = rest.split_at_checked(usize::from(u16::from_be_bytes(*len)))?;
        items.push(item.to_vec());
        area = rest;
    }
    area.is_empty().then_some(items)
}

/// The options of an option area (RFC 8415 section 21.1), in order: code
/// and value, or the error that ends the walk.
fn options(area: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), ParseError6>> {
    let mut rest = Some(area);
    std::iter::from_fn(move || {
        let area = rest.take().filter(|a| !a.is_empty())?;
        let Some((head, tail)) = area.split_first_chunk::<4>() else {
            return Some(Err(ParseError6::OptionHeader { left: area.len() }));
        };
        let code = u16::from_be_bytes([head[0], head[1]]);
        let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
        let Some((value, after)) = tail.split_at_checked(len) else {
            return Some(Err(ParseError6::OptionOverrun { code }));
        };
        rest = Some(after);
        Some(Ok((code, value)))
    })
}

/// Real-looking client messages, written byte by byte from the RFC
/// layouts and what each client's source sends, for the tests of the
/// parser and of the encoder.
#[cfg(test)]
pub(super) mod fixture {
    /// The pieces, joined.
    pub fn cat(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    /// The system UUID of the test machine, `qemu -uuid
    /// 2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e`.
    pub const UUID_TEXT: &str = "2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e";

    /// iPXE (x86_64 EFI) soliciting, as `src/net/udp/dhcpv6.c`,
    /// `dhcpv6_tx`, lays it out: client id, IA_NA, the fixed request
    /// options (ORO, vendor class, architecture, NII), user class,
    /// elapsed time.
    pub fn ipxe_solicit() -> Vec<u8> {
        cat(&[
            &[0x01, 0x5a, 0x3c, 0x11], // Solicit, xid 5a3c11
            &[0x00, 0x01, 0x00, 0x12], // client id, 18 bytes
            &[0x00, 0x04],             // DUID-UUID, the UUID in RFC 4122 order
            &[
                0x2b, 0x6a, 0x81, 0xe4, 0x5b, 0x6f, 0x4c, 0x2a, 0x9d, 0x3e, 0x7f, 0x0a, 0x1b, 0x2c,
                0x3d, 0x4e,
            ],
            &[0x00, 0x03, 0x00, 0x0c], // IA_NA, 12 bytes
            &[0x8c, 0x1a, 0x7e, 0x42], // IAID (iPXE: CRC32 of the MAC)
            &[0, 0, 0, 0, 0, 0, 0, 0], // T1, T2: 0
            &[0x00, 0x06, 0x00, 0x08], // ORO, 8 bytes
            &[0x00, 0x17, 0x00, 0x18, 0x00, 0x3b, 0x00, 0x3c], // 23 24 59 60
            &[0x00, 0x10, 0x00, 0x26], // vendor class, 38 bytes
            &[0x00, 0x00, 0x01, 0x57], // enterprise 343
            &[0x00, 0x20],             // one item, 32 bytes
            b"PXEClient:Arch:00007:UNDI:003016",
            &[0x00, 0x3d, 0x00, 0x02, 0x00, 0x07], // architecture 7, x64 UEFI
            &[0x00, 0x3e, 0x00, 0x03, 0x01, 0x03, 0x10], // NII: UNDI 3.16
            &[0x00, 0x0f, 0x00, 0x06, 0x00, 0x04], // user class, one 4-byte item
            b"iPXE",
            &[0x00, 0x08, 0x00, 0x02, 0x00, 0x00], // elapsed time 0
        ])
    }

    /// ISC dhclient (`dhclient -6`) soliciting with rapid commit: a
    /// DUID-LLT client id, elapsed time, the options it asks for, IA_NA.
    pub fn dhclient_solicit() -> Vec<u8> {
        cat(&[
            &[0x01, 0x0b, 0xee, 0x70],                         // Solicit, xid 0bee70
            &[0x00, 0x01, 0x00, 0x0e],                         // client id, 14 bytes
            &[0x00, 0x01, 0x00, 0x01],                         // DUID-LLT, Ethernet
            &[0x2c, 0xa9, 0x3f, 0x79],                         // time
            &[0x52, 0x54, 0x00, 0xab, 0xcd, 0xef],             // MAC
            &[0x00, 0x08, 0x00, 0x02, 0x00, 0x00],             // elapsed time 0
            &[0x00, 0x0e, 0x00, 0x00],                         // rapid commit
            &[0x00, 0x06, 0x00, 0x08],                         // ORO, 8 bytes
            &[0x00, 0x17, 0x00, 0x18, 0x00, 0x27, 0x00, 0x1f], // 23 24 39 31
            &[0x00, 0x03, 0x00, 0x0c],                         // IA_NA, 12 bytes
            &[0x00, 0xab, 0xcd, 0xef],                         // IAID: the MAC's last bytes
            &[0, 0, 0x0e, 0x10, 0, 0, 0x15, 0x18],             // T1 3600, T2 5400
        ])
    }

    /// OVMF's UEFI HTTP boot soliciting: what `NetworkPkg/Dhcp6Dxe` puts
    /// first (client id, elapsed time, IA_NA), then what
    /// `NetworkPkg/HttpBootDxe/HttpBootDhcp6.c`, `HttpBootBuildDhcp6Options`,
    /// adds (ORO, NII, architecture, vendor class).
    pub fn edk2_http_solicit() -> Vec<u8> {
        cat(&[
            &[0x01, 0x9f, 0x00, 0x2d], // Solicit, xid 9f002d
            &[0x00, 0x01, 0x00, 0x12], // client id, 18 bytes
            &[0x00, 0x04],             // DUID-UUID, the SMBIOS layout
            &[
                0xe4, 0x81, 0x6a, 0x2b, 0x6f, 0x5b, 0x2a, 0x4c, 0x9d, 0x3e, 0x7f, 0x0a, 0x1b, 0x2c,
                0x3d, 0x4e,
            ],
            &[0x00, 0x08, 0x00, 0x02, 0x00, 0x00], // elapsed time 0
            &[0x00, 0x03, 0x00, 0x0c],             // IA_NA, 12 bytes
            &[0x00, 0x00, 0x00, 0x01],             // IAID 1
            &[0, 0, 0, 0, 0, 0, 0, 0],             // T1, T2: 0
            &[0x00, 0x06, 0x00, 0x08],             // ORO, 8 bytes
            &[0x00, 0x3b, 0x00, 0x3c, 0x00, 0x17, 0x00, 0x10], // 59 60 23 16
            &[0x00, 0x3e, 0x00, 0x03, 0x01, 0x03, 0x00], // NII: UNDI 3.0
            &[0x00, 0x3d, 0x00, 0x02, 0x00, 0x10], // architecture 16, x64 UEFI HTTP
            &[0x00, 0x10, 0x00, 0x27],             // vendor class, 39 bytes
            &[0x00, 0x00, 0x01, 0x57],             // enterprise 343
            &[0x00, 0x21],                         // one item, 33 bytes
            b"HTTPClient:Arch:00016:UNDI:003000",
        ])
    }

    /// The client of [`relayed_solicit`]: a DUID-LL Solicit.
    pub fn relayed_client() -> Vec<u8> {
        cat(&[
            &[0x01, 0x00, 0x00, 0x07], // Solicit, xid 000007
            &[0x00, 0x01, 0x00, 0x0a], // client id, 10 bytes
            &[0x00, 0x03, 0x00, 0x01], // DUID-LL, Ethernet
            &[0x52, 0x54, 0x00, 0x12, 0x34, 0x56],
            &[0x00, 0x03, 0x00, 0x0c],             // IA_NA, 12 bytes
            &[0x00, 0x00, 0x00, 0x05],             // IAID 5
            &[0, 0, 0, 0, 0, 0, 0, 0],             // T1, T2: 0
            &[0x00, 0x08, 0x00, 0x02, 0x00, 0x64], // elapsed time 1 s
        ])
    }

    /// Relay A, next to the client: hop count 0, link 2001:db8:10::1, peer
    /// the client's link-local address, the client's MAC (79), the
    /// Solicit (9); no interface-id.
    pub fn relay_a() -> Vec<u8> {
        let client = relayed_client();
        cat(&[
            &[0x0c, 0x00], // Relay-Forw, hop count 0
            &[
                0x20, 0x01, 0x0d, 0xb8, 0x00, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01,
            ],
            &[
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56,
            ],
            &[0x00, 0x4f, 0x00, 0x08], // client link-layer address, 8 bytes
            &[0x00, 0x01],             // Ethernet
            &[0x52, 0x54, 0x00, 0x12, 0x34, 0x56],
            &[0x00, 0x09, 0x00, client.len() as u8], // relay message
            &client,
        ])
    }

    /// [`relay_a`] relayed again by relay B: hop count 1, link
    /// unspecified, peer relay A's address, interface-id `ge-0/0/7`.
    pub fn relayed_solicit() -> Vec<u8> {
        let a = relay_a();
        cat(&[
            &[0x0c, 0x01], // Relay-Forw, hop count 1
            &[0; 16],      // link address unspecified
            &[
                0x20, 0x01, 0x0d, 0xb8, 0x00, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01,
            ],
            &[0x00, 0x12, 0x00, 0x08], // interface-id, 8 bytes
            b"ge-0/0/7",
            &[0x00, 0x09, 0x00, a.len() as u8], // relay message
            &a,
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::{fixture::*, *};
    use crate::inventory::{parse_uuid, uuid_text};

    #[test]
    fn an_ipxe_solicit_parses() {
        let req = Request6::parse(&ipxe_solicit()).expect("parses");
        assert_eq!(req.msg_type, MessageType::Solicit);
        assert_eq!(req.xid, [0x5a, 0x3c, 0x11]);
        let Some(Duid::Uuid(sent)) = req.client_duid() else {
            panic!("not a DUID-UUID: {:?}", req.client_duid());
        };
        // iPXE sends the RFC 4122 order: the text reads as sent.
        assert_eq!(uuid_text(&sent), UUID_TEXT);
        assert_eq!(
            req.ia_na,
            vec![IaNa {
                iaid: 0x8c1a_7e42,
                t1: 0,
                t2: 0,
                addrs: vec![]
            }]
        );
        assert_eq!(req.oro, vec![23, 24, 59, 60]);
        assert_eq!(
            req.vendor_class,
            Some(VendorClass6 {
                enterprise: 343,
                data: vec![b"PXEClient:Arch:00007:UNDI:003016".to_vec()],
            })
        );
        assert!(req.is_pxe_client() && !req.is_http_client());
        assert!(req.has_user_class(b"iPXE") && !req.has_user_class(b"iPX"));
        assert_eq!(req.arch, Some(7));
        assert_eq!(req.nii, Some([1, 3, 16]));
        assert!(!req.rapid_commit);
        assert_eq!(req.server_id, None);
        assert!(req.relays.is_empty());
        assert_eq!(req.client_link_layer(), None);
    }

    #[test]
    fn a_dhclient_solicit_parses() {
        let req = Request6::parse(&dhclient_solicit()).expect("parses");
        assert_eq!(req.msg_type, MessageType::Solicit);
        assert_eq!(req.xid, [0x0b, 0xee, 0x70]);
        assert_eq!(
            req.client_duid(),
            Some(Duid::LinkLayerTime(MacAddr([
                0x52, 0x54, 0x00, 0xab, 0xcd, 0xef
            ])))
        );
        assert!(req.rapid_commit);
        assert_eq!(req.oro, vec![23, 24, 39, 31]);
        assert_eq!(req.ia_na.len(), 1);
        assert_eq!((req.ia_na[0].t1, req.ia_na[0].t2), (3600, 5400));
        assert_eq!(req.vendor_class, None);
        assert!(!req.is_pxe_client() && !req.is_http_client());
        assert_eq!(req.vendor_text(), None);
        assert!(req.user_classes.is_empty());
        assert_eq!((req.arch, req.nii), (None, None));
    }

    #[test]
    fn an_edk2_http_boot_solicit_parses() {
        let req = Request6::parse(&edk2_http_solicit()).expect("parses");
        assert_eq!(req.msg_type, MessageType::Solicit);
        assert!(req.is_http_client() && !req.is_pxe_client());
        assert_eq!(
            req.vendor_text(),
            Some(&b"HTTPClient:Arch:00016:UNDI:003000"[..])
        );
        assert_eq!(req.arch, Some(16));
        assert_eq!(req.nii, Some([1, 3, 0]));
        assert_eq!(req.oro, vec![59, 60, 23, 16]);
        assert!(req.user_classes.is_empty());
        // edk2 sends the SMBIOS layout: the text reads with the first three
        // fields swapped.
        let duid = req.client_duid().expect("a client id");
        let [as_sent, swapped] = duid.system_uuids().expect("a DUID-UUID");
        assert_ne!(uuid_text(&as_sent), UUID_TEXT);
        assert_eq!(uuid_text(&swapped), UUID_TEXT);
        assert!(duid.names_uuid(&parse_uuid(UUID_TEXT).expect("parses")));
    }

    #[test]
    fn a_solicit_through_two_relays_parses_with_both_hops_outermost_first() {
        let req = Request6::parse(&relayed_solicit()).expect("parses");
        assert_eq!(req.msg_type, MessageType::Solicit);
        assert_eq!(req.xid, [0, 0, 7]);
        let mac = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
        assert_eq!(req.client_duid(), Some(Duid::LinkLayer(mac)));
        assert_eq!(
            req.relays,
            vec![
                RelayHop {
                    hop_count: 1,
                    link_addr: Ipv6Addr::UNSPECIFIED,
                    peer_addr: "2001:db8:10::1".parse().unwrap(),
                    interface_id: Some(b"ge-0/0/7".to_vec()),
                    client_link_layer: None,
                },
                RelayHop {
                    hop_count: 0,
                    link_addr: "2001:db8:10::1".parse().unwrap(),
                    peer_addr: "fe80::5054:ff:fe12:3456".parse().unwrap(),
                    interface_id: None,
                    client_link_layer: Some(mac),
                },
            ]
        );
        assert_eq!(req.client_link_layer(), Some(mac));
        assert_eq!(identity::mac_from_eui64(req.relays[1].peer_addr), Some(mac));
    }

    #[test]
    fn iaaddr_options_inside_an_ia_na_are_read() {
        let req = Request6::parse(&cat(&[
            &[0x03, 0x00, 0x00, 0x01],             // Request, xid 000001
            &[0x00, 0x02, 0x00, 0x04, 0, 3, 0, 1], // server id (a bare DUID-LL)
            &[0x00, 0x03, 0x00, 0x28],             // IA_NA, 40 bytes
            &[0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0], // IAID 9, T1, T2
            &[0x00, 0x05, 0x00, 0x18],             // IA Address, 24 bytes
            &[
                0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0x00,
            ],
            &[0, 0, 0x0e, 0x10, 0, 0, 0x1c, 0x20], // lifetimes
            &[0x00, 0x03, 0x00, 0x0c, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0], // IA_NA 10
        ]))
        .expect("parses");
        assert_eq!(req.msg_type, MessageType::Request);
        assert_eq!(req.server_id.as_deref(), Some(&[0, 3, 0, 1][..]));
        assert_eq!(req.ia_na.len(), 2);
        assert_eq!(req.ia_na[0].iaid, 9);
        assert_eq!(
            req.ia_na[0].addrs,
            vec!["2001:db8::100".parse::<Ipv6Addr>().unwrap()]
        );
        assert_eq!((req.ia_na[1].iaid, req.ia_na[1].addrs.len()), (10, 0));
    }

    /// `depth` Relay-Forw messages around the iPXE Solicit.
    fn nested(depth: usize) -> Vec<u8> {
        let mut msg = ipxe_solicit();
        for hop in 0..depth {
            let mut relay = vec![0x0c, hop as u8];
            relay.extend_from_slice(&[0; 32]);
            relay.extend_from_slice(&[0x00, 0x09]);
            relay.extend_from_slice(&(msg.len() as u16).to_be_bytes());
            relay.extend_from_slice(&msg);
            msg = relay;
        }
        msg
    }

    #[test]
    fn relay_chains_up_to_the_hop_count_limit_parse_and_longer_ones_are_refused() {
        let req = Request6::parse(&nested(HOP_COUNT_LIMIT)).expect("32 relays parse");
        assert_eq!(req.relays.len(), HOP_COUNT_LIMIT);
        assert_eq!(req.relays[0].hop_count, 31);
        assert_eq!(req.relays[31].hop_count, 0);
        for depth in [HOP_COUNT_LIMIT + 1, 40] {
            assert_eq!(
                Request6::parse(&nested(depth)),
                Err(ParseError6::RelayTooDeep),
                "{depth}"
            );
        }
    }

    #[test]
    fn a_relay_forw_without_a_relay_message_is_refused() {
        let mut relay = vec![0x0c, 0x00];
        relay.extend_from_slice(&[0; 32]);
        relay.extend_from_slice(&[0x00, 0x12, 0x00, 0x02, b'e', b'0']); // interface-id only
        assert_eq!(
            Request6::parse(&relay),
            Err(ParseError6::RelayWithoutMessage { depth: 0 })
        );
    }

    #[test]
    fn messages_servers_send_are_refused_relayed_or_not() {
        for (kind, msg_type) in [
            (2u8, MessageType::Advertise),
            (7, MessageType::Reply),
            (10, MessageType::Reconfigure),
            (13, MessageType::RelayRepl),
        ] {
            let mut msg = ipxe_solicit();
            msg[0] = kind;
            assert_eq!(
                Request6::parse(&msg),
                Err(ParseError6::ServerMessage(msg_type)),
                "{msg_type:?}"
            );
            let mut relayed = relayed_solicit();
            // The Solicit's type byte, inside both relays.
            // Each relay: its header, one 12-byte option (interface-id or
            // client link-layer address), the relay message's option header.
            let at = 2 * (RELAY_HEADER + 12 + 4);
            assert_eq!(relayed[at], 0x01);
            relayed[at] = kind;
            assert_eq!(
                Request6::parse(&relayed),
                Err(ParseError6::ServerMessage(msg_type)),
                "relayed {msg_type:?}"
            );
        }
    }

    #[test]
    fn lengths_that_lie_are_refused() {
        let head = [0x01, 0, 0, 1];
        for (opts, err) in [
            (
                &[0x00, 0x01, 0x00, 0x09, 0, 1][..],
                ParseError6::OptionOverrun { code: 1 },
            ),
            (&[0x00, 0x01, 0x00], ParseError6::OptionHeader { left: 3 }),
            (
                &[0x00, 0x06, 0x00, 0x03, 0, 23, 0],
                ParseError6::OptionLength { code: 6, len: 3 },
            ),
            (
                &[0x00, 0x3d, 0x00, 0x01, 7],
                ParseError6::OptionLength { code: 61, len: 1 },
            ),
            (
                &[0x00, 0x3e, 0x00, 0x02, 1, 3],
                ParseError6::OptionLength { code: 62, len: 2 },
            ),
            (
                &[0x00, 0x03, 0x00, 0x08, 0, 0, 0, 1, 0, 0, 0, 0],
                ParseError6::OptionLength { code: 3, len: 8 },
            ),
            // An item longer than its option.
            (
                &[0x00, 0x0f, 0x00, 0x04, 0x00, 0x05, b'i', b'P'],
                ParseError6::OptionLength { code: 15, len: 4 },
            ),
            // A vendor class without its enterprise number.
            (
                &[0x00, 0x10, 0x00, 0x02, 0x00, 0x00],
                ParseError6::OptionLength { code: 16, len: 2 },
            ),
            // An IA Address too short, inside an IA_NA.
            (
                &[
                    0x00, 0x03, 0x00, 0x14, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x05, 0x00,
                    0x04, 0, 0, 0, 0,
                ],
                ParseError6::OptionLength { code: 5, len: 4 },
            ),
            // An option inside an IA_NA running past the IA_NA.
            (
                &[
                    0x00, 0x03, 0x00, 0x10, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x05, 0x00,
                    0x18, 0, 0, 0, 0,
                ],
                ParseError6::OptionOverrun { code: 5 },
            ),
        ] {
            assert_eq!(
                Request6::parse(&cat(&[&head, opts])),
                Err(err),
                "{opts:02x?}"
            );
        }
        assert_eq!(
            Request6::parse(&[0x01, 0, 0]),
            Err(ParseError6::Truncated { len: 3 })
        );
        assert_eq!(Request6::parse(&[]), Err(ParseError6::Truncated { len: 0 }));
        assert_eq!(
            Request6::parse(&relayed_solicit()[..RELAY_HEADER - 1]),
            Err(ParseError6::Truncated {
                len: RELAY_HEADER - 1
            })
        );
    }

    #[test]
    fn the_first_of_a_repeated_single_option_counts() {
        let req = Request6::parse(&cat(&[
            &[0x01, 0, 0, 1],
            &[0x00, 0x01, 0x00, 0x02, 0xaa, 0xaa],
            &[0x00, 0x01, 0x00, 0x02, 0xbb, 0xbb],
            &[0x00, 0x3d, 0x00, 0x04, 0x00, 0x07, 0x00, 0x09],
            &[0x00, 0x3d, 0x00, 0x02, 0x00, 0x00],
            &[0x00, 0x0f, 0x00, 0x05, 0x00, 0x03, b'a', b'b', b'c'],
            &[0x00, 0x0f, 0x00, 0x05, 0x00, 0x01, b'x', 0x00, 0x00],
        ]))
        .expect("parses");
        assert_eq!(req.client_id.as_deref(), Some(&[0xaa, 0xaa][..]));
        assert_eq!(req.arch, Some(7));
        // User classes add up, empty items included.
        assert_eq!(
            req.user_classes,
            vec![b"abc".to_vec(), b"x".to_vec(), b"".to_vec()]
        );
    }

    #[test]
    fn no_truncation_of_a_valid_message_panics_the_parser() {
        for msg in [
            ipxe_solicit(),
            dhclient_solicit(),
            edk2_http_solicit(),
            relayed_solicit(),
        ] {
            assert!(Request6::parse(&msg).is_ok());
            for len in 0..msg.len() {
                let _ = Request6::parse(&msg[..len]);
            }
        }
    }

    #[test]
    fn no_single_byte_value_at_any_offset_panics_the_parser() {
        for msg in [ipxe_solicit(), relayed_solicit()] {
            for at in 0..msg.len() {
                for v in 0..=255u8 {
                    let mut b = msg.clone();
                    b[at] = v;
                    let _ = Request6::parse(&b);
                }
            }
        }
    }
}

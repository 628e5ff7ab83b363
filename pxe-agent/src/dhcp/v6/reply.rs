//! The DHCPv6 reply model (an Advertise or a Reply, RFC 8415 sections 16.3
//! and 18.3) and its encoding into the bytes a server sends: the message,
//! wrapped in one Relay-Repl per relay the request came through (section
//! 19.3). It does not choose what a reply holds, which is the policy's,
//! nor send it, which is the server's.

use std::net::Ipv6Addr;

use dhcproto::{
    Encodable as _,
    v6::{self as proto, DhcpOption, MessageType, OptionCode},
};

use super::request::{RELAY_HEADER, RelayHop, VendorClass6, opt};

/// A reply to one client message, apart from the relay path back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply6 {
    /// Advertise or Reply.
    pub msg_type: MessageType,
    /// The request's transaction id.
    pub xid: [u8; 3],
    /// This server's DUID (option 2).
    pub server_id: Vec<u8>,
    /// The client's DUID (option 1), echoed.
    pub client_id: Option<Vec<u8>>,
    pub ia_na: Vec<IaNaReply>,
    /// Status of the whole message (13), as opposed to one IA's.
    pub status: Option<Status>,
    /// Server preference (7): a client takes an Advertise of 255 at once
    /// rather than waiting for others (RFC 8415 section 18.2.1).
    pub preference: Option<u8>,
    /// Rapid commit (14): this Reply answers a Solicit that asked for it,
    /// and commits the addresses in it (RFC 8415 section 18.3.1).
    pub rapid_commit: bool,
    /// DNS recursive name servers (23, RFC 3646).
    pub dns: Vec<Ipv6Addr>,
    /// Domain search list (24, RFC 3646), names as text.
    pub domain_search: Vec<String>,
    /// Boot file URL (59, RFC 5970 section 3.1).
    pub boot_url: Option<String>,
    /// Boot file parameters (60, RFC 5970 section 3.2), in order.
    pub boot_params: Vec<String>,
    /// Vendor class (16): UEFI HTTP boot takes an answer as an HTTP boot
    /// answer only when it names itself `HTTPClient` (UEFI 2.5 section
    /// 24.7.2).
    pub vendor_class: Option<VendorClass6>,
}

/// An IA_NA in a reply (RFC 8415 section 21.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IaNaReply {
    pub iaid: u32,
    pub t1: u32,
    pub t2: u32,
    pub addrs: Vec<Lifetimes>,
    /// Status of this IA (13 inside it), such as NoAddrsAvail.
    pub status: Option<Status>,
}

/// An address of an IA and its lifetimes in seconds (IA Address, 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetimes {
    pub addr: Ipv6Addr,
    pub preferred: u32,
    pub valid: u32,
}

/// A status code option (13): the code and a message for people.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: StatusCode6,
    pub message: String,
}

impl Status {
    pub fn new(code: StatusCode6, message: impl Into<String>) -> Status {
        Status {
            code,
            message: message.into(),
        }
    }
}

/// The status codes a server sends (RFC 8415 section 21.13).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum StatusCode6 {
    Success = 0,
    UnspecFail = 1,
    NoAddrsAvail = 2,
    NoBinding = 3,
    NotOnLink = 4,
    UseMulticast = 5,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError6 {
    #[error("option {code} would hold {len} bytes, more than its 16-bit length can say")]
    OptionTooLong { code: u16, len: usize },
    #[error("{name:?} in the domain search list is not a domain name: {why}")]
    DomainName { name: String, why: &'static str },
    #[error("a {len}-byte message does not fit into the relay message option of a Relay-Repl")]
    RelayTooLong { len: usize },
}

/// The bytes to send for `reply` to a request that came through `relays`
/// (outermost first, as [`Request6`](super::Request6) holds them).
///
/// Where [`try_encode6`] refuses a value that cannot be encoded (a domain
/// search name that is not a domain name, an option value over 65,535
/// bytes), this leaves that name or option out and sends the rest. A
/// message too long for a Relay-Repl to hold cannot be left partly out:
/// the result is then empty, and there is nothing to send (no UDP
/// datagram holds 64 KiB either).
pub fn encode6(reply: &Reply6, relays: &[RelayHop]) -> Vec<u8> {
    encode(reply, relays, false).unwrap_or_default()
}

/// [`encode6`], refusing what it would leave out.
pub fn try_encode6(reply: &Reply6, relays: &[RelayHop]) -> Result<Vec<u8>, EncodeError6> {
    encode(reply, relays, true)
}

/// The largest option value: its length is 16 bits (RFC 8415 section 21.1).
const MAX_OPTION: usize = u16::MAX as usize;

/// The message, then its Relay-Repls.
fn encode(reply: &Reply6, relays: &[RelayHop], strict: bool) -> Result<Vec<u8>, EncodeError6> {
    let mut bytes = message(reply, strict)?;
    // RFC 8415 section 19.3: each Relay-Repl copies its Relay-Forw's hop
    // count, link and peer address, and interface-id. The innermost hop
    // is the last.
    for hop in relays.iter().rev() {
        bytes = relay_repl(hop, &bytes, strict)?;
    }
    Ok(bytes)
}

/// The Advertise or Reply itself. dhcproto encodes the message and the
/// options whose encoders write what RFC 8415 says. Its encoders for 15
/// and 16 write the number of items as the option length, and the one for
/// 24 compresses names with pointers, which DHCPv6 forbids (RFC 8415
/// section 10): 16 and 24, like 59 and 60 that it does not know, go in as
/// raw values.
fn message(reply: &Reply6, strict: bool) -> Result<Vec<u8>, EncodeError6> {
    let mut opts = Options {
        opts: proto::DhcpOptions::new(),
        strict,
    };
    opts.put(
        opt::SERVER_ID,
        reply.server_id.len(),
        DhcpOption::ServerId(reply.server_id.clone()),
    )?;
    if let Some(id) = &reply.client_id {
        opts.put(opt::CLIENT_ID, id.len(), DhcpOption::ClientId(id.clone()))?;
    }
    for ia in &reply.ia_na {
        let mut inner = proto::DhcpOptions::new();
        // IAID, T1 and T2, then each IA Address (4 + 24) and the status.
        let mut len = 12;
        for a in &ia.addrs {
            inner.insert(DhcpOption::IAAddr(proto::IAAddr {
                addr: a.addr,
                preferred_life: a.preferred,
                valid_life: a.valid,
                opts: proto::DhcpOptions::new(),
            }));
            len += 28;
        }
        if let Some(status) = &ia.status {
            inner.insert(status_option(status));
            len += 6 + status.message.len();
        }
        let iana = proto::IANA {
            id: ia.iaid,
            t1: ia.t1,
            t2: ia.t2,
            opts: inner,
        };
        opts.put(opt::IA_NA, len, DhcpOption::IANA(iana))?;
    }
    if let Some(status) = &reply.status {
        opts.put(
            opt::STATUS_CODE,
            2 + status.message.len(),
            status_option(status),
        )?;
    }
    if let Some(preference) = reply.preference {
        opts.put(opt::PREFERENCE, 1, DhcpOption::Preference(preference))?;
    }
    if reply.rapid_commit {
        opts.put(opt::RAPID_COMMIT, 0, DhcpOption::RapidCommit)?;
    }
    if !reply.dns.is_empty() {
        opts.put(
            opt::DNS_SERVERS,
            16 * reply.dns.len(),
            DhcpOption::DomainNameServers(reply.dns.clone()),
        )?;
    }
    let mut search = Vec::new();
    for name in &reply.domain_search {
        match encode_domain_name(name) {
            Ok(wire) => search.extend_from_slice(&wire),
            Err(err) => opts.fail(err)?,
        }
    }
    if !search.is_empty() {
        opts.raw(opt::DOMAIN_LIST, search)?;
    }
    if let Some(url) = &reply.boot_url {
        opts.raw(opt::BOOTFILE_URL, url.as_bytes().to_vec())?;
    }
    if !reply.boot_params.is_empty() {
        // Each parameter: a 16-bit length and its bytes (RFC 5970
        // section 3.2).
        let mut value = Vec::new();
        for param in &reply.boot_params {
            put_item(&mut value, param.as_bytes());
        }
        opts.raw(opt::BOOTFILE_PARAM, value)?;
    }
    if let Some(class) = &reply.vendor_class {
        // Enterprise number, then each item with its 16-bit length (RFC
        // 8415 section 21.16).
        let mut value = class.enterprise.to_be_bytes().to_vec();
        for item in &class.data {
            put_item(&mut value, item);
        }
        opts.raw(opt::VENDOR_CLASS, value)?;
    }

    let mut msg = proto::Message::new_with_id(reply.msg_type, reply.xid);
    msg.set_opts(opts.opts);
    Ok(msg
        .to_vec()
        .expect("dhcproto fails to write to a Vec only when its offset overflows"))
}

/// A Relay-Repl along `hop` holding `msg`. dhcproto cannot build one
/// (`RelayMessage` has private fields and no constructor).
fn relay_repl(hop: &RelayHop, msg: &[u8], strict: bool) -> Result<Vec<u8>, EncodeError6> {
    let id_len = hop.interface_id.as_ref().map_or(0, |id| 4 + id.len());
    let mut relay = Vec::with_capacity(RELAY_HEADER + id_len + 4 + msg.len());
    relay.push(u8::from(MessageType::RelayRepl));
    relay.push(hop.hop_count);
    relay.extend_from_slice(&hop.link_addr.octets());
    relay.extend_from_slice(&hop.peer_addr.octets());
    if let Some(id) = &hop.interface_id {
        // It was read from an option, so it fits one.
        if put_option(&mut relay, opt::INTERFACE_ID, id).is_err() {
            refuse_if(
                strict,
                EncodeError6::OptionTooLong {
                    code: opt::INTERFACE_ID,
                    len: id.len(),
                },
            )?;
        }
    }
    put_option(&mut relay, opt::RELAY_MSG, msg)
        .map_err(|len| EncodeError6::RelayTooLong { len })?;
    Ok(relay)
}

/// The options of a message being built, and whether a value that does not
/// fit is an error (else it is left out).
struct Options {
    opts: proto::DhcpOptions,
    strict: bool,
}

impl Options {
    /// Adds `option`, whose value is `len` bytes, if that fits an option.
    fn put(&mut self, code: u16, len: usize, option: DhcpOption) -> Result<(), EncodeError6> {
        if len > MAX_OPTION {
            return self.fail(EncodeError6::OptionTooLong { code, len });
        }
        self.opts.insert(option);
        Ok(())
    }

    /// Adds option `code` with the raw `value`, if it fits.
    fn raw(&mut self, code: u16, value: Vec<u8>) -> Result<(), EncodeError6> {
        let len = value.len();
        let option = proto::UnknownOption::new(OptionCode::from(code), value);
        self.put(code, len, DhcpOption::Unknown(option))
    }

    fn fail(&self, err: EncodeError6) -> Result<(), EncodeError6> {
        refuse_if(self.strict, err)
    }
}

/// `err` when strict; otherwise nothing, and what failed is left out.
fn refuse_if(strict: bool, err: EncodeError6) -> Result<(), EncodeError6> {
    if strict { Err(err) } else { Ok(()) }
}

fn status_option(status: &Status) -> DhcpOption {
    DhcpOption::StatusCode(proto::StatusCode {
        status: proto::Status::from(status.code as u16),
        msg: status.message.clone(),
    })
}

/// Appends an item: its 16-bit length and its bytes. An item too long for
/// that length makes the whole option too long, which is caught there.
fn put_item(out: &mut Vec<u8>, item: &[u8]) {
    let len = u16::try_from(item.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(item);
}

/// Appends option `code` with `value`; the value's length when it does not
/// fit an option.
fn put_option(out: &mut Vec<u8>, code: u16, value: &[u8]) -> Result<(), usize> {
    let len = u16::try_from(value.len()).map_err(|_| value.len())?;
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(value);
    Ok(())
}

/// A domain name in the uncompressed wire form of RFC 1035 section 3.1,
/// which DHCPv6 options use (RFC 8415 section 10): each label with its
/// length, then the root's empty label. A trailing dot is allowed; labels
/// are printable ASCII (an internationalized name goes in its `xn--`
/// form), 1 to 63 bytes, and the whole is at most 255 bytes.
pub fn encode_domain_name(name: &str) -> Result<Vec<u8>, EncodeError6> {
    let bad = |why| EncodeError6::DomainName {
        name: name.to_owned(),
        why,
    };
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    if trimmed.is_empty() {
        return Err(bad("it is empty"));
    }
    let mut wire = Vec::with_capacity(trimmed.len() + 2);
    for label in trimmed.split('.') {
        let Ok(len @ 1..=63) = u8::try_from(label.len()) else {
            return Err(bad("a label is empty or longer than 63 bytes"));
        };
        if !label.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad("a label holds a space, a control or a non-ASCII byte"));
        }
        wire.push(len);
        wire.extend_from_slice(label.as_bytes());
    }
    wire.push(0);
    if wire.len() > 255 {
        return Err(bad("it is longer than 255 bytes"));
    }
    Ok(wire)
}

#[cfg(test)]
mod tests {
    use dhcproto::{Decodable as _, Decoder, Name};

    use super::{super::request::fixture, *};
    use crate::dhcp::v6::Request6;

    fn everything() -> Reply6 {
        Reply6 {
            msg_type: MessageType::Advertise,
            xid: [0x5a, 0x3c, 0x11],
            server_id: vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 1],
            client_id: Some(vec![0, 3, 0, 1, 0x52, 0x54, 0, 0x12, 0x34, 0x56]),
            ia_na: vec![IaNaReply {
                iaid: 0x8c1a_7e42,
                t1: 1800,
                t2: 2880,
                addrs: vec![Lifetimes {
                    addr: "2001:db8:10::100".parse().unwrap(),
                    preferred: 3600,
                    valid: 7200,
                }],
                status: Some(Status::new(StatusCode6::Success, "ok")),
            }],
            status: Some(Status::new(StatusCode6::Success, "all well")),
            preference: Some(255),
            rapid_commit: true,
            dns: vec!["2001:db8::53".parse().unwrap()],
            domain_search: vec!["lab.example.com".into(), "example.com.".into()],
            boot_url: Some("http://[2001:db8::1]/boot/ipxe.efi".into()),
            boot_params: vec!["a=1".into(), "console=ttyS0".into()],
            vendor_class: Some(VendorClass6 {
                enterprise: 343,
                data: vec![b"HTTPClient".to_vec()],
            }),
        }
    }

    fn decode(bytes: &[u8]) -> proto::Message {
        proto::Message::decode(&mut Decoder::new(bytes)).expect("decodes")
    }

    fn raw(msg: &proto::Message, code: u16) -> Vec<u8> {
        match msg.opts().get(OptionCode::from(code)) {
            Some(DhcpOption::Unknown(opt)) => opt.data().to_vec(),
            other => panic!("option {code}: {other:?}"),
        }
    }

    #[test]
    fn every_option_of_an_advertise_reads_back_through_dhcproto() {
        let msg = decode(&encode6(&everything(), &[]));
        assert_eq!(msg.msg_type(), MessageType::Advertise);
        assert_eq!(msg.xid(), [0x5a, 0x3c, 0x11]);
        // dhcproto's decoder stops quietly at an option it cannot read:
        // every option must have been read.
        assert_eq!(msg.opts().iter().count(), 11, "{msg:#?}");
        let get = |code: OptionCode| msg.opts().get(code).cloned();
        assert_eq!(
            get(OptionCode::ServerId),
            Some(DhcpOption::ServerId(vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 1]))
        );
        assert_eq!(
            get(OptionCode::ClientId),
            Some(DhcpOption::ClientId(vec![
                0, 3, 0, 1, 0x52, 0x54, 0, 0x12, 0x34, 0x56
            ]))
        );
        let Some(DhcpOption::IANA(ia)) = get(OptionCode::IANA) else {
            panic!("no IA_NA");
        };
        assert_eq!((ia.id, ia.t1, ia.t2), (0x8c1a_7e42, 1800, 2880));
        assert_eq!(
            ia.opts.get(OptionCode::IAAddr),
            Some(&DhcpOption::IAAddr(proto::IAAddr {
                addr: "2001:db8:10::100".parse().unwrap(),
                preferred_life: 3600,
                valid_life: 7200,
                opts: proto::DhcpOptions::new(),
            }))
        );
        assert_eq!(
            ia.opts.get(OptionCode::StatusCode),
            Some(&DhcpOption::StatusCode(proto::StatusCode {
                status: proto::Status::Success,
                msg: "ok".into(),
            }))
        );
        assert_eq!(
            get(OptionCode::StatusCode),
            Some(DhcpOption::StatusCode(proto::StatusCode {
                status: proto::Status::Success,
                msg: "all well".into(),
            }))
        );
        assert_eq!(
            get(OptionCode::Preference),
            Some(DhcpOption::Preference(255))
        );
        assert_eq!(get(OptionCode::RapidCommit), Some(DhcpOption::RapidCommit));
        assert_eq!(
            get(OptionCode::DomainNameServers),
            Some(DhcpOption::DomainNameServers(vec![
                "2001:db8::53".parse().unwrap()
            ]))
        );
        assert_eq!(
            get(OptionCode::DomainSearchList),
            Some(DhcpOption::DomainSearchList(vec![
                Name::from_ascii("lab.example.com.").unwrap(),
                Name::from_ascii("example.com.").unwrap(),
            ]))
        );
        assert_eq!(
            get(OptionCode::VendorClass),
            Some(DhcpOption::VendorClass(proto::VendorClass {
                num: 343,
                data: vec![b"HTTPClient".to_vec()],
            }))
        );
        assert_eq!(raw(&msg, 59), b"http://[2001:db8::1]/boot/ipxe.efi");
        assert_eq!(raw(&msg, 60), b"\x00\x03a=1\x00\x0dconsole=ttyS0");
    }

    #[test]
    fn the_hand_written_options_are_the_bytes_the_rfcs_lay_out() {
        let reply = Reply6 {
            msg_type: MessageType::Reply,
            xid: [1, 2, 3],
            server_id: vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 1],
            client_id: None,
            ia_na: vec![],
            status: None,
            preference: None,
            rapid_commit: false,
            dns: vec![],
            domain_search: vec!["a.example".into(), "example".into()],
            boot_url: Some("tftp://x/y".into()),
            boot_params: vec![],
            vendor_class: Some(VendorClass6 {
                enterprise: 343,
                data: vec![b"HTTPClient".to_vec(), b"x".to_vec()],
            }),
        };
        let expected = fixture::cat(&[
            &[0x07, 1, 2, 3],                                        // Reply, xid
            &[0x00, 0x02, 0x00, 0x0a, 0, 3, 0, 1, 2, 0, 0, 0, 0, 1], // server id
            &[0x00, 0x10, 0x00, 0x13],                               // vendor class, 19 bytes
            &[0x00, 0x00, 0x01, 0x57],                               // enterprise 343
            &[0x00, 0x0a],                                           // 10-byte item
            b"HTTPClient",
            &[0x00, 0x01, b'x'],       // 1-byte item
            &[0x00, 0x18, 0x00, 0x14], // domain search list, 20 bytes
            // Both names in full: the second is no pointer into the first.
            b"\x01a\x07example\x00",
            b"\x07example\x00",
            &[0x00, 0x3b, 0x00, 0x0a], // boot file URL, 10 bytes
            b"tftp://x/y",
        ]);
        assert_eq!(encode6(&reply, &[]), expected);
    }

    #[test]
    fn an_ia_without_addresses_carries_its_status() {
        let reply = Reply6 {
            msg_type: MessageType::Reply,
            ia_na: vec![IaNaReply {
                iaid: 5,
                t1: 0,
                t2: 0,
                addrs: vec![],
                status: Some(Status::new(StatusCode6::NoAddrsAvail, "no address for you")),
            }],
            status: None,
            preference: None,
            rapid_commit: false,
            dns: vec![],
            domain_search: vec![],
            boot_url: None,
            boot_params: vec![],
            vendor_class: None,
            ..everything()
        };
        let msg = decode(&encode6(&reply, &[]));
        let Some(DhcpOption::IANA(ia)) = msg.opts().get(OptionCode::IANA) else {
            panic!("no IA_NA");
        };
        assert_eq!(ia.id, 5);
        assert_eq!(ia.opts.get(OptionCode::IAAddr), None);
        assert_eq!(
            ia.opts.get(OptionCode::StatusCode),
            Some(&DhcpOption::StatusCode(proto::StatusCode {
                status: proto::Status::NoAddrsAvail,
                msg: "no address for you".into(),
            }))
        );
        assert_eq!(msg.opts().get(OptionCode::RapidCommit), None);
        assert_eq!(msg.opts().get(OptionCode::Preference), None);
        for code in [13, 16, 23, 24, 59, 60] {
            assert_eq!(msg.opts().get(OptionCode::from(code)), None, "{code}");
        }
    }

    #[test]
    fn status_codes_are_their_rfc_numbers() {
        for (code, n) in [
            (StatusCode6::Success, 0u16),
            (StatusCode6::UnspecFail, 1),
            (StatusCode6::NoAddrsAvail, 2),
            (StatusCode6::NoBinding, 3),
            (StatusCode6::NotOnLink, 4),
            (StatusCode6::UseMulticast, 5),
        ] {
            assert_eq!(code as u16, n);
        }
    }

    /// A Relay-Repl read by hand: hop count, link and peer address, and
    /// its options by code.
    fn read_relay_repl(bytes: &[u8]) -> (u8, Ipv6Addr, Ipv6Addr, Vec<(u16, Vec<u8>)>) {
        assert_eq!(bytes[0], 13, "a Relay-Repl");
        let addr = |at: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&bytes[at..at + 16]).unwrap());
        let mut opts = Vec::new();
        let mut rest = &bytes[34..];
        while !rest.is_empty() {
            let code = u16::from_be_bytes([rest[0], rest[1]]);
            let len = usize::from(u16::from_be_bytes([rest[2], rest[3]]));
            opts.push((code, rest[4..4 + len].to_vec()));
            rest = &rest[4 + len..];
        }
        (bytes[1], addr(2), addr(18), opts)
    }

    #[test]
    fn a_reply_to_a_relayed_solicit_goes_back_through_both_relays() {
        let req = Request6::parse(&fixture::relayed_solicit()).expect("parses");
        let reply = Reply6 {
            msg_type: MessageType::Advertise,
            xid: req.xid,
            client_id: req.client_id.as_deref().map(<[u8]>::to_vec),
            ..everything()
        };
        let bytes = encode6(&reply, &req.relays);

        // Relay B's, outermost: its hop count, link, peer and interface-id.
        let (hop, link, peer, opts) = read_relay_repl(&bytes);
        assert_eq!(hop, 1);
        assert_eq!(link, Ipv6Addr::UNSPECIFIED);
        assert_eq!(peer, "2001:db8:10::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(opts.len(), 2);
        assert_eq!(opts[0], (18, b"ge-0/0/7".to_vec()));
        assert_eq!(opts[1].0, 9);

        // Relay A's: no interface-id to echo, and option 79 is not echoed.
        let (hop, link, peer, opts) = read_relay_repl(&opts[1].1);
        assert_eq!(hop, 0);
        assert_eq!(link, "2001:db8:10::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(peer, "fe80::5054:ff:fe12:3456".parse::<Ipv6Addr>().unwrap());
        assert_eq!(opts.len(), 1);
        assert_eq!(opts[0].0, 9);

        // The Advertise, as unrelayed.
        assert_eq!(opts[0].1, encode6(&reply, &[]));
        let msg = decode(&opts[0].1);
        assert_eq!(msg.xid(), [0, 0, 7]);
        assert_eq!(
            msg.opts().get(OptionCode::ClientId),
            Some(&DhcpOption::ClientId(vec![
                0, 3, 0, 1, 0x52, 0x54, 0, 0x12, 0x34, 0x56
            ]))
        );
    }

    #[test]
    fn values_that_cannot_be_encoded_are_left_out_or_refused() {
        let reply = Reply6 {
            domain_search: vec![
                "a..example".into(),
                "example.com".into(),
                "b c.example".into(),
                format!("{}.example", "x".repeat(64)),
                ".".into(),
            ],
            boot_url: Some("h".repeat(70_000)),
            ..everything()
        };
        let msg = decode(&encode6(&reply, &[]));
        assert_eq!(
            msg.opts().get(OptionCode::DomainSearchList),
            Some(&DhcpOption::DomainSearchList(vec![
                Name::from_ascii("example.com.").unwrap()
            ]))
        );
        assert_eq!(msg.opts().get(OptionCode::from(59)), None);
        assert!(msg.opts().get(OptionCode::from(60)).is_some());
        assert!(matches!(
            try_encode6(&reply, &[]),
            Err(EncodeError6::DomainName { name, .. }) if name == "a..example"
        ));
        let reply = Reply6 {
            domain_search: vec![],
            ..reply
        };
        assert_eq!(
            try_encode6(&reply, &[]),
            Err(EncodeError6::OptionTooLong {
                code: 59,
                len: 70_000
            })
        );
    }

    #[test]
    fn a_message_too_long_for_a_relay_repl_is_not_sent() {
        let reply = Reply6 {
            boot_url: Some("h".repeat(40_000)),
            boot_params: vec!["p".repeat(40_000)],
            ..everything()
        };
        let relays = [RelayHop {
            hop_count: 0,
            link_addr: Ipv6Addr::UNSPECIFIED,
            peer_addr: Ipv6Addr::LOCALHOST,
            interface_id: None,
            client_link_layer: None,
        }];
        assert!(encode6(&reply, &[]).len() > 80_000);
        assert_eq!(encode6(&reply, &relays), Vec::<u8>::new());
        assert!(matches!(
            try_encode6(&reply, &relays),
            Err(EncodeError6::RelayTooLong { .. })
        ));
    }

    #[test]
    fn domain_names_are_checked_label_by_label() {
        assert_eq!(
            encode_domain_name("Lab.Example.").unwrap(),
            b"\x03Lab\x07Example\x00"
        );
        let longest = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61),
        ]
        .join(".");
        assert_eq!(encode_domain_name(&longest).map(|w| w.len()), Ok(255));
        let too_long = format!("{longest}x");
        for bad in ["", ".", "a..b", ".a", "a b", "é.example", too_long.as_str()] {
            assert!(encode_domain_name(bad).is_err(), "{bad:?}");
        }
    }
}

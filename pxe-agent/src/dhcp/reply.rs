//! The reply model and its builder: what a DHCP reply holds apart from the
//! request's own fields ([`Reply`]), the server and the client it names
//! ([`Server`], [`Subject`]), and how the parts of an answer become its
//! fields and options ([`build`], `build_proxy`, [`nak`], `withhold_boot`,
//! `echo_relay_info`). It does not choose those parts, which is the policy
//! (`decide`), nor turn a reply into bytes (`encode`).

use std::{collections::BTreeMap, net::Ipv4Addr};

use dhcproto::v4::{DhcpOption, DhcpOptions, MessageType, OptionCode, UnknownOption};
use pxe_ebpf_common::bootp::{HTTP_CLIENT, OPT_CLIENT_UUID, OPT_VENDOR_INFO, PXE_CLIENT};

use super::Request;
use crate::inventory::{ExtraOptions, Host, Inventory, Subnet};

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
    Nak,
}

impl ReplyKind {
    pub fn message_type(self) -> MessageType {
        match self {
            ReplyKind::Offer => MessageType::Offer,
            ReplyKind::Ack => MessageType::Ack,
            ReplyKind::Nak => MessageType::Nak,
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
    /// The codes in `options` that are the host's own (its name, its extra
    /// options), sorted: the encoder puts them after the rest, so the fast
    /// path can keep everything before them once for all hosts that share
    /// it.
    pub host_codes: Vec<u8>,
}

impl Reply {
    /// A proxyDHCP answer: boot information without an address, naming
    /// itself `PXEClient` (option 60), which no other reply does.
    pub fn is_proxy(&self) -> bool {
        matches!(
            self.options.get(OptionCode::ClassIdentifier),
            Some(DhcpOption::ClassIdentifier(id)) if id.as_slice() == PXE_CLIENT
        )
    }
}

/// Whom a reply is for: a reserved host, or a client leasing from a pool.
pub struct Subject<'a> {
    pub ip: Ipv4Addr,
    pub hostname: Option<&'a str>,
    pub subnet: &'a Subnet,
    pub options: Option<&'a ExtraOptions>,
    pub lease_time: u32,
}

impl<'a> Subject<'a> {
    /// A reserved host, if it has an IPv4 address.
    pub fn host(inv: &'a Inventory, host: &'a Host) -> Option<Subject<'a>> {
        let (ip, _) = host.ip?;
        let subnet = inv.subnet_of(host)?;
        Some(Subject {
            ip,
            hostname: host.hostname.as_deref(),
            subnet,
            options: Some(&host.options),
            lease_time: subnet.lease_time,
        })
    }
}

/// The boot part of an answer.
pub enum Boot {
    /// Address only.
    None,
    /// TFTP file for PXE firmware.
    Tftp(String),
    /// URL for UEFI HTTP boot.
    Http(String),
    /// URL an iPXE client chains to.
    Ipxe(String),
}

/// Assembles a reply: the subnet's settings and then its `options`, the
/// host's name, lease, server id, the boot answer, then the profile's and
/// its rules' options (`rule_options`) and the host's own options. A later
/// source wins per code: host over profile and rules, over the boot
/// answer, over the subnet's options, over the subnet's settings.
pub fn build(
    subject: &Subject,
    kind: ReplyKind,
    boot: Boot,
    rule_options: &BTreeMap<u8, Vec<u8>>,
    server: &Server,
) -> Reply {
    let subnet = subject.subnet;
    let mut options = DhcpOptions::new();
    options.insert(DhcpOption::SubnetMask(subnet.netmask()));
    if let Some(router) = subnet.router {
        options.insert(DhcpOption::Router(vec![router]));
    }
    if !subnet.dns.is_empty() {
        options.insert(DhcpOption::DomainNameServer(subnet.dns.clone()));
    }
    if let Some(domain) = &subnet.domain {
        options.insert(DhcpOption::DomainName(domain.clone()));
    }
    insert_raw(&mut options, &subnet.options);
    if let Some(name) = subject.hostname {
        options.insert(DhcpOption::Hostname(name.to_string()));
    }
    options.insert(DhcpOption::AddressLeaseTime(subject.lease_time));
    options.insert(DhcpOption::MessageType(kind.message_type()));
    options.insert(DhcpOption::ServerIdentifier(server.ip));

    let (siaddr, file) = boot_fields(boot, &mut options, server, false);
    extra_options(&mut options, rule_options, subject.options);
    let named = subject.hostname.is_some() && !rule_options.contains_key(&OPT_HOSTNAME);
    Reply {
        kind,
        yiaddr: subject.ip,
        siaddr,
        file,
        options,
        host_codes: host_codes(named.then_some(OPT_HOSTNAME), subject.options),
    }
}

/// Puts the boot answer into a reply: `siaddr` and `file` for TFTP, option
/// 67 (and 60 for HTTP boot) otherwise. `proxy` for a proxyDHCP answer, in
/// which iPXE is not told that there is no proxyDHCP server.
fn boot_fields(
    boot: Boot,
    options: &mut DhcpOptions,
    server: &Server,
    proxy: bool,
) -> (Ipv4Addr, Option<String>) {
    match boot {
        Boot::None => (Ipv4Addr::UNSPECIFIED, None),
        Boot::Tftp(name) => (server.ip, Some(name)),
        Boot::Http(url) => {
            // UEFI HTTP boot takes only offers that echo "HTTPClient"
            // (UEFI 2.5 section 24.7.2).
            options.insert(DhcpOption::ClassIdentifier(HTTP_CLIENT.to_vec()));
            options.insert(DhcpOption::BootfileName(url.into_bytes()));
            (Ipv4Addr::UNSPECIFIED, None)
        }
        Boot::Ipxe(url) => {
            options.insert(DhcpOption::BootfileName(url.into_bytes()));
            if !proxy {
                // iPXE waits for ProxyDHCP offers unless told there are
                // none: encapsulated option 176 (no-pxedhcp) = 1.
                options.insert(DhcpOption::Unknown(UnknownOption::new(
                    OptionCode::from(175),
                    vec![176, 1, 1],
                )));
            }
            (Ipv4Addr::UNSPECIFIED, None)
        }
    }
}

/// Option 12, the host name.
const OPT_HOSTNAME: u8 = 12;

/// The sorted codes a host's reply holds of its own: its name when it is
/// the host's, and its extra options.
fn host_codes(name: Option<u8>, host_options: Option<&ExtraOptions>) -> Vec<u8> {
    let mut codes: Vec<u8> = name
        .into_iter()
        .chain(host_options.into_iter().flatten().map(|(code, _)| code))
        .collect();
    codes.sort_unstable();
    codes.dedup();
    codes
}

/// `extra` as options, replacing any of the same code.
fn insert_raw(options: &mut DhcpOptions, extra: &BTreeMap<u8, Vec<u8>>) {
    for (code, value) in extra {
        options.insert(DhcpOption::Unknown(UnknownOption::new(
            OptionCode::from(*code),
            value.clone(),
        )));
    }
}

/// Profile and rule options, then the host's own options (a later source
/// wins per code).
fn extra_options(
    options: &mut DhcpOptions,
    rule_options: &BTreeMap<u8, Vec<u8>>,
    host_options: Option<&ExtraOptions>,
) {
    for (code, value) in rule_options
        .iter()
        .map(|(code, value)| (*code, value.as_slice()))
        .chain(host_options.into_iter().flatten())
    {
        options.insert(DhcpOption::Unknown(UnknownOption::new(
            OptionCode::from(code),
            value.to_vec(),
        )));
    }
}

/// PXE vendor options (option 43, PXE 2.1 section 2.4.1.2):
/// PXE_DISCOVERY_CONTROL (6) = 8, "boot the file this offer names, without
/// boot server discovery or a menu", then the end tag. BIOS PXE ROMs take a
/// proxy offer only with it.
const PXE_VENDOR_OPTIONS: [u8; 4] = [6, 1, 8, 255];

/// A proxyDHCP answer (PXE 2.1 section 2.2.3): no address and no address
/// options (the address server gives those), this server as next server,
/// the boot answer, server id,
/// option 60 `PXEClient`, the PXE vendor options, option 97 echoed when
/// the client sent it, then the subnet's, the profile's and rules', and
/// the host's options, in that order of precedence as in [`build`].
pub(super) fn build_proxy(
    kind: ReplyKind,
    boot: Boot,
    subnet_options: &BTreeMap<u8, Vec<u8>>,
    rule_options: &BTreeMap<u8, Vec<u8>>,
    host_options: Option<&ExtraOptions>,
    req: &Request,
    server: &Server,
) -> Reply {
    let mut options = DhcpOptions::new();
    insert_raw(&mut options, subnet_options);
    options.insert(DhcpOption::MessageType(kind.message_type()));
    options.insert(DhcpOption::ServerIdentifier(server.ip));
    options.insert(DhcpOption::ClassIdentifier(PXE_CLIENT.to_vec()));
    options.insert(DhcpOption::Unknown(UnknownOption::new(
        OptionCode::from(OPT_VENDOR_INFO),
        PXE_VENDOR_OPTIONS.to_vec(),
    )));
    if let Some(uuid) = &req.more.client_uuid {
        options.insert(DhcpOption::Unknown(UnknownOption::new(
            OptionCode::from(OPT_CLIENT_UUID),
            uuid.clone(),
        )));
    }
    let (_, file) = boot_fields(boot, &mut options, server, true);
    extra_options(&mut options, rule_options, host_options);
    Reply {
        kind,
        host_codes: host_codes(None, host_options),
        yiaddr: Ipv4Addr::UNSPECIFIED,
        // The next server is this one, whatever the boot answer: iPXE
        // takes a proxy answer as boot information only with a next
        // server and a boot file (or a PXE menu), and otherwise asks
        // again on port 4011 and drops that answer for the same reason.
        siaddr: server.ip,
        file,
        options,
    }
}

/// A NAK (RFC 2131 table 3: only the message type, server id and a message).
pub fn nak(server: &Server, why: &str) -> Reply {
    let mut options = DhcpOptions::new();
    options.insert(DhcpOption::MessageType(MessageType::Nak));
    options.insert(DhcpOption::ServerIdentifier(server.ip));
    options.insert(DhcpOption::Message(why.to_string()));
    Reply {
        kind: ReplyKind::Nak,
        yiaddr: Ipv4Addr::UNSPECIFIED,
        siaddr: Ipv4Addr::UNSPECIFIED,
        file: None,
        options,
        host_codes: Vec::new(),
    }
}

/// The options that point a client at something to boot: TFTP server name
/// (66), boot file name (67), vendor-specific PXE data (43), the
/// `HTTPClient` class (60) that makes UEFI take an offer as an HTTP boot
/// offer, and iPXE's encapsulated settings (175).
pub(super) const BOOT_OPTIONS: [u8; 5] = [66, 67, 43, 60, 175];

/// Makes `reply` an address-only answer, for a host whose `netboot` policy
/// gives it no boot file now ([`Inventory::withholds_boot`]): no next
/// server, no `file`, none of [`BOOT_OPTIONS`], whether they came from the
/// boot answer, a rule or the host's own options. Address, router, DNS,
/// hostname, domain and lease time stay, so the firmware configures the
/// interface, finds nothing to boot and falls through to the next boot
/// device.
pub(super) fn withhold_boot(reply: &mut Reply) {
    reply.siaddr = Ipv4Addr::UNSPECIFIED;
    reply.file = None;
    for code in BOOT_OPTIONS {
        reply.options.remove(OptionCode::from(code));
    }
}

/// RFC 3046 2.2: the server echoes the relay agent information unchanged.
pub(super) fn echo_relay_info(reply: &mut Reply, req: &Request) {
    if let Some(info) = &req.more.relay_agent_info {
        reply.options.insert(DhcpOption::Unknown(UnknownOption::new(
            OptionCode::RelayAgentInformation,
            info.clone(),
        )));
    }
}

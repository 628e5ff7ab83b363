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
    let Some(host) = inv.host_by_mac(req.chaddr) else {
        return Decision::Pass(Counter::PassUnknownHost);
    };
    let Some(reply) = reply_for(inv, host, class, kind, server) else {
        return Decision::Pass(Counter::PassUnknownHost);
    };
    if relayed && !inv.subnet_of(host).contains(req.giaddr) {
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use pxe_ebpf_common::VendorClass;

    use super::*;
    use crate::inventory::MacAddr;

    const INV: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    lease_time: 600
profiles:
  - name: worker
    boot: {bios: undionly.kpxe, uefi: ipxe.efi, http: "http://{server}/ipxe.efi"}
  - name: bare
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, profile: worker}
  - {mac: "52:54:00:00:00:02", ip: 10.66.1.11, profile: bare}
"#;
    const SERVER: Server = Server {
        ip: Ipv4Addr::new(10, 66, 0, 1),
        mac: [2, 0, 0, 0, 0, 1],
    };
    const WORKER: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
    const BARE: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 2]);
    const RESERVED: Ipv4Addr = Ipv4Addr::new(10, 66, 1, 10);

    fn inv() -> Inventory {
        Inventory::parse(Path::new("t.yaml"), INV).expect("valid")
    }

    fn discover(mac: MacAddr) -> Request {
        Request {
            chaddr: mac,
            ..Request::template_skeleton()
        }
    }

    fn pxe(mut r: Request, arch: u16) -> Request {
        r.arch = Some(arch);
        r.vendor = VendorClass::PxeClient;
        r
    }

    fn request(mut r: Request) -> Request {
        r.msg_type = Some(MessageType::Request);
        r
    }

    /// What a decision amounts to, for table rows.
    #[derive(Debug, PartialEq)]
    enum Want {
        Offer(Option<String>),
        Ack,
        Pass(Counter),
        Drop,
    }

    fn summarize(d: Decision) -> Want {
        match d {
            Decision::Reply(r) if r.kind == ReplyKind::Ack => Want::Ack,
            Decision::Reply(r) => Want::Offer(r.file),
            Decision::Pass(c) => Want::Pass(c),
            Decision::Drop(_) => Want::Drop,
        }
    }

    #[test]
    fn decisions_by_firmware_host_relay_and_state() {
        let other = Ipv4Addr::new(10, 66, 0, 2);
        let cases: Vec<(&str, Request, Want)> = vec![
            ("plain client", discover(WORKER), Want::Offer(None)),
            (
                "bios pxe",
                pxe(discover(WORKER), 0),
                Want::Offer(Some("undionly.kpxe".into())),
            ),
            (
                "uefi x64 pxe",
                pxe(discover(WORKER), 7),
                Want::Offer(Some("ipxe.efi".into())),
            ),
            (
                "arm64 without a file",
                pxe(discover(WORKER), 11),
                Want::Pass(Counter::PassUnknownHost),
            ),
            (
                "profile without boot",
                pxe(discover(BARE), 7),
                Want::Offer(None),
            ),
            (
                "unknown mac",
                pxe(discover(MacAddr([9; 6])), 0),
                Want::Pass(Counter::PassUnknownHost),
            ),
            (
                "unknown arch",
                pxe(discover(WORKER), 6),
                Want::Pass(Counter::PassUnsupportedClient),
            ),
            (
                "ipxe",
                Request {
                    ipxe: true,
                    ..pxe(discover(WORKER), 0)
                },
                Want::Pass(Counter::PassIpxe),
            ),
            (
                "relayed in subnet",
                Request {
                    giaddr: Ipv4Addr::new(10, 66, 9, 1),
                    ..discover(WORKER)
                },
                Want::Offer(None),
            ),
            (
                "relayed foreign",
                Request {
                    giaddr: Ipv4Addr::new(192, 0, 2, 1),
                    ..discover(WORKER)
                },
                Want::Pass(Counter::PassRelay),
            ),
            (
                "relayed with option 82",
                Request {
                    giaddr: Ipv4Addr::new(10, 66, 9, 1),
                    relay_info: true,
                    ..discover(WORKER)
                },
                Want::Pass(Counter::PassRelay),
            ),
            (
                "selecting us",
                Request {
                    server_id: Some(SERVER.ip),
                    requested_ip: Some(RESERVED),
                    ..request(discover(WORKER))
                },
                Want::Ack,
            ),
            (
                "selecting another server",
                Request {
                    server_id: Some(other),
                    requested_ip: Some(RESERVED),
                    ..request(discover(WORKER))
                },
                Want::Drop,
            ),
            (
                "init-reboot for reservation",
                Request {
                    requested_ip: Some(RESERVED),
                    ..request(discover(WORKER))
                },
                Want::Ack,
            ),
            (
                "init-reboot for another address",
                Request {
                    requested_ip: Some(other),
                    ..request(discover(WORKER))
                },
                Want::Pass(Counter::PassRequestMismatch),
            ),
            (
                "renewing",
                Request {
                    ciaddr: RESERVED,
                    ..request(discover(WORKER))
                },
                Want::Ack,
            ),
            (
                "renewing another address",
                Request {
                    ciaddr: other,
                    ..request(discover(WORKER))
                },
                Want::Pass(Counter::PassRequestMismatch),
            ),
            (
                "release",
                Request {
                    msg_type: Some(MessageType::Release),
                    ..discover(WORKER)
                },
                Want::Pass(Counter::PassMessageType),
            ),
            (
                "bootp without message type",
                Request {
                    msg_type: None,
                    ..discover(WORKER)
                },
                Want::Pass(Counter::PassMessageType),
            ),
        ];
        let inv = inv();
        for (name, req, want) in cases {
            assert_eq!(summarize(decide(&req, &inv, &SERVER)), want, "{name}");
        }
    }

    #[test]
    fn http_boot_gets_url_with_server_expanded_and_class_echo() {
        let inv = inv();
        let req = Request {
            arch: Some(16),
            vendor: VendorClass::HttpClient,
            ..discover(WORKER)
        };
        let Decision::Reply(r) = decide(&req, &inv, &SERVER) else {
            panic!("no reply")
        };
        assert_eq!(
            r.options.get(OptionCode::BootfileName),
            Some(&DhcpOption::BootfileName(
                b"http://10.66.0.1/ipxe.efi".to_vec()
            ))
        );
        assert_eq!(
            r.options.get(OptionCode::ClassIdentifier),
            Some(&DhcpOption::ClassIdentifier(b"HTTPClient".to_vec()))
        );
        assert_eq!(r.file, None);
        assert_eq!(r.siaddr, Ipv4Addr::UNSPECIFIED);
    }

    #[test]
    fn reply_carries_subnet_options_lease_and_server_id() {
        let inv = inv();
        let Decision::Reply(r) = decide(&discover(WORKER), &inv, &SERVER) else {
            panic!("no reply")
        };
        assert_eq!(r.yiaddr, RESERVED);
        assert_eq!(
            r.options.get(OptionCode::SubnetMask),
            Some(&DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 0, 0)))
        );
        assert_eq!(
            r.options.get(OptionCode::Router),
            Some(&DhcpOption::Router(vec![SERVER.ip]))
        );
        assert_eq!(
            r.options.get(OptionCode::AddressLeaseTime),
            Some(&DhcpOption::AddressLeaseTime(600))
        );
        assert_eq!(
            r.options.get(OptionCode::ServerIdentifier),
            Some(&DhcpOption::ServerIdentifier(SERVER.ip))
        );
        assert_eq!(
            r.options.get(OptionCode::MessageType),
            Some(&DhcpOption::MessageType(MessageType::Offer))
        );
    }
}

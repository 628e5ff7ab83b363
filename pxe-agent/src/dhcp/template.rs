//! Compiles the inventory into the fast path's `ReplyTemplate`s.
//!
//! Each template is the slow path's own encoding of a DHCPOFFER, made against
//! a request whose per-request fields are zero; the XDP program splices it and
//! fills those fields in. There is no second reply builder.

use std::collections::BTreeMap;

use pxe_ebpf_common::{BootClass, HostKey, ReplyTemplate, bootp};

use super::{Decision, Reply, ReplyKind, Request, Server, encode, fast_path};
use crate::inventory::Host;
use crate::inventory::{Inventory, Problem};

/// Every (host port, boot class) the inventory answers, as map entries.
pub type Templates = BTreeMap<HostKey, ReplyTemplate>;

/// Compiles all hosts; reports every host whose reply does not fit.
pub fn compile(inv: &Inventory, server: &Server) -> Result<Templates, Vec<Problem>> {
    let mut out = Templates::new();
    let mut problems = Vec::new();
    for host in &inv.hosts {
        for class in BootClass::ALL {
            let Some(offer) = class_reply(inv, host, class, ReplyKind::Offer, server) else {
                continue;
            };
            match build(&offer, server, inv.subnet_of(host)) {
                // Every port gets the same reply: nothing in it depends on
                // the port (`{mac}` is the host's primary MAC), and the XDP
                // program fills in the request's own chaddr.
                Ok(t) => {
                    for mac in host.ports() {
                        out.insert(HostKey::new(mac.0, class), t);
                    }
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

/// The reply the fast path gives every request of `class` from `host`, or
/// `None` when it passes them: `decide`'s answer to the class's request,
/// as far as [`fast_path`] lets the kernel give it.
pub fn class_reply(
    inv: &Inventory,
    host: &Host,
    class: BootClass,
    kind: ReplyKind,
    server: &Server,
) -> Option<Reply> {
    let ack_for = (kind == ReplyKind::Ack).then_some(host.ip);
    match fast_path(&Request::of_class(host.mac, class, ack_for), inv, server) {
        Decision::Reply(reply) => Some(reply),
        Decision::Pass(_) | Decision::Drop(_) => None,
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
    t.proxy = u8::from(offer.is_proxy());
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

#[cfg(test)]
mod tests {
    use std::{net::Ipv4Addr, path::Path};

    use super::*;
    use crate::dhcp::ReplyKind;

    const SERVER: Server = Server {
        ip: Ipv4Addr::new(10, 66, 0, 1),
        mac: [2, 0, 0, 0, 0, 1],
    };

    fn inventory(extra_options: &str) -> Inventory {
        let yaml = format!(
            r#"
subnets:
  - {{cidr: 10.66.0.0/16, router: 10.66.0.1, dns: [10.66.0.1], domain: lab.example}}
profiles:
  - name: worker
    boot: {{bios: undionly.kpxe, uefi: ipxe.efi, http: "http://{{server}}:8080/ipxe.efi"}}
hosts:
  - {{mac: "52:54:00:00:00:01", ip: 10.66.1.10, hostname: node-1, profile: worker, options: {extra_options}}}
"#
        );
        Inventory::parse(Path::new("t.yaml"), &yaml).expect("valid inventory")
    }

    #[test]
    fn template_is_the_encoders_offer_with_request_fields_zero() {
        let inv = inventory("{42: 10.66.0.1}");
        let templates = compile(&inv, &SERVER).expect("compiles");
        // Plain, BIOS, UEFI x64, HTTP; no arm64 file, so no arm64 template.
        let classes: Vec<u8> = templates.keys().map(|k| k.class).collect();
        assert_eq!(classes, vec![0, 1, 2, 4]);
        let host = &inv.hosts[0];
        for (key, t) in &templates {
            let class = BootClass::ALL[key.class as usize];
            let offer = class_reply(&inv, host, class, ReplyKind::Offer, &SERVER).expect("reply");
            let bytes = encode(&offer, &Request::template_skeleton()).expect("encodes");
            assert_eq!(&t.payload[..t.len as usize], &bytes[..], "{class:?}");
            assert!(t.payload[t.len as usize..].iter().all(|b| *b == 0));
            assert_eq!(t.payload[t.msg_type_off as usize], bootp::DHCPOFFER);
            assert_eq!(t.csum_offer, sum16(&bytes));
            assert_eq!(t.yiaddr, [10, 66, 1, 10]);
            assert_eq!((t.subnet, t.netmask), ([10, 66, 0, 0], [255, 255, 0, 0]));
            assert_eq!(
                (t.server_ip, t.server_mac),
                (SERVER.ip.octets(), SERVER.mac)
            );
            // The per-request fields the XDP program fills are zero.
            assert!(
                bytes[bootp::OFF_XID..bootp::OFF_YIADDR]
                    .iter()
                    .all(|b| *b == 0)
            );
            assert!(
                bytes[bootp::OFF_GIADDR..bootp::OFF_SNAME]
                    .iter()
                    .all(|b| *b == 0)
            );
        }
    }

    #[test]
    fn patching_the_message_type_gives_the_encoders_ack() {
        let inv = inventory("{}");
        let t = compile(&inv, &SERVER).expect("compiles")
            [&HostKey::new([0x52, 0x54, 0, 0, 0, 1], BootClass::Bios)];
        let ack = class_reply(
            &inv,
            &inv.hosts[0],
            BootClass::Bios,
            ReplyKind::Ack,
            &SERVER,
        )
        .expect("reply");
        let mut patched = t.payload[..t.len as usize].to_vec();
        patched[t.msg_type_off as usize] = bootp::DHCPACK;
        assert_eq!(
            patched,
            encode(&ack, &Request::template_skeleton()).expect("encodes")
        );
        assert_eq!(t.csum_ack, sum16(&patched));
    }

    #[test]
    fn extra_options_are_compiled_in() {
        let inv = inventory("{42: 10.66.0.1, 66: tftp.lab.example}");
        let t = compile(&inv, &SERVER).expect("compiles")
            [&HostKey::new([0x52, 0x54, 0, 0, 0, 1], BootClass::Plain)];
        let payload = &t.payload[..t.len as usize];
        let ntp = find_option(payload, 42).expect("option 42");
        assert_eq!(&payload[ntp - 1..ntp + 4], &[4, 10, 66, 0, 1]);
        let name = find_option(payload, 66).expect("option 66");
        assert_eq!(&payload[name..name + 16], b"tftp.lab.example");
    }

    #[test]
    fn reply_too_large_is_refused_naming_the_host() {
        let big = format!(
            "{{224: \"{}\", 225: \"{}\"}}",
            "x".repeat(200),
            "y".repeat(200)
        );
        let Err(problems) = compile(&inventory(&big), &SERVER) else {
            panic!("a reply too large compiled")
        };
        assert!(!problems.is_empty());
        let text = problems[0].to_string();
        assert!(
            text.contains("node-1") && text.contains("options") && text.contains("544"),
            "{text}"
        );
    }

    #[test]
    fn short_replies_are_padded_to_the_bootp_minimum() {
        let inv = inventory("{}");
        for t in compile(&inv, &SERVER).expect("compiles").values() {
            assert!(t.len as usize >= bootp::MIN_REPLY);
        }
    }

    #[test]
    fn sum16_folds_carries_and_pads_odd_lengths() {
        assert_eq!(sum16(&[0xff, 0xff, 0x00, 0x01]), 0x0001);
        assert_eq!(sum16(&[0x12]), 0x1200);
    }

    const RULES: &str = r#"
subnets:
  - {cidr: 10.66.0.0/16}
profiles:
  - name: worker
    boot: {bios: undionly.kpxe, uefi: ipxe.efi, http: "http://{server}/ipxe.efi"}
    rules:
      - match: {labels: {rack: r1}}
        boot: {bios: rack1.kpxe}
        options: {66: tftp-r1}
      - match: {arch: [7]}
        boot: {uefi: seven.efi}
      - match: {vendor_class: "HTTPClient:Arch:00019"}
        boot: {http: "http://{server}/arm.efi"}
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, profile: worker, labels: {rack: r1}}
  - {mac: "52:54:00:00:00:02", ip: 10.66.1.11, profile: worker, labels: {rack: r2}}
"#;

    #[test]
    fn label_rules_are_compiled_and_request_dependent_ones_leave_the_class_to_the_slow_path() {
        let inv = Inventory::parse(Path::new("t.yaml"), RULES).expect("valid");
        let t = compile(&inv, &SERVER).expect("compiles");
        let file = |mac: u8, class: BootClass| {
            t.get(&HostKey::new([0x52, 0x54, 0, 0, 0, mac], class))
                .map(|t| {
                    let f = &t.payload[bootp::OFF_FILE..bootp::OFF_FILE + 128];
                    String::from_utf8_lossy(&f[..f.iter().position(|b| *b == 0).unwrap_or(128)])
                        .into_owned()
                })
        };
        // Labels are known ahead of time: compiled per host.
        assert_eq!(file(1, BootClass::Bios).as_deref(), Some("rack1.kpxe"));
        assert_eq!(file(2, BootClass::Bios).as_deref(), Some("undionly.kpxe"));
        let opt66 = |mac: u8| {
            let t = &t[&HostKey::new([0x52, 0x54, 0, 0, 0, mac], BootClass::Plain)];
            find_option(&t.payload[..t.len as usize], 66).is_some()
        };
        assert!(opt66(1) && !opt66(2));
        // arch [7] splits the UEFI x64 class (7 and 9): only a request can tell.
        assert_eq!(file(1, BootClass::UefiX64), None);
        // A vendor-class rule that may apply to HTTP boot: that class too.
        assert_eq!(file(1, BootClass::Http), None);
        assert!(t.contains_key(&HostKey::new([0x52, 0x54, 0, 0, 0, 1], BootClass::Plain)));
    }

    #[test]
    fn a_proxy_subnet_compiles_proxy_offers_for_pxe_classes_only() {
        let yaml = r#"
subnets:
  - {cidr: 10.66.0.0/16, mode: proxy}
profiles:
  - name: worker
    boot: {bios: undionly.kpxe, uefi: ipxe.efi, http: "http://{server}:8080/ipxe.efi"}
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, profile: worker}
"#;
        let inv = Inventory::parse(Path::new("t.yaml"), yaml).expect("valid");
        let templates = compile(&inv, &SERVER).expect("compiles");
        // BIOS and UEFI x64 PXE; no plain client or HTTP boot is answered.
        let classes: Vec<u8> = templates.keys().map(|k| k.class).collect();
        assert_eq!(classes, vec![1, 2]);
        for t in templates.values() {
            assert_eq!(t.proxy, 1);
            assert_eq!(t.yiaddr, [0; 4]);
            let payload = &t.payload[..t.len as usize];
            let vendor = find_option(payload, 60).expect("option 60");
            assert_eq!(&payload[vendor..vendor + 9], b"PXEClient");
            assert!(find_option(payload, 51).is_none());
        }
        let server_mode = compile(&inventory("{}"), &SERVER).expect("compiles");
        assert!(server_mode.values().all(|t| t.proxy == 0));
    }

    #[test]
    fn a_provisioned_host_recompiles_to_address_only_templates_and_only_its_own_change() {
        let mut inv = inventory("{}");
        inv.profiles[0].netboot = crate::inventory::Netboot::Once;
        let armed = compile(&inv, &SERVER).expect("compiles");
        inv.provisioned.insert(inv.hosts[0].mac);
        let done = compile(&inv, &SERVER).expect("compiles");
        assert_eq!(
            armed.keys().collect::<Vec<_>>(),
            done.keys().collect::<Vec<_>>()
        );
        let plain = &done[&HostKey::new([0x52, 0x54, 0, 0, 0, 1], BootClass::Plain)];
        for (key, t) in &done {
            let payload = &t.payload[..t.len as usize];
            assert!(
                payload[bootp::OFF_FILE..bootp::OFF_FILE + 128]
                    .iter()
                    .all(|b| *b == 0)
            );
            assert_eq!(&payload[bootp::OFF_SIADDR..bootp::OFF_SIADDR + 4], &[0; 4]);
            for code in [43, 60, 66, 67, 175] {
                assert!(
                    find_option(payload, code).is_none(),
                    "{key:?} option {code}"
                );
            }
            assert_eq!(t.yiaddr, [10, 66, 1, 10]);
            assert!(find_option(payload, 3).is_some() && find_option(payload, 12).is_some());
            // Every class gets the plain address-only reply.
            assert_eq!(payload, &plain.payload[..plain.len as usize]);
        }
    }
}

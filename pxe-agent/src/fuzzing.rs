//! Entry points for the fuzz targets in `fuzz/` and for the unit tests that
//! replay their seeds and regressions: one function per target, taking the
//! raw input and panicking only when a property of the code under test
//! fails. It owns those properties, not the code they check; the parsers,
//! `decide`, the loader and the renderers are called exactly as the agent
//! calls them.
//!
//! Not an API: the names may change with the fuzz targets.

use std::{
    net::Ipv4Addr,
    path::{Component, Path},
    sync::LazyLock,
};

use dhcproto::{Decodable as _, Decoder, v4::Message};
use ipmi_rs::connection::{CompletionErrorCode, IpmiCommand as _};
use pxe_ebpf_common::BootClass;

use crate::{
    bmc::{
        BootFlags,
        command::{GetBootFlags, GetChassisStatus, SetSessionPrivilege, bmc_info},
        decode_rakp_answers,
        ipmi::completion_code_byte,
    },
    dhcp::{
        Answer, Decision, Request, Server, decide, encode, fast_path, pool_reply, template,
        v6::{Answer6, Request6, Server6, decide6, encode6},
    },
    http::{artifacts::parse_range, grub, plan::Target, script},
    inventory::Inventory,
    tftp::{
        option::{self, BLKSIZE_RANGE, DEFAULT_BLKSIZE, Limits, MAX_WINDOWSIZE, TIMEOUT_RANGE},
        packet::{self, Packet},
        path::{MAX_NAME, sanitize},
    },
};

/// One target's entry point.
pub type Entry = fn(&[u8]);

/// The targets by name, as `fuzz/fuzz_targets/<name>.rs`, the corpus and
/// regression directories and `cargo xtask fuzz --target` name them.
pub const TARGETS: &[(&str, Entry)] = &[
    ("dhcp_request", dhcp_request),
    ("dhcp6_request", dhcp6_request),
    ("tftp_request", tftp_request),
    ("inventory", inventory),
    ("ipxe_script", ipxe_script),
    ("http_range", http_range),
    ("ipmi_response", ipmi_response),
];

/// The server the DHCP target answers as: the example inventory's agent.
pub const SERVER: Server = Server {
    ip: Ipv4Addr::new(10, 66, 0, 1),
    mac: [0x02, 0, 0, 0, 0, 0x01],
};

/// The documented example inventory (reserved hosts with rules, a pool,
/// discovery): requests are decided against it. Its MACs are the ones the
/// seed requests carry.
static EXAMPLE: LazyLock<Inventory> = LazyLock::new(|| {
    Inventory::parse(
        Path::new("examples/inventory.yaml"),
        include_str!("../../examples/inventory.yaml"),
    )
    .expect("the example inventory is valid")
});

/// A DHCP request (the UDP payload): parsed as both paths parse it, decided,
/// encoded. Properties: whatever the fast path answers, `decide` answers
/// identically (the XDP program sends exactly that); every encoded reply
/// decodes with dhcproto and carries the request's xid and chaddr.
pub fn dhcp_request(data: &[u8]) {
    let Ok(req) = Request::parse(data) else {
        return;
    };
    let inv = &*EXAMPLE;
    let answer = decide(&req, inv, &SERVER);
    if let Decision::Reply(fast) = fast_path(&req, inv, &SERVER) {
        assert_eq!(
            answer,
            Answer::Reply(fast),
            "the fast path answers what decide does not"
        );
    }
    let reply = match answer {
        Answer::Reply(reply) => reply,
        Answer::Pool(ask) => {
            let ip = req
                .requested_ip
                .filter(|ip| ask.slice.contains(ip))
                .unwrap_or(*ask.slice.start());
            pool_reply(&req, inv, &SERVER, &ask, ip)
        }
        _ => return,
    };
    // A boot file too long for BOOTP is refused by the encoder, not sent.
    let Ok(bytes) = encode(&reply, &req) else {
        return;
    };
    let msg = Message::decode(&mut Decoder::new(&bytes)).expect("an encoded reply decodes");
    assert_eq!(msg.xid(), req.xid);
    assert_eq!(msg.chaddr(), &req.chaddr.0);
}

/// The DHCPv6 server the DHCPv6 target answers as.
static SERVER6: LazyLock<Server6> = LazyLock::new(|| Server6 {
    ip: "fd00:66::1".parse().expect("an address"),
    duid: vec![0, 3, 0, 1, 0x02, 0, 0, 0, 0, 0x01],
});

/// An inventory with IPv6 reservations, one by MAC and one by UUID, and a
/// profile that boots every firmware class: DHCPv6 messages are decided
/// against it.
static EXAMPLE6: LazyLock<Inventory> = LazyLock::new(|| {
    Inventory::parse(
        Path::new("dhcp6.yaml"),
        r#"
subnets:
  - {cidr: 10.66.0.0/16, router: 10.66.0.1}
  - {cidr: "fd00:66::/64", dns: ["fd00:66::53"], domain: lab.example, ra: {}}
profiles:
  - name: all
    boot: {bios: undionly.kpxe, uefi: ipxe.efi, http: "http://{server}:8080/ipxe.efi"}
hosts:
  - {mac: "52:54:00:12:34:56", ip: 10.66.1.10, ipv6: "fd00:66::10", profile: all}
  - {mac: "52:54:00:12:34:57", ip: 10.66.1.11, ipv6: "fd00:66::11", profile: all,
     uuid: 8a5c2e6b-1e0f-4c1d-9b7a-0123456789ab}
"#,
    )
    .expect("the DHCPv6 example inventory is valid")
});

/// A DHCPv6 message (the UDP payload), from an EUI-64 link-local source
/// whose MAC is the first host's: parsed, decided, encoded. Properties: an
/// answer is one Relay-Reply per relay the message came through, each with
/// its relay's hop count, link and peer address, around an Advertise or
/// Reply that dhcproto decodes, carrying the message's transaction id, the
/// client's DUID and this server's. (The wrappers are read here, not by
/// dhcproto, which reads a Relay-Reply's inner message as another relay
/// message.)
pub fn dhcp6_request(data: &[u8]) {
    use dhcproto::v6;
    let Ok(req) = Request6::parse(data) else {
        return;
    };
    let source = "fe80::5054:ff:fe12:3456".parse().expect("an address");
    let reply = match decide6(&req, source, &EXAMPLE6, &SERVER6) {
        Answer6::Reply(reply)
        | Answer6::ReservationDeclined { reply, .. }
        | Answer6::PoolRelease(reply)
        | Answer6::PoolDecline { reply, .. } => reply,
        // The first address of the slice for every IA_NA, as a store
        // with the pool to itself gives it.
        Answer6::Pool(ask) => {
            let ia_na = req
                .ia_na
                .iter()
                .map(|ia| crate::dhcp::v6::decide::pool_lease(ia.iaid, *ask.slice.start(), 3600))
                .collect();
            Box::new(crate::dhcp::v6::pool_reply6(
                &req, source, &EXAMPLE6, &SERVER6, &ask, ia_na,
            ))
        }
        Answer6::Ignore(_) | Answer6::NotOurs => return,
    };
    let bytes = encode6(&reply, &req.relays);
    let mut inner = bytes.as_slice();
    for hop in &req.relays {
        let (header, options) = inner.split_at_checked(34).expect("a Relay-Reply header");
        assert_eq!(header[0], 13, "a Relay-Reply");
        assert_eq!(header[1], hop.hop_count);
        assert_eq!(header[2..18], hop.link_addr.octets());
        assert_eq!(header[18..34], hop.peer_addr.octets());
        inner = relay_message(options).expect("a Relay-Reply carries option 9");
    }
    let msg = v6::Message::decode(&mut Decoder::new(inner)).expect("an encoded reply decodes");
    assert!(matches!(
        msg.msg_type(),
        v6::MessageType::Advertise | v6::MessageType::Reply
    ));
    assert_eq!(msg.xid(), req.xid);
    assert_eq!(
        msg.opts().get(v6::OptionCode::ServerId),
        Some(&v6::DhcpOption::ServerId(SERVER6.duid.clone()))
    );
    if let Some(id) = &req.client_id {
        assert_eq!(
            msg.opts().get(v6::OptionCode::ClientId),
            Some(&v6::DhcpOption::ClientId(id.to_vec()))
        );
    }
}

/// The value of option 9 (the relayed message) among a relay message's
/// options.
fn relay_message(mut options: &[u8]) -> Option<&[u8]> {
    while let [c0, c1, l0, l1, rest @ ..] = options {
        let len = usize::from(u16::from_be_bytes([*l0, *l1]));
        let value = rest.get(..len)?;
        if u16::from_be_bytes([*c0, *c1]) == 9 {
            return Some(value);
        }
        options = &rest[len..];
    }
    None
}

/// A TFTP datagram. Properties: a request's file name is either refused or
/// becomes a relative path of normal components; negotiated values stay in
/// their RFC ranges and within the server's limits; the OACK parses back to
/// the options accepted, each of which the client asked for.
pub fn tftp_request(data: &[u8]) {
    // The first byte picks the server's limits, so both the defaults and
    // small maxima are exercised.
    let Some((&pick, datagram)) = data.split_first() else {
        return;
    };
    let limits = Limits {
        max_blksize: [1468, 512, 8, 65464][usize::from(pick & 3)],
        max_windowsize: [1, 8, 64, 65535][usize::from((pick >> 2) & 3)],
        timeout: std::time::Duration::from_secs(1),
    };
    let size = (pick & 0x10 != 0).then_some(u64::from(pick) << 20);
    let request = match packet::parse(datagram) {
        Ok(Packet::Rrq(r) | Packet::Wrq(r)) => r,
        _ => return,
    };
    if let Ok(path) = sanitize(request.filename) {
        assert!(request.filename.len() <= MAX_NAME);
        assert!(
            path.components().all(|c| matches!(c, Component::Normal(_))),
            "{path:?} is not beneath the root"
        );
    }
    let n = option::negotiate(&request.options, limits, size);
    assert!(
        n.blksize == DEFAULT_BLKSIZE
            || (BLKSIZE_RANGE.contains(&n.blksize) && n.blksize <= limits.max_blksize),
        "block size {} out of range",
        n.blksize
    );
    assert!(n.windowsize >= 1 && n.windowsize <= limits.max_windowsize.clamp(1, MAX_WINDOWSIZE));
    assert!(TIMEOUT_RANGE.contains(&n.timeout.as_secs()));
    let oack = packet::oack(&n.oack);
    let Ok(Packet::Oack { options }) = packet::parse(&oack) else {
        panic!("the OACK does not parse");
    };
    assert_eq!(options.len(), n.oack.len(), "an OACK value holds a NUL");
    for ((name, value), (sent_name, sent_value)) in options.iter().zip(&n.oack) {
        assert_eq!(*name, sent_name.as_bytes());
        assert_eq!(*value, sent_value.as_bytes());
        assert!(
            request
                .options
                .iter()
                .any(|(asked, _)| asked.eq_ignore_ascii_case(name)),
            "{sent_name} acknowledged but not asked for"
        );
    }
}

/// An inventory file's text. Properties: an inventory the loader accepts
/// is consistent (every host's address in its subnet, its MACs find it),
/// compiles into fast-path templates, and every host's firmware request of
/// each boot class is decided and encoded without a panic.
pub fn inventory(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(inv) = Inventory::parse(Path::new("fuzz.yaml"), text) else {
        return;
    };
    check_loaded(&inv);
}

fn check_loaded(inv: &Inventory) {
    for host in &inv.hosts {
        if let Some(ip) = host.ipv4() {
            assert!(
                inv.subnet_of(host).is_some_and(|s| s.contains(ip)),
                "{host:?}"
            );
        }
        for mac in host.ports() {
            assert_eq!(inv.host_by_mac(*mac).map(|h| h.mac), Some(host.mac));
        }
        inv.profile_of(host);
    }
    // Refusing an inventory the fast path cannot hold is an error, not a
    // panic.
    let _ = template::compile(inv, &SERVER);
    for host in inv.hosts.iter().take(8) {
        for class in BootClass::ALL {
            for ack in [None, host.ipv4()] {
                let req = Request::of_class(host.mac, class, ack);
                if let Answer::Reply(reply) = decide(&req, inv, &SERVER) {
                    let _ = encode(&reply, &req);
                }
            }
        }
    }
}

/// The lines the built-in iPXE template writes; any other line in a
/// rendered script was injected through a value.
const IPXE_LINES: &[&str] = &[
    "#!ipxe", "# ", "chain ", "echo ", "exit", "kernel ", "initrd ", "boot",
];

/// Fields of a profile and host, NUL-separated: hostname, kernel, initrd,
/// cmdline, chain, a label value and the token (the agent's own, so only
/// one of its form is used). They are put into an
/// inventory as YAML strings; when the loader accepts it, every host's
/// iPXE script and grub.cfg are rendered. Property: the script holds only
/// the template's own lines, whatever the values (a value cannot add an
/// iPXE command), and the grub.cfg only lines its renderer writes.
pub fn ipxe_script(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut fields = text.split('\0');
    let mut field = || fields.next().filter(|f| !f.is_empty());
    let (hostname, kernel, initrd, cmdline, chain, label, token) = (
        field(),
        field(),
        field(),
        field(),
        field(),
        field(),
        // Tokens are the agent's own: hex and `-` (`http::token`).
        field().filter(|t| t.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')),
    );
    let quote = |s: &str| serde_json::to_string(s).expect("a string serializes");
    let mut fields = String::new();
    for (key, value) in [("kernel", kernel), ("cmdline", cmdline), ("chain", chain)] {
        if let Some(value) = value {
            fields.push_str(&format!("    {key}: {}\n", quote(value)));
        }
    }
    if let Some(initrd) = initrd {
        fields.push_str(&format!("    initrd: [{}]\n", quote(initrd)));
    }
    let mut host = String::new();
    if let Some(hostname) = hostname {
        host.push_str(&format!("    hostname: {}\n", quote(hostname)));
    }
    if let Some(label) = label {
        host.push_str(&format!("    labels: {{rack: {}}}\n", quote(label)));
    }
    // The same values under an iPXE profile and under a grub one: each
    // inventory is accepted or refused on its own.
    for boot in [
        "boot: {bios: undionly.kpxe}",
        "boot: {uefi: shimx64.efi}\n    grub: {}",
    ] {
        let yaml = format!(
            "subnets:\n  - cidr: 10.66.0.0/16\nprofiles:\n  - name: p\n    {boot}\n{fields}\
             hosts:\n  - mac: \"52:54:00:12:34:56\"\n    ip: 10.66.1.10\n    profile: p\n{host}"
        );
        if let Ok(inv) = Inventory::parse(Path::new("fuzz.yaml"), &yaml) {
            render_all(&inv, token);
        }
    }
}

fn render_all(inv: &Inventory, token: Option<&str>) {
    for host in &inv.hosts {
        let target = Target {
            mac: host.mac,
            ip: host.ipv4().map_or_else(
                || {
                    host.ipv6()
                        .unwrap_or(std::net::Ipv6Addr::UNSPECIFIED)
                        .into()
                },
                Into::into,
            ),
            ipv4: host.ipv4(),
            ipv6: host.ipv6(),
            hostname: host.hostname.as_deref(),
            labels: &host.labels,
        };
        let profile = inv.profile_of(host);
        if profile.grub.is_some() {
            let cfg = grub::render(profile, &target, SERVER.ip, token);
            assert!(!cfg.contains('\r'), "carriage return in\n{cfg}");
            continue;
        }
        for profile in [profile.clone(), script::local_disk(profile)] {
            let rendered = script::render(&profile, &target, SERVER.ip, token)
                .expect("the built-in template renders");
            for line in rendered.lines() {
                assert!(
                    IPXE_LINES.iter().any(|l| line.starts_with(l)),
                    "injected line {line:?} in\n{rendered}"
                );
            }
        }
    }
}

/// A file size (8 bytes, little endian) and a `Range` header value.
/// Property: a range that is served lies inside the file.
pub fn http_range(data: &[u8]) {
    let Some((size, spec)) = data.split_first_chunk::<8>() else {
        return;
    };
    let size = u64::from_le_bytes(*size);
    let Ok(spec) = std::str::from_utf8(spec) else {
        return;
    };
    if let Some((start, end)) = parse_range(spec, size) {
        assert!(
            start <= end && end < size,
            "{spec:?} of {size}: {start}-{end}"
        );
    }
}

/// A BMC's answer: the first byte picks the decoder (each IPMI response
/// parser, a completion code, or the RMCP+ Open Session and RAKP 2
/// datagrams of the handshake diagnosis, split at the first 0xff 0xff),
/// the rest is the answer. Property: no decoder panics or reads past what
/// it checked, and a completion code maps back to its byte.
pub fn ipmi_response(data: &[u8]) {
    let Some((&pick, answer)) = data.split_first() else {
        return;
    };
    match pick % 7 {
        0 => {
            if let Ok(status) = GetChassisStatus::parse_success_response(answer) {
                status.power();
            }
        }
        1 => {
            if let Ok(flags) = GetBootFlags::parse_success_response(answer) {
                let round = BootFlags::decode(&flags.encode()).expect("five bytes decode");
                assert_eq!(round.selector, flags.selector);
                flags.device();
            }
        }
        2 => {
            if let Ok(level) = SetSessionPrivilege::parse_success_response(answer) {
                assert!(level <= 0x0f);
            }
        }
        3 => {
            if let Ok(id) = ipmi_rs::app::GetDeviceId::parse_success_response(answer) {
                bmc_info(&id);
            }
        }
        4 => {
            if let Some(&byte) = answer.first()
                && let Ok(cc) = CompletionErrorCode::try_from(byte)
            {
                assert_eq!(completion_code_byte(cc), byte);
            }
        }
        _ => {
            let split = answer
                .windows(2)
                .position(|w| w == [0xff, 0xff])
                .unwrap_or(answer.len());
            let (open, rakp2) = answer.split_at(split);
            let rakp2 = rakp2.get(2..).unwrap_or_default();
            for privilege in [0x04, 0x12] {
                decode_rakp_answers(open, rakp2, "viewer", b"pxe-sim-secret", privilege);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// `fuzz/<kind>/<target>/*` of every target.
    fn inputs(kind: &str) -> Vec<(&'static str, Entry, PathBuf)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz")
            .join(kind);
        let mut out = Vec::new();
        for &(name, run) in TARGETS {
            let Ok(dir) = std::fs::read_dir(root.join(name)) else {
                continue;
            };
            for entry in dir {
                let path = entry.expect("readable fuzz directory").path();
                out.push((name, run, path));
            }
        }
        out.sort_by(|a, b| a.2.cmp(&b.2));
        out
    }

    fn replay(kind: &str) -> usize {
        let inputs = inputs(kind);
        for (name, run, path) in &inputs {
            let data = std::fs::read(path).expect("readable fuzz input");
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(outcome.is_ok(), "{name}: {} fails again", path.display());
        }
        inputs.len()
    }

    /// Every input a fuzz run found a crash with, through the same entry
    /// point: each stays fixed.
    #[test]
    fn fuzz_regressions_stay_fixed() {
        replay("regressions");
    }

    /// The committed seeds hold for every target (and each target has some).
    #[test]
    fn fuzz_seed_corpora_pass() {
        for &(name, _) in TARGETS {
            assert!(
                inputs("corpus").iter().any(|(n, _, _)| *n == name),
                "no seeds for {name}"
            );
        }
        replay("corpus");
    }

    #[test]
    fn the_example_inventory_holds_its_properties() {
        check_loaded(&EXAMPLE);
    }
}

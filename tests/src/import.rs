//! `pxe-agent import` against the servers it imports from: a dnsmasq
//! configuration in Ironic's shape and a kea-dhcp4 configuration in the
//! shape of Kea's documentation, each with 1,000 reservations and PXE
//! classes. The original server answers one DISCOVER per reserved MAC (a mix
//! of BIOS, UEFI x64, ARM64 and iPXE firmware) in a lab; then the agent,
//! serving the imported inventory in the same lab, answers the same
//! DISCOVERs, and every MAC must get the same address, boot file and NTP
//! servers (option 42: subnet-wide, and a Kea reservation's own).

use std::{
    collections::BTreeMap,
    fs,
    net::Ipv4Addr,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use dhcproto::{
    Decodable as _, Decoder,
    v4::{DhcpOption, Message, MessageType, OptionCode},
};
use xtask::{ChildGuard, Lab};

use crate::{
    agent::{Scratch, Served, agent_bin},
    frame::{Req, parse_reply},
    raw::{RawSocket, in_netns, is_dhcp_reply},
};

const HOSTS: usize = 1000;

fn mac(i: usize) -> [u8; 6] {
    [0x52, 0x54, 0x00, 0x10, (i >> 8) as u8, i as u8]
}

fn mac_text(i: usize) -> String {
    mac(i)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 66, 1 + (i / 250) as u8, 1 + (i % 250) as u8)
}

/// The DISCOVER host `i` sends: BIOS, UEFI x64 (arch 7 and 9), ARM64 and
/// iPXE (on UEFI x64, with option 175 and user class `iPXE`) in turn.
fn discover(i: usize) -> Req {
    let mut req = match i % 5 {
        0 => Req::discover(mac(i)).pxe(0),
        1 => Req::discover(mac(i)).pxe(7),
        2 => Req::discover(mac(i)).pxe(9),
        3 => Req::discover(mac(i)).pxe(11),
        _ => {
            let mut r = Req::discover(mac(i)).pxe(7);
            r.user_class = Some(b"iPXE");
            r.opt175 = true;
            r
        }
    };
    req.broadcast = true;
    req.xid = 0x1000_0000 + i as u32;
    req
}

/// What an OFFER said: the address, the boot file from option 67 or,
/// without it, the BOOTP `file` field (servers differ in which they use),
/// and the NTP servers (option 42).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    yiaddr: Ipv4Addr,
    boot: Option<String>,
    ntp: Option<Vec<Ipv4Addr>>,
}

fn answer(msg: &Message) -> Answer {
    let from_option = match msg.opts().get(OptionCode::BootfileName) {
        Some(DhcpOption::BootfileName(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    };
    let from_field = msg
        .fname()
        .map(|f| {
            String::from_utf8_lossy(f)
                .trim_end_matches('\0')
                .to_string()
        })
        .filter(|f| !f.is_empty());
    Answer {
        yiaddr: msg.yiaddr(),
        boot: from_option
            .map(|f| f.trim_end_matches('\0').to_string())
            .or(from_field),
        ntp: match msg.opts().get(OptionCode::NtpServers) {
            Some(DhcpOption::NtpServers(servers)) => Some(servers.clone()),
            _ => None,
        },
    }
}

/// Sends every host's DISCOVER from the lab's client end and collects the
/// OFFERs by host; the ones still missing after a round are sent again, up
/// to three rounds.
fn offers(lab: &Lab) -> BTreeMap<usize, Answer> {
    let iface = lab.client_if().to_string();
    let rx = {
        let iface = iface.clone();
        in_netns(lab.client_ns(), move || RawSocket::open(&iface))
            .expect("netns")
            .expect("raw socket")
    };
    rx.set_recv_buffer(8 << 20).expect("receive buffer");
    let tx = in_netns(lab.client_ns(), move || RawSocket::send_only(&iface))
        .expect("netns")
        .expect("raw socket");
    let mut got = BTreeMap::new();
    for _round in 0..3 {
        let missing: Vec<usize> = (0..HOSTS).filter(|i| !got.contains_key(i)).collect();
        if missing.is_empty() {
            break;
        }
        let mut pending = missing.into_iter().peekable();
        let mut quiet_since = Instant::now();
        loop {
            // Paced: a burst of 20, then whatever came back.
            for _ in 0..20 {
                if let Some(i) = pending.next() {
                    tx.send(&discover(i).frame()).expect("send DISCOVER");
                    quiet_since = Instant::now();
                }
            }
            while let Some(f) = rx.recv(Duration::from_millis(2)).expect("recv") {
                if !is_dhcp_reply(&f) {
                    continue;
                }
                let Ok(msg) = Message::decode(&mut Decoder::new(&parse_reply(&f).payload)) else {
                    continue;
                };
                if msg.opts().msg_type() != Some(MessageType::Offer) {
                    continue;
                }
                let i = msg.xid().wrapping_sub(0x1000_0000) as usize;
                if i < HOSTS && msg.chaddr().get(..6) == Some(&mac(i)[..]) {
                    got.insert(i, answer(&msg));
                }
            }
            if pending.peek().is_none() && quiet_since.elapsed() > Duration::from_secs(2) {
                break;
            }
        }
    }
    got
}

/// `pxe-agent import ARGS` -> the inventory text; prints the report's size.
fn import(args: &[&str], dir: &Scratch) -> String {
    let out = dir.path("imported.yaml");
    let report = dir.path("report.txt");
    let status = Command::new(agent_bin())
        .arg("import")
        .args(args)
        .arg("--output")
        .arg(&out)
        .arg("--report")
        .arg(&report)
        .status()
        .expect("run pxe-agent import");
    assert!(status.success(), "pxe-agent import {args:?} failed");
    let report = fs::read_to_string(&report).expect("report");
    eprintln!(
        "import {args:?}: {} report lines:\n{report}",
        report.lines().count()
    );
    fs::read_to_string(&out).expect("imported inventory")
}

/// Waits until `pid`'s server answers: polls the first host until an OFFER
/// comes (servers take a moment to open their sockets).
fn wait_answering(lab: &Lab, server: &mut ChildGuard, name: &str) {
    let iface = lab.client_if().to_string();
    let sock = in_netns(lab.client_ns(), move || RawSocket::open(&iface))
        .expect("netns")
        .expect("raw socket");
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Some(status) = server.try_wait().expect("poll server") {
            panic!("{name} exited early: {status}");
        }
        let mut probe = discover(0);
        probe.xid = 0x0f00_0000;
        sock.send(&probe.frame()).expect("send");
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            if let Some(f) = sock.recv(Duration::from_millis(50)).expect("recv")
                && is_dhcp_reply(&f)
            {
                return;
            }
        }
    }
    panic!("{name} did not answer within 15 s");
}

/// Runs `start` (the original server) in the lab of a fresh agent before the
/// agent starts, collects its OFFERs and stops it; then collects the
/// agent's for the imported inventory and compares them host by host.
fn compare(name: &str, inventory: &str, start: impl FnOnce(&Lab) -> ChildGuard) -> (usize, usize) {
    let mut original = BTreeMap::new();
    let served = Served::start_prepared(name, inventory, &[], None, |lab| {
        let mut server = start(lab);
        wait_answering(lab, &mut server, name);
        let started = Instant::now();
        original = offers(lab);
        eprintln!(
            "{name}: {} of {HOSTS} OFFERs from the original server in {:.1} s",
            original.len(),
            started.elapsed().as_secs_f64()
        );
        server.stop().expect("stop the original server");
    });
    let started = Instant::now();
    let agent = offers(&served.lab);
    eprintln!(
        "{name}: {} of {HOSTS} OFFERs from pxe-agent in {:.1} s",
        agent.len(),
        started.elapsed().as_secs_f64()
    );
    let mut matched = 0;
    let mut differ = Vec::new();
    for i in 0..HOSTS {
        let (a, b) = (original.get(&i), agent.get(&i));
        if a.is_some() && a == b {
            matched += 1;
        } else if differ.len() < 10 {
            differ.push(format!(
                "{} ({:?}): original {a:?}, agent {b:?}",
                mac_text(i),
                discover(i).arch
            ));
        }
    }
    eprintln!(
        "{name}: {matched} of {HOSTS} reserved MACs got the same address, boot file and NTP servers"
    );
    assert_eq!(
        original.len(),
        HOSTS,
        "the original server did not answer every host"
    );
    // Both configurations send option 42 to every host: a match is a
    // carried option, not two answers without one.
    assert!(
        original.values().all(|a| a.ntp.is_some()),
        "the original server sent some host no NTP servers"
    );
    assert_eq!(
        matched,
        HOSTS,
        "answers differ, first ones:\n{}",
        differ.join("\n")
    );
    (original.len(), matched)
}

/// An Ironic-shaped dnsmasq configuration (provisioning network without a
/// router, iPXE detected by option 175, UEFI by option 93) with the hosts in
/// a `--dhcp-hostsfile`; a rack whose UEFI machines get another loader
/// through a host tag.
fn dnsmasq_files(dir: &Path) -> (String, String) {
    let hosts = dir.join("dnsmasq.hosts");
    let conf = format!(
        "\
# Disable listening for DNS
port=0
log-dhcp
dhcp-range=10.66.200.1,10.66.200.250,255.255.0.0,1h
# Disable default router(s) and DNS over provisioning network
dhcp-option=3
dhcp-option=6
# NTP for everyone, whether they ask for it or not
dhcp-option-force=option:ntp-server,10.66.0.4,10.66.0.5
dhcp-hostsfile={hosts}
dhcp-match=set:ipxe,175 # iPXE sends a 175 option.
dhcp-match=set:efi,option:client-arch,7
dhcp-match=set:efi,option:client-arch,9
dhcp-match=set:arm64,option:client-arch,11
dhcp-userclass=set:ipxe,iPXE
# Client is PXE booting over EFI without iPXE ROM; send EFI version of iPXE chainloader
dhcp-boot=tag:efi,tag:!ipxe,snponly.efi
dhcp-boot=tag:arm64,tag:!ipxe,ipxe-arm64.efi
# Client is running PXE over BIOS; send BIOS version of iPXE chainloader
dhcp-boot=tag:!efi,tag:!arm64,tag:!ipxe,undionly.kpxe,localhost.localdomain,10.66.0.1
# Client is running iPXE; move to next stage of chainloading
dhcp-boot=tag:ipxe,http://10.66.0.1:8088/boot.ipxe
# Rack 2's NICs want iPXE's own driver
dhcp-boot=tag:rack2,tag:efi,tag:!ipxe,ipxe.efi
",
        hosts = hosts.display()
    );
    let mut lines = String::new();
    for i in 0..HOSTS {
        let tag = if i % 7 == 0 { "set:rack2," } else { "" };
        let lease = if i % 3 == 0 { ",infinite" } else { "" };
        lines.push_str(&format!("{},{tag}{},node-{i}{lease}\n", mac_text(i), ip(i)));
    }
    fs::write(&hosts, lines).expect("write hosts file");
    let conf_path = dir.join("dnsmasq.conf");
    fs::write(&conf_path, &conf).expect("write dnsmasq.conf");
    (conf_path.display().to_string(), hosts.display().to_string())
}

#[test]
fn dnsmasq_import_answers_every_reserved_mac_as_dnsmasq_did() {
    crate::fixture::assert_root();
    let dir = Scratch::new("import-dnsmasq");
    let (conf, _hosts) = dnsmasq_files(&dir.0);
    let inventory = import(&["dnsmasq", &conf], &dir);
    let state = dir.path("dnsmasq");
    fs::create_dir_all(&state).expect("state dir");
    let (answered, matched) = compare("pximpd", &inventory, |lab| {
        ChildGuard::spawn(
            lab.cmd_in(lab.server_ns(), "dnsmasq")
                .arg("--no-daemon")
                .arg(format!("--conf-file={conf}"))
                .arg(format!("--interface={}", lab.server_if()))
                .args(["--bind-interfaces", "--no-ping", "--dhcp-authoritative"])
                .arg(format!(
                    "--dhcp-leasefile={}",
                    state.join("leases").display()
                ))
                .arg(format!("--pid-file={}", state.join("pid").display()))
                .arg(format!("--log-facility={}", state.join("log").display()))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null()),
        )
        .expect("spawn dnsmasq")
    });
    assert_eq!((answered, matched), (HOSTS, HOSTS));
}

/// A kea-dhcp4 configuration with the PXE classes of Kea's documentation
/// (option 93 for the architecture, option 77 for iPXE), a subnet default
/// boot file and reservations of which some carry their own.
fn kea_file(dir: &Path, iface: &str) -> String {
    let mut reservations = Vec::new();
    for i in 0..HOSTS {
        // A reservation's own boot file, for hosts that do not ask as iPXE:
        // Kea would send an iPXE client that TFTP file too, which the agent
        // cannot (it chains iPXE to a URL; the import reports such hosts).
        let mut extra = if i % 11 == 0 && i % 5 != 4 {
            r#", "boot-file-name": "special.efi""#.to_owned()
        } else {
            String::new()
        };
        // A reservation's own NTP server, over the subnet's.
        if i % 13 == 0 {
            extra.push_str(
                r#", "option-data": [ { "name": "ntp-servers", "data": "10.66.0.9", "always-send": true } ]"#,
            );
        }
        reservations.push(format!(
            r#"        {{ "hw-address": "{}", "ip-address": "{}", "hostname": "node-{i}"{extra} }}"#,
            mac_text(i),
            ip(i)
        ));
    }
    let conf = format!(
        r#"// kea-dhcp4 for the provisioning network
{{
  "Dhcp4": {{
    "interfaces-config": {{ "interfaces": ["{iface}"], "dhcp-socket-type": "raw" }},
    "lease-database": {{ "type": "memfile", "persist": false, "lfc-interval": 0 }},
    "valid-lifetime": 3600,
    /* iPXE first: it also sends option 93 */
    "client-classes": [
      {{ "name": "ipxe", "test": "option[77].hex == 'iPXE'",
         "boot-file-name": "http://10.66.0.1:8080/boot.ipxe" }},
      {{ "name": "legacy", "test": "substring(option[60].hex,0,9) == 'PXEClient' and option[93].hex == 0x0000",
         "boot-file-name": "undionly.kpxe" }},
      {{ "name": "uefi", "test": "option[93].hex == 0x0007 or option[93].hex == 0x0009",
         "boot-file-name": "ipxe.efi" }},
      {{ "name": "arm64", "test": "option[93].hex == 0x000b",
         "boot-file-name": "ipxe-arm64.efi" }}
    ],
    "subnet4": [{{
      "id": 1,
      "subnet": "10.66.0.0/16",
      "pools": [ {{ "pool": "10.66.200.1 - 10.66.200.250" }} ],
      "option-data": [ {{ "name": "routers", "data": "10.66.0.254" }},
                       {{ "name": "ntp-servers", "data": "10.66.0.4, 10.66.0.5", "always-send": true }} ],
      "boot-file-name": "pxelinux.0", # for anything else
      "reservations": [
{reservations}
      ]
    }}],
    "loggers": [{{ "name": "kea-dhcp4", "output_options": [{{ "output": "{log}" }}], "severity": "WARN" }}]
  }}
}}
"#,
        reservations = reservations.join(",\n"),
        log = dir.join("kea.log").display()
    );
    let path = dir.join("kea-dhcp4.conf");
    fs::write(&path, conf).expect("write kea config");
    path.display().to_string()
}

#[test]
fn kea_import_answers_every_reserved_mac_as_kea_did() {
    crate::fixture::assert_root();
    let dir = Scratch::new("import-kea");
    let conf = kea_file(&dir.0, xtask::lab::SERVER_IF);
    let inventory = import(&["kea", &conf], &dir);
    let state = dir.path("kea");
    fs::create_dir_all(&state).expect("state dir");
    let (answered, matched) = compare("pximpk", &inventory, |lab| {
        assert_eq!(lab.server_if(), xtask::lab::SERVER_IF);
        ChildGuard::spawn(
            lab.cmd_in(lab.server_ns(), "kea-dhcp4")
                .env("KEA_PIDFILE_DIR", &state)
                .env("KEA_LOCKFILE_DIR", &state)
                .args(["-c", &conf])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null()),
        )
        .expect("spawn kea-dhcp4")
    });
    assert_eq!((answered, matched), (HOSTS, HOSTS));
}

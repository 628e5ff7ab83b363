//! proxyDHCP under QEMU: dnsmasq leases the addresses, the agent (subnet
//! `mode: proxy`) gives PXE firmware its boot information only, and real
//! firmware boots the whole chain through the agent's boot files.
//!
//! The lab is a bridge with the guests' tap, the agent on the bridge, and a
//! namespace on the same segment where dnsmasq (10.66.0.2) is the address
//! server: reservations for the inventory's hosts, a small range for
//! anything else, no boot information at all. A boot passes when the guest
//! leased its reserved address from dnsmasq (its lease file says so), its
//! console shows the chain through the agent's files and script, and it
//! phoned home. A plain DHCP client on the segment must hear exactly one
//! server: dnsmasq.

use std::{
    collections::BTreeMap,
    fs,
    time::{Duration, Instant},
};

use xtask::vm::{BootLab, BootLabConfig, Firmware, SERVER_IP, initramfs::PROFILE_CMDLINE};

use crate::{agent::agent_bin, fixture::assert_root};

/// One boot takes 8–25 s under TCG; iPXE waits a few seconds more for
/// proxy offers, and the machine is shared.
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

const DNSMASQ_CIDR: &str = "10.66.0.2/16";
const DNSMASQ_IP: &str = "10.66.0.2";
const BIOS_MAC: &str = "52:54:00:12:34:56";
const BIOS_IP: &str = "10.66.1.10";
const UEFI_MAC: &str = "52:54:00:12:34:58";
const UEFI_IP: &str = "10.66.1.12";
/// The plain client on the segment, in no inventory.
const PLAIN_MAC: &str = "02:00:00:00:77:01";

const INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    mode: proxy
profiles:
  - name: worker
    boot:
      bios: undionly.kpxe
      uefi: ipxe.efi
    kernel: "http://{server}:8080/artifacts/vmlinuz"
    initrd: ["http://{server}:8080/artifacts/initrd.img"]
    cmdline: "@CMDLINE@"
hosts:
  - {mac: "52:54:00:12:34:56", ip: 10.66.1.10, hostname: node-bios, profile: worker}
  - {mac: "52:54:00:12:34:58", ip: 10.66.1.12, hostname: node-uefi, profile: worker}
"#;

/// A boot lab whose addresses come from dnsmasq, with the agent in proxy
/// mode on the same bridge.
struct ProxyLab {
    lab: BootLab,
}

impl ProxyLab {
    fn start(prefix: &str) -> ProxyLab {
        assert_root();
        let inventory = INVENTORY.replace("@CMDLINE@", PROFILE_CMDLINE);
        let cfg = BootLabConfig::new(prefix, &agent_bin(), &inventory).bridge(1);
        let mut lab = BootLab::start(&cfg).unwrap_or_else(|e| panic!("boot lab {prefix}: {e:#}"));
        let ns = lab
            .add_segment_ns("dhcp", Some(DNSMASQ_CIDR))
            .expect("namespace for dnsmasq");
        let dir = lab.dir().to_str().expect("utf-8 path").to_owned();
        // DHCP only (--port=0), the hosts' reservations and a small range,
        // nothing about booting: no dhcp-boot, no pxe-service.
        let args = [
            "dnsmasq".to_owned(),
            "-k".to_owned(),
            "--conf-file=/dev/null".to_owned(),
            "--port=0".to_owned(),
            "--interface=pxcli0".to_owned(),
            "--bind-interfaces".to_owned(),
            "--user=root".to_owned(),
            "--dhcp-range=10.66.100.10,10.66.100.50,255.255.0.0,1h".to_owned(),
            format!("--dhcp-host={BIOS_MAC},{BIOS_IP}"),
            format!("--dhcp-host={UEFI_MAC},{UEFI_IP}"),
            format!("--dhcp-leasefile={dir}/dnsmasq.leases"),
            format!("--pid-file={dir}/dnsmasq.pid"),
            "--dhcp-authoritative".to_owned(),
            "--no-ping".to_owned(),
            "--log-dhcp".to_owned(),
            "--log-facility=-".to_owned(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        lab.spawn_helper_in(&ns, "dnsmasq", &args)
            .expect("start dnsmasq");
        // The segment's DHCP as dnsmasq's port sees it, for a failure's report.
        lab.spawn_helper_in(
            &ns,
            "capture",
            &[
                "tcpdump",
                "-n",
                "-l",
                "-v",
                "-i",
                "pxcli0",
                "udp port 67 or udp port 68 or udp port 4011",
            ],
        )
        .expect("start tcpdump");
        ProxyLab { lab }
    }

    fn dnsmasq_leases(&self) -> String {
        fs::read_to_string(self.lab.dir().join("dnsmasq.leases")).unwrap_or_default()
    }

    fn context(&self, vm: &xtask::vm::Vm) -> String {
        format!(
            "--- console (last 60 lines) ---\n{}\n--- agent log (last 40 lines) ---\n{}\n\
             --- dnsmasq (last 40 lines) ---\n{}\n--- DHCP on the segment (last 150 lines) ---\n{}\n\
             --- agent counters ---\n{:?}",
            vm.console_tail(60),
            self.lab.agent_log_tail(40),
            tail(&self.lab.helper_log("dnsmasq"), 40),
            tail(&self.lab.helper_log("capture"), 150),
            stats(&self.lab),
        )
    }

    /// Boots `mac` with `firmware` to the phone-home and checks the chain.
    fn boot(&self, name: &str, mac: &str, ip: &str, firmware: Firmware, firmware_steps: &[&str]) {
        let spec = self.lab.vm_spec(name, mac, firmware, 0);
        let mut vm = self
            .lab
            .start_vm(&spec)
            .unwrap_or_else(|e| panic!("start {name}: {e:#}"));
        let report = vm
            .wait(BOOT_TIMEOUT, &mut |_| {})
            .unwrap_or_else(|e| panic!("follow {name}: {e:#}"));
        eprintln!("{}", report.summary());
        assert!(
            report.phoned_home,
            "the guest did not phone home\n{}",
            self.context(&vm)
        );
        assert_eq!(
            report.ip.as_deref(),
            Some(ip),
            "wrong address\n{}",
            self.context(&vm)
        );
        let leases = self.dnsmasq_leases();
        assert!(
            leases
                .lines()
                .any(|l| l.contains(mac) && l.contains(&format!(" {ip} "))),
            "dnsmasq's lease file has no lease of {ip} for {mac}:\n{leases}"
        );
        let mut steps: Vec<String> = firmware_steps.iter().map(|s| (*s).to_owned()).collect();
        steps.extend([
            format!("http://{SERVER_IP}:8080/boot/{mac}.ipxe"),
            format!("http://{SERVER_IP}:8080/artifacts/vmlinuz"),
            format!("http://{SERVER_IP}:8080/artifacts/initrd.img"),
            format!("PXE-AGENT-BOOTED {mac} {ip}"),
            format!("PXE-AGENT-PHONED-HOME {mac} ok"),
        ]);
        let console = vm.console_tail(usize::MAX);
        let mut at = 0;
        for step in &steps {
            match console[at..].find(step.as_str()) {
                Some(found) => at += found + step.len(),
                None => panic!(
                    "console lacks {step:?} (after the steps before it: {steps:?})\n{}",
                    self.context(&vm)
                ),
            }
        }
        crate::boot_vm::assert_host_booted(&self.lab, mac);
        // The agent answered as a proxy only: never an address.
        let stats = stats(&self.lab);
        let get = |k: &str| stats.get(k).copied().unwrap_or(0);
        eprintln!(
            "proxy answers: {} offers from the slow path, {} from XDP, {} ACKs on port 4011",
            get("pxe_slow_replies_total{type=\"proxy_offer\"}"),
            get("pxe_xdp_packets_total{outcome=\"tx_proxy_offer\"}"),
            get("pxe_slow_replies_total{type=\"proxy_ack\"}"),
        );
        assert!(
            get("pxe_slow_replies_total{type=\"proxy_offer\"}")
                + get("pxe_xdp_packets_total{outcome=\"tx_proxy_offer\"}")
                >= 1,
            "{stats:?}"
        );
        assert!(
            get("pxe_slow_ignored_total{reason=\"ignore_not_pxe\"}") >= 1,
            "the guest's own DHCP was not ignored: {stats:?}"
        );
        for address_reply in [
            "pxe_slow_replies_total{type=\"offer\"}",
            "pxe_slow_replies_total{type=\"ack\"}",
            "pxe_xdp_packets_total{outcome=\"tx_offer\"}",
            "pxe_xdp_packets_total{outcome=\"tx_ack\"}",
        ] {
            assert_eq!(get(address_reply), 0, "{address_reply}: {stats:?}");
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The agent's counters by sample name.
fn stats(lab: &BootLab) -> BTreeMap<String, u64> {
    lab.cli(&["stats"])
        .unwrap_or_else(|e| panic!("pxe-agent stats: {e:#}"))
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            Some((parts.next()?.to_owned(), parts.next()?.parse().ok()?))
        })
        .collect()
}

/// SeaBIOS with the NIC's iPXE ROM: iPXE takes its address from dnsmasq's
/// offer and its script URL from the agent's proxy offer (which names a
/// next server and a boot file, so iPXE needs no ProxyDHCPREQUEST).
#[test]
fn proxy_bios_ipxe_rom_boots_with_the_address_from_dnsmasq() {
    let lab = ProxyLab::start("pxproxbios");
    lab.boot("pbios", BIOS_MAC, BIOS_IP, Firmware::Bios, &["iPXE"]);
}

/// OVMF's PXE: the address from dnsmasq, ipxe.efi named by the agent's
/// proxy offer and fetched over TFTP, then iPXE as above.
#[test]
fn proxy_uefi_pxe_boots_with_the_address_from_dnsmasq() {
    let lab = ProxyLab::start("pxproxuefi");
    lab.boot(
        "puefi",
        UEFI_MAC,
        UEFI_IP,
        Firmware::UefiPxe,
        &[
            ">>Start PXE over IPv4",
            &format!("Station IP address is {UEFI_IP}"),
            "NBP filename is ipxe.efi",
            "NBP file downloaded successfully",
            "iPXE",
        ],
    );
}

/// A plain DHCP client on the proxy segment: dnsmasq answers it, once per
/// request, and the agent never does.
#[test]
fn proxy_plain_client_hears_only_the_address_server() {
    let mut lab = ProxyLab::start("pxproxplain");
    let ns = lab
        .lab
        .add_segment_ns("plain", None)
        .expect("namespace for the client");
    xtask::process::run(
        std::process::Command::new("ip")
            .args([
                "netns", "exec", &ns, "ip", "link", "set", "pxcli0", "address",
            ])
            .arg(PLAIN_MAC),
    )
    .expect("set the client's MAC");
    // Every reply to the client's port, from whichever server.
    lab.lab
        .spawn_helper_in(
            &ns,
            "tcpdump",
            &["tcpdump", "-n", "-l", "-i", "pxcli0", "udp dst port 68"],
        )
        .expect("start tcpdump");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lab.lab.helper_log("tcpdump").contains("listening on") {
        assert!(Instant::now() < deadline, "tcpdump does not capture");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &ns, "busybox", "udhcpc", "-f", "-q", "-n"])
        .args(["-t", "5", "-T", "2", "-i", "pxcli0", "-s", "/bin/true"])
        .output()
        .expect("run udhcpc");
    assert!(
        out.status.success(),
        "udhcpc got no lease: {}{}\ndnsmasq:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        lab.lab.helper_log("dnsmasq")
    );
    // Time for a late answer from anyone.
    std::thread::sleep(Duration::from_secs(2));
    let capture = lab.lab.helper_log("tcpdump");
    let replies: Vec<&str> = capture
        .lines()
        .filter(|l| l.contains("BOOTP/DHCP, Reply"))
        .collect();
    let from = |ip: &str| {
        replies
            .iter()
            .filter(|l| l.contains(&format!("IP {ip}.67 >")))
            .count()
    };
    // DISCOVER and REQUEST: one OFFER and one ACK, both dnsmasq's.
    assert_eq!(from(DNSMASQ_IP), 2, "replies:\n{capture}");
    assert_eq!(replies.len(), 2, "replies:\n{capture}");
    assert_eq!(from(SERVER_IP), 0, "the agent answered:\n{capture}");
    let leases = lab.dnsmasq_leases();
    assert!(
        leases.contains(PLAIN_MAC) && leases.contains(" 10.66.100."),
        "no dnsmasq lease for the client:\n{leases}"
    );
    let stats = stats(&lab.lab);
    assert!(
        stats
            .get("pxe_slow_ignored_total{reason=\"ignore_not_pxe\"}")
            .copied()
            .unwrap_or(0)
            >= 2,
        "the agent did not count the client's DISCOVER and REQUEST: {stats:?}"
    );
}

/// The fast path and port 4011 in proxy mode, on crafted requests: the XDP
/// program in the kernel (`BPF_PROG_TEST_RUN`) against the slow path's
/// policy and encoding, and the agent's boot server port on a veth pair.
mod frames {
    use std::net::Ipv4Addr;

    use dhcproto::{
        Decodable as _, Decoder,
        v4::{DhcpOption, Message, MessageType, OptionCode},
    };
    use pxe_agent::dhcp::{Answer, Decision, Request, decide, encode, fast_path};
    use pxe_ebpf_common::Counter;

    use crate::{
        agent::Served,
        fixture::{Fixture, XDP_DROP, XDP_PASS, XDP_TX},
        frame::{Req, SERVER_IP, parse_reply},
    };

    const INVENTORY: &str = r#"
subnets:
  - {cidr: 10.66.0.0/16, mode: proxy}
profiles:
  - name: worker
    boot: {bios: undionly.kpxe, uefi: ipxe.efi}
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, hostname: node-1, profile: worker}
"#;
    const WORKER: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
    const NODE1: Ipv4Addr = Ipv4Addr::new(10, 66, 1, 10);
    const ADDRESS_SERVER: Ipv4Addr = Ipv4Addr::new(10, 66, 0, 2);

    /// Runs `req` through the kernel: the action and the one counter moved.
    fn run(fx: &Fixture, req: &Req) -> (u32, Counter, Vec<u8>) {
        let before = fx.stats();
        let (action, out) = fx.run(&req.frame());
        let after = fx.stats();
        let moved: Vec<Counter> = Counter::ALL
            .iter()
            .copied()
            .filter(|c| *c != Counter::Rx && after.get(*c) != before.get(*c))
            .collect();
        let [counter] = moved[..] else {
            panic!("counters moved: {moved:?}")
        };
        (action, counter, out)
    }

    /// The kernel passes or drops `req` under `counter`, as the policy's
    /// projection says, and the slow path does not answer it either.
    fn expect_unanswered(fx: &Fixture, req: &Req, action: u32, counter: Counter, slow: Counter) {
        let (got, moved, _) = run(fx, req);
        assert_eq!((got, moved), (action, counter), "{req:?}");
        let parsed = Request::parse(&req.payload()).expect("parses");
        let projection = if action == XDP_DROP {
            Decision::Drop(counter)
        } else {
            Decision::Pass(counter)
        };
        assert_eq!(fast_path(&parsed, &fx.inv, &fx.server), projection);
        assert_eq!(decide(&parsed, &fx.inv, &fx.server), Answer::Ignore(slow));
    }

    #[test]
    fn proxy_xdp_answers_a_known_pxe_discover_with_the_broadcast_proxy_offer() {
        let fx = Fixture::with_inventory(INVENTORY);
        for (arch, file) in [(0, "undionly.kpxe"), (7, "ipxe.efi")] {
            let req = Req::discover(WORKER).pxe(arch);
            let (action, counter, out) = run(&fx, &req);
            assert_eq!((action, counter), (XDP_TX, Counter::TxProxyOffer));
            let reply = parse_reply(&out);
            assert!(reply.ip_csum_ok && reply.udp_csum_ok);
            // No address to unicast to: broadcast.
            assert_eq!(reply.eth_dst, [0xff; 6]);
            assert_eq!(reply.ip_dst, Ipv4Addr::BROADCAST);
            let parsed = Request::parse(&req.payload()).expect("parses");
            let Answer::Reply(slow) = decide(&parsed, &fx.inv, &fx.server) else {
                panic!("the slow path does not answer what XDP answered")
            };
            assert_eq!(reply.payload, encode(&slow, &parsed).expect("encodes"));
            let msg = Message::decode(&mut Decoder::new(&reply.payload)).expect("decodes");
            assert_eq!(msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
            assert_eq!(msg.siaddr(), SERVER_IP);
            let fname = msg.fname().expect("file");
            assert!(fname.starts_with(file.as_bytes()), "{fname:?}");
            let opts = msg.opts();
            assert_eq!(
                opts.get(OptionCode::MessageType),
                Some(&DhcpOption::MessageType(MessageType::Offer))
            );
            assert_eq!(
                opts.get(OptionCode::ClassIdentifier),
                Some(&DhcpOption::ClassIdentifier(b"PXEClient".to_vec()))
            );
            assert!(opts.get(OptionCode::AddressLeaseTime).is_none());
            assert!(opts.get(OptionCode::SubnetMask).is_none());
        }
    }

    #[test]
    fn proxy_xdp_leaves_plain_clients_requests_and_option_97_alone() {
        let fx = Fixture::with_inventory(INVENTORY);
        // udhcpc of a known host: no template, and the slow path ignores it.
        let mut plain = Req::discover(WORKER);
        plain.vendor = Some(b"udhcp 1.36.1");
        expect_unanswered(
            &fx,
            &plain,
            XDP_PASS,
            Counter::PassUnknownHost,
            Counter::IgnoreNotPxe,
        );
        // The client completing its lease with the address server.
        let mut selecting = Req::discover(WORKER).pxe(0).request();
        selecting.server_id = Some(ADDRESS_SERVER);
        selecting.requested_ip = Some(NODE1);
        expect_unanswered(
            &fx,
            &selecting,
            XDP_DROP,
            Counter::DropOtherServer,
            Counter::DropOtherServer,
        );
        // INIT-REBOOT for its address: the address server's to answer.
        let mut rebooting = Req::discover(WORKER).pxe(0).request();
        rebooting.requested_ip = Some(NODE1);
        expect_unanswered(
            &fx,
            &rebooting,
            XDP_PASS,
            Counter::PassRequestMismatch,
            Counter::PassRequestMismatch,
        );
        // Option 97 is echoed: the slow path answers.
        let mut uuid = Req::discover(WORKER).pxe(7);
        uuid.extra.push((97, vec![0; 17]));
        let (action, counter, _) = run(&fx, &uuid);
        assert_eq!((action, counter), (XDP_PASS, Counter::PassClientUuid));
        let parsed = Request::parse(&uuid.payload()).expect("parses");
        assert_eq!(
            fast_path(&parsed, &fx.inv, &fx.server),
            Decision::Pass(Counter::PassClientUuid)
        );
        let Answer::Reply(slow) = decide(&parsed, &fx.inv, &fx.server) else {
            panic!("the slow path does not answer option 97")
        };
        assert!(slow.is_proxy());
    }

    /// A proxyDHCP client's follow-up on UDP 4011, unicast from the address
    /// it leased elsewhere: the agent's boot server port answers it with
    /// the ACK, to the port it came from; a REQUEST there for another
    /// server and a plain client's are not answered.
    #[test]
    fn proxy_port_4011_acks_the_follow_up_request() {
        let served = Served::start("pxprox4011", INVENTORY);
        served.add_client_address("10.66.1.10/16");
        let ask = |req: &Req| -> Option<Vec<u8>> {
            let payload: String = req.payload().iter().map(|b| format!("{b:02x}")).collect();
            // One datagram from 10.66.1.10:68 to the agent's port 4011; the
            // answer (or nothing within 2 s) on stdout as hex.
            let script = format!(
                "import socket,sys\n\
                 s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
                 s.bind(('10.66.1.10',68))\n\
                 s.settimeout(2)\n\
                 s.sendto(bytes.fromhex('{payload}'),('{SERVER_IP}',4011))\n\
                 try:\n    d,a=s.recvfrom(2000)\n    print(a[0],a[1],d.hex())\n\
                 except socket.timeout:\n    print('none')\n"
            );
            let out = served
                .client_cmd("python3")
                .args(["-c", &script])
                .output()
                .expect("run python3");
            let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            assert!(
                out.status.success(),
                "python3: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            if text == "none" {
                return None;
            }
            let mut parts = text.split_whitespace();
            assert_eq!(parts.next(), Some("10.66.0.1"), "{text}");
            assert_eq!(
                parts.next(),
                Some("4011"),
                "answered from another port: {text}"
            );
            let hex = parts.next().expect("payload");
            Some(
                (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                    .collect(),
            )
        };
        let mut follow_up = Req::discover(WORKER).pxe(7).request();
        follow_up.ciaddr = NODE1;
        follow_up.server_id = Some(SERVER_IP);
        let ack = ask(&follow_up).expect("no answer on port 4011");
        let msg = Message::decode(&mut Decoder::new(&ack)).expect("decodes");
        assert_eq!(msg.xid(), follow_up.xid);
        assert_eq!(msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
        assert_eq!(msg.ciaddr(), NODE1);
        assert_eq!(
            msg.opts().get(OptionCode::MessageType),
            Some(&DhcpOption::MessageType(MessageType::Ack))
        );
        assert_eq!(
            msg.opts().get(OptionCode::ClassIdentifier),
            Some(&DhcpOption::ClassIdentifier(b"PXEClient".to_vec()))
        );
        assert!(msg.fname().expect("file").starts_with(b"ipxe.efi"));
        // The same bytes the one policy and encoder give.
        let mut parsed = Request::parse(&follow_up.payload()).expect("parses");
        parsed.boot_server = true;
        let Answer::Reply(reply) = decide(&parsed, &served_inventory(), &served_server()) else {
            panic!("decide does not answer the follow-up")
        };
        assert_eq!(
            ack,
            encode(&reply, &parsed).expect("encodes"),
            "port 4011 answered other bytes than decide and encode give"
        );

        let mut other = follow_up.clone();
        other.server_id = Some(ADDRESS_SERVER);
        assert_eq!(ask(&other), None, "answered a request for another server");
        let mut plain = follow_up.clone();
        plain.vendor = Some(b"udhcp 1.36.1");
        plain.arch = None;
        assert_eq!(ask(&plain), None, "answered a plain client");
        let stats = served.stats();
        let get = |k: &str| stats.get(k).copied().unwrap_or(0);
        assert_eq!(get("pxe_slow_replies_total{type=\"proxy_ack\"}"), 1);
        assert_eq!(get("pxe_slow_ignored_total{reason=\"ignore_not_pxe\"}"), 1);
        assert_eq!(
            get("pxe_slow_ignored_total{reason=\"drop_other_server\"}"),
            1
        );
    }

    fn served_inventory() -> pxe_agent::inventory::Inventory {
        pxe_agent::inventory::Inventory::parse(std::path::Path::new("t.yaml"), INVENTORY)
            .expect("valid")
    }

    /// The server as the agent on the lab's veth names itself; only its
    /// address is in a reply's payload.
    fn served_server() -> pxe_agent::dhcp::Server {
        pxe_agent::dhcp::Server {
            ip: SERVER_IP,
            mac: [0; 6],
        }
    }
}

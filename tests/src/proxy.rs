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

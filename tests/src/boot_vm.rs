//! The whole boot chain with real firmware under QEMU (TCG): SeaBIOS with
//! the NIC's iPXE ROM, OVMF's PXE and OVMF's HTTP boot, each network-booting
//! a Debian kernel and a busybox initramfs from the agent (see `xtask::vm`).
//!
//! A boot passes only if the guest leased its address from the agent, said
//! so on its serial console (`PXE-AGENT-BOOTED <mac>`) and phoned home
//! (`POST /api/v1/hosts/<mac>/booted`, acknowledged by the agent). The
//! console must also show the steps of the chain in order (firmware, boot
//! file, iPXE script, kernel, initrd), so a boot that took another road
//! fails. On failure the console tail and the agent's log are printed.
//!
//! Each boot runs in its own lab: a namespace with a tap (or, for the storm,
//! a bridge of taps), radvd, and the agent with `--boot-root` (iPXE
//! binaries) and `--artifacts` (kernel, initramfs).

use std::{
    collections::BTreeMap,
    fs,
    time::{Duration, Instant},
};

use xtask::vm::{
    BootLab, BootLabConfig, BootReport, Firmware, SERVER_IP, Vm, VmSpec,
    initramfs::PROFILE_CMDLINE, wait_all,
};

use crate::{agent::agent_bin, fixture::assert_root};

/// One boot takes 8–25 s under TCG here; this leaves room for a busy machine.
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
/// VMs booting at once in the storm (on 2 cores all 8 phoned home after
/// 26–37 s here, the CPU being the bound).
const STORM_VMS: usize = 8;
const STORM_TIMEOUT: Duration = Duration::from_secs(240);

pub(crate) const WORKER_MAC: &str = "52:54:00:12:34:56";
pub(crate) const WORKER_IP: &str = "10.66.1.10";
const CHAINED_MAC: &str = "52:54:00:12:34:57";
const CHAINED_IP: &str = "10.66.1.11";
const UNKNOWN_MAC: &str = "52:54:00:aa:bb:01";
/// The second HTTP server the `chained` profile chains to.
const CHAIN_PORT: u16 = 8081;

/// Profiles for every case; `{cmdline}` and `{hosts}` are filled in.
const INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    dns: [10.66.0.1]
    lease_time: 3600
    pool: {start: 10.66.200.1, end: 10.66.200.250}
discovery: {policy: inspect, profile: inspector, lease_time: 600}
profiles:
  - name: worker
    boot:
      bios: undionly.kpxe
      uefi: ipxe.efi
      http: "http://{server}:8080/ipxe.efi"
    kernel: "http://{server}:8080/artifacts/vmlinuz"
    initrd: ["http://{server}:8080/artifacts/initrd.img"]
    cmdline: "@CMDLINE@"
  - name: chained
    boot:
      bios: undionly.kpxe
      uefi: ipxe.efi
    chain: "http://{server}:8081/installer.ipxe"
  - name: inspector
    boot:
      bios: undionly.kpxe
      uefi: ipxe.efi
      http: "http://{server}:8080/ipxe.efi"
    kernel: "http://{server}:8080/artifacts/vmlinuz"
    initrd: ["http://{server}:8080/artifacts/initrd.img"]
    cmdline: "@CMDLINE@"
hosts:
  - mac: "52:54:00:12:34:56"
    ip: 10.66.1.10
    hostname: node-1
    profile: worker
@WORKER_OPTIONS@
  - mac: "52:54:00:12:34:57"
    ip: 10.66.1.11
    hostname: node-chained
    profile: chained
@STORM_HOSTS@
"#;

/// The installer script on the second HTTP server: the same kernel, its
/// phone-home URL built by iPXE from its own `${mac}`.
const INSTALLER_SCRIPT: &str = "#!ipxe\n\
echo Chained to the installer script on the second server\n\
kernel http://10.66.0.1:8080/artifacts/vmlinuz initrd=initrd.img console=ttyS0 panic=1 \
pxe.phonehome=http://10.66.0.1:8080/api/v1/hosts/${mac}/booted\n\
initrd http://10.66.0.1:8080/artifacts/initrd.img\n\
boot\n";

fn storm_mac(i: usize) -> String {
    format!("52:54:00:00:20:{:02x}", i + 1)
}

fn storm_ip(i: usize) -> String {
    format!("10.66.2.{}", i + 1)
}

/// The test inventory; `worker_options` is an `options:` line for node-1.
pub(crate) fn inventory(worker_options: &str) -> String {
    let storm: String = (0..STORM_VMS)
        .map(|i| {
            format!(
                "  - mac: \"{}\"\n    ip: {}\n    hostname: storm-{}\n    profile: worker\n",
                storm_mac(i),
                storm_ip(i),
                i + 1
            )
        })
        .collect();
    INVENTORY
        .replace("@CMDLINE@", PROFILE_CMDLINE)
        .replace("@WORKER_OPTIONS@\n", worker_options)
        .replace("@STORM_HOSTS@\n", &storm)
}

/// Starts a boot lab, panicking with the reason (and the agent's log) if
/// it cannot.
fn lab(prefix: &str, cfg: impl FnOnce(BootLabConfig) -> BootLabConfig) -> BootLab {
    lab_with(prefix, &inventory(""), cfg)
}

fn lab_with(
    prefix: &str,
    inventory: &str,
    cfg: impl FnOnce(BootLabConfig) -> BootLabConfig,
) -> BootLab {
    assert_root();
    let cfg = cfg(BootLabConfig::new(prefix, &agent_bin(), inventory));
    BootLab::start(&cfg).unwrap_or_else(|e| panic!("boot lab {prefix}: {e:#}"))
}

/// Everything worth reading when a boot failed.
pub(crate) fn context(lab: &BootLab, vm: &Vm, report: &BootReport) -> String {
    format!(
        "{}\n--- console of {} (last 50 lines) ---\n{}\n--- qemu ---\n{}\n--- agent log (last 50 lines) ---\n{}",
        report.summary(),
        vm.spec().name,
        vm.console_tail(50),
        vm.qemu_log().trim(),
        lab.agent_log_tail(50),
    )
}

/// Boots one VM to the end and requires that it phoned home with `ip`.
pub(crate) fn boot(
    lab: &BootLab,
    name: &str,
    mac: &str,
    firmware: Firmware,
    ip: &str,
) -> (Vm, BootReport) {
    boot_spec(lab, &lab.vm_spec(name, mac, firmware, 0), BOOT_TIMEOUT, ip)
}

/// Boots the VM `spec` makes to the end (within `timeout`) and requires
/// that it phoned home with `ip`.
pub(crate) fn boot_spec(
    lab: &BootLab,
    spec: &VmSpec,
    timeout: Duration,
    ip: &str,
) -> (Vm, BootReport) {
    let name = &spec.name;
    let mut vm = lab
        .start_vm(spec)
        .unwrap_or_else(|e| panic!("start {name}: {e:#}"));
    let report = vm
        .wait(timeout, &mut |_| {})
        .unwrap_or_else(|e| panic!("follow {name}: {e:#}"));
    eprintln!("{}", report.summary());
    assert!(
        report.phoned_home,
        "the guest did not phone home\n{}",
        context(lab, &vm, &report)
    );
    assert_eq!(
        report.ip.as_deref(),
        Some(ip),
        "wrong address\n{}",
        context(lab, &vm, &report)
    );
    (vm, report)
}

/// Requires `steps` to appear in the console in this order.
pub(crate) fn assert_chain<S: AsRef<str> + std::fmt::Debug>(
    lab: &BootLab,
    vm: &Vm,
    report: &BootReport,
    steps: &[S],
) {
    let console = vm.console_tail(usize::MAX);
    let mut at = 0;
    for step in steps.iter().map(AsRef::as_ref) {
        match console[at..].find(step) {
            Some(found) => at += found + step.len(),
            None => panic!(
                "console lacks {step:?} (after the steps before it: {steps:?})\n{}",
                context(lab, vm, report)
            ),
        }
    }
}

/// The console steps from the iPXE script on, for a host whose script is
/// the agent's per-host one.
fn script_steps(mac: &str) -> Vec<String> {
    vec![
        format!("Filename: http://{SERVER_IP}:8080/boot/{mac}.ipxe"),
        format!("http://{SERVER_IP}:8080/artifacts/vmlinuz"),
        format!("http://{SERVER_IP}:8080/artifacts/initrd.img"),
        format!("PXE-AGENT-BOOTED {mac}"),
        format!("PXE-AGENT-PHONED-HOME {mac} ok"),
    ]
}

/// The worker's console shows `firmware_steps` and then its own script's
/// steps in order, and `pxe-agent hosts` shows its phone-home.
pub(crate) fn assert_worker_booted_through_script(
    lab: &BootLab,
    vm: &Vm,
    report: &BootReport,
    firmware_steps: Vec<String>,
) {
    let mut steps = firmware_steps;
    steps.extend(script_steps(WORKER_MAC));
    assert_chain(
        lab,
        vm,
        report,
        &steps.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert_host_booted(lab, WORKER_MAC);
}

/// XDP sent at least two OFFERs and two ACKs: the firmware's and the guest's.
pub(crate) fn assert_fast_path_answered_twice(lab: &BootLab) {
    assert!(xdp_counter(lab, "tx_offer") >= 2, "{:?}", stats(lab));
    assert!(xdp_counter(lab, "tx_ack") >= 2, "{:?}", stats(lab));
}

/// `pxe-agent hosts`' row for `mac`, which must show the phone-home.
pub(crate) fn assert_host_booted(lab: &BootLab, mac: &str) -> String {
    let table = lab
        .cli(&["hosts"])
        .unwrap_or_else(|e| panic!("pxe-agent hosts: {e:#}"));
    let row = table
        .lines()
        .find(|l| l.starts_with(mac))
        .unwrap_or_else(|| panic!("{mac} not in `pxe-agent hosts`:\n{table}"))
        .to_owned();
    assert!(
        row.contains("booted") && row.contains("ramdisk up"),
        "`pxe-agent hosts` does not show the phone-home of {mac}:\n{table}"
    );
    row
}

/// The agent's counters by sample name.
pub(crate) fn stats(lab: &BootLab) -> BTreeMap<String, u64> {
    lab.cli(&["stats"])
        .unwrap_or_else(|e| panic!("pxe-agent stats: {e:#}"))
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            Some((parts.next()?.to_owned(), parts.next()?.parse().ok()?))
        })
        .collect()
}

pub(crate) fn xdp_counter(lab: &BootLab, outcome: &str) -> u64 {
    stats(lab)
        .get(&format!("pxe_xdp_packets_total{{outcome=\"{outcome}\"}}"))
        .copied()
        .unwrap_or(0)
}

/// The console steps of OVMF's PXE loading ipxe.efi over TFTP for the
/// worker, up to iPXE.
pub(crate) fn uefi_pxe_steps() -> Vec<String> {
    vec![
        ">>Start PXE over IPv4".to_owned(),
        format!("Station IP address is {WORKER_IP}"),
        "NBP filename is ipxe.efi".to_owned(),
        "NBP file downloaded successfully".to_owned(),
        "iPXE".to_owned(),
    ]
}

/// TFTP boots need the agent's TFTP server; say so plainly when it is missing.
pub(crate) fn require_tftp(lab: &BootLab) {
    assert!(
        lab.udp_listening(69),
        "pxe-agent serves no TFTP: nothing listens on UDP port 69 in the lab although \
         `pxe-agent run` was given --boot-root {}. This boot fetches its first boot file \
         over TFTP, so it needs the agent's TFTP server (`--boot-root DIR` served over \
         TFTP on the interface), which `pxe-agent run` does not start yet.\nagent log:\n{}",
        lab.boot_root().display(),
        lab.agent_log_tail(20)
    );
}

#[test]
fn bios_ipxe_rom_boots_the_host_script_and_phones_home() {
    let lab = lab("pxvmbios", |c| c.xdp_mode("native"));
    let (vm, report) = boot(&lab, "bios", WORKER_MAC, Firmware::Bios, WORKER_IP);
    let steps = vec!["iPXE".to_owned()];
    assert_worker_booted_through_script(&lab, &vm, &report, steps);
    // iPXE went to the slow path; the guest's own DHCP was answered by XDP
    // in driver mode on the tap.
    assert_eq!(lab.xdp_mode().as_deref(), Some("Native"));
    assert!(xdp_counter(&lab, "pass_ipxe") >= 2, "{:?}", stats(&lab));
    assert!(xdp_counter(&lab, "tx_ack") >= 1, "{:?}", stats(&lab));
}

/// The NIC ROM under SeaBIOS is itself iPXE (user class "iPXE" and option
/// 175 from its very first request), so the agent rightly sends it straight
/// to its script. To make the first answer chain undionly.kpxe over TFTP,
/// as a classic PXE ROM would be answered, node-1 starts with option 67 set
/// to the TFTP URL; once the ROM has fetched undionly.kpxe, the inventory
/// drops the override, and undionly's own DHCP gets the script.
#[test]
fn bios_chains_undionly_over_tftp_before_the_script() {
    let tftp_first = format!("    options: {{67: \"tftp://{SERVER_IP}/undionly.kpxe\"}}\n");
    let lab = lab("pxvmundi", |c| BootLabConfig {
        inventory: inventory(&tftp_first),
        ..c.xdp_mode("native").arg("--reload-interval").arg("20ms")
    });
    require_tftp(&lab);
    let spec = lab.vm_spec("undionly", WORKER_MAC, Firmware::Bios, 0);
    let mut vm = lab.start_vm(&spec).expect("start VM");
    let deadline = Instant::now() + BOOT_TIMEOUT;
    let mut fetched = false;
    while !fetched {
        let exited = vm
            .poll(&mut |line| fetched |= line.contains("undionly.kpxe... ok"))
            .expect("poll VM");
        if exited || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        fetched,
        "the ROM never loaded undionly.kpxe over TFTP\n{}",
        context(&lab, &vm, vm.report())
    );
    lab.replace_inventory(&inventory(""))
        .expect("inventory without the override");
    let report = vm.wait(BOOT_TIMEOUT, &mut |_| {}).expect("follow VM");
    eprintln!("{}", report.summary());
    assert!(
        report.phoned_home,
        "the guest did not phone home\n{}",
        context(&lab, &vm, &report)
    );
    let steps = vec![
        format!("Filename: tftp://{SERVER_IP}/undionly.kpxe"),
        "undionly.kpxe... ok".to_owned(),
        // undionly.kpxe is iPXE again, now on the ROM's UNDI.
        "iPXE initialising devices".to_owned(),
    ];
    assert_worker_booted_through_script(&lab, &vm, &report, steps);
}

#[test]
fn uefi_pxe_loads_ipxe_efi_over_tftp_then_the_script() {
    let lab = lab("pxvmpxe", |c| c.xdp_mode("native"));
    require_tftp(&lab);
    let (vm, report) = boot(&lab, "uefipxe", WORKER_MAC, Firmware::UefiPxe, WORKER_IP);
    assert_worker_booted_through_script(&lab, &vm, &report, uefi_pxe_steps());
    // OVMF's PXE requests (arch 7) and the guest's own DHCP are answered by
    // the fast path; only iPXE's go to the slow path.
    assert_fast_path_answered_twice(&lab);
}

#[test]
fn uefi_http_boot_loads_ipxe_efi_over_http_then_the_script() {
    let lab = lab("pxvmhttp", |c| c.xdp_mode("native"));
    let (vm, report) = boot(&lab, "uefihttp", WORKER_MAC, Firmware::UefiHttp, WORKER_IP);
    let steps = vec![
        ">>Start HTTP Boot over IPv4".to_owned(),
        format!("URI: http://{SERVER_IP}:8080/ipxe.efi"),
        "iPXE".to_owned(),
    ];
    assert_worker_booted_through_script(&lab, &vm, &report, steps);
    // OVMF's HTTPClient requests (arch 16) and the guest's own DHCP are
    // answered by the fast path; only iPXE's go to the slow path.
    assert_fast_path_answered_twice(&lab);
}

#[test]
fn chain_profile_boots_from_a_second_http_server() {
    // The installer's script is not the agent's, so its kernel line has no
    // phone-home token: an agent serving such hosts turns the token off.
    let inventory = inventory("") + "ipxe:\n  phone_home_token: off\n";
    let mut lab = lab_with("pxvmchain", &inventory, |c| c.xdp_mode("native"));
    let site = lab.dir().join("installer");
    fs::create_dir_all(&site).expect("installer dir");
    fs::write(site.join("installer.ipxe"), INSTALLER_SCRIPT).expect("installer script");
    let listen = format!("{SERVER_IP}:{CHAIN_PORT}");
    let site = site.to_str().expect("utf-8 path").to_owned();
    lab.spawn_helper(
        "httpd",
        &["busybox", "httpd", "-f", "-p", &listen, "-h", &site],
    )
    .expect("start busybox httpd");
    let url = format!("http://{listen}/installer.ipxe");
    let deadline = Instant::now() + Duration::from_secs(10);
    while lab
        .cmd("curl")
        .args(["-sf", "-m", "1", "-o", "/dev/null", &url])
        .status()
        .map_or(true, |s| !s.success())
    {
        assert!(
            Instant::now() < deadline,
            "busybox httpd does not serve {url}: {}",
            lab.helper_log("httpd")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (vm, report) = boot(&lab, "chain", CHAINED_MAC, Firmware::Bios, CHAINED_IP);
    let steps = [
        format!("Filename: {url}"),
        "Chained to the installer script on the second server".to_owned(),
        format!("http://{SERVER_IP}:8080/artifacts/vmlinuz"),
        format!("PXE-AGENT-BOOTED {CHAINED_MAC}"),
        format!("PXE-AGENT-PHONED-HOME {CHAINED_MAC} ok"),
    ];
    assert_chain(
        &lab,
        &vm,
        &report,
        &steps.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert_host_booted(&lab, CHAINED_MAC);
}

#[test]
fn unknown_mac_boots_the_discovery_profile_and_is_listed() {
    let lab = lab("pxvmdisc", |c| c.xdp_mode("native"));
    let spec = lab.vm_spec("unknown", UNKNOWN_MAC, Firmware::Bios, 0);
    let mut vm = lab.start_vm(&spec).expect("start VM");
    let report = vm.wait(BOOT_TIMEOUT, &mut |_| {}).expect("follow VM");
    eprintln!("{}", report.summary());
    assert!(
        report.phoned_home,
        "the unknown machine did not phone home\n{}",
        context(&lab, &vm, &report)
    );
    let ip = report.ip.clone().unwrap_or_default();
    assert!(
        ip.starts_with("10.66.200."),
        "expected a pool address, got {ip}\n{}",
        context(&lab, &vm, &report)
    );
    assert_chain(
        &lab,
        &vm,
        &report,
        &script_steps(UNKNOWN_MAC)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let table = lab
        .cli(&["hosts", "--discovered"])
        .expect("hosts --discovered");
    let row = table
        .lines()
        .find(|l| l.starts_with(UNKNOWN_MAC))
        .unwrap_or_else(|| panic!("{UNKNOWN_MAC} not listed for adoption:\n{table}"));
    assert!(row.contains(&ip), "listed without its lease {ip}: {row}");
}

#[test]
fn storm_of_vms_booting_at_once_all_phone_home() {
    let lab = lab("pxvmstorm", |c| c.bridge(STORM_VMS));
    let started = Instant::now();
    let mut vms: Vec<Vm> = (0..STORM_VMS)
        .map(|i| {
            let spec = lab.vm_spec(&format!("storm{}", i + 1), &storm_mac(i), Firmware::Bios, i);
            lab.start_vm(&spec).expect("start VM")
        })
        .collect();
    let reports = wait_all(&mut vms, STORM_TIMEOUT, &mut |_, _| {}).expect("follow VMs");
    let elapsed = started.elapsed();
    eprintln!(
        "{STORM_VMS} VMs, agent on a bridge (XDP {}), all done after {:.1}s:",
        lab.xdp_mode().unwrap_or_default(),
        elapsed.as_secs_f64()
    );
    for report in &reports {
        eprintln!("  {}", report.summary());
    }
    for (i, (vm, report)) in vms.iter().zip(&reports).enumerate() {
        assert!(
            report.phoned_home && report.ip.as_deref() == Some(storm_ip(i).as_str()),
            "storm VM {} did not boot\n{}",
            i + 1,
            context(&lab, vm, report)
        );
        assert_host_booted(&lab, &storm_mac(i));
    }
    // Generic XDP on the bridge answered every guest's own DHCP.
    let acks = xdp_counter(&lab, "tx_ack");
    assert!(
        acks >= STORM_VMS as u64,
        "{acks} fast-path ACKs: {:?}",
        stats(&lab)
    );
}

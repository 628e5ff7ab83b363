//! Network boot under enforcing Secure Boot with real firmware: OVMF's
//! secboot build with Microsoft's keys enrolled (see `xtask::vm::qemu`),
//! Debian's signed shim and grub (`xtask::vm::signed`) and Debian's signed
//! kernel.
//!
//! - The signed chain boots: the firmware fetches shim over TFTP, shim
//!   fetches grub next to itself, grub reads the grub.cfg the agent renders
//!   for the host (over TFTP, by the host's address) and loads the kernel
//!   and initrd it names; the kernel must say Secure Boot is enabled, the
//!   guest must lease its address and phone home with the token the
//!   rendered grub.cfg put on its command line (the agent requires it).
//! - An unsigned boot file (Debian's `ipxe.efi`) is refused by the same
//!   firmware: it is downloaded, but iPXE never runs, never asks for its
//!   script, and the firmware reports the refusal.
//! - Without firmware: curl, from the host's address, gets the host's
//!   rendered grub.cfg over HTTP and TFTP (each a new boot, with a new token that the
//!   phone-home then needs), even where a file of that name exists; any
//!   other address gets the file.

use std::{
    fs, thread,
    time::{Duration, Instant},
};

use xtask::vm::{
    BootLab, BootLabConfig, BootReport, Firmware, SERVER_IP, Vm, initramfs::PROFILE_CMDLINE,
};

use crate::{
    agent::{Scratch, Served, agent_bin},
    boot_vm::assert_host_booted,
    fixture::assert_root,
};

/// The signed chain under TCG with SMM: about 60-90 s here; generous for a
/// busy machine, but bounded.
const BOOT_TIMEOUT: Duration = Duration::from_secs(400);
/// How long the refused boot file is watched for a sign of iPXE.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(240);
/// After the firmware reported the refusal, how long iPXE gets to show up
/// anyway.
const AFTER_REFUSAL: Duration = Duration::from_secs(15);

const SECURE_MAC: &str = "52:54:00:12:34:60";
const SECURE_IP: &str = "10.66.1.20";
const UNSIGNED_MAC: &str = "52:54:00:12:34:61";
const UNSIGNED_IP: &str = "10.66.1.21";

/// The kernel's line (arch/x86/kernel/setup.c) when the firmware booted it
/// with Secure Boot on.
const SECURE_BOOT_ENABLED: &str = "Secure boot enabled";

/// `secure` boots the signed chain; Debian 12's signed grubnetx64.efi has
/// no http module, so grub fetches kernel and initrd over TFTP from the
/// boot root. `unsigned` hands the firmware Debian's (unsigned) iPXE.
const INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    dns: [10.66.0.1]
    lease_time: 3600
profiles:
  - name: secure
    boot:
      uefi: shimx64.efi
    grub: {}
    kernel: "tftp://{server}/vmlinuz"
    initrd: ["tftp://{server}/initrd.img"]
    cmdline: "@CMDLINE@"
  - name: unsigned
    boot:
      uefi: ipxe.efi
    kernel: "http://{server}:8080/artifacts/vmlinuz"
    initrd: ["http://{server}:8080/artifacts/initrd.img"]
    cmdline: "@CMDLINE@"
hosts:
  - mac: "52:54:00:12:34:60"
    ip: 10.66.1.20
    hostname: node-sb
    profile: secure
  - mac: "52:54:00:12:34:61"
    ip: 10.66.1.21
    hostname: node-unsigned
    profile: unsigned
"#;

/// A boot lab with the signed chain in its boot root, and the kernel and
/// initrd beside it for grub's TFTP.
fn lab(prefix: &str) -> BootLab {
    assert_root();
    let inventory = INVENTORY.replace("@CMDLINE@", PROFILE_CMDLINE);
    let cfg = BootLabConfig::new(prefix, &agent_bin(), &inventory);
    let lab = BootLab::start(&cfg).unwrap_or_else(|e| panic!("boot lab {prefix}: {e:#}"));
    lab.add_signed_chain()
        .unwrap_or_else(|e| panic!("signed shim and grub: {e:#}"));
    for name in ["vmlinuz", "initrd.img"] {
        fs::copy(lab.artifacts().join(name), lab.boot_root().join(name))
            .unwrap_or_else(|e| panic!("copy {name} into the boot root: {e}"));
    }
    lab
}

fn context(lab: &BootLab, vm: &Vm, report: &BootReport) -> String {
    format!(
        "{}\n--- console of {} (last 60 lines) ---\n{}\n--- qemu ---\n{}\n--- agent log (last 40 lines) ---\n{}",
        report.summary(),
        vm.spec().name,
        vm.console_tail(60),
        vm.qemu_log().trim(),
        lab.agent_log_tail(40),
    )
}

/// Requires `steps` in the console in this order.
fn assert_in_order(lab: &BootLab, vm: &Vm, report: &BootReport, steps: &[&str]) {
    let console = vm.console_tail(usize::MAX);
    let mut at = 0;
    for step in steps {
        match console[at..].find(step) {
            Some(found) => at += found + step.len(),
            None => panic!(
                "console lacks {step:?} (after the steps before it: {steps:?})\n{}",
                context(lab, vm, report)
            ),
        }
    }
}

#[test]
fn signed_shim_grub_and_kernel_boot_under_enforcing_secure_boot() {
    let lab = lab("pxsbok");
    let spec = lab
        .vm_spec("secure", SECURE_MAC, Firmware::UefiPxe, 0)
        .secure_boot()
        .memory_mb(512);
    let mut vm = lab.start_vm(&spec).expect("start the VM");
    let report = vm.wait(BOOT_TIMEOUT, &mut |_| {}).expect("follow the VM");
    eprintln!("{}", report.summary());
    assert!(
        report.phoned_home,
        "the guest did not phone home\n{}",
        context(&lab, &vm, &report)
    );
    assert_eq!(
        report.ip.as_deref(),
        Some(SECURE_IP),
        "wrong address\n{}",
        context(&lab, &vm, &report)
    );
    assert_in_order(
        &lab,
        &vm,
        &report,
        &[
            "NBP filename is shimx64.efi",
            "Fetching Netboot Image grubx64.efi",
            "Welcome to GRUB!",
            &format!("Loading tftp://{SERVER_IP}/vmlinuz"),
            SECURE_BOOT_ENABLED,
            &format!("PXE-AGENT-BOOTED {SECURE_MAC}"),
            &format!("PXE-AGENT-PHONED-HOME {SECURE_MAC} ok"),
        ],
    );
    // grub's config came from the agent, rendered for this host: over
    // TFTP, at the name Debian's grub asks for.
    let log = lab.agent_log();
    assert!(
        log.lines().any(|l| l.contains("TFTP transfer done")
            && l.contains(&format!("peer={SECURE_IP}:"))
            && l.contains("file=/grub/grub.cfg")),
        "no grub.cfg was sent to {SECURE_IP} over TFTP\n{}",
        context(&lab, &vm, &report)
    );
    let row = assert_host_booted(&lab, SECURE_MAC);
    eprintln!("{row}");
}

#[test]
fn unsigned_ipxe_is_refused_by_secure_boot_firmware() {
    let lab = lab("pxsbno");
    let spec = lab
        .vm_spec("unsigned", UNSIGNED_MAC, Firmware::UefiPxe, 0)
        .secure_boot()
        .memory_mb(512);
    let mut vm = lab.start_vm(&spec).expect("start the VM");
    let started = Instant::now();
    let mut refused_at = None;
    let mut ipxe_ran = false;
    loop {
        let exited = vm
            .poll(&mut |line: &str| {
                if line.contains("iPXE") {
                    ipxe_ran = true;
                }
                if line.contains("Access Denied") || line.contains("Security Violation") {
                    refused_at.get_or_insert_with(Instant::now);
                }
            })
            .expect("follow the VM");
        let settled = refused_at.is_some_and(|at| at.elapsed() >= AFTER_REFUSAL);
        if exited || settled || ipxe_ran || started.elapsed() >= REFUSAL_TIMEOUT {
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    let report = vm.report().clone();
    let log = lab.agent_log();
    // The firmware did get the file: the refusal is its signature check,
    // not a failed download.
    assert!(
        log.lines().any(|l| l.contains("TFTP transfer done")
            && l.contains(&format!("peer={UNSIGNED_IP}:"))
            && l.contains("file=ipxe.efi")),
        "the firmware never downloaded ipxe.efi\n{}",
        context(&lab, &vm, &report)
    );
    assert!(
        !ipxe_ran,
        "iPXE ran under Secure Boot although it is not signed\n{}",
        context(&lab, &vm, &report)
    );
    assert!(
        !log.contains(&format!("/boot/{UNSIGNED_MAC}.ipxe")),
        "the refused iPXE asked for its script\n{}",
        context(&lab, &vm, &report)
    );
    assert!(
        !report.phoned_home && report.booted_after.is_none(),
        "the guest booted past the refused iPXE\n{}",
        context(&lab, &vm, &report)
    );
    assert!(
        refused_at.is_some(),
        "the firmware did not report refusing ipxe.efi (Access Denied / Security Violation)\n{}",
        context(&lab, &vm, &report)
    );
}

/// One grub host, and an on-disk `grub/grub.cfg` that only other clients
/// may get.
const SERVED_INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
profiles:
  - name: secure
    boot: {uefi: shimx64.efi}
    grub: {}
    kernel: "tftp://{server}/vmlinuz"
    initrd: ["http://{server}:8080/artifacts/initrd.img"]
    cmdline: "console=ttyS0 home=http://{server}:8080/api/v1/hosts/{mac}/booted"
hosts:
  - mac: "52:54:00:12:34:60"
    ip: 10.66.1.20
    hostname: node-sb
    profile: secure
"#;

/// The token on a rendered grub.cfg's kernel line.
fn token_of(config: &str) -> String {
    config
        .split_whitespace()
        .find_map(|w| w.strip_prefix("'pxe_agent.token="))
        .and_then(|t| t.strip_suffix('\''))
        .unwrap_or_else(|| panic!("no token in\n{config}"))
        .to_owned()
}

fn curl(served: &Served, args: &[&str]) -> String {
    let out = served
        .client_cmd("curl")
        .args(["-s", "--max-time", "10"])
        .args(args)
        .output()
        .expect("run curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_host_gets_its_rendered_grub_cfg_over_http_and_tftp() {
    let boot = Scratch::new("boot");
    fs::create_dir_all(boot.path("grub")).expect("mkdir");
    fs::write(boot.path("grub/grub.cfg"), "on disk\n").expect("write");
    fs::write(boot.path("grubx64.efi"), "grub\n").expect("write");
    let root = boot.0.to_str().expect("utf-8 path").to_owned();
    let served = Served::start_with("pxsbcfg", SERVED_INVENTORY, &["--boot-root", &root]);
    served.set_client_mac(SECURE_MAC);
    served.add_client_address(&format!("{SECURE_IP}/16"));

    let url = format!("http://{SERVER_IP}:8080/grub/grub.cfg");
    let first = curl(&served, &["--interface", SECURE_IP, &url]);
    assert!(
        first.starts_with("# node-sb (52:54:00:12:34:60, 10.66.1.20), profile secure\n"),
        "{first}\n{}",
        served.log()
    );
    assert!(
        first.contains(
            "\nlinux '(tftp,10.66.0.1)/vmlinuz' 'console=ttyS0' \
             'home=http://10.66.0.1:8080/api/v1/hosts/52:54:00:12:34:60/booted' \
             'pxe_agent.token="
        ),
        "{first}"
    );
    assert!(
        first.contains("\ninitrd '(http,10.66.0.1:8080)/artifacts/initrd.img'\nboot\n"),
        "{first}"
    );
    // Over TFTP, by the requesting address, the same (curl, to send from
    // the host's address).
    let tftp = format!("tftp://{SERVER_IP}/grub/grub.cfg");
    let over_tftp = curl(&served, &["--interface", SECURE_IP, &tftp]);
    assert!(
        over_tftp.contains("\nlinux '(tftp,10.66.0.1)/vmlinuz' 'console=ttyS0' "),
        "{over_tftp}\n{}",
        served.log()
    );
    let latest = curl(&served, &["--interface", SECURE_IP, &url]);
    let (first, second, latest) = (token_of(&first), token_of(&over_tftp), token_of(&latest));
    assert!(
        first != second && second != latest && first != latest,
        "each grub.cfg is a new boot with a new token"
    );

    // shim over UEFI HTTP boot asks for `<dir>//grubx64.efi`.
    let doubled = format!("http://{SERVER_IP}:8080//grubx64.efi");
    assert_eq!(
        curl(&served, &["--interface", SECURE_IP, &doubled]),
        "grub\n"
    );

    // Another address is no host of the grub profile: the file on disk.
    served
        .lab
        .run_in(
            served.lab.client_ns(),
            &[
                "ip",
                "addr",
                "add",
                "10.66.1.99/16",
                "dev",
                served.lab.client_if(),
            ],
        )
        .expect("second address");
    assert_eq!(
        curl(&served, &["--interface", "10.66.1.99", &url]),
        "on disk\n"
    );
    let from_other = curl(&served, &["--interface", "10.66.1.99", &tftp]);
    assert_eq!(from_other, "on disk\n");

    // The phone-home needs the token of the latest grub.cfg.
    let booted = format!("http://{SERVER_IP}:8080/api/v1/hosts/{SECURE_MAC}/booted");
    let post = |token: &str| {
        curl(
            &served,
            &[
                "--interface",
                SECURE_IP,
                "-X",
                "POST",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                &format!("{booted}?token={token}"),
            ],
        )
    };
    assert_eq!(post(&first), "403", "a token of an earlier grub.cfg");
    assert_eq!(post(&latest), "204", "{}", served.log());
    let hosts = served.cli(&["hosts"]);
    let row = hosts
        .lines()
        .find(|l| l.starts_with(SECURE_MAC))
        .unwrap_or_else(|| panic!("{SECURE_MAC} not listed:\n{hosts}"));
    assert!(
        row.contains("/grub/grub.cfg (grub)") && row.contains("booted"),
        "{hosts}"
    );
}

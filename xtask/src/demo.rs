//! `cargo xtask demo`: the whole network boot chain with real firmware. The
//! agent serves `examples/inventory.yaml` in a throw-away namespace, and a
//! QEMU VM (SeaBIOS with the NIC's iPXE ROM) boots through it: DHCP, the
//! iPXE script over HTTP, a Debian kernel and a busybox initramfs that
//! phones home. Its console is streamed; the agent's host table follows.
//!
//! Owns only the demo's flow; the lab, guest and VM come from [`xtask::vm`].

use std::{fs, path::Path, time::Duration};

use anyhow::{Context as _, ensure};
use xtask::{
    process::{self, run_forwarded},
    setup, target_dir,
    vm::{
        BootLab, BootLabConfig, Firmware,
        bootlab::{KEEP_ENV, METRICS_ADDR},
    },
    workspace_root,
};

const CLIENT_MAC: &str = "52:54:00:12:34:56";
/// What examples/inventory.yaml assigns to [`CLIENT_MAC`].
const EXPECTED_IP: &str = "10.66.1.10";
/// A BIOS boot takes ~8 s under TCG here; room for a slow machine.
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

pub fn run() -> anyhow::Result<()> {
    // Packages, toolchains, and the guest's kernel and busybox.
    setup::run()?;
    println!("==> building pxe-agent (release)");
    run_forwarded(setup::command("cargo").current_dir(workspace_root()).args([
        "build",
        "--release",
        "-p",
        "pxe-agent",
    ]))
    .context("failed to build pxe-agent")?;
    let agent = target_dir().join("release").join("pxe-agent");
    let path = workspace_root().join("examples").join("inventory.yaml");
    let inventory =
        fs::read_to_string(&path).with_context(|| format!("failed to read {}", path.display()))?;

    println!(
        "==> lab: namespace, tap, radvd, pxe-agent with {}",
        path.display()
    );
    let lab = BootLab::start(&BootLabConfig::new("pxdemo", &agent, &inventory))?;
    println!(
        "==> agent on {} in {} (XDP {}), boot root {}, artifacts {}",
        lab.iface(),
        lab.server_ns(),
        lab.xdp_mode().as_deref().unwrap_or("?"),
        lab.boot_root().display(),
        lab.artifacts().display()
    );
    serve_inspector(&lab)?;
    let booted = boot_one(&lab);
    // The VM is gone by now; the lab (agent, radvd, namespaces) goes here.
    drop(lab);
    let ip = booted?;
    println!("==> demo passed: {CLIENT_MAC} booted over the network, leased {ip} and phoned home");
    Ok(())
}

/// The example's `inspector` profile (what unknown machines boot) loads
/// `/inspector/vmlinuz` and `/inspector/initramfs.img` from the boot root:
/// the same guest, so a VM with any other MAC boots too.
fn serve_inspector(lab: &BootLab) -> anyhow::Result<()> {
    let dir = lab.boot_root().join("inspector");
    fs::create_dir_all(&dir)?;
    for (from, to) in [("vmlinuz", "vmlinuz"), ("initrd.img", "initramfs.img")] {
        copy(&lab.artifacts().join(from), &dir.join(to))?;
    }
    Ok(())
}

/// Firmware, iPXE and initramfs lines, and only the kernel's milestones
/// among its few hundred boot messages (the console file keeps them all).
fn worth_showing(line: &str) -> bool {
    const KERNEL_MILESTONES: &[&str] = &[
        "Linux version",
        "Command line:",
        "Unpacking initramfs",
        "Run /init",
        "virtio_net",
        "e1000",
        "panic",
        "error",
        "Power down",
    ];
    let line = line.trim();
    if line.is_empty() {
        return false;
    }
    let kernel = line.starts_with('[')
        && line[1..]
            .trim_start()
            .starts_with(|c: char| c.is_ascii_digit());
    !kernel || KERNEL_MILESTONES.iter().any(|m| line.contains(m))
}

fn copy(from: &Path, to: &Path) -> anyhow::Result<()> {
    fs::copy(from, to).with_context(|| format!("failed to copy {}", from.display()))?;
    Ok(())
}

/// Boots node-1, streaming its console; returns the address it phoned home
/// from once the agent's host table shows the phone-home.
fn boot_one(lab: &BootLab) -> anyhow::Result<String> {
    let spec = lab.vm_spec("node-1", CLIENT_MAC, Firmware::Bios, 0);
    println!(
        "==> VM {CLIENT_MAC}: {}, console {}",
        spec.firmware.label(),
        spec.console_path().display()
    );
    let mut vm = lab.start_vm(&spec)?;
    let report = vm.wait(BOOT_TIMEOUT, &mut |line| {
        if worth_showing(line) {
            println!("[vm] {line}");
        }
    })?;
    println!("==> {}", report.summary());
    drop(vm);

    println!("==> pxe-agent hosts");
    let table = lab.cli(&["hosts"])?;
    print!("{table}");
    match lab.cli(&["stats"]) {
        Ok(stats) => {
            println!("==> pxe-agent stats (non-zero)");
            for line in stats.lines().filter(|l| !l.ends_with(" 0")) {
                println!("{line}");
            }
        }
        Err(err) => eprintln!("warning: {err:#}"),
    }
    save_metrics(lab);
    let failed = || {
        format!(
            "agent log (last 30 lines):\n{}\n(set {KEEP_ENV}=1 to keep the lab's files)",
            lab.agent_log_tail(30)
        )
    };
    ensure!(
        report.phoned_home,
        "the VM did not phone home: {}\n{}",
        report.summary(),
        failed()
    );
    let ip = report.ip.clone().unwrap_or_default();
    ensure!(
        ip == EXPECTED_IP,
        "the VM leased {ip}, expected {EXPECTED_IP}"
    );
    let row = table.lines().find(|l| l.starts_with(CLIENT_MAC));
    ensure!(
        row.is_some_and(|r| r.contains("booted")),
        "the agent's host table does not show {CLIENT_MAC} as booted\n{}",
        failed()
    );
    Ok(ip)
}

/// Keeps the agent's whole /metrics page after the boot in
/// `target/demo-metrics.txt`, so two builds' pages can be compared.
fn save_metrics(lab: &BootLab) {
    let url = format!("http://{METRICS_ADDR}/metrics");
    let path = target_dir().join("demo-metrics.txt");
    let page = process::run(lab.cmd("curl").args(["-sf", "-m", "5", &url]))
        .and_then(|page| Ok(fs::write(&path, page)?));
    match page {
        Ok(()) => println!("==> metrics page saved in {}", path.display()),
        Err(err) => eprintln!("warning: failed to save the metrics page: {err:#}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_stream_keeps_firmware_lines_and_kernel_milestones() {
        assert!(worth_showing("Configuring (net0 52:54:00:12:34:56)... ok"));
        assert!(worth_showing(
            "PXE-AGENT-BOOTED 52:54:00:12:34:56 10.66.1.10"
        ));
        assert!(worth_showing("[    1.653833] Run /init as init process"));
        assert!(!worth_showing(
            "[    0.026581] RAMDISK: [mem 0x1fe8e000-0x1ff3cfff]"
        ));
        assert!(!worth_showing("   "));
        assert!(worth_showing("[vm] not a kernel line"));
    }
}

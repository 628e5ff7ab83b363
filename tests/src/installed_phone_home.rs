//! The phone-home shipped for installed systems (`deploy/phone-home/`): its
//! script against the agent run as the DaemonSet runs it, from the host's
//! own address in the client namespace, reading a command line written as
//! an installed system's would be; with curl, and with busybox's wget
//! alone. Its systemd unit passes `systemd-analyze verify`, and the
//! cloud-init snippet writes the script as it is. A QEMU guest running the
//! script at boot is in `recovery_vm`.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use crate::{
    agent::{Privileges, Scratch, Served, assert_daemonset_privileges},
    phone_home::{MAC, MISMATCH, MISSING, PHONE_HOME_URL, script_token, served_as, stage},
};

fn dir() -> PathBuf {
    xtask::workspace_root().join("deploy/phone-home")
}

fn script() -> PathBuf {
    dir().join("pxe-phone-home")
}

/// Runs the script in the client namespace with `cmdline` as the kernel
/// command line, `env` added; with `busybox`, by busybox's `sh` with only
/// that directory's applets on `PATH`.
fn run(served: &Served, cmdline: &Path, env: &[(&str, &str)], busybox: Option<&Path>) -> Output {
    let mut cmd = served.client_cmd("env");
    cmd.arg(format!("PXE_PHONE_HOME_CMDLINE={}", cmdline.display()))
        .arg("PXE_PHONE_HOME_WAIT=0");
    for (k, v) in env {
        cmd.arg(format!("{k}={v}"));
    }
    if let Some(bin) = busybox {
        cmd.arg(format!("PATH={}", bin.display()))
            .arg(bin.join("sh"));
    }
    cmd.arg(script()).output().expect("run pxe-phone-home")
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A directory holding only busybox's applets the script may use: no curl.
fn busybox_bin(scratch: &Scratch) -> PathBuf {
    let busybox = ["/usr/bin/busybox", "/bin/busybox"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("busybox (apt-get install busybox)");
    let bin = scratch.path("bin");
    fs::create_dir_all(&bin).expect("bin dir");
    for applet in ["sh", "cat", "uname", "sleep", "timeout", "wget"] {
        symlink(&busybox, bin.join(applet)).expect("link an applet");
    }
    bin
}

#[test]
fn the_shipped_phone_home_reads_the_token_and_url_from_the_command_line() {
    let (served, _artifacts) = served_as("pxinst", "", Privileges::DaemonSet);
    assert_daemonset_privileges(served.agent_pid());
    let scratch = Scratch::new("pxinst-cmdline");
    let token = script_token(&served);
    assert_eq!(stage(&served), "script");
    let cmdline = scratch.path("cmdline");
    let installed =
        format!("BOOT_IMAGE=/boot/vmlinuz root=/dev/vda1 ro quiet pxe.phonehome={PHONE_HOME_URL}");

    // No phone-home URL: nothing to tell, and it says so.
    fs::write(&cmdline, "BOOT_IMAGE=/boot/vmlinuz root=/dev/vda1 ro\n").expect("cmdline");
    let out = run(&served, &cmdline, &[], None);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no pxe.phonehome="),
        "{}",
        text(&out)
    );

    // The URL without the token: refused, tried again, and a failure.
    fs::write(&cmdline, format!("{installed}\n")).expect("cmdline");
    let out = run(&served, &cmdline, &[("PXE_PHONE_HOME_TRIES", "2")], None);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(served.stats()[MISSING], 2, "{}", text(&out));
    assert_eq!(stage(&served), "script", "a refused phone-home is no boot");

    // The boot's token, as the installer carried it over: booted.
    fs::write(&cmdline, format!("{installed} pxe_agent.token={token}\n")).expect("cmdline");
    let out = run(&served, &cmdline, &[], None);
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("phoned home to {PHONE_HOME_URL}")),
        "{}",
        text(&out)
    );
    let (_, tag) = token.split_once('-').expect("epoch-tag");
    assert!(!said.contains(tag), "the token was printed: {}", text(&out));
    assert_eq!(stage(&served), "booted");
    let table = served.cli(&["hosts"]);
    let row = table.lines().find(|l| l.starts_with(MAC)).expect("listed");
    assert!(row.contains("installed system up"), "{table}");

    // Again with busybox's wget only (an initramfs, a minimal image).
    let bin = busybox_bin(&scratch);
    let out = run(&served, &cmdline, &[], Some(&bin));
    assert!(out.status.success(), "{}", text(&out));
    // A token of the right shape but not the boot's: refused.
    let (epoch, _) = token.split_once('-').expect("epoch-tag");
    let forged = format!("{epoch}-{}", "0".repeat(tag.len()));
    fs::write(&cmdline, format!("{installed} pxe_agent.token={forged}\n")).expect("cmdline");
    let out = run(
        &served,
        &cmdline,
        &[("PXE_PHONE_HOME_TRIES", "1")],
        Some(&bin),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(served.stats()[MISMATCH], 1);
    let log = served.log();
    assert!(
        !log.contains(tag),
        "the token is in the agent's log:\n{log}"
    );
}

#[test]
fn the_systemd_unit_verifies_and_runs_the_script_after_the_network() {
    let unit = fs::read_to_string(dir().join("pxe-phone-home.service")).expect("read the unit");
    for line in [
        "After=network-online.target",
        "Wants=network-online.target",
        "ConditionKernelCommandLine=pxe.phonehome",
        "Type=oneshot",
        "ExecStart=/usr/local/sbin/pxe-phone-home",
    ] {
        assert!(unit.lines().any(|l| l == line), "no {line}:\n{unit}");
    }
    // Verified as installed, the script at the path the unit names.
    let scratch = Scratch::new("pxunit");
    let installed = unit.replace(
        "ExecStart=/usr/local/sbin/pxe-phone-home",
        &format!("ExecStart={}", script().display()),
    );
    let path = scratch.path("pxe-phone-home.service");
    fs::write(&path, installed).expect("write the unit");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("run systemd-analyze (apt-get install systemd)");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        text(&out)
    );
}

#[test]
fn the_cloud_init_snippet_writes_the_shipped_script_to_run_every_boot() {
    let snippet = fs::read_to_string(dir().join("cloud-init.yaml")).expect("read the snippet");
    assert!(snippet.starts_with("#cloud-config\n"), "{snippet}");
    let doc: serde_norway::Value = serde_norway::from_str(&snippet).expect("YAML");
    let files = doc["write_files"].as_sequence().expect("write_files");
    assert_eq!(files.len(), 1, "{snippet}");
    let file = &files[0];
    assert_eq!(
        file["path"].as_str(),
        Some("/var/lib/cloud/scripts/per-boot/pxe-phone-home")
    );
    assert_eq!(file["permissions"].as_str(), Some("0755"));
    let shipped = fs::read_to_string(script()).expect("read the script");
    assert_eq!(
        file["content"].as_str(),
        Some(shipped.as_str()),
        "the snippet's script differs from deploy/phone-home/pxe-phone-home"
    );
}

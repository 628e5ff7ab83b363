//! The Debian package (`cargo xtask deb`): the agent's binary, its systemd
//! unit and defaults (`deploy/debian/`), the example inventory as
//! `/etc/pxe-agent/inventory.yaml`, and the installed-system phone-home,
//! staged and built with `dpkg-deb`, so no packaging tool beyond dpkg is
//! needed. The boot root is Debian's `ipxe` package, a dependency.

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

/// Where each shipped file goes: (source under the workspace, path in the
/// package, mode).
const FILES: &[(&str, &str, u32)] = &[
    (
        "deploy/debian/pxe-agent.service",
        "usr/lib/systemd/system/pxe-agent.service",
        0o644,
    ),
    ("deploy/debian/default", "etc/default/pxe-agent", 0o644),
    (
        "examples/inventory.yaml",
        "etc/pxe-agent/inventory.yaml",
        0o644,
    ),
    (
        "deploy/phone-home/pxe-phone-home",
        "usr/lib/pxe-agent/phone-home/pxe-phone-home",
        0o755,
    ),
    (
        "deploy/phone-home/pxe-phone-home.service",
        "usr/lib/pxe-agent/phone-home/pxe-phone-home.service",
        0o644,
    ),
    (
        "deploy/phone-home/cloud-init.yaml",
        "usr/lib/pxe-agent/phone-home/cloud-init.yaml",
        0o644,
    ),
    ("README.md", "usr/share/doc/pxe-agent/README.md", 0o644),
];

/// Configuration files: an upgrade keeps the operator's edits.
const CONFFILES: &[&str] = &["/etc/default/pxe-agent", "/etc/pxe-agent/inventory.yaml"];

/// The package's version: the agent crate's.
pub fn version() -> anyhow::Result<String> {
    let manifest = crate::workspace_root().join("pxe-agent/Cargo.toml");
    let text = fs::read_to_string(&manifest)
        .with_context(|| format!("failed to read {}", manifest.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .map(str::to_owned)
        .context("no version in pxe-agent/Cargo.toml")
}

/// Builds `pxe-agent_<version>_<arch>.deb` in `out` from `binary`; its
/// path.
pub fn build(binary: &Path, out: &Path) -> anyhow::Result<PathBuf> {
    let root = crate::workspace_root();
    let version = version()?;
    let arch = text(Command::new("dpkg").arg("--print-architecture"))?;
    let stage = out.join("pxe-agent-deb");
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    let put = |to: &str, from: &Path, mode: u32| -> anyhow::Result<()> {
        let dest = stage.join(to);
        fs::create_dir_all(dest.parent().expect("a parent"))?;
        fs::copy(from, &dest)
            .with_context(|| format!("failed to copy {} into the package", from.display()))?;
        fs::set_permissions(&dest, fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    put("usr/bin/pxe-agent", binary, 0o755)?;
    // As Debian's packaging does: no debug symbols in the package (a debug
    // build's are hundreds of megabytes).
    let status = Command::new("strip")
        .arg("--strip-debug")
        .arg(stage.join("usr/bin/pxe-agent"))
        .status()
        .context("failed to run strip (binutils)")?;
    if !status.success() {
        bail!("strip failed ({status})");
    }
    for (from, to, mode) in FILES {
        put(to, &root.join(from), *mode)?;
    }
    for script in ["postinst", "postrm"] {
        put(
            &format!("DEBIAN/{script}"),
            &root.join("deploy/debian").join(script),
            0o755,
        )?;
    }
    let installed_kib = du_kib(&stage)?;
    let control = format!(
        "Package: pxe-agent\n\
         Version: {version}\n\
         Architecture: {arch}\n\
         Maintainer: pxe-agent developers <pxe-agent@users.noreply.github.com>\n\
         Installed-Size: {installed_kib}\n\
         Depends: libc6, libgcc-s1, adduser, ipxe\n\
         Section: net\n\
         Priority: optional\n\
         Description: eBPF/XDP network-boot server for bare-metal fleets\n \
         DHCP for known hosts answered by an XDP program at line rate, a\n \
         slow path for the rest, TFTP and HTTP boot, iPXE scripts, boot\n \
         progress, and recovery through IPMI or Redfish BMCs. Runs as the\n \
         pxe-agent user with five capabilities (pxe-agent.service).\n"
    );
    fs::write(stage.join("DEBIAN/control"), control)?;
    fs::write(stage.join("DEBIAN/conffiles"), CONFFILES.join("\n") + "\n")?;
    let deb = out.join(format!("pxe-agent_{version}_{arch}.deb"));
    let status = Command::new("dpkg-deb")
        .args(["--build", "--root-owner-group", "-Zgzip"])
        .arg(&stage)
        .arg(&deb)
        .status()
        .context("failed to run dpkg-deb")?;
    if !status.success() {
        bail!("dpkg-deb failed ({status})");
    }
    fs::remove_dir_all(&stage)?;
    Ok(deb)
}

fn text(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().context("failed to run dpkg")?;
    if !out.status.success() {
        bail!("{cmd:?} failed");
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The size of the files under `dir`, in KiB, as dpkg counts it.
fn du_kib(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            du_kib(&entry.path())? * 1024
        } else {
            meta.len()
        };
    }
    Ok(total.div_ceil(1024))
}

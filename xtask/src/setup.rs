//! Idempotent bootstrap of a Debian 12 machine: the outside programs the
//! tests and the demo drive, the `nightly` toolchain with `rust-src`,
//! bpf-linker built against the nightly's own libLLVM, the network-boot
//! guest's kernel and busybox ([`crate::vm::guest`]), and the Python tools
//! the Kubernetes manifest tests run ([`python_tools_dir`]).
//!
//! Every step checks first and prints one line, so running it again is cheap.
//! It also owns [`command`], which puts `~/.cargo/bin` on the PATH of the
//! toolchain programs it starts.

use std::{
    env,
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::process::{self, output, run_forwarded};

/// Debian packages the tests, demo and benchmarks need.
pub const PACKAGES: &[&str] = &[
    "iproute2",
    // setpriv: the restart tests start the agent with the DaemonSet's
    // capabilities only (Essential, listed so that it is checked).
    "util-linux",
    "ethtool",
    "busybox",
    "udhcpc",
    "isc-dhcp-client",
    "isc-dhcp-relay",
    "dhcpcd5",
    "kea-dhcp4-server",
    // `bench dhcp`: the DHCPv6 peer of the IPv6 rows.
    "kea-dhcp6-server",
    "kea-admin",
    "dnsmasq-base",
    "tcpdump",
    "bpftool",
    "curl",
    "tftp-hpa",
    "atftp",
    "ipxe",
    "iptables",
    // Packet loss on the lab links (fault tests): nf_tables' netdev hooks.
    "nftables",
    // `bench boot`: the TFTP and HTTP servers pxe-agent is compared with.
    "tftpd-hpa",
    "nginx",
    // Network boots with real firmware (`vm`): QEMU, the NICs' iPXE option
    // ROMs, UEFI firmware, and router advertisements so iPXE does not wait
    // for IPv6. The guest's busybox-static is unpacked, not installed: it
    // conflicts with busybox.
    "qemu-system-x86",
    "ipxe-qemu",
    "ovmf",
    "radvd",
    // BMC tests: the IPMI simulator and a reference lanplus client; the
    // openssl CLI makes the Redfish TLS tests' CA and certificate.
    "openipmi",
    "ipmitool",
    "openssl",
    // Manifest tests: a venv for kubernetes-validate and jsonschema
    // (Debian's pip refuses to install outside one).
    "python3-venv",
    // The runtime image without a registry (`image --rootfs`, the image
    // test): mmdebstrap builds its Debian root, podman imports it, and the
    // test runs it with runc, which also copes with hybrid cgroup v1/v2
    // hierarchies; nsenter (util-linux, above) puts podman in the lab's
    // namespace. As root with vfs storage, neither uidmap nor
    // fuse-overlayfs is needed.
    "mmdebstrap",
    "podman",
    "runc",
    // strip: the image's and the Debian package's agent go without their
    // debug info.
    "binutils",
    // systemd-analyze verifies the shipped units; adduser is the Debian
    // package's dependency for its user.
    "systemd",
    "adduser",
    // The alerts' tests (tests/src/monitoring.rs): promtool checks and
    // unit-tests the rules; a real Prometheus scrapes an agent in the lab.
    "prometheus",
    // The fleet page's test: a real browser, headless, driven over the
    // DevTools protocol on a pipe (no WebDriver port needed).
    "chromium",
];

/// PyPI packages of the tests, installed into [`python_tools_dir`]:
/// kubernetes-validate bundles the Kubernetes 1.25-1.37 schemas (offline);
/// it and `deploy/tests/check_crds.py` need jsonschema >= 4.23, newer than
/// Debian's. sushy-tools is the Redfish emulator of the Redfish driver's
/// tests (its fake driver needs no libvirt; pip brings Flask and bcrypt).
pub const PYTHON_TOOLS: &[(&str, &str)] = &[
    ("kubernetes-validate", "1.37.0"),
    ("jsonschema", "4.26.0"),
    ("sushy-tools", "2.2.0"),
];

/// The bpf-linker release the eBPF build is known to work with.
pub const BPF_LINKER_VERSION: &str = "0.13.0";

/// The rustup toolchain that builds the eBPF object (aya-build's default).
pub const NIGHTLY: &str = "nightly";

/// Runs every step; each is skipped when already satisfied.
pub fn run() -> anyhow::Result<()> {
    ensure_packages()?;
    ensure_nightly()?;
    ensure_rust_src()?;
    ensure_bpf_linker()?;
    crate::vm::guest::ensure()?;
    crate::vm::signed::ensure()?;
    ensure_python_tools()?;
    report_kubectl();
    Ok(())
}

/// A command for a toolchain program (`cargo`, `rustup`, `rustc`,
/// `bpf-linker`) with the cargo bin directory on its PATH, so it is found
/// and so nested builds find bpf-linker.
pub fn command(program: &str) -> Command {
    let mut cmd = Command::new(program);
    if let Ok(path) = path_with_cargo_bin() {
        cmd.env("PATH", path);
    }
    cmd
}

/// `$CARGO_HOME/bin`, or `~/.cargo/bin`.
pub fn cargo_bin_dir() -> anyhow::Result<PathBuf> {
    if let Some(home) = env::var_os("CARGO_HOME") {
        return Ok(PathBuf::from(home).join("bin"));
    }
    Ok(home_dir()?.join(".cargo").join("bin"))
}

/// `$XDG_CACHE_HOME/pxe-agent`, or `~/.cache/pxe-agent`.
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    let base = match env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => home_dir()?.join(".cache"),
    };
    Ok(base.join("pxe-agent"))
}

/// The venv holding [`PYTHON_TOOLS`]: `<cache dir>/python`; its `bin/`
/// has `python` and `kubernetes-validate`.
pub fn python_tools_dir() -> anyhow::Result<PathBuf> {
    Ok(cache_dir()?.join("python"))
}

fn home_dir() -> anyhow::Result<PathBuf> {
    env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .context("HOME is not set")
}

/// The current PATH with the cargo bin directory in front, unless already on it.
fn path_with_cargo_bin() -> anyhow::Result<OsString> {
    let bin = cargo_bin_dir()?;
    let current = env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = env::split_paths(&current).collect();
    if !dirs.contains(&bin) {
        dirs.insert(0, bin);
    }
    env::join_paths(dirs).context("PATH contains an invalid entry")
}

fn report(step: &str, state: &str) {
    println!("setup: {step:<20} {state}");
}

fn ensure_packages() -> anyhow::Result<()> {
    let missing = PACKAGES
        .iter()
        .copied()
        .filter(|pkg| !package_installed(pkg))
        .collect::<Vec<_>>();
    if missing.is_empty() {
        report("packages", &format!("ok ({} installed)", PACKAGES.len()));
        return Ok(());
    }
    report("packages", &format!("installing {}", missing.join(" ")));
    process::ensure_root().context("installing packages needs root")?;
    run_forwarded(Command::new("apt-get").arg("update")).context("apt-get update failed")?;
    run_forwarded(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing),
    )
    .context("failed to install packages")
}

fn package_installed(pkg: &str) -> bool {
    let query = output(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]));
    query.is_ok_and(|out| {
        out.status.success() && String::from_utf8_lossy(&out.stdout).ends_with(" installed")
    })
}

/// Installs the nightly toolchain unless rustup lists it.
pub fn ensure_nightly() -> anyhow::Result<()> {
    let list = process::run(command("rustup").args(["toolchain", "list"]))
        .context("rustup is required (https://rustup.rs)")?;
    if list
        .lines()
        .any(|line| line.starts_with(&format!("{NIGHTLY}-")))
    {
        report("nightly toolchain", "ok");
        return Ok(());
    }
    report("nightly toolchain", "installing");
    run_forwarded(command("rustup").args(["toolchain", "install", NIGHTLY, "--profile", "minimal"]))
        .context(
            "the nightly toolchain is missing and could not be installed: \
             install it with `rustup toolchain install nightly` and rerun",
        )
}

fn ensure_rust_src() -> anyhow::Result<()> {
    let installed = process::run(command("rustup").args([
        "component",
        "list",
        "--toolchain",
        NIGHTLY,
        "--installed",
    ]))
    .context("failed to list nightly components")?;
    if installed.lines().any(|line| line.trim() == "rust-src") {
        report("rust-src (nightly)", "ok");
        return Ok(());
    }
    report("rust-src (nightly)", "installing");
    run_forwarded(command("rustup").args(["component", "add", "rust-src", "--toolchain", NIGHTLY]))
        .context("failed to add rust-src to the nightly toolchain")
}

/// The nightly's libLLVM shared library and its LLVM major version.
#[derive(Debug)]
struct NightlyLlvm {
    lib: PathBuf,
    major: u32,
}

fn ensure_bpf_linker() -> anyhow::Result<()> {
    let llvm = find_nightly_llvm()?;
    let prefix = cache_dir()?.join("rust-llvm");
    link_llvm(&llvm, &prefix)?;
    if bpf_linker_ok() {
        report(
            "bpf-linker",
            &format!("ok ({BPF_LINKER_VERSION}, LLVM {})", llvm.major),
        );
        return Ok(());
    }
    report(
        "bpf-linker",
        &format!(
            "installing {BPF_LINKER_VERSION} (LLVM {}, ~1 min)",
            llvm.major
        ),
    );
    run_forwarded(
        command("cargo")
            .env("LLVM_PREFIX", &prefix)
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--force",
            ])
            .args(["--no-default-features", "--features"])
            .arg(format!("llvm-{}", llvm.major)),
    )
    .context("failed to install bpf-linker")?;
    if !bpf_linker_ok() {
        bail!("bpf-linker {BPF_LINKER_VERSION} was installed but does not run");
    }
    Ok(())
}

fn find_nightly_llvm() -> anyhow::Result<NightlyLlvm> {
    let sysroot =
        process::run(command("rustc").args([&format!("+{NIGHTLY}"), "--print", "sysroot"]))
            .context("failed to locate the nightly sysroot")?;
    let lib_dir = Path::new(sysroot.trim()).join("lib");
    let mut names = fs::read_dir(&lib_dir)
        .with_context(|| format!("failed to read {}", lib_dir.display()))?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| llvm_major(name).is_some())
        .collect::<Vec<_>>();
    names.sort();
    let name = names
        .first()
        .with_context(|| format!("no libLLVM.so.*-nightly in {}", lib_dir.display()))?;
    let major = llvm_major(name).context("unreachable: filtered above")?;
    Ok(NightlyLlvm {
        lib: lib_dir.join(name),
        major,
    })
}

/// The LLVM major version in `libLLVM.so.<MAJOR>.<MINOR>-rust-<ver>-nightly`.
fn llvm_major(file_name: &str) -> Option<u32> {
    let rest = file_name.strip_prefix("libLLVM.so.")?;
    if !rest.ends_with("-nightly") {
        return None;
    }
    let digits = rest.split(|c: char| !c.is_ascii_digit()).next()?;
    digits.parse().ok()
}

/// Puts the nightly's libLLVM into `<prefix>/lib` under two names:
/// `libLLVM.so`, which bpf-linker's build links against (`LLVM_PREFIX`), and
/// the library's own file name (its soname), which the built binary asks the
/// loader for at run time through its rpath to `<prefix>/lib`.
fn link_llvm(llvm: &NightlyLlvm, prefix: &Path) -> anyhow::Result<()> {
    let lib_dir = prefix.join("lib");
    fs::create_dir_all(&lib_dir)
        .with_context(|| format!("failed to create {}", lib_dir.display()))?;
    let soname = llvm
        .lib
        .file_name()
        .context("libLLVM path has no file name")?;
    let mut changed = false;
    for name in [OsString::from("libLLVM.so"), soname.to_owned()] {
        changed |= ensure_symlink(&llvm.lib, &lib_dir.join(name))?;
    }
    let state = if changed { "linked" } else { "ok" };
    report(
        "nightly libLLVM",
        &format!("{state} ({})", llvm.lib.display()),
    );
    Ok(())
}

/// Makes `link` a symlink to `target`; returns whether it had to change.
fn ensure_symlink(target: &Path, link: &Path) -> anyhow::Result<bool> {
    if fs::read_link(link).is_ok_and(|current| current == target) {
        return Ok(false);
    }
    match fs::remove_file(link) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            return Err(err).with_context(|| format!("failed to replace {}", link.display()));
        }
        _ => {}
    }
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("failed to link {} to {}", link.display(), target.display()))?;
    Ok(true)
}

/// Creates the venv with Debian's python3 (not a per-user interpreter that
/// may move) and installs [`PYTHON_TOOLS`] at their pinned versions.
fn ensure_python_tools() -> anyhow::Result<()> {
    let venv = python_tools_dir()?;
    let python = venv.join("bin").join("python");
    let wanted = PYTHON_TOOLS
        .iter()
        .map(|(name, version)| format!("{name}=={version}"))
        .collect::<Vec<_>>();
    if python_tools_ok(&python) {
        report("python tools", &format!("ok ({})", wanted.join(" ")));
        return Ok(());
    }
    report(
        "python tools",
        &format!("installing {} into {}", wanted.join(" "), venv.display()),
    );
    if !python.exists() {
        run_forwarded(
            Command::new("/usr/bin/python3")
                .arg("-m")
                .arg("venv")
                .arg(&venv),
        )
        .context("failed to create the venv for the manifest tests (python3-venv)")?;
    }
    run_forwarded(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(&wanted),
    )
    .context("failed to install the manifest tests' Python tools from PyPI")?;
    if !python_tools_ok(&python) {
        bail!("{} were installed but are not importable", wanted.join(" "));
    }
    Ok(())
}

/// True when the venv has every [`PYTHON_TOOLS`] package at its version.
fn python_tools_ok(python: &Path) -> bool {
    let Ok(out) = process::run(Command::new(python).args(["-m", "pip", "list", "--format=freeze"]))
    else {
        return false;
    };
    PYTHON_TOOLS.iter().all(|(name, version)| {
        out.lines()
            .any(|line| line.eq_ignore_ascii_case(&format!("{name}=={version}")))
    })
}

/// kubectl (with its built-in Kustomize) builds the manifests in the tests.
/// It is not a Debian 12 package, so setup only reports it.
fn report_kubectl() {
    match process::run(Command::new("kubectl").args(["version", "--client"])) {
        Ok(out) => {
            let version = out.lines().next().unwrap_or_default().trim().to_owned();
            report("kubectl", &format!("ok ({version})"));
        }
        Err(_) => report(
            "kubectl",
            "MISSING: the manifest tests need kubectl >= 1.27 (Kustomize v5) on PATH",
        ),
    }
}

/// True when `bpf-linker --version` runs and reports [`BPF_LINKER_VERSION`].
fn bpf_linker_ok() -> bool {
    process::run(command("bpf-linker").arg("--version")).is_ok_and(|out| {
        out.split_whitespace()
            .any(|word| word == BPF_LINKER_VERSION)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_major_comes_from_the_file_name() {
        assert_eq!(llvm_major("libLLVM.so.22.1-rust-1.97.0-nightly"), Some(22));
        assert_eq!(llvm_major("libLLVM.so.19.1-rust-1.84.0-nightly"), Some(19));
        assert_eq!(llvm_major("libLLVM-22-rust-1.97.0-nightly.so"), None);
        assert_eq!(llvm_major("libLLVM.so.22.1-rust-1.95.0-stable"), None);
    }
}

//! `cargo xtask bench <what>`: benchmarks that need root, network namespaces
//! and outside programs. One module per benchmark; this one owns only the
//! subcommand list.

pub(crate) mod boot;
pub(crate) mod dhcp;
mod scale;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum Bench {
    /// DORA rate, latency and CPU of pxe-agent, Kea and dnsmasq serving the
    /// same reservations, with perfdhcp (relayed) and dhcp-loadgen (direct
    /// PXE broadcasts), and over DHCPv6 with perfdhcp -6 (`--family`);
    /// refreshes the tables in docs/benchmarks.md.
    Dhcp(dhcp::Args),
    /// TFTP (ipxe.efi, 20 MiB) against tftpd-hpa and 100 concurrent HTTP
    /// downloads against nginx; refreshes docs/benchmarks-boot.md.
    Boot(boot::Args),
    /// What a fleet-sized inventory (1,000 to 250,000 hosts, every boot
    /// class) costs the agent: time to ready, memory, map memory, reloads
    /// and kernel time per reply; writes target/bench/scale.md.
    Scale(scale::Args),
}

pub fn run(bench: Bench) -> anyhow::Result<()> {
    match bench {
        Bench::Dhcp(args) => dhcp::run(args),
        Bench::Boot(args) => boot::run(args),
        Bench::Scale(args) => scale::run(args),
    }
}

/// The lab's namespaces (`<prefix>-<pid>-…`) go when it drops; says so if
/// any did not.
fn warn_leftover_namespaces(prefix: &str) {
    let ours = format!("{prefix}-{}-", std::process::id());
    match xtask::process::run(std::process::Command::new("ip").args(["netns", "list"])) {
        Ok(list) => {
            for ns in list.lines().filter(|l| l.starts_with(&ours)) {
                eprintln!("warning: namespace {ns} is still there");
            }
        }
        Err(err) => eprintln!("warning: {err:#}"),
    }
}

/// Builds `packages` in release mode (with `extra` cargo arguments) and
/// returns the paths of `bins` in the release directory, each checked to
/// exist.
fn build_release(
    packages: &[&str],
    extra: &[&str],
    bins: &[&str],
) -> anyhow::Result<Vec<std::path::PathBuf>> {
    build(true, packages, extra, bins)
}

/// Builds `packages` (with `extra` cargo arguments), in release mode with
/// `release`, and returns the paths of `bins` in that profile's directory,
/// each checked to exist.
pub(crate) fn build(
    release: bool,
    packages: &[&str],
    extra: &[&str],
    bins: &[&str],
) -> anyhow::Result<Vec<std::path::PathBuf>> {
    use anyhow::Context as _;
    let mut args = vec!["build"];
    if release {
        args.push("--release");
    }
    for package in packages {
        args.extend(["-p", package]);
    }
    args.extend(extra);
    xtask::process::run_forwarded(
        xtask::setup::command("cargo")
            .current_dir(xtask::workspace_root())
            .args(&args),
    )
    .with_context(|| format!("failed to build {}", bins.join(" and ")))?;
    let profile = xtask::target_dir().join(if release { "release" } else { "debug" });
    bins.iter()
        .map(|bin| {
            let path = profile.join(bin);
            anyhow::ensure!(path.exists(), "{} missing after the build", path.display());
            Ok(path)
        })
        .collect()
}

/// Output of `cmd`, trimmed.
pub(crate) fn run_text(cmd: &mut std::process::Command) -> anyhow::Result<String> {
    Ok(xtask::process::run(cmd)?.trim().to_owned())
}

/// The CPU model, for the results' header line.
pub(crate) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// A run's configuration files and logs, removed on drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> anyhow::Result<Scratch> {
        use anyhow::Context as _;
        let dir = std::env::temp_dir().join(format!("pxe-bench-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("failed to create {}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

//! `cargo xtask bench <what>`: benchmarks that need root, network namespaces
//! and outside programs. One module per benchmark; this one owns only the
//! subcommand list.

mod boot;
mod dhcp;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum Bench {
    /// DORA rate, latency and CPU of pxe-agent, Kea and dnsmasq serving the
    /// same reservations, with perfdhcp (relayed) and dhcp-loadgen (direct
    /// PXE broadcasts); refreshes the table in docs/benchmarks.md.
    Dhcp(dhcp::Args),
    /// TFTP (ipxe.efi, 20 MiB) against tftpd-hpa and 100 concurrent HTTP
    /// downloads against nginx; refreshes docs/benchmarks-boot.md.
    Boot(boot::Args),
}

pub fn run(bench: Bench) -> anyhow::Result<()> {
    match bench {
        Bench::Dhcp(args) => dhcp::run(args),
        Bench::Boot(args) => boot::run(args),
    }
}

/// Output of `cmd`, trimmed.
fn run_text(cmd: &mut std::process::Command) -> anyhow::Result<String> {
    Ok(xtask::process::run(cmd)?.trim().to_owned())
}

/// The CPU model, for the results' header line.
fn cpu_model() -> String {
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

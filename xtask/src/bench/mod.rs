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

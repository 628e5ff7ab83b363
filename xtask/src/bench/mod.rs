//! `cargo xtask bench <what>`: benchmarks that need root, network namespaces
//! and outside programs. One module per benchmark; this one owns only the
//! subcommand list.

mod dhcp;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum Bench {
    /// DORA rate, latency and CPU of pxe-agent, Kea and dnsmasq serving the
    /// same reservations, with perfdhcp (relayed) and dhcp-loadgen (direct
    /// PXE broadcasts); refreshes the table in docs/benchmarks.md.
    Dhcp(dhcp::Args),
}

pub fn run(bench: Bench) -> anyhow::Result<()> {
    match bench {
        Bench::Dhcp(args) => dhcp::run(args),
    }
}

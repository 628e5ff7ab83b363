//! The command line: its flags and subcommands ([`Cli`], [`Command`]), one
//! module for what each subcommand (or family of them) does with the
//! library, and what they share: how to reach the agent ([`agent`]) and
//! the runtime ([`runtime`]).

pub mod agent;
pub mod bmc;
pub mod check;
pub mod hosts;
pub mod import;
pub mod leases;
pub mod oob;
pub mod run;
pub mod runtime;
pub mod stats;
pub mod status;
pub mod trace;
pub mod xdp;

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
};

use clap::{Parser, Subcommand};
use pxe_agent::client::DEFAULT_METRICS;

use self::{
    agent::{AgentCall, ApiArgs, Output},
    bmc::BmcCommand,
    hosts::HostsAction,
    import::{ExportTo, ImportFrom},
    oob::Select,
    run::RunArgs,
};

#[derive(Parser)]
#[command(
    version,
    about = "XDP-accelerated network-boot responder for bare-metal fleets"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "parsed once at start; `run` simply has the most flags"
)]
pub enum Command {
    /// Attach the fast path to an interface and serve the inventory until
    /// SIGINT or SIGTERM (needs CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON or root).
    Run(RunArgs),
    /// Remove what `run --pin-dir DIR` left pinned: detach the XDP link of
    /// each interface (all under DIR unless --interface is given) and
    /// remove its map pins. For uninstalling; a restart must not run it.
    Detach {
        /// The directory `run --pin-dir` pinned under (on bpffs).
        #[arg(long, value_name = "DIR")]
        pin_dir: PathBuf,
        /// Only this interface (repeat for several); default every
        /// interface pinned under DIR.
        #[arg(long, short, value_name = "IFACE")]
        interface: Vec<String>,
    },
    /// Act on hosts' BMCs through the running agent (or, with --direct,
    /// straight from the inventory).
    Bmc {
        #[command(subcommand)]
        command: BmcCommand,
    },
    /// Hand hosts to the running agent's recovery controller: set the boot
    /// device to PXE, power on or cycle, and watch the boot chain.
    Recover {
        /// Hosts by name or MAC (or select them with --all or --label).
        #[arg(value_name = "HOST")]
        hosts: Vec<String>,
        #[command(flatten)]
        select: Select,
    },
    /// Validate inventory files, or Kubernetes manifests (BootNetwork,
    /// BootProfile, BootHost and BareMetalHost objects; directories are read
    /// file by file) with the conversion `run --kube` applies, without
    /// running.
    Check {
        /// Inventory files, manifest files or directories of manifests.
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
        /// Secret manifests (files or directories) holding the BMC
        /// credentials the objects name; without them, and without Secrets
        /// among the manifests, credentials are not checked.
        #[arg(long, value_name = "PATH")]
        secrets: Vec<PathBuf>,
        /// Check that the TFTP and HTTP boot files the profiles name are
        /// in this directory, as `run --boot-root DIR` would serve them.
        #[arg(long, value_name = "DIR")]
        boot_root: Option<PathBuf>,
        /// Check that the `/artifacts/` files the profiles name (kernels,
        /// initrds) are in this directory, as `run --artifacts DIR` would
        /// serve them.
        #[arg(long, value_name = "DIR")]
        artifacts: Option<PathBuf>,
        /// Server address to expand `{server}` with (the longest address is
        /// assumed otherwise, so size checks hold for any server).
        #[arg(long)]
        server_ip: Option<Ipv4Addr>,
        /// Check against maps of this many host entries, as `run
        /// --map-capacity N` would make them.
        #[arg(long, value_name = "N")]
        map_capacity: Option<u32>,
    },
    /// Lab helper: attach a pass-through XDP program to the far end of a veth
    /// pair so it receives the fast path's XDP_TX replies, until SIGINT or
    /// SIGTERM. Real NICs do not need this; hidden from the command list.
    #[command(hide = true)]
    VethPeer {
        /// The veth end the clients send from.
        #[arg(long, short, value_name = "IFACE")]
        interface: String,
        /// Instead of passing frames up, redirect every frame the interface
        /// receives to this one (a veth end): its peer then receives them as
        /// XDP frames in page buffers, as from a NIC, rather than as socket
        /// buffers veth copies before running XDP. Benchmarks use it.
        #[arg(long, value_name = "IFACE")]
        redirect_to: Option<String>,
    },
    /// The running agent at a glance: ready or not and why, each
    /// interface's XDP attach mode, the inventory in force, hosts per boot
    /// stage, and the peers; when no agent answers, the XDP programs it
    /// left pinned that still answer. Exits 1 while the agent is not ready
    /// or not reachable.
    Status {
        /// Print text, or the agent's JSON.
        #[arg(long, alias = "output", value_enum, default_value_t = Output::Table)]
        format: Output,
        #[command(flatten)]
        api: ApiArgs,
        /// The agent's `run --pin-dir`: when the agent does not answer,
        /// the programs pinned there and still attached are reported (they
        /// keep answering known hosts).
        #[arg(long, value_name = "DIR", default_value = pxe_agent::xdp::pin::DEFAULT_DIR)]
        pin_dir: PathBuf,
    },
    /// Print the counters of the running agent.
    Stats {
        /// The agent's metrics address (`run --metrics-addr`).
        #[arg(long, default_value = DEFAULT_METRICS)]
        metrics_addr: SocketAddr,
    },
    /// List the running agent's hosts with their boot progress; with
    /// --discovered, the unknown clients that asked for DHCP (to adopt into
    /// the inventory).
    Hosts {
        /// The unknown clients that asked for DHCP instead of the hosts.
        #[arg(long)]
        discovered: bool,
        /// Print a table, or the agent's JSON.
        #[arg(long, alias = "output", value_enum, default_value_t = Output::Table)]
        format: Output,
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        action: Option<HostsAction>,
    },
    /// List the running agent's pool leases.
    Leases {
        /// Print a table, or the agent's JSON.
        #[arg(long, alias = "output", value_enum, default_value_t = Output::Table)]
        format: Output,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Follow one machine (by MAC or host name) live through both paths, one line per event until
    /// Ctrl-C: the XDP verdict (tx_offer, pass_ipxe, ...), the slow path's
    /// answer or why it ignored the request, TFTP and HTTP fetches, the
    /// phone-home. tcpdump does not see replies the XDP program sends.
    Trace {
        /// The machine: its MAC address, or the host name of an inventory
        /// host.
        #[arg(value_name = "MAC|HOST")]
        host: String,
        #[command(flatten)]
        api: ApiArgs,
        /// Exit after this many events.
        #[arg(long, value_name = "N")]
        count: Option<u64>,
    },
    /// Translate a dnsmasq or Kea configuration into an inventory (what
    /// could not be translated is reported with its file and line), or
    /// carry their live leases into the agent's lease store.
    Import {
        #[command(subcommand)]
        from: ImportFrom,
    },
    /// Write an inventory's reservations in another server's format.
    Export {
        #[command(subcommand)]
        to: ExportTo,
    },
    /// Arm a `netboot: once` host to be given its boot file again and, with
    /// a BMC, hand it to the recovery controller (PXE, power cycle) so it
    /// provisions now.
    Reprovision {
        /// The host, by name or MAC.
        host: String,
        /// Only arm it: no BMC call; it provisions at its next network boot.
        #[arg(long)]
        no_power: bool,
        #[command(flatten)]
        agent: AgentCall,
    },
}

impl Cli {
    /// Parses `args`, refusing as clap does what its attributes cannot
    /// say: `--api-auth kubernetes` with `--api-token-file`.
    pub fn try_parse_checked<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let cli = Cli::try_parse_from(args)?;
        if let Command::Run(run) = &cli.command {
            run.check()?;
        }
        Ok(cli)
    }
}

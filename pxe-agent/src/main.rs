//! Command line: `run`, `detach`, `check`, `stats`, `hosts`, `leases`,
//! `trace`, `bmc`, `recover`, `import`, `export`.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

mod cli;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use pxe_agent::{
    app::{self, ApiAuth, ApiConfig, OobConfig, RunConfig},
    client::DEFAULT_METRICS,
    dhcp::{Server, server::Limits},
    http::{limit, tls::TlsFiles},
    inventory::{self, LoadError, MacAddr},
    logging::{self, LogFormat},
    ratelimit::Rate,
    recovery::{self, SequencePolicy},
    tftp,
    xdp::{AttachMode, Capacity, VethPeer},
};
use tokio::sync::watch;

use crate::cli::{
    agent::{AgentCall, ApiArgs, Output},
    bmc::BmcCommand,
    hosts::HostsAction,
    import::{ExportTo, ImportFrom},
    oob::{EchoArg, Select},
    runtime::{block_on_signal, runtime, wait_for_signal},
};

#[derive(Parser)]
#[command(
    version,
    about = "XDP-accelerated network-boot responder for bare-metal fleets"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "parsed once at start; `run` simply has the most flags"
)]
enum Command {
    /// Attach the fast path to an interface and serve the inventory until
    /// SIGINT or SIGTERM (needs CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON or root).
    Run {
        /// Provisioning interface to serve, as NAME or NAME=SERVER_IP;
        /// repeat it to serve several (VLAN sub-interfaces such as
        /// eth0.100 included). Each gets its own XDP program, slow-path
        /// and TFTP sockets, and answers the hosts of the subnets holding
        /// its address (plus relayed requests) as SERVER_IP, by default
        /// the interface's IPv4 address.
        #[arg(
            long,
            short,
            required_unless_present = "interface_dir",
            value_name = "NAME[=SERVER_IP]"
        )]
        interface: Vec<app::Interface>,
        /// This node's name: it picks this node's file in --interface-dir
        /// and is written to the BootHosts it serves (`status.servingNode`).
        /// Defaults to the host name.
        #[arg(long, env = "NODE_NAME")]
        node_name: Option<String>,
        /// Instead of --interface: read this node's interfaces from
        /// DIR/<node name>, else DIR/default, one NAME[=SERVER_IP] a line
        /// (a ConfigMap keyed by node name, mounted at DIR).
        #[arg(long, value_name = "DIR", conflicts_with = "interface")]
        interface_dir: Option<PathBuf>,
        /// Inventory file (YAML); watched and reloaded on change. Exactly
        /// one of --inventory and --kube.
        #[arg(long, required_unless_present = "kube", conflicts_with = "kube")]
        inventory: Option<PathBuf>,
        /// Read the inventory from the Kubernetes API (BootHost, BootProfile
        /// and BootNetwork objects) instead of a file: in-cluster
        /// configuration, else KUBECONFIG.
        #[arg(long)]
        kube: bool,
        /// Namespace of the objects (and of the slot Leases of --peers
        /// kube); defaults to the service account's namespace, else the
        /// kubeconfig's, else `default`.
        #[arg(long, env = "POD_NAMESPACE")]
        kube_namespace: Option<String>,
        /// Also read Metal3 BareMetalHosts matching this label selector as
        /// hosts (never written to).
        #[arg(long, requires = "kube", value_name = "SELECTOR")]
        metal3_selector: Option<String>,
        /// At most this many status patches and Events a second.
        #[arg(long, default_value_t = 10, requires = "kube")]
        kube_status_qps: u32,
        /// Server address in replies (option 54, source address) when one
        /// interface is served; the same as --interface NAME=SERVER_IP.
        /// Defaults to the interface's IPv4 address.
        #[arg(long)]
        server_ip: Option<Ipv4Addr>,
        /// Address serving /metrics and /healthz, for Prometheus and the
        /// kubelet: open, with no per-host identifier.
        #[arg(long, default_value = DEFAULT_METRICS)]
        metrics_addr: SocketAddr,
        /// Address serving the JSON API (/api/v1). Beyond loopback, every
        /// call needs an identity (--api-token-file or --api-auth
        /// kubernetes), or the agent refuses to start.
        #[arg(long, default_value_t = ApiConfig::default().addr)]
        api_addr: SocketAddr,
        /// Serve the JSON API over TLS (1.2 and 1.3) with this certificate
        /// (PEM, its chain after it); both files are reloaded when they
        /// change. Needs --api-tls-key.
        #[arg(long, value_name = "FILE", requires = "api_tls_key")]
        api_tls_cert: Option<PathBuf>,
        /// The private key of --api-tls-cert (PEM).
        #[arg(long, value_name = "FILE", requires = "api_tls_cert")]
        api_tls_key: Option<PathBuf>,
        /// XDP attach mode: auto tries native and falls back to generic.
        #[arg(long, value_enum, default_value_t = AttachMode::Auto)]
        xdp_mode: AttachMode,
        /// How often to check the inventory file for changes, in milliseconds.
        #[arg(long, default_value_t = 250)]
        reload_ms: u64,
        /// Directory for the lease database.
        #[arg(long, default_value = "/var/lib/pxe-agent")]
        state_dir: PathBuf,
        /// Slow-path requests per second one MAC may send (burst: twice that).
        #[arg(long, default_value_t = 10.0)]
        rate_per_mac: f64,
        /// Slow-path requests per second all unknown MACs together may send.
        #[arg(long, default_value_t = 2000.0)]
        rate_unknown: f64,
        /// Address of the boot HTTP server: iPXE scripts (/boot/<mac>.ipxe),
        /// boot files (/), artifacts (/artifacts/) and the phone-home.
        /// The default iPXE script URL uses its port.
        #[arg(
            long,
            default_value_t = SocketAddr::from((Ipv4Addr::UNSPECIFIED, inventory::DEFAULT_HTTP_PORT)),
        )]
        http_addr: SocketAddr,
        /// Boot HTTP connections served at once; more wait in the listen
        /// backlog until one ends. Each holds up to two open files; the
        /// agent lowers this to what its open-files limit holds.
        #[arg(long, default_value_t = limit::DEFAULT_MAX_CONNECTIONS as u32,
              value_parser = clap::value_parser!(u32).range(1..))]
        http_max_connections: u32,
        /// Milliseconds a boot HTTP client has to send a whole request head,
        /// from its connection (or its previous response) on; also the
        /// keep-alive idle time.
        #[arg(long, default_value_t = limit::DEFAULT_HEADER_TIMEOUT.as_millis() as u64,
              value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
        http_header_timeout_ms: u64,
        /// Milliseconds a boot HTTP response may wait for the client to read
        /// before the connection is dropped.
        #[arg(long, default_value_t = limit::DEFAULT_WRITE_TIMEOUT.as_millis() as u64,
              value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
        http_write_timeout_ms: u64,
        /// Directory of boot files (iPXE binaries), served over HTTP at /
        /// and over TFTP (UDP port 69).
        #[arg(long)]
        boot_root: Option<PathBuf>,
        /// Largest TFTP windowsize (RFC 7440) granted to clients that ask
        /// for one: blocks sent before waiting for an ACK, 1 to 64. Each
        /// transfer holds up to this many blocks in memory.
        #[arg(
            long,
            default_value_t = tftp::DEFAULT_MAX_WINDOWSIZE,
            value_parser = clap::value_parser!(u16).range(1..=i64::from(tftp::option::MAX_WINDOWSIZE)),
        )]
        tftp_max_windowsize: u16,
        /// TFTP transfers served at once; read requests beyond it wait for
        /// a slot (--tftp-max-waiting). Each transfer holds a thread, a
        /// socket, an open file and an eventfd; the agent lowers this to
        /// what its open-files limit holds.
        #[arg(long, default_value_t = tftp::DEFAULT_MAX_TRANSFERS as u32,
              value_parser = clap::value_parser!(u32).range(1..))]
        tftp_max_transfers: u32,
        /// TFTP read requests held, first come first served, while
        /// --tftp-max-transfers run; past it, requests get ERROR 0 "server
        /// busy", which firmware answers by asking again. 0 refuses at once.
        #[arg(long, default_value_t = tftp::DEFAULT_MAX_WAITING as u32)]
        tftp_max_waiting: u32,
        /// Microseconds a TFTP transfer polls its socket for the client's
        /// answer before it sleeps (0: never). A quick answer is then caught
        /// without a wake-up, which can make lock-step transfers several
        /// times faster; at most half the CPUs' worth of transfers poll at
        /// once, so a storm of transfers does not burn every CPU.
        #[arg(long, default_value_t = tftp::DEFAULT_BUSY_POLL.as_micros() as u64, value_name = "US")]
        tftp_busy_poll_us: u64,
        /// Directory of kernels, initrds and images, served at /artifacts/.
        #[arg(long)]
        artifacts: Option<PathBuf>,
        /// Log lines as text, or as one JSON object a line (level, message,
        /// target, timestamp and the event's fields).
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
        /// BMC calls running at once, recovery and operators' together.
        #[arg(long, default_value_t = SequencePolicy::default().max_in_flight)]
        bmc_concurrency: usize,
        /// Power-ups (power on, cycle, reset) per second, on average.
        #[arg(long, default_value_t = SequencePolicy::default().power_ups_per_second)]
        power_ons_per_second: f64,
        /// Hold power-ups while this many hosts are awaiting a boot stage.
        #[arg(long, default_value_t = SequencePolicy::default().max_awaiting)]
        max_awaiting: usize,
        /// Hold power-ups while the DHCP slow path receives more requests
        /// per second than this.
        #[arg(long, default_value_t = SequencePolicy::default().max_slow_path_rate)]
        slow_path_rate_threshold: f64,
        /// Bearer tokens of the API, one `name token` a line; the name goes
        /// to the audit log. With it every API call needs a token; without
        /// it reads are open (on loopback only) and acting calls refused.
        #[arg(long, value_name = "FILE")]
        api_token_file: Option<PathBuf>,
        /// How API callers are identified: `tokens`, by --api-token-file;
        /// `kubernetes`, by the Kubernetes API server (in-cluster
        /// configuration, else KUBECONFIG, with or without --kube): the
        /// bearer token with a TokenReview, each call with a
        /// SubjectAccessReview of its verb (read, power, bootdev, recover,
        /// reprovision, netboot-done) on boothosts/api in group
        /// pxe-agent.io, in --kube-namespace. Not with --api-token-file.
        #[arg(long, value_enum, default_value_t = ApiAuthArg::Tokens)]
        api_auth: ApiAuthArg,
        /// Audit log of every BMC call (JSON lines); default
        /// <state-dir>/audit.jsonl.
        #[arg(long, value_name = "FILE")]
        audit_log: Option<PathBuf>,
        /// What the BMCs keep of the boot flags, which the read-back after
        /// a boot-device set compares: full, or device-only for BMCs that
        /// keep only the device (OpenIPMI's ipmi_sim).
        #[arg(long, value_enum, default_value_t = EchoArg::Full)]
        bmc_boot_flag_echo: EchoArg,
        /// Milliseconds a recovery waits after a failed attempt before the
        /// next; doubled for each further attempt, up to ten minutes.
        #[arg(
            long,
            default_value_t = recovery::Policy::default().backoff_initial.as_millis() as u64,
            value_name = "MS"
        )]
        recovery_backoff_ms: u64,
        /// Pin each interface's XDP link and maps in DIR/<interface>/ (DIR
        /// on bpffs, e.g. /sys/fs/bpf/pxe-agent): the program keeps
        /// answering known hosts after the agent exits, and the next agent
        /// adopts it, replacing it atomically when its version differs.
        /// `pxe-agent detach` removes it. Without it, exit detaches.
        #[arg(long, value_name = "DIR")]
        pin_dir: Option<PathBuf>,
        /// Host entries (MACs) the fast path's maps hold. Without it, twice
        /// what the inventory at start needs (at least 262,144): a reload that
        /// needs more is refused, naming this flag.
        #[arg(long, value_name = "N")]
        map_capacity: Option<u32>,
        #[command(flatten)]
        peers: PeerArgs,
    },
    /// Remove what `run --pin-dir DIR` left pinned: detach the XDP link of
    /// each interface (all under DIR unless --interface is given) and
    /// remove its map pins. For uninstalling; a restart must not run it.
    Detach {
        #[arg(long, value_name = "DIR")]
        pin_dir: PathBuf,
        #[arg(long, short)]
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
        hosts: Vec<String>,
        #[command(flatten)]
        select: Select,
    },
    /// Validate an inventory file without running.
    Check {
        file: PathBuf,
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
    /// SIGTERM. Real NICs do not need this.
    VethPeer {
        #[arg(long, short)]
        interface: String,
        /// Instead of passing frames up, redirect every frame the interface
        /// receives to this one (a veth end): its peer then receives them as
        /// XDP frames in page buffers, as from a NIC, rather than as socket
        /// buffers veth copies before running XDP. Benchmarks use it.
        #[arg(long, value_name = "IFACE")]
        redirect_to: Option<String>,
    },
    /// Print the counters of the running agent.
    Stats {
        #[arg(long, default_value = DEFAULT_METRICS)]
        metrics_addr: SocketAddr,
    },
    /// List the running agent's hosts with their boot progress; with
    /// --discovered, the unknown clients that asked for DHCP (to adopt into
    /// the inventory).
    Hosts {
        #[arg(long)]
        discovered: bool,
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        action: Option<HostsAction>,
    },
    /// List the running agent's pool leases.
    Leases {
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Follow one machine live through both paths, one line per event until
    /// Ctrl-C: the XDP verdict (tx_offer, pass_ipxe, ...), the slow path's
    /// answer or why it ignored the request, TFTP and HTTP fetches, the
    /// phone-home. tcpdump does not see replies the XDP program sends.
    Trace {
        mac: MacAddr,
        #[command(flatten)]
        api: ApiArgs,
        /// Exit after this many events.
        #[arg(long, value_name = "N")]
        count: Option<u64>,
    },
    /// Translate a dnsmasq or kea-dhcp4 configuration into an inventory;
    /// what could not be translated is reported with its file and line.
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
        host: String,
        /// Only arm it: no BMC call; it provisions at its next network boot.
        #[arg(long)]
        no_power: bool,
        #[command(flatten)]
        agent: AgentCall,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ApiAuthArg {
    Tokens,
    Kubernetes,
}

impl Cli {
    /// Parses `args`, refusing as clap does what its attributes cannot
    /// say: `--api-auth kubernetes` with `--api-token-file`.
    fn try_parse_checked<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let cli = Cli::try_parse_from(args)?;
        if let Command::Run {
            api_auth: ApiAuthArg::Kubernetes,
            api_token_file: Some(_),
            ..
        } = &cli.command
        {
            return Err(<Cli as clap::CommandFactory>::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                "the argument '--api-auth kubernetes' cannot be used with '--api-token-file \
                 <FILE>'",
            ));
        }
        Ok(cli)
    }
}

fn main() -> ExitCode {
    app::limit_heap_arenas();
    let cli = Cli::try_parse_checked(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let format = match &cli.command {
        Command::Run { log_format, .. } => *log_format,
        _ => LogFormat::Text,
    };
    let subscriber = logging::subscriber(format, logging::filter(), std::io::stderr);
    if let Err(e) = tracing::subscriber::set_global_default(subscriber) {
        eprintln!("error: failed to set up logging: {e}");
        return ExitCode::FAILURE;
    }
    match dispatch(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The machine's host name, the default node name.
fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Run {
            interface,
            node_name,
            interface_dir,
            inventory,
            kube,
            kube_namespace,
            metal3_selector,
            kube_status_qps,
            server_ip,
            metrics_addr,
            api_addr,
            api_tls_cert,
            api_tls_key,
            xdp_mode,
            reload_ms,
            state_dir,
            rate_per_mac,
            rate_unknown,
            http_addr,
            http_max_connections,
            http_header_timeout_ms,
            http_write_timeout_ms,
            boot_root,
            tftp_max_windowsize,
            tftp_max_transfers,
            tftp_max_waiting,
            tftp_busy_poll_us,
            artifacts,
            log_format: _,
            bmc_concurrency,
            power_ons_per_second,
            max_awaiting,
            slow_path_rate_threshold,
            api_token_file,
            api_auth,
            audit_log,
            bmc_boot_flag_echo,
            recovery_backoff_ms,
            pin_dir,
            map_capacity,
            peers,
        } => {
            anyhow::ensure!(
                bmc_concurrency > 0 && power_ons_per_second > 0.0 && slow_path_rate_threshold > 0.0,
                "--power-ons-per-second and --slow-path-rate-threshold must be positive"
            );
            anyhow::ensure!(
                rate_per_mac > 0.0 && rate_unknown > 0.0,
                "rates must be positive"
            );
            anyhow::ensure!(kube_status_qps > 0, "--kube-status-qps must be positive");
            let node_name = match node_name {
                Some(name) => name,
                None => host_name()?,
            };
            let peers = peers.config(kube_namespace.clone(), &node_name)?;
            let auth = match api_auth {
                ApiAuthArg::Tokens => ApiAuth::Tokens,
                ApiAuthArg::Kubernetes => ApiAuth::Kubernetes {
                    namespace: kube_namespace.clone(),
                },
            };
            let kube = kube.then(|| pxe_agent::kube::KubeSettings {
                namespace: kube_namespace,
                node_name: node_name.clone(),
                metal3_selector,
                status_qps: kube_status_qps,
            });
            let cfg = RunConfig {
                peers,
                interfaces: with_server_ip(
                    interfaces(interface, interface_dir, &node_name)?,
                    server_ip,
                )?,
                inventory: inventory.unwrap_or_default(),
                kube,
                metrics_addr,
                api: ApiConfig {
                    addr: api_addr,
                    tls: api_tls_cert
                        .zip(api_tls_key)
                        .map(|(cert, key)| TlsFiles { cert, key }),
                    token_file: api_token_file,
                    auth,
                },
                xdp_mode,
                reload_interval: Duration::from_millis(reload_ms.max(10)),
                state_dir,
                limits: Limits {
                    per_mac: Rate {
                        per_sec: rate_per_mac,
                        burst: 2.0 * rate_per_mac,
                    },
                    unknown: Rate {
                        per_sec: rate_unknown,
                        burst: rate_unknown,
                    },
                    tracked_macs: 65_536,
                },
                http_addr,
                http_limits: limit::Limits {
                    max_connections: http_max_connections as usize,
                    header_timeout: Duration::from_millis(http_header_timeout_ms),
                    write_timeout: Duration::from_millis(http_write_timeout_ms),
                },
                boot_root,
                tftp_max_windowsize,
                tftp_max_transfers: tftp_max_transfers as usize,
                tftp_max_waiting: tftp_max_waiting as usize,
                tftp_busy_poll: Duration::from_micros(tftp_busy_poll_us),
                artifacts,
                oob: OobConfig {
                    sequence: SequencePolicy {
                        max_in_flight: bmc_concurrency,
                        power_ups_per_second: power_ons_per_second,
                        max_awaiting,
                        max_slow_path_rate: slow_path_rate_threshold,
                        ..SequencePolicy::default()
                    },
                    audit_log,
                    boot_flag_echo: bmc_boot_flag_echo.into(),
                    recovery: recovery::Policy {
                        backoff_initial: Duration::from_millis(recovery_backoff_ms),
                        ..recovery::Policy::default()
                    },
                },
                pin_dir,
                map_capacity,
            };
            run(cfg)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Import { from } => cli::import::import(from),
        Command::Export { to } => cli::import::export(to),
        Command::Check {
            file,
            server_ip,
            map_capacity,
        } => {
            let server = Server {
                ip: server_ip.unwrap_or(Ipv4Addr::BROADCAST),
                mac: [0; 6],
            };
            let checked = app::prepare(&file, &server, inventory::DEFAULT_HTTP_PORT).and_then(
                |(inv, compiled)| {
                    let capacity = Capacity::for_inventory([&compiled], map_capacity);
                    capacity
                        .fits(&compiled, inv.hosts.len())
                        .map_err(|problem| LoadError::Invalid {
                            path: file.clone(),
                            problems: vec![problem],
                        })?;
                    Ok((inv, compiled, capacity))
                },
            );
            match checked {
                Ok((inv, compiled, capacity)) => {
                    println!(
                        "{}: ok, {} hosts, {} compiled replies sharing {} bodies, \
                         maps for {} host entries",
                        file.display(),
                        inv.hosts.len(),
                        compiled.replies(),
                        compiled.bodies.len(),
                        capacity.hosts
                    );
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("{e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::Detach { pin_dir, interface } => {
            let removed = pxe_agent::xdp::pin::detach(&pin_dir, &interface)
                .with_context(|| format!("failed to detach what {} pins", pin_dir.display()))?;
            if removed.is_empty() {
                println!("nothing pinned under {}", pin_dir.display());
            }
            for r in removed {
                let link = if r.link {
                    "link detached and unpinned"
                } else {
                    "no link pinned"
                };
                let maps = if r.maps.is_empty() {
                    "no map pins".to_string()
                } else {
                    format!("map pins removed: {}", r.maps.join(", "))
                };
                println!("{}: {link}; {maps}", r.iface);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::VethPeer {
            interface,
            redirect_to,
        } => {
            let _peer = match redirect_to {
                Some(target) => VethPeer::attach_redirect(&interface, &target)?,
                None => VethPeer::attach(&interface)?,
            };
            block_on_signal(async { Ok(()) })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Hosts {
            action: Some(HostsAction::Done { host, agent }),
            ..
        } => cli::hosts::done(&host, &agent),
        Command::Reprovision {
            host,
            no_power,
            agent,
        } => cli::hosts::reprovision(&host, no_power, &agent),
        Command::Hosts {
            discovered,
            output,
            api,
            action: None,
        } => cli::hosts::list(discovered, output, &api),
        Command::Leases { output, api } => cli::leases::list(output, &api),
        Command::Stats { metrics_addr } => cli::stats::print(metrics_addr),
        Command::Trace { mac, api, count } => cli::trace::trace(&api, mac, count),
        Command::Bmc { command } => cli::bmc::bmc(command),
        Command::Recover { hosts, select } => cli::oob::recover(hosts, &select),
    }
}

/// `--interface`, or this node's entry of `--interface-dir` (clap makes
/// them exclusive).
fn interfaces(
    given: Vec<app::Interface>,
    dir: Option<PathBuf>,
    node: &str,
) -> anyhow::Result<Vec<app::Interface>> {
    let Some(dir) = dir else {
        return Ok(given);
    };
    app::interfaces_of_node(&dir, node)
}

/// The kernel's host name (the node's, under hostNetwork).
fn host_name() -> anyhow::Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("failed to read the host name (give --node-name)")?;
    Ok(name.trim().to_owned())
}

/// Sharing the discovery pools with other agents on the same segment
/// (docs/peers.md).
#[derive(clap::Args)]
struct PeerArgs {
    /// Share the discovery pools with the other agents through
    /// coordination.k8s.io Leases in the namespace (in-cluster config, or
    /// KUBECONFIG): each agent leases from its own slice and answers the
    /// unknown MACs of its hash buckets. Reserved hosts are answered by
    /// every agent.
    #[arg(long, value_enum, value_name = "kube")]
    peers: Option<PeersArg>,
    /// Slices each pool is cut into: the most agents that can share it.
    #[arg(long, default_value_t = 8, requires = "peers")]
    pool_slots: u16,
    /// leaseDurationSeconds of an agent's slot Lease, renewed every third:
    /// an agent that dies loses its unknown MACs to the others within about
    /// this long.
    #[arg(long, default_value_t = 15, value_name = "S", requires = "peers")]
    peer_lease_seconds: u32,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum PeersArg {
    Kube,
}

impl PeerArgs {
    /// The membership's settings, in `namespace` (--kube-namespace; the
    /// client's default namespace when unset) as `node`.
    fn config(
        self,
        namespace: Option<String>,
        node: &str,
    ) -> anyhow::Result<Option<pxe_agent::share::membership::Config>> {
        let Some(PeersArg::Kube) = self.peers else {
            return Ok(None);
        };
        pxe_agent::share::Share::new(0, self.pool_slots).context("--pool-slots")?;
        anyhow::ensure!(
            self.peer_lease_seconds >= 1,
            "--peer-lease-seconds must be at least 1"
        );
        Ok(Some(pxe_agent::share::membership::Config {
            namespace,
            node: node.to_string(),
            slots: self.pool_slots,
            lease_secs: self.peer_lease_seconds,
        }))
    }
}

/// Folds `--server-ip` into the one interface it may name.
fn with_server_ip(
    mut interfaces: Vec<app::Interface>,
    server_ip: Option<Ipv4Addr>,
) -> anyhow::Result<Vec<app::Interface>> {
    let Some(ip) = server_ip else {
        return Ok(interfaces);
    };
    match interfaces.as_mut_slice() {
        [one] if one.server_ip.is_none_or(|given| given == ip) => {
            one.server_ip = Some(ip);
            Ok(interfaces)
        }
        [one] => {
            anyhow::bail!("--server-ip {ip} contradicts --interface {one}: give the address once")
        }
        _ => anyhow::bail!(
            "--server-ip names the server of one interface; with several, give each \
             its own as --interface NAME=SERVER_IP"
        ),
    }
}

fn run(cfg: RunConfig) -> anyhow::Result<()> {
    let rt = runtime()?;
    rt.block_on(async move {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            wait_for_signal().await;
            let _ = tx.send(true);
        });
        app::run(cfg, rx).await
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(extra: &[&str]) -> Result<Cli, clap::Error> {
        let mut args = vec!["pxe-agent", "run", "--inventory", "hosts.yaml"];
        args.extend_from_slice(extra);
        Cli::try_parse_checked(args)
    }

    /// The arguments the DaemonSet gives the agent's container, with the
    /// `$(VAR)` references Kubernetes expands set to sample values.
    fn daemonset_args() -> Vec<String> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/base/daemonset.yaml");
        let text = std::fs::read_to_string(path).expect("the DaemonSet manifest");
        let doc: serde_norway::Value = serde_norway::from_str(&text).expect("YAML");
        let containers = doc["spec"]["template"]["spec"]["containers"]
            .as_sequence()
            .expect("containers");
        let agent = containers
            .iter()
            .find(|c| c["name"].as_str() == Some("pxe-agent"))
            .expect("the pxe-agent container");
        agent["args"]
            .as_sequence()
            .expect("args")
            .iter()
            .map(|a| {
                a.as_str()
                    .expect("an argument")
                    .replace("$(POD_IP)", "192.0.2.10")
            })
            .collect()
    }

    #[test]
    fn the_daemonset_arguments_parse_and_keep_the_api_off_every_address() {
        let args = daemonset_args();
        let mut argv = vec!["pxe-agent".to_string()];
        argv.extend(args.iter().cloned());
        let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{e}"));
        let Command::Run {
            api_addr,
            metrics_addr,
            ..
        } = cli.command
        else {
            panic!("the DaemonSet does not run `run`");
        };
        assert_eq!(api_addr, "192.0.2.10:9465".parse().expect("addr"));
        assert!(!api_addr.ip().is_unspecified());
        assert_eq!(metrics_addr.port(), 9464);
    }

    #[test]
    fn run_takes_interfaces_or_an_interface_dir_not_both() {
        assert!(run_args(&["--interface", "eth1"]).is_ok());
        assert!(run_args(&["--interface-dir", "/etc/pxe-agent/interfaces"]).is_ok());
        let both = run_args(&["-i", "eth1", "--interface-dir", "/etc/pxe-agent/interfaces"]);
        assert_eq!(
            both.err().map(|e| e.kind()),
            Some(clap::error::ErrorKind::ArgumentConflict)
        );
        let neither = run_args(&[]);
        assert_eq!(
            neither.err().map(|e| e.kind()),
            Some(clap::error::ErrorKind::MissingRequiredArgument)
        );
    }

    #[test]
    fn kubernetes_api_auth_and_a_token_file_exclude_each_other() {
        assert!(run_args(&["-i", "eth1", "--api-auth", "kubernetes"]).is_ok());
        assert!(
            run_args(&[
                "-i",
                "eth1",
                "--api-auth",
                "tokens",
                "--api-token-file",
                "t"
            ])
            .is_ok()
        );
        assert!(run_args(&["-i", "eth1", "--api-token-file", "t"]).is_ok());
        let both = run_args(&[
            "-i",
            "eth1",
            "--api-auth",
            "kubernetes",
            "--api-token-file",
            "t",
        ]);
        assert_eq!(
            both.err().map(|e| e.kind()),
            Some(clap::error::ErrorKind::ArgumentConflict)
        );
    }
}

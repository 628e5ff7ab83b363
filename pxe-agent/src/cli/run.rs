//! `pxe-agent run`: its flags, the checks clap cannot express, the
//! [`RunConfig`] they make, and the agent run until SIGINT or SIGTERM.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use anyhow::Context as _;
use pxe_agent::{
    admission,
    api::tls::TlsFiles,
    app::{self, ApiAuth, ApiConfig, OobConfig, RunConfig},
    client::DEFAULT_METRICS,
    dhcp::server::Limits,
    http::limit,
    inventory,
    logging::LogFormat,
    ratelimit::Rate,
    recovery::{self, SequencePolicy},
    shutdown::Shutdown,
    tftp,
    when::DurationArg,
    xdp::AttachMode,
};

use super::{
    oob::EchoArg,
    runtime::{runtime, wait_for_signal},
};

/// `--state-dir` unless given: where the agent keeps its records, and
/// where `import leases` writes the lease store.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/pxe-agent";

/// The flags of `pxe-agent run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Provisioning interface to serve, as NAME or NAME=SERVER_IP
    /// (an IPv4 address, an IPv6 one, or both comma-separated); repeat
    /// it to serve several (VLAN sub-interfaces such as eth0.100
    /// included). Each gets its own XDP program, slow-path and TFTP
    /// sockets, and answers the hosts of the subnets holding its address
    /// (plus relayed requests) as SERVER_IP, by default the interface's
    /// IPv4 address; DHCPv6 is served where it has an IPv6 address
    /// beyond its link-local one (or one is given).
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
    /// How often to check the inventory file for changes (at least 10ms).
    #[arg(long, value_name = "DURATION", default_value_t = DurationArg(Duration::from_millis(250)))]
    reload_interval: DurationArg,
    /// --reload-interval in milliseconds, as older command lines give it.
    #[arg(long, hide = true, conflicts_with = "reload_interval")]
    reload_ms: Option<u64>,
    /// Directory of the agent's records: leases, netboot and recovery
    /// state, the phone-home token key and, by default, the audit log.
    #[arg(long, default_value = DEFAULT_STATE_DIR)]
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
    /// backlog until one ends. Each holds up to two open files, and as
    /// many again may wait parked for an artifact's turn (one file
    /// each); the agent lowers both to what its open-files limit holds.
    #[arg(long, default_value_t = limit::DEFAULT_MAX_CONNECTIONS as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    http_max_connections: u32,
    /// How long a boot HTTP client has to send a whole request head, from
    /// its connection (or its previous response) on; also the keep-alive
    /// idle time.
    #[arg(long, value_name = "DURATION", default_value_t = DurationArg(limit::DEFAULT_HEADER_TIMEOUT))]
    http_header_timeout: DurationArg,
    /// --http-header-timeout in milliseconds, as older command lines give
    /// it.
    #[arg(long, hide = true, conflicts_with = "http_header_timeout")]
    http_header_timeout_ms: Option<u64>,
    /// How long a boot HTTP response may wait for the client to read
    /// before the connection is dropped.
    #[arg(long, value_name = "DURATION", default_value_t = DurationArg(limit::DEFAULT_WRITE_TIMEOUT))]
    http_write_timeout: DurationArg,
    /// --http-write-timeout in milliseconds, as older command lines give
    /// it.
    #[arg(long, hide = true, conflicts_with = "http_write_timeout")]
    http_write_timeout_ms: Option<u64>,
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
    /// Artifact downloads (/artifacts/: kernels, initrds, images) sent
    /// at once per interface. The rest wait, connection open, in the
    /// order their machines first asked for their boot file, so that a
    /// boot storm finishes machines one after another instead of all at
    /// the end. Boot files, scripts, grub.cfg and phone-home never wait
    /// for a turn.
    #[arg(long, default_value_t = admission::DEFAULT_BOUND as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    artifact_transfers: u32,
    /// How long a TFTP transfer polls its socket for the client's answer
    /// before it sleeps (0s: never; e.g. 50us). A quick answer is then caught
    /// without a wake-up, which can make lock-step transfers several
    /// times faster; at most half the CPUs' worth of transfers poll at
    /// once, so a storm of transfers does not burn every CPU.
    #[arg(long, value_name = "DURATION", default_value_t = DurationArg(tftp::DEFAULT_BUSY_POLL))]
    tftp_busy_poll: DurationArg,
    /// --tftp-busy-poll in microseconds, as older command lines give it.
    #[arg(long, hide = true, conflicts_with = "tftp_busy_poll")]
    tftp_busy_poll_us: Option<u64>,
    /// Directory of kernels, initrds and images, served at /artifacts/.
    #[arg(long)]
    artifacts: Option<PathBuf>,
    /// Log lines as text, or as one JSON object a line (level, message,
    /// target, timestamp and the event's fields).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
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
    /// How long a recovery waits after a failed attempt before the next;
    /// doubled for each further attempt, up to ten minutes.
    #[arg(
        long,
        value_name = "DURATION",
        default_value_t = DurationArg(recovery::Policy::default().backoff_initial)
    )]
    recovery_backoff: DurationArg,
    /// --recovery-backoff in milliseconds, as older command lines give it.
    #[arg(long, hide = true, conflicts_with = "recovery_backoff")]
    recovery_backoff_ms: Option<u64>,
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
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ApiAuthArg {
    Tokens,
    Kubernetes,
}

impl RunArgs {
    /// Refuses, as clap does, what its attributes cannot say:
    /// `--api-auth kubernetes` with `--api-token-file`.
    pub fn check(&self) -> Result<(), clap::Error> {
        if self.api_auth == ApiAuthArg::Kubernetes && self.api_token_file.is_some() {
            return Err(<super::Cli as clap::CommandFactory>::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                "the argument '--api-auth kubernetes' cannot be used with '--api-token-file \
                 <FILE>'",
            ));
        }
        Ok(())
    }
}

impl TryFrom<RunArgs> for RunConfig {
    type Error = anyhow::Error;

    /// Checks the values clap lets through, and fills in what the flags
    /// leave to the machine: the node name and this node's interfaces.
    fn try_from(args: RunArgs) -> anyhow::Result<RunConfig> {
        anyhow::ensure!(
            args.bmc_concurrency > 0
                && args.power_ons_per_second > 0.0
                && args.slow_path_rate_threshold > 0.0,
            "--bmc-concurrency, --power-ons-per-second and --slow-path-rate-threshold must be positive"
        );
        anyhow::ensure!(
            args.rate_per_mac > 0.0 && args.rate_unknown > 0.0,
            "rates must be positive"
        );
        let http_header_timeout = args
            .http_header_timeout_ms
            .map_or(args.http_header_timeout.0, Duration::from_millis);
        let http_write_timeout = args
            .http_write_timeout_ms
            .map_or(args.http_write_timeout.0, Duration::from_millis);
        anyhow::ensure!(
            !http_header_timeout.is_zero() && !http_write_timeout.is_zero(),
            "--http-header-timeout and --http-write-timeout must be positive"
        );
        anyhow::ensure!(
            args.kube_status_qps > 0,
            "--kube-status-qps must be positive"
        );
        let node_name = match args.node_name {
            Some(name) => name,
            None => host_name()?,
        };
        let peers = args.peers.config(args.kube_namespace.clone(), &node_name)?;
        let auth = match args.api_auth {
            ApiAuthArg::Tokens => ApiAuth::Tokens,
            ApiAuthArg::Kubernetes => ApiAuth::Kubernetes {
                namespace: args.kube_namespace.clone(),
            },
        };
        let kube = args.kube.then(|| pxe_agent::kube::KubeSettings {
            namespace: args.kube_namespace,
            node_name: node_name.clone(),
            metal3_selector: args.metal3_selector,
            status_qps: args.kube_status_qps,
        });
        Ok(RunConfig {
            peers,
            interfaces: with_server_ip(
                interfaces(args.interface, args.interface_dir, &node_name)?,
                args.server_ip,
            )?,
            inventory: args.inventory.unwrap_or_default(),
            kube,
            metrics_addr: args.metrics_addr,
            api: ApiConfig {
                addr: args.api_addr,
                tls: args
                    .api_tls_cert
                    .zip(args.api_tls_key)
                    .map(|(cert, key)| TlsFiles { cert, key }),
                token_file: args.api_token_file,
                auth,
            },
            xdp_mode: args.xdp_mode,
            reload_interval: args
                .reload_ms
                .map_or(args.reload_interval.0, Duration::from_millis)
                .max(Duration::from_millis(10)),
            state_dir: args.state_dir,
            limits: Limits {
                per_mac: Rate {
                    per_sec: args.rate_per_mac,
                    burst: 2.0 * args.rate_per_mac,
                },
                unknown: Rate {
                    per_sec: args.rate_unknown,
                    burst: args.rate_unknown,
                },
                tracked_macs: 65_536,
            },
            http_addr: args.http_addr,
            http_limits: limit::Limits {
                max_connections: args.http_max_connections as usize,
                // As many again may wait for an artifact's turn, slot
                // given back.
                max_parked: args.http_max_connections as usize,
                header_timeout: http_header_timeout,
                write_timeout: http_write_timeout,
            },
            boot_root: args.boot_root,
            tftp_max_windowsize: args.tftp_max_windowsize,
            tftp_max_transfers: args.tftp_max_transfers as usize,
            tftp_max_waiting: args.tftp_max_waiting as usize,
            artifact_transfers: args.artifact_transfers as usize,
            tftp_busy_poll: args
                .tftp_busy_poll_us
                .map_or(args.tftp_busy_poll.0, Duration::from_micros),
            artifacts: args.artifacts,
            oob: OobConfig {
                sequence: SequencePolicy {
                    max_in_flight: args.bmc_concurrency,
                    power_ups_per_second: args.power_ons_per_second,
                    max_awaiting: args.max_awaiting,
                    max_slow_path_rate: args.slow_path_rate_threshold,
                    ..SequencePolicy::default()
                },
                audit_log: args.audit_log,
                boot_flag_echo: args.bmc_boot_flag_echo.into(),
                recovery: recovery::Policy {
                    backoff_initial: args
                        .recovery_backoff_ms
                        .map_or(args.recovery_backoff.0, Duration::from_millis),
                    ..recovery::Policy::default()
                },
            },
            pin_dir: args.pin_dir,
            map_capacity: args.map_capacity,
        })
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
    /// leaseDurationSeconds of an agent's slot Lease (whole seconds),
    /// renewed every third: an agent that dies loses its unknown MACs to
    /// the others within about this long.
    #[arg(long, value_name = "DURATION", default_value_t = DurationArg(Duration::from_secs(15)), requires = "peers")]
    peer_lease: DurationArg,
    /// --peer-lease in seconds, as older command lines give it.
    #[arg(long, hide = true, conflicts_with = "peer_lease", requires = "peers")]
    peer_lease_seconds: Option<u32>,
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
    ) -> anyhow::Result<Option<pxe_agent::kube::membership::Config>> {
        let Some(PeersArg::Kube) = self.peers else {
            return Ok(None);
        };
        pxe_agent::share::Share::new(0, self.pool_slots).context("--pool-slots")?;
        let lease = self
            .peer_lease_seconds
            .map_or(self.peer_lease.0, |s| Duration::from_secs(s.into()));
        anyhow::ensure!(
            lease >= Duration::from_secs(1) && lease.subsec_nanos() == 0,
            "--peer-lease must be whole seconds, at least 1s"
        );
        let lease_secs = u32::try_from(lease.as_secs()).context("--peer-lease is too long")?;
        Ok(Some(pxe_agent::kube::membership::Config {
            namespace,
            node: node.to_string(),
            slots: self.pool_slots,
            lease_secs,
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

/// Runs the agent with `cfg` until SIGINT or SIGTERM.
pub fn run(cfg: RunConfig) -> anyhow::Result<()> {
    let rt = runtime()?;
    rt.block_on(async move {
        let (trigger, shutdown) = Shutdown::new();
        tokio::spawn(async move {
            wait_for_signal().await;
            trigger.stop();
        });
        app::run(cfg, shutdown).await
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    fn run_args(extra: &[&str]) -> Result<Cli, clap::Error> {
        let mut args = vec!["pxe-agent", "run", "--inventory", "hosts.yaml"];
        args.extend_from_slice(extra);
        Cli::try_parse_checked(args)
    }

    /// The [`RunConfig`] `run` would be given with `extra` flags.
    fn run_config(extra: &[&str]) -> anyhow::Result<RunConfig> {
        let cli = run_args(extra).unwrap_or_else(|e| panic!("{e}"));
        let Command::Run(run) = cli.command else {
            panic!("not `run`");
        };
        RunConfig::try_from(run)
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
        let Command::Run(run) = cli.command else {
            panic!("the DaemonSet does not run `run`");
        };
        assert_eq!(run.api_addr, "192.0.2.10:9465".parse().expect("addr"));
        assert!(!run.api_addr.ip().is_unspecified());
        assert_eq!(run.metrics_addr.port(), 9464);
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

    #[test]
    fn the_flags_become_the_run_config() {
        let cfg = run_config(&[
            "-i",
            "eth1",
            "--node-name",
            "node-a",
            "--server-ip",
            "192.0.2.1",
            "--rate-per-mac",
            "5",
            "--reload-ms",
            "1",
            "--api-auth",
            "kubernetes",
            "--kube-namespace",
            "boot",
            "--http-max-connections",
            "7",
            "--tftp-busy-poll-us",
            "30",
            "--recovery-backoff-ms",
            "1500",
        ])
        .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(cfg.interfaces.len(), 1);
        assert_eq!(cfg.interfaces[0].name, "eth1");
        assert_eq!(
            cfg.interfaces[0].server_ip,
            Some(Ipv4Addr::new(192, 0, 2, 1))
        );
        assert_eq!(cfg.inventory, PathBuf::from("hosts.yaml"));
        assert!(cfg.kube.is_none());
        assert!(cfg.peers.is_none());
        assert_eq!(cfg.limits.per_mac.per_sec, 5.0);
        assert_eq!(cfg.limits.per_mac.burst, 10.0);
        // Never checked more often than every 10 ms, whatever is asked.
        assert_eq!(cfg.reload_interval, Duration::from_millis(10));
        assert!(matches!(
            cfg.api.auth,
            ApiAuth::Kubernetes { namespace: Some(ref ns) } if ns == "boot"
        ));
        assert!(cfg.api.tls.is_none());
        assert_eq!(cfg.http_limits.max_connections, 7);
        assert_eq!(cfg.tftp_busy_poll, Duration::from_micros(30));
        assert_eq!(
            cfg.oob.recovery.backoff_initial,
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn durations_are_written_with_units_and_the_older_unit_flags_still_work() {
        let cfg = run_config(&[
            "-i",
            "eth1",
            "--reload-interval",
            "2s",
            "--http-header-timeout",
            "5s",
            "--http-write-timeout",
            "1m",
            "--tftp-busy-poll",
            "50us",
            "--recovery-backoff",
            "1m30s",
        ])
        .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(cfg.reload_interval, Duration::from_secs(2));
        assert_eq!(cfg.http_limits.header_timeout, Duration::from_secs(5));
        assert_eq!(cfg.http_limits.write_timeout, Duration::from_secs(60));
        assert_eq!(cfg.tftp_busy_poll, Duration::from_micros(50));
        assert_eq!(cfg.oob.recovery.backoff_initial, Duration::from_secs(90));
        let cfg = run_config(&["-i", "eth1", "--http-header-timeout-ms", "700"])
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(cfg.http_limits.header_timeout, Duration::from_millis(700));
        // A bare number is not a duration, and one value is given once.
        assert!(run_args(&["-i", "eth1", "--reload-interval", "250"]).is_err());
        assert!(run_args(&["-i", "eth1", "--reload-interval", "1s", "--reload-ms", "5"]).is_err());
    }

    #[test]
    fn values_clap_lets_through_are_refused_by_name() {
        let refused = |extra: &[&str]| {
            let mut args = vec!["-i", "eth1", "--node-name", "node-a"];
            args.extend_from_slice(extra);
            match run_config(&args) {
                Ok(_) => panic!("{extra:?} was accepted"),
                Err(e) => format!("{e:#}"),
            }
        };
        assert_eq!(refused(&["--rate-per-mac", "0"]), "rates must be positive");
        assert_eq!(
            refused(&["--http-write-timeout", "0s"]),
            "--http-header-timeout and --http-write-timeout must be positive"
        );
        assert_eq!(
            refused(&["--peers", "kube", "--peer-lease", "1500ms"]),
            "--peer-lease must be whole seconds, at least 1s"
        );
        assert_eq!(
            refused(&["--bmc-concurrency", "0"]),
            "--bmc-concurrency, --power-ons-per-second and --slow-path-rate-threshold must be positive"
        );
        assert_eq!(
            refused(&["--peers", "kube", "--peer-lease-seconds", "0"]),
            "--peer-lease must be whole seconds, at least 1s"
        );
        assert!(
            refused(&["-i", "eth2", "--server-ip", "192.0.2.1"])
                .starts_with("--server-ip names the server of one interface")
        );
    }
}

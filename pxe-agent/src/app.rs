//! Wiring of a running agent, until shutdown: inventory (a file or the
//! Kubernetes API) → compiled replies → XDP maps, the slow path for what
//! XDP passes up, TFTP, the HTTP listeners, out-of-band control, the pool
//! peers, the reload and netboot watchers and the health monitor.
//!
//! An agent serves one or more interfaces (VLAN sub-interfaces included).
//! Each gets its own server address, its own loaded XDP program whose hosts
//! maps hold the replies compiled for that address, its own slow-path
//! and TFTP sockets bound to it; the inventory, the policy, the lease store
//! and the HTTP listeners are shared.

use std::{
    fmt,
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use anyhow::Context as _;
use axum::{
    Router,
    extract::connect_info::Connected,
    serve::{IncomingStream, Listener, ListenerExt as _},
};
use tokio::{net::TcpListener, sync::mpsc};
use tracing::{error, info, warn};

use crate::{
    api::{
        admin::{self, AdminState},
        auth::Tokens,
        gate::{Gate, Identities},
        kube_auth::Reviewer,
        tls::{self, Reloader, ServingCert, TlsFiles, TlsStats},
        tls_listener::TlsListener,
    },
    audit::AuditLog,
    bmc::{BootFlagEcho, Driver, Fallbacks, RetryPolicy},
    clock, control,
    dhcp::{
        Server,
        server::{self, Limits},
        template,
    },
    health::Health,
    http::{BootState, boot, limit, sendfile, token::TokenKey},
    inventory::{Inventory, Layout, LoadError},
    kube::{host_records, membership},
    lease::LeaseStore,
    metrics::AgentGauges,
    netboot::NetbootStore,
    netdev, open_files,
    progress::Progress,
    rawsock::RawSocket,
    recovery::{self, Controller, RecoveryStore, SequencePolicy, Sequencer},
    rollout::{
        self, Serving, compile_each, compile_each_beside, load_provisioned, map_writes_of,
        trim_heap,
    },
    share::Share,
    shutdown::Shutdown,
    state::State,
    sync::lock,
    tftp,
    xdp::{self, AttachMode, Capacity, FastPath, events},
};

/// An interface to serve, as `--interface NAME[=IP]` gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    /// The server address its replies name (option 54, siaddr, `{server}`);
    /// defaults to the interface's IPv4 address.
    pub server_ip: Option<Ipv4Addr>,
}

impl std::str::FromStr for Interface {
    type Err = String;

    /// `eth0` or `eth0.100=10.100.0.1`.
    fn from_str(s: &str) -> Result<Interface, String> {
        let (name, ip) = match s.split_once('=') {
            Some((name, ip)) => {
                let ip = ip
                    .parse()
                    .map_err(|_| format!("{ip:?} is not an IPv4 address"))?;
                (name, Some(ip))
            }
            None => (s, None),
        };
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(['/', ' ']) {
            return Err(format!("{name:?} is not an interface name"));
        }
        Ok(Interface {
            name: name.to_string(),
            server_ip: ip,
        })
    }
}

impl fmt::Display for Interface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.server_ip {
            Some(ip) => write!(f, "{}={ip}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// The interfaces of node `node` in `dir` (`--interface-dir`): the file
/// named after the node, else the file `default`; one `NAME[=SERVER_IP]` a
/// line, blank lines and `#` comments ignored. `dir` is a ConfigMap keyed
/// by node name, mounted into the pod, so one DaemonSet serves each node's
/// own provisioning NICs.
pub fn interfaces_of_node(dir: &Path, node: &str) -> anyhow::Result<Vec<Interface>> {
    anyhow::ensure!(
        !node.is_empty() && node != "." && node != ".." && !node.contains('/'),
        "node name {node:?} cannot name a file in {}",
        dir.display()
    );
    let (path, text) = [node, "default"]
        .iter()
        .find_map(|name| {
            let path = dir.join(name);
            match std::fs::read_to_string(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                read => Some((path, read)),
            }
        })
        .with_context(|| {
            format!(
                "no interfaces for node {node:?} in {}: neither {node:?} nor \"default\" is there",
                dir.display()
            )
        })?;
    let text = text.with_context(|| format!("failed to read {}", path.display()))?;
    let mut interfaces = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let interface = line
            .parse::<Interface>()
            .map_err(|e| anyhow::anyhow!("{}:{}: {e}", path.display(), number + 1))?;
        interfaces.push(interface);
    }
    anyhow::ensure!(
        !interfaces.is_empty(),
        "{} names no interface",
        path.display()
    );
    Ok(interfaces)
}

/// An interface being served, with the server its replies name.
#[derive(Clone, Debug)]
struct Iface {
    name: String,
    server: Server,
}

/// The server of each interface: its MAC, and its address as given or read.
fn resolve(interfaces: &[Interface]) -> anyhow::Result<Vec<Iface>> {
    anyhow::ensure!(!interfaces.is_empty(), "no interface to serve");
    let mut out: Vec<Iface> = Vec::with_capacity(interfaces.len());
    for i in interfaces {
        anyhow::ensure!(
            out.iter().all(|o| o.name != i.name),
            "interface {} is given twice",
            i.name
        );
        let mac = netdev::mac_of(&i.name)?;
        let ip = match i.server_ip {
            Some(ip) => ip,
            None => netdev::ipv4_of(&i.name)?,
        };
        out.push(Iface {
            name: i.name.clone(),
            server: Server { ip, mac },
        });
    }
    Ok(out)
}

/// Everything `pxe-agent run` needs.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The interfaces served, in the order given (at least one).
    pub interfaces: Vec<Interface>,
    /// The inventory file; unused when `kube` is set.
    pub inventory: PathBuf,
    /// Read the inventory from the Kubernetes API instead of the file.
    pub kube: Option<crate::kube::KubeSettings>,
    /// `/metrics` and `/healthz`: open, no per-host identifier.
    pub metrics_addr: SocketAddr,
    /// The JSON API: where it listens and who may call it.
    pub api: ApiConfig,
    pub xdp_mode: AttachMode,
    /// How often the inventory file is checked for changes.
    pub reload_interval: Duration,
    /// Where the agent's records live: leases, netboot and recovery state,
    /// the phone-home token key and, by default, the audit log.
    pub state_dir: PathBuf,
    /// The slow path's storm guard.
    pub limits: Limits,
    /// Where scripts, boot files and artifacts are served.
    pub http_addr: SocketAddr,
    /// Connection bound and deadlines of that listener.
    pub http_limits: limit::Limits,
    /// Served over HTTP at `/` (and TFTP): iPXE binaries.
    pub boot_root: Option<PathBuf>,
    /// Largest TFTP `windowsize` granted (1..=64).
    pub tftp_max_windowsize: u16,
    /// TFTP transfers served at once.
    pub tftp_max_transfers: usize,
    /// TFTP read requests held, past `tftp_max_transfers`, until a slot
    /// frees.
    pub tftp_max_waiting: usize,
    /// How long a TFTP transfer busy-polls before it sleeps.
    pub tftp_busy_poll: std::time::Duration,
    /// Served over HTTP at `/artifacts/`.
    pub artifacts: Option<PathBuf>,
    /// Out-of-band control: sequencing, tokens, audit log.
    pub oob: OobConfig,
    /// A bpffs directory to pin each interface's XDP link and maps in
    /// (`<dir>/<ifname>/`): they outlive the agent, and the next one adopts
    /// them. Without it, exiting detaches.
    pub pin_dir: Option<PathBuf>,
    /// Sharing the discovery pools with peer agents (`--peers kube`).
    pub peers: Option<membership::Config>,
    /// Host entries (ports) the fast path's maps hold; without it, twice
    /// what the inventory at start needs.
    pub map_capacity: Option<u32>,
}

/// The out-of-band knobs of `pxe-agent run`.
#[derive(Clone, Debug, Default)]
pub struct OobConfig {
    pub sequence: SequencePolicy,
    pub recovery: recovery::Policy,
    /// Defaults to `<state-dir>/audit.jsonl`.
    pub audit_log: Option<PathBuf>,
    /// What the BMCs echo of the boot flags (every BMC of the agent).
    pub boot_flag_echo: BootFlagEcho,
}

/// The JSON API of `pxe-agent run`.
#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// Loopback unless the operator says otherwise; beyond loopback the
    /// API needs a way to identify callers.
    pub addr: SocketAddr,
    /// Serve it over TLS with this certificate and key, reloaded when
    /// they change.
    pub tls: Option<TlsFiles>,
    /// `name token` lines; without it, reads are open (on loopback) and
    /// every other call is refused.
    pub token_file: Option<PathBuf>,
    /// How callers are identified.
    pub auth: ApiAuth,
}

impl Default for ApiConfig {
    fn default() -> ApiConfig {
        ApiConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 9465)),
            tls: None,
            token_file: None,
            auth: ApiAuth::Tokens,
        }
    }
}

/// How the JSON API identifies its callers (`--api-auth`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiAuth {
    /// The tokens of `token_file`, if any.
    Tokens,
    /// TokenReviews and SubjectAccessReviews, in `namespace`
    /// (`--kube-namespace`; `None`: the service account's or the
    /// kubeconfig's).
    Kubernetes { namespace: Option<String> },
}

/// Receive buffer of the slow path's port-67 socket, in bytes.
const SLOW_PATH_RCVBUF: usize = 8 << 20;
/// Receive buffer of the TFTP listener on port 69 (read requests only;
/// each transfer has a socket of its own).
const TFTP_RCVBUF: usize = 8 << 20;

/// Clients recorded by the slow path, kept for adoption.
const DISCOVERED_CAPACITY: usize = 65_536;

/// Boot steps shared with peers a second, at most (`kube::host_records`):
/// only steps of hosts with a BMC seen by an agent that does not own them.
const PEER_STEP_QPS: u32 = 50;

/// glibc arenas the agent's threads share. By default glibc gives threads
/// arenas of their own, up to eight per core; the inventory and its compiled
/// records are built on short-lived threads (the blocking pool, the compile
/// slices), and what each reload leaves in use pins its arena's free memory
/// around it, where [`trim_heap`] cannot take it back: at 100,000 hosts the
/// agent's RSS wandered between 85 and 110 MiB over a dozen one-host
/// reloads. With two it stays between 48 and 66 MiB, at the same reload
/// time; the serving paths allocate little and glibc's per-thread caches
/// take most of that without the arena's lock.
const MALLOC_ARENAS: i32 = 2;

/// Called first thing in `main`, before any thread has an arena.
pub fn limit_heap_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
}

/// Runs until `shutdown` stops.
pub async fn run(mut cfg: RunConfig, mut shutdown: Shutdown) -> anyhow::Result<()> {
    limit_panic_messages();
    fit_open_files(&mut cfg);
    let ifaces = resolve(&cfg.interfaces)?;
    let servers: Vec<Server> = ifaces.iter().map(|i| i.server).collect();
    for i in &ifaces {
        info!(iface = %i.name, server = %i.server.ip, "starting");
    }
    let gate = Arc::new(api_gate(&cfg.api, &servers).await?);
    let api_tls = api_tls(&cfg.api)?;

    let http_port = cfg.http_addr.port();
    std::fs::create_dir_all(&cfg.state_dir).with_context(|| {
        format!(
            "failed to create the state directory {}",
            cfg.state_dir.display()
        )
    })?;
    let netboot = Arc::new(NetbootStore::open_in(&cfg.state_dir)?);
    // How long reading and checking the file took, logged with the load so
    // that start-up time can be told apart from the file's size.
    let mut read_time = None;
    // Where the file's host entries are, for the first reload to patch.
    let mut layout = None;
    let (kube_source, (inv, compiled)) = match &cfg.kube {
        None => {
            let started = Instant::now();
            let loaded = load_provisioned(&cfg.inventory, None, &netboot)?;
            read_time = Some(started.elapsed());
            layout = loaded.layout;
            (
                None,
                // Settled by the load.
                compile_each_beside(loaded.inventory, &cfg.inventory, &servers, http_port, None)?,
            )
        }
        Some(settings) => {
            let compile_servers = servers.clone();
            let store = netboot.clone();
            let prepare: crate::kube::Prepare =
                Arc::new(move |mut inv: Inventory, label: &Path, running| {
                    inv.provisioned = store.done();
                    match running {
                        // A rebuild of a running agent: laid out as built
                        // (a settled copy is the peak of a rebuild again).
                        Some(_) => {
                            compile_each_beside(inv, label, &compile_servers, http_port, running)
                        }
                        None => compile_each(inv, label, &compile_servers, http_port),
                    }
                });
            let (source, prepared) = crate::kube::Source::start(settings.clone(), prepare)
                .await
                .context("failed to read the inventory from the Kubernetes API")?;
            (Some(source), prepared)
        }
    };
    let leases = LeaseStore::open(&cfg.state_dir.join("leases.redb"))?;
    // One program per interface: each map holds the replies naming that
    // interface's server, for the hosts of its subnets.
    let mut fasts = Vec::with_capacity(ifaces.len());
    let mut map_writes = 0;
    if let Some(dir) = &cfg.pin_dir {
        xdp::pin::prepare(dir)?;
        detach_unserved(dir, &ifaces)?;
    }
    let capacity = Capacity::for_inventory(&compiled, cfg.map_capacity);
    for c in &compiled {
        capacity
            .fits(c, inv.hosts.len())
            .map_err(|problem| LoadError::Invalid {
                path: cfg.inventory.clone(),
                problems: vec![problem],
            })?;
    }
    let count = compiled.iter().map(template::Compiled::replies).sum();
    let bodies: usize = compiled.iter().map(|c| c.bodies.len()).sum();
    for (iface, compiled) in ifaces.iter().zip(compiled) {
        let fast = match &cfg.pin_dir {
            None => {
                let mut fast = FastPath::load_with(capacity).with_context(|| {
                    format!("failed to load the XDP program for {}", iface.name)
                })?;
                // Fill the maps before attaching: once attached, every known host is answered.
                let (report, _) = fast
                    .sync(compiled)
                    .with_context(|| format!("failed to fill the hosts map of {}", iface.name))?;
                map_writes += map_writes_of(&report);
                fast.attach(&iface.name, cfg.xdp_mode)?;
                fast
            }
            Some(dir) => {
                let (fast, report) =
                    start_pinned(dir, &iface.name, cfg.xdp_mode, compiled, capacity)?;
                map_writes += map_writes_of(&report);
                fast
            }
        };
        fasts.push(fast);
    }
    let hosts = inv.hosts.len();
    info!(
        hosts,
        replies = count,
        shared_bodies = bodies,
        map_capacity = capacity.hosts,
        interfaces = ifaces.len(),
        read_ms = read_time.map(|t| t.as_secs_f64() * 1e3),
        "inventory loaded"
    );
    trim_heap();

    let progress = Arc::new(Progress::default());
    let health = Arc::new(Health::default());
    let mut programs = Vec::with_capacity(ifaces.len());
    for (iface, fast) in ifaces.iter().zip(&fasts) {
        let id = fast.attached_program_id().with_context(|| {
            format!("failed to read the id of the XDP program on {}", iface.name)
        })?;
        programs.push((iface.name.clone(), id));
    }
    let state = Arc::new(
        // Moved, not cloned: a copy kept here would outlive every reload.
        State::new(
            Arc::new(inv),
            leases,
            DISCOVERED_CAPACITY,
            progress.clone(),
            health.clone(),
        )
        .with_netboot(netboot),
    );
    // Shared pools: no unknown MAC is answered, and no host's BMC acted
    // on, until a slot is claimed.
    let (peers, fleet) = match &cfg.peers {
        Some(p) => {
            state.set_share(Share::unclaimed(p.slots)?);
            let client = kube::Client::try_default()
                .await
                .context("failed to set up the Kubernetes client for --peers kube")?;
            info!(
                namespace = %p.namespace.as_deref().unwrap_or(client.default_namespace()),
                node = %p.node,
                slots = p.slots,
                "sharing the discovery pools through Leases"
            );
            let membership = tokio::spawn(membership::run(
                p.clone(),
                client.clone(),
                state.clone(),
                shutdown.clone(),
            ));
            let (netboot_tx, netboot_rx) = mpsc::unbounded_channel();
            state.netboot.publish_to(netboot_tx);
            let (publish, recovery_rx) = mpsc::unbounded_channel();
            let (adopt_tx, adopt) = mpsc::unbounded_channel();
            let records = tokio::spawn(host_records::run(
                host_records::Config {
                    namespace: p.namespace.clone(),
                    node: p.node.clone(),
                    step_qps: PEER_STEP_QPS,
                },
                client,
                state.clone(),
                host_records::Links {
                    netboot: netboot_rx,
                    recovery: recovery_rx,
                    adopt: adopt_tx,
                },
                shutdown.clone(),
            ));
            let fleet = control::Fleet {
                publish,
                adopt,
                // A previous owner still alive has this long to finish and
                // share what it started.
                hold: Duration::from_secs(u64::from(p.lease_secs)),
            };
            (vec![membership, records], Some(fleet))
        }
        None => (Vec::new(), None),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut slow_threads = Vec::with_capacity(ifaces.len());
    for iface in &ifaces {
        slow_threads.push(start_slow_path(&cfg, iface, state.clone(), stop.clone())?);
    }
    let events: Vec<_> = fasts
        .iter_mut()
        .filter_map(FastPath::take_events)
        .map(|ring| tokio::spawn(events::stream(ring, state.clone(), shutdown.clone())))
        .collect();
    // One trace filter for the agent: a traced MAC is traced on every
    // interface.
    let (filters, rings): (Vec<_>, Vec<_>) =
        fasts.iter_mut().filter_map(FastPath::take_trace).unzip();
    progress.trace().set_kernel(Box::new(filters));
    let traces: Vec<_> = rings
        .into_iter()
        .map(|ring| {
            let hub = progress.trace().clone();
            tokio::spawn(xdp::trace::stream(ring, hub, shutdown.clone()))
        })
        .collect();
    let boot = Arc::new(BootState {
        shared: state.clone(),
        servers: servers.clone(),
        boot_root: cfg.boot_root.clone(),
        artifacts: cfg.artifacts.clone(),
        tftp_stats: OnceLock::new(),
        http_stats: limit::Stats::default(),
        token_key: TokenKey::load_or_create(&cfg.state_dir)
            .context("failed to load the phone-home token key")?,
        refusal_log: Mutex::default(),
    });
    let (oob, recovery_task) = start_recovery(&cfg, &state, fleet, shutdown.clone())?;
    let recovery_task = watch_recovery(recovery_task, state.clone(), shutdown.clone());
    let counters = fasts.iter().map(FastPath::counters_handle).collect();
    let serving = Arc::new(Serving {
        fast: Mutex::new(fasts),
        gauges: Mutex::new(AgentGauges {
            hosts,
            templates: count,
            map_writes,
            ..Default::default()
        }),
        applying: Mutex::new(()),
        state: state.clone(),
        control: oob.control.clone(),
    });
    let admin = Arc::new(AdminState {
        serving: serving.clone(),
        counters,
        boot: boot.clone(),
        oob: oob.clone(),
        kube: OnceLock::new(),
        gate,
        api_tls: api_tls.as_ref().map(|t| t.stats.clone()),
    });

    let tftp = match &cfg.boot_root {
        Some(root) => start_tftp(&cfg, &ifaces, root, boot.clone(), shutdown.clone()).await?,
        None => Vec::new(),
    };
    let mut servers = Vec::new();
    // One listener for every interface: the default address is the
    // wildcard, and each interface's replies point at its own address.
    let boot_listener = limit::bind(cfg.http_addr)
        .with_context(|| format!("failed to bind the boot HTTP address {}", cfg.http_addr))?;
    info!(addr = %cfg.http_addr, "serving iPXE scripts, boot files and artifacts");
    servers.push(tokio::spawn(sendfile::serve(
        boot_listener,
        boot::router(boot.clone()),
        boot,
        cfg.http_limits,
        shutdown.clone(),
    )));
    let metrics_listener = TcpListener::bind(cfg.metrics_addr)
        .await
        .with_context(|| format!("failed to bind the metrics address {}", cfg.metrics_addr))?;
    info!(addr = %cfg.metrics_addr, "serving /metrics and /healthz");
    servers.push(serve_http(
        metrics_listener,
        admin::metrics_router(admin.clone()),
        shutdown.clone(),
    ));
    let api_listener = TcpListener::bind(cfg.api.addr)
        .await
        .with_context(|| format!("failed to bind the API address {}", cfg.api.addr))?;
    let api_router = admin::api_router(admin.clone());
    match api_tls {
        None => {
            info!(addr = %cfg.api.addr, "serving the JSON API /api/v1");
            servers.push(serve_http(api_listener, api_router, shutdown.clone()));
        }
        Some(ApiTls {
            reloader,
            serving,
            stats,
        }) => {
            info!(addr = %cfg.api.addr, "serving the JSON API /api/v1 over TLS");
            let listener = TlsListener::new(
                api_listener,
                tls::server_config(serving.clone()),
                stats.clone(),
            )
            .context("failed to start the API's TLS listener")?;
            // axum hands a custom listener's peer address to the gate (as
            // `ConnectInfo`) only through `tap_io`.
            servers.push(serve_http(
                listener.tap_io(|_| ()),
                api_router,
                shutdown.clone(),
            ));
            let reload = tls::reload(
                reloader,
                serving,
                stats,
                tls::RELOAD_INTERVAL,
                shutdown.clone(),
            );
            servers.push(tokio::spawn(async move {
                reload.await;
                Ok(())
            }));
        }
    }

    let monitor = tokio::spawn(monitor_health(programs, state.clone(), shutdown.clone()));
    let watcher = match kube_source {
        // The same apply as a file reload's: map sync with rollback, state
        // swap, control task, gauges.
        Some(source) => {
            admin.kube.set(source.stats()).ok();
            let to = serving.clone();
            let apply: crate::kube::Apply =
                Arc::new(move |prepared| rollout::apply_from_source(&to, prepared));
            tokio::spawn(source.run(
                serving.clone(),
                oob.fallbacks.clone(),
                apply,
                shutdown.clone(),
            ))
        }
        None => tokio::spawn(watch_inventory(
            cfg.clone(),
            ifaces.iter().map(|i| i.server).collect(),
            serving.clone(),
            layout,
            shutdown.clone(),
        )),
    };
    let netboot_task = tokio::spawn(watch_netboot(
        ifaces.iter().map(|i| i.server).collect(),
        serving.clone(),
        shutdown.clone(),
    ));
    shutdown.stopped().await;
    info!("shutting down");
    // First, so the slow paths stop even if joining something below fails.
    stop.store(true, Ordering::Relaxed);
    // Trace streams never end by themselves; the admin server waits for them.
    admin.boot.shared.progress.trace().close();
    watcher.await.context("inventory watcher panicked")?;
    netboot_task.await.context("netboot watcher panicked")?;
    recovery_task
        .await
        .context("out-of-band control panicked")?;
    monitor.await.context("health monitor panicked")?;
    for peers in peers {
        peers
            .await
            .context("pool membership or host records panicked")?;
    }
    for events in events {
        events.await.context("event reader panicked")?;
    }
    for traces in traces {
        traces.await.context("trace reader panicked")?;
    }
    for tftp in tftp {
        tftp.await
            .context("TFTP server panicked")?
            .context("TFTP server failed")?;
    }
    for http in servers {
        http.await
            .context("http server panicked")?
            .context("http server failed")?;
    }
    for slow_thread in slow_threads {
        tokio::task::spawn_blocking(move || slow_thread.join())
            .await
            .context("slow path join failed")?
            .map_err(|_| anyhow::anyhow!("slow path supervisor panicked"))?;
    }
    // Dropping the last handle detaches the programs.
    drop(admin);
    Ok(())
}

/// Opens the recovery store and the audit log, and starts the out-of-band
/// control task over each host's BMC driver for the inventory in force.
/// Fails (the agent does not start) on a recovery store or audit log it
/// cannot open: acting without either is not an option.
fn start_recovery(
    cfg: &RunConfig,
    state: &Arc<State>,
    fleet: Option<control::Fleet>,
    shutdown: Shutdown,
) -> anyhow::Result<(Arc<admin::OobState>, tokio::task::JoinHandle<()>)> {
    let store =
        RecoveryStore::open_in(&cfg.state_dir).context("failed to open the recovery store")?;
    let controller =
        Controller::new(store, cfg.oob.recovery).context("failed to load the recovery state")?;
    let audit_path = cfg
        .oob
        .audit_log
        .clone()
        .unwrap_or_else(|| cfg.state_dir.join("audit.jsonl"));
    let audit = Arc::new(AuditLog::open(&audit_path)?);
    let fallbacks = Arc::new(Fallbacks::new(Some(audit.clone())));
    let rx_of = state.clone();
    let share_of = state.clone();
    let echo = cfg.oob.boot_flag_echo;
    let record = fallbacks.clone();
    let inputs = control::Inputs {
        controller,
        sequencer: Sequencer::new(cfg.oob.sequence),
        make_bmc: Box::new(move |settings| {
            Driver::for_host_in(settings, RetryPolicy::default(), echo, &record)
        }),
        progress: state.progress.clone(),
        slow_path_rx: Box::new(move || rx_of.stats.rx.load(Ordering::Relaxed)),
        share: Box::new(move || share_of.share()),
        fleet,
    };
    let (handle, task) = control::start(inputs, state.inventory(), shutdown);
    info!(audit = %audit_path.display(), "out-of-band control running");
    Ok((
        Arc::new(admin::OobState {
            control: handle,
            audit,
            fallbacks,
        }),
        task,
    ))
}

/// The API's gate: how callers are identified, checked against where the
/// API listens.
async fn api_gate(api: &ApiConfig, servers: &[Server]) -> anyhow::Result<Gate> {
    let identities = match (&api.auth, &api.token_file) {
        (ApiAuth::Kubernetes { .. }, Some(_)) => {
            anyhow::bail!("--api-auth kubernetes and --api-token-file exclude each other")
        }
        (ApiAuth::Kubernetes { namespace }, None) => {
            let (client, namespace) = crate::kube::connect(namespace.clone())
                .await
                .context("--api-auth kubernetes needs the Kubernetes API")?;
            info!(
                %namespace,
                "API callers are checked by the Kubernetes API server: their bearer token with a \
                 TokenReview, each call with a SubjectAccessReview of its verb on boothosts/api"
            );
            let reviewer = Reviewer::new(client, namespace)
                .context("failed to read random bytes for the review cache's key")?;
            Identities::Kubernetes(Box::new(reviewer))
        }
        (ApiAuth::Tokens, Some(path)) => {
            info!("API callers are identified by the bearer tokens of --api-token-file");
            Identities::Tokens(Tokens::load(path)?)
        }
        (ApiAuth::Tokens, None) => {
            warn!(
                "no --api-token-file: API reads are open on loopback, and power, bootdev, \
                 recover and netboot calls are refused"
            );
            Identities::None
        }
    };
    let provisioning: Vec<std::net::IpAddr> = servers.iter().map(|s| s.ip.into()).collect();
    Ok(Gate::for_listener(identities, api.addr, &provisioning)?)
}

/// The API's serving certificate, loaded at start, and what reloads it.
struct ApiTls {
    reloader: Reloader,
    serving: Arc<ServingCert>,
    stats: Arc<TlsStats>,
}

/// The API's TLS, when configured: a pair that does not load stops the
/// start. Without it, an API beyond loopback is warned about.
fn api_tls(api: &ApiConfig) -> anyhow::Result<Option<ApiTls>> {
    let Some(files) = &api.tls else {
        if !api.addr.ip().is_loopback() {
            warn!(
                addr = %api.addr,
                "the API listens beyond loopback without TLS: bearer tokens cross the network \
                 in clear; serve it over TLS with --api-tls-cert and --api-tls-key"
            );
        }
        return Ok(None);
    };
    let (reloader, loaded) =
        Reloader::start(files.clone()).context("failed to load the API's TLS certificate")?;
    let stats = Arc::new(TlsStats::default());
    stats.not_after.store(loaded.not_after, Ordering::Relaxed);
    info!(
        cert = %files.cert.display(),
        not_after = loaded.not_after,
        "loaded the API's TLS certificate"
    );
    Ok(Some(ApiTls {
        reloader,
        serving: Arc::new(ServingCert::new(loaded.certified)),
        stats,
    }))
}

/// Panics are contained where they happen (one DHCP request, one BMC
/// call, one service that is then restarted) and counted there; the default
/// hook's message to stderr is kept, but at most one a second, so a flood of
/// requests that panic cannot flood the log.
fn limit_panic_messages() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    static LAST: Mutex<Option<std::time::Instant>> = Mutex::new(None);
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let mut last = lock(&LAST);
            if last.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                *last = Some(std::time::Instant::now());
                drop(last);
                default(info);
            }
        }));
    });
}

/// Reports out-of-band control that ends before shutdown (a panic in its
/// task) in the agent's health, instead of letting BMC actions and recovery
/// stop unnoticed.
fn watch_recovery(
    task: tokio::task::JoinHandle<()>,
    state: Arc<State>,
    shutdown: Shutdown,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let ended = task.await;
        if shutdown.is_stopped() {
            return;
        }
        let why = match ended {
            Err(e) if e.is_panic() => "panicked",
            _ => "stopped",
        };
        error!("out-of-band control {why}: BMC actions and recovery are off until a restart");
        state
            .health
            .set_oob(Err(format!("{why}; BMC actions and recovery are off")));
    })
}

/// Lowers the TFTP and HTTP bounds to what the open-files limit holds, once
/// it is raised as far as it goes, so that a storm past them waits rather
/// than fails for want of descriptors.
fn fit_open_files(cfg: &mut RunConfig) {
    let wanted = open_files::Bounds {
        tftp_transfers: if cfg.boot_root.is_some() {
            cfg.tftp_max_transfers
        } else {
            0
        },
        http_connections: cfg.http_limits.max_connections,
    };
    let fitted = open_files::fit(wanted);
    if cfg.boot_root.is_some() {
        cfg.tftp_max_transfers = fitted.tftp_transfers;
    }
    cfg.http_limits.max_connections = fitted.http_connections;
}

/// Binds UDP port 69 on each interface and serves `root` over TFTP there,
/// turning finished transfers into boot progress. One server (one set of
/// counters) serves a socket per interface; its transfers stay on the
/// interface their request came in on.
async fn start_tftp(
    cfg: &RunConfig,
    ifaces: &[Iface],
    root: &Path,
    boot: Arc<BootState>,
    shutdown: Shutdown,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<Result<(), tftp::ServeError>>>> {
    use socket2::{Domain, Protocol, Socket, Type};
    // A block must fit one frame on every interface (a VLAN's MTU may be
    // below its parent's).
    let mut mtu = u32::MAX;
    for iface in ifaces {
        mtu = mtu.min(netdev::mtu_of(&iface.name)?);
    }
    let tftp_cfg = tftp::TftpConfig {
        max_blksize: tftp::TftpConfig::blksize_for_mtu(mtu),
        max_windowsize: cfg.tftp_max_windowsize,
        max_transfers: cfg.tftp_max_transfers,
        max_waiting: cfg.tftp_max_waiting,
        busy_poll: cfg.tftp_busy_poll,
        ..tftp::TftpConfig::new(root)
    };
    let gate_state = boot.shared.clone();
    let gate: tftp::Gate = Arc::new(move |ip| {
        let std::net::IpAddr::V4(ip) = ip else {
            return None;
        };
        if !gate_state.inventory().withholds_boot_at(ip) {
            return None;
        }
        crate::netboot::Counters::bump(&gate_state.netboot.counters.refused_tftp);
        Some("netboot: this host is given no boot file now")
    });
    let server = tftp::Server::new(tftp_cfg)
        .with_context(|| format!("cannot serve {} over TFTP", root.display()))?
        .with_generated(Arc::new(crate::http::grub::TftpConfigs(boot.clone())))
        .with_gate(gate);
    boot.tftp_stats.set(server.stats()).ok();
    let mut socks = Vec::with_capacity(ifaces.len());
    for iface in ifaces {
        let sock = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))
            .context("failed to open the TFTP socket")?;
        sock.set_reuse_address(true)?;
        sock.bind_device(Some(iface.name.as_bytes()))
            .with_context(|| format!("failed to bind the TFTP socket to {}", iface.name))?;
        sock.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 69)).into())
            .with_context(|| format!("failed to bind UDP port 69 on {}", iface.name))?;
        // A room powering on sends thousands of read requests within a
        // second; the default buffer holds a few hundred.
        if let Err(e) = force_recv_buffer(&sock, TFTP_RCVBUF) {
            warn!(iface = %iface.name, error = %e, "could not enlarge the TFTP socket's receive buffer");
        }
        sock.set_nonblocking(true)?;
        socks.push(tokio::net::UdpSocket::from_std(sock.into())?);
        info!(iface = %iface.name, root = %root.display(), "serving TFTP on UDP port 69");
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel::<tftp::TransferEvent>(1024);
    tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            let ip = match event.peer.ip() {
                std::net::IpAddr::V4(ip) => ip,
                std::net::IpAddr::V6(ip) => ip.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED),
            };
            let Some(mac) = boot.shared.mac_at(ip).await else {
                continue;
            };
            let at = clock::unix_ms(event.finished);
            let how = match &event.outcome {
                tftp::Outcome::Done => "done".to_string(),
                // UEFI firmware asks for the size, aborts, then asks again:
                // part of a normal boot, not a failure.
                tftp::Outcome::Failed(
                    e @ (tftp::TransferError::Peer { .. } | tftp::TransferError::Superseded { .. }),
                ) => {
                    format!("stopped ({e})")
                }
                tftp::Outcome::Failed(e) => format!("failed: {e}"),
            };
            let detail = format!("{} {} B {how}", event.file, event.bytes);
            let what = how.split([' ', ':']).next().unwrap_or_default();
            boot.shared.progress.tftp_transfer(mac, at, what, detail);
        }
    });
    Ok(socks
        .into_iter()
        .map(|sock| {
            tokio::spawn(
                server
                    .clone()
                    .serve(sock, Some(tx.clone()), shutdown.clone()),
            )
        })
        .collect())
}

/// Queue priority of the DHCP replies the slow path sends
/// (`TC_PRIO_INTERACTIVE`): the first band of `pfifo_fast`, the qdisc of a
/// host without `fq_codel`, so a reply does not wait behind the boot files
/// queued on the same link. The fast path's replies (`XDP_TX`) pass no
/// queue at all.
const DHCP_PRIORITY: libc::c_int = 6;

/// Gives the DHCP socket `fd` [`DHCP_PRIORITY`] (`SO_PRIORITY`; values up
/// to 6 need no privilege).
fn prefer_dhcp(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    set_int_option(fd, libc::SO_PRIORITY, DHCP_PRIORITY)
}

/// [`prefer_dhcp`] for the two sockets `role` sends from; a failure is
/// logged, and the replies then queue with everything else.
fn prefer_dhcp_sockets(sock: &impl std::os::fd::AsFd, raw: &RawSocket, role: &str) {
    use std::os::fd::AsFd as _;
    for fd in [sock.as_fd(), raw.as_fd()] {
        if let Err(e) = prefer_dhcp(fd) {
            warn!(error = %e, role, "could not give the DHCP sockets their queue priority");
        }
    }
}

/// Sets a socket's receive buffer past `rmem_max` (`SO_RCVBUFFORCE`, which
/// the agent's CAP_NET_ADMIN allows), else as far as `rmem_max` lets it.
fn force_recv_buffer(sock: &socket2::Socket, bytes: usize) -> std::io::Result<()> {
    use std::os::fd::AsFd as _;
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    set_int_option(sock.as_fd(), libc::SO_RCVBUFFORCE, value)
        .or_else(|_| sock.set_recv_buffer_size(bytes))
}

/// Sets the `SOL_SOCKET` option `name` of `fd` to the integer `value`.
fn set_int_option(
    fd: std::os::fd::BorrowedFd<'_>,
    name: libc::c_int,
    value: libc::c_int,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: value is a c_int of the size given, the fd is open.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Serves `router` on `listener` until shutdown, with peer addresses.
fn serve_http<L>(
    listener: L,
    router: Router,
    mut shutdown: Shutdown,
) -> tokio::task::JoinHandle<std::io::Result<()>>
where
    L: Listener<Addr = SocketAddr>,
    for<'a> SocketAddr: Connected<IncomingStream<'a, L>>,
{
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            shutdown.stopped().await;
        })
        .await
    })
}

/// Polls the inventory file and applies valid changes; refuses invalid ones
/// and keeps serving the previous inventory. `layout` is that of the file
/// in force, which a reload patches from.
async fn watch_inventory(
    cfg: RunConfig,
    servers: Vec<Server>,
    serving: Arc<Serving>,
    mut layout: Option<Layout>,
    mut shutdown: Shutdown,
) {
    let mut seen = fingerprint(&cfg.inventory);
    let mut tick = tokio::time::interval(cfg.reload_interval);
    // A file whose map writes failed is tried again, not left half-known.
    let mut retry_at: Option<std::time::Instant> = None;
    loop {
        tokio::select! {
            () = shutdown.stopped() => return,
            _ = tick.tick() => {}
        }
        let now = fingerprint(&cfg.inventory);
        let retry = retry_at.is_some_and(|at| std::time::Instant::now() >= at);
        if now == seen && !retry {
            continue;
        }
        seen = now;
        retry_at = None;
        let (path, serving, servers) = (cfg.inventory.clone(), serving.clone(), servers.clone());
        let http_port = cfg.http_addr.port();
        let before = layout.take();
        // Loading, compiling and the map writes (up to one `bpf()` call per
        // template) block: none of it runs on the runtime.
        match tokio::task::spawn_blocking(move || {
            rollout::apply_inventory(&path, &servers, http_port, &serving, before)
        })
        .await
        {
            Ok((rollout::Reload::SyncFailed, kept)) => {
                layout = kept;
                retry_at = Some(std::time::Instant::now() + rollout::RELOAD_RETRY);
            }
            Ok((rollout::Reload::Applied | rollout::Reload::Refused, kept)) => layout = kept,
            Err(e) => error!(error = %e, "inventory reload task failed"),
        }
    }
}

/// Puts each netboot change in force on both paths: the inventory in force
/// with the store's done hosts, recompiled; the map sync writes only the
/// entries of the hosts that changed.
async fn watch_netboot(servers: Vec<Server>, serving: Arc<Serving>, mut shutdown: Shutdown) {
    loop {
        tokio::select! {
            () = shutdown.stopped() => return,
            () = serving.state.netboot_changed.notified() => {}
        }
        let (serving, servers) = (serving.clone(), servers.clone());
        if let Err(e) =
            tokio::task::spawn_blocking(move || rollout::apply_netboot(&servers, &serving)).await
        {
            error!(error = %e, "netboot apply task failed");
        }
    }
}

/// Modification time, size and inode of the file behind the path
/// (following symlinks, as Kubernetes ConfigMap volumes swap them).
fn fingerprint(path: &Path) -> Option<(SystemTime, u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len(), meta.ino()))
}

/// Binds the slow path's sockets on the interface and starts its thread,
/// and the PXE boot server's ([`start_boot_server`]): one of each per
/// interface, each answering as that interface's server.
fn start_slow_path(
    cfg: &RunConfig,
    iface: &Iface,
    shared: Arc<State>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))
        .context("failed to open the DHCP socket")?;
    sock.set_reuse_address(true)?;
    sock.set_broadcast(true)?;
    sock.bind_device(Some(iface.name.as_bytes()))
        .with_context(|| format!("failed to bind the DHCP socket to {}", iface.name))?;
    sock.bind(
        &SocketAddr::from((Ipv4Addr::UNSPECIFIED, pxe_ebpf_common::bootp::SERVER_PORT)).into(),
    )
    .with_context(|| format!("failed to bind UDP port 67 on {}", iface.name))?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    // Room for the requests that arrive while a batch's leases are being
    // committed (a few ms of fdatasync): the default buffer holds ~170.
    if let Err(e) = force_recv_buffer(&sock, SLOW_PATH_RCVBUF) {
        warn!(error = %e, "could not enlarge the DHCP socket's receive buffer");
    }
    let raw = RawSocket::send_only(&iface.name)
        .with_context(|| format!("failed to open a raw socket on {}", iface.name))?;
    prefer_dhcp_sockets(&sock, &raw, "slow path");
    let limits = cfg.limits;
    let server = iface.server;
    info!(iface = %iface.name, "slow path listening on UDP port 67");
    let sock: std::net::UdpSocket = sock.into();
    start_boot_server(iface, shared.clone(), stop.clone(), limits)?;
    std::thread::Builder::new()
        .name("dhcp-slow-path".into())
        .spawn(move || supervise_slow_path(&sock, &raw, server, &shared, limits, &stop, false))
        .context("failed to start the slow path thread")
}

/// Binds the PXE boot server port (UDP 4011) on the interface and starts
/// its thread: proxyDHCP clients send their follow-up DHCPREQUEST there
/// (docs/lifecycle.md, "proxyDHCP").
fn start_boot_server(
    iface: &Iface,
    shared: Arc<State>,
    stop: Arc<AtomicBool>,
    limits: Limits,
) -> anyhow::Result<()> {
    use socket2::{Domain, Protocol, Socket, Type};
    let port = pxe_ebpf_common::bootp::PXE_PORT;
    let sock = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))
        .context("failed to open the PXE boot server socket")?;
    sock.set_reuse_address(true)?;
    sock.bind_device(Some(iface.name.as_bytes()))
        .with_context(|| {
            format!(
                "failed to bind the PXE boot server socket to {}",
                iface.name
            )
        })?;
    sock.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)).into())
        .with_context(|| format!("failed to bind UDP port {port} on {}", iface.name))?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let raw = RawSocket::send_only(&iface.name)
        .with_context(|| format!("failed to open a raw socket on {}", iface.name))?;
    prefer_dhcp_sockets(&sock, &raw, "PXE boot server");
    let server = iface.server;
    info!(iface = %iface.name, "PXE boot server listening on UDP port {port}");
    let sock: std::net::UdpSocket = sock.into();
    std::thread::Builder::new()
        .name("dhcp-boot-server".into())
        .spawn(move || supervise_slow_path(&sock, &raw, server, &shared, limits, &stop, true))
        .context("failed to start the PXE boot server thread")?;
    Ok(())
}

/// Pause before a slow path that died is started again.
const SLOW_PATH_RESTART: Duration = Duration::from_millis(200);

/// Runs the slow path until `stop`, starting it again whenever it dies,
/// so that nothing a client sends can end DHCP service for the others.
fn supervise_slow_path(
    sock: &std::net::UdpSocket,
    raw: &RawSocket,
    server: Server,
    shared: &Arc<State>,
    limits: Limits,
    stop: &AtomicBool,
    boot_server: bool,
) {
    loop {
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if boot_server {
                server::serve_boot_server(sock, raw, server, shared.clone(), limits, stop)
            } else {
                server::serve(sock, raw, server, shared.clone(), limits, stop)
            }
        }));
        let Err(panic) = run else {
            shared.health.slow_path_down(None);
            return;
        };
        let why = panic_message(panic.as_ref());
        error!(panic = %why, "slow path died; starting it again");
        shared
            .health
            .slow_path_down(Some(format!("thread panicked: {why}")));
        std::thread::sleep(SLOW_PATH_RESTART);
        if stop.load(Ordering::Relaxed) {
            return;
        }
        shared.health.slow_path_restarted();
    }
}

/// The text of a panic payload.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

/// Detaches what a previous agent pinned under `dir` for interfaces this
/// one no longer serves: left alone, their programs would go on answering
/// from an inventory nobody updates.
fn detach_unserved(dir: &Path, ifaces: &[Iface]) -> anyhow::Result<()> {
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("failed to read the pin directory {}", dir.display()))?;
    let mut unserved = Vec::new();
    for entry in entries {
        let entry =
            entry.with_context(|| format!("failed to read the pin directory {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().is_ok_and(|t| t.is_dir()) && ifaces.iter().all(|i| i.name != name) {
            unserved.push(name);
        }
    }
    if unserved.is_empty() {
        return Ok(());
    }
    for removed in xdp::pin::detach(dir, &unserved)? {
        warn!(
            iface = %removed.iface,
            link = removed.link,
            maps = removed.maps.len(),
            "detached the pinned XDP program of an interface no longer served"
        );
    }
    Ok(())
}

/// Starts `iface`'s fast path on its pins under `dir`, adopting what the
/// last agent left attached (see [`FastPath::start_pinned`]); with the map
/// writes of its first fill as far as they are known: every template on
/// fresh maps, none counted when the pinned maps were adopted (the loader
/// reports no diff for that fill).
fn start_pinned(
    dir: &Path,
    iface: &str,
    mode: AttachMode,
    compiled: template::Compiled,
    capacity: Capacity,
) -> anyhow::Result<(FastPath, xdp::maps::SyncReport)> {
    let pins = xdp::pin::iface_dir(dir, iface);
    let (fast, adoption, report) =
        FastPath::start_pinned(&pins, iface, mode, compiled, capacity)
            .with_context(|| format!("failed to start the XDP fast path of {iface} on its pins"))?;
    let pins = pins.display();
    match adoption {
        xdp::Adoption::Fresh { program } => {
            info!(%iface, program, %pins, "XDP program attached fresh and pinned");
        }
        xdp::Adoption::Unchanged { program } => {
            info!(%iface, program, %pins, "adopted the pinned XDP program unchanged");
        }
        xdp::Adoption::Replaced {
            from,
            to,
            maps_reused,
        } => {
            let maps = if maps_reused {
                "on the pinned maps"
            } else {
                "on new maps (another layout)"
            };
            info!(
                %iface, %pins,
                "adopted the pinned XDP link and replaced its program {from} -> {to} atomically, {maps}"
            );
        }
    }
    Ok((fast, report))
}

/// How often the health monitor asks the kernel and the state store.
const HEALTH_EVERY: Duration = Duration::from_secs(1);
/// How often the state store is probed with a write of its own.
const STORE_PROBE_EVERY: Duration = Duration::from_secs(5);

/// Keeps `Health` current with what only a question shows: whether our
/// program is still the one attached to each interface (`programs` holds
/// the interface and our program's id there), and whether the state store
/// can still be written. Both questions block, so they run on the blocking
/// pool.
async fn monitor_health(programs: Vec<(String, u32)>, shared: Arc<State>, mut shutdown: Shutdown) {
    let mut tick = tokio::time::interval(HEALTH_EVERY);
    let mut last_probe: Option<std::time::Instant> = None;
    loop {
        tokio::select! {
            () = shutdown.stopped() => return,
            _ = tick.tick() => {}
        }
        let probe = last_probe.is_none_or(|t| t.elapsed() >= STORE_PROBE_EVERY);
        if probe {
            last_probe = Some(std::time::Instant::now());
        }
        let (programs, shared) = (programs.clone(), shared.clone());
        let _ = tokio::task::spawn_blocking(move || {
            let problems: Vec<String> = programs
                .iter()
                .filter_map(|(iface, program_id)| xdp_problem(iface, *program_id))
                .collect();
            for why in &problems {
                warn!("{why}");
            }
            shared.health.set_xdp(if problems.is_empty() {
                Ok(())
            } else {
                Err(problems.join("; "))
            });
            if probe {
                let result = lock(&shared.leases).probe().map_err(|e| e.to_string());
                shared.health.set_store(result);
            }
        })
        .await;
    }
}

/// What is wrong with our program `program_id` on `iface`, if anything.
fn xdp_problem(iface: &str, program_id: u32) -> Option<String> {
    match netdev::xdp_program_id(iface) {
        Ok(Some(id)) if id == program_id => None,
        Ok(Some(id)) => Some(format!(
            "another XDP program (id {id}) is attached to {iface}, not ours (id {program_id})"
        )),
        Ok(None) => Some(format!("no XDP program attached to {iface}")),
        Err(e) => Some(format!("cannot read the XDP state of {iface}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, process};

    use super::*;

    #[test]
    fn dhcp_sockets_get_the_first_band_of_the_hosts_queue() {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        prefer_dhcp(sock.as_fd()).expect("SO_PRIORITY");
        let mut value: libc::c_int = -1;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: value and len describe a c_int buffer; the fd is open.
        let rc = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PRIORITY,
                (&raw mut value).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        // TC_PRIO_INTERACTIVE: band 0 in pfifo_fast's default priomap.
        assert_eq!(value, 6);
    }

    /// A directory laid out as the interfaces ConfigMap is mounted.
    fn interface_dir(files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "pxe-interface-dir-{}-{}",
            process::id(),
            files
                .iter()
                .map(|(name, _)| *name)
                .collect::<Vec<_>>()
                .join("+")
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            fs::write(dir.join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn interface_dir_reads_the_nodes_own_file_first() {
        let dir = interface_dir(&[
            (
                "worker-b",
                "# two NICs\neth2=10.66.0.2\n\n  eth2.100=10.100.0.2  # VLAN\n",
            ),
            ("default", "eth1\n"),
        ]);
        let got = interfaces_of_node(&dir, "worker-b").unwrap();
        assert_eq!(
            got,
            vec![
                "eth2=10.66.0.2".parse::<Interface>().unwrap(),
                "eth2.100=10.100.0.2".parse::<Interface>().unwrap(),
            ]
        );
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn interface_dir_falls_back_to_default() {
        let dir = interface_dir(&[("worker-a", "eth3\n"), ("default", "eth1\n")]);
        let got = interfaces_of_node(&dir, "worker-z").unwrap();
        assert_eq!(got, vec!["eth1".parse::<Interface>().unwrap()]);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn interface_dir_without_the_node_or_default_names_both() {
        let dir = interface_dir(&[("worker-a", "eth3\n")]);
        let err = interfaces_of_node(&dir, "worker-z")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&dir.display().to_string()) && err.contains("\"worker-z\""),
            "{err}"
        );
        assert!(err.contains("default"), "{err}");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn interface_dir_refuses_bad_lines_empty_files_and_path_names() {
        let dir = interface_dir(&[("bad", "eth1\neth2=10.0.0.300\n"), ("empty", "# none\n")]);
        let err = interfaces_of_node(&dir, "bad").unwrap_err().to_string();
        assert!(
            err.ends_with("bad:2: \"10.0.0.300\" is not an IPv4 address"),
            "{err}"
        );
        let err = interfaces_of_node(&dir, "empty").unwrap_err().to_string();
        assert!(err.ends_with("empty names no interface"), "{err}");
        for node in ["", "..", "a/b"] {
            assert!(interfaces_of_node(&dir, node).is_err(), "{node:?}");
        }
        fs::remove_dir_all(dir).unwrap();
    }
    #[test]
    fn interfaces_are_named_alone_or_with_their_server_address() {
        let vlan: Interface = "eth0.100=10.100.0.1".parse().expect("valid");
        assert_eq!(
            vlan,
            Interface {
                name: "eth0.100".into(),
                server_ip: Some(Ipv4Addr::new(10, 100, 0, 1)),
            }
        );
        assert_eq!(vlan.to_string(), "eth0.100=10.100.0.1");
        let plain: Interface = "eth0".parse().expect("valid");
        assert_eq!(plain.server_ip, None);
        for bad in [
            "",
            "=10.0.0.1",
            "eth0=10.0.0",
            "eth0=",
            "a-name-far-too-long0",
        ] {
            assert!(bad.parse::<Interface>().is_err(), "{bad:?} was accepted");
        }
    }
}

//! Wiring of a running agent: inventory → templates → XDP maps, the slow
//! path for what XDP passes up, the reload watcher and the HTTP endpoints,
//! until shutdown.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use axum::{Json, Router, extract::State, http::StatusCode, routing::get};
use tokio::{net::TcpListener, sync::watch};
use tracing::{error, info, warn};

use crate::{
    dhcp::{
        Server,
        server::{self, Limits},
        template,
    },
    discovered::Discovered,
    inventory::{Inventory, LoadError, MacAddr},
    lease::{Lease, LeaseStore},
    metrics::{self, AgentGauges},
    netdev,
    rawsock::RawSocket,
    xdp::{AttachMode, FastPath, Stats},
};

/// Everything `pxe-agent run` needs.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub iface: String,
    pub inventory: PathBuf,
    /// Defaults to the interface's IPv4 address.
    pub server_ip: Option<Ipv4Addr>,
    pub metrics_addr: SocketAddr,
    pub xdp_mode: AttachMode,
    /// How often the inventory file is checked for changes.
    pub reload_interval: Duration,
    /// Where the lease database lives.
    pub state_dir: PathBuf,
    /// The slow path's storm guard.
    pub limits: Limits,
}

/// State shared by the reload loop and the HTTP handlers.
struct Shared {
    fast: Mutex<FastPath>,
    gauges: Mutex<AgentGauges>,
    slow: Arc<server::Shared>,
}

/// Clients recorded by the slow path, kept for adoption.
const DISCOVERED_CAPACITY: usize = 65_536;

/// Loads and compiles an inventory; the error names file, host and field.
pub fn prepare(
    path: &Path,
    server: &Server,
) -> Result<(Inventory, template::Templates), LoadError> {
    let inv = Inventory::load(path)?;
    let templates = template::compile(&inv, server).map_err(|problems| LoadError::Invalid {
        path: path.to_path_buf(),
        problems,
    })?;
    Ok((inv, templates))
}

/// Runs until `shutdown` turns true.
pub async fn run(cfg: RunConfig, mut shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    let mac = netdev::mac_of(&cfg.iface)?;
    let ip = match cfg.server_ip {
        Some(ip) => ip,
        None => netdev::ipv4_of(&cfg.iface)?,
    };
    let server = Server { ip, mac };
    info!(iface = %cfg.iface, server = %ip, "starting");

    let (inv, templates) = prepare(&cfg.inventory, &server)?;
    std::fs::create_dir_all(&cfg.state_dir).with_context(|| {
        format!(
            "failed to create the state directory {}",
            cfg.state_dir.display()
        )
    })?;
    let leases = LeaseStore::open(&cfg.state_dir.join("leases.redb"))?;
    let mut fast = FastPath::load().context("failed to load the XDP program")?;
    let count = templates.len();
    // Fill the map before attaching: once attached, every known host is answered.
    fast.sync(templates)
        .context("failed to fill the hosts map")?;
    fast.attach(&cfg.iface, cfg.xdp_mode)?;
    info!(
        hosts = inv.hosts.len(),
        templates = count,
        "inventory loaded"
    );

    let slow = Arc::new(server::Shared::new(
        Arc::new(inv.clone()),
        leases,
        DISCOVERED_CAPACITY,
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let slow_thread = start_slow_path(&cfg, server, slow.clone(), stop.clone())?;
    let shared = Arc::new(Shared {
        fast: Mutex::new(fast),
        gauges: Mutex::new(AgentGauges {
            hosts: inv.hosts.len(),
            templates: count,
            ..Default::default()
        }),
        slow,
    });

    let listener = TcpListener::bind(cfg.metrics_addr)
        .await
        .with_context(|| format!("failed to bind the metrics address {}", cfg.metrics_addr))?;
    info!(addr = %cfg.metrics_addr, "serving /metrics and /healthz");
    let router = Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(healthz))
        .route("/api/v1/discovered", get(discovered_api))
        .route("/api/v1/leases", get(leases_api))
        .with_state(shared.clone());
    let mut http_shutdown = shutdown.clone();
    let http = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = http_shutdown.wait_for(|stop| *stop).await;
            })
            .await
    });

    let watcher = tokio::spawn(watch_inventory(
        cfg.clone(),
        server,
        shared.clone(),
        shutdown.clone(),
    ));
    let _ = shutdown.wait_for(|stop| *stop).await;
    info!("shutting down");
    watcher.await.context("inventory watcher panicked")?;
    http.await
        .context("http server panicked")?
        .context("http server failed")?;
    stop.store(true, Ordering::Relaxed);
    tokio::task::spawn_blocking(move || slow_thread.join())
        .await
        .context("slow path join failed")?
        .map_err(|_| anyhow::anyhow!("slow path thread panicked"))?;
    // Dropping the last handle detaches the program.
    drop(shared);
    Ok(())
}

/// Polls the inventory file and applies valid changes; refuses invalid ones
/// and keeps serving the previous inventory.
async fn watch_inventory(
    cfg: RunConfig,
    server: Server,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut seen = fingerprint(&cfg.inventory);
    let mut tick = tokio::time::interval(cfg.reload_interval);
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            _ = tick.tick() => {}
        }
        let now = fingerprint(&cfg.inventory);
        if now == seen {
            continue;
        }
        seen = now;
        let path = cfg.inventory.clone();
        let result = tokio::task::spawn_blocking(move || prepare(&path, &server)).await;
        let mut gauges = shared.gauges.lock().unwrap_or_else(PoisonError::into_inner);
        match result {
            Ok(Ok((inv, templates))) => {
                let count = templates.len();
                let mut fast = shared.fast.lock().unwrap_or_else(PoisonError::into_inner);
                match fast.sync(templates) {
                    Ok(report) => {
                        shared.slow.replace_inventory(Arc::new(inv.clone()));
                        gauges.hosts = inv.hosts.len();
                        gauges.templates = count;
                        gauges.reloads_ok += 1;
                        info!(
                            hosts = inv.hosts.len(),
                            written = report.written,
                            removed = report.removed,
                            unchanged = report.unchanged,
                            "inventory reloaded"
                        );
                    }
                    Err(e) => {
                        gauges.reloads_rejected += 1;
                        error!(error = %e, "failed to update the hosts map; the previous entries stay");
                    }
                }
            }
            Ok(Err(e)) => {
                gauges.reloads_rejected += 1;
                warn!("inventory change refused, still serving the previous one: {e}");
            }
            Err(e) => error!(error = %e, "inventory reload task failed"),
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

async fn metrics_page(State(shared): State<Arc<Shared>>) -> Result<String, (StatusCode, String)> {
    let internal = |what: &str, e: &dyn std::fmt::Display| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("failed to read {what}: {e}"),
        )
    };
    let fast = {
        let fast = shared.fast.lock().unwrap_or_else(PoisonError::into_inner);
        Stats::read(fast.counters()).map_err(|e| internal("counters", &e))?
    };
    let gauges = *shared.gauges.lock().unwrap_or_else(PoisonError::into_inner);
    let leases = shared
        .slow
        .leases
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .list()
        .map_err(|e| internal("leases", &e))?;
    let discovered = shared
        .slow
        .discovered
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .len();
    Ok(metrics::render(&metrics::Page {
        fast: &fast,
        gauges: &gauges,
        slow: &shared.slow.stats,
        discovered,
        leases: &leases,
    }))
}

/// `GET /api/v1/discovered`: unknown clients, most recently seen first.
async fn discovered_api(State(shared): State<Arc<Shared>>) -> Json<Vec<Discovered>> {
    Json(
        shared
            .slow
            .discovered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .list(),
    )
}

/// `GET /api/v1/leases`: pool leases, including quarantined addresses.
async fn leases_api(
    State(shared): State<Arc<Shared>>,
) -> Result<Json<Vec<LeaseView>>, (StatusCode, String)> {
    let list = shared
        .slow
        .leases
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .list();
    let list = list.map_err(|e| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("failed to read leases: {e}"),
        )
    })?;
    Ok(Json(list.iter().map(LeaseView::from).collect()))
}

/// A lease as the API shows it.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq)]
pub struct LeaseView {
    pub mac: String,
    pub ip: Ipv4Addr,
    pub state: String,
    /// Unix seconds.
    pub expires: u64,
    pub hostname: Option<String>,
}

impl From<&Lease> for LeaseView {
    fn from(l: &Lease) -> LeaseView {
        LeaseView {
            mac: MacAddr(l.mac).to_string(),
            ip: l.ip,
            state: format!("{:?}", l.state).to_lowercase(),
            expires: l.expires,
            hostname: l.hostname.clone(),
        }
    }
}

/// Binds the slow path's sockets on the interface and starts its thread.
fn start_slow_path(
    cfg: &RunConfig,
    server: Server,
    shared: Arc<server::Shared>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))
        .context("failed to open the DHCP socket")?;
    sock.set_reuse_address(true)?;
    sock.set_broadcast(true)?;
    sock.bind_device(Some(cfg.iface.as_bytes()))
        .with_context(|| format!("failed to bind the DHCP socket to {}", cfg.iface))?;
    sock.bind(
        &SocketAddr::from((Ipv4Addr::UNSPECIFIED, pxe_ebpf_common::bootp::SERVER_PORT)).into(),
    )
    .context("failed to bind UDP port 67")?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let raw = RawSocket::open(&cfg.iface, false)
        .with_context(|| format!("failed to open a raw socket on {}", cfg.iface))?;
    let limits = cfg.limits;
    info!(iface = %cfg.iface, "slow path listening on UDP port 67");
    std::thread::Builder::new()
        .name("dhcp-slow-path".into())
        .spawn(move || server::serve(sock.into(), raw, server, shared, limits, stop))
        .context("failed to start the slow path thread")
}

/// Ready once the program is attached and the map is filled, which `run`
/// does before binding this endpoint.
async fn healthz() -> &'static str {
    "ok\n"
}

//! Wiring of a running agent: inventory → templates → XDP maps, the reload
//! watcher and the HTTP endpoints, until shutdown.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use axum::{Router, extract::State, http::StatusCode, routing::get};
use tokio::{net::TcpListener, sync::watch};
use tracing::{error, info, warn};

use crate::{
    dhcp::{Server, template},
    inventory::{Inventory, LoadError},
    metrics::{self, AgentGauges},
    netdev,
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
}

/// State shared by the reload loop and the HTTP handlers.
struct Shared {
    fast: Mutex<FastPath>,
    gauges: Mutex<AgentGauges>,
}

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

    let shared = Arc::new(Shared {
        fast: Mutex::new(fast),
        gauges: Mutex::new(AgentGauges {
            hosts: inv.hosts.len(),
            templates: count,
            ..Default::default()
        }),
    });

    let listener = TcpListener::bind(cfg.metrics_addr)
        .await
        .with_context(|| format!("failed to bind the metrics address {}", cfg.metrics_addr))?;
    info!(addr = %cfg.metrics_addr, "serving /metrics and /healthz");
    let router = Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(healthz))
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
    let stats = {
        let fast = shared.fast.lock().unwrap_or_else(PoisonError::into_inner);
        Stats::read(fast.counters()).map_err(|e| {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("failed to read counters: {e}"),
            )
        })?
    };
    let gauges = *shared.gauges.lock().unwrap_or_else(PoisonError::into_inner);
    Ok(metrics::render(&stats, &gauges))
}

/// Ready once the program is attached and the map is filled, which `run`
/// does before binding this endpoint.
async fn healthz() -> &'static str {
    "ok\n"
}

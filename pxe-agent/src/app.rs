//! Wiring of a running agent: inventory → templates → XDP maps, the slow
//! path for what XDP passes up, the reload watcher and the HTTP endpoints,
//! until shutdown.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, OnceLock, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use axum::Router;
use tokio::{net::TcpListener, sync::watch};
use tracing::{error, info, warn};

use crate::{
    dhcp::{
        Server,
        server::{self, Limits},
        template,
    },
    http::{
        BootState,
        admin::{self, AdminState},
        boot, limit, sendfile,
    },
    inventory::{Inventory, LoadError},
    lease::LeaseStore,
    metrics::AgentGauges,
    netdev,
    progress::Progress,
    rawsock::RawSocket,
    tftp,
    xdp::{AttachMode, FastPath, events},
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
    /// Where scripts, boot files and artifacts are served.
    pub http_addr: SocketAddr,
    /// Connection bound and deadlines of that listener.
    pub http_limits: limit::Limits,
    /// Served over HTTP at `/` (and TFTP): iPXE binaries.
    pub boot_root: Option<PathBuf>,
    /// Largest TFTP `windowsize` granted (1..=64).
    pub tftp_max_windowsize: u16,
    /// How long a TFTP transfer busy-polls before it sleeps.
    pub tftp_busy_poll: std::time::Duration,
    /// Served over HTTP at `/artifacts/`.
    pub artifacts: Option<PathBuf>,
}

/// Receive buffer of the slow path's port-67 socket, in bytes.
const SLOW_PATH_RCVBUF: usize = 8 << 20;

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

    let progress = Arc::new(Progress::default());
    let dhcp = Arc::new(server::Shared::new(
        Arc::new(inv.clone()),
        leases,
        DISCOVERED_CAPACITY,
        progress.clone(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let slow_thread = start_slow_path(&cfg, server, dhcp.clone(), stop.clone())?;
    let events = fast
        .take_events()
        .map(|ring| tokio::spawn(events::stream(ring, progress.clone(), shutdown.clone())));
    let boot = Arc::new(BootState {
        dhcp: dhcp.clone(),
        server,
        boot_root: cfg.boot_root.clone(),
        artifacts: cfg.artifacts.clone(),
        progress,
        tftp_stats: OnceLock::new(),
        http_stats: limit::Stats::default(),
    });
    let admin = Arc::new(AdminState {
        fast: Mutex::new(fast),
        gauges: Mutex::new(AgentGauges {
            hosts: inv.hosts.len(),
            templates: count,
            ..Default::default()
        }),
        boot: boot.clone(),
    });

    let tftp = match &cfg.boot_root {
        Some(root) => Some(start_tftp(&cfg, root, boot.clone(), shutdown.clone()).await?),
        None => None,
    };
    let mut servers = Vec::new();
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
    let admin_listener = TcpListener::bind(cfg.metrics_addr)
        .await
        .with_context(|| format!("failed to bind the metrics address {}", cfg.metrics_addr))?;
    info!(addr = %cfg.metrics_addr, "serving /metrics, /healthz and /api/v1");
    servers.push(serve_http(
        admin_listener,
        admin::router(admin.clone()),
        shutdown.clone(),
    ));

    let watcher = tokio::spawn(watch_inventory(
        cfg.clone(),
        server,
        admin.clone(),
        shutdown.clone(),
    ));
    let _ = shutdown.wait_for(|stop| *stop).await;
    info!("shutting down");
    watcher.await.context("inventory watcher panicked")?;
    if let Some(events) = events {
        events.await.context("event reader panicked")?;
    }
    if let Some(tftp) = tftp {
        tftp.await
            .context("TFTP server panicked")?
            .context("TFTP server failed")?;
    }
    for http in servers {
        http.await
            .context("http server panicked")?
            .context("http server failed")?;
    }
    stop.store(true, Ordering::Relaxed);
    tokio::task::spawn_blocking(move || slow_thread.join())
        .await
        .context("slow path join failed")?
        .map_err(|_| anyhow::anyhow!("slow path thread panicked"))?;
    // Dropping the last handle detaches the program.
    drop(admin);
    Ok(())
}

/// Binds UDP port 69 on the interface and serves `root` over TFTP, turning
/// finished transfers into boot progress.
async fn start_tftp(
    cfg: &RunConfig,
    root: &Path,
    boot: Arc<BootState>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<tokio::task::JoinHandle<Result<(), tftp::ServeError>>> {
    use socket2::{Domain, Protocol, Socket, Type};
    let mtu = netdev::mtu_of(&cfg.iface)?;
    let tftp_cfg = tftp::TftpConfig {
        max_blksize: tftp::TftpConfig::blksize_for_mtu(mtu),
        max_windowsize: cfg.tftp_max_windowsize,
        busy_poll: cfg.tftp_busy_poll,
        ..tftp::TftpConfig::new(root)
    };
    let server = tftp::Server::new(tftp_cfg)
        .with_context(|| format!("cannot serve {} over TFTP", root.display()))?;
    boot.tftp_stats.set(server.stats()).ok();
    let sock = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))
        .context("failed to open the TFTP socket")?;
    sock.set_reuse_address(true)?;
    sock.bind_device(Some(cfg.iface.as_bytes()))
        .with_context(|| format!("failed to bind the TFTP socket to {}", cfg.iface))?;
    sock.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 69)).into())
        .context("failed to bind UDP port 69")?;
    sock.set_nonblocking(true)?;
    let sock = tokio::net::UdpSocket::from_std(sock.into())?;
    info!(root = %root.display(), "serving TFTP on UDP port 69");
    let (tx, mut rx) = tokio::sync::mpsc::channel::<tftp::TransferEvent>(1024);
    tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            let ip = match event.peer.ip() {
                std::net::IpAddr::V4(ip) => ip,
                std::net::IpAddr::V6(ip) => ip.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED),
            };
            let Some(mac) = boot.mac_at(ip) else { continue };
            let at = event
                .finished
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
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
            boot.progress
                .tftp(mac, at, format!("{} {} B {how}", event.file, event.bytes));
        }
    });
    Ok(tokio::spawn(server.serve(sock, Some(tx), shutdown)))
}

/// Sets a socket's receive buffer past `rmem_max` (`SO_RCVBUFFORCE`, which
/// the agent's CAP_NET_ADMIN allows), else as far as `rmem_max` lets it.
fn force_recv_buffer(sock: &socket2::Socket, bytes: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: value is a c_int of the size given, the fd is open.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        sock.set_recv_buffer_size(bytes)
    }
}

/// Serves `router` on `listener` until shutdown, with peer addresses.
fn serve_http(
    listener: TcpListener,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await
    })
}

/// Polls the inventory file and applies valid changes; refuses invalid ones
/// and keeps serving the previous inventory.
async fn watch_inventory(
    cfg: RunConfig,
    server: Server,
    shared: Arc<AdminState>,
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
                        shared.boot.dhcp.replace_inventory(Arc::new(inv.clone()));
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
    // Room for the requests that arrive while a batch's leases are being
    // committed (a few ms of fdatasync): the default buffer holds ~170.
    if let Err(e) = force_recv_buffer(&sock, SLOW_PATH_RCVBUF) {
        warn!(error = %e, "could not enlarge the DHCP socket's receive buffer");
    }
    let raw = RawSocket::send_only(&cfg.iface)
        .with_context(|| format!("failed to open a raw socket on {}", cfg.iface))?;
    let limits = cfg.limits;
    info!(iface = %cfg.iface, "slow path listening on UDP port 67");
    std::thread::Builder::new()
        .name("dhcp-slow-path".into())
        .spawn(move || server::serve(sock.into(), raw, server, shared, limits, stop))
        .context("failed to start the slow path thread")
}

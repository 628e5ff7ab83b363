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
//!
//! `run` is here; what it is given is [`config`]'s, and what it starts is
//! in `interfaces`, `services`, `oob` and `watch`.

mod config;
mod interfaces;
mod oob;
mod services;
mod watch;

use std::{
    net::IpAddr,
    path::Path,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use axum::serve::ListenerExt as _;
use tokio::{net::TcpListener, sync::mpsc};
use tracing::{info, warn};

use crate::{
    api::{
        admin::{self, AdminState},
        tls::{self},
        tls_listener::TlsListener,
    },
    control,
    dhcp::{Server, template},
    health::Health,
    http::{BootState, boot, limit, sendfile, token::TokenKey},
    inventory::{Inventory, LoadError, served_files},
    kube::{host_records, membership},
    lease::LeaseStore,
    metrics::AgentGauges,
    netboot::NetbootStore,
    open_files,
    progress::Progress,
    rollout::{
        self, Serving, compile_each, compile_each_beside, load_provisioned, map_writes_of,
        trim_heap,
    },
    share::Share,
    shutdown::Shutdown,
    state::State,
    sync::lock,
    xdp::{self, Capacity, FastPath, events},
};

pub use self::{
    config::{ApiAuth, ApiConfig, OobConfig, RunConfig},
    interfaces::{Interface, interfaces_of_node},
};
use self::{
    interfaces::{Iface, detach_unserved, resolve, start_pinned},
    oob::{ApiTls, api_gate, api_tls, start_recovery, watch_recovery},
    services::{serve_http, start_dhcp6, start_slow_path, start_tftp},
    watch::{monitor_health, watch_inventory, watch_netboot},
};

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

/// Says at startup what the inventory names that the agent will not serve:
/// TFTP boot files without `--boot-root` (the firmware of those hosts gets
/// an answer naming a file no one serves), and files missing under the
/// boot root or the artifacts directory.
fn warn_unserved_files(inv: &Inventory, cfg: &RunConfig) {
    let named = served_files::named(inv);
    if cfg.boot_root.is_none() {
        let tftp: Vec<String> = named
            .iter()
            .filter(|n| n.tftp)
            .map(|n| format!("{} {}", n.field, n.path))
            .collect();
        if !tftp.is_empty() {
            warn!(
                files = %tftp.join(", "),
                "the inventory names TFTP boot files but no --boot-root is given: TFTP is not \
                 served, and PXE firmware told to fetch them will fail"
            );
        }
    }
    let missing = served_files::missing(&named, cfg.boot_root.as_deref(), cfg.artifacts.as_deref());
    for problem in missing {
        warn!("the inventory names a file the agent cannot serve: {problem}");
    }
}

/// Runs until `shutdown` stops.
pub async fn run(mut cfg: RunConfig, mut shutdown: Shutdown) -> anyhow::Result<()> {
    limit_panic_messages();
    fit_open_files(&mut cfg);
    let ifaces = resolve(&cfg.interfaces)?;
    // DHCPv4 is served where there is an IPv4 address: one XDP program,
    // one compiled set of replies and one slow path per such interface.
    let ifaces4: Vec<Iface> = ifaces.iter().filter(|i| i.ip.is_some()).cloned().collect();
    let servers: Vec<Server> = ifaces4.iter().filter_map(Iface::server).collect();
    for i in &ifaces {
        info!(iface = %i.name, server = ?i.ip, server6 = ?i.ip6, "starting");
    }
    let provisioning: Vec<IpAddr> = ifaces.iter().flat_map(Iface::addresses).collect();
    let gate = Arc::new(api_gate(&cfg.api, &provisioning).await?);
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
    let leases = LeaseStore::open(&cfg.state_dir.join(crate::lease::STORE_FILE))?;
    // One program per interface: each map holds the replies naming that
    // interface's server, for the hosts of its subnets.
    let mut fasts = Vec::with_capacity(ifaces4.len());
    let mut map_writes = 0;
    if let Some(dir) = &cfg.pin_dir {
        xdp::pin::prepare(dir)?;
        detach_unserved(dir, &ifaces4)?;
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
    for (iface, compiled) in ifaces4.iter().zip(compiled) {
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
    let mut programs = Vec::with_capacity(ifaces4.len());
    for (iface, fast) in ifaces4.iter().zip(&fasts) {
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
    // Readiness follows the DHCPv4 slow path; on an agent with no IPv4
    // interface, the first DHCPv6 loop.
    let mut beats = ifaces4.is_empty();
    for iface in &ifaces {
        if let Some(server) = iface.server() {
            slow_threads.push(start_slow_path(
                &cfg,
                iface,
                server,
                state.clone(),
                stop.clone(),
            )?);
        }
        let dhcp6 = start_dhcp6(&cfg, iface, state.clone(), stop.clone(), beats)?;
        beats &= dhcp6.is_none();
        slow_threads.extend(dhcp6);
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
        servers6: ifaces.iter().filter_map(|i| i.ip6).collect(),
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
    let interfaces = ifaces4.iter().map(|i| i.name.clone()).collect();
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
        interfaces,
        boot: boot.clone(),
        oob: oob.clone(),
        kube: OnceLock::new(),
        gate,
        api_tls: api_tls.as_ref().map(|t| t.stats.clone()),
        shutdown: shutdown.clone(),
        fleet: Default::default(),
    });

    warn_unserved_files(&state.inventory(), &cfg);
    // Each interface's turns for artifacts, before the TFTP servers give
    // places in them and the boot HTTP listener takes them.
    state.admission.set_bound(cfg.artifact_transfers);
    for iface in &ifaces {
        let addrs: Vec<IpAddr> = [iface.ip.map(IpAddr::from), iface.ip6.map(IpAddr::from)]
            .into_iter()
            .flatten()
            .collect();
        state.admission.interface(&iface.name, &addrs);
    }
    let tftp = match &cfg.boot_root {
        Some(root) => start_tftp(&cfg, &ifaces, root, boot.clone(), shutdown.clone()).await?,
        None => Vec::new(),
    };
    let mut http_servers = Vec::new();
    // One listener for every interface: the default address is the
    // wildcard, and each interface's replies point at its own address.
    let boot_listener = limit::bind(cfg.http_addr)
        .with_context(|| format!("failed to bind the boot HTTP address {}", cfg.http_addr))?;
    info!(addr = %cfg.http_addr, "serving iPXE scripts, boot files and artifacts");
    http_servers.push(tokio::spawn(sendfile::serve(
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
    http_servers.push(serve_http(
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
            http_servers.push(serve_http(api_listener, api_router, shutdown.clone()));
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
            http_servers.push(serve_http(
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
            http_servers.push(tokio::spawn(async move {
                reload.await;
                Ok(())
            }));
        }
    }

    // Named at exit when pinned: they keep answering without an agent.
    let left_pinned = cfg
        .pin_dir
        .as_ref()
        .map(|dir| (dir.clone(), programs.clone()));
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
            servers.clone(),
            serving.clone(),
            layout,
            shutdown.clone(),
        )),
    };
    let netboot_task = tokio::spawn(watch_netboot(
        servers.clone(),
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
    for http in http_servers {
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
    // Dropping the last handle detaches the programs, unless pinned.
    drop(admin);
    if let Some((dir, programs)) = left_pinned {
        let gauges = *lock(&serving.gauges);
        for (iface, program) in programs {
            info!(
                %iface,
                program,
                pins = %xdp::pin::iface_dir(&dir, &iface).display(),
                generation = gauges.reloads_ok + 1,
                hosts = gauges.hosts,
                "exiting with the XDP program pinned: it keeps answering the known hosts of \
                 this inventory generation on {iface} until the next agent adopts it \
                 (`pxe-agent detach --pin-dir {}` removes it)",
                dir.display()
            );
        }
    }
    Ok(())
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
        http_parked: cfg.http_limits.max_parked,
    };
    let fitted = open_files::fit(wanted);
    if cfg.boot_root.is_some() {
        cfg.tftp_max_transfers = fitted.tftp_transfers;
    }
    cfg.http_limits.max_connections = fitted.http_connections;
    cfg.http_limits.max_parked = fitted.http_parked;
}

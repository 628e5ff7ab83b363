//! What the agent watches while it runs: the inventory file and the
//! netboot records (each change handed to the rollout), and the health of
//! the XDP links and the state store.

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime},
};

use tracing::{error, warn};

use super::config::RunConfig;
use crate::{
    dhcp::Server,
    inventory::Layout,
    netdev,
    rollout::{self, Serving},
    shutdown::Shutdown,
    state::State,
    sync::lock,
};

/// Polls the inventory file and applies valid changes; refuses invalid ones
/// and keeps serving the previous inventory. `layout` is that of the file
/// in force, which a reload patches from.
pub(super) async fn watch_inventory(
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
pub(super) async fn watch_netboot(
    servers: Vec<Server>,
    serving: Arc<Serving>,
    mut shutdown: Shutdown,
) {
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
pub(super) fn fingerprint(path: &Path) -> Option<(SystemTime, u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len(), meta.ino()))
}

/// How often the health monitor asks the kernel and the state store.
pub(super) const HEALTH_EVERY: Duration = Duration::from_secs(1);

/// How often the state store is probed with a write of its own.
pub(super) const STORE_PROBE_EVERY: Duration = Duration::from_secs(5);

/// Keeps `Health` current with what only a question shows: whether our
/// program is still the one attached to each interface (`programs` holds
/// the interface and our program's id there), and whether the state store
/// can still be written. Both questions block, so they run on the blocking
/// pool.
pub(super) async fn monitor_health(
    programs: Vec<(String, u32)>,
    shared: Arc<State>,
    mut shutdown: Shutdown,
) {
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
            let found: Vec<(&String, XdpFound)> = programs
                .iter()
                .map(|(iface, program_id)| (iface, xdp_check(iface, *program_id)))
                .collect();
            shared.health.set_xdp_modes(
                found
                    .iter()
                    .map(|(iface, f)| (iface.to_string(), f.mode))
                    .collect(),
            );
            let problems: Vec<String> = found.into_iter().filter_map(|(_, f)| f.problem).collect();
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

/// What the kernel says of our program on one interface.
pub(super) struct XdpFound {
    /// How it is attached: `native`, `generic`, `offload`, or `none`.
    pub mode: &'static str,
    /// What is wrong, if anything.
    pub problem: Option<String>,
}

/// How our program `program_id` is attached to `iface`, and what is
/// wrong there.
pub(super) fn xdp_check(iface: &str, program_id: u32) -> XdpFound {
    let none = |problem| XdpFound {
        mode: "none",
        problem: Some(problem),
    };
    match netdev::xdp_attached(iface) {
        Ok(attached) => match attached.iter().find(|(id, _)| *id == program_id) {
            Some((_, mode)) => XdpFound {
                mode: mode.as_str(),
                problem: None,
            },
            None => match attached.first() {
                Some((id, _)) => none(format!(
                    "another XDP program (id {id}) is attached to {iface}, not ours (id {program_id})"
                )),
                None => none(format!("no XDP program attached to {iface}")),
            },
        },
        Err(e) => none(format!("cannot read the XDP state of {iface}: {e}")),
    }
}

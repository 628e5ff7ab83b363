//! Putting an inventory in force: load, compile for each served interface,
//! check against the fast path's maps, sync the maps with rollback, then
//! swap the state both paths and the control task read. Every source (the
//! file, the Kubernetes API, netboot changes) comes through here, under one
//! lock, so that none undoes another.

use std::{
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tracing::{error, info, warn};

use crate::{
    control,
    dhcp::{Server, template},
    inventory::{Host, Inventory, Layout, LoadError, Loaded},
    metrics::AgentGauges,
    netboot::NetbootStore,
    state::State,
    sync::lock,
    xdp::{self, Capacity, FastPath, SyncError, sync_each},
};

/// What serves an inventory, and what putting another in force changes.
pub struct Serving {
    /// One per served interface, in the order given; owned by the reload,
    /// which holds them while it writes the maps.
    pub fast: Mutex<Vec<FastPath>>,
    pub gauges: Mutex<AgentGauges>,
    /// Held while an inventory is compiled and put in force, so a reload
    /// and a netboot change never undo each other.
    pub applying: Mutex<()>,
    /// Inventory, leases and progress, which both paths read.
    pub state: Arc<State>,
    /// The out-of-band task, told of each inventory in force.
    pub control: control::Handle,
}

/// Loads and compiles an inventory; the error names file, host and field.
/// `check`, `run` and every reload come through here, so a file `check`
/// passes is one `run` can load. `http_port` is where the boot HTTP server
/// listens, which the default iPXE script URL points at.
pub fn prepare(
    path: &Path,
    server: &Server,
    http_port: u16,
) -> Result<(Inventory, template::Compiled), LoadError> {
    let (inv, mut compiled) = prepare_each(path, std::slice::from_ref(server), http_port)?;
    Ok((
        inv,
        compiled.pop().expect("one server, one compiled inventory"),
    ))
}

/// An inventory with the replies compiled from it, `compiled[i]` for the
/// `i`th interface's server.
pub type Prepared = (Inventory, Vec<template::Compiled>);

/// Like [`prepare`], compiling the replies once per interface's server:
/// `compiled[i]` names `servers[i]` and holds the hosts it answers.
pub fn prepare_each(
    path: &Path,
    servers: &[Server],
    http_port: u16,
) -> Result<Prepared, LoadError> {
    compile_each(Inventory::load(path)?, path, servers, http_port)
}

/// The part of [`prepare_each`] after the inventory is loaded, for every
/// source: the file, or the Kubernetes API (`label` names the source in
/// messages, as the path names a file).
pub fn compile_each(
    inv: Inventory,
    label: &Path,
    servers: &[Server],
    http_port: u16,
) -> Result<Prepared, LoadError> {
    compile_each_beside(settled(inv), label, servers, http_port, None)
}

/// [`compile_each`] for a reload of a running agent: hosts unchanged since
/// the inventory in force keep what its maps hold (see
/// [`template::compile_reusing`]).
pub fn compile_each_beside(
    mut inv: Inventory,
    label: &Path,
    servers: &[Server],
    http_port: u16,
    running: Option<&Serving>,
) -> Result<Prepared, LoadError> {
    inv.use_http_port(http_port);
    inv.serve_on(&servers.iter().map(|s| s.ip).collect::<Vec<_>>());
    // What is in force, taken under the lock and compiled beside without it.
    let in_force = running.map(|serving| {
        let fast = lock(&serving.fast);
        let compiled: Vec<_> = fast
            .iter()
            .map(|f| f.in_step().then(|| f.current().compiled().clone()))
            .collect();
        (serving.state.inventory(), compiled)
    });
    let templates = servers
        .iter()
        .enumerate()
        .map(|(i, server)| {
            let reuse = in_force.as_ref().and_then(|(inv, compiled)| {
                Some(template::Reuse {
                    inv,
                    compiled: compiled.get(i)?.as_deref()?,
                })
            });
            compile(label, &inv, server, reuse)
        })
        .collect::<Result<_, _>>()?;
    Ok((inv, templates))
}

/// Compiles `inv` and checks the result against the limits of the fast
/// path's maps; `path` is only used in messages.
fn compile(
    path: &Path,
    inv: &Inventory,
    server: &Server,
    reuse: Option<template::Reuse>,
) -> Result<template::Compiled, LoadError> {
    let invalid = |problems| LoadError::Invalid {
        path: path.to_path_buf(),
        problems,
    };
    let compiled = template::compile_reusing(inv, server, reuse).map_err(invalid)?;
    // Past the largest maps an agent can be given: refused here, so that
    // `check` says so; a running agent's own maps are checked in force.
    Capacity::LARGEST
        .fits(&compiled, inv.hosts.len())
        .map_err(|problem| invalid(vec![problem]))?;
    Ok(compiled)
}

/// Gives the heap that loading and compiling an inventory used and freed
/// back to the system, so that the agent's RSS follows what it keeps: the
/// parse and compile peak of a large inventory is several times what stays,
/// and glibc returns only the top of the main heap by itself, never
/// memory freed in the middle of an arena.
pub fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free pages of glibc's own arenas;
    // it touches no memory that is in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// `inv` copied into heap that parsing has freed, the original dropped.
/// Its per-host strings and options were allocated among the parser's
/// garbage and, once that is freed, pin a page each that the system cannot
/// get back (at 100,000 hosts the inventory's RSS was three times its
/// heap); after a trim the copy is laid out in consolidated free memory,
/// side by side. Costs one clone of the inventory per load.
fn settled(inv: Inventory) -> Inventory {
    trim_heap();
    let mut settled = inv.clone();
    // The hosts themselves, not only the list of them.
    for host in &mut settled.hosts {
        *host = Arc::new(Host::clone(host));
    }
    drop(inv);
    settled
}

/// What became of a reload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reload {
    /// In force on both paths.
    Applied,
    /// The file is not valid: it waits for the next change of the file.
    Refused,
    /// The maps could not be written; worth trying again.
    SyncFailed,
}

/// How long after a failed map write the same file is tried again.
pub const RELOAD_RETRY: Duration = Duration::from_secs(5);

/// Loads the inventory at `path` and puts it in force in both paths on
/// every interface (`servers[i]` is that of `serving.fast[i]`), or refuses
/// it and leaves the previous one in force everywhere. Also returns the
/// layout of the file in force afterwards: the new file's when it was
/// applied, `before` otherwise.
pub fn apply_inventory(
    path: &Path,
    servers: &[Server],
    http_port: u16,
    serving: &Serving,
    before: Option<Layout>,
) -> (Reload, Option<Layout>) {
    let state = &serving.state;
    let _applying = lock(&serving.applying);
    let started = Instant::now();
    let in_force = state.inventory();
    let loaded = load_provisioned(
        path,
        before.as_ref().map(|l| (&*in_force, l)),
        &state.netboot,
    );
    drop(in_force);
    let read = started.elapsed();
    let (prepared, layout, patched) = match loaded {
        Ok(loaded) => (
            compile_each_beside(loaded.inventory, path, servers, http_port, Some(serving)),
            loaded.layout,
            loaded.patched,
        ),
        Err(e) => (Err(e), None, false),
    };
    let reload = apply_prepared(prepared, serving, started);
    if reload != Reload::Applied {
        return (reload, before);
    }
    // Reading and checking the file is most of a small change's cost.
    info!(
        read_ms = read.as_secs_f64() * 1e3,
        compile_and_sync_ms = (started.elapsed() - read).as_secs_f64() * 1e3,
        patched,
        "inventory reload timing"
    );
    (reload, layout)
}

/// The inventory file at `path`, read and checked (patched from `previous`
/// when it can be, see [`Inventory::reload`]), with the hosts the netboot
/// store records as done. A file parsed whole is settled.
pub fn load_provisioned(
    path: &Path,
    previous: Option<(&Inventory, &Layout)>,
    netboot: &NetbootStore,
) -> Result<Loaded, LoadError> {
    let mut loaded = Inventory::reload(path, previous)?;
    if !loaded.patched {
        loaded.inventory = settled(loaded.inventory);
    }
    loaded.inventory.provisioned = netboot.done();
    Ok(loaded)
}

pub fn apply_netboot(servers: &[Server], serving: &Serving) {
    let state = &serving.state;
    let _applying = lock(&serving.applying);
    let current = state.inventory();
    let done = state.netboot.done();
    if current.provisioned == done {
        return;
    }
    let mut inv = (*current).clone();
    inv.provisioned = done;
    let label = Path::new("netboot state");
    let in_force: Vec<_> = {
        let fast = lock(&serving.fast);
        fast.iter()
            .map(|f| f.in_step().then(|| f.current().compiled().clone()))
            .collect()
    };
    let templates = servers
        .iter()
        .zip(&in_force)
        .map(|(server, compiled)| {
            let reuse = compiled.as_deref().map(|compiled| template::Reuse {
                inv: &current,
                compiled,
            });
            compile(label, &inv, server, reuse)
        })
        .collect::<Result<Vec<_>, _>>();
    match templates {
        Ok(templates) => {
            if apply_compiled(Ok((inv, templates)), serving, None) == Reload::SyncFailed {
                // Tried again on the next change or reload; say so now.
                warn!("netboot change not yet in force on the fast path");
            }
        }
        Err(e) => error!("netboot change not applied: {e}"),
    }
}

/// Puts an inventory that any source loaded and compiled (or its error) in
/// force on both paths, or leaves the previous one in force everywhere.
/// `started` is when its reading began, which the reload's duration (a
/// gauge) counts from.
pub fn apply_prepared(
    prepared: Result<Prepared, LoadError>,
    serving: &Serving,
    started: Instant,
) -> Reload {
    apply_compiled(prepared, serving, Some(started))
}

/// [`apply_prepared`]; `reload` (when the reload started) is `None` for a
/// netboot change, which is not counted, timed or logged as a reload of
/// the inventory.
fn apply_compiled(
    prepared: Result<Prepared, LoadError>,
    serving: &Serving,
    reload: Option<Instant>,
) -> Reload {
    let health = &serving.state.health;
    let rejected = || {
        lock(&serving.gauges).reloads_rejected += 1;
    };
    let (inv, templates) = match prepared {
        Ok(prepared) => prepared,
        Err(e) => {
            rejected();
            warn!("inventory change refused, still serving the previous one: {e}");
            return Reload::Refused;
        }
    };
    let count = templates.iter().map(template::Compiled::replies).sum();
    let mut fast = lock(&serving.fast);
    // The maps were sized at start; an inventory past them is refused
    // whole, like any other invalid one.
    let too_big = fast
        .iter()
        .zip(&templates)
        .find_map(|(f, c)| f.capacity().fits(c, inv.hosts.len()).err());
    if let Some(problem) = too_big {
        drop(fast);
        rejected();
        warn!("inventory change refused, still serving the previous one: {problem}");
        return Reload::Refused;
    }
    let synced = sync_each(&mut fast, templates);
    drop(fast);
    let report = match synced {
        Ok(report) => report,
        Err(e @ SyncError::RolledBack { .. }) => {
            rejected();
            health.set_maps(Ok(()));
            error!(
                "inventory change not applied: failed to update the hosts map: {e}; \
                 still serving the previous inventory on both paths; trying again in {} s",
                RELOAD_RETRY.as_secs()
            );
            return Reload::SyncFailed;
        }
        Err(e @ SyncError::Mixed { .. }) => {
            rejected();
            health.set_maps(Err(e.to_string()));
            error!(
                "inventory change not applied: {e}; trying again in {} s",
                RELOAD_RETRY.as_secs()
            );
            return Reload::SyncFailed;
        }
    };
    health.set_maps(Ok(()));
    let hosts = inv.hosts.len();
    let inv = Arc::new(inv);
    serving.control.set_inventory(inv.clone());
    serving.state.replace_inventory(inv);
    // In force on both paths from here; giving memory back comes after.
    let took = reload.map(|started| started.elapsed());
    trim_heap();
    {
        let mut gauges = lock(&serving.gauges);
        gauges.hosts = hosts;
        gauges.templates = count;
        gauges.map_writes += map_writes_of(&report);
        if let Some(took) = took {
            gauges.reloads_ok += 1;
            gauges.reload_seconds = Some(took);
        }
    }
    if reload.is_none() {
        info!(
            written = report.written,
            removed = report.removed,
            unchanged = report.unchanged,
            "netboot state applied"
        );
        return Reload::Applied;
    }
    info!(
        hosts,
        written = report.written,
        removed = report.removed,
        unchanged = report.unchanged,
        "inventory reloaded"
    );
    Reload::Applied
}

/// Map element writes and deletes of one sync, as `pxe_xdp_map_writes_total`
/// counts them.
pub fn map_writes_of(report: &xdp::maps::SyncReport) -> u64 {
    u64::try_from(report.map_writes()).unwrap_or(u64::MAX)
}

/// Puts an inventory a source other than the file compiled in force, under
/// [`Serving::applying`]; false if it could not. A netboot change made
/// while it compiled is looked at again.
pub fn apply_from_source(serving: &Serving, prepared: Prepared) -> bool {
    let applied = {
        let _applying = lock(&serving.applying);
        // The objects were read before: the gauge times compile and sync
        // here.
        apply_prepared(Ok(prepared), serving, Instant::now()) == Reload::Applied
    };
    // Compiled before a netboot change, maybe: the watcher checks.
    serving.state.netboot_changed.notify_one();
    applied
}

#[cfg(test)]
mod tests {
    use std::{fmt::Write as _, fs, net::Ipv4Addr, process};

    use super::*;

    const SERVER: Server = Server {
        ip: Ipv4Addr::new(10, 0, 0, 1),
        mac: [0x02, 0, 0, 0, 0, 1],
    };

    /// An inventory file of `count` hosts in 10.0.0.0/8 whose profile sets
    /// every boot class, so that each compiles to five replies.
    fn every_class_inventory(count: u32) -> String {
        let mut text = String::from(
            "subnets: [{cidr: 10.0.0.0/8}]\n\
             profiles:\n  - name: all\n    boot: {bios: undionly.kpxe, uefi: ipxe.efi, \
             uefi_arm64: ipxe-arm64.efi, http: \"http://{server}/ipxe.efi\"}\n\
             hosts:\n",
        );
        for n in 0..count {
            let [_, a, b, c] = (n + 2).to_be_bytes();
            let _ = writeln!(
                text,
                "  - {{mac: \"02:00:00:{a:02x}:{b:02x}:{c:02x}\", ip: 10.{a}.{b}.{c}, profile: all}}"
            );
        }
        text
    }

    #[test]
    fn prepare_each_compiles_each_interface_its_own_hosts_and_address() {
        let path = std::env::temp_dir().join(format!("pxe-agent-app-{}-each.yaml", process::id()));
        fs::write(
            &path,
            "subnets: [{cidr: 10.66.0.0/16}, {cidr: 10.100.0.0/24}]\n\
             profiles: [{name: w, boot: {bios: undionly.kpxe}}]\n\
             hosts:\n  - {mac: \"02:00:00:00:00:10\", ip: 10.66.1.10, profile: w}\n  \
             - {mac: \"02:00:00:00:01:00\", ip: 10.100.0.50, profile: w}\n",
        )
        .expect("write the inventory");
        let vlan = Server {
            ip: Ipv4Addr::new(10, 100, 0, 1),
            mac: [0x02, 0, 0, 0, 0, 2],
        };
        let parent = Server {
            ip: Ipv4Addr::new(10, 66, 0, 1),
            ..SERVER
        };
        let result = prepare_each(&path, &[parent, vlan], 8080);
        let _ = fs::remove_file(&path);
        let (_, templates) = result.expect("valid");
        assert_eq!(templates.len(), 2);
        let (parent_host, vlan_host) = ([2, 0, 0, 0, 0, 0x10], [2, 0, 0, 0, 1, 0]);
        for (set, server, host) in [
            (&templates[0], parent, parent_host),
            (&templates[1], vlan, vlan_host),
        ] {
            assert!(!set.hosts.is_empty());
            for key in set.hosts.keys() {
                assert_eq!(key.mac, host);
            }
            for body in &set.bodies {
                assert_eq!(
                    (body.server_ip, body.server_mac),
                    (server.ip.octets(), server.mac)
                );
            }
        }
    }

    #[test]
    fn prepare_points_the_default_ipxe_script_at_the_http_port() {
        let path =
            std::env::temp_dir().join(format!("pxe-agent-app-{}-script.yaml", process::id()));
        fs::write(&path, every_class_inventory(1)).expect("write the inventory");
        let result = prepare(&path, &SERVER, 8081);
        let _ = fs::remove_file(&path);
        let (inv, _) = result.expect("valid");
        assert_eq!(inv.ipxe.script, "http://{server}:8081/boot/{mac}.ipxe");
    }
}

//! What the agents of a fleet (`--peers kube`) share about each inventory
//! host, so that they act as one: its netboot record (done or armed, since
//! when, by what), its recovery record as its owner keeps it, and the boot
//! steps that agents other than the owner saw. One coordination.k8s.io/v1
//! Lease per host, `pxe-agent-host-<mac>`, labelled [`HOST_LABEL`],
//! carries them as JSON annotations ([`NETBOOT`], [`RECOVERY`], [`STEPS`]),
//! the way Kubernetes' own leader election once kept its record in an
//! annotation.
//!
//! Owns the records' form, their merge rules ([`Change::over`]: netboot
//! last-writer-wins by its time, done on a tie; each step the later one;
//! the recovery record the owner's), reading them (one watch, whose
//! records go to the netboot store, boot progress and the control task)
//! and writing this agent's changes (merge patches at the Lease's
//! resourceVersion, read again and merged again on a 409). It decides
//! nothing: who owns a host is [`Share`](super::Share)'s, what the records
//! mean `netboot`'s and `recovery`'s. See docs/peers.md.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use futures_util::StreamExt as _;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt as _, watcher},
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::coordination::{HOST_LABEL, leases_api};
use crate::{
    mac::MacAddr,
    netboot,
    progress::{Stage, Step},
    ratelimit::TokenBucket,
    recovery,
    shutdown::Shutdown,
    state::State,
};

/// The annotation holding the host's [`SharedNetboot`].
pub const NETBOOT: &str = "pxe-agent.io/netboot";
/// The annotation holding the host's [`SharedRecovery`].
pub const RECOVERY: &str = "pxe-agent.io/recovery";
/// The annotation holding the host's [`Steps`].
pub const STEPS: &str = "pxe-agent.io/steps";

/// Tries of one write against 409s before it waits for the next round.
const CONFLICT_RETRIES: u32 = 4;
/// How often boot steps are compared with what is shared, and pending
/// writes (new or failed) are written.
const ROUND: Duration = Duration::from_millis(500);
/// The longest one call to the API server may take: a hung call must not
/// hold up the records (or the agent's shutdown).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Warnings about failed writes, at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The Lease of `mac`'s record.
pub fn lease_name(mac: MacAddr) -> String {
    format!("pxe-agent-host-{}", hex(mac))
}

fn hex(mac: MacAddr) -> String {
    mac.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn mac_of_hex(text: &str) -> Option<MacAddr> {
    if text.len() != 12 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (i, byte) in mac.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(MacAddr(mac))
}

/// A host's netboot record and the agent that wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedNetboot {
    #[serde(flatten)]
    pub record: netboot::Record,
    pub node: String,
}

/// A host's recovery record as its owner keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedRecovery {
    pub node: String,
    pub record: recovery::Record,
}

/// One boot step an agent saw.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedStep {
    pub at_ms: u64,
    pub detail: String,
    pub node: String,
}

/// The latest step of each stage any agent shared.
pub type Steps = BTreeMap<Stage, SharedStep>;

/// Everything shared about one host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shared {
    pub netboot: Option<SharedNetboot>,
    pub recovery: Option<SharedRecovery>,
    pub steps: Steps,
}

impl Shared {
    /// The host and its records from a host record Lease; an annotation
    /// that does not parse counts as absent (and is overwritten by the
    /// next change).
    pub fn from_lease(lease: &Lease) -> Option<(MacAddr, Shared)> {
        let meta = &lease.metadata;
        let mac = mac_of_hex(meta.labels.as_ref()?.get(HOST_LABEL)?)?;
        let annotations = meta.annotations.clone().unwrap_or_default();
        let get = |key: &str| annotations.get(key).map(String::as_str);
        Some((
            mac,
            Shared {
                netboot: get(NETBOOT).and_then(|t| serde_json::from_str(t).ok()),
                recovery: get(RECOVERY).and_then(|t| serde_json::from_str(t).ok()),
                steps: get(STEPS)
                    .and_then(|t| serde_json::from_str(t).ok())
                    .unwrap_or_default(),
            },
        ))
    }
}

/// A change of this agent's to share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Netboot(netboot::Record),
    /// `owner`: this agent owns the host now. A former owner only finishes
    /// what it started: its record is written over its own, never over
    /// the new owner's.
    Recovery {
        record: recovery::Record,
        owner: bool,
    },
    Steps(Steps),
}

impl Change {
    /// The annotation to write over `current` (what the host's Lease holds
    /// now), or `None` when it holds this change already or a newer one:
    /// a netboot record only when it supersedes the shared one, steps
    /// only those later than the shared ones (merged with the rest), the
    /// owner's recovery record whenever it differs (a former owner's only
    /// over its own).
    pub fn over(&self, current: &Shared, node: &str) -> Option<(&'static str, String)> {
        match self {
            Change::Netboot(record) => {
                let shared = current.netboot.as_ref().map(|n| &n.record);
                record.supersedes(shared).then(|| {
                    (
                        NETBOOT,
                        text(&SharedNetboot {
                            record: *record,
                            node: node.to_string(),
                        }),
                    )
                })
            }
            Change::Recovery { record, owner } => {
                let (same, others) = current.recovery.as_ref().map_or((false, false), |r| {
                    (r.node == node && &r.record == record, r.node != node)
                });
                (!same && (*owner || !others)).then(|| {
                    (
                        RECOVERY,
                        text(&SharedRecovery {
                            node: node.to_string(),
                            record: record.clone(),
                        }),
                    )
                })
            }
            Change::Steps(steps) => {
                let mut merged = current.steps.clone();
                let mut newer = false;
                for (stage, step) in steps {
                    if merged.get(stage).is_none_or(|s| s.at_ms < step.at_ms) {
                        merged.insert(*stage, step.clone());
                        newer = true;
                    }
                }
                newer.then(|| (STEPS, text(&merged)))
            }
        }
    }
}

/// The JSON of an annotation (serializing plain data cannot fail).
fn text(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// How the records are kept.
#[derive(Clone, Debug)]
pub struct Config {
    /// The Leases' namespace (as the membership's).
    pub namespace: Option<String>,
    pub node: String,
    /// Step writes a second, at most; netboot and recovery records are
    /// written at once (one change per host per boot, and the boot-loop
    /// protection waits on them).
    pub step_qps: u32,
}

/// The channels between the records and the rest of the agent.
pub struct Links {
    /// The netboot store's local changes (`NetbootStore::publish_to`).
    pub netboot: mpsc::UnboundedReceiver<(MacAddr, netboot::Record)>,
    /// The control task's changed records of the hosts it owns.
    pub recovery: mpsc::UnboundedReceiver<(MacAddr, recovery::Record)>,
    /// Peers' recovery records, for the control task to follow.
    pub adopt: mpsc::UnboundedSender<(MacAddr, recovery::Record)>,
}

/// Writes waiting for their turn, one of each kind per host.
#[derive(Default)]
struct Pending {
    netboot: BTreeMap<MacAddr, netboot::Record>,
    recovery: BTreeMap<MacAddr, recovery::Record>,
    steps: BTreeMap<MacAddr, Steps>,
}

/// Keeps the hosts' records until `shutdown`. See the module documentation.
pub async fn run(
    cfg: Config,
    client: Client,
    state: Arc<State>,
    mut links: Links,
    mut shutdown: Shutdown,
) {
    let (api, namespace) = leases_api(client, cfg.namespace.as_deref());
    let (tx, mut events) = mpsc::channel(1024);
    let watch_api = api.clone();
    let watching = tokio::spawn(async move {
        let config = watcher::Config::default().labels(HOST_LABEL);
        let mut stream = watcher(watch_api, config).default_backoff().boxed();
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => {
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    warn!(error = %e, "watch of the hosts' shared records failed; retrying");
                }
            }
        }
    });
    let mut keeper = Keeper {
        node: cfg.node.clone(),
        api,
        state,
        adopt: links.adopt.clone(),
        cache: HashMap::new(),
        listing: None,
        pending: Pending::default(),
        bucket: TokenBucket::new(cfg.step_qps, Instant::now()),
        warned: None,
    };
    info!(%namespace, node = %cfg.node, "sharing the hosts' netboot and recovery records through Leases");
    let mut round = tokio::time::interval(ROUND);
    round.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let flush = tokio::select! {
            () = shutdown.stopped() => break,
            Some(event) = events.recv() => {
                keeper.event(event);
                false
            }
            // A local change goes out at once.
            Some((mac, record)) = links.netboot.recv() => {
                keeper.pending.netboot.insert(mac, record);
                true
            }
            Some((mac, record)) = links.recovery.recv() => {
                keeper.pending.recovery.insert(mac, record);
                true
            }
            _ = round.tick() => {
                keeper.scan_steps();
                true
            }
        };
        if flush {
            tokio::select! {
                () = shutdown.stopped() => break,
                () = keeper.flush() => {}
            }
        }
    }
    watching.abort();
}

struct Keeper {
    node: String,
    api: Api<Lease>,
    state: Arc<State>,
    adopt: mpsc::UnboundedSender<(MacAddr, recovery::Record)>,
    /// Each host's Lease as last read or written: resourceVersion, records.
    cache: HashMap<MacAddr, (String, Shared)>,
    /// The initial list being received.
    listing: Option<HashMap<MacAddr, (String, Shared)>>,
    pending: Pending,
    bucket: TokenBucket,
    /// When a failed write was last warned about.
    warned: Option<Instant>,
}

impl Keeper {
    fn event(&mut self, event: watcher::Event<Lease>) {
        match event {
            watcher::Event::Init => self.listing = Some(HashMap::new()),
            watcher::Event::InitApply(lease) => {
                if let (Some(listing), Some((mac, rv, shared))) = (&mut self.listing, read(&lease))
                {
                    listing.insert(mac, (rv, shared));
                }
            }
            watcher::Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                self.cache.clear();
                for (mac, (rv, shared)) in listed {
                    self.take(mac, rv, shared);
                }
                // Local records the fleet has not seen (kept while the API
                // was away, or from before peers) go out now.
                for (mac, record) in self.state.netboot.records() {
                    let shared = self.cache.get(&mac).and_then(|(_, s)| s.netboot.as_ref());
                    if record.supersedes(shared.map(|n| &n.record)) {
                        self.pending.netboot.insert(mac, record);
                    }
                }
            }
            watcher::Event::Apply(lease) => {
                if let Some((mac, rv, shared)) = read(&lease) {
                    self.take(mac, rv, shared);
                }
            }
            watcher::Event::Delete(lease) => {
                if let Some((mac, _, _)) = read(&lease) {
                    self.cache.remove(&mac);
                }
            }
        }
    }

    /// Caches a host's Lease and takes what peers wrote in it.
    fn take(&mut self, mac: MacAddr, rv: String, shared: Shared) {
        let stats = &self.state.host_records;
        if let Some(n) = &shared.netboot {
            match self.state.netboot.adopt(mac, n.record) {
                Ok(true) => {
                    bump(&stats.taken_netboot);
                    info!(%mac, phase = ?n.record.phase, by = %n.record.by, node = %n.node, "netboot record taken from a peer");
                    self.state.netboot_changed.notify_one();
                }
                Ok(false) => {}
                Err(e) => warn!(%mac, error = %e, "failed to store a peer's netboot record"),
            }
        }
        for (stage, step) in shared.steps.iter().filter(|(_, s)| s.node != self.node) {
            let local = self.state.progress.get(mac);
            let newer = local
                .as_ref()
                .and_then(|p| p.steps().into_iter().find(|(s, _)| s == stage)?.1.cloned())
                .is_none_or(|l| l.at_ms < step.at_ms);
            if newer {
                bump(&stats.taken_steps);
                self.state.progress.merge_remote(
                    mac,
                    *stage,
                    Step {
                        at_ms: step.at_ms,
                        detail: format!("{} (seen by {})", step.detail, step.node),
                    },
                );
            }
        }
        // Only a record that changed goes to the control task: a Lease
        // changes with every step written to it too.
        let before = self.cache.get(&mac).and_then(|(_, s)| s.recovery.as_ref());
        if let Some(r) = shared.recovery.as_ref().filter(|r| r.node != self.node)
            && before != Some(r)
        {
            bump(&stats.taken_recovery);
            let _ = self.adopt.send((mac, r.record.clone()));
        }
        self.cache.insert(mac, (rv, shared));
    }

    /// Queues the boot steps this agent saw of managed hosts another agent
    /// owns that are later than the shared ones: the owner's recovery
    /// follows them.
    fn scan_steps(&mut self) {
        let share = self.state.share();
        if !share.is_shared() {
            return;
        }
        let inventory = self.state.inventory();
        for host in inventory.hosts.iter().filter(|h| h.bmc.is_some()) {
            if share.owns_host(host.mac) {
                continue;
            }
            let Some(progress) = self.state.progress.get(host.mac) else {
                continue;
            };
            let shared = self.cache.get(&host.mac).map(|(_, s)| &s.steps);
            let steps: Steps = progress
                .steps()
                .into_iter()
                .filter_map(|(stage, step)| Some((stage, step?)))
                .filter(|(stage, step)| {
                    shared
                        .and_then(|s| s.get(stage))
                        .is_none_or(|s| s.at_ms < step.at_ms)
                })
                .map(|(stage, step)| {
                    (
                        stage,
                        SharedStep {
                            at_ms: step.at_ms,
                            detail: step.detail.clone(),
                            node: self.node.clone(),
                        },
                    )
                })
                .collect();
            if !steps.is_empty() {
                self.pending
                    .steps
                    .entry(host.mac)
                    .or_default()
                    .extend(steps);
            }
        }
    }

    /// Writes what is pending: netboot records first, then recovery
    /// records, then steps as the rate allows. A failed write stays
    /// pending for the next round.
    async fn flush(&mut self) {
        for (mac, record) in std::mem::take(&mut self.pending.netboot) {
            if !self.write(mac, &Change::Netboot(record)).await {
                self.pending.netboot.entry(mac).or_insert(record);
            }
        }
        let share = self.state.share();
        for (mac, record) in std::mem::take(&mut self.pending.recovery) {
            let change = Change::Recovery {
                record: record.clone(),
                owner: share.owns_host(mac),
            };
            if !self.write(mac, &change).await {
                self.pending.recovery.entry(mac).or_insert(record);
            }
        }
        while let Some((mac, steps)) = self.pending.steps.pop_first() {
            if !self.bucket.try_take(Instant::now()) {
                self.pending.steps.insert(mac, steps);
                break;
            }
            if !self.write(mac, &Change::Steps(steps.clone())).await {
                self.pending.steps.insert(mac, steps);
                break;
            }
        }
    }

    /// Writes `change` to `mac`'s Lease; true when it is there (or
    /// something newer is).
    async fn write(&mut self, mac: MacAddr, change: &Change) -> bool {
        let state = self.state.clone();
        let stats = &state.host_records;
        for _ in 0..CONFLICT_RETRIES {
            let result = match self.cache.get(&mac) {
                None => {
                    let Some((key, value)) = change.over(&Shared::default(), &self.node) else {
                        return true;
                    };
                    let lease = new_lease(mac, key, value);
                    timed(self.api.create(&PostParams::default(), &lease)).await
                }
                Some((rv, shared)) => {
                    let Some((key, value)) = change.over(shared, &self.node) else {
                        return true;
                    };
                    let patch = json!({
                        "metadata": {"resourceVersion": rv, "annotations": {key: value}},
                    });
                    timed(self.api.patch(
                        &lease_name(mac),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    ))
                    .await
                }
            };
            match result {
                Ok(lease) => {
                    bump(&stats.writes_ok);
                    if let Some((mac, rv, shared)) = read(&lease) {
                        self.cache.insert(mac, (rv, shared));
                    }
                    return true;
                }
                Err(kube::Error::Api(s))
                    if s.is_conflict() || s.is_already_exists() || s.is_not_found() =>
                {
                    bump(&stats.write_conflicts);
                    debug!(%mac, code = s.code, "host record changed meanwhile; reading it again");
                    match timed(self.api.get_opt(&lease_name(mac))).await {
                        Ok(Some(lease)) => {
                            if let Some((mac, rv, shared)) = read(&lease) {
                                self.take(mac, rv, shared);
                            }
                        }
                        Ok(None) => {
                            self.cache.remove(&mac);
                        }
                        Err(e) => {
                            bump(&stats.writes_failed);
                            self.warn(mac, &e);
                            return false;
                        }
                    }
                }
                Err(e) => {
                    bump(&stats.writes_failed);
                    self.warn(mac, &e);
                    return false;
                }
            }
        }
        false
    }
}

impl Keeper {
    /// A failed read or write, logged at most every [`WARN_EVERY`]; the
    /// write stays pending for the next round.
    fn warn(&mut self, mac: MacAddr, e: &kube::Error) {
        if self.warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            self.warned = Some(Instant::now());
            warn!(%mac, error = %e, "failed to write a host's shared record; trying again every round");
        }
    }
}

/// `call`, failed after [`CALL_TIMEOUT`].
async fn timed<T>(call: impl Future<Output = kube::Result<T>>) -> kube::Result<T> {
    tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| {
            Err(kube::Error::Service(
                format!("no answer within {} s", CALL_TIMEOUT.as_secs()).into(),
            ))
        })
}

/// A host record Lease's host, resourceVersion and records.
fn read(lease: &Lease) -> Option<(MacAddr, String, Shared)> {
    let (mac, shared) = Shared::from_lease(lease)?;
    Some((mac, lease.metadata.resource_version.clone()?, shared))
}

/// A new host record Lease holding one annotation.
fn new_lease(mac: MacAddr, key: &str, value: String) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(lease_name(mac)),
            labels: Some(
                [
                    (HOST_LABEL.to_string(), hex(mac)),
                    (
                        "app.kubernetes.io/name".to_string(),
                        "pxe-agent".to_string(),
                    ),
                ]
                .into(),
            ),
            annotations: Some([(key.to_string(), value)].into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netboot::{Actor, Phase};

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0xab, 0, 1]);

    fn step(at_ms: u64, node: &str) -> SharedStep {
        SharedStep {
            at_ms,
            detail: "undionly.kpxe".into(),
            node: node.into(),
        }
    }

    #[test]
    fn a_lease_round_trips_its_records() {
        let netboot = SharedNetboot {
            record: netboot::Record {
                phase: Phase::Done,
                since_ms: 5,
                by: Actor::PhoneHome,
            },
            node: "node-0".into(),
        };
        let (key, value) = Change::Netboot(netboot.record)
            .over(&Shared::default(), "node-0")
            .expect("new");
        let mut lease = new_lease(MAC, key, value);
        assert_eq!(
            lease.metadata.name.as_deref(),
            Some("pxe-agent-host-525400ab0001")
        );
        let (key, value) = Change::Steps(Steps::from([(Stage::Tftp, step(7, "node-1"))]))
            .over(&Shared::default(), "node-1")
            .expect("new");
        lease
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(key.into(), value);
        lease.metadata.resource_version = Some("3".into());
        let (mac, rv, shared) = read(&lease).expect("a host record");
        assert_eq!((mac, rv.as_str()), (MAC, "3"));
        assert_eq!(shared.netboot, Some(netboot));
        assert_eq!(shared.steps.get(&Stage::Tftp), Some(&step(7, "node-1")));
        // A label that is no MAC is not a host record.
        lease
            .metadata
            .labels
            .get_or_insert_default()
            .insert(HOST_LABEL.into(), "nope".into());
        assert!(read(&lease).is_none());
    }

    #[test]
    fn changes_merge_last_writer_wins() {
        let armed = |since_ms| netboot::Record {
            phase: Phase::Armed,
            since_ms,
            by: Actor::Operator,
        };
        let current = Shared {
            netboot: Some(SharedNetboot {
                record: armed(10),
                node: "node-1".into(),
            }),
            recovery: None,
            steps: Steps::from([(Stage::Dhcp, step(10, "node-1"))]),
        };
        // An older netboot record is not written; a newer one is.
        assert_eq!(Change::Netboot(armed(9)).over(&current, "node-0"), None);
        assert!(
            Change::Netboot(armed(11))
                .over(&current, "node-0")
                .is_some()
        );
        // Steps: only later ones, merged with the rest.
        let older = Steps::from([(Stage::Dhcp, step(9, "node-0"))]);
        assert_eq!(Change::Steps(older).over(&current, "node-0"), None);
        let later = Steps::from([(Stage::Tftp, step(12, "node-0"))]);
        let (key, value) = Change::Steps(later)
            .over(&current, "node-0")
            .expect("newer");
        assert_eq!(key, STEPS);
        let merged: Steps = serde_json::from_str(&value).expect("json");
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[&Stage::Dhcp].node, "node-1");
    }
}

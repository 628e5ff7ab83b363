//! The inventory from the Kubernetes API, a second source beside the file:
//! BootHost, BootProfile and BootNetwork objects (`pxe-agent.io/v1alpha1`)
//! in the agent's namespace, and, with `--metal3-selector`, Metal3
//! BareMetalHosts read as hosts. Owns the client, one watch per kind (list,
//! then watch from its resourceVersion, with bookmarks, re-list on 410 and
//! back-off on errors, all kube-runtime's `watcher`), the debounced
//! rebuild (`document`: one validation, the file's), handing the result to
//! the apply path every source shares (`rollout`), and writing back status and
//! Events (`status`, `events`) to the agent's own kinds only.
//!
//! It does not decide DHCP policy, touch the XDP maps itself, or write to
//! BareMetalHosts, which another controller owns.

pub mod coordination;
pub mod document;
pub mod events;
pub mod host_records;
pub mod manifests;
pub mod membership;
pub mod objects;
pub mod status;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    hash::{DefaultHasher, Hash as _, Hasher as _},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client,
    api::{DynamicObject, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt as _, watcher},
};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use self::{
    document::{Basis, Built, SecretKeys, Snapshot},
    objects::{Kind, ObjRef, Stored},
    status::{Interner, Outbox},
};
use crate::metrics::exposition::{self, Exposition};
use crate::{
    bmc::{Fallbacks, Password},
    inventory::{Inventory, LoadError},
    mac::MacAddr,
    ratelimit::TokenBucket,
    rollout::{Prepared, Serving},
    shutdown::Shutdown,
    view::{HostView, for_each_host_view},
};

/// What `pxe-agent run --kube` needs.
#[derive(Clone, Debug)]
pub struct KubeSettings {
    /// `--kube-namespace`; `None`: the kubeconfig's or service account's.
    pub namespace: Option<String>,
    /// `--node-name`: written as `servingNode`.
    pub node_name: String,
    /// `--metal3-selector`: also read the BareMetalHosts it selects.
    pub metal3_selector: Option<String>,
    /// `--kube-status-qps`: status patches and Events a second, at most.
    pub status_qps: u32,
}

/// Compiles an inventory for the served interfaces (`rollout::compile_each`);
/// given the running agent, beside what it has in force, so that the hosts
/// a rebuild did not change keep their compiled records.
pub type Prepare =
    Arc<dyn Fn(Inventory, &Path, Option<&Serving>) -> Result<Prepared, LoadError> + Send + Sync>;
/// Puts a compiled inventory in force on both paths; false if it could not.
pub type Apply = Arc<dyn Fn(Prepared) -> bool + Send + Sync>;

/// Quiet time after a change before the inventory is rebuilt, so that a
/// burst of changes (an `kubectl apply` of many objects) is one rebuild.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// A full rebuild (and Secret re-read) this often even without events.
const RESYNC: Duration = Duration::from_secs(30);
/// Secrets are read again after this long.
const SECRET_TTL: Duration = Duration::from_secs(30);
/// How often wanted statuses are recomputed from the agent's state.
const STATUS_EVERY: Duration = Duration::from_secs(1);
/// Retries of a status patch after a 409 Conflict.
const CONFLICT_RETRIES: u32 = 3;
/// How long `start` waits for the first list of every kind.
const INITIAL_LIST: Duration = Duration::from_secs(30);

pub const KUBE_EVENTS: &str = "pxe_kube_watch_events_total";
pub const KUBE_WATCH_ERRORS: &str = "pxe_kube_watch_errors_total";
pub const KUBE_REBUILDS: &str = "pxe_kube_rebuilds_total";
pub const KUBE_REFUSED: &str = "pxe_kube_objects_refused";
pub const KUBE_STATUS: &str = "pxe_kube_status_patches_total";
pub const KUBE_EVENTS_SENT: &str = "pxe_kube_events_created_total";

/// The Kubernetes source's counters, for `/metrics`.
#[derive(Debug, Default)]
pub struct KubeStats {
    pub watch_events: AtomicU64,
    pub watch_errors: AtomicU64,
    pub rebuilds_ok: AtomicU64,
    pub rebuilds_failed: AtomicU64,
    /// Objects refused by the last rebuild (a gauge).
    pub refused: AtomicU64,
    pub status_sent: AtomicU64,
    pub status_failed: AtomicU64,
    pub status_conflicts: AtomicU64,
    pub events_created: AtomicU64,
}

impl KubeStats {
    pub fn render(&self) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = Exposition::new();
        out.family(
            KUBE_EVENTS,
            exposition::Kind::Counter,
            "Watch events received from the Kubernetes API.",
        )
        .value(get(&self.watch_events));
        out.family(
            KUBE_WATCH_ERRORS,
            exposition::Kind::Counter,
            "Watch errors (each followed by a back-off and a re-watch or re-list).",
        )
        .value(get(&self.watch_errors));
        out.family(
            KUBE_REBUILDS,
            exposition::Kind::Counter,
            "Inventory rebuilds from the cluster's objects.",
        )
        .sample(&[("result", "ok")], get(&self.rebuilds_ok))
        .sample(&[("result", "failed")], get(&self.rebuilds_failed));
        out.family(
            KUBE_REFUSED,
            exposition::Kind::Gauge,
            "Objects the last rebuild refused as invalid.",
        )
        .value(get(&self.refused));
        out.family(
            KUBE_STATUS,
            exposition::Kind::Counter,
            "Status patches sent, by result.",
        )
        .sample(&[("result", "ok")], get(&self.status_sent))
        .sample(&[("result", "failed")], get(&self.status_failed))
        .sample(&[("result", "conflict")], get(&self.status_conflicts));
        out.family(
            KUBE_EVENTS_SENT,
            exposition::Kind::Counter,
            "Events created for refused objects.",
        )
        .value(get(&self.events_created));
        out.finish()
    }
}

/// What a watch task reports.
enum Update {
    Event(Kind, watcher::Event<DynamicObject>),
}

/// The objects of one kind as watched, and the list being received.
#[derive(Default)]
struct Store {
    objects: BTreeMap<String, Stored>,
    listing: Option<BTreeMap<String, Stored>>,
    listed: bool,
}

fn name_of(object: &DynamicObject) -> Option<String> {
    object.metadata.name.clone()
}

/// The source: the client, the stores the watches fill, and what the last
/// rebuild decided.
pub struct Source {
    client: Client,
    namespace: String,
    settings: KubeSettings,
    prepare: Prepare,
    stats: Arc<KubeStats>,
    rx: mpsc::Receiver<Update>,
    stores: BTreeMap<Kind, Store>,
    kinds: Vec<Kind>,
    secrets: BTreeMap<String, (Instant, Option<SecretKeys>)>,
    refused: BTreeMap<ObjRef, Vec<String>>,
    accepted: BTreeSet<ObjRef>,
    degraded: BTreeMap<ObjRef, Vec<String>>,
    /// When each object's Accepted condition last changed (accepted or
    /// not), so the wanted status stays the same until the write shows up
    /// in the watch.
    transitions: HashMap<ObjRef, (bool, u64)>,
    /// The generation and message an Event was last created for.
    evented: HashMap<ObjRef, (Option<i64>, String)>,
    /// BareMetalHost refusals already logged, per generation.
    logged: HashMap<ObjRef, (Option<i64>, String)>,
    /// The wanted statuses' texts, one copy of each.
    texts: Interner,
    /// What the last build was made of, when the next may patch it (see
    /// `document::patch`), and whether the last build was such a patch.
    basis: Option<Basis>,
    patched: bool,
    label: PathBuf,
}

/// A client of the in-cluster configuration, else `KUBECONFIG`'s, and the
/// agent's namespace: `namespace` (`--kube-namespace`) when given, else
/// the service account's or the kubeconfig context's.
pub async fn connect(namespace: Option<String>) -> anyhow::Result<(Client, String)> {
    let config = kube::Config::infer().await.map_err(|e| {
        anyhow::anyhow!("no Kubernetes configuration (in-cluster or KUBECONFIG): {e}")
    })?;
    let namespace = namespace.unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config)
        .map_err(|e| anyhow::anyhow!("failed to build the Kubernetes client: {e}"))?;
    Ok((client, namespace))
}

impl Source {
    /// Connects (in-cluster config, else `KUBECONFIG`), starts the watches
    /// and waits for the first list of every kind; the inventory they make.
    pub async fn start(
        settings: KubeSettings,
        prepare: Prepare,
    ) -> anyhow::Result<(Source, Prepared)> {
        let (client, namespace) = connect(settings.namespace.clone()).await?;
        let mut kinds = vec![Kind::BootNetwork, Kind::BootProfile, Kind::BootHost];
        if settings.metal3_selector.is_some() {
            kinds.push(Kind::BareMetalHost);
        }
        let stats = Arc::new(KubeStats::default());
        let (tx, rx) = mpsc::channel(1024);
        for &kind in &kinds {
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &namespace, &kind.resource());
            let mut config = watcher::Config::default();
            if kind == Kind::BareMetalHost
                && let Some(selector) = &settings.metal3_selector
            {
                config = config.labels(selector);
            }
            let (tx, stats) = (tx.clone(), stats.clone());
            tokio::spawn(async move {
                let mut stream = watcher(api, config).default_backoff().boxed();
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(event) => {
                            if tx.send(Update::Event(kind, event)).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                            warn!(kind = kind.name(), error = %e, "watch failed; retrying with back-off");
                        }
                    }
                }
            });
        }
        info!(%namespace, kinds = ?kinds.iter().map(|k| k.name()).collect::<Vec<_>>(), "reading the inventory from the Kubernetes API");
        let mut source = Source {
            client,
            label: PathBuf::from(format!("kubernetes namespace/{namespace}")),
            namespace,
            settings,
            prepare,
            stats,
            rx,
            stores: kinds.iter().map(|&k| (k, Store::default())).collect(),
            kinds,
            secrets: BTreeMap::new(),
            refused: BTreeMap::new(),
            accepted: BTreeSet::new(),
            degraded: BTreeMap::new(),
            transitions: HashMap::new(),
            evented: HashMap::new(),
            logged: HashMap::new(),
            texts: Interner::default(),
            basis: None,
            patched: false,
        };
        let deadline = tokio::time::Instant::now() + INITIAL_LIST;
        while !source.stores.values().all(|s| s.listed) {
            let missing: Vec<&str> = source
                .stores
                .iter()
                .filter(|(_, s)| !s.listed)
                .map(|(k, _)| k.plural())
                .collect();
            let update = tokio::time::timeout_at(deadline, source.rx.recv())
                .await
                .map_err(|_| {
                    anyhow::anyhow!(
                        "no list of {} from the Kubernetes API within {} s",
                        missing.join(", "),
                        INITIAL_LIST.as_secs()
                    )
                })?
                .ok_or_else(|| anyhow::anyhow!("the watches ended"))?;
            source.update(update);
        }
        let built = source.rebuild(None).await;
        let prepared = built.result.map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok((source, prepared))
    }

    pub fn stats(&self) -> Arc<KubeStats> {
        self.stats.clone()
    }

    /// Applies a watch event to the stores; true when an object changed in
    /// a way a rebuild depends on.
    fn update(&mut self, update: Update) -> bool {
        let Update::Event(kind, event) = update;
        self.stats.watch_events.fetch_add(1, Ordering::Relaxed);
        let Some(store) = self.stores.get_mut(&kind) else {
            return false;
        };
        // Only what is read is kept (not, for one, the field managers'
        // record, most of a real object's size).
        let value = Stored::new;
        match event {
            watcher::Event::Init => {
                store.listing = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(o) => {
                if let (Some(listing), Some(name)) = (&mut store.listing, name_of(&o)) {
                    listing.insert(name, value(&o));
                }
                false
            }
            watcher::Event::InitDone => {
                // A copy laid out after the list's own garbage is freed:
                // the objects as received sit one among each response's
                // parse, pinning its pages once it is freed.
                let listed = store.listing.take().unwrap_or_default().clone();
                let changed = listed.len() != store.objects.len()
                    || listed.iter().any(|(name, o)| {
                        !store.objects.get(name).is_some_and(|was| was.same_body(o))
                    });
                store.objects = listed;
                store.listed = true;
                changed
            }
            watcher::Event::Apply(o) => {
                let Some(name) = name_of(&o) else {
                    return false;
                };
                let o = value(&o);
                let changed = !store
                    .objects
                    .get(&name)
                    .is_some_and(|was| was.same_body(&o));
                store.objects.insert(name, o);
                changed
            }
            watcher::Event::Delete(o) => name_of(&o)
                .and_then(|name| store.objects.remove(&name))
                .is_some(),
        }
    }

    /// The Secrets the objects name (`Snapshot::secret_names`).
    fn snapshot_names(&self) -> BTreeSet<String> {
        let of = |kind| self.stores.get(&kind).map(|s| &s.objects);
        let empty = BTreeMap::new();
        document::secret_names(
            of(Kind::BootHost).unwrap_or(&empty),
            of(Kind::BootProfile).unwrap_or(&empty),
            of(Kind::BareMetalHost).unwrap_or(&empty),
        )
    }

    /// Reads the Secrets the objects name (again after [`SECRET_TTL`], and
    /// every time while one is missing).
    async fn read_secrets(&mut self, names: &BTreeSet<String>) {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        self.secrets.retain(|name, _| names.contains(name));
        for name in names {
            let fresh = self
                .secrets
                .get(name)
                .is_some_and(|(at, keys)| keys.is_some() && at.elapsed() < SECRET_TTL);
            if fresh {
                continue;
            }
            let keys = match api.get_opt(name).await {
                Ok(Some(secret)) => {
                    let data = secret.data.unwrap_or_default();
                    Some(SecretKeys {
                        username: data
                            .get(document::SECRET_USERNAME)
                            .and_then(|b| String::from_utf8(b.0.clone()).ok()),
                        password: data
                            .get(document::SECRET_PASSWORD)
                            .map(|b| Password::new(b.0.clone())),
                    })
                }
                Ok(None) => None,
                Err(e) => {
                    // Keep what was read before: an API hiccup is not a
                    // removed Secret.
                    warn!(secret = %name, error = %e, "failed to read a BMC credentials Secret");
                    if self.secrets.contains_key(name) {
                        continue;
                    }
                    None
                }
            };
            self.secrets.insert(name.clone(), (Instant::now(), keys));
        }
    }

    /// Everything a rebuild reads, the objects taken out of the stores
    /// (not copied: at fleet size they are most of the source's memory);
    /// [`Source::restore`] puts them back.
    fn snapshot(&mut self) -> Snapshot<Stored> {
        let mut take = |kind| {
            self.stores
                .get_mut(&kind)
                .map(|s| std::mem::take(&mut s.objects))
                .unwrap_or_default()
        };
        Snapshot {
            namespace: self.namespace.clone(),
            hosts: take(Kind::BootHost),
            profiles: take(Kind::BootProfile),
            networks: take(Kind::BootNetwork),
            bare_metal: take(Kind::BareMetalHost),
            secrets: self
                .secrets
                .iter()
                .filter_map(|(name, (_, keys))| keys.clone().map(|k| (name.clone(), k)))
                .collect(),
        }
    }

    /// Puts the objects a [`Source::snapshot`] took back in their stores.
    fn restore(&mut self, snapshot: Snapshot<Stored>) {
        for (kind, objects) in [
            (Kind::BootHost, snapshot.hosts),
            (Kind::BootProfile, snapshot.profiles),
            (Kind::BootNetwork, snapshot.networks),
            (Kind::BareMetalHost, snapshot.bare_metal),
        ] {
            if let Some(store) = self.stores.get_mut(&kind) {
                store.objects = objects;
            }
        }
    }

    /// Builds the inventory of the objects as they are now (beside the
    /// `running` agent's, once there is one).
    async fn rebuild(&mut self, running: Option<Arc<Serving>>) -> Built<Prepared> {
        let names = self.snapshot_names();
        self.read_secrets(&names).await;
        let snapshot = self.snapshot();
        let (prepare, label) = (self.prepare.clone(), self.label.clone());
        // What a patch starts from: the inventory in force, when it is the
        // last build's (a failed apply forgets the basis).
        let basis = self.basis.take();
        let previous = running.as_ref().map(|a| a.state.inventory());
        // The objects come back however the build ends, a panic included:
        // stores left empty would make the next rebuild an empty inventory.
        let (built, basis, snapshot) = tokio::task::spawn_blocking(move || {
            let prepare = |inv, label: &Path| prepare(inv, label, running.as_deref());
            let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let patched =
                    previous
                        .as_deref()
                        .zip(basis.as_ref())
                        .and_then(|(previous, basis)| {
                            document::patch(&snapshot, &label, &prepare, previous, basis)
                        });
                match patched {
                    Some((built, basis)) => (built, Some(basis), true),
                    None => {
                        let built = document::build(&snapshot, &label, &prepare);
                        let whole = built.result.is_ok()
                            && built.refused.is_empty()
                            && built.degraded.is_empty();
                        let basis = whole.then(|| snapshot.basis());
                        (built, basis, false)
                    }
                }
            }));
            (built, snapshot)
        })
        .await
        .map(|(built, snapshot)| match built {
            Ok((built, basis, patched)) => (Ok(built), basis.map(|b| (b, patched)), snapshot),
            Err(e) => (Err(e), None, snapshot),
        })
        .expect("the rebuild task catches its panics");
        self.restore(snapshot);
        self.patched = basis.as_ref().is_some_and(|(_, patched)| *patched);
        self.basis = basis.map(|(b, _)| b);
        let mut built = built.unwrap_or_else(|e| Built {
            result: Err(LoadError::Invalid {
                path: PathBuf::from("kubernetes"),
                problems: vec![crate::inventory::Problem::new(
                    None,
                    "inventory",
                    format!("the rebuild panicked: {}", panic_message(&*e)),
                )],
            }),
            refused: BTreeMap::new(),
            accepted: BTreeSet::new(),
            degraded: BTreeMap::new(),
        });
        match &built.result {
            Ok(_) => {
                self.stats.rebuilds_ok.fetch_add(1, Ordering::Relaxed);
                self.refused = built.refused.clone();
                // Moved, not copied: one entry an object.
                self.accepted = std::mem::take(&mut built.accepted);
                self.degraded = built.degraded.clone();
            }
            Err(e) => {
                self.stats.rebuilds_failed.fetch_add(1, Ordering::Relaxed);
                warn!(
                    "inventory from the Kubernetes API refused, still serving the previous one: {e}"
                );
            }
        }
        self.stats
            .refused
            .store(built.refused.len() as u64, Ordering::Relaxed);
        for (at, problems) in &built.refused {
            let generation = self.object(at).and_then(|o| o.generation);
            let message = problems.join("; ");
            if self.logged.get(at) != Some(&(generation, message.clone())) {
                warn!(object = %at, "refused: {message}");
                self.logged.insert(at.clone(), (generation, message));
            }
        }
        self.logged.retain(|at, _| built.refused.contains_key(at));
        built
    }

    fn object(&self, at: &ObjRef) -> Option<&Stored> {
        self.stores.get(&at.kind)?.objects.get(&*at.name)
    }

    /// Runs until shutdown: applies watch events, rebuilds after a quiet
    /// [`DEBOUNCE`], and feeds the status writer.
    pub async fn run(
        mut self,
        serving: Arc<Serving>,
        fallbacks: Arc<Fallbacks>,
        apply: Apply,
        mut shutdown: Shutdown,
    ) {
        let (out_tx, out_rx) = mpsc::channel(64);
        let writer = tokio::spawn(status_writer(
            self.client.clone(),
            self.namespace.clone(),
            self.settings.clone(),
            self.stats.clone(),
            out_rx,
            shutdown.clone(),
        ));
        let mut due: Option<tokio::time::Instant> = None;
        let mut resync = tokio::time::interval(RESYNC);
        resync.tick().await;
        let mut status_tick = tokio::time::interval(STATUS_EVERY);
        loop {
            let debounce = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.stopped() => break,
                update = self.rx.recv() => {
                    let Some(update) = update else { break };
                    if self.update(update) && due.is_none() {
                        due = Some(tokio::time::Instant::now() + DEBOUNCE);
                    }
                }
                () = debounce => {
                    due = None;
                    self.rebuild_and_apply(&apply, &serving).await;
                    let _ = out_tx.send(self.wanted(&serving, &fallbacks)).await;
                }
                _ = resync.tick() => {
                    self.rebuild_and_apply(&apply, &serving).await;
                }
                _ = status_tick.tick() => {
                    let _ = out_tx.send(self.wanted(&serving, &fallbacks)).await;
                }
            }
        }
        drop(out_tx);
        let _ = writer.await;
    }

    /// Rebuilds, and applies what the rebuild made unless it is the
    /// inventory in force (compared with the agent's own, not a copy: at
    /// fleet size an inventory is tens of megabytes).
    async fn rebuild_and_apply(&mut self, apply: &Apply, serving: &Arc<Serving>) {
        let started = Instant::now();
        let built = self.rebuild(Some(serving.clone())).await;
        let Ok(prepared) = built.result else {
            return;
        };
        if *serving.state.inventory() == prepared.0 {
            debug!("objects changed, inventory did not");
            return;
        }
        let hosts = prepared.0.hosts.len();
        let apply = apply.clone();
        let applied = tokio::task::spawn_blocking(move || apply(prepared))
            .await
            .unwrap_or(false);
        if applied {
            info!(
                hosts,
                refused = self.refused.len(),
                patched = self.patched,
                ms = started.elapsed().as_millis() as u64,
                "inventory from the Kubernetes API in force"
            );
        } else {
            // What is in force is not what the basis describes.
            self.basis = None;
        }
    }

    /// The status every own object should have now, where it may have
    /// changed, and the Events due. An object whose inputs (its status,
    /// generation and version as watched, its problems, what the agent
    /// observed of its host) are those of the last round is skipped: at
    /// fleet size a round over every object each second would build a
    /// status for each.
    fn wanted(&mut self, serving: &Serving, fallbacks: &Fallbacks) -> Outgoing {
        let mut views: HashMap<MacAddr, HostView> = HashMap::new();
        for_each_host_view(&serving.state, &serving.control, fallbacks, |view| {
            if status::matters(&view) {
                views.insert(view.mac, view);
            }
        });
        let now = crate::clock::now_ms();
        let mut statuses = Vec::new();
        let mut events = Vec::new();
        let node = self.settings.node_name.as_str();
        for kind in self.kinds.clone() {
            if !kind.is_ours() {
                continue;
            }
            let Some(store) = self.stores.get_mut(&kind) else {
                continue;
            };
            for (name, object) in &mut store.objects {
                let at = ObjRef::new(kind, name);
                let problems = self
                    .refused
                    .get(&at)
                    .or_else(|| self.degraded.get(&at))
                    .map(Vec::as_slice);
                if problems.is_none() && !self.accepted.contains(&at) {
                    // Not part of a successful rebuild yet.
                    continue;
                }
                let view = (kind == Kind::BootHost && !self.refused.contains_key(&at))
                    .then(|| object.mac.and_then(|mac| views.get(&mac)))
                    .flatten();
                let mut hasher = DefaultHasher::new();
                (object.seen, problems).hash(&mut hasher);
                view.map(|v| serde_json::to_string(v).unwrap_or_default())
                    .hash(&mut hasher);
                // Never 0, the mark of an object not offered yet.
                let fingerprint = hasher.finish() | 1;
                if object.offered == fingerprint {
                    continue;
                }
                object.offered = fingerprint;
                let generation = object.generation;
                let observed = object.status();
                let ok = problems.is_none();
                let since = match self.transitions.get(&at) {
                    Some(&(was, at_ms)) if was == ok => at_ms,
                    _ => {
                        self.transitions.insert(at.clone(), (ok, now));
                        now
                    }
                };
                let condition = status::accepted(problems, generation, observed.as_ref(), since);
                let wanted =
                    status::status_of(condition, generation, view, node, kind == Kind::BootHost);
                let resource_version = object.resource_version.as_deref().map(str::to_owned);
                statuses.push(Want {
                    at: at.clone(),
                    shown: status::same(&wanted, observed.as_ref()),
                    status: self.texts.get(wanted.to_string()),
                    resource_version: resource_version.clone(),
                });
                if let Some(problems) = problems {
                    let message = problems.join("; ");
                    let key = (generation, message.clone());
                    if self.evented.get(&at) != Some(&key) {
                        self.evented.insert(at.clone(), key);
                        events.push(events::Invalid {
                            at: at.clone(),
                            uid: object.uid.as_deref().map(str::to_owned),
                            resource_version,
                            message,
                        });
                    }
                }
            }
        }
        self.evented
            .retain(|at, _| self.refused.contains_key(at) || self.degraded.contains_key(at));
        let stores = &self.stores;
        self.transitions.retain(|at, _| {
            stores
                .get(&at.kind)
                .is_some_and(|s| s.objects.contains_key(&*at.name))
        });
        self.texts.prune();
        Outgoing { statuses, events }
    }
}

/// What a caught panic says, when it says it as text.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// One object's wanted status (compact JSON, interned), and whether the
/// watch already shows it.
struct Want {
    at: ObjRef,
    status: Arc<str>,
    shown: bool,
    resource_version: Option<String>,
}

/// One round of wanted statuses and the Events to create.
struct Outgoing {
    statuses: Vec<Want>,
    events: Vec<events::Invalid>,
}

/// Sends what the source wants written: at most `status_qps` patches and
/// Events a second, one queued status per object (the latest), merge
/// patches to `/status` guarded by the object's resourceVersion, re-read
/// and retried on a 409 Conflict.
async fn status_writer(
    client: Client,
    namespace: String,
    settings: KubeSettings,
    stats: Arc<KubeStats>,
    mut rx: mpsc::Receiver<Outgoing>,
    mut shutdown: Shutdown,
) {
    let mut outbox = Outbox::default();
    let mut versions: HashMap<ObjRef, String> = HashMap::new();
    let mut pending_events: Vec<events::Invalid> = Vec::new();
    let mut bucket = TokenBucket::new(settings.status_qps, Instant::now());
    let apis: BTreeMap<Kind, Api<DynamicObject>> = Kind::ALL
        .into_iter()
        .filter(|k| k.is_ours())
        .map(|k| {
            (
                k,
                Api::namespaced_with(client.clone(), &namespace, &k.resource()),
            )
        })
        .collect();
    let events_api: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(client.clone(), &namespace);
    loop {
        let idle = outbox.is_empty() && pending_events.is_empty();
        let wait = if idle {
            Duration::from_secs(3600)
        } else {
            bucket.wait()
        };
        tokio::select! {
            () = shutdown.stopped() => return,
            msg = rx.recv() => {
                let Some(out) = msg else { return };
                for want in out.statuses {
                    // The version guards a patch yet to send; none is
                    // kept for an object that shows what is wanted.
                    match want.resource_version {
                        Some(rv) if !want.shown => {
                            versions.insert(want.at.clone(), rv);
                        }
                        _ => {
                            versions.remove(&want.at);
                        }
                    }
                    outbox.offer(&want.at, want.status, want.shown);
                }
                pending_events.extend(out.events);
                continue;
            }
            () = tokio::time::sleep(wait) => {}
        }
        if !bucket.try_take(Instant::now()) {
            continue;
        }
        if let Some(event) = pending_events.pop() {
            let body = events::invalid_spec(&event, &namespace, &settings.node_name);
            match events_api.create(&PostParams::default(), &body).await {
                Ok(_) => {
                    stats.events_created.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => warn!(object = %event.at, error = %e, "failed to create an Event"),
            }
            continue;
        }
        let Some((at, wanted)) = outbox.take() else {
            continue;
        };
        let Some(api) = apis.get(&at.kind) else {
            continue;
        };
        let mut attempt = 0;
        let status: Value = serde_json::from_str(&wanted).unwrap_or(Value::Null);
        loop {
            let mut patch = json!({"status": status});
            if let Some(rv) = versions.get(&at) {
                patch["metadata"] = json!({"resourceVersion": rv});
            }
            match api
                .patch_status(&at.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(object) => {
                    stats.status_sent.fetch_add(1, Ordering::Relaxed);
                    if let Some(rv) = object.metadata.resource_version {
                        versions.insert(at.clone(), rv);
                    }
                    outbox.sent(&at, &wanted);
                    break;
                }
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < CONFLICT_RETRIES => {
                    stats.status_conflicts.fetch_add(1, Ordering::Relaxed);
                    attempt += 1;
                    debug!(object = %at, attempt, "status conflict; reading the object again");
                    match api.get_opt(&at.name).await {
                        Ok(Some(object)) => {
                            if let Some(rv) = object.metadata.resource_version {
                                versions.insert(at.clone(), rv);
                            }
                        }
                        Ok(None) => {
                            outbox.remove(&at);
                            versions.remove(&at);
                            break;
                        }
                        Err(e) => {
                            stats.status_failed.fetch_add(1, Ordering::Relaxed);
                            warn!(object = %at, error = %e, "failed to re-read after a conflict");
                            outbox.retry(&at, wanted);
                            break;
                        }
                    }
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    outbox.remove(&at);
                    versions.remove(&at);
                    break;
                }
                Err(e) => {
                    if matches!(&e, kube::Error::Api(s) if s.code == 409) {
                        stats.status_conflicts.fetch_add(1, Ordering::Relaxed);
                    }
                    stats.status_failed.fetch_add(1, Ordering::Relaxed);
                    warn!(object = %at, error = %e, "failed to write status; trying again later");
                    outbox.retry(&at, wanted);
                    break;
                }
            }
        }
    }
}

//! Out-of-band control in the running agent: one task that owns the
//! recovery [`Controller`], the [`Sequencer`] and the [`Executor`], feeds
//! the controller boot progress, ticks it at its deadlines, and runs the
//! operators' BMC calls (API and CLI) through the same sequencer, so that
//! every call on hardware is ordered in one place.
//!
//! Owns turning an operator's [`Op`] into trait calls ([`perform`], also
//! used by `pxe-agent bmc --direct`), what the API shows of it
//! ([`Outcome`], [`View`]) and the last known power state of each host.
//! It does not authenticate nor audit callers (that is `api::admin`), and
//! does not decide recoveries (that is `recovery`).
//!
//! With peers it acts only on the hosts this agent owns (`Share`), divides
//! the sequencing limits with the other live agents, shares the records
//! of its own hosts and follows the others' ([`Fleet`]).

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinSet,
};
use tracing::{info, warn};

use crate::{
    bmc::{Bmc, BmcError, BootDevice, BootFlags, BootTarget, PowerAction, PowerState},
    clock,
    inventory::{BmcSettings, Inventory},
    mac::MacAddr,
    progress::Progress,
    recovery::{
        self, Action, ActionKind, Controller, Done, HostStatus, Load, Observation, Record,
        Sequencer,
    },
    share::Share,
    shutdown::Shutdown,
    sync::lock,
};

/// How often boot progress and the slow path's request rate are read.
const POLL: Duration = Duration::from_secs(1);
/// Operators' calls waiting for the task.
const QUEUE: usize = 256;
/// Marks the epoch of an operator's call in the sequencer, so that the
/// controller's epochs (small counters) never collide with it.
const MANUAL: u64 = 1 << 63;
/// The longest a BMC action may still run after its agent lost the host:
/// a power-up's two calls (status, then power) at the IPMI driver's
/// deadline and grace each. A host gained from an agent that may still be
/// running one is held this long past that agent's next membership round.
const ACTION_BOUND: Duration = Duration::from_secs(31);

/// What an operator asks of one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Power(PowerAction),
    PowerStatus,
    BootDevice(BootTarget),
    /// Device id and chassis power, read only.
    Info,
    /// Hand the host to the recovery controller.
    Recover,
}

impl Op {
    /// The audit log's `action`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Power(_) | Op::PowerStatus => "power",
            Op::BootDevice(_) => "bootdev",
            Op::Info => "info",
            Op::Recover => "recover",
        }
    }

    /// The audit log's `params` (nothing secret is in an op).
    pub fn params(self) -> serde_json::Value {
        match self {
            Op::Power(a) => serde_json::json!({ "action": power_action_name(a) }),
            Op::PowerStatus => serde_json::json!({ "action": "status" }),
            Op::BootDevice(t) => serde_json::json!({
                "device": device_name(t.device),
                "persistent": t.persistent,
                "efi": t.efi,
            }),
            Op::Info | Op::Recover => serde_json::json!({}),
        }
    }

    /// Power-ups wait for the storm limits as the controller's do.
    fn powers_up(self) -> bool {
        matches!(
            self,
            Op::Power(PowerAction::On | PowerAction::Cycle | PowerAction::Reset)
        )
    }
}

/// `on`, `off`, `cycle`, `reset`, `soft`; `status` is [`Op::PowerStatus`].
pub fn parse_power(text: &str) -> Option<Op> {
    Some(match text {
        "on" => Op::Power(PowerAction::On),
        "off" => Op::Power(PowerAction::Off),
        "cycle" => Op::Power(PowerAction::Cycle),
        "reset" => Op::Power(PowerAction::Reset),
        "soft" => Op::Power(PowerAction::SoftOff),
        "status" => Op::PowerStatus,
        _ => return None,
    })
}

/// `pxe`, `disk`, `bios`, `http` (UEFI HTTP boot).
pub fn parse_device(text: &str) -> Option<BootDevice> {
    Some(match text {
        "pxe" => BootDevice::Pxe,
        "disk" => BootDevice::Disk,
        "bios" => BootDevice::BiosSetup,
        "http" => BootDevice::UefiHttp,
        _ => return None,
    })
}

fn power_action_name(a: PowerAction) -> &'static str {
    match a {
        PowerAction::On => "on",
        PowerAction::Off => "off",
        PowerAction::Cycle => "cycle",
        PowerAction::Reset => "reset",
        PowerAction::SoftOff => "soft",
    }
}

fn device_name(d: BootDevice) -> &'static str {
    match d {
        BootDevice::Pxe => "pxe",
        BootDevice::Disk => "disk",
        BootDevice::BiosSetup => "bios",
        BootDevice::UefiHttp => "http",
    }
}

/// The boot flags as the API shows them.
fn flags_name(f: BootFlags) -> String {
    if !f.valid || f.selector == 0 {
        return "none".into();
    }
    let device = [BootDevice::Pxe, BootDevice::Disk, BootDevice::BiosSetup]
        .into_iter()
        .find(|d| d.selector() == f.selector)
        .map(device_name)
        .or((f.selector == crate::bmc::redfish::UEFI_HTTP_SELECTOR).then_some("http"))
        .map_or_else(|| format!("selector {:#x}", f.selector), str::to_owned);
    let mut out = device;
    if f.persistent {
        out.push_str(" persistent");
    }
    if f.efi {
        out.push_str(" efi");
    }
    out
}

/// Why an operator's call failed, mapped to an HTTP status by the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Failure {
    /// No inventory host has that name or MAC.
    UnknownHost,
    /// The host has no `bmc` block.
    NoBmc,
    /// The controller refused (a recovery is under way).
    Refused,
    /// The BMC call failed.
    Bmc,
    /// The agent is shutting down.
    Unavailable,
}

/// The BMC's identity as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InfoView {
    pub device_id: u8,
    pub device_revision: u8,
    pub firmware: String,
    pub ipmi_version: String,
    pub manufacturer_id: u32,
    pub product_id: u16,
    /// Redfish `Manufacturer` (IPMI reports only `manufacturer_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// Redfish `Model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// Whether an operator's call succeeded: `ok` or `error` in the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallResult {
    /// Nothing failed (what an outcome is until [`Outcome::fail`]).
    #[default]
    Ok,
    Error,
}

impl CallResult {
    /// The CLI text, the same as the serde form.
    pub fn as_str(self) -> &'static str {
        match self {
            CallResult::Ok => "ok",
            CallResult::Error => "error",
        }
    }
}

impl fmt::Display for CallResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What came of one operator's call on one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Outcome {
    /// The host as asked (name or MAC).
    pub host: String,
    pub mac: Option<MacAddr>,
    /// [`CallResult::Error`] exactly when `failure` is set (see
    /// [`Outcome::fail`]).
    pub result: CallResult,
    /// Power state read or reached, when known.
    pub power: Option<PowerState>,
    /// The boot device read back, as text (`pxe persistent efi`, `none`).
    pub boot_device: Option<String>,
    pub info: Option<InfoView>,
    /// The recovery state after a `recover`.
    pub recovery: Option<recovery::State>,
    pub failure: Option<Failure>,
    pub error: Option<String>,
    pub duration_ms: u64,
}

impl Outcome {
    /// A call on `host` (`mac` once found) that has not failed (yet).
    pub fn new(host: &str, mac: Option<MacAddr>) -> Outcome {
        Outcome {
            host: host.to_string(),
            mac,
            ..Outcome::default()
        }
    }

    fn failed(host: &str, mac: Option<MacAddr>, failure: Failure, error: String) -> Outcome {
        let mut out = Outcome::new(host, mac);
        out.fail(failure, error);
        out
    }

    /// Marks the call failed, for `failure`, with `error` as its message.
    pub fn fail(&mut self, failure: Failure, error: String) {
        self.result = CallResult::Error;
        self.failure = Some(failure);
        self.error = Some(error);
    }

    pub fn is_ok(&self) -> bool {
        self.failure.is_none()
    }

    /// The audit log's `result`: `ok` or the error.
    pub fn audit_result(&self) -> String {
        match &self.error {
            None => "ok".into(),
            Some(e) => e.clone(),
        }
    }
}

/// Makes the trait calls of `op` (never [`Op::Recover`], which is the
/// controller's) on `bmc`, and says what they found: the power state
/// reached or read, the boot device read back.
pub async fn perform<B: Bmc>(bmc: &B, op: Op, out: &mut Outcome) -> Result<(), BmcError> {
    match op {
        Op::PowerStatus => {
            out.power = Some(bmc.power_status().await?);
        }
        Op::Power(action) => {
            bmc.power(action).await?;
            // What the chassis reports right after is what it reached or
            // is on its way from; a failed read does not undo the action.
            out.power = bmc.power_status().await.ok();
        }
        Op::BootDevice(target) => {
            bmc.set_boot_device(target).await?;
            out.boot_device = Some(flags_name(bmc.boot_device().await?));
        }
        Op::Info => {
            let info = bmc.info().await?;
            out.info = Some(InfoView {
                device_id: info.device_id,
                device_revision: info.device_revision,
                firmware: info.firmware_version.clone().unwrap_or_else(|| {
                    format!("{}.{:02x}", info.firmware_major, info.firmware_minor)
                }),
                ipmi_version: format!("{}.{}", info.ipmi_version.0, info.ipmi_version.1),
                manufacturer_id: info.manufacturer_id,
                product_id: info.product_id,
                vendor: info.vendor.clone(),
                model: info.model.clone(),
            });
            out.power = Some(bmc.power_status().await?);
            out.boot_device = Some(flags_name(bmc.boot_device().await?));
        }
        Op::Recover => {}
    }
    Ok(())
}

/// The host `name` (hostname or MAC) of `inv`.
pub fn find_host<'a>(inv: &'a Inventory, name: &str) -> Option<&'a crate::inventory::Host> {
    if let Ok(mac) = name.parse::<MacAddr>() {
        return inv.host_by_mac(mac);
    }
    inv.hosts
        .iter()
        .find(|h| h.hostname.as_deref() == Some(name))
        .map(|h| &**h)
}

/// What the API reads without asking the task: kept current by the task.
#[derive(Debug, Default)]
pub struct View {
    pub recovery: HashMap<MacAddr, HostStatus>,
    /// Last known power state and when it was learnt (unix ms).
    pub power: HashMap<MacAddr, (PowerState, u64)>,
    /// The recovery block of `/metrics`.
    pub metrics: String,
}

struct Request {
    host: String,
    op: Op,
    reply: oneshot::Sender<Outcome>,
}

/// The API's side of the task: send it calls, read its view, hand it
/// inventories.
#[derive(Clone)]
pub struct Handle {
    tx: mpsc::Sender<Request>,
    view: Arc<Mutex<View>>,
    inventory: Arc<watch::Sender<Arc<Inventory>>>,
}

impl Handle {
    /// Runs `op` on `host` through the task and waits for what came of it.
    pub async fn call(&self, host: &str, op: Op) -> Outcome {
        let (reply, rx) = oneshot::channel();
        let gone = || {
            Outcome::failed(
                host,
                None,
                Failure::Unavailable,
                "out-of-band control is not running".into(),
            )
        };
        if self
            .tx
            .send(Request {
                host: host.to_string(),
                op,
                reply,
            })
            .await
            .is_err()
        {
            return gone();
        }
        rx.await.unwrap_or_else(|_| gone())
    }

    pub fn view(&self) -> std::sync::MutexGuard<'_, View> {
        lock(&self.view)
    }

    /// Puts a reloaded inventory in force: plans and BMCs.
    pub fn set_inventory(&self, inv: Arc<Inventory>) {
        self.inventory.send_replace(inv);
    }
}

/// Builds a host's driver from its inventory settings.
pub type MakeBmc<B> = Box<dyn Fn(&BmcSettings) -> Result<B, BmcError> + Send>;

/// The inputs of the task besides its handle.
pub struct Inputs<B> {
    pub controller: Controller,
    pub sequencer: Sequencer,
    pub make_bmc: MakeBmc<B>,
    pub progress: Arc<Progress>,
    /// Requests the DHCP slow path received so far (a counter).
    pub slow_path_rx: Box<dyn Fn() -> u64 + Send>,
    /// The share in force: which hosts this agent owns.
    pub share: Box<dyn Fn() -> Arc<Share> + Send>,
    /// With peers: the records shared with them.
    pub fleet: Option<Fleet>,
}

/// The task's side of the records shared with peers
/// (`kube::host_records`).
pub struct Fleet {
    /// Changed records of the hosts this agent owns, to be shared.
    pub publish: mpsc::UnboundedSender<(MacAddr, Record)>,
    /// Records of the hosts other agents own, as they shared them.
    pub adopt: mpsc::UnboundedReceiver<(MacAddr, Record)>,
    /// How long a host gained from another owner waits before this agent
    /// acts on it.
    pub hold: Duration,
}

/// Starts the task serving `inv`; it ends when `shutdown` stops.
pub fn start<B: Bmc + 'static>(
    inputs: Inputs<B>,
    inv: Arc<Inventory>,
    shutdown: Shutdown,
) -> (Handle, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let (inv_tx, inv_rx) = watch::channel(inv);
    let view = Arc::new(Mutex::new(View::default()));
    let handle = Handle {
        tx,
        view: view.clone(),
        inventory: Arc::new(inv_tx),
    };
    let mut controller = inputs.controller;
    if inputs.fleet.is_some() {
        controller.set_peers();
    }
    let task = Task {
        controller,
        sequencer: inputs.sequencer,
        executor: recovery::Executor::new(),
        make_bmc: inputs.make_bmc,
        bmcs: HashMap::new(),
        inventory: Arc::new(Inventory::default()),
        progress: inputs.progress,
        slow_path_rx: inputs.slow_path_rx,
        share: inputs.share,
        owners_of: None,
        fleet: inputs.fleet,
        seen: HashMap::new(),
        rx_last: None,
        slow_path_rate: 0.0,
        manual: JoinSet::new(),
        pending: HashMap::new(),
        next_ticket: 0,
        view,
    };
    // On a thread and runtime of its own: every change of the controller
    // ends in a durable commit of the recovery store (an fsync), which must
    // not hold up the workers that serve DHCP, TFTP, HTTP and the API.
    let join = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("oob-control")
            .build();
        match runtime {
            Ok(rt) => rt.block_on(task.run(rx, inv_rx, shutdown)),
            Err(e) => {
                tracing::error!(error = %e, "failed to start the out-of-band control runtime")
            }
        }
    });
    (handle, join)
}

/// An operator's call waiting in the sequencer.
struct Pending {
    host: String,
    op: Op,
    reply: oneshot::Sender<Outcome>,
    asked: Instant,
}

struct Task<B> {
    controller: Controller,
    sequencer: Sequencer,
    executor: recovery::Executor<B>,
    make_bmc: MakeBmc<B>,
    bmcs: HashMap<MacAddr, Arc<B>>,
    inventory: Arc<Inventory>,
    progress: Arc<Progress>,
    slow_path_rx: Box<dyn Fn() -> u64 + Send>,
    share: Box<dyn Fn() -> Arc<Share> + Send>,
    /// The share the controller's owners were last set from.
    owners_of: Option<Arc<Share>>,
    fleet: Option<Fleet>,
    /// The progress step times already fed to the controller.
    seen: HashMap<MacAddr, [Option<u64>; 5]>,
    rx_last: Option<(u64, Instant)>,
    slow_path_rate: f64,
    manual: JoinSet<(Action, Pending, Outcome)>,
    pending: HashMap<(MacAddr, u64), Pending>,
    next_ticket: u64,
    view: Arc<Mutex<View>>,
}

impl<B: Bmc + 'static> Task<B> {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Request>,
        mut inv_rx: watch::Receiver<Arc<Inventory>>,
        mut shutdown: Shutdown,
    ) {
        let first = inv_rx.borrow_and_update().clone();
        self.apply(first);
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.step();
            let now = clock::now_ms();
            let wake = [
                self.controller.next_deadline(),
                self.sequencer.next_release_ms(now),
            ]
            .into_iter()
            .flatten()
            .min()
            .map_or(POLL, |at| Duration::from_millis(at.saturating_sub(now)))
            .min(POLL);
            tokio::select! {
                () = shutdown.stopped() => break,
                Some(req) = rx.recv() => self.request(req),
                Ok(()) = inv_rx.changed() => {
                    let inv = inv_rx.borrow_and_update().clone();
                    self.apply(inv);
                }
                Some((mac, record)) = recv_adopt(&mut self.fleet) => {
                    self.controller.adopt(mac, record, clock::now_ms());
                }
                Some(done) = self.executor.next(), if !self.executor.is_idle() => {
                    self.sequencer.finished(&done.action);
                    match done.result {
                        Ok(Done::PoweredOn | Done::PowerCycled) => {
                            self.note_power(done.action.mac, PowerState::On);
                        }
                        Ok(Done::Power(state)) => self.note_power(done.action.mac, state),
                        _ => {}
                    }
                    self.controller.complete(&done.action, done.result, clock::now_ms());
                }
                Some(joined) = self.manual.join_next(), if !self.manual.is_empty() => {
                    match joined {
                        Ok((ticket, pending, outcome)) => self.finish(ticket, pending, outcome),
                        Err(e) => warn!(error = %e, "a BMC call task was lost"),
                    }
                }
                _ = poll.tick() => self.poll(),
                () = tokio::time::sleep(wake) => {}
            }
        }
        // Calls still queued are answered, not dropped silently.
        for (_, p) in self.pending.drain() {
            let _ = p.reply.send(Outcome::failed(
                &p.host,
                None,
                Failure::Unavailable,
                "the agent is shutting down".into(),
            ));
        }
    }

    /// Puts `inv` in force: plans to the controller, drivers to the executor.
    fn apply(&mut self, inv: Arc<Inventory>) {
        let mut bmcs = HashMap::new();
        for host in &inv.hosts {
            let Some(settings) = &host.bmc else { continue };
            match (self.make_bmc)(settings) {
                Ok(bmc) => {
                    bmcs.insert(host.mac, Arc::new(bmc));
                }
                Err(e) => warn!(host = %host.label(), error = %e, "no driver for this BMC"),
            }
        }
        self.executor
            .set_bmcs(bmcs.iter().map(|(m, b)| (*m, b.clone())));
        self.bmcs = bmcs;
        self.controller
            .set_hosts(recovery::plans(&inv), clock::now_ms());
        // Who owns new hosts is settled before any tick.
        self.owners_of = None;
        info!(
            managed = self.bmcs.len(),
            "out-of-band control has the inventory"
        );
        self.inventory = inv;
    }

    fn request(&mut self, req: Request) {
        let Request { host, op, reply } = req;
        let asked = Instant::now();
        let Some(found) = find_host(&self.inventory, &host) else {
            let _ = reply.send(Outcome::failed(
                &host,
                None,
                Failure::UnknownHost,
                format!("no inventory host is named {host:?}"),
            ));
            return;
        };
        let mac = found.mac;
        if !self.bmcs.contains_key(&mac) {
            let _ = reply.send(Outcome::failed(
                &host,
                Some(mac),
                Failure::NoBmc,
                format!(
                    "host {} has no usable bmc block in the inventory",
                    found.label()
                ),
            ));
            return;
        }
        // With peers, one agent acts on each BMC: the host's owner, once
        // its hold of a host it gained is over.
        let share = (self.share)();
        let now = clock::now_ms();
        if !self.controller.acts_on(mac, now) {
            let why = match self.controller.held_until(mac) {
                Some(until) if share.owns_host(mac) => format!(
                    "this agent took host {} over from another one and acts on it in {} s \
                     (a call the other started may still be running)",
                    found.label(),
                    until.saturating_sub(now).div_ceil(1000)
                ),
                _ => format!(
                    "host {}'s BMC is acted on by its owner, {}; ask that agent",
                    found.label(),
                    share
                        .host_owner_name(mac)
                        .map_or("no live agent (try again shortly)".to_string(), |node| {
                            format!("the agent on node {node}")
                        })
                ),
            };
            let _ = reply.send(Outcome::failed(&host, Some(mac), Failure::Refused, why));
            return;
        }
        if op == Op::Recover {
            let now = clock::now_ms();
            let mut out = match self.controller.request(mac, now) {
                Ok(()) => Outcome::new(&host, Some(mac)),
                Err(e) => Outcome::failed(&host, Some(mac), Failure::Refused, e.to_string()),
            };
            // The first actions go to the sequencer now, so the state
            // answered is the one the host is in.
            self.step();
            out.recovery = self.controller.status(mac).map(|s| s.state);
            out.duration_ms = elapsed_ms(asked);
            let _ = reply.send(out);
            return;
        }
        self.next_ticket += 1;
        let ticket = Action {
            mac,
            kind: if op.powers_up() {
                ActionKind::PowerUp
            } else {
                // Only the kind's class matters to the sequencer.
                ActionKind::SetBootDevice(BootTarget {
                    device: BootDevice::Pxe,
                    persistent: false,
                    efi: false,
                })
            },
            epoch: MANUAL | self.next_ticket,
        };
        self.pending.insert(
            (mac, ticket.epoch),
            Pending {
                host,
                op,
                reply,
                asked,
            },
        );
        self.sequencer.push(ticket, clock::now_ms());
    }

    /// Settles which hosts this agent acts on when the share changed, and
    /// its part of the fleet's sequencing limits.
    fn settle_owners(&mut self, now: u64) {
        let share = (self.share)();
        if self
            .owners_of
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &share))
        {
            return;
        }
        // A host whose previous owner is known to be gone is held one lease
        // duration; one whose previous owner may still act on it (alive, or
        // unknown as on start) until that owner has seen the change and
        // finished what it started.
        let lease = self.fleet.as_ref().map_or(Duration::ZERO, |f| f.hold);
        let (short, long) = (millis(lease), millis(lease / 3 + ACTION_BOUND));
        let before = self.owners_of.clone();
        let hold = |mac: MacAddr| match before.as_ref().and_then(|s| s.host_owner(mac)) {
            Some(previous) if !share.live().contains(&previous) => short,
            _ => long,
        };
        self.controller
            .set_owners(|mac| share.owns_host(mac), hold, now);
        if let Some((rank, live)) = share.rank() {
            self.sequencer.set_fleet(rank, live);
        }
        self.owners_of = Some(share);
    }

    /// Ticks the controller, releases what may run and publishes the view.
    fn step(&mut self) {
        let now = clock::now_ms();
        self.settle_owners(now);
        // Gained hosts: the steps seen while they were held are fed before
        // their deadlines are judged.
        for mac in self.controller.activate(now) {
            self.seen.remove(&mac);
            self.feed(mac, now);
        }
        for action in self.controller.tick(now) {
            self.sequencer.push(action, now);
        }
        let load = Load {
            awaiting: self.controller.awaiting(),
            slow_path_rate: self.slow_path_rate,
        };
        // Actions of hosts this agent no longer acts on are dropped, not run.
        let (controller, pending) = (&self.controller, &self.pending);
        let mut dropped = Vec::new();
        let released = self.sequencer.release(now, load, |a| {
            let wanted = if a.epoch & MANUAL != 0 {
                pending.contains_key(&(a.mac, a.epoch))
            } else {
                controller.is_current(a)
            };
            let acts = controller.acts_on(a.mac, now);
            if wanted && !acts {
                dropped.push(*a);
            }
            wanted && acts
        });
        for action in dropped {
            match self.pending.remove(&(action.mac, action.epoch)) {
                Some(p) => {
                    let _ = p.reply.send(Outcome::failed(
                        &p.host,
                        Some(action.mac),
                        Failure::Refused,
                        "the host moved to another agent before the call ran; ask its owner".into(),
                    ));
                }
                None => self.controller.dropped(&action),
            }
        }
        for action in released {
            if action.epoch & MANUAL == 0 {
                self.executor.start(action);
                continue;
            }
            let (Some(pending), Some(bmc)) = (
                self.pending.remove(&(action.mac, action.epoch)),
                self.bmcs.get(&action.mac).cloned(),
            ) else {
                self.sequencer.finished(&action);
                continue;
            };
            self.manual.spawn(async move {
                let mut out = Outcome::new(&pending.host, Some(action.mac));
                // On a task of its own, so that a panic in the call is this
                // host's error and this task always comes back: the
                // sequencer's slot is always freed.
                let op = pending.op;
                let call = tokio::spawn(async move {
                    let mut out = out;
                    let result = perform(bmc.as_ref(), op, &mut out).await;
                    (out, result.map_err(|e| e.to_string()))
                });
                let failed = match call.await {
                    Ok((done, result)) => {
                        out = done;
                        result.err()
                    }
                    Err(e) => {
                        out = Outcome::new(&pending.host, Some(action.mac));
                        Some(if e.is_panic() {
                            "the BMC call panicked".to_string()
                        } else {
                            "the BMC call was cancelled".to_string()
                        })
                    }
                };
                if let Some(error) = failed {
                    out.fail(Failure::Bmc, error);
                }
                out.duration_ms = elapsed_ms(pending.asked);
                (action, pending, out)
            });
        }
        for t in self.controller.take_transitions() {
            info!(
                mac = %t.mac,
                from = %t.from,
                to = %t.to,
                reason = %t.reason,
                attempt = t.attempt,
                "recovery transition"
            );
        }
        let changed = self.controller.take_changed();
        if let Some(fleet) = &self.fleet {
            for change in changed {
                let _ = fleet.publish.send(change);
            }
        }
        self.publish();
    }

    fn finish(&mut self, ticket: Action, pending: Pending, outcome: Outcome) {
        self.sequencer.finished(&ticket);
        if let Some(state) = outcome.power {
            self.note_power(ticket.mac, state);
        }
        let _ = pending.reply.send(outcome);
    }

    fn note_power(&mut self, mac: MacAddr, state: PowerState) {
        let mut view = lock(&self.view);
        view.power.insert(mac, (state, clock::now_ms()));
    }

    /// Feeds the controller the boot steps recorded since the last poll
    /// and measures the slow path's request rate.
    fn poll(&mut self) {
        let now = clock::now_ms();
        let macs: Vec<MacAddr> = self.bmcs.keys().copied().collect();
        for mac in macs {
            self.feed(mac, now);
        }
        let rx = (self.slow_path_rx)();
        let at = Instant::now();
        if let Some((last, when)) = self.rx_last {
            let secs = at.duration_since(when).as_secs_f64();
            if secs > 0.0 {
                self.slow_path_rate = rx.saturating_sub(last) as f64 / secs;
            }
        }
        self.rx_last = Some((rx, at));
    }

    /// Feeds the controller the boot steps of `mac` recorded since it was
    /// last fed.
    fn feed(&mut self, mac: MacAddr, now: u64) {
        let Some(p) = self.progress.get(mac) else {
            return;
        };
        let times = [
            p.dhcp.as_ref().map(|s| s.at_ms),
            p.tftp.as_ref().map(|s| s.at_ms),
            p.script.as_ref().map(|s| s.at_ms),
            p.artifact.as_ref().map(|s| s.at_ms),
            p.booted.as_ref().map(|s| s.at_ms),
        ];
        let seen = self.seen.entry(mac).or_default();
        let kinds = [
            Observation::Dhcp,
            Observation::BootFile,
            Observation::Script,
            Observation::Artifacts,
            Observation::PhoneHome,
        ];
        for ((time, before), kind) in times.iter().zip(seen.iter()).zip(kinds) {
            if let Some(at) = time
                && time != before
            {
                self.controller.observe_step(mac, kind, *at, now);
            }
        }
        *seen = times;
    }

    fn publish(&self) {
        let share = self.owners_of.clone().unwrap_or_else(|| (self.share)());
        let recovery = self
            .controller
            .snapshot()
            .into_iter()
            .map(|mut s| {
                if share.is_shared() {
                    s.owner = share.host_owner_name(s.mac).map(str::to_owned);
                }
                (s.mac, s)
            })
            .collect();
        let metrics = recovery::metrics::render(&self.controller, &self.sequencer);
        let mut view = lock(&self.view);
        view.recovery = recovery;
        view.metrics = metrics;
    }
}

/// The next record a peer shared, when there are peers.
async fn recv_adopt(fleet: &mut Option<Fleet>) -> Option<(MacAddr, Record)> {
    match fleet {
        Some(f) => f.adopt.recv().await,
        None => std::future::pending().await,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcome_shows_its_typed_fields_as_the_api_text() {
        let mac = MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x5a]);
        let mut out = Outcome::new("node-1", Some(mac));
        out.power = Some(PowerState::Off);
        out.recovery = Some(recovery::State::AwaitingBootFile);
        let json = serde_json::to_value(&out).expect("json");
        assert_eq!(json["mac"], "52:54:00:12:34:5a");
        assert_eq!(json["result"], "ok");
        assert_eq!(json["power"], "off");
        assert_eq!(json["recovery"], "awaiting-boot-file");
        assert_eq!(serde_json::from_value::<Outcome>(json).expect("back"), out);

        let failed = Outcome::failed("nobody", None, Failure::UnknownHost, "no host".into());
        let json = serde_json::to_value(&failed).expect("json");
        assert_eq!(json["result"], "error");
        assert_eq!(json["failure"], "unknown-host");
        assert!(json["mac"].is_null() && json["power"].is_null());
        assert!(!failed.is_ok());
    }
}

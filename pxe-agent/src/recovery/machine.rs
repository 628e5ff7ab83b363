//! [`Controller`]: the per-host recovery state machine. Owns the states,
//! their deadlines, attempts and back-off, the after-boot boot device, the
//! transition journal and counts, and writing each host's record to the
//! [`RecoveryStore`] whenever it changes. It never sleeps and never calls
//! a BMC: time comes in as `now_ms`, BMC calls go out as [`Action`]s and
//! their results come back through [`Controller::complete`].
//!
//! With peers, it acts only on the hosts this agent owns
//! ([`Controller::set_owners`]); it follows every other host's record as
//! its owner shares it ([`Controller::adopt`]), and hands its own hosts'
//! changed records out to be shared ([`Controller::take_changed`]). A host
//! it gains is held for a while before it acts on it, so that a previous
//! owner still alive finishes and shares what it started; it then goes on
//! from the recorded stage and deadline, as after a restart.
//!
//! ```text
//! idle ──request / no phone-home──▶ recovering ──power up──▶ awaiting-dhcp
//!   ▲                                  ▲   │                    │ dhcp
//!   │ cancel                      retry│   │bmc error           ▼
//!   │                                  │   ▼             awaiting-boot-file
//!   │                               backoff ◀──timeout──        │ boot file
//!   │                                  │                        ▼
//!   │                     attempts out │                  awaiting-script
//!   │                                  ▼                        │ script
//!   │                               failed                      ▼
//!   │                                                  awaiting-phone-home
//!   │                                                           │ phone-home
//!   └──────── (any state) ───────phone-home──────────────▶ booted
//!                                   heartbeat lost: booted ──▶ recovering
//! ```
//!
//! No host is power-cycled for having been added: the `expect_boot` watch
//! of a host new to the inventory starts by asking its BMC whether it is
//! on ([`Watch`]). A host that is off is watched as always; one that runs
//! is left alone until it shows boot activity or an operator asks for its
//! recovery. One whose BMC does not answer is asked again every
//! `backoff_max`, never power-cycled meanwhile; one whose BMC refuses for
//! good (credentials, privilege) is left alone as a running host is.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{
    Action, ActionError, ActionKind, Done, Observation, Plan, Policy, Reason, RecoveryStore,
    RequestError, State, StoreError, Transition, ms,
};
use crate::{
    bmc::{BmcError, BootDevice, BootTarget},
    inventory::AfterBoot,
    mac::MacAddr,
};

/// What a host's recovery record holds, on disk and as shared with peers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub state: State,
    /// The attempt of the current (or last) recovery, 1-based; 0 before one.
    pub attempt: u32,
    /// When the current state ends by itself (stage deadline, back-off,
    /// `expect_boot` or heartbeat watch), unix milliseconds.
    pub deadline_ms: Option<u64>,
    /// In `recovering`: the boot device is set, the power action is next.
    #[serde(default)]
    pub boot_device_set: bool,
    /// In `booted`: the after-boot boot device is still to be set.
    #[serde(default)]
    pub after_boot: Option<AfterBootJob>,
    pub last: Option<LastTransition>,
    /// The last BMC error, as its message (it names the BMC, never a
    /// password).
    #[serde(default)]
    pub last_error: Option<String>,
    /// When the current attempt's power action was made: boot steps seen
    /// before it belong to an earlier boot (see [`Controller::observe_step`]).
    #[serde(default)]
    pub powered_ms: Option<u64>,
    /// Bumped with every change an action depends on: results of actions
    /// asked at an older epoch are stale.
    pub epoch: u64,
    /// Where an idle host's `expect_boot` watch stands.
    #[serde(default)]
    pub watch: Watch,
    /// The awaiting state whose deadline passed, while the host has not got
    /// past it since (through back-off, retries and `failed`): the stage
    /// it is stuck in. Cleared by a later stage, a phone-home or going idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled: Option<State>,
}

/// An idle `expect_boot` host's watch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Watch {
    /// The deadline counts (or the host has no watch).
    #[default]
    Counting,
    /// Added with `expect_boot`: its BMC is asked whether it is on before
    /// a deadline counts. While the BMC does not answer, `deadline_ms` is
    /// when it is asked again.
    CheckingPower,
    /// It was on when added (or its BMC refused for good): no deadline until
    /// it shows boot activity (a DHCP answer, a boot file, a script), which
    /// starts the watch; an operator's `recover` acts at once.
    UntilBootActivity,
}

/// The after-boot boot device still to be set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AfterBootJob {
    /// Failed tries so far.
    pub tries: u32,
    /// Not before this time (back-off after a failed try).
    pub not_before_ms: u64,
}

/// The last transition of a host, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastTransition {
    pub from: State,
    pub to: State,
    pub reason: Reason,
    pub at_ms: u64,
}

/// One host as `pxe-agent hosts` and the API show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostStatus {
    pub mac: MacAddr,
    pub state: State,
    pub attempt: u32,
    pub max_attempts: Option<u32>,
    pub deadline_ms: Option<u64>,
    pub last_transition: Option<LastTransition>,
    pub last_error: Option<String>,
    /// The after-boot boot device is still to be set.
    pub after_boot_pending: bool,
    /// In the inventory with a BMC (records of others wait for the next
    /// inventory to decide).
    pub managed: bool,
    /// This agent acts on the host (always, without peers).
    pub owned: bool,
    /// The node that owns it, with peers (filled in by the control task).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Where an idle host's `expect_boot` watch stands.
    pub watch: Watch,
    /// The stage whose deadline passed and that the host has not got past
    /// since ([`Record::stalled`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stalled: Option<State>,
}

#[derive(Debug)]
struct Host {
    /// `None` for a record loaded from disk whose host the inventory has
    /// not (yet) confirmed: it stays untouched until then.
    plan: Option<Plan>,
    record: Record,
    /// An action for the current epoch is out (queued or running).
    issued: bool,
    /// Loaded from disk and not yet given its plan.
    resumed: bool,
    /// This agent acts on it (see [`Controller::set_owners`]).
    owned: bool,
    /// Gained from another owner: not acted on before this time.
    held_until: Option<u64>,
}

impl Host {
    /// Owned and not held at `now_ms`: the controller acts on it.
    fn is_active(&self, now_ms: u64) -> bool {
        self.plan.is_some() && self.owned && self.held_until.is_none_or(|t| t <= now_ms)
    }
}

/// The recovery state machine of every managed host. See the module
/// documentation.
#[derive(Debug)]
pub struct Controller {
    store: RecoveryStore,
    policy: Policy,
    hosts: BTreeMap<MacAddr, Host>,
    journal: Vec<Transition>,
    counts: BTreeMap<(State, State, Reason), u64>,
    dirty: BTreeSet<MacAddr>,
    removed: BTreeSet<MacAddr>,
    store_errors: u64,
    stale_results: u64,
    /// Owned hosts whose record changed since [`Controller::take_changed`].
    changed: BTreeSet<MacAddr>,
    /// With peers, hosts start unowned: [`Controller::set_owners`] gives
    /// them (and holds them), since another agent may have acted on them.
    peers: bool,
}

impl Controller {
    /// Loads every host's record from `store`: a host that was, say,
    /// awaiting its script when the agent stopped resumes awaiting it, with
    /// the same deadline. Hosts act only once [`Controller::set_hosts`]
    /// gave them their plan.
    pub fn new(store: RecoveryStore, policy: Policy) -> Result<Controller, StoreError> {
        let hosts = store
            .load()?
            .into_iter()
            .map(|(mac, record)| {
                (
                    mac,
                    Host {
                        plan: None,
                        record,
                        issued: false,
                        resumed: true,
                        owned: true,
                        held_until: None,
                    },
                )
            })
            .collect();
        Ok(Controller {
            store,
            policy,
            hosts,
            journal: Vec::new(),
            counts: BTreeMap::new(),
            dirty: BTreeSet::new(),
            removed: BTreeSet::new(),
            store_errors: 0,
            stale_results: 0,
            changed: BTreeSet::new(),
            peers: false,
        })
    }

    /// Makes this a controller among peers: every host, loaded or added
    /// later, is unowned until [`Controller::set_owners`] says otherwise.
    pub fn set_peers(&mut self) {
        self.peers = true;
        for host in self.hosts.values_mut() {
            host.owned = false;
        }
    }

    /// Which hosts this agent acts on: those `owns` says yes to. A host
    /// gained is held for `hold_ms(mac)` from `now_ms` (a previous owner may
    /// still be finishing a BMC call); a host lost is left alone, an action
    /// already running finishing and its record then following the new
    /// owner's (a queued one is dropped, see [`Controller::dropped`]).
    /// Without peers every host is owned, and none is held.
    pub fn set_owners(
        &mut self,
        owns: impl Fn(MacAddr) -> bool,
        hold_ms: impl Fn(MacAddr) -> u64,
        now_ms: u64,
    ) {
        for (mac, host) in &mut self.hosts {
            let owned = owns(*mac);
            if owned && !host.owned {
                host.held_until = Some(now_ms.saturating_add(hold_ms(*mac)));
            }
            if !owned {
                host.held_until = None;
                // Never shared by an agent that does not own it.
                self.changed.remove(mac);
            }
            host.owned = owned;
        }
    }

    /// A peer's record of `mac`, as its owner shared it: taken unless this
    /// agent acts on the host itself. Returns whether it was taken.
    pub fn adopt(&mut self, mac: MacAddr, record: Record, now_ms: u64) -> bool {
        let Some(host) = self.hosts.get_mut(&mac) else {
            return false;
        };
        if host.is_active(now_ms) || host.record == record {
            return false;
        }
        host.record = record;
        host.issued = false;
        // Cached on disk, not shared again.
        if let Err(e) = self.store.write(&[(mac, Some(&host.record))]) {
            self.store_errors += 1;
            tracing::warn!(error = %e, "failed to persist a peer's recovery record");
        }
        true
    }

    /// The records of owned hosts that changed since the last call, to be
    /// shared with peers.
    pub fn take_changed(&mut self) -> Vec<(MacAddr, Record)> {
        std::mem::take(&mut self.changed)
            .into_iter()
            .filter_map(|mac| Some((mac, self.hosts.get(&mac)?.record.clone())))
            .collect()
    }

    /// Ends the holds due at `now_ms` and returns those hosts: the caller
    /// feeds them the boot steps seen while they were held (which were not
    /// taken) before the next [`Controller::tick`] judges their deadlines.
    /// An `expect_boot` or heartbeat watch recorded by the previous owner
    /// restarts from now if it would end sooner, as after a restart: the
    /// heartbeats it saw last are not shared.
    pub fn activate(&mut self, now_ms: u64) -> Vec<MacAddr> {
        let mut activated = Vec::new();
        for (mac, host) in &mut self.hosts {
            if host.held_until.is_none_or(|t| t > now_ms) {
                continue;
            }
            host.held_until = None;
            activated.push(*mac);
            let (Some(plan), record) = (host.plan, &mut host.record) else {
                continue;
            };
            let window = match record.state {
                State::Idle if record.watch != Watch::Counting => None,
                State::Idle => plan.settings.expect_boot.then_some(plan.settings.deadline),
                State::Booted => plan.settings.heartbeat,
                _ => None,
            };
            if let Some(window) = window {
                let fresh = now_ms.saturating_add(ms(window));
                record.deadline_ms = Some(record.deadline_ms.map_or(fresh, |d| d.max(fresh)));
            }
            // Shared again under this owner.
            self.changed.insert(*mac);
        }
        activated
    }

    /// Whether this agent acts on `mac` at `now_ms`: owned and not held.
    pub fn acts_on(&self, mac: MacAddr, now_ms: u64) -> bool {
        self.hosts.get(&mac).is_some_and(|h| h.is_active(now_ms))
    }

    /// Until when `mac` is held after it was gained, if it is.
    pub fn held_until(&self, mac: MacAddr) -> Option<u64> {
        self.hosts.get(&mac).and_then(|h| h.held_until)
    }

    /// `action` was dropped before it ran (its host moved to another
    /// owner): the host may be given new actions again.
    pub fn dropped(&mut self, action: &Action) {
        if let Some(host) = self.hosts.get_mut(&action.mac)
            && host.issued
            && host.record.epoch == action.epoch
        {
            host.issued = false;
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The hosts the inventory manages (those with a BMC), with their
    /// plans. New hosts start idle; an `expect_boot` watch armed by this
    /// inventory first asks the BMC whether the host runs
    /// ([`Watch::CheckingPower`]); hosts no longer listed are forgotten,
    /// on disk too. A host loaded from disk keeps its state; its
    /// `expect_boot` and heartbeat watches restart from `now_ms` if they
    /// would end sooner, since its phone-homes could not reach a stopped
    /// agent.
    pub fn set_hosts(&mut self, plans: impl IntoIterator<Item = (MacAddr, Plan)>, now_ms: u64) {
        let plans: BTreeMap<MacAddr, Plan> = plans.into_iter().collect();
        let gone: Vec<MacAddr> = self
            .hosts
            .keys()
            .filter(|mac| !plans.contains_key(mac))
            .copied()
            .collect();
        for mac in gone {
            self.hosts.remove(&mac);
            self.dirty.remove(&mac);
            self.removed.insert(mac);
        }
        for (mac, plan) in plans {
            let host = self.hosts.entry(mac).or_insert_with(|| Host {
                plan: None,
                record: Record {
                    state: State::Idle,
                    attempt: 0,
                    deadline_ms: None,
                    boot_device_set: false,
                    after_boot: None,
                    last: None,
                    last_error: None,
                    powered_ms: None,
                    epoch: 0,
                    watch: Watch::Counting,
                    stalled: None,
                },
                issued: false,
                resumed: false,
                owned: !self.peers,
                held_until: None,
            });
            let old = host.plan.replace(plan);
            let watch = |plan: &Plan, state: State| match state {
                State::Idle => plan.settings.expect_boot.then_some(plan.settings.deadline),
                State::Booted => plan.settings.heartbeat,
                _ => None,
            };
            let record = &mut host.record;
            if !matches!(record.state, State::Idle | State::Booted) {
                continue;
            }
            let window = watch(&plan, record.state);
            let fresh = window.map(|w| now_ms.saturating_add(ms(w)));
            // An idle watch armed now asks first whether the host runs.
            let check = record.state == State::Idle && window.is_some();
            record.deadline_ms = match old {
                // Loaded from disk: never sooner than a fresh watch; a
                // check or a wait for boot activity goes on.
                None if host.resumed && record.watch != Watch::Counting => None,
                None if host.resumed => match (record.deadline_ms, fresh) {
                    (Some(stored), Some(fresh)) => Some(stored.max(fresh)),
                    (_, fresh) => fresh,
                },
                Some(old) if watch(&old, record.state) == window => continue,
                None | Some(_) if check => {
                    record.watch = Watch::CheckingPower;
                    record.epoch += 1;
                    None
                }
                None | Some(_) => {
                    record.watch = Watch::Counting;
                    fresh
                }
            };
            host.resumed = false;
            self.dirty.insert(mac);
        }
        for host in self.hosts.values_mut() {
            host.resumed = false;
        }
        self.flush();
    }

    /// A boot-chain step seen for `mac`. Moves an awaiting host forward
    /// (never back: a host that starts the chain over must still meet the
    /// deadline of the stage it was in), and a phone-home makes any host
    /// `booted`.
    pub fn observe(&mut self, mac: MacAddr, observation: Observation, now_ms: u64) {
        let Some(host) = self.hosts.get_mut(&mac) else {
            return;
        };
        // The owner follows the host; the others take its records.
        if !host.is_active(now_ms) {
            return;
        }
        let Some(plan) = host.plan else { return };
        let state = host.record.state;
        if observation == Observation::PhoneHome {
            if state == State::Booted {
                // The heartbeat watch moves on in memory only: a write per
                // phone-home would cost a commit per host every few minutes,
                // and a restart restarts the watch anyway.
                host.record.deadline_ms = plan
                    .settings
                    .heartbeat
                    .map(|hb| now_ms.saturating_add(ms(hb)));
                return;
            }
            // Whatever boot override a recovery left set must not make the
            // next reboot reinstall.
            let after_boot = state != State::Idle && plan.settings.after_boot == AfterBoot::Disk;
            let deadline = plan
                .settings
                .heartbeat
                .map(|hb| now_ms.saturating_add(ms(hb)));
            self.transition(mac, State::Booted, Reason::PhoneHome, deadline, now_ms);
            if let Some(host) = self.hosts.get_mut(&mac) {
                host.record.after_boot = after_boot.then_some(AfterBootJob {
                    tries: 0,
                    not_before_ms: now_ms,
                });
            }
            self.flush();
            return;
        }
        if state == State::Idle && host.record.watch != Watch::Counting {
            // Boot activity of a host that ran when it was added: now it
            // is expected to phone home.
            if plan.settings.expect_boot {
                let record = &mut host.record;
                record.watch = Watch::Counting;
                record.deadline_ms = Some(now_ms.saturating_add(ms(plan.settings.deadline)));
                record.epoch += 1;
                host.issued = false;
                self.dirty.insert(mac);
                self.flush();
            }
            return;
        }
        if !state.is_awaiting() {
            return;
        }
        let (to, reason) = match observation {
            Observation::Dhcp => (State::AwaitingBootFile, Reason::DhcpSeen),
            Observation::BootFile => (State::AwaitingScript, Reason::BootFileSeen),
            Observation::Script => (State::AwaitingPhoneHome, Reason::ScriptSeen),
            Observation::Artifacts => (State::AwaitingPhoneHome, Reason::ArtifactsSeen),
            Observation::PhoneHome => return,
        };
        if to <= state {
            return;
        }
        let stages = plan.settings.stages;
        let window = match to {
            State::AwaitingBootFile => stages.boot_file,
            State::AwaitingScript => stages.script,
            _ => plan.settings.deadline,
        };
        self.transition(
            mac,
            to,
            reason,
            Some(now_ms.saturating_add(ms(window))),
            now_ms,
        );
        self.flush();
    }

    /// [`Controller::observe`] of a step seen at `at_ms`: a step from
    /// before the host's current boot (awaiting a stage: before the power
    /// action; else before its last transition) is not taken. Steps are
    /// fed again when a host is gained from another owner, however old.
    pub fn observe_step(
        &mut self,
        mac: MacAddr,
        observation: Observation,
        at_ms: u64,
        now_ms: u64,
    ) {
        let since = self.hosts.get(&mac).map_or(0, |h| {
            let last = h.record.last.map_or(0, |t| t.at_ms);
            match h.record.powered_ms {
                Some(powered) if h.record.state.is_awaiting() => powered,
                _ => last,
            }
        });
        if at_ms >= since {
            self.observe(mac, observation, now_ms);
        }
    }

    /// An operator asks for `mac` to be recovered now.
    pub fn request(&mut self, mac: MacAddr, now_ms: u64) -> Result<(), RequestError> {
        let state = self.managed_state(mac)?;
        if state.is_active() {
            return Err(RequestError::InProgress { mac, state });
        }
        self.start(mac, Reason::Requested, now_ms);
        self.flush();
        Ok(())
    }

    /// An operator stops `mac`'s recovery. The host goes idle without an
    /// `expect_boot` watch (the operator took over) until it phones home
    /// or is requested again. An action already running still finishes.
    pub fn cancel(&mut self, mac: MacAddr, now_ms: u64) -> Result<(), RequestError> {
        let state = self.managed_state(mac)?;
        if !state.is_active() {
            return Err(RequestError::NotRecovering { mac, state });
        }
        self.transition(mac, State::Idle, Reason::Cancelled, None, now_ms);
        self.flush();
        Ok(())
    }

    fn managed_state(&self, mac: MacAddr) -> Result<State, RequestError> {
        match self.hosts.get(&mac) {
            Some(host) if host.plan.is_some() => Ok(host.record.state),
            _ => Err(RequestError::NotManaged { mac }),
        }
    }

    /// Ends the states whose deadline passed and returns the BMC actions
    /// to run now. Call it on a timer (see [`Controller::next_deadline`])
    /// and after every input.
    pub fn tick(&mut self, now_ms: u64) -> Vec<Action> {
        let due: Vec<(MacAddr, State, Watch)> = self
            .hosts
            .iter()
            .filter(|(_, h)| h.is_active(now_ms))
            .filter(|(_, h)| h.record.deadline_ms.is_some_and(|d| d <= now_ms))
            .map(|(mac, h)| (*mac, h.record.state, h.record.watch))
            .collect();
        for (mac, state, watch) in due {
            match state {
                // Time to ask the BMC again whether the host runs.
                State::Idle if watch == Watch::CheckingPower => {
                    if let Some(host) = self.hosts.get_mut(&mac) {
                        host.record.deadline_ms = None;
                        self.dirty.insert(mac);
                    }
                }
                State::Idle => self.start(mac, Reason::NoPhoneHome, now_ms),
                State::Booted => self.start(mac, Reason::HeartbeatLost, now_ms),
                State::Backoff => self.retry(mac, now_ms),
                State::AwaitingDhcp => self.fail_attempt(mac, Reason::DhcpTimeout, now_ms),
                State::AwaitingBootFile => {
                    self.fail_attempt(mac, Reason::BootFileTimeout, now_ms);
                }
                State::AwaitingScript => self.fail_attempt(mac, Reason::ScriptTimeout, now_ms),
                State::AwaitingPhoneHome => {
                    self.fail_attempt(mac, Reason::PhoneHomeTimeout, now_ms);
                }
                State::Recovering | State::Failed => {}
            }
        }
        let mut actions = Vec::new();
        for (mac, host) in &mut self.hosts {
            let Some(plan) = host.plan else { continue };
            if host.issued || !host.is_active(now_ms) {
                continue;
            }
            let record = &host.record;
            let kind = match record.state {
                State::Idle
                    if record.watch == Watch::CheckingPower && record.deadline_ms.is_none() =>
                {
                    ActionKind::PowerStatus
                }
                State::Recovering if record.boot_device_set => ActionKind::PowerUp,
                State::Recovering => ActionKind::SetBootDevice(BootTarget {
                    device: plan.network,
                    persistent: false,
                    efi: plan.efi,
                }),
                State::Booted
                    if record
                        .after_boot
                        .is_some_and(|job| job.not_before_ms <= now_ms) =>
                {
                    ActionKind::SetBootDevice(BootTarget {
                        device: BootDevice::Disk,
                        persistent: true,
                        efi: plan.efi,
                    })
                }
                _ => continue,
            };
            host.issued = true;
            actions.push(Action {
                mac: *mac,
                kind,
                epoch: record.epoch,
            });
        }
        self.flush();
        actions
    }

    /// Whether `action` is still wanted: queued actions whose host moved on
    /// (phoned home, was cancelled) are dropped instead of run.
    pub fn is_current(&self, action: &Action) -> bool {
        self.hosts
            .get(&action.mac)
            .is_some_and(|h| h.issued && h.record.epoch == action.epoch)
    }

    /// The result of `action`. Results of stale actions are counted and
    /// otherwise ignored.
    pub fn complete(&mut self, action: &Action, result: Result<Done, ActionError>, now_ms: u64) {
        if !self.is_current(action) {
            self.stale_results += 1;
            return;
        }
        let mac = action.mac;
        let Some(host) = self.hosts.get_mut(&mac) else {
            return;
        };
        let Some(plan) = host.plan else { return };
        host.issued = false;
        let record = &mut host.record;
        if let Err(e) = &result {
            record.last_error = Some(e.to_string());
            self.dirty.insert(mac);
        }
        match (record.state, result) {
            (State::Idle, result) if record.watch == Watch::CheckingPower => {
                // Off: watched as always. On: left alone until it shows
                // boot activity. Not known: never cycled on a guess; asked
                // again later, or, when no retry can help (credentials,
                // privilege), left alone as a running host is.
                match &result {
                    Ok(Done::Power(crate::bmc::PowerState::Off)) => {
                        record.watch = Watch::Counting;
                        record.deadline_ms =
                            Some(now_ms.saturating_add(ms(plan.settings.deadline)));
                    }
                    Err(e) if !e.is_permanent() => {
                        record.deadline_ms =
                            Some(now_ms.saturating_add(ms(self.policy.backoff_max)));
                    }
                    _ => {
                        record.watch = Watch::UntilBootActivity;
                        record.deadline_ms = None;
                    }
                }
                if result.is_ok() {
                    record.last_error = None;
                }
                record.epoch += 1;
                self.dirty.insert(mac);
            }
            (State::Booted, Ok(_)) => {
                record.after_boot = None;
                record.last_error = None;
                self.dirty.insert(mac);
            }
            (State::Booted, Err(e)) => {
                let tries = record.after_boot.map_or(0, |job| job.tries) + 1;
                record.after_boot =
                    (!e.is_permanent() && tries < plan.settings.max_attempts).then(|| {
                        AfterBootJob {
                            tries,
                            not_before_ms: now_ms.saturating_add(ms(self.policy.backoff(tries))),
                        }
                    });
                record.epoch += 1;
                self.dirty.insert(mac);
            }
            (State::Recovering, Ok(Done::BootDeviceSet)) => {
                record.boot_device_set = true;
                record.epoch += 1;
                self.dirty.insert(mac);
            }
            (State::Recovering, Ok(done)) => {
                let reason = if done == Done::PoweredOn {
                    Reason::PoweredOn
                } else {
                    Reason::PowerCycled
                };
                self.power_done(mac, plan, reason, now_ms);
            }
            // The action went out but its answer was lost: whether the host
            // restarted shows in the DHCP stage, which has its own deadline.
            // Sending a cycle again could restart a host already booting.
            (State::Recovering, Err(ActionError::Bmc(BmcError::OutcomeUnknown { .. }))) => {
                self.power_done(mac, plan, Reason::PowerOutcomeUnknown, now_ms);
            }
            (State::Recovering, Err(e)) if e.is_permanent() => {
                self.transition(mac, State::Failed, Reason::BmcPermanentError, None, now_ms);
            }
            (State::Recovering, Err(_)) => self.fail_attempt(mac, Reason::BmcError, now_ms),
            _ => {}
        }
        // Shared even when the host moved to another owner while the call
        // ran: the new owner goes on from what it did.
        self.changed.insert(mac);
        self.flush();
    }

    fn power_done(&mut self, mac: MacAddr, plan: Plan, reason: Reason, now_ms: u64) {
        if let Some(host) = self.hosts.get_mut(&mac) {
            host.record.powered_ms = Some(now_ms);
        }
        let deadline = now_ms.saturating_add(ms(plan.settings.stages.dhcp));
        self.transition(mac, State::AwaitingDhcp, reason, Some(deadline), now_ms);
    }

    /// Starts a new recovery at attempt 1.
    fn start(&mut self, mac: MacAddr, reason: Reason, now_ms: u64) {
        if let Some(host) = self.hosts.get_mut(&mac) {
            host.record.attempt = 1;
            host.record.last_error = None;
        }
        self.transition(mac, State::Recovering, reason, None, now_ms);
    }

    fn retry(&mut self, mac: MacAddr, now_ms: u64) {
        if let Some(host) = self.hosts.get_mut(&mac) {
            host.record.attempt += 1;
        }
        self.transition(mac, State::Recovering, Reason::Retry, None, now_ms);
    }

    /// The current attempt failed for `reason`: back off, or `failed` once
    /// the attempts are used up.
    fn fail_attempt(&mut self, mac: MacAddr, reason: Reason, now_ms: u64) {
        let Some(host) = self.hosts.get(&mac) else {
            return;
        };
        let (Some(plan), attempt) = (host.plan, host.record.attempt) else {
            return;
        };
        if attempt >= plan.settings.max_attempts {
            self.transition(mac, State::Failed, reason, None, now_ms);
        } else {
            let wait = self.policy.backoff(attempt);
            let until = now_ms.saturating_add(ms(wait));
            self.transition(mac, State::Backoff, reason, Some(until), now_ms);
        }
    }

    /// Moves `mac` to `to`, records why, and marks the record for writing.
    fn transition(
        &mut self,
        mac: MacAddr,
        to: State,
        reason: Reason,
        deadline_ms: Option<u64>,
        now_ms: u64,
    ) {
        let Some(host) = self.hosts.get_mut(&mac) else {
            return;
        };
        let record = &mut host.record;
        let from = record.state;
        record.state = to;
        record.deadline_ms = deadline_ms;
        record.boot_device_set = false;
        record.after_boot = None;
        record.watch = Watch::Counting;
        record.epoch += 1;
        record.stalled = stalled_after(record.stalled, from, to, reason);
        record.last = Some(LastTransition {
            from,
            to,
            reason,
            at_ms: now_ms,
        });
        host.issued = false;
        self.dirty.insert(mac);
        *self.counts.entry((from, to, reason)).or_default() += 1;
        self.journal.push(Transition {
            mac,
            from,
            to,
            reason,
            at_ms: now_ms,
            attempt: record.attempt,
        });
    }

    /// Writes every changed record in one commit. A failed write is logged
    /// and counted; the records stay in memory and are written whole with
    /// their next change, so the file catches up.
    fn flush(&mut self) {
        if self.dirty.is_empty() && self.removed.is_empty() {
            return;
        }
        let changes: Vec<(MacAddr, Option<&Record>)> = self
            .removed
            .iter()
            .map(|mac| (*mac, None))
            .chain(
                self.dirty
                    .iter()
                    .filter_map(|mac| self.hosts.get(mac).map(|h| (*mac, Some(&h.record)))),
            )
            .collect();
        for mac in &self.dirty {
            if self.hosts.get(mac).is_some_and(|h| h.owned) {
                self.changed.insert(*mac);
            }
        }
        match self.store.write(&changes) {
            Ok(()) => {
                self.dirty.clear();
                self.removed.clear();
            }
            Err(e) => {
                self.store_errors += 1;
                tracing::warn!(error = %e, "failed to persist recovery state");
            }
        }
    }

    /// The transitions since the last call, oldest first, for the log.
    pub fn take_transitions(&mut self) -> Vec<Transition> {
        std::mem::take(&mut self.journal)
    }

    /// Transitions so far by (from, to, reason), for
    /// [`metrics::TRANSITIONS`](super::metrics::TRANSITIONS).
    pub fn transition_counts(&self) -> &BTreeMap<(State, State, Reason), u64> {
        &self.counts
    }

    /// Managed hosts this agent owns per state, every state listed (with
    /// peers, the fleet's figures are the sum over the agents).
    pub fn hosts_per_state(&self) -> BTreeMap<State, usize> {
        let mut out: BTreeMap<State, usize> = State::ALL.iter().map(|s| (*s, 0)).collect();
        for host in self.hosts.values().filter(|h| h.plan.is_some() && h.owned) {
            *out.entry(host.record.state).or_default() += 1;
        }
        out
    }

    /// Owned hosts stuck in each awaiting stage ([`Record::stalled`]),
    /// every awaiting state listed.
    pub fn stalled_per_stage(&self) -> BTreeMap<State, usize> {
        let mut out: BTreeMap<State, usize> = State::ALL
            .iter()
            .filter(|s| s.is_awaiting())
            .map(|s| (*s, 0))
            .collect();
        for host in self.hosts.values().filter(|h| h.plan.is_some() && h.owned) {
            if let Some(stage) = host.record.stalled {
                *out.entry(stage).or_default() += 1;
            }
        }
        out
    }

    /// Hosts in an `awaiting-*` state: the input to storm control. With
    /// peers, the fleet's: every host's record is here, owned or shared.
    pub fn awaiting(&self) -> usize {
        self.hosts
            .values()
            .filter(|h| h.plan.is_some() && h.record.state.is_awaiting())
            .count()
    }

    /// Failed writes to the store so far.
    pub fn store_errors(&self) -> u64 {
        self.store_errors
    }

    /// Results that arrived for actions no longer current.
    pub fn stale_results(&self) -> u64 {
        self.stale_results
    }

    /// The earliest deadline of any managed host: when `tick` next has
    /// something to do by itself.
    pub fn next_deadline(&self) -> Option<u64> {
        self.hosts
            .values()
            .filter(|h| h.plan.is_some() && h.owned)
            .flat_map(|h| {
                if h.held_until.is_some() {
                    return [h.held_until, None];
                }
                let after_boot = h
                    .record
                    .after_boot
                    .filter(|_| !h.issued)
                    .map(|j| j.not_before_ms);
                [h.record.deadline_ms, after_boot]
            })
            .flatten()
            .min()
    }

    /// One host's status.
    pub fn status(&self, mac: MacAddr) -> Option<HostStatus> {
        self.hosts.get(&mac).map(|h| status(mac, h))
    }

    /// Every host with a record, by MAC.
    pub fn snapshot(&self) -> Vec<HostStatus> {
        self.hosts.iter().map(|(mac, h)| status(*mac, h)).collect()
    }
}

/// Where a host is stuck after moving `from` -> `to` for `reason`: the
/// stage whose deadline just passed, or the one it was stuck in until it
/// gets to a later stage, phones home or goes idle.
fn stalled_after(stalled: Option<State>, from: State, to: State, reason: Reason) -> Option<State> {
    if reason.is_stage_timeout() {
        return Some(from);
    }
    match (stalled, to) {
        (_, State::Booted | State::Idle) => None,
        (Some(stuck), to) if to.is_awaiting() && to > stuck => None,
        (stalled, _) => stalled,
    }
}

fn status(mac: MacAddr, host: &Host) -> HostStatus {
    HostStatus {
        mac,
        state: host.record.state,
        attempt: host.record.attempt,
        max_attempts: host.plan.map(|p| p.settings.max_attempts),
        deadline_ms: host.record.deadline_ms,
        last_transition: host.record.last,
        last_error: host.record.last_error.clone(),
        after_boot_pending: host.record.after_boot.is_some(),
        managed: host.plan.is_some(),
        owned: host.owned,
        owner: None,
        watch: host.record.watch,
        stalled: host.record.stalled,
    }
}

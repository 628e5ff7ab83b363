//! Boot progress per host: the last DHCP answer, TFTP transfer, iPXE script
//! fetch, artifact fetches and the phone-home from the booted system, so
//! `pxe-agent hosts` can say where each machine is in the boot chain.
//! A service records a serving event with one call, which also publishes
//! it to the live trace ([`crate::trace`]) when the host is traced; the
//! XDP program traces its own answers.
//!
//! Bounded: inventory hosts are always kept (the inventory bounds them),
//! and MACs the inventory does not list (every slow-path answer, NAKs to
//! random MACs included, records one) hold at most [`DEFAULT_CAPACITY`]
//! entries, the least recently updated making room for a new one.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use serde::{Deserialize, Serialize};

use crate::{
    inventory::Host,
    mac::MacAddr,
    sync::lock,
    trace::{Hub, TracePath},
};

/// How far a host got, in boot-chain order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    Dhcp,
    Tftp,
    Script,
    Artifacts,
    Booted,
}

impl Stage {
    /// The CLI text, the same as the serde form.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Dhcp => "dhcp",
            Stage::Tftp => "tftp",
            Stage::Script => "script",
            Stage::Artifacts => "artifacts",
            Stage::Booted => "booted",
        }
    }
}

/// One step with its time (unix milliseconds) and detail.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub at_ms: u64,
    pub detail: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostProgress {
    pub mac: MacAddr,
    /// The port the host's last DHCP request came from: which of its MACs
    /// the current boot is on. For a host with one MAC, that MAC.
    #[serde(default)]
    pub boot_mac: Option<MacAddr>,
    pub dhcp: Option<Step>,
    pub tftp: Option<Step>,
    pub script: Option<Step>,
    /// The most recent artifact fetch.
    pub artifact: Option<Step>,
    pub artifacts_fetched: u64,
    pub booted: Option<Step>,
    /// The last DHCPDECLINE of its reserved address: another machine holds
    /// it. Not a boot stage.
    #[serde(default)]
    pub declined: Option<Step>,
    /// The epoch of the current boot's phone-home token
    /// (`http::token`): 0 when none is known (an agent restarted since).
    /// A counter, not a secret; not shown.
    #[serde(skip)]
    pub token_epoch: u64,
}

impl HostProgress {
    /// `mac` with nothing seen yet.
    pub fn new(mac: MacAddr) -> HostProgress {
        HostProgress {
            mac,
            boot_mac: None,
            dhcp: None,
            tftp: None,
            script: None,
            artifact: None,
            artifacts_fetched: 0,
            booted: None,
            declined: None,
            token_epoch: 0,
        }
    }

    /// The boot steps in boot-chain order.
    pub fn steps(&self) -> [(Stage, Option<&Step>); 5] {
        [
            (Stage::Dhcp, self.dhcp.as_ref()),
            (Stage::Tftp, self.tftp.as_ref()),
            (Stage::Script, self.script.as_ref()),
            (Stage::Artifacts, self.artifact.as_ref()),
            (Stage::Booted, self.booted.as_ref()),
        ]
    }

    /// The furthest stage of the current boot: a DHCP answer after the last
    /// phone-home starts a new one.
    pub fn stage(&self) -> Option<Stage> {
        let at = |s: &Option<Step>| s.as_ref().map(|s| s.at_ms);
        let steps = [
            (Stage::Dhcp, at(&self.dhcp)),
            (Stage::Tftp, at(&self.tftp)),
            (Stage::Script, at(&self.script)),
            (Stage::Artifacts, at(&self.artifact)),
            (Stage::Booted, at(&self.booted)),
        ];
        let start = at(&self.dhcp).unwrap_or(0);
        steps
            .iter()
            .filter(|(_, t)| t.is_some_and(|t| t >= start))
            .map(|(s, _)| *s)
            .max()
    }
}

/// How many MACs outside the inventory are tracked, as many as the storm
/// guard and the discovered registry track.
pub const DEFAULT_CAPACITY: usize = 65_536;

/// A serving event after DHCP ([`Progress::served`]).
#[derive(Clone, Copy, Debug)]
pub enum Served<'a> {
    /// A boot script (an iPXE script, a grub.cfg) served over `via`, named
    /// `what` in the trace.
    Script { via: TracePath, what: &'a str },
    /// A boot file or artifact fetched over HTTP.
    Artifact,
    /// The phone-home of the system the host booted.
    PhoneHome,
}

pub struct Progress {
    inner: Mutex<Tracked>,
    /// The live trace: here because every service that records progress
    /// already holds this, and each serving event goes to both.
    trace: Arc<Hub>,
    /// Fast-path answers whose events were overwritten before the agent
    /// read them: answers this view does not show.
    xdp_events_lost: AtomicU64,
}

impl Default for Progress {
    fn default() -> Progress {
        Progress::new(DEFAULT_CAPACITY)
    }
}

struct Entry {
    progress: HostProgress,
    /// Key of this entry in `Tracked::order`.
    touched: u64,
}

struct Tracked {
    hosts: HashMap<MacAddr, Entry>,
    /// The MACs outside the inventory, least recently updated first.
    order: BTreeMap<u64, MacAddr>,
    inventory: HashSet<MacAddr>,
    /// A host's other ports -> its primary MAC, which its entry is under.
    ports: HashMap<MacAddr, MacAddr>,
    capacity: usize,
    tick: u64,
}

impl Tracked {
    /// The MAC `mac`'s entry is kept under: its host's primary MAC.
    fn primary(&self, mac: MacAddr) -> MacAddr {
        self.ports.get(&mac).copied().unwrap_or(mac)
    }

    fn update(&mut self, mac: MacAddr, f: impl FnOnce(&mut HostProgress)) {
        let mac = self.primary(mac);
        self.tick += 1;
        let tick = self.tick;
        let listed = self.inventory.contains(&mac);
        if let Some(entry) = self.hosts.get_mut(&mac) {
            if !listed {
                self.order.remove(&entry.touched);
                self.order.insert(tick, mac);
            }
            entry.touched = tick;
            return f(&mut entry.progress);
        }
        if !listed {
            if self.capacity == 0 {
                return;
            }
            if self.order.len() >= self.capacity
                && let Some((_, oldest)) = self.order.pop_first()
            {
                self.hosts.remove(&oldest);
            }
            self.order.insert(tick, mac);
        }
        let mut progress = HostProgress::new(mac);
        f(&mut progress);
        self.hosts.insert(
            mac,
            Entry {
                progress,
                touched: tick,
            },
        );
    }

    fn set_inventory(&mut self, inventory: HashSet<MacAddr>) {
        self.inventory = inventory;
        self.order.clear();
        for (mac, entry) in &self.hosts {
            if !self.inventory.contains(mac) {
                self.order.insert(entry.touched, *mac);
            }
        }
        while self.order.len() > self.capacity {
            if let Some((_, oldest)) = self.order.pop_first() {
                self.hosts.remove(&oldest);
            }
        }
    }
}

impl Progress {
    /// Tracks inventory hosts and at most `capacity` other MACs.
    pub fn new(capacity: usize) -> Progress {
        Progress {
            inner: Mutex::new(Tracked {
                hosts: HashMap::new(),
                order: BTreeMap::new(),
                inventory: HashSet::new(),
                ports: HashMap::new(),
                capacity,
                tick: 0,
            }),
            trace: Arc::default(),
            xdp_events_lost: AtomicU64::new(0),
        }
    }

    /// Counts fast-path answers this view missed (see `xdp::events`).
    pub fn missed_xdp_events(&self, n: u64) {
        self.xdp_events_lost.fetch_add(n, Ordering::Relaxed);
    }

    /// Fast-path answers this view missed so far.
    pub fn xdp_events_lost(&self) -> u64 {
        self.xdp_events_lost.load(Ordering::Relaxed)
    }

    /// The live trace itself, for its watchers and for events that are no
    /// boot step (a refusal, a request ignored).
    pub fn trace(&self) -> &Arc<Hub> {
        &self.trace
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tracked> {
        lock(&self.inner)
    }

    fn with(&self, mac: MacAddr, f: impl FnOnce(&mut HostProgress)) {
        self.lock().update(mac, f);
    }

    /// The MACs of the serving inventory, whose progress is never evicted;
    /// MACs it no longer lists count against the capacity again.
    pub fn set_inventory(&self, macs: impl IntoIterator<Item = MacAddr>) {
        self.lock().set_inventory(macs.into_iter().collect());
    }

    /// [`Progress::set_inventory`] with the serving inventory's hosts: a
    /// host with several ports has one entry, under its primary MAC, that
    /// each of its MACs records into and reads.
    pub fn set_hosts(&self, hosts: &[Arc<Host>]) {
        let mut tracked = self.lock();
        tracked.ports = hosts
            .iter()
            .flat_map(|h| h.ports()[1..].iter().map(|&port| (port, h.mac)))
            .collect();
        tracked.set_inventory(hosts.iter().map(|h| h.mac).collect());
    }

    /// How many MACs have progress recorded.
    pub fn len(&self) -> usize {
        self.lock().hosts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    // Serving events. Each records the host's boot step and, when someone
    // traces the host, publishes the live trace's event of it with the same
    // time: a service records both or neither. `detail` is the step's;
    // `trace_detail` is built only for a traced host.

    /// A DHCP answer the slow path sent to `mac`: `what` is the answer
    /// (`offer`, `ack`, `proxy offer`, `nak`).
    pub fn dhcp_answer(
        &self,
        mac: MacAddr,
        at_ms: u64,
        what: &str,
        trace_detail: impl FnOnce() -> String,
        detail: String,
    ) {
        self.trace
            .publish_at(at_ms, mac, TracePath::Dhcp, what, trace_detail);
        self.dhcp(mac, at_ms, detail);
    }

    /// A DHCP answer the XDP program sent, as its events report it: the
    /// step only, since the program traces its own answers (`xdp::trace`).
    pub fn xdp_answer(&self, mac: MacAddr, at_ms: u64, detail: String) {
        self.dhcp(mac, at_ms, detail);
    }

    /// A TFTP transfer to `mac` that ended: `what` is how (`done`,
    /// `stopped`, `failed`); the trace's detail is the step's.
    pub fn tftp_transfer(&self, mac: MacAddr, at_ms: u64, what: &str, detail: String) {
        self.trace
            .publish_at(at_ms, mac, TracePath::Tftp, what, || detail.clone());
        self.tftp(mac, at_ms, detail);
    }

    /// What a host fetched after DHCP, over HTTP or TFTP: its trace event
    /// (named by `served`) and its boot step.
    pub fn served(
        &self,
        mac: MacAddr,
        at_ms: u64,
        served: Served<'_>,
        trace_detail: impl FnOnce() -> String,
        detail: String,
    ) {
        let (via, what, step): (_, _, fn(&Self, MacAddr, u64, String)) = match served {
            Served::Script { via, what } => (via, what, Self::script),
            Served::Artifact => (TracePath::Http, "fetch", Self::artifact),
            Served::PhoneHome => (TracePath::PhoneHome, "booted", Self::booted),
        };
        self.trace.publish_at(at_ms, mac, via, what, trace_detail);
        step(self, mac, at_ms, detail);
    }

    /// A DHCP answer to `mac`, which is also the port the host boots on.
    fn dhcp(&self, mac: MacAddr, at_ms: u64, detail: String) {
        self.with(mac, |p| {
            p.boot_mac = Some(mac);
            p.dhcp = Some(Step { at_ms, detail });
        });
    }

    fn tftp(&self, mac: MacAddr, at_ms: u64, detail: String) {
        self.with(mac, |p| p.tftp = Some(Step { at_ms, detail }));
    }

    fn script(&self, mac: MacAddr, at_ms: u64, detail: String) {
        self.with(mac, |p| p.script = Some(Step { at_ms, detail }));
    }

    fn artifact(&self, mac: MacAddr, at_ms: u64, detail: String) {
        self.with(mac, |p| {
            p.artifact = Some(Step { at_ms, detail });
            p.artifacts_fetched += 1;
        });
    }

    fn booted(&self, mac: MacAddr, at_ms: u64, detail: String) {
        self.with(mac, |p| p.booted = Some(Step { at_ms, detail }));
    }

    /// A step a peer agent saw (`kube::host_records`), kept unless this
    /// agent saw a later one itself. No trace event: the peer traced it.
    pub fn merge_remote(&self, mac: MacAddr, stage: Stage, step: Step) {
        self.with(mac, |p| {
            let slot = match stage {
                Stage::Dhcp => &mut p.dhcp,
                Stage::Tftp => &mut p.tftp,
                Stage::Script => &mut p.script,
                Stage::Artifacts => &mut p.artifact,
                Stage::Booted => &mut p.booted,
            };
            if slot.as_ref().is_none_or(|s| s.at_ms < step.at_ms) {
                *slot = Some(step);
            }
        });
    }

    pub fn declined(&self, mac: MacAddr, at_ms: u64, detail: String) {
        self.with(mac, |p| p.declined = Some(Step { at_ms, detail }));
    }

    /// Starts a new boot's phone-home token epoch for `mac`: `now_ms`, or
    /// one past the current epoch if the clock has not moved past it, so
    /// every boot's epoch is new and a token of an earlier boot is stale.
    pub fn new_token_epoch(&self, mac: MacAddr, now_ms: u64) -> u64 {
        let mut epoch = now_ms;
        self.with(mac, |p| {
            epoch = now_ms.max(p.token_epoch.saturating_add(1));
            p.token_epoch = epoch;
        });
        epoch
    }

    /// Whether a genuine token of boot `epoch` is the current boot's: not
    /// older than the newest epoch issued or accepted. After a restart none
    /// is known and the first genuine token sets it, so a restarted agent
    /// keeps taking the tokens it issued.
    pub fn accept_token_epoch(&self, mac: MacAddr, epoch: u64) -> bool {
        let mut current = false;
        self.with(mac, |p| {
            if epoch >= p.token_epoch {
                p.token_epoch = epoch;
                current = true;
            }
        });
        current
    }

    pub fn get(&self, mac: MacAddr) -> Option<HostProgress> {
        let tracked = self.lock();
        tracked
            .hosts
            .get(&tracked.primary(mac))
            .map(|e| e.progress.clone())
    }

    /// Inventory hosts by the furthest stage of their current boot, every
    /// stage listed (0 included); hosts not seen yet are not counted.
    pub fn inventory_stages(&self) -> [(Stage, usize); 5] {
        let mut out = [
            (Stage::Dhcp, 0),
            (Stage::Tftp, 0),
            (Stage::Script, 0),
            (Stage::Artifacts, 0),
            (Stage::Booted, 0),
        ];
        let tracked = self.lock();
        for mac in &tracked.inventory {
            let stage = tracked.hosts.get(mac).and_then(|e| e.progress.stage());
            if let Some(slot) = out.iter_mut().find(|(s, _)| Some(*s) == stage) {
                slot.1 += 1;
            }
        }
        out
    }

    /// The stage of each host of `hosts`, in their order, read under one
    /// lock: what a fleet view of many thousand hosts reads twice a second.
    pub fn stages<'a>(&self, hosts: impl IntoIterator<Item = &'a Host>) -> Vec<Option<Stage>> {
        let tracked = self.lock();
        hosts
            .into_iter()
            .map(|h| {
                tracked
                    .hosts
                    .get(&tracked.primary(h.mac))
                    .and_then(|e| e.progress.stage())
            })
            .collect()
    }

    /// Hosts with any progress, by MAC.
    pub fn list(&self) -> Vec<HostProgress> {
        let mut all: Vec<HostProgress> = self
            .lock()
            .hosts
            .values()
            .map(|e| e.progress.clone())
            .collect();
        all.sort_by_key(|p| p.mac);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{self, Clocks};

    #[test]
    fn stages_serialize_as_their_text() {
        for stage in [
            Stage::Dhcp,
            Stage::Tftp,
            Stage::Script,
            Stage::Artifacts,
            Stage::Booted,
        ] {
            assert_eq!(
                serde_json::to_value(stage).expect("json"),
                stage.as_str(),
                "{stage:?}"
            );
        }
    }

    const MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);

    #[test]
    fn inventory_hosts_are_counted_by_the_stage_of_their_boot() {
        let p = Progress::default();
        let (a, b, c) = (
            MacAddr([2, 0, 0, 0, 0, 0x11]),
            MacAddr([2, 0, 0, 0, 0, 0x12]),
            MacAddr([2, 0, 0, 0, 0, 0x13]),
        );
        p.set_inventory([a, b, c]);
        p.xdp_answer(a, 1_000, "ack".into());
        p.xdp_answer(b, 1_000, "ack".into());
        p.tftp_transfer(b, 2_000, "done", "undionly.kpxe".into());
        // Not in the inventory: not counted.
        p.xdp_answer(MAC, 1_000, "ack".into());
        assert_eq!(
            p.inventory_stages(),
            [
                (Stage::Dhcp, 1),
                (Stage::Tftp, 1),
                (Stage::Script, 0),
                (Stage::Artifacts, 0),
                (Stage::Booted, 0)
            ]
        );
    }

    #[test]
    fn stage_follows_the_boot_chain_and_restarts_with_dhcp() {
        let p = Progress::default();
        p.dhcp(MAC, 10, "offer".into());
        assert_eq!(p.get(MAC).and_then(|h| h.stage()), Some(Stage::Dhcp));
        p.tftp(MAC, 11, "undionly.kpxe".into());
        p.script(MAC, 12, "script".into());
        p.artifact(MAC, 13, "vmlinuz".into());
        p.artifact(MAC, 14, "initrd".into());
        p.booted(MAC, 20, "ok".into());
        let h = p.get(MAC).expect("recorded");
        assert_eq!((h.stage(), h.artifacts_fetched), (Some(Stage::Booted), 2));
        // The next boot starts over.
        p.dhcp(MAC, 30, "offer".into());
        assert_eq!(p.get(MAC).and_then(|h| h.stage()), Some(Stage::Dhcp));
    }

    #[tokio::test]
    async fn a_serving_event_is_a_step_and_a_trace_event_of_the_same_time() {
        use crate::trace::Next;
        let p = Progress::default();
        let mut watch = p.trace().watch(MAC).expect("watch");
        p.dhcp_answer(
            MAC,
            10,
            "offer",
            || "Discover xid 0x00000001: 10.0.0.1 to Broadcast".into(),
            "offer 10.0.0.1 (slow path)".into(),
        );
        p.tftp_transfer(MAC, 11, "done", "undionly.kpxe 100 B done".into());
        p.served(
            MAC,
            12,
            Served::Script {
                via: TracePath::Tftp,
                what: "grub.cfg",
            },
            || "/grub/grub.cfg for 10.0.0.1".into(),
            "/grub/grub.cfg (grub)".into(),
        );
        p.served(
            MAC,
            13,
            Served::Artifact,
            || "/vmlinuz from 10.0.0.1:5000".into(),
            "vmlinuz".into(),
        );
        p.served(
            MAC,
            14,
            Served::PhoneHome,
            || "\"up\" from 10.0.0.1:5001".into(),
            "up".into(),
        );
        // Nothing is built for a MAC nobody traces.
        let other = MacAddr([2, 0, 0, 0, 0, 2]);
        p.dhcp_answer(
            other,
            15,
            "ack",
            || panic!("trace detail built for an untraced MAC"),
            "ack 10.0.0.2 (slow path)".into(),
        );
        // The fast path's answers are the XDP program's to trace: a step
        // only, so the next event is the marker published after it.
        p.xdp_answer(MAC, 16, "ack 10.0.0.1 (pxe, xdp)".into());
        p.trace()
            .publish(MAC, TracePath::Agent, "marker", String::new);
        let mut events = Vec::new();
        for _ in 0..6 {
            match watch.next().await {
                Next::Event(e) => events.push((e.at_ms, e.path, e.what.clone(), e.detail.clone())),
                other => panic!("{other:?}"),
            }
        }
        let marker = events.pop().expect("six events");
        assert_eq!((marker.1, marker.2.as_str()), (TracePath::Agent, "marker"));
        let event = |at: u64, path: TracePath, what: &str, detail: &str| {
            (at, path, what.to_string(), detail.to_string())
        };
        assert_eq!(
            events,
            [
                event(
                    10,
                    TracePath::Dhcp,
                    "offer",
                    "Discover xid 0x00000001: 10.0.0.1 to Broadcast"
                ),
                event(11, TracePath::Tftp, "done", "undionly.kpxe 100 B done"),
                event(
                    12,
                    TracePath::Tftp,
                    "grub.cfg",
                    "/grub/grub.cfg for 10.0.0.1"
                ),
                event(13, TracePath::Http, "fetch", "/vmlinuz from 10.0.0.1:5000"),
                event(
                    14,
                    TracePath::PhoneHome,
                    "booted",
                    "\"up\" from 10.0.0.1:5001"
                ),
            ]
        );
        let h = p.get(MAC).expect("recorded");
        let steps: Vec<_> = h
            .steps()
            .into_iter()
            .map(|(stage, step)| (stage, step.map(|s| (s.at_ms, s.detail.as_str()))))
            .collect();
        assert_eq!(
            steps,
            [
                (Stage::Dhcp, Some((16, "ack 10.0.0.1 (pxe, xdp)"))),
                (Stage::Tftp, Some((11, "undionly.kpxe 100 B done"))),
                (Stage::Script, Some((12, "/grub/grub.cfg (grub)"))),
                (Stage::Artifacts, Some((13, "vmlinuz"))),
                (Stage::Booted, Some((14, "up"))),
            ]
        );
        assert_eq!(h.boot_mac, Some(MAC));
        assert!(p.get(other).is_some_and(|h| h.dhcp.is_some()));
    }

    #[test]
    fn each_boot_gets_a_new_token_epoch_and_older_ones_are_refused() {
        let p = Progress::default();
        // After a restart nothing is known: a genuine token is taken.
        assert!(p.accept_token_epoch(MAC, 500));
        let first = p.new_token_epoch(MAC, 1_000);
        assert_eq!(first, 1_000);
        // The clock stood still (or stepped back): still a new epoch.
        let second = p.new_token_epoch(MAC, 900);
        assert_eq!(second, 1_001);
        assert!(!p.accept_token_epoch(MAC, first), "earlier boot");
        assert!(!p.accept_token_epoch(MAC, 500), "before the restart");
        assert!(p.accept_token_epoch(MAC, second));
        assert!(p.accept_token_epoch(MAC, second), "heartbeats repeat it");
        let h = p.get(MAC).expect("recorded");
        assert!(!serde_json::to_string(&h).expect("json").contains("epoch"));
    }

    #[test]
    fn a_late_drained_answer_keeps_its_own_time() {
        // A fast-path answer sent 150 ms ago, drained after the phone-home
        // that followed it, must not start a new boot.
        let p = Progress::default();
        let sent_ns = Clocks::now().monotonic_ns() - 150_000_000;
        let now = clock::now_ms();
        p.booted(MAC, now - 50, "ok".into());
        let sent = Clocks::now().wall_ms_of(sent_ns);
        assert!(sent.abs_diff(now - 150) < 20, "sent {sent}, now {now}");
        p.dhcp(MAC, sent, "ack".into());
        assert_eq!(p.get(MAC).and_then(|h| h.stage()), Some(Stage::Booted));
    }

    #[test]
    fn random_macs_stay_within_the_bound_and_inventory_hosts_survive() {
        let p = Progress::default();
        let hosts: Vec<MacAddr> = (0..100u8)
            .map(|i| MacAddr([0x52, 0x54, 0, 0, 1, i]))
            .collect();
        p.set_inventory(hosts.iter().copied());
        for (i, &h) in hosts.iter().enumerate() {
            p.booted(h, i as u64, "ok".into());
        }
        // A pseudo-random walk over MACs: NAKs to 200,000 clients that never
        // come back.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for n in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x.to_be_bytes();
            let mac = MacAddr([0x02, b[1], b[2], b[3], b[4], b[5]]);
            p.dhcp(mac, 1_000 + n, "nak 0.0.0.0 (slow path)".into());
        }
        assert!(
            p.len() <= DEFAULT_CAPACITY + hosts.len(),
            "{} entries tracked",
            p.len()
        );
        for (i, &h) in hosts.iter().enumerate() {
            let got = p.get(h).and_then(|h| h.booted).map(|s| s.at_ms);
            assert_eq!(got, Some(i as u64), "progress of inventory host {h} lost");
        }
    }

    #[test]
    fn a_host_with_two_ports_has_one_entry_that_names_the_port_that_booted() {
        let inv = crate::inventory::Inventory::parse(
            std::path::Path::new("inv.yaml"),
            "subnets: [{cidr: 10.0.0.0/24}]\nprofiles: [{name: p}]\nhosts:\n  - {macs: [\"02:00:00:00:00:01\", \"02:00:00:00:00:02\"], ip: 10.0.0.11, profile: p}\n",
        )
        .expect("inventory");
        let (primary, second) = (inv.hosts[0].mac, inv.hosts[0].macs[1]);
        let p = Progress::new(0);
        p.set_hosts(&inv.hosts);
        p.dhcp(second, 1_000, "ack 10.0.0.11".into());
        p.booted(primary, 2_000, "phone-home".into());
        assert_eq!(p.len(), 1, "one entry for the host");
        let entry = p.get(primary).expect("tracked");
        assert_eq!(entry.mac, primary);
        assert_eq!(entry.boot_mac, Some(second));
        assert_eq!(entry.stage(), Some(Stage::Booted));
        assert_eq!(p.get(second), Some(entry));
        p.dhcp(primary, 3_000, "ack 10.0.0.11".into());
        assert_eq!(p.get(second).and_then(|e| e.boot_mac), Some(primary));
    }

    #[test]
    fn stages_are_read_in_host_order_through_any_port() {
        let inv = crate::inventory::Inventory::parse(
            std::path::Path::new("inv.yaml"),
            "subnets: [{cidr: 10.0.0.0/24}]\nprofiles: [{name: p}]\nhosts:\n  - {macs: [\"02:00:00:00:00:01\", \"02:00:00:00:00:02\"], ip: 10.0.0.11, profile: p}\n  - {mac: \"02:00:00:00:00:03\", ip: 10.0.0.12, profile: p}\n  - {mac: \"02:00:00:00:00:04\", ip: 10.0.0.13, profile: p}\n",
        )
        .expect("inventory");
        let p = Progress::new(0);
        p.set_hosts(&inv.hosts);
        p.dhcp(inv.hosts[0].macs[1], 1_000, "ack".into());
        p.tftp(inv.hosts[0].mac, 1_001, "ipxe.efi".into());
        p.booted(inv.hosts[2].mac, 900, "phone-home".into());
        assert_eq!(
            p.stages(inv.hosts.iter().map(|h| &**h)),
            [Some(Stage::Tftp), None, Some(Stage::Booted)]
        );
    }

    #[test]
    fn the_least_recently_updated_unknown_mac_is_evicted() {
        let p = Progress::new(2);
        let (a, b, c) = (
            MacAddr([2, 0, 0, 0, 1, 1]),
            MacAddr([2, 0, 0, 0, 1, 2]),
            MacAddr([2, 0, 0, 0, 1, 3]),
        );
        p.dhcp(a, 1, "offer".into());
        p.dhcp(b, 2, "offer".into());
        // a is updated again, so b is the one to go.
        p.tftp(a, 3, "undionly.kpxe".into());
        p.dhcp(c, 4, "offer".into());
        assert_eq!((p.get(a).is_some(), p.get(b).is_some()), (true, false));
        assert!(p.get(c).is_some());
        // A host added to the inventory is kept; one removed from it counts
        // against the bound again.
        p.set_inventory([b, c]);
        p.dhcp(b, 5, "offer".into());
        p.set_inventory([b]);
        assert_eq!(p.len(), 3);
        p.dhcp(MacAddr([2, 0, 0, 0, 1, 4]), 6, "offer".into());
        p.dhcp(MacAddr([2, 0, 0, 0, 1, 5]), 7, "offer".into());
        assert_eq!(p.len(), 3, "b plus two others");
        assert!(p.get(b).is_some());
    }
}

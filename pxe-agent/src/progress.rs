//! Boot progress per host: the last DHCP answer, TFTP transfer, iPXE script
//! fetch, artifact fetches and the phone-home from the booted system, so
//! `pxe-agent hosts` can say where each machine is in the boot chain.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

use crate::{inventory::MacAddr, trace::Hub};

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

/// One step with its time (unix milliseconds) and detail.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub at_ms: u64,
    pub detail: String,
}

/// Now, in unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The wall clock and `CLOCK_MONOTONIC` read together once, to turn
/// monotonic readings (what the XDP program stamps its events with) into
/// wall time: one reading serves a whole drain of the event ring.
#[derive(Clone, Copy, Debug)]
pub struct Clocks {
    wall_ms: u64,
    monotonic_ns: u64,
}

impl Clocks {
    pub fn now() -> Clocks {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; on failure it stays
        // zero, and every reading then maps to now.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        Clocks {
            wall_ms: now_ms(),
            monotonic_ns: u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000
                + u64::try_from(ts.tv_nsec).unwrap_or(0),
        }
    }

    pub fn monotonic_ns(&self) -> u64 {
        self.monotonic_ns
    }

    /// The unix-millisecond time of the monotonic reading `at_ns`.
    pub fn wall_ms_of(&self, at_ns: u64) -> u64 {
        self.wall_ms
            .saturating_sub(self.monotonic_ns.saturating_sub(at_ns) / 1_000_000)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostProgress {
    pub mac: String,
    pub dhcp: Option<Step>,
    pub tftp: Option<Step>,
    pub script: Option<Step>,
    /// The most recent artifact fetch.
    pub artifact: Option<Step>,
    pub artifacts_fetched: u64,
    pub booted: Option<Step>,
}

impl HostProgress {
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

#[derive(Default)]
pub struct Progress {
    hosts: Mutex<HashMap<MacAddr, HostProgress>>,
    /// The live trace: here because every service that records progress
    /// already holds this, and publishes its trace events next to it.
    trace: Arc<Hub>,
}

impl Progress {
    pub fn trace(&self) -> &Arc<Hub> {
        &self.trace
    }

    fn with(&self, mac: MacAddr, f: impl FnOnce(&mut HostProgress)) {
        let mut hosts = self.hosts.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = hosts.entry(mac).or_insert_with(|| HostProgress {
            mac: mac.to_string(),
            ..Default::default()
        });
        f(entry);
    }

    pub fn dhcp(&self, mac: MacAddr, at_ms: u64, detail: String) {
        self.with(mac, |p| p.dhcp = Some(Step { at_ms, detail }));
    }

    pub fn tftp(&self, mac: MacAddr, at_ms: u64, detail: String) {
        self.with(mac, |p| p.tftp = Some(Step { at_ms, detail }));
    }

    pub fn script(&self, mac: MacAddr, at_ms: u64, detail: String) {
        self.with(mac, |p| p.script = Some(Step { at_ms, detail }));
    }

    pub fn artifact(&self, mac: MacAddr, at_ms: u64, detail: String) {
        self.with(mac, |p| {
            p.artifact = Some(Step { at_ms, detail });
            p.artifacts_fetched += 1;
        });
    }

    pub fn booted(&self, mac: MacAddr, at_ms: u64, detail: String) {
        self.with(mac, |p| p.booted = Some(Step { at_ms, detail }));
    }

    pub fn get(&self, mac: MacAddr) -> Option<HostProgress> {
        self.hosts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&mac)
            .cloned()
    }

    /// Hosts with any progress, by MAC.
    pub fn list(&self) -> Vec<HostProgress> {
        let mut all: Vec<HostProgress> = self
            .hosts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| a.mac.cmp(&b.mac));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);

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

    #[test]
    fn a_late_drained_answer_keeps_its_own_time() {
        // A fast-path answer sent 150 ms ago, drained after the phone-home
        // that followed it, must not start a new boot.
        let p = Progress::default();
        let sent_ns = Clocks::now().monotonic_ns() - 150_000_000;
        let now = now_ms();
        p.booted(MAC, now - 50, "ok".into());
        let sent = Clocks::now().wall_ms_of(sent_ns);
        assert!(sent.abs_diff(now - 150) < 20, "sent {sent}, now {now}");
        p.dhcp(MAC, sent, "ack".into());
        assert_eq!(p.get(MAC).and_then(|h| h.stage()), Some(Stage::Booted));
    }
}

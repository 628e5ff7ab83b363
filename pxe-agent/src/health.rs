//! Whether the agent serves what it says it serves: the facts `/healthz`
//! reports, fed by the services (the slow path's heartbeat and restarts,
//! the state store's writes, the inventory switch) and by a monitor that
//! asks the kernel whether the XDP program is still attached.
//!
//! Owns no service; every service reports here and nothing here acts.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::sync::lock;

/// How long the slow path may go without a turn of its loop before it counts
/// as stalled: its socket's read timeout is 100 ms and a batch takes a few.
pub const SLOW_PATH_STALL: Duration = Duration::from_secs(3);

/// The agent's health, read by `/healthz` and the metrics.
pub struct Health {
    started: Instant,
    /// Milliseconds since `started` of the slow path's last loop turn.
    slow_path_beat: AtomicU64,
    slow_path_running: AtomicBool,
    /// Times the slow path's thread was started again after it died.
    pub slow_path_restarts: AtomicU64,
    /// Problems that a check found, by what was checked.
    problems: Mutex<Problems>,
}

#[derive(Default)]
struct Problems {
    xdp: Option<String>,
    maps: Option<String>,
    store: Option<String>,
    slow_path: Option<String>,
    oob: Option<String>,
    /// Each interface the program was attached to, and how our program
    /// is attached there now (`none` when it no longer is).
    xdp_attached: Vec<(String, &'static str)>,
}

impl Default for Health {
    fn default() -> Health {
        Health {
            started: Instant::now(),
            slow_path_beat: AtomicU64::new(0),
            slow_path_running: AtomicBool::new(false),
            slow_path_restarts: AtomicU64::new(0),
            problems: Mutex::new(Problems::default()),
        }
    }
}

impl Health {
    fn problems(&self) -> std::sync::MutexGuard<'_, Problems> {
        lock(&self.problems)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The slow path is in its loop.
    pub fn slow_path_beat(&self) {
        self.slow_path_beat.store(self.now_ms(), Ordering::Relaxed);
        self.slow_path_running.store(true, Ordering::Relaxed);
    }

    /// The slow path's thread ended; `why` is `None` for a clean stop.
    pub fn slow_path_down(&self, why: Option<String>) {
        self.slow_path_running.store(false, Ordering::Relaxed);
        self.problems().slow_path = why;
    }

    /// The slow path came back after dying.
    pub fn slow_path_restarted(&self) {
        self.slow_path_restarts.fetch_add(1, Ordering::Relaxed);
        self.problems().slow_path = None;
    }

    /// What the XDP check found: `Err` says what is wrong.
    pub fn set_xdp(&self, result: Result<(), String>) {
        self.problems().xdp = result.err();
    }

    /// How our program is attached to each interface it was attached to
    /// (`native`, `generic`, `offload`; `none` when it no longer is), as
    /// the monitor last found.
    pub fn set_xdp_modes(&self, modes: Vec<(String, &'static str)>) {
        self.problems().xdp_attached = modes;
    }

    /// What [`Health::set_xdp_modes`] last recorded.
    pub fn xdp_modes(&self) -> Vec<(String, &'static str)> {
        self.problems().xdp_attached.clone()
    }

    /// Per interface, whether our program is still the one attached there
    /// (the monitor's last look).
    pub fn xdp_attached(&self) -> Vec<(String, bool)> {
        self.problems()
            .xdp_attached
            .iter()
            .map(|(iface, mode)| (iface.clone(), *mode != "none"))
            .collect()
    }

    /// Whether the maps hold what the inventory in force says.
    pub fn set_maps(&self, result: Result<(), String>) {
        self.problems().maps = result.err();
    }

    /// The outcome of the last write to the state store.
    pub fn set_store(&self, result: Result<(), String>) {
        self.problems().store = result.err();
    }

    /// Whether out-of-band control (BMC actions, recovery) runs.
    pub fn set_oob(&self, result: Result<(), String>) {
        self.problems().oob = result.err();
    }

    /// Each check by its metric label, and whether it passes now: what
    /// [`Health::check`] reports, one flag per check.
    pub fn checks(&self) -> [(&'static str, bool); 5] {
        let slow_path_ok = self.check().iter().all(|p| !p.starts_with("slow path"));
        let p = self.problems();
        [
            ("slow_path", slow_path_ok),
            ("xdp", p.xdp.is_none()),
            ("maps", p.maps.is_none()),
            ("state_store", p.store.is_none()),
            ("out_of_band", p.oob.is_none()),
        ]
    }

    /// Everything that is wrong now; empty when ready.
    pub fn check(&self) -> Vec<String> {
        let mut out = Vec::new();
        let beat = self.slow_path_beat.load(Ordering::Relaxed);
        let stalled = self.now_ms().saturating_sub(beat) > SLOW_PATH_STALL.as_millis() as u64;
        let p = self.problems();
        if !self.slow_path_running.load(Ordering::Relaxed) {
            out.push(match &p.slow_path {
                Some(why) => format!("slow path down: {why}"),
                None => "slow path not running".to_string(),
            });
        } else if stalled {
            out.push(format!("slow path stalled for {} ms", self.now_ms() - beat));
        }
        for (what, problem) in [
            ("XDP", &p.xdp),
            ("maps", &p.maps),
            ("state store", &p.store),
            ("out-of-band control", &p.oob),
        ] {
            if let Some(problem) = problem {
                out.push(format!("{what}: {problem}"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_while_the_slow_path_beats_and_no_check_failed() {
        let h = Health::default();
        assert_eq!(h.check(), vec!["slow path not running"]);
        h.slow_path_beat();
        assert!(h.check().is_empty());
        h.set_xdp(Err("no program attached to eth1".into()));
        h.set_store(Err("disk full".into()));
        assert_eq!(
            h.check(),
            vec!["XDP: no program attached to eth1", "state store: disk full"]
        );
        h.set_xdp(Ok(()));
        h.set_store(Ok(()));
        h.slow_path_down(Some("thread panicked: boom".into()));
        assert_eq!(h.check(), vec!["slow path down: thread panicked: boom"]);
        assert_eq!(
            h.checks(),
            [
                ("slow_path", false),
                ("xdp", true),
                ("maps", true),
                ("state_store", true),
                ("out_of_band", true)
            ]
        );
        h.slow_path_restarted();
        h.slow_path_beat();
        assert!(h.check().is_empty());
        assert!(h.checks().iter().all(|(_, ok)| *ok));
        assert_eq!(h.slow_path_restarts.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_slow_path_that_stops_beating_is_stalled() {
        let h = Health::default();
        h.slow_path_beat();
        h.slow_path_beat.store(0, Ordering::Relaxed);
        // Pretend the agent has run past the stall bound since that beat.
        let h = Health {
            started: Instant::now() - SLOW_PATH_STALL * 2,
            ..h
        };
        let problems = h.check();
        assert!(problems[0].starts_with("slow path stalled"), "{problems:?}");
    }
}

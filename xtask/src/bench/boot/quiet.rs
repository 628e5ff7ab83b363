//! Other work on the machine (another benchmark, a build) skews every
//! figure here, since the servers and the client share two CPUs. Before
//! each measurement the benchmark waits, within a budget for the whole run,
//! until the machine is quiet, and it records how busy the machine was when
//! each measurement started.

use std::{
    thread,
    time::{Duration, Instant},
};

use super::{measure::cpus, servers};

/// Quiet: less than this share of one CPU busy over a sample.
pub const QUIET_BUSY: f64 = 0.2;
/// One sample of the machine's idle time.
const SAMPLE: Duration = Duration::from_millis(250);

/// Waits for a quiet machine out of a budget shared by the whole run.
pub struct Quiet {
    budget: Duration,
    /// Measurements that started on a busy machine.
    pub busy_starts: usize,
    /// The busiest start, in shares of one CPU.
    pub worst: f64,
    pub waited: Duration,
}

impl Quiet {
    pub fn new(budget: Duration) -> Quiet {
        Quiet {
            budget,
            busy_starts: 0,
            worst: 0.0,
            waited: Duration::ZERO,
        }
    }

    /// Samples until the machine is quiet or the budget is spent; returns
    /// the last sample's busy share of one CPU.
    pub fn wait(&mut self) -> f64 {
        let started = Instant::now();
        let mut warned = false;
        let busy = loop {
            let busy = sample();
            if busy < QUIET_BUSY || self.waited + started.elapsed() >= self.budget {
                break busy;
            }
            if !warned {
                println!(
                    "bench: waiting for a quiet machine ({:.0}% of a CPU busy with other work)",
                    busy * 100.0
                );
                warned = true;
            }
        };
        self.waited += started.elapsed();
        if busy >= QUIET_BUSY {
            self.busy_starts += 1;
        }
        self.worst = self.worst.max(busy);
        busy
    }
}

/// Busy share of one CPU over [`SAMPLE`]: CPUs × wall time − idle.
fn sample() -> f64 {
    let tick = servers::ticks_per_second();
    let idle0 = servers::machine_idle_ticks();
    let started = Instant::now();
    thread::sleep(SAMPLE);
    let idle = servers::machine_idle_ticks().saturating_sub(idle0) as f64 / tick;
    let wall = started.elapsed().as_secs_f64();
    ((wall * cpus() - idle) / wall).max(0.0)
}

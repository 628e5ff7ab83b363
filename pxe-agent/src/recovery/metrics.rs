//! The recovery metrics: their names, and their block of the agent's
//! `/metrics` page, written through [`crate::metrics::exposition`]. Owns nothing else; the numbers come from the [`Controller`]
//! and the [`Sequencer`].

use super::{Controller, Gate, Sequencer, State};
use crate::metrics::exposition::{Exposition, Kind};

/// Counter, labels `from`, `to`, `reason`.
pub const TRANSITIONS: &str = "pxe_recovery_transitions_total";
/// Gauge, label `state`: managed hosts in each state.
pub const HOSTS: &str = "pxe_recovery_hosts";
/// Gauge, label `stage`: hosts whose stage deadline passed and that have
/// not got past that stage since.
pub const STALLED: &str = "pxe_recovery_stalled_hosts";
/// Gauge, labels `host`, `stage`: one series per stuck host, 1. Names
/// hosts: served on the API listener only, never on `/metrics`.
pub const STALLED_HOST: &str = "pxe_recovery_stalled_host_info";
/// Gauge, label `host`: one series per host whose recovery failed, 1.
/// Names hosts: served on the API listener only.
pub const FAILED_HOST: &str = "pxe_recovery_failed_host_info";
/// Gauge: BMC actions waiting to start.
pub const QUEUE: &str = "pxe_recovery_queue_length";
/// Gauge: BMC actions running.
pub const IN_FLIGHT: &str = "pxe_recovery_actions_in_flight";
/// Counter, label `gate`: actions that had to wait, by what held them.
pub const WAITS: &str = "pxe_recovery_waits_total";
/// Counter: seconds released actions spent queued.
pub const WAIT_SECONDS: &str = "pxe_recovery_wait_seconds_total";
/// Counter: failed writes of the recovery store.
pub const STORE_ERRORS: &str = "pxe_recovery_store_errors_total";

/// The block for `/metrics`: every state and gate is listed, with 0 when
/// nothing is in it, so that dashboards see a series from the start.
pub fn render(controller: &Controller, sequencer: &Sequencer) -> String {
    let mut out = Exposition::new();
    let mut f = out.family(
        TRANSITIONS,
        Kind::Counter,
        "Recovery state transitions, by from state, to state and reason.",
    );
    for ((from, to, reason), count) in controller.transition_counts() {
        f.sample(
            &[
                ("from", from.as_str()),
                ("to", to.as_str()),
                ("reason", reason.as_str()),
            ],
            count,
        );
    }
    let mut f = out.family(
        HOSTS,
        Kind::Gauge,
        "Hosts with a BMC this agent owns (all, without peers), by recovery state.",
    );
    for (state, count) in controller.hosts_per_state() {
        f.sample(&[("state", State::as_str(state))], count);
    }
    let mut f = out.family(
        STALLED,
        Kind::Gauge,
        "Hosts this agent owns whose deadline in a stage passed and that have not got past that stage since (back-off, retries and failed included), by stage.",
    );
    for (stage, count) in controller.stalled_per_stage() {
        f.sample(&[("stage", stage.as_str())], count);
    }
    let stats = sequencer.stats();
    out.family(QUEUE, Kind::Gauge, "BMC actions waiting to start.")
        .value(stats.queued);
    out.family(IN_FLIGHT, Kind::Gauge, "BMC actions running.")
        .value(stats.in_flight);
    let mut f = out.family(
        WAITS,
        Kind::Counter,
        "BMC actions that had to wait, by the limit that held them.",
    );
    for gate in Gate::ALL {
        let count = stats.waits.get(&gate).copied().unwrap_or(0);
        f.sample(&[("gate", gate.as_str())], count);
    }
    out.family(
        WAIT_SECONDS,
        Kind::Counter,
        "Seconds that started BMC actions spent queued.",
    )
    .value(stats.wait_ms_total as f64 / 1000.0);
    out.family(
        STORE_ERRORS,
        Kind::Counter,
        "Failed writes of the recovery state file.",
    )
    .value(controller.store_errors());
    out.finish()
}

/// The series that name hosts, for the API listener's `/api/v1/metrics`
/// (identified callers only): hosts stuck in a stage past its deadline,
/// as (host name, stage), and hosts whose recovery failed.
pub fn render_named(stalled: &[(&str, State)], failed: &[&str]) -> String {
    let mut out = Exposition::new();
    let mut f = out.family(
        STALLED_HOST,
        Kind::Gauge,
        "A host stuck in a stage past its deadline (see pxe_recovery_stalled_hosts), 1 per host.",
    );
    for (host, stage) in stalled {
        f.sample(&[("host", host), ("stage", stage.as_str())], 1);
    }
    let mut f = out.family(
        FAILED_HOST,
        Kind::Gauge,
        "A host whose recovery failed (see pxe_recovery_hosts{state=\"failed\"}), 1 per host.",
    );
    for host in failed {
        f.sample(&[("host", host)], 1);
    }
    out.finish()
}

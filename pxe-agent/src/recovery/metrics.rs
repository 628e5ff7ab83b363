//! The recovery metrics: their names, and their block of the agent's
//! `/metrics` page, written through [`crate::metrics::exposition`]. Owns nothing else; the numbers come from the [`Controller`]
//! and the [`Sequencer`].

use super::{Controller, Gate, Sequencer, State};
use crate::metrics::exposition::{Exposition, Kind};

/// Counter, labels `from`, `to`, `reason`.
pub const TRANSITIONS: &str = "pxe_recovery_transitions_total";
/// Gauge, label `state`: managed hosts in each state.
pub const HOSTS: &str = "pxe_recovery_hosts";
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

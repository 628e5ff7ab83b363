//! The recovery metrics: their names, and their rendering in the
//! Prometheus text format (0.0.4) as a block the agent's `/metrics` page
//! appends. Owns nothing else; the numbers come from the [`Controller`]
//! and the [`Sequencer`].

use std::fmt::Write as _;

use super::{Controller, Gate, Sequencer, State};

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
    let mut out = String::new();
    let head = |out: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
    };
    head(
        &mut out,
        TRANSITIONS,
        "counter",
        "Recovery state transitions, by from state, to state and reason.",
    );
    for ((from, to, reason), count) in controller.transition_counts() {
        let _ = writeln!(
            out,
            "{TRANSITIONS}{{from=\"{from}\",to=\"{to}\",reason=\"{reason}\"}} {count}"
        );
    }
    head(
        &mut out,
        HOSTS,
        "gauge",
        "Hosts with a BMC this agent owns (all, without peers), by recovery state.",
    );
    for (state, count) in controller.hosts_per_state() {
        let _ = writeln!(out, "{HOSTS}{{state=\"{}\"}} {count}", State::as_str(state));
    }
    let stats = sequencer.stats();
    head(&mut out, QUEUE, "gauge", "BMC actions waiting to start.");
    let _ = writeln!(out, "{QUEUE} {}", stats.queued);
    head(&mut out, IN_FLIGHT, "gauge", "BMC actions running.");
    let _ = writeln!(out, "{IN_FLIGHT} {}", stats.in_flight);
    head(
        &mut out,
        WAITS,
        "counter",
        "BMC actions that had to wait, by the limit that held them.",
    );
    for gate in Gate::ALL {
        let count = stats.waits.get(&gate).copied().unwrap_or(0);
        let _ = writeln!(out, "{WAITS}{{gate=\"{}\"}} {count}", gate.as_str());
    }
    head(
        &mut out,
        WAIT_SECONDS,
        "counter",
        "Seconds that started BMC actions spent queued.",
    );
    let _ = writeln!(
        out,
        "{WAIT_SECONDS} {}",
        stats.wait_ms_total as f64 / 1000.0
    );
    head(
        &mut out,
        STORE_ERRORS,
        "counter",
        "Failed writes of the recovery state file.",
    );
    let _ = writeln!(out, "{STORE_ERRORS} {}", controller.store_errors());
    out
}

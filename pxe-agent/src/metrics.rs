//! Metric names and their Prometheus text rendering; one place for both.

use std::fmt::Write as _;

use pxe_ebpf_common::Counter;

use crate::xdp::Stats;

/// What the agent exports besides the XDP counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct AgentGauges {
    pub hosts: usize,
    pub templates: usize,
    pub reloads_ok: u64,
    pub reloads_rejected: u64,
}

pub const XDP_PACKETS: &str = "pxe_xdp_packets_total";
pub const INVENTORY_HOSTS: &str = "pxe_inventory_hosts";
pub const INVENTORY_TEMPLATES: &str = "pxe_inventory_templates";
pub const INVENTORY_RELOADS: &str = "pxe_inventory_reloads_total";

/// Renders the metrics page (text exposition format 0.0.4).
pub fn render(stats: &Stats, g: &AgentGauges) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP {XDP_PACKETS} DHCP packets seen by the XDP fast path, by outcome."
    );
    let _ = writeln!(out, "# TYPE {XDP_PACKETS} counter");
    for c in Counter::ALL {
        let _ = writeln!(
            out,
            "{XDP_PACKETS}{{outcome=\"{}\"}} {}",
            c.name(),
            stats.get(c)
        );
    }
    let _ = writeln!(
        out,
        "# HELP {INVENTORY_HOSTS} Hosts in the serving inventory."
    );
    let _ = writeln!(out, "# TYPE {INVENTORY_HOSTS} gauge");
    let _ = writeln!(out, "{INVENTORY_HOSTS} {}", g.hosts);
    let _ = writeln!(
        out,
        "# HELP {INVENTORY_TEMPLATES} Compiled replies (host x boot class) in the XDP map."
    );
    let _ = writeln!(out, "# TYPE {INVENTORY_TEMPLATES} gauge");
    let _ = writeln!(out, "{INVENTORY_TEMPLATES} {}", g.templates);
    let _ = writeln!(
        out,
        "# HELP {INVENTORY_RELOADS} Inventory reloads, applied or rejected."
    );
    let _ = writeln!(out, "# TYPE {INVENTORY_RELOADS} counter");
    let _ = writeln!(out, "{INVENTORY_RELOADS}{{result=\"ok\"}} {}", g.reloads_ok);
    let _ = writeln!(
        out,
        "{INVENTORY_RELOADS}{{result=\"rejected\"}} {}",
        g.reloads_rejected
    );
    out
}

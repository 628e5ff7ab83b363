//! The `/metrics` page, assembled once a scrape from each service's
//! section: the fast and slow paths, the gauges of the serving layer,
//! TFTP, boot HTTP, the share of the pool, host records, other DHCP
//! servers, netboot and the API's own counters. The names are
//! [`metrics`](crate::metrics)'; every section goes through one writer.

#[cfg(test)]
mod golden;

use std::sync::atomic::Ordering;

use pxe_ebpf_common::Counter;

use crate::{
    admission::Snapshot,
    http::limit,
    lease::LeaseState,
    metrics::{
        exposition::{Exposition, Kind},
        *,
    },
    share::Share,
    state::{Dhcp6Stats, SlowPathStats},
    tftp::StatsSnapshot,
    xdp::Stats,
};

/// Everything one scrape shows.
pub struct Page<'a> {
    pub fast: &'a Stats,
    pub gauges: &'a AgentGauges,
    pub slow: &'a SlowPathStats,
    /// The DHCPv6 slow path's: its samples carry `family="ipv6"` in the
    /// slow path's families, whose IPv4 samples stay unlabelled.
    pub slow6: &'a Dhcp6Stats,
    pub health: &'a crate::health::Health,
    pub discovered: usize,
    /// MACs `pxe-agent trace` watches now.
    pub traced: usize,
    /// Fast-path answers the boot-progress view missed.
    pub xdp_events_lost: u64,
    /// Pool leases by state, from the lease store's index.
    pub leases: &'a [(LeaseState, usize)],
    /// IPv6 pool leases by state, shown with `family="ipv6"`.
    pub leases6: &'a [(LeaseState, usize)],
    /// Counters of the TFTP server, when it runs.
    pub tftp: Option<StatsSnapshot>,
    /// Counters of the boot HTTP listener.
    pub http: limit::StatsSnapshot,
}

/// Renders the metrics page (text exposition format 0.0.4).
pub fn render(p: &Page) -> String {
    let mut o = Exposition::new();
    let mut f = o.family(
        XDP_PACKETS,
        Kind::Counter,
        "DHCP packets seen by the XDP fast path, by outcome.",
    );
    for c in Counter::ALL {
        f.sample(&[("outcome", c.name())], p.fast.get(c));
    }
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    const V6: (&str, &str) = ("family", "ipv6");
    o.family(
        SLOW_RX,
        Kind::Counter,
        "Requests the userspace slow path read.",
    )
    .sample(&[], load(&p.slow.rx))
    .sample(&[V6], load(&p.slow6.rx));
    let mut f = o.family(
        SLOW_REPLIES,
        Kind::Counter,
        "Replies sent by the slow path, by message type.",
    );
    for (kind, c) in [
        ("offer", &p.slow.offers),
        ("ack", &p.slow.acks),
        ("nak", &p.slow.naks),
        ("proxy_offer", &p.slow.proxy_offers),
        ("proxy_ack", &p.slow.proxy_acks),
    ] {
        f.sample(&[("type", kind)], load(c));
    }
    for (kind, c) in [
        ("advertise", &p.slow6.advertises),
        ("reply", &p.slow6.replies),
    ] {
        f.sample(&[V6, ("type", kind)], load(c));
    }
    o.histogram(
        SLOW_REPLY_SECONDS,
        "Time from reading a request to sending its reply in the IPv4 slow path, the lease commit included.",
        &[(&[], &p.slow.reply_seconds.snapshot())],
    );
    let mut f = o.family(
        SLOW_IGNORED,
        Kind::Counter,
        "Requests the slow path did not answer, by reason.",
    );
    for c in Counter::ALL {
        let n = load(&p.slow.ignored[c as usize]);
        if n > 0 {
            f.sample(&[("reason", c.name())], n);
        }
    }
    for c in Counter::ALL {
        let n = load(&p.slow6.ignored[c as usize]);
        if n > 0 {
            f.sample(&[V6, ("reason", c.name())], n);
        }
    }
    let mut f = o.family(
        SLOW_LIMITED,
        Kind::Counter,
        "Requests dropped by the storm guard, by bucket.",
    );
    for (scope, c) in [
        ("mac", &p.slow.limited_mac),
        ("unknown", &p.slow.limited_unknown),
        ("table", &p.slow.limited_table),
    ] {
        f.sample(&[("scope", scope)], load(c));
    }
    for (scope, c) in [
        ("mac", &p.slow6.limited_mac),
        ("unknown", &p.slow6.limited_unknown),
        ("table", &p.slow6.limited_table),
    ] {
        f.sample(&[V6, ("scope", scope)], load(c));
    }
    o.family(
        SLOW_NOT_OURS,
        Kind::Counter,
        "Requests of unknown hosts left to a peer agent sharing the discovery pool.",
    )
    .sample(&[], load(&p.slow.not_ours))
    .sample(&[V6], load(&p.slow6.not_ours));
    let mut f = o.family(SLOW_ERRORS, Kind::Counter, "Slow-path failures, by kind.");
    for (kind, c) in [
        ("malformed", &p.slow.malformed),
        ("pool_exhausted", &p.slow.pool_exhausted),
        ("lease_store", &p.slow.lease_errors),
        ("send", &p.slow.send_errors),
        ("panic", &p.slow.panics),
    ] {
        f.sample(&[("kind", kind)], load(c));
    }
    for (kind, c) in [
        ("malformed", &p.slow6.malformed),
        ("pool_exhausted", &p.slow6.pool_exhausted),
        ("lease_store", &p.slow6.lease_errors),
        ("send", &p.slow6.send_errors),
        ("panic", &p.slow6.panics),
    ] {
        f.sample(&[V6, ("kind", kind)], load(c));
    }
    let mut f = o.family(
        SLOW_DECLINES_REFUSED,
        Kind::Counter,
        "DHCPDECLINEs of pool addresses not acted on, by reason: the address was not given to that MAC, or quarantining it would pass the MAC's or the pool's limit.",
    );
    for (reason, c) in [
        ("not_given", &p.slow.declines_not_given),
        ("mac_limit", &p.slow.declines_mac_limit),
        ("pool_limit", &p.slow.declines_pool_limit),
    ] {
        f.sample(&[("reason", reason)], load(c));
    }
    for (reason, c) in [
        ("not_given", &p.slow6.declines_not_given),
        ("mac_limit", &p.slow6.declines_mac_limit),
        ("pool_limit", &p.slow6.declines_pool_limit),
    ] {
        f.sample(&[V6, ("reason", reason)], load(c));
    }
    o.family(
        RESERVATION_DECLINES,
        Kind::Counter,
        "DHCPDECLINEs of a reserved address by its own host: another machine uses it (`pxe-agent hosts` names the host).",
    )
    .sample(&[], load(&p.slow.reservation_declines))
    .sample(&[V6], load(&p.slow6.reservation_declines));
    o.family(
        SLOW_RESTARTS,
        Kind::Counter,
        "Times the slow path was started again after it died.",
    )
    .value(load(&p.health.slow_path_restarts));
    o.family(READY, Kind::Gauge, "1 while /healthz answers 200.")
        .value(u8::from(p.health.check().is_empty()));
    let mut f = o.family(
        HEALTH_CHECK,
        Kind::Gauge,
        "1 while a check of /healthz passes, by check: the slow path runs, our XDP program is attached, the maps hold the inventory in force, the state store can be written, out-of-band control runs.",
    );
    for (check, ok) in p.health.checks() {
        f.sample(&[("check", check)], u8::from(ok));
    }
    let mut f = o.family(
        XDP_ATTACHED,
        Kind::Gauge,
        "1 while this agent's XDP program is the one attached to the interface, by interface.",
    );
    for (interface, attached) in p.health.xdp_attached() {
        f.sample(&[("interface", &interface)], u8::from(attached));
    }
    o.family(
        DISCOVERED,
        Kind::Gauge,
        "Unknown clients recorded for adoption.",
    )
    .value(p.discovered);
    o.family(
        TRACED,
        Kind::Gauge,
        "MACs traced live (each costs the XDP program a map lookup per request).",
    )
    .value(p.traced);
    o.family(
        XDP_EVENTS_LOST,
        Kind::Counter,
        "Fast-path answers whose events were overwritten before the agent read them \
         (the boot-progress view does not show them).",
    )
    .value(p.xdp_events_lost);
    let mut f = o.family(LEASES, Kind::Gauge, "Pool leases, by state.");
    let count = |leases: &[(LeaseState, usize)], state| {
        leases
            .iter()
            .find(|(s, _)| *s == state)
            .map_or(0, |(_, n)| *n)
    };
    for state in [LeaseState::Bound, LeaseState::Declined] {
        f.sample(&[("state", state.as_str())], count(p.leases, state));
    }
    for state in [LeaseState::Bound, LeaseState::Declined] {
        f.sample(&[V6, ("state", state.as_str())], count(p.leases6, state));
    }
    if let Some(t) = p.tftp {
        render_tftp(&mut o, &t);
    }
    render_http(&mut o, &p.http);
    o.family(
        INVENTORY_HOSTS,
        Kind::Gauge,
        "Hosts in the serving inventory.",
    )
    .value(p.gauges.hosts);
    o.family(
        INVENTORY_TEMPLATES,
        Kind::Gauge,
        "Compiled replies (host x boot class) in the XDP map.",
    )
    .value(p.gauges.templates);
    o.family(
        INVENTORY_RELOADS,
        Kind::Counter,
        "Inventory reloads, applied or rejected.",
    )
    .sample(&[("result", "ok")], p.gauges.reloads_ok)
    .sample(&[("result", "rejected")], p.gauges.reloads_rejected);
    render_reload_cost(&mut o, p.gauges);
    o.finish()
}

/// The TFTP server's transfers, bytes, retransmits and waiting requests.
fn render_tftp(o: &mut Exposition, t: &StatsSnapshot) {
    let mut f = o.family(
        TFTP_TRANSFERS,
        Kind::Counter,
        "TFTP read requests, by outcome.",
    );
    for (outcome, v) in [
        ("done", t.done),
        ("failed", t.failed),
        ("busy", t.busy),
        ("refused", t.refused),
    ] {
        f.sample(&[("outcome", outcome)], v);
    }
    o.family(
        TFTP_BYTES,
        Kind::Counter,
        "Payload bytes acknowledged by TFTP clients.",
    )
    .value(t.bytes);
    o.family(
        TFTP_RETRANSMITS,
        Kind::Counter,
        "TFTP packets resent after a timeout.",
    )
    .value(t.retransmits);
    o.family(TFTP_ACTIVE, Kind::Gauge, "TFTP transfers running.")
        .value(t.active);
    o.family(
        TFTP_WAITING,
        Kind::Gauge,
        "TFTP read requests waiting for a transfer slot.",
    )
    .value(t.waiting);
    o.family(
        TFTP_WAITED,
        Kind::Counter,
        "TFTP read requests that waited for a transfer slot.",
    )
    .value(t.waited);
    o.family(
        TFTP_WAIT_EXPIRED,
        Kind::Counter,
        "Waiting TFTP read requests forgotten because the client went silent.",
    )
    .value(t.wait_expired);
}

/// The boot HTTP listener's connections, drops and refused phone-homes.
fn render_http(o: &mut Exposition, h: &limit::StatsSnapshot) {
    o.family(
        HTTP_CONNECTIONS,
        Kind::Counter,
        "Connections the boot HTTP listener accepted.",
    )
    .value(h.accepted);
    o.family(
        HTTP_TRANSFERS,
        Kind::Counter,
        "Boot files and artifacts the boot HTTP listener sent whole (sendfile).",
    )
    .value(h.transfers);
    o.family(
        HTTP_BYTES,
        Kind::Counter,
        "Bytes of boot files and artifacts the boot HTTP listener sent whole.",
    )
    .value(h.bytes);
    o.family(
        HTTP_OPEN,
        Kind::Gauge,
        "Boot HTTP connections being served.",
    )
    .value(h.open);
    o.family(
        HTTP_PARKED,
        Kind::Gauge,
        "Boot HTTP connections parked, request read, until their artifact's turn (pxe_artifact_transfers_waiting), their connection slot given back.",
    )
    .value(h.parked);
    o.family(
        HTTP_AT_LIMIT,
        Kind::Counter,
        "Times every boot HTTP connection slot was taken, so new connections waited in the listen backlog.",
    )
    .value(h.at_limit);
    let mut f = o.family(
        HTTP_DROPPED,
        Kind::Counter,
        "Boot HTTP connections the server closed, by reason.",
    );
    for (reason, v) in [
        ("head_timeout", h.head_timeouts),
        ("write_timeout", h.write_timeouts),
        ("short_body", h.short_bodies),
    ] {
        f.sample(&[("reason", reason)], v);
    }
    o.family(
        HTTP_ACCEPT_ERRORS,
        Kind::Counter,
        "Failed accepts of the boot HTTP listener (EMFILE, ENFILE, ...), each followed by a pause.",
    )
    .value(h.accept_errors);
    o.family(
        HTTP_PHONE_HOME_REJECTED,
        Kind::Counter,
        "Phone-homes from the host's address refused for their token, by reason (mismatch: wrong, or of an earlier boot).",
    )
    .sample(&[("reason", "missing")], h.phone_home_missing)
    .sample(&[("reason", "mismatch")], h.phone_home_mismatch);
}

/// What reloads cost: the duration of the last one and the map writes so far.
fn render_reload_cost(o: &mut Exposition, gauges: &AgentGauges) {
    o.family(
        INVENTORY_RELOAD_SECONDS,
        Kind::Gauge,
        "Duration of the last applied inventory reload, from reading the inventory to the change being in force on the XDP maps (read, compile, sync); 0 before the first.",
    )
    .value(gauges.reload_seconds.map_or(0.0, |d| d.as_secs_f64()));
    o.family(
        XDP_MAP_WRITES,
        Kind::Counter,
        "Element writes and deletes the agent made to the XDP maps to fill the fast path, start-up fill included (not counted for pinned maps an agent adopts).",
    )
    .value(gauges.map_writes);
}

/// The fast path's counters of each interface's program (their sum is
/// `pxe_xdp_packets_total`).
pub fn render_xdp_interfaces(per_interface: &[(&str, Stats)]) -> String {
    let mut o = Exposition::new();
    let mut f = o.family(
        XDP_INTERFACE_PACKETS,
        Kind::Counter,
        "DHCP packets seen by the XDP program of each interface, by outcome (pxe_xdp_packets_total is their sum).",
    );
    for (interface, stats) in per_interface {
        for c in Counter::ALL {
            f.sample(
                &[("interface", interface), ("outcome", c.name())],
                stats.get(c),
            );
        }
    }
    o.finish()
}

/// Inventory hosts by the furthest stage of their current boot.
pub fn render_boot_stages(stages: &[(crate::progress::Stage, usize)]) -> String {
    let mut o = Exposition::new();
    let mut f = o.family(
        BOOT_STAGE_HOSTS,
        Kind::Gauge,
        "Inventory hosts by the furthest stage of their current boot (dhcp, tftp, script, artifacts, booted); hosts not seen since the agent started are not counted.",
    );
    for (stage, n) in stages {
        f.sample(&[("stage", stage.as_str())], n);
    }
    o.finish()
}

/// How many IPv4 addresses the inventory's discovery pools hold, all
/// subnets together: what `pxe_leases` fills.
pub fn render_pool(addresses: u64) -> String {
    let mut o = Exposition::new();
    o.family(
        POOL_ADDRESSES,
        Kind::Gauge,
        "IPv4 addresses in the discovery pools of the inventory in force, all subnets together (pxe_leases counts those leased or declined).",
    )
    .value(addresses);
    o.finish()
}

/// Each interface's turns for artifact downloads (`admission`): running
/// and waiting, turns given, and how long they waited.
pub fn render_admission(per_interface: &[(String, Snapshot)]) -> String {
    let mut o = Exposition::new();
    for (name, kind, help, of) in [
        (
            ARTIFACT_TRANSFERS_RUNNING,
            Kind::Gauge,
            "Artifact downloads being sent in a turn, per interface.",
            (|s: &Snapshot| s.running as u64) as fn(&Snapshot) -> u64,
        ),
        (
            ARTIFACT_TRANSFERS_WAITING,
            Kind::Gauge,
            "Artifact downloads waiting for a turn (--artifact-transfers), connection open, per interface.",
            |s| s.waiting as u64,
        ),
        (
            ARTIFACT_TURNS,
            Kind::Counter,
            "Turns given to artifact downloads, per interface.",
            |s| s.turns,
        ),
        (
            ARTIFACT_TURNS_WAITED,
            Kind::Counter,
            "Turns that had to wait (all taken, or others waiting), per interface.",
            |s| s.waited,
        ),
    ] {
        let mut f = o.family(name, kind, help);
        for (iface, snap) in per_interface {
            f.sample(&[("interface", iface.as_str())], of(snap));
        }
    }
    let labels: Vec<[(&str, &str); 1]> = per_interface
        .iter()
        .map(|(iface, _)| [("interface", iface.as_str())])
        .collect();
    let waits: Vec<(&[(&str, &str)], &HistogramSnapshot)> = labels
        .iter()
        .zip(per_interface)
        .map(|(l, (_, s))| (&l[..], &s.wait))
        .collect();
    o.histogram(
        ARTIFACT_WAIT_SECONDS,
        "Time artifact downloads waited for their turn (0 when one was free), per interface.",
        &waits,
    );
    o.finish()
}

/// How the discovery pools are shared: this agent's slot, the live slots
/// and the RFC 3074 buckets this agent answers (256 alone, 0 while its
/// own slot is not live).
pub fn render_share(share: &Share) -> String {
    let mut o = Exposition::new();
    // -1 while no slot is claimed.
    o.family(
        SHARE_SLOT,
        Kind::Gauge,
        "This agent's pool slot, and how many slots the pools are cut into.",
    )
    .sample(
        &[("slots", &share.slots().to_string())],
        share.slot().map_or(-1, i32::from),
    );
    o.family(SHARE_LIVE, Kind::Gauge, "Pool slots whose agents are live.")
        .value(share.live().len());
    o.family(
        SHARE_BUCKETS,
        Kind::Gauge,
        "Hash buckets of unknown MACs (of 256) this agent answers.",
    )
    .value(share.buckets_owned());
    o.finish()
}

/// The hosts' records shared with peer agents: writes by result, peers'
/// records taken by kind, and how many managed hosts this agent owns.
pub fn render_host_records(s: &crate::state::HostRecordStats, owned: usize) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let mut o = Exposition::new();
    let mut f = o.family(
        SHARE_RECORD_WRITES,
        Kind::Counter,
        "Writes of this agent's changes to the hosts' shared records (Leases), by result.",
    );
    for (result, n) in [
        ("ok", &s.writes_ok),
        ("conflict", &s.write_conflicts),
        ("failed", &s.writes_failed),
    ] {
        f.sample(&[("result", result)], n.load(Relaxed));
    }
    let mut f = o.family(
        SHARE_RECORDS_TAKEN,
        Kind::Counter,
        "Peers' records this agent received: netboot records it took, recovery records of hosts it does not own (taken unless it acts on the host), boot steps it took.",
    );
    for (kind, n) in [
        ("netboot", &s.taken_netboot),
        ("recovery", &s.taken_recovery),
        ("step", &s.taken_steps),
    ] {
        f.sample(&[("kind", kind)], n.load(Relaxed));
    }
    o.family(
        SHARE_OWNED,
        Kind::Gauge,
        "Hosts with a BMC whose recovery this agent owns (all of them without peers).",
    )
    .value(owned);
    o.finish()
}

/// Another DHCP server answering hosts whose state this agent keeps, while
/// agents share nothing ([`crate::other_server`]).
pub fn render_other_servers(o: &crate::other_server::OtherServers) -> String {
    let mut out = Exposition::new();
    out.family(
        OTHER_SERVER_REQUESTS,
        Kind::Counter,
        "DHCPREQUESTs naming another server for hosts with netboot once or a BMC, without --peers (that server shares neither state).",
    )
    .value(o.requests());
    out.family(
        OTHER_SERVER_HOSTS,
        Kind::Gauge,
        "Hosts with netboot once or a BMC that another DHCP server answers, warned about once each.",
    )
    .value(o.hosts());
    out.finish()
}

/// The API gate's refusals by reason (`missing`, `invalid`, `forbidden`,
/// `throttled`, ...): never the caller or its address.
pub fn render_api_auth(refused: &[(&str, u64)]) -> String {
    let mut o = Exposition::new();
    let mut f = o.family(
        API_REFUSED,
        Kind::Counter,
        "JSON API calls refused before their handler: no or an unknown token, no right to the verb, too many failures from the address, no way to identify callers.",
    );
    for (reason, n) in refused {
        f.sample(&[("reason", reason)], n);
    }
    o.finish()
}

/// How the fast path's program is attached to each served interface: one
/// series per interface and mode, 1 for the mode it runs in (`none` when
/// it is not attached), as the health check last found.
pub fn render_xdp_attach(modes: &[(String, &str)]) -> String {
    let mut o = Exposition::new();
    let mut f = o.family(
        XDP_ATTACH_MODE,
        Kind::Gauge,
        "1 for the mode the XDP program runs in on the interface (native, generic, offload), or none when it is not attached.",
    );
    for (iface, mode) in modes {
        for m in ["native", "generic", "offload", "none"] {
            f.sample(&[("interface", iface), ("mode", m)], u64::from(*mode == m));
        }
    }
    o.finish()
}

/// The API's TLS: certificate reloads by result (`ok`, `error`), failed
/// handshakes by reason (`error`, `timeout`) and when the certificate
/// served expires.
pub fn render_api_tls(
    reloads: [(&str, u64); 2],
    failures: [(&str, u64); 2],
    not_after: i64,
) -> String {
    let mut o = Exposition::new();
    let mut f = o.family(
        API_TLS_RELOADS,
        Kind::Counter,
        "Changes of the API's certificate files: put in force (ok) or refused, the previous certificate serving on (error).",
    );
    for (result, n) in reloads {
        f.sample(&[("result", result)], n);
    }
    let mut f = o.family(
        API_TLS_HANDSHAKE_FAILURES,
        Kind::Counter,
        "TLS handshakes on the API listener that failed or did not finish in time.",
    );
    for (reason, n) in failures {
        f.sample(&[("reason", reason)], n);
    }
    o.family(
        API_TLS_NOT_AFTER,
        Kind::Gauge,
        "When the API's serving certificate expires (notAfter), in unix seconds.",
    )
    .value(not_after);
    o.finish()
}

/// The netboot counters: state changes by kind, boot files refused by
/// route, and how many `once` hosts are done now.
pub fn render_netboot(c: &crate::netboot::Counters, done: usize) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let mut o = Exposition::new();
    let mut f = o.family(
        NETBOOT_CHANGES,
        Kind::Counter,
        "Netboot state changes: provisioning done (by phone-home or operator), armed again.",
    );
    for (to, by, n) in [
        ("done", "phone-home", &c.done_phone_home),
        ("done", "operator", &c.done_operator),
        ("armed", "operator", &c.armed),
        // Taken from a peer agent's record (`--peers kube`).
        ("done", "peer", &c.adopted_done),
        ("armed", "peer", &c.adopted_armed),
    ] {
        f.sample(&[("to", to), ("by", by)], n.load(Relaxed));
    }
    let mut f = o.family(
        NETBOOT_REFUSED,
        Kind::Counter,
        "Boot files refused to hosts netboot gives none now, by route (script: an exit script served).",
    );
    for (route, n) in [
        ("tftp", &c.refused_tftp),
        ("http", &c.refused_http),
        ("script", &c.exit_scripts),
    ] {
        f.sample(&[("route", route)], n.load(Relaxed));
    }
    o.family(
        NETBOOT_DONE,
        Kind::Gauge,
        "Hosts whose provisioning is recorded as done.",
    )
    .value(done);
    o.finish()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn reload_cost_is_rendered_as_a_gauge_and_a_counter() {
        let mut o = Exposition::new();
        render_reload_cost(&mut o, &AgentGauges::default());
        let text = o.finish();
        assert!(
            text.contains("\npxe_inventory_reload_seconds 0\n"),
            "{}",
            text
        );
        assert!(text.contains("\npxe_xdp_map_writes_total 0\n"), "{}", text);
        let gauges = AgentGauges {
            map_writes: 12,
            reload_seconds: Some(Duration::from_millis(1500)),
            ..AgentGauges::default()
        };
        let mut o = Exposition::new();
        render_reload_cost(&mut o, &gauges);
        let text = o.finish();
        assert!(
            text.contains("# TYPE pxe_inventory_reload_seconds gauge\n"),
            "{}",
            text
        );
        assert!(
            text.contains("# TYPE pxe_xdp_map_writes_total counter\n"),
            "{}",
            text
        );
        assert!(
            text.contains("\npxe_inventory_reload_seconds 1.5\n"),
            "{}",
            text
        );
        assert!(text.contains("\npxe_xdp_map_writes_total 12\n"), "{}", text);
    }

    #[test]
    fn each_interface_has_its_own_fast_path_counters() {
        let mut eth1 = Stats::default();
        eth1.0[Counter::TxAck as usize] = 5;
        let page = render_xdp_interfaces(&[("eth1", eth1), ("eth2", Stats::default())]);
        for line in [
            "# TYPE pxe_xdp_interface_packets_total counter\n",
            "pxe_xdp_interface_packets_total{interface=\"eth1\",outcome=\"tx_ack\"} 5\n",
            "pxe_xdp_interface_packets_total{interface=\"eth2\",outcome=\"tx_ack\"} 0\n",
        ] {
            assert!(page.contains(line), "{line:?} in {page}");
        }
    }

    #[test]
    fn the_pool_size_is_a_gauge() {
        assert_eq!(
            render_pool(254),
            "# HELP pxe_pool_addresses IPv4 addresses in the discovery pools of the inventory in force, all subnets together (pxe_leases counts those leased or declined).\n\
             # TYPE pxe_pool_addresses gauge\n\
             pxe_pool_addresses 254\n"
        );
    }

    #[test]
    fn other_servers_are_a_counter_and_a_gauge() {
        let page = render_other_servers(&crate::other_server::OtherServers::default());
        for line in [
            "# TYPE pxe_dhcp_other_server_requests_total counter\n",
            "\npxe_dhcp_other_server_requests_total 0\n",
            "# TYPE pxe_dhcp_other_server_hosts gauge\n",
            "\npxe_dhcp_other_server_hosts 0\n",
        ] {
            assert!(page.contains(line), "{line:?} in {page}");
        }
    }
}

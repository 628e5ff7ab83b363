//! Metric names and their Prometheus text rendering; one place for both.

use std::{fmt::Write as _, sync::atomic::Ordering};

use pxe_ebpf_common::Counter;

use crate::{
    dhcp::server, http::limit, lease::LeaseState, share::Share, tftp::StatsSnapshot, xdp::Stats,
};

/// What the agent exports besides the counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct AgentGauges {
    pub hosts: usize,
    pub templates: usize,
    pub reloads_ok: u64,
    pub reloads_rejected: u64,
    /// Element writes and deletes made to the XDP maps, start-up fill
    /// included: what a reload costs the kernel side.
    pub map_writes: u64,
    /// Duration of the last applied reload, from the start of reading the
    /// inventory to its change being in force on the maps; `None` before
    /// the first.
    pub reload_seconds: Option<std::time::Duration>,
}

pub const XDP_PACKETS: &str = "pxe_xdp_packets_total";
pub const SLOW_REPLIES: &str = "pxe_slow_replies_total";
pub const SLOW_IGNORED: &str = "pxe_slow_ignored_total";
pub const SLOW_LIMITED: &str = "pxe_slow_ratelimited_total";
pub const SLOW_ERRORS: &str = "pxe_slow_errors_total";
pub const SLOW_DECLINES_REFUSED: &str = "pxe_slow_declines_refused_total";
pub const RESERVATION_DECLINES: &str = "pxe_reservation_declines_total";
pub const SLOW_RX: &str = "pxe_slow_requests_total";
pub const SLOW_RESTARTS: &str = "pxe_slow_path_restarts_total";
pub const SLOW_NOT_OURS: &str = "pxe_slow_not_ours_total";
pub const OTHER_SERVER_REQUESTS: &str = "pxe_dhcp_other_server_requests_total";
pub const OTHER_SERVER_HOSTS: &str = "pxe_dhcp_other_server_hosts";
pub const SHARE_SLOT: &str = "pxe_share_slot";
pub const SHARE_LIVE: &str = "pxe_share_live_slots";
pub const SHARE_BUCKETS: &str = "pxe_share_buckets";
pub const SHARE_RECORD_WRITES: &str = "pxe_share_host_record_writes_total";
pub const SHARE_RECORDS_TAKEN: &str = "pxe_share_host_records_taken_total";
pub const SHARE_OWNED: &str = "pxe_share_owned_hosts";
pub const READY: &str = "pxe_ready";
pub const NETBOOT_CHANGES: &str = "pxe_netboot_changes_total";
pub const NETBOOT_REFUSED: &str = "pxe_netboot_refused_total";
pub const NETBOOT_DONE: &str = "pxe_netboot_done_hosts";
pub const DISCOVERED: &str = "pxe_discovered_hosts";
pub const TRACED: &str = "pxe_traced_macs";
pub const XDP_EVENTS_LOST: &str = "pxe_xdp_events_lost_total";
pub const LEASES: &str = "pxe_leases";
pub const TFTP_TRANSFERS: &str = "pxe_tftp_transfers_total";
pub const TFTP_BYTES: &str = "pxe_tftp_bytes_total";
pub const TFTP_RETRANSMITS: &str = "pxe_tftp_retransmits_total";
pub const TFTP_ACTIVE: &str = "pxe_tftp_active_transfers";
pub const TFTP_WAITING: &str = "pxe_tftp_waiting_requests";
pub const TFTP_WAITED: &str = "pxe_tftp_waited_requests_total";
pub const TFTP_WAIT_EXPIRED: &str = "pxe_tftp_wait_expired_total";
pub const INVENTORY_HOSTS: &str = "pxe_inventory_hosts";
pub const INVENTORY_TEMPLATES: &str = "pxe_inventory_templates";
pub const INVENTORY_RELOADS: &str = "pxe_inventory_reloads_total";
pub const INVENTORY_RELOAD_SECONDS: &str = "pxe_inventory_reload_seconds";
pub const XDP_MAP_WRITES: &str = "pxe_xdp_map_writes_total";
pub const HTTP_CONNECTIONS: &str = "pxe_http_connections_total";
pub const HTTP_OPEN: &str = "pxe_http_open_connections";
pub const HTTP_AT_LIMIT: &str = "pxe_http_at_limit_total";
pub const HTTP_DROPPED: &str = "pxe_http_dropped_total";
pub const HTTP_ACCEPT_ERRORS: &str = "pxe_http_accept_errors_total";
pub const HTTP_PHONE_HOME_REJECTED: &str = "pxe_http_phone_home_rejected_total";
pub const API_REFUSED: &str = "pxe_api_auth_failures_total";
pub const API_TLS_RELOADS: &str = "pxe_api_tls_reloads_total";
pub const API_TLS_HANDSHAKE_FAILURES: &str = "pxe_api_tls_handshake_failures_total";
pub const API_TLS_NOT_AFTER: &str = "pxe_api_tls_cert_not_after_seconds";

/// Everything one scrape shows.
pub struct Page<'a> {
    pub fast: &'a Stats,
    pub gauges: &'a AgentGauges,
    pub slow: &'a server::Stats,
    pub health: &'a crate::health::Health,
    pub discovered: usize,
    /// MACs `pxe-agent trace` watches now.
    pub traced: usize,
    /// Fast-path answers the boot-progress view missed.
    pub xdp_events_lost: u64,
    /// Pool leases by state, from the lease store's index.
    pub leases: &'a [(LeaseState, usize)],
    /// Counters of the TFTP server, when it runs.
    pub tftp: Option<StatsSnapshot>,
    /// Counters of the boot HTTP listener.
    pub http: limit::StatsSnapshot,
}

struct Out(String);

impl Out {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &str, value: impl std::fmt::Display) {
        if labels.is_empty() {
            let _ = writeln!(self.0, "{name} {value}");
        } else {
            let _ = writeln!(self.0, "{name}{{{labels}}} {value}");
        }
    }
}

/// Renders the metrics page (text exposition format 0.0.4).
pub fn render(p: &Page) -> String {
    let mut o = Out(String::new());
    o.head(
        XDP_PACKETS,
        "counter",
        "DHCP packets seen by the XDP fast path, by outcome.",
    );
    for c in Counter::ALL {
        o.sample(
            XDP_PACKETS,
            &format!("outcome=\"{}\"", c.name()),
            p.fast.get(c),
        );
    }
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    o.head(SLOW_RX, "counter", "Requests the userspace slow path read.");
    o.sample(SLOW_RX, "", load(&p.slow.rx));
    o.head(
        SLOW_REPLIES,
        "counter",
        "Replies sent by the slow path, by message type.",
    );
    for (kind, c) in [
        ("offer", &p.slow.offers),
        ("ack", &p.slow.acks),
        ("nak", &p.slow.naks),
        ("proxy_offer", &p.slow.proxy_offers),
        ("proxy_ack", &p.slow.proxy_acks),
    ] {
        o.sample(SLOW_REPLIES, &format!("type=\"{kind}\""), load(c));
    }
    o.head(
        SLOW_IGNORED,
        "counter",
        "Requests the slow path did not answer, by reason.",
    );
    for c in Counter::ALL
        .iter()
        .filter(|c| load(&p.slow.ignored[**c as usize]) > 0)
    {
        o.sample(
            SLOW_IGNORED,
            &format!("reason=\"{}\"", c.name()),
            load(&p.slow.ignored[*c as usize]),
        );
    }
    o.head(
        SLOW_LIMITED,
        "counter",
        "Requests dropped by the storm guard, by bucket.",
    );
    for (scope, c) in [
        ("mac", &p.slow.limited_mac),
        ("unknown", &p.slow.limited_unknown),
        ("table", &p.slow.limited_table),
    ] {
        o.sample(SLOW_LIMITED, &format!("scope=\"{scope}\""), load(c));
    }
    o.head(
        SLOW_NOT_OURS,
        "counter",
        "Requests of unknown hosts left to a peer agent sharing the discovery pool.",
    );
    o.sample(SLOW_NOT_OURS, "", load(&p.slow.not_ours));
    o.head(SLOW_ERRORS, "counter", "Slow-path failures, by kind.");
    for (kind, c) in [
        ("malformed", &p.slow.malformed),
        ("pool_exhausted", &p.slow.pool_exhausted),
        ("lease_store", &p.slow.lease_errors),
        ("send", &p.slow.send_errors),
        ("panic", &p.slow.panics),
    ] {
        o.sample(SLOW_ERRORS, &format!("kind=\"{kind}\""), load(c));
    }
    o.head(
        SLOW_DECLINES_REFUSED,
        "counter",
        "DHCPDECLINEs of pool addresses not acted on, by reason: the address was not given to that MAC, or quarantining it would pass the MAC's or the pool's limit.",
    );
    for (reason, c) in [
        ("not_given", &p.slow.declines_not_given),
        ("mac_limit", &p.slow.declines_mac_limit),
        ("pool_limit", &p.slow.declines_pool_limit),
    ] {
        o.sample(
            SLOW_DECLINES_REFUSED,
            &format!("reason=\"{reason}\""),
            load(c),
        );
    }
    o.head(
        RESERVATION_DECLINES,
        "counter",
        "DHCPDECLINEs of a reserved address by its own host: another machine uses it (`pxe-agent hosts` names the host).",
    );
    o.sample(RESERVATION_DECLINES, "", load(&p.slow.reservation_declines));
    o.head(
        SLOW_RESTARTS,
        "counter",
        "Times the slow path was started again after it died.",
    );
    o.sample(SLOW_RESTARTS, "", load(&p.health.slow_path_restarts));
    o.head(READY, "gauge", "1 while /healthz answers 200.");
    o.sample(READY, "", u8::from(p.health.check().is_empty()));
    o.head(
        DISCOVERED,
        "gauge",
        "Unknown clients recorded for adoption.",
    );
    o.sample(DISCOVERED, "", p.discovered);
    o.head(
        TRACED,
        "gauge",
        "MACs traced live (each costs the XDP program a map lookup per request).",
    );
    o.sample(TRACED, "", p.traced);
    o.head(
        XDP_EVENTS_LOST,
        "counter",
        "Fast-path answers whose events were overwritten before the agent read them \
         (the boot-progress view does not show them).",
    );
    o.sample(XDP_EVENTS_LOST, "", p.xdp_events_lost);
    o.head(LEASES, "gauge", "Pool leases, by state.");
    for (name, state) in [
        ("bound", LeaseState::Bound),
        ("declined", LeaseState::Declined),
    ] {
        o.sample(
            LEASES,
            &format!("state=\"{name}\""),
            p.leases
                .iter()
                .find(|(s, _)| *s == state)
                .map_or(0, |(_, n)| *n),
        );
    }
    if let Some(t) = p.tftp {
        o.head(TFTP_TRANSFERS, "counter", "TFTP read requests, by outcome.");
        for (outcome, v) in [
            ("done", t.done),
            ("failed", t.failed),
            ("busy", t.busy),
            ("refused", t.refused),
        ] {
            o.sample(TFTP_TRANSFERS, &format!("outcome=\"{outcome}\""), v);
        }
        o.head(
            TFTP_BYTES,
            "counter",
            "Payload bytes acknowledged by TFTP clients.",
        );
        o.sample(TFTP_BYTES, "", t.bytes);
        o.head(
            TFTP_RETRANSMITS,
            "counter",
            "TFTP packets resent after a timeout.",
        );
        o.sample(TFTP_RETRANSMITS, "", t.retransmits);
        o.head(TFTP_ACTIVE, "gauge", "TFTP transfers running.");
        o.sample(TFTP_ACTIVE, "", t.active);
        o.head(
            TFTP_WAITING,
            "gauge",
            "TFTP read requests waiting for a transfer slot.",
        );
        o.sample(TFTP_WAITING, "", t.waiting);
        o.head(
            TFTP_WAITED,
            "counter",
            "TFTP read requests that waited for a transfer slot.",
        );
        o.sample(TFTP_WAITED, "", t.waited);
        o.head(
            TFTP_WAIT_EXPIRED,
            "counter",
            "Waiting TFTP read requests forgotten because the client went silent.",
        );
        o.sample(TFTP_WAIT_EXPIRED, "", t.wait_expired);
    }
    let h = &p.http;
    o.head(
        HTTP_CONNECTIONS,
        "counter",
        "Connections the boot HTTP listener accepted.",
    );
    o.sample(HTTP_CONNECTIONS, "", h.accepted);
    o.head(HTTP_OPEN, "gauge", "Boot HTTP connections being served.");
    o.sample(HTTP_OPEN, "", h.open);
    o.head(
        HTTP_AT_LIMIT,
        "counter",
        "Times every boot HTTP connection slot was taken, so new connections waited in the listen backlog.",
    );
    o.sample(HTTP_AT_LIMIT, "", h.at_limit);
    o.head(
        HTTP_DROPPED,
        "counter",
        "Boot HTTP connections the server closed, by reason.",
    );
    for (reason, v) in [
        ("head_timeout", h.head_timeouts),
        ("write_timeout", h.write_timeouts),
        ("short_body", h.short_bodies),
    ] {
        o.sample(HTTP_DROPPED, &format!("reason=\"{reason}\""), v);
    }
    o.head(
        HTTP_ACCEPT_ERRORS,
        "counter",
        "Failed accepts of the boot HTTP listener (EMFILE, ENFILE, ...), each followed by a pause.",
    );
    o.sample(HTTP_ACCEPT_ERRORS, "", h.accept_errors);
    o.head(
        HTTP_PHONE_HOME_REJECTED,
        "counter",
        "Phone-homes from the host's address refused for their token, by reason (mismatch: wrong, or of an earlier boot).",
    );
    for (reason, v) in [
        ("missing", h.phone_home_missing),
        ("mismatch", h.phone_home_mismatch),
    ] {
        o.sample(HTTP_PHONE_HOME_REJECTED, &format!("reason=\"{reason}\""), v);
    }
    o.head(INVENTORY_HOSTS, "gauge", "Hosts in the serving inventory.");
    o.sample(INVENTORY_HOSTS, "", p.gauges.hosts);
    o.head(
        INVENTORY_TEMPLATES,
        "gauge",
        "Compiled replies (host x boot class) in the XDP map.",
    );
    o.sample(INVENTORY_TEMPLATES, "", p.gauges.templates);
    o.head(
        INVENTORY_RELOADS,
        "counter",
        "Inventory reloads, applied or rejected.",
    );
    o.sample(INVENTORY_RELOADS, "result=\"ok\"", p.gauges.reloads_ok);
    o.sample(
        INVENTORY_RELOADS,
        "result=\"rejected\"",
        p.gauges.reloads_rejected,
    );
    render_reload_cost(&mut o, p.gauges);
    o.0
}

/// What reloads cost: the duration of the last one and the map writes so far.
fn render_reload_cost(o: &mut Out, gauges: &AgentGauges) {
    o.head(
        INVENTORY_RELOAD_SECONDS,
        "gauge",
        "Duration of the last applied inventory reload, from reading the inventory to the change being in force on the XDP maps (read, compile, sync); 0 before the first.",
    );
    o.sample(
        INVENTORY_RELOAD_SECONDS,
        "",
        gauges.reload_seconds.map_or(0.0, |d| d.as_secs_f64()),
    );
    o.head(
        XDP_MAP_WRITES,
        "counter",
        "Element writes and deletes the agent made to the XDP maps to fill the fast path, start-up fill included (not counted for pinned maps an agent adopts).",
    );
    o.sample(XDP_MAP_WRITES, "", gauges.map_writes);
}

/// How the discovery pools are shared: this agent's slot, the live slots
/// and the RFC 3074 buckets this agent answers (256 alone, 0 while its
/// own slot is not live).
pub fn render_share(share: &Share) -> String {
    let mut o = Out(String::new());
    o.head(
        SHARE_SLOT,
        "gauge",
        "This agent's pool slot, and how many slots the pools are cut into.",
    );
    // -1 while no slot is claimed.
    o.sample(
        SHARE_SLOT,
        &format!("slots=\"{}\"", share.slots()),
        share.slot().map_or(-1, i32::from),
    );
    o.head(SHARE_LIVE, "gauge", "Pool slots whose agents are live.");
    o.sample(SHARE_LIVE, "", share.live().len());
    o.head(
        SHARE_BUCKETS,
        "gauge",
        "Hash buckets of unknown MACs (of 256) this agent answers.",
    );
    o.sample(SHARE_BUCKETS, "", share.buckets_owned());
    o.0
}

/// The hosts' records shared with peer agents: writes by result, peers'
/// records taken by kind, and how many managed hosts this agent owns.
pub fn render_host_records(s: &crate::share::host_records::Stats, owned: usize) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let mut o = Out(String::new());
    o.head(
        SHARE_RECORD_WRITES,
        "counter",
        "Writes of this agent's changes to the hosts' shared records (Leases), by result.",
    );
    for (result, n) in [
        ("ok", &s.writes_ok),
        ("conflict", &s.write_conflicts),
        ("failed", &s.writes_failed),
    ] {
        o.sample(
            SHARE_RECORD_WRITES,
            &format!("result=\"{result}\""),
            n.load(Relaxed),
        );
    }
    o.head(
        SHARE_RECORDS_TAKEN,
        "counter",
        "Peers' records this agent received: netboot records it took, recovery records of hosts it does not own (taken unless it acts on the host), boot steps it took.",
    );
    for (kind, n) in [
        ("netboot", &s.taken_netboot),
        ("recovery", &s.taken_recovery),
        ("step", &s.taken_steps),
    ] {
        o.sample(
            SHARE_RECORDS_TAKEN,
            &format!("kind=\"{kind}\""),
            n.load(Relaxed),
        );
    }
    o.head(
        SHARE_OWNED,
        "gauge",
        "Hosts with a BMC whose recovery this agent owns (all of them without peers).",
    );
    o.sample(SHARE_OWNED, "", owned);
    o.0
}

/// Another DHCP server answering hosts whose state this agent keeps, while
/// agents share nothing ([`crate::other_server`]).
pub fn render_other_servers(o: &crate::other_server::OtherServers) -> String {
    let mut out = Out(String::new());
    out.head(
        OTHER_SERVER_REQUESTS,
        "counter",
        "DHCPREQUESTs naming another server for hosts with netboot once or a BMC, without --peers (that server shares neither state).",
    );
    out.sample(OTHER_SERVER_REQUESTS, "", o.requests());
    out.head(
        OTHER_SERVER_HOSTS,
        "gauge",
        "Hosts with netboot once or a BMC that another DHCP server answers, warned about once each.",
    );
    out.sample(OTHER_SERVER_HOSTS, "", o.hosts());
    out.0
}

/// The API gate's refusals by reason (`missing`, `invalid`, `forbidden`,
/// `throttled`, ...): never the caller or its address.
pub fn render_api_auth(refused: &[(&str, u64)]) -> String {
    let mut o = Out(String::new());
    o.head(
        API_REFUSED,
        "counter",
        "JSON API calls refused before their handler: no or an unknown token, no right to the verb, too many failures from the address, no way to identify callers.",
    );
    for (reason, n) in refused {
        o.sample(API_REFUSED, &format!("reason=\"{reason}\""), n);
    }
    o.0
}

/// The API's TLS: certificate reloads by result (`ok`, `error`), failed
/// handshakes by reason (`error`, `timeout`) and when the certificate
/// served expires.
pub fn render_api_tls(
    reloads: [(&str, u64); 2],
    failures: [(&str, u64); 2],
    not_after: i64,
) -> String {
    let mut o = Out(String::new());
    o.head(
        API_TLS_RELOADS,
        "counter",
        "Changes of the API's certificate files: put in force (ok) or refused, the previous certificate serving on (error).",
    );
    for (result, n) in reloads {
        o.sample(API_TLS_RELOADS, &format!("result=\"{result}\""), n);
    }
    o.head(
        API_TLS_HANDSHAKE_FAILURES,
        "counter",
        "TLS handshakes on the API listener that failed or did not finish in time.",
    );
    for (reason, n) in failures {
        o.sample(
            API_TLS_HANDSHAKE_FAILURES,
            &format!("reason=\"{reason}\""),
            n,
        );
    }
    o.head(
        API_TLS_NOT_AFTER,
        "gauge",
        "When the API's serving certificate expires (notAfter), in unix seconds.",
    );
    o.sample(API_TLS_NOT_AFTER, "", not_after);
    o.0
}

/// The netboot counters: state changes by kind, boot files refused by
/// route, and how many `once` hosts are done now.
pub fn render_netboot(c: &crate::netboot::Counters, done: usize) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let mut o = Out(String::new());
    o.head(
        NETBOOT_CHANGES,
        "counter",
        "Netboot state changes: provisioning done (by phone-home or operator), armed again.",
    );
    o.sample(
        NETBOOT_CHANGES,
        "to=\"done\",by=\"phone-home\"",
        c.done_phone_home.load(Relaxed),
    );
    o.sample(
        NETBOOT_CHANGES,
        "to=\"done\",by=\"operator\"",
        c.done_operator.load(Relaxed),
    );
    o.sample(
        NETBOOT_CHANGES,
        "to=\"armed\",by=\"operator\"",
        c.armed.load(Relaxed),
    );
    // Taken from a peer agent's record (`--peers kube`).
    o.sample(
        NETBOOT_CHANGES,
        "to=\"done\",by=\"peer\"",
        c.adopted_done.load(Relaxed),
    );
    o.sample(
        NETBOOT_CHANGES,
        "to=\"armed\",by=\"peer\"",
        c.adopted_armed.load(Relaxed),
    );
    o.head(
        NETBOOT_REFUSED,
        "counter",
        "Boot files refused to hosts netboot gives none now, by route (script: an exit script served).",
    );
    o.sample(
        NETBOOT_REFUSED,
        "route=\"tftp\"",
        c.refused_tftp.load(Relaxed),
    );
    o.sample(
        NETBOOT_REFUSED,
        "route=\"http\"",
        c.refused_http.load(Relaxed),
    );
    o.sample(
        NETBOOT_REFUSED,
        "route=\"script\"",
        c.exit_scripts.load(Relaxed),
    );
    o.head(
        NETBOOT_DONE,
        "gauge",
        "Hosts whose provisioning is recorded as done.",
    );
    o.sample(NETBOOT_DONE, "", done);
    o.0
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn reload_cost_is_rendered_as_a_gauge_and_a_counter() {
        let mut o = Out(String::new());
        render_reload_cost(&mut o, &AgentGauges::default());
        assert!(
            o.0.contains("\npxe_inventory_reload_seconds 0\n"),
            "{}",
            o.0
        );
        assert!(o.0.contains("\npxe_xdp_map_writes_total 0\n"), "{}", o.0);
        let gauges = AgentGauges {
            map_writes: 12,
            reload_seconds: Some(Duration::from_millis(1500)),
            ..AgentGauges::default()
        };
        let mut o = Out(String::new());
        render_reload_cost(&mut o, &gauges);
        assert!(
            o.0.contains("# TYPE pxe_inventory_reload_seconds gauge\n"),
            "{}",
            o.0
        );
        assert!(
            o.0.contains("# TYPE pxe_xdp_map_writes_total counter\n"),
            "{}",
            o.0
        );
        assert!(
            o.0.contains("\npxe_inventory_reload_seconds 1.5\n"),
            "{}",
            o.0
        );
        assert!(o.0.contains("\npxe_xdp_map_writes_total 12\n"), "{}", o.0);
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

#[cfg(test)]
mod golden;

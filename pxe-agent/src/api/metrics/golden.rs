//! The `/metrics` sections byte for byte, from fixed counters: dashboards
//! and the end-to-end tests read these names, labels and this text format,
//! so a change to how the page is written must not change a byte of it.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use super::*;

use crate::{health::Health, kube::KubeStats};

/// Gives each counter of `counters` its own value, 1, 2, 3...
fn number(counters: &[&AtomicU64]) {
    for (n, c) in (1..).zip(counters) {
        c.store(n, Ordering::Relaxed);
    }
}

#[test]
fn the_page_is_written_as_before() {
    let fast = Stats(std::array::from_fn(|i| 100 + i as u64));
    let gauges = AgentGauges {
        hosts: 3,
        templates: 7,
        reloads_ok: 5,
        reloads_rejected: 1,
        map_writes: 42,
        reload_seconds: Some(Duration::from_millis(250)),
    };
    let slow = crate::state::SlowPathStats::default();
    let s = &slow;
    number(&[
        &s.rx,
        &s.offers,
        &s.acks,
        &s.naks,
        &s.proxy_offers,
        &s.proxy_acks,
        &s.limited_mac,
        &s.limited_unknown,
        &s.limited_table,
        &s.malformed,
        &s.pool_exhausted,
        &s.lease_errors,
        &s.declines_not_given,
        &s.declines_mac_limit,
        &s.declines_pool_limit,
        &s.reservation_declines,
        &s.send_errors,
        &s.panics,
        &s.not_ours,
    ]);
    // Only the reasons seen are listed.
    s.ignored[Counter::PassUnknownHost as usize].store(9, Ordering::Relaxed);
    s.reply_seconds.observe(Duration::from_millis(3));
    let slow6 = crate::state::Dhcp6Stats::default();
    let s6 = &slow6;
    number(&[
        &s6.rx,
        &s6.advertises,
        &s6.replies,
        &s6.malformed,
        &s6.reservation_declines,
        &s6.send_errors,
        &s6.panics,
        &s6.pool_exhausted,
        &s6.lease_errors,
        &s6.not_ours,
        &s6.declines_not_given,
        &s6.declines_mac_limit,
        &s6.declines_pool_limit,
        &s6.limited_mac,
        &s6.limited_unknown,
        &s6.limited_table,
    ]);
    s6.ignored[Counter::DropOtherServer as usize].store(8, Ordering::Relaxed);
    let health = Health::default();
    health.slow_path_restarts.store(2, Ordering::Relaxed);
    health.set_xdp_modes(vec![("eth1".into(), "native"), ("eth2".into(), "none")]);
    health.set_xdp(Err("no XDP program attached to eth2".into()));
    let tftp = StatsSnapshot {
        requests: 1,
        done: 2,
        failed: 3,
        busy: 4,
        waited: 5,
        wait_expired: 6,
        waiting: 7,
        refused: 8,
        duplicates: 9,
        bytes: 10,
        retransmits: 11,
        send_errors: 12,
        events_dropped: 13,
        active: 14,
    };
    let http = limit::StatsSnapshot {
        accepted: 21,
        open: 22,
        parked: 32,
        at_limit: 23,
        head_timeouts: 24,
        write_timeouts: 25,
        short_bodies: 26,
        accept_errors: 27,
        phone_home_missing: 28,
        phone_home_mismatch: 29,
        transfers: 30,
        bytes: 31,
    };
    let page = |tftp| {
        render(&Page {
            fast: &fast,
            gauges: &gauges,
            slow: &slow,
            slow6: &slow6,
            health: &health,
            discovered: 31,
            traced: 32,
            xdp_events_lost: 33,
            leases: &[(LeaseState::Declined, 34), (LeaseState::Bound, 35)],
            leases6: &[(LeaseState::Bound, 36)],
            tftp,
            http,
        })
    };
    assert_eq!(page(Some(tftp)), PAGE);
    assert_eq!(page(None), PAGE.replace(PAGE_TFTP, ""));
}

#[test]
fn the_share_sections_are_written_as_before() {
    let share = Share::new(1, 4).expect("share").with_live([0, 1, 3]);
    assert_eq!(render_share(&share), SHARE);
    let records = crate::state::HostRecordStats::default();
    let r = &records;
    number(&[
        &r.writes_ok,
        &r.write_conflicts,
        &r.writes_failed,
        &r.taken_netboot,
        &r.taken_recovery,
        &r.taken_steps,
    ]);
    assert_eq!(render_host_records(&records, 7), HOST_RECORDS);
    assert_eq!(
        render_other_servers(&crate::other_server::OtherServers::default()),
        OTHER_SERVERS
    );
}

#[test]
fn the_api_and_netboot_sections_are_written_as_before() {
    assert_eq!(
        render_api_auth(&[("missing", 3), ("invalid", 0), ("throttled", 1)]),
        API_AUTH
    );
    assert_eq!(
        render_api_tls(
            [("ok", 2), ("error", 1)],
            [("error", 4), ("timeout", 5)],
            1_767_225_600
        ),
        API_TLS
    );
    let counters = crate::netboot::Counters::default();
    let c = &counters;
    number(&[
        &c.done_phone_home,
        &c.done_operator,
        &c.armed,
        &c.adopted_done,
        &c.adopted_armed,
        &c.refused_tftp,
        &c.refused_http,
        &c.exit_scripts,
    ]);
    assert_eq!(render_netboot(&counters, 6), NETBOOT);
}

#[test]
fn the_kube_section_is_written_as_before() {
    let stats = KubeStats::default();
    let k = &stats;
    number(&[
        &k.watch_events,
        &k.watch_errors,
        &k.rebuilds_ok,
        &k.rebuilds_failed,
        &k.refused,
        &k.status_sent,
        &k.status_failed,
        &k.status_conflicts,
        &k.events_created,
    ]);
    assert_eq!(stats.render(), KUBE);
}

const PAGE: &str = r#"# HELP pxe_xdp_packets_total DHCP packets seen by the XDP fast path, by outcome.
# TYPE pxe_xdp_packets_total counter
pxe_xdp_packets_total{outcome="rx"} 100
pxe_xdp_packets_total{outcome="tx_offer"} 101
pxe_xdp_packets_total{outcome="tx_ack"} 102
pxe_xdp_packets_total{outcome="pass_unknown_host"} 103
pxe_xdp_packets_total{outcome="pass_ipxe"} 104
pxe_xdp_packets_total{outcome="pass_relay"} 105
pxe_xdp_packets_total{outcome="pass_vlan"} 106
pxe_xdp_packets_total{outcome="pass_ip"} 107
pxe_xdp_packets_total{outcome="pass_malformed"} 108
pxe_xdp_packets_total{outcome="pass_options"} 109
pxe_xdp_packets_total{outcome="pass_unsupported_client"} 110
pxe_xdp_packets_total{outcome="pass_message_type"} 111
pxe_xdp_packets_total{outcome="pass_request_mismatch"} 112
pxe_xdp_packets_total{outcome="pass_no_room"} 113
pxe_xdp_packets_total{outcome="drop_other_server"} 114
pxe_xdp_packets_total{outcome="error"} 115
pxe_xdp_packets_total{outcome="event_lost"} 116
pxe_xdp_packets_total{outcome="trace_lost"} 117
pxe_xdp_packets_total{outcome="pass_not_for_us"} 118
pxe_xdp_packets_total{outcome="tx_proxy_offer"} 119
pxe_xdp_packets_total{outcome="ignore_not_pxe"} 120
pxe_xdp_packets_total{outcome="pass_client_uuid"} 121
# HELP pxe_slow_requests_total Requests the userspace slow path read.
# TYPE pxe_slow_requests_total counter
pxe_slow_requests_total 1
pxe_slow_requests_total{family="ipv6"} 1
# HELP pxe_slow_replies_total Replies sent by the slow path, by message type.
# TYPE pxe_slow_replies_total counter
pxe_slow_replies_total{type="offer"} 2
pxe_slow_replies_total{type="ack"} 3
pxe_slow_replies_total{type="nak"} 4
pxe_slow_replies_total{type="proxy_offer"} 5
pxe_slow_replies_total{type="proxy_ack"} 6
pxe_slow_replies_total{family="ipv6",type="advertise"} 2
pxe_slow_replies_total{family="ipv6",type="reply"} 3
# HELP pxe_slow_reply_seconds Time from reading a request to sending its reply in the IPv4 slow path, the lease commit included.
# TYPE pxe_slow_reply_seconds histogram
pxe_slow_reply_seconds_bucket{le="0.0005"} 0
pxe_slow_reply_seconds_bucket{le="0.001"} 0
pxe_slow_reply_seconds_bucket{le="0.0025"} 0
pxe_slow_reply_seconds_bucket{le="0.005"} 1
pxe_slow_reply_seconds_bucket{le="0.01"} 1
pxe_slow_reply_seconds_bucket{le="0.025"} 1
pxe_slow_reply_seconds_bucket{le="0.05"} 1
pxe_slow_reply_seconds_bucket{le="0.1"} 1
pxe_slow_reply_seconds_bucket{le="0.25"} 1
pxe_slow_reply_seconds_bucket{le="0.5"} 1
pxe_slow_reply_seconds_bucket{le="1"} 1
pxe_slow_reply_seconds_bucket{le="+Inf"} 1
pxe_slow_reply_seconds_sum 0.003
pxe_slow_reply_seconds_count 1
# HELP pxe_slow_ignored_total Requests the slow path did not answer, by reason.
# TYPE pxe_slow_ignored_total counter
pxe_slow_ignored_total{reason="pass_unknown_host"} 9
pxe_slow_ignored_total{family="ipv6",reason="drop_other_server"} 8
# HELP pxe_slow_ratelimited_total Requests dropped by the storm guard, by bucket.
# TYPE pxe_slow_ratelimited_total counter
pxe_slow_ratelimited_total{scope="mac"} 7
pxe_slow_ratelimited_total{scope="unknown"} 8
pxe_slow_ratelimited_total{scope="table"} 9
pxe_slow_ratelimited_total{family="ipv6",scope="mac"} 14
pxe_slow_ratelimited_total{family="ipv6",scope="unknown"} 15
pxe_slow_ratelimited_total{family="ipv6",scope="table"} 16
# HELP pxe_slow_not_ours_total Requests of unknown hosts left to a peer agent sharing the discovery pool.
# TYPE pxe_slow_not_ours_total counter
pxe_slow_not_ours_total 19
pxe_slow_not_ours_total{family="ipv6"} 10
# HELP pxe_slow_errors_total Slow-path failures, by kind.
# TYPE pxe_slow_errors_total counter
pxe_slow_errors_total{kind="malformed"} 10
pxe_slow_errors_total{kind="pool_exhausted"} 11
pxe_slow_errors_total{kind="lease_store"} 12
pxe_slow_errors_total{kind="send"} 17
pxe_slow_errors_total{kind="panic"} 18
pxe_slow_errors_total{family="ipv6",kind="malformed"} 4
pxe_slow_errors_total{family="ipv6",kind="pool_exhausted"} 8
pxe_slow_errors_total{family="ipv6",kind="lease_store"} 9
pxe_slow_errors_total{family="ipv6",kind="send"} 6
pxe_slow_errors_total{family="ipv6",kind="panic"} 7
# HELP pxe_slow_declines_refused_total DHCPDECLINEs of pool addresses not acted on, by reason: the address was not given to that MAC, or quarantining it would pass the MAC's or the pool's limit.
# TYPE pxe_slow_declines_refused_total counter
pxe_slow_declines_refused_total{reason="not_given"} 13
pxe_slow_declines_refused_total{reason="mac_limit"} 14
pxe_slow_declines_refused_total{reason="pool_limit"} 15
pxe_slow_declines_refused_total{family="ipv6",reason="not_given"} 11
pxe_slow_declines_refused_total{family="ipv6",reason="mac_limit"} 12
pxe_slow_declines_refused_total{family="ipv6",reason="pool_limit"} 13
# HELP pxe_reservation_declines_total DHCPDECLINEs of a reserved address by its own host: another machine uses it (`pxe-agent hosts` names the host).
# TYPE pxe_reservation_declines_total counter
pxe_reservation_declines_total 16
pxe_reservation_declines_total{family="ipv6"} 5
# HELP pxe_slow_path_restarts_total Times the slow path was started again after it died.
# TYPE pxe_slow_path_restarts_total counter
pxe_slow_path_restarts_total 2
# HELP pxe_ready 1 while /healthz answers 200.
# TYPE pxe_ready gauge
pxe_ready 0
# HELP pxe_health_check_ok 1 while a check of /healthz passes, by check: the slow path runs, our XDP program is attached, the maps hold the inventory in force, the state store can be written, out-of-band control runs.
# TYPE pxe_health_check_ok gauge
pxe_health_check_ok{check="slow_path"} 0
pxe_health_check_ok{check="xdp"} 0
pxe_health_check_ok{check="maps"} 1
pxe_health_check_ok{check="state_store"} 1
pxe_health_check_ok{check="out_of_band"} 1
# HELP pxe_xdp_attached 1 while this agent's XDP program is the one attached to the interface, by interface.
# TYPE pxe_xdp_attached gauge
pxe_xdp_attached{interface="eth1"} 1
pxe_xdp_attached{interface="eth2"} 0
# HELP pxe_discovered_hosts Unknown clients recorded for adoption.
# TYPE pxe_discovered_hosts gauge
pxe_discovered_hosts 31
# HELP pxe_traced_macs MACs traced live (each costs the XDP program a map lookup per request).
# TYPE pxe_traced_macs gauge
pxe_traced_macs 32
# HELP pxe_xdp_events_lost_total Fast-path answers whose events were overwritten before the agent read them (the boot-progress view does not show them).
# TYPE pxe_xdp_events_lost_total counter
pxe_xdp_events_lost_total 33
# HELP pxe_leases Pool leases, by state.
# TYPE pxe_leases gauge
pxe_leases{state="bound"} 35
pxe_leases{state="declined"} 34
pxe_leases{family="ipv6",state="bound"} 36
pxe_leases{family="ipv6",state="declined"} 0
# HELP pxe_tftp_transfers_total TFTP read requests, by outcome.
# TYPE pxe_tftp_transfers_total counter
pxe_tftp_transfers_total{outcome="done"} 2
pxe_tftp_transfers_total{outcome="failed"} 3
pxe_tftp_transfers_total{outcome="busy"} 4
pxe_tftp_transfers_total{outcome="refused"} 8
# HELP pxe_tftp_bytes_total Payload bytes acknowledged by TFTP clients.
# TYPE pxe_tftp_bytes_total counter
pxe_tftp_bytes_total 10
# HELP pxe_tftp_retransmits_total TFTP packets resent after a timeout.
# TYPE pxe_tftp_retransmits_total counter
pxe_tftp_retransmits_total 11
# HELP pxe_tftp_active_transfers TFTP transfers running.
# TYPE pxe_tftp_active_transfers gauge
pxe_tftp_active_transfers 14
# HELP pxe_tftp_waiting_requests TFTP read requests waiting for a transfer slot.
# TYPE pxe_tftp_waiting_requests gauge
pxe_tftp_waiting_requests 7
# HELP pxe_tftp_waited_requests_total TFTP read requests that waited for a transfer slot.
# TYPE pxe_tftp_waited_requests_total counter
pxe_tftp_waited_requests_total 5
# HELP pxe_tftp_wait_expired_total Waiting TFTP read requests forgotten because the client went silent.
# TYPE pxe_tftp_wait_expired_total counter
pxe_tftp_wait_expired_total 6
# HELP pxe_http_connections_total Connections the boot HTTP listener accepted.
# TYPE pxe_http_connections_total counter
pxe_http_connections_total 21
# HELP pxe_http_file_transfers_total Boot files and artifacts the boot HTTP listener sent whole (sendfile).
# TYPE pxe_http_file_transfers_total counter
pxe_http_file_transfers_total 30
# HELP pxe_http_file_bytes_total Bytes of boot files and artifacts the boot HTTP listener sent whole.
# TYPE pxe_http_file_bytes_total counter
pxe_http_file_bytes_total 31
# HELP pxe_http_open_connections Boot HTTP connections being served.
# TYPE pxe_http_open_connections gauge
pxe_http_open_connections 22
# HELP pxe_http_parked_connections Boot HTTP connections parked, request read, until their artifact's turn (pxe_artifact_transfers_waiting), their connection slot given back.
# TYPE pxe_http_parked_connections gauge
pxe_http_parked_connections 32
# HELP pxe_http_at_limit_total Times every boot HTTP connection slot was taken, so new connections waited in the listen backlog.
# TYPE pxe_http_at_limit_total counter
pxe_http_at_limit_total 23
# HELP pxe_http_dropped_total Boot HTTP connections the server closed, by reason.
# TYPE pxe_http_dropped_total counter
pxe_http_dropped_total{reason="head_timeout"} 24
pxe_http_dropped_total{reason="write_timeout"} 25
pxe_http_dropped_total{reason="short_body"} 26
# HELP pxe_http_accept_errors_total Failed accepts of the boot HTTP listener (EMFILE, ENFILE, ...), each followed by a pause.
# TYPE pxe_http_accept_errors_total counter
pxe_http_accept_errors_total 27
# HELP pxe_http_phone_home_rejected_total Phone-homes from the host's address refused for their token, by reason (mismatch: wrong, or of an earlier boot).
# TYPE pxe_http_phone_home_rejected_total counter
pxe_http_phone_home_rejected_total{reason="missing"} 28
pxe_http_phone_home_rejected_total{reason="mismatch"} 29
# HELP pxe_inventory_hosts Hosts in the serving inventory.
# TYPE pxe_inventory_hosts gauge
pxe_inventory_hosts 3
# HELP pxe_inventory_templates Compiled replies (host x boot class) in the XDP map.
# TYPE pxe_inventory_templates gauge
pxe_inventory_templates 7
# HELP pxe_inventory_reloads_total Inventory reloads, applied or rejected.
# TYPE pxe_inventory_reloads_total counter
pxe_inventory_reloads_total{result="ok"} 5
pxe_inventory_reloads_total{result="rejected"} 1
# HELP pxe_inventory_reload_seconds Duration of the last applied inventory reload, from reading the inventory to the change being in force on the XDP maps (read, compile, sync); 0 before the first.
# TYPE pxe_inventory_reload_seconds gauge
pxe_inventory_reload_seconds 0.25
# HELP pxe_xdp_map_writes_total Element writes and deletes the agent made to the XDP maps to fill the fast path, start-up fill included (not counted for pinned maps an agent adopts).
# TYPE pxe_xdp_map_writes_total counter
pxe_xdp_map_writes_total 42
"#;
const PAGE_TFTP: &str = r#"# HELP pxe_tftp_transfers_total TFTP read requests, by outcome.
# TYPE pxe_tftp_transfers_total counter
pxe_tftp_transfers_total{outcome="done"} 2
pxe_tftp_transfers_total{outcome="failed"} 3
pxe_tftp_transfers_total{outcome="busy"} 4
pxe_tftp_transfers_total{outcome="refused"} 8
# HELP pxe_tftp_bytes_total Payload bytes acknowledged by TFTP clients.
# TYPE pxe_tftp_bytes_total counter
pxe_tftp_bytes_total 10
# HELP pxe_tftp_retransmits_total TFTP packets resent after a timeout.
# TYPE pxe_tftp_retransmits_total counter
pxe_tftp_retransmits_total 11
# HELP pxe_tftp_active_transfers TFTP transfers running.
# TYPE pxe_tftp_active_transfers gauge
pxe_tftp_active_transfers 14
# HELP pxe_tftp_waiting_requests TFTP read requests waiting for a transfer slot.
# TYPE pxe_tftp_waiting_requests gauge
pxe_tftp_waiting_requests 7
# HELP pxe_tftp_waited_requests_total TFTP read requests that waited for a transfer slot.
# TYPE pxe_tftp_waited_requests_total counter
pxe_tftp_waited_requests_total 5
# HELP pxe_tftp_wait_expired_total Waiting TFTP read requests forgotten because the client went silent.
# TYPE pxe_tftp_wait_expired_total counter
pxe_tftp_wait_expired_total 6
"#;
const SHARE: &str = r#"# HELP pxe_share_slot This agent's pool slot, and how many slots the pools are cut into.
# TYPE pxe_share_slot gauge
pxe_share_slot{slots="4"} 1
# HELP pxe_share_live_slots Pool slots whose agents are live.
# TYPE pxe_share_live_slots gauge
pxe_share_live_slots 3
# HELP pxe_share_buckets Hash buckets of unknown MACs (of 256) this agent answers.
# TYPE pxe_share_buckets gauge
pxe_share_buckets 83
"#;
const HOST_RECORDS: &str = r#"# HELP pxe_share_host_record_writes_total Writes of this agent's changes to the hosts' shared records (Leases), by result.
# TYPE pxe_share_host_record_writes_total counter
pxe_share_host_record_writes_total{result="ok"} 1
pxe_share_host_record_writes_total{result="conflict"} 2
pxe_share_host_record_writes_total{result="failed"} 3
# HELP pxe_share_host_records_taken_total Peers' records this agent received: netboot records it took, recovery records of hosts it does not own (taken unless it acts on the host), boot steps it took.
# TYPE pxe_share_host_records_taken_total counter
pxe_share_host_records_taken_total{kind="netboot"} 4
pxe_share_host_records_taken_total{kind="recovery"} 5
pxe_share_host_records_taken_total{kind="step"} 6
# HELP pxe_share_owned_hosts Hosts with a BMC whose recovery this agent owns (all of them without peers).
# TYPE pxe_share_owned_hosts gauge
pxe_share_owned_hosts 7
"#;
const OTHER_SERVERS: &str = r#"# HELP pxe_dhcp_other_server_requests_total DHCPREQUESTs naming another server for hosts with netboot once or a BMC, without --peers (that server shares neither state).
# TYPE pxe_dhcp_other_server_requests_total counter
pxe_dhcp_other_server_requests_total 0
# HELP pxe_dhcp_other_server_hosts Hosts with netboot once or a BMC that another DHCP server answers, warned about once each.
# TYPE pxe_dhcp_other_server_hosts gauge
pxe_dhcp_other_server_hosts 0
"#;
const API_AUTH: &str = r#"# HELP pxe_api_auth_failures_total JSON API calls refused before their handler: no or an unknown token, no right to the verb, too many failures from the address, no way to identify callers.
# TYPE pxe_api_auth_failures_total counter
pxe_api_auth_failures_total{reason="missing"} 3
pxe_api_auth_failures_total{reason="invalid"} 0
pxe_api_auth_failures_total{reason="throttled"} 1
"#;
const API_TLS: &str = r#"# HELP pxe_api_tls_reloads_total Changes of the API's certificate files: put in force (ok) or refused, the previous certificate serving on (error).
# TYPE pxe_api_tls_reloads_total counter
pxe_api_tls_reloads_total{result="ok"} 2
pxe_api_tls_reloads_total{result="error"} 1
# HELP pxe_api_tls_handshake_failures_total TLS handshakes on the API listener that failed or did not finish in time.
# TYPE pxe_api_tls_handshake_failures_total counter
pxe_api_tls_handshake_failures_total{reason="error"} 4
pxe_api_tls_handshake_failures_total{reason="timeout"} 5
# HELP pxe_api_tls_cert_not_after_seconds When the API's serving certificate expires (notAfter), in unix seconds.
# TYPE pxe_api_tls_cert_not_after_seconds gauge
pxe_api_tls_cert_not_after_seconds 1767225600
"#;
const NETBOOT: &str = r#"# HELP pxe_netboot_changes_total Netboot state changes: provisioning done (by phone-home or operator), armed again.
# TYPE pxe_netboot_changes_total counter
pxe_netboot_changes_total{to="done",by="phone-home"} 1
pxe_netboot_changes_total{to="done",by="operator"} 2
pxe_netboot_changes_total{to="armed",by="operator"} 3
pxe_netboot_changes_total{to="done",by="peer"} 4
pxe_netboot_changes_total{to="armed",by="peer"} 5
# HELP pxe_netboot_refused_total Boot files refused to hosts netboot gives none now, by route (script: an exit script served).
# TYPE pxe_netboot_refused_total counter
pxe_netboot_refused_total{route="tftp"} 6
pxe_netboot_refused_total{route="http"} 7
pxe_netboot_refused_total{route="script"} 8
# HELP pxe_netboot_done_hosts Hosts whose provisioning is recorded as done.
# TYPE pxe_netboot_done_hosts gauge
pxe_netboot_done_hosts 6
"#;
const KUBE: &str = r#"# HELP pxe_kube_watch_events_total Watch events received from the Kubernetes API.
# TYPE pxe_kube_watch_events_total counter
pxe_kube_watch_events_total 1
# HELP pxe_kube_watch_errors_total Watch errors (each followed by a back-off and a re-watch or re-list).
# TYPE pxe_kube_watch_errors_total counter
pxe_kube_watch_errors_total 2
# HELP pxe_kube_rebuilds_total Inventory rebuilds from the cluster's objects.
# TYPE pxe_kube_rebuilds_total counter
pxe_kube_rebuilds_total{result="ok"} 3
pxe_kube_rebuilds_total{result="failed"} 4
# HELP pxe_kube_objects_refused Objects the last rebuild refused as invalid.
# TYPE pxe_kube_objects_refused gauge
pxe_kube_objects_refused 5
# HELP pxe_kube_status_patches_total Status patches sent, by result.
# TYPE pxe_kube_status_patches_total counter
pxe_kube_status_patches_total{result="ok"} 6
pxe_kube_status_patches_total{result="failed"} 7
pxe_kube_status_patches_total{result="conflict"} 8
# HELP pxe_kube_events_created_total Events created for refused objects.
# TYPE pxe_kube_events_created_total counter
pxe_kube_events_created_total 9
"#;

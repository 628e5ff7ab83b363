//! The agent's metric names, the gauges it keeps besides its counters, the
//! latency [`Histogram`], and the one writer of the text exposition format
//! ([`exposition`]). Each section of the page is written beside what it
//! counts or, for counters read from several services, by the page in
//! [`api::metrics`](crate::api::metrics).

pub mod exposition;
mod histogram;

pub use histogram::{Histogram, HistogramSnapshot, WAIT_BUCKETS};

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
pub const XDP_INTERFACE_PACKETS: &str = "pxe_xdp_interface_packets_total";
pub const SLOW_REPLIES: &str = "pxe_slow_replies_total";
pub const SLOW_IGNORED: &str = "pxe_slow_ignored_total";
pub const SLOW_LIMITED: &str = "pxe_slow_ratelimited_total";
pub const SLOW_ERRORS: &str = "pxe_slow_errors_total";
pub const SLOW_DECLINES_REFUSED: &str = "pxe_slow_declines_refused_total";
pub const RESERVATION_DECLINES: &str = "pxe_reservation_declines_total";
pub const SLOW_RX: &str = "pxe_slow_requests_total";
pub const SLOW_REPLY_SECONDS: &str = "pxe_slow_reply_seconds";
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
pub const HEALTH_CHECK: &str = "pxe_health_check_ok";
pub const XDP_ATTACHED: &str = "pxe_xdp_attached";
pub const XDP_ATTACH_MODE: &str = "pxe_xdp_attach_mode";
pub const NETBOOT_CHANGES: &str = "pxe_netboot_changes_total";
pub const NETBOOT_REFUSED: &str = "pxe_netboot_refused_total";
pub const NETBOOT_DONE: &str = "pxe_netboot_done_hosts";
pub const DISCOVERED: &str = "pxe_discovered_hosts";
pub const BOOT_STAGE_HOSTS: &str = "pxe_boot_stage_hosts";
pub const TRACED: &str = "pxe_traced_macs";
pub const XDP_EVENTS_LOST: &str = "pxe_xdp_events_lost_total";
pub const LEASES: &str = "pxe_leases";
pub const POOL_ADDRESSES: &str = "pxe_pool_addresses";
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
pub const HTTP_TRANSFERS: &str = "pxe_http_file_transfers_total";
pub const HTTP_BYTES: &str = "pxe_http_file_bytes_total";
pub const HTTP_OPEN: &str = "pxe_http_open_connections";
pub const HTTP_AT_LIMIT: &str = "pxe_http_at_limit_total";
pub const HTTP_PARKED: &str = "pxe_http_parked_connections";
pub const ARTIFACT_TRANSFERS_RUNNING: &str = "pxe_artifact_transfers_running";
pub const ARTIFACT_TRANSFERS_WAITING: &str = "pxe_artifact_transfers_waiting";
pub const ARTIFACT_TURNS: &str = "pxe_artifact_turns_total";
pub const ARTIFACT_TURNS_WAITED: &str = "pxe_artifact_turns_waited_total";
pub const ARTIFACT_WAIT_SECONDS: &str = "pxe_artifact_wait_seconds";
pub const HTTP_DROPPED: &str = "pxe_http_dropped_total";
pub const HTTP_ACCEPT_ERRORS: &str = "pxe_http_accept_errors_total";
pub const HTTP_PHONE_HOME_REJECTED: &str = "pxe_http_phone_home_rejected_total";
pub const API_REFUSED: &str = "pxe_api_auth_failures_total";
pub const API_TLS_RELOADS: &str = "pxe_api_tls_reloads_total";
pub const API_TLS_HANDSHAKE_FAILURES: &str = "pxe_api_tls_handshake_failures_total";
pub const API_TLS_NOT_AFTER: &str = "pxe_api_tls_cert_not_after_seconds";

//! The boot HTTP server (axum, with a sendfile(2) path for files):
//! per-host iPXE scripts and grub.cfg, boot files and artifacts, and the
//! phone-home endpoint. The admin listeners (metrics, health and the JSON
//! API) are [`api`](crate::api)'s.

pub mod artifacts;
pub mod boot;
pub mod grub;
pub mod limit;
pub mod plan;
pub mod script;
pub mod sendfile;
pub mod token;

use std::{
    net::IpAddr,
    path::PathBuf,
    sync::{Arc, OnceLock},
};

use crate::{dhcp::Server, state::State, tftp};

/// What the boot server needs to answer.
pub struct BootState {
    /// Inventory, leases, progress and health, as every service reads them.
    pub shared: Arc<State>,
    /// The server of each interface, in the order given (never empty).
    pub servers: Vec<Server>,
    /// The IPv6 address of each interface that has one a URL can name.
    pub servers6: Vec<std::net::Ipv6Addr>,
    /// Served at `/`: the TFTP root (iPXE binaries), so the UEFI HTTP boot
    /// URL of a DHCP answer resolves here too.
    pub boot_root: Option<PathBuf>,
    /// Served at `/artifacts/`: kernels, initrds, images.
    pub artifacts: Option<PathBuf>,
    /// The TFTP server's counters, once it runs.
    pub tftp_stats: OnceLock<Arc<tftp::Stats>>,
    /// The boot listener's connection counters.
    pub http_stats: limit::Stats,
    /// Signs and checks the phone-home tokens of rendered scripts.
    pub token_key: token::TokenKey,
    /// When each host's refused phone-home was last logged, so a host (or
    /// a spoofer) retrying in a loop logs once a minute.
    pub refusal_log: std::sync::Mutex<std::collections::HashMap<crate::mac::MacAddr, u64>>,
}

impl BootState {
    /// The address a client at `client` reaches the agent at, of the
    /// client's family: the interface's whose address is in the client's
    /// subnet, else the first interface's (of the other family when no
    /// interface has one of the client's).
    pub fn server_for(&self, client: IpAddr) -> IpAddr {
        let inv = self.shared.inventory();
        let first = || {
            self.servers
                .first()
                .map(|s| IpAddr::V4(s.ip))
                .or_else(|| self.servers6.first().map(|ip| IpAddr::V6(*ip)))
                .expect("every served interface has an address of one family")
        };
        match crate::wire::canonical(client) {
            IpAddr::V4(client) => inv
                .subnets
                .iter()
                .find(|s| s.contains(client))
                .and_then(|s| self.servers.iter().find(|srv| s.contains(srv.ip)))
                .map_or_else(first, |srv| IpAddr::V4(srv.ip)),
            IpAddr::V6(client) => inv
                .subnets6
                .iter()
                .find(|s| s.contains(client))
                .and_then(|s| self.servers6.iter().find(|srv| s.contains(**srv)))
                .or(self.servers6.first())
                .map_or_else(first, |srv| IpAddr::V6(*srv)),
        }
    }
}

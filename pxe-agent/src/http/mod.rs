//! The boot HTTP server (axum, with a sendfile(2) path for files):
//! per-host iPXE scripts, boot files and artifacts, and the phone-home
//! endpoint; plus the admin endpoints
//! (metrics, health, discovered hosts, leases, boot progress) on their own
//! listener.

pub mod admin;
pub mod artifacts;
pub mod auth;
pub mod boot;
pub mod limit;
pub mod script;
pub mod sendfile;

use std::{
    net::Ipv4Addr,
    path::PathBuf,
    sync::{Arc, OnceLock},
};

use crate::{
    dhcp::{Server, server},
    inventory::MacAddr,
    progress::Progress,
    tftp,
};

/// What the boot server needs to answer.
pub struct BootState {
    /// Inventory and leases, shared with the DHCP slow path.
    pub dhcp: Arc<server::Shared>,
    /// The server of each interface, in the order given (never empty).
    pub servers: Vec<Server>,
    /// Served at `/`: the TFTP root (iPXE binaries), so the UEFI HTTP boot
    /// URL of a DHCP answer resolves here too.
    pub boot_root: Option<PathBuf>,
    /// Served at `/artifacts/`: kernels, initrds, images.
    pub artifacts: Option<PathBuf>,
    pub progress: Arc<Progress>,
    /// The TFTP server's counters, once it runs.
    pub tftp_stats: OnceLock<Arc<tftp::Stats>>,
    /// The boot listener's connection counters.
    pub http_stats: limit::Stats,
}

impl BootState {
    /// The address `mac` may fetch its script from: its reservation, or the
    /// pool address it leased.
    pub fn address_of(&self, mac: MacAddr) -> Option<Ipv4Addr> {
        if let Some(host) = self.dhcp.inventory().host_by_mac(mac) {
            return Some(host.ip);
        }
        self.dhcp.lease_of(mac)
    }

    /// The server a client at `client` reaches: the interface whose
    /// address is in the client's subnet, else the first one.
    pub fn server_for(&self, client: Ipv4Addr) -> Server {
        let inv = self.dhcp.inventory();
        let subnet = inv.subnets.iter().find(|s| s.contains(client));
        subnet
            .and_then(|s| self.servers.iter().find(|srv| s.contains(srv.ip)))
            .or(self.servers.first())
            .copied()
            .expect("an agent serves at least one interface")
    }

    /// The MAC behind a client address, for recording progress.
    pub fn mac_at(&self, ip: Ipv4Addr) -> Option<MacAddr> {
        if let Some(host) = self.dhcp.inventory().host_by_ip(ip) {
            return Some(host.mac);
        }
        self.dhcp.mac_with_lease(ip)
    }
}

//! The state several services read: the inventory in force (with its
//! indexes), pool leases, the machines discovered, boot progress, health,
//! the slow path's counters and how the discovery pools are shared with
//! peer agents (`share`). DHCP, TFTP, HTTP and the API each hold an
//! `Arc<State>` and read it here, so no service reaches into another for
//! it; each service keeps only its own working state (sockets, transfers,
//! the storm guard's buckets).

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::{Arc, Mutex, RwLock, atomic::AtomicU64},
};

use pxe_ebpf_common::Counter;

use crate::{
    discovered::Registry,
    health::Health,
    inventory::Inventory,
    lease::{LeaseState, LeaseStore},
    mac::MacAddr,
    netboot::{Actor, NetbootStore, StoreError},
    progress::Progress,
    share::Share,
    sync::{lock, read, write},
    wire::canonical,
};

/// What the services share (see the module doc).
pub struct State {
    /// The serving inventory; the reload loop swaps it.
    pub inventory: RwLock<Arc<Inventory>>,
    pub leases: Mutex<LeaseStore>,
    pub discovered: Mutex<Registry>,
    /// The slow path's counters, read by `/metrics`.
    pub stats: SlowPathStats,
    pub stats6: Dhcp6Stats,
    /// Where each host is in its boot; the slow path records its answers.
    pub progress: Arc<Progress>,
    /// What `/healthz` reports; the slow path beats here.
    pub health: Arc<Health>,
    /// This agent's slot and the live slots; the membership swaps it.
    pub share: RwLock<Arc<Share>>,
    /// Which `netboot: once` hosts are provisioned. The inventory in force
    /// carries a copy ([`Inventory::provisioned`]) that every route reads;
    /// after a change here, `netboot_changed` wakes the task that puts a
    /// recompiled inventory in force on both paths.
    pub netboot: Arc<NetbootStore>,
    pub netboot_changed: tokio::sync::Notify,
    /// The counters of the records shared with peers (`kube::host_records`).
    pub host_records: HostRecordStats,
    /// Hosts another DHCP server answers while nothing is shared.
    pub other_servers: crate::other_server::OtherServers,
    /// Turns for boot transfers, per interface: the TFTP servers and the
    /// boot HTTP listener take them, `/metrics` and `hosts` read them.
    pub admission: crate::admission::Admissions,
}

/// Counters of the DHCP slow path (`dhcp::server`), exported on /metrics:
/// shared state, so that the server counts and the page reads them here.
#[derive(Default)]
pub struct SlowPathStats {
    pub rx: AtomicU64,
    pub offers: AtomicU64,
    pub acks: AtomicU64,
    pub naks: AtomicU64,
    /// proxyDHCP answers (PXE boot information without an address); not
    /// counted in `offers` and `acks`.
    pub proxy_offers: AtomicU64,
    pub proxy_acks: AtomicU64,
    /// Requests not answered, by reason (indexed by `Counter`).
    pub ignored: [AtomicU64; Counter::Count as usize],
    pub limited_mac: AtomicU64,
    pub limited_unknown: AtomicU64,
    pub limited_table: AtomicU64,
    pub malformed: AtomicU64,
    pub pool_exhausted: AtomicU64,
    pub lease_errors: AtomicU64,
    /// DHCPDECLINEs refused: for an address not given to the MAC, past the
    /// MAC's quarantine limit, past the pool's.
    pub declines_not_given: AtomicU64,
    pub declines_mac_limit: AtomicU64,
    pub declines_pool_limit: AtomicU64,
    /// DHCPDECLINEs of reserved addresses by their own hosts.
    pub reservation_declines: AtomicU64,
    pub send_errors: AtomicU64,
    /// Requests whose handling panicked (contained, request dropped).
    pub panics: AtomicU64,
    /// Requests of unknown hosts left to a peer agent sharing the pool.
    pub not_ours: AtomicU64,
    /// From reading a request's batch to its reply sent, lease commit
    /// included.
    pub reply_seconds: crate::metrics::Histogram,
}

/// The DHCPv6 slow path's counters (`dhcp::v6::server`).
#[derive(Default, Debug)]
pub struct Dhcp6Stats {
    pub rx: AtomicU64,
    pub advertises: AtomicU64,
    pub replies: AtomicU64,
    /// Requests not answered, by reason (indexed by `Counter`, the same
    /// reasons as IPv4's).
    pub ignored: [AtomicU64; Counter::Count as usize],
    /// Messages that do not parse as DHCPv6 client or relay messages.
    pub malformed: AtomicU64,
    /// Declines of a reserved address by its own host.
    pub reservation_declines: AtomicU64,
    pub send_errors: AtomicU64,
    /// Requests whose handling panicked (contained, request dropped).
    pub panics: AtomicU64,
    /// IA_NAs of pool clients no address was free for (NoAddrsAvail).
    pub pool_exhausted: AtomicU64,
    /// Lease store failures while settling a pool client.
    pub lease_errors: AtomicU64,
    /// Pool clients left to a peer agent sharing the pool.
    pub not_ours: AtomicU64,
    /// Declines of pool addresses not acted on, by reason (as IPv4's).
    pub declines_not_given: AtomicU64,
    pub declines_mac_limit: AtomicU64,
    pub declines_pool_limit: AtomicU64,
    /// Messages dropped by the storm guard, by bucket (as IPv4's).
    pub limited_mac: AtomicU64,
    pub limited_unknown: AtomicU64,
    pub limited_table: AtomicU64,
}

impl State {
    pub fn new(
        inventory: Arc<Inventory>,
        leases: LeaseStore,
        discovered_capacity: usize,
        progress: Arc<Progress>,
        health: Arc<Health>,
    ) -> State {
        progress.set_hosts(&inventory.hosts);
        let mut leases = leases;
        leases.set_lease_key(inventory.discovery.lease_key);
        State {
            inventory: RwLock::new(inventory),
            leases: Mutex::new(leases),
            discovered: Mutex::new(Registry::new(discovered_capacity)),
            stats: SlowPathStats::default(),
            stats6: Dhcp6Stats::default(),
            progress,
            health,
            share: RwLock::new(Arc::new(Share::alone())),
            netboot: Arc::new(NetbootStore::in_memory()),
            netboot_changed: tokio::sync::Notify::new(),
            host_records: HostRecordStats::default(),
            other_servers: Default::default(),
            admission: Default::default(),
        }
    }

    /// The state with `store` as its netboot store (the one in the state
    /// directory); [`State::new`] keeps one in memory.
    pub fn with_netboot(mut self, store: Arc<NetbootStore>) -> State {
        self.netboot = store;
        self
    }

    /// Records that `mac`'s provisioning is done; `Ok(false)` if it was.
    pub fn netboot_done(&self, mac: MacAddr, by: Actor) -> Result<bool, StoreError> {
        let changed = self.netboot.mark_done(mac, by, crate::clock::now_ms())?;
        if changed {
            self.netboot_changed.notify_one();
        }
        Ok(changed)
    }

    /// Arms `mac` to be given its boot file again; `Ok(false)` if it was.
    pub fn netboot_arm(&self, mac: MacAddr) -> Result<bool, StoreError> {
        let changed = self.netboot.arm(mac, crate::clock::now_ms())?;
        if changed {
            self.netboot_changed.notify_one();
        }
        Ok(changed)
    }

    /// Waits (up to `within`) until the inventory in force carries the
    /// netboot store's records, i.e. every route follows the last change.
    pub async fn netboot_in_force(&self, within: std::time::Duration) -> bool {
        let until = tokio::time::Instant::now() + within;
        loop {
            if self.inventory().provisioned == self.netboot.done() {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// How the pools are shared now ([`Share::alone`] without peers).
    pub fn share(&self) -> Arc<Share> {
        read(&self.share).clone()
    }

    /// Swaps in a new membership.
    pub fn set_share(&self, share: Share) {
        *write(&self.share) = Arc::new(share);
    }

    /// The serving inventory.
    pub fn inventory(&self) -> Arc<Inventory> {
        read(&self.inventory).clone()
    }

    /// The pool address `mac` holds (bound or offered).
    pub fn lease_of(&self, mac: MacAddr) -> Option<Ipv4Addr> {
        let store = lock(&self.leases);
        store
            .lease_of_mac(mac.0)
            .filter(|l| matches!(l.state, LeaseState::Bound | LeaseState::Offered))
            .map(|l| l.ip)
    }

    /// The MAC holding the pool lease of `ip`, of either family.
    pub fn mac_with_lease(&self, ip: IpAddr) -> Option<MacAddr> {
        let store = lock(&self.leases);
        match canonical(ip) {
            IpAddr::V4(ip) => store.bound_at(ip),
            IpAddr::V6(ip) => store.bound6_at(ip),
        }
        .map(MacAddr)
    }

    /// Swaps in a new inventory; MACs it now lists leave the discovered set.
    pub fn replace_inventory(&self, inv: Arc<Inventory>) {
        lock(&self.discovered).adopt_known(|mac| inv.host_by_mac(mac).is_some());
        lock(&self.leases).set_lease_key(inv.discovery.lease_key);
        // A reload that changed hosts' settings, not which MACs are whose,
        // leaves what progress tracks as it is.
        if !self.inventory().same_ports(&inv) {
            self.progress.set_hosts(&inv.hosts);
        }
        self.other_servers.retain(&inv);
        let old = std::mem::replace(&mut *write(&self.inventory), inv);
        // The lock is not held while a fleet's hosts are freed.
        drop(old);
    }

    /// The address `mac` may fetch its script and phone home from, of the
    /// family of `peer` (the address a request came from): its IPv4 or IPv6
    /// reservation, else the pool address it leased (over IPv6, `peer`
    /// itself when the lease bound there is `mac`'s: an IPv6 lease is
    /// keyed by DUID and IAID, not by MAC). A reserved host is answered at
    /// once; the lease lookup may wait for the slow path's commit (an
    /// fsync) on the lease store's lock, so it runs on the blocking pool.
    pub async fn address_of(self: &Arc<Self>, mac: MacAddr, peer: IpAddr) -> Option<IpAddr> {
        let peer = canonical(peer);
        if let Some(host) = self.inventory().host_by_mac(mac) {
            return match peer {
                IpAddr::V4(_) => host.ipv4().map(IpAddr::V4),
                IpAddr::V6(_) => host.ipv6().map(IpAddr::V6),
            };
        }
        let state = self.clone();
        tokio::task::spawn_blocking(move || match peer {
            IpAddr::V4(_) => state.lease_of(mac).map(IpAddr::V4),
            IpAddr::V6(_) => (state.mac_with_lease(peer) == Some(mac)).then_some(peer),
        })
        .await
        .ok()
        .flatten()
    }

    /// The MAC behind a client address, for recording progress: a
    /// reservation at once, a pool lease from the blocking pool.
    pub async fn mac_at(self: &Arc<Self>, ip: IpAddr) -> Option<MacAddr> {
        if let Some(host) = self.inventory().host_at(ip) {
            return Some(host.mac);
        }
        let state = self.clone();
        tokio::task::spawn_blocking(move || state.mac_with_lease(ip))
            .await
            .ok()
            .flatten()
    }
}

/// The counters of the host records shared with peers
/// (`kube::host_records`), for `/metrics`.
#[derive(Debug, Default)]
pub struct HostRecordStats {
    pub writes_ok: AtomicU64,
    pub write_conflicts: AtomicU64,
    pub writes_failed: AtomicU64,
    pub taken_netboot: AtomicU64,
    pub taken_recovery: AtomicU64,
    pub taken_steps: AtomicU64,
}

//! What the request loop (`server`) and the peers' threads (`worker`)
//! share: the root, the settings of a transfer, the counters and events,
//! the peers with a transfer running ([`PeerEntry`]) and the size-probe
//! notes. Owns that state and the small rules on it; the loop fills it in
//! when it starts.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tokio::sync::mpsc;

use crate::sync::lock;

use super::{
    Generated, Stats, TransferEvent, bump, mailbox::Mailbox, option, path::Root, spin::SpinSlots,
};

/// What the peers' threads share with the loop.
pub(super) struct Shared {
    pub root: Arc<Root>,
    /// Names made per client, asked before the root.
    pub generated: Option<Arc<dyn Generated>>,
    pub stats: Arc<Stats>,
    pub limits: option::Limits,
    pub retries: u32,
    pub local_ip: IpAddr,
    pub device: Option<Vec<u8>>,
    /// Where [`Shared::emit`] sends events.
    pub events: Option<mpsc::Sender<TransferEvent>>,
    /// Peers with a transfer running, and where to leave their new
    /// requests; locked through [`Shared::peers`].
    pub peers: Mutex<HashMap<SocketAddr, PeerEntry>>,
    pub busy_poll: Duration,
    pub spin_slots: SpinSlots,
    /// Clients that just aborted a transfer after its first packet (a size
    /// probe), and when: their next request goes to the front of the wait
    /// ([`Shared::probed`], [`Shared::follows_probe`]).
    pub probed: Mutex<HashMap<IpAddr, std::time::Instant>>,
}

/// How long after a size probe a client's next request counts as its
/// continuation.
const PROBE_FOLLOWS_WITHIN: Duration = Duration::from_secs(3);
/// Size of the probe notes past which the stale ones are dropped.
const PROBED_PRUNE_AT: usize = 4096;

/// The way to a running peer thread's transfers.
pub(super) struct PeerEntry {
    /// Tells this thread's entry from a later one for the same peer.
    pub id: u64,
    pub mailbox: Arc<Mailbox>,
}

impl Shared {
    /// Sends `event` if there is room; a full or closed channel drops it.
    pub fn emit(&self, event: TransferEvent) {
        let Some(events) = &self.events else {
            return;
        };
        if events.try_send(event).is_err() {
            bump(&self.stats.events_dropped);
        }
    }

    pub fn peers(&self) -> MutexGuard<'_, HashMap<SocketAddr, PeerEntry>> {
        lock(&self.peers)
    }

    /// Notes that `ip` aborted a transfer after its first packet.
    pub fn probed(&self, ip: IpAddr) {
        let now = std::time::Instant::now();
        let mut probed = lock(&self.probed);
        // Bounded by what can follow within the window: forget the rest.
        if probed.len() >= PROBED_PRUNE_AT {
            probed.retain(|_, at| now.duration_since(*at) < PROBE_FOLLOWS_WITHIN);
        }
        probed.insert(ip, now);
    }

    /// Whether `ip` probed within [`PROBE_FOLLOWS_WITHIN`]; forgets it.
    pub fn follows_probe(&self, ip: IpAddr) -> bool {
        let mut probed = lock(&self.probed);
        probed
            .remove(&ip)
            .is_some_and(|at| at.elapsed() < PROBE_FOLLOWS_WITHIN)
    }
}

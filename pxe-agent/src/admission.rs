//! Turns for artifact downloads: on each interface, at most a bound of
//! kernels, initrds and images (`/artifacts/`) are sent at once; the rest
//! wait for a turn in the order their machines first asked for a file
//! (the boot file, over TFTP or HTTP), so that a storm finishes machines
//! one after another instead of sharing the link among all of them until
//! the end. Boot files, scripts, grub.cfg and phone-home take no turn.
//!
//! Why a bound and an order: on one bottleneck (the link, or the CPUs),
//! n downloads served all at once share it and nearly all finish near the
//! end; served a bounded number at a time, in order, the total ends at the
//! same time while the median one ends about twice as early. Ordering by
//! machine rather than by request keeps a machine that has started ahead:
//! its kernel goes before the kernel of a machine that asked later.
//!
//! Why not boot files: firmware waits a few seconds for a TFTP answer (or
//! an HTTP boot response) and then gives up, and a lock-step TFTP transfer
//! is bound by round trips, not bytes; a turn held for a client that gave
//! up would cost seconds. The TFTP server bounds its transfers itself
//! (`tftp::waiting`). iPXE and boot loaders hold an artifact request open
//! for as long as it takes, so artifacts are what can wait.
//!
//! The boot HTTP listener parks a connection, request read and nothing
//! answered, until its turn.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::{
        Arc, Mutex, MutexGuard, RwLock,
        atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed},
    },
    time::Duration,
};

use tokio::{sync::oneshot, time::Instant};

use crate::metrics::{Histogram, HistogramSnapshot, WAIT_BUCKETS};

/// Artifact downloads an interface serves at once by default: a few
/// connections fill a link with sendfile(2), and the fewer share it, the
/// earlier each ends.
pub const DEFAULT_BOUND: usize = 64;

/// How long a client keeps its place in the order after it was last
/// seen: a machine that comes back later is a new boot.
const PLACE_KEPT: Duration = Duration::from_secs(600);

/// One interface's turns.
pub struct Admission {
    bound: usize,
    inner: Mutex<Inner>,
    /// Turns given.
    turns: AtomicU64,
    /// Of those, the ones that had to wait.
    waited: AtomicU64,
    /// Time from asking to the turn, every turn (0 for one given at once).
    wait: Histogram,
}

#[derive(Default)]
struct Inner {
    /// Turns held.
    running: usize,
    /// Each client's place: the order in which clients first asked.
    places: HashMap<IpAddr, Place>,
    next_place: u64,
    next_seq: u64,
    waiting: BTreeMap<Key, Waiter>,
    /// Clients kept after the last sweep of stale places.
    swept: usize,
}

struct Place {
    rank: u64,
    seen: Instant,
}

/// A waiter's position: its client's place, then when it asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    rank: u64,
    seq: u64,
}

struct Waiter {
    client: IpAddr,
    since: Instant,
    tx: oneshot::Sender<Turn>,
}

/// A client waiting for a turn, as `hosts` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait {
    pub since: Instant,
    /// Waiters ahead of it on its interface.
    pub ahead: usize,
}

/// Counts of one interface, for a scrape.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub running: usize,
    pub waiting: usize,
    pub turns: u64,
    pub waited: u64,
    pub wait: HistogramSnapshot,
}

/// A turn: given back (and handed to the first waiter) when dropped.
#[must_use = "a turn is given back when dropped"]
pub struct Turn {
    admission: Option<Arc<Admission>>,
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turn").finish_non_exhaustive()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(admission) = self.admission.take() {
            admission.release();
        }
    }
}

impl Admission {
    /// Turns for `bound` downloads at once (at least one).
    pub fn new(bound: usize) -> Arc<Admission> {
        Arc::new(Admission {
            bound: bound.max(1),
            inner: Mutex::default(),
            turns: AtomicU64::new(0),
            waited: AtomicU64::new(0),
            wait: Histogram::with_bounds(&WAIT_BUCKETS),
        })
    }

    pub fn bound(&self) -> usize {
        self.bound
    }

    /// Gives `client` its place in the order now, if it has none (a boot
    /// file it asks for, before any turn).
    pub fn place(&self, client: IpAddr) {
        self.lock().place(client, Instant::now());
    }

    /// A turn for `client` now, if one is free and nobody waits.
    pub fn try_turn(self: &Arc<Self>, client: IpAddr) -> Option<Turn> {
        let mut inner = self.lock();
        inner.place(client, Instant::now());
        inner.free(self.bound).then(|| self.give(&mut inner, None))
    }

    /// Waits for a turn for `client`. Dropping the future gives up the
    /// place in line (and a turn that reached it meanwhile).
    pub async fn turn(self: &Arc<Self>, client: IpAddr) -> Turn {
        let (key, rx) = {
            let mut inner = self.lock();
            let now = Instant::now();
            let rank = inner.place(client, now);
            if inner.free(self.bound) {
                return self.give(&mut inner, None);
            }
            let key = Key {
                rank,
                seq: inner.next_seq,
            };
            inner.next_seq += 1;
            let (tx, rx) = oneshot::channel();
            inner.waiting.insert(
                key,
                Waiter {
                    client,
                    since: now,
                    tx,
                },
            );
            (key, rx)
        };
        let _leave = Leave {
            admission: self,
            key,
        };
        rx.await
            .expect("a waiter's sender is dropped only after sending its turn")
    }

    /// Counts now.
    pub fn snapshot(&self) -> Snapshot {
        let inner = self.lock();
        Snapshot {
            running: inner.running,
            waiting: inner.waiting.len(),
            turns: self.turns.load(Relaxed),
            waited: self.waited.load(Relaxed),
            wait: self.wait.snapshot(),
        }
    }

    /// The clients waiting now, each with its first wait.
    pub fn waiting(&self) -> HashMap<IpAddr, Wait> {
        let inner = self.lock();
        let mut out = HashMap::with_capacity(inner.waiting.len());
        for (ahead, w) in inner.waiting.values().enumerate() {
            out.entry(w.client).or_insert(Wait {
                since: w.since,
                ahead,
            });
        }
        out
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a turn for a client that waited since `since`.
    fn give(self: &Arc<Self>, inner: &mut Inner, since: Option<Instant>) -> Turn {
        inner.running += 1;
        self.turns.fetch_add(1, Relaxed);
        if since.is_some() {
            self.waited.fetch_add(1, Relaxed);
        }
        self.wait
            .observe(since.map_or(Duration::ZERO, |s| s.elapsed()));
        Turn {
            admission: Some(self.clone()),
        }
    }

    /// Gives back a turn: to the first waiter if there is one.
    fn release(self: &Arc<Self>) {
        let (waiter, turn) = {
            let mut inner = self.lock();
            inner.running -= 1;
            let Some((_, waiter)) = inner.waiting.pop_first() else {
                return;
            };
            let turn = self.give(&mut inner, Some(waiter.since));
            (waiter, turn)
        };
        // A waiter that left between the pop and here drops the turn,
        // which comes back here for the next one.
        let _ = waiter.tx.send(turn);
    }
}

/// Takes a waiter's place out of the line when its future is dropped
/// before its turn came.
struct Leave<'a> {
    admission: &'a Arc<Admission>,
    key: Key,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.admission.lock().waiting.remove(&self.key);
    }
}

impl Inner {
    fn free(&self, bound: usize) -> bool {
        self.waiting.is_empty() && self.running < bound
    }

    /// The client's place in the order, given now if it has none.
    fn place(&mut self, client: IpAddr, now: Instant) -> u64 {
        if self.places.len() > 1024 && self.places.len() > 2 * self.swept {
            self.places
                .retain(|_, p| now.duration_since(p.seen) < PLACE_KEPT);
            self.swept = self.places.len();
        }
        let next = &mut self.next_place;
        let place = self.places.entry(client).or_insert_with(|| {
            *next += 1;
            Place {
                rank: *next,
                seen: now,
            }
        });
        place.seen = now;
        place.rank
    }
}

/// The turns of every served interface, which the boot HTTP listener
/// takes from, the TFTP servers give places in, and `/metrics` and
/// `hosts` read.
pub struct Admissions {
    bound: AtomicUsize,
    interfaces: RwLock<Vec<Interface>>,
}

struct Interface {
    name: String,
    addrs: Vec<IpAddr>,
    admission: Arc<Admission>,
}

impl Default for Admissions {
    fn default() -> Admissions {
        Admissions::new(DEFAULT_BOUND)
    }
}

impl Admissions {
    /// Interfaces added from now on serve `bound` downloads at once.
    pub fn new(bound: usize) -> Admissions {
        Admissions {
            bound: AtomicUsize::new(bound),
            interfaces: RwLock::default(),
        }
    }

    /// Sets the bound of the interfaces added from now on.
    pub fn set_bound(&self, bound: usize) {
        self.bound.store(bound, Relaxed);
    }

    /// The turns of interface `name`, with its addresses `addrs`: added on
    /// first use.
    pub fn interface(&self, name: &str, addrs: &[IpAddr]) -> Arc<Admission> {
        let mut interfaces = self.interfaces.write().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = interfaces.iter_mut().find(|i| i.name == name) {
            for a in addrs {
                if !i.addrs.contains(a) {
                    i.addrs.push(*a);
                }
            }
            return i.admission.clone();
        }
        let admission = Admission::new(self.bound.load(Relaxed));
        interfaces.push(Interface {
            name: name.to_string(),
            addrs: addrs.to_vec(),
            admission: admission.clone(),
        });
        admission
    }

    /// The turns of the interface that has address `local` (where a
    /// connection arrived); the first interface's for any other address
    /// (loopback, a forwarded port).
    pub fn for_local(&self, local: IpAddr) -> Arc<Admission> {
        {
            let interfaces = self.interfaces.read().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = interfaces
                .iter()
                .find(|i| i.addrs.contains(&local))
                .or(interfaces.first())
            {
                return i.admission.clone();
            }
        }
        self.interface("", &[])
    }

    /// Each interface's name and turns.
    pub fn each(&self) -> Vec<(String, Arc<Admission>)> {
        let interfaces = self.interfaces.read().unwrap_or_else(|e| e.into_inner());
        interfaces
            .iter()
            .map(|i| (i.name.clone(), i.admission.clone()))
            .collect()
    }

    /// Every waiting client, on whichever interface.
    pub fn waiting(&self) -> HashMap<IpAddr, Wait> {
        let mut out = HashMap::new();
        for (_, admission) in self.each() {
            out.extend(admission.waiting());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, n))
    }

    /// Starts a waiter for `client` that records its turn's arrival in
    /// `order` and keeps the turn until the returned sender is dropped.
    fn waiter(
        admission: &Arc<Admission>,
        client: u8,
        order: &Arc<Mutex<Vec<u8>>>,
    ) -> (tokio::task::JoinHandle<()>, oneshot::Sender<()>) {
        let (hold, held) = oneshot::channel::<()>();
        let (admission, order) = (admission.clone(), order.clone());
        let task = tokio::spawn(async move {
            let _turn = admission.turn(ip(client)).await;
            order.lock().unwrap().push(client);
            let _ = held.await;
        });
        (task, hold)
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn the_bound_holds_and_waiters_go_by_their_machines_place() {
        let a = Admission::new(2);
        // Clients 1..=4 get their places in this order (3 and 4 by their
        // boot files).
        let first = a.try_turn(ip(1)).expect("a free turn");
        let second = a.try_turn(ip(2)).expect("a free turn");
        a.place(ip(3));
        a.place(ip(4));
        assert!(a.try_turn(ip(3)).is_none(), "the bound is 2");
        let order = Arc::new(Mutex::new(Vec::new()));
        // Client 4 asks before client 3, and client 1 (the oldest place)
        // asks last.
        let mut holds = Vec::new();
        for client in [4, 3, 1] {
            holds.push(waiter(&a, client, &order));
            settle().await;
        }
        let snap = a.snapshot();
        assert_eq!((snap.running, snap.waiting), (2, 3));
        assert_eq!(a.waiting()[&ip(4)].ahead, 2, "behind 1 and 3");
        drop(first);
        settle().await;
        drop(second);
        settle().await;
        assert_eq!(*order.lock().unwrap(), [1, 3], "by place, not by asking");
        drop(holds.remove(2).1);
        settle().await;
        assert_eq!(*order.lock().unwrap(), [1, 3, 4]);
        let snap = a.snapshot();
        assert_eq!((snap.running, snap.waiting), (2, 0));
        assert_eq!((snap.turns, snap.waited), (5, 3));
        assert_eq!(snap.wait.count, 5);
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_loses_its_place_and_no_turn() {
        let a = Admission::new(1);
        let held = a.try_turn(ip(1)).unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let (gone, _hold_gone) = waiter(&a, 2, &order);
        let (_stays, _hold) = waiter(&a, 3, &order);
        settle().await;
        gone.abort();
        settle().await;
        assert_eq!(a.snapshot().waiting, 1);
        drop(held);
        settle().await;
        assert_eq!(*order.lock().unwrap(), [3]);
        assert_eq!(a.snapshot().running, 1);
    }

    #[tokio::test]
    async fn a_turn_given_to_a_waiter_that_left_goes_to_the_next() {
        let a = Admission::new(1);
        let held = a.try_turn(ip(1)).unwrap();
        // A waiter whose receiver is gone but whose place is still in
        // line: what a turn handed over as the waiter leaves meets.
        let (tx, rx) = oneshot::channel();
        drop(rx);
        a.lock().waiting.insert(
            Key { rank: 0, seq: 99 },
            Waiter {
                client: ip(2),
                since: Instant::now(),
                tx,
            },
        );
        let order = Arc::new(Mutex::new(Vec::new()));
        let (_t, _hold) = waiter(&a, 3, &order);
        settle().await;
        drop(held);
        settle().await;
        assert_eq!(*order.lock().unwrap(), [3]);
        let snap = a.snapshot();
        assert_eq!((snap.running, snap.waiting), (1, 0));
    }

    #[test]
    fn connections_find_their_interface_and_others_the_first() {
        let all = Admissions::new(4);
        let eth1 = all.interface("eth1", &[ip(1)]);
        let eth2 = all.interface("eth2", &[ip(2)]);
        assert!(Arc::ptr_eq(&all.for_local(ip(2)), &eth2));
        assert!(Arc::ptr_eq(
            &all.for_local(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            &eth1
        ));
        assert!(Arc::ptr_eq(&all.interface("eth1", &[ip(9)]), &eth1));
        assert!(Arc::ptr_eq(&all.for_local(ip(9)), &eth1));
        assert_eq!(eth1.bound(), 4);
    }
}

//! Read requests waiting for a transfer slot, one per peer, forgotten once
//! the peer has been silent for [`WAIT_FOR`]: first come, first served
//! while the queue drains, newest first while it stands.
//!
//! In a boot storm more machines ask for their boot file at once than
//! `max_transfers` serves. Refusing them makes firmware back off for
//! seconds (or give up); holding them costs a few hundred bytes each and no
//! descriptor, and each starts the moment a transfer ends. A peer that
//! resends its request while it waits keeps its place, with the newest
//! request. A client that is part-way through (it just aborted its size
//! probe and asks for the file itself, from a new port) goes ahead of all
//! the others, so that a storm finishes machines instead of starting them
//! all.
//!
//! Once the oldest request has waited longer than [`STANDING`], the queue
//! is not keeping up, and the oldest are the clients nearest to giving
//! up: firmware stops asking after a few seconds. Serving them first
//! starts transfers whose client is gone by the time the first packet
//! arrives (a storm of 10,000 machines started about 4,800 such, each
//! holding a slot for the resends of a first packet nobody answered).
//! Serving the newest first (adaptive LIFO) spends the slots on clients
//! still listening; when the queue drains, order is first come again.

use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    time::Duration,
};

use tokio::time::Instant;

use super::request::ReadRequest;

/// How long a waiting request is kept after its peer was last heard from.
/// Firmware resends a read request every second or few from the same port,
/// which keeps its place; one silent for longer has most likely given up,
/// and serving it would hold a slot for nothing (in a storm, serving the
/// abandoned requests first is how a queue collapses). A slower client
/// whose entry lapsed is queued again by its next resend.
pub(super) const WAIT_FOR: Duration = Duration::from_secs(3);

/// How long the oldest request may wait before the queue counts as
/// standing and serves the newest first: about one firmware resend
/// interval.
pub(super) const STANDING: Duration = Duration::from_secs(1);

/// What [`Waiting::offer`] did with a request.
pub(super) enum Offer {
    /// Queued at the back.
    Queued,
    /// The peer was already waiting: its request is replaced, its place kept.
    Refreshed,
    /// No room: the request is handed back to be refused.
    Full(Box<ReadRequest>),
}

/// Where [`Waiting::pop`] takes from.
enum Lane {
    /// Clients part-way through, first come first.
    Ahead,
    /// The longest-waiting of the others.
    Oldest,
    /// The newest of the others.
    Newest,
}

struct Entry {
    /// Tells this entry from a later one for the same peer in `order`.
    seq: u64,
    request: ReadRequest,
    heard: Instant,
    /// When the peer's first waiting request arrived.
    queued: Instant,
}

/// The queue. `ahead` (clients part-way through) is served before `order`;
/// both may hold stale slots (a peer forgotten or served), skipped when
/// reached.
pub(super) struct Waiting {
    ahead: VecDeque<(u64, SocketAddr)>,
    order: VecDeque<(u64, SocketAddr)>,
    by_peer: HashMap<SocketAddr, Entry>,
    next_seq: u64,
    capacity: usize,
    /// Requests forgotten because their peer went silent.
    pub expired: u64,
}

impl Waiting {
    pub fn new(capacity: usize) -> Waiting {
        Waiting {
            ahead: VecDeque::new(),
            order: VecDeque::new(),
            by_peer: HashMap::new(),
            next_seq: 0,
            capacity,
            expired: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_peer.is_empty()
    }

    pub fn len(&self) -> usize {
        self.by_peer.len()
    }

    /// Queues `request` (ahead of the others when `first`), or refreshes
    /// the peer's waiting one.
    pub fn offer(
        &mut self,
        peer: SocketAddr,
        request: ReadRequest,
        now: Instant,
        first: bool,
    ) -> Offer {
        if let Some(entry) = self.by_peer.get_mut(&peer) {
            entry.request = request;
            entry.heard = now;
            return Offer::Refreshed;
        }
        if self.by_peer.len() >= self.capacity {
            self.forget_silent(now);
            if self.by_peer.len() >= self.capacity {
                return Offer::Full(Box::new(request));
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        if first {
            self.ahead.push_back((seq, peer));
        } else {
            self.order.push_back((seq, peer));
        }
        self.by_peer.insert(
            peer,
            Entry {
                seq,
                request,
                heard: now,
                queued: now,
            },
        );
        Offer::Queued
    }

    /// The next request to serve whose peer is still asking: the clients
    /// part-way through first, then the longest-waiting one, or the newest
    /// while the queue stands.
    pub fn next(&mut self, now: Instant) -> Option<(SocketAddr, ReadRequest)> {
        if let Some(got) = self.pop(Lane::Ahead, now) {
            return Some(got);
        }
        // Forget the dead slots at the front, where the oldest are, so the
        // count waiting stays true while the newest are served.
        while let Some(&slot) = self.order.front() {
            if self.is_live(slot, now) {
                break;
            }
            self.order.pop_front();
        }
        let &(_, oldest) = self.order.front()?;
        let waited = self
            .by_peer
            .get(&oldest)
            .map(|e| now.duration_since(e.queued));
        let lane = if waited > Some(STANDING) {
            Lane::Newest
        } else {
            Lane::Oldest
        };
        self.pop(lane, now)
    }

    /// Takes the first live entry from `lane`, dropping the dead slots on
    /// the way.
    fn pop(&mut self, lane: Lane, now: Instant) -> Option<(SocketAddr, ReadRequest)> {
        loop {
            let slot = match lane {
                Lane::Ahead => self.ahead.pop_front(),
                Lane::Oldest => self.order.pop_front(),
                Lane::Newest => self.order.pop_back(),
            }?;
            if self.is_live(slot, now) {
                let entry = self.by_peer.remove(&slot.1)?;
                return Some((slot.1, entry.request));
            }
        }
    }

    /// Whether `slot` is still its peer's waiting entry; one whose peer has
    /// been silent for [`WAIT_FOR`] is forgotten and counted.
    fn is_live(&mut self, (seq, peer): (u64, SocketAddr), now: Instant) -> bool {
        match self.by_peer.get(&peer) {
            Some(entry) if entry.seq == seq => {
                if now.duration_since(entry.heard) <= WAIT_FOR {
                    return true;
                }
                self.by_peer.remove(&peer);
                self.expired += 1;
                false
            }
            _ => false,
        }
    }

    /// Drops every waiting request (the server is stopping).
    pub fn clear(&mut self) {
        self.ahead.clear();
        self.order.clear();
        self.by_peer.clear();
    }

    /// Drops every request whose peer has been silent for [`WAIT_FOR`].
    fn forget_silent(&mut self, now: Instant) {
        let before = self.by_peer.len();
        self.by_peer
            .retain(|_, e| now.duration_since(e.heard) <= WAIT_FOR);
        self.expired += (before - self.by_peer.len()) as u64;
        let by_peer = &self.by_peer;
        let live =
            |(seq, peer): &(u64, SocketAddr)| by_peer.get(peer).is_some_and(|e| e.seq == *seq);
        self.ahead.retain(live);
        self.order.retain(live);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(name: &str) -> ReadRequest {
        ReadRequest::octet(name)
    }

    fn peer(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    fn name(got: Option<(SocketAddr, ReadRequest)>) -> Option<(u16, String)> {
        got.map(|(p, r)| (p.port(), r.file))
    }

    #[test]
    fn requests_leave_in_arrival_order_and_a_resend_keeps_its_place() {
        let now = Instant::now();
        let mut w = Waiting::new(8);
        assert!(matches!(
            w.offer(peer(1), request("a"), now, false),
            Offer::Queued
        ));
        assert!(matches!(
            w.offer(peer(2), request("b"), now, false),
            Offer::Queued
        ));
        assert!(matches!(
            w.offer(peer(1), request("a2"), now, false),
            Offer::Refreshed
        ));
        assert_eq!(w.len(), 2);
        assert_eq!(name(w.next(now)), Some((1, "a2".into())));
        assert_eq!(name(w.next(now)), Some((2, "b".into())));
        assert_eq!(name(w.next(now)), None);
        assert!(w.is_empty());
    }

    #[test]
    fn a_client_part_way_through_goes_first() {
        let now = Instant::now();
        let mut w = Waiting::new(8);
        w.offer(peer(1), request("a"), now, false);
        w.offer(peer(2), request("b"), now, true);
        assert_eq!(name(w.next(now)), Some((2, "b".into())));
        assert_eq!(name(w.next(now)), Some((1, "a".into())));
    }

    #[test]
    fn a_full_queue_hands_the_request_back_unless_someone_went_silent() {
        let start = Instant::now();
        let mut w = Waiting::new(2);
        w.offer(peer(1), request("a"), start, false);
        w.offer(peer(2), request("b"), start + Duration::from_secs(2), false);
        let Offer::Full(back) = w.offer(
            peer(3),
            request("c"),
            start + Duration::from_millis(2500),
            false,
        ) else {
            panic!("a third request fit a queue of two");
        };
        assert_eq!(back.file, "c");
        // Peer 1 has been silent past WAIT_FOR: its place goes to peer 3.
        let later = start + WAIT_FOR + Duration::from_secs(1);
        assert!(matches!(
            w.offer(peer(3), request("c"), later, false),
            Offer::Queued
        ));
        assert_eq!(w.expired, 1);
        assert_eq!(w.len(), 2);
    }

    #[test]
    fn a_standing_queue_serves_the_newest_first_until_it_drains() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut w = Waiting::new(8);
        w.offer(peer(1), request("a"), at(0), false);
        w.offer(peer(2), request("b"), at(100), false);
        w.offer(peer(3), request("c"), at(200), false);
        // Within STANDING of the oldest: first come, first served.
        assert_eq!(name(w.next(at(900))), Some((1, "a".into())));
        w.offer(peer(4), request("d"), at(1000), false);
        w.offer(peer(5), request("e"), at(1100), true);
        // Peer 2 has waited past STANDING: the client part-way through,
        // then the newest.
        let late = at(1200);
        assert_eq!(name(w.next(late)), Some((5, "e".into())));
        assert_eq!(name(w.next(late)), Some((4, "d".into())));
        assert_eq!(name(w.next(late)), Some((3, "c".into())));
        assert_eq!(name(w.next(late)), Some((2, "b".into())));
        assert_eq!(name(w.next(late)), None);
        // Drained: a new pair leaves in arrival order again.
        w.offer(peer(6), request("f"), at(1300), false);
        w.offer(peer(7), request("g"), at(1400), false);
        assert_eq!(name(w.next(at(1500))), Some((6, "f".into())));
    }

    #[test]
    fn lapsed_requests_leave_from_the_front_while_the_newest_are_served() {
        let start = Instant::now();
        let mut w = Waiting::new(8);
        w.offer(peer(1), request("a"), start, false);
        w.offer(peer(2), request("b"), start + WAIT_FOR, false);
        w.offer(peer(3), request("c"), start + WAIT_FOR, false);
        let then = start + WAIT_FOR + Duration::from_millis(1);
        // Peer 1 lapsed; peer 2 is the oldest live one and has not waited
        // past STANDING: it goes first, and peer 1 is counted.
        assert_eq!(name(w.next(then)), Some((2, "b".into())));
        assert_eq!(w.expired, 1);
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn a_request_whose_peer_went_silent_is_skipped() {
        let start = Instant::now();
        let mut w = Waiting::new(4);
        w.offer(peer(1), request("a"), start, false);
        w.offer(peer(2), request("b"), start + WAIT_FOR, false);
        let then = start + WAIT_FOR + Duration::from_millis(1);
        assert_eq!(name(w.next(then)), Some((2, "b".into())));
        assert_eq!(w.expired, 1);
    }
}

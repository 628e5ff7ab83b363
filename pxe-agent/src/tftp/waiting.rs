//! Read requests waiting for a transfer slot: first come, first served, one
//! per peer, forgotten once the peer has been silent for [`WAIT_FOR`].
//!
//! In a boot storm more machines ask for their boot file at once than
//! `max_transfers` serves. Refusing them makes firmware back off for
//! seconds (or give up); holding them costs a few hundred bytes each and no
//! descriptor, and each starts the moment a transfer ends. A peer that
//! resends its request while it waits keeps its place, with the newest
//! request. A client that is part-way through (it just aborted its size
//! probe and asks for the file itself, from a new port) goes to the front,
//! so that a storm finishes machines instead of starting them all.

use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    time::Duration,
};

use tokio::time::Instant;

use super::transfer::ReadRequest;

/// How long a waiting request is kept after its peer was last heard from.
/// Firmware resends a read request every second or few from the same port,
/// which keeps its place; one silent for longer has most likely given up,
/// and serving it would hold a slot for nothing (in a storm, serving the
/// abandoned requests first is how a queue collapses). A slower client
/// whose entry lapsed is queued again by its next resend.
pub(super) const WAIT_FOR: Duration = Duration::from_secs(3);

/// What [`Waiting::offer`] did with a request.
pub(super) enum Offer {
    /// Queued at the back.
    Queued,
    /// The peer was already waiting: its request is replaced, its place kept.
    Refreshed,
    /// No room: the request is handed back to be refused.
    Full(Box<ReadRequest>),
}

struct Entry {
    /// Tells this entry from a later one for the same peer in `order`.
    seq: u64,
    request: ReadRequest,
    heard: Instant,
}

/// The queue. `order` may hold stale slots (a peer forgotten or served); they
/// are skipped when reached.
pub(super) struct Waiting {
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

    /// Queues `request` at the back (at the front when `first`), or
    /// refreshes the peer's waiting one.
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
            self.order.push_front((seq, peer));
        } else {
            self.order.push_back((seq, peer));
        }
        self.by_peer.insert(
            peer,
            Entry {
                seq,
                request,
                heard: now,
            },
        );
        Offer::Queued
    }

    /// The longest-waiting request whose peer is still asking.
    pub fn next(&mut self, now: Instant) -> Option<(SocketAddr, ReadRequest)> {
        while let Some((seq, peer)) = self.order.pop_front() {
            let Some(entry) = self.by_peer.get(&peer) else {
                continue;
            };
            if entry.seq != seq {
                continue;
            }
            let entry = self.by_peer.remove(&peer).expect("looked up above");
            if now.duration_since(entry.heard) > WAIT_FOR {
                self.expired += 1;
                continue;
            }
            return Some((peer, entry.request));
        }
        None
    }

    /// Drops every waiting request (the server is stopping).
    pub fn clear(&mut self) {
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
        self.order
            .retain(|(seq, peer)| by_peer.get(peer).is_some_and(|e| e.seq == *seq));
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
        assert_eq!(name(w.next(later)), Some((2, "b".into())));
        assert_eq!(name(w.next(later)), Some((3, "c".into())));
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

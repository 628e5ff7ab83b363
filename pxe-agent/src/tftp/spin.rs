//! Busy-polling a transfer's socket for a short while before it blocks.
//!
//! In lock-step, a block's round trip is mostly the two wake-ups of the
//! sleeping threads, one per direction. A transfer that keeps polling for
//! its client's ACK for a few tens of microseconds catches it without
//! sleeping, and so without being woken. The spin is bounded in time per
//! wait and in the number of transfers spinning at once ([`SpinSlots`]),
//! so a storm of transfers blocks like before instead of burning every
//! CPU; and with more transfers running than CPUs to run them
//! ([`SpinSlots::crowded`]) nobody spins, as every CPU then has a transfer
//! to wake and a spin would only take time from it.

use std::{
    io,
    mem::MaybeUninit,
    net::{SocketAddr, UdpSocket},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use socket2::SockRef;

/// How many transfers may spin at once.
#[derive(Debug)]
pub struct SpinSlots {
    active: AtomicUsize,
    max: usize,
    /// Running transfers past which nobody spins.
    crowd: usize,
}

impl SpinSlots {
    /// Half the CPUs this process may use, at least one.
    pub fn for_this_machine() -> SpinSlots {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        SpinSlots {
            crowd: 2 * cpus,
            ..SpinSlots::new((cpus / 2).max(1))
        }
    }

    pub fn new(max: usize) -> SpinSlots {
        SpinSlots {
            active: AtomicUsize::new(0),
            max,
            crowd: usize::MAX,
        }
    }

    /// Whether `running` transfers are too many for anyone to spin.
    pub fn crowded(&self, running: u64) -> bool {
        running > self.crowd as u64
    }

    fn acquire(&self) -> Option<SlotGuard<'_>> {
        self.active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| SlotGuard(self))
    }
}

struct SlotGuard<'a>(&'a SpinSlots);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A transfer's busy-poll: how long one wait may spin, and the slots it
/// competes for.
#[derive(Clone, Copy, Debug)]
pub struct BusyPoll<'a> {
    pub budget: Duration,
    pub slots: &'a SpinSlots,
}

impl BusyPoll<'_> {
    /// Polls `socket` without blocking until a datagram arrives (received
    /// into `buf`), `budget` or `deadline` passes, or no slot is free.
    /// `None` when nothing arrived: the caller then blocks as usual, which
    /// also handles empty datagrams, errors and a shut-down socket.
    pub fn receive(
        &self,
        socket: &UdpSocket,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Option<(usize, SocketAddr)> {
        if self.budget.is_zero() {
            return None;
        }
        let _slot = self.slots.acquire()?;
        let until = deadline.min(Instant::now() + self.budget);
        // SAFETY: MaybeUninit<u8> has the layout of u8, and recv only
        // writes initialized bytes, so `buf` stays initialized.
        let uninit = unsafe { &mut *(std::ptr::from_mut(buf) as *mut [MaybeUninit<u8>]) };
        let sock = SockRef::from(socket);
        loop {
            match sock.recv_from_with_flags(uninit, libc::MSG_DONTWAIT) {
                Ok((len, from)) if len > 0 => return from.as_socket().map(|from| (len, from)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                _ => return None,
            }
            if Instant::now() >= until {
                return None;
            }
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let b = UdpSocket::bind("127.0.0.1:0").expect("bind");
        (a, b)
    }

    #[test]
    fn a_queued_datagram_is_caught_without_blocking() {
        let (server, client) = pair();
        client
            .send_to(b"ack", server.local_addr().expect("addr"))
            .expect("send");
        let slots = SpinSlots::new(1);
        let poll = BusyPoll {
            budget: Duration::from_millis(50),
            slots: &slots,
        };
        let mut buf = [0u8; 8];
        let got = poll.receive(&server, &mut buf, Instant::now() + Duration::from_secs(1));
        assert_eq!(got, Some((3, client.local_addr().expect("addr"))));
        assert_eq!(slots.active.load(Ordering::Acquire), 0, "slot given back");
    }

    #[test]
    fn spinning_is_bounded_by_budget_and_slots() {
        let (server, _client) = pair();
        let slots = SpinSlots::new(1);
        let poll = BusyPoll {
            budget: Duration::from_millis(5),
            slots: &slots,
        };
        let mut buf = [0u8; 8];
        let started = Instant::now();
        assert_eq!(
            poll.receive(&server, &mut buf, started + Duration::from_secs(1)),
            None
        );
        let spent = started.elapsed();
        assert!(
            spent >= Duration::from_millis(5) && spent < Duration::from_millis(500),
            "{spent:?}"
        );
        // With the only slot taken, a second transfer does not spin at all.
        let _held = slots.acquire().expect("free slot");
        let started = Instant::now();
        assert_eq!(
            poll.receive(&server, &mut buf, started + Duration::from_secs(1)),
            None
        );
        assert!(started.elapsed() < Duration::from_millis(5));
        // A zero budget turns it off.
        let off = BusyPoll {
            budget: Duration::ZERO,
            slots: &SpinSlots::new(1),
        };
        assert_eq!(
            off.receive(&server, &mut buf, Instant::now() + Duration::from_secs(1)),
            None
        );
    }
}

//! The fast path's event slots, written by the XDP program in the kernel
//! (`BPF_PROG_TEST_RUN`) and read through the agent's own reader: every
//! reply is one event with what was answered, a REQUEST dropped for naming
//! another server one with the server it named, a reader that falls behind
//! loses the oldest and counts them, and what was read is not read again.

use std::net::Ipv4Addr;

use pxe_agent::xdp::events::EventReader;
use pxe_ebpf_common::{BootClass, Counter, EVENT_SLOTS, ServedEvent, bootp};

use crate::{
    fixture::{Fixture, WORKER_MAC, XDP_DROP, XDP_TX},
    frame::{Req, SERVER_IP},
};

/// Keeps the calling thread on CPU 0, where the program then runs: each
/// CPU has its own slots.
fn on_cpu0() {
    // SAFETY: a zeroed cpu_set_t with one bit set, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
            0,
            "failed to pin the test thread to CPU 0"
        );
    }
}

fn monotonic_coarse_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) },
        0
    );
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn reader(fx: &mut Fixture) -> EventReader {
    fx.fast
        .take_events()
        .expect("the fast path has an event reader")
}

fn drain(reader: &mut EventReader) -> (Vec<ServedEvent>, u64) {
    let mut events = Vec::new();
    let drained = reader
        .drain(|e| events.push(*e))
        .expect("the event slots drain");
    assert_eq!(drained.read, events.len() as u64);
    (events, drained.lost)
}

fn answer(fx: &Fixture, frame: &[u8]) {
    let (action, _) = fx.run(frame);
    assert_eq!(action, XDP_TX, "the program did not answer");
}

#[test]
fn every_reply_is_one_event_with_what_was_answered() {
    on_cpu0();
    let mut fx = Fixture::new();
    let mut events = reader(&mut fx);
    let host = fx.worker_ip();
    let before = monotonic_coarse_ns();
    let mut req = Req::discover(WORKER_MAC).pxe(7);
    answer(&fx, &req.frame());
    req = req.request();
    req.requested_ip = Some(host);
    req.server_id = Some(SERVER_IP);
    answer(&fx, &req.frame());
    let after = monotonic_coarse_ns();

    let (got, lost) = drain(&mut events);
    assert_eq!(lost, 0);
    let kinds: Vec<u8> = got.iter().map(|e| e.msg_type).collect();
    assert_eq!(kinds, [bootp::DHCPOFFER, bootp::DHCPACK]);
    for e in &got {
        assert_eq!(e.mac, WORKER_MAC);
        assert_eq!(e.class, BootClass::UefiX64 as u8);
        assert_eq!(e.yiaddr, host.octets());
        // The program reads the coarse clock once a tick: at most a tick
        // (4 ms at HZ=250, 10 ms at HZ=100) before the request was made.
        assert!(
            e.at_ns + 10_000_000 >= before && e.at_ns <= after,
            "event time {} outside {before}..={after}",
            e.at_ns
        );
    }
    let (again, lost) = drain(&mut events);
    assert!(again.is_empty(), "events were read twice: {again:?}");
    assert_eq!(lost, 0);
}

#[test]
fn a_request_naming_another_server_is_dropped_as_it_came_and_streamed() {
    on_cpu0();
    let mut fx = Fixture::new();
    let mut events = reader(&mut fx);
    let other = Ipv4Addr::new(10, 66, 0, 2);
    let mut req = Req::discover(WORKER_MAC).pxe(7).request();
    req.requested_ip = Some(fx.worker_ip());
    req.server_id = Some(other);
    let frame = req.frame();
    let before = fx.stats().get(Counter::DropOtherServer);
    let (action, out) = fx.run(&frame);
    assert_eq!(action, XDP_DROP, "the verdict stays a drop");
    assert_eq!(out, frame, "the frame is not touched");
    assert_eq!(fx.stats().get(Counter::DropOtherServer), before + 1);

    let (got, lost) = drain(&mut events);
    assert_eq!(lost, 0);
    assert_eq!(got.len(), 1, "one event: {got:?}");
    let e = got[0];
    assert_eq!(e.msg_type, bootp::DHCPREQUEST);
    assert_eq!(e.mac, WORKER_MAC);
    assert_eq!(e.class, BootClass::UefiX64 as u8);
    assert_eq!(e.yiaddr, other.octets(), "the server the client named");
    // A REQUEST naming this server is answered, as an ACK event.
    req.server_id = Some(SERVER_IP);
    answer(&fx, &req.frame());
    let (got, _) = drain(&mut events);
    let kinds: Vec<u8> = got.iter().map(|e| e.msg_type).collect();
    assert_eq!(kinds, [bootp::DHCPACK]);
}

#[test]
fn a_reader_that_falls_behind_loses_the_oldest_and_counts_them() {
    on_cpu0();
    let mut fx = Fixture::new();
    let mut events = reader(&mut fx);
    let extra = 100;
    let frame = |xid: u32| {
        let mut req = Req::discover(WORKER_MAC).pxe(0);
        req.xid = xid;
        req.frame()
    };
    for xid in 0..EVENT_SLOTS + extra {
        answer(&fx, &frame(xid));
    }
    let (got, lost) = drain(&mut events);
    assert_eq!(lost, u64::from(extra), "the overwritten events are counted");
    assert_eq!(
        got.len(),
        EVENT_SLOTS as usize,
        "a whole CPU's slots are read"
    );
    assert!(got.iter().all(|e| e.msg_type == bootp::DHCPOFFER));
    // Read on from where it stopped.
    answer(&fx, &frame(1));
    let (got, lost) = drain(&mut events);
    assert_eq!((got.len(), lost), (1, 0));
}

//! The XDP program on a million mutated DHCP requests (`BPF_PROG_TEST_RUN`):
//! bit flips, truncations, option lengths and IPv4/UDP lengths that lie,
//! option soup, for reserved and unknown MACs. It may answer only what the
//! slow path would answer byte for byte: a request the slow path's parser
//! accepts and `decide` answers; every answer decodes with dhcproto; a
//! frame it does not answer leaves it untouched; and its counters account
//! for every request exactly once.

use std::time::Instant;

use dhcproto::{Decodable as _, Decoder, v4::Message};
use pxe_agent::dhcp::{Answer, Decision, Request, decide, encode, fast_path};
use pxe_ebpf_common::Counter;

use crate::{
    fixture::{BARE_MAC, Fixture, UNKNOWN_MAC, WORKER_MAC, XDP_TX},
    frame::{Req, parse_reply},
    hostile::{mutate, seeds},
    rng::Rng,
};

/// Mutated requests run.
const MUTATED: usize = 1_000_000;
/// Ethernet, IPv4 without options, UDP.
const HEADERS: usize = 42;

/// Lies in the IPv4 total length or UDP length, a truncated frame, or
/// trailing bytes past the IP packet (Ethernet padding, which is legal).
/// Three frames in four are left as built, so that most requests reach the
/// DHCP walk with their payload's own mutation.
fn mutate_frame(rng: &mut Rng, mut f: Vec<u8>) -> Vec<u8> {
    match rng.below(20) {
        0 => {
            let len = rng.next_u64() as u16;
            f[16..18].copy_from_slice(&len.to_be_bytes());
        }
        1 => {
            let len = rng.next_u64() as u16;
            f[38..40].copy_from_slice(&len.to_be_bytes());
        }
        2 => {
            // Both lengths agree with each other, not with the frame.
            let udp = (rng.next_u64() as u16) & 0x7fff;
            f[16..18].copy_from_slice(&(udp + 20).to_be_bytes());
            f[38..40].copy_from_slice(&udp.to_be_bytes());
        }
        3 => f.truncate(HEADERS + rng.below(f.len() - HEADERS + 1)),
        4 => f.extend((0..1 + rng.below(64)).map(|_| rng.next_u64() as u8)),
        _ => {}
    }
    f
}

/// The DHCP payload the kernel's UDP stack would deliver, when the frame's
/// lengths are consistent; `None` for a frame no socket would receive.
fn delivered(frame: &[u8]) -> Option<&[u8]> {
    let ip_len = usize::from(u16::from_be_bytes([frame[16], frame[17]]));
    let udp_len = usize::from(u16::from_be_bytes([frame[38], frame[39]]));
    (udp_len >= 8 && udp_len + 20 == ip_len && 14 + ip_len <= frame.len())
        .then(|| &frame[HEADERS..14 + ip_len])
}

/// Checks an answer to `frame` against the slow path; a panic names the
/// case to replay.
fn check_answer(fx: &Fixture, case: usize, frame: &[u8], out: &[u8]) {
    let payload = delivered(frame)
        .unwrap_or_else(|| panic!("case {case}: answered a frame with lying lengths"));
    let req = Request::parse(payload)
        .unwrap_or_else(|e| panic!("case {case}: answered a request the parser refuses: {e}"));
    let reply = match decide(&req, &fx.inv, &fx.server) {
        Answer::Reply(reply) => reply,
        other => panic!("case {case}: answered where the slow path decides {other:?}"),
    };
    assert_eq!(
        fast_path(&req, &fx.inv, &fx.server),
        Decision::Reply(reply.clone()),
        "case {case}: the kernel answered outside the policy's projection"
    );
    let answer = parse_reply(out);
    assert!(
        answer.ip_csum_ok && answer.udp_csum_ok,
        "case {case}: bad checksum"
    );
    let slow = encode(&reply, &req).expect("slow path encodes");
    assert_eq!(
        answer.payload, slow,
        "case {case}: the answer differs from the slow path's"
    );
    let msg = Message::decode(&mut Decoder::new(&answer.payload))
        .unwrap_or_else(|e| panic!("case {case}: the answer does not decode: {e}"));
    assert_eq!(msg.xid(), req.xid, "case {case}");
}

#[test]
fn a_million_mutated_requests_are_answered_only_as_the_slow_path_would() {
    let fx = Fixture::new();
    let seeds = seeds(&[WORKER_MAC, BARE_MAC, UNKNOWN_MAC]);
    let payloads: Vec<Vec<u8>> = seeds.iter().map(Req::payload).collect();
    let before = fx.stats();
    let mut rng = Rng(0xf022_0001);
    let (mut answered, mut passed_unchanged) = (0u64, 0u64);
    let started = Instant::now();
    // One test run per request: with a repeat count the kernel reruns the
    // program on the frame it rewrote into an answer (see
    // `Fixture::time_per_run`), so repeats would not be more requests.
    for case in 0..MUTATED {
        let seed = &seeds[case % seeds.len()];
        let payload = mutate(&mut rng, payloads[case % seeds.len()].clone());
        let frame = mutate_frame(&mut rng, seed.frame_for(&payload));
        let (action, out) = fx.run(&frame);
        if action == XDP_TX {
            answered += 1;
            check_answer(&fx, case, &frame, &out);
        } else {
            assert_eq!(out, frame, "case {case}: a frame not answered was changed");
            passed_unchanged += 1;
        }
    }
    let took = started.elapsed();
    let after = fx.stats();
    let delta = |c: Counter| after.get(c) - before.get(c);
    // Each request ends in exactly one outcome; `Rx` counts them all and
    // the lost-event counters come on top of an outcome.
    let outcomes: u64 = Counter::ALL
        .iter()
        .filter(|c| ![Counter::Rx, Counter::EventLost, Counter::TraceLost].contains(c))
        .map(|c| delta(*c))
        .sum();
    println!(
        "{MUTATED} mutated requests in {:.1} s: {answered} answered, {passed_unchanged} \
         passed or dropped; counters: {}",
        took.as_secs_f64(),
        Counter::ALL
            .iter()
            .filter(|c| delta(**c) > 0)
            .map(|c| format!("{c:?}={}", delta(*c)))
            .collect::<Vec<_>>()
            .join(" ")
    );
    assert_eq!(
        delta(Counter::Rx),
        MUTATED as u64,
        "rx is not every request"
    );
    assert_eq!(
        outcomes, MUTATED as u64,
        "outcome counters do not sum to the requests"
    );
    assert_eq!(
        delta(Counter::TxOffer) + delta(Counter::TxAck) + delta(Counter::TxProxyOffer),
        answered,
        "answers counted are not the answers sent"
    );
    assert!(
        answered > 0,
        "no mutated request was answered: the check saw nothing"
    );
}

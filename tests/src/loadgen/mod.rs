//! The DHCP load generator behind the `dhcp-loadgen` binary: full
//! DISCOVER/OFFER/REQUEST/ACK exchanges sent as PXE clients would send them
//! (broadcast, giaddr 0, vendor class and option 93), from many MACs, at a
//! fixed rate or as fast as one core allows, for a bounded time.
//!
//! It owns the generator's loop, its exchange table and its result line; the
//! request frames come from [`crate::frame`]. It does not start servers or
//! namespaces: run it inside the client namespace (`ip netns exec`).
//!
//! Its socket ([`socket::PacketSocket`]) is its own rather than
//! [`crate::raw::RawSocket`]: a load generator needs batched, non-blocking
//! sends and receives.

mod pinned;
mod socket;

use std::{
    io,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

pub use pinned::{Class, kernel_time_pinned};
use socket::PacketSocket;

use crate::frame::{Req, udp_frame};

const ETH_HLEN: usize = 14;
/// BOOTP offsets (RFC 2131 section 2), from the start of the message.
const BOOTP_XID: usize = 4;
const BOOTP_YIADDR: usize = 16;
const BOOTP_CHADDR: usize = 28;
const BOOTP_OPTIONS: usize = 240;
const OPTION_USER_CLASS: u8 = 77;
const DHCPOFFER: u8 = 2;
const DHCPACK: u8 = 5;
/// Offset of the BOOTP message in the frames this generator sends.
const PAYLOAD: usize = 42;

/// What one run does.
#[derive(Clone, Debug)]
pub struct Options {
    /// The interface to listen to, and to send on unless `send_iface` is set.
    pub iface: String,
    /// Another interface to send on.
    pub send_iface: Option<String>,
    /// The client MACs, cycled over in order.
    pub macs: Vec<[u8; 6]>,
    /// New exchanges per second; `None` sends as fast as it can.
    pub rate: Option<u32>,
    /// How long new exchanges are started.
    pub duration: Duration,
    /// How long to wait afterwards for the answers still outstanding.
    pub drain: Duration,
    /// An exchange not completed this long after its DISCOVER is lost.
    pub timeout: Duration,
    /// Exchanges outstanding at most; when full, a new exchange starts as
    /// soon as one completes or is lost. Bounds a flood to what keeps the
    /// server saturated instead of burying its answers' REQUESTs.
    pub window: usize,
    /// The user class option (77) value every DISCOVER and REQUEST
    /// carries, if any: `iPXE` makes the requests look like iPXE's own,
    /// which sends the bare string (not RFC 3004's length-prefixed list).
    pub user_class: Option<Vec<u8>>,
    /// Send as a relay agent instead of as the clients themselves.
    pub relay: Option<Relay>,
}

/// A relay agent (RFC 2131 section 4.1): requests go unicast from
/// `giaddr`:67 to the server's port 67 with giaddr set, and answers come
/// back to `giaddr`:67.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Relay {
    pub giaddr: Ipv4Addr,
    /// The relay's own MAC: the listening interface's.
    pub relay_mac: [u8; 6],
    pub server_ip: Ipv4Addr,
    pub server_mac: [u8; 6],
}

/// What one run counted. An exchange is complete when its ACK arrives;
/// latency runs from its DISCOVER to its ACK.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub discovers: u64,
    pub requests: u64,
    pub offers: u64,
    pub acks: u64,
    /// The send phase, which rates are measured over.
    pub duration: Duration,
    pub latency_sum: Duration,
    pub latency_max: Duration,
    /// This process's own CPU time (user + system).
    pub cpu: Duration,
}

impl Report {
    pub fn exchanges_per_s(&self) -> f64 {
        self.acks as f64 / self.duration.as_secs_f64().max(1e-9)
    }

    pub fn discovers_per_s(&self) -> f64 {
        self.discovers as f64 / self.duration.as_secs_f64().max(1e-9)
    }

    /// Exchanges started but not completed, in percent of those started.
    pub fn drop_pct(&self) -> f64 {
        if self.discovers == 0 {
            return 0.0;
        }
        100.0 * self.discovers.saturating_sub(self.acks) as f64 / self.discovers as f64
    }

    pub fn avg_latency(&self) -> Duration {
        match u32::try_from(self.acks) {
            Ok(0) => Duration::ZERO,
            Ok(n) => self.latency_sum / n,
            Err(_) => Duration::from_secs_f64(self.latency_sum.as_secs_f64() / self.acks as f64),
        }
    }

    /// The one machine-readable line `dhcp-loadgen run` prints.
    pub fn line(&self) -> String {
        format!(
            "dhcp-loadgen discovers={} requests={} offers={} acks={} duration_s={:.3} \
             discovers_per_s={:.1} exchanges_per_s={:.1} drop_pct={:.3} avg_us={:.1} \
             max_us={:.1} cpu_s={:.3}",
            self.discovers,
            self.requests,
            self.offers,
            self.acks,
            self.duration.as_secs_f64(),
            self.discovers_per_s(),
            self.exchanges_per_s(),
            self.drop_pct(),
            self.avg_latency().as_secs_f64() * 1e6,
            self.latency_max.as_secs_f64() * 1e6,
            self.cpu.as_secs_f64(),
        )
    }
}

/// Reads a MAC list: one `aa:bb:cc:dd:ee:ff` a line, blank lines ignored
/// (the format perfdhcp's `-M` takes as well).
pub fn parse_macs(text: &str) -> Result<Vec<[u8; 6]>, String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(|line| parse_mac(line).ok_or_else(|| format!("invalid MAC {line:?}")))
        .collect()
}

fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split([':', '-']);
    for byte in &mut mac {
        let part = parts.next()?;
        if part.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// Runs the exchanges `opts` describes and reports what came back.
pub fn run(opts: &Options) -> io::Result<Report> {
    if opts.macs.is_empty() {
        return Err(io::Error::other("no MACs to send from"));
    }
    let mut socket = PacketSocket::open(&opts.iface, opts.send_iface.as_deref())?;
    // Answers to a relay go to giaddr:67. Bound, this socket keeps the
    // kernel from answering each with an ICMP port unreachable; when its
    // small buffer is full the kernel drops them quietly.
    let _relay_port = opts
        .relay
        .map(|relay| std::net::UdpSocket::bind((relay.giaddr, 67)))
        .transpose()?;
    let frames = Frames::new(opts.user_class.as_deref(), opts.relay);
    let mut generator = Generator::new(opts, &mut socket, &frames);
    generator.run()?;
    let mut report = generator.report;
    report.cpu = own_cpu_time();
    Ok(report)
}

/// Kernel time of the XDP program per reply, from `BPF_PROG_TEST_RUN`.
#[derive(Clone, Copy, Debug)]
pub struct KernelTime {
    pub runs: u32,
    /// A BIOS PXE DISCOVER answered with an OFFER.
    pub offer: Duration,
    /// The matching SELECTING REQUEST answered with an ACK.
    pub ack: Duration,
    /// What a call of repeat 1 adds per run over a call of repeat `runs`
    /// ([`harness_cost`]).
    pub harness: Duration,
}

impl KernelTime {
    /// The mean of OFFER and ACK as the kernel reported them, one call a run.
    pub fn per_reply(&self) -> Duration {
        (self.offer + self.ack) / 2
    }

    /// [`KernelTime::per_reply`] less the harness: what a call with repeat
    /// `runs` would report per run, could the program be rerun on the
    /// request rather than on the reply it rewrote the frame into.
    pub fn program(&self) -> Duration {
        self.per_reply().saturating_sub(self.harness)
    }

    /// The one machine-readable line `dhcp-loadgen prog-test-run` prints.
    pub fn line(&self) -> String {
        format!(
            "prog-test-run runs={} offer_ns={} ack_ns={} per_reply_ns={} harness_ns={} \
             program_ns={}",
            self.runs,
            self.offer.as_nanos(),
            self.ack.as_nanos(),
            self.per_reply().as_nanos(),
            self.harness.as_nanos(),
            self.program().as_nanos(),
        )
    }
}

/// What timing one run per `BPF_PROG_TEST_RUN` call adds to each run, over
/// one call that repeats the program `runs` times.
///
/// A reply cannot be timed with a large repeat: the kernel reruns the
/// program on the frame it already rewrote, which times a reply being
/// passed over. One call a run pays, each time, for the kernel's clock
/// reads and the setup around its loop, which a large repeat spreads over
/// all runs. This measures that part on the object's pass-only program
/// (`pxe_pass`, which does nothing), timed both ways on the same frame:
/// the difference of the two means.
pub fn harness_cost(runs: u32) -> Result<Duration, String> {
    use aya::programs::{TestRun as _, TestRunOptions, Xdp};
    let mut ebpf = aya::Ebpf::load(pxe_agent::xdp::loader::object())
        .map_err(|err| format!("failed to load the XDP object: {err}"))?;
    let program: &mut Xdp = ebpf
        .program_mut(pxe_ebpf_common::PASS_PROGRAM_NAME)
        .ok_or("the XDP object has no pass-only program")?
        .try_into()
        .map_err(|err| format!("the pass-only program is not XDP: {err}"))?;
    program
        .load()
        .map_err(|err| format!("the kernel refused the pass-only program: {err}"))?;
    let frame = Req::discover([0x02, 0, 0, 0, 0, 1]).pxe(0).frame();
    let mut out = vec![0u8; 4096];
    let mut time = |repeat: u32| -> Result<Duration, String> {
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(&frame);
        opts.data_out = Some(&mut out);
        opts.repeat = repeat;
        program
            .test_run(opts)
            .map(|res| res.duration)
            .map_err(|err| format!("BPF_PROG_TEST_RUN failed: {err}"))
    };
    let mut single = Duration::ZERO;
    for _ in 0..runs {
        single += time(1)?;
    }
    let single = single / runs.max(1);
    let repeated = time(runs.max(1))?;
    Ok(single.saturating_sub(repeated))
}

/// Loads the XDP program with the test inventory and times `runs` runs each
/// of a PXE DISCOVER and REQUEST the program answers.
///
/// [`Fixture::time_per_run`](crate::fixture::Fixture::time_per_run) makes
/// one `BPF_PROG_TEST_RUN` call per run with repeat 1: with a larger repeat
/// the kernel reruns the program on the frame it already rewrote into a
/// reply, which times a reply being passed over, not a request answered.
pub fn kernel_time_per_reply(runs: u32) -> KernelTime {
    use crate::fixture::{Fixture, WORKER_MAC};
    let fixture = Fixture::new();
    let host = fixture.worker_ip();
    let mut req = Req::discover(WORKER_MAC).pxe(0);
    req.broadcast = true;
    let offer = fixture.time_per_run(&req.frame(), runs);
    req = req.request();
    req.requested_ip = Some(host);
    req.server_id = Some(fixture.server.ip);
    let ack = fixture.time_per_run(&req.frame(), runs);
    let harness = harness_cost(runs).unwrap_or_else(|err| panic!("{err}"));
    KernelTime {
        runs,
        offer,
        ack,
        harness,
    }
}

/// DISCOVER and REQUEST frames with the per-exchange fields patched in.
struct Frames {
    discover: Vec<u8>,
    request: Vec<u8>,
    /// Sent by a relay: the Ethernet source is the relay's, not the client's.
    relayed: bool,
    /// Offsets of the values of options 50 and 54 in `request`.
    requested_ip: usize,
    server_id: usize,
}

impl Frames {
    /// A BIOS PXE client (option 93 = 0, "PXEClient" vendor class) that asks
    /// for broadcast replies, with `user_class` as option 77 if given; or
    /// its requests as `relay` forwards them.
    fn new(user_class: Option<&[u8]>, relay: Option<Relay>) -> Frames {
        let mut req = Req::discover([0; 6]).pxe(0);
        req.broadcast = relay.is_none();
        if let Some(class) = user_class {
            req.extra.push((OPTION_USER_CLASS, class.to_vec()));
        }
        let frame = |req: &mut Req| match relay {
            Some(r) => {
                req.giaddr = r.giaddr;
                udp_frame(
                    r.relay_mac,
                    r.server_mac,
                    r.giaddr,
                    r.server_ip,
                    67,
                    67,
                    &req.payload(),
                )
            }
            None => req.frame(),
        };
        let discover = frame(&mut req);
        req = req.request();
        req.requested_ip = Some(Ipv4Addr::UNSPECIFIED);
        req.server_id = Some(Ipv4Addr::UNSPECIFIED);
        let request = frame(&mut req);
        let options = &request[PAYLOAD..];
        let requested_ip = PAYLOAD + option_value(options, 50).expect("REQUEST carries option 50");
        let server_id = PAYLOAD + option_value(options, 54).expect("REQUEST carries option 54");
        Frames {
            discover,
            request,
            relayed: relay.is_some(),
            requested_ip,
            server_id,
        }
    }

    fn fill_discover<'b>(&self, buf: &'b mut Vec<u8>, mac: [u8; 6], xid: u32) -> &'b [u8] {
        buf.clear();
        buf.extend_from_slice(&self.discover);
        patch_client(buf, mac, xid, self.relayed);
        buf
    }

    fn fill_request<'b>(&self, buf: &'b mut Vec<u8>, mac: [u8; 6], offer: &Answer) -> &'b [u8] {
        buf.clear();
        buf.extend_from_slice(&self.request);
        patch_client(buf, mac, offer.xid, self.relayed);
        buf[self.requested_ip..self.requested_ip + 4].copy_from_slice(&offer.yiaddr.octets());
        buf[self.server_id..self.server_id + 4].copy_from_slice(&offer.server_id.octets());
        buf
    }
}

/// The xid, chaddr and, unless a relay sends, the Ethernet source: what
/// differs between clients.
fn patch_client(frame: &mut [u8], mac: [u8; 6], xid: u32, relayed: bool) {
    if !relayed {
        frame[6..12].copy_from_slice(&mac);
    }
    frame[PAYLOAD + BOOTP_XID..PAYLOAD + BOOTP_XID + 4].copy_from_slice(&xid.to_be_bytes());
    frame[PAYLOAD + BOOTP_CHADDR..PAYLOAD + BOOTP_CHADDR + 6].copy_from_slice(&mac);
}

/// The offset, within a BOOTP message, of the value of option `code`.
fn option_value(bootp: &[u8], code: u8) -> Option<usize> {
    let mut off = BOOTP_OPTIONS;
    while off < bootp.len() {
        match bootp[off] {
            0 => off += 1,
            255 => return None,
            c => {
                let len = usize::from(*bootp.get(off + 1)?);
                if c == code && off + 2 + len <= bootp.len() {
                    return Some(off + 2);
                }
                off += 2 + len;
            }
        }
    }
    None
}

/// A server's answer as the generator needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Answer {
    msg_type: u8,
    xid: u32,
    yiaddr: Ipv4Addr,
    server_id: Ipv4Addr,
}

/// Takes apart a BOOTREPLY in an IPv4/UDP frame to the DHCP client port,
/// whatever its destination (broadcast or unicast to chaddr), or to a
/// relay's server port; `None` for anything else.
fn parse_answer(frame: &[u8]) -> Option<Answer> {
    if frame.len() < ETH_HLEN + 20 || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &frame[ETH_HLEN..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ip[0] >> 4 != 4 || ihl < 20 || ip[9] != 17 {
        return None;
    }
    let udp = ip.get(ihl..)?;
    if udp.len() < 8 || !matches!(udp[2..4], [0, 68] | [0, 67]) {
        return None;
    }
    let bootp = &udp[8..];
    if bootp.len() < BOOTP_OPTIONS || bootp[0] != 2 {
        return None;
    }
    let msg_type = *bootp.get(option_value(bootp, 53)?)?;
    let server_id = match option_value(bootp, 54) {
        Some(off) => ipv4_at(bootp, off)?,
        None => ipv4_at(ip, 12)?,
    };
    Some(Answer {
        msg_type,
        xid: u32::from_be_bytes(bootp[BOOTP_XID..BOOTP_XID + 4].try_into().ok()?),
        yiaddr: ipv4_at(bootp, BOOTP_YIADDR)?,
        server_id,
    })
}

fn ipv4_at(bytes: &[u8], off: usize) -> Option<Ipv4Addr> {
    let octets: [u8; 4] = bytes.get(off..off + 4)?.try_into().ok()?;
    Some(Ipv4Addr::from(octets))
}

/// Where an exchange stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Stage {
    #[default]
    Free,
    AwaitOffer,
    AwaitAck,
}

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    xid: u32,
    stage: Stage,
    mac: u32,
    started: Option<Instant>,
}

/// Outstanding exchanges, indexed by the low bits of their xid: xids are
/// handed out in sequence, so a slot is only reused after `SLOTS` newer
/// exchanges, long after its answer would count as lost.
struct Table {
    slots: Vec<Slot>,
    next_xid: u32,
    /// No exchange older than this xid is outstanding.
    oldest_xid: u32,
    outstanding: usize,
}

const SLOTS: usize = 1 << 20;

impl Table {
    fn new(first_xid: u32) -> Table {
        Table {
            slots: vec![Slot::default(); SLOTS],
            next_xid: first_xid,
            oldest_xid: first_xid,
            outstanding: 0,
        }
    }

    fn index(xid: u32) -> usize {
        xid as usize & (SLOTS - 1)
    }

    fn start(&mut self, mac: u32, now: Instant) -> u32 {
        let xid = self.next_xid;
        self.next_xid = xid.wrapping_add(1);
        let slot = &mut self.slots[Self::index(xid)];
        if slot.stage == Stage::Free {
            self.outstanding += 1;
        }
        *slot = Slot {
            xid,
            stage: Stage::AwaitOffer,
            mac,
            started: Some(now),
        };
        xid
    }

    /// The exchange `xid` if it is at `stage`.
    fn get(&mut self, xid: u32, stage: Stage) -> Option<&mut Slot> {
        let slot = &mut self.slots[Self::index(xid)];
        (slot.xid == xid && slot.stage == stage).then_some(slot)
    }

    fn finish(&mut self, xid: u32) {
        self.slots[Self::index(xid)].stage = Stage::Free;
        self.outstanding -= 1;
    }

    /// The oldest exchange still outstanding, if any; skips finished ones.
    fn oldest(&mut self) -> Option<Slot> {
        while self.oldest_xid != self.next_xid {
            let slot = self.slots[Self::index(self.oldest_xid)];
            if slot.xid == self.oldest_xid && slot.stage != Stage::Free {
                return Some(slot);
            }
            self.oldest_xid = self.oldest_xid.wrapping_add(1);
        }
        None
    }

    /// Gives up on exchanges started `timeout` or longer before `now`.
    fn expire(&mut self, now: Instant, timeout: Duration) {
        while let Some(slot) = self.oldest() {
            if slot
                .started
                .is_some_and(|t| now.saturating_duration_since(t) < timeout)
            {
                break;
            }
            self.finish(slot.xid);
        }
    }

    /// When the oldest outstanding exchange will be given up on.
    fn next_expiry(&mut self, timeout: Duration) -> Option<Instant> {
        self.oldest()?.started.map(|t| t + timeout)
    }
}

/// A token bucket of new exchanges. It holds at most half a millisecond's
/// worth (8 to 128), far less than a veth's 256-frame ring: a generator
/// that falls behind (descheduled, say) shows a lower rate rather than a
/// burst that overflows the link and counts as the server's drops.
struct Bucket {
    rate: Option<f64>,
    tokens: f64,
    cap: f64,
    last: Instant,
}

/// New exchanges started per loop turn when sending without a rate.
const FLOOD_BURST: u32 = 32;

impl Bucket {
    fn new(rate: Option<u32>, now: Instant) -> Bucket {
        let rate = rate.map(f64::from);
        let cap = rate.map_or(0.0, |r| (r / 2000.0).clamp(8.0, 128.0));
        Bucket {
            rate,
            tokens: 1.0,
            cap,
            last: now,
        }
    }

    /// How many exchanges may start now.
    fn take(&mut self, now: Instant) -> u32 {
        let Some(rate) = self.rate else {
            return FLOOD_BURST;
        };
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + rate * dt).min(self.cap);
        let n = self.tokens.floor();
        self.tokens -= n;
        n as u32
    }

    /// How long until the next token, or zero when flooding.
    fn wait(&self) -> Duration {
        match self.rate {
            Some(rate) => Duration::from_secs_f64(((1.0 - self.tokens) / rate).max(0.0)),
            None => Duration::ZERO,
        }
    }
}

struct Generator<'a> {
    opts: &'a Options,
    socket: &'a mut PacketSocket,
    frames: &'a Frames,
    table: Table,
    report: Report,
    next_mac: usize,
    /// The answers of one received batch, handled after it is parsed.
    answers: Vec<Answer>,
}

/// Frames received per loop turn at most, so sending keeps its pace.
const RX_BATCH: usize = 256;

impl<'a> Generator<'a> {
    fn new(opts: &'a Options, socket: &'a mut PacketSocket, frames: &'a Frames) -> Generator<'a> {
        Generator {
            opts,
            socket,
            frames,
            table: Table::new(first_xid()),
            report: Report::default(),
            next_mac: 0,
            answers: Vec::with_capacity(socket::BATCH),
        }
    }

    fn run(&mut self) -> io::Result<()> {
        let start = Instant::now();
        let stop_sending = start + self.opts.duration;
        let mut bucket = Bucket::new(self.opts.rate, start);
        loop {
            let now = Instant::now();
            if now >= stop_sending {
                break;
            }
            self.table.expire(now, self.opts.timeout);
            let received = self.receive()?;
            let room = self.opts.window.saturating_sub(self.table.outstanding);
            let sent = bucket.take(now).min(room as u32);
            for _ in 0..sent {
                self.discover(now)?;
            }
            self.socket.flush()?;
            if received == 0 && sent == 0 {
                let wait = if room == 0 {
                    self.until_expiry(now)
                } else {
                    bucket.wait()
                };
                self.socket.wait(wait.min(stop_sending - now))?;
            }
        }
        self.report.duration = start.elapsed();
        self.drain(Instant::now() + self.opts.drain)
    }

    fn until_expiry(&mut self, now: Instant) -> Duration {
        self.table
            .next_expiry(self.opts.timeout)
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }

    /// Collects answers until none are outstanding or `deadline` passes.
    fn drain(&mut self, deadline: Instant) -> io::Result<()> {
        loop {
            let now = Instant::now();
            self.table.expire(now, self.opts.timeout);
            if self.table.outstanding == 0 || now >= deadline {
                break;
            }
            let received = self.receive()?;
            self.socket.flush()?;
            if received == 0 {
                self.socket
                    .wait((deadline - now).min(Duration::from_millis(10)))?;
            }
        }
        Ok(())
    }

    fn discover(&mut self, now: Instant) -> io::Result<()> {
        let mac_idx = self.next_mac;
        self.next_mac = (self.next_mac + 1) % self.opts.macs.len();
        let xid = self.table.start(mac_idx as u32, now);
        let (frames, mac) = (self.frames, self.opts.macs[mac_idx]);
        self.socket.push(|buf| {
            frames.fill_discover(buf, mac, xid);
        })?;
        self.report.discovers += 1;
        Ok(())
    }

    /// Handles every frame already queued, up to [`RX_BATCH`]; returns how many.
    fn receive(&mut self) -> io::Result<usize> {
        let mut n = 0;
        while n < RX_BATCH {
            let got = self.socket.recv_batch()?;
            if got == 0 {
                break;
            }
            n += got;
            let mut answers = std::mem::take(&mut self.answers);
            answers.extend((0..got).filter_map(|i| parse_answer(self.socket.received(i))));
            for answer in answers.drain(..) {
                self.answer(&answer)?;
            }
            self.answers = answers;
        }
        Ok(n)
    }

    fn answer(&mut self, answer: &Answer) -> io::Result<()> {
        match answer.msg_type {
            DHCPOFFER => self.offer(answer),
            DHCPACK => {
                self.ack(answer.xid);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// RFC 2131 4.3.2, SELECTING: the REQUEST names the offering server
    /// (option 54) and asks for the offered address (option 50).
    fn offer(&mut self, offer: &Answer) -> io::Result<()> {
        let Some(slot) = self.table.get(offer.xid, Stage::AwaitOffer) else {
            return Ok(());
        };
        slot.stage = Stage::AwaitAck;
        let mac = self.opts.macs[slot.mac as usize];
        self.report.offers += 1;
        let frames = self.frames;
        self.socket.push(|buf| {
            frames.fill_request(buf, mac, offer);
        })?;
        self.report.requests += 1;
        Ok(())
    }

    fn ack(&mut self, xid: u32) {
        let Some(slot) = self.table.get(xid, Stage::AwaitAck) else {
            return;
        };
        let latency = slot.started.map(|t| t.elapsed()).unwrap_or_default();
        self.table.finish(xid);
        self.report.acks += 1;
        self.report.latency_sum += latency;
        self.report.latency_max = self.report.latency_max.max(latency);
    }
}

/// A different xid range per run, so late answers to an earlier run on the
/// same link never match this one.
fn first_xid() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(16))
        .unwrap_or(0);
    nanos ^ std::process::id().rotate_left(8)
}

/// This process's user + system CPU time so far.
pub fn own_cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{SERVER_IP, parse_reply, udp_frame};

    #[test]
    fn macs_parse_one_a_line() {
        let macs = parse_macs("52:54:00:00:00:01\n\n52-54-00-00-01-ff\n").unwrap();
        assert_eq!(
            macs,
            [[0x52, 0x54, 0, 0, 0, 1], [0x52, 0x54, 0, 0, 1, 0xff]]
        );
        assert!(parse_macs("52:54:00:00:00\n").is_err());
        assert!(parse_macs("52:54:00:00:00:01:02\n").is_err());
    }

    #[test]
    fn request_carries_the_offer_and_the_client() {
        let frames = Frames::new(None, None);
        let mac = [0x52, 0x54, 0, 1, 2, 3];
        let offer = Answer {
            msg_type: DHCPOFFER,
            xid: 0xdead_beef,
            yiaddr: Ipv4Addr::new(10, 66, 1, 2),
            server_id: SERVER_IP,
        };
        let mut buf = Vec::new();
        let frame = frames.fill_request(&mut buf, mac, &offer).to_vec();
        let bootp = &frame[PAYLOAD..];
        assert_eq!(&frame[6..12], &mac);
        assert_eq!(&bootp[BOOTP_CHADDR..BOOTP_CHADDR + 6], &mac);
        assert_eq!(
            &bootp[BOOTP_XID..BOOTP_XID + 4],
            &0xdead_beef_u32.to_be_bytes()
        );
        let requested = option_value(bootp, 50).unwrap();
        assert_eq!(&bootp[requested..requested + 4], &[10, 66, 1, 2]);
        let sid = option_value(bootp, 54).unwrap();
        assert_eq!(&bootp[sid..sid + 4], &SERVER_IP.octets());
        assert_eq!(bootp[option_value(bootp, 53).unwrap()], 3, "DHCPREQUEST");
        assert_eq!(bootp[10] & 0x80, 0x80, "broadcast flag");
        assert!(parse_reply(&frame).ip_csum_ok);
    }

    #[test]
    fn user_class_rides_on_both_requests() {
        let frames = Frames::new(Some(b"iPXE"), None);
        for frame in [&frames.discover, &frames.request] {
            let bootp = &frame[PAYLOAD..];
            let at = option_value(bootp, OPTION_USER_CLASS).expect("option 77");
            assert_eq!(bootp[at - 1], 4, "bare string, as iPXE sends it");
            assert_eq!(&bootp[at..at + 4], b"iPXE");
            assert!(parse_reply(frame).ip_csum_ok);
        }
        let plain = Frames::new(None, None);
        assert_eq!(
            option_value(&plain.discover[PAYLOAD..], OPTION_USER_CLASS),
            None
        );
    }

    #[test]
    fn answers_are_read_from_client_port_frames_only() {
        let mut bootp = vec![0u8; 300];
        bootp[0] = 2;
        bootp[BOOTP_XID..BOOTP_XID + 4].copy_from_slice(&7u32.to_be_bytes());
        bootp[BOOTP_YIADDR..BOOTP_YIADDR + 4].copy_from_slice(&[10, 66, 1, 1]);
        bootp[236..240].copy_from_slice(&[99, 130, 83, 99]);
        bootp[240..246].copy_from_slice(&[53, 1, DHCPACK, 54, 4, 10]);
        bootp[246..250].copy_from_slice(&[66, 0, 1, 255]);
        let frame = udp_frame(
            [2; 6],
            [0xff; 6],
            SERVER_IP,
            Ipv4Addr::BROADCAST,
            67,
            68,
            &bootp,
        );
        let answer = parse_answer(&frame).unwrap();
        assert_eq!(
            answer,
            Answer {
                msg_type: DHCPACK,
                xid: 7,
                yiaddr: Ipv4Addr::new(10, 66, 1, 1),
                server_id: SERVER_IP,
            }
        );
        // Answers to a relay go to its port 67; requests on that port are not answers.
        let to_relay = udp_frame([2; 6], [4; 6], SERVER_IP, SERVER_IP, 67, 67, &bootp);
        assert_eq!(parse_answer(&to_relay).map(|a| a.xid), Some(7));
        bootp[0] = 1;
        let to_server = udp_frame([2; 6], [0xff; 6], SERVER_IP, SERVER_IP, 68, 67, &bootp);
        assert_eq!(parse_answer(&to_server), None);
    }

    #[test]
    fn a_relay_sends_from_its_own_address_with_giaddr() {
        let relay = Relay {
            giaddr: Ipv4Addr::new(10, 66, 250, 2),
            relay_mac: [2, 0, 0, 0, 0, 0x42],
            server_ip: SERVER_IP,
            server_mac: [2, 0, 0, 0, 0, 1],
        };
        let frames = Frames::new(None, Some(relay));
        let mac = [0x52, 0x54, 0, 1, 2, 3];
        let mut buf = Vec::new();
        let frame = frames.fill_discover(&mut buf, mac, 9).to_vec();
        let parsed = parse_reply(&frame);
        assert_eq!(&frame[0..6], &relay.server_mac);
        assert_eq!(
            &frame[6..12],
            &relay.relay_mac,
            "the relay's MAC, not the client's"
        );
        assert_eq!((parsed.sport, parsed.dport), (67, 67));
        assert_eq!((parsed.ip_src, parsed.ip_dst), (relay.giaddr, SERVER_IP));
        assert!(parsed.ip_csum_ok);
        let bootp = &frame[PAYLOAD..];
        assert_eq!(&bootp[24..28], &relay.giaddr.octets(), "giaddr");
        assert_eq!(&bootp[BOOTP_CHADDR..BOOTP_CHADDR + 6], &mac);
        assert_eq!(bootp[10] & 0x80, 0, "no broadcast flag");
    }

    #[test]
    fn bucket_limits_bursts_to_half_a_millisecond() {
        let t0 = Instant::now();
        let mut bucket = Bucket::new(Some(100_000), t0);
        assert_eq!(bucket.take(t0), 1);
        // One second idle refills half a millisecond's worth, not 100,000.
        assert_eq!(bucket.take(t0 + Duration::from_secs(1)), 50);
        assert_eq!(bucket.take(t0 + Duration::from_secs(1)), 0);
        let mut slow = Bucket::new(Some(1_000), t0);
        assert_eq!(slow.take(t0 + Duration::from_secs(1)), 8);
        let mut flood = Bucket::new(None, t0);
        assert_eq!(flood.take(t0), FLOOD_BURST);
    }

    #[test]
    fn lost_exchanges_expire_oldest_first() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(1);
        let mut table = Table::new(u32::MAX - 1);
        let a = table.start(0, t0);
        let b = table.start(1, t0 + Duration::from_millis(500));
        let c = table.start(2, t0 + Duration::from_millis(600));
        table.finish(b);
        assert_eq!(table.next_expiry(timeout), Some(t0 + timeout));
        table.expire(t0 + Duration::from_millis(1550), timeout);
        assert_eq!(table.outstanding, 1);
        assert!(table.get(a, Stage::AwaitOffer).is_none());
        assert!(table.get(c, Stage::AwaitOffer).is_some());
        assert_eq!(
            table.next_expiry(timeout),
            Some(t0 + Duration::from_millis(1600))
        );
        table.expire(t0 + Duration::from_secs(2), timeout);
        assert_eq!((table.outstanding, table.next_expiry(timeout)), (0, None));
    }

    #[test]
    fn report_rates_and_drops() {
        let report = Report {
            discovers: 1000,
            acks: 990,
            duration: Duration::from_secs(2),
            latency_sum: Duration::from_millis(99),
            ..Report::default()
        };
        assert_eq!(report.exchanges_per_s(), 495.0);
        assert!((report.drop_pct() - 1.0).abs() < 1e-9);
        assert_eq!(report.avg_latency(), Duration::from_micros(100));
    }
}

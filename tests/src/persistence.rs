//! Discovery-pool leases end to end: real clients (udhcpc, dhclient, dhcpcd)
//! leasing from the pool, and leases kept on disk across a clean restart and
//! across SIGKILL in the middle of a burst of exchanges.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use dhcproto::{
    Decodable as _, Decoder,
    v4::{DhcpOption, Message, MessageType, OptionCode},
};

use crate::{
    agent::Served,
    frame::{Req, SERVER_IP, parse_reply},
    raw::{RawSocket, in_netns, is_dhcp_reply},
    slow_path,
};

pub type Mac = [u8; 6];

pub fn mac_str(mac: &Mac) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// What one round of exchanges got back, by MAC.
#[derive(Debug, Default)]
pub struct Round {
    pub offered: BTreeMap<Mac, Ipv4Addr>,
    pub acked: BTreeMap<Mac, Ipv4Addr>,
    pub naked: BTreeSet<Mac>,
}

/// A DHCP client on a raw socket in the lab's client namespace that runs
/// DISCOVER → OFFER → REQUEST (selecting the offering server, asking for the
/// offered address) → ACK for many MACs at once.
pub struct Dora {
    sock: RawSocket,
    next_xid: u32,
}

impl Dora {
    pub fn open(served: &Served) -> Dora {
        let ns = served.lab.client_ns().to_string();
        let iface = served.lab.client_if().to_string();
        let sock = in_netns(&ns, move || RawSocket::open(&iface))
            .expect("enter client namespace")
            .expect("raw socket");
        // Distinct per client and per run, so late answers to an earlier
        // client never match this one.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Dora {
            sock,
            next_xid: seed & 0xfff0_0000,
        }
    }

    /// Runs the exchanges of `macs` side by side: all DISCOVERs, then the
    /// OFFERs that come within `timeout`, then a REQUEST per OFFER, then the
    /// ACKs (or NAKs) that come within `timeout`.
    pub fn round(&mut self, macs: &[Mac], timeout: Duration) -> Round {
        self.round_with(macs, timeout, || {})
    }

    /// [`Dora::round`], calling `requested` once the REQUESTs are out.
    pub fn round_with(
        &mut self,
        macs: &[Mac],
        timeout: Duration,
        requested: impl FnOnce(),
    ) -> Round {
        let base = self.next_xid;
        self.next_xid = self.next_xid.wrapping_add(macs.len() as u32 + 1);
        let mut round = Round::default();
        for (i, mac) in macs.iter().enumerate() {
            let mut req = Req::discover(*mac);
            req.broadcast = true;
            req.xid = base.wrapping_add(i as u32);
            self.sock.send(&req.frame()).expect("send DISCOVER");
        }
        let offers = self.collect(base, macs.len(), MessageType::Offer, timeout);
        for (i, ip) in offers.iter().enumerate() {
            let Some((_, ip)) = ip else { continue };
            round.offered.insert(macs[i], *ip);
            let mut req = Req::discover(macs[i]).request();
            req.broadcast = true;
            req.xid = base.wrapping_add(i as u32);
            req.requested_ip = Some(*ip);
            req.server_id = Some(SERVER_IP);
            self.sock.send(&req.frame()).expect("send REQUEST");
        }
        requested();
        let pending = offers.iter().filter(|o| o.is_some()).count();
        if pending == 0 {
            return round;
        }
        let answers = self.collect_any(base, macs.len(), pending, timeout);
        for (i, answer) in answers.iter().enumerate() {
            match answer {
                Some((MessageType::Ack, ip)) => {
                    round.acked.insert(macs[i], *ip);
                }
                Some((MessageType::Nak, _)) => {
                    round.naked.insert(macs[i]);
                }
                _ => {}
            }
        }
        round
    }

    /// Answers of type `want` to the `n` exchanges starting at `base`.
    fn collect(
        &self,
        base: u32,
        n: usize,
        want: MessageType,
        timeout: Duration,
    ) -> Vec<Option<(MessageType, Ipv4Addr)>> {
        let mut got = vec![None; n];
        let mut count = 0;
        let deadline = Instant::now() + timeout;
        while count < n && Instant::now() < deadline {
            let Some((i, kind, ip)) = self.next_answer(base, n) else {
                continue;
            };
            if kind == want && got[i].is_none() {
                got[i] = Some((kind, ip));
                count += 1;
            }
        }
        got
    }

    /// ACKs or NAKs to the `n` exchanges starting at `base`, until `expect`
    /// came or `timeout` passed.
    fn collect_any(
        &self,
        base: u32,
        n: usize,
        expect: usize,
        timeout: Duration,
    ) -> Vec<Option<(MessageType, Ipv4Addr)>> {
        let mut got = vec![None; n];
        let mut count = 0;
        let deadline = Instant::now() + timeout;
        while count < expect && Instant::now() < deadline {
            let Some((i, kind, ip)) = self.next_answer(base, n) else {
                continue;
            };
            if matches!(kind, MessageType::Ack | MessageType::Nak) && got[i].is_none() {
                got[i] = Some((kind, ip));
                count += 1;
            }
        }
        got
    }

    /// The next server answer to one of the `n` exchanges starting at
    /// `base`, waiting up to 10 ms: its index, type and yiaddr.
    fn next_answer(&self, base: u32, n: usize) -> Option<(usize, MessageType, Ipv4Addr)> {
        let frame = self
            .sock
            .recv(Duration::from_millis(10))
            .expect("receive")?;
        if !is_dhcp_reply(&frame) {
            return None;
        }
        let msg = Message::decode(&mut Decoder::new(&parse_reply(&frame).payload))
            .expect("server answer decodes");
        let i = msg.xid().wrapping_sub(base) as usize;
        if i >= n {
            return None;
        }
        let kind = match msg.opts().get(OptionCode::MessageType) {
            Some(DhcpOption::MessageType(t)) => *t,
            _ => return None,
        };
        Some((i, kind, msg.yiaddr()))
    }
}

/// `count` MACs `02:<tag>:00:00:<i>`.
pub fn macs(tag: u8, count: u16) -> Vec<Mac> {
    (0..count)
        .map(|i| {
            let [hi, lo] = i.to_be_bytes();
            [0x02, tag, 0, 0, hi, lo]
        })
        .collect()
}

/// `pxe-agent leases`: MAC → (IP, state).
pub fn leases(served: &Served) -> Vec<(String, Ipv4Addr, String)> {
    served
        .cli(&["leases"])
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((
                f.next()?.to_string(),
                f.next()?.parse().ok()?,
                f.next()?.to_string(),
            ))
        })
        .collect()
}

/// `pxe-agent hosts --discovered`: MAC → IP column.
pub fn discovered(served: &Served) -> BTreeMap<String, String> {
    served
        .cli(&["hosts", "--discovered"])
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.to_string(), f.next()?.to_string()))
        })
        .collect()
}

fn in_range(ip: Ipv4Addr, start: [u8; 4], end: [u8; 4]) -> bool {
    (Ipv4Addr::from(start)..=Ipv4Addr::from(end)).contains(&ip)
}

/// A pool big enough for the burst tests, on the lab's subnet.
pub(crate) const POOL_INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    lease_time: 3600
    pool: {start: 10.66.200.1, end: 10.66.203.250}
discovery: {policy: inspect, profile: inspector, lease_time: 600}
profiles:
  - name: inspector
    boot: {bios: undionly.kpxe}
hosts:
  - mac: "52:54:00:12:34:56"
    ip: 10.66.1.10
    profile: inspector
"#;
const POOL: ([u8; 4], [u8; 4]) = ([10, 66, 200, 1], [10, 66, 203, 250]);

/// Runs `macs` through `dora` in rounds of `window`.
pub(crate) fn lease_all(dora: &mut Dora, macs: &[Mac], window: usize) -> Round {
    let mut all = Round::default();
    for chunk in macs.chunks(window) {
        let r = dora.round(chunk, Duration::from_secs(2));
        all.offered.extend(r.offered);
        all.acked.extend(r.acked);
        all.naked.extend(r.naked);
    }
    all
}

fn assert_distinct_in_pool(what: &str, leased: &BTreeMap<Mac, Ipv4Addr>) {
    let ips: BTreeSet<_> = leased.values().collect();
    assert_eq!(
        ips.len(),
        leased.len(),
        "{what}: an address went twice: {leased:?}"
    );
    for ip in ips {
        assert!(
            in_range(*ip, POOL.0, POOL.1),
            "{what}: {ip} is outside the pool"
        );
    }
}

#[test]
fn pool_leases_survive_a_clean_restart() {
    let mut served = Served::start("pxpersist", POOL_INVENTORY);
    let mut dora = Dora::open(&served);
    let first = macs(0x10, 20);
    let before = lease_all(&mut dora, &first, 20);
    assert_eq!(
        before.acked.len(),
        first.len(),
        "not every MAC got a pool lease: {before:?}\nagent log:\n{}",
        served.log()
    );
    assert_distinct_in_pool("before the restart", &before.acked);

    let status = served.signal_agent(libc::SIGTERM);
    assert!(
        status.success(),
        "agent did not exit cleanly on SIGTERM ({status}); log:\n{}",
        served.log()
    );
    served.restart(&[]);

    let listed: BTreeMap<String, (Ipv4Addr, String)> = leases(&served)
        .into_iter()
        .map(|(mac, ip, state)| (mac, (ip, state)))
        .collect();
    for (mac, ip) in &before.acked {
        assert_eq!(
            listed.get(&mac_str(mac)),
            Some(&(*ip, "bound".to_string())),
            "lease of {} lost or changed across the restart; listed: {listed:?}",
            mac_str(mac)
        );
    }

    let again = lease_all(&mut dora, &first, 20);
    assert_eq!(
        again.acked, before.acked,
        "the same MACs did not get the same addresses after the restart"
    );
    let newcomers = lease_all(&mut dora, &macs(0x11, 20), 20);
    assert_eq!(
        newcomers.acked.len(),
        20,
        "new MACs got no lease: {newcomers:?}"
    );
    let taken: BTreeSet<_> = before.acked.values().collect();
    for (mac, ip) in newcomers.offered.iter().chain(&newcomers.acked) {
        assert!(
            !taken.contains(ip),
            "new MAC {} was given {ip}, which is leased to another MAC",
            mac_str(mac)
        );
    }
    assert_distinct_in_pool("new MACs", &newcomers.acked);
}

#[test]
fn acked_leases_survive_sigkill_mid_burst() {
    let mut served = Served::start("pxkill", POOL_INVENTORY);
    let burst = macs(0x20, 200);
    let acked: Arc<Mutex<BTreeMap<Mac, Ipv4Addr>>> = Arc::default();
    let requested = Arc::new(AtomicUsize::new(0));
    // Shortest time from a round's REQUESTs to its last ACK, in µs.
    let commit_us = Arc::new(AtomicU64::new(u64::MAX));
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let mut dora = Dora::open(&served);
        let (burst, acked, requested, commit_us, stop) = (
            burst.clone(),
            acked.clone(),
            requested.clone(),
            commit_us.clone(),
            stop.clone(),
        );
        std::thread::spawn(move || {
            for chunk in burst.chunks(25) {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let mut out = None;
                let r = dora.round_with(chunk, Duration::from_millis(500), || {
                    out = Some(Instant::now());
                    requested.fetch_add(1, Ordering::SeqCst);
                });
                if let Some(t) = out.filter(|_| r.acked.len() == chunk.len()) {
                    commit_us.fetch_min(t.elapsed().as_micros() as u64, Ordering::SeqCst);
                }
                acked.lock().expect("lock").extend(r.acked);
            }
        })
    };
    // Kill while the fourth round is being bound: halfway through the time
    // earlier rounds took from REQUESTs to ACKs, so that some of its leases
    // may be on disk without their ACKs having gone out.
    let deadline = Instant::now() + Duration::from_secs(10);
    while requested.load(Ordering::SeqCst) < 4 && !sender.is_finished() {
        assert!(
            Instant::now() < deadline,
            "burst sent no REQUESTs; log:\n{}",
            served.log()
        );
        std::hint::spin_loop();
    }
    let half = commit_us.load(Ordering::SeqCst).min(100_000) / 2;
    std::thread::sleep(Duration::from_micros(half));
    served.signal_agent(libc::SIGKILL);
    stop.store(true, Ordering::Relaxed);
    sender.join().expect("burst thread");
    let acked = acked.lock().expect("lock").clone();
    println!(
        "{} of {} MACs ACKed before SIGKILL ({half} µs into round 4)",
        acked.len(),
        burst.len()
    );
    assert!(
        acked.len() < burst.len(),
        "the whole burst finished before the kill; nothing was cut short"
    );
    assert_distinct_in_pool("ACKed before the kill", &acked);

    served.restart(&[]);
    let listed = leases(&served);
    println!(
        "{} leases on disk after the restart (bound but never acknowledged: {})",
        listed.len(),
        listed.len().saturating_sub(acked.len())
    );
    let mut seen = BTreeSet::new();
    for (mac, ip, _) in &listed {
        assert!(
            seen.insert(*ip),
            "{ip} appears twice in the leases ({mac}): {listed:?}"
        );
    }
    let listed: BTreeMap<String, (Ipv4Addr, String)> = listed
        .into_iter()
        .map(|(mac, ip, state)| (mac, (ip, state)))
        .collect();
    for (mac, ip) in &acked {
        assert_eq!(
            listed.get(&mac_str(mac)),
            Some(&(*ip, "bound".to_string())),
            "{} was ACKed {ip} before the kill, but the restarted agent lists {:?}",
            mac_str(mac),
            listed.get(&mac_str(mac))
        );
    }

    let mut dora = Dora::open(&served);
    let acked_macs: Vec<Mac> = acked.keys().copied().collect();
    let again = lease_all(&mut dora, &acked_macs, 25);
    for (mac, ip) in &acked {
        assert_eq!(
            again.acked.get(mac),
            Some(ip),
            "{} no longer gets the address it was ACKed before the kill",
            mac_str(mac)
        );
    }
    let newcomers = lease_all(&mut dora, &macs(0x21, 100), 25);
    assert_eq!(
        newcomers.acked.len(),
        100,
        "new MACs got no lease: {newcomers:?}"
    );
    let taken: BTreeSet<_> = acked.values().collect();
    for (mac, ip) in newcomers.offered.iter().chain(&newcomers.acked) {
        assert!(
            !taken.contains(ip),
            "new MAC {} was given {ip}, ACKed to another MAC before the kill",
            mac_str(mac)
        );
    }
    assert_distinct_in_pool("new MACs", &newcomers.acked);
}

/// Runs dhclient once in the client namespace and stops the daemon it
/// leaves behind; returns its lease file.
fn dhclient(served: &Served) -> String {
    let (lease, pid, conf) = (
        served.dir.path("dhclient.leases"),
        served.dir.path("dhclient.pid"),
        served.dir.path("dhclient.conf"),
    );
    std::fs::write(&conf, "timeout 15;\n").expect("dhclient config");
    let out = served
        .client_cmd("dhclient")
        .args(["-4", "-1", "-sf", "/bin/true", "-cf"])
        .arg(&conf)
        .arg("-lf")
        .arg(&lease)
        .arg("-pf")
        .arg(&pid)
        .arg(served.lab.client_if())
        .output()
        .expect("run dhclient");
    // dhclient forks into the background once bound: stop the daemon it
    // started, by the PID it wrote.
    if let Some(p) = std::fs::read_to_string(&pid)
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
    {
        // SAFETY: signals the PID our own dhclient wrote.
        unsafe { libc::kill(p, libc::SIGTERM) };
    }
    assert!(
        out.status.success(),
        "dhclient failed: {}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        served.log()
    );
    std::fs::read_to_string(&lease).expect("dhclient lease file")
}

#[test]
fn unknown_macs_get_distinct_pool_leases_from_udhcpc_dhclient_and_dhcpcd() {
    let served = Served::start("pxpool", slow_path::INVENTORY);
    let pool = ([10, 66, 200, 1], [10, 66, 200, 20]);
    let mut leased = BTreeMap::new();

    served.set_client_mac("52:54:00:aa:cc:01");
    let lease = served.udhcpc(&[]);
    leased.insert("52:54:00:aa:cc:01", lease["ip"].clone());

    served.set_client_mac("52:54:00:aa:cc:02");
    let file = dhclient(&served);
    let ip = file
        .lines()
        .find_map(|l| l.trim().strip_prefix("fixed-address "))
        .and_then(|v| v.strip_suffix(';'))
        .unwrap_or_else(|| panic!("no address in dhclient's lease file: {file}"));
    assert!(
        file.contains("option dhcp-server-identifier 10.66.0.1;"),
        "dhclient's lease is not from the agent: {file}"
    );
    leased.insert("52:54:00:aa:cc:02", ip.to_string());

    served.set_client_mac("52:54:00:aa:cc:03");
    let lease = served.dhcpcd();
    assert_eq!(
        lease["server"], "10.66.0.1",
        "dhcpcd's lease is not from the agent"
    );
    leased.insert("52:54:00:aa:cc:03", lease["ip"].clone());

    let ips: BTreeSet<&String> = leased.values().collect();
    assert_eq!(
        ips.len(),
        leased.len(),
        "an address went to two clients: {leased:?}"
    );
    for (mac, ip) in &leased {
        let ip: Ipv4Addr = ip
            .parse()
            .unwrap_or_else(|_| panic!("{mac} got no address: {leased:?}"));
        assert!(
            in_range(ip, pool.0, pool.1),
            "{mac} got {ip}, outside the pool"
        );
    }
    let listed = discovered(&served);
    for (mac, ip) in &leased {
        assert_eq!(
            listed.get(*mac),
            Some(ip),
            "{mac} is not listed for adoption with its address: {listed:?}"
        );
    }
}

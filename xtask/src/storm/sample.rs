//! What the server side did during a run: `server.csv` (the stack's CPU
//! every 100 ms and its memory every second, from a thread of its own) and
//! the drop counters read before and after the run for `meta.json`.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::{lab::StormLab, stacks::METRICS_ADDR};
use crate::bench::{boot::servers::tree_cpu_ticks, dhcp::cpu::thread_time};

/// Sampling period of `server.csv`.
const PERIOD: Duration = Duration::from_millis(100);
/// Memory is read every this many samples: `smaps_rollup` walks the page
/// tables of the whole stack under its mmap lock, which every 100 ms took a
/// seventh of this two-CPU machine from the stack it measured.
const PSS_EVERY: u32 = 10;

/// The sampler thread; [`Sampler::finish`] stops it and writes the file.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<String>,
    out: PathBuf,
}

impl Sampler {
    /// Starts sampling `pids` (and their children) plus the NAPI thread
    /// `napi`; t_ms counts from now.
    pub fn start(pids: Vec<u32>, napi: u32, out: PathBuf) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = thread::spawn(move || {
            let tick_ms = 1000.0 / clock_ticks_per_sec();
            let napi_start = thread_time(napi).unwrap_or_default();
            let cpu_start: u64 = pids.iter().map(|&p| tree_cpu_ticks(p)).sum();
            let t0 = Instant::now();
            let mut csv = String::from("t_ms,cpu_ms,pss_kib\n");
            let mut next = t0;
            let (mut pss, mut sample) = (0, 0u32);
            loop {
                let ticks = pids.iter().map(|&p| tree_cpu_ticks(p)).sum::<u64>() - cpu_start;
                let napi_ms = thread_time(napi)
                    .unwrap_or_default()
                    .saturating_sub(napi_start)
                    .as_secs_f64()
                    * 1000.0;
                if sample % PSS_EVERY == 0 {
                    pss = pids.iter().map(|&p| tree_pss_kib(p)).sum::<u64>();
                }
                sample += 1;
                let _ = writeln!(
                    csv,
                    "{:.0},{:.1},{pss}",
                    t0.elapsed().as_secs_f64() * 1000.0,
                    ticks as f64 * tick_ms + napi_ms
                );
                if flag.load(Ordering::Relaxed) {
                    return csv;
                }
                next += PERIOD;
                thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        });
        Sampler { stop, handle, out }
    }

    /// Stops the thread and writes `server.csv`.
    pub fn finish(self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let csv = self
            .handle
            .join()
            .map_err(|_| anyhow::anyhow!("the sampler thread panicked"))?;
        fs::write(&self.out, csv).with_context(|| format!("failed to write {}", self.out.display()))
    }
}

fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as f64 } else { 100.0 }
}

/// Proportional set size of `pid` and its direct children (nginx's
/// workers, tftpd-hpa's forks): pages shared by several processes count
/// once in all, as they cost once, where summed RSS would count them per
/// process.
fn tree_pss_kib(pid: u32) -> u64 {
    let children =
        fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    std::iter::once(pid)
        .chain(children.split_whitespace().filter_map(|c| c.parse().ok()))
        .map(pss_kib)
        .sum()
}

fn pss_kib(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// The server side's drop counters at one moment.
#[derive(Debug, Clone, Default)]
pub struct Drops {
    pub iface_rx_dropped: u64,
    pub udp_rcvbuf_errors: u64,
    /// Datagrams the server's kernel dropped on the way out (the veth's
    /// ring toward the machines full: ENOBUFS, which UDP counts here).
    pub udp_sndbuf_errors: u64,
    pub udp_in_errors: u64,
    /// Replies the XDP program sent (`XDP_TX`) that the veth could not
    /// hand on: its peer's ring full (`ethtool -S`, `*xdp_tx_errors`).
    pub xdp_tx_errors: u64,
    /// The agent's storm guard (slow-path rate limit) drops; `None` for
    /// stacks without its metrics.
    pub agent_storm_guard: Option<u64>,
}

/// UDP datagrams the simulator's namespace dropped: (receive buffers
/// full, a simulator that falls behind; sends dropped, the veth's ring
/// toward the server full).
pub fn sim_udp_drops(net: &StormLab) -> anyhow::Result<(u64, u64)> {
    let snmp = net
        .lab
        .run_in(net.lab.client_ns(), &["cat", "/proc/net/snmp"])?;
    let udp = udp_counters(&snmp);
    let get = |name: &str| udp.get(name).copied().unwrap_or(0);
    Ok((get("RcvbufErrors"), get("SndbufErrors")))
}

/// The agent's /metrics page, read in the server namespace.
pub fn agent_metrics(net: &StormLab) -> anyhow::Result<String> {
    let url = format!("http://{METRICS_ADDR}/metrics");
    net.lab.run_in(net.lab.server_ns(), &["curl", "-sf", &url])
}

impl Drops {
    /// Reads the counters in the server namespace; `agent` asks the
    /// agent's metrics endpoint too.
    pub fn read(net: &StormLab, agent: bool) -> anyhow::Result<Drops> {
        let (lab, ns) = (&net.lab, net.lab.server_ns());
        let path = format!("/sys/class/net/{}/statistics/rx_dropped", lab.server_if());
        let iface_rx_dropped = lab
            .run_in(ns, &["cat", &path])?
            .trim()
            .parse()
            .with_context(|| format!("unexpected {path}"))?;
        let snmp = udp_counters(&lab.run_in(ns, &["cat", "/proc/net/snmp"])?);
        let xdp_tx_errors = ethtool_sum(
            &lab.run_in(ns, &["ethtool", "-S", lab.server_if()])?,
            "xdp_tx_errors",
        );
        let agent_storm_guard = if agent {
            agent_metrics(net)
                .ok()
                .map(|body| metric_sum(&body, STORM_GUARD_METRIC))
        } else {
            None
        };
        Ok(Drops {
            iface_rx_dropped,
            udp_rcvbuf_errors: snmp.get("RcvbufErrors").copied().unwrap_or(0),
            udp_sndbuf_errors: snmp.get("SndbufErrors").copied().unwrap_or(0),
            udp_in_errors: snmp.get("InErrors").copied().unwrap_or(0),
            xdp_tx_errors,
            agent_storm_guard,
        })
    }

    /// What grew from `before` to `self`.
    pub fn since(&self, before: &Drops) -> Drops {
        Drops {
            iface_rx_dropped: self
                .iface_rx_dropped
                .saturating_sub(before.iface_rx_dropped),
            udp_rcvbuf_errors: self
                .udp_rcvbuf_errors
                .saturating_sub(before.udp_rcvbuf_errors),
            udp_sndbuf_errors: self
                .udp_sndbuf_errors
                .saturating_sub(before.udp_sndbuf_errors),
            udp_in_errors: self.udp_in_errors.saturating_sub(before.udp_in_errors),
            xdp_tx_errors: self.xdp_tx_errors.saturating_sub(before.xdp_tx_errors),
            agent_storm_guard: self
                .agent_storm_guard
                .map(|after| after.saturating_sub(before.agent_storm_guard.unwrap_or(0))),
        }
    }
}

/// The sum of the `ethtool -S` counters whose names end in `suffix` (one
/// per queue).
fn ethtool_sum(stats: &str, suffix: &str) -> u64 {
    stats
        .lines()
        .filter_map(|line| line.trim().split_once(':'))
        .filter(|(name, _)| name.trim().ends_with(suffix))
        .filter_map(|(_, value)| value.trim().parse::<u64>().ok())
        .sum()
}

/// The agent's storm-guard counter, one sample per bucket.
const STORM_GUARD_METRIC: &str = "pxe_slow_ratelimited_total";

/// The sum of every sample of `name` in a Prometheus text body.
fn metric_sum(body: &str, name: &str) -> u64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(['{', ' ']))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The `Udp:` counters of `/proc/net/snmp` by name.
fn udp_counters(snmp: &str) -> BTreeMap<String, u64> {
    counters(snmp, "Udp:")
}

/// TCP counters that tell a congested or memory-starved lab apart from a
/// slow server: resends and timeouts, memory pressure and what it pruned,
/// full accept queues, aborted connections.
const TCP_COUNTERS: [&str; 10] = [
    "RetransSegs",
    "TCPTimeouts",
    "TCPAbortOnTimeout",
    "TCPMemoryPressures",
    "TCPRcvPruned",
    "TCPOFODrop",
    "TCPRcvQDrop",
    "TCPBacklogDrop",
    "ListenOverflows",
    "TCPZeroWindowDrop",
];

/// [`TCP_COUNTERS`] of the server and the client namespace.
pub fn tcp_counters(net: &StormLab) -> anyhow::Result<[BTreeMap<String, u64>; 2]> {
    Ok([
        tcp_counters_in(net, net.lab.server_ns())?,
        tcp_counters_in(net, net.lab.client_ns())?,
    ])
}

/// [`TCP_COUNTERS`] in namespace `ns` (`Tcp:` of `/proc/net/snmp`,
/// `TcpExt:` of `/proc/net/netstat`).
fn tcp_counters_in(net: &StormLab, ns: &str) -> anyhow::Result<BTreeMap<String, u64>> {
    let text = net
        .lab
        .run_in(ns, &["cat", "/proc/net/snmp", "/proc/net/netstat"])?;
    let mut all = counters(&text, "Tcp:");
    all.extend(counters(&text, "TcpExt:"));
    Ok(TCP_COUNTERS
        .iter()
        .map(|name| ((*name).to_owned(), all.get(*name).copied().unwrap_or(0)))
        .collect())
}

/// What each counter grew by from `before` to `after`.
pub fn growth(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(name, v)| {
            let was = before.get(name).copied().unwrap_or(0);
            (name.clone(), v.saturating_sub(was))
        })
        .collect()
}

/// The counters of the `prefix` lines of a `/proc/net/snmp`-style text
/// by name (a header line, then a line of values).
fn counters(text: &str, prefix: &str) -> BTreeMap<String, u64> {
    let mut lines = text.lines().filter(|l| {
        l.strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with(' '))
    });
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return BTreeMap::new();
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .skip(1)
        .filter_map(|(n, v)| Some((n.to_owned(), v.parse().ok()?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_udp_counters_and_metric_sums() {
        let snmp = "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors\n\
                    Udp: 10 2 7 9 5\nUdpLite: InDatagrams\nUdpLite: 0\n";
        let udp = udp_counters(snmp);
        assert_eq!(udp["InErrors"], 7);
        assert_eq!(udp["RcvbufErrors"], 5);
        let body = "# HELP x\npxe_slow_ratelimited_total{scope=\"mac\"} 3\n\
                    pxe_slow_ratelimited_total{scope=\"unknown\"} 4\npxe_slow_other 9\n";
        assert_eq!(metric_sum(body, "pxe_slow_ratelimited_total"), 7);
    }

    #[test]
    fn reads_tcp_counters_of_both_files_apart() {
        let text = "Tcp: RtoAlgorithm RetransSegs\nTcp: 1 40\n\
                    TcpExt: SyncookiesSent TCPTimeouts\nTcpExt: 0 6\n";
        assert_eq!(counters(text, "Tcp:")["RetransSegs"], 40);
        assert!(!counters(text, "Tcp:").contains_key("TCPTimeouts"));
        assert_eq!(counters(text, "TcpExt:")["TCPTimeouts"], 6);
        let before = BTreeMap::from([("a".to_owned(), 3)]);
        let after = BTreeMap::from([("a".to_owned(), 10), ("b".to_owned(), 2)]);
        let grew = growth(&before, &after);
        assert_eq!((grew["a"], grew["b"]), (7, 2));
    }

    #[test]
    fn sums_an_ethtool_counter_over_queues() {
        let stats = "NIC statistics:\n     peer_ifindex: 4\n     rx_queue_0_xdp_tx_errors: 12\n     \
                     rx_queue_1_xdp_tx_errors: 3\n     tx_queue_0_xdp_xmit_errors: 9\n";
        assert_eq!(ethtool_sum(stats, "xdp_tx_errors"), 15);
        assert_eq!(ethtool_sum(stats, "absent"), 0);
    }
}

//! The loads and one run of any: start the generator in the client
//! namespace pinned to the generator's core, wait for it to finish by
//! itself, and turn its output and the CPU the run cost into a [`Sample`].
//!
//! - [`LoadKind::Relayed`]: perfdhcp (Kea 2.2). It always acts as a relay:
//!   giaddr is its own address, it sends from port 67 and gets unicast
//!   answers, so this measures the relayed path.
//! - [`LoadKind::RelayedLoadgen`]: dhcp-loadgen as a relay (the same
//!   requests with giaddr set, unicast from the client end's address and
//!   port 67), so the relayed path is measured beyond perfdhcp's limit.
//! - [`LoadKind::Direct`]: dhcp-loadgen. Broadcast DORA exchanges as PXE
//!   firmware sends them (giaddr 0, broadcast flag, vendor class, option 93).
//! - [`LoadKind::Pool`]: dhcp-loadgen from MACs no server knows, each used
//!   once per run, so every exchange takes a new address from the pool
//!   (pxe-agent's slow path: discovery).
//! - [`LoadKind::Ipxe`]: dhcp-loadgen over the reservations with user class
//!   `iPXE` in every request (pxe-agent's slow path: iPXE chainloading).
//! - [`LoadKind::Dhcpv6`]: perfdhcp -6 on the client end, to ff02::1:2
//!   from its link-local address, one DUID-LL a reserved MAC (pxe-agent's
//!   slow path: DHCPv6). An exchange is Solicit, Advertise, Request, Reply.
//!
//! CPU of a run: the server side is the server process plus the server
//! end's NAPI thread; the client side is the generator plus the client end's
//! NAPI thread. The machine's busy time is read as well, to check the two
//! add up and to see what anything else on the machine used meanwhile.

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use xtask::ChildGuard;

use super::{
    cpu::{self, Machine, MachineUsage},
    hosts::{CLIENT_IP, SERVER_IP, Setup},
    reply6,
    report::thousands,
    server::Server,
    testbed::{Bins, SENDER_IF, Testbed},
};

/// How long the generator waits for answers after it stops sending.
const DRAIN: Duration = Duration::from_secs(1);
/// A generator that has not exited this long after its run should have
/// ended is stopped and the run fails.
const GRACE: Duration = Duration::from_secs(15);
/// perfdhcp's DISCOVER carries a 262-byte BOOTP message; DHCP clients pad
/// theirs to at least 300, the size of an RFC 951 BOOTP message (fixed
/// fields and a 64-byte vendor area). On a veth the fast path has too
/// little tailroom to grow a 262-byte request into its reply and passes it
/// up (`pass_no_room`), so perfdhcp's requests get a site-specific option
/// (code 224, RFC 3942) of 38 zero bytes, which brings them to 302 bytes;
/// every server skips it.
const PERFDHCP_PAD: (u8, usize) = (224, 38);
/// The most a clean run may drop, in percent.
pub const CLEAN_DROP_PCT: f64 = 1.0;
/// A run whose generator sent less than this share of its target rate
/// measured the generator, not the server.
const GENERATOR_SHORTFALL: f64 = 0.9;
/// Drops with the client side this busy (share of its one core) and the
/// server side below [`SERVER_SPARE`] are the client's own.
const CLIENT_SATURATED: f64 = 0.9;
const SERVER_SPARE: f64 = 0.5;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadKind {
    Direct,
    Relayed,
    RelayedLoadgen,
    Pool,
    Ipxe,
    Dhcpv6,
}

impl LoadKind {
    pub const ALL: [LoadKind; 6] = [
        LoadKind::Direct,
        LoadKind::Relayed,
        LoadKind::RelayedLoadgen,
        LoadKind::Pool,
        LoadKind::Ipxe,
        LoadKind::Dhcpv6,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LoadKind::Direct => "direct PXE (dhcp-loadgen)",
            LoadKind::Relayed => "relayed (perfdhcp)",
            LoadKind::RelayedLoadgen => "relayed (dhcp-loadgen)",
            LoadKind::Pool => "slow path: unknown MACs, pool (dhcp-loadgen)",
            LoadKind::Ipxe => "slow path: iPXE user class (dhcp-loadgen)",
            LoadKind::Dhcpv6 => "DHCPv6 (perfdhcp -6)",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            LoadKind::Direct => "direct",
            LoadKind::Relayed => "relayed",
            LoadKind::RelayedLoadgen => "relayed, dhcp-loadgen",
            LoadKind::Pool => "pool",
            LoadKind::Ipxe => "iPXE",
            LoadKind::Dhcpv6 => "DHCPv6",
        }
    }

    /// 4 or 6.
    pub fn family(self) -> u8 {
        if self == LoadKind::Dhcpv6 { 6 } else { 4 }
    }

    /// Measured at the slow-path host counts (`--slow-hosts`) rather than
    /// the fast-path ones (`--hosts`). The DHCPv6 load is pxe-agent's slow
    /// path, but all its answers are reservations, so it is measured at
    /// the same host counts as the DHCPv4 reservations.
    pub fn at_slow_hosts(self) -> bool {
        matches!(self, LoadKind::Pool | LoadKind::Ipxe)
    }

    /// How the servers are configured for this load.
    pub fn setup(self) -> Setup {
        match self {
            LoadKind::Direct | LoadKind::Relayed | LoadKind::RelayedLoadgen => Setup::Reservations,
            LoadKind::Pool => Setup::Pool,
            LoadKind::Ipxe => Setup::Ipxe,
            LoadKind::Dhcpv6 => Setup::Dhcpv6,
        }
    }

    /// Every run starts a fresh server with an empty lease database: each
    /// exchange takes a new address, and the pool only has to hold one run.
    pub fn fresh_server_per_run(self) -> bool {
        self == LoadKind::Pool
    }
}

/// One run of a generator against a server.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// New exchanges per second asked for; `None` is as fast as possible.
    pub rate: Option<u32>,
    /// The send phase, which rates are measured over.
    pub duration: Duration,
    pub discovers: u64,
    pub acks: u64,
    pub avg_latency: Duration,
    pub max_latency: Duration,
    pub generator_cpu: Duration,
    pub server_process_cpu: Duration,
    pub server_napi_cpu: Duration,
    pub client_napi_cpu: Duration,
    pub machine: MachineUsage,
    /// DISCOVERs sent from a MAC this run had already used: a pool run
    /// that sent more than its list of unknown MACs holds.
    pub reused_macs: u64,
    /// pxe-agent's counters over the run (`pxe-agent stats`), by sample.
    pub agent: Option<BTreeMap<String, u64>>,
}

impl Sample {
    pub fn exchanges_per_s(&self) -> f64 {
        self.acks as f64 / self.duration.as_secs_f64().max(1e-9)
    }

    pub fn discovers_per_s(&self) -> f64 {
        self.discovers as f64 / self.duration.as_secs_f64().max(1e-9)
    }

    pub fn drop_pct(&self) -> f64 {
        if self.discovers == 0 {
            return 100.0;
        }
        100.0 * self.discovers.saturating_sub(self.acks) as f64 / self.discovers as f64
    }

    /// The generator could not send at the rate asked for.
    pub fn generator_short(&self) -> bool {
        self.rate
            .is_some_and(|rate| self.discovers_per_s() < GENERATOR_SHORTFALL * f64::from(rate))
    }

    /// Why this run measured the generator rather than the server, if it
    /// did: it could not send at the rate asked for, or it dropped answers
    /// while its core was saturated and the server side mostly idle.
    pub fn generator_limit(&self) -> Option<String> {
        if let Some(rate) = self.rate.filter(|_| self.generator_short()) {
            return Some(format!(
                "asked for {}/s, sent {}/s",
                thousands(f64::from(rate)),
                thousands(self.discovers_per_s())
            ));
        }
        let (client, server) = (self.client_load(), self.server_load());
        (self.drop_pct() > CLEAN_DROP_PCT && client >= CLIENT_SATURATED && server < SERVER_SPARE)
            .then(|| {
                format!(
                    "{:.1}% dropped with the client core {:.0}% busy, the server side {:.0}% of a core",
                    self.drop_pct(),
                    client * 100.0,
                    server * 100.0
                )
            })
    }

    /// Share of one core the client side used over the send phase.
    pub fn client_load(&self) -> f64 {
        (self.generator_cpu + self.client_napi_cpu).as_secs_f64()
            / self.duration.as_secs_f64().max(1e-9)
    }

    /// Share of one core the server side used over the send phase.
    pub fn server_load(&self) -> f64 {
        self.server_cpu().as_secs_f64() / self.duration.as_secs_f64().max(1e-9)
    }

    /// Cores' worth of CPU that neither side used: other work on the machine
    /// while the run went on, which it competed with.
    pub fn other_load(&self) -> f64 {
        let other = self
            .machine_minus_client()
            .saturating_sub(self.server_cpu());
        other.as_secs_f64() / self.machine.wall.as_secs_f64().max(1e-9)
    }

    /// The server side: its process and its end's NAPI thread.
    pub fn server_cpu(&self) -> Duration {
        self.server_process_cpu + self.server_napi_cpu
    }

    /// The machine's busy time minus the client side: the server's share
    /// as the whole machine sees it, including anything else that ran.
    pub fn machine_minus_client(&self) -> Duration {
        self.machine
            .busy
            .saturating_sub(self.generator_cpu + self.client_napi_cpu)
    }

    /// The tick-sampled busy fields of `/proc/stat` (user, nice, system,
    /// irq, softirq) minus the generator: what that simpler reading gives.
    pub fn sampled_minus_generator(&self) -> Duration {
        self.machine.sampled_busy.saturating_sub(self.generator_cpu)
    }

    /// CPU seconds per 1,000 completed exchanges.
    pub fn per_1k(&self, cpu: Duration) -> Option<f64> {
        (self.acks > 0).then(|| cpu.as_secs_f64() * 1000.0 / self.acks as f64)
    }
}

/// What a run needs from its surroundings.
pub struct Runner<'a> {
    pub bed: &'a Testbed,
    pub bins: &'a Bins,
    /// One MAC a line: the reservations, for both generators.
    pub macs: &'a Path,
    /// One MAC a line, none reserved, and how many: the pool load's clients.
    pub unknown_macs: Option<(&'a Path, u64)>,
}

impl Runner<'_> {
    /// One run of `load` against `server`: `rate` new exchanges per second
    /// (or as fast as possible) for `duration`.
    pub fn run(
        &self,
        server: &Server,
        load: LoadKind,
        rate: Option<u32>,
        duration: Duration,
    ) -> anyhow::Result<Sample> {
        let mut cmd = self.generator(load, rate, duration)?;
        let counters_before = server.agent_counters(self.bed, self.bins);
        let before = Usage::read(self.bed, server.pid())?;
        let run = run_to_exit(&mut cmd, duration + DRAIN + GRACE)?;
        let after = Usage::read(self.bed, server.pid())?;
        let counters_after = server.agent_counters(self.bed, self.bins);
        let mut sample = match load {
            LoadKind::Direct | LoadKind::RelayedLoadgen | LoadKind::Pool | LoadKind::Ipxe => {
                parse_loadgen(&run.stdout)
            }
            LoadKind::Relayed => parse_perfdhcp(&run.stdout, duration, PERFDHCP4_SECTIONS),
            LoadKind::Dhcpv6 => parse_perfdhcp(&run.stdout, duration, PERFDHCP6_SECTIONS),
        }
        .with_context(|| {
            format!(
                "{} gave no result ({}): {}",
                load.name(),
                run.status,
                run.tail()
            )
        })?;
        sample.rate = rate;
        sample.generator_cpu = run.cpu;
        after.fill(&before, &mut sample);
        if let (LoadKind::Pool, Some((_, count))) = (load, self.unknown_macs) {
            sample.reused_macs = sample.discovers.saturating_sub(count);
        }
        if let (Some(before), Some(after)) = (counters_before, counters_after) {
            sample.agent = Some(counter_delta(&before, &after));
        }
        Ok(sample)
    }

    /// Whether the server answers a short, slow run: direct DHCPv4, or
    /// perfdhcp -6 for the DHCPv6 setup.
    pub fn probe(&self, setup: Setup) -> anyhow::Result<bool> {
        if setup == Setup::Dhcpv6 {
            let mut cmd = self.perfdhcp6(Some(PROBE6_RATE), Duration::from_secs(1));
            let run = run_to_exit(&mut cmd, Duration::from_secs(2) + GRACE)?;
            let sample = parse_perfdhcp(&run.stdout, Duration::from_secs(1), PERFDHCP6_SECTIONS)
                .with_context(|| {
                    format!(
                        "perfdhcp -6 probe gave no result ({}): {}",
                        run.status,
                        run.tail()
                    )
                })?;
            return Ok(sample.acks > 0);
        }
        let mut cmd = self
            .bed
            .lab
            .cmd_in(self.bed.client_ns(), &self.bins.loadgen);
        cmd.args(["run", "--interface", self.bed.client_if()])
            .args(["--send-on", SENDER_IF, "--macs"])
            .arg(self.macs)
            .args(["--rate", "20", "--duration", "0.5", "--drain", "0.5"]);
        let run = run_to_exit(&mut cmd, Duration::from_secs(1) + GRACE)?;
        let sample = parse_loadgen(&run.stdout).with_context(|| {
            format!(
                "dhcp-loadgen probe gave no result ({}): {}",
                run.status,
                run.tail()
            )
        })?;
        Ok(sample.acks > 0)
    }

    fn generator(
        &self,
        load: LoadKind,
        rate: Option<u32>,
        duration: Duration,
    ) -> anyhow::Result<Command> {
        let bed = self.bed;
        let mut cmd = bed.lab.cmd_in(bed.client_ns(), "taskset");
        cmd.args(["-c", &bed.cores.generator_list()]);
        // perfdhcp's -p takes whole seconds only.
        let secs = duration.as_secs().max(1).to_string();
        match load {
            LoadKind::Direct | LoadKind::RelayedLoadgen | LoadKind::Pool | LoadKind::Ipxe => {
                let macs = match (load, self.unknown_macs) {
                    (LoadKind::Pool, Some((file, _))) => file,
                    (LoadKind::Pool, None) => bail!("the pool load needs unknown MACs"),
                    _ => self.macs,
                };
                cmd.arg(&self.bins.loadgen)
                    .args(["run", "--interface", bed.client_if()])
                    .args(["--send-on", SENDER_IF, "--macs"])
                    .arg(macs)
                    .args(["--duration", &secs, "--drain"])
                    .arg(format!("{:.3}", DRAIN.as_secs_f64()))
                    .arg("--rate")
                    .arg(rate.map_or("max".to_owned(), |r| r.to_string()));
                if load == LoadKind::Ipxe {
                    // As iPXE sends it: option 77 = the bare string.
                    cmd.args(["--user-class", "iPXE"]);
                }
                if load == LoadKind::RelayedLoadgen {
                    cmd.args(["--relay", CLIENT_IP, "--server", SERVER_IP])
                        .args(["--server-mac", &bed.server_mac]);
                }
            }
            LoadKind::Relayed => {
                // -g single: one thread, on the one core it is pinned to.
                let (code, len) = PERFDHCP_PAD;
                cmd.args(["perfdhcp", "-4", "-g", "single", "-p", &secs, "-M"])
                    .arg(self.macs)
                    .arg("-o")
                    .arg(format!("{code},{}", "00".repeat(len)));
                if let Some(rate) = rate {
                    cmd.args(["-r", &rate.to_string()]);
                }
                cmd.args(["-l", CLIENT_IP, SERVER_IP]);
            }
            LoadKind::Dhcpv6 => cmd = self.perfdhcp6(rate, duration),
        }
        Ok(cmd)
    }

    /// perfdhcp -6 on the generator's core: one thread, Solicits to
    /// ff02::1:2 from the client end's link-local address, one reserved
    /// MAC from the list (as a DUID-LL) for each exchange.
    fn perfdhcp6(&self, rate: Option<u32>, duration: Duration) -> Command {
        let bed = self.bed;
        let mut cmd = bed.lab.cmd_in(bed.client_ns(), "taskset");
        cmd.args(["-c", &bed.cores.generator_list()])
            .args(["perfdhcp", "-6", "-g", "single", "-p"])
            .arg(duration.as_secs().max(1).to_string())
            .arg("-M")
            .arg(self.macs);
        if let Some(rate) = rate {
            cmd.args(["-r", &rate.to_string()]);
        }
        cmd.args(["-l", bed.client_if()]);
        cmd
    }

    /// Runs perfdhcp -6 at `rate` for `duration` while tcpdump records the
    /// answers on the client end, and checks each Advertise and Reply
    /// against the reservation of the DUID it names.
    pub fn check_replies6(
        &self,
        rate: u32,
        duration: Duration,
        pcap: &Path,
    ) -> anyhow::Result<reply6::Check> {
        let bed = self.bed;
        let mut dump = bed.lab.cmd_in(bed.client_ns(), "tcpdump");
        // --immediate-mode: each packet is handed over as it comes rather
        // than in blocks that a stop can leave unwritten.
        dump.args([
            "-i",
            bed.client_if(),
            "--immediate-mode",
            "-U",
            "-n",
            "-s",
            "0",
        ])
        .arg("-w")
        .arg(pcap)
        .args(["udp", "and", "dst", "port", "546"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let tcpdump = ChildGuard::spawn(&mut dump)?;
        // tcpdump writes the file's header once it listens.
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::metadata(pcap).map_or(0, |m| m.len()) == 0 {
            if Instant::now() >= deadline {
                bail!("tcpdump did not start capturing into {}", pcap.display());
            }
            thread::sleep(Duration::from_millis(50));
        }
        thread::sleep(Duration::from_millis(300));
        let mut cmd = self.perfdhcp6(Some(rate), duration);
        let run = run_to_exit(&mut cmd, duration + DRAIN + GRACE)?;
        thread::sleep(Duration::from_millis(300));
        tcpdump.stop()?;
        let sample =
            parse_perfdhcp(&run.stdout, duration, PERFDHCP6_SECTIONS).with_context(|| {
                format!(
                    "perfdhcp -6 gave no result ({}): {}",
                    run.status,
                    run.tail()
                )
            })?;
        let bytes =
            std::fs::read(pcap).with_context(|| format!("failed to read {}", pcap.display()))?;
        let mut check = reply6::check_capture(&bytes)
            .with_context(|| format!("failed to read the capture {}", pcap.display()))?;
        check.exchanges = sample.acks;
        Ok(check)
    }
}

/// A finished generator: its output and its own CPU time.
struct Finished {
    status: String,
    stdout: String,
    stderr: String,
    cpu: Duration,
}

impl Finished {
    /// The last lines of its output, for error messages.
    fn tail(&self) -> String {
        let lines: Vec<&str> = self.stderr.lines().chain(self.stdout.lines()).collect();
        lines[lines.len().saturating_sub(6)..].join(" | ")
    }
}

/// Runs `cmd` until it exits by itself (or `timeout` passes, which fails).
/// Its CPU time is read while it is a zombie, before it is reaped.
fn run_to_exit(cmd: &mut Command, timeout: Duration) -> anyhow::Result<Finished> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut guard = ChildGuard::spawn(cmd)?;
    let readers = [
        read_all(guard.0.stdout.take()),
        read_all(guard.0.stderr.take()),
    ];
    let deadline = Instant::now() + timeout;
    while !exited(guard.id())? {
        if Instant::now() >= deadline {
            bail!(
                "`{}` still running after {}s",
                xtask::process::describe(cmd),
                timeout.as_secs()
            );
        }
        thread::sleep(Duration::from_millis(10));
    }
    let cpu = cpu::process_time(guard.id())?;
    let status = guard.stop()?;
    let [stdout, stderr] = readers.map(|r| r.join().unwrap_or_default());
    Ok(Finished {
        status: status.to_string(),
        stdout,
        stderr,
        cpu,
    })
}

fn read_all(stream: Option<impl std::io::Read + Send + 'static>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut stream) = stream {
            let _ = stream.read_to_string(&mut text);
        }
        text
    })
}

/// True once `pid` (our child) has exited; it stays unreaped, so its
/// `/proc` entry still holds its final CPU times.
fn exited(pid: u32) -> anyhow::Result<bool> {
    // SAFETY: waitid fills the zeroed siginfo; WNOWAIT leaves the child
    // for ChildGuard to reap.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let flags = libc::WEXITED | libc::WNOWAIT | libc::WNOHANG;
        if libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("waitid on {pid} failed"));
        }
        Ok(info.si_pid() != 0)
    }
}

/// CPU counters read before and after a run.
struct Usage {
    machine: Machine,
    server_process: Duration,
    server_napi: Duration,
    client_napi: Duration,
}

impl Usage {
    fn read(bed: &Testbed, server_pid: u32) -> anyhow::Result<Usage> {
        Ok(Usage {
            machine: Machine::read()?,
            server_process: cpu::process_time(server_pid)?,
            server_napi: cpu::thread_time(bed.napi.server)?,
            client_napi: cpu::thread_time(bed.napi.client)?,
        })
    }

    fn fill(&self, before: &Usage, sample: &mut Sample) {
        sample.machine = self.machine.since(&before.machine);
        sample.server_process_cpu = self.server_process.saturating_sub(before.server_process);
        sample.server_napi_cpu = self.server_napi.saturating_sub(before.server_napi);
        sample.client_napi_cpu = self.client_napi.saturating_sub(before.client_napi);
    }
}

/// What each counter grew by between two readings.
fn counter_delta(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(name, &value)| {
            let was = before.get(name).copied().unwrap_or(0);
            (name.clone(), value.saturating_sub(was))
        })
        .collect()
}

/// dhcp-loadgen's `key=value` result line.
fn parse_loadgen(stdout: &str) -> Option<Sample> {
    let line = stdout.lines().find(|l| l.starts_with("dhcp-loadgen "))?;
    let fields: HashMap<&str, &str> = line
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let num = |k: &str| fields.get(k)?.parse::<f64>().ok();
    let micros = |k: &str| num(k).map(|us| Duration::from_secs_f64(us.max(0.0) / 1e6));
    Some(Sample {
        duration: Duration::from_secs_f64(num("duration_s")?.max(0.0)),
        discovers: fields.get("discovers")?.parse().ok()?,
        acks: fields.get("acks")?.parse().ok()?,
        avg_latency: micros("avg_us")?,
        max_latency: micros("max_us")?,
        ..Sample::default()
    })
}

/// perfdhcp's report sections for the first and second half of an
/// exchange, DHCPv4 and DHCPv6.
const PERFDHCP4_SECTIONS: [&str; 2] = ["DISCOVER-OFFER", "REQUEST-ACK"];
const PERFDHCP6_SECTIONS: [&str; 2] = ["SOLICIT-ADVERTISE", "REQUEST-REPLY"];
/// Exchanges per second of the DHCPv6 readiness probe.
const PROBE6_RATE: u32 = 20;

/// perfdhcp's final report. Exchanges are completed REQUEST-ACK (or
/// REQUEST-REPLY) pairs; latency adds the delays of the two halves (for the
/// maximum that is an upper bound: the two maxima may come from different
/// exchanges). perfdhcp does not count its own turnaround from OFFER to
/// REQUEST, which dhcp-loadgen's latency includes.
fn parse_perfdhcp(stdout: &str, period: Duration, sections: [&str; 2]) -> Option<Sample> {
    let offer = perfdhcp_section(stdout, sections[0])?;
    let ack = perfdhcp_section(stdout, sections[1])?;
    Some(Sample {
        duration: period,
        discovers: offer.sent,
        acks: ack.received,
        avg_latency: offer.avg + ack.avg,
        max_latency: offer.max + ack.max,
        ..Sample::default()
    })
}

#[derive(Debug, PartialEq)]
struct PerfdhcpStats {
    sent: u64,
    received: u64,
    avg: Duration,
    max: Duration,
}

fn perfdhcp_section(stdout: &str, name: &str) -> Option<PerfdhcpStats> {
    let start = stdout.find(&format!("***Statistics for: {name}***"))?;
    // The section runs from the line after its header to the next header.
    let body = stdout[start..]
        .split_once('\n')
        .map_or("", |(_, rest)| rest);
    let body = body.find("***").map_or(body, |end| &body[..end]);
    let value = |key: &str| {
        body.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .map(str::trim)
    };
    let count = |key: &str| value(key)?.parse::<u64>().ok();
    let millis = |key: &str| {
        let ms = value(key)?.strip_suffix("ms")?.trim().parse::<f64>().ok()?;
        Some(Duration::from_secs_f64(ms.max(0.0) / 1e3))
    };
    Some(PerfdhcpStats {
        sent: count("sent packets:")?,
        received: count("received packets:")?,
        // perfdhcp leaves the delays out when nothing came back.
        avg: millis("avg delay:").unwrap_or_default(),
        max: millis("max delay:").unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERFDHCP: &str = "***Rate statistics***
Rate: 1999.63 4-way exchanges/second, expected rate: 2000

***Statistics for: DISCOVER-OFFER***
sent packets: 5999
received packets: 5990
drops: 9
min delay: 0.080 ms
avg delay: 0.537 ms
max delay: 7.817 ms

***Statistics for: REQUEST-ACK***
sent packets: 5990
received packets: 5980
drops: 10
min delay: 0.066 ms
avg delay: 0.312 ms
max delay: 6.235 ms
";

    #[test]
    fn perfdhcp_report_becomes_a_sample() {
        let s = parse_perfdhcp(PERFDHCP, Duration::from_secs(3), PERFDHCP4_SECTIONS).unwrap();
        assert_eq!((s.discovers, s.acks), (5999, 5980));
        assert_eq!(s.avg_latency, Duration::from_micros(849));
        assert_eq!(s.max_latency, Duration::from_micros(14_052));
        assert!((s.exchanges_per_s() - 5980.0 / 3.0).abs() < 1e-9);
        assert!(parse_perfdhcp("Rate: 0\n", Duration::from_secs(1), PERFDHCP4_SECTIONS).is_none());
        // The DHCPv6 report names its sections by the v6 messages; an
        // Advertise without an address gets no Request, so the exchange
        // is not complete.
        let v6 = PERFDHCP
            .replace("DISCOVER-OFFER", "SOLICIT-ADVERTISE")
            .replace("REQUEST-ACK", "REQUEST-REPLY");
        let s = parse_perfdhcp(&v6, Duration::from_secs(3), PERFDHCP6_SECTIONS).unwrap();
        assert_eq!((s.discovers, s.acks), (5999, 5980));
        assert!(parse_perfdhcp(&v6, Duration::from_secs(3), PERFDHCP4_SECTIONS).is_none());
    }

    #[test]
    fn loadgen_line_becomes_a_sample() {
        let out = "dhcp-loadgen discovers=3000 requests=3000 offers=3000 acks=2990 \
                   duration_s=3.000 discovers_per_s=1000.0 exchanges_per_s=996.7 \
                   drop_pct=0.333 avg_us=9.8 max_us=263.9 cpu_s=0.160\n";
        let s = parse_loadgen(out).unwrap();
        assert_eq!((s.discovers, s.acks), (3000, 2990));
        assert_eq!(s.max_latency, Duration::from_nanos(263_900));
        assert!((s.drop_pct() - 1.0 / 3.0).abs() < 1e-9);
        assert!(parse_loadgen("nothing\n").is_none());
    }

    #[test]
    fn shortfall_is_measured_against_the_target_rate() {
        let sample = |discovers| Sample {
            rate: Some(10_000),
            duration: Duration::from_secs(1),
            discovers,
            ..Sample::default()
        };
        assert!(!sample(9_500).generator_short());
        assert!(sample(8_000).generator_short());
        let flood = Sample {
            rate: None,
            ..sample(1)
        };
        assert!(!flood.generator_short());
    }
}

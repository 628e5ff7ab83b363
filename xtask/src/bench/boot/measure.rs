//! What is measured and in which order: the TFTP rows, one transfer at a
//! time, and the HTTP rounds of concurrent downloads. Repetitions are
//! interleaved (every row once, then every row again), so a disturbance on
//! the machine spreads over all servers instead of hitting one.
//!
//! A failed measurement is recorded with its error and the run goes on.

use std::time::{Duration, Instant};

use super::{
    http, median, netns,
    quiet::Quiet,
    servers::{self, AGENT_HTTP, AGENT_TFTP, Bed, Files, NGINX_PORT, TFTPD_PORT},
    tftp,
};

/// What one run measures.
#[derive(Clone, Debug)]
pub struct Plan {
    pub tftp: bool,
    pub http: bool,
    pub tftp_reps: usize,
    pub http_reps: usize,
    pub clients: usize,
    pub big_mib: usize,
    pub artifact_mib: usize,
    pub windowsize: u16,
    pub pin_tftp: bool,
    pub pin_http: bool,
    pub cores: Cores,
}

/// Which CPUs the servers and the client get when a part is pinned.
#[derive(Clone, Debug)]
pub struct Cores {
    pub all: Vec<usize>,
    pub servers: Vec<usize>,
    pub client: Vec<usize>,
}

impl Cores {
    /// The last CPU this process may use plays the client, the others the
    /// server; with one CPU both share it.
    pub fn detect() -> Cores {
        let all = servers::allowed_cpus();
        let (servers, client) = match all.split_last() {
            Some((&last, rest)) if !rest.is_empty() => (rest.to_vec(), vec![last]),
            _ => (all.clone(), all.clone()),
        };
        Cores {
            all,
            servers,
            client,
        }
    }

    pub fn describe(&self, pinned: bool) -> String {
        if pinned {
            format!(
                "servers on CPU {}, client on CPU {}",
                list(&self.servers),
                list(&self.client)
            )
        } else {
            format!("servers and client share CPUs {}", list(&self.all))
        }
    }
}

fn list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The block size every row with options asks for: the largest block in a
/// 1500-byte frame (also pxe-agent's `max_blksize` on such a link).
pub const BLKSIZE: u16 = 1468;

/// The TFTP rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Row {
    /// (a) tftpd-hpa, no options: RFC 1350, 512-byte blocks.
    TftpdPlain,
    /// (b) tftpd-hpa, `blksize 1468` and `tsize`.
    TftpdBlksize,
    /// (c) pxe-agent with the options of (b).
    AgentBlksize,
    /// (d) pxe-agent, `blksize 1468`, `tsize` and `windowsize`.
    AgentWindow,
}

impl Row {
    pub const ALL: [Row; 4] = [
        Row::TftpdPlain,
        Row::TftpdBlksize,
        Row::AgentBlksize,
        Row::AgentWindow,
    ];

    pub fn letter(self) -> char {
        match self {
            Row::TftpdPlain => 'a',
            Row::TftpdBlksize => 'b',
            Row::AgentBlksize => 'c',
            Row::AgentWindow => 'd',
        }
    }

    pub fn server(self) -> &'static str {
        match self {
            Row::TftpdPlain | Row::TftpdBlksize => "tftpd-hpa",
            Row::AgentBlksize | Row::AgentWindow => "pxe-agent",
        }
    }

    fn port(self) -> u16 {
        match self {
            Row::TftpdPlain | Row::TftpdBlksize => TFTPD_PORT,
            Row::AgentBlksize | Row::AgentWindow => AGENT_TFTP,
        }
    }

    pub fn options(self, windowsize: u16) -> tftp::Options {
        match self {
            Row::TftpdPlain => tftp::Options {
                blksize: None,
                windowsize: None,
            },
            Row::TftpdBlksize | Row::AgentBlksize => tftp::Options {
                blksize: Some(BLKSIZE),
                windowsize: None,
            },
            Row::AgentWindow => tftp::Options {
                blksize: Some(BLKSIZE),
                windowsize: Some(windowsize),
            },
        }
    }
}

/// One TFTP row for one file, over all repetitions.
#[derive(Clone, Debug)]
pub struct TftpResult {
    pub row: Row,
    pub file: String,
    pub size: usize,
    pub runs: Vec<tftp::Fetched>,
    pub error: Option<String>,
}

impl TftpResult {
    pub fn median(&self) -> Option<Duration> {
        let times: Vec<Duration> = self.runs.iter().map(|r| r.elapsed).collect();
        (!times.is_empty() && self.error.is_none()).then(|| median(&times))
    }
}

/// One HTTP server over all rounds.
#[derive(Clone, Debug)]
pub struct HttpResult {
    pub server: &'static str,
    pub rounds: Vec<HttpRound>,
    /// One download alone, each repetition (the first one also warms up).
    pub single: Vec<Duration>,
    pub error: Option<String>,
}

/// One round with the CPU it cost.
#[derive(Clone, Debug)]
pub struct HttpRound {
    pub round: http::Round,
    /// CPU seconds of the server's processes (nginx: master and workers).
    pub server_cpu: f64,
    /// CPU seconds of the benchmark's download threads.
    pub client_cpu: f64,
    /// Busy CPU seconds of the whole machine (CPUs × wall − idle).
    pub machine_busy: f64,
    pub wall: Duration,
}

impl HttpResult {
    /// The round with the median time (the lower middle for an even count).
    pub fn median_round(&self) -> Option<&HttpRound> {
        if self.error.is_some() {
            return None;
        }
        let mut rounds: Vec<&HttpRound> = self.rounds.iter().collect();
        rounds.sort_by_key(|r| r.round.elapsed);
        rounds.get(rounds.len().saturating_sub(1) / 2).copied()
    }
}

/// Everything one run measured.
#[derive(Clone, Debug, Default)]
pub struct Results {
    pub tftp: Vec<TftpResult>,
    pub http: Vec<HttpResult>,
    /// What tftpd-hpa answered to a `windowsize` request.
    pub tftpd_windowsize: Option<String>,
    /// Measurements that started while other work kept the machine busy,
    /// the busiest start (share of one CPU), and the time spent waiting.
    pub busy_starts: usize,
    pub worst_busy: f64,
    pub waited: Duration,
}

impl Results {
    pub fn complete(&self) -> bool {
        self.tftp.iter().all(|r| r.error.is_none()) && self.http.iter().all(|r| r.error.is_none())
    }
}

/// Time the whole run may spend waiting for a quiet machine.
const QUIET_BUDGET: Duration = Duration::from_secs(120);

pub fn all(bed: &mut Bed, files: &Files, plan: &Plan) -> Results {
    let mut results = Results::default();
    let mut quiet = Quiet::new(QUIET_BUDGET);
    if plan.tftp {
        if let Err(err) = pin(bed, plan, plan.pin_tftp) {
            eprintln!("warning: {err:#}");
        }
        results.tftpd_windowsize = Some(probe_tftpd_windowsize(bed, files, plan));
        results.tftp = tftp_rows(bed, files, plan, &mut quiet);
    }
    if plan.http {
        if let Err(err) = pin(bed, plan, plan.pin_http) {
            eprintln!("warning: {err:#}");
        }
        results.http = http_rounds(bed, files, plan, &mut quiet);
    }
    results.busy_starts = quiet.busy_starts;
    results.worst_busy = quiet.worst;
    results.waited = quiet.waited;
    results
}

/// Moves the servers to the server CPUs (or back to all of them) and says
/// where the client goes.
fn pin(bed: &Bed, plan: &Plan, pinned: bool) -> anyhow::Result<()> {
    let cpus = if pinned {
        &plan.cores.servers
    } else {
        &plan.cores.all
    };
    for pid in [bed.agent.pid(), bed.tftpd.pid(), bed.nginx.pid()] {
        servers::pin_tree(pid, cpus)?;
    }
    println!("bench: {}", plan.cores.describe(pinned));
    Ok(())
}

/// Runs `f` on a client thread in the lab's client namespace, on the
/// client CPU when `pinned`.
fn client<T: Send + 'static>(
    bed: &Bed,
    plan: &Plan,
    pinned: bool,
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let cpus = if pinned {
        plan.cores.client.clone()
    } else {
        plan.cores.all.clone()
    };
    netns::run_in(bed.client_ns(), move || {
        servers::set_affinity(0, &cpus)?;
        f()
    })
}

/// Asks tftpd-hpa for `windowsize` to show whether it grants it.
fn probe_tftpd_windowsize(bed: &Bed, files: &Files, plan: &Plan) -> String {
    let (file, bytes) = files.tftp[0].clone();
    let options = Row::AgentWindow.options(plan.windowsize);
    let fetched = client(bed, plan, plan.pin_tftp, move || {
        tftp::fetch(servers::addr(TFTPD_PORT), &file, options, &bytes)
    });
    match fetched {
        Ok(f) if f.windowsize == 1 => format!(
            "asked for windowsize {}, tftpd-hpa left it out of its OACK (not implemented), so it sends lock-step",
            plan.windowsize
        ),
        Ok(f) => format!(
            "asked for windowsize {}, tftpd-hpa granted {}",
            plan.windowsize, f.windowsize
        ),
        Err(err) => format!("windowsize probe failed: {err:#}"),
    }
}

fn tftp_rows(bed: &mut Bed, files: &Files, plan: &Plan, quiet: &mut Quiet) -> Vec<TftpResult> {
    let mut results: Vec<TftpResult> = files
        .tftp
        .iter()
        .flat_map(|(file, bytes)| {
            Row::ALL.map(|row| TftpResult {
                row,
                file: file.clone(),
                size: bytes.len(),
                runs: Vec::new(),
                error: None,
            })
        })
        .collect();
    // One unmeasured transfer per row and file warms caches and sockets.
    for rep in 0..=plan.tftp_reps {
        for result in results.iter_mut().filter(|r| r.error.is_none()) {
            let bytes = files
                .tftp
                .iter()
                .find(|(name, _)| *name == result.file)
                .map(|(_, bytes)| bytes.clone())
                .unwrap_or_default();
            let (file, row) = (result.file.clone(), result.row);
            let options = row.options(plan.windowsize);
            if rep > 0 {
                quiet.wait();
            }
            let fetched = client(bed, plan, plan.pin_tftp, move || {
                tftp::fetch(servers::addr(row.port()), &file, options, &bytes)
            });
            match fetched {
                Ok(f) => {
                    if rep > 0 {
                        println!(
                            "bench: tftp ({}) {} {} rep {rep}: {:.3} s, {:.1} MiB/s (blksize {}, window {}{})",
                            row.letter(),
                            row.server(),
                            result.file,
                            f.elapsed.as_secs_f64(),
                            mib_per_s(f.bytes as u64, f.elapsed),
                            f.blksize,
                            f.windowsize,
                            anomalies(&f),
                        );
                        result.runs.push(f);
                    }
                }
                Err(err) => {
                    eprintln!(
                        "bench: tftp ({}) {} {}: {err:#}",
                        row.letter(),
                        row.server(),
                        result.file
                    );
                    result.error = Some(format!("{err:#}"));
                }
            }
        }
        if let Err(err) = bed.check_alive() {
            eprintln!("bench: {err:#}");
            for result in results.iter_mut().filter(|r| r.error.is_none()) {
                result.error = Some(format!("{err:#}"));
            }
        }
    }
    results
}

fn anomalies(f: &tftp::Fetched) -> String {
    if f.repeats == 0 && f.gaps == 0 {
        String::new()
    } else {
        format!(", {} repeats, {} gaps", f.repeats, f.gaps)
    }
}

fn http_rounds(bed: &mut Bed, files: &Files, plan: &Plan, quiet: &mut Quiet) -> Vec<HttpResult> {
    let path = format!("/artifacts/{}", files.artifact);
    let mut results = vec![
        HttpResult {
            server: "pxe-agent",
            rounds: Vec::new(),
            single: Vec::new(),
            error: None,
        },
        HttpResult {
            server: "nginx",
            rounds: Vec::new(),
            single: Vec::new(),
            error: None,
        },
    ];
    // One download at a time first: a machine booting alone. The first
    // one also warms up each server.
    for rep in 0..=plan.http_reps {
        for result in results.iter_mut().filter(|r| r.error.is_none()) {
            let (p, size) = (path.clone(), files.artifact_size);
            let port = http_port(result.server);
            if rep > 0 {
                quiet.wait();
            }
            let single = client(bed, plan, plan.pin_http, move || {
                let started = Instant::now();
                http::download(servers::addr(port), &p, size)?;
                Ok(started.elapsed())
            });
            match single {
                Ok(t) if rep > 0 => {
                    println!(
                        "bench: http {} 1 download rep {rep}: {:.1} ms, {:.0} MiB/s",
                        result.server,
                        t.as_secs_f64() * 1000.0,
                        mib_per_s(size, t)
                    );
                    result.single.push(t);
                }
                Ok(_) => {}
                Err(err) => {
                    eprintln!("bench: http {}: {err:#}", result.server);
                    result.error = Some(format!("{err:#}"));
                }
            }
        }
    }
    for rep in 1..=plan.http_reps {
        for result in results.iter_mut().filter(|r| r.error.is_none()) {
            let pid = match result.server {
                "pxe-agent" => bed.agent.pid(),
                _ => bed.nginx.pid(),
            };
            let port = http_port(result.server);
            quiet.wait();
            match timed_round(bed, plan, pid, port, &path, files.artifact_size) {
                Ok(r) => {
                    println!(
                        "bench: http {} rep {rep}: {} × {} MiB in {:.3} s, {:.0} MiB/s; CPU: server {:.2} s, client {:.2} s, machine {:.0}% busy",
                        result.server,
                        plan.clients,
                        plan.artifact_mib,
                        r.round.elapsed.as_secs_f64(),
                        mib_per_s(r.round.bytes, r.round.elapsed),
                        r.server_cpu,
                        r.client_cpu,
                        100.0 * r.machine_busy / (r.wall.as_secs_f64() * cpus()),
                    );
                    result.rounds.push(r);
                }
                Err(err) => {
                    eprintln!("bench: http {}: {err:#}", result.server);
                    result.error = Some(format!("{err:#}"));
                }
            }
        }
        if let Err(err) = bed.check_alive() {
            eprintln!("bench: {err:#}");
            for result in results.iter_mut().filter(|r| r.error.is_none()) {
                result.error = Some(format!("{err:#}"));
            }
        }
    }
    results
}

fn http_port(server: &str) -> u16 {
    if server == "pxe-agent" {
        AGENT_HTTP
    } else {
        NGINX_PORT
    }
}

fn timed_round(
    bed: &Bed,
    plan: &Plan,
    pid: u32,
    port: u16,
    path: &str,
    size: u64,
) -> anyhow::Result<HttpRound> {
    let tick = servers::ticks_per_second();
    let (server0, client0, idle0) = (
        servers::tree_cpu_ticks(pid),
        servers::own_cpu_ticks(),
        servers::machine_idle_ticks(),
    );
    let started = Instant::now();
    let (ns, path) = (bed.client_ns().to_owned(), path.to_owned());
    let clients = plan.clients;
    let round = client(bed, plan, plan.pin_http, move || {
        http::round(&ns, servers::addr(port), &path, clients, size)
    })?;
    let wall = started.elapsed();
    let (server1, client1, idle1) = (
        servers::tree_cpu_ticks(pid),
        servers::own_cpu_ticks(),
        servers::machine_idle_ticks(),
    );
    let idle = idle1.saturating_sub(idle0) as f64 / tick;
    Ok(HttpRound {
        round,
        server_cpu: server1.saturating_sub(server0) as f64 / tick,
        client_cpu: client1.saturating_sub(client0) as f64 / tick,
        machine_busy: (wall.as_secs_f64() * cpus() - idle).max(0.0),
        wall,
    })
}

pub fn cpus() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

pub fn mib_per_s(bytes: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        bytes as f64 / f64::from(1u32 << 20) / secs
    } else {
        0.0
    }
}

//! `cargo xtask bench dhcp`: pxe-agent, Kea and dnsmasq serving the same
//! reservations, measured under a relayed load (perfdhcp) and a direct PXE
//! load (dhcp-loadgen), which pxe-agent's XDP program answers, and under two
//! loads its userspace slow path answers: unknown MACs leasing from a pool,
//! and iPXE clients of the reserved hosts. Plus the XDP program's in-kernel
//! time per reply.
//!
//! Owns the run's order and its command-line options: build, time the XDP
//! program, set up one testbed, then per host count and server setup start
//! each server in turn, wait until it answers, ramp the setup's loads and
//! stop it. Prints progress and the tables, one set per address family; a
//! full run also refreshes each family's block of docs/benchmarks.md.
//! Every server, generator and namespace is released on the way out, on
//! error too (their guards drop).
//!
//! Method and its limits: docs/benchmarks.md.

pub(crate) mod cpu;
mod hosts;
mod load;
mod ramp;
mod reply6;
pub(super) mod report;
pub(crate) mod server;
pub(crate) mod testbed;

use super::{Scratch, build_release, cpu_model, run_text, warn_leftover_namespaces};
use std::{
    fs,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, ensure};
use xtask::{ensure_root, process, setup, workspace_root};

use self::{
    cpu::Cores,
    hosts::{Hosts, Setup},
    load::{LoadKind, Runner},
    ramp::{Measurement, Plan},
    report::RunInfo,
    server::{Server, ServerKind},
    testbed::{Bins, Testbed},
};

/// Runs of the XDP program per timed request, each its own syscall.
const PROG_TEST_RUNS: u32 = 100_000;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Reservation counts to measure the fast-path loads (direct, relayed)
    /// with, comma-separated [default: 1000,50000; with --quick: 1000].
    #[arg(long, value_delimiter = ',')]
    hosts: Option<Vec<usize>>,
    /// Reservation counts to measure the slow-path loads (pool, iPXE)
    /// with, comma-separated [default: 1000]; the pool lies above the
    /// reservations, so it shrinks as they grow.
    #[arg(long, value_delimiter = ',')]
    slow_hosts: Option<Vec<usize>>,
    /// A short smoke run: fewer, shorter steps; prints the table but leaves
    /// docs/benchmarks.md as it is.
    #[arg(long)]
    quick: bool,
    /// Servers to measure, comma-separated [default: all]; a subset
    /// leaves docs/benchmarks.md as it is.
    #[arg(long, value_enum, value_delimiter = ',')]
    servers: Option<Vec<ServerKind>>,
    /// Loads to run, comma-separated [default: all]; a subset leaves
    /// docs/benchmarks.md as it is.
    #[arg(long, value_enum, value_delimiter = ',')]
    loads: Option<Vec<LoadKind>>,
    /// Address family of the loads: 4 (DHCPv4), 6 (DHCPv6) or both; a
    /// full run of one family refreshes only that family's block of
    /// docs/benchmarks.md.
    #[arg(long, value_enum, default_value = "both")]
    family: Family,
    /// Do not refresh docs/benchmarks.md.
    #[arg(long)]
    no_docs: bool,
}

/// Which address family's loads to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Family {
    #[value(name = "4")]
    V4,
    #[value(name = "6")]
    V6,
    Both,
}

impl Family {
    fn includes(self, family: u8) -> bool {
        match self {
            Family::V4 => family == 4,
            Family::V6 => family == 6,
            Family::Both => true,
        }
    }
}

impl Args {
    fn plan(&self) -> anyhow::Result<Plan> {
        let default_hosts = if self.quick {
            vec![1_000]
        } else {
            vec![1_000, 50_000]
        };
        let hosts = self.hosts.clone().unwrap_or(default_hosts);
        ensure!(!hosts.is_empty(), "--hosts needs at least one count");
        let slow_hosts = self.slow_hosts.clone().unwrap_or(vec![1_000]);
        ensure!(
            !slow_hosts.is_empty(),
            "--slow-hosts needs at least one count"
        );
        for &n in hosts.iter().chain(&slow_hosts) {
            Hosts::new(n)?;
        }
        let servers = self.servers.clone().unwrap_or(ServerKind::ALL.to_vec());
        let loads: Vec<LoadKind> = self
            .loads
            .clone()
            .unwrap_or(LoadKind::ALL.to_vec())
            .into_iter()
            .filter(|l| self.family.includes(l.family()))
            .collect();
        ensure!(
            !servers.is_empty() && !loads.is_empty(),
            "nothing to measure (--family {:?} leaves none of the loads asked for)",
            self.family
        );
        let (direct_rates, relayed_rates, step) = if self.quick {
            (
                vec![1_000, 10_000, 40_000],
                vec![1_000, 10_000],
                Duration::from_secs(2),
            )
        } else {
            (
                vec![1_000, 2_000, 5_000, 10_000, 20_000, 40_000, 80_000, 160_000],
                vec![1_000, 2_000, 5_000, 10_000, 20_000, 40_000],
                Duration::from_secs(3),
            )
        };
        // A pool run must not use more addresses than the pool holds: every
        // DISCOVER of a new MAC takes one (pxe-agent holds it for 30 s).
        let pool = slow_hosts
            .iter()
            .map(|&n| Hosts::new(n).map(Hosts::pool_size))
            .collect::<anyhow::Result<Vec<u32>>>()?
            .into_iter()
            .min()
            .unwrap_or(0);
        let pool_rates: Vec<u32> = direct_rates
            .iter()
            .copied()
            .filter(|&r| u64::from(r) * step.as_secs() <= u64::from(pool))
            .collect();
        ensure!(
            !loads.contains(&LoadKind::Pool) || !pool_rates.is_empty(),
            "with {} reservations the pool has {pool} addresses: too few for a pool run",
            slow_hosts.iter().max().copied().unwrap_or(0)
        );
        Ok(Plan {
            hosts,
            slow_hosts,
            servers,
            loads,
            direct_rates,
            relayed_rates,
            pool_rates,
            step,
            max_run: step,
        })
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    ensure_root()?;
    let plan = args.plan()?;
    setup::run()?;
    let families: Vec<u8> = [4, 6]
        .into_iter()
        .filter(|&f| plan.loads.iter().any(|l| l.family() == f))
        .collect();
    let versions = tool_versions(&families)?;
    let cores = Cores::detect()?;
    let bins = build()?;
    let started = Instant::now();
    let kernel_time = if families.contains(&4) {
        println!(
            "bench: timing the XDP program ({PROG_TEST_RUNS} BPF_PROG_TEST_RUN calls per request)"
        );
        let line = prog_test_run(&bins.loadgen)?;
        println!("bench: {line}");
        Some(line)
    } else {
        None
    };
    let scratch = Scratch::new("dhcp")?;
    let results = bench_all(&bins, cores, &plan, &scratch.0)?;
    warn_leftover_namespaces(testbed::LAB_PREFIX);
    let info = RunInfo {
        date: run_text(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))?,
        kernel: run_text(Command::new("uname").arg("-r"))?,
        cpu_model: cpu_model(),
        cpus: std::thread::available_parallelism().map_or(0, usize::from),
        versions,
        kernel_time,
        elapsed: started.elapsed(),
        plan,
        quick: args.quick,
    };
    let blocks: Vec<(u8, String)> = families
        .iter()
        .map(|&family| {
            let rows: Vec<Measurement> = results
                .iter()
                .filter(|m| m.load.family() == family)
                .cloned()
                .collect();
            (family, report::markdown(&info, &rows, family))
        })
        .collect();
    for (_, block) in &blocks {
        println!("\n{block}");
    }
    if args.quick
        || args.no_docs
        || args.servers.is_some()
        || args.loads.is_some()
        || args.slow_hosts.is_some()
    {
        println!("bench: docs/benchmarks.md left as it is");
    } else {
        let docs = workspace_root().join("docs").join("benchmarks.md");
        for (family, block) in &blocks {
            report::refresh_docs(&docs, *family, block)?;
        }
        println!("bench: refreshed {}", docs.display());
    }
    Ok(())
}

/// One testbed for the whole run, so every server faces the same client side.
fn bench_all(
    bins: &Bins,
    cores: Cores,
    plan: &Plan,
    scratch: &Path,
) -> anyhow::Result<Vec<Measurement>> {
    let bed = Testbed::new(bins, cores).context("failed to set up the testbed")?;
    println!(
        "bench: testbed {} ({}) <-> {} ({}); generator on CPU {}, servers on CPU {}",
        bed.server_ns(),
        bed.server_if(),
        bed.client_ns(),
        bed.client_if(),
        bed.cores.generator_list(),
        bed.cores.server_list()
    );
    let mut results = Vec::new();
    for count in plan.all_hosts() {
        let hosts = Hosts::new(count)?;
        let dir = scratch.join(format!("hosts-{count}"));
        fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
        let macs = dir.join("macs.txt");
        fs::write(&macs, hosts.mac_list())
            .with_context(|| format!("failed to write {}", macs.display()))?;
        for setup in [Setup::Reservations, Setup::Pool, Setup::Ipxe, Setup::Dhcpv6] {
            let loads = plan.loads_for(count, setup);
            if loads.is_empty() {
                continue;
            }
            let unknown = if setup == Setup::Pool {
                let file = dir.join("unknown-macs.txt");
                let n = hosts.pool_size() as usize;
                fs::write(&file, hosts::unknown_mac_list(n))
                    .with_context(|| format!("failed to write {}", file.display()))?;
                Some((file, n as u64))
            } else {
                None
            };
            let runner = Runner {
                bed: &bed,
                bins,
                macs: &macs,
                unknown_macs: unknown.as_ref().map(|(f, n)| (f.as_path(), *n)),
            };
            for &kind in plan.servers.iter().filter(|k| k.serves(setup)) {
                let server_dir = dir.join(format!("{setup:?}-{kind:?}").to_lowercase());
                results.extend(bench_server(
                    &runner,
                    plan,
                    hosts,
                    setup,
                    &loads,
                    kind,
                    &server_dir,
                ));
            }
        }
    }
    Ok(results)
}

/// The loads of one setup against one server; a server that fails to
/// start or to answer yields failed measurements, and the run goes on.
fn bench_server(
    runner: &Runner<'_>,
    plan: &Plan,
    hosts: Hosts,
    setup: Setup,
    loads: &[LoadKind],
    kind: ServerKind,
    dir: &Path,
) -> Vec<Measurement> {
    let what = match setup {
        Setup::Reservations => String::new(),
        Setup::Pool => format!(" and a pool of {} addresses", hosts.pool_size()),
        Setup::Ipxe => " and an iPXE answer".to_owned(),
        Setup::Dhcpv6 => " over DHCPv6".to_owned(),
    };
    println!(
        "bench: starting {} with {} hosts{what}",
        kind.name(),
        hosts.count
    );
    let failed = |err: anyhow::Error| {
        eprintln!("bench: {} with {} hosts: {err:#}", kind.name(), hosts.count);
        loads
            .iter()
            .map(|&load| Measurement::failed(hosts.count, kind, load, format!("{err:#}")))
            .collect()
    };
    let mut server = match Server::start(kind, runner.bed, runner.bins, hosts, setup, dir) {
        Ok(server) => server,
        Err(err) => return failed(err),
    };
    let answering = ramp::wait_answering(runner, &mut server, true);
    let check = match (&answering, setup) {
        (Ok(()), Setup::Dhcpv6) => check_replies6(runner, &server, hosts, dir),
        _ => None,
    };
    let results = match answering {
        Ok(()) => loads
            .iter()
            .map(|&load| {
                let m = ramp::measure(runner, &mut server, plan, hosts.count, load);
                if let Some(counters) = m.agent_counters() {
                    println!(
                        "bench: pxe-agent {}: {}",
                        load.short(),
                        report::agent_note_for(load, &counters)
                    );
                }
                Measurement {
                    check: check.clone(),
                    ..m
                }
            })
            .collect(),
        Err(err) => failed(err),
    };
    if let Err(err) = server.stop() {
        eprintln!("warning: {err:#}");
    }
    results
}

/// Exchanges per second and seconds of the DHCPv6 answer check: slow
/// enough for any server to answer all, long enough to sample many hosts.
const CHECK6_RATE: u32 = 200;
const CHECK6_SECS: u64 = 3;

/// Runs the DHCPv6 answer check against `server` and prints its result;
/// `None` (and a warning) if the check itself could not run.
fn check_replies6(
    runner: &Runner<'_>,
    server: &Server,
    hosts: Hosts,
    dir: &Path,
) -> Option<reply6::Check> {
    let pcap = dir.join("answers6.pcap");
    match runner.check_replies6(CHECK6_RATE, Duration::from_secs(CHECK6_SECS), &pcap) {
        Ok(check) => {
            println!(
                "bench: {} with {} hosts, DHCPv6 answers: {}",
                server.kind.name(),
                hosts.count,
                check.summary()
            );
            Some(check)
        }
        Err(err) => {
            eprintln!(
                "warning: {} with {} hosts: DHCPv6 answer check failed: {err:#}",
                server.kind.name(),
                hosts.count
            );
            None
        }
    }
}

/// Builds the agent and the load generator (release).
fn build() -> anyhow::Result<Bins> {
    println!("bench: building pxe-agent and dhcp-loadgen (release)");
    let built = build_release(
        &["pxe-agent", "pxe-tests"],
        &["--bins"],
        &["pxe-agent", "dhcp-loadgen"],
    )?;
    let [agent, loadgen] = <[std::path::PathBuf; 2]>::try_from(built)
        .map_err(|_| anyhow::anyhow!("expected two built binaries"))?;
    Ok(Bins { agent, loadgen })
}

/// The versions of the outside programs the run's `families` need, which
/// also checks they exist.
fn tool_versions(families: &[u8]) -> anyhow::Result<Vec<(String, String)>> {
    let first_line = |text: String| text.lines().next().unwrap_or_default().trim().to_owned();
    let mut versions = Vec::new();
    if families.contains(&4) {
        let kea = run_text(Command::new("kea-dhcp4").arg("-v"))
            .context("kea-dhcp4 is needed (package kea-dhcp4-server)")?;
        versions.push(("Kea".to_owned(), first_line(kea)));
    }
    if families.contains(&6) {
        let kea = run_text(Command::new("kea-dhcp6").arg("-v"))
            .context("kea-dhcp6 is needed (package kea-dhcp6-server)")?;
        versions.push(("kea-dhcp6".to_owned(), first_line(kea)));
        run_text(Command::new("tcpdump").arg("--version"))
            .context("tcpdump is needed (package tcpdump)")?;
    }
    let perfdhcp = run_text(Command::new("perfdhcp").arg("-v"))
        .context("perfdhcp is needed (package kea-admin)")?;
    let dnsmasq = run_text(Command::new("dnsmasq").arg("-v"))
        .context("dnsmasq is needed (package dnsmasq-base)")?;
    run_text(Command::new("taskset").arg("-V")).context("taskset is needed (util-linux)")?;
    let dnsmasq = first_line(dnsmasq)
        .split_whitespace()
        .nth(2)
        .unwrap_or("?")
        .to_owned();
    versions.extend([
        (
            "perfdhcp".into(),
            first_line(perfdhcp).replace("VERSION: ", ""),
        ),
        ("dnsmasq".into(), dnsmasq),
    ]);
    Ok(versions)
}

/// `dhcp-loadgen prog-test-run`, phrased for the report.
fn prog_test_run(loadgen: &Path) -> anyhow::Result<String> {
    let out = process::run(
        Command::new(loadgen)
            .arg("prog-test-run")
            .args(["--runs", &PROG_TEST_RUNS.to_string()]),
    )
    .context("BPF_PROG_TEST_RUN timing failed")?;
    let field = |key: &str| {
        out.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .with_context(|| format!("no {key} in `{}`", out.trim()))
    };
    Ok(format!(
        "{} ns per reply in the kernel (OFFER {} ns, ACK {} ns), mean of {} runs each, \
         one run per syscall (with a larger repeat the kernel reruns the program on the frame \
         it already rewrote into a reply); {} ns less the {} ns that one run per call adds \
         over a large repeat (an empty XDP program timed both ways)",
        field("per_reply_ns")?,
        field("offer_ns")?,
        field("ack_ns")?,
        report::thousands(f64::from(PROG_TEST_RUNS)),
        field("program_ns")?,
        field("harness_ns")?,
    ))
}

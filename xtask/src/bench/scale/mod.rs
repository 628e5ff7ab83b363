//! `cargo xtask bench scale`: what a fleet-sized inventory costs pxe-agent.
//! For each source (an inventory file, or BootHost objects from the fake
//! Kubernetes API server) and size it generates a fleet inventory
//! ([`xtask::fleet`]: every boot class, host names, one extra option each),
//! starts the agent on the server end of a lab with its program pinned,
//! and measures the time to ready, the agent's steady memory and its peak
//! in each phase (the load, then each reload on its own), the locked memory
//! of the attached program's maps, the reloads (one host changed; for the
//! file 1,000 hosts added; then every host's replies changed, which the
//! file reads whole) and the program's kernel time per reply for a random
//! host, on the agent's own maps. A size the agent cannot load is a row
//! with its error, and the run goes on.
//!
//! Owns the run's order and its command-line options; prints the table and
//! writes it to target/bench/scale.md. Method: docs/benchmarks.md, "Fleet
//! scale". No traffic crosses the lab: replies are timed with
//! `BPF_PROG_TEST_RUN`.

mod agent;
mod report;

use super::{Scratch, build_release, cpu_model, run_text, warn_leftover_namespaces};
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, ensure};
use xtask::{Lab, ensure_root, fleet, process, target_dir};

use self::{
    agent::{Agent, SETTLE, Source},
    report::{Numbers, PerReply, Row, RunInfo},
};

const LAB_PREFIX: &str = "pxscale";
/// `BPF_PROG_TEST_RUN` calls per timed request.
const PROG_TEST_RUNS: u32 = 100_000;
/// Runs of [`PROG_TEST_RUNS`] each whose median is reported.
const PROG_TEST_REPEATS: usize = 5;
/// Hosts the second reload adds.
const ADDED: usize = 1_000;
/// The lease time of the reload that changes every host's replies.
const RELEASED: u32 = 1800;

/// Where the measured agent reads its inventory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Inventory {
    /// `--inventory FILE`.
    File,
    /// `--kube`: BootNetwork, BootProfile and BootHost objects.
    Kube,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Inventory sizes, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1000,10000,100000,250000"
    )]
    sizes: Vec<usize>,
    /// Inventory sources, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "file,kube")]
    sources: Vec<Inventory>,
    /// Build and measure the debug binaries (else the release ones, which
    /// are what is deployed and what the figures are for).
    #[arg(long)]
    debug: bool,
}

/// The agent, the load generator (whose `prog-test-run` times replies) and
/// the fake Kubernetes API server.
struct Bins {
    agent: PathBuf,
    loadgen: PathBuf,
    api: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    ensure_root()?;
    ensure!(!args.sizes.is_empty(), "--sizes needs at least one size");
    for &n in &args.sizes {
        ensure!(
            (1..=fleet::MAX_FLEET - ADDED).contains(&n),
            "size {n} is outside 1..={}",
            fleet::MAX_FLEET - ADDED
        );
    }
    run_text(Command::new("bpftool").arg("version")).context("bpftool is needed")?;
    let release = !args.debug;
    let bins = build(release)?;
    let scratch = Scratch::new("scale")?;
    let lab = Lab::new(LAB_PREFIX).context("failed to set up the lab")?;
    let mut rows = Vec::new();
    for &source in &args.sources {
        for &hosts in &args.sizes {
            println!("bench: {hosts} hosts, {}", report::source_name(source));
            let dir = scratch.0.join(format!("hosts-{hosts}"));
            let outcome =
                measure(&bins, &lab, &dir, source, hosts).map_err(|err| format!("{err:#}"));
            if let Err(err) = &outcome {
                eprintln!("bench: {hosts} hosts: {err}");
            }
            rows.push(Row {
                source,
                hosts,
                outcome,
            });
            // The inventories of the larger sizes take tens of MB each.
            let _ = fs::remove_dir_all(&dir);
        }
    }
    drop(lab);
    warn_leftover_namespaces(LAB_PREFIX);
    let info = RunInfo {
        date: run_text(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))?,
        kernel: run_text(Command::new("uname").arg("-r"))?,
        cpu_model: cpu_model(),
        cpus: std::thread::available_parallelism().map_or(0, usize::from),
        profile: if release { "release" } else { "debug" },
        runs: PROG_TEST_RUNS,
    };
    let table = report::markdown(&info, &rows);
    println!("\n{table}");
    let out = target_dir().join("bench").join("scale.md");
    if let Some(parent) = out.parent() {
        fs::create_dir_all(parent)
            .with_context(|| format!("failed to create {}", parent.display()))?;
    }
    fs::write(&out, &table).with_context(|| format!("failed to write {}", out.display()))?;
    println!("bench: wrote {}", out.display());
    Ok(())
}

/// One source and size: start, read the numbers once ready, the reloads
/// (the peak reset before each), the kernel time; the agent is stopped and
/// its pins removed on every way out.
fn measure(
    bins: &Bins,
    lab: &Lab,
    dir: &Path,
    source: Inventory,
    hosts: usize,
) -> anyhow::Result<Numbers> {
    let (file, objects);
    let from = match source {
        Inventory::File => {
            file = fleet::fleet_inventory(hosts, 0);
            Source::File(&file)
        }
        Inventory::Kube => {
            objects = fleet::fleet_objects(hosts);
            Source::Kube {
                objects: &objects,
                api: &bins.api,
            }
        }
    };
    let (mut agent, started) = Agent::start(&bins.agent, lab, dir, &from)?;
    let load_peak_kib = agent.rss_kib()?.1;
    std::thread::sleep(SETTLE);
    let rss_kib = agent.rss_kib()?.0;
    let memlock = agent.map_memlock()?;
    println!(
        "bench: ready in {:.3} s (inventory read in {}), RSS {rss_kib} KiB, peak {load_peak_kib} KiB, \
         maps {memlock} bytes",
        started.ready.as_secs_f64(),
        started
            .read
            .map_or_else(|| "?".to_owned(), |r| format!("{:.3} s", r.as_secs_f64())),
    );
    let changed = random_index(hosts);
    let one = match source {
        Inventory::File => agent.reload(&fleet::fleet_inventory_changed(hosts, changed))?,
        Inventory::Kube => agent.patch_object(
            &format!("boothosts/{}", fleet::fleet_host_name(changed)),
            &format!(
                r#"{{"spec":{{"options":{{"{}":"{}"}}}}}}"#,
                fleet::FLEET_OPTION,
                fleet::fleet_option_text(changed, true)
            ),
        )?,
    };
    println!(
        "bench: host {changed} changed: {}, {} map writes, peak {} KiB",
        one.timing(),
        one.map_writes,
        one.peak_kib
    );
    let added = match source {
        // The changed host stays changed: this reload only adds.
        Inventory::File => {
            let added = agent.reload(&fleet::fleet_inventory_changed(hosts + ADDED, changed))?;
            println!(
                "bench: {ADDED} hosts added: {}, {} map writes, peak {} KiB",
                added.timing(),
                added.map_writes,
                added.peak_kib
            );
            Some(added)
        }
        Inventory::Kube => None,
    };
    let whole = match source {
        Inventory::File => agent.reload(&fleet::fleet_inventory_leasing(hosts, RELEASED))?,
        Inventory::Kube => agent.patch_object(
            "bootnetworks/fleet",
            &format!(
                r#"{{"spec":{{"subnets":[{}]}}}}"#,
                fleet::fleet_subnet_object(RELEASED)
            ),
        )?,
    };
    println!(
        "bench: every host's replies changed: {}, {} map writes, peak {} KiB",
        whole.timing(),
        whole.map_writes,
        whole.peak_kib
    );
    let timed = random_index(hosts);
    let per_reply_ns = prog_test_run(&bins.loadgen, &agent.pin_dir(), fleet::fleet_mac(timed));
    match &per_reply_ns {
        Ok(ns) => println!(
            "bench: host {timed}: {} ns per reply, {} ns less the harness",
            ns.raw, ns.program
        ),
        Err(err) => eprintln!("bench: host {timed}: {err}"),
    }
    agent.stop()?;
    Ok(Numbers {
        ready: started.ready,
        read: started.read,
        rss_kib,
        load_peak_kib,
        memlock,
        one_host: one,
        add_hosts: added,
        whole,
        per_reply_ns,
    })
}

/// `dhcp-loadgen prog-test-run` on the agent's pinned program and maps,
/// [`PROG_TEST_REPEATS`] times: the median of the runs' means of OFFER and
/// ACK, in ns, as timed and less the harness. One run's mean moves by a
/// tenth from run to run on a shared VM; the median of a few does not
/// follow one disturbed run.
fn prog_test_run(loadgen: &Path, pins: &Path, mac: [u8; 6]) -> Result<PerReply, String> {
    let mac = mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let runs = (0..PROG_TEST_REPEATS)
        .map(|_| {
            let out = process::run(
                Command::new(loadgen)
                    .args(["prog-test-run", "--runs", &PROG_TEST_RUNS.to_string()])
                    .arg("--pinned")
                    .arg(pins)
                    .args(["--mac", &mac, "--class", "bios"]),
            )
            .map_err(|err| format!("{err:#}"))?;
            let field = |key: &str| {
                out.split_whitespace()
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                    .and_then(|ns| ns.parse::<u64>().ok())
                    .ok_or_else(|| format!("no {key} in `{}`", out.trim()))
            };
            Ok(PerReply {
                raw: field("per_reply_ns")?,
                program: field("program_ns")?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let median = |f: fn(&PerReply) -> u64| {
        let mut v: Vec<u64> = runs.iter().map(f).collect();
        v.sort_unstable();
        v[v.len() / 2]
    };
    Ok(PerReply {
        raw: median(|r| r.raw),
        program: median(|r| r.program),
    })
}

/// A host index below `n`, different on every call and run (the clock's
/// nanoseconds): the bench times whichever host the hash map puts where.
fn random_index(n: usize) -> usize {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as usize ^ d.as_secs() as usize);
    // A multiplicative hash spreads the low, clock-granular bits.
    nanos.wrapping_mul(0x9e37_79b9_7f4a_7c15) % n
}

/// Builds the agent, dhcp-loadgen and fake-kube-api, in release mode with
/// `release`.
fn build(release: bool) -> anyhow::Result<Bins> {
    let names = ["pxe-agent", "dhcp-loadgen", "fake-kube-api"];
    let profile = if release { "release" } else { "debug" };
    println!("bench: building {} ({profile})", names.join(", "));
    let built = if release {
        build_release(&["pxe-agent", "pxe-tests"], &["--bins"], &names)?
    } else {
        super::build(false, &["pxe-agent", "pxe-tests"], &["--bins"], &names)?
    };
    let [agent, loadgen, api] = <[PathBuf; 3]>::try_from(built)
        .map_err(|_| anyhow::anyhow!("expected three built binaries"))?;
    Ok(Bins {
        agent,
        loadgen,
        api,
    })
}

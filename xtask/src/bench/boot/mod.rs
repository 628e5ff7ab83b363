//! `cargo xtask bench boot`: the boot chain's file servers against
//! established ones, in one run.
//!
//! - TFTP: Debian's `ipxe.efi` and a 20 MiB file, one transfer at a time,
//!   tftpd-hpa with no options and with `blksize 1468`, pxe-agent with
//!   `blksize 1468` and with `windowsize` on top.
//! - HTTP: 100 concurrent downloads of a 50 MiB artifact from pxe-agent's
//!   `/artifacts/` and from nginx (sendfile).
//!
//! Owns the run's order and its command-line options: build, write the
//! files, start every server in one lab, measure, print the tables, and on
//! a full run refresh docs/benchmarks-boot.md. Servers and namespaces are
//! released on the way out, on error too (their guards drop).
//!
//! Method and its limits: docs/benchmarks-boot.md.

mod http;
mod measure;
pub(super) mod netns;
mod quiet;
mod report;
pub(crate) mod servers;
mod tftp;

use super::{Scratch, build_release, cpu_model, run_text, warn_leftover_namespaces};
use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, ensure};
use xtask::{ensure_root, process, setup, workspace_root};

use self::{
    measure::{Cores, Plan},
    report::RunInfo,
    servers::{Bed, Files},
};

/// Which half of the benchmark to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    Tftp,
    Http,
}

/// A part to pin, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PinPart {
    Tftp,
    Http,
    None,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A short smoke run: fewer repetitions, a 5 MiB TFTP file, 20
    /// downloads; prints the tables but leaves docs/benchmarks-boot.md as
    /// it is.
    #[arg(long)]
    quick: bool,
    /// Parts to run, comma-separated [default: tftp,http]; a subset leaves
    /// docs/benchmarks-boot.md as it is.
    #[arg(long, value_enum, value_delimiter = ',')]
    parts: Option<Vec<Part>>,
    /// Repetitions of each TFTP transfer [default: 15; --quick: 3].
    #[arg(long)]
    tftp_reps: Option<usize>,
    /// Repetitions of each HTTP round [default: 5; --quick: 1].
    #[arg(long)]
    http_reps: Option<usize>,
    /// Concurrent HTTP downloads per round [default: 100; --quick: 20].
    #[arg(long)]
    clients: Option<usize>,
    /// Parts in which the servers run on all CPUs but the last and the
    /// client on the last one, as two machines would, comma-separated
    /// [default: tftp]; `none` shares every CPU in every part. Another
    /// choice leaves docs/benchmarks-boot.md as it is.
    #[arg(long, value_enum, value_delimiter = ',')]
    pin: Option<Vec<PinPart>>,
    /// `windowsize` pxe-agent is asked for (it grants at most its
    /// `max_windowsize`, 16 by default).
    #[arg(long, default_value_t = 16)]
    windowsize: u16,
    /// Do not refresh docs/benchmarks-boot.md.
    #[arg(long)]
    no_docs: bool,
}

impl Args {
    fn plan(&self) -> anyhow::Result<Plan> {
        let parts = self
            .parts
            .clone()
            .unwrap_or_else(|| vec![Part::Tftp, Part::Http]);
        ensure!(!parts.is_empty(), "nothing to measure");
        let pin = self.pin.clone().unwrap_or_else(|| vec![PinPart::Tftp]);
        let plan = Plan {
            tftp: parts.contains(&Part::Tftp),
            http: parts.contains(&Part::Http),
            tftp_reps: self.tftp_reps.unwrap_or(if self.quick { 3 } else { 15 }),
            http_reps: self.http_reps.unwrap_or(if self.quick { 1 } else { 5 }),
            clients: self.clients.unwrap_or(if self.quick { 20 } else { 100 }),
            big_mib: if self.quick { 5 } else { 20 },
            artifact_mib: 50,
            windowsize: self.windowsize,
            pin_tftp: pin.contains(&PinPart::Tftp),
            pin_http: pin.contains(&PinPart::Http),
            cores: Cores::detect(),
        };
        ensure!(
            plan.tftp_reps > 0 && plan.http_reps > 0 && plan.clients > 0,
            "repetitions and clients must be at least 1"
        );
        ensure!(
            (1..=65535).contains(&plan.windowsize),
            "--windowsize must be 1..=65535"
        );
        Ok(plan)
    }

    /// Only a full run with every part and the defaults goes into the docs.
    fn refreshes_docs(&self) -> bool {
        !(self.quick
            || self.no_docs
            || self.parts.is_some()
            || self.tftp_reps.is_some()
            || self.http_reps.is_some()
            || self.clients.is_some()
            || self.pin.is_some()
            || self.windowsize != 16)
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    ensure_root()?;
    let plan = args.plan()?;
    setup::run()?;
    let mut versions = tool_versions()?;
    versions.insert(0, ("pxe-agent".into(), agent_revision()));
    let agent = build()?;
    let started = Instant::now();
    let scratch = Scratch::new("boot")?;
    println!(
        "bench: writing the served files ({} MiB TFTP file, {} MiB artifact)",
        plan.big_mib, plan.artifact_mib
    );
    let files = Files::create(&scratch.0, plan.big_mib, plan.artifact_mib)?;
    let results = {
        let mut bed = Bed::start(&agent, &files, &scratch.0).context("failed to start the lab")?;
        println!(
            "bench: lab {} <-> {}: pxe-agent (TFTP :{}, HTTP :{}), tftpd-hpa :{}, nginx :{} on {}",
            bed.lab.server_ns(),
            bed.lab.client_ns(),
            servers::AGENT_TFTP,
            servers::AGENT_HTTP,
            servers::TFTPD_PORT,
            servers::NGINX_PORT,
            servers::SERVER_IP,
        );
        let results = measure::all(&mut bed, &files, &plan);
        if let Err(err) = bed.check_alive() {
            eprintln!("warning: {err:#}");
        }
        results
    };
    warn_leftover_namespaces(servers::LAB_PREFIX);
    let info = RunInfo {
        date: run_text(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))?,
        kernel: run_text(Command::new("uname").arg("-r"))?,
        cpu_model: cpu_model(),
        cpus: std::thread::available_parallelism().map_or(0, usize::from),
        versions,
        elapsed: started.elapsed(),
        quick: args.quick,
    };
    let block = report::markdown(&info, &plan, &results);
    println!("\n{block}");
    if args.refreshes_docs() {
        let docs = workspace_root().join("docs").join("benchmarks-boot.md");
        report::refresh_docs(&docs, &block)?;
        println!("bench: refreshed {}", docs.display());
    } else {
        println!("bench: docs/benchmarks-boot.md left as it is");
    }
    ensure!(
        results.complete(),
        "some measurements failed (see the table)"
    );
    Ok(())
}

/// Builds the agent (release).
fn build() -> anyhow::Result<PathBuf> {
    println!("bench: building pxe-agent (release)");
    let mut bins = build_release(&["pxe-agent"], &[], &["pxe-agent"])?;
    bins.pop().context("no pxe-agent path")
}

/// The versions of the outside programs, which also checks they exist.
fn tool_versions() -> anyhow::Result<Vec<(String, String)>> {
    let tftpd = run_text(Command::new("/usr/sbin/in.tftpd").arg("-V"))
        .context("in.tftpd is needed (package tftpd-hpa)")?;
    let nginx = process::output(Command::new("/usr/sbin/nginx").arg("-v"))
        .context("nginx is needed (package nginx)")?;
    let nginx = String::from_utf8_lossy(&nginx.stderr);
    let first = |text: &str| text.lines().next().unwrap_or_default().trim().to_owned();
    Ok(vec![
        (
            "tftpd-hpa".into(),
            first(&tftpd)
                .split([',', ' '])
                .nth(1)
                .unwrap_or("?")
                .to_owned(),
        ),
        (
            "nginx".into(),
            first(&nginx).rsplit('/').next().unwrap_or("?").to_owned(),
        ),
    ])
}

/// The commit the agent is built from, and whether its sources differ
/// from it (read-only git queries; "unknown" without git).
fn agent_revision() -> String {
    let root = workspace_root();
    let git = |args: &[&str]| run_text(Command::new("git").arg("-C").arg(&root).args(args)).ok();
    let Some(commit) = git(&["rev-parse", "--short", "HEAD"]) else {
        return "unknown".into();
    };
    let dirty = git(&[
        "status",
        "--porcelain",
        "--",
        "pxe-agent",
        "pxe-ebpf",
        "pxe-ebpf-common",
        "Cargo.toml",
        "Cargo.lock",
    ])
    .is_some_and(|out| !out.is_empty());
    if dirty {
        format!("{commit} + uncommitted changes")
    } else {
        commit
    }
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(values: &[Duration]) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    match sorted.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2,
    }
}

//! `cargo xtask fuzz`: runs the libFuzzer targets of `fuzz/` (cargo-fuzz,
//! nightly) for a bounded time each and prints what each did.
//!
//! Owns installing cargo-fuzz, the directories a run writes (all under
//! `target/fuzz/`: the build, the corpus a run grows, crash artifacts and
//! logs) and the summary. The committed seeds in `fuzz/corpus/<target>/`
//! are only read; what the targets check is `pxe_agent::fuzzing`'s.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Stdio,
};

use anyhow::{Context as _, bail};
use xtask::{
    process::{describe, run_forwarded},
    setup::{self, NIGHTLY, command},
    target_dir, workspace_root,
};

#[derive(Debug, clap::Args)]
pub struct Options {
    /// How long each target runs.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Run only this target (repeatable); default: every target in
    /// fuzz/fuzz_targets/.
    #[arg(long = "target", value_name = "NAME")]
    targets: Vec<String>,
}

/// One target's run.
struct Outcome {
    target: String,
    /// libFuzzer's executed inputs and rate (`-print_final_stats`).
    execs: u64,
    execs_per_sec: u64,
    new_units: u64,
    /// Crash, leak, timeout and out-of-memory inputs it wrote.
    crashes: Vec<PathBuf>,
}

pub fn run(opts: Options) -> anyhow::Result<()> {
    setup::ensure_nightly()?;
    ensure_cargo_fuzz()?;
    let root = workspace_root();
    let all = targets(&root.join("fuzz/fuzz_targets"))?;
    let chosen = if opts.targets.is_empty() {
        all
    } else {
        for t in &opts.targets {
            if !all.contains(t) {
                bail!("no fuzz target {t}; the targets are: {}", all.join(", "));
            }
        }
        opts.targets.clone()
    };
    let out = target_dir().join("fuzz");
    println!("==> building the fuzz targets (nightly, ASan)");
    run_forwarded(&mut cargo_fuzz("build", &out))?;
    let mut outcomes = Vec::new();
    for target in &chosen {
        println!("==> {target}: {} s", opts.seconds);
        outcomes.push(run_target(&root, &out, target, opts.seconds)?);
    }
    println!();
    println!(
        "{:<16} {:>12} {:>10} {:>10} {:>8}",
        "target", "execs", "execs/s", "new units", "crashes"
    );
    for o in &outcomes {
        println!(
            "{:<16} {:>12} {:>10} {:>10} {:>8}",
            o.target,
            o.execs,
            o.execs_per_sec,
            o.new_units,
            o.crashes.len()
        );
    }
    let crashed: Vec<&Outcome> = outcomes.iter().filter(|o| !o.crashes.is_empty()).collect();
    if !crashed.is_empty() {
        for o in &crashed {
            for c in &o.crashes {
                eprintln!("{}: {}", o.target, c.display());
            }
        }
        bail!(
            "{} target(s) crashed; reproduce with `cargo +nightly fuzz run <target> <input>`, \
             fix, and keep each input in fuzz/regressions/<target>/",
            crashed.len()
        );
    }
    Ok(())
}

/// `cargo +nightly fuzz <sub>` with the build under `out`, the eBPF build
/// skipped (no target links the XDP object) and the workspace root as the
/// working directory, where cargo-fuzz finds `fuzz/`.
fn cargo_fuzz(sub: &str, out: &Path) -> std::process::Command {
    let mut cmd = command("cargo");
    cmd.current_dir(workspace_root())
        .env("AYA_BUILD_SKIP", "1")
        .arg(format!("+{NIGHTLY}"))
        .args(["fuzz", sub, "--target-dir"])
        .arg(out);
    cmd
}

fn run_target(root: &Path, out: &Path, target: &str, seconds: u64) -> anyhow::Result<Outcome> {
    let corpus = out.join("corpus").join(target);
    let artifacts = out.join("artifacts").join(target);
    let logs = out.join("logs");
    for dir in [&corpus, &artifacts, &logs] {
        fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    }
    let before = artifact_files(&artifacts)?;
    let log_path = logs.join(format!("{target}.log"));
    let log = fs::File::create(&log_path)
        .with_context(|| format!("failed to create {}", log_path.display()))?;
    let seeds = root.join("fuzz/corpus").join(target);
    // The first corpus directory is the one libFuzzer adds to: the
    // committed seeds stay as they are.
    let mut cmd = cargo_fuzz("run", out);
    cmd.arg(target)
        .arg(&corpus)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-timeout=10")
        .arg("-print_final_stats=1")
        .stdout(log.try_clone()?)
        .stderr(log);
    let status = cmd
        .status()
        .with_context(|| format!("failed to run `{}`", describe(&cmd)))?;
    let text = fs::read_to_string(&log_path).unwrap_or_default();
    let stat = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let crashes: Vec<PathBuf> = artifact_files(&artifacts)?
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    if !status.success() && crashes.is_empty() {
        bail!(
            "{target}: the fuzzer failed ({status}) without a crash input; see {}",
            log_path.display()
        );
    }
    Ok(Outcome {
        target: target.to_string(),
        execs: stat("number_of_executed_units"),
        execs_per_sec: stat("average_exec_per_sec"),
        new_units: stat("new_units_added"),
        crashes,
    })
}

fn artifact_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("failed to read {}", dir.display()))? {
        files.push(entry?.path());
    }
    Ok(files)
}

/// The targets: `fuzz/fuzz_targets/<name>.rs`.
fn targets(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("failed to read {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "rs")
            && let Some(stem) = path.file_stem()
        {
            names.push(stem.to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// `cargo install cargo-fuzz --locked` unless `cargo fuzz` already runs.
fn ensure_cargo_fuzz() -> anyhow::Result<()> {
    let present = command("cargo")
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        println!("cargo-fuzz: ok");
        return Ok(());
    }
    println!("cargo-fuzz: installing");
    run_forwarded(command("cargo").args(["install", "cargo-fuzz", "--locked"]))
        .context("failed to install cargo-fuzz")
}

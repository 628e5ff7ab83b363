//! `cargo xtask storm`: N simulated machines (up to 100,000) network-boot at
//! once, each through the whole chain with firmware timers (relayed DHCP,
//! boot file over TFTP or HTTP, iPXE's DHCP, script, kernel, initrd,
//! phone-home), against pxe-agent, Kea + tftpd-hpa + nginx and dnsmasq +
//! nginx serving the same reservations and files. Root.
//!
//! ```text
//! cargo xtask storm --machines 1000,10000 --spread 30 --release --report
//! cargo xtask storm --report-only --docs
//! ```
//!
//! Each run (machine count × stack) gets a fresh routed lab ([`lab`]), the
//! stack ([`stacks`]), `machines.tsv` (MAC, class by `--mix`, TFTP
//! windowsize for `--windowsize-share` percent of the TFTP machines), the
//! simulator `storm-client` in the client namespace and a sampler of the
//! server side ([`sample`]). Results go to `target/storm/<N>/<stack>/`:
//! the simulator's `machines.csv`, `timeline.csv`, `summary.json`, plus
//! `server.csv` and `meta.json`. `--report` writes
//! `target/storm/report.html` and prints the summary tables; `--docs` also
//! copies the plots to `docs/storm/<N>/`.

mod lab;
mod report;
mod sample;
mod stacks;

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Stdio,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use xtask::{ChildGuard, ensure_root, target_dir, workspace_root};

use self::{
    lab::{RELAY_IP, SERVER_IP, StormLab},
    sample::{Drops, Sampler},
    stacks::{Files, Sizes, Stack},
};

/// The TFTP windowsize the `--windowsize-share` machines ask for.
const WINDOWSIZE: u32 = 4;
/// Time the simulator gets past `--limit` before it is stopped.
const GRACE: Duration = Duration::from_secs(60);

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Machine counts, one run per count and stack.
    #[arg(long, value_delimiter = ',', default_value = "10000")]
    machines: Vec<usize>,
    /// Machines start uniformly within this many seconds.
    #[arg(long, default_value_t = 0.0)]
    spread: f64,
    /// Stacks to run, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "pxe-agent,kea,dnsmasq"
    )]
    servers: Vec<Stack>,
    /// Firmware mix in percent (bios, uefi, uefi_http, arm64).
    #[arg(long, default_value = "bios=25,uefi=50,uefi_http=15,arm64=10")]
    mix: String,
    /// Percent of the TFTP machines that ask for windowsize 4.
    #[arg(long, default_value_t = 30)]
    windowsize_share: u32,
    /// Size of the boot files, KiB.
    #[arg(long, default_value_t = 64)]
    bootfile_kib: usize,
    /// Size of the kernel, KiB. The defaults keep the network out of the
    /// way: 10,000 machines fetch 2.5 GiB at these sizes, where the lab's
    /// veth (no segmentation offload with XDP on both ends) moved about
    /// 150 MB/s in the 10,000-machine storm.
    #[arg(long, default_value_t = 64)]
    kernel_kib: usize,
    /// Size of the initrd, KiB.
    #[arg(long, default_value_t = 128)]
    initrd_kib: usize,
    /// Packets each band of the queue (`pfifo_fast`) of each end of the
    /// lab's link holds.
    #[arg(long, default_value_t = 100_000)]
    link_queue: u32,
    /// Seconds after which the simulator gives up on the machines left.
    #[arg(long, default_value_t = 240)]
    limit: u64,
    /// Seed of the simulator's jitter and of the class assignment.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Build pxe-agent and storm-client in release mode.
    #[arg(long)]
    release: bool,
    /// After the runs, write target/storm/report.html and print its tables.
    #[arg(long)]
    report: bool,
    /// Run nothing; only write the report from the results already there.
    #[arg(long)]
    report_only: bool,
    /// With the report, copy its plots to docs/storm/<N>/.
    #[arg(long)]
    docs: bool,
}

/// The four firmware classes of `machines.tsv`, in `--mix` order.
const CLASSES: [&str; 4] = ["bios", "uefi", "uefi_http", "arm64"];

pub fn run(args: Args) -> anyhow::Result<()> {
    ensure_root()?;
    let root = target_dir().join("storm");
    if !args.report_only {
        let mix = parse_mix(&args.mix)?;
        ensure!(
            args.windowsize_share <= 100,
            "--windowsize-share is a percentage"
        );
        let bins = build(args.release)?;
        for &n in &args.machines {
            ensure!(
                n > 0 && n <= stacks::MAX_MACHINES,
                "--machines {n}: use 1 to {}",
                stacks::MAX_MACHINES
            );
            for &stack in &args.servers {
                let out = root.join(n.to_string()).join(stack.name());
                println!("storm: {n} machines against {}", stack.label());
                match run_one(&args, &bins, &mix, n, stack, &out) {
                    Ok(summary) => println!("storm: {} {n}: {summary}", stack.name()),
                    Err(err) => eprintln!("storm: {} {n} failed: {err:#}", stack.name()),
                }
            }
        }
    }
    if args.report || args.report_only {
        let html = root.join("report.html");
        let markdown = report::write(&root, &html)?;
        println!("{markdown}");
        println!("storm: wrote {}", html.display());
        if args.docs {
            for n in &args.machines {
                let dir = workspace_root().join("docs/storm").join(n.to_string());
                fs::create_dir_all(&dir)
                    .with_context(|| format!("failed to create {}", dir.display()))?;
                let names = report::svg_files(&root, &n.to_string(), &dir)?;
                println!("storm: {} plots in {}", names.len(), dir.display());
            }
        }
    }
    Ok(())
}

struct Bins {
    agent: PathBuf,
    client: PathBuf,
}

/// Builds pxe-agent and storm-client (as `bench scale` builds its binaries).
fn build(release: bool) -> anyhow::Result<Bins> {
    println!(
        "storm: building pxe-agent and storm-client ({})",
        if release { "release" } else { "debug" }
    );
    let built = crate::bench::build(
        release,
        &["pxe-agent", "pxe-tests"],
        &["--bins"],
        &["pxe-agent", "storm-client"],
    )?;
    let [agent, client] = <[PathBuf; 2]>::try_from(built)
        .map_err(|_| anyhow::anyhow!("expected two built binaries"))?;
    Ok(Bins { agent, client })
}

/// One run: fresh lab, stack, simulator, sampler; returns a line for the
/// progress output. Results (or what the stack's failure left) are in `out`.
fn run_one(
    args: &Args,
    bins: &Bins,
    mix: &[u32; 4],
    n: usize,
    stack: Stack,
    out: &Path,
) -> anyhow::Result<String> {
    if out.exists() {
        fs::remove_dir_all(out).with_context(|| format!("failed to clear {}", out.display()))?;
    }
    fs::create_dir_all(out).with_context(|| format!("failed to create {}", out.display()))?;
    let scratch = std::env::temp_dir().join(format!("pxe-storm-{}", std::process::id()));
    let _ = fs::remove_dir_all(&scratch);
    let sizes = Sizes {
        bootfile_kib: args.bootfile_kib,
        kernel_kib: args.kernel_kib,
        initrd_kib: args.initrd_kib,
    };
    let result = (|| {
        let files = Files::write(&scratch.join("files"), sizes)?;
        let mut net = StormLab::new(&bins.agent, args.link_queue)?;
        let machines = out.join("machines.tsv");
        write(
            &machines,
            &machines_tsv(n, mix, args.windowsize_share, args.seed),
        )?;
        let started = Instant::now();
        let running = stacks::start(stack, &net, &bins.agent, &files, n, &scratch.join("stack"))
            .with_context(|| format!("{} did not start", stack.label()))?;
        println!(
            "storm: {} ready after {:.1} s",
            stack.name(),
            started.elapsed().as_secs_f64()
        );
        let before = Drops::read(&net, stack == Stack::PxeAgent)?;
        let sim_before = sample::sim_udp_drops(&net)?;
        let tcp_before = sample::tcp_counters(&net)?;
        let sampler = Sampler::start(running.pids(), net.napi, out.join("server.csv"));
        let sim = simulate(args, bins, &net, &machines, out);
        sampler.finish()?;
        let after = Drops::read(&net, stack == Stack::PxeAgent)?;
        let sim_after = sample::sim_udp_drops(&net)?;
        let tcp_after = sample::tcp_counters(&net)?;
        let tcp = [0, 1].map(|i| sample::growth(&tcp_before[i], &tcp_after[i]));
        let sim_drops = (
            sim_after.0.saturating_sub(sim_before.0),
            sim_after.1.saturating_sub(sim_before.1),
        );
        if stack == Stack::PxeAgent {
            // Its counters at the end (TFTP waits, HTTP slots, XDP), for
            // reading a run after the fact.
            let metrics = sample::agent_metrics(&net).unwrap_or_default();
            write(&out.join("agent-metrics.txt"), &metrics)?;
        }
        let peer = net.check_peer();
        let mut running = running;
        let alive = running.check_alive();
        running.stop();
        keep_logs(&scratch.join("stack"), out);
        let mut sim_error = sim.err().map(|e| format!("{e:#}"));
        for problem in [peer.err(), alive.err()].into_iter().flatten() {
            let text = format!("{problem:#}");
            sim_error = Some(match sim_error {
                Some(prev) => format!("{prev}; {text}"),
                None => text,
            });
        }
        write(
            &out.join("meta.json"),
            &meta_json(
                args,
                n,
                stack,
                &after.since(&before),
                sim_drops,
                &tcp,
                sim_error.as_deref(),
            ),
        )?;
        let summary = fs::read_to_string(out.join("summary.json")).unwrap_or_default();
        Ok(match sim_error {
            Some(err) => format!("{} (problem: {err})", summary.trim()),
            None => summary.trim().to_owned(),
        })
    })();
    let _ = fs::remove_dir_all(&scratch);
    result
}

/// Copies the stack's logs (`<name>.log`) into the run's results, where
/// they outlive the scratch directory; best effort.
fn keep_logs(stack_dir: &Path, out: &Path) {
    let Ok(entries) = fs::read_dir(stack_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log")
            && let Some(name) = path.file_name()
        {
            let _ = fs::copy(&path, out.join(name));
        }
    }
}

/// Runs storm-client in the client namespace until it exits, or stops it
/// `GRACE` past the limit.
fn simulate(
    args: &Args,
    bins: &Bins,
    net: &StormLab,
    machines: &Path,
    out: &Path,
) -> anyhow::Result<()> {
    let log = out.join("storm-client.log");
    let log_file =
        fs::File::create(&log).with_context(|| format!("failed to create {}", log.display()))?;
    let mut cmd = net.lab.cmd_in(net.lab.client_ns(), &bins.client);
    cmd.arg("--machines")
        .arg(machines)
        .args(["--server", SERVER_IP, "--relay", RELAY_IP])
        .arg("--out")
        .arg(out)
        .args(["--spread", &args.spread.to_string()])
        .args(["--seed", &args.seed.to_string()])
        .args(["--limit", &args.limit.to_string()])
        .args(["--ipxe-user-class", "iPXE"])
        .stdin(Stdio::null())
        .stdout(
            log_file
                .try_clone()
                .context("failed to clone the log handle")?,
        )
        .stderr(log_file);
    let mut child = ChildGuard::spawn(&mut cmd)?;
    let deadline = Instant::now()
        + Duration::from_secs(args.limit)
        + Duration::from_secs_f64(args.spread.max(0.0))
        + GRACE;
    loop {
        if let Some(status) = child.try_wait()? {
            if status.success() {
                return Ok(());
            }
            let text = fs::read_to_string(&log).unwrap_or_default();
            let tail = text.lines().last().unwrap_or("").trim();
            bail!("storm-client exited ({status}): {tail}");
        }
        if Instant::now() > deadline {
            child.stop()?;
            bail!(
                "storm-client did not finish within limit + spread + {} s",
                GRACE.as_secs()
            );
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// Parses `bios=25,uefi=50,uefi_http=15,arm64=10` into percentages in
/// [`CLASSES`] order (missing classes 0); they must add up to 100.
fn parse_mix(text: &str) -> anyhow::Result<[u32; 4]> {
    let mut mix = [0; 4];
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let (name, pct) = part
            .split_once('=')
            .with_context(|| format!("--mix: {part:?} is not class=percent"))?;
        let slot = CLASSES
            .iter()
            .position(|c| *c == name.trim())
            .with_context(|| {
                format!("--mix: unknown class {name:?} (use {})", CLASSES.join(", "))
            })?;
        mix[slot] = pct
            .trim()
            .parse()
            .with_context(|| format!("--mix: {pct:?} is not a percentage"))?;
    }
    ensure!(
        mix.iter().sum::<u32>() == 100,
        "--mix must add up to 100, not {}",
        mix.iter().sum::<u32>()
    );
    Ok(mix)
}

/// `machines.tsv`: machine i's MAC, its class (by `mix`, spread over the
/// index range so any prefix has the mix) and windowsize for
/// `windowsize_share` percent of the TFTP machines, chosen by `seed`.
fn machines_tsv(n: usize, mix: &[u32; 4], windowsize_share: u32, seed: u64) -> String {
    let mut out = String::with_capacity(n * 32);
    for i in 0..n {
        let slot = (mix_hash(i as u64, seed) % 100) as u32;
        let mut acc = 0;
        let class = CLASSES
            .iter()
            .zip(mix)
            .find(|(_, pct)| {
                acc += **pct;
                slot < acc
            })
            .map_or(CLASSES[0], |(c, _)| *c);
        let window = if class != "uefi_http"
            && (mix_hash(i as u64, seed ^ 0x5eed) % 100) < u64::from(windowsize_share)
        {
            WINDOWSIZE
        } else {
            0
        };
        let _ = writeln!(out, "{}\t{class}\t{window}", stacks::machine_mac(i));
    }
    out
}

/// A 64-bit mix (splitmix64) of `i` and `seed`.
fn mix_hash(i: u64, seed: u64) -> u64 {
    let mut z = i.wrapping_add(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn meta_json(
    args: &Args,
    n: usize,
    stack: Stack,
    drops: &Drops,
    sim_drops: (u64, u64),
    tcp: &[BTreeMap<String, u64>; 2],
    sim_error: Option<&str>,
) -> String {
    let object = |counters: &BTreeMap<String, u64>| {
        let fields: Vec<String> = counters
            .iter()
            .map(|(name, v)| format!("{}: {v}", json_string(name)))
            .collect();
        format!("{{{}}}", fields.join(", "))
    };
    let tcp_json = format!(
        "{{\"server\": {}, \"sim\": {}}}",
        object(&tcp[0]),
        object(&tcp[1])
    );
    let mix = parse_mix(&args.mix).unwrap_or_default();
    let mix_json = CLASSES
        .iter()
        .zip(mix)
        .map(|(c, p)| format!("\"{c}\": {p}"))
        .collect::<Vec<_>>()
        .join(", ");
    let kernel = crate::bench::run_text(std::process::Command::new("uname").arg("-r"))
        .unwrap_or_else(|_| "unknown".into());
    let date = crate::bench::run_text(
        std::process::Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
    )
    .unwrap_or_default();
    let guard = drops
        .agent_storm_guard
        .map_or_else(|| "null".to_owned(), |v| v.to_string());
    let sim_error = sim_error.map_or_else(|| "null".to_owned(), json_string);
    format!(
        "{{\n  \"stack\": {},\n  \"label\": {},\n  \"machines\": {n},\n  \"spread_s\": {},\n  \
         \"mix\": {{{mix_json}}},\n  \"windowsize_share\": {},\n  \"bootfile_kib\": {},\n  \
         \"kernel_kib\": {},\n  \"initrd_kib\": {},\n  \"cpu\": {},\n  \"kernel\": {},\n  \
         \"date\": {},\n  \"nofile\": {},\n  \"server_drops\": {{\"iface_rx_dropped\": {}, \"udp_rcvbuf_errors\": {}, \
         \"udp_sndbuf_errors\": {}, \"udp_in_errors\": {}, \"xdp_tx_errors\": {}, \
         \"agent_storm_guard\": {guard}}},\n  \
         \"sim_udp_rcvbuf_errors\": {},\n  \"sim_udp_sndbuf_errors\": {},\n  \"tcp\": {tcp_json},\n  \
         \"sim_error\": {sim_error}\n}}\n",
        json_string(stack.name()),
        json_string(stack.label()),
        args.spread,
        args.windowsize_share,
        args.bootfile_kib,
        args.kernel_kib,
        args.initrd_kib,
        json_string(&crate::bench::cpu_model()),
        json_string(&kernel),
        json_string(&date),
        stacks::nofile_in_force().map_or_else(|| "null".to_owned(), |n| n.to_string()),
        drops.iface_rx_dropped,
        drops.udp_rcvbuf_errors,
        drops.udp_sndbuf_errors,
        drops.udp_in_errors,
        drops.xdp_tx_errors,
        sim_drops.0,
        sim_drops.1,
    )
}

/// `text` as a JSON string literal.
fn json_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    fs::write(path, text).with_context(|| format!("failed to write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_parses_and_must_add_up() {
        assert_eq!(
            parse_mix("bios=25,uefi=50,uefi_http=15,arm64=10").unwrap(),
            [25, 50, 15, 10]
        );
        assert_eq!(parse_mix("uefi=100").unwrap(), [0, 100, 0, 0]);
        assert!(parse_mix("bios=50").is_err());
        assert!(parse_mix("floppy=100").is_err());
    }

    #[test]
    fn machines_follow_the_mix() {
        let tsv = machines_tsv(10_000, &[25, 50, 15, 10], 30, 1);
        let lines: Vec<&str> = tsv.lines().collect();
        assert_eq!(lines.len(), 10_000);
        assert!(lines[0].starts_with("02:57:00:00:00:00\t"));
        let count = |class: &str| {
            lines
                .iter()
                .filter(|l| l.split('\t').nth(1) == Some(class))
                .count()
        };
        assert!((2_300..2_700).contains(&count("bios")), "{}", count("bios"));
        assert!((4_700..5_300).contains(&count("uefi")));
        let windowed = lines.iter().filter(|l| l.ends_with("\t4")).count();
        assert!((2_300..2_900).contains(&windowed), "{windowed}");
        assert!(
            lines
                .iter()
                .all(|l| !(l.contains("uefi_http") && l.ends_with("\t4")))
        );
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}

//! Storm-aware sequencing in the running agent, seen from 20 real IPMI
//! BMCs (OpenIPMI's `ipmi_sim`): the power-up rate, the limit on BMC calls
//! at once, holding power-ups while too many hosts await DHCP, and a dead
//! BMC failing alone. What counts is what the chassis programs recorded
//! (power-on times, start and end of every call), not what the agent says
//! it did.
//!
//! The agent runs on the server end of its lab, the fleet on the client
//! end at 10.67.0.1..20 ([`BmcFleet::start_on`]); the agent reaches them
//! through a second address, 10.67.0.254/24, on its own end. No guests:
//! recovered hosts stay awaiting-dhcp until their DHCP deadline.

use std::{
    fs, thread,
    time::{Duration, Instant, SystemTime},
};

use crate::{
    agent::{Scratch, Served, agent_bin},
    bmc_lab::{BmcFleet, bmc_ip},
    bmc_sim::{PASSWORD, Span},
};

const FLEET: usize = 20;
const TOKEN: &str = "0123456789abcdef0123456789abcdef";
/// The agent's address on the BMC network.
const AGENT_BMC_CIDR: &str = "10.67.0.254/24";
/// On the BMC network, with nothing behind it.
const DEAD_BMC: &str = "10.67.0.200";
const RATE: f64 = 2.0;
/// `pxe-agent run` has no flag for it: the sequencer's default.
const BURST: usize = 1;
const CONCURRENCY: usize = 4;
/// How far a chassis program's clock reading may trail the agent's
/// release of the call (session set-up, forking the program).
const JITTER: Duration = Duration::from_millis(150);

/// The agent with 20 BMC hosts, and the fleet. Field order: the
/// simulators stop before the agent's lab goes.
struct Rig {
    fleet: BmcFleet,
    dir: Scratch,
    served: Served,
}

impl Rig {
    /// `recovery` is the hosts' recovery block (YAML flow map) or empty;
    /// host `dead`'s BMC address has nothing behind it.
    fn start(name: &str, extra: &[&str], recovery: &str, dead: Option<usize>) -> Rig {
        let dir = Scratch::new(&format!("{name}-bmc"));
        fs::write(dir.path("bmc.password"), PASSWORD).unwrap();
        fs::write(dir.path("tokens"), format!("ops {TOKEN}\n")).unwrap();
        fs::write(dir.path("token"), format!("{TOKEN}\n")).unwrap();
        let password = dir.path("bmc.password");
        let mut inventory = String::from(
            "subnets: [{cidr: 10.66.0.0/16}]\n\
             profiles: [{name: w, boot: {bios: undionly.kpxe}}]\nhosts:\n",
        );
        for i in 0..FLEET {
            let bmc = if dead == Some(i) {
                DEAD_BMC.to_owned()
            } else {
                bmc_ip(i)
            };
            inventory.push_str(&format!(
                "  - mac: \"02:00:00:00:01:{i:02x}\"\n    ip: 10.66.1.{}\n    \
                 hostname: node-{i:02}\n    profile: w\n    bmc:\n      \
                 address: ipmi://{bmc}:623\n      username: admin\n      \
                 password_file: {}\n",
                10 + i,
                password.display()
            ));
            if !recovery.is_empty() {
                inventory.push_str(&format!("    recovery: {recovery}\n"));
            }
        }
        let tokens = dir.path("tokens");
        let mut args = vec![
            "--api-token-file",
            tokens.to_str().unwrap(),
            "--bmc-boot-flag-echo",
            "device-only",
        ];
        args.extend(extra);
        let served = Served::start_with(name, &inventory, &args);
        let lab = &served.lab;
        lab.run_in(
            lab.server_ns(),
            &["ip", "addr", "add", AGENT_BMC_CIDR, "dev", lab.server_if()],
        )
        .expect("address the agent on the BMC network");
        let started = Instant::now();
        let fleet = BmcFleet::start_on(lab.client_ns(), lab.client_if(), lab.server_ns(), FLEET);
        eprintln!(
            "{FLEET} BMCs answered after {:.2}s",
            started.elapsed().as_secs_f64()
        );
        Rig { fleet, dir, served }
    }

    fn token(&self) -> String {
        self.dir.path("token").display().to_string()
    }

    /// `pxe-agent ARGS --token-file T` in the agent's namespace: success
    /// and stdout.
    fn cli(&self, args: &[&str]) -> (bool, String) {
        let out = self
            .served
            .lab
            .cmd_in(self.served.lab.server_ns(), agent_bin())
            .args(args)
            .args(["--token-file", &self.token()])
            .output()
            .expect("run pxe-agent");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        eprintln!(
            "$ pxe-agent {}\n{stdout}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), stdout)
    }

    fn metrics(&self) -> String {
        let out = self
            .served
            .lab
            .cmd_in(self.served.lab.server_ns(), "curl")
            .args(["-s", "http://127.0.0.1:9464/metrics"])
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Every power-on the fleet recorded, in time order.
    fn power_ons(&self) -> Vec<SystemTime> {
        let mut all: Vec<SystemTime> = self
            .fleet
            .sims()
            .iter()
            .flat_map(|s| s.power_ons())
            .collect();
        all.sort();
        all
    }

    fn context(&self) -> String {
        let log = self.served.log();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("agent log (last 40 lines):\n{}", tail.join("\n"))
    }
}

/// Seconds from `t0`.
pub(crate) fn secs(t: SystemTime, t0: SystemTime) -> f64 {
    match t.duration_since(t0) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// The most times (sorted) in any half-open window `[t, t + window)`.
pub(crate) fn most_in_window(times: &[SystemTime], window: Duration) -> usize {
    (0..times.len())
        .map(|i| {
            times[i..]
                .iter()
                .take_while(|t| **t < times[i] + window)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// The most spans running at one instant (an end before a start at the
/// same instant).
pub(crate) fn most_overlapping(spans: &[Span]) -> usize {
    let mut edges: Vec<(SystemTime, i32)> = spans
        .iter()
        .flat_map(|s| [(s.start, 1), (s.end, -1)])
        .collect();
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

/// User and system CPU time of process `pid` so far, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("read the agent's stat");
    // Fields after the command name (which may hold spaces) in parentheses;
    // utime and stime are fields 14 and 15 of proc(5), in clock ticks.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ticks as f64 / hz as f64
}

/// The value of the sample `name` (with its labels) on a `/metrics` page.
fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn print_offsets(what: &str, times: &[SystemTime], t0: SystemTime) {
    let offsets: Vec<String> = times
        .iter()
        .map(|t| format!("{:.2}", secs(*t, t0)))
        .collect();
    eprintln!("{what} (s after the command): {}", offsets.join(" "));
}

#[test]
fn power_ons_keep_to_the_rate_and_bmc_calls_to_the_concurrency_limit() {
    let rig = Rig::start(
        "pxseqrate",
        &["--bmc-concurrency", "4", "--power-ons-per-second", "2"],
        "",
        None,
    );
    // Every chassis call takes 1.2 s (under the driver's 2 s attempt
    // timeout, so nothing is resent): a power-on and its read-back keep a
    // BMC busy ~2.5 s, so at 2 power-ons a second about five calls would
    // overlap without the limit.
    for sim in rig.fleet.sims() {
        sim.set_call_delay(Duration::from_millis(1200));
    }
    let t0 = SystemTime::now();
    let (ok, table) = rig.cli(&["bmc", "power", "on", "--all", "--concurrency", "20"]);
    assert!(ok, "power on --all failed:\n{table}\n{}", rig.context());
    for (i, sim) in rig.fleet.sims().iter().enumerate() {
        assert_eq!(sim.power_ons().len(), 1, "BMC {i} ({})", sim.ip());
    }
    let ons = rig.power_ons();
    print_offsets("power-ons", &ons, t0);
    let gaps: Vec<f64> = ons.windows(2).map(|w| secs(w[1], w[0])).collect();
    let min_gap = gaps.iter().copied().fold(f64::INFINITY, f64::min);
    let span = secs(ons[FLEET - 1], ons[0]);
    let in_a_second = most_in_window(&ons, Duration::from_secs(1));
    let spans: Vec<Span> = rig.fleet.sims().iter().flat_map(|s| s.spans()).collect();
    let overlap = most_overlapping(&spans);
    let metrics = rig.metrics();
    let held = sample(&metrics, "pxe_recovery_waits_total{gate=\"concurrency\"}");
    eprintln!(
        "span {span:.2}s, smallest gap {min_gap:.2}s, most in 1 s {in_a_second}, \
         most BMC calls at once {overlap} ({} chassis calls), waits for the \
         concurrency limit {held:?}",
        spans.len()
    );
    assert!(
        in_a_second <= RATE as usize + BURST,
        "{in_a_second} power-ons in one second"
    );
    let least = (FLEET - BURST) as f64 / RATE - JITTER.as_secs_f64();
    assert!(span >= least, "{FLEET} power-ons in {span:.2}s");
    assert!(
        overlap <= CONCURRENCY,
        "{overlap} BMC calls overlapped: {spans:?}"
    );
    assert!(
        held.is_some_and(|n| n > 0.0),
        "the concurrency limit never held a call:\n{metrics}"
    );
}

#[test]
fn power_ups_wait_while_too_many_hosts_await_dhcp() {
    const DHCP_DEADLINE: Duration = Duration::from_secs(6);
    let rig = Rig::start(
        "pxseqstorm",
        &[
            "--bmc-concurrency",
            "4",
            "--power-ons-per-second",
            "2",
            "--max-awaiting",
            "5",
        ],
        "{stages: {dhcp: 6s}}",
        None,
    );
    let t0 = SystemTime::now();
    let (ok, table) = rig.cli(&["recover", "--all", "--concurrency", "20"]);
    assert!(ok, "recover --all failed:\n{table}\n{}", rig.context());
    // Five power-ons at the rate (2 s), then nothing until the first host's
    // DHCP deadline.
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.power_ons().len() < 5 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    // Held, the agent waits for events: it does not spin.
    let cpu_before = cpu_seconds(rig.served.agent_pid());
    thread::sleep(Duration::from_millis(1500));
    let cpu_held = cpu_seconds(rig.served.agent_pid()) - cpu_before;
    let held = rig.metrics();
    let first = *rig.power_ons().first().expect("no host powered on");
    let queued = sample(&held, "pxe_recovery_queue_length");
    let awaiting = sample(&held, "pxe_recovery_hosts{state=\"awaiting-dhcp\"}");
    let waits = sample(&held, "pxe_recovery_waits_total{gate=\"awaiting\"}");
    eprintln!(
        "while held: {} power-ons, queue {queued:?}, awaiting-dhcp {awaiting:?}, \
         waits for awaiting hosts {waits:?}",
        rig.power_ons().len()
    );
    eprintln!("agent CPU while held: {cpu_held:.2}s in 1.5 s");
    assert!(
        cpu_held < 0.1,
        "the agent spun while power-ups were held: {cpu_held:.2}s of CPU in 1.5 s"
    );
    assert_eq!(rig.power_ons().len(), 5, "{}", rig.context());
    assert_eq!(queued, Some((FLEET - 5) as f64), "{held}");
    assert_eq!(awaiting, Some(5.0), "{held}");
    assert!(waits.is_some_and(|n| n >= 1.0), "{held}");
    // The first host leaves awaiting-dhcp at its deadline; then the next.
    let deadline = Instant::now() + DHCP_DEADLINE + Duration::from_secs(6);
    while rig.power_ons().len() < 6 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    let ons = rig.power_ons();
    print_offsets("power-ons", &ons, t0);
    assert!(ons.len() >= 6, "nothing powered on after the deadline");
    let sixth = secs(ons[5], first);
    eprintln!("sixth power-on {sixth:.2}s after the first");
    assert!(
        ons[5] >= first + DHCP_DEADLINE,
        "a sixth power-on {sixth:.2}s after the first, before any host left awaiting-dhcp"
    );
    let after = rig.metrics();
    let waited = sample(&after, "pxe_recovery_wait_seconds_total");
    eprintln!("seconds released actions waited in all: {waited:?}");
    assert!(
        waited.is_some_and(|s| s >= DHCP_DEADLINE.as_secs_f64() - 2.0),
        "{after}"
    );
}

#[test]
fn a_dead_bmc_fails_alone_and_the_others_power_on_on_schedule() {
    let rig = Rig::start(
        "pxseqdead",
        &["--bmc-concurrency", "4", "--power-ons-per-second", "2"],
        "",
        Some(0),
    );
    // The CLI's default 16 requests at once: the dead host holds one of
    // them for its whole deadline, the others go on to the next hosts.
    let t0 = SystemTime::now();
    let (ok, table) = rig.cli(&["bmc", "power", "on", "--all"]);
    let took = secs(SystemTime::now(), t0);
    assert!(!ok, "power on --all succeeded with a dead BMC:\n{table}");
    let ons = rig.power_ons();
    print_offsets("power-ons", &ons, t0);
    assert!(rig.fleet.sims()[0].power_ons().is_empty());
    for (i, sim) in rig.fleet.sims().iter().enumerate().skip(1) {
        assert_eq!(sim.power_ons().len(), 1, "BMC {i} ({})", sim.ip());
    }
    // Twenty power-up slots, one of them the dead host's, 0.5 s apart.
    let last = secs(ons[FLEET - 2], t0);
    let due = (FLEET - BURST) as f64 / RATE + 2.0;
    eprintln!(
        "last live power-on {last:.2}s after the command (due by {due:.1}s); command took {took:.2}s"
    );
    assert!(
        last <= due,
        "the live BMCs were held up: last power-on at {last:.2}s"
    );
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("node-")).collect();
    assert_eq!(rows.len(), FLEET, "{table}");
    let dead = rows.iter().find(|l| l.starts_with("node-00 ")).unwrap();
    assert!(
        dead.contains(" error ") && dead.contains(DEAD_BMC),
        "the dead BMC's row does not say what failed: {dead}"
    );
    for row in rows.iter().filter(|l| !l.starts_with("node-00 ")) {
        assert!(row.contains(" ok "), "{row}");
    }
}

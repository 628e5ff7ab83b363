//! CPU accounting for the benchmark: which cores play client and server,
//! pinning threads to them, and reading what each side spent.
//!
//! Sources, all from `/proc`:
//! - `/proc/stat`: the whole machine. Its user/system/softirq fields are
//!   tick samples, which miss short bursts between ticks; its idle and
//!   iowait fields are measured, so "busy" here is wall time times online
//!   CPUs minus idle and iowait.
//! - `/proc/<pid>/stat` utime + stime: a whole process (every thread, even
//!   exited ones), scaled by the kernel to its measured run time.
//! - `/proc/<tid>/schedstat`: one thread's run time in nanoseconds, for the
//!   NAPI threads.
//!
//! It does not decide what counts as server or client CPU; [`super::load`]
//! does.

use std::{
    collections::BTreeSet,
    fs,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};

/// The generator's core and the server's cores.
#[derive(Clone, Debug)]
pub struct Cores {
    pub generator: usize,
    pub server: Vec<usize>,
}

impl Cores {
    /// The last CPU this process may run on drives the load; the others
    /// serve.
    pub fn detect() -> anyhow::Result<Cores> {
        let mut cpus = allowed_cpus()?;
        ensure!(
            cpus.len() >= 2,
            "the benchmark needs 2 CPUs (one for the load generator, one for the server), \
             this process may use {}",
            cpus.len()
        );
        let generator = cpus.pop().context("no CPU")?;
        Ok(Cores {
            generator,
            server: cpus,
        })
    }

    /// The server cores as `taskset -c` spells them.
    pub fn server_list(&self) -> String {
        join(&self.server)
    }

    pub fn generator_list(&self) -> String {
        self.generator.to_string()
    }
}

fn join(cpus: &[usize]) -> String {
    cpus.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn allowed_cpus() -> anyhow::Result<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity fills it.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(std::io::Error::last_os_error()).context("sched_getaffinity failed");
        }
        set
    };
    let max = 8 * size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads the set for indices below its size.
    Ok((0..max)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Restricts thread `tid` to `cpus`.
pub fn pin(tid: u32, cpus: &[usize]) -> anyhow::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays in bounds
    // because every CPU came from sched_getaffinity.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(tid as libc::pid_t, size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("failed to pin thread {tid} to CPUs {}", join(cpus)));
    }
    Ok(())
}

/// Kernel threads named `napi/<iface>-<id>` (threaded NAPI), by thread id.
pub fn napi_threads(iface: &str) -> BTreeSet<u32> {
    let prefix = format!("napi/{iface}-");
    let Ok(dir) = fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim_end().starts_with(&prefix))
        })
        .collect()
}

/// User + system time of process `pid` (all its threads), to the clock tick.
pub fn process_time(pid: u32) -> anyhow::Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let stat = fs::read_to_string(&path).with_context(|| format!("failed to read {path}"))?;
    parse_process_time(&stat, clock_tick()).with_context(|| format!("unexpected {path}: {stat}"))
}

fn parse_process_time(stat: &str, tick: Duration) -> Option<Duration> {
    // The command name, field 2, may hold spaces and parentheses; fields
    // after its closing parenthesis start at field 3 (state).
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u32 = fields.get(11)?.parse().ok()?;
    let stime: u32 = fields.get(12)?.parse().ok()?;
    Some(tick * (utime + stime))
}

/// Run time of thread `tid` in nanoseconds, from its schedstat.
pub fn thread_time(tid: u32) -> anyhow::Result<Duration> {
    let path = format!("/proc/{tid}/schedstat");
    let text = fs::read_to_string(&path).with_context(|| format!("failed to read {path}"))?;
    let ns = text
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("unexpected {path}: {text}"))?;
    Ok(Duration::from_nanos(ns))
}

fn clock_tick() -> Duration {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Duration::from_secs(1) / u32::try_from(hz).ok().filter(|&hz| hz > 0).unwrap_or(100)
}

/// The machine's CPU time at one instant.
#[derive(Clone, Copy, Debug)]
pub struct Machine {
    at: Instant,
    cpus: u32,
    /// user + nice + system + irq + softirq, tick-sampled.
    sampled_busy: Duration,
    /// idle + iowait, measured.
    idle: Duration,
}

/// What the machine spent between two [`Machine`] readings.
#[derive(Clone, Copy, Debug, Default)]
pub struct MachineUsage {
    pub wall: Duration,
    /// CPUs × wall − idle − iowait: every CPU's busy time, measured.
    pub busy: Duration,
    /// The tick-sampled busy fields, for comparison.
    pub sampled_busy: Duration,
}

impl Machine {
    pub fn read() -> anyhow::Result<Machine> {
        let text = fs::read_to_string("/proc/stat").context("failed to read /proc/stat")?;
        parse_proc_stat(&text, clock_tick(), Instant::now()).context("unexpected /proc/stat")
    }

    pub fn since(&self, before: &Machine) -> MachineUsage {
        let wall = self.at.saturating_duration_since(before.at);
        MachineUsage {
            wall,
            busy: (wall * self.cpus).saturating_sub(self.idle.saturating_sub(before.idle)),
            sampled_busy: self.sampled_busy.saturating_sub(before.sampled_busy),
        }
    }
}

/// Waits until the whole machine has been busy for less than `cores` CPUs'
/// worth over a short window, for at most `max_wait`; returns whether it
/// got that quiet. Between runs the bench's own processes are idle, so what
/// it waits out is other work on the machine.
pub fn wait_quiet(cores: f64, max_wait: Duration) -> anyhow::Result<bool> {
    const WINDOW: Duration = Duration::from_millis(300);
    let deadline = Instant::now() + max_wait;
    loop {
        let before = Machine::read()?;
        std::thread::sleep(WINDOW);
        let usage = Machine::read()?.since(&before);
        if usage.busy.as_secs_f64() < cores * usage.wall.as_secs_f64() {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
    }
}

fn parse_proc_stat(text: &str, tick: Duration, at: Instant) -> anyhow::Result<Machine> {
    let cpus = text
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    let total = text
        .lines()
        .find(|l| l.starts_with("cpu "))
        .context("no cpu line")?;
    let v: Vec<u64> = total
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().context("non-numeric field"))
        .collect::<anyhow::Result<_>>()?;
    if v.len() < 7 {
        bail!("cpu line has {} fields", v.len());
    }
    let (user, nice, system, idle, iowait, irq, softirq) =
        (v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
    let ticks = |n: u64| tick * u32::try_from(n).unwrap_or(u32::MAX);
    Ok(Machine {
        at,
        cpus: u32::try_from(cpus).context("too many CPUs")?,
        sampled_busy: ticks(user + nice + system + irq + softirq),
        idle: ticks(idle + iowait),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_time_survives_odd_command_names() {
        let stat = "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0 100 0 0";
        let tick = Duration::from_millis(10);
        assert_eq!(
            parse_process_time(stat, tick),
            Some(Duration::from_millis(120))
        );
        assert_eq!(parse_process_time("1234 (x) S 1", tick), None);
    }

    #[test]
    fn machine_busy_is_wall_time_minus_idle() {
        let tick = Duration::from_millis(10);
        let t0 = Instant::now();
        let before = parse_proc_stat(
            "cpu  100 0 50 1000 10 0 5 0 0 0\ncpu0 50 0 25 500 5 0 2 0 0 0\ncpu1 50 0 25 500 5 0 3 0 0 0\n",
            tick,
            t0,
        )
        .unwrap();
        let after = parse_proc_stat(
            "cpu  150 0 60 1140 10 0 5 0 0 0\ncpu0 75 0 30 570 5 0 2 0 0 0\ncpu1 75 0 30 570 5 0 3 0 0 0\n",
            tick,
            t0 + Duration::from_secs(1),
        )
        .unwrap();
        let usage = after.since(&before);
        // 2 CPUs × 1 s − 1.4 s idle.
        assert_eq!(usage.wall, Duration::from_secs(1));
        assert_eq!(usage.busy, Duration::from_millis(600));
        assert_eq!(usage.sampled_busy, Duration::from_millis(600));
    }
}

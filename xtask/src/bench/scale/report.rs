//! The fleet-scale results as one markdown table, a row per inventory
//! source and size; a size the agent could not load is a row naming what
//! failed.
//!
//! Owns presentation only; the numbers come from [`super::agent`] and
//! `dhcp-loadgen prog-test-run --pinned`.

use std::{fmt::Write as _, time::Duration};

use super::{super::dhcp::report::thousands, Inventory, agent::Reload};

/// One inventory source and size's numbers.
#[derive(Clone, Debug)]
pub struct Row {
    pub source: Inventory,
    pub hosts: usize,
    pub outcome: Result<Numbers, String>,
}

#[derive(Clone, Debug)]
pub struct Numbers {
    pub ready: Duration,
    pub read: Option<Duration>,
    /// VmRSS once ready and settled, KiB.
    pub rss_kib: u64,
    /// VmHWM once ready: the load's peak, KiB.
    pub load_peak_kib: u64,
    pub memlock: u64,
    /// The reload that changes one host.
    pub one_host: Reload,
    /// The reload that adds 1,000 hosts (the file only).
    pub add_hosts: Option<Reload>,
    /// The reload that changes every host's replies.
    pub whole: Reload,
    /// Nanoseconds per reply (mean of OFFER and ACK), or why it failed.
    pub per_reply_ns: Result<PerReply, String>,
}

/// Kernel time per reply, ns: as `BPF_PROG_TEST_RUN` reports it with one
/// run per call, and less what one run per call adds over a large repeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerReply {
    pub raw: u64,
    pub program: u64,
}

/// Facts printed above the table.
pub struct RunInfo {
    pub date: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub profile: &'static str,
    pub runs: u32,
}

/// How the table names `source`.
pub fn source_name(source: Inventory) -> &'static str {
    match source {
        Inventory::File => "file",
        Inventory::Kube => "BootHosts",
    }
}

/// The heading line and the table.
pub fn markdown(info: &RunInfo, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Run of {}, Linux {}, {} × {}, pxe-agent {} build; BPF_PROG_TEST_RUN: {} runs each of a \
         DISCOVER and its REQUEST for one host picked at random (BIOS class), one run per syscall; \
         ns per reply is the median of 5 such means, then the same less what one \
         run per call adds over a large repeat (an empty XDP program timed both ways).\n",
        info.date,
        info.kernel,
        info.cpus,
        info.cpu_model,
        info.profile,
        thousands(f64::from(info.runs)),
    );
    out.push_str(
        "| source | hosts | ready | ready after read | steady RSS | peak: load / one host / \
         all hosts | map memory | one-host reload | +1,000-host reload | all-hosts reload | \
         ns per reply (less harness) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut failures = Vec::new();
    for row in rows {
        let hosts = thousands(row.hosts as f64);
        let source = source_name(row.source);
        match &row.outcome {
            Ok(n) => {
                let after_read = n.read.map_or_else(
                    || "n/a".to_owned(),
                    |read| secs(n.ready.saturating_sub(read).as_secs_f64()),
                );
                let per_reply = match &n.per_reply_ns {
                    Ok(ns) => format!("{} ({})", ns.raw, ns.program),
                    Err(err) => {
                        failures.push(format!("{hosts} hosts, BPF_PROG_TEST_RUN: {err}"));
                        "failed".to_owned()
                    }
                };
                let _ = writeln!(
                    out,
                    "| {source} | {hosts} | {} | {after_read} | {} MiB | {} / {} / {} MiB | {} MiB | {} | {} | {} | {per_reply} |",
                    secs(n.ready.as_secs_f64()),
                    mib(n.rss_kib * 1024),
                    mib(n.load_peak_kib * 1024),
                    mib(n.one_host.peak_kib * 1024),
                    mib(n.whole.peak_kib * 1024),
                    mib(n.memlock),
                    reload(&n.one_host),
                    n.add_hosts
                        .as_ref()
                        .map_or_else(|| "n/a".to_owned(), reload),
                    reload(&n.whole),
                );
            }
            Err(err) => {
                let _ = writeln!(
                    out,
                    "| {source} | {hosts} | failed: {} | | | | | | | | | |",
                    cell(err)
                );
            }
        }
    }
    for failure in failures {
        let _ = writeln!(out, "\n- {failure}");
    }
    out
}

/// `95.0 ms (1 write; read 30.0 ms, patched)`.
fn reload(r: &Reload) -> String {
    let read = r
        .read
        .map_or_else(String::new, |d| format!("read {}, ", secs(d.as_secs_f64())));
    let how = r.how();
    let writes = if r.map_writes == 1 { "write" } else { "writes" };
    format!(
        "{} ({} {writes}; {read}{how})",
        secs(r.seconds),
        thousands(r.map_writes as f64)
    )
}

/// A duration in ms below a second, else in s.
fn secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / f64::from(1u32 << 20))
}

/// `text` fit for one table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_size_is_a_row_naming_the_error() {
        let info = RunInfo {
            date: "today".into(),
            kernel: "6.1".into(),
            cpu_model: "CPU".into(),
            cpus: 2,
            profile: "release",
            runs: 100_000,
        };
        let reload = |seconds, map_writes, read, patched, peak_kib| Reload {
            seconds,
            map_writes,
            read,
            patched,
            peak_kib,
        };
        let rows = [
            Row {
                source: Inventory::File,
                hosts: 1_000,
                outcome: Ok(Numbers {
                    ready: Duration::from_millis(350),
                    read: Some(Duration::from_millis(50)),
                    rss_kib: 20_480,
                    load_peak_kib: 30_720,
                    memlock: 3 << 20,
                    one_host: reload(0.004, 5, Some(Duration::from_millis(1)), Some(true), 21_504),
                    add_hosts: Some(reload(0.05, 5_000, None, Some(false), 25_600)),
                    whole: reload(0.1, 1_000, None, Some(false), 28_672),
                    per_reply_ns: Ok(PerReply {
                        raw: 240,
                        program: 180,
                    }),
                }),
            },
            Row {
                source: Inventory::Kube,
                hosts: 100_000,
                outcome: Err("error: hosts: too many | replies".into()),
            },
        ];
        let text = markdown(&info, &rows);
        assert!(text.contains(
            "| file | 1,000 | 350.0 ms | 300.0 ms | 20.0 MiB | 30.0 / 21.0 / 28.0 MiB | 3.0 MiB | 4.0 ms (5 writes; read 1.0 ms, patched) | 50.0 ms (5,000 writes; whole file) | 100.0 ms (1,000 writes; whole file) | 240 (180) |"
        ), "{text}");
        assert!(
            text.contains("| BootHosts | 100,000 | failed: error: hosts: too many \\| replies |"),
            "{text}"
        );
    }
}

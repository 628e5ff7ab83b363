//! The summary table of one N: per-stack numbers computed from the loaded
//! runs, rendered as HTML and as Markdown. Plots live in `plot`.

use std::fmt::Write as _;

use super::data::{Group, Machine, Run};
use super::html::escape;

/// DHCP answered within this many ms counts as "within 2 s".
const DHCP_TARGET_MS: f64 = 2000.0;
/// The share of machines whose time to boot is compared even when some
/// never boot.
const MOST: f64 = 0.9;

/// One stack's row of the summary table.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub label: String,
    pub machines: usize,
    pub completed: usize,
    /// (stage, count), by stage name.
    pub failed: Vec<(String, usize)>,
    /// DHCP latency (ack_ms - start_ms) p50, p99, max in ms; `None` when no
    /// machine got an ACK.
    pub dhcp_ms: Option<[f64; 3]>,
    /// Share of all machines with a DHCP ACK within 2 s.
    pub within_2s: f64,
    /// The last phone-home (ms) when every machine booted.
    pub all_booted_ms: Option<f64>,
    /// Time-to-all-booted divided by pxe-agent's.
    pub ratio: Option<f64>,
    /// The phone-home (ms) by which [`MOST`] of the machines had booted.
    pub most_booted_ms: Option<f64>,
    /// Time-to-90 %-booted divided by pxe-agent's.
    pub most_ratio: Option<f64>,
    pub retransmissions: u64,
    pub server_cpu_peak: Option<f64>,
    pub server_pss_peak_mib: Option<f64>,
    pub sim_cpu_peak: Option<f64>,
    pub drops: u64,
    /// The simulator's UDP drops (receive, send); `None` for runs that did
    /// not record them.
    pub sim_drops: Option<(u64, u64)>,
}

/// The rows of `group`, in its run order.
pub fn rows(group: &Group) -> Vec<Row> {
    let mut rows: Vec<Row> = group.runs.iter().map(row).collect();
    let agent = group
        .runs
        .iter()
        .zip(&rows)
        .find(|(run, _)| run.stack == "pxe-agent")
        .map(|(_, row)| (row.all_booted_ms, row.most_booted_ms));
    let ratio = |t: Option<f64>, base: Option<f64>| match (t, base) {
        (Some(t), Some(b)) if b > 0.0 => Some(t / b),
        _ => None,
    };
    if let Some((all, most)) = agent {
        for row in &mut rows {
            row.ratio = ratio(row.all_booted_ms, all);
            row.most_ratio = ratio(row.most_booted_ms, most);
        }
    }
    rows
}

fn row(run: &Run) -> Row {
    let machines = &run.machines;
    let completed = machines
        .iter()
        .filter(|m| m.phone_home_ms.is_some())
        .count();
    let mut failed: Vec<(String, usize)> = Vec::new();
    for m in run.failed() {
        match failed.iter_mut().find(|(s, _)| *s == m.failed_stage) {
            Some((_, count)) => *count += 1,
            None => failed.push((m.failed_stage.clone(), 1)),
        }
    }
    failed.sort_by_key(|(stage, _)| (stage_rank(stage), stage.clone()));
    let mut dhcp: Vec<f64> = machines.iter().filter_map(dhcp_latency).collect();
    dhcp.sort_by(f64::total_cmp);
    let within = dhcp.iter().filter(|&&ms| ms <= DHCP_TARGET_MS).count();
    let mut booted: Vec<f64> = machines.iter().filter_map(|m| m.phone_home_ms).collect();
    booted.sort_by(f64::total_cmp);
    let all_booted_ms = (completed == machines.len() && completed > 0)
        .then(|| booted.last().copied())
        .flatten();
    let most = (MOST * machines.len() as f64).ceil() as usize;
    let most_booted_ms = (most > 0 && booted.len() >= most).then(|| booted[most - 1]);
    Row {
        label: run.label().to_owned(),
        machines: machines.len(),
        completed,
        failed,
        dhcp_ms: (!dhcp.is_empty()).then(|| {
            [
                percentile(&dhcp, 0.50),
                percentile(&dhcp, 0.99),
                dhcp[dhcp.len() - 1],
            ]
        }),
        within_2s: if machines.is_empty() {
            0.0
        } else {
            within as f64 / machines.len() as f64
        },
        all_booted_ms,
        ratio: None,
        most_booted_ms,
        most_ratio: None,
        retransmissions: run.summary.retransmissions,
        server_cpu_peak: peak(run.server_cpu_percent().into_iter().map(|p| p.1)),
        server_pss_peak_mib: peak(run.server.iter().map(|s| s.pss_kib / 1024.0)),
        sim_cpu_peak: peak(run.sim_cpu_percent().into_iter().map(|p| p.1)),
        drops: run.meta.server_drops.total(),
        sim_drops: run
            .meta
            .sim_udp_rcvbuf_errors
            .zip(run.meta.sim_udp_sndbuf_errors),
    }
}

/// The failed stages in boot order (machines.csv's failed_stage values).
const FAILED_STAGES: [&str; 8] = [
    "dhcp",
    "bootfile",
    "ipxe_dhcp",
    "script",
    "kernel",
    "initrd",
    "phone_home",
    "limit",
];

fn stage_rank(stage: &str) -> usize {
    FAILED_STAGES
        .iter()
        .position(|s| *s == stage)
        .unwrap_or(FAILED_STAGES.len())
}

/// ack_ms - start_ms, when both are there.
pub fn dhcp_latency(m: &Machine) -> Option<f64> {
    Some(m.ack_ms? - m.start_ms?)
}

/// Nearest-rank percentile of sorted, non-empty `values`.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn peak(values: impl Iterator<Item = f64>) -> Option<f64> {
    values.fold(None, |acc, v| Some(acc.map_or(v, |a: f64| a.max(v))))
}

const HEADER: [&str; 18] = [
    "stack",
    "machines",
    "completed",
    "failed (by stage)",
    "DHCP p50",
    "DHCP p99",
    "DHCP max",
    "DHCP ≤ 2 s",
    "all booted",
    "vs pxe-agent",
    "90 % booted",
    "vs pxe-agent (90 %)",
    "retransmissions",
    "server CPU peak (1 s)",
    "server memory peak (PSS)",
    "simulator CPU peak (1 s)",
    "server drops",
    "simulator drops (receive / send)",
];

impl Row {
    /// The row's cells as text, in [`HEADER`] order.
    fn cells(&self) -> [String; 18] {
        let failed = if self.failed.is_empty() {
            "0".to_owned()
        } else {
            self.failed
                .iter()
                .map(|(stage, n)| format!("{stage} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let dhcp = |i: usize| self.dhcp_ms.map_or("–".to_owned(), |d| seconds(d[i]));
        let all_booted = self.all_booted_ms.map_or_else(
            || format!("not all ({} of {})", self.completed, self.machines),
            seconds,
        );
        let opt =
            |v: Option<f64>, unit: &str| v.map_or("–".to_owned(), |v| format!("{v:.0}{unit}"));
        [
            self.label.clone(),
            self.machines.to_string(),
            self.completed.to_string(),
            failed,
            dhcp(0),
            dhcp(1),
            dhcp(2),
            format!("{:.1} %", self.within_2s * 100.0),
            all_booted,
            self.ratio.map_or("–".to_owned(), |r| format!("{r:.2}×")),
            self.most_booted_ms.map_or("–".to_owned(), seconds),
            self.most_ratio
                .map_or("–".to_owned(), |r| format!("{r:.2}×")),
            self.retransmissions.to_string(),
            opt(self.server_cpu_peak, " %"),
            opt(self.server_pss_peak_mib, " MiB"),
            opt(self.sim_cpu_peak, " %"),
            self.drops.to_string(),
            self.sim_drops
                .map_or("–".to_owned(), |(r, s)| format!("{r} / {s}")),
        ]
    }
}

/// ms as seconds with up to 3 decimals, shorter for long times.
fn seconds(ms: f64) -> String {
    let s = ms / 1000.0;
    if s < 10.0 {
        format!("{s:.3} s")
    } else {
        format!("{s:.1} s")
    }
}

/// The table as HTML.
pub fn html(rows: &[Row]) -> String {
    html_of(&HEADER, rows.iter().map(|r| r.cells().to_vec()))
}

/// The table as Markdown.
pub fn markdown(rows: &[Row]) -> String {
    markdown_of(&HEADER, rows.iter().map(|r| r.cells().to_vec()))
}

/// A table of `header` and the rows' cells as HTML, escaped.
pub fn html_of(header: &[impl AsRef<str>], rows: impl Iterator<Item = Vec<String>>) -> String {
    let mut out = String::from("<table>\n<thead><tr>");
    for h in header {
        let _ = write!(out, "<th>{}</th>", escape(h.as_ref()));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{}</td>", escape(&cell));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n");
    out
}

/// A table of `header` and the rows' cells as Markdown, `|` escaped.
pub fn markdown_of(header: &[impl AsRef<str>], rows: impl Iterator<Item = Vec<String>>) -> String {
    let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
    let header: Vec<String> = header.iter().map(|h| h.as_ref().to_owned()).collect();
    let mut out = line(&header);
    out.push_str(&line(&vec!["---".to_owned(); header.len()]));
    for row in rows {
        let cells: Vec<String> = row.iter().map(|c| c.replace('|', "\\|")).collect();
        out.push_str(&line(&cells));
    }
    out
}

//! Reads a storm result tree (`<root>/<N>/<stack>/` with machines.csv,
//! timeline.csv, server.csv, summary.json and meta.json) into memory; errors
//! name the file and line. What the numbers mean is left to the plots and the
//! table.

use std::fs;
use std::path::Path;

use anyhow::{Context, bail};
use serde::Deserialize;

/// The stacks in the order (and colours) the report shows them; others follow
/// by name.
pub const STACK_ORDER: [&str; 3] = ["pxe-agent", "kea", "dnsmasq"];

/// All stacks run with the same machine count N.
#[derive(Debug)]
pub struct Group {
    /// The N directory's name (the machine count).
    pub n: String,
    /// One run per stack, in [`STACK_ORDER`].
    pub runs: Vec<Run>,
}

/// One stack's run: `<root>/<N>/<stack>/`.
#[derive(Debug)]
pub struct Run {
    /// Stack directory name (`pxe-agent`, `kea`, `dnsmasq`).
    pub stack: String,
    /// The rows of machines.csv.
    pub machines: Vec<Machine>,
    /// The rows of timeline.csv (100 ms buckets).
    pub timeline: Vec<Tick>,
    /// The rows of server.csv.
    pub server: Vec<ServerSample>,
    /// summary.json.
    pub summary: Summary,
    /// meta.json.
    pub meta: Meta,
}

/// One machine's stage times, ms since the simulator's t0; `None` when the
/// machine did not reach the stage.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Machine {
    pub start_ms: Option<f64>,
    pub ack_ms: Option<f64>,
    pub bootfile_ms: Option<f64>,
    pub ipxe_ack_ms: Option<f64>,
    pub script_ms: Option<f64>,
    pub kernel_ms: Option<f64>,
    pub initrd_ms: Option<f64>,
    pub phone_home_ms: Option<f64>,
    /// The stage the machine failed in, empty when it did not fail.
    pub failed_stage: String,
}

/// One 100 ms bucket of timeline.csv.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tick {
    /// Bucket start, ms since t0 (buckets are [`TIMELINE_BUCKET_MS`] wide).
    pub t_ms: f64,
    /// Datagrams and HTTP requests the simulator sent in the bucket.
    pub sent_pkts: f64,
    /// Datagrams and HTTP responses it received in the bucket.
    pub recv_pkts: f64,
    /// OFFERs and ACKs received in the bucket.
    pub dhcp_answers: f64,
    /// DHCP and TFTP resends in the bucket.
    pub retransmissions: f64,
    /// The simulator's own CPU time (ms), cumulative at the bucket's end.
    pub sim_cpu_ms: f64,
}

/// One sample of server.csv.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServerSample {
    /// ms since t0.
    pub t_ms: f64,
    /// Cumulative CPU time (ms) of the stack's processes.
    pub cpu_ms: f64,
    /// Summed proportional set size (KiB) of the stack's processes.
    pub pss_kib: f64,
}

/// summary.json (fields the report uses).
#[derive(Debug, Clone, Deserialize)]
pub struct Summary {
    /// Checked against machines.csv's rows.
    pub machines: usize,
    pub retransmissions: u64,
}

/// meta.json (fields the report uses).
#[derive(Debug, Clone, Deserialize)]
pub struct Meta {
    /// Human label, e.g. "Kea + tftpd-hpa + nginx".
    pub label: String,
    pub spread_s: Option<f64>,
    #[serde(default)]
    pub mix: serde_json::Value,
    /// Percent of the TFTP machines that ask for a windowsize.
    pub windowsize_share: Option<f64>,
    pub bootfile_kib: Option<f64>,
    pub kernel_kib: Option<f64>,
    pub initrd_kib: Option<f64>,
    /// CPU model name.
    #[serde(default)]
    pub cpu: String,
    /// uname -r.
    #[serde(default)]
    pub kernel: String,
    #[serde(default)]
    pub date: String,
    /// The open-files limit the stacks ran with.
    #[serde(default)]
    pub nofile: Option<u64>,
    pub server_drops: Drops,
    /// The simulator's namespace: datagrams dropped in its receive buffers
    /// and on its way out.
    #[serde(default)]
    pub sim_udp_rcvbuf_errors: Option<u64>,
    #[serde(default)]
    pub sim_udp_sndbuf_errors: Option<u64>,
    pub sim_error: Option<String>,
}

/// Server-side drop counters; `None` where the stack has no such counter.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct Drops {
    pub iface_rx_dropped: Option<u64>,
    pub udp_rcvbuf_errors: Option<u64>,
    /// Replies the server's kernel dropped on the way out (not recorded
    /// by runs before it was).
    #[serde(default)]
    pub udp_sndbuf_errors: Option<u64>,
    pub udp_in_errors: Option<u64>,
    /// Replies the XDP program sent that the veth dropped (not recorded by
    /// runs before it was).
    #[serde(default)]
    pub xdp_tx_errors: Option<u64>,
    pub agent_storm_guard: Option<u64>,
}

impl Drops {
    /// All counted drops together. UDP's InErrors already counts its
    /// RcvbufErrors, so the latter counts only where the former is missing.
    pub fn total(&self) -> u64 {
        [
            self.iface_rx_dropped,
            self.udp_in_errors.or(self.udp_rcvbuf_errors),
            self.udp_sndbuf_errors,
            self.xdp_tx_errors,
            self.agent_storm_guard,
        ]
        .iter()
        .flatten()
        .sum()
    }
}

impl Run {
    /// The stack's label from meta.json.
    pub fn label(&self) -> &str {
        &self.meta.label
    }

    /// The machines that failed in some stage.
    pub fn failed(&self) -> impl Iterator<Item = &Machine> {
        self.machines.iter().filter(|m| !m.failed_stage.is_empty())
    }

    /// Server CPU over time: (seconds, % of one core, per second).
    pub fn server_cpu_percent(&self) -> Vec<(f64, f64)> {
        percent_of_core(self.server.iter().map(|s| (s.t_ms, s.cpu_ms)))
    }

    /// The simulator's CPU over time: (seconds, % of one core, per second).
    pub fn sim_cpu_percent(&self) -> Vec<(f64, f64)> {
        // sim_cpu_ms is taken at the bucket's end.
        percent_of_core(
            self.timeline
                .iter()
                .map(|t| (t.t_ms + TIMELINE_BUCKET_MS, t.sim_cpu_ms)),
        )
    }
}

/// The width of a timeline.csv bucket.
const TIMELINE_BUCKET_MS: f64 = 100.0;

/// Over one-second windows, how much of a core the CPU time went to.
const CPU_WINDOW_MS: f64 = 1000.0;

/// Turns cumulative CPU ms samples into % of one core per [`CPU_WINDOW_MS`]
/// window (the last sample of each window against the previous window's),
/// placed at the later sample's time (s). Per 100 ms sample the kernel's tick
/// granularity alone would make the curve jump by 10 %.
fn percent_of_core(samples: impl Iterator<Item = (f64, f64)>) -> Vec<(f64, f64)> {
    let mut last_of_window: Vec<(f64, f64)> = Vec::new();
    for (t, cpu) in samples {
        let window = (t / CPU_WINDOW_MS).ceil();
        // The first sample stays: it is where the first window starts.
        let same = last_of_window.len() > 1
            && last_of_window
                .last()
                .is_some_and(|last| (last.0 / CPU_WINDOW_MS).ceil() == window);
        if same {
            last_of_window.pop();
        }
        last_of_window.push((t, cpu));
    }
    last_of_window
        .windows(2)
        .filter(|w| w[1].0 > w[0].0)
        .map(|w| {
            let pct = (w[1].1 - w[0].1) / (w[1].0 - w[0].0) * 100.0;
            (w[1].0 / 1000.0, pct.max(0.0))
        })
        .collect()
}

/// Every N group under `root` (directories named by a number), ascending.
pub fn load_all(root: &Path) -> anyhow::Result<Vec<Group>> {
    let entries =
        fs::read_dir(root).with_context(|| format!("failed to read {}", root.display()))?;
    let mut ns = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("failed to read {}", root.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Ok(count) = name.parse::<u64>()
            && entry.path().is_dir()
        {
            ns.push((count, name));
        }
    }
    if ns.is_empty() {
        bail!(
            "no result directories (<N>/<stack>/) under {}",
            root.display()
        );
    }
    ns.sort();
    ns.into_iter().map(|(_, n)| load_group(root, &n)).collect()
}

/// The runs of `<root>/<n>/`.
pub fn load_group(root: &Path, n: &str) -> anyhow::Result<Group> {
    let dir = root.join(n);
    let entries =
        fs::read_dir(&dir).with_context(|| format!("failed to read {}", dir.display()))?;
    let mut stacks = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("failed to read {}", dir.display()))?;
        if entry.path().is_dir() {
            stacks.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    if stacks.is_empty() {
        bail!("no stack directories under {}", dir.display());
    }
    stacks.sort_by_key(|s| (stack_rank(s), s.clone()));
    let runs = stacks
        .into_iter()
        .map(|stack| load_run(&dir.join(&stack), stack))
        .collect::<anyhow::Result<_>>()?;
    Ok(Group {
        n: n.to_owned(),
        runs,
    })
}

/// Position of `stack` in [`STACK_ORDER`] (unknown stacks last).
pub fn stack_rank(stack: &str) -> usize {
    STACK_ORDER
        .iter()
        .position(|s| *s == stack)
        .unwrap_or(STACK_ORDER.len())
}

fn load_run(dir: &Path, stack: String) -> anyhow::Result<Run> {
    let machines = read_csv(&dir.join("machines.csv"), |row| {
        Ok(Machine {
            start_ms: row.opt("start_ms")?,
            ack_ms: row.opt("ack_ms")?,
            bootfile_ms: row.opt("bootfile_ms")?,
            ipxe_ack_ms: row.opt("ipxe_ack_ms")?,
            script_ms: row.opt("script_ms")?,
            kernel_ms: row.opt("kernel_ms")?,
            initrd_ms: row.opt("initrd_ms")?,
            phone_home_ms: row.opt("phone_home_ms")?,
            failed_stage: row.text("failed_stage")?.to_owned(),
        })
    })?;
    let timeline = read_csv(&dir.join("timeline.csv"), |row| {
        Ok(Tick {
            t_ms: row.num("t_ms")?,
            sent_pkts: row.num("sent_pkts")?,
            recv_pkts: row.num("recv_pkts")?,
            dhcp_answers: row.num("dhcp_answers")?,
            retransmissions: row.num("retransmissions")?,
            sim_cpu_ms: row.num("sim_cpu_ms")?,
        })
    })?;
    let server = read_csv(&dir.join("server.csv"), |row| {
        Ok(ServerSample {
            t_ms: row.num("t_ms")?,
            cpu_ms: row.num("cpu_ms")?,
            pss_kib: row.num("pss_kib")?,
        })
    })?;
    let summary_path = dir.join("summary.json");
    let summary: Summary = read_json(&summary_path)?;
    if summary.machines != machines.len() {
        bail!(
            "{} counts {} machines, machines.csv has {} rows",
            summary_path.display(),
            summary.machines,
            machines.len()
        );
    }
    Ok(Run {
        stack,
        machines,
        timeline,
        server,
        summary,
        meta: read_json(&dir.join("meta.json"))?,
    })
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text =
        fs::read_to_string(path).with_context(|| format!("failed to read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("invalid {}", path.display()))
}

/// One data row of a CSV file, with its columns looked up by header name.
struct Row<'a> {
    header: &'a [&'a str],
    fields: Vec<&'a str>,
}

impl Row<'_> {
    fn text(&self, column: &str) -> anyhow::Result<&str> {
        let i = self
            .header
            .iter()
            .position(|h| *h == column)
            .with_context(|| format!("no column {column} in the header"))?;
        Ok(self.fields[i])
    }

    fn opt(&self, column: &str) -> anyhow::Result<Option<f64>> {
        let text = self.text(column)?;
        if text.is_empty() {
            return Ok(None);
        }
        let value = text
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite())
            .with_context(|| format!("column {column}: not a number: {text:?}"))?;
        Ok(Some(value))
    }

    fn num(&self, column: &str) -> anyhow::Result<f64> {
        self.opt(column)?
            .with_context(|| format!("column {column}: empty"))
    }
}

/// Reads a CSV file with a header line and plain comma-separated fields (the
/// storm files never quote), one `parse` per data row.
fn read_csv<T>(path: &Path, parse: impl Fn(&Row) -> anyhow::Result<T>) -> anyhow::Result<Vec<T>> {
    let text =
        fs::read_to_string(path).with_context(|| format!("failed to read {}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .with_context(|| format!("{}: empty file, no header", path.display()))?
        .split(',')
        .map(str::trim)
        .collect();
    let mut rows = Vec::new();
    for (i, line) in lines.enumerate() {
        let line_no = i + 2;
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != header.len() {
            bail!(
                "{}:{line_no}: {} fields, the header has {}",
                path.display(),
                fields.len(),
                header.len()
            );
        }
        let row = Row {
            header: &header,
            fields,
        };
        rows.push(parse(&row).with_context(|| format!("{}:{line_no}", path.display()))?);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_a_share_of_one_core_per_second() {
        // 100 ms samples: 50 % of a core in the first second, 200 % (two
        // cores) in the second.
        let samples = (0..=20).map(|i| {
            let t = f64::from(i) * 100.0;
            let cpu = if i <= 10 {
                t / 2.0
            } else {
                500.0 + (t - 1000.0) * 2.0
            };
            (t, cpu)
        });
        let pct = percent_of_core(samples);
        assert_eq!(pct, [(1.0, 50.0), (2.0, 200.0)]);
    }
}

//! What the storm records: one row per machine (stage times, resends, where
//! it stopped), counters per 100 ms bucket, and the files they are written to
//! (`machines.csv`, `timeline.csv`, `summary.json`).

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::Path,
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::Context as _;

/// The stages of a machine's chain, in order; `failed_stage` names one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Dhcp,
    Bootfile,
    IpxeDhcp,
    Script,
    Kernel,
    Initrd,
    PhoneHome,
    Limit,
}

impl Stage {
    /// The name in `failed_stage` and `failed_by_stage`.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Dhcp => "dhcp",
            Stage::Bootfile => "bootfile",
            Stage::IpxeDhcp => "ipxe_dhcp",
            Stage::Script => "script",
            Stage::Kernel => "kernel",
            Stage::Initrd => "initrd",
            Stage::PhoneHome => "phone_home",
            Stage::Limit => "limit",
        }
    }
}

/// One machine's run. Times are offsets from the storm's t0.
#[derive(Clone, Debug, Default)]
pub struct Record {
    pub mac: String,
    pub class: String,
    pub windowsize: u16,
    pub start: Option<Duration>,
    pub offer: Option<Duration>,
    pub ack: Option<Duration>,
    pub bootfile: Option<Duration>,
    pub ipxe_ack: Option<Duration>,
    pub script: Option<Duration>,
    pub kernel: Option<Duration>,
    pub initrd: Option<Duration>,
    pub phone_home: Option<Duration>,
    pub discover_tx: u32,
    pub request_tx: u32,
    pub ipxe_discover_tx: u32,
    pub ipxe_request_tx: u32,
    pub tftp_retx: u32,
    pub failed: Option<(Stage, String)>,
}

/// The `machines.csv` header.
pub const MACHINES_HEADER: &str = "mac,class,windowsize,start_ms,offer_ms,ack_ms,bootfile_ms,ipxe_ack_ms,script_ms,kernel_ms,initrd_ms,phone_home_ms,discover_tx,request_tx,ipxe_discover_tx,ipxe_request_tx,tftp_retx,failed_stage,error";

impl Record {
    /// The `machines.csv` row.
    pub fn row(&self) -> String {
        let ms = |t: Option<Duration>| t.map_or(String::new(), |t| format!("{:.3}", millis(t)));
        let (stage, error) = match &self.failed {
            Some((stage, error)) => (stage.name(), error.replace([',', '\n', '\r'], ";")),
            None => ("", String::new()),
        };
        format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{stage},{error}",
            self.mac,
            self.class,
            self.windowsize,
            ms(self.start),
            ms(self.offer),
            ms(self.ack),
            ms(self.bootfile),
            ms(self.ipxe_ack),
            ms(self.script),
            ms(self.kernel),
            ms(self.initrd),
            ms(self.phone_home),
            self.discover_tx,
            self.request_tx,
            self.ipxe_discover_tx,
            self.ipxe_request_tx,
            self.tftp_retx,
        )
    }
}

fn millis(t: Duration) -> f64 {
    t.as_secs_f64() * 1000.0
}

/// What one bucket counts.
#[derive(Clone, Copy, Debug)]
pub enum Event {
    /// A datagram or HTTP request sent.
    Sent,
    /// A datagram or HTTP response received.
    Recv,
    /// An OFFER or ACK received (counted as received too).
    DhcpAnswer,
    /// A DHCP or TFTP resend (counted as sent too).
    Retransmission,
    /// A phone-home finished.
    Completed,
}

#[derive(Clone, Copy, Debug, Default)]
struct Bucket {
    sent: u64,
    recv: u64,
    dhcp_answers: u64,
    retransmissions: u64,
    completed: u64,
    cpu_ms: Option<f64>,
}

/// The 100 ms buckets of the storm's timeline.
pub struct Timeline {
    t0: Instant,
    buckets: Mutex<Vec<Bucket>>,
}

/// The width of a timeline bucket.
pub const BUCKET: Duration = Duration::from_millis(100);

impl Timeline {
    /// An empty timeline starting at `t0`.
    pub fn new(t0: Instant) -> Timeline {
        Timeline {
            t0,
            buckets: Mutex::new(Vec::new()),
        }
    }

    /// The storm's t0.
    pub fn t0(&self) -> Instant {
        self.t0
    }

    /// Time since t0.
    pub fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    fn with_bucket(&self, at: Duration, f: impl FnOnce(&mut Bucket)) {
        let index = (at.as_millis() / BUCKET.as_millis()) as usize;
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() <= index {
            buckets.resize(index + 1, Bucket::default());
        }
        f(&mut buckets[index]);
    }

    /// Counts `event` now.
    pub fn count(&self, event: Event) {
        self.with_bucket(self.now(), |b| match event {
            Event::Sent => b.sent += 1,
            Event::Recv => b.recv += 1,
            Event::DhcpAnswer => {
                b.recv += 1;
                b.dhcp_answers += 1;
            }
            Event::Retransmission => {
                b.sent += 1;
                b.retransmissions += 1;
            }
            Event::Completed => b.completed += 1,
        });
    }

    /// Notes the simulator's cumulative CPU at `at` (the bucket's end wins).
    pub fn cpu(&self, at: Duration, cpu_ms: f64) {
        self.with_bucket(at, |b| b.cpu_ms = Some(cpu_ms));
    }

    /// Writes `timeline.csv`; returns the totals (sent, received, resends).
    fn write(&self, path: &Path) -> anyhow::Result<(u64, u64, u64)> {
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::from(
            "t_ms,sent_pkts,recv_pkts,dhcp_answers,retransmissions,completed,sim_cpu_ms\n",
        );
        let mut cpu = 0.0_f64;
        let mut totals = (0, 0, 0);
        for (i, b) in buckets.iter().enumerate() {
            cpu = b.cpu_ms.unwrap_or(cpu).max(cpu);
            totals.0 += b.sent;
            totals.1 += b.recv;
            totals.2 += b.retransmissions;
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{cpu:.1}",
                i as u128 * BUCKET.as_millis(),
                b.sent,
                b.recv,
                b.dhcp_answers,
                b.retransmissions,
                b.completed
            );
        }
        std::fs::write(path, out).with_context(|| format!("failed to write {}", path.display()))?;
        Ok(totals)
    }
}

/// The process's own CPU time (user + system) so far, in ms.
pub fn own_cpu_ms() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// What the storm did, as `summary.json` holds it.
pub struct Summary {
    pub machines: usize,
    pub completed: usize,
    pub failed_by_stage: BTreeMap<&'static str, usize>,
    pub wall_ms: f64,
    pub sim_cpu_ms: f64,
    pub sent_pkts: u64,
    pub recv_pkts: u64,
    pub retransmissions: u64,
}

impl Summary {
    /// The one line the CLI prints.
    pub fn line(&self) -> String {
        let failed: Vec<String> = self
            .failed_by_stage
            .iter()
            .map(|(stage, n)| format!("{stage}:{n}"))
            .collect();
        format!(
            "machines={} completed={} failed={} wall_ms={:.0} sim_cpu_ms={:.0} sent_pkts={} recv_pkts={} retransmissions={}",
            self.machines,
            self.completed,
            if failed.is_empty() {
                "-".to_owned()
            } else {
                failed.join(",")
            },
            self.wall_ms,
            self.sim_cpu_ms,
            self.sent_pkts,
            self.recv_pkts,
            self.retransmissions
        )
    }
}

/// Writes `machines.csv`, `timeline.csv` and `summary.json` into `dir`.
pub fn write(dir: &Path, records: &[Record], timeline: &Timeline) -> anyhow::Result<Summary> {
    std::fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let mut csv = String::with_capacity(records.len() * 128);
    csv.push_str(MACHINES_HEADER);
    csv.push('\n');
    let mut failed_by_stage = BTreeMap::new();
    for record in records {
        csv.push_str(&record.row());
        csv.push('\n');
        if let Some((stage, _)) = &record.failed {
            *failed_by_stage.entry(stage.name()).or_insert(0) += 1;
        }
    }
    let path = dir.join("machines.csv");
    std::fs::write(&path, csv).with_context(|| format!("failed to write {}", path.display()))?;
    let wall_ms = millis(timeline.now());
    let sim_cpu_ms = own_cpu_ms();
    timeline.cpu(timeline.now(), sim_cpu_ms);
    let (sent_pkts, recv_pkts, retransmissions) = timeline.write(&dir.join("timeline.csv"))?;
    let summary = Summary {
        machines: records.len(),
        completed: records.iter().filter(|r| r.phone_home.is_some()).count(),
        failed_by_stage,
        wall_ms,
        sim_cpu_ms,
        sent_pkts,
        recv_pkts,
        retransmissions,
    };
    let json = serde_json::json!({
        "machines": summary.machines,
        "completed": summary.completed,
        "failed_by_stage": summary.failed_by_stage,
        "wall_ms": summary.wall_ms,
        "sim_cpu_ms": summary.sim_cpu_ms,
        "sent_pkts": summary.sent_pkts,
        "recv_pkts": summary.recv_pkts,
        "retransmissions": summary.retransmissions,
    });
    let path = dir.join("summary.json");
    std::fs::write(&path, format!("{json:#}\n"))
        .with_context(|| format!("failed to write {}", path.display()))?;
    Ok(summary)
}

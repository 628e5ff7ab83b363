//! The boot storm simulator: N machines, each running the real netboot chain
//! with firmware and iPXE timers from its own address behind a DHCP relay:
//! the machines on one runtime, their DHCP on the engine's own thread with
//! one shared relay socket.

pub mod dhcp;
pub mod http;
pub mod machine;
pub mod record;
pub mod script;
pub mod tftp;

use std::{
    net::Ipv4Addr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::sync::Semaphore;

use record::{Record, Stage, Summary, Timeline};

use crate::rng::Rng;

/// What a storm runs with (the CLI's flags).
#[derive(Clone, Debug)]
pub struct Options {
    pub machines: PathBuf,
    pub server: Ipv4Addr,
    pub relay: Ipv4Addr,
    pub out: PathBuf,
    pub spread: Duration,
    pub seed: u64,
    pub limit: Duration,
    pub ipxe_user_class: String,
    pub phone_home_port: Option<u16>,
    /// Send option 97 (client UUID) as firmware does.
    pub uuid: bool,
}

/// What every machine shares.
pub struct Context {
    pub server: Ipv4Addr,
    pub relay: Ipv4Addr,
    pub seed: u64,
    pub user_class: &'static [u8],
    pub phone_home_port: Option<u16>,
    pub uuid: bool,
    pub timeline: Arc<Timeline>,
    pub dhcp: Arc<dhcp::Engine>,
    /// One permit a machine past DHCP: bounds open sockets.
    pub sockets: Semaphore,
}

/// Descriptors kept back for the runtime, the relay socket and files.
const SPARE_FDS: u64 = 256;

/// Raises RLIMIT_NOFILE to its hard limit; returns the soft limit now.
fn raise_nofile() -> u64 {
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur as u64
    }
}

/// Runs the storm and writes its files into `opts.out`.
pub fn run(opts: &Options) -> anyhow::Result<Summary> {
    let text = std::fs::read_to_string(&opts.machines)
        .with_context(|| format!("failed to read {}", opts.machines.display()))?;
    let machines = machine::parse_machines(&text)
        .with_context(|| format!("in {}", opts.machines.display()))?;
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("failed to create {}", opts.out.display()))?;
    let nofile = raise_nofile();
    let permits = nofile.saturating_sub(SPARE_FDS).clamp(16, 1 << 20) as usize;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("failed to start the runtime")?;
    let records = runtime.block_on(async {
        let timeline = Arc::new(Timeline::new(Instant::now()));
        let engine = dhcp::Engine::start(opts.relay, opts.server, Arc::clone(&timeline))?;
        let sampler = tokio::spawn(sample_cpu(Arc::clone(&timeline)));
        let ctx = Arc::new(Context {
            server: opts.server,
            relay: opts.relay,
            seed: opts.seed,
            user_class: Box::leak(opts.ipxe_user_class.clone().into_bytes().into_boxed_slice()),
            phone_home_port: opts.phone_home_port,
            uuid: opts.uuid,
            timeline: Arc::clone(&timeline),
            dhcp: Arc::clone(&engine),
            sockets: Semaphore::new(permits),
        });
        let t0 = tokio::time::Instant::from_std(timeline.t0());
        let deadline = t0 + opts.limit;
        let mut rng = Rng(opts.seed.max(1));
        let tasks: Vec<_> = machines
            .into_iter()
            .enumerate()
            .map(|(index, m)| {
                let unit = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                let start = t0 + opts.spread.mul_f64(unit);
                let ctx = Arc::clone(&ctx);
                tokio::spawn(async move {
                    let mut record = Record {
                        mac: machine::mac_text(&m.mac),
                        class: m.class.name().to_owned(),
                        windowsize: m.windowsize,
                        ..Record::default()
                    };
                    tokio::time::sleep_until(start).await;
                    let chain = machine::run(ctx, index, m, &mut record);
                    if tokio::time::timeout_at(deadline, chain).await.is_err() {
                        record.failed = Some((Stage::Limit, "not booted within the limit".into()));
                    }
                    record
                })
            })
            .collect();
        let mut records = Vec::with_capacity(tasks.len());
        for task in tasks {
            records.push(task.await.context("a machine's task panicked")?);
        }
        engine.stop();
        sampler.abort();
        anyhow::Ok((records, timeline))
    })?;
    let (records, timeline) = records;
    record::write(&opts.out, &records, &timeline)
}

/// Notes the simulator's CPU at the end of every timeline bucket.
async fn sample_cpu(timeline: Arc<Timeline>) {
    let mut tick = tokio::time::interval(record::BUCKET);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let at = timeline.now();
        timeline.cpu(
            at.saturating_sub(Duration::from_millis(1)),
            record::own_cpu_ms(),
        );
    }
}

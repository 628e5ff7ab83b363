//! Out-of-band calls from the command line (`bmc`, `recover`): which hosts
//! are selected, the calls made through the running agent or, with
//! `--direct`, straight to the BMCs of an inventory file, and their outcomes
//! printed one row per host.

use std::{path::PathBuf, process::ExitCode, sync::Arc};

use anyhow::Context as _;
use pxe_agent::{
    audit::{AuditLog, Entry},
    bmc::{BootFlagEcho, Driver, Fallbacks, RetryPolicy},
    client, clock,
    control::{self, Op, Outcome},
    inventory,
    terminal::{self, Align, Table},
    view::HostView,
};

use super::{
    agent::{AgentCall, Output},
    runtime::runtime,
};

/// Which hosts, how to reach them, and how to print.
#[derive(clap::Args)]
pub struct Select {
    /// Every host with a BMC whose label KEY is VALUE (repeat: all must match).
    #[arg(long, value_name = "KEY=VALUE")]
    label: Vec<String>,
    /// Every host with a BMC.
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    agent: AgentCall,
    /// Act without an agent: drivers from --inventory, audited as `direct`.
    #[arg(long, requires = "inventory")]
    direct: bool,
    /// Inventory file for --direct.
    #[arg(long)]
    inventory: Option<PathBuf>,
    /// Audit log for --direct.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/var/lib/pxe-agent/audit.jsonl"
    )]
    audit_log: PathBuf,
    /// BMC calls at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// For --direct: what the BMCs keep of the boot flags (see `run`).
    #[arg(long, value_enum, default_value_t = EchoArg::Full)]
    bmc_boot_flag_echo: EchoArg,
}

/// `--bmc-boot-flag-echo`: what the BMCs keep of the boot flags.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum EchoArg {
    Full,
    DeviceOnly,
}

impl From<EchoArg> for BootFlagEcho {
    fn from(e: EchoArg) -> BootFlagEcho {
        match e {
            EchoArg::Full => BootFlagEcho::Full,
            EchoArg::DeviceOnly => BootFlagEcho::DeviceOnly,
        }
    }
}

/// `pxe-agent recover`: hands the selected hosts to the agent's recovery
/// controller.
pub fn recover(hosts: Vec<String>, select: &Select) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        !select.direct,
        "recover needs the running agent's controller; --direct cannot recover"
    );
    oob(Op::Recover, hosts, select)
}

/// `--label KEY=VALUE` pairs.
fn labels(select: &Select) -> anyhow::Result<Vec<(String, String)>> {
    select
        .label
        .iter()
        .map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("--label {l:?} is not KEY=VALUE"))
        })
        .collect()
}

/// The hosts named, plus those --all or --label select among hosts with
/// a BMC (`(name, has_bmc, labels)`), each once, in order.
fn targets(
    named: Vec<String>,
    select: &Select,
    known: impl Iterator<Item = (String, bool, std::collections::BTreeMap<String, String>)>,
) -> anyhow::Result<Vec<String>> {
    let wanted = labels(select)?;
    let mut out = named;
    if select.all || !wanted.is_empty() {
        for (name, bmc, host_labels) in known {
            let matches = wanted
                .iter()
                .all(|(k, v)| host_labels.get(k).is_some_and(|h| h == v));
            if bmc && matches && !out.contains(&name) {
                out.push(name);
            }
        }
    }
    anyhow::ensure!(
        !out.is_empty(),
        "no host selected: name hosts, or use --all or --label KEY=VALUE"
    );
    Ok(out)
}

/// Runs `op` on every selected host, through the agent or directly, and
/// prints one row (or JSON object) per host. Fails when any host failed.
pub fn oob(op: Op, hosts: Vec<String>, select: &Select) -> anyhow::Result<ExitCode> {
    let concurrency = select.concurrency.max(1);
    let outcomes: Vec<Outcome> = if select.direct {
        let path = select
            .inventory
            .as_ref()
            .context("--direct needs --inventory FILE")?;
        let inv = inventory::Inventory::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
        let hosts = targets(
            hosts,
            select,
            inv.hosts.iter().map(|h| {
                (
                    h.hostname
                        .map_or_else(|| h.mac.to_string(), |n| n.to_string()),
                    h.bmc.is_some(),
                    h.labels.clone(),
                )
            }),
        )?;
        let audit = Arc::new(AuditLog::open(&select.audit_log)?);
        let echo = select.bmc_boot_flag_echo.into();
        runtime()?.block_on(direct(op, hosts, &inv, &audit, concurrency, echo))?
    } else {
        let api = select.agent.api.client()?;
        let hosts = if select.all || !select.label.is_empty() {
            let list: Vec<HostView> = serde_json::from_str(&api.get("/api/v1/hosts")?)
                .context("malformed /api/v1/hosts answer")?;
            targets(
                hosts,
                select,
                list.into_iter().map(|h| {
                    let name = h.hostname.clone().unwrap_or_else(|| h.mac.to_string());
                    (name, h.bmc, h.labels)
                }),
            )?
        } else {
            targets(hosts, select, std::iter::empty())?
        };
        through_agent(op, hosts, &api, concurrency)
    };
    let failed = outcomes.iter().filter(|o| !o.is_ok()).count();
    match select.agent.format {
        Output::Json => println!("{}", serde_json::to_string_pretty(&outcomes)?),
        Output::Table => {
            let mut table = Table::new(&[
                ("HOST", 32, Align::Left),
                ("RESULT", 8, Align::Left),
                ("POWER", 7, Align::Left),
                ("TIME", 10, Align::Right),
                ("DETAIL", 48, Align::Left),
                ("error", 120, Align::Left),
            ]);
            for o in &outcomes {
                let detail = o
                    .recovery
                    .map(|state| state.to_string())
                    .or_else(|| {
                        o.info.as_ref().map(|i| match &i.vendor {
                            Some(vendor) => format!(
                                "{vendor} {} fw {} {}",
                                i.model.as_deref().unwrap_or(""),
                                i.firmware,
                                o.boot_device.as_deref().unwrap_or("")
                            ),
                            None => format!(
                                "dev {} fw {} ipmi {} {}",
                                i.device_id,
                                i.firmware,
                                i.ipmi_version,
                                o.boot_device.as_deref().unwrap_or("")
                            ),
                        })
                    })
                    .or_else(|| o.boot_device.clone())
                    .unwrap_or_else(|| "-".into());
                table.row(vec![
                    terminal::escape(&o.host).into_owned(),
                    o.result.to_string(),
                    o.power.map_or("-", |p| p.as_str()).to_string(),
                    format!("{}ms", o.duration_ms),
                    terminal::escape(detail.trim_end()).into_owned(),
                    terminal::escape(o.error.as_deref().unwrap_or("-")).into_owned(),
                ]);
            }
            print!("{}", table.render());
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Sends `op` for each host to the agent, `concurrency` at a time: each
/// worker takes the next host as soon as its last one answered, so a slow
/// or dead BMC holds up only its own worker. The agent's sequencer decides
/// the order and pace of the calls themselves. Outcomes are in `hosts`'
/// order.
fn through_agent(
    op: Op,
    hosts: Vec<String>,
    api: &client::Api,
    concurrency: usize,
) -> Vec<Outcome> {
    let (path, body) = match op {
        Op::Power(_) | Op::PowerStatus => ("power", Some(op.params())),
        Op::BootDevice(_) => ("bootdev", Some(op.params())),
        Op::Info => ("bmc", None),
        Op::Recover => ("recover", Some(serde_json::json!({}))),
    };
    let ask = |host: &String| {
        let started = std::time::Instant::now();
        let url = format!("/api/v1/hosts/{}/{path}", url_segment(host));
        let answer = match &body {
            Some(body) => api.request("POST", &url, Some(body)),
            None => api.request("GET", &url, None),
        };
        let failed = |error: String| {
            let mut out = Outcome::new(host, None);
            out.fail(control::Failure::Unavailable, error);
            out.duration_ms = started.elapsed().as_millis() as u64;
            out
        };
        match answer {
            Ok((_, text)) => match serde_json::from_str::<Outcome>(&text) {
                Ok(o) => o,
                Err(_) => failed(text.trim().to_string()),
            },
            Err(e) => failed(format!("{e:#}")),
        }
    };
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<(usize, Outcome)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..concurrency.min(hosts.len()))
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(host) = hosts.get(i) else { break };
                        mine.push((i, ask(host)));
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a request thread panicked"))
            .collect()
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, o)| o).collect()
}

/// `host` as a path segment: host names and MACs need no escaping but
/// `%` and `/` would change the path.
fn url_segment(host: &str) -> String {
    host.replace('%', "%25").replace('/', "%2F")
}

/// Runs `op` on each host's BMC from the inventory, `concurrency` at a
/// time, recording each call in `audit` as caller `direct`.
async fn direct(
    op: Op,
    hosts: Vec<String>,
    inv: &inventory::Inventory,
    audit: &Arc<AuditLog>,
    concurrency: usize,
    echo: BootFlagEcho,
) -> anyhow::Result<Vec<Outcome>> {
    use futures_util::StreamExt as _;
    // Fallbacks are recorded for this run only: a hold-down lives in the
    // running agent.
    let record = Arc::new(Fallbacks::new(Some(audit.clone())));
    let record = &record;
    let calls = hosts.into_iter().map(|name| async move {
        let at_ms = clock::now_ms();
        let started = std::time::Instant::now();
        let mut out = Outcome::new(&name, None);
        match control::find_host(inv, &name) {
            None => out.fail(
                control::Failure::UnknownHost,
                format!("no inventory host is named {name:?}"),
            ),
            Some(host) => {
                out.mac = Some(host.mac);
                match &host.bmc {
                    None => out.fail(
                        control::Failure::NoBmc,
                        format!("host {} has no bmc block in the inventory", host.label()),
                    ),
                    Some(s) => match Driver::for_host_in(s, RetryPolicy::default(), echo, record) {
                        Err(e) => out.fail(control::Failure::NoBmc, e.to_string()),
                        Ok(bmc) => {
                            if let Err(e) = control::perform(&bmc, op, &mut out).await {
                                out.fail(control::Failure::Bmc, e.to_string());
                            }
                        }
                    },
                }
            }
        }
        out.duration_ms = started.elapsed().as_millis() as u64;
        (at_ms, out)
    });
    let done: Vec<(u64, Outcome)> = futures_util::stream::iter(calls)
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let mut outcomes = Vec::with_capacity(done.len());
    for (at_ms, out) in done {
        audit.record(&Entry {
            at_ms,
            caller: "direct".into(),
            groups: Vec::new(),
            host: out.host.clone(),
            action: op.name().into(),
            params: op.params(),
            result: out.audit_result(),
            duration_ms: out.duration_ms,
        })?;
        outcomes.push(out);
    }
    Ok(outcomes)
}

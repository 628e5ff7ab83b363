//! Command line: `run`, `check`, `stats`.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use pxe_agent::{
    app::{self, RunConfig},
    dhcp::Server,
    xdp::{AttachMode, VethPeer},
};
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

const DEFAULT_METRICS: &str = "127.0.0.1:9464";

#[derive(Parser)]
#[command(
    version,
    about = "XDP-accelerated network-boot responder for bare-metal fleets"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Attach the fast path to an interface and serve the inventory until
    /// SIGINT or SIGTERM (needs CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON or root).
    Run {
        /// Provisioning interface the XDP program attaches to.
        #[arg(long, short)]
        interface: String,
        /// Inventory file (YAML); watched and reloaded on change.
        #[arg(long)]
        inventory: PathBuf,
        /// Server address in replies (option 54, source address). Defaults to
        /// the interface's IPv4 address.
        #[arg(long)]
        server_ip: Option<Ipv4Addr>,
        /// Address of the HTTP endpoint serving /metrics and /healthz.
        #[arg(long, default_value = DEFAULT_METRICS)]
        metrics_addr: SocketAddr,
        /// XDP attach mode: auto tries native and falls back to generic.
        #[arg(long, value_enum, default_value_t = AttachMode::Auto)]
        xdp_mode: AttachMode,
        /// How often to check the inventory file for changes, in milliseconds.
        #[arg(long, default_value_t = 250)]
        reload_ms: u64,
    },
    /// Validate an inventory file without running.
    Check {
        file: PathBuf,
        /// Server address to expand `{server}` with (the longest address is
        /// assumed otherwise, so size checks hold for any server).
        #[arg(long)]
        server_ip: Option<Ipv4Addr>,
    },
    /// Lab helper: attach a pass-through XDP program to the far end of a veth
    /// pair so it receives the fast path's XDP_TX replies, until SIGINT or
    /// SIGTERM. Real NICs do not need this.
    VethPeer {
        #[arg(long, short)]
        interface: String,
    },
    /// Print the fast-path counters of the running agent.
    Stats {
        #[arg(long, default_value = DEFAULT_METRICS)]
        metrics_addr: SocketAddr,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match dispatch(Cli::parse().command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Run {
            interface,
            inventory,
            server_ip,
            metrics_addr,
            xdp_mode,
            reload_ms,
        } => {
            let cfg = RunConfig {
                iface: interface,
                inventory,
                server_ip,
                metrics_addr,
                xdp_mode,
                reload_interval: Duration::from_millis(reload_ms.max(10)),
            };
            run(cfg)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { file, server_ip } => {
            let server = Server {
                ip: server_ip.unwrap_or(Ipv4Addr::BROADCAST),
                mac: [0; 6],
            };
            match app::prepare(&file, &server) {
                Ok((inv, templates)) => {
                    println!(
                        "{}: ok, {} hosts, {} compiled replies",
                        file.display(),
                        inv.hosts.len(),
                        templates.len()
                    );
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("{e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::VethPeer { interface } => {
            let _peer = VethPeer::attach(&interface)?;
            block_on_signal(async { Ok(()) })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Stats { metrics_addr } => {
            print!("{}", stats(metrics_addr)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn run(cfg: RunConfig) -> anyhow::Result<()> {
    let rt = runtime()?;
    rt.block_on(async move {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            wait_for_signal().await;
            let _ = tx.send(true);
        });
        app::run(cfg, rx).await
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("failed to start the runtime")
}

/// Runs `fut`, then waits for SIGINT or SIGTERM.
fn block_on_signal(fut: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    runtime()?.block_on(async move {
        fut.await?;
        wait_for_signal().await;
        Ok(())
    })
}

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("failed to install the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Fetches /metrics from the running agent and prints its samples as a table.
fn stats(addr: SocketAddr) -> anyhow::Result<String> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .with_context(|| format!("no agent answering on {addr} (is `pxe-agent run` up?)"))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(conn, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut body = String::new();
    conn.read_to_string(&mut body)
        .context("failed to read /metrics")?;
    let (head, page) = body
        .split_once("\r\n\r\n")
        .context("malformed HTTP response")?;
    anyhow::ensure!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "agent answered: {}",
        head.lines().next().unwrap_or("")
    );
    let mut out = String::new();
    for line in page
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        if let Some((name, value)) = line.rsplit_once(' ') {
            out.push_str(&format!("{name:<60} {value:>12}\n"));
        }
    }
    Ok(out)
}

//! The three DHCP servers under test, each started in the server namespace
//! on the server cores with the same reservations, and stopped by PID.
//!
//! Owns each server's configuration and command line and its start-up
//! check; whether it answers is probed by [`super::load::probe`].

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Stdio,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use xtask::ChildGuard;

use super::{
    hosts::{Hosts, SERVER_IP, SUBNET},
    testbed::{Bins, Testbed},
};

/// Where the agent serves its counters, inside the server namespace.
const METRICS_ADDR: &str = "127.0.0.1:9464";
const AGENT_READY_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ServerKind {
    PxeAgent,
    Kea,
    Dnsmasq,
}

impl ServerKind {
    pub const ALL: [ServerKind; 3] = [ServerKind::PxeAgent, ServerKind::Kea, ServerKind::Dnsmasq];

    pub fn name(self) -> &'static str {
        match self {
            ServerKind::PxeAgent => "pxe-agent",
            ServerKind::Kea => "Kea",
            ServerKind::Dnsmasq => "dnsmasq",
        }
    }

    /// How long it may take to answer its first request: dnsmasq with
    /// 50,000 hosts binds at once but answers nothing for ~17 s.
    pub fn answer_timeout(self) -> Duration {
        match self {
            ServerKind::PxeAgent => Duration::from_secs(30),
            ServerKind::Kea | ServerKind::Dnsmasq => Duration::from_secs(120),
        }
    }
}

/// A running server.
pub struct Server {
    pub kind: ServerKind,
    guard: ChildGuard,
    log: PathBuf,
}

impl Server {
    /// Writes the configuration for `hosts` into `dir` and starts the
    /// server in the testbed's server namespace.
    pub fn start(
        kind: ServerKind,
        bed: &Testbed,
        bins: &Bins,
        hosts: Hosts,
        dir: &Path,
    ) -> anyhow::Result<Server> {
        fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
        let log = dir.join(format!("{}.log", kind.name().to_lowercase()));
        let out = fs::File::create(&log)
            .with_context(|| format!("failed to create {}", log.display()))?;
        let mut cmd = bed.lab.cmd_in(bed.server_ns(), "taskset");
        cmd.args(["-c", &bed.cores.server_list()])
            .stdin(Stdio::null())
            .stdout(out.try_clone().context("failed to clone log handle")?)
            .stderr(out);
        match kind {
            ServerKind::PxeAgent => agent_command(&mut cmd, bed, bins, hosts, dir)?,
            ServerKind::Kea => kea_command(&mut cmd, bed, hosts, dir)?,
            ServerKind::Dnsmasq => dnsmasq_command(&mut cmd, bed, hosts, dir)?,
        }
        let mut server = Server {
            kind,
            guard: ChildGuard::spawn(&mut cmd)?,
            log,
        };
        if kind == ServerKind::PxeAgent {
            server.wait_agent_ready(bed, bins)?;
        }
        Ok(server)
    }

    /// The server's PID (`ip netns exec` and `taskset` exec it in place).
    pub fn pid(&self) -> u32 {
        self.guard.id()
    }

    /// Fails, with the end of its log, if the server has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.guard.try_wait()? {
            bail!(
                "{} exited ({status}); log:\n{}",
                self.kind.name(),
                self.log_tail()
            );
        }
        Ok(())
    }

    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// SIGTERM (the agent detaches XDP on it), SIGKILL after a grace period.
    pub fn stop(self) -> anyhow::Result<()> {
        let name = self.kind.name();
        self.guard
            .stop()
            .with_context(|| format!("failed to stop {name}"))?;
        Ok(())
    }

    /// The agent's counters by sample name (`pxe_xdp_packets_total{...}`);
    /// `None` for the peers, or if `pxe-agent stats` fails.
    pub fn agent_counters(&self, bed: &Testbed, bins: &Bins) -> Option<BTreeMap<String, u64>> {
        if self.kind != ServerKind::PxeAgent {
            return None;
        }
        let agent = bins.agent.to_str()?;
        let stats = [agent, "stats", "--metrics-addr", METRICS_ADDR];
        let out = bed.lab.run_in(bed.server_ns(), &stats).ok()?;
        Some(
            out.lines()
                .filter_map(|line| {
                    let (name, value) = line.split_once(char::is_whitespace)?;
                    Some((name.to_owned(), value.trim().parse().ok()?))
                })
                .collect(),
        )
    }

    /// `pxe-agent stats` answers once XDP is attached and the maps are filled.
    fn wait_agent_ready(&mut self, bed: &Testbed, bins: &Bins) -> anyhow::Result<()> {
        let deadline = Instant::now() + AGENT_READY_TIMEOUT;
        loop {
            self.check_alive()?;
            let stats = [
                bins.agent.to_str().context("agent path is not UTF-8")?,
                "stats",
                "--metrics-addr",
                METRICS_ADDR,
            ];
            if bed.lab.run_in(bed.server_ns(), &stats).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "pxe-agent not ready after {}s; log:\n{}",
                    AGENT_READY_TIMEOUT.as_secs(),
                    self.log_tail()
                );
            }
            thread::sleep(Duration::from_millis(200));
        }
    }
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    fs::write(path, text).with_context(|| format!("failed to write {}", path.display()))
}

fn agent_command(
    cmd: &mut std::process::Command,
    bed: &Testbed,
    bins: &Bins,
    hosts: Hosts,
    dir: &Path,
) -> anyhow::Result<()> {
    let inventory = dir.join("inventory.yaml");
    write(&inventory, &hosts.inventory())?;
    cmd.arg(&bins.agent)
        .args([
            "run",
            "--interface",
            bed.server_if(),
            "--xdp-mode",
            "native",
        ])
        .args(["--metrics-addr", METRICS_ADDR])
        // The slow path's lease database, kept out of /var/lib.
        .arg("--state-dir")
        .arg(dir)
        .arg("--inventory")
        .arg(&inventory);
    Ok(())
}

/// kea-dhcp4 with its PID and lock files in `dir` rather than /run.
fn kea_command(
    cmd: &mut std::process::Command,
    bed: &Testbed,
    hosts: Hosts,
    dir: &Path,
) -> anyhow::Result<()> {
    let config = dir.join("kea-dhcp4.json");
    write(
        &config,
        &hosts.kea_config(bed.server_if(), &dir.join("kea-dhcp4.log")),
    )?;
    cmd.env("KEA_PIDFILE_DIR", dir)
        .env("KEA_LOCKFILE_DIR", dir)
        .args(["kea-dhcp4", "-c"])
        .arg(&config);
    Ok(())
}

/// dnsmasq as a DHCP server only (`--port=0`), static leases for the
/// reservations only, no routine per-packet log lines. `--leasefile-ro`
/// keeps leases in memory, as Kea's non-persistent memfile does: with a
/// lease file dnsmasq rewrites that file as leases change.
fn dnsmasq_command(
    cmd: &mut std::process::Command,
    bed: &Testbed,
    hosts: Hosts,
    dir: &Path,
) -> anyhow::Result<()> {
    let hosts_file = dir.join("dnsmasq.hosts");
    write(&hosts_file, &hosts.dnsmasq_hosts())?;
    let network = SUBNET.split('/').next().context("subnet has no address")?;
    cmd.args(["dnsmasq", "-k", "--conf-file=/dev/null", "--port=0"])
        .arg(format!("--interface={}", bed.server_if()))
        .arg("--bind-interfaces")
        .arg(format!(
            "--dhcp-range={network},static,{},1h",
            super::hosts::NETMASK
        ))
        .arg(format!("--dhcp-hostsfile={}", hosts_file.display()))
        .arg(format!("--dhcp-lease-max={}", hosts.count * 2))
        .arg("--leasefile-ro")
        .arg(format!(
            "--dhcp-boot={},,{SERVER_IP}",
            super::hosts::BIOS_BOOT_FILE
        ))
        .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
        .args(["--no-ping", "--dhcp-authoritative", "--quiet-dhcp"])
        .arg(format!(
            "--log-facility={}",
            dir.join("dnsmasq-daemon.log").display()
        ));
    Ok(())
}

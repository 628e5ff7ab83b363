//! The DHCP servers under test, each started in the server namespace on the
//! server cores with the same reservations (and, for the slow-path loads, a
//! pool or an iPXE answer), and stopped by PID. Kea runs a second time with
//! its leases written to a file, for the pool load only. For the DHCPv6
//! load Kea is kea-dhcp6 and dnsmasq serves the IPv6 subnet only.
//!
//! Owns each server's configuration and command line, its start-up check
//! and its restart with an empty lease database; whether it answers is
//! probed by [`super::load::Runner::probe`].

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
    hosts::{
        BIOS_BOOT_FILE, Hosts, IPXE_URL, LEASE_SECS, NETMASK, POOL_LEASE_SECS, SERVER_IP, SUBNET,
        SUBNET6, Setup,
    },
    testbed::{Bins, Testbed},
};

/// Where the agent serves its counters, inside the server namespace.
const METRICS_ADDR: &str = "127.0.0.1:9464";
const AGENT_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// pxe-agent's storm guard for the slow-path loads (`--rate-per-mac`,
/// `--rate-unknown`): far above any rate the bench sends, so that it
/// measures the slow path rather than its limits (defaults 10 and 2,000/s).
pub const SLOW_PATH_RATE_LIMIT: &str = "1000000";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ServerKind {
    PxeAgent,
    Kea,
    /// Kea with `persist: true`: every lease change appended to a CSV file.
    KeaPersist,
    Dnsmasq,
}

impl ServerKind {
    pub const ALL: [ServerKind; 4] = [
        ServerKind::PxeAgent,
        ServerKind::Kea,
        ServerKind::KeaPersist,
        ServerKind::Dnsmasq,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ServerKind::PxeAgent => "pxe-agent",
            ServerKind::Kea => "Kea",
            ServerKind::KeaPersist => "Kea (persist)",
            ServerKind::Dnsmasq => "dnsmasq",
        }
    }

    /// For file names.
    fn file_stem(self) -> &'static str {
        match self {
            ServerKind::PxeAgent => "pxe-agent",
            ServerKind::Kea => "kea",
            ServerKind::KeaPersist => "kea-persist",
            ServerKind::Dnsmasq => "dnsmasq",
        }
    }

    /// Whether this server is measured in `setup`: Kea with a lease file
    /// only where leases are made (the pool), the others everywhere.
    /// (Every DHCPv6 answer is a reservation, so its leases are no more
    /// than those of the relayed and direct loads.)
    pub fn serves(self, setup: Setup) -> bool {
        self != ServerKind::KeaPersist || setup == Setup::Pool
    }

    /// How long it may take to answer its first request: dnsmasq with
    /// 50,000 hosts binds at once but answers nothing for ~17 s.
    pub fn answer_timeout(self) -> Duration {
        match self {
            ServerKind::PxeAgent => Duration::from_secs(30),
            ServerKind::Kea | ServerKind::KeaPersist | ServerKind::Dnsmasq => {
                Duration::from_secs(120)
            }
        }
    }
}

/// What a server was started with, to start it again.
#[derive(Clone, Debug)]
struct Launch {
    hosts: Hosts,
    setup: Setup,
    dir: PathBuf,
}

/// A running server.
pub struct Server {
    pub kind: ServerKind,
    /// `None` only between stopping and starting again in a restart.
    guard: Option<ChildGuard>,
    log: PathBuf,
    launch: Launch,
    /// Starts so far; each start has its own lease database.
    generation: u32,
}

impl Server {
    /// Writes the configuration for `hosts` and `setup` into `dir` and
    /// starts the server in the testbed's server namespace.
    pub fn start(
        kind: ServerKind,
        bed: &Testbed,
        bins: &Bins,
        hosts: Hosts,
        setup: Setup,
        dir: &Path,
    ) -> anyhow::Result<Server> {
        let launch = Launch {
            hosts,
            setup,
            dir: dir.to_owned(),
        };
        let (guard, log) = spawn(kind, bed, bins, &launch, 0)?;
        let mut server = Server {
            kind,
            guard: Some(guard),
            log,
            launch,
            generation: 0,
        };
        if kind == ServerKind::PxeAgent {
            server.wait_agent_ready(bed, bins)?;
        }
        Ok(server)
    }

    /// Stops the server and starts it again with an empty lease database
    /// (the previous one is deleted); the caller waits until it answers.
    pub fn restart(&mut self, bed: &Testbed, bins: &Bins) -> anyhow::Result<()> {
        if let Some(guard) = self.guard.take() {
            guard
                .stop()
                .with_context(|| format!("failed to stop {}", self.kind.name()))?;
        }
        if let Some(old) = lease_state(self.kind, &self.launch, self.generation) {
            let _ = fs::remove_dir_all(&old).or_else(|_| fs::remove_file(&old));
        }
        self.generation += 1;
        let (guard, log) = spawn(self.kind, bed, bins, &self.launch, self.generation)?;
        self.guard = Some(guard);
        self.log = log;
        if self.kind == ServerKind::PxeAgent {
            self.wait_agent_ready(bed, bins)?;
        }
        Ok(())
    }

    /// The server's PID (`ip netns exec` and `taskset` exec it in place);
    /// 0 if a restart failed to start it.
    pub fn pid(&self) -> u32 {
        self.guard.as_ref().map_or(0, ChildGuard::id)
    }

    /// Fails, with the end of its log, if the server has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        let Some(guard) = self.guard.as_mut() else {
            bail!("{} is not running", self.kind.name());
        };
        if let Some(status) = guard.try_wait()? {
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

    /// What the server was configured for.
    pub fn setup(&self) -> Setup {
        self.launch.setup
    }

    /// SIGTERM (the agent detaches XDP on it), SIGKILL after a grace period.
    pub fn stop(self) -> anyhow::Result<()> {
        let name = self.kind.name();
        if let Some(guard) = self.guard {
            guard
                .stop()
                .with_context(|| format!("failed to stop {name}"))?;
        }
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

/// Writes the configuration and starts `kind`, its output going to a log
/// of its own for this start.
fn spawn(
    kind: ServerKind,
    bed: &Testbed,
    bins: &Bins,
    launch: &Launch,
    generation: u32,
) -> anyhow::Result<(ChildGuard, PathBuf)> {
    let dir = &launch.dir;
    fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let log = dir.join(format!("{}-{generation}.log", kind.file_stem()));
    let out =
        fs::File::create(&log).with_context(|| format!("failed to create {}", log.display()))?;
    let mut cmd = bed.lab.cmd_in(bed.server_ns(), "taskset");
    cmd.args(["-c", &bed.cores.server_list()])
        .stdin(Stdio::null())
        .stdout(out.try_clone().context("failed to clone log handle")?)
        .stderr(out);
    let state = lease_state(kind, launch, generation);
    match kind {
        ServerKind::PxeAgent => agent_command(&mut cmd, bed, bins, launch, state.as_deref())?,
        ServerKind::Kea if launch.setup == Setup::Dhcpv6 => kea6_command(&mut cmd, bed, launch)?,
        ServerKind::Kea | ServerKind::KeaPersist => {
            kea_command(&mut cmd, bed, launch, kind, state.as_deref())?
        }
        ServerKind::Dnsmasq if launch.setup == Setup::Dhcpv6 => {
            dnsmasq6_command(&mut cmd, bed, launch)?
        }
        ServerKind::Dnsmasq => dnsmasq_command(&mut cmd, bed, launch, state.as_deref())?,
    }
    Ok((ChildGuard::spawn(&mut cmd)?, log))
}

/// Where one start of `kind` keeps its leases: pxe-agent's state directory
/// (its redb file), Kea's CSV file with `persist: true`, dnsmasq's lease
/// file in the pool setup. `None`: leases in memory only.
fn lease_state(kind: ServerKind, launch: &Launch, generation: u32) -> Option<PathBuf> {
    let dir = &launch.dir;
    match kind {
        ServerKind::PxeAgent => Some(dir.join(format!("state-{generation}"))),
        ServerKind::KeaPersist => Some(dir.join(format!("kea-leases4-{generation}.csv"))),
        ServerKind::Dnsmasq if launch.setup == Setup::Pool => {
            Some(dir.join(format!("dnsmasq-{generation}.leases")))
        }
        ServerKind::Kea | ServerKind::Dnsmasq => None,
    }
}

fn agent_command(
    cmd: &mut std::process::Command,
    bed: &Testbed,
    bins: &Bins,
    launch: &Launch,
    state: Option<&Path>,
) -> anyhow::Result<()> {
    let inventory = launch.dir.join("inventory.yaml");
    write(&inventory, &launch.hosts.inventory(launch.setup))?;
    let state = state.context("pxe-agent needs a state directory")?;
    fs::create_dir_all(state).with_context(|| format!("failed to create {}", state.display()))?;
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
        .arg(state)
        .arg("--inventory")
        .arg(&inventory);
    if matches!(launch.setup, Setup::Pool | Setup::Ipxe | Setup::Dhcpv6) {
        cmd.args(["--rate-per-mac", SLOW_PATH_RATE_LIMIT])
            .args(["--rate-unknown", SLOW_PATH_RATE_LIMIT]);
    }
    Ok(())
}

/// kea-dhcp4 with its PID and lock files in `dir` rather than /run.
fn kea_command(
    cmd: &mut std::process::Command,
    bed: &Testbed,
    launch: &Launch,
    kind: ServerKind,
    lease_file: Option<&Path>,
) -> anyhow::Result<()> {
    let dir = &launch.dir;
    let config = dir.join(format!("{}-dhcp4.json", kind.file_stem()));
    write(
        &config,
        &launch.hosts.kea_config(
            bed.server_if(),
            &dir.join(format!("{}-dhcp4.log", kind.file_stem())),
            launch.setup,
            lease_file,
        ),
    )?;
    cmd.env("KEA_PIDFILE_DIR", dir)
        .env("KEA_LOCKFILE_DIR", dir)
        .args(["kea-dhcp4", "-c"])
        .arg(&config);
    Ok(())
}

/// kea-dhcp6 with its PID and lock files in `dir` rather than /run.
fn kea6_command(
    cmd: &mut std::process::Command,
    bed: &Testbed,
    launch: &Launch,
) -> anyhow::Result<()> {
    let dir = &launch.dir;
    let config = dir.join("kea-dhcp6.json");
    write(
        &config,
        &launch
            .hosts
            .kea6_config(bed.server_if(), &dir.join("kea-dhcp6.log")),
    )?;
    cmd.env("KEA_PIDFILE_DIR", dir)
        .env("KEA_LOCKFILE_DIR", dir)
        .args(["kea-dhcp6", "-c"])
        .arg(&config);
    Ok(())
}

/// dnsmasq as a DHCPv6 server only: the IPv6 subnet as a static range
/// (reservations only, as for DHCPv4), leases in memory, no router
/// advertisements, the same flags otherwise.
fn dnsmasq6_command(
    cmd: &mut std::process::Command,
    bed: &Testbed,
    launch: &Launch,
) -> anyhow::Result<()> {
    let (dir, hosts) = (&launch.dir, launch.hosts);
    let hosts_file = dir.join("dnsmasq6.hosts");
    write(&hosts_file, &hosts.dnsmasq6_hosts())?;
    let (network, prefix) = SUBNET6.split_once('/').context("subnet has no prefix")?;
    cmd.args(["dnsmasq", "-k", "--conf-file=/dev/null", "--port=0"])
        .arg(format!("--interface={}", bed.server_if()))
        .arg("--bind-interfaces")
        .arg(format!(
            "--dhcp-range={network},static,{prefix},{LEASE_SECS}"
        ))
        .arg(format!("--dhcp-hostsfile={}", hosts_file.display()))
        .arg(format!("--dhcp-lease-max={}", hosts.count * 2))
        .arg("--leasefile-ro")
        .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
        .args(["--dhcp-authoritative", "--quiet-dhcp", "--quiet-dhcp6"])
        .arg(format!(
            "--log-facility={}",
            dir.join("dnsmasq-daemon.log").display()
        ));
    Ok(())
}

/// dnsmasq as a DHCP server only (`--port=0`), no routine per-packet log
/// lines. With reservations only: static leases, and `--leasefile-ro` keeps
/// them in memory, as Kea's non-persistent memfile does (with a lease file
/// dnsmasq rewrites that file as leases change). The pool setup needs a
/// lease file for its dynamic leases (`lease_file`); the iPXE setup tags
/// user class `iPXE` and answers it with [`IPXE_URL`].
fn dnsmasq_command(
    cmd: &mut std::process::Command,
    bed: &Testbed,
    launch: &Launch,
    lease_file: Option<&Path>,
) -> anyhow::Result<()> {
    let (dir, hosts) = (&launch.dir, launch.hosts);
    let hosts_file = dir.join("dnsmasq.hosts");
    write(&hosts_file, &hosts.dnsmasq_hosts())?;
    let network = SUBNET.split('/').next().context("subnet has no address")?;
    cmd.args(["dnsmasq", "-k", "--conf-file=/dev/null", "--port=0"])
        .arg(format!("--interface={}", bed.server_if()))
        .arg("--bind-interfaces");
    match launch.setup {
        Setup::Pool => {
            let (start, end) = hosts.pool();
            cmd.arg(format!(
                "--dhcp-range={start},{end},{NETMASK},{POOL_LEASE_SECS}"
            ));
        }
        Setup::Reservations | Setup::Ipxe | Setup::Dhcpv6 => {
            cmd.arg(format!("--dhcp-range={network},static,{NETMASK},1h"));
        }
    }
    cmd.arg(format!("--dhcp-hostsfile={}", hosts_file.display()));
    let lease_max = match launch.setup {
        Setup::Pool => hosts.count + hosts.pool_size() as usize,
        Setup::Reservations | Setup::Ipxe | Setup::Dhcpv6 => hosts.count * 2,
    };
    cmd.arg(format!("--dhcp-lease-max={lease_max}"));
    match lease_file {
        Some(file) => cmd.arg(format!("--dhcp-leasefile={}", file.display())),
        None => cmd.arg("--leasefile-ro"),
    };
    if launch.setup == Setup::Ipxe {
        cmd.arg("--dhcp-userclass=set:ipxe,iPXE")
            .arg(format!("--dhcp-boot=tag:ipxe,{IPXE_URL}"))
            .arg(format!(
                "--dhcp-boot=tag:!ipxe,{BIOS_BOOT_FILE},,{SERVER_IP}"
            ));
    } else {
        cmd.arg(format!("--dhcp-boot={BIOS_BOOT_FILE},,{SERVER_IP}"));
    }
    cmd.arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
        .args(["--no-ping", "--dhcp-authoritative", "--quiet-dhcp"])
        .arg(format!(
            "--log-facility={}",
            dir.join("dnsmasq-daemon.log").display()
        ));
    Ok(())
}

//! The lab and the servers under test: pxe-agent (TFTP and boot HTTP),
//! tftpd-hpa and nginx, all in the lab's server namespace on the same
//! address, each on its own port, all running for the whole benchmark.
//!
//! The agent is started as an operator would run it (`pxe-agent run` on the
//! lab's interface, XDP attached in native mode), so its XDP program sees
//! every packet the server end receives, whichever server is measured: all
//! servers share the same data path. No `pxe-agent veth-peer` runs on the
//! client end: nothing here needs XDP_TX replies, and an XDP program on the
//! client end would take segmentation offload away from the server end
//! (veth turns off GSO on a peer whose other end runs XDP), which no real
//! NIC does.
//!
//! Owns the scratch files the servers read (configuration, served files)
//! and their command lines; every process is stopped by its PID when this
//! drops, before the lab's namespaces go.

use std::{
    fs,
    net::SocketAddr,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use xtask::{ChildGuard, Lab};

use super::{http, netns, tftp};

pub const LAB_PREFIX: &str = "pxboot";
/// The server end's address (the lab's default) and the client end's.
pub const SERVER_IP: &str = "10.66.0.1";
const CLIENT_CIDR: &str = "10.66.0.2/16";
const CLIENT_IP: &str = "10.66.0.2";

pub const AGENT_TFTP: u16 = 69;
pub const TFTPD_PORT: u16 = 6969;
pub const AGENT_HTTP: u16 = 8080;
pub const NGINX_PORT: u16 = 8081;
const METRICS_ADDR: &str = "127.0.0.1:9464";

const TFTPD: &str = "/usr/sbin/in.tftpd";
const NGINX: &str = "/usr/sbin/nginx";
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The files both TFTP servers and both HTTP servers serve.
pub struct Files {
    /// The TFTP root (also the agent's `--boot-root`).
    pub tftp_root: PathBuf,
    /// nginx's root; its `artifacts/` is the agent's `--artifacts`.
    pub www: PathBuf,
    /// TFTP files by name, with their contents for checking transfers.
    pub tftp: Vec<(String, Vec<u8>)>,
    /// The HTTP artifact's name under `/artifacts/` and its size.
    pub artifact: String,
    pub artifact_size: u64,
}

impl Files {
    /// Writes `ipxe.efi` (copied from Debian's ipxe package), a
    /// `big_mib` MiB TFTP file and a `artifact_mib` MiB artifact of
    /// pseudo-random bytes, readable by the servers' unprivileged users.
    pub fn create(dir: &Path, big_mib: usize, artifact_mib: usize) -> anyhow::Result<Files> {
        let tftp_root = dir.join("tftp");
        let www = dir.join("www");
        let artifacts = www.join("artifacts");
        for d in [dir, &tftp_root, &www, &artifacts] {
            fs::create_dir_all(d).with_context(|| format!("failed to create {}", d.display()))?;
            fs::set_permissions(d, fs::Permissions::from_mode(0o755))
                .with_context(|| format!("failed to set permissions of {}", d.display()))?;
        }
        let ipxe = fs::read(IPXE_EFI)
            .with_context(|| format!("failed to read {IPXE_EFI} (package ipxe)"))?;
        let big_name = format!("big-{big_mib}m.bin");
        let big = pseudo_random(big_mib << 20, 1);
        let artifact = format!("artifact-{artifact_mib}m.bin");
        let artifact_bytes = pseudo_random(artifact_mib << 20, 2);
        let writes = [
            (tftp_root.join("ipxe.efi"), &ipxe[..]),
            (tftp_root.join(&big_name), &big[..]),
            (artifacts.join(&artifact), &artifact_bytes[..]),
            (artifacts.join(PROBE), b"probe\n"),
        ];
        for (path, bytes) in writes {
            fs::write(&path, bytes)
                .with_context(|| format!("failed to write {}", path.display()))?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o644))
                .with_context(|| format!("failed to set permissions of {}", path.display()))?;
        }
        Ok(Files {
            tftp_root,
            www,
            tftp: vec![("ipxe.efi".into(), ipxe), (big_name, big)],
            artifact,
            artifact_size: (artifact_mib << 20) as u64,
        })
    }

    fn artifacts(&self) -> PathBuf {
        self.www.join("artifacts")
    }
}

/// Debian's iPXE EFI binary (a symlink to /boot/ipxe.efi).
pub const IPXE_EFI: &str = "/usr/lib/ipxe/ipxe.efi";
/// A small artifact the readiness probes fetch.
const PROBE: &str = "probe.txt";

/// Bytes from xorshift64: incompressible, and the same on every run.
fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A running server process.
pub struct Server {
    pub name: &'static str,
    guard: ChildGuard,
    log: PathBuf,
}

impl Server {
    fn spawn(name: &'static str, mut cmd: Command, log: PathBuf) -> anyhow::Result<Server> {
        let out = fs::File::create(&log)
            .with_context(|| format!("failed to create {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone().context("failed to clone a log handle")?)
            .stderr(out);
        Ok(Server {
            name,
            guard: ChildGuard::spawn(&mut cmd)?,
            log,
        })
    }

    /// The server's PID (`ip netns exec` execs it in place).
    pub fn pid(&self) -> u32 {
        self.guard.id()
    }

    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.guard.try_wait()? {
            bail!("{} exited ({status}); log:\n{}", self.name, self.log_tail());
        }
        Ok(())
    }

    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

/// The lab with every server running. Field order matters: the servers
/// stop before the lab's namespaces go.
pub struct Bed {
    pub agent: Server,
    pub tftpd: Server,
    pub nginx: Server,
    pub lab: Lab,
}

impl Bed {
    /// Sets up the lab, starts the three servers and waits until each
    /// serves a file.
    pub fn start(agent_bin: &Path, files: &Files, dir: &Path) -> anyhow::Result<Bed> {
        let lab = Lab::new(LAB_PREFIX)?;
        lab.run_in(
            lab.client_ns(),
            &["ip", "addr", "add", CLIENT_CIDR, "dev", lab.client_if()],
        )
        .with_context(|| format!("failed to assign {CLIENT_CIDR} to the client end"))?;
        let agent = start_agent(&lab, agent_bin, files, dir)?;
        let tftpd = start_tftpd(&lab, files, dir)?;
        let nginx = start_nginx(&lab, files, dir)?;
        let mut bed = Bed {
            agent,
            tftpd,
            nginx,
            lab,
        };
        bed.wait_ready(agent_bin, files)?;
        Ok(bed)
    }

    pub fn client_ns(&self) -> &str {
        self.lab.client_ns()
    }

    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        self.agent.check_alive()?;
        self.tftpd.check_alive()?;
        self.nginx.check_alive()
    }

    fn wait_ready(&mut self, agent_bin: &Path, files: &Files) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let agent = agent_bin.to_str().context("agent path is not UTF-8")?;
        let stats = [agent, "stats", "--metrics-addr", METRICS_ADDR];
        while self.lab.run_in(self.lab.server_ns(), &stats).is_err() {
            self.agent.check_alive()?;
            if Instant::now() >= deadline {
                bail!(
                    "pxe-agent not ready after {} s; log:\n{}",
                    READY_TIMEOUT.as_secs(),
                    self.agent.log_tail()
                );
            }
            thread::sleep(Duration::from_millis(200));
        }
        let (ipxe_name, ipxe) = files.tftp[0].clone();
        let options = tftp::Options {
            blksize: Some(1468),
            windowsize: None,
        };
        for (port, name) in [(AGENT_TFTP, "pxe-agent"), (TFTPD_PORT, "tftpd-hpa")] {
            let (file, bytes) = (ipxe_name.clone(), ipxe.clone());
            self.until_ready(name, deadline, move || {
                tftp::fetch(addr(port), &file, options, &bytes).map(drop)
            })?;
        }
        for (port, name) in [(AGENT_HTTP, "pxe-agent"), (NGINX_PORT, "nginx")] {
            self.until_ready(name, deadline, move || {
                http::download(addr(port), &format!("/artifacts/{PROBE}"), 6).map(drop)
            })?;
        }
        Ok(())
    }

    /// Repeats `probe` from the client namespace until it succeeds.
    fn until_ready(
        &mut self,
        name: &str,
        deadline: Instant,
        probe: impl Fn() -> anyhow::Result<()> + Send + Sync + Clone + 'static,
    ) -> anyhow::Result<()> {
        loop {
            self.check_alive()?;
            let attempt = probe.clone();
            match netns::run_in(self.client_ns(), attempt) {
                Ok(()) => return Ok(()),
                Err(err) if Instant::now() >= deadline => {
                    return Err(err).with_context(|| format!("{name} does not serve files"));
                }
                Err(_) => thread::sleep(Duration::from_millis(200)),
            }
        }
    }
}

/// A server's address in the lab.
pub fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([10, 66, 0, 1], port))
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    fs::write(path, text).with_context(|| format!("failed to write {}", path.display()))
}

/// `pxe-agent run` with the TFTP root and the artifacts, one host (the
/// client's address, so downloads are recorded as boot progress the way a
/// booting machine's are).
fn start_agent(lab: &Lab, bin: &Path, files: &Files, dir: &Path) -> anyhow::Result<Server> {
    let state = dir.join("agent-state");
    fs::create_dir_all(&state).with_context(|| format!("failed to create {}", state.display()))?;
    let inventory = dir.join("inventory.yaml");
    write(
        &inventory,
        &format!(
            "subnets:\n  - cidr: 10.66.0.0/16\n    router: {SERVER_IP}\n    lease_time: 3600\n\
             profiles:\n  - name: pxe\n    boot:\n      bios: undionly.kpxe\n      uefi: ipxe.efi\n\
             hosts:\n  - mac: \"52:54:00:00:00:02\"\n    ip: {CLIENT_IP}\n    profile: pxe\n"
        ),
    )?;
    let mut cmd = lab.cmd_in(lab.server_ns(), bin);
    cmd.args([
        "run",
        "--interface",
        lab.server_if(),
        "--xdp-mode",
        "native",
    ])
    .args(["--metrics-addr", METRICS_ADDR])
    .arg("--http-addr")
    .arg(addr(AGENT_HTTP).to_string())
    .arg("--inventory")
    .arg(&inventory)
    .arg("--state-dir")
    .arg(&state)
    .arg("--boot-root")
    .arg(&files.tftp_root)
    .arg("--artifacts")
    .arg(files.artifacts());
    Server::spawn("pxe-agent", cmd, dir.join("pxe-agent.log"))
}

/// tftpd-hpa in the foreground on its own port, chrooted to the TFTP root.
fn start_tftpd(lab: &Lab, files: &Files, dir: &Path) -> anyhow::Result<Server> {
    let mut cmd = lab.cmd_in(lab.server_ns(), TFTPD);
    cmd.args(["-L", "-4", "-u", "nobody", "-a"])
        .arg(format!("{SERVER_IP}:{TFTPD_PORT}"))
        .arg("-s")
        .arg(&files.tftp_root);
    Server::spawn("tftpd-hpa", cmd, dir.join("tftpd-hpa.log"))
}

/// nginx with a configuration of its own: the settings a tuned static file
/// server uses (sendfile, tcp_nopush, no access log), everything it writes
/// kept in the scratch directory.
fn start_nginx(lab: &Lab, files: &Files, dir: &Path) -> anyhow::Result<Server> {
    let prefix = dir.join("nginx");
    fs::create_dir_all(&prefix)
        .with_context(|| format!("failed to create {}", prefix.display()))?;
    let conf = prefix.join("nginx.conf");
    let p = prefix.display();
    write(
        &conf,
        &format!(
            "worker_processes auto;\n\
             daemon off;\n\
             pid {p}/nginx.pid;\n\
             error_log {p}/error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n\
             \x20   sendfile on;\n\
             \x20   tcp_nopush on;\n\
             \x20   access_log off;\n\
             \x20   default_type application/octet-stream;\n\
             \x20   client_body_temp_path {p}/client_body;\n\
             \x20   proxy_temp_path {p}/proxy;\n\
             \x20   fastcgi_temp_path {p}/fastcgi;\n\
             \x20   uwsgi_temp_path {p}/uwsgi;\n\
             \x20   scgi_temp_path {p}/scgi;\n\
             \x20   server {{\n\
             \x20       listen {SERVER_IP}:{NGINX_PORT};\n\
             \x20       root {www};\n\
             \x20   }}\n\
             }}\n",
            www = files.www.display()
        ),
    )?;
    let mut cmd = lab.cmd_in(lab.server_ns(), NGINX);
    cmd.arg("-e")
        .arg(prefix.join("error.log"))
        .arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(&conf);
    Server::spawn("nginx", cmd, dir.join("nginx.log"))
}

/// CPU time (user + system, clock ticks) of `pid` and its children: live
/// children (nginx's workers) and reaped ones (`cutime`, `cstime`).
pub fn tree_cpu_ticks(pid: u32) -> u64 {
    let mut total = stat_fields(&format!("/proc/{pid}/stat"))
        .map_or(0, |f| f.utime + f.stime + f.cutime + f.cstime);
    let Ok(entries) = fs::read_dir("/proc") else {
        return total;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(child) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(f) = stat_fields(&format!("/proc/{child}/stat")).filter(|f| f.ppid == pid) {
            total += f.utime + f.stime + f.cutime + f.cstime;
        }
    }
    total
}

/// CPU time (clock ticks) of this process: the benchmark's own client
/// threads, including those that have exited.
pub fn own_cpu_ticks() -> u64 {
    stat_fields("/proc/self/stat").map_or(0, |f| f.utime + f.stime)
}

struct StatFields {
    ppid: u32,
    utime: u64,
    stime: u64,
    cutime: u64,
    cstime: u64,
}

fn stat_fields(path: &str) -> Option<StatFields> {
    let text = fs::read_to_string(path).ok()?;
    // The command name (field 2) may hold spaces; fields after it are plain.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state).
    let get = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(StatFields {
        ppid: u32::try_from(get(4)?).ok()?,
        utime: get(14)?,
        stime: get(15)?,
        cutime: get(16)?,
        cstime: get(17)?,
    })
}

/// Idle and iowait time of all CPUs together, in clock ticks
/// (`/proc/stat`). The kernel measures these two, whereas it samples the
/// busy fields on ticks, so busy time is best taken as CPUs × wall time
/// minus this.
pub fn machine_idle_ticks() -> u64 {
    let Ok(text) = fs::read_to_string("/proc/stat") else {
        return 0;
    };
    let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
        return 0;
    };
    line.split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse::<u64>().ok())
        .skip(3)
        .take(2)
        .sum()
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// The CPUs the calling thread may run on (`sched_getaffinity`); CPU 0
/// alone if that fails.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is a plain bit set; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the set is writable and its size is passed along.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return vec![0];
    }
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: CPU_ISSET only reads inside `set` (it checks the bound).
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect();
    if cpus.is_empty() { vec![0] } else { cpus }
}

/// Restricts thread `tid` (0: the calling thread) to `cpus`.
pub fn set_affinity(tid: u32, cpus: &[usize]) -> anyhow::Result<()> {
    // SAFETY: cpu_set_t is a plain bit set; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        // SAFETY: CPU_SET only writes inside `set` (it checks the bound).
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    let tid = libc::pid_t::try_from(tid).context("thread id out of range")?;
    // SAFETY: the set is initialized and its size is passed along.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) };
    if rc != 0 {
        bail!(
            "sched_setaffinity({tid}) failed: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Restricts every thread of `pid` and of its children (nginx's workers)
/// to `cpus`; threads and processes they start later inherit it.
pub fn pin_tree(pid: u32, cpus: &[usize]) -> anyhow::Result<()> {
    let mut pids = vec![pid];
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(child) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if stat_fields(&format!("/proc/{child}/stat")).is_some_and(|f| f.ppid == pid) {
                pids.push(child);
            }
        }
    }
    for p in pids {
        let tasks = fs::read_dir(format!("/proc/{p}/task"))
            .with_context(|| format!("failed to list the threads of {p}"))?;
        for task in tasks.flatten() {
            if let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) {
                // A thread may exit between the listing and the call.
                if let Err(err) = set_affinity(tid, cpus)
                    && Path::new(&format!("/proc/{p}/task/{tid}")).exists()
                {
                    return Err(err);
                }
            }
        }
    }
    Ok(())
}

//! The three stacks under test, serving the same reservations and the same
//! files: pxe-agent alone, Kea with tftpd-hpa and nginx, dnsmasq (DHCP and
//! TFTP) with nginx. Owns their configuration and their processes; the
//! network belongs to [`super::lab`].

use std::{
    fmt::Write as _,
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use xtask::ChildGuard;

use super::lab::{RELAY_IP, SERVER_IP, StormLab};

/// HTTP port of every stack (the agent's default boot HTTP port; nginx's).
pub const HTTP_PORT: u16 = 8080;
/// The agent's metrics endpoint, inside the server namespace.
pub const METRICS_ADDR: &str = "127.0.0.1:9464";
/// Machines the address plan holds (10.66.0.2 to 10.67.255.254).
pub const MAX_MACHINES: usize = 131_069;
/// How long a stack may take to answer its readiness probe.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const TFTPD: &str = "/usr/sbin/in.tftpd";
const NGINX: &str = "/usr/sbin/nginx";

/// Boot file names, by firmware.
pub const BIOS_FILE: &str = "undionly.kpxe";
pub const UEFI_FILE: &str = "ipxe.efi";
pub const ARM64_FILE: &str = "ipxe-arm64.efi";

/// One stack under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Stack {
    #[value(name = "pxe-agent")]
    PxeAgent,
    Kea,
    Dnsmasq,
}

impl Stack {
    /// Its result directory name.
    pub fn name(self) -> &'static str {
        match self {
            Stack::PxeAgent => "pxe-agent",
            Stack::Kea => "kea",
            Stack::Dnsmasq => "dnsmasq",
        }
    }

    /// Its name in the report.
    pub fn label(self) -> &'static str {
        match self {
            Stack::PxeAgent => "pxe-agent",
            Stack::Kea => "Kea + tftpd-hpa + nginx",
            Stack::Dnsmasq => "dnsmasq + nginx",
        }
    }
}

/// The MAC of machine `i`: `02:57:` and `i` in 32 bits, big-endian.
pub fn machine_mac(i: usize) -> String {
    let [a, b, c, d] = u32::try_from(i).unwrap_or(u32::MAX).to_be_bytes();
    format!("02:57:{a:02x}:{b:02x}:{c:02x}:{d:02x}")
}

/// The reserved address of machine `i`: 10.66.0.2 on.
pub fn machine_ip(i: usize) -> Ipv4Addr {
    let base = u32::from(Ipv4Addr::new(10, 66, 0, 2));
    Ipv4Addr::from(base + u32::try_from(i).unwrap_or(u32::MAX))
}

/// Sizes of the synthetic files every stack serves.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub bootfile_kib: usize,
    pub kernel_kib: usize,
    pub initrd_kib: usize,
}

/// The files every stack serves: boot files (TFTP and HTTP root), kernel
/// and initrd under `artifacts/`, and for the peer stacks the static iPXE
/// script `boot.ipxe`.
pub struct Files {
    /// Boot files; also nginx's root (with `artifacts/` and `boot.ipxe`).
    pub root: PathBuf,
    /// Kernel and initrd, the agent's `--artifacts`.
    pub artifacts: PathBuf,
}

impl Files {
    /// Writes the files into `dir` (synthetic bytes, the same for every stack).
    pub fn write(dir: &Path, sizes: Sizes) -> anyhow::Result<Files> {
        let root = dir.join("root");
        let artifacts = root.join("artifacts");
        fs::create_dir_all(&artifacts)
            .with_context(|| format!("failed to create {}", artifacts.display()))?;
        for name in [BIOS_FILE, UEFI_FILE, ARM64_FILE] {
            write(&root.join(name), &synthetic(sizes.bootfile_kib))?;
        }
        write(&artifacts.join("vmlinuz"), &synthetic(sizes.kernel_kib))?;
        write(&artifacts.join("initrd.img"), &synthetic(sizes.initrd_kib))?;
        write(&root.join("boot.ipxe"), &static_script())?;
        // tftpd-hpa runs as nobody.
        for entry in [&root, &artifacts] {
            Command::new("chmod")
                .arg("-R")
                .arg("a+rX")
                .arg(entry)
                .status()
                .ok();
        }
        Ok(Files { root, artifacts })
    }
}

/// `kib` KiB of bytes that do not compress away.
fn synthetic(kib: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..kib * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x.to_le_bytes()[0]
        })
        .collect()
}

/// The peer stacks' iPXE script: the same kernel and initrd the agent's
/// default script names, and a phone-home nginx answers with 204.
fn static_script() -> Vec<u8> {
    format!(
        "#!ipxe\nkernel http://{SERVER_IP}:{HTTP_PORT}/artifacts/vmlinuz console=ttyS0\n\
         initrd http://{SERVER_IP}:{HTTP_PORT}/artifacts/initrd.img\nboot\n"
    )
    .into_bytes()
}

/// The agent's inventory: the relayed machine subnet, one profile with
/// every boot class, kernel and initrd, the default iPXE script, and one
/// host per machine.
pub fn agent_inventory(machines: usize) -> String {
    let mut yaml = format!(
        "subnets:\n  - cidr: 10.66.0.0/15\n    router: {RELAY_IP}\n    lease_time: 3600\n\
         profiles:\n  - name: storm\n    boot:\n      bios: {BIOS_FILE}\n      uefi: {UEFI_FILE}\n      \
         uefi_arm64: {ARM64_FILE}\n      http: \"http://{{server}}:{HTTP_PORT}/{UEFI_FILE}\"\n    \
         kernel: \"http://{{server}}:{HTTP_PORT}/artifacts/vmlinuz\"\n    \
         initrd: [\"http://{{server}}:{HTTP_PORT}/artifacts/initrd.img\"]\n    \
         cmdline: \"console=ttyS0\"\nhosts:\n"
    );
    yaml.reserve(machines * 90);
    for i in 0..machines {
        let _ = writeln!(
            yaml,
            "  - {{mac: \"{}\", ip: {}, hostname: m{i}, profile: storm}}",
            machine_mac(i),
            machine_ip(i)
        );
    }
    yaml
}

/// The Kea test that matches iPXE's user class (option 77).
const KEA_IPXE_TEST: &str = "substring(option[77].hex,0,4) == 'iPXE'";

/// kea-dhcp4 for the relayed subnet: UDP sockets (relayed requests arrive
/// unicast), in-memory leases, one reservation per machine, and classes in
/// the order Kea takes the first boot file from: iPXE → the script, HTTP
/// boot → the boot file's URL, ARM64 and x64 UEFI → their TFTP files; the
/// subnet's default is the BIOS file.
pub fn kea_config(machines: usize, iface: &str, log: &Path) -> String {
    let reservations = (0..machines)
        .map(|i| {
            format!(
                "{{\"hw-address\":\"{}\",\"ip-address\":\"{}\"}}",
                machine_mac(i),
                machine_ip(i)
            )
        })
        .collect::<Vec<_>>()
        .join(",\n");
    let http = format!("http://{SERVER_IP}:{HTTP_PORT}");
    format!(
        r#"{{"Dhcp4": {{
  "interfaces-config": {{"interfaces": ["{iface}"], "dhcp-socket-type": "udp"}},
  "lease-database": {{"type": "memfile", "persist": false, "lfc-interval": 0}},
  "valid-lifetime": 3600,
  "client-classes": [
    {{"name": "ipxe", "test": "{KEA_IPXE_TEST}", "boot-file-name": "{http}/boot.ipxe"}},
    {{"name": "http", "test": "substring(option[60].hex,0,10) == 'HTTPClient'",
      "boot-file-name": "{http}/{UEFI_FILE}",
      "option-data": [{{"name": "vendor-class-identifier", "data": "HTTPClient"}}]}},
    {{"name": "arm64", "test": "option[93].hex == 0x000b", "boot-file-name": "{ARM64_FILE}"}},
    {{"name": "uefi", "test": "option[93].hex == 0x0007", "boot-file-name": "{UEFI_FILE}"}}
  ],
  "subnet4": [{{
    "id": 1,
    "subnet": "10.66.0.0/15",
    "option-data": [{{"name": "routers", "data": "{RELAY_IP}"}}],
    "next-server": "{SERVER_IP}",
    "boot-file-name": "{BIOS_FILE}",
    "reservations-in-subnet": true,
    "reservations-out-of-pool": true,
    "reservations": [
{reservations}
    ]
  }}],
  "loggers": [{{
    "name": "kea-dhcp4",
    "output_options": [{{"output": "{log}"}}],
    "severity": "WARN"
  }}]
}}}}
"#,
        log = log.display()
    )
}

/// dnsmasq's `--dhcp-hostsfile`: one `mac,ip` a line.
pub fn dnsmasq_hosts(machines: usize) -> String {
    (0..machines).fold(String::new(), |mut out, i| {
        let _ = writeln!(out, "{},{}", machine_mac(i), machine_ip(i));
        out
    })
}

/// dnsmasq's arguments beyond the files: static leases for the relayed
/// subnet, tags by architecture (option 93) and for iPXE (user class), a
/// boot file for each, and its own TFTP server on `tftp_root`.
pub fn dnsmasq_args(machines: usize, iface: &str, dir: &Path, tftp_root: &Path) -> Vec<String> {
    let http = format!("http://{SERVER_IP}:{HTTP_PORT}");
    vec![
        "-k".into(),
        "--conf-file=/dev/null".into(),
        "--port=0".into(),
        format!("--interface={iface}"),
        "--bind-interfaces".into(),
        "--dhcp-range=10.66.0.0,static,255.254.0.0,1h".into(),
        format!("--dhcp-hostsfile={}", dir.join("dnsmasq.hosts").display()),
        format!("--dhcp-lease-max={}", machines * 2),
        "--leasefile-ro".into(),
        format!("--dhcp-option=option:router,{RELAY_IP}"),
        "--dhcp-match=set:efi64,option:client-arch,7".into(),
        "--dhcp-match=set:arm64,option:client-arch,11".into(),
        "--dhcp-match=set:http,option:client-arch,16".into(),
        "--dhcp-userclass=set:ipxe,iPXE".into(),
        format!("--dhcp-boot=tag:ipxe,{http}/boot.ipxe"),
        format!("--dhcp-boot=tag:!ipxe,tag:http,{http}/{UEFI_FILE}"),
        "--dhcp-option-force=tag:http,60,HTTPClient".into(),
        format!("--dhcp-boot=tag:!ipxe,tag:arm64,{ARM64_FILE},,{SERVER_IP}"),
        format!("--dhcp-boot=tag:!ipxe,tag:efi64,{UEFI_FILE},,{SERVER_IP}"),
        format!("--dhcp-boot=tag:!ipxe,tag:!http,tag:!arm64,tag:!efi64,{BIOS_FILE},,{SERVER_IP}"),
        "--enable-tftp".into(),
        format!("--tftp-root={}", tftp_root.display()),
        "--tftp-max=65535".into(),
        format!("--pid-file={}", dir.join("dnsmasq.pid").display()),
        "--no-ping".into(),
        "--dhcp-authoritative".into(),
        "--quiet-dhcp".into(),
        format!(
            "--log-facility={}",
            dir.join("dnsmasq-daemon.log").display()
        ),
    ]
}

/// nginx on [`HTTP_PORT`]: the files, and the phone-home answered with 204.
fn nginx_config(prefix: &Path, root: &Path) -> String {
    let p = prefix.display();
    format!(
        "worker_processes auto;\ndaemon off;\npid {p}/nginx.pid;\nerror_log {p}/error.log warn;\n\
         worker_rlimit_nofile 200000;\nevents {{ worker_connections 65535; }}\nhttp {{\n\
         \x20   sendfile on;\n    tcp_nopush on;\n    access_log off;\n\
         \x20   default_type application/octet-stream;\n\
         \x20   client_body_temp_path {p}/client_body;\n    proxy_temp_path {p}/proxy;\n\
         \x20   fastcgi_temp_path {p}/fastcgi;\n    uwsgi_temp_path {p}/uwsgi;\n\
         \x20   scgi_temp_path {p}/scgi;\n\
         \x20   server {{\n        listen {SERVER_IP}:{HTTP_PORT} backlog=65535;\n\
         \x20       root {root};\n        location /api/ {{ return 204; }}\n    }}\n}}\n",
        root = root.display()
    )
}

/// A started stack: its processes, stopped by PID on drop.
pub struct Running {
    pub stack: Stack,
    procs: Vec<(&'static str, ChildGuard, PathBuf)>,
}

impl Running {
    /// The PIDs of the stack's processes (their children count through
    /// the sampler's process-tree walk).
    pub fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(|(_, guard, _)| guard.id()).collect()
    }

    /// Fails naming the first process that has exited, with its log's end.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for (name, guard, log) in &mut self.procs {
            if let Some(status) = guard.try_wait()? {
                bail!("{name} exited ({status}): {}", log_tail(log));
            }
        }
        Ok(())
    }

    /// Stops every process by PID.
    pub fn stop(self) {
        for (name, guard, _) in self.procs {
            if let Err(err) = guard.stop() {
                eprintln!("warning: stopping {name}: {err:#}");
            }
        }
    }
}

/// Starts `stack` in the lab's server namespace with its configuration in
/// `dir`, and waits until it answers.
pub fn start(
    stack: Stack,
    net: &StormLab,
    agent_bin: &Path,
    files: &Files,
    machines: usize,
    dir: &Path,
) -> anyhow::Result<Running> {
    ensure!(
        machines <= MAX_MACHINES,
        "{machines} machines exceed the address plan ({MAX_MACHINES})"
    );
    fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    raise_nofile()?;
    let lab = &net.lab;
    let iface = lab.server_if();
    let mut running = Running {
        stack,
        procs: Vec::new(),
    };
    match stack {
        Stack::PxeAgent => {
            let inventory = dir.join("inventory.yaml");
            write(&inventory, agent_inventory(machines).as_bytes())?;
            let mut cmd = lab.cmd_in(lab.server_ns(), agent_bin);
            cmd.args(["run", "--interface", iface, "--xdp-mode", "native"])
                .args(["--metrics-addr", METRICS_ADDR])
                .arg("--state-dir")
                .arg(dir.join("state"))
                .arg("--inventory")
                .arg(&inventory)
                .arg("--boot-root")
                .arg(&files.root)
                .arg("--artifacts")
                .arg(&files.artifacts)
                // Defaults changed: the slow path's per-MAC limit (10/s,
                // burst 20) and unknown-MAC limit (2000/s) are a storm
                // guard against misbehaving clients; here every machine is
                // known and follows firmware timers, so they would only
                // measure the guard, not the capacity (as in bench dhcp).
                .args([
                    "--rate-per-mac",
                    crate::bench::dhcp::server::SLOW_PATH_RATE_LIMIT,
                ])
                .args([
                    "--rate-unknown",
                    crate::bench::dhcp::server::SLOW_PATH_RATE_LIMIT,
                ])
                // The peers' bounds: nginx 65,535 connections, dnsmasq
                // --tftp-max=65535, tftpd-hpa forks without a bound. The
                // agent raises its open-files limit to hold them (past it,
                // requests would wait). With a bound of 2,048 transfers the
                // lab's lossy veth (full rings: SndbufErrors on both sides)
                // kept slots through retransmission timeouts and the queue
                // outgrew the machines' patience (4,180 of 10,000 booted).
                .args(["--http-max-connections", "65535"])
                .args(["--tftp-max-transfers", "65535"]);
            running.spawn("pxe-agent", cmd, dir)?;
            wait_ready(&mut running, || {
                probe(
                    net,
                    &[
                        "curl",
                        "-sf",
                        "-o",
                        "/dev/null",
                        &format!("http://{METRICS_ADDR}/healthz"),
                    ],
                )
                .map(drop)
            })?;
        }
        Stack::Kea => {
            let config = dir.join("kea-dhcp4.json");
            write(
                &config,
                kea_config(machines, iface, &dir.join("kea-dhcp4.log")).as_bytes(),
            )?;
            let mut kea = lab.cmd_in(lab.server_ns(), "kea-dhcp4");
            kea.env("KEA_PIDFILE_DIR", dir)
                .env("KEA_LOCKFILE_DIR", dir)
                .arg("-c")
                .arg(&config);
            running.spawn("kea-dhcp4", kea, dir)?;
            let mut tftpd = lab.cmd_in(lab.server_ns(), TFTPD);
            tftpd
                .args(["-L", "-4", "-u", "nobody", "-a"])
                .arg(format!("{SERVER_IP}:69"))
                .arg("-s")
                .arg(&files.root);
            running.spawn("tftpd-hpa", tftpd, dir)?;
            start_nginx(&mut running, net, files, dir)?;
            wait_ready(&mut running, || {
                probe(net, &["ss", "-Hlun", "sport = :67"]).and_then(|out| {
                    ensure!(!out.trim().is_empty(), "kea-dhcp4 not listening yet");
                    Ok(())
                })?;
                probe_http(net)
            })?;
        }
        Stack::Dnsmasq => {
            write(
                &dir.join("dnsmasq.hosts"),
                dnsmasq_hosts(machines).as_bytes(),
            )?;
            let mut cmd = lab.cmd_in(lab.server_ns(), "dnsmasq");
            cmd.args(dnsmasq_args(machines, iface, dir, &files.root));
            running.spawn("dnsmasq", cmd, dir)?;
            start_nginx(&mut running, net, files, dir)?;
            wait_ready(&mut running, || {
                probe(net, &["ss", "-Hlun", "sport = :67"]).and_then(|out| {
                    ensure!(!out.trim().is_empty(), "dnsmasq not listening yet");
                    Ok(())
                })?;
                probe_http(net)
            })?;
        }
    }
    Ok(running)
}

impl Running {
    fn spawn(&mut self, name: &'static str, mut cmd: Command, dir: &Path) -> anyhow::Result<()> {
        let log = dir.join(format!("{name}.log"));
        let out = fs::File::create(&log)
            .with_context(|| format!("failed to create {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone().context("failed to clone the log handle")?)
            .stderr(out);
        let guard =
            ChildGuard::spawn(&mut cmd).with_context(|| format!("failed to start {name}"))?;
        self.procs.push((name, guard, log));
        Ok(())
    }
}

fn start_nginx(
    running: &mut Running,
    net: &StormLab,
    files: &Files,
    dir: &Path,
) -> anyhow::Result<()> {
    let prefix = dir.join("nginx");
    fs::create_dir_all(&prefix)
        .with_context(|| format!("failed to create {}", prefix.display()))?;
    let conf = prefix.join("nginx.conf");
    write(&conf, nginx_config(&prefix, &files.root).as_bytes())?;
    let mut cmd = net.lab.cmd_in(net.lab.server_ns(), NGINX);
    cmd.arg("-e")
        .arg(prefix.join("error.log"))
        .arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(&conf);
    running.spawn("nginx", cmd, dir)
}

fn probe(net: &StormLab, args: &[&str]) -> anyhow::Result<String> {
    net.lab.run_in(net.lab.server_ns(), args)
}

fn probe_http(net: &StormLab) -> anyhow::Result<()> {
    let url = format!("http://{SERVER_IP}:{HTTP_PORT}/boot.ipxe");
    probe(net, &["curl", "-sf", "-o", "/dev/null", &url]).map(drop)
}

/// Polls `ready` until it succeeds, failing early when a process exits.
fn wait_ready(
    running: &mut Running,
    mut ready: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        running.check_alive()?;
        match ready() {
            Ok(()) => return Ok(()),
            Err(err) if started.elapsed() > READY_TIMEOUT => {
                return Err(err.context(format!(
                    "{} not ready after {} s",
                    running.stack.name(),
                    READY_TIMEOUT.as_secs()
                )));
            }
            Err(_) => thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Open files the stacks are started with (where `fs.nr_open` allows).
const STACK_NOFILE: libc::rlim_t = 1 << 20;

/// Raises this process's open-file limit, which the stacks inherit: each
/// TFTP transfer and HTTP connection holds a socket, and tens of thousands
/// run at once (the usual soft limit is 1024). The hard limit goes to
/// [`STACK_NOFILE`] where the process may raise it (CAP_SYS_RESOURCE), as a
/// `LimitNOFILE=` set for a storm-sized fleet would; the soft limit to the
/// hard one.
fn raise_nofile() -> anyhow::Result<()> {
    let ceiling = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<libc::rlim_t>().ok())
        .unwrap_or(0)
        .min(STACK_NOFILE);
    let mut limit = nofile()?;
    if ceiling > limit.rlim_max && set_nofile(ceiling, ceiling).is_err() {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            println!(
                "storm: the open-files hard limit stays {} (raising it needs CAP_SYS_RESOURCE); \
                 the agent fits its bounds to it",
                limit.rlim_max
            );
        });
    }
    limit = nofile()?;
    set_nofile(limit.rlim_max, limit.rlim_max)
        .with_context(|| format!("failed to raise RLIMIT_NOFILE to {}", limit.rlim_max))
}

/// The open-files limit in force, the stacks' after [`raise_nofile`].
pub fn nofile_in_force() -> Option<u64> {
    nofile().ok().map(|l| l.rlim_cur)
}

fn nofile() -> anyhow::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit to write.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        anyhow::bail!(
            "getrlimit(RLIMIT_NOFILE): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(limit)
}

fn set_nofile(soft: libc::rlim_t, hard: libc::rlim_t) -> anyhow::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `limit` is a valid rlimit to read.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

fn log_tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(3).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

fn write(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    fs::write(path, bytes).with_context(|| format!("failed to write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_follow_the_plan() {
        assert_eq!(machine_mac(0), "02:57:00:00:00:00");
        assert_eq!(machine_mac(65_537), "02:57:00:01:00:01");
        assert_eq!(machine_ip(0), Ipv4Addr::new(10, 66, 0, 2));
        assert_eq!(
            machine_ip(MAX_MACHINES - 1),
            Ipv4Addr::new(10, 67, 255, 254)
        );
    }

    #[test]
    fn kea_config_has_one_reservation_per_machine_and_the_classes() {
        let text = kea_config(1000, "pxsrv0", Path::new("/tmp/kea.log"));
        assert_eq!(text.matches("\"hw-address\"").count(), 1000);
        assert!(text.contains("\"ip-address\":\"10.66.3.233\""));
        for class in ["\"ipxe\"", "\"http\"", "\"arm64\"", "\"uefi\""] {
            assert!(text.contains(class), "{class}");
        }
        // Balanced braces and brackets: the JSON is at least well nested.
        assert_eq!(text.matches('{').count(), text.matches('}').count());
        assert_eq!(text.matches('[').count(), text.matches(']').count());
    }

    #[test]
    fn dnsmasq_tags_every_class_and_ipxe() {
        let args = dnsmasq_args(10, "pxsrv0", Path::new("/d"), Path::new("/r")).join(" ");
        for tag in [
            "set:efi64",
            "set:arm64",
            "set:http",
            "set:ipxe,iPXE",
            "--enable-tftp",
        ] {
            assert!(args.contains(tag), "{tag}");
        }
        assert_eq!(dnsmasq_hosts(3).lines().count(), 3);
    }

    #[test]
    fn agent_inventory_lists_every_machine() {
        let yaml = agent_inventory(5);
        assert_eq!(yaml.matches("profile: storm").count(), 5);
        assert!(yaml.contains("cidr: 10.66.0.0/15"));
    }
}

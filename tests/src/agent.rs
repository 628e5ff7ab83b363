//! A real `pxe-agent` process serving a lab: the agent on the server end of a
//! veth pair, the pass-through program on the client end, and readers for its
//! counters and for the server namespace's UDP statistics.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
    thread,
    time::{Duration, Instant},
};

use xtask::{ChildGuard, Lab};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// The agent's metrics listener (`/metrics`, `/healthz`) in its namespace:
/// the default.
pub const METRICS_ADDR: &str = "127.0.0.1:9464";
/// The agent's JSON API in its namespace: the default.
pub const API_ADDR: &str = "127.0.0.1:9465";

/// The listener that serves `path`: the API for `/api/...`, else the
/// metrics listener.
pub fn listener_for(path: &str) -> &'static str {
    if path.starts_with("/api/") {
        API_ADDR
    } else {
        METRICS_ADDR
    }
}

/// The agent binary `cargo xtask test` builds before the privileged suite.
pub fn agent_bin() -> PathBuf {
    let bin = std::env::var_os("PXE_AGENT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| xtask::target_dir().join("debug/pxe-agent"));
    assert!(
        bin.exists(),
        "{} missing: build it with `cargo build -p pxe-agent` (`cargo xtask test` does)",
        bin.display()
    );
    bin
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "pxe-{name}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// How the agent process is started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Privileges {
    /// Root with every capability, as the suite runs.
    #[default]
    Root,
    /// As the DaemonSet runs it: root, `no_new_privs`, and only the
    /// capabilities its container adds ([`daemonset_capabilities`]), in the
    /// bounding, permitted and effective sets; none inheritable or ambient.
    DaemonSet,
}

/// The capabilities `deploy/base/daemonset.yaml` adds to the agent's
/// container (`BPF`, `NET_ADMIN`, ...), read from the manifest itself.
pub fn daemonset_capabilities() -> Vec<String> {
    let path = xtask::workspace_root().join("deploy/base/daemonset.yaml");
    let text = fs::read_to_string(&path).expect("read the DaemonSet manifest");
    let doc: serde_norway::Value = serde_norway::from_str(&text).expect("DaemonSet YAML");
    let containers = doc["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .expect("containers");
    let agent = containers
        .iter()
        .find(|c| c["name"].as_str() == Some("pxe-agent"))
        .expect("the pxe-agent container");
    agent["securityContext"]["capabilities"]["add"]
        .as_sequence()
        .expect("capabilities added")
        .iter()
        .map(|c| c.as_str().expect("a capability name").to_string())
        .collect()
}

/// `setpriv` and its arguments, to run the next program as
/// [`Privileges::DaemonSet`] (it execs the program in its own place).
pub fn daemonset_wrapper() -> Vec<String> {
    let mut args = vec!["setpriv".to_string()];
    args.extend(daemonset_setpriv());
    args
}

/// `setpriv` arguments that run the next program as [`Privileges::DaemonSet`]:
/// root keeps in its permitted and effective sets exactly the bounding set
/// when it execs, so `--bounding-set` alone decides them.
fn daemonset_setpriv() -> Vec<String> {
    let caps: Vec<String> = daemonset_capabilities()
        .iter()
        .map(|c| format!("+{}", c.to_lowercase()))
        .collect();
    vec![
        "--no-new-privs".into(),
        "--inh-caps".into(),
        "-all".into(),
        "--ambient-caps".into(),
        "-all".into(),
        "--bounding-set".into(),
        format!("-all,{}", caps.join(",")),
    ]
}

/// The capability numbers of linux/capability.h, for the names the
/// DaemonSet uses.
pub fn capability_bit(name: &str) -> u32 {
    match name {
        "NET_BIND_SERVICE" => 10,
        "NET_ADMIN" => 12,
        "NET_RAW" => 13,
        "SYS_ADMIN" => 21,
        "PERFMON" => 38,
        "BPF" => 39,
        other => panic!("capability {other} has no number here"),
    }
}

/// Asserts that process `pid` runs as [`Privileges::DaemonSet`]: exactly the
/// DaemonSet's capabilities effective, permitted and bounding, none
/// inheritable or ambient, and `no_new_privs`.
pub fn assert_daemonset_privileges(pid: u32) {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("read the status");
    let field = |name: &str| {
        let value = status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"));
        // Capability sets are hex; NoNewPrivs is 0 or 1, the same in hex.
        u64::from_str_radix(value.trim(), 16)
            .unwrap_or_else(|_| panic!("{name} of the agent {pid}: {value}"))
    };
    let want = daemonset_capabilities()
        .iter()
        .fold(0u64, |set, c| set | 1 << capability_bit(c));
    for (name, expected) in [
        ("CapEff", want),
        ("CapPrm", want),
        ("CapBnd", want),
        ("CapInh", 0),
        ("CapAmb", 0),
        ("NoNewPrivs", 1),
    ] {
        assert_eq!(
            field(name),
            expected,
            "{name} of the agent {pid}:\n{status}"
        );
    }
}

/// Field order matters: processes stop before their namespaces go.
pub struct Served {
    pub agent: ChildGuard,
    pub peer: ChildGuard,
    /// The fake Kubernetes API server an agent started by
    /// [`Served::start_kube`] reads its inventory from.
    pub api: Option<crate::kube_api::FakeApi>,
    pub lab: Lab,
    pub dir: Scratch,
    pub inventory: PathBuf,
    /// How the agent is started, and started again by [`Served::restart`].
    pub privileges: Privileges,
    /// The agent's `--api-token-file`, which [`Served::cli`] passes on.
    pub token_file: Option<PathBuf>,
}

/// The `--api-token-file` among an agent's arguments.
fn token_file_of(args: &[&str]) -> Option<PathBuf> {
    args.windows(2)
        .find(|w| w[0] == "--api-token-file")
        .map(|w| PathBuf::from(w[1]))
}

impl Served {
    /// Starts the agent on a fresh lab with `inventory` (YAML text) and waits
    /// until it answers on its metrics endpoint.
    pub fn start(name: &str, inventory: &str) -> Served {
        Served::start_with(name, inventory, &[])
    }

    /// Like [`Served::start`], waiting up to `ready_within` for the agent
    /// to serve: for inventories that take it longer than usual to load.
    pub fn start_within(name: &str, inventory: &str, ready_within: Duration) -> Served {
        let served = Served::launch(name, inventory, &[], None, |_| {}, None);
        served.wait_ready_within(ready_within);
        served
    }

    fn wait_ready(&self) {
        self.wait_ready_within(Duration::from_secs(20));
    }

    fn wait_ready_within(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.try_stats().is_some() && self.peer_attached() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "agent not ready after {} s; log:\n{}",
            within.as_secs(),
            self.log()
        );
    }

    fn peer_attached(&self) -> bool {
        self.lab
            .run_in(
                self.lab.client_ns(),
                &["ip", "link", "show", self.lab.client_if()],
            )
            .is_ok_and(|out| out.contains("xdp"))
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path("agent.log")).unwrap_or_default()
    }

    fn try_stats(&self) -> Option<BTreeMap<String, u64>> {
        let out = self
            .lab
            .cmd_in(self.lab.server_ns(), agent_bin())
            .arg("stats")
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        Some(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| {
                    let mut parts = l.split_whitespace();
                    Some((parts.next()?.to_string(), parts.next()?.parse().ok()?))
                })
                .collect(),
        )
    }

    /// The agent's metrics, by sample name (`pxe_xdp_packets_total{outcome="tx_ack"}`).
    pub fn stats(&self) -> BTreeMap<String, u64> {
        self.try_stats()
            .unwrap_or_else(|| panic!("`pxe-agent stats` failed; log:\n{}", self.log()))
    }

    /// One fast-path counter by its name (`tx_offer`).
    pub fn counter(&self, name: &str) -> u64 {
        self.stats()[&format!("pxe_xdp_packets_total{{outcome=\"{name}\"}}")]
    }

    /// UDP datagrams the server namespace's kernel stack received (delivered
    /// or refused for want of a socket): none of the fast path's traffic.
    pub fn kernel_udp_datagrams(&self) -> u64 {
        let snmp = self
            .lab
            .run_in(self.lab.server_ns(), &["cat", "/proc/net/snmp"])
            .expect("read snmp");
        let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
        let names: Vec<&str> = udp.next().expect("Udp header").split_whitespace().collect();
        let values: Vec<u64> = udp
            .next()
            .expect("Udp values")
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        let get = |n: &str| values[names.iter().position(|x| *x == n).expect("snmp field") - 1];
        get("InDatagrams") + get("NoPorts") + get("InErrors")
    }

    /// Replaces the inventory file atomically, as an operator's tooling or a
    /// ConfigMap update does.
    pub fn replace_inventory(&self, yaml: &str) {
        let tmp = self.dir.path("inventory.yaml.new");
        fs::write(&tmp, yaml).expect("write inventory");
        fs::rename(&tmp, &self.inventory).expect("replace inventory");
    }

    /// Gives the client end an address (`10.66.1.10/16`), for clients that
    /// need one (curl, tftp).
    pub fn add_client_address(&self, cidr: &str) {
        self.lab
            .run_in(
                self.lab.client_ns(),
                &["ip", "addr", "add", cidr, "dev", self.lab.client_if()],
            )
            .expect("client address");
    }

    /// The MAC address of the server end, where the agent serves.
    pub fn server_mac(&self) -> [u8; 6] {
        let text = self
            .lab
            .run_in(
                self.lab.server_ns(),
                &[
                    "cat",
                    &format!("/sys/class/net/{}/address", self.lab.server_if()),
                ],
            )
            .expect("read the server MAC");
        let mut mac = [0u8; 6];
        for (byte, part) in mac.iter_mut().zip(text.trim().split(':')) {
            *byte = u8::from_str_radix(part, 16).expect("hex MAC");
        }
        mac
    }

    pub fn client_cmd(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.lab.cmd_in(self.lab.client_ns(), program)
    }

    pub fn set_client_mac(&self, mac: &str) {
        self.lab.set_client_mac(mac).expect("set client MAC");
    }
}

/// Writes an executable shell script.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(name);
    fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write script");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod script");
    path
}

/// Spawns `pxe-agent run` on the lab's server end with the inventory at
/// `inventory`, the state directory `<dir>/state` and `extra` arguments,
/// appending its output to `<dir>/agent.log`; with `nofile`, under that
/// open-files limit (soft and hard, set by `prlimit`), and with
/// `privileges` (by `setpriv`): each execs the next in place of itself, so
/// the child's PID is the agent's.
fn spawn_agent(
    lab: &Lab,
    dir: &Scratch,
    inventory: &Path,
    extra: &[&str],
    nofile: Option<u64>,
    privileges: Privileges,
) -> ChildGuard {
    let log = fs::File::options()
        .create(true)
        .append(true)
        .open(dir.path("agent.log"))
        .expect("agent log");
    let mut wrappers: Vec<Vec<String>> = Vec::new();
    if let Some(n) = nofile {
        wrappers.push(vec!["prlimit".into(), format!("--nofile={n}")]);
    }
    if privileges == Privileges::DaemonSet {
        wrappers.push(daemonset_wrapper());
    }
    let mut cmd = match wrappers.concat().split_first() {
        Some((first, rest)) => {
            let mut cmd = lab.cmd_in(lab.server_ns(), first);
            cmd.args(rest).arg(agent_bin());
            cmd
        }
        None => lab.cmd_in(lab.server_ns(), agent_bin()),
    };
    // Native mode unless the test asks for another.
    let mode: &[&str] = if extra.contains(&"--xdp-mode") {
        &[]
    } else {
        &["--xdp-mode", "native"]
    };
    // The scratch directory's state directory unless the test gives one.
    let state = dir.path("state");
    let state: &[&std::ffi::OsStr] = if extra.contains(&"--state-dir") {
        &[]
    } else {
        &["--state-dir".as_ref(), state.as_os_str()]
    };
    ChildGuard::spawn(
        cmd.args(["run", "--interface", lab.server_if()])
            .args(mode)
            .arg("--inventory")
            .arg(inventory)
            .args(state)
            .args(extra)
            .stderr(log.try_clone().expect("log fd"))
            .stdout(log),
    )
    .expect("spawn agent")
}

impl Served {
    /// Like [`Served::start`], with `extra` arguments to `pxe-agent run`
    /// (`["--rate-unknown", "500"]`).
    pub fn start_with(name: &str, inventory: &str, extra: &[&str]) -> Served {
        Served::start_limited(name, inventory, extra, None)
    }

    /// Like [`Served::start_with`], the agent limited to `nofile` open files
    /// when given.
    pub fn start_limited(
        name: &str,
        inventory: &str,
        extra: &[&str],
        nofile: Option<u64>,
    ) -> Served {
        Served::start_prepared(name, inventory, extra, nofile, |_| {})
    }

    /// Like [`Served::start_with`], the agent started with `privileges`,
    /// and so again by [`Served::restart`].
    pub fn start_as(name: &str, inventory: &str, extra: &[&str], privileges: Privileges) -> Served {
        let served = Served::launch_as(name, inventory, extra, None, |_| {}, None, privileges);
        served.wait_ready();
        served
    }

    /// Like [`Served::start_as`], with `setup` run on the lab before the
    /// agent starts.
    pub fn start_as_prepared(
        name: &str,
        inventory: &str,
        extra: &[&str],
        privileges: Privileges,
        setup: impl FnOnce(&mut Lab),
    ) -> Served {
        let served = Served::launch_as(name, inventory, extra, None, setup, None, privileges);
        served.wait_ready();
        served
    }

    /// Starts the agent as [`Served::start_as`] does, for a start that must
    /// fail: its exit status and log, once it exited (within 20 s).
    pub fn start_refused(
        name: &str,
        inventory: &str,
        extra: &[&str],
        privileges: Privileges,
    ) -> (std::process::ExitStatus, String) {
        let mut served = Served::launch_as(name, inventory, extra, None, |_| {}, None, privileges);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = served.agent.try_wait().expect("poll agent") {
                return (status, served.log());
            }
            assert!(
                Instant::now() < deadline,
                "the agent did not exit:\n{}",
                served.log()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Like [`Served::start_limited`], with `setup` run on the lab before
    /// the agent starts (to add the interfaces `extra` names).
    pub fn start_prepared(
        name: &str,
        inventory: &str,
        extra: &[&str],
        nofile: Option<u64>,
        setup: impl FnOnce(&mut Lab),
    ) -> Served {
        let served = Served::launch(name, inventory, extra, nofile, setup, None);
        served.wait_ready();
        served
    }

    /// Like [`Served::start_prepared`] on a lab whose server end has
    /// `server_cidr` instead of the default.
    pub fn start_on(
        name: &str,
        server_cidr: &str,
        inventory: &str,
        extra: &[&str],
        setup: impl FnOnce(&mut Lab),
    ) -> Served {
        let served = Served::launch(name, inventory, extra, None, setup, Some(server_cidr));
        served.wait_ready();
        served
    }

    /// The lab, the agent and the peer program, not yet waited for.
    fn launch(
        name: &str,
        inventory: &str,
        extra: &[&str],
        nofile: Option<u64>,
        setup: impl FnOnce(&mut Lab),
        server_cidr: Option<&str>,
    ) -> Served {
        Served::launch_as(
            name,
            inventory,
            extra,
            nofile,
            setup,
            server_cidr,
            Privileges::Root,
        )
    }

    /// [`Served::launch`] with the agent started with `privileges`.
    fn launch_as(
        name: &str,
        inventory: &str,
        extra: &[&str],
        nofile: Option<u64>,
        setup: impl FnOnce(&mut Lab),
        server_cidr: Option<&str>,
        privileges: Privileges,
    ) -> Served {
        crate::fixture::assert_root();
        let cidr = server_cidr.unwrap_or(xtask::lab::DEFAULT_SERVER_CIDR);
        let mut lab = Lab::new_with(name, cidr).expect("lab");
        setup(&mut lab);
        let dir = Scratch::new(name);
        let path = dir.path("inventory.yaml");
        fs::write(&path, inventory).expect("write inventory");
        let agent = spawn_agent(&lab, &dir, &path, extra, nofile, privileges);
        let peer = ChildGuard::spawn(
            lab.cmd_in(lab.client_ns(), agent_bin())
                .args(["veth-peer", "--interface", lab.client_if()])
                .stderr(std::process::Stdio::null()),
        )
        .expect("spawn veth peer");
        Served {
            agent,
            peer,
            api: None,
            lab,
            dir,
            inventory: path,
            privileges,
            token_file: token_file_of(extra),
        }
    }

    /// Starts a fake Kubernetes API server on the loopback of the server
    /// namespace, lets `seed` create objects in it (namespace `ns`), then
    /// the agent with `--kube` (a kubeconfig in the scratch directory
    /// pointing at the fake) and `extra` arguments, as the DaemonSet runs
    /// it ([`Privileges::DaemonSet`], checked); waits until it serves.
    pub fn start_kube(
        name: &str,
        ns: &str,
        extra: &[&str],
        seed: impl FnOnce(&crate::kube_api::FakeApi),
    ) -> Served {
        Served::start_kube_prepared(name, ns, extra, |_| {}, seed)
    }

    /// [`Served::start_kube`] with `setup` run on the lab before the agent
    /// starts (an IPv6 address on the server end, say).
    pub fn start_kube_prepared(
        name: &str,
        ns: &str,
        extra: &[&str],
        setup: impl FnOnce(&mut Lab),
        seed: impl FnOnce(&crate::kube_api::FakeApi),
    ) -> Served {
        crate::fixture::assert_root();
        let mut lab = Lab::new(name).expect("lab");
        setup(&mut lab);
        let dir = Scratch::new(name);
        let api = crate::kube_api::FakeApi::start(&lab, lab.server_ns(), "127.0.0.1:0");
        seed(&api);
        let kubeconfig = dir.path("kubeconfig");
        api.write_kubeconfig(&kubeconfig, ns);
        let mut args = vec!["--kube", "--kube-namespace", ns, "--node-name", "node-a"];
        args.extend_from_slice(extra);
        let log = fs::File::options()
            .create(true)
            .append(true)
            .open(dir.path("agent.log"))
            .expect("agent log");
        let wrapper = daemonset_wrapper();
        let mut cmd = lab.cmd_in(lab.server_ns(), &wrapper[0]);
        cmd.args(&wrapper[1..])
            .arg(agent_bin())
            .args([
                "run",
                "--interface",
                lab.server_if(),
                "--xdp-mode",
                "native",
            ])
            .arg("--state-dir")
            .arg(dir.path("state"))
            .args(&args)
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info,pxe_agent=debug,kube=info")
            .stderr(log.try_clone().expect("log fd"))
            .stdout(log);
        let agent = ChildGuard::spawn(&mut cmd).expect("spawn agent");
        let peer = ChildGuard::spawn(
            lab.cmd_in(lab.client_ns(), agent_bin())
                .args(["veth-peer", "--interface", lab.client_if()])
                .stderr(std::process::Stdio::null()),
        )
        .expect("spawn veth peer");
        let inventory = dir.path("no-inventory");
        let served = Served {
            agent,
            peer,
            api: Some(api),
            lab,
            dir,
            inventory,
            privileges: Privileges::DaemonSet,
            token_file: token_file_of(&args),
        };
        served.wait_ready();
        assert_daemonset_privileges(served.agent_pid());
        served
    }

    /// The fake API server of [`Served::start_kube`].
    pub fn api(&self) -> &crate::kube_api::FakeApi {
        self.api.as_ref().expect("started with start_kube")
    }

    /// The agent's PID (`ip netns exec` runs it in place of itself).
    pub fn agent_pid(&self) -> u32 {
        self.agent.id()
    }

    /// Sends `signal` to the agent, by its PID, and waits until it exits.
    pub fn signal_agent(&mut self, signal: libc::c_int) -> std::process::ExitStatus {
        let pid = libc::pid_t::try_from(self.agent.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) on our own child, not yet reaped, so the PID is
        // still the agent's.
        unsafe { libc::kill(pid, signal) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.agent.try_wait().expect("poll agent") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "agent still running 10 s after signal {signal}; log:\n{}",
                self.log()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the agent again, after [`Served::signal_agent`] stopped it, on
    /// the same interface, inventory and state directory and with the same
    /// privileges, with `extra` arguments, and waits until it serves.
    pub fn restart(&mut self, extra: &[&str]) {
        assert!(
            self.agent.try_wait().expect("poll agent").is_some(),
            "restart: the previous agent is still running"
        );
        self.agent = spawn_agent(
            &self.lab,
            &self.dir,
            &self.inventory,
            extra,
            None,
            self.privileges,
        );
        self.wait_ready();
    }

    /// Runs a `pxe-agent` subcommand against the running agent (inside the
    /// server namespace), with the agent's token when it has a token file,
    /// and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let mut cmd = self.lab.cmd_in(self.lab.server_ns(), agent_bin());
        if let Some(tokens) = &self.token_file {
            cmd.env("PXE_AGENT_TOKEN_FILE", tokens);
        }
        let out = cmd.args(args).output().expect("run pxe-agent");
        assert!(
            out.status.success(),
            "`pxe-agent {}` failed: {}\nagent log:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Served {
    /// Runs dhcpcd once in the client namespace; the variables its hook saw on
    /// BOUND.
    pub fn dhcpcd(&self) -> BTreeMap<String, String> {
        self.dhcpcd_with(&[])
    }

    /// [`Served::dhcpcd`] with `extra` arguments before the interface.
    pub fn dhcpcd_with(&self, extra: &[&str]) -> BTreeMap<String, String> {
        let args = [
            &[
                "-4",
                "--oneshot",
                "--nobackground",
                "--noarp",
                "-t",
                "15",
                "-f",
                "/dev/null",
            ][..],
            extra,
        ]
        .concat();
        let text = self.run_dhcpcd(
            &args,
            r#"echo "reason=$reason ip=$new_ip_address server=$new_dhcp_server_identifier""#,
        );
        vars(
            text.lines()
                .find(|l| l.contains("reason=BOUND"))
                .unwrap_or_else(|| {
                    panic!(
                        "dhcpcd reported no lease: {text}\nagent log:\n{}",
                        self.log()
                    )
                }),
        )
    }

    /// Runs `dhcpcd ARGS -c HOOK <client interface>` in the client
    /// namespace, `hook` being a shell script body, for at most 20 s;
    /// returns what it and its hook printed.
    pub fn run_dhcpcd(&self, args: &[&str], hook: &str) -> String {
        use std::os::unix::process::CommandExt as _;
        let hook = script(&self.dir.0, "dhcpcd.sh", hook);
        let out_path = self.dir.path("dhcpcd.out");
        let out = std::fs::File::create(&out_path).expect("dhcpcd output file");
        // Its own process group, ended as a whole afterwards (its helpers
        // outlive it); a tmpfs over its lease directory in the private mount
        // namespace `ip netns exec` gives it keeps the machine's files untouched.
        let mut child = self
            .client_cmd("sh")
            .arg("-c")
            .arg(r#"mount -t tmpfs tmpfs /var/lib/dhcpcd && exec dhcpcd "$@""#)
            .arg("dhcpcd")
            .args(args)
            .arg("-c")
            .arg(&hook)
            .arg(self.lab.client_if())
            .stdout(out.try_clone().expect("fd"))
            .stderr(out)
            .process_group(0)
            .spawn()
            .expect("run dhcpcd");
        let pgid = child.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().expect("wait dhcpcd").is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: signals only the process group this test created.
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
        let _ = child.wait();
        std::fs::read_to_string(&out_path).unwrap_or_default()
    }

    /// Runs ISC dhclient once (`-1`, no-op script) in the client namespace,
    /// stops the daemon it became once bound; returns its lease file.
    pub fn dhclient(&self) -> String {
        let (lease, pid) = (
            self.dir.path("dhclient.leases"),
            self.dir.path("dhclient.pid"),
        );
        let out = self
            .client_cmd("dhclient")
            .args(["-4", "-1", "-sf", "/bin/true", "-lf"])
            .arg(&lease)
            .arg("-pf")
            .arg(&pid)
            .arg(self.lab.client_if())
            .output()
            .expect("run dhclient");
        // dhclient forks into the background once bound: stop the daemon we started.
        let daemon = std::fs::read_to_string(&pid)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok());
        if let Some(p) = daemon {
            // SAFETY: signalling the PID our own dhclient wrote.
            unsafe { libc::kill(p, libc::SIGTERM) };
        }
        assert!(
            out.status.success(),
            "dhclient failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::read_to_string(&lease).expect("dhclient lease file")
    }

    /// Runs busybox udhcpc once with `extra` arguments; returns the variables
    /// its script saw on `bound`.
    pub fn udhcpc(&self, extra: &[&str]) -> BTreeMap<String, String> {
        self.udhcpc_on(self.lab.client_ns(), self.lab.client_if(), extra)
    }

    /// Like [`Served::udhcpc`], on `iface` of namespace `ns`.
    pub fn udhcpc_on(&self, ns: &str, iface: &str, extra: &[&str]) -> BTreeMap<String, String> {
        self.udhcpc_showing(ns, iface, extra, &[])
    }

    /// Like [`Served::udhcpc_on`], the script also printing the variables
    /// `shown` (udhcpc's names: `ntpsrv` for option 42, `domain` for 15),
    /// each with spaces in its value replaced by commas.
    pub fn udhcpc_showing(
        &self,
        ns: &str,
        iface: &str,
        extra: &[&str],
        shown: &[&str],
    ) -> BTreeMap<String, String> {
        let more: String = shown
            .iter()
            .map(|v| format!(" {v}=$(echo ${v} | tr ' ' ,)"))
            .collect();
        let hook = script(
            &self.dir.0,
            "udhcpc.sh",
            &format!(
                r#"[ "$1" = bound ] && echo "ip=$ip siaddr=$siaddr boot_file=$boot_file bootfile=$bootfile serverid=$serverid lease=$lease{more}""#
            ),
        );
        let out = self
            .lab
            .cmd_in(ns, "busybox")
            .args([
                "udhcpc", "-f", "-q", "-n", "-t", "5", "-T", "1", "-i", iface, "-s",
            ])
            .arg(&hook)
            .args(extra)
            .output()
            .expect("run udhcpc");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "udhcpc failed: {text}{}\nagent log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        vars(&text)
    }
}

pub fn vars(text: &str) -> BTreeMap<String, String> {
    text.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

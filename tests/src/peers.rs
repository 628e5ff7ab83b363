//! Two agents sharing one inventory on one L2 segment, with their pool
//! membership in Leases on a fake Kubernetes API: known hosts get their
//! reservation whichever agent answers, pool clients are spread over both
//! agents and never share an address, and killing one agent moves its
//! unknown clients to the other.
//!
//! ```text
//!              bridge ns: pxbr0 10.66.0.254/16 (fake API on :port)
//!          ┌──────────────┬──────────────┬──────────────┐
//!       pxb-a0         pxb-a1         pxb-cl         pxb-kn
//!         │              │              │              │
//!  a0: pxag0 .0.1   a1: pxag0 .0.2   cl: pxcl0      kn: pxkn0
//!   agent, slot ?    agent, slot ?    raw DORA       udhcpc
//! ```
//!
//! The agents run in native XDP mode on their veth; the bridge ends carry
//! the pass-through program so XDP_TX frames arrive (docs/veth.md). The
//! Leases live in the fake API server of `kube_api`, run in the bridge
//! namespace.

mod file_mode;
mod six;

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    net::{Ipv4Addr, SocketAddr, TcpListener},
    path::PathBuf,
    process::Command,
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use dhcproto::{
    Decodable as _, Decoder,
    v4::{DhcpOption, Message, MessageType, OptionCode},
};
use pxe_agent::share::Share;
use serde_json::Value;
use xtask::ChildGuard;

use crate::{
    agent::{Scratch, agent_bin, assert_daemonset_privileges, daemonset_wrapper, script, vars},
    frame::{Req, parse_reply},
    kube_api,
    raw::{RawSocket, in_netns, is_dhcp_reply},
};

/// The fake Kubernetes API (`kube_api`) serving on a listener bound in the
/// bridge namespace, on a runtime of its own that stops on drop.
struct Api {
    runtime: Option<tokio::runtime::Runtime>,
    addr: SocketAddr,
}

impl Api {
    fn start(ns: &Ns) -> Api {
        let listener = in_netns(&ns.0, || TcpListener::bind((BRIDGE_IP, 0)))
            .expect("enter the bridge namespace")
            .expect("bind the fake API");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("local addr");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            kube_api::serve(listener, Arc::new(kube_api::Server::default())).await;
        });
        Api {
            runtime: Some(runtime),
            addr,
        }
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Lease duration of the agents' slot Leases, in seconds.
pub(crate) const LEASE_SECS: u64 = 2;
const POOL_CLIENTS: u8 = 150;
const BRIDGE_IP: &str = "10.66.0.254";
pub(crate) const AGENT_IPS: [&str; 2] = ["10.66.0.1", "10.66.0.2"];
const API_TOKEN: &str = "peers-operator-token-0123456789";
/// The `netboot: once` host.
const ONCE_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x77, 0x00, 0x04];

fn inventory() -> String {
    r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.254
    lease_time: 3600
    pool: {start: 10.66.200.1, end: 10.66.203.254}
discovery: {policy: inspect, profile: inspector}
profiles:
  - name: worker
    boot: {bios: undionly.kpxe}
  - name: inspector
  - name: install
    netboot: once
    boot: {bios: undionly.kpxe}
    kernel: "http://{server}:8080/artifacts/vmlinuz"
    initrd: ["http://{server}:8080/artifacts/initrd.img"]
hosts:
  - {mac: "52:54:00:77:00:01", ip: 10.66.1.10, profile: worker}
  - {mac: "52:54:00:77:00:02", ip: 10.66.1.11, profile: worker}
  - {mac: "52:54:00:77:00:03", ip: 10.66.1.12, profile: worker}
  - {mac: "52:54:00:77:00:04", ip: 10.66.1.13, hostname: node-once, profile: install}
"#
    .to_string()
}

/// A namespace of this test, deleted (with its resolver file) on drop.
pub(crate) struct Ns(pub(crate) String);

impl Ns {
    fn new(name: String) -> Ns {
        run(Command::new("ip").args(["netns", "add", &name]));
        let ns = Ns(name);
        let etc = PathBuf::from("/etc/netns").join(&ns.0);
        fs::create_dir_all(&etc).expect("netns etc");
        fs::write(etc.join("resolv.conf"), "").expect("netns resolv.conf");
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub(crate) fn ip(&self, args: &[&str]) -> String {
        run(Command::new("ip").args(["-n", &self.0]).args(args))
    }

    pub(crate) fn cmd(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.0]).arg(program);
        cmd
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        let _ = fs::remove_dir_all(PathBuf::from("/etc/netns").join(&self.0));
    }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The lab. Field order matters: processes and the fake stop before the
/// namespaces go.
pub(crate) struct PeerLab {
    agents: Vec<Option<ChildGuard>>,
    _peers: Vec<ChildGuard>,
    api: Option<Api>,
    /// The agents share their pools through `api` (`--peers kube`); else
    /// each runs alone, in file mode.
    kube: bool,
    pub(crate) dir: Scratch,
    /// Arguments both agents get besides the lab's own.
    extra: Vec<String>,
    pub(crate) bridge: Ns,
    pub(crate) agent_ns: Vec<Ns>,
    clients: Ns,
    pub(crate) known: Ns,
}

impl PeerLab {
    fn new() -> PeerLab {
        PeerLab::with(&inventory(), true, &[])
    }

    /// The lab with `inventory` (a file for both agents), both agents
    /// started with `extra` besides the lab's arguments; without `kube`,
    /// no fake API, and the agents run without `--peers`, each alone (file
    /// mode).
    pub(crate) fn with(inventory: &str, kube: bool, extra: &[&str]) -> PeerLab {
        PeerLab::with_prepared(inventory, kube, extra, |_| {})
    }

    /// [`PeerLab::with`], `prepare` run on the lab before the agents start.
    pub(crate) fn with_prepared(
        inventory: &str,
        kube: bool,
        extra: &[&str],
        prepare: impl FnOnce(&PeerLab),
    ) -> PeerLab {
        crate::fixture::assert_root();
        let base = format!("pxpeer-{}", std::process::id());
        // Leftovers of an earlier run of this PID are not ours to keep.
        let bridge = Ns::new(format!("{base}-br"));
        let agent_ns = vec![Ns::new(format!("{base}-a0")), Ns::new(format!("{base}-a1"))];
        let clients = Ns::new(format!("{base}-cl"));
        let known = Ns::new(format!("{base}-kn"));
        bridge.ip(&["link", "add", "pxbr0", "type", "bridge"]);
        bridge.ip(&["link", "set", "pxbr0", "up"]);
        bridge.ip(&["addr", "add", &format!("{BRIDGE_IP}/16"), "dev", "pxbr0"]);
        let attach = |ns: &Ns, outer: &str, inner: &str, addr: Option<&str>| {
            bridge.ip(&[
                "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", &ns.0,
            ]);
            bridge.ip(&["link", "set", outer, "master", "pxbr0", "up"]);
            ns.ip(&["link", "set", inner, "up"]);
            if let Some(addr) = addr {
                ns.ip(&["addr", "add", &format!("{addr}/16"), "dev", inner]);
            }
            // XDP_TX on a veth reaches its peer only with NAPI there.
            run(bridge.cmd("ethtool").args(["-K", outer, "gro", "on"]));
            run(ns.cmd("ethtool").args(["-K", inner, "gro", "on"]));
        };
        attach(&agent_ns[0], "pxb-a0", "pxag0", Some(AGENT_IPS[0]));
        attach(&agent_ns[1], "pxb-a1", "pxag0", Some(AGENT_IPS[1]));
        attach(&clients, "pxb-cl", "pxcl0", None);
        attach(&known, "pxb-kn", "pxkn0", None);
        let peers = ["pxb-a0", "pxb-a1"]
            .iter()
            .map(|outer| {
                ChildGuard::spawn(
                    bridge
                        .cmd(agent_bin())
                        .args(["veth-peer", "--interface", outer])
                        .stderr(std::process::Stdio::null()),
                )
                .expect("veth peer")
            })
            .collect();
        let api = kube.then(|| Api::start(&bridge));
        let dir = Scratch::new("peers");
        fs::write(dir.path("inventory.yaml"), inventory).expect("inventory");
        for sub in ["root", "artifacts"] {
            fs::create_dir_all(dir.path(sub)).expect("mkdir");
        }
        fs::write(dir.path("root/undionly.kpxe"), b"bios loader").expect("boot file");
        fs::write(dir.path("artifacts/vmlinuz"), b"kernel").expect("kernel");
        fs::write(dir.path("artifacts/initrd.img"), b"initrd").expect("initrd");
        fs::write(dir.path("tokens"), format!("ops {API_TOKEN}\n")).expect("tokens");
        if let Some(api) = &api {
            fs::write(
                dir.path("kubeconfig"),
                format!(
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: fake, namespace: pxe}}\ncurrent-context: fake\n",
                    api.addr
                ),
            )
            .expect("kubeconfig");
        }
        let mut lab = PeerLab {
            agents: vec![None, None],
            _peers: peers,
            api,
            kube,
            dir,
            extra: extra.iter().map(|a| (*a).to_owned()).collect(),
            bridge,
            agent_ns,
            clients,
            known,
        };
        prepare(&lab);
        for i in 0..2 {
            lab.start_agent(i);
        }
        lab
    }

    pub(crate) fn start_agent(&mut self, i: usize) {
        let log = fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.path(&format!("agent{i}.log")))
            .expect("agent log");
        let state = self.dir.path(&format!("state{i}"));
        // As the DaemonSet runs it: its capabilities and no_new_privs.
        let wrapper = daemonset_wrapper();
        let child = ChildGuard::spawn(
            self.agent_ns[i]
                .cmd(&wrapper[0])
                .args(&wrapper[1..])
                .arg(agent_bin())
                .env("KUBECONFIG", self.dir.path("kubeconfig"))
                .env("RUST_LOG", "info,pxe_agent::share=debug,pxe_agent::kube::membership=debug,pxe_agent::kube::host_records=debug")
                .args(["run", "--interface", "pxag0", "--xdp-mode", "native"])
                .arg("--inventory")
                .arg(self.dir.path("inventory.yaml"))
                .arg("--state-dir")
                .arg(&state)
                .arg("--boot-root")
                .arg(self.dir.path("root"))
                .arg("--artifacts")
                .arg(self.dir.path("artifacts"))
                .arg("--api-token-file")
                .arg(self.dir.path("tokens"))
                .args(["--rate-unknown", "100000"])
                .args(self.peer_args(i))
                .args(&self.extra)
                .stderr(log.try_clone().expect("log fd"))
                .stdout(log),
        )
        .expect("spawn agent");
        self.agents[i] = Some(child);
    }

    /// Agent `i`'s arguments for sharing the pools over the fake API; none
    /// without it.
    fn peer_args(&self, i: usize) -> Vec<String> {
        if !self.kube {
            return Vec::new();
        }
        let lease = format!("{LEASE_SECS}s");
        let node = format!("node-{i}");
        [
            "--peers",
            "kube",
            "--pool-slots",
            "2",
            "--peer-lease",
            &lease,
        ]
        .into_iter()
        .chain(["--kube-namespace", "pxe", "--node-name", &node])
        .map(str::to_owned)
        .collect()
    }

    fn log(&self, i: usize) -> String {
        fs::read_to_string(self.dir.path(&format!("agent{i}.log"))).unwrap_or_default()
    }

    /// `kill -9` of agent `i`, reaped.
    pub(crate) fn kill(&mut self, i: usize) {
        let child = self.agents[i].as_mut().expect("agent running");
        let pid = libc::pid_t::try_from(child.id()).expect("pid");
        // SAFETY: kill(2) on our own unreaped child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let _ = child.0.wait();
    }

    pub(crate) fn logs(&self) -> String {
        format!(
            "agent 0 log:\n{}\nagent 1 log:\n{}",
            self.log(0),
            self.log(1)
        )
    }

    /// GET `path` on agent `i`'s admin listener, as JSON.
    pub(crate) fn get(&self, i: usize, path: &str) -> Option<Value> {
        serde_json::from_str(&self.text(i, path)?).ok()
    }

    /// Agent `i`'s `path` on its API or metrics listener, as text.
    pub(crate) fn text(&self, i: usize, path: &str) -> Option<String> {
        let out = self.agent_ns[i]
            .cmd("curl")
            .args(["-sf", "--max-time", "2"])
            .args(["-H", &format!("Authorization: Bearer {API_TOKEN}")])
            .arg(format!("http://{}{path}", crate::agent::listener_for(path)))
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Asserts that agent `i` runs as the DaemonSet runs it.
    pub(crate) fn assert_as_daemonset(&self, i: usize) {
        let agent = self.agents[i].as_ref().expect("agent running");
        assert_daemonset_privileges(agent.id());
    }

    /// Waits until `ok` holds for agent `i`'s `/api/v1/peers`; checks on
    /// the way that the agent runs as the DaemonSet runs it.
    pub(crate) fn wait_peers(&self, i: usize, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(v) = self.get(i, "/api/v1/peers")
                && ok(&v)
            {
                self.assert_as_daemonset(i);
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "agent {i}: {what} not reached in 30 s: {:?}\n{}",
                self.get(i, "/api/v1/peers"),
                self.logs()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Agent `i`'s bound pool leases: address → MAC.
    fn bound(&self, i: usize) -> BTreeMap<Ipv4Addr, String> {
        let v = self
            .get(i, "/api/v1/leases")
            .unwrap_or_else(|| panic!("agent {i}: no leases\n{}", self.logs()));
        v.as_array()
            .expect("lease list")
            .iter()
            .filter(|l| l["state"] == "bound")
            .map(|l| {
                (
                    l["ip"].as_str().unwrap().parse().unwrap(),
                    l["mac"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    /// `POST path` on agent `i`'s API with the operator's token: the status
    /// code and body.
    fn act(&self, i: usize, path: &str) -> (String, String) {
        let out = self.agent_ns[i]
            .cmd("curl")
            .args([
                "-s",
                "--max-time",
                "10",
                "-X",
                "POST",
                "-w",
                "\n%{http_code}",
            ])
            .args(["-H", &format!("Authorization: Bearer {API_TOKEN}")])
            .arg(format!("http://{}{path}", crate::agent::API_ADDR))
            .output()
            .expect("run curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().to_owned(), body.to_owned())
    }

    /// `GET` (or with `post`, `POST`) of `path` on agent `i`'s boot HTTP
    /// server, from the known-host namespace: the status code and body.
    pub(crate) fn boot_http(&self, i: usize, path: &str, post: bool) -> (String, String) {
        let mut cmd = self.known.cmd("curl");
        cmd.args(["-s", "--max-time", "10", "-w", "\n%{http_code}"]);
        if post {
            cmd.args(["-X", "POST", "-d", "installed"]);
        }
        let out = cmd
            .arg(format!("http://{}:8080{path}", AGENT_IPS[i]))
            .output()
            .expect("run curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().to_owned(), body.to_owned())
    }

    /// The phone-home of host `mac` through agent `i`, with the token of
    /// the iPXE script agent `i` serves it.
    pub(crate) fn phone_home(&self, i: usize, mac: &str) {
        let (code, script) = self.boot_http(i, &format!("/boot/{mac}.ipxe"), false);
        assert_eq!(code, "200", "agent {i}'s script for {mac}: {script}");
        let token = script
            .split_whitespace()
            .find_map(|a| a.strip_prefix("pxe_agent.token="))
            .unwrap_or_else(|| panic!("no token in agent {i}'s script:\n{script}"));
        let url = format!("/api/v1/hosts/{mac}/booted?token={token}");
        let (code, _) = self.boot_http(i, &url, true);
        assert_eq!(code, "204", "phone-home refused\n{}", self.logs());
    }

    /// A TFTP download of `file` from agent `i`: the bytes, or curl's error.
    fn tftp(&self, i: usize, file: &str) -> Result<String, String> {
        let out = self
            .known
            .cmd("curl")
            .args(["-sS", "--max-time", "10"])
            .arg(format!("tftp://{}/{file}", AGENT_IPS[i]))
            .output()
            .expect("run curl");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// The `netboot` object agent `i` shows for the once host.
    fn netboot(&self, i: usize) -> Value {
        let hosts = self.get(i, "/api/v1/hosts").expect("hosts");
        hosts
            .as_array()
            .expect("host list")
            .iter()
            .find(|h| h["mac"] == mac_text(ONCE_MAC))
            .map(|h| h["netboot"].clone())
            .expect("the once host")
    }

    /// Runs udhcpc in the known-host namespace as `mac`.
    pub(crate) fn udhcpc(&self, mac: &str) -> BTreeMap<String, String> {
        self.known
            .ip(&["link", "set", "dev", "pxkn0", "address", mac]);
        let hook = script(
            &self.dir.0,
            "udhcpc.sh",
            r#"[ "$1" = bound ] && echo "ip=$ip serverid=$serverid""#,
        );
        let out = self
            .known
            .cmd("busybox")
            .args([
                "udhcpc",
                "-f",
                "-q",
                "-n",
                "-t",
                "5",
                "-T",
                "1",
                "-i",
                "pxkn0",
                "-V",
                "PXEClient",
                "-x",
                "0x5d:0000",
                "-s",
            ])
            .arg(&hook)
            .output()
            .expect("run udhcpc");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "udhcpc as {mac} failed: {text}\n{}",
            self.logs()
        );
        vars(&text)
    }
}

/// One reply as the clients' namespace saw it.
#[derive(Clone, Debug)]
struct Seen {
    kind: MessageType,
    mac: [u8; 6],
    yiaddr: Ipv4Addr,
    server: Ipv4Addr,
    /// What it is told to boot: BOOTP `file`, else option 67.
    file: String,
}

fn decode(frame: &[u8]) -> Option<Seen> {
    if !is_dhcp_reply(frame) {
        return None;
    }
    let reply = parse_reply(frame);
    let msg = Message::decode(&mut Decoder::new(&reply.payload)).ok()?;
    let kind = match msg.opts().get(OptionCode::MessageType) {
        Some(DhcpOption::MessageType(t)) => *t,
        _ => return None,
    };
    let server = match msg.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(ip)) => *ip,
        _ => return None,
    };
    let file = match msg.opts().get(OptionCode::BootfileName) {
        Some(DhcpOption::BootfileName(name)) => String::from_utf8_lossy(name).into_owned(),
        _ => String::from_utf8_lossy(msg.fname().unwrap_or_default()).into_owned(),
    };
    Some(Seen {
        kind,
        mac: msg.chaddr()[..6].try_into().ok()?,
        yiaddr: msg.yiaddr(),
        server,
        file: file.trim_end_matches('\0').to_owned(),
    })
}

/// The raw DORA driver on the clients' namespace.
struct Clients {
    sock: RawSocket,
}

impl Clients {
    fn open(ns: &Ns) -> Clients {
        let sock = in_netns(&ns.0, || RawSocket::open("pxcl0"))
            .expect("enter the clients' namespace")
            .expect("raw socket");
        sock.ignore_outgoing().expect("ignore outgoing");
        sock.set_recv_buffer(8 << 20).expect("receive buffer");
        Clients { sock }
    }

    fn send(&self, req: &Req) {
        self.sock.send(&req.frame()).expect("send");
    }

    /// Replies until `quiet` passes without one.
    fn collect(&self, quiet: Duration) -> Vec<Seen> {
        let mut got = Vec::new();
        while let Some(frame) = self.sock.recv(quiet).expect("recv") {
            got.extend(decode(&frame));
        }
        got
    }
}

fn mac_of(i: u8) -> [u8; 6] {
    // Locally administered; the bridge is this test's own.
    [0x02, 0x5e, 0x77, 0x01, 0x00, i]
}

fn discover(mac: [u8; 6], xid: u32) -> Req {
    let mut r = Req::discover(mac);
    r.xid = xid;
    r.broadcast = true;
    r
}

fn mac_text(mac: [u8; 6]) -> String {
    mac.map(|b| format!("{b:02x}")).join(":")
}

#[test]
fn two_agents_share_a_pool_without_sharing_an_address_and_fail_over() {
    let mut lab = PeerLab::new();
    // Both claim a slot and see each other.
    let views: Vec<Value> = (0..2)
        .map(|i| {
            lab.wait_peers(i, "both slots live", |v| {
                v["serving"] == true && v["live"].as_array().is_some_and(|l| l.len() == 2)
            })
        })
        .collect();
    let slot = |i: usize| views[i]["slot"].as_u64().expect("slot") as u16;
    assert_ne!(slot(0), slot(1), "two agents, two slots: {views:?}");
    // The status (`pxe-agent status`) shows the same sharing.
    for (i, view) in views.iter().enumerate() {
        let status = lab.get(i, "/api/v1/status").expect("status");
        assert_eq!(status["peers"]["slot"], view["slot"], "{status}");
        assert_eq!(status["peers"]["slots"], 2, "{status}");
        assert_eq!(status["peers"]["live"], view["live"], "{status}");
    }
    let slice = |i: usize| {
        let s = &views[i]["slices"][0];
        let ip = |k: &str| s[k].as_str().unwrap().parse::<Ipv4Addr>().unwrap();
        ip("start")..=ip("end")
    };
    println!(
        "slots: agent 0 = {} {:?}, agent 1 = {} {:?}",
        slot(0),
        slice(0),
        slot(1),
        slice(1)
    );

    // (1) Known hosts: their reservation, from whichever agent, every time.
    for (n, want) in [
        ("01", "10.66.1.10"),
        ("02", "10.66.1.11"),
        ("03", "10.66.1.12"),
    ] {
        for _ in 0..2 {
            let lease = lab.udhcpc(&format!("52:54:00:77:00:{n}"));
            assert_eq!(lease["ip"], want, "{lease:?}");
            assert!(AGENT_IPS.contains(&lease["serverid"].as_str()), "{lease:?}");
        }
    }

    // (2) Pool clients, DISCOVER then REQUEST, with raw frames.
    let clients = Clients::open(&lab.clients);
    let macs: Vec<[u8; 6]> = (0..POOL_CLIENTS).map(mac_of).collect();
    let macs: Vec<[u8; 6]> = macs
        .into_iter()
        .chain((0..POOL_CLIENTS).map(|i| [0x02, 0x5e, 0x77, 0x02, 0x00, i]))
        .collect();
    for (i, mac) in macs.iter().enumerate() {
        clients.send(&discover(*mac, 0x5000_0000 + i as u32));
        if i % 32 == 31 {
            thread::sleep(Duration::from_millis(5));
        }
    }
    let offers = clients.collect(Duration::from_secs(2));
    let mut by_mac: BTreeMap<[u8; 6], Vec<Seen>> = BTreeMap::new();
    for s in offers.iter().filter(|s| s.kind == MessageType::Offer) {
        by_mac.entry(s.mac).or_default().push(s.clone());
    }
    let server_ip = |i: usize| AGENT_IPS[i].parse::<Ipv4Addr>().unwrap();
    // The owner of each MAC's bucket, as both agents compute it.
    let share = Share::new(0, 2).unwrap().with_live([0, 1]);
    let owner_agent = |mac: &[u8; 6]| {
        let owner = share.owner(pxe_agent::share::bucket(mac)).unwrap();
        usize::from(owner != slot(0))
    };
    for mac in &macs {
        let got = by_mac.get(mac).map_or(&[][..], Vec::as_slice);
        assert_eq!(
            got.len(),
            1,
            "{}: one OFFER, from one agent: {got:?}",
            mac_text(*mac)
        );
        let agent = owner_agent(mac);
        assert_eq!(
            got[0].server,
            server_ip(agent),
            "{}: the bucket owner answers",
            mac_text(*mac)
        );
        assert!(
            slice(agent).contains(&got[0].yiaddr),
            "{got:?} outside {:?}",
            slice(agent)
        );
    }
    let answered = |i: usize| macs.iter().filter(|m| owner_agent(m) == i).count();
    println!(
        "pool clients: {} — agent 0 answered {} ({:.0}%), agent 1 answered {} ({:.0}%)",
        macs.len(),
        answered(0),
        100.0 * answered(0) as f64 / macs.len() as f64,
        answered(1),
        100.0 * answered(1) as f64 / macs.len() as f64
    );
    for i in 0..2 {
        assert!(answered(i) * 5 > macs.len(), "agent {i} answered under 20%");
    }
    for (i, mac) in macs.iter().enumerate() {
        let offer = &by_mac[mac][0];
        let mut r = discover(*mac, 0x6000_0000 + i as u32).request();
        r.server_id = Some(offer.server);
        r.requested_ip = Some(offer.yiaddr);
        clients.send(&r);
        if i % 32 == 31 {
            thread::sleep(Duration::from_millis(5));
        }
    }
    let acks: Vec<Seen> = clients
        .collect(Duration::from_secs(2))
        .into_iter()
        .filter(|s| s.kind == MessageType::Ack)
        .collect();
    let acked: BTreeSet<[u8; 6]> = acks.iter().map(|s| s.mac).collect();
    assert_eq!(
        acked.len(),
        macs.len(),
        "every pool client ACKed\n{}",
        lab.logs()
    );

    // After the fact, from both agents' lease stores.
    let stores = [lab.bound(0), lab.bound(1)];
    let sets: Vec<BTreeSet<Ipv4Addr>> =
        stores.iter().map(|s| s.keys().copied().collect()).collect();
    let shared: Vec<_> = sets[0].intersection(&sets[1]).collect();
    println!(
        "lease stores: agent 0 holds {}, agent 1 holds {}, addresses in both: {}",
        sets[0].len(),
        sets[1].len(),
        shared.len()
    );
    assert!(
        shared.is_empty(),
        "addresses leased by both agents: {shared:?}"
    );
    assert_eq!(sets[0].len() + sets[1].len(), macs.len());
    for (i, set) in sets.iter().enumerate() {
        assert!(
            set.iter().all(|ip| slice(i).contains(ip)),
            "agent {i} leased outside its slice {:?}: {set:?}",
            slice(i),
        );
        assert_eq!(set.len(), answered(i));
    }

    // (3) Kill agent 0; its unknown clients move to agent 1.
    let orphans: Vec<[u8; 6]> = macs
        .iter()
        .copied()
        .filter(|m| owner_agent(m) == 0)
        .collect();
    let killed = Instant::now();
    lab.kill(0);
    let probe = orphans[0];
    let mut xid = 0x7000_0000u32;
    let moved_after = loop {
        xid += 1;
        clients.send(&discover(probe, xid));
        let got = clients.collect(Duration::from_millis(200));
        if got
            .iter()
            .any(|s| s.kind == MessageType::Offer && s.mac == probe && s.server == server_ip(1))
        {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(6 * LEASE_SECS),
            "agent 1 did not take over agent 0's clients within {} s\n{}",
            6 * LEASE_SECS,
            lab.logs()
        );
    };
    println!(
        "fail-over: agent 1 answered agent 0's clients {:.1} s after kill -9 (lease {} s)",
        moved_after.as_secs_f64(),
        LEASE_SECS
    );
    assert!(
        moved_after < Duration::from_secs(2 * LEASE_SECS + 1),
        "fail-over took {moved_after:?}"
    );
    // An orphan asking for its old address is told to start over ...
    let old = stores[0]
        .iter()
        .find(|(_, m)| **m == mac_text(orphans[1]))
        .map(|(ip, _)| *ip)
        .expect("orphan's old lease");
    let mut reboot = discover(orphans[1], 0x7100_0000).request();
    reboot.requested_ip = Some(old);
    clients.send(&reboot);
    let naks = clients.collect(Duration::from_millis(500));
    assert!(
        naks.iter()
            .any(|s| s.kind == MessageType::Nak && s.mac == orphans[1] && s.server == server_ip(1)),
        "INIT-REBOOT for {old} of the dead agent's slice not NAKed: {naks:?}"
    );
    // ... and every orphan gets an address of the survivor's slice.
    for (i, mac) in orphans.iter().enumerate() {
        clients.send(&discover(*mac, 0x7200_0000 + i as u32));
    }
    let offers = clients.collect(Duration::from_secs(2));
    let retaken: BTreeMap<[u8; 6], Ipv4Addr> = offers
        .iter()
        .filter(|s| s.kind == MessageType::Offer && s.server == server_ip(1))
        .map(|s| (s.mac, s.yiaddr))
        .collect();
    println!(
        "after fail-over: {} of {} orphaned clients offered by agent 1",
        orphans.iter().filter(|m| retaken.contains_key(*m)).count(),
        orphans.len()
    );
    for mac in &orphans {
        let ip = retaken.get(mac).unwrap_or_else(|| {
            panic!("{} not answered by agent 1\n{}", mac_text(*mac), lab.logs())
        });
        assert!(
            slice(1).contains(ip),
            "{ip} outside agent 1's slice {:?}",
            slice(1)
        );
    }
    // Known hosts still get their reservation from the survivor.
    let lease = lab.udhcpc("52:54:00:77:00:01");
    assert_eq!(lease["ip"], "10.66.1.10");
    assert_eq!(lease["serverid"], AGENT_IPS[1]);

    // (4) Agent 0 comes back on its node: it takes its own slot again, and
    // its clients' renewals are its to answer from its store.
    let restarted = Instant::now();
    lab.start_agent(0);
    let view = lab.wait_peers(0, "its own slot back", |v| {
        v["serving"] == true && v["live"].as_array().is_some_and(|l| l.len() == 2)
    });
    assert_eq!(view["slot"].as_u64(), Some(u64::from(slot(0))), "{view:?}");
    lab.wait_peers(1, "agent 0 live again", |v| {
        v["live"].as_array().is_some_and(|l| l.len() == 2)
    });
    println!(
        "restart: agent 0 serving its slot {} again {:.1} s after start",
        slot(0),
        restarted.elapsed().as_secs_f64()
    );
    let client = orphans[2];
    let old = stores[0]
        .iter()
        .find(|(_, m)| **m == mac_text(client))
        .map(|(ip, _)| *ip)
        .expect("client's lease");
    let mut reboot = discover(client, 0x7300_0000).request();
    reboot.requested_ip = Some(old);
    clients.send(&reboot);
    let replies: Vec<Seen> = clients
        .collect(Duration::from_millis(500))
        .into_iter()
        .filter(|s| s.mac == client)
        .collect();
    assert!(
        replies.len() == 1
            && replies[0].kind == MessageType::Ack
            && replies[0].yiaddr == old
            && replies[0].server == server_ip(0),
        "INIT-REBOOT for {old} after the restart: want one ACK from agent 0, got {replies:?}\n{}",
        lab.logs()
    );

    // (5) The API goes away: once their Leases have run out unrenewed,
    // neither agent answers a pool client; reserved hosts are still served.
    drop(lab.api.take());
    thread::sleep(Duration::from_secs(LEASE_SECS + 2));
    for i in 0..2 {
        lab.wait_peers(i, "its own slot lapsed", |v| v["serving"] == false);
    }
    let fresh = [0x02, 0x5e, 0x77, 0x03, 0x00, 0x01];
    clients.send(&discover(fresh, 0x7400_0000));
    let got = clients.collect(Duration::from_secs(1));
    assert!(
        !got.iter().any(|s| s.mac == fresh),
        "a pool client answered with the API gone: {got:?}"
    );
    let lease = lab.udhcpc("52:54:00:77:00:02");
    assert_eq!(lease["ip"], "10.66.1.11");
    println!("API down: no pool client answered, reserved hosts still served");
}

/// The once host's OFFERs from both agents, to `req`.
fn once_offers(clients: &Clients, req: &Req) -> Vec<Seen> {
    clients.send(req);
    clients
        .collect(Duration::from_millis(300))
        .into_iter()
        .filter(|s| s.kind == MessageType::Offer && s.mac == ONCE_MAC)
        .collect()
}

/// A BIOS PXE DISCOVER (answered by the XDP program) and an iPXE one
/// (passed to the slow path) of the once host.
fn once_discovers(xid: u32) -> [(&'static str, Req); 2] {
    let fast = Req::discover(ONCE_MAC).pxe(0);
    let mut slow = Req::discover(ONCE_MAC).pxe(0);
    slow.user_class = Some(b"iPXE");
    [("fast path", fast), ("slow path", slow)].map(|(what, mut r)| {
        r.xid = xid;
        r.broadcast = true;
        (what, r)
    })
}

/// Both agents offer the once host its address on both paths, with
/// (`boots`) or without its boot file.
fn assert_offers(lab: &PeerLab, clients: &Clients, boots: bool, when: &str) {
    for (what, req) in once_discovers(0x5100_0000) {
        let offers = once_offers(clients, &req);
        let servers: BTreeSet<Ipv4Addr> = offers.iter().map(|o| o.server).collect();
        assert_eq!(
            servers.len(),
            2,
            "{when}, {what}: one OFFER from each agent: {offers:?}\n{}",
            lab.logs()
        );
        for o in &offers {
            assert_eq!(
                o.yiaddr,
                Ipv4Addr::new(10, 66, 1, 13),
                "{when}, {what}: {o:?}"
            );
            assert_eq!(
                !o.file.is_empty(),
                boots,
                "{when}, {what}: boot file from {}: {o:?}",
                o.server
            );
        }
    }
}

/// Every route of both agents withholds the once host's boot files (or,
/// with `boots`, serves them).
fn assert_routes(lab: &PeerLab, boots: bool, when: &str) {
    let mac = mac_text(ONCE_MAC);
    for i in 0..2 {
        let (code, script) = lab.boot_http(i, &format!("/boot/{mac}.ipxe"), false);
        assert_eq!(code, "200", "{when}, agent {i}: {script}");
        assert_eq!(
            script.contains("kernel "),
            boots,
            "{when}, agent {i}'s script: {script}"
        );
        let (code, _) = lab.boot_http(i, "/artifacts/vmlinuz", false);
        assert_eq!(code, if boots { "200" } else { "403" }, "{when}, agent {i}");
        let tftp = lab.tftp(i, "undionly.kpxe");
        assert_eq!(tftp.is_ok(), boots, "{when}, agent {i}: TFTP {tftp:?}");
    }
}

#[test]
fn two_agents_hold_one_netboot_state_for_a_once_host() {
    let lab = PeerLab::new();
    for i in 0..2 {
        lab.wait_peers(i, "both slots live", |v| {
            v["serving"] == true && v["live"].as_array().is_some_and(|l| l.len() == 2)
        });
    }
    // The routes are reached from the known hosts' namespace, at the
    // once host's own address.
    lab.known
        .ip(&["addr", "add", "10.66.1.13/16", "dev", "pxkn0"]);
    let clients = Clients::open(&lab.clients);
    assert_offers(&lab, &clients, true, "armed");
    assert_routes(&lab, true, "armed");

    // (1) The host phones home through agent 0, as its installer would.
    let mac = mac_text(ONCE_MAC);
    lab.phone_home(0, &mac);
    let phoned = Instant::now();
    // Agent 1 withholds the boot file too: `boots` turns false once the
    // inventory in force, the fast path's maps included, withholds it.
    while lab.netboot(1)["boots"] != false {
        assert!(
            phoned.elapsed() < Duration::from_secs(10),
            "agent 1 still boots the host\n{}",
            lab.logs()
        );
        thread::sleep(Duration::from_millis(10));
    }
    let withheld = phoned.elapsed();
    println!(
        "phone-home on agent 0: agent 1 withholds the boot file {} ms later",
        withheld.as_millis()
    );
    assert!(withheld < Duration::from_secs(2), "{withheld:?}");
    assert_offers(&lab, &clients, false, "done by phone-home");
    assert_routes(&lab, false, "done by phone-home");
    for i in 0..2 {
        let n = lab.netboot(i);
        assert_eq!(n["state"], "done", "agent {i}: {n}");
        assert_eq!(n["by"], "phone-home", "agent {i}: {n}");
    }

    // (2) `reprovision` through agent 1 arms it on both.
    let (code, body) = lab.act(1, &format!("/api/v1/hosts/{mac}/reprovision"));
    assert_eq!(code, "200", "reprovision on agent 1: {body}");
    let armed = Instant::now();
    // `boots`: the inventory in force, maps included, gives the boot file.
    while lab.netboot(0)["boots"] != true {
        assert!(armed.elapsed() < Duration::from_secs(10), "{}", lab.logs());
        thread::sleep(Duration::from_millis(20));
    }
    println!(
        "reprovision on agent 1: agent 0 boots it again {} ms later",
        armed.elapsed().as_millis()
    );
    assert_eq!(lab.netboot(0)["state"], "armed");
    assert_offers(&lab, &clients, true, "reprovisioned");
    assert_routes(&lab, true, "reprovisioned");

    // (3) The operator marks it done through agent 0: withheld on both.
    let (code, body) = lab.act(0, &format!("/api/v1/hosts/{mac}/netboot/done"));
    assert_eq!(code, "200", "done on agent 0: {body}");
    let done = Instant::now();
    while lab.netboot(1)["boots"] != false {
        assert!(done.elapsed() < Duration::from_secs(10), "{}", lab.logs());
        thread::sleep(Duration::from_millis(20));
    }
    println!(
        "done on agent 0: agent 1 withholds it {} ms later",
        done.elapsed().as_millis()
    );
    assert_offers(&lab, &clients, false, "done by the operator");
    assert_routes(&lab, false, "done by the operator");
    assert_eq!(lab.netboot(1)["by"], "operator");
    let metrics = lab.text(1, "/metrics").expect("metrics");
    assert!(
        metrics.contains("pxe_netboot_changes_total{to=\"done\",by=\"peer\"} 2"),
        "{metrics}"
    );
}

//! A boot lab: `pxe-agent` serving DHCP, TFTP and HTTP on tap devices in a
//! throw-away namespace, for QEMU VMs to network-boot from.
//!
//! Wiring, chosen after trying both on kernel 6.18:
//! - one VM: a tap device holds the server address (10.66.0.1/16) and the
//!   agent attaches to it. tun/tap implements native XDP, and `XDP_TX` on a
//!   tap hands the reply to the reader of the tap, QEMU, so the fast path
//!   runs in driver mode exactly as on a NIC;
//! - several VMs: their taps are enslaved to a bridge that holds the server
//!   address, and the agent attaches to the bridge in generic (skb) mode (a
//!   bridge has no native XDP). Broadcast and unicast DHCP to the server are
//!   delivered locally to the bridge, where generic XDP sees them; an
//!   `XDP_TX` reply is transmitted on the bridge, which forwards it to the
//!   client's port by its learned MAC. Attaching per tap would need one
//!   agent per tap, and each agent binds UDP 67 and HTTP 8080.
//!
//! radvd sends router advertisements on the server interface: iPXE waits
//! about 16 s for IPv6 autoconfiguration on a link without them, which
//! would otherwise dominate every boot.
//!
//! With IPv6 ([`Family`]) the server interface also has, or for IPv6
//! only has instead, [`SERVER_IP6`]; radvd stays off and the inventory's
//! `ra:` has the agent advertise itself, so its M and O flags start the
//! guests' DHCPv6. On the bridge wiring a bridge filter can keep the
//! guests' IPv4 and ARP off the segment ([`BootLab::carry_guest_ipv4`]).
//!
//! The lab is an [`xtask::Lab`](crate::Lab) whose veth pair is left unused
//! (with a documentation-range address, so it does not compete with the
//! taps' subnet); the taps and the bridge live in its server namespace and
//! go away with it. Declare [`Vm`]s after the lab so they stop first.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};

use super::{
    guest, initramfs,
    qemu::{Firmware, Vm, VmSpec, clean_line},
    signed,
};
use crate::{
    Lab,
    process::{self, ChildGuard},
    rootfs::{IPXE_DIR, IPXE_FILES},
};

/// The agent's address on the taps' link.
pub const SERVER_IP: &str = "10.66.0.1";
const SERVER_CIDR: &str = "10.66.0.1/16";
/// The agent's IPv6 address on the taps' link, in a lab that has IPv6
/// ([`Family`]), and its subnet.
pub const SERVER_IP6: &str = "fd00:66::1";
pub const SUBNET6: &str = "fd00:66::/64";
/// Given to the lab's veth pair, which the boot lab does not use.
const UNUSED_VETH_CIDR: &str = "192.0.2.1/30";
/// The agent's metrics listener inside the server namespace (the CLI
/// default).
pub const METRICS_ADDR: &str = "127.0.0.1:9464";
/// The agent's API listener inside the server namespace (the CLI default).
pub const API_ADDR: &str = "127.0.0.1:9465";
/// The bridge of the bridge wiring.
const BRIDGE: &str = "pxbr0";
/// The bridge's own MAC, fixed so it does not change as taps join.
const BRIDGE_MAC: &str = "02:00:0a:42:00:01";
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Set (to anything) to keep each lab's scratch directory (consoles, agent
/// log, inventory) after the lab is gone.
pub const KEEP_ENV: &str = "PXE_VM_KEEP";

static SEQ: AtomicU32 = AtomicU32::new(0);

/// How the VMs reach the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wiring {
    /// One tap; the agent attaches to it.
    Tap,
    /// `taps` taps on a bridge; the agent attaches to the bridge.
    Bridge { taps: usize },
}

/// Which IP families the guests' segment carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// IPv4 only: the server has [`SERVER_IP`]; radvd advertises nothing
    /// but its presence (see the module docs).
    V4,
    /// Both: the server also has [`SERVER_IP6`]; no radvd, the agent's
    /// own router advertisements (the inventory's `ra:`) start the
    /// guests' DHCPv6.
    DualStack,
    /// IPv6 only: the server has [`SERVER_IP6`] and no IPv4 address,
    /// and the agent serves DHCPv6 alone there (no XDP program); the
    /// agent's router advertisements start the guests' DHCPv6.
    V6Only,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct BootLabConfig {
    /// Lab name prefix (lowercase letters and digits).
    pub prefix: String,
    /// The `pxe-agent` binary.
    pub agent: PathBuf,
    /// The inventory, as YAML text.
    pub inventory: String,
    pub wiring: Wiring,
    /// `--xdp-mode`: `auto`, `native` or `skb`.
    pub xdp_mode: String,
    /// More arguments for `pxe-agent run`.
    pub extra_args: Vec<String>,
    /// Environment variables for `pxe-agent run` (`KUBECONFIG`, ...).
    pub env: Vec<(String, String)>,
    /// The agent reads its inventory from the Kubernetes API (`--kube`),
    /// not from the inventory file.
    pub kube: bool,
    /// Programs (name, program and arguments) started in the server
    /// namespace before the agent, for the lab's lifetime: what the agent
    /// needs from the start, such as an API server.
    pub helpers: Vec<(String, Vec<String>)>,
    /// Run radvd on the server interface (see the module docs).
    pub radvd: bool,
    pub family: Family,
    /// A program (and its arguments) that runs the agent in its own place,
    /// such as `setpriv` with the DaemonSet's capabilities.
    pub wrapper: Vec<String>,
}

impl BootLabConfig {
    /// One tap, `--xdp-mode auto`, radvd on.
    pub fn new(prefix: &str, agent: &Path, inventory: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            agent: agent.to_path_buf(),
            inventory: inventory.to_owned(),
            wiring: Wiring::Tap,
            xdp_mode: "auto".into(),
            extra_args: Vec::new(),
            env: Vec::new(),
            kube: false,
            helpers: Vec::new(),
            radvd: true,
            family: Family::V4,
            wrapper: Vec::new(),
        }
    }

    /// Gives the segment IPv6 as `family` says, without radvd.
    pub fn family(mut self, family: Family) -> Self {
        self.family = family;
        if family != Family::V4 {
            self.radvd = false;
        }
        self
    }

    /// Runs the agent through `wrapper` (program first), which execs it.
    pub fn wrapper(mut self, wrapper: Vec<String>) -> Self {
        self.wrapper = wrapper;
        self
    }

    /// `taps` taps on a bridge, the agent on the bridge in skb mode.
    pub fn bridge(mut self, taps: usize) -> Self {
        self.wiring = Wiring::Bridge { taps };
        self.xdp_mode = "skb".into();
        self
    }

    pub fn xdp_mode(mut self, mode: &str) -> Self {
        self.xdp_mode = mode.to_owned();
        self
    }

    pub fn arg(mut self, arg: &str) -> Self {
        self.extra_args.push(arg.to_owned());
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// `--kube` instead of `--inventory`.
    pub fn kube(mut self) -> Self {
        self.kube = true;
        self
    }

    /// Starts `args` (program first) as helper `name` before the agent.
    pub fn helper(mut self, name: &str, args: &[&str]) -> Self {
        self.helpers.push((
            name.to_owned(),
            args.iter().map(|a| (*a).to_owned()).collect(),
        ));
        self
    }
}

/// The running lab. Field order is drop order: the agent (SIGTERM, so it
/// detaches XDP), then helpers such as radvd, then the namespaces, then the
/// scratch directory.
pub struct BootLab {
    agent: Option<ChildGuard>,
    helpers: Vec<ChildGuard>,
    lab: Lab,
    iface: String,
    taps: Vec<String>,
    agent_bin: PathBuf,
    dir: ScratchDir,
    /// The agent's `--api-token-file`, which [`BootLab::cli`] passes on.
    token_file: Option<String>,
}

impl BootLab {
    /// Builds the network, fills the boot root and artifacts, starts radvd
    /// and the agent, and waits until the agent reports healthy.
    pub fn start(cfg: &BootLabConfig) -> anyhow::Result<BootLab> {
        Self::start_launched(cfg, |lab| Ok(lab.agent_command(cfg)))
    }

    /// Like [`BootLab::start`], but the agent is whatever `launch` returns
    /// once the lab's network and files are in place (such as a container
    /// engine running the agent's image). Its output goes to the agent log,
    /// and the lab waits for `/healthz` at [`METRICS_ADDR`] in the server
    /// namespace, as for its own agent. `cfg`'s agent settings (`xdp_mode`,
    /// `extra_args`, `env`, `kube`) are left to `launch`; [`BootLab::cli`]
    /// still runs `cfg.agent`.
    pub fn start_launched(
        cfg: &BootLabConfig,
        launch: impl FnOnce(&BootLab) -> anyhow::Result<Command>,
    ) -> anyhow::Result<BootLab> {
        let lab = Lab::new_with(&cfg.prefix, UNUSED_VETH_CIDR)?;
        let dir = ScratchDir::new(&cfg.prefix)?;
        let mut this = BootLab {
            agent: None,
            helpers: Vec::new(),
            lab,
            iface: String::new(),
            taps: Vec::new(),
            agent_bin: cfg.agent.clone(),
            dir,
            token_file: cfg
                .extra_args
                .windows(2)
                .find(|w| w[0] == "--api-token-file")
                .map(|w| w[1].clone()),
        };
        this.wire(cfg.wiring, cfg.family)?;
        if cfg.radvd {
            this.start_radvd()?;
        }
        this.fill_roots()?;
        fs::write(this.inventory_path(), &cfg.inventory)?;
        for (name, args) in &cfg.helpers {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            this.spawn_helper(name, &args)?;
        }
        let agent = launch(&this)?;
        this.start_agent(agent)?;
        Ok(this)
    }

    pub fn server_ns(&self) -> &str {
        self.lab.server_ns()
    }

    /// The interface the agent serves (the tap, or the bridge).
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// The taps VMs attach to.
    pub fn taps(&self) -> &[String] {
        &self.taps
    }

    /// The scratch directory: inventory, logs, boot root, artifacts, VM files.
    pub fn dir(&self) -> &Path {
        &self.dir.0
    }

    /// Served over TFTP and at `/` over HTTP (`--boot-root`).
    pub fn boot_root(&self) -> PathBuf {
        self.dir().join("boot")
    }

    /// Served at `/artifacts/` (`--artifacts`): `vmlinuz`, `initrd.img`.
    pub fn artifacts(&self) -> PathBuf {
        self.dir().join("artifacts")
    }

    pub fn inventory_path(&self) -> PathBuf {
        self.dir().join("inventory.yaml")
    }

    /// A VM on tap `tap`, its files in the lab's scratch directory.
    pub fn vm_spec(&self, name: &str, mac: &str, firmware: Firmware, tap: usize) -> VmSpec {
        let tap = self.taps.get(tap).map_or("missing-tap", String::as_str);
        VmSpec::new(name, mac, firmware, tap, &self.dir().join("vms"))
    }

    /// Copies Debian's signed shim and grub (see [`signed`]) into the boot
    /// root as `shimx64.efi` and `grubx64.efi`, where shim looks for grub.
    pub fn add_signed_chain(&self) -> anyhow::Result<()> {
        let chain = signed::ensure()?;
        let boot = self.boot_root();
        for (src, name) in [
            (&chain.shim, signed::SHIM_FILE),
            (&chain.grub, signed::GRUB_FILE),
        ] {
            fs::copy(src, boot.join(name))
                .with_context(|| format!("failed to copy {}", src.display()))?;
        }
        Ok(())
    }

    /// Starts a VM inside the lab's server namespace.
    pub fn start_vm(&self, spec: &VmSpec) -> anyhow::Result<Vm> {
        Vm::start(self.server_ns(), spec)
    }

    /// A command running `program` in the server namespace.
    pub fn cmd(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.lab.cmd_in(self.server_ns(), program)
    }

    /// Runs `pxe-agent <args>` against the running agent and returns its output.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = self.cmd(&self.agent_bin);
        if let Some(tokens) = &self.token_file {
            cmd.env("PXE_AGENT_TOKEN_FILE", tokens);
        }
        process::run(cmd.args(args))
    }

    /// The agent's log so far (terminal escapes removed).
    pub fn agent_log(&self) -> String {
        read_clean(&self.dir().join("agent.log"))
    }

    /// The last `lines` lines of the agent's log.
    pub fn agent_log_tail(&self, lines: usize) -> String {
        let log = self.agent_log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The XDP attach mode the agent logged (`Native`, `Skb`).
    pub fn xdp_mode(&self) -> Option<String> {
        self.agent_log()
            .lines()
            .filter(|l| l.contains("XDP program attached"))
            .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("mode=")))
            .map(str::to_owned)
    }

    /// Whether something in the server namespace listens on UDP `port`.
    pub fn udp_listening(&self, port: u16) -> bool {
        let filter = format!("sport = :{port}");
        self.lab
            .run_in(self.server_ns(), &["ss", "-Hlun", &filter])
            .is_ok_and(|out| !out.trim().is_empty())
    }

    /// Replaces the inventory atomically; the agent reloads it.
    pub fn replace_inventory(&self, yaml: &str) -> anyhow::Result<()> {
        let tmp = self.dir().join("inventory.yaml.new");
        fs::write(&tmp, yaml)?;
        fs::rename(&tmp, self.inventory_path())?;
        Ok(())
    }

    /// Starts `args` (program first) in the server namespace for the lab's
    /// lifetime, its output in `<dir>/<name>.log`.
    pub fn spawn_helper(&mut self, name: &str, args: &[&str]) -> anyhow::Result<()> {
        let ns = self.server_ns().to_owned();
        self.spawn_helper_in(&ns, name, args)
    }

    /// Like [`BootLab::spawn_helper`], in namespace `ns` of the lab.
    pub fn spawn_helper_in(&mut self, ns: &str, name: &str, args: &[&str]) -> anyhow::Result<()> {
        let (program, rest) = args.split_first().context("spawn_helper needs a program")?;
        let log = fs::File::create(self.dir().join(format!("{name}.log")))?;
        let mut cmd = self.lab.cmd_in(ns, program);
        cmd.args(rest)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let mut helper = ChildGuard::spawn(&mut cmd)?;
        // A helper that refuses its arguments or configuration exits at once.
        thread::sleep(Duration::from_millis(200));
        if let Some(status) = helper.try_wait()? {
            bail!(
                "{name} exited at once ({status}): {}",
                self.helper_log(name).trim()
            );
        }
        self.helpers.push(helper);
        Ok(())
    }

    /// A helper's log (see [`BootLab::spawn_helper`]).
    pub fn helper_log(&self, name: &str) -> String {
        read_clean(&self.dir().join(format!("{name}.log")))
    }

    /// A namespace `<base>-<name>` on the guests' segment: a veth pair whose
    /// server end joins the lab's bridge, its other end (`pxcli0`)
    /// addressed `cidr` when given. For a second DHCP server or a plain
    /// DHCP client beside the guests; needs [`BootLabConfig::bridge`].
    pub fn add_segment_ns(&mut self, name: &str, cidr: Option<&str>) -> anyhow::Result<String> {
        ensure!(
            self.iface == BRIDGE,
            "a namespace on the segment needs the bridge wiring"
        );
        let link = self.lab.add_client_ns(name)?;
        self.ip(&["link", "set", &link.server_if, "master", BRIDGE])
            .with_context(|| format!("failed to put {} on the bridge", link.server_if))?;
        if let Some(cidr) = cidr {
            self.lab.run_in(
                &link.client_ns,
                &["ip", "addr", "add", cidr, "dev", &link.client_if],
            )?;
        }
        Ok(link.client_ns)
    }

    fn ip(&self, args: &[&str]) -> anyhow::Result<()> {
        process::run(Command::new("ip").args(["-n", self.server_ns()]).args(args))?;
        Ok(())
    }

    fn wire(&mut self, wiring: Wiring, family: Family) -> anyhow::Result<()> {
        let count = match wiring {
            Wiring::Tap => 1,
            Wiring::Bridge { taps } => taps,
        };
        ensure!(count > 0, "a boot lab needs at least one tap");
        for i in 0..count {
            let tap = format!("pxtap{i}");
            self.ip(&["tuntap", "add", "dev", &tap, "mode", "tap"])
                .with_context(|| format!("failed to create tap {tap}"))?;
            self.taps.push(tap);
        }
        match wiring {
            Wiring::Tap => self.iface = self.taps[0].clone(),
            Wiring::Bridge { .. } => {
                let br = BRIDGE;
                self.ip(&["link", "add", br, "type", "bridge", "stp_state", "0"])
                    .context("failed to create the bridge")?;
                self.ip(&["link", "set", br, "address", BRIDGE_MAC])?;
                for tap in self.taps.clone() {
                    self.ip(&["link", "set", &tap, "master", br])?;
                }
                self.ip(&["link", "set", br, "up"])?;
                self.iface = br.to_owned();
            }
        }
        for tap in self.taps.clone() {
            self.ip(&["link", "set", &tap, "up"])?;
        }
        let iface = self.iface.clone();
        if family != Family::V6Only {
            self.ip(&["addr", "add", SERVER_CIDR, "dev", &iface])
                .with_context(|| format!("failed to assign {SERVER_CIDR} to {iface}"))?;
        }
        if family != Family::V4 {
            // Past duplicate address detection at once, so the agent
            // finds it at start.
            let cidr = format!("{SERVER_IP6}/64");
            self.ip(&["-6", "addr", "add", &cidr, "dev", &iface, "nodad"])
                .with_context(|| format!("failed to assign {cidr} to {iface}"))?;
        }
        Ok(())
    }

    /// Whether the bridge passes the guests' IPv4 and ARP frames: off, a
    /// bridge filter drops them before the bridge device, where the
    /// agent's (generic) XDP program would see them, so a dual-stack
    /// segment becomes IPv6-only for the guests. Needs the bridge wiring.
    pub fn carry_guest_ipv4(&self, carried: bool) -> anyhow::Result<()> {
        ensure!(
            self.iface == BRIDGE,
            "filtering the guests' IPv4 needs the bridge wiring"
        );
        if carried {
            self.lab
                .run_in(
                    self.server_ns(),
                    &["nft", "delete", "table", "bridge", "v6only"],
                )
                .context("failed to remove the IPv6-only bridge filter")?;
            return Ok(());
        }
        let rules = "table bridge v6only {\n  chain in {\n    \
             type filter hook prerouting priority 0; policy accept;\n    \
             ether type { ip, arp } counter drop\n  }\n}\n";
        let file = self.dir().join("v6only.nft");
        fs::write(&file, rules)?;
        self.lab
            .run_in(self.server_ns(), &["nft", "-f", &path_str(&file)?])
            .context("failed to load the IPv6-only bridge filter")?;
        Ok(())
    }

    /// Frames the IPv6-only filter dropped (IPv4 and ARP from the guests).
    pub fn ipv4_frames_dropped(&self) -> anyhow::Result<u64> {
        let out = self.lab.run_in(
            self.server_ns(),
            &["nft", "list", "table", "bridge", "v6only"],
        )?;
        out.split_whitespace()
            .skip_while(|w| *w != "packets")
            .nth(1)
            .context("no counter in the IPv6-only filter")?
            .parse()
            .context("counter")
    }

    fn start_radvd(&mut self) -> anyhow::Result<()> {
        // radvd refuses to advertise unless the namespace forwards IPv6.
        self.lab.run_in(
            self.server_ns(),
            &["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"],
        )?;
        // No prefix and a zero router lifetime: iPXE stops waiting for
        // IPv6 autoconfiguration and configures nothing from it.
        let conf = self.dir().join("radvd.conf");
        fs::write(
            &conf,
            format!(
                "interface {} {{\n    AdvSendAdvert on;\n    IgnoreIfMissing on;\n    \
                 AdvDefaultLifetime 0;\n    MinRtrAdvInterval 3;\n    MaxRtrAdvInterval 10;\n}};\n",
                self.iface
            ),
        )?;
        let pid = self.dir().join("radvd.pid");
        let (conf, pid) = (path_str(&conf)?, path_str(&pid)?);
        self.spawn_helper(
            "radvd",
            &["radvd", "-n", "-m", "stderr", "-C", &conf, "-p", &pid],
        )
        .context("failed to start radvd (install radvd: `cargo xtask setup`)")
    }

    /// Copies the iPXE binaries the image has into the boot root (from
    /// Debian's ipxe package, as the image does), and the guest kernel
    /// and a freshly built initramfs into the artifacts.
    fn fill_roots(&self) -> anyhow::Result<()> {
        let boot = self.boot_root();
        fs::create_dir_all(&boot)?;
        for name in IPXE_FILES {
            let src = Path::new(IPXE_DIR).join(name);
            // Copies, not symlinks: the agent refuses links out of its roots.
            fs::copy(&src, boot.join(name)).with_context(|| {
                format!(
                    "failed to copy {} (install ipxe: `cargo xtask setup`)",
                    src.display()
                )
            })?;
        }
        let artifacts = self.artifacts();
        fs::create_dir_all(&artifacts)?;
        let assets = guest::ensure()?;
        link_or_copy(&assets.kernel.vmlinuz, &artifacts.join("vmlinuz"))?;
        initramfs::build(&assets, &artifacts.join("initrd.img"))?;
        Ok(())
    }

    /// `pxe-agent run` on the lab's interface, roots and inventory, through
    /// the configured wrapper when there is one.
    fn agent_command(&self, cfg: &BootLabConfig) -> Command {
        let mut cmd = match cfg.wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = self.cmd(program);
                cmd.args(args).arg(&cfg.agent);
                cmd
            }
            None => self.cmd(&cfg.agent),
        };
        cmd.args(["run", "--interface", &self.iface]);
        if cfg.kube {
            cmd.arg("--kube");
        } else {
            cmd.arg("--inventory").arg(self.inventory_path());
        }
        cmd.arg("--state-dir")
            .arg(self.dir().join("state"))
            .arg("--boot-root")
            .arg(self.boot_root())
            .arg("--artifacts")
            .arg(self.artifacts())
            .args(["--xdp-mode", &cfg.xdp_mode, "--metrics-addr", METRICS_ADDR])
            .args(&cfg.extra_args)
            .envs(cfg.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Starts `cmd` as the agent and waits until it reports healthy.
    fn start_agent(&mut self, mut cmd: Command) -> anyhow::Result<()> {
        let log = fs::File::create(self.dir().join("agent.log"))?;
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let mut agent = ChildGuard::spawn(&mut cmd)?;
        let url = format!("http://{METRICS_ADDR}/healthz");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = agent.try_wait()? {
                bail!(
                    "pxe-agent exited before it was ready ({status}); log:\n{}",
                    self.agent_log_tail(30)
                );
            }
            let health = ["curl", "-sf", "-m", "1", "-o", "/dev/null", &url];
            if self.lab.run_in(self.server_ns(), &health).is_ok() {
                break;
            }
            if Instant::now() >= deadline {
                bail!(
                    "pxe-agent not healthy after {}s; log:\n{}",
                    READY_TIMEOUT.as_secs(),
                    self.agent_log_tail(30)
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
        self.agent = Some(agent);
        Ok(())
    }
}

fn path_str(path: &Path) -> anyhow::Result<String> {
    path.to_str()
        .map(str::to_owned)
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

fn read_clean(path: &Path) -> String {
    let bytes = fs::read(path).unwrap_or_default();
    bytes
        .split(|&b| b == b'\n')
        .map(clean_line)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A hard link where the file system allows one (the kernel is 8 MB), a
/// copy otherwise.
fn link_or_copy(src: &Path, dest: &Path) -> anyhow::Result<()> {
    if fs::hard_link(src, dest).is_ok() {
        return Ok(());
    }
    fs::copy(src, dest).with_context(|| format!("failed to copy {}", src.display()))?;
    Ok(())
}

/// `$TMPDIR/pxe-vm-<prefix>-<pid>-<n>`, removed on drop unless [`KEEP_ENV`] is set.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(prefix: &str) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "pxe-vm-{prefix}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::env::var_os(KEEP_ENV).is_some() {
            eprintln!("{KEEP_ENV} set: keeping {}", self.0.display());
            return;
        }
        let _ = fs::remove_dir_all(&self.0);
    }
}

//! The benchmark's network: one [`Lab`] (server and client namespaces
//! joined by a veth pair) set up so that every server faces the same client
//! side and each side's packet work runs on its own cores.
//!
//! - The client end has [`CLIENT_CIDR`], so perfdhcp can relay from it.
//! - The server end has [`SERVER_CIDR6`] besides its link-local address,
//!   which DHCPv6 servers need to serve that subnet; perfdhcp -6 sends from
//!   the client end's link-local address, used once DAD has passed.
//! - `pxe-agent veth-peer` runs on the client end for the whole run: XDP_TX
//!   replies only reach a veth peer that runs NAPI (docs/veth.md).
//! - dhcp-loadgen sends on a second veth pair inside the client namespace
//!   ([`SENDER_IF`]), whose far end redirects every frame into the client
//!   end (`veth-peer --redirect-to`). The server end then receives XDP
//!   frames in page buffers, as a NIC hands them to XDP and to the stack,
//!   instead of socket buffers that veth copies into a page before it runs
//!   an XDP program. Answers come back on the client end as before.
//! - Both ends run NAPI in a kernel thread of their own (threaded NAPI),
//!   pinned to the server cores and the generator's core. Otherwise the
//!   kernel does the receiving end's work in softirq inside the sender's
//!   system call, on the sender's core, and charges it to the sender.
//! - GRO on the server end gives it NAPI without an XDP program (Kea and
//!   dnsmasq); TSO off on both ends makes the veth hand every frame to that
//!   NAPI rather than to the backlog of the sending core.
//!
//! Owns the lab and the peer program; servers and generators run in it
//! but belong to their own modules.

use std::{
    cell::RefCell,
    collections::BTreeSet,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use xtask::{ChildGuard, Lab};

use super::{
    cpu::{self, Cores},
    hosts::{CLIENT_CIDR, SERVER_CIDR6},
};

pub const LAB_PREFIX: &str = "pxbench";
/// Where dhcp-loadgen sends; [`SENDER_PEER`] redirects to the client end.
pub const SENDER_IF: &str = "pxgen0";
const SENDER_PEER: &str = "pxgen1";
const ATTACH_TIMEOUT: Duration = Duration::from_secs(20);

/// The binaries the benchmark runs.
#[derive(Clone, Debug)]
pub struct Bins {
    pub agent: PathBuf,
    pub loadgen: PathBuf,
}

/// The NAPI threads of the two veth ends.
#[derive(Clone, Copy, Debug)]
pub struct NapiThreads {
    pub server: u32,
    pub client: u32,
}

/// Field order matters: the peer programs stop before the lab goes.
pub struct Testbed {
    peer: RefCell<ChildGuard>,
    redirect: RefCell<ChildGuard>,
    pub lab: Lab,
    pub napi: NapiThreads,
    pub cores: Cores,
    /// The server end's MAC, where a relay sends.
    pub server_mac: String,
}

impl Testbed {
    pub fn new(bins: &Bins, cores: Cores) -> anyhow::Result<Testbed> {
        let lab = Lab::new(LAB_PREFIX)?;
        configure_links(&lab)?;
        let peer = start_peer(&lab, &bins.agent, lab.client_if(), None)?;
        let redirect = start_peer(&lab, &bins.agent, SENDER_PEER, Some(lab.client_if()))?;
        let napi = thread_napi(&lab, &cores)?;
        let address = format!("/sys/class/net/{}/address", lab.server_if());
        let server_mac = lab
            .run_in(lab.server_ns(), &["cat", &address])
            .with_context(|| format!("failed to read {address}"))?
            .trim()
            .to_owned();
        Ok(Testbed {
            server_mac,
            peer: RefCell::new(peer),
            redirect: RefCell::new(redirect),
            lab,
            napi,
            cores,
        })
    }

    pub fn server_ns(&self) -> &str {
        self.lab.server_ns()
    }

    pub fn client_ns(&self) -> &str {
        self.lab.client_ns()
    }

    pub fn server_if(&self) -> &str {
        self.lab.server_if()
    }

    pub fn client_if(&self) -> &str {
        self.lab.client_if()
    }

    /// Fails if a peer program has exited: without them, XDP_TX replies or
    /// the generator's requests would silently stop arriving.
    pub fn check_peer(&self) -> anyhow::Result<()> {
        for peer in [&self.peer, &self.redirect] {
            if let Some(status) = peer.borrow_mut().try_wait()? {
                bail!("pxe-agent veth-peer exited ({status})");
            }
        }
        Ok(())
    }
}

fn configure_links(lab: &Lab) -> anyhow::Result<()> {
    let (srv, cli) = (lab.server_ns(), lab.client_ns());
    let (srv_if, cli_if) = (lab.server_if(), lab.client_if());
    lab.run_in(cli, &["ip", "addr", "add", CLIENT_CIDR, "dev", cli_if])
        .with_context(|| format!("failed to assign {CLIENT_CIDR} to {cli_if}"))?;
    lab.run_in(
        srv,
        &["ip", "addr", "add", SERVER_CIDR6, "dev", srv_if, "nodad"],
    )
    .with_context(|| format!("failed to assign {SERVER_CIDR6} to {srv_if}"))?;
    wait_link_local(lab, cli, cli_if)?;
    wait_link_local(lab, srv, srv_if)?;
    lab.run_in(srv, &["ethtool", "-K", srv_if, "gro", "on", "tso", "off"])
        .with_context(|| format!("failed to set GRO on, TSO off on {srv_if}"))?;
    lab.run_in(cli, &["ethtool", "-K", cli_if, "tso", "off"])
        .with_context(|| format!("failed to set TSO off on {cli_if}"))?;
    let add = [
        "ip",
        "link",
        "add",
        SENDER_IF,
        "type",
        "veth",
        "peer",
        "name",
        SENDER_PEER,
    ];
    lab.run_in(cli, &add)
        .with_context(|| format!("failed to add the sender pair {SENDER_IF}/{SENDER_PEER}"))?;
    for iface in [SENDER_IF, SENDER_PEER] {
        lab.run_in(cli, &["ethtool", "-K", iface, "tso", "off"])
            .with_context(|| format!("failed to set TSO off on {iface}"))?;
        lab.run_in(cli, &["ip", "link", "set", iface, "up"])
            .with_context(|| format!("failed to bring {iface} up"))?;
    }
    Ok(())
}

/// Waits until `iface` in `ns` has a link-local address that has passed
/// duplicate address detection (a tentative one cannot be bound).
fn wait_link_local(lab: &Lab, ns: &str, iface: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let show = ["ip", "-6", "addr", "show", "dev", iface, "scope", "link"];
    loop {
        let out = lab.run_in(ns, &show)?;
        if out.contains("inet6 fe80:") && !out.contains("tentative") {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{iface} has no usable link-local address after 10 s: {out}"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `pxe-agent veth-peer` on `iface` in the client namespace, passing
/// frames up or redirecting them to `redirect_to`, until the testbed goes.
pub(crate) fn start_peer(
    lab: &Lab,
    agent: &Path,
    iface: &str,
    redirect_to: Option<&str>,
) -> anyhow::Result<ChildGuard> {
    let mut cmd = lab.cmd_in(lab.client_ns(), agent);
    cmd.args(["veth-peer", "--interface", iface])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if let Some(target) = redirect_to {
        cmd.args(["--redirect-to", target]);
    }
    let mut peer = ChildGuard::spawn(&mut cmd)?;
    let deadline = Instant::now() + ATTACH_TIMEOUT;
    let show = ["ip", "link", "show", "dev", iface];
    while !lab
        .run_in(lab.client_ns(), &show)
        .is_ok_and(|out| out.contains(" xdp"))
    {
        if let Some(status) = peer.try_wait()? {
            bail!("pxe-agent veth-peer exited before attaching ({status})");
        }
        ensure!(
            Instant::now() < deadline,
            "pxe-agent veth-peer did not attach"
        );
        thread::sleep(Duration::from_millis(100));
    }
    Ok(peer)
}

/// Turns on threaded NAPI on both ends and pins each end's thread to its
/// side's cores.
fn thread_napi(lab: &Lab, cores: &Cores) -> anyhow::Result<NapiThreads> {
    let server = thread_napi_of(lab, lab.server_ns(), lab.server_if())?;
    let client = thread_napi_of(lab, lab.client_ns(), lab.client_if())?;
    cpu::pin(server, &cores.server)?;
    cpu::pin(client, &[cores.generator])?;
    Ok(NapiThreads { server, client })
}

/// The thread that appears when `iface` in `ns` switches to threaded NAPI;
/// thread names are not unique across namespaces, so it is the new one.
pub(crate) fn thread_napi_of(lab: &Lab, ns: &str, iface: &str) -> anyhow::Result<u32> {
    let before = cpu::napi_threads(iface);
    let defer = std::env::var("PXB_DEFER").unwrap_or("0".into());
    let timeout = std::env::var("PXB_TIMEOUT").unwrap_or("0".into());
    let script = format!(
        "echo {defer} > /sys/class/net/{iface}/napi_defer_hard_irqs; echo {timeout} > /sys/class/net/{iface}/gro_flush_timeout; echo 1 > /sys/class/net/{iface}/threaded"
    );
    lab.run_in(ns, &["sh", "-c", &script])
        .with_context(|| format!("failed to enable threaded NAPI on {iface}"))?;
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let new: BTreeSet<u32> = cpu::napi_threads(iface)
            .difference(&before)
            .copied()
            .collect();
        match new.len() {
            1 => return Ok(*new.first().context("unreachable: one element")?),
            0 if Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
            0 => bail!("no NAPI thread appeared for {iface} after enabling threaded NAPI"),
            n => bail!("{n} NAPI threads appeared for {iface}; expected one (one queue)"),
        }
    }
}

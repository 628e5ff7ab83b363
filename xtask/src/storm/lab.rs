//! The storm's routed network: a server namespace and a client namespace
//! that plays the relay/router of a rack and holds every machine address.
//!
//! - Server end 10.64.0.1/16, route to the machine space 10.66.0.0/15 via
//!   the client end 10.64.0.2.
//! - Client end 10.64.0.2/16; 10.66.0.0/15 is local there (AnyIP route on
//!   lo, `ip_nonlocal_bind`), so the simulator binds sockets to any
//!   machine's address, and the relay address 10.66.0.1 sits on lo.
//! - Threaded NAPI on the server end: its XDP work runs in a kernel thread
//!   whose CPU time the sampler adds to the server's.
//! - `pxe-agent veth-peer` on the client end: XDP_TX replies only reach a
//!   veth peer that runs NAPI (docs/veth.md).
//! - A queue on both ends (`pfifo_fast`, 100,000 packets a band): a veth
//!   with XDP on its peer hands packets to a ring of 256, and without a
//!   queue drops what does not fit; with one, the kernel (6.16 and later)
//!   holds them back. `pfifo_fast` is what a Linux host without `fq_codel`
//!   (which this kernel lacks) queues with: three bands by socket priority,
//!   first in first out within each.

use std::path::Path;

use anyhow::Context as _;
use xtask::{ChildGuard, Lab};

use crate::bench::dhcp::testbed::{start_peer, thread_napi_of};

/// Namespace prefix of the storm's labs.
const LAB_PREFIX: &str = "pxstorm";
/// The server address every stack uses.
pub const SERVER_IP: &str = "10.64.0.1";
const SERVER_CIDR: &str = "10.64.0.1/16";
const CLIENT_IP: &str = "10.64.0.2";
const CLIENT_CIDR: &str = "10.64.0.2/16";
/// The relay (giaddr) address, on the client namespace's lo.
pub const RELAY_IP: &str = "10.66.0.1";
/// The machines' address space.
pub const MACHINE_NET: &str = "10.66.0.0/15";

/// One run's network. Field order matters: the peer program stops before
/// the lab goes.
pub struct StormLab {
    peer: ChildGuard,
    pub lab: Lab,
    /// The server end's NAPI kernel thread.
    pub napi: u32,
}

impl StormLab {
    /// Builds the topology; `agent` is the pxe-agent binary (for `veth-peer`).
    /// `queue`: packets each end's `pfifo` holds.
    pub fn new(agent: &Path, queue: u32) -> anyhow::Result<StormLab> {
        let lab = Lab::new_with(LAB_PREFIX, SERVER_CIDR)?;
        let (srv, cli) = (lab.server_ns(), lab.client_ns());
        let cli_if = lab.client_if();
        let steps: [&[&str]; 5] = [
            &["ip", "addr", "add", CLIENT_CIDR, "dev", cli_if],
            &["ip", "route", "add", "local", MACHINE_NET, "dev", "lo"],
            &["ip", "addr", "add", &format!("{RELAY_IP}/32"), "dev", "lo"],
            &["sysctl", "-q", "net.ipv4.ip_nonlocal_bind=1"],
            &["ethtool", "-K", cli_if, "tso", "off"],
        ];
        for step in steps {
            lab.run_in(cli, step)
                .with_context(|| format!("client namespace: {}", step.join(" ")))?;
        }
        lab.run_in(srv, &["ip", "route", "add", MACHINE_NET, "via", CLIENT_IP])
            .context("failed to route the machine space to the client namespace")?;
        lab.run_in(
            srv,
            &["ethtool", "-K", lab.server_if(), "gro", "on", "tso", "off"],
        )
        .context("failed to set GRO on, TSO off on the server end")?;
        // Tens of thousands of machines connect at once: deeper listen
        // queues and every local port. Only per-namespace settings: the
        // socket buffer maxima and netdev_max_backlog are the machine's.
        for ns in [srv, cli] {
            lab.run_in(
                ns,
                &[
                    "sysctl",
                    "-q",
                    "net.core.somaxconn=65535",
                    "net.ipv4.ip_local_port_range=1024 65535",
                ],
            )
            .with_context(|| format!("failed to raise socket limits in {ns}"))?;
        }
        for (ns, iface) in [(srv, lab.server_if()), (cli, cli_if)] {
            self::queue(&lab, ns, iface, queue)?;
        }
        let peer = start_peer(&lab, agent, cli_if, None)?;
        let napi = thread_napi_of(&lab, srv, lab.server_if())?;
        Ok(StormLab { peer, lab, napi })
    }

    /// Fails if the peer program has exited (replies would stop arriving).
    pub fn check_peer(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.peer.try_wait()? {
            anyhow::bail!("pxe-agent veth-peer exited ({status})");
        }
        Ok(())
    }
}

/// Gives `iface` a queue (`pfifo_fast`, `limit` packets a band): veth
/// then holds a packet back while its peer's ring is full, where the
/// default (`noqueue`) drops it. A lock-step TFTP transfer pays for a
/// dropped packet with a timeout, so drops in the lab, not the servers,
/// decided how many machines booted.
fn queue(lab: &Lab, ns: &str, iface: &str, limit: u32) -> anyhow::Result<()> {
    let limit = limit.to_string();
    let steps: [&[&str]; 2] = [
        &["ip", "link", "set", "dev", iface, "txqueuelen", &limit],
        &["tc", "qdisc", "replace", "dev", iface, "root", "pfifo_fast"],
    ];
    for step in steps {
        lab.run_in(ns, step)
            .with_context(|| format!("{ns}: {}", step.join(" ")))?;
    }
    Ok(())
}

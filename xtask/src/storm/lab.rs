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
//! - Rings of their own for XDP answers, as a NIC has transmit rings for
//!   XDP apart from the stack's: the client end has one receive ring per
//!   CPU plus one, veth hands the XDP program's `XDP_TX` frames from CPU c
//!   to ring c, and the server end's transmit-queue map (XPS) sends all of
//!   the stack's traffic to the last. With one ring, the replies of every
//!   stack's DHCP server still share it, as before: only XDP answers skip
//!   the queue.
//! - A queue on both ends (`pfifo_fast`, 100,000 packets a band): a veth
//!   with XDP on its peer hands packets to a ring of 256, and without a
//!   queue drops what does not fit; with one, the kernel (6.16 and later)
//!   holds them back. `pfifo_fast` is what a Linux host without `fq_codel`
//!   (which this kernel lacks) queues with: three bands by socket priority,
//!   first in first out within each.

use std::path::Path;

use anyhow::Context as _;
use xtask::{ChildGuard, Lab, lab::Queues};

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
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let queues = Queues {
            server_tx: cpus + 1,
            client_rx: cpus + 1,
        };
        let lab = Lab::new_with_queues(LAB_PREFIX, SERVER_CIDR, queues)?;
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
        stack_to_last_queue(&lab, srv, lab.server_if(), cpus)?;
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

/// Sends everything the stack transmits on `iface` (of `cpus + 1` transmit
/// queues) through the last queue, whose packets veth puts in the peer's
/// last receive ring; the others carry no stack traffic.
fn stack_to_last_queue(lab: &Lab, ns: &str, iface: &str, cpus: u32) -> anyhow::Result<()> {
    for queue in 0..=cpus {
        let mask = if queue == cpus {
            cpu_mask(cpus)
        } else {
            "0".to_owned()
        };
        let path = format!("/sys/class/net/{iface}/queues/tx-{queue}/xps_cpus");
        lab.run_in(ns, &["sh", "-c", &format!("echo {mask} > {path}")])
            .with_context(|| format!("{ns}: failed to write {mask} to {path}"))?;
    }
    Ok(())
}

/// The hex CPU mask of CPUs `0..cpus` as sysfs takes it (groups of 32
/// bits, comma-separated, most significant first).
fn cpu_mask(cpus: u32) -> String {
    let words = cpus.div_ceil(32).max(1);
    (0..words)
        .rev()
        .map(|w| {
            let bits = cpus.saturating_sub(w * 32).min(32);
            let word = if bits == 32 {
                u32::MAX
            } else {
                (1u32 << bits) - 1
            };
            format!("{word:08x}")
        })
        .collect::<Vec<_>>()
        .join(",")
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

#[cfg(test)]
mod tests {
    use super::cpu_mask;

    #[test]
    fn cpu_masks_cover_every_cpu() {
        assert_eq!(cpu_mask(2), "00000003");
        assert_eq!(cpu_mask(32), "ffffffff");
        assert_eq!(cpu_mask(33), "00000001,ffffffff");
    }
}

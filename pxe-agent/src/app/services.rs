//! Starting the packet services: the DHCP slow path (supervised, restarted
//! after a panic) and the PXE boot server, TFTP and the HTTP listeners, and
//! the socket options that keep DHCP first in the host's queues.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use axum::{
    Router,
    extract::connect_info::Connected,
    serve::{IncomingStream, Listener},
};
use tracing::{error, info, warn};

use super::{config::RunConfig, interfaces::Iface};
use crate::{
    clock,
    dhcp::{
        Server,
        server::{self, Limits},
    },
    http::BootState,
    netdev,
    rawsock::RawSocket,
    shutdown::Shutdown,
    state::State,
    tftp,
};

/// Receive buffer of the slow path's port-67 socket and of the DHCPv6
/// socket (port 547), in bytes.
pub(super) const SLOW_PATH_RCVBUF: usize = 8 << 20;

/// Receive buffer of the TFTP listener on port 69 (read requests only;
/// each transfer has a socket of its own).
pub(super) const TFTP_RCVBUF: usize = 8 << 20;

/// Binds UDP port 69 on each interface and serves `root` over TFTP there,
/// turning finished transfers into boot progress. One server (one set of
/// counters) serves a socket per interface; its transfers stay on the
/// interface their request came in on.
pub(super) async fn start_tftp(
    cfg: &RunConfig,
    ifaces: &[Iface],
    root: &Path,
    boot: Arc<BootState>,
    shutdown: Shutdown,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<Result<(), tftp::ServeError>>>> {
    use socket2::{Domain, Protocol, Socket, Type};
    // A block must fit one frame on every interface (a VLAN's MTU may be
    // below its parent's).
    let mut mtu = u32::MAX;
    for iface in ifaces {
        mtu = mtu.min(netdev::mtu_of(&iface.name)?);
    }
    let tftp_cfg = tftp::TftpConfig {
        max_blksize: tftp::TftpConfig::blksize_for_mtu(mtu),
        max_windowsize: cfg.tftp_max_windowsize,
        max_transfers: cfg.tftp_max_transfers,
        max_waiting: cfg.tftp_max_waiting,
        busy_poll: cfg.tftp_busy_poll,
        ..tftp::TftpConfig::new(root)
    };
    let gate_state = boot.shared.clone();
    let gate: tftp::Gate = Arc::new(move |ip| {
        if !gate_state.inventory().withholds_boot_at(ip) {
            return None;
        }
        crate::netboot::Counters::bump(&gate_state.netboot.counters.refused_tftp);
        Some("netboot: this host is given no boot file now")
    });
    let server = tftp::Server::new(tftp_cfg)
        .with_context(|| format!("cannot serve {} over TFTP", root.display()))?
        .with_generated(Arc::new(crate::http::grub::TftpConfigs(boot.clone())))
        .with_gate(gate);
    boot.tftp_stats.set(server.stats()).ok();
    let mut socks = Vec::with_capacity(ifaces.len());
    for iface in ifaces {
        // The interface's turns, shared with the boot HTTP listener's file
        // sends that arrive at its addresses.
        let addrs: Vec<IpAddr> = [iface.ip.map(IpAddr::from), iface.ip6.map(IpAddr::from)]
            .into_iter()
            .flatten()
            .collect();
        let admission = boot.shared.admission.interface(&iface.name, &addrs);
        // IPv6 too where the interface has an address for boot URLs; a
        // transfer's socket takes its listener's family (`tftp::worker`).
        let wildcards = [
            iface.ip.map(|_| IpAddr::from(Ipv4Addr::UNSPECIFIED)),
            iface
                .ip6
                .map(|_| IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED)),
        ]
        .into_iter()
        .flatten();
        for wildcard in wildcards {
            let sock = Socket::new(
                Domain::for_address(SocketAddr::new(wildcard, 69)),
                Type::DGRAM,
                Some(Protocol::UDP),
            )
            .context("failed to open the TFTP socket")?;
            if wildcard.is_ipv6() {
                sock.set_only_v6(true)?;
            }
            sock.set_reuse_address(true)?;
            sock.bind_device(Some(iface.name.as_bytes()))
                .with_context(|| format!("failed to bind the TFTP socket to {}", iface.name))?;
            sock.bind(&SocketAddr::new(wildcard, 69).into())
                .with_context(|| {
                    format!("failed to bind UDP port 69 ({wildcard}) on {}", iface.name)
                })?;
            // A room powering on sends thousands of read requests within a
            // second; the default buffer holds a few hundred.
            if let Err(e) = force_recv_buffer(&sock, TFTP_RCVBUF) {
                warn!(iface = %iface.name, error = %e, "could not enlarge the TFTP socket's receive buffer");
            }
            sock.set_nonblocking(true)?;
            socks.push((
                tokio::net::UdpSocket::from_std(sock.into())?,
                admission.clone(),
            ));
            info!(iface = %iface.name, root = %root.display(), %wildcard, "serving TFTP on UDP port 69");
        }
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel::<tftp::TransferEvent>(1024);
    tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            let Some(mac) = boot.shared.mac_at(event.peer.ip()).await else {
                continue;
            };
            let at = clock::unix_ms(event.finished);
            let how = match &event.outcome {
                tftp::Outcome::Done => "done".to_string(),
                // UEFI firmware asks for the size, aborts, then asks again:
                // part of a normal boot, not a failure.
                tftp::Outcome::Failed(
                    e @ (tftp::TransferError::Peer { .. } | tftp::TransferError::Superseded { .. }),
                ) => {
                    format!("stopped ({e})")
                }
                tftp::Outcome::Failed(e) => format!("failed: {e}"),
            };
            let detail = format!("{} {} B {how}", event.file, event.bytes);
            let what = how.split([' ', ':']).next().unwrap_or_default();
            boot.shared.progress.tftp_transfer(mac, at, what, detail);
        }
    });
    Ok(socks
        .into_iter()
        .map(|(sock, admission)| {
            tokio::spawn(server.clone().with_admission(admission).serve(
                sock,
                Some(tx.clone()),
                shutdown.clone(),
            ))
        })
        .collect())
}

/// Queue priority of the DHCP replies the slow path sends
/// (`TC_PRIO_INTERACTIVE`): the first band of `pfifo_fast`, the qdisc of a
/// host without `fq_codel`, so a reply does not wait behind the boot files
/// queued on the same link. The fast path's replies (`XDP_TX`) pass no
/// queue at all.
pub(super) const DHCP_PRIORITY: libc::c_int = 6;

/// Gives the DHCP socket `fd` [`DHCP_PRIORITY`] (`SO_PRIORITY`; values up
/// to 6 need no privilege).
pub(super) fn prefer_dhcp(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    set_int_option(fd, libc::SO_PRIORITY, DHCP_PRIORITY)
}

/// [`prefer_dhcp`] for the two sockets `role` sends from; a failure is
/// logged, and the replies then queue with everything else.
pub(super) fn prefer_dhcp_sockets(sock: &impl std::os::fd::AsFd, raw: &RawSocket, role: &str) {
    use std::os::fd::AsFd as _;
    for fd in [sock.as_fd(), raw.as_fd()] {
        if let Err(e) = prefer_dhcp(fd) {
            warn!(error = %e, role, "could not give the DHCP sockets their queue priority");
        }
    }
}

/// Sets a socket's receive buffer past `rmem_max` (`SO_RCVBUFFORCE`, which
/// the agent's CAP_NET_ADMIN allows), else as far as `rmem_max` lets it.
pub(super) fn force_recv_buffer(sock: &socket2::Socket, bytes: usize) -> std::io::Result<()> {
    use std::os::fd::AsFd as _;
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    set_int_option(sock.as_fd(), libc::SO_RCVBUFFORCE, value)
        .or_else(|_| sock.set_recv_buffer_size(bytes))
}

/// Sets the `SOL_SOCKET` option `name` of `fd` to the integer `value`.
pub(super) fn set_int_option(
    fd: std::os::fd::BorrowedFd<'_>,
    name: libc::c_int,
    value: libc::c_int,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: value is a c_int of the size given, the fd is open.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Serves `router` on `listener` until shutdown, with peer addresses.
pub(super) fn serve_http<L>(
    listener: L,
    router: Router,
    mut shutdown: Shutdown,
) -> tokio::task::JoinHandle<std::io::Result<()>>
where
    L: Listener<Addr = SocketAddr>,
    for<'a> SocketAddr: Connected<IncomingStream<'a, L>>,
{
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            shutdown.stopped().await;
        })
        .await
    })
}

/// Binds the slow path's sockets on the interface and starts its thread,
/// and the PXE boot server's ([`start_boot_server`]): one of each per
/// interface, each answering as that interface's server.
pub(super) fn start_slow_path(
    cfg: &RunConfig,
    iface: &Iface,
    server: Server,
    shared: Arc<State>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))
        .context("failed to open the DHCP socket")?;
    sock.set_reuse_address(true)?;
    sock.set_broadcast(true)?;
    sock.bind_device(Some(iface.name.as_bytes()))
        .with_context(|| format!("failed to bind the DHCP socket to {}", iface.name))?;
    sock.bind(
        &SocketAddr::from((Ipv4Addr::UNSPECIFIED, pxe_ebpf_common::bootp::SERVER_PORT)).into(),
    )
    .with_context(|| format!("failed to bind UDP port 67 on {}", iface.name))?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    // Room for the requests that arrive while a batch's leases are being
    // committed (a few ms of fdatasync): the default buffer holds ~170.
    if let Err(e) = force_recv_buffer(&sock, SLOW_PATH_RCVBUF) {
        warn!(error = %e, "could not enlarge the DHCP socket's receive buffer");
    }
    let raw = RawSocket::send_only(&iface.name)
        .with_context(|| format!("failed to open a raw socket on {}", iface.name))?;
    prefer_dhcp_sockets(&sock, &raw, "slow path");
    let limits = cfg.limits;
    info!(iface = %iface.name, "slow path listening on UDP port 67");
    let sock: std::net::UdpSocket = sock.into();
    start_boot_server(iface, server, shared.clone(), stop.clone(), limits)?;
    std::thread::Builder::new()
        .name("dhcp-slow-path".into())
        .spawn(move || supervise_slow_path(&sock, &raw, server, &shared, limits, &stop, false))
        .context("failed to start the slow path thread")
}

/// Binds the PXE boot server port (UDP 4011) on the interface and starts
/// its thread: proxyDHCP clients send their follow-up DHCPREQUEST there
/// (docs/lifecycle.md, "proxyDHCP").
pub(super) fn start_boot_server(
    iface: &Iface,
    server: Server,
    shared: Arc<State>,
    stop: Arc<AtomicBool>,
    limits: Limits,
) -> anyhow::Result<()> {
    use socket2::{Domain, Protocol, Socket, Type};
    let port = pxe_ebpf_common::bootp::PXE_PORT;
    let sock = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))
        .context("failed to open the PXE boot server socket")?;
    sock.set_reuse_address(true)?;
    sock.bind_device(Some(iface.name.as_bytes()))
        .with_context(|| {
            format!(
                "failed to bind the PXE boot server socket to {}",
                iface.name
            )
        })?;
    sock.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)).into())
        .with_context(|| format!("failed to bind UDP port {port} on {}", iface.name))?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let raw = RawSocket::send_only(&iface.name)
        .with_context(|| format!("failed to open a raw socket on {}", iface.name))?;
    prefer_dhcp_sockets(&sock, &raw, "PXE boot server");
    info!(iface = %iface.name, "PXE boot server listening on UDP port {port}");
    let sock: std::net::UdpSocket = sock.into();
    std::thread::Builder::new()
        .name("dhcp-boot-server".into())
        .spawn(move || supervise_slow_path(&sock, &raw, server, &shared, limits, &stop, true))
        .context("failed to start the PXE boot server thread")?;
    Ok(())
}

/// Starts DHCPv6 on the interface when it has an IPv6 address a boot URL
/// can name (`dhcp::v6::server`), and the router advertisements of the
/// subnets that ask for them (`dhcp::v6::advert`); without one, or when UDP 547 cannot be
/// bound there (another DHCPv6 server holds it), says so and serves IPv4
/// only.
pub(super) fn start_dhcp6(
    cfg: &RunConfig,
    iface: &Iface,
    shared: Arc<State>,
    stop: Arc<AtomicBool>,
    beats: bool,
) -> anyhow::Result<Option<std::thread::JoinHandle<()>>> {
    use crate::dhcp::v6::{Server6, advert, server as server6};
    let Some(ip) = iface.ip6 else {
        info!(iface = %iface.name, "no IPv6 address beyond link-local: DHCPv6 not served there");
        return Ok(None);
    };
    let duid = server6::load_or_create_duid(&cfg.state_dir, iface.mac).with_context(|| {
        format!(
            "failed to keep the DHCPv6 server DUID in {}",
            cfg.state_dir.display()
        )
    })?;
    let index = netdev::index_of(&iface.name)
        .with_context(|| format!("failed to find interface {}", iface.name))?;
    let sock = match server6::bind(&iface.name, index) {
        Ok(sock) => sock,
        Err(e) => {
            warn!(iface = %iface.name, error = %e, "DHCPv6 not served: UDP port 547 could not be bound or ff02::1:2 joined");
            return Ok(None);
        }
    };
    // As the port-67 socket: room for the requests that arrive while the
    // thread waits for a CPU (the default buffer holds a few hundred).
    if let Err(e) = force_recv_buffer(&socket2::SockRef::from(&sock), SLOW_PATH_RCVBUF) {
        warn!(error = %e, "could not enlarge the DHCPv6 socket's receive buffer");
    }
    info!(iface = %iface.name, server = %ip, "DHCPv6 listening on UDP port 547");
    match advert::open(&iface.name, index) {
        Ok(sock) => {
            let (shared, stop, mac) = (shared.clone(), stop.clone(), iface.mac);
            std::thread::Builder::new()
                .name("ra".into())
                .spawn(move || advert::serve(&sock, index, ip, mac, &shared, &stop))
                .context("failed to start the router advertisement thread")?;
        }
        Err(e) => {
            warn!(iface = %iface.name, error = %e, "no router advertisements: the ICMPv6 socket could not be opened");
        }
    }
    let server = Server6 { ip, duid };
    let limits = cfg.limits;
    std::thread::Builder::new()
        .name("dhcp6".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    server6::serve(&sock, &server, &shared, limits, &stop, beats);
                }));
                if let Err(panic) = run {
                    error!(panic = %panic_message(panic.as_ref()), "DHCPv6 died; starting it again");
                    std::thread::sleep(SLOW_PATH_RESTART);
                }
            }
        })
        .context("failed to start the DHCPv6 thread")
        .map(Some)
}

/// Pause before a slow path that died is started again.
pub(super) const SLOW_PATH_RESTART: Duration = Duration::from_millis(200);

/// Runs the slow path until `stop`, starting it again whenever it dies,
/// so that nothing a client sends can end DHCP service for the others.
pub(super) fn supervise_slow_path(
    sock: &std::net::UdpSocket,
    raw: &RawSocket,
    server: Server,
    shared: &Arc<State>,
    limits: Limits,
    stop: &AtomicBool,
    boot_server: bool,
) {
    loop {
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if boot_server {
                server::serve_boot_server(sock, raw, server, shared.clone(), limits, stop)
            } else {
                server::serve(sock, raw, server, shared.clone(), limits, stop)
            }
        }));
        let Err(panic) = run else {
            shared.health.slow_path_down(None);
            return;
        };
        let why = panic_message(panic.as_ref());
        error!(panic = %why, "slow path died; starting it again");
        shared
            .health
            .slow_path_down(Some(format!("thread panicked: {why}")));
        std::thread::sleep(SLOW_PATH_RESTART);
        if stop.load(Ordering::Relaxed) {
            return;
        }
        shared.health.slow_path_restarted();
    }
}

/// The text of a panic payload.
pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dhcp_sockets_get_the_first_band_of_the_hosts_queue() {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        prefer_dhcp(sock.as_fd()).expect("SO_PRIORITY");
        let mut value: libc::c_int = -1;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: value and len describe a c_int buffer; the fd is open.
        let rc = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PRIORITY,
                (&raw mut value).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        // TC_PRIO_INTERACTIVE: band 0 in pfifo_fast's default priomap.
        assert_eq!(value, 6);
    }
}

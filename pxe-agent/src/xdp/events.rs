//! The fast path's stream of sent replies (a BPF ring buffer), read into
//! the boot-progress view.

use std::sync::Arc;

use aya::maps::{MapData, RingBuf};
use pxe_ebpf_common::{BootClass, ServedEvent, bootp};
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::watch,
};
use tracing::warn;

use crate::{dhcp::server::unix_now, inventory::MacAddr, progress::Progress};

/// Reads events until shutdown.
pub async fn stream(
    ring: RingBuf<MapData>,
    progress: Arc<Progress>,
    mut shutdown: watch::Receiver<bool>,
) {
    // SAFETY: the ring buffer owns its map fd, which stays open and the same
    // for as long as the AsyncFd owns the ring.
    let registered = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) };
    let mut fd = match registered {
        Ok(fd) => fd,
        Err(e) => {
            return warn!(error = %e, "cannot poll the XDP event ring; fast-path progress is not recorded");
        }
    };
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            guard = fd.readable_mut() => {
                let Ok(mut guard) = guard else { return };
                let ring = guard.get_inner_mut();
                while let Some(item) = ring.next() {
                    if let Some(event) = decode(&item) {
                        record(&progress, &event);
                    }
                }
                guard.clear_ready();
            }
        }
    }
}

fn decode(bytes: &[u8]) -> Option<ServedEvent> {
    if bytes.len() < size_of::<ServedEvent>() {
        return None;
    }
    // SAFETY: ServedEvent is repr(C) plain bytes and the length was checked;
    // read_unaligned makes no alignment assumption.
    Some(unsafe { bytes.as_ptr().cast::<ServedEvent>().read_unaligned() })
}

fn record(progress: &Progress, e: &ServedEvent) {
    let what = if e.msg_type == bootp::DHCPACK {
        "ack"
    } else {
        "offer"
    };
    let class = BootClass::ALL
        .get(usize::from(e.class))
        .map_or("?".to_string(), |c| format!("{c:?}").to_lowercase());
    let ip = std::net::Ipv4Addr::from(e.yiaddr);
    progress.dhcp(
        MacAddr(e.mac),
        unix_now(),
        format!("{what} {ip} ({class}, xdp)"),
    );
}

//! The fast path's stream of sent replies (a BPF ring buffer), read into
//! the boot-progress view.

use std::{sync::Arc, time::Duration};

use aya::maps::{MapData, RingBuf};
use pxe_ebpf_common::{BootClass, ServedEvent, bootp};
use tokio::sync::watch;

use crate::{
    inventory::MacAddr,
    progress::{Clocks, Progress},
};

/// How often the ring is drained. The XDP program writes without waking
/// the reader (a wake-up per reply would cost more than the reply), so the
/// boot-progress view lags by at most this; each event carries its own
/// send time, so the lag does not reorder a host's steps.
const DRAIN_EVERY: Duration = Duration::from_millis(200);

/// Reads events until shutdown.
pub async fn stream(
    mut ring: RingBuf<MapData>,
    progress: Arc<Progress>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(DRAIN_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            _ = tick.tick() => {
                let clocks = Clocks::now();
                while let Some(item) = ring.next() {
                    if let Some(event) = decode(&item) {
                        record(&progress, &event, &clocks);
                    }
                }
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

fn record(progress: &Progress, e: &ServedEvent, clocks: &Clocks) {
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
        clocks.wall_ms_of(e.at_ns),
        format!("{what} {ip} ({class}, xdp)"),
    );
}

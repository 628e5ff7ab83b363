//! The fast path's stream of sent replies, read into the boot-progress
//! view, and of the REQUESTs it dropped for naming another server, handed
//! to [`crate::other_server`]: per-CPU event slots in a memory-mapped array
//! (`EVENTS`), the per-CPU count of events written (`EVENT_HEADS`), and how
//! far the agent has read each CPU's slots, kept in the array itself so
//! that an agent adopting pinned maps reads on from where the last one
//! stopped.

use std::{
    os::fd::AsFd as _,
    ptr::NonNull,
    sync::{
        Arc,
        atomic::{Ordering, fence},
    },
    time::{Duration, Instant},
};

use aya::maps::{MapData, MapError, PerCpuArray};
use pxe_ebpf_common::{BootClass, EVENT_SLOTS, ServedEvent, bootp};
use tracing::warn;

use crate::{clock::Clocks, logging::Every, mac::MacAddr, shutdown::Shutdown, state::State};

/// How often the slots are drained. The XDP program writes without waking
/// the reader (a wake-up per reply would cost more than the reply), so the
/// boot-progress view lags by at most this; each event carries its own
/// send time, so the lag does not reorder a host's steps. At this period a
/// CPU can send `EVENT_SLOTS` replies (40,000 a second) between two drains
/// before the oldest are overwritten.
const DRAIN_EVERY: Duration = Duration::from_millis(200);

const SLOT_BYTES: usize = size_of::<ServedEvent>();

/// Entries `EVENTS` needs for `cpus` possible CPUs: their slots, then one
/// entry per CPU whose first word is how far the agent has read that
/// CPU's slots (the program never indexes past its CPU's slots).
pub fn entries(cpus: usize) -> u32 {
    u32::try_from(cpus * (EVENT_SLOTS as usize + 1)).unwrap_or(u32::MAX)
}

#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    #[error("the events map has {entries} entries, too few for {cpus} CPUs")]
    TooSmall { entries: u32, cpus: usize },
    #[error("failed to map the events map into memory")]
    Mmap(#[source] std::io::Error),
    #[error("failed to read the per-CPU event counts")]
    Heads(#[source] MapError),
}

/// What one drain found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    pub read: u64,
    /// Events overwritten before they were read.
    pub lost: u64,
}

/// The agent's view of the event slots.
pub struct EventReader {
    /// The mapping of `EVENTS`, read and written in place.
    base: NonNull<u8>,
    len: usize,
    cpus: usize,
    heads: PerCpuArray<MapData, u64>,
    /// Keeps the map's descriptor for as long as the mapping is used.
    _events: MapData,
}

// SAFETY: the mapping is owned by the reader, used through `&mut self`
// only, and unmapped once, on drop.
unsafe impl Send for EventReader {}

impl EventReader {
    /// Maps `events` (created with [`entries`] for `cpus`) into memory.
    pub fn new(
        events: MapData,
        heads: PerCpuArray<MapData, u64>,
        cpus: usize,
    ) -> Result<EventReader, EventsError> {
        let max = events.info().map_or(0, |info| info.max_entries());
        if max < entries(cpus) {
            return Err(EventsError::TooSmall { entries: max, cpus });
        }
        let len = max as usize * SLOT_BYTES;
        let fd = events.fd().as_fd();
        // SAFETY: a shared mapping of a BPF array created with
        // BPF_F_MMAPABLE, `len` bytes from its start; unmapped on drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(EventsError::Mmap(std::io::Error::last_os_error()));
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or_else(|| {
            EventsError::Mmap(std::io::Error::other("mmap returned a null mapping"))
        })?;
        Ok(EventReader {
            base,
            len,
            cpus,
            heads,
            _events: events,
        })
    }

    fn slot(&self, index: usize) -> *mut u8 {
        debug_assert!((index + 1) * SLOT_BYTES <= self.len);
        // SAFETY: inside the mapping: `index` is below `entries(cpus)`.
        unsafe { self.base.as_ptr().add(index * SLOT_BYTES) }
    }

    /// Where the agent keeps how far it has read `cpu`'s slots.
    fn read_mark(&self, cpu: usize) -> *mut u64 {
        self.slot(self.cpus * EVENT_SLOTS as usize + cpu)
            .cast::<u64>()
    }

    /// Hands every event written since the last drain to `each`, oldest
    /// first on each CPU, and records how far it read.
    pub fn drain(&mut self, mut each: impl FnMut(&ServedEvent)) -> Result<Drained, EventsError> {
        let heads = self.heads.get(&0, 0).map_err(EventsError::Heads)?;
        let slots = u64::from(EVENT_SLOTS);
        let mut out = Drained::default();
        for cpu in 0..self.cpus {
            let head = heads.get(cpu).copied().unwrap_or(0);
            // SAFETY: the agent's own word in the mapping.
            let mut next = unsafe { self.read_mark(cpu).read_volatile() };
            if next > head {
                // The counts started again (maps made anew under our mark).
                next = head;
            }
            if head - next > slots {
                out.lost += head - next - slots;
                next = head - slots;
            }
            for n in next..head {
                match self.read_event(cpu, n) {
                    Some(event) => {
                        out.read += 1;
                        each(&event);
                    }
                    None => out.lost += 1,
                }
            }
            // SAFETY: the agent's own word in the mapping.
            unsafe { self.read_mark(cpu).write_volatile(head) };
        }
        Ok(out)
    }

    /// `cpu`'s event number `n`, unless the program has overwritten it
    /// (or is overwriting it) with a later one.
    fn read_event(&self, cpu: usize, n: u64) -> Option<ServedEvent> {
        let slot = self
            .slot(cpu * EVENT_SLOTS as usize + (n % u64::from(EVENT_SLOTS)) as usize)
            .cast::<ServedEvent>();
        let want = (n as u32).wrapping_add(1);
        // SAFETY: an aligned u32 inside the slot.
        let seq = || unsafe { (&raw const (*slot).seq).read_volatile() };
        if seq() != want {
            return None;
        }
        fence(Ordering::Acquire);
        // SAFETY: 24 bytes inside the mapping; every bit pattern is a
        // valid `ServedEvent`.
        let event = unsafe { slot.read_volatile() };
        fence(Ordering::Acquire);
        (seq() == want).then_some(event)
    }
}

impl Drop for EventReader {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Reads events until shutdown.
pub async fn stream(mut reader: EventReader, state: Arc<State>, mut shutdown: Shutdown) {
    let mut tick = tokio::time::interval(DRAIN_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warn_lost = Every::new(Duration::from_secs(10));
    loop {
        tokio::select! {
            () = shutdown.stopped() => return,
            _ = tick.tick() => {
                let clocks = Clocks::now();
                // Each CPU has its own ring, read one after the other: the
                // answers are recorded in the order the program sent them,
                // so a host's last port is the one it booted on last.
                let mut drained = Vec::new();
                let result = reader.drain(|event| drained.push(*event));
                drained.sort_by_key(|e| e.at_ns);
                for event in &drained {
                    record(&state, event, &clocks);
                }
                match result {
                    Ok(d) if d.lost > 0 => {
                        state.progress.missed_xdp_events(d.lost);
                        if let Some(unlogged) = warn_lost.admit(Instant::now()) {
                            warn!(lost = d.lost, unlogged_drains = unlogged,
                                "fast-path events were overwritten before they were read: \
                                 the boot-progress view misses some XDP answers");
                        }
                    }
                    Ok(_) => {}
                    Err(e) => warn!(error = %e, "failed to read fast-path events"),
                }
            }
        }
    }
}

/// An answer is a step of the host's boot; a REQUEST naming another server
/// (`yiaddr` holds the server it named) is no step of this agent's.
fn record(state: &State, e: &ServedEvent, clocks: &Clocks) {
    let ip = std::net::Ipv4Addr::from(e.yiaddr);
    let what = match e.msg_type {
        bootp::DHCPACK => "ack",
        bootp::DHCPOFFER => "offer",
        bootp::DHCPREQUEST => {
            state
                .other_servers
                .seen(&state.inventory(), &state.share(), MacAddr(e.mac), ip);
            return;
        }
        _ => return,
    };
    let class = BootClass::ALL
        .get(usize::from(e.class))
        .map_or("?".to_string(), |c| format!("{c:?}").to_lowercase());
    state.progress.xdp_answer(
        MacAddr(e.mac),
        clocks.wall_ms_of(e.at_ns),
        format!("{what} {ip} ({class}, xdp)"),
    );
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::{inventory::Inventory, lease::LeaseStore, progress::Progress};

    const INVENTORY: &str = r#"
subnets: [{cidr: 10.66.0.0/16}]
profiles: [{name: once, boot: {bios: undionly.kpxe}, netboot: once}]
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.1, hostname: node-1, profile: once}
"#;
    const MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];

    fn event(msg_type: u8, yiaddr: [u8; 4]) -> ServedEvent {
        ServedEvent {
            at_ns: Clocks::now().monotonic_ns(),
            mac: MAC,
            msg_type,
            class: BootClass::Bios as u8,
            yiaddr,
            seq: 1,
        }
    }

    #[test]
    fn answers_are_progress_and_requests_naming_another_server_are_not() {
        let dir = std::env::temp_dir().join(format!("pxe-events-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let inv = Inventory::parse(Path::new("t.yaml"), INVENTORY).expect("valid inventory");
        let state = State::new(
            Arc::new(inv),
            LeaseStore::open(&dir.join("leases.redb")).expect("lease store"),
            16,
            Arc::new(Progress::default()),
            Arc::default(),
        );
        let clocks = Clocks::now();
        let dhcp = |state: &State| {
            state
                .progress
                .get(MacAddr(MAC))
                .and_then(|p| p.dhcp)
                .map(|s| s.detail)
        };

        record(&state, &event(bootp::DHCPREQUEST, [10, 66, 0, 2]), &clocks);
        assert_eq!(dhcp(&state), None, "no step of this agent's");
        assert_eq!(state.other_servers.requests(), 1);
        assert_eq!(state.other_servers.hosts(), 1);

        record(&state, &event(bootp::DHCPOFFER, [10, 66, 1, 1]), &clocks);
        assert_eq!(dhcp(&state).as_deref(), Some("offer 10.66.1.1 (bios, xdp)"));
        record(&state, &event(bootp::DHCPACK, [10, 66, 1, 1]), &clocks);
        assert_eq!(dhcp(&state).as_deref(), Some("ack 10.66.1.1 (bios, xdp)"));
        // Nothing else is an answer.
        record(&state, &event(bootp::DHCPDISCOVER, [10, 66, 1, 9]), &clocks);
        assert_eq!(dhcp(&state).as_deref(), Some("ack 10.66.1.1 (bios, xdp)"));
        assert_eq!(state.other_servers.requests(), 1);
        drop(state);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

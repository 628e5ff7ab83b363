//! Loads the embedded XDP object and owns its attachment: dropping a
//! `FastPath` detaches the program, unless it was started with pins
//! (`FastPath::start_pinned`), whose link outlives the agent.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use aya::{
    Ebpf, EbpfError, EbpfLoader,
    maps::{
        Array, DevMap, HashMap, Map, MapData, MapError, PerCpuArray, RingBuf, xdp::XdpMapError,
    },
    pin::PinError as AyaPinError,
    programs::{
        ProgramError, Xdp, XdpMode,
        links::{FdLink, LinkError, LinkType, PinnedLink},
        xdp::{XdpLink, XdpLinkId},
    },
};
use pxe_ebpf_common::{
    BODIES_MAP, COUNTERS_MAP, EVENT_HEADS_MAP, EVENTS_MAP, HOSTS_MAP, PASS_PROGRAM_NAME,
    PROGRAM_NAME, REDIRECT_MAP, REDIRECT_PROGRAM_NAME, TRACE_GATE_MAP, TRACE_MAP, TRACED_MAP,
};
use tracing::{info, warn};

use super::{
    capacity::Capacity,
    events::{self, EventReader},
    maps::{self, Installed, Maps, SyncError, SyncReport},
    pin,
    trace::TraceFilter,
};
use crate::dhcp::template::Compiled;

/// The XDP object built by `build.rs` from the `pxe-ebpf` crate.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pxe-ebpf"));

/// The embedded XDP object, for tools and tests that load its programs
/// themselves (empty when built with `AYA_BUILD_SKIP`).
pub fn object() -> &'static [u8] {
    OBJECT
}

#[derive(Debug, thiserror::Error)]
pub enum XdpError {
    #[error("the XDP object is empty: this binary was built with AYA_BUILD_SKIP")]
    NoObject,
    #[error("failed to load the XDP object")]
    Load(#[source] EbpfError),
    #[error("the XDP object has no {0}")]
    Missing(&'static str),
    #[error("the kernel refused the XDP program")]
    Verify(#[source] ProgramError),
    #[error("failed to open map {name}")]
    Map {
        name: &'static str,
        source: MapError,
    },
    #[error("no interface named {0}")]
    NoInterface(String),
    #[error("failed to set the redirect target")]
    Redirect(#[source] XdpMapError),
    #[error("failed to attach XDP to {iface} in {mode:?} mode")]
    Attach {
        iface: String,
        mode: AttachMode,
        source: ProgramError,
    },
    #[error(transparent)]
    Pins(#[from] super::pin::PinError),
    #[error("failed to fill the hosts map")]
    Fill(#[source] SyncError),
    #[error("failed to pin {}", path.display())]
    Pin { path: PathBuf, source: AyaPinError },
    #[error(
        "the XDP attachment on {0} is not a bpf_link (kernel older than 5.9?): it cannot be pinned"
    )]
    NotALink(String),
    #[error("failed to read the pinned XDP link {}", path.display())]
    Link { path: PathBuf, source: LinkError },
    #[error("failed to replace the XDP program on {iface} through its link")]
    Replace { iface: String, source: ProgramError },
    #[error("failed to put the new map pins in place in {}", path.display())]
    Rename {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to read the possible CPUs from {path}")]
    Cpus {
        path: &'static str,
        source: std::io::Error,
    },
    #[error("failed to open the fast path's event slots")]
    Events(#[source] super::events::EventsError),
}

/// What starting on pins found and did, for the log and the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adoption {
    /// No usable link was pinned: the program was attached and pinned.
    Fresh { program: u32 },
    /// The pinned link runs the same program: it keeps running, on the
    /// pinned maps.
    Unchanged { program: u32 },
    /// The pinned link ran another program: it now runs ours (one link
    /// update, no moment without a program), on the pinned maps when their
    /// layout is ours, else on new ones.
    Replaced {
        from: u32,
        to: u32,
        maps_reused: bool,
    },
}

/// How to attach: native (driver) mode, generic (skb) mode, or native with
/// a fallback to generic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    Auto,
    Native,
    Skb,
}

/// The loaded program, its maps and, once attached, its link.
pub struct FastPath {
    ebpf: Ebpf,
    maps: Maps,
    counters: Arc<PerCpuArray<MapData, u64>>,
    events: Option<EventReader>,
    trace: Option<(TraceFilter, RingBuf<MapData>)>,
    current: Installed,
    link: Option<XdpLinkId>,
    /// The id of the program attached to the interface: ours, or the one
    /// the adopted link kept running.
    attached: Option<u32>,
    /// Set when the link is pinned: dropping must not detach.
    pinned: bool,
    /// Cleared when a sync and its undo both failed: `current` is then what
    /// was read back from the maps, not a compiled inventory.
    in_step: bool,
}

impl FastPath {
    /// Loads the program into the kernel (the verifier runs here) without
    /// attaching it anywhere, with the maps as large as the object declares.
    pub fn load() -> Result<FastPath, XdpError> {
        FastPath::load_with(Capacity::default())
    }

    /// [`FastPath::load`] with maps of `capacity`.
    pub fn load_with(capacity: Capacity) -> Result<FastPath, XdpError> {
        FastPath::from_ebpf(load_object(None, capacity)?)
    }

    fn from_ebpf(mut ebpf: Ebpf) -> Result<FastPath, XdpError> {
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or(XdpError::Missing(PROGRAM_NAME))?
            .try_into()
            .map_err(XdpError::Verify)?;
        prog.load().map_err(XdpError::Verify)?;
        let hosts = ebpf
            .take_map(HOSTS_MAP)
            .ok_or(XdpError::Missing(HOSTS_MAP))?;
        let hosts_capacity = map_data(&hosts)
            .and_then(|m| m.info().ok())
            .map_or(0, |info| info.max_entries());
        let hosts = HashMap::try_from(hosts).map_err(|source| XdpError::Map {
            name: HOSTS_MAP,
            source,
        })?;
        let bodies = ebpf
            .take_map(BODIES_MAP)
            .ok_or(XdpError::Missing(BODIES_MAP))?;
        let bodies = Array::try_from(bodies).map_err(|source| XdpError::Map {
            name: BODIES_MAP,
            source,
        })?;
        let counters = ebpf
            .take_map(COUNTERS_MAP)
            .ok_or(XdpError::Missing(COUNTERS_MAP))?;
        let counters = PerCpuArray::try_from(counters).map_err(|source| XdpError::Map {
            name: COUNTERS_MAP,
            source,
        })?;
        let events = take_events(&mut ebpf)?;
        let trace = take_trace(&mut ebpf)?;
        Ok(FastPath {
            ebpf,
            maps: Maps {
                hosts,
                hosts_capacity,
                bodies,
            },
            counters: Arc::new(counters),
            events: Some(events),
            trace: Some(trace),
            current: Installed::default(),
            link: None,
            attached: None,
            pinned: false,
            in_step: true,
        })
    }

    /// The loaded program, for `BPF_PROG_TEST_RUN`.
    pub fn program(&self) -> &Xdp {
        self.ebpf
            .program(PROGRAM_NAME)
            .and_then(|p| <&Xdp>::try_from(p).ok())
            .expect("loaded in FastPath::load")
    }

    /// The kernel's id of the loaded program.
    pub fn program_id(&self) -> Result<u32, aya::programs::ProgramError> {
        Ok(self.program().info()?.id())
    }

    /// The kernel's id of the program attached to the interface: the one
    /// loaded, or the one an adopted link kept running.
    pub fn attached_program_id(&self) -> Result<u32, ProgramError> {
        match self.attached {
            Some(id) => Ok(id),
            None => self.program_id(),
        }
    }

    fn program_mut(&mut self) -> &mut Xdp {
        self.ebpf
            .program_mut(PROGRAM_NAME)
            .and_then(|p| <&mut Xdp>::try_from(p).ok())
            .expect("loaded in FastPath::load")
    }

    /// Attaches to `iface`; returns the mode that worked.
    pub fn attach(&mut self, iface: &str, mode: AttachMode) -> Result<AttachMode, XdpError> {
        let (link, used) = self.attach_link(iface, mode)?;
        self.link = Some(link);
        Ok(used)
    }

    fn attach_link(
        &mut self,
        iface: &str,
        mode: AttachMode,
    ) -> Result<(XdpLinkId, AttachMode), XdpError> {
        let prog = self.program_mut();
        let attach = |prog: &mut Xdp, m: AttachMode, flags: XdpMode| {
            prog.attach(iface, flags)
                .map_err(|source| XdpError::Attach {
                    iface: iface.to_string(),
                    mode: m,
                    source,
                })
        };
        let (link, used) = match mode {
            AttachMode::Native => (attach(prog, mode, XdpMode::Driver)?, AttachMode::Native),
            AttachMode::Skb => (attach(prog, mode, XdpMode::Skb)?, AttachMode::Skb),
            AttachMode::Auto => match attach(prog, AttachMode::Native, XdpMode::Driver) {
                Ok(link) => (link, AttachMode::Native),
                Err(e) => {
                    warn!(%iface, error = %e, "native XDP unavailable, falling back to generic (skb) mode");
                    (
                        attach(prog, AttachMode::Skb, XdpMode::Skb)?,
                        AttachMode::Skb,
                    )
                }
            },
        };
        info!(%iface, mode = ?used, "XDP program attached");
        Ok((link, used))
    }

    /// Starts the fast path of `iface` on the pins in `dir` (its directory
    /// under `--pin-dir`, on bpffs), never leaving `iface` without a
    /// program:
    /// - a pinned link running on `iface` is adopted: our program is loaded
    ///   on the pinned maps when they are that program's and have our
    ///   layout (else on new maps, pinned in their place once they run),
    ///   the maps are read back so that filling them with `compiled` is a
    ///   diff, and the link is then switched to our program in one
    ///   update unless it already runs the same code (same tag);
    /// - otherwise (nothing pinned, or a link whose interface went or that
    ///   was detached) the leftovers are removed, the maps created and
    ///   pinned, filled, and the program attached and its link pinned.
    ///
    /// The maps get `capacity`; pinned maps of another size are replaced
    /// like maps of another layout.
    ///
    /// From then on, dropping the `FastPath` leaves everything attached.
    pub fn start_pinned(
        dir: &Path,
        iface: &str,
        mode: AttachMode,
        compiled: Compiled,
        capacity: Capacity,
    ) -> Result<(FastPath, Adoption, SyncReport), XdpError> {
        pin::prepare(dir)?;
        match adoptable(&dir.join(pin::LINK), iface)? {
            Some((link, running)) => FastPath::adopt(dir, iface, link, running, compiled, capacity),
            None => FastPath::start_fresh(dir, iface, mode, compiled, capacity),
        }
    }

    fn start_fresh(
        dir: &Path,
        iface: &str,
        mode: AttachMode,
        compiled: Compiled,
        capacity: Capacity,
    ) -> Result<(FastPath, Adoption, SyncReport), XdpError> {
        // Maps pinned for a program no longer attached: start them anew.
        pin::remove_maps(dir)?;
        let mut fast = FastPath::from_ebpf(load_object(Some(dir), capacity)?)?;
        let (report, _) = fast.sync(compiled).map_err(XdpError::Fill)?;
        let (id, _) = fast.attach_link(iface, mode)?;
        let link = fast.program_mut().take_link(id).map_err(XdpError::Verify)?;
        let link = FdLink::try_from(link).map_err(|_| XdpError::NotALink(iface.into()))?;
        let path = dir.join(pin::LINK);
        link.pin(&path)
            .map_err(|source| XdpError::Pin { path, source })?;
        fast.pin_program(dir)?;
        fast.pinned = true;
        let program = fast.program_id().map_err(XdpError::Verify)?;
        fast.attached = Some(program);
        Ok((fast, Adoption::Fresh { program }, report))
    }

    fn adopt(
        dir: &Path,
        iface: &str,
        link: FdLink,
        running: u32,
        compiled: Compiled,
        capacity: Capacity,
    ) -> Result<(FastPath, Adoption, SyncReport), XdpError> {
        // The running program's own pin, when it is the one the link runs;
        // without it (pinned by someone else, or removed) the pinned maps
        // cannot be told to be that program's, so new ones are made.
        let running_info = match pin::read_program(&dir.join(pin::PROGRAM)) {
            Ok(info) => Some(info).filter(|p| p.id == running),
            Err(e) => {
                info!(%iface, error = %e, "no pinned program to adopt the maps of");
                None
            }
        };
        let fresh = load_object(None, capacity)?;
        let reuse = running_info
            .as_ref()
            .is_some_and(|info| pins_fit(dir, &fresh, info));
        let mut fast = if reuse {
            drop(fresh);
            let mut fast = FastPath::from_ebpf(load_object(Some(dir), capacity)?)?;
            fast.current = Installed::read(&fast.maps);
            if let Some((filter, _)) = &fast.trace {
                // The MACs the last agent traced have no watcher now.
                if let Err(e) = filter.clear() {
                    warn!(%iface, error = %e, "failed to clear the adopted trace filter");
                }
            }
            fast
        } else {
            // Pinned beside the old maps now, renamed over them once our
            // program runs: until then the old program keeps its own.
            for name in pin::MAPS {
                let path = dir.join(format!("{name}{}", pin::NEW_SUFFIX));
                let _ = std::fs::remove_file(&path);
                let map = fresh.map(name).ok_or(XdpError::Missing(name))?;
                map.pin(&path)
                    .map_err(|source| XdpError::Pin { path, source })?;
            }
            FastPath::from_ebpf(fresh)?
        };
        fast.pinned = true;
        let (report, _) = fast.sync(compiled).map_err(XdpError::Fill)?;
        let ours = fast.program().info().map_err(XdpError::Verify)?;
        if reuse
            && running_info
                .as_ref()
                .is_some_and(|info| ours.tag() == info.tag)
        {
            fast.attached = Some(running);
            return Ok((fast, Adoption::Unchanged { program: running }, report));
        }
        let path = dir.join(pin::LINK);
        let link = XdpLink::try_from(link).map_err(|source| XdpError::Link { path, source })?;
        let id = fast
            .program_mut()
            .attach_to_link(link)
            .map_err(|source| XdpError::Replace {
                iface: iface.into(),
                source,
            })?;
        fast.link = Some(id);
        fast.attached = Some(ours.id());
        fast.pin_program(dir)?;
        if !reuse {
            for name in pin::MAPS {
                let from = dir.join(format!("{name}{}", pin::NEW_SUFFIX));
                let to = dir.join(name);
                std::fs::rename(&from, &to)
                    .map_err(|source| XdpError::Rename { path: to, source })?;
            }
        }
        Ok((
            fast,
            Adoption::Replaced {
                from: running,
                to: ours.id(),
                maps_reused: reuse,
            },
            report,
        ))
    }

    /// Pins the program (in place of the one pinned before), so that the
    /// next agent can read what the link runs without CAP_SYS_ADMIN.
    fn pin_program(&mut self, dir: &Path) -> Result<(), XdpError> {
        let path = dir.join(pin::PROGRAM);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(pin::PinError::Remove { path, source }.into()),
        }
        self.program_mut()
            .pin(&path)
            .map_err(|source| XdpError::Pin { path, source })
    }

    /// Makes the maps hold exactly `desired`, entry by entry (see `maps`).
    ///
    /// On failure the maps hold what they held before, and `current` with
    /// them; if even the undo failed, `current` is read back from the maps,
    /// so the next sync starts from what the kernel really has.
    ///
    /// Returns the compiled inventory the maps held before.
    pub fn sync(
        &mut self,
        desired: impl Into<Arc<Compiled>>,
    ) -> Result<(SyncReport, Arc<Compiled>), SyncError> {
        match maps::sync(&mut self.maps, &mut self.current, desired.into()) {
            Ok(done) => {
                self.in_step = true;
                Ok(done)
            }
            Err(e @ SyncError::RolledBack { .. }) => Err(e),
            Err(e @ SyncError::Mixed { .. }) => {
                self.current = Installed::read(&self.maps);
                self.in_step = false;
                Err(e)
            }
        }
    }

    /// Whether what the maps hold is a compiled inventory put in force
    /// whole, which a reload may reuse host by host.
    pub fn in_step(&self) -> bool {
        self.in_step
    }

    /// Host entries in the map.
    pub fn entries(&self) -> usize {
        self.current.len()
    }

    /// What the maps hold.
    pub fn current(&self) -> &Installed {
        &self.current
    }

    /// The sizes the maps were created with.
    pub fn capacity(&self) -> Capacity {
        Capacity {
            hosts: self.maps.hosts_capacity,
            bodies: self.maps.bodies.len(),
        }
    }

    /// The stream of replies sent (once; the reader owns it).
    pub fn take_events(&mut self) -> Option<EventReader> {
        self.events.take()
    }

    /// The filter of traced MACs and the ring of their verdicts (once; the
    /// trace hub owns them).
    pub fn take_trace(&mut self) -> Option<(TraceFilter, RingBuf<MapData>)> {
        self.trace.take()
    }

    pub fn counters(&self) -> &PerCpuArray<MapData, u64> {
        &self.counters
    }

    /// The counters map, for readers that must not wait for a reload's
    /// map writes.
    pub fn counters_handle(&self) -> Arc<PerCpuArray<MapData, u64>> {
        self.counters.clone()
    }

    /// Raw map access for tests that write entries directly.
    pub fn maps_mut(&mut self) -> &mut Maps {
        &mut self.maps
    }
}

/// Loads the object, its maps on the pins in `pins` when given (reused
/// where pinned, created and pinned where not), the hosts and bodies maps
/// of `capacity`; no program is loaded yet.
fn load_object(pins: Option<&Path>, capacity: Capacity) -> Result<Ebpf, XdpError> {
    if OBJECT.is_empty() {
        return Err(XdpError::NoObject);
    }
    let mut loader = EbpfLoader::new();
    loader
        .map_max_entries(HOSTS_MAP, capacity.hosts)
        .map_max_entries(BODIES_MAP, capacity.bodies)
        .map_max_entries(EVENTS_MAP, events::entries(possible_cpus()?));
    if let Some(dir) = pins {
        for name in pin::MAPS {
            loader.map_pin_path(name, dir.join(name));
        }
    }
    loader.load(OBJECT).map_err(XdpError::Load)
}

/// The link pinned at `path` and the program it runs, if it runs on
/// `iface`; a link that does not (its interface went, or it was detached)
/// is unpinned.
fn adoptable(path: &Path, iface: &str) -> Result<Option<(FdLink, u32)>, XdpError> {
    if !path.exists() {
        return Ok(None);
    }
    let stale = |why: String| -> Result<Option<(FdLink, u32)>, XdpError> {
        warn!(%iface, pin = %path.display(), "{why}: removing the stale link pin");
        std::fs::remove_file(path).map_err(|source| pin::PinError::Remove {
            path: path.into(),
            source,
        })?;
        Ok(None)
    };
    let link = match PinnedLink::from_pin(path) {
        Ok(link) => FdLink::from(link),
        Err(e) => return stale(format!("cannot open the pinned link: {e}")),
    };
    let info = link.info().map_err(|source| XdpError::Link {
        path: path.into(),
        source,
    })?;
    if !matches!(info.link_type(), Ok(LinkType::Xdp)) {
        return stale("the pinned link is not an XDP link".into());
    }
    let running = info.program_id();
    match crate::netdev::xdp_program_id(iface) {
        Ok(Some(id)) if id == running => Ok(Some((link, running))),
        Ok(Some(id)) => stale(format!(
            "the pinned link runs program {running} but {iface} runs {id}"
        )),
        Ok(None) => stale(format!("the pinned link is not attached to {iface}")),
        Err(e) => stale(format!("cannot read the XDP state of {iface}: {e}")),
    }
}

/// Whether the maps pinned in `dir` are the ones `running` uses and have
/// the layout the object `fresh` declares: then a program loaded from the
/// object can share them. Everything is read through pins and descriptors
/// held, never by id, so CAP_BPF is enough.
fn pins_fit(dir: &Path, fresh: &Ebpf, running: &pin::PinnedProgram) -> bool {
    let used = &running.map_ids;
    pin::MAPS.iter().all(|name| {
        let Ok(pinned) = MapData::from_pin(dir.join(name)).and_then(|m| m.info()) else {
            return false;
        };
        let Some(ours) = fresh
            .map(name)
            .and_then(map_data)
            .and_then(|m| m.info().ok())
        else {
            return false;
        };
        let same = used.contains(&pinned.id())
            && pinned.map_type().ok() == ours.map_type().ok()
            && pinned.key_size() == ours.key_size()
            && pinned.value_size() == ours.value_size()
            && pinned.max_entries() == ours.max_entries()
            && pinned.map_flags() == ours.map_flags();
        if !same {
            info!(map = name, "the pinned map does not fit the new program");
        }
        same
    })
}

/// The map behind the kinds of map the program pins.
fn map_data(map: &Map) -> Option<&MapData> {
    match map {
        Map::HashMap(m) | Map::PerCpuArray(m) | Map::RingBuf(m) | Map::Array(m) => Some(m),
        _ => None,
    }
}

fn take_events(ebpf: &mut Ebpf) -> Result<EventReader, XdpError> {
    let mut take = |name: &'static str| ebpf.take_map(name).ok_or(XdpError::Missing(name));
    let Map::Array(events) = take(EVENTS_MAP)? else {
        return Err(XdpError::Map {
            name: EVENTS_MAP,
            source: MapError::InvalidMapType { map_type: 0 },
        });
    };
    let heads = PerCpuArray::try_from(take(EVENT_HEADS_MAP)?).map_err(|source| XdpError::Map {
        name: EVENT_HEADS_MAP,
        source,
    })?;
    EventReader::new(events, heads, possible_cpus()?).map_err(XdpError::Events)
}

/// CPUs the kernel may run the program on: per-CPU maps and the event
/// slots are sized to them.
fn possible_cpus() -> Result<usize, XdpError> {
    aya::util::nr_cpus().map_err(|(path, source)| XdpError::Cpus { path, source })
}

fn take_trace(ebpf: &mut Ebpf) -> Result<(TraceFilter, RingBuf<MapData>), XdpError> {
    let mut take = |name: &'static str| ebpf.take_map(name).ok_or(XdpError::Missing(name));
    let failed = |name| move |source| XdpError::Map { name, source };
    let traced = HashMap::try_from(take(TRACED_MAP)?).map_err(failed(TRACED_MAP))?;
    let gate = Array::try_from(take(TRACE_GATE_MAP)?).map_err(failed(TRACE_GATE_MAP))?;
    let ring = RingBuf::try_from(take(TRACE_MAP)?).map_err(failed(TRACE_MAP))?;
    Ok((TraceFilter::new(traced, gate), ring))
}

/// Makes each interface's maps hold its compiled inventory (`desired[i]`
/// for `fast[i]`), all of them or none: when one interface's sync fails,
/// the interfaces already synced are put back as they were, so both paths
/// keep serving the previous inventory everywhere.
pub fn sync_each(fast: &mut [FastPath], desired: Vec<Compiled>) -> Result<SyncReport, SyncError> {
    assert_eq!(
        fast.len(),
        desired.len(),
        "one compiled inventory per interface"
    );
    let mut previous: Vec<Arc<Compiled>> = Vec::with_capacity(fast.len());
    let mut total = SyncReport::default();
    for (i, compiled) in desired.into_iter().enumerate() {
        let failed = match fast[i].sync(compiled) {
            Ok((report, old)) => {
                total.add(&report);
                previous.push(old);
                continue;
            }
            Err(e) => e,
        };
        let mut undo_error = None;
        for (done, old) in fast[..i].iter_mut().zip(previous) {
            if let Err(e) = done.sync(old) {
                undo_error.get_or_insert(e.into_source());
            }
        }
        return Err(match undo_error {
            None => failed,
            Some(undo) => SyncError::Mixed {
                source: failed.into_source(),
                undo,
            },
        });
    }
    Ok(total)
}

/// The lab program attached to the far end of a veth pair: pass-through,
/// so that end receives what the fast path sends with XDP_TX, or a redirect
/// of every frame to another interface. Detached on drop.
pub struct VethPeer {
    _ebpf: Ebpf,
}

impl VethPeer {
    /// Attaches the pass-through program to `iface`.
    pub fn attach(iface: &str) -> Result<VethPeer, XdpError> {
        Self::attach_program(iface, PASS_PROGRAM_NAME, None)
    }

    /// Attaches to `iface` the program that redirects every frame it
    /// receives to `target`.
    pub fn attach_redirect(iface: &str, target: &str) -> Result<VethPeer, XdpError> {
        Self::attach_program(iface, REDIRECT_PROGRAM_NAME, Some(target))
    }

    fn attach_program(
        iface: &str,
        name: &'static str,
        target: Option<&str>,
    ) -> Result<VethPeer, XdpError> {
        let mut ebpf = load_object(None, Capacity::default())?;
        if let Some(target) = target {
            let ifindex = ifindex(target).ok_or_else(|| XdpError::NoInterface(target.into()))?;
            let mut map: DevMap<_> = ebpf
                .map_mut(REDIRECT_MAP)
                .ok_or(XdpError::Missing(REDIRECT_MAP))?
                .try_into()
                .map_err(|source| XdpError::Map {
                    name: REDIRECT_MAP,
                    source,
                })?;
            map.set(0, ifindex, None, 0).map_err(XdpError::Redirect)?;
        }
        let prog: &mut Xdp = ebpf
            .program_mut(name)
            .ok_or(XdpError::Missing(name))?
            .try_into()
            .map_err(XdpError::Verify)?;
        prog.load().map_err(XdpError::Verify)?;
        prog.attach(iface, XdpMode::Driver)
            .map_err(|source| XdpError::Attach {
                iface: iface.to_string(),
                mode: AttachMode::Native,
                source,
            })?;
        match target {
            Some(target) => info!(%iface, %target, "redirecting XDP program attached"),
            None => info!(%iface, "pass-through XDP program attached to the veth peer"),
        }
        // Dropping the Ebpf detaches its links.
        Ok(VethPeer { _ebpf: ebpf })
    }
}

/// The index of interface `name`, if there is one.
fn ifindex(name: &str) -> Option<u32> {
    crate::netdev::index_of(name).ok()
}

impl Drop for FastPath {
    fn drop(&mut self) {
        if self.pinned {
            // The pin holds the link: closing our descriptors leaves the
            // program attached for the next agent.
            info!("XDP program left attached through its pinned link");
            return;
        }
        let Some(link) = self.link.take() else { return };
        if let Some(prog) = self
            .ebpf
            .program_mut(PROGRAM_NAME)
            .and_then(|p| <&mut Xdp>::try_from(p).ok())
        {
            match prog.detach(link) {
                Ok(()) => info!("XDP program detached"),
                Err(e) => warn!(error = %e, "failed to detach XDP program"),
            }
        }
    }
}

//! Loads the embedded XDP object and owns its attachment: dropping a
//! `FastPath` detaches the program.

use std::sync::Arc;

use aya::{
    Ebpf, EbpfError,
    maps::{Array, DevMap, HashMap, MapData, MapError, PerCpuArray, RingBuf, xdp::XdpMapError},
    programs::{ProgramError, Xdp, XdpMode, xdp::XdpLinkId},
};
use pxe_ebpf_common::{
    COUNTERS_MAP, EVENTS_MAP, HOSTS_MAP, HostKey, PASS_PROGRAM_NAME, PROGRAM_NAME, REDIRECT_MAP,
    REDIRECT_PROGRAM_NAME, ReplyTemplate, TRACE_GATE_MAP, TRACE_MAP, TRACED_MAP,
};
use tracing::{info, warn};

use super::{
    maps::{self, SyncError, SyncReport},
    trace::TraceFilter,
};
use crate::dhcp::template::Templates;

/// The XDP object built by `build.rs` from the `pxe-ebpf` crate.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pxe-ebpf"));

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
    hosts: HashMap<MapData, HostKey, ReplyTemplate>,
    counters: Arc<PerCpuArray<MapData, u64>>,
    events: Option<RingBuf<MapData>>,
    trace: Option<(TraceFilter, RingBuf<MapData>)>,
    current: Templates,
    link: Option<XdpLinkId>,
}

impl FastPath {
    /// Loads the program into the kernel (the verifier runs here) without
    /// attaching it anywhere.
    pub fn load() -> Result<FastPath, XdpError> {
        if OBJECT.is_empty() {
            return Err(XdpError::NoObject);
        }
        let mut ebpf = Ebpf::load(OBJECT).map_err(XdpError::Load)?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or(XdpError::Missing(PROGRAM_NAME))?
            .try_into()
            .map_err(XdpError::Verify)?;
        prog.load().map_err(XdpError::Verify)?;
        let hosts = ebpf
            .take_map(HOSTS_MAP)
            .ok_or(XdpError::Missing(HOSTS_MAP))?;
        let hosts = HashMap::try_from(hosts).map_err(|source| XdpError::Map {
            name: HOSTS_MAP,
            source,
        })?;
        let counters = ebpf
            .take_map(COUNTERS_MAP)
            .ok_or(XdpError::Missing(COUNTERS_MAP))?;
        let counters = PerCpuArray::try_from(counters).map_err(|source| XdpError::Map {
            name: COUNTERS_MAP,
            source,
        })?;
        let events = ebpf
            .take_map(EVENTS_MAP)
            .ok_or(XdpError::Missing(EVENTS_MAP))?;
        let events = RingBuf::try_from(events).map_err(|source| XdpError::Map {
            name: EVENTS_MAP,
            source,
        })?;
        let trace = take_trace(&mut ebpf)?;
        Ok(FastPath {
            ebpf,
            hosts,
            counters: Arc::new(counters),
            events: Some(events),
            trace: Some(trace),
            current: Templates::new(),
            link: None,
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

    /// Attaches to `iface`; returns the mode that worked.
    pub fn attach(&mut self, iface: &str, mode: AttachMode) -> Result<AttachMode, XdpError> {
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(PROGRAM_NAME)
            .and_then(|p| <&mut Xdp>::try_from(p).ok())
            .expect("loaded in FastPath::load");
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
        self.link = Some(link);
        info!(%iface, mode = ?used, "XDP program attached");
        Ok(used)
    }

    /// Makes the map hold exactly `desired`, entry by entry (see `maps`).
    ///
    /// On failure the map holds what it held before, and `current` with it;
    /// if even the undo failed, `current` is read back from the map, so the
    /// next sync starts from what the kernel really has.
    pub fn sync(&mut self, desired: Templates) -> Result<SyncReport, SyncError> {
        match maps::sync(&mut self.hosts, &self.current, &desired) {
            Ok(report) => {
                self.current = desired;
                Ok(report)
            }
            Err(e @ SyncError::RolledBack { .. }) => Err(e),
            Err(e @ SyncError::Mixed { .. }) => {
                self.current = self.hosts.iter().filter_map(Result::ok).collect();
                Err(e)
            }
        }
    }

    /// Number of templates in the map.
    pub fn templates(&self) -> usize {
        self.current.len()
    }

    /// The templates the map holds.
    pub fn current(&self) -> &Templates {
        &self.current
    }

    /// The stream of replies sent (once; the reader owns it).
    pub fn take_events(&mut self) -> Option<RingBuf<MapData>> {
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

    /// Raw map access for tests that write templates directly.
    pub fn hosts_mut(&mut self) -> &mut HashMap<MapData, HostKey, ReplyTemplate> {
        &mut self.hosts
    }
}

fn take_trace(ebpf: &mut Ebpf) -> Result<(TraceFilter, RingBuf<MapData>), XdpError> {
    let mut take = |name: &'static str| ebpf.take_map(name).ok_or(XdpError::Missing(name));
    let failed = |name| move |source| XdpError::Map { name, source };
    let traced = HashMap::try_from(take(TRACED_MAP)?).map_err(failed(TRACED_MAP))?;
    let gate = Array::try_from(take(TRACE_GATE_MAP)?).map_err(failed(TRACE_GATE_MAP))?;
    let ring = RingBuf::try_from(take(TRACE_MAP)?).map_err(failed(TRACE_MAP))?;
    Ok((TraceFilter::new(traced, gate), ring))
}

/// Makes each interface's map hold its templates (`desired[i]` for
/// `fast[i]`), all of them or none: when one interface's sync fails, the
/// interfaces already synced are put back as they were, so both paths keep
/// serving the previous inventory everywhere.
pub fn sync_each(fast: &mut [FastPath], desired: Vec<Templates>) -> Result<SyncReport, SyncError> {
    assert_eq!(
        fast.len(),
        desired.len(),
        "one set of templates per interface"
    );
    let previous: Vec<Templates> = fast.iter().map(|f| f.current.clone()).collect();
    let mut total = SyncReport::default();
    for (i, templates) in desired.into_iter().enumerate() {
        let failed = match fast[i].sync(templates) {
            Ok(report) => {
                total.written += report.written;
                total.removed += report.removed;
                total.unchanged += report.unchanged;
                continue;
            }
            Err(e) => e,
        };
        let mut undo_error = None;
        for (done, old) in fast[..i].iter_mut().zip(&previous) {
            if let Err(e) = done.sync(old.clone()) {
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
        if OBJECT.is_empty() {
            return Err(XdpError::NoObject);
        }
        let mut ebpf = Ebpf::load(OBJECT).map_err(XdpError::Load)?;
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
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: name is NUL-terminated.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}

impl Drop for FastPath {
    fn drop(&mut self) {
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

//! Live trace of chosen machines through both paths, for `pxe-agent trace`.
//!
//! One [`Hub`] per agent. Publishers (the XDP trace reader, the DHCP slow
//! path, TFTP, the boot HTTP server and the phone-home) call
//! [`Hub::publish`] with a MAC; unless someone watches that MAC this is one
//! atomic load, so the detail closure never runs and nothing is allocated.
//! Watchers ([`Hub::watch`]) register the MAC here and, through the
//! [`KernelFilter`] the agent installs, in the XDP program's `TRACED` map,
//! for as long as a [`Watch`] lives. Owns neither the events' content nor
//! their transport: the admin API streams them, the CLI prints them.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
};

use pxe_ebpf_common::MAX_TRACED;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::{
    clock,
    mac::MacAddr,
    shutdown::{Shutdown, Trigger},
    sync::lock,
};

/// Events buffered for a slow watcher before it misses some.
const CAPACITY: usize = 1024;

/// Where in the boot chain an event comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TracePath {
    /// The XDP program's verdict.
    Xdp,
    /// The userspace DHCP slow path.
    Dhcp,
    Tftp,
    /// Scripts, boot files and artifacts on the boot HTTP server.
    Http,
    /// `POST /api/v1/hosts/<mac>/booted`.
    PhoneHome,
    /// The trace itself (events lost by a slow watcher).
    Agent,
}

impl TracePath {
    pub fn name(self) -> &'static str {
        match self {
            TracePath::Xdp => "xdp",
            TracePath::Dhcp => "dhcp",
            TracePath::Tftp => "tftp",
            TracePath::Http => "http",
            TracePath::PhoneHome => "phone-home",
            TracePath::Agent => "agent",
        }
    }
}

/// One step of a traced machine, one line of `GET /api/v1/trace/<mac>`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// Unix milliseconds.
    pub at_ms: u64,
    pub mac: MacAddr,
    pub path: TracePath,
    /// A short keyword: the XDP counter (`tx_offer`, `pass_ipxe`), the
    /// slow path's answer (`offer`, `ack`, `nak`, `ignore`), `done`, ...
    pub what: String,
    pub detail: String,
}

/// Puts MACs in the XDP program's trace filter; installed once the program
/// is loaded (`xdp::TraceFilter`). Without one only userspace is traced.
pub trait KernelFilter: Send + Sync {
    /// Adds `mac` to the filter or removes it; `count` is how many MACs are
    /// traced afterwards (the program's gate).
    fn set(&self, mac: MacAddr, traced: bool, count: usize) -> Result<(), String>;
}

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("{MAX_TRACED} MACs are traced already")]
    Full,
    #[error("failed to trace {mac} in the XDP program: {reason}")]
    Kernel { mac: MacAddr, reason: String },
}

pub struct Hub {
    /// MACs with at least one watcher: the publishers' fast check.
    traced: AtomicUsize,
    /// Watchers per MAC.
    watchers: Mutex<HashMap<MacAddr, usize>>,
    kernel: OnceLock<Box<dyn KernelFilter>>,
    tx: broadcast::Sender<Arc<TraceEvent>>,
    /// Stopped at shutdown: every watch ends, so the streams serving
    /// them end and the admin server can stop.
    closed: Trigger,
}

impl Default for Hub {
    fn default() -> Hub {
        Hub {
            traced: AtomicUsize::new(0),
            watchers: Mutex::new(HashMap::new()),
            kernel: OnceLock::new(),
            tx: broadcast::channel(CAPACITY).0,
            // Watches subscribe as they start.
            closed: Shutdown::new().0,
        }
    }
}

impl Hub {
    /// Installs the kernel side; later calls are ignored.
    pub fn set_kernel(&self, filter: Box<dyn KernelFilter>) {
        let _ = self.kernel.set(filter);
    }

    /// Ends every watch, now and later.
    pub fn close(&self) {
        self.closed.stop();
    }

    /// Whether anyone watches `mac`.
    #[inline]
    pub fn is_traced(&self, mac: MacAddr) -> bool {
        self.traced.load(Ordering::Relaxed) != 0 && self.lock().contains_key(&mac)
    }

    /// MACs traced now.
    pub fn traced(&self) -> usize {
        self.traced.load(Ordering::Relaxed)
    }

    /// Publishes an event of `mac`, stamped now, if `mac` is traced.
    #[inline]
    pub fn publish(
        &self,
        mac: MacAddr,
        path: TracePath,
        what: &str,
        detail: impl FnOnce() -> String,
    ) {
        if self.is_traced(mac) {
            self.send(clock::now_ms(), mac, path, what, detail());
        }
    }

    /// Like [`Hub::publish`] for an event that happened at `at_ms`.
    #[inline]
    pub fn publish_at(
        &self,
        at_ms: u64,
        mac: MacAddr,
        path: TracePath,
        what: &str,
        detail: impl FnOnce() -> String,
    ) {
        if self.is_traced(mac) {
            self.send(at_ms, mac, path, what, detail());
        }
    }

    fn send(&self, at_ms: u64, mac: MacAddr, path: TracePath, what: &str, detail: String) {
        // No receiver left: the watcher is leaving, nothing to do.
        let _ = self.tx.send(Arc::new(TraceEvent {
            at_ms,
            mac,
            path,
            what: what.to_string(),
            detail,
        }));
    }

    /// Starts watching `mac` until the returned [`Watch`] is dropped.
    pub fn watch(self: &Arc<Hub>, mac: MacAddr) -> Result<Watch, WatchError> {
        // Subscribed before the MAC is traced: no event is missed.
        let rx = self.tx.subscribe();
        let mut watchers = self.lock();
        let known = watchers.contains_key(&mac);
        if !known {
            if watchers.len() >= MAX_TRACED as usize {
                return Err(WatchError::Full);
            }
            if let Some(kernel) = self.kernel.get() {
                kernel
                    .set(mac, true, watchers.len() + 1)
                    .map_err(|reason| WatchError::Kernel { mac, reason })?;
            }
        }
        *watchers.entry(mac).or_default() += 1;
        self.traced.store(watchers.len(), Ordering::Relaxed);
        Ok(Watch {
            hub: self.clone(),
            mac,
            rx,
            closed: self.closed.subscribe(),
        })
    }

    fn unwatch(&self, mac: MacAddr) {
        let mut watchers = self.lock();
        let Some(n) = watchers.get_mut(&mac) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            watchers.remove(&mac);
            if let Some(kernel) = self.kernel.get()
                && let Err(e) = kernel.set(mac, false, watchers.len())
            {
                tracing::warn!(%mac, error = %e, "failed to stop tracing in the XDP program");
            }
        }
        self.traced.store(watchers.len(), Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<MacAddr, usize>> {
        lock(&self.watchers)
    }
}

/// A watcher of one MAC; dropping it stops the trace when it was the last.
pub struct Watch {
    hub: Arc<Hub>,
    mac: MacAddr,
    rx: broadcast::Receiver<Arc<TraceEvent>>,
    closed: Shutdown,
}

/// What a watcher gets next.
#[derive(Debug)]
pub enum Next {
    Event(Arc<TraceEvent>),
    /// The watcher fell behind and this many events (of any MAC) were lost.
    Lost(u64),
    /// The agent is shutting down.
    Closed,
}

impl Watch {
    /// The next event of this watcher's MAC. Cancel-safe.
    pub async fn next(&mut self) -> Next {
        loop {
            let received = tokio::select! {
                r = self.rx.recv() => r,
                () = self.closed.stopped() => return Next::Closed,
            };
            match received {
                Ok(event) if event.mac == self.mac => return Next::Event(event),
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(n)) => return Next::Lost(n),
                // The hub holds the sender and outlives every watch.
                Err(broadcast::error::RecvError::Closed) => return Next::Closed,
            }
        }
    }

    pub fn mac(&self) -> MacAddr {
        self.mac
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.hub.unwatch(self.mac);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
    const B: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 2]);

    #[derive(Default)]
    struct Recorder(Mutex<Vec<(MacAddr, bool, usize)>>);

    impl KernelFilter for Arc<Recorder> {
        fn set(&self, mac: MacAddr, traced: bool, count: usize) -> Result<(), String> {
            self.0.lock().unwrap().push((mac, traced, count));
            Ok(())
        }
    }

    #[tokio::test]
    async fn untraced_macs_cost_no_detail_and_reach_no_watcher() {
        let hub = Arc::new(Hub::default());
        hub.publish(A, TracePath::Dhcp, "offer", || {
            panic!("detail built for an untraced MAC")
        });
        let mut watch = hub.watch(A).expect("watch");
        hub.publish(B, TracePath::Dhcp, "offer", || {
            panic!("detail built for an untraced MAC")
        });
        hub.publish(A, TracePath::Tftp, "done", || "ipxe.efi".into());
        let Next::Event(event) = watch.next().await else {
            panic!("lost events")
        };
        assert_eq!(event.mac, A);
        assert_eq!((event.path, event.what.as_str()), (TracePath::Tftp, "done"));
        assert_eq!(event.detail, "ipxe.efi");
        hub.close();
        assert!(matches!(watch.next().await, Next::Closed));
    }

    #[tokio::test]
    async fn the_kernel_filter_follows_the_first_and_last_watcher() {
        let hub = Arc::new(Hub::default());
        let rec = Arc::new(Recorder::default());
        hub.set_kernel(Box::new(rec.clone()));
        let first = hub.watch(A).expect("watch");
        let second = hub.watch(A).expect("watch");
        let other = hub.watch(B).expect("watch");
        assert_eq!(hub.traced(), 2);
        drop(first);
        assert!(hub.is_traced(A), "a watcher is left");
        drop(second);
        assert!(!hub.is_traced(A));
        drop(other);
        assert_eq!(hub.traced(), 0);
        assert_eq!(
            *rec.0.lock().unwrap(),
            [(A, true, 1), (B, true, 2), (A, false, 1), (B, false, 0)]
        );
    }

    #[test]
    fn events_serialize_as_one_json_line() {
        let event = TraceEvent {
            at_ms: 1,
            mac: A,
            path: TracePath::PhoneHome,
            what: "booted".into(),
            detail: "ok".into(),
        };
        let line = serde_json::to_string(&event).expect("json");
        assert!(!line.contains('\n'));
        assert!(line.contains(r#""path":"phone-home""#), "{line}");
        assert!(line.contains(r#""mac":"52:54:00:00:00:01""#), "{line}");
        assert_eq!(
            serde_json::from_str::<TraceEvent>(&line).expect("parses"),
            event
        );
    }
}

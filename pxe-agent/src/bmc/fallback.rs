//! Per-host fallback between two drivers of one BMC (Redfish and IPMI):
//! [`FallbackBmc`] runs each call on the driver the host starts with and,
//! when that fails, the same call on the other; [`Fallbacks`] is the one
//! record of which driver each host starts with, of the hold-down after a
//! fallback, and of the fallbacks themselves (log line, metric, audit
//! entry), which the API, `pxe-agent hosts` and `/metrics` read.
//!
//! Owns the policy: which failures fall back ([`Reason::of`]), and how
//! long a host starts with the second driver after one (the hold-down).
//! It does not build drivers ([`super::driver`]) nor read the inventory.

use std::{
    collections::{BTreeMap, HashMap},
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::{
    Bmc, BmcError, BmcInfo, BootFlags, BootTarget, PowerAction, PowerState, single::Single,
};
use crate::{
    audit::{AuditLog, Entry},
    clock::now_ms,
    metrics::exposition::{Exposition, Kind},
    sync::lock,
};

/// Metric name of the fallbacks made.
pub const FALLBACK_TOTAL: &str = "pxe_bmc_fallback_total";
/// Metric name of the hosts in hold-down now.
pub const FALLBACK_HELD: &str = "pxe_bmc_fallback_held_hosts";

/// Default of `bmc.fallback_hold`.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(10 * 60);

/// Why a call fell back to the other driver: the metric's `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// No answer, connection refused or reset, deadline passed.
    Unreachable,
    /// The TLS handshake or settings failed.
    Tls,
    /// An HTTP error status (500, 404, ...).
    HttpStatus,
    /// The BMC accepted a boot override but reads back another.
    ReadBack,
    /// Credentials or privilege refused.
    Auth,
    /// A malformed answer, a system or value the BMC does not have, or an
    /// error of the IPMI protocol.
    Protocol,
}

impl Reason {
    /// Why `e` falls back; `None` when the call must not be repeated on
    /// the other driver: a power action whose outcome is unknown may have
    /// happened, and sending it again could cycle the host twice.
    pub fn of(e: &BmcError) -> Option<Reason> {
        Some(match e {
            BmcError::OutcomeUnknown { .. } => return None,
            BmcError::Unreachable { .. }
            | BmcError::Timeout { .. }
            | BmcError::Connect { .. }
            | BmcError::WorkerLost { .. } => Reason::Unreachable,
            BmcError::TlsConfig { .. } | BmcError::TlsRejected { .. } => Reason::Tls,
            BmcError::Http { .. } => Reason::HttpStatus,
            BmcError::ReadBackMismatch { .. } => Reason::ReadBack,
            BmcError::AuthFailed { .. }
            | BmcError::InsufficientPrivilege { .. }
            | BmcError::Credentials { .. } => Reason::Auth,
            BmcError::NoCipherSuite { .. }
            | BmcError::Protocol { .. }
            | BmcError::CompletionCode { .. }
            | BmcError::UnsupportedDriver { .. }
            | BmcError::Malformed { .. }
            | BmcError::SystemNotFound { .. }
            | BmcError::NotAdvertised { .. }
            | BmcError::BothFailed { .. } => Reason::Protocol,
        })
    }

    pub fn label(self) -> &'static str {
        match self {
            Reason::Unreachable => "unreachable",
            Reason::Tls => "tls",
            Reason::HttpStatus => "http-status",
            Reason::ReadBack => "read-back",
            Reason::Auth => "auth",
            Reason::Protocol => "protocol",
        }
    }
}

/// One fallback, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FallbackEvent {
    /// Unix milliseconds.
    pub at_ms: u64,
    pub from: String,
    pub to: String,
    /// [`Reason::label`].
    pub reason: String,
    /// The call that failed: `power`, `power-status`, `bootdev`, ...
    pub call: String,
    /// The first driver's error (never holds a password).
    pub error: String,
}

/// A host's driver state, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverStatus {
    /// The driver the host's next call starts with.
    pub driver: String,
    /// Until when (unix ms) calls start with the second driver.
    pub held_until_ms: Option<u64>,
    pub last_fallback: Option<FallbackEvent>,
}

#[derive(Debug, Default)]
struct HostState {
    held_until_ms: Option<u64>,
    last: Option<FallbackEvent>,
}

/// Which driver each host with two starts with, and every fallback made.
/// Shared by every driver the agent builds, across inventory reloads.
#[derive(Default)]
pub struct Fallbacks {
    hosts: Mutex<HashMap<String, HostState>>,
    counts: Mutex<BTreeMap<(&'static str, &'static str, Reason), u64>>,
    audit: Option<Arc<AuditLog>>,
}

impl std::fmt::Debug for Fallbacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fallbacks").finish_non_exhaustive()
    }
}

impl Fallbacks {
    /// A record that writes each fallback to `audit` too.
    pub fn new(audit: Option<Arc<AuditLog>>) -> Fallbacks {
        Fallbacks {
            audit,
            ..Fallbacks::default()
        }
    }

    /// Whether the host keyed `key` is in hold-down at `now`.
    fn held(&self, key: &str, now: u64) -> bool {
        lock(&self.hosts)
            .get(key)
            .and_then(|h| h.held_until_ms)
            .is_some_and(|until| now < until)
    }

    fn hold(&self, key: &str, until: Option<u64>) {
        lock(&self.hosts)
            .entry(key.to_owned())
            .or_default()
            .held_until_ms = until;
    }

    fn note(
        &self,
        key: &str,
        reason: Reason,
        event: FallbackEvent,
        from: &'static str,
        to: &'static str,
    ) {
        *lock(&self.counts).entry((from, to, reason)).or_default() += 1;
        lock(&self.hosts).entry(key.to_owned()).or_default().last = Some(event);
    }

    /// The state of the host whose fallback is keyed `key`, `first` and
    /// `second` being its drivers in order.
    pub fn status(&self, key: &str, first: &str, second: &str) -> DriverStatus {
        let now = now_ms();
        let hosts = lock(&self.hosts);
        let state = hosts.get(key);
        let held_until_ms = state
            .and_then(|h| h.held_until_ms)
            .filter(|&until| now < until);
        DriverStatus {
            driver: if held_until_ms.is_some() {
                second
            } else {
                first
            }
            .to_owned(),
            held_until_ms,
            last_fallback: state.and_then(|h| h.last.clone()),
        }
    }

    /// The fallback counter and the hold-down gauge, Prometheus text.
    pub fn render(&self) -> String {
        let mut out = Exposition::new();
        let mut f = out.family(
            FALLBACK_TOTAL,
            Kind::Counter,
            "BMC calls redone on a host's other driver after its first failed.",
        );
        for ((from, to, reason), n) in lock(&self.counts).iter() {
            f.sample(&[("from", from), ("to", to), ("reason", reason.label())], n);
        }
        let now = now_ms();
        let held = lock(&self.hosts)
            .values()
            .filter(|h| h.held_until_ms.is_some_and(|u| now < u))
            .count();
        out.family(
            FALLBACK_HELD,
            Kind::Gauge,
            "Hosts whose BMC calls start with their second driver (hold-down).",
        )
        .value(held);
        out.finish()
    }
}

/// Two drivers of one BMC, tried in order, with the hold-down after a
/// fallback. See the module documentation.
#[derive(Debug, Clone)]
pub struct FallbackBmc {
    first: Arc<Single>,
    second: Arc<Single>,
    hold: Duration,
    /// The host's name, for the log and the audit entry.
    host: String,
    /// The host's key in `record` (its primary BMC address).
    key: String,
    record: Arc<Fallbacks>,
}

impl FallbackBmc {
    pub fn new(
        first: Single,
        second: Single,
        hold: Duration,
        host: String,
        key: String,
        record: Arc<Fallbacks>,
    ) -> FallbackBmc {
        FallbackBmc {
            first: Arc::new(first),
            second: Arc::new(second),
            hold,
            host,
            key,
            record,
        }
    }

    /// Names of the two drivers, in order.
    pub fn names(&self) -> (&'static str, &'static str) {
        (self.first.name(), self.second.name())
    }

    /// Runs `op` on the driver the host starts with, then on the other
    /// when that fails in a way that allows it; starts or ends the
    /// hold-down by which driver worked.
    async fn run<T, F, Fut>(&self, call: &'static str, op: F) -> Result<T, BmcError>
    where
        F: Fn(Arc<Single>) -> Fut,
        Fut: Future<Output = Result<T, BmcError>>,
    {
        let held = self.record.held(&self.key, now_ms());
        let (start, other) = if held {
            (&self.second, &self.first)
        } else {
            (&self.first, &self.second)
        };
        let error = match op(start.clone()).await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let Some(reason) = Reason::of(&error) else {
            return Err(error);
        };
        let (from, to) = (start.name(), other.name());
        warn!(
            host = %self.host,
            from,
            to,
            reason = reason.label(),
            call,
            error = %error,
            "BMC call failed: falling back to the other driver"
        );
        let at_ms = now_ms();
        let event = FallbackEvent {
            at_ms,
            from: from.to_owned(),
            to: to.to_owned(),
            reason: reason.label().to_owned(),
            call: call.to_owned(),
            error: error.to_string(),
        };
        self.record.note(&self.key, reason, event.clone(), from, to);
        let started = std::time::Instant::now();
        let result = op(other.clone()).await;
        if result.is_ok() {
            if Arc::ptr_eq(other, &self.second) {
                let until =
                    at_ms.saturating_add(u64::try_from(self.hold.as_millis()).unwrap_or(u64::MAX));
                self.record.hold(&self.key, Some(until));
                info!(host = %self.host, driver = to, hold = ?self.hold, "BMC calls start with the second driver during the hold-down");
            } else {
                self.record.hold(&self.key, None);
            }
        }
        self.audit(event, &result, started.elapsed()).await;
        result.map_err(|second| BmcError::BothFailed {
            first: Box::new(error),
            second: Box::new(second),
        })
    }

    /// Writes the fallback to the audit log, off the runtime's workers.
    async fn audit<T>(&self, event: FallbackEvent, result: &Result<T, BmcError>, took: Duration) {
        let Some(audit) = self.record.audit.clone() else {
            return;
        };
        let entry = Entry {
            at_ms: event.at_ms,
            caller: "agent".into(),
            groups: Vec::new(),
            host: self.host.clone(),
            action: "bmc-fallback".into(),
            params: serde_json::json!({
                "from": event.from,
                "to": event.to,
                "reason": event.reason,
                "call": event.call,
                "error": event.error,
                "hold_s": self.hold.as_secs(),
            }),
            result: match result {
                Ok(_) => "ok".into(),
                Err(e) => e.to_string(),
            },
            duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
        };
        match tokio::task::spawn_blocking(move || audit.record(&entry)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "audit entry of a BMC fallback not written"),
            Err(e) => tracing::error!(error = %e, "audit entry of a BMC fallback lost"),
        }
    }
}

impl Bmc for FallbackBmc {
    async fn power_status(&self) -> Result<PowerState, BmcError> {
        self.run("power-status", |d: Arc<Single>| async move {
            d.power_status().await
        })
        .await
    }

    async fn power(&self, action: PowerAction) -> Result<(), BmcError> {
        self.run(
            "power",
            |d: Arc<Single>| async move { d.power(action).await },
        )
        .await
    }

    async fn set_boot_device(&self, target: BootTarget) -> Result<(), BmcError> {
        self.run("bootdev", |d: Arc<Single>| async move {
            d.set_boot_device(target).await
        })
        .await
    }

    async fn boot_device(&self) -> Result<BootFlags, BmcError> {
        self.run("boot-device", |d: Arc<Single>| async move {
            d.boot_device().await
        })
        .await
    }

    async fn info(&self) -> Result<BmcInfo, BmcError> {
        self.run("info", |d: Arc<Single>| async move { d.info().await })
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn event(reason: Reason) -> FallbackEvent {
        FallbackEvent {
            at_ms: now_ms(),
            from: "redfish".into(),
            to: "ipmi".into(),
            reason: reason.label().into(),
            call: "power".into(),
            error: "BMC 10.0.0.1:443 unreachable".into(),
        }
    }

    #[test]
    fn every_failure_falls_back_but_a_power_action_of_unknown_outcome() {
        let bmc = || "10.0.0.1:443".to_owned();
        let cases = [
            (
                BmcError::Connect {
                    bmc: bmc(),
                    reason: "refused".into(),
                },
                Some(Reason::Unreachable),
            ),
            (
                BmcError::Http {
                    bmc: bmc(),
                    method: "GET",
                    path: "/redfish/v1/".into(),
                    status: 500,
                    message: None,
                },
                Some(Reason::HttpStatus),
            ),
            (
                BmcError::ReadBackMismatch {
                    bmc: bmc(),
                    wanted: BootTarget {
                        device: super::super::BootDevice::Pxe,
                        persistent: false,
                        efi: true,
                    },
                    got: BootFlags {
                        valid: true,
                        persistent: false,
                        efi: true,
                        selector: 2,
                    },
                },
                Some(Reason::ReadBack),
            ),
            (
                BmcError::AuthFailed {
                    bmc: bmc(),
                    user: "admin".into(),
                },
                Some(Reason::Auth),
            ),
            (
                BmcError::OutcomeUnknown {
                    bmc: bmc(),
                    action: PowerAction::Cycle,
                    waited: Duration::from_secs(5),
                },
                None,
            ),
        ];
        for (error, want) in cases {
            assert_eq!(Reason::of(&error), want, "{error}");
        }
    }

    #[test]
    fn a_hold_down_switches_the_driver_shown_until_it_ends() {
        let record = Fallbacks::default();
        let key = "redfish://10.0.0.1/redfish/v1/Systems/1";
        assert_eq!(record.status(key, "redfish", "ipmi").driver, "redfish");
        record.note(
            key,
            Reason::HttpStatus,
            event(Reason::HttpStatus),
            "redfish",
            "ipmi",
        );
        record.hold(key, Some(now_ms() + 60_000));
        assert!(record.held(key, now_ms()));
        let status = record.status(key, "redfish", "ipmi");
        assert_eq!(status.driver, "ipmi");
        assert!(status.held_until_ms.is_some());
        assert_eq!(status.last_fallback.unwrap().reason, "http-status");
        let page = record.render();
        assert!(
            page.contains(
                "pxe_bmc_fallback_total{from=\"redfish\",to=\"ipmi\",reason=\"http-status\"} 1"
            ),
            "{page}"
        );
        assert!(page.contains("pxe_bmc_fallback_held_hosts 1"), "{page}");
        // Once it has passed, calls start with the first driver again.
        record.hold(key, Some(now_ms() - 1));
        assert!(!record.held(key, now_ms()));
        assert_eq!(record.status(key, "redfish", "ipmi").driver, "redfish");
        assert!(record.render().contains("pxe_bmc_fallback_held_hosts 0"));
    }

    #[test]
    fn the_metrics_are_written_as_before() {
        let record = Fallbacks::default();
        let held = "redfish://10.0.0.1/redfish/v1/Systems/1";
        let free = "redfish://10.0.0.2/redfish/v1/Systems/1";
        for (key, reason) in [
            (held, Reason::HttpStatus),
            (held, Reason::HttpStatus),
            (free, Reason::Unreachable),
        ] {
            record.note(key, reason, event(reason), "redfish", "ipmi");
        }
        record.note(free, Reason::Auth, event(Reason::Auth), "ipmi", "redfish");
        record.hold(held, Some(now_ms() + 3_600_000));
        record.hold(free, Some(now_ms() - 1));
        assert_eq!(
            record.render(),
            r#"# HELP pxe_bmc_fallback_total BMC calls redone on a host's other driver after its first failed.
# TYPE pxe_bmc_fallback_total counter
pxe_bmc_fallback_total{from="ipmi",to="redfish",reason="auth"} 1
pxe_bmc_fallback_total{from="redfish",to="ipmi",reason="unreachable"} 1
pxe_bmc_fallback_total{from="redfish",to="ipmi",reason="http-status"} 2
# HELP pxe_bmc_fallback_held_hosts Hosts whose BMC calls start with their second driver (hold-down).
# TYPE pxe_bmc_fallback_held_hosts gauge
pxe_bmc_fallback_held_hosts 1
"#
        );
    }
}

//! The agent's BMC calls counted by operation and result for `/metrics`:
//! [`Counted`] wraps the driver the agent builds for a host and records
//! each call in the shared [`Calls`]. Owns the counting only; the drivers
//! and the fallback between them are [`super::driver`]'s.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use super::{Bmc, BmcError, BmcInfo, BootFlags, BootTarget, PowerAction, PowerState};
use crate::{
    metrics::exposition::{Exposition, Kind},
    sync::lock,
};

/// Metric name of the calls made.
pub const CALLS: &str = "pxe_bmc_calls_total";

/// Every operation, listed on the page from the start.
const OPS: [&str; 5] = [
    "power_status",
    "power",
    "set_boot_device",
    "boot_device",
    "info",
];

/// Calls made through [`Counted`] drivers, by operation and result.
#[derive(Debug, Default)]
pub struct Calls {
    counts: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
}

impl Calls {
    fn count<T>(&self, op: &'static str, result: &Result<T, BmcError>) {
        let result = if result.is_ok() { "ok" } else { "error" };
        *lock(&self.counts).entry((op, result)).or_default() += 1;
    }

    /// The `/metrics` block: every operation with both results, 0 included.
    pub fn render(&self) -> String {
        let counts = lock(&self.counts);
        let mut out = Exposition::new();
        let mut f = out.family(
            CALLS,
            Kind::Counter,
            "BMC calls the agent made (recovery and API actions), by operation and result; a call that fell back to a host's other driver counts once.",
        );
        for op in OPS {
            for result in ["ok", "error"] {
                let n = counts.get(&(op, result)).copied().unwrap_or(0);
                f.sample(&[("op", op), ("result", result)], n);
            }
        }
        out.finish()
    }
}

/// A driver whose calls are counted in `calls`.
#[derive(Debug, Clone)]
pub struct Counted<B> {
    inner: B,
    calls: Arc<Calls>,
}

impl<B> Counted<B> {
    pub fn new(inner: B, calls: Arc<Calls>) -> Counted<B> {
        Counted { inner, calls }
    }
}

impl<B: Bmc> Bmc for Counted<B> {
    async fn power_status(&self) -> Result<PowerState, BmcError> {
        let r = self.inner.power_status().await;
        self.calls.count("power_status", &r);
        r
    }

    async fn power(&self, action: PowerAction) -> Result<(), BmcError> {
        let r = self.inner.power(action).await;
        self.calls.count("power", &r);
        r
    }

    async fn set_boot_device(&self, target: BootTarget) -> Result<(), BmcError> {
        let r = self.inner.set_boot_device(target).await;
        self.calls.count("set_boot_device", &r);
        r
    }

    async fn boot_device(&self) -> Result<BootFlags, BmcError> {
        let r = self.inner.boot_device().await;
        self.calls.count("boot_device", &r);
        r
    }

    async fn info(&self) -> Result<BmcInfo, BmcError> {
        let r = self.inner.info().await;
        self.calls.count("info", &r);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bmc::fake::FakeBmc;

    #[tokio::test]
    async fn calls_are_counted_by_operation_and_result() {
        let calls = Arc::new(Calls::default());
        let bmc = Counted::new(FakeBmc::new("bmc:623", PowerState::Off), calls.clone());
        bmc.power_status().await.unwrap();
        bmc.power(PowerAction::On).await.unwrap();
        let page = calls.render();
        for line in [
            "pxe_bmc_calls_total{op=\"power_status\",result=\"ok\"} 1\n",
            "pxe_bmc_calls_total{op=\"power\",result=\"ok\"} 1\n",
            "pxe_bmc_calls_total{op=\"info\",result=\"error\"} 0\n",
        ] {
            assert!(page.contains(line), "{line:?} in {page}");
        }
    }
}

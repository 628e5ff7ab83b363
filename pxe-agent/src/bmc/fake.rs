//! A [`Bmc`] that keeps a simulated chassis in memory, for tests of the
//! code that calls BMCs (the recovery controller, later the CLI and API).
//!
//! It behaves as IPMI BMCs do where it matters to callers: power on and
//! off are idempotent, a power cycle of a host that is off is refused
//! (completion code D5h, as ipmitool shows on most BMCs), a boot override
//! set as one-time is consumed (valid bit cleared) by the next power-up
//! while a persistent one stays, and every power-up records which device
//! the firmware would boot. Failures and delays are injected per call.
//! Delays use `tokio::time`, so tests with a paused clock run instantly.
//!
//! It owns no protocol: nothing here goes on a wire.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::sync::lock;

use super::{
    Bmc, BmcError, BmcInfo, BootDevice, BootFlags, BootTarget, CommandName, PowerAction, PowerState,
};

/// Which trait method a failure or delay applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    PowerStatus,
    Power,
    SetBootDevice,
    BootDevice,
    Info,
}

/// A call as the fake saw it, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    PowerStatus,
    Power(PowerAction),
    SetBootDevice(BootTarget),
    BootDevice,
    Info,
}

/// One power-up of the simulated host: what it booted from. `None`: no
/// override was valid, so the firmware's own boot order applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Boot {
    pub device: Option<BootDevice>,
    pub efi: bool,
}

#[derive(Debug)]
struct Chassis {
    power: PowerState,
    flags: BootFlags,
    boots: Vec<Boot>,
    calls: Vec<Seen>,
    /// Failures to return, by call, first in first out.
    failures: Vec<(Call, BmcError)>,
    /// Fail every call, e.g. an unreachable BMC.
    always: Option<BmcError>,
    delays: Vec<(Call, Duration)>,
    /// What Get System Boot Options answers next instead of the truth,
    /// for read-back mismatches.
    stale_read_back: VecDeque<BootFlags>,
}

/// A simulated BMC. Clones share the chassis, so a test keeps one to
/// inspect while the code under test owns another.
#[derive(Debug, Clone)]
pub struct FakeBmc {
    name: String,
    chassis: Arc<Mutex<Chassis>>,
}

const NO_OVERRIDE: BootFlags = BootFlags {
    valid: false,
    persistent: false,
    efi: false,
    selector: 0,
};

impl FakeBmc {
    /// A BMC named `name` (as `host:port` would be) whose host is `power`.
    pub fn new(name: impl Into<String>, power: PowerState) -> FakeBmc {
        FakeBmc {
            name: name.into(),
            chassis: Arc::new(Mutex::new(Chassis {
                power,
                flags: NO_OVERRIDE,
                boots: Vec::new(),
                calls: Vec::new(),
                failures: Vec::new(),
                always: None,
                delays: Vec::new(),
                stale_read_back: VecDeque::new(),
            })),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Chassis) -> T) -> T {
        f(&mut lock(&self.chassis))
    }

    /// The name errors carry, like a real driver's `host:port`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The next `call` fails with `error` (queued after earlier ones).
    pub fn fail_next(&self, call: Call, error: BmcError) {
        self.with(|c| c.failures.push((call, error)));
    }

    /// Every call fails with `error` until [`FakeBmc::heal`].
    pub fn fail_always(&self, error: BmcError) {
        self.with(|c| c.always = Some(error));
    }

    pub fn heal(&self) {
        self.with(|c| c.always = None);
    }

    /// Each `call` takes `delay` before it answers.
    pub fn delay(&self, call: Call, delay: Duration) {
        self.with(|c| c.delays.push((call, delay)));
    }

    /// The next boot-device read answers `flags` instead of what is set.
    pub fn stale_read_back(&self, flags: BootFlags) {
        self.with(|c| c.stale_read_back.push_back(flags));
    }

    pub fn power_state(&self) -> PowerState {
        self.with(|c| c.power)
    }

    /// The boot flags the BMC holds now.
    pub fn flags(&self) -> BootFlags {
        self.with(|c| c.flags)
    }

    /// Every power-up so far, oldest first.
    pub fn boots(&self) -> Vec<Boot> {
        self.with(|c| c.boots.clone())
    }

    /// Every call so far, oldest first, failed ones included.
    pub fn calls(&self) -> Vec<Seen> {
        self.with(|c| c.calls.clone())
    }

    /// The host shut itself down (or lost power).
    pub fn host_powers_off(&self) {
        self.with(|c| c.power = PowerState::Off);
    }

    /// A timeout error naming this BMC, for injecting.
    pub fn timeout(&self) -> BmcError {
        BmcError::Timeout {
            bmc: self.name.clone(),
            deadline: Duration::from_secs(15),
        }
    }

    /// Logs `seen`, waits the call's delay, then returns the injected
    /// failure for `call`, if any.
    async fn enter(&self, call: Call, seen: Seen) -> Result<(), BmcError> {
        let delay = self.with(|c| {
            c.calls.push(seen);
            c.delays
                .iter()
                .filter(|(k, _)| *k == call)
                .map(|(_, d)| *d)
                .sum::<Duration>()
        });
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        self.with(|c| {
            if let Some(error) = &c.always {
                return Err(error.clone());
            }
            match c.failures.iter().position(|(k, _)| *k == call) {
                Some(at) => Err(c.failures.remove(at).1),
                None => Ok(()),
            }
        })
    }
}

impl Chassis {
    /// The firmware starts: it boots the override if one is valid, and a
    /// one-time override is used up (IPMI 2.0 §28.12: the BMC clears the
    /// valid bit once the boot flags were handed to the BIOS).
    fn power_up(&mut self) {
        let flags = self.flags;
        self.boots.push(Boot {
            device: flags.valid.then(|| flags.device()).flatten(),
            efi: flags.efi,
        });
        if flags.valid && !flags.persistent {
            self.flags.valid = false;
        }
        self.power = PowerState::On;
    }
}

impl Bmc for FakeBmc {
    async fn power_status(&self) -> Result<PowerState, BmcError> {
        self.enter(Call::PowerStatus, Seen::PowerStatus).await?;
        Ok(self.power_state())
    }

    async fn power(&self, action: PowerAction) -> Result<(), BmcError> {
        self.enter(Call::Power, Seen::Power(action)).await?;
        self.with(|c| match (action, c.power) {
            (PowerAction::On, PowerState::Off) => {
                c.power_up();
                Ok(())
            }
            (PowerAction::On, PowerState::On) => Ok(()),
            (PowerAction::Off | PowerAction::SoftOff, _) => {
                c.power = PowerState::Off;
                Ok(())
            }
            (PowerAction::Cycle | PowerAction::Reset, PowerState::On) => {
                c.power_up();
                Ok(())
            }
            // Most BMCs refuse a cycle or reset of a host that is off
            // ("request parameter(s) not supported in present state").
            (PowerAction::Cycle | PowerAction::Reset, PowerState::Off) => {
                Err(BmcError::CompletionCode {
                    bmc: self.name.clone(),
                    cmd: CommandName::ChassisControl,
                    code: 0xd5,
                })
            }
        })
    }

    async fn set_boot_device(&self, target: BootTarget) -> Result<(), BmcError> {
        self.enter(Call::SetBootDevice, Seen::SetBootDevice(target))
            .await?;
        let wanted = BootFlags::from(target);
        // The read-back, as the IPMI driver does it.
        let got = self.with(|c| {
            c.flags = wanted;
            c.stale_read_back.pop_front().unwrap_or(c.flags)
        });
        if got == wanted {
            Ok(())
        } else {
            Err(BmcError::ReadBackMismatch {
                bmc: self.name.clone(),
                wanted: target,
                got,
            })
        }
    }

    async fn boot_device(&self) -> Result<BootFlags, BmcError> {
        self.enter(Call::BootDevice, Seen::BootDevice).await?;
        Ok(self.with(|c| c.stale_read_back.pop_front().unwrap_or(c.flags)))
    }

    async fn info(&self) -> Result<BmcInfo, BmcError> {
        self.enter(Call::Info, Seen::Info).await?;
        Ok(BmcInfo {
            device_id: 0x20,
            device_revision: 1,
            firmware_major: 1,
            firmware_minor: 0,
            ipmi_version: (2, 0),
            manufacturer_id: 0,
            product_id: 0,
            vendor: None,
            model: None,
            firmware_version: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PXE_ONCE: BootTarget = BootTarget {
        device: BootDevice::Pxe,
        persistent: false,
        efi: true,
    };

    #[tokio::test]
    async fn one_time_override_is_used_by_the_next_power_up_only() {
        let bmc = FakeBmc::new("bmc-1:623", PowerState::On);
        bmc.set_boot_device(PXE_ONCE).await.unwrap();
        assert!(bmc.flags().valid);
        bmc.power(PowerAction::Cycle).await.unwrap();
        assert!(!bmc.flags().valid, "consumed by the power-up");
        bmc.power(PowerAction::Reset).await.unwrap();
        assert_eq!(
            bmc.boots(),
            [
                Boot {
                    device: Some(BootDevice::Pxe),
                    efi: true
                },
                Boot {
                    device: None,
                    efi: true
                }
            ]
        );
    }

    #[tokio::test]
    async fn persistent_override_stays_across_power_ups() {
        let bmc = FakeBmc::new("bmc-1:623", PowerState::Off);
        let disk = BootTarget {
            device: BootDevice::Disk,
            persistent: true,
            efi: false,
        };
        bmc.set_boot_device(disk).await.unwrap();
        bmc.power(PowerAction::On).await.unwrap();
        bmc.power(PowerAction::On).await.unwrap();
        bmc.power(PowerAction::Cycle).await.unwrap();
        let disk_boot = Boot {
            device: Some(BootDevice::Disk),
            efi: false,
        };
        assert_eq!(bmc.boots(), [disk_boot, disk_boot], "on twice is one boot");
        assert!(bmc.flags().valid && bmc.flags().persistent);
    }

    #[tokio::test]
    async fn cycling_a_host_that_is_off_is_refused() {
        let bmc = FakeBmc::new("bmc-1:623", PowerState::Off);
        let err = bmc.power(PowerAction::Cycle).await.unwrap_err();
        assert!(
            matches!(err, BmcError::CompletionCode { code: 0xd5, .. }),
            "{err}"
        );
        assert!(bmc.boots().is_empty());
    }

    #[tokio::test]
    async fn injected_failures_and_read_back_mismatches_are_returned_once() {
        let bmc = FakeBmc::new("bmc-1:623", PowerState::On);
        bmc.fail_next(Call::PowerStatus, bmc.timeout());
        assert!(bmc.power_status().await.is_err());
        assert_eq!(bmc.power_status().await, Ok(PowerState::On));
        bmc.stale_read_back(NO_OVERRIDE);
        assert!(matches!(
            bmc.set_boot_device(PXE_ONCE).await,
            Err(BmcError::ReadBackMismatch { .. })
        ));
        assert_eq!(bmc.set_boot_device(PXE_ONCE).await, Ok(()));
        bmc.fail_always(bmc.timeout());
        assert!(bmc.info().await.is_err() && bmc.boot_device().await.is_err());
        bmc.heal();
        assert!(bmc.info().await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn delays_pass_on_the_tokio_clock() {
        let bmc = FakeBmc::new("bmc-1:623", PowerState::On);
        bmc.delay(Call::Power, Duration::from_secs(5));
        let start = tokio::time::Instant::now();
        bmc.power(PowerAction::Off).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        assert_eq!(bmc.power_state(), PowerState::Off);
        assert_eq!(bmc.calls(), [Seen::Power(PowerAction::Off)]);
    }
}

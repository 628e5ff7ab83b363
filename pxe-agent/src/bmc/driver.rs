//! The one driver type callers build: [`Driver`] picks IPMI or Redfish from
//! a host's BMC address and delegates every [`Bmc`] call to it.
//!
//! Owns that choice only. The recovery controller, the CLI and the API all
//! build their drivers here, so the fallback from one driver to another
//! ([`super::fallback`]) is in this one place for all of them.

use std::sync::Arc;

use super::{
    Bmc, BmcAddress, BmcError, BmcInfo, BootFlagEcho, BootFlags, BootTarget, IpmiBmc, PowerAction,
    PowerState, RedfishBmc, RetryPolicy,
    fallback::{DriverStatus, FallbackBmc, Fallbacks},
    settings::{BmcSettings, DriverKind},
    single::Single,
};

/// A host's BMC driver.
#[derive(Debug, Clone)]
pub enum Driver {
    Ipmi(IpmiBmc),
    Redfish(RedfishBmc),
    /// Two drivers of one BMC, the second used when the first fails
    /// (`bmc.drivers: [redfish, ipmi]`).
    Fallback(FallbackBmc),
}

impl Driver {
    /// The driver for `settings`, with a fallback record of its own (for
    /// one-off calls); the agent shares one with [`Driver::for_host_in`].
    pub fn for_host(
        settings: &BmcSettings,
        policy: RetryPolicy,
        echo: BootFlagEcho,
    ) -> Result<Driver, BmcError> {
        Driver::for_host_in(settings, policy, echo, &Arc::new(Fallbacks::default()))
    }

    /// The driver for `settings`: by address scheme, or both drivers in
    /// the order of `bmc.drivers` when the host has two addresses; `echo`
    /// applies to IPMI; fallbacks are recorded in `record`.
    pub fn for_host_in(
        settings: &BmcSettings,
        policy: RetryPolicy,
        echo: BootFlagEcho,
        record: &Arc<Fallbacks>,
    ) -> Result<Driver, BmcError> {
        let Some(fallback) = &settings.fallback else {
            return Ok(
                match Single::build(settings, &settings.address, policy, echo)? {
                    Single::Ipmi(b) => Driver::Ipmi(b),
                    Single::Redfish(b) => Driver::Redfish(b),
                },
            );
        };
        let redfish = Single::build(settings, &settings.address, policy, echo)?;
        let ipmi = Single::build(settings, &fallback.ipmi, policy, echo)?;
        let (first, second) = match fallback.first {
            DriverKind::Redfish => (redfish, ipmi),
            DriverKind::Ipmi => (ipmi, redfish),
        };
        Ok(Driver::Fallback(FallbackBmc::new(
            first,
            second,
            fallback.hold,
            fallback.host.clone(),
            fallback_key(settings),
            record.clone(),
        )))
    }

    /// `ipmi`, `redfish`, or for a fallback pair the first driver's name,
    /// for messages and the audit log.
    pub fn name(&self) -> &'static str {
        match self {
            Driver::Ipmi(_) => "ipmi",
            Driver::Redfish(_) => "redfish",
            Driver::Fallback(f) => f.names().0,
        }
    }
}

/// The key of a host's state in [`Fallbacks`]: its primary BMC address.
pub fn fallback_key(settings: &BmcSettings) -> String {
    settings.address.to_string()
}

/// What the API shows of a host's driver: the one its calls start with,
/// and for a host with two its hold-down and last fallback.
pub fn status(settings: &BmcSettings, record: &Fallbacks) -> DriverStatus {
    let kind = |a: &BmcAddress| match a {
        BmcAddress::Ipmi { .. } => "ipmi",
        BmcAddress::Redfish(_) => "redfish",
    };
    match &settings.fallback {
        None => DriverStatus {
            driver: kind(&settings.address).to_owned(),
            held_until_ms: None,
            last_fallback: None,
        },
        Some(f) => {
            let (first, second) = match f.first {
                DriverKind::Redfish => ("redfish", "ipmi"),
                DriverKind::Ipmi => ("ipmi", "redfish"),
            };
            record.status(&fallback_key(settings), first, second)
        }
    }
}

impl Bmc for Driver {
    async fn power_status(&self) -> Result<PowerState, BmcError> {
        match self {
            Driver::Ipmi(b) => b.power_status().await,
            Driver::Redfish(b) => b.power_status().await,
            Driver::Fallback(b) => b.power_status().await,
        }
    }

    async fn power(&self, action: PowerAction) -> Result<(), BmcError> {
        match self {
            Driver::Ipmi(b) => b.power(action).await,
            Driver::Redfish(b) => b.power(action).await,
            Driver::Fallback(b) => b.power(action).await,
        }
    }

    async fn set_boot_device(&self, target: BootTarget) -> Result<(), BmcError> {
        match self {
            Driver::Ipmi(b) => b.set_boot_device(target).await,
            Driver::Redfish(b) => b.set_boot_device(target).await,
            Driver::Fallback(b) => b.set_boot_device(target).await,
        }
    }

    async fn boot_device(&self) -> Result<BootFlags, BmcError> {
        match self {
            Driver::Ipmi(b) => b.boot_device().await,
            Driver::Redfish(b) => b.boot_device().await,
            Driver::Fallback(b) => b.boot_device().await,
        }
    }

    async fn info(&self) -> Result<BmcInfo, BmcError> {
        match self {
            Driver::Ipmi(b) => b.info().await,
            Driver::Redfish(b) => b.info().await,
            Driver::Fallback(b) => b.info().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bmc::{
        Credentials, Password, TlsOptions,
        settings::{BootMode, PasswordSource},
    };

    fn settings(address: &str) -> BmcSettings {
        BmcSettings {
            address: address.parse().unwrap(),
            credentials: Credentials::new("admin", Password::new("pw-not-shown")).unwrap(),
            password_from: PasswordSource::Env("BMC_PW".into()),
            boot_mode: BootMode::Uefi,
            tls: TlsOptions::default(),
            fallback: None,
        }
    }

    #[test]
    fn the_address_scheme_picks_the_driver() {
        let echo = BootFlagEcho::default();
        let ipmi = Driver::for_host(&settings("ipmi://10.0.0.1"), RetryPolicy::default(), echo);
        assert_eq!(ipmi.unwrap().name(), "ipmi");
        for address in [
            "redfish+http://10.0.0.1:8000/redfish/v1/Systems/1",
            "idrac-redfish://10.0.0.1/redfish/v1/Systems/System.Embedded.1",
        ] {
            let driver = Driver::for_host(&settings(address), RetryPolicy::default(), echo)
                .expect("redfish driver");
            assert_eq!(driver.name(), "redfish");
            assert!(!format!("{driver:?}").contains("pw-not-shown"));
        }
    }

    #[test]
    fn an_unreadable_ca_file_fails_when_the_driver_is_built() {
        let mut s = settings("redfish://10.0.0.1/redfish/v1/Systems/1");
        s.tls.ca_file = Some("/nonexistent/pxe-agent-ca.pem".into());
        let err =
            Driver::for_host(&s, RetryPolicy::default(), BootFlagEcho::default()).unwrap_err();
        assert!(matches!(err, BmcError::TlsConfig { .. }), "{err}");
        assert!(err.is_permanent());
        assert!(
            err.to_string().contains("/nonexistent/pxe-agent-ca.pem"),
            "{err}"
        );
    }
}

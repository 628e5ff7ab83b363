//! The one driver type callers build: [`Driver`] picks IPMI or Redfish from
//! a host's BMC address and delegates every [`Bmc`] call to it.
//!
//! Owns that choice only. The recovery controller, the CLI and the API all
//! build their drivers here, so a later driver (or a fallback from one
//! driver to another) is added in this one place.

use super::{
    Bmc, BmcAddress, BmcError, BmcInfo, BootFlagEcho, BootFlags, BootTarget, IpmiBmc, PowerAction,
    PowerState, RedfishBmc, RetryPolicy,
};
use crate::inventory::BmcSettings;

/// A host's BMC driver.
#[derive(Debug, Clone)]
pub enum Driver {
    Ipmi(IpmiBmc),
    Redfish(RedfishBmc),
}

impl Driver {
    /// The driver for `settings`: by address scheme; `echo` applies to IPMI.
    pub fn for_host(
        settings: &BmcSettings,
        policy: RetryPolicy,
        echo: BootFlagEcho,
    ) -> Result<Driver, BmcError> {
        match &settings.address {
            BmcAddress::Ipmi { .. } => {
                IpmiBmc::new(&settings.address, settings.credentials.clone(), policy)
                    .map(|b| Driver::Ipmi(b.with_boot_flag_echo(echo)))
            }
            BmcAddress::Redfish(_) => RedfishBmc::new(
                &settings.address,
                settings.credentials.clone(),
                &settings.tls,
                policy,
            )
            .map(Driver::Redfish),
        }
    }

    /// `ipmi` or `redfish`, for messages and the audit log.
    pub fn name(&self) -> &'static str {
        match self {
            Driver::Ipmi(_) => "ipmi",
            Driver::Redfish(_) => "redfish",
        }
    }
}

impl Bmc for Driver {
    async fn power_status(&self) -> Result<PowerState, BmcError> {
        match self {
            Driver::Ipmi(b) => b.power_status().await,
            Driver::Redfish(b) => b.power_status().await,
        }
    }

    async fn power(&self, action: PowerAction) -> Result<(), BmcError> {
        match self {
            Driver::Ipmi(b) => b.power(action).await,
            Driver::Redfish(b) => b.power(action).await,
        }
    }

    async fn set_boot_device(&self, target: BootTarget) -> Result<(), BmcError> {
        match self {
            Driver::Ipmi(b) => b.set_boot_device(target).await,
            Driver::Redfish(b) => b.set_boot_device(target).await,
        }
    }

    async fn boot_device(&self) -> Result<BootFlags, BmcError> {
        match self {
            Driver::Ipmi(b) => b.boot_device().await,
            Driver::Redfish(b) => b.boot_device().await,
        }
    }

    async fn info(&self) -> Result<BmcInfo, BmcError> {
        match self {
            Driver::Ipmi(b) => b.info().await,
            Driver::Redfish(b) => b.info().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        bmc::{Credentials, Password, TlsOptions},
        inventory::{BootMode, PasswordSource},
    };

    fn settings(address: &str) -> BmcSettings {
        BmcSettings {
            address: address.parse().unwrap(),
            credentials: Credentials::new("admin", Password::new("pw-not-shown")).unwrap(),
            password_from: PasswordSource::Env("BMC_PW".into()),
            boot_mode: BootMode::Uefi,
            tls: TlsOptions::default(),
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

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

//! One driver alone, IPMI or Redfish, built from a host's settings and
//! one of its BMC addresses: what a [`Driver`](super::Driver) is for most
//! hosts and what a [`FallbackBmc`](super::FallbackBmc) holds two of. Owns
//! building it and delegating each [`Bmc`] call; which driver a host gets
//! is [`super::driver`]'s.

use super::{
    Bmc, BmcAddress, BmcError, BmcInfo, BootFlagEcho, BootFlags, BootTarget, IpmiBmc, PowerAction,
    PowerState, RedfishBmc, RetryPolicy, settings::BmcSettings,
};

/// One driver alone: what a [`FallbackBmc`](super::FallbackBmc) holds two
/// of.
#[derive(Debug, Clone)]
pub enum Single {
    Ipmi(IpmiBmc),
    Redfish(RedfishBmc),
}

impl Single {
    pub(super) fn build(
        settings: &BmcSettings,
        address: &BmcAddress,
        policy: RetryPolicy,
        echo: BootFlagEcho,
    ) -> Result<Single, BmcError> {
        match address {
            BmcAddress::Ipmi { .. } => IpmiBmc::new(address, settings.credentials.clone(), policy)
                .map(|b| Single::Ipmi(b.with_boot_flag_echo(echo))),
            BmcAddress::Redfish(_) => {
                RedfishBmc::new(address, settings.credentials.clone(), &settings.tls, policy)
                    .map(Single::Redfish)
            }
        }
    }

    /// `ipmi` or `redfish`.
    pub fn name(&self) -> &'static str {
        match self {
            Single::Ipmi(_) => "ipmi",
            Single::Redfish(_) => "redfish",
        }
    }
}

impl Bmc for Single {
    async fn power_status(&self) -> Result<PowerState, BmcError> {
        match self {
            Single::Ipmi(b) => b.power_status().await,
            Single::Redfish(b) => b.power_status().await,
        }
    }

    async fn power(&self, action: PowerAction) -> Result<(), BmcError> {
        match self {
            Single::Ipmi(b) => b.power(action).await,
            Single::Redfish(b) => b.power(action).await,
        }
    }

    async fn set_boot_device(&self, target: BootTarget) -> Result<(), BmcError> {
        match self {
            Single::Ipmi(b) => b.set_boot_device(target).await,
            Single::Redfish(b) => b.set_boot_device(target).await,
        }
    }

    async fn boot_device(&self) -> Result<BootFlags, BmcError> {
        match self {
            Single::Ipmi(b) => b.boot_device().await,
            Single::Redfish(b) => b.boot_device().await,
        }
    }

    async fn info(&self) -> Result<BmcInfo, BmcError> {
        match self {
            Single::Ipmi(b) => b.info().await,
            Single::Redfish(b) => b.info().await,
        }
    }
}

//! A host's BMC settings as the drivers take them: the address, the
//! credentials and where the password came from, the boot mode, the TLS
//! trust and the second driver of a host with two ([`BmcSettings`]). Owns
//! that model only; the inventory reads it from its file format, checks it
//! and reads the password (`inventory::oob`), and [`super::driver`] builds
//! drivers from it.

use std::{fmt, path::PathBuf, time::Duration};

use super::{BmcAddress, Credentials, TlsOptions};

/// How to reach a host's BMC and boot it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BmcSettings {
    pub address: BmcAddress,
    /// User name and the password read when the inventory loaded.
    pub credentials: Credentials,
    /// Where the password came from, for messages.
    pub password_from: PasswordSource,
    pub boot_mode: BootMode,
    /// How a Redfish driver trusts the BMC's certificate.
    pub tls: TlsOptions,
    /// The second driver of a host with both a Redfish and an IPMI
    /// address (`bmc.ipmi`, `bmc.drivers`).
    pub fallback: Option<FallbackSettings>,
}

/// A BMC driver as `bmc.drivers` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverKind {
    Redfish,
    Ipmi,
}

impl DriverKind {
    /// The driver `bmc.drivers` names `text`: the inverse of
    /// [`DriverKind::name`].
    pub fn parse(text: &str) -> Result<DriverKind, String> {
        match text {
            "redfish" => Ok(DriverKind::Redfish),
            "ipmi" => Ok(DriverKind::Ipmi),
            other => Err(format!(
                "unknown driver {other:?} (expected redfish or ipmi)"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DriverKind::Redfish => "redfish",
            DriverKind::Ipmi => "ipmi",
        }
    }

    /// The driver that speaks `address`'s scheme.
    pub fn of(address: &BmcAddress) -> DriverKind {
        match address {
            BmcAddress::Redfish(_) => DriverKind::Redfish,
            BmcAddress::Ipmi { .. } => DriverKind::Ipmi,
        }
    }
}

/// A host whose BMC is reached by Redfish (`address`) and by IPMI
/// (`ipmi`): calls start with `first` and are redone on the other when
/// they fail; after such a fallback, calls start with the other for `hold`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FallbackSettings {
    /// The IPMI address (`bmc.ipmi`).
    pub ipmi: BmcAddress,
    /// The driver tried first (`bmc.drivers[0]`).
    pub first: DriverKind,
    /// `bmc.fallback_hold`.
    pub hold: Duration,
    /// The host's name, for the log and the audit log.
    pub host: String,
}

/// Where a BMC password is read from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PasswordSource {
    File(PathBuf),
    Env(String),
}

impl fmt::Display for PasswordSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PasswordSource::File(path) => write!(f, "file {}", path.display()),
            PasswordSource::Env(name) => write!(f, "environment variable {name}"),
        }
    }
}

/// The firmware mode the boot-device override asks for (the EFI bit of
/// boot flags, IPMI 2.0 §28.13 parameter 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BootMode {
    #[default]
    Legacy,
    Uefi,
}

impl BootMode {
    pub fn is_efi(self) -> bool {
        self == BootMode::Uefi
    }
}

//! Out-of-band control of a host through its BMC.
//!
//! Owns the driver-facing [`Bmc`] trait (power, boot device, identity), the
//! types it speaks in, [`BmcError`], the BMC address format
//! ([`address::BmcAddress`]), the credentials ([`credential`]) and a host's
//! BMC settings ([`settings`]). The IPMI driver lives in [`ipmi`], its wire
//! commands in [`command`], the replay that diagnoses a failed handshake
//! in `rakp`; the Redfish driver in [`redfish`]. [`driver::Driver`] is the
//! one type callers build from a host's settings: one driver alone
//! ([`single`]) or two, with [`fallback`]'s per-host fallback from one to
//! the other. [`fake`] is a simulated BMC for tests of the callers.
//!
//! It does not decide *when* to power-cycle or re-provision a host: that is
//! the recovery controller's job, which (like the CLI and the API) only calls
//! the trait. Nothing here reads the inventory.

pub mod address;
pub mod command;
pub mod counted;
pub mod credential;
pub mod driver;
pub mod fake;
pub mod fallback;
pub mod ipmi;
mod rakp;
pub mod redfish;
pub mod settings;
pub mod single;

use std::{fmt, future::Future, time::Duration};

pub use address::{AddressError, BmcAddress, RedfishAddress};
pub use command::{BootDevice, BootFlags, ChassisStatus};
pub use credential::{CredentialError, Credentials, Password};
pub use driver::Driver;
pub use fallback::{FallbackBmc, Fallbacks};
pub use ipmi::{BootFlagEcho, IpmiBmc, RetryPolicy};
/// For the IPMI fuzz target (`crate::fuzzing`) only.
pub(crate) use rakp::decode_answers as decode_rakp_answers;
pub use redfish::{RedfishBmc, TlsOptions};

/// What a driver can do to one host's BMC. Every call has its own deadline
/// (see [`RetryPolicy`]) and never panics, whatever the BMC answers.
pub trait Bmc: Send + Sync {
    /// Whether the host is powered on.
    fn power_status(&self) -> impl Future<Output = Result<PowerState, BmcError>> + Send;

    /// Asks the chassis to change power state; returns once the BMC accepted it.
    fn power(&self, action: PowerAction) -> impl Future<Output = Result<(), BmcError>> + Send;

    /// Sets the boot device and returns only once reading it back agrees.
    fn set_boot_device(
        &self,
        target: BootTarget,
    ) -> impl Future<Output = Result<(), BmcError>> + Send;

    /// The boot flags the BMC holds now.
    fn boot_device(&self) -> impl Future<Output = Result<BootFlags, BmcError>> + Send;

    /// The BMC's identity (Get Device ID).
    fn info(&self) -> impl Future<Output = Result<BmcInfo, BmcError>> + Send;
}

/// The host's power as the chassis reports it; `on` or `off` in the API,
/// the CLI and the Kubernetes status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PowerState {
    On,
    Off,
}

impl PowerState {
    /// The API and CLI text, the same as the serde form.
    pub fn as_str(self) -> &'static str {
        match self {
            PowerState::On => "on",
            PowerState::Off => "off",
        }
    }
}

impl fmt::Display for PowerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Chassis Control request (IPMI 2.0 §28.3, data byte 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerAction {
    /// Power down (0h): immediate, not graceful.
    Off,
    /// Power up (1h).
    On,
    /// Power cycle (2h): off, then on after at least 1 s.
    Cycle,
    /// Hard reset (3h).
    Reset,
    /// Soft shutdown through ACPI overtemperature emulation (5h).
    SoftOff,
}

impl PowerAction {
    /// True when sending it twice has the same effect as once, so a request
    /// whose answer was lost may be sent again.
    pub fn is_idempotent(self) -> bool {
        matches!(self, PowerAction::On | PowerAction::Off)
    }
}

/// The boot override to set: a device, for the next boot or for all, in
/// legacy (BIOS) or EFI mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootTarget {
    pub device: BootDevice,
    /// Applies to all future boots, not only the next one.
    pub persistent: bool,
    /// Boot in EFI mode rather than legacy BIOS mode.
    pub efi: bool,
}

/// A BMC's identity: from Get Device ID (IPMI 2.0 §20.1), or for Redfish
/// from the Manager (the numeric IPMI fields are then 0 and the text
/// fields are set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BmcInfo {
    pub device_id: u8,
    pub device_revision: u8,
    pub firmware_major: u8,
    pub firmware_minor: u8,
    /// IPMI version as (major, minor), e.g. (2, 0).
    pub ipmi_version: (u8, u8),
    /// IANA enterprise number of the manufacturer.
    pub manufacturer_id: u32,
    pub product_id: u16,
    /// Manufacturer name (Redfish `Manufacturer`).
    pub vendor: Option<String>,
    /// Model (Redfish `Model`).
    pub model: Option<String>,
    /// Firmware version as the BMC writes it (Redfish `FirmwareVersion`).
    pub firmware_version: Option<String>,
}

/// A command this module sends, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandName {
    GetDeviceId,
    GetChassisStatus,
    ChassisControl,
    SetSystemBootOptions,
    GetSystemBootOptions,
    SetSessionPrivilege,
}

impl fmt::Display for CommandName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CommandName::GetDeviceId => "Get Device ID",
            CommandName::GetChassisStatus => "Get Chassis Status",
            CommandName::ChassisControl => "Chassis Control",
            CommandName::SetSystemBootOptions => "Set System Boot Options",
            CommandName::GetSystemBootOptions => "Get System Boot Options",
            CommandName::SetSessionPrivilege => "Set Session Privilege Level",
        })
    }
}

/// The step of RMCP+ session setup (IPMI 2.0 §13.15-13.24) that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeStep {
    /// RMCP presence ping / pong (ASF).
    Ping,
    /// Get Channel Authentication Capabilities.
    AuthCapabilities,
    OpenSession,
    Rakp2,
    Rakp4,
}

impl fmt::Display for HandshakeStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HandshakeStep::Ping => "RMCP ping",
            HandshakeStep::AuthCapabilities => "Get Channel Authentication Capabilities",
            HandshakeStep::OpenSession => "RMCP+ Open Session",
            HandshakeStep::Rakp2 => "RAKP message 2",
            HandshakeStep::Rakp4 => "RAKP message 4",
        })
    }
}

/// What was wrong with an answer, below the level of IPMI completion codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("malformed or unsupported answer to {0}")]
    Handshake(HandshakeStep),
    #[error("RMCP+ status {code:#04x} in answer to {step}")]
    RmcpStatus { step: HandshakeStep, code: u8 },
    #[error("malformed session packet")]
    Session,
    #[error("answer to another command (netfn {netfn:#04x} cmd {cmd:#04x})")]
    UnexpectedResponse { netfn: u8, cmd: u8 },
    #[error("malformed {0} response")]
    Response(CommandName),
    #[error("the IPMI library panicked on the BMC's answer")]
    LibraryPanic,
}

/// Why a call to one BMC failed. Messages name the BMC (`host:port`), never
/// the password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BmcError {
    #[error("BMC {bmc} unreachable: no answer within {waited:?}")]
    Unreachable { bmc: String, waited: Duration },
    #[error("BMC {bmc} did not complete the call within its {deadline:?} deadline")]
    Timeout { bmc: String, deadline: Duration },
    #[error("BMC {bmc} rejected the credentials of user {user:?} (wrong user name or password)")]
    AuthFailed { bmc: String, user: String },
    #[error(
        "BMC {bmc}: user {user:?} lacks the Administrator privilege required for power and boot control"
    )]
    InsufficientPrivilege { bmc: String, user: String },
    #[error(
        "BMC {bmc} offers no matching cipher suite (RMCP+ needs suite 3: RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128)"
    )]
    NoCipherSuite { bmc: String },
    #[error("BMC {bmc}: {source}")]
    Protocol {
        bmc: String,
        #[source]
        source: ProtocolError,
    },
    #[error("BMC {bmc} answered {cmd} with completion code {code:#04x}")]
    CompletionCode {
        bmc: String,
        cmd: CommandName,
        code: u8,
    },
    #[error("BMC {bmc} accepted boot device {wanted:?} but reads back {got:?}")]
    ReadBackMismatch {
        bmc: String,
        wanted: BootTarget,
        got: BootFlags,
    },
    #[error(
        "BMC {bmc}: {action:?} was sent but its outcome is unknown (no answer within {waited:?})"
    )]
    OutcomeUnknown {
        bmc: String,
        action: PowerAction,
        waited: Duration,
    },
    #[error("the {driver} driver cannot speak to BMC address {address}")]
    UnsupportedDriver {
        address: String,
        driver: &'static str,
    },
    #[error("BMC {bmc}: TLS settings unusable: {reason}")]
    TlsConfig { bmc: String, reason: String },
    #[error(
        "BMC {bmc}: TLS handshake failed: {reason} (set bmc.ca_file to the CA that signed the \
         BMC's certificate, or bmc.insecure: true to skip verification)"
    )]
    TlsRejected { bmc: String, reason: String },
    #[error("BMC {bmc}: connection failed: {reason}")]
    Connect { bmc: String, reason: String },
    #[error("BMC {bmc} answered {method} {path} with HTTP {status}{}", redfish_message(.message))]
    Http {
        bmc: String,
        method: &'static str,
        path: String,
        status: u16,
        /// The Redfish error's first `@Message.ExtendedInfo` message (or
        /// its `message`), when it had one.
        message: Option<String>,
    },
    #[error("BMC {bmc}: unexpected Redfish answer from {path}: {problem}")]
    Malformed {
        bmc: String,
        path: String,
        problem: String,
    },
    #[error("BMC {bmc}: {problem}")]
    SystemNotFound { bmc: String, problem: String },
    #[error("BMC {bmc}: {what} {wanted} is not advertised (it advertises {advertised:?})")]
    NotAdvertised {
        bmc: String,
        what: &'static str,
        wanted: String,
        advertised: Vec<String>,
    },
    #[error("BMC {bmc}: the blocking IPMI worker stopped unexpectedly")]
    WorkerLost { bmc: String },
    #[error("BMC {bmc}: {source}")]
    Credentials {
        bmc: String,
        #[source]
        source: CredentialError,
    },
    #[error("{first}; then over the other driver: {second}")]
    BothFailed {
        first: Box<BmcError>,
        second: Box<BmcError>,
    },
}

fn redfish_message(message: &Option<String>) -> String {
    message
        .as_ref()
        .map(|m| format!(": {m}"))
        .unwrap_or_default()
}

impl BmcError {
    /// True for errors retrying cannot fix (credentials, privilege, cipher
    /// suite, configuration): callers should not loop on them.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            BmcError::AuthFailed { .. }
                | BmcError::InsufficientPrivilege { .. }
                | BmcError::NoCipherSuite { .. }
                | BmcError::UnsupportedDriver { .. }
                | BmcError::TlsConfig { .. }
                | BmcError::TlsRejected { .. }
                | BmcError::SystemNotFound { .. }
                | BmcError::NotAdvertised { .. }
                | BmcError::Credentials { .. }
        ) || matches!(self, BmcError::BothFailed { second, .. } if second.is_permanent())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_state_serializes_as_its_text() {
        for state in [PowerState::On, PowerState::Off] {
            let json = serde_json::to_string(&state).expect("json");
            assert_eq!(json, format!("\"{state}\""));
            assert_eq!(
                serde_json::from_str::<PowerState>(&json).expect("parses"),
                state
            );
        }
        assert_eq!(PowerState::On.as_str(), "on");
        assert_eq!(PowerState::Off.as_str(), "off");
    }
}

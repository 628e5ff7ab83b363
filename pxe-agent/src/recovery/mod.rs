//! Out-of-band recovery: bringing a host that did not boot (or stopped
//! answering) back through the boot chain with its BMC.
//!
//! Owns the per-host state machine ([`Controller`], pure and driven by the
//! caller's clock: no sleeps, `now` is passed in), its persistence
//! ([`RecoveryStore`], redb), the sequencing of BMC actions across many
//! hosts under concurrency, rate and storm limits ([`Sequencer`]), running
//! them through the [`Bmc`](crate::bmc::Bmc) trait ([`Executor`]) and the
//! metric names and rendering ([`metrics`]).
//!
//! It does not talk IPMI (that is `bmc`), watch the boot chain itself (the
//! agent feeds it [`Observation`]s from `progress`), read the inventory
//! file (the agent hands it [`Plan`]s, see [`plans`]) nor decide when to
//! run: the agent calls [`Controller::tick`] on a timer and after every
//! input. See `docs/bmc.md` for the state diagram and every knob.
//!
//! Times are unix milliseconds (as in `progress`), so that deadlines
//! written to disk mean the same after a restart.

mod executor;
mod machine;
pub mod metrics;
mod sequence;
mod store;

use std::{fmt, time::Duration};

use serde::{Deserialize, Serialize};

pub use executor::{Completion, Executor, execute};
pub use machine::{AfterBootJob, Controller, HostStatus, LastTransition, Record, Watch};
pub use sequence::{Gate, Load, SequencePolicy, SequenceStats, Sequencer};
pub use store::{RECOVERY_FILE, RecoveryStore, StoreError};

use crate::{
    bmc::{BmcError, BootDevice, BootTarget},
    inventory::{Inventory, RecoverySettings},
    mac::MacAddr,
};

/// Where a host is in its recovery. `Backoff` is the wait before a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// Not being recovered; watched for `expect_boot` when set.
    Idle,
    /// Setting the boot device, then powering on or cycling.
    Recovering,
    AwaitingDhcp,
    AwaitingBootFile,
    AwaitingScript,
    AwaitingPhoneHome,
    /// Waiting out the back-off before the next attempt.
    Backoff,
    /// Phoned home; watched for `heartbeat` when set.
    Booted,
    /// Out of attempts, or the BMC refused for good; waits for a request
    /// or a phone-home.
    Failed,
}

impl State {
    pub const ALL: [State; 9] = [
        State::Idle,
        State::Recovering,
        State::AwaitingDhcp,
        State::AwaitingBootFile,
        State::AwaitingScript,
        State::AwaitingPhoneHome,
        State::Backoff,
        State::Booted,
        State::Failed,
    ];

    /// The metric label and CLI text.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Idle => "idle",
            State::Recovering => "recovering",
            State::AwaitingDhcp => "awaiting-dhcp",
            State::AwaitingBootFile => "awaiting-boot-file",
            State::AwaitingScript => "awaiting-script",
            State::AwaitingPhoneHome => "awaiting-phone-home",
            State::Backoff => "backoff",
            State::Booted => "booted",
            State::Failed => "failed",
        }
    }

    /// Powered and somewhere in the boot chain: what loads the DHCP, TFTP
    /// and HTTP servers, and what storm control counts.
    pub fn is_awaiting(self) -> bool {
        matches!(
            self,
            State::AwaitingDhcp
                | State::AwaitingBootFile
                | State::AwaitingScript
                | State::AwaitingPhoneHome
        )
    }

    /// A recovery is under way (a request would be refused).
    pub fn is_active(self) -> bool {
        self == State::Recovering || self == State::Backoff || self.is_awaiting()
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a transition happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// An operator (CLI or API) asked.
    Requested,
    /// An `expect_boot` host did not phone home within its deadline.
    NoPhoneHome,
    /// A booted host with `heartbeat` stopped phoning home.
    HeartbeatLost,
    /// The back-off ended; next attempt.
    Retry,
    /// The host was off and was powered on.
    PoweredOn,
    /// The host was on and was power-cycled.
    PowerCycled,
    /// The power action was sent but its answer was lost; the DHCP
    /// deadline tells whether it happened.
    PowerOutcomeUnknown,
    DhcpSeen,
    BootFileSeen,
    ScriptSeen,
    ArtifactsSeen,
    PhoneHome,
    DhcpTimeout,
    BootFileTimeout,
    ScriptTimeout,
    PhoneHomeTimeout,
    /// A BMC call failed in a way a retry may fix.
    BmcError,
    /// A BMC call failed in a way no retry fixes (credentials, privilege,
    /// cipher suite, no driver): straight to `failed`.
    BmcPermanentError,
    /// An operator stopped the recovery.
    Cancelled,
}

impl Reason {
    /// The metric label and CLI text.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Requested => "requested",
            Reason::NoPhoneHome => "no-phone-home",
            Reason::HeartbeatLost => "heartbeat-lost",
            Reason::Retry => "retry",
            Reason::PoweredOn => "powered-on",
            Reason::PowerCycled => "power-cycled",
            Reason::PowerOutcomeUnknown => "power-outcome-unknown",
            Reason::DhcpSeen => "dhcp-seen",
            Reason::BootFileSeen => "boot-file-seen",
            Reason::ScriptSeen => "script-seen",
            Reason::ArtifactsSeen => "artifacts-seen",
            Reason::PhoneHome => "phone-home",
            Reason::DhcpTimeout => "dhcp-timeout",
            Reason::BootFileTimeout => "boot-file-timeout",
            Reason::ScriptTimeout => "script-timeout",
            Reason::PhoneHomeTimeout => "phone-home-timeout",
            Reason::BmcError => "bmc-error",
            Reason::BmcPermanentError => "bmc-permanent-error",
            Reason::Cancelled => "cancelled",
        }
    }
}

impl Reason {
    /// The deadline of an awaiting stage passed: the host is stuck there.
    pub fn is_stage_timeout(self) -> bool {
        matches!(
            self,
            Reason::DhcpTimeout
                | Reason::BootFileTimeout
                | Reason::ScriptTimeout
                | Reason::PhoneHomeTimeout
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A step of the boot chain seen for a MAC (from `progress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observation {
    /// A DHCP answer went out.
    Dhcp,
    /// The boot file was fetched (TFTP or HTTP).
    BootFile,
    /// The iPXE script was fetched.
    Script,
    /// A kernel, initrd or other artifact was fetched.
    Artifacts,
    /// The booted system called the phone-home.
    PhoneHome,
}

/// One state change, for the log and `pxe_recovery_transitions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub mac: MacAddr,
    pub from: State,
    pub to: State,
    pub reason: Reason,
    /// Unix milliseconds.
    pub at_ms: u64,
    /// The attempt the host is on after the transition (0 before the first).
    pub attempt: u32,
}

/// A BMC call the controller wants made. `epoch` ties it to the state it
/// was asked in: a result for an older epoch is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    pub mac: MacAddr,
    pub kind: ActionKind,
    pub epoch: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionKind {
    /// Set the boot device (the driver reads it back before answering).
    SetBootDevice(BootTarget),
    /// Power the host up: a cycle when it is on, power on when it is off.
    /// This is what storm control limits.
    PowerUp,
    /// Read the power state: whether a host added with `expect_boot` is
    /// already running (see [`Watch`]).
    PowerStatus,
}

impl ActionKind {
    pub fn is_power(self) -> bool {
        self == ActionKind::PowerUp
    }
}

/// What a successful action did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    BootDeviceSet,
    PoweredOn,
    PowerCycled,
    /// The power state, as read.
    Power(crate::bmc::PowerState),
}

/// Why an action failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    #[error(transparent)]
    Bmc(#[from] BmcError),
    #[error("host {mac} has no BMC the executor knows")]
    NoBmc { mac: MacAddr },
    #[error("the task running the BMC call for {mac} ended without an answer")]
    TaskLost { mac: MacAddr },
}

impl ActionError {
    /// True when retrying cannot help.
    pub fn is_permanent(&self) -> bool {
        match self {
            ActionError::Bmc(e) => e.is_permanent(),
            ActionError::NoBmc { .. } => true,
            ActionError::TaskLost { .. } => false,
        }
    }
}

/// Why a request or cancel was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("host {mac} has no bmc block in the inventory")]
    NotManaged { mac: MacAddr },
    #[error("host {mac} is already being recovered ({state})")]
    InProgress { mac: MacAddr, state: State },
    #[error("host {mac} is not being recovered ({state})")]
    NotRecovering { mac: MacAddr, state: State },
}

/// Agent-wide policy: what the inventory does not say per host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Wait before the second attempt; doubled for each further one.
    pub backoff_initial: Duration,
    /// Longest wait between attempts.
    pub backoff_max: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            backoff_initial: Duration::from_secs(30),
            backoff_max: Duration::from_secs(10 * 60),
        }
    }
}

impl Policy {
    /// The wait after failed attempt `attempt` (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        self.backoff_initial
            .saturating_mul(1 << doublings)
            .min(self.backoff_max)
    }
}

/// What the controller needs to know about one host from the inventory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub settings: RecoverySettings,
    /// The boot override sets the EFI bit (`boot_mode: uefi`).
    pub efi: bool,
    /// The network boot device a recovery asks for: UEFI HTTP boot for a
    /// UEFI host whose profile boots by HTTP only, else PXE.
    pub network: BootDevice,
}

/// The plans of every inventory host that has a BMC; hosts without a
/// `recovery` block get the defaults (recovered only on request).
pub fn plans(inventory: &Inventory) -> Vec<(MacAddr, Plan)> {
    inventory
        .hosts
        .iter()
        .filter_map(|host| {
            let bmc = host.bmc.as_ref()?;
            let efi = bmc.boot_mode.is_efi();
            let boot = inventory.profile_of(host).boot.as_ref();
            let http_only = boot.is_some_and(|b| {
                (b.http.is_some() || b.http_arm64.is_some() || b.http_ia32.is_some())
                    && b.bios.is_none()
                    && b.uefi.is_none()
                    && b.uefi_arm64.is_none()
            });
            Some((
                host.mac,
                Plan {
                    settings: host.recovery.as_deref().copied().unwrap_or_default(),
                    efi,
                    network: if efi && http_only {
                        BootDevice::UefiHttp
                    } else {
                        BootDevice::Pxe
                    },
                },
            ))
        })
        .collect()
}

/// Milliseconds of `d`, saturating.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;

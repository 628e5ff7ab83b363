//! [`Executor`]: runs the controller's [`Action`]s against BMCs, each in a
//! task of its own, and hands back their results as [`Completion`]s for
//! [`Controller::complete`](super::Controller::complete). Owns which BMC
//! belongs to which host and turning an action into trait calls
//! ([`execute`]); a slow or failing BMC holds up only its own task. The
//! IPMI driver already keeps its blocking library on the blocking pool
//! with a deadline per call, so nothing here blocks the runtime.
//!
//! It does not decide what to run or when: that is the controller and the
//! [`Sequencer`](super::Sequencer).

use std::{collections::HashMap, sync::Arc};

use tokio::task::{Id, JoinSet};

use super::{Action, ActionError, ActionKind, Done};
use crate::{
    bmc::{Bmc, PowerAction, PowerState},
    mac::MacAddr,
};

/// An action and what came of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub action: Action,
    pub result: Result<Done, ActionError>,
}

/// Makes the trait calls of `kind` on `bmc`. A power-up reads the power
/// state first: a host that is off is powered on (a cycle of a host that
/// is off is refused by most BMCs), one that is on is power-cycled.
pub async fn execute<B: Bmc>(bmc: &B, kind: ActionKind) -> Result<Done, ActionError> {
    match kind {
        ActionKind::SetBootDevice(target) => {
            // The driver reads the flags back and fails on a mismatch.
            bmc.set_boot_device(target).await?;
            Ok(Done::BootDeviceSet)
        }
        ActionKind::PowerStatus => Ok(Done::Power(bmc.power_status().await?)),
        ActionKind::PowerUp => match bmc.power_status().await? {
            PowerState::Off => {
                bmc.power(PowerAction::On).await?;
                Ok(Done::PoweredOn)
            }
            PowerState::On => {
                bmc.power(PowerAction::Cycle).await?;
                Ok(Done::PowerCycled)
            }
        },
    }
}

/// The running BMC calls. See the module documentation.
#[derive(Debug)]
pub struct Executor<B> {
    bmcs: HashMap<MacAddr, Arc<B>>,
    tasks: JoinSet<Completion>,
    running: HashMap<Id, Action>,
}

impl<B> Default for Executor<B> {
    fn default() -> Self {
        Executor {
            bmcs: HashMap::new(),
            tasks: JoinSet::new(),
            running: HashMap::new(),
        }
    }
}

impl<B: Bmc + 'static> Executor<B> {
    pub fn new() -> Executor<B> {
        Executor::default()
    }

    /// The BMC of every managed host, replacing the previous set (after an
    /// inventory reload). Running calls keep the BMC they started with.
    pub fn set_bmcs(&mut self, bmcs: impl IntoIterator<Item = (MacAddr, Arc<B>)>) {
        self.bmcs = bmcs.into_iter().collect();
    }

    /// Starts `action` in a task of its own. Must be called inside a tokio
    /// runtime.
    pub fn start(&mut self, action: Action) {
        let bmc = self.bmcs.get(&action.mac).cloned();
        let handle = self.tasks.spawn(async move {
            let result = match bmc {
                Some(bmc) => execute(bmc.as_ref(), action.kind).await,
                None => Err(ActionError::NoBmc { mac: action.mac }),
            };
            Completion { action, result }
        });
        self.running.insert(handle.id(), action);
    }

    /// The next action to finish, in finishing order; `None` at once when
    /// nothing runs (guard it with [`Executor::is_idle`] in a `select!`).
    /// A task that panicked or was aborted completes with
    /// [`ActionError::TaskLost`].
    pub async fn next(&mut self) -> Option<Completion> {
        let done = self.tasks.join_next_with_id().await?;
        Some(match done {
            Ok((id, completion)) => {
                self.running.remove(&id);
                completion
            }
            Err(e) => {
                let action = self.running.remove(&e.id())?;
                Completion {
                    action,
                    result: Err(ActionError::TaskLost { mac: action.mac }),
                }
            }
        })
    }

    pub fn in_flight(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_idle(&self) -> bool {
        self.tasks.is_empty()
    }
}

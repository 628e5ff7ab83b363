//! Owns the shutdown signal every long-running task takes: a [`Trigger`]
//! that asks once, and the [`Shutdown`] handles that hear it. It does not
//! know what a task does when told to stop.

use tokio::sync::watch;

/// A task's view of shutdown: cheap to clone, one per task.
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

/// The side that asks for shutdown. Dropping it stops every [`Shutdown`]
/// too, so a forgotten trigger cannot leave tasks running.
#[derive(Debug)]
pub struct Trigger(watch::Sender<bool>);

impl Shutdown {
    /// A trigger and the first handle that hears it; clone the handle for
    /// each task.
    pub fn new() -> (Trigger, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (Trigger(tx), Shutdown(rx))
    }

    /// Resolves once shutdown was asked, or the trigger is gone; at once
    /// when either already happened. Cancel-safe, so it fits a `select!`
    /// arm in a loop.
    pub async fn stopped(&mut self) {
        // An error means the trigger is gone, which stops as well. The
        // watch's guard is dropped here, not held by the caller across its
        // awaits, which keeps a serve future `Send`.
        let _ = self.0.wait_for(|stop| *stop).await;
    }

    /// Whether shutdown was asked. A trigger dropped without asking does
    /// not count here, unlike in [`Shutdown::stopped`].
    pub fn is_stopped(&self) -> bool {
        *self.0.borrow()
    }
}

impl Trigger {
    /// Asks every handle, present and later, to stop.
    pub fn stop(&self) {
        self.0.send_replace(true);
    }

    /// A new handle on this trigger.
    pub fn subscribe(&self) -> Shutdown {
        Shutdown(self.0.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::timeout;

    use super::*;

    const SOON: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn a_handle_waits_until_stop_is_asked() {
        let (trigger, mut shutdown) = Shutdown::new();
        assert!(timeout(SOON, shutdown.stopped()).await.is_err());
        assert!(!shutdown.is_stopped());
        trigger.stop();
        timeout(SOON, shutdown.stopped()).await.expect("stopped");
        assert!(shutdown.is_stopped());
        // Asked once, stopped for good: clones and later handles too.
        timeout(SOON, shutdown.clone().stopped())
            .await
            .expect("clone");
        timeout(SOON, trigger.subscribe().stopped())
            .await
            .expect("subscribed after the stop");
    }

    #[tokio::test]
    async fn a_dropped_trigger_stops_but_is_not_a_stop_asked() {
        let (trigger, mut shutdown) = Shutdown::new();
        drop(trigger);
        timeout(SOON, shutdown.stopped()).await.expect("stopped");
        assert!(!shutdown.is_stopped());
    }
}

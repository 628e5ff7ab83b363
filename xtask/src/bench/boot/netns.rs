//! Moving the calling thread into a lab namespace, so the benchmark's own
//! clients (plain std sockets on threads) run on the client end of the lab
//! without a helper process.
//!
//! `setns(2)` with `CLONE_NEWNET` changes the namespace of the calling thread
//! only; threads it spawns afterwards start in the same namespace. Callers
//! therefore do it on a thread of their own, never on the main thread.

use std::{fs::File, os::fd::AsRawFd as _, path::Path};

use anyhow::{Context as _, bail};

/// Where `ip netns add` keeps its namespaces.
const NETNS_DIR: &str = "/run/netns";

/// Moves the calling thread into the network namespace `ns`.
pub fn enter(ns: &str) -> anyhow::Result<()> {
    let path = Path::new(NETNS_DIR).join(ns);
    let file = File::open(&path).with_context(|| format!("failed to open {}", path.display()))?;
    // SAFETY: setns takes a descriptor we own for the duration of the call
    // and a flag; it only changes this thread's network namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        bail!(
            "setns({}) failed: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Runs `f` on a new thread inside `ns` and returns its result.
pub fn run_in<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let ns = ns.to_owned();
    std::thread::Builder::new()
        .name("bench-client".into())
        .spawn(move || {
            enter(&ns)?;
            f()
        })
        .context("failed to spawn a client thread")?
        .join()
        .map_err(|_| anyhow::anyhow!("client thread panicked"))?
}

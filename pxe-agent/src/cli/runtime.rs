//! The tokio runtime of the commands that need one, and the signals
//! (SIGINT, SIGTERM) that end the long-running ones.

use anyhow::Context as _;

/// The runtime of the commands that need one: two workers.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("failed to start the runtime")
}

/// Runs `fut`, then waits for SIGINT or SIGTERM.
pub fn block_on_signal(fut: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    runtime()?.block_on(async move {
        fut.await?;
        wait_for_signal().await;
        Ok(())
    })
}

/// Returns on SIGINT or SIGTERM, whichever comes first.
pub async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("failed to install the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

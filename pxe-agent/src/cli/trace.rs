//! `pxe-agent trace`: one machine followed live through the running
//! agent's paths, one line per event.

use std::{io::BufRead as _, process::ExitCode};

use anyhow::Context as _;
use pxe_agent::{mac::MacAddr, terminal, trace::TraceEvent, when};

use super::agent::ApiArgs;

/// Prints the running agent's trace of `mac`, one line per event, until the
/// agent ends it, Ctrl-C, or `count` events.
pub fn trace(api: &ApiArgs, mac: MacAddr, count: Option<u64>) -> anyhow::Result<ExitCode> {
    let api = api.client()?;
    let reader = api.stream(&format!("/api/v1/trace/{mac}"))?;
    eprintln!("tracing {mac} on {}; Ctrl-C to stop", api.authority());
    let mut seen = 0;
    for line in reader.lines() {
        let line = line.context("failed to read the trace")?;
        if line.trim().is_empty() {
            // A heartbeat.
            continue;
        }
        let event: TraceEvent =
            serde_json::from_str(&line).with_context(|| format!("malformed trace line: {line}"))?;
        println!(
            "{}  {:<10}  {:<23}  {}",
            when::clock(event.at_ms),
            event.path.name(),
            terminal::escape(&event.what),
            terminal::escape(&event.detail)
        );
        seen += 1;
        if count.is_some_and(|n| seen >= n) {
            return Ok(ExitCode::SUCCESS);
        }
    }
    anyhow::bail!("the agent ended the trace (shutting down?)")
}

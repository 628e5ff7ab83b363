//! `pxe-agent trace`: one machine, named by MAC or by host name, followed
//! live through the running agent's paths, one line per event.

use std::{io::BufRead as _, process::ExitCode};

use anyhow::Context as _;
use pxe_agent::{client, mac::MacAddr, terminal, trace::TraceEvent, view::HostView, when};

use super::agent::ApiArgs;

/// Prints the running agent's trace of `host` (a MAC or a host name), one line per event, until the
/// agent ends it, Ctrl-C, or `count` events.
pub fn trace(api: &ApiArgs, host: &str, count: Option<u64>) -> anyhow::Result<ExitCode> {
    let api = api.client()?;
    let mac = resolve(&api, host)?;
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

/// `host` as the MAC to trace: a MAC as it is, a name looked up among the
/// agent's hosts.
fn resolve(api: &client::Api, host: &str) -> anyhow::Result<MacAddr> {
    if let Ok(mac) = host.parse() {
        return Ok(mac);
    }
    let hosts: Vec<HostView> = serde_json::from_str(&api.get("/api/v1/hosts")?)
        .context("malformed /api/v1/hosts answer")?;
    by_name(hosts.iter().map(|h| (h.hostname.as_deref(), h.mac)), host)
}

/// The MAC of the host named `name` among `(hostname, mac)` pairs
/// (case-insensitively, as DNS names compare).
fn by_name<'a>(
    mut hosts: impl Iterator<Item = (Option<&'a str>, MacAddr)>,
    name: &str,
) -> anyhow::Result<MacAddr> {
    hosts
        .find(|(n, _)| n.is_some_and(|n| n.eq_ignore_ascii_case(name)))
        .map(|(_, mac)| mac)
        .with_context(|| {
            format!(
                "{:?} is neither a MAC address nor the name of one of the agent's hosts",
                terminal::escape(name)
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_to_their_host_s_mac() {
        let one: MacAddr = "52:54:00:00:00:01".parse().expect("mac");
        let two: MacAddr = "52:54:00:00:00:02".parse().expect("mac");
        let hosts = [(None, two), (Some("node-1"), one)];
        assert_eq!(by_name(hosts.into_iter(), "NODE-1").expect("found"), one);
        let err = by_name(hosts.into_iter(), "node-9").expect_err("no such host");
        assert!(err.to_string().contains("node-9"), "{err}");
    }
}

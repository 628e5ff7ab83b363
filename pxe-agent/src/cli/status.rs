//! `pxe-agent status`: the running agent at a glance, from
//! `GET /api/v1/status`: ready or not and why, each interface's XDP attach
//! mode, the inventory in force, hosts per boot stage, and the peers.

use std::{fmt::Write as _, process::ExitCode};

use anyhow::Context as _;
use pxe_agent::{progress::Stage, terminal, view::StatusView};

use super::agent::{ApiArgs, Output, print_json};

/// `pxe-agent status`: as text or as the agent's JSON; fails (exit 1)
/// while the agent is not ready.
pub fn status(format: Output, api: &ApiArgs) -> anyhow::Result<ExitCode> {
    let body = api.client()?.get("/api/v1/status")?;
    let status: StatusView =
        serde_json::from_str(&body).context("malformed /api/v1/status answer")?;
    match format {
        Output::Json => print_json(&body)?,
        Output::Table => print!("{}", text(&status)),
    }
    Ok(if status.ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The status as lines of `what: value`.
fn text(s: &StatusView) -> String {
    let mut out = String::new();
    let esc = |t: &str| terminal::escape(t).into_owned();
    if s.ready {
        out.push_str("ready:       yes\n");
    } else {
        out.push_str("ready:       no\n");
        for p in &s.problems {
            let _ = writeln!(out, "  {}", esc(p));
        }
    }
    for i in &s.interfaces {
        let _ = writeln!(
            out,
            "interface:   {} (XDP {})",
            esc(&i.name),
            esc(&i.xdp_mode)
        );
    }
    if s.interfaces.is_empty() {
        out.push_str("interface:   none yet\n");
    }
    let _ = writeln!(
        out,
        "inventory:   generation {}, {} hosts, {} reloads rejected",
        s.inventory.generation, s.inventory.hosts, s.inventory.reloads_rejected
    );
    // Boot-chain order, hosts not seen yet first.
    let order = ["none"].into_iter().chain(
        [
            Stage::Dhcp,
            Stage::Tftp,
            Stage::Script,
            Stage::Artifacts,
            Stage::Booted,
        ]
        .map(Stage::as_str),
    );
    let stages: Vec<String> = order
        .filter_map(|st| s.stages.get(st).map(|n| format!("{st} {n}")))
        .collect();
    let _ = writeln!(
        out,
        "stages:      {}",
        if stages.is_empty() {
            "no hosts".to_string()
        } else {
            stages.join(", ")
        }
    );
    match &s.peers {
        None => out.push_str("peers:       none (this agent serves every pool whole)\n"),
        Some(p) => {
            let slot = p
                .slot
                .map_or_else(|| "no slot yet".to_string(), |n| format!("slot {n}"));
            let live: Vec<String> = p.live.iter().map(u16::to_string).collect();
            let _ = writeln!(
                out,
                "peers:       {slot} of {}, live slots [{}], {}, {} buckets",
                p.slots,
                live.join(" "),
                if p.serving { "serving" } else { "not serving" },
                p.buckets
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_says_why_not_ready_and_counts_stages_in_boot_order() {
        let status: StatusView = serde_json::from_str(
            r#"{"ready": false, "problems": ["XDP: no XDP program attached to eth1"],
                "interfaces": [{"name": "eth1", "xdp_mode": "none"}],
                "inventory": {"generation": 3, "hosts": 5, "reloads_rejected": 1},
                "stages": {"booted": 2, "dhcp": 1, "none": 2}}"#,
        )
        .expect("status");
        let said = text(&status);
        assert_eq!(
            said,
            "ready:       no\n  XDP: no XDP program attached to eth1\n\
             interface:   eth1 (XDP none)\n\
             inventory:   generation 3, 5 hosts, 1 reloads rejected\n\
             stages:      none 2, dhcp 1, booted 2\n\
             peers:       none (this agent serves every pool whole)\n"
        );
        let shared: StatusView = serde_json::from_str(
            r#"{"ready": true, "problems": [], "interfaces": [],
                "inventory": {"generation": 1, "hosts": 0, "reloads_rejected": 0},
                "stages": {},
                "peers": {"slot": 1, "slots": 2, "live": [0, 1], "serving": true,
                          "buckets": 128, "slices": []}}"#,
        )
        .expect("status");
        assert_eq!(
            text(&shared),
            "ready:       yes\n\
             interface:   none yet\n\
             inventory:   generation 1, 0 hosts, 0 reloads rejected\n\
             stages:      no hosts\n\
             peers:       slot 1 of 2, live slots [0 1], serving, 128 buckets\n"
        );
    }
}

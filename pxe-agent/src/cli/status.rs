//! `pxe-agent status`: the running agent at a glance, from
//! `GET /api/v1/status`: ready or not and why, each interface's XDP attach
//! mode, the inventory in force, hosts per boot stage, and the peers. When
//! no agent answers, what its `--pin-dir` still has attached, answering
//! known hosts without it (`xdp::pin::survey`).

use std::{fmt::Write as _, path::Path, process::ExitCode};

use anyhow::Context as _;
use pxe_agent::{
    progress::Stage,
    terminal,
    view::StatusView,
    xdp::pin::{self, Survey},
};

use super::agent::{ApiArgs, Output, print_json};

/// `pxe-agent status`: as text or as the agent's JSON; fails (exit 1)
/// while the agent is not ready, and when it cannot be reached (then the
/// programs pinned under `pin_dir` are reported).
pub fn status(format: Output, api: &ApiArgs, pin_dir: &Path) -> anyhow::Result<ExitCode> {
    let body = match api.client()?.get("/api/v1/status") {
        Ok(body) => body,
        // Connecting or reading failed: no agent there to answer.
        Err(e) if e.chain().any(|c| c.is::<std::io::Error>()) => {
            let pinned = pinned(pin_dir);
            match format {
                Output::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&unreachable_json(
                        &api.addr(),
                        &e,
                        pin_dir,
                        &pinned
                    ))?
                ),
                Output::Table => print!("{}", unreachable_text(&api.addr(), &e, pin_dir, &pinned)),
            }
            return Ok(ExitCode::FAILURE);
        }
        Err(e) => return Err(e),
    };
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

/// What `pin_dir` pins, or why that could not be read; nothing pinned
/// when the directory is not there.
fn pinned(pin_dir: &Path) -> Result<Vec<Survey>, String> {
    // Not `exists()`: a directory this user may not look into (bpffs is
    // root's) is not "nothing pinned".
    match std::fs::symlink_metadata(pin_dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(format!("{e} (the pins are root's: run it as root)"));
        }
        Err(e) => return Err(e.to_string()),
        Ok(_) => {}
    }
    pin::survey(pin_dir).map_err(|e| format!("{e:#}"))
}

/// `ready: no`, why, and one `pinned:` line per interface directory.
fn unreachable_text(
    addr: &str,
    error: &anyhow::Error,
    pin_dir: &Path,
    pinned: &Result<Vec<Survey>, String>,
) -> String {
    let esc = |t: &str| terminal::escape(t).into_owned();
    let dir = esc(&pin_dir.display().to_string());
    let mut out = String::new();
    let _ = writeln!(out, "ready:       no");
    let _ = writeln!(
        out,
        "  agent not reachable at {}: {}",
        esc(addr),
        esc(&format!("{error:#}"))
    );
    match pinned {
        Err(why) => {
            let _ = writeln!(out, "pinned:      cannot read {dir}: {}", esc(why));
        }
        Ok(found) if found.is_empty() => {
            let _ = writeln!(out, "pinned:      nothing under {dir}");
        }
        Ok(found) => {
            for s in found {
                let iface = esc(&s.iface);
                let hosts = s
                    .hosts
                    .map_or_else(|| "its".to_string(), |n| format!("the {n}"));
                let line = match (s.program, s.attached) {
                    (Some(id), true) => format!(
                        "XDP program id {id} still attached to {iface}: answering {hosts} known \
                         hosts of its pinned maps without an agent (unknown machines, relayed and \
                         iPXE requests, TFTP and HTTP go unanswered); `pxe-agent detach \
                         --pin-dir {dir} --interface {iface}` removes it"
                    ),
                    (Some(id), false) => format!(
                        "{iface}: the pinned link's program id {id} is no longer attached \
                         (nothing answers; the next agent removes the stale pins)"
                    ),
                    (None, _) => format!("{iface}: no program answering"),
                };
                let _ = writeln!(out, "pinned:      {line}");
                if let Some(problem) = &s.problem {
                    let _ = writeln!(out, "  {}", esc(problem));
                }
            }
        }
    }
    out
}

/// The same as JSON: `ready`, `reachable`, `error`, `pin_dir` and the
/// survey of each interface (or `pin_error`).
fn unreachable_json(
    addr: &str,
    error: &anyhow::Error,
    pin_dir: &Path,
    pinned: &Result<Vec<Survey>, String>,
) -> serde_json::Value {
    let mut out = serde_json::json!({
        "ready": false,
        "reachable": false,
        "agent": addr,
        "error": format!("{error:#}"),
        "pin_dir": pin_dir.display().to_string(),
    });
    match pinned {
        Ok(found) => {
            out["pinned"] = found
                .iter()
                .map(|s| {
                    serde_json::json!({
                        "interface": s.iface,
                        "program": s.program,
                        "attached": s.attached,
                        "hosts": s.hosts,
                        "problem": s.problem,
                    })
                })
                .collect();
        }
        Err(why) => out["pin_error"] = why.clone().into(),
    }
    out
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
    fn an_unreachable_agent_is_told_with_the_pinned_programs_that_still_answer() {
        let error = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
            .context("no agent answering on 127.0.0.1:9465 (is `pxe-agent run` up?)");
        let pinned = Ok(vec![
            Survey {
                iface: "eth1".into(),
                program: Some(42),
                attached: true,
                hosts: Some(200),
                problem: None,
            },
            Survey {
                iface: "eth2".into(),
                program: Some(7),
                attached: false,
                hosts: Some(3),
                problem: None,
            },
        ]);
        let dir = Path::new("/sys/fs/bpf/pxe-agent");
        let said = unreachable_text("http://127.0.0.1:9465", &error, dir, &pinned);
        assert_eq!(
            said,
            "ready:       no\n  agent not reachable at http://127.0.0.1:9465: no agent answering \
             on 127.0.0.1:9465 (is `pxe-agent run` up?): connection refused\n\
             pinned:      XDP program id 42 still attached to eth1: answering the 200 known hosts \
             of its pinned maps without an agent (unknown machines, relayed and iPXE requests, \
             TFTP and HTTP go unanswered); `pxe-agent detach --pin-dir /sys/fs/bpf/pxe-agent \
             --interface eth1` removes it\n\
             pinned:      eth2: the pinned link's program id 7 is no longer attached (nothing \
             answers; the next agent removes the stale pins)\n"
        );
        let json = unreachable_json("http://127.0.0.1:9465", &error, dir, &pinned);
        assert_eq!(json["reachable"], false);
        assert_eq!(json["pinned"][0]["program"], 42);
        assert_eq!(json["pinned"][0]["hosts"], 200);
        assert!(
            unreachable_text("a:1", &error, dir, &Ok(Vec::new()))
                .ends_with("pinned:      nothing under /sys/fs/bpf/pxe-agent\n")
        );
    }

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

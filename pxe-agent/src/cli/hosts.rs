//! `pxe-agent hosts` and `reprovision`: the hosts and discovered-clients
//! tables, and the netboot actions on one host.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use pxe_agent::{
    bmc::PowerState,
    clock,
    discovered::Discovered,
    progress::{Stage, Step},
    recovery::{State, Watch},
    terminal::{self, Align, Table},
    view::{HostView, NetbootView, ReprovisionView, TurnView},
    when,
};

use super::agent::{AgentCall, ApiArgs, Output, print_json};

#[derive(Subcommand)]
pub enum HostsAction {
    /// Record a `netboot: once` host's provisioning as done, as its
    /// phone-home would: from now on every route gives it no boot file.
    Done {
        /// The host, by name or MAC.
        host: String,
        #[command(flatten)]
        agent: AgentCall,
    },
}

/// `pxe-agent hosts`: the hosts (or, with `discovered`, the unknown
/// clients) as a table or as the agent's JSON.
pub fn list(discovered: bool, output: Output, api: &ApiArgs) -> anyhow::Result<ExitCode> {
    match (output, discovered) {
        (Output::Json, _) => {
            let path = if discovered {
                "/api/v1/discovered"
            } else {
                "/api/v1/hosts"
            };
            print_json(&api.client()?.get(path)?)?;
            Ok(ExitCode::SUCCESS)
        }
        (Output::Table, false) => hosts_table(api),
        (Output::Table, true) => discovered_table(api),
    }
}

/// The hosts with their boot progress, one row each.
fn hosts_table(api: &ApiArgs) -> anyhow::Result<ExitCode> {
    let list: Vec<HostView> = serde_json::from_str(&api.client()?.get("/api/v1/hosts")?)
        .context("malformed /api/v1/hosts answer")?;
    let now = clock::now_ms();
    let step = |s: &Option<Step>| {
        s.as_ref().map_or("-".to_string(), |s| {
            format!(
                "{} {}",
                when::ago(s.at_ms, now),
                terminal::escape(&s.detail)
            )
        })
    };
    // With peers, the agent that owns each host's recovery.
    let owners = list.iter().any(|h| h.owner.is_some());
    let owner_column = [("OWNER", 16, Align::Left)];
    // In a boot storm, the hosts whose artifact waits for its turn.
    let turns = list.iter().any(|h| h.turn.is_some());
    let turn_column = [("WAITING FOR TURN", 28, Align::Left)];
    // With IPv6 reservations, each host's.
    let six = list.iter().any(|h| h.ipv6.is_some());
    let ipv6_column = [("IPV6", 25, Align::Left)];
    let mut table = Table::new(
        &[
            &[("MAC", 17, Align::Left), ("IP", 15, Align::Left)][..],
            if six { &ipv6_column[..] } else { &[] },
            &[
                ("HOSTNAME", 24, Align::Left),
                ("STAGE", 9, Align::Left),
                ("POWER", 7, Align::Left),
                ("BMC", 20, Align::Left),
                ("RECOVERY", 19, Align::Left),
                ("ATTEMPTS", 8, Align::Right),
            ][..],
            if owners { &owner_column[..] } else { &[] },
            if turns { &turn_column[..] } else { &[] },
            &[
                ("NETBOOT", 28, Align::Left),
                ("LAST DHCP", 44, Align::Left),
                ("LAST TFTP/SCRIPT", 44, Align::Left),
                ("BOOTED", 44, Align::Left),
                ("BOOT MAC", 17, Align::Left),
                // Lowercase: not a boot stage (docs/boot.md).
                ("declined", 32, Align::Left),
            ],
        ]
        .concat(),
    );
    for h in list {
        let p = &h.progress;
        let middle = p.script.as_ref().or(p.tftp.as_ref()).cloned();
        let mut row = vec![
            h.mac.to_string(),
            h.ip.map_or("-".into(), |ip| ip.to_string()),
        ];
        if six {
            row.push(h.ipv6.map_or("-".to_string(), |ip| ip.to_string()));
        }
        row.extend([
            terminal::escape(h.hostname.as_deref().unwrap_or("-")).into_owned(),
            h.stage.map_or("-", Stage::as_str).to_string(),
            h.power.map_or("-", PowerState::as_str).to_string(),
            bmc_column(&h, now),
            recovery_cell(&h),
            h.attempts.map_or("-".to_string(), |a| a.to_string()),
        ]);
        if owners {
            row.push(terminal::escape(h.owner.as_deref().unwrap_or("-")).into_owned());
        }
        if turns {
            row.push(h.turn.as_ref().map_or("-".to_string(), turn_cell));
        }
        row.extend([
            netboot_cell(&h.netboot, now),
            step(&p.dhcp),
            step(&middle),
            step(&p.booted),
            h.boot_mac.map_or("-".to_string(), |m| m.to_string()),
            step(&p.declined),
        ]);
        table.row(row);
    }
    print!("{}", table.render());
    Ok(ExitCode::SUCCESS)
}

/// `2.4s, 17 ahead`: an artifact download waiting for its turn.
fn turn_cell(t: &TurnView) -> String {
    format!("{:.1}s, {} ahead", t.waiting_ms as f64 / 1000.0, t.ahead)
}

/// The unknown clients that asked for DHCP, one row each.
fn discovered_table(api: &ApiArgs) -> anyhow::Result<ExitCode> {
    let list: Vec<Discovered> = serde_json::from_str(&api.client()?.get("/api/v1/discovered")?)
        .context("malformed /api/v1/discovered answer")?;
    let now = clock::now_ms();
    let mut table = Table::new(&[
        ("MAC", 17, Align::Left),
        ("IP", 15, Align::Left),
        ("ARCH", 5, Align::Right),
        ("VENDOR CLASS", 32, Align::Left),
        ("USER CLASS", 16, Align::Left),
        ("RELAY", 15, Align::Left),
        ("REQS", 8, Align::Right),
        ("last seen", 12, Align::Left),
    ]);
    for d in list {
        let opt = |v: &Option<String>| {
            v.as_deref()
                .map_or_else(|| "-".into(), |v| terminal::escape(v).into_owned())
        };
        table.row(vec![
            d.mac.to_string(),
            d.ip.map_or("-".into(), |ip| ip.to_string()),
            d.arch.map_or("-".into(), |a| a.to_string()),
            opt(&d.vendor_class),
            opt(&d.user_class),
            d.relay.map_or("-".into(), |ip| ip.to_string()),
            d.requests.to_string(),
            when::ago(d.last_seen.saturating_mul(1000), now),
        ]);
    }
    print!("{}", table.render());
    Ok(ExitCode::SUCCESS)
}

/// `pxe-agent hosts done HOST`.
pub fn done(host: &str, agent: &AgentCall) -> anyhow::Result<ExitCode> {
    netboot_call(agent, host, "netboot/done", None)
}

/// `pxe-agent reprovision HOST [--no-power]`.
pub fn reprovision(host: &str, no_power: bool, agent: &AgentCall) -> anyhow::Result<ExitCode> {
    netboot_call(
        agent,
        host,
        "reprovision",
        Some(serde_json::json!({ "power": !no_power })),
    )
}

/// The hosts table's BMC column: the driver calls start with, and
/// `fallback <time left>` during a hold-down.
fn bmc_column(h: &HostView, now: u64) -> String {
    match (&h.bmc_driver, h.bmc_fallback_until_ms) {
        (None, _) => "-".to_string(),
        (Some(d), None) => d.clone(),
        (Some(d), Some(until)) => {
            let left = until.saturating_sub(now) / 1000;
            format!("{d} fallback {}m{:02}s", left / 60, left % 60)
        }
    }
}

/// The `NETBOOT` cell of `pxe-agent hosts`: the policy, and for `once`
/// whether the host is armed or done, by what and how long ago.
fn netboot_cell(n: &NetbootView, now: u64) -> String {
    match (&n.state, n.since_ms, &n.by) {
        (Some(state), Some(at), Some(by)) => {
            format!("{} {state} ({by}, {})", n.policy, when::ago(at, now))
        }
        (Some(state), _, _) => format!("{} {state}", n.policy),
        _ => n.policy.to_string(),
    }
}

/// The RECOVERY cell: the state, and why an idle `expect_boot` host's
/// deadline does not count.
fn recovery_cell(h: &HostView) -> String {
    let state = h.recovery.map_or("-", State::as_str);
    match h.recovery_watch {
        Some(Watch::CheckingPower) => format!("{state} (checking)"),
        Some(Watch::UntilBootActivity) => format!("{state} (running)"),
        Some(Watch::Counting) | None => state.to_string(),
    }
}

/// `hosts done` and `reprovision`: `POST /api/v1/hosts/<host>/<action>`
/// with the token, then the answer as JSON or one line.
fn netboot_call(
    agent: &AgentCall,
    host: &str,
    action: &str,
    body: Option<serde_json::Value>,
) -> anyhow::Result<ExitCode> {
    let path = format!("/api/v1/hosts/{host}/{action}");
    let (status, page) = agent.api.client()?.request("POST", &path, body.as_ref())?;
    if !(200..300).contains(&status) {
        let why = page.trim();
        anyhow::bail!("{path}: {status} {why}");
    }
    if agent.format == Output::Json {
        print_json(&page)?;
        return Ok(ExitCode::SUCCESS);
    }
    let now = clock::now_ms();
    if action == "reprovision" {
        let view: ReprovisionView =
            serde_json::from_str(&page).with_context(|| format!("malformed {path} answer"))?;
        let power = match &view.power {
            None => "no BMC call".to_string(),
            Some(out) => match (&out.recovery, &out.error) {
                (_, Some(error)) => format!("BMC: {}", terminal::escape(error)),
                (Some(state), None) => format!("recovery {state}"),
                (None, None) => format!("BMC: {}", out.result),
            },
        };
        println!(
            "{} ({}): netboot {}; {power}",
            terminal::escape(host),
            view.mac,
            netboot_cell(&view.netboot, now)
        );
        let failed = view.power.as_ref().is_some_and(|o| o.failure.is_some());
        return Ok(if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        });
    }
    let view: NetbootView =
        serde_json::from_str(&page).with_context(|| format!("malformed {path} answer"))?;
    println!(
        "{}: netboot {}",
        terminal::escape(host),
        netboot_cell(&view, now)
    );
    Ok(ExitCode::SUCCESS)
}

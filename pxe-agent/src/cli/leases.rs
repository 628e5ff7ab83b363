//! `pxe-agent leases`: the running agent's pool leases, IPv4 and IPv6.

use std::process::ExitCode;

use anyhow::Context as _;
use pxe_agent::{
    clock,
    terminal::{self, Align, Table},
    view::LeaseView,
    when,
};

use super::agent::{ApiArgs, Output, print_json};

/// `pxe-agent leases`: as a table or as the agent's JSON.
pub fn list(output: Output, api: &ApiArgs) -> anyhow::Result<ExitCode> {
    if output == Output::Json {
        print_json(&api.client()?.get("/api/v1/leases")?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let list: Vec<LeaseView> = serde_json::from_str(&api.client()?.get("/api/v1/leases")?)
        .context("malformed /api/v1/leases answer")?;
    let now = clock::now_ms() / 1000;
    let mut table = Table::new(&[
        ("MAC", 17, Align::Left),
        ("IP", 39, Align::Left),
        ("STATE", 9, Align::Left),
        ("EXPIRES", 12, Align::Right),
        ("hostname", 64, Align::Left),
    ]);
    for l in list {
        table.row(vec![
            // An IPv6 client whose DUID and address carry no MAC.
            l.mac.map_or_else(|| "-".to_owned(), |m| m.to_string()),
            l.ip.to_string(),
            l.state.to_string(),
            when::until(l.expires, now),
            terminal::escape(l.hostname.as_deref().unwrap_or_default()).into_owned(),
        ]);
    }
    print!("{}", table.render());
    Ok(ExitCode::SUCCESS)
}

//! `pxe-agent stats`: the running agent's counters, from its /metrics page.

use std::{net::SocketAddr, process::ExitCode};

use pxe_agent::client;

/// `pxe-agent stats`: prints the counters at `metrics_addr`.
pub fn print(metrics_addr: SocketAddr) -> anyhow::Result<ExitCode> {
    print!("{}", table(&client::metrics(metrics_addr)?));
    Ok(ExitCode::SUCCESS)
}

/// The samples of a /metrics page as a table.
fn table(page: &str) -> String {
    let mut out = String::new();
    for line in page
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        if let Some((name, value)) = line.rsplit_once(' ') {
            out.push_str(&format!("{name:<60} {value:>12}\n"));
        }
    }
    out
}

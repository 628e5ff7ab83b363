//! `pxe-agent import` and `export`: their flags, and the translated
//! inventory and report written where they say.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::Subcommand;
use pxe_agent::inventory;

#[derive(Subcommand)]
pub enum ImportFrom {
    /// dnsmasq configuration files and --dhcp-hostsfile files (hosts files
    /// and configuration files they name are read too, when readable).
    Dnsmasq {
        /// dnsmasq configuration files and hosts files.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        #[command(flatten)]
        out: ImportOutput,
    },
    /// A kea-dhcp4 configuration file, a kea-dhcp6 one, or both (JSON,
    /// comments allowed), told apart by their Dhcp4 and Dhcp6 objects; the
    /// reservations of the two join into hosts by MAC.
    Kea {
        /// kea-dhcp4.conf, kea-dhcp6.conf, or both: one of each at most.
        #[arg(required = true, num_args = 1..=2, value_name = "FILE")]
        files: Vec<PathBuf>,
        #[command(flatten)]
        out: ImportOutput,
    },
}

#[derive(clap::Args)]
pub struct ImportOutput {
    /// Where to write the inventory (default: standard output).
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Where to write the report of what was not translated (default:
    /// standard error).
    #[arg(long)]
    report: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum ExportTo {
    /// A dnsmasq hosts file (`--dhcp-hostsfile`), one
    /// MAC,IP[,[IPv6]][,hostname] line per host, on standard output.
    Dnsmasq {
        /// The inventory file (YAML) to export.
        inventory: PathBuf,
    },
}

/// `pxe-agent import`: the inventory to --output (or stdout), the report to
/// --report (or stderr). Untranslated items do not fail the command; input
/// that cannot be read or parsed, or a result that does not validate, does.
pub fn import(from: ImportFrom) -> anyhow::Result<ExitCode> {
    use pxe_agent::import;
    let (result, out) = match from {
        ImportFrom::Dnsmasq { files, out } => (import::dnsmasq::import(&files), out),
        ImportFrom::Kea { files, out } => (import::kea::import(&files), out),
    };
    let imported = match result {
        Ok(i) => i,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    match &out.output {
        Some(path) => std::fs::write(path, &imported.yaml)
            .with_context(|| format!("failed to write {}", path.display()))?,
        None => print!("{}", imported.yaml),
    }
    let report = imported.report.to_string();
    match &out.report {
        Some(path) => std::fs::write(path, &report)
            .with_context(|| format!("failed to write {}", path.display()))?,
        None => eprint!("{report}"),
    }
    let inventory = out
        .output
        .as_ref()
        .map_or("inventory.yaml".to_owned(), |p| p.display().to_string());
    eprintln!(
        "run it as the configuration did: pxe-agent run {}",
        imported.run_flags.args(&inventory).join(" ")
    );
    if imported.report.is_empty() {
        eprintln!(
            "imported {} hosts; everything was translated",
            imported.hosts
        );
    } else {
        eprintln!(
            "imported {} hosts; {} items were not translated as they were (see the report{})",
            imported.hosts,
            imported.report.items.len(),
            out.report
                .as_ref()
                .map(|p| format!(" in {}", p.display()))
                .unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `pxe-agent export`: the inventory's reservations on standard output.
pub fn export(to: ExportTo) -> anyhow::Result<ExitCode> {
    let ExportTo::Dnsmasq { inventory } = to;
    let inv = inventory::Inventory::load(&inventory)?;
    print!(
        "{}",
        pxe_agent::import::export::dnsmasq_hosts(&inv, &inventory.display().to_string())
    );
    Ok(ExitCode::SUCCESS)
}

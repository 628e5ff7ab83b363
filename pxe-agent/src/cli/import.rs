//! `pxe-agent import` and `export`: their flags, and the translated
//! inventory and report written where they say; `import leases`, the live
//! leases written into the lease store of a state directory.

use std::{fs, path::PathBuf, process::ExitCode};

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
    /// Live leases of dnsmasq (its lease file) or Kea (its memfile) into
    /// the lease store of the agent's state directory, so that the
    /// machines holding them keep their addresses. Run it with the old
    /// server stopped and before the agent starts. Only unexpired leases
    /// at addresses of the inventory's pools, of machines that are not its
    /// hosts, are carried; the others are counted and reported by line.
    Leases(LeaseArgs),
}

/// Whose lease files `import leases` reads.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum LeaseFormat {
    /// dnsmasq's lease file (/var/lib/misc/dnsmasq.leases).
    Dnsmasq,
    /// Kea's memfile: kea-leases4.csv, kea-leases6.csv.
    Kea,
}

#[derive(clap::Args)]
pub struct LeaseArgs {
    /// Whose lease files they are.
    #[arg(long, value_enum)]
    from: LeaseFormat,
    /// The lease files, oldest first (a later line for an address wins):
    /// dnsmasq.leases; or Kea's kea-leases4.csv, kea-leases6.csv or both,
    /// each after the .1 and then .2 file a lease file cleanup left, if
    /// any.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// The inventory the agent will serve: a lease is carried only at an
    /// address of one of its pools.
    #[arg(long, value_name = "FILE")]
    inventory: PathBuf,
    /// The agent's state directory (`run --state-dir`); the leases go into
    /// its lease store, which is created if missing.
    #[arg(long, value_name = "DIR", default_value = super::run::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Replace the leases of a lease store that already holds some (by
    /// default such a store is left alone and the command fails).
    #[arg(long)]
    force: bool,
    /// Read, sort and report only: write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Where to write the report of each lease or line left out (default:
    /// standard error).
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
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
        ImportFrom::Leases(args) => return import_leases(&args),
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

/// `pxe-agent import leases`: reads the files, sorts their leases against
/// the inventory, reports what is left out, and (unless --dry-run)
/// replaces the lease store's records with the rest. Malformed lines do
/// not fail the command; an unreadable file or inventory, a file of
/// another format, or a store that holds leases already (without
/// --force) does, before anything is written.
fn import_leases(args: &LeaseArgs) -> anyhow::Result<ExitCode> {
    use pxe_agent::{
        import::leases::{Format, Reading, sort},
        lease::{LeaseStore, STORE_FILE},
    };
    let inv = match inventory::Inventory::load(&args.inventory) {
        Ok(inv) => inv,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let format = match args.from {
        LeaseFormat::Dnsmasq => Format::Dnsmasq,
        LeaseFormat::Kea => Format::Kea,
    };
    let mut reading = Reading::default();
    for file in &args.files {
        let bytes = fs::read(file).with_context(|| format!("failed to read {}", file.display()))?;
        if let Err(e) = reading.read(format, file, &String::from_utf8_lossy(&bytes)) {
            eprintln!("error: {e}");
            return Ok(ExitCode::FAILURE);
        }
    }
    let sorted = sort(reading, &inv, pxe_agent::clock::now_secs());
    let report = sorted.report.to_string();
    match &args.report {
        Some(path) => fs::write(path, &report)
            .with_context(|| format!("failed to write {}", path.display()))?,
        // The files' host names are the old server's clients' words.
        None => {
            for line in report.lines() {
                eprintln!("{}", pxe_agent::terminal::escape(line));
            }
        }
    }
    if sorted.discovery_off {
        eprintln!(
            "warning: {} has discovery off: the agent answers no machine outside its hosts, \
             so the carried leases are served only once discovery.policy is inspect",
            args.inventory.display()
        );
    }
    if args.dry_run {
        eprintln!("{} (--dry-run: nothing written)", sorted.summary());
        return Ok(ExitCode::SUCCESS);
    }
    fs::create_dir_all(&args.state_dir)
        .with_context(|| format!("failed to create {}", args.state_dir.display()))?;
    let path = args.state_dir.join(STORE_FILE);
    let created = !path.exists();
    let mut store = LeaseStore::open(&path).with_context(|| {
        format!(
            "failed to open the lease store {} (an agent running on this state directory \
             holds it: stop the agent first)",
            path.display()
        )
    })?;
    if !store.is_empty() && !args.force {
        eprintln!(
            "error: {} holds leases already: nothing written; --force replaces them with the \
             imported ones",
            path.display()
        );
        return Ok(ExitCode::FAILURE);
    }
    store.set_lease_key(inv.discovery.lease_key);
    store
        .replace_all(&sorted.leases, &sorted.leases6)
        .with_context(|| format!("failed to write {}", path.display()))?;
    drop(store);
    if created {
        give_to_state_dir_owner(&path, &args.state_dir)?;
    }
    eprintln!("{}; written to {}", sorted.summary(), path.display());
    Ok(ExitCode::SUCCESS)
}

/// Gives a lease store this command created the owner of its state
/// directory: an agent running as its own user (the package's unit)
/// could not write a file root made.
fn give_to_state_dir_owner(path: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let owner = fs::metadata(dir).with_context(|| format!("failed to read {}", dir.display()))?;
    let file = fs::metadata(path).with_context(|| format!("failed to read {}", path.display()))?;
    if (file.uid(), file.gid()) != (owner.uid(), owner.gid()) {
        std::os::unix::fs::chown(path, Some(owner.uid()), Some(owner.gid())).with_context(
            || {
                format!(
                    "failed to give {} to the owner of {}",
                    path.display(),
                    dir.display()
                )
            },
        )?;
    }
    Ok(())
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

//! The `pxe-agent` binary: parses the command line ([`cli`]), sets up
//! logging, and hands the subcommand to its module.

mod cli;

use std::process::ExitCode;

use pxe_agent::{
    app,
    logging::{self, LogFormat},
};

use crate::cli::{Cli, Command, hosts::HostsAction};

fn main() -> ExitCode {
    app::limit_heap_arenas();
    let cli = Cli::try_parse_checked(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let format = match &cli.command {
        Command::Run(run) => run.log_format,
        _ => LogFormat::Text,
    };
    let subscriber = logging::subscriber(format, logging::filter(), std::io::stderr);
    if let Err(e) = tracing::subscriber::set_global_default(subscriber) {
        eprintln!("error: failed to set up logging: {e}");
        return ExitCode::FAILURE;
    }
    match dispatch(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `command`: each subcommand is done by its module of [`cli`].
fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Run(args) => {
            cli::run::run(args.try_into()?)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Import { from } => cli::import::import(from),
        Command::Export { to } => cli::import::export(to),
        Command::Check {
            paths,
            secrets,
            boot_root,
            artifacts,
            server_ip,
            map_capacity,
        } => {
            let roots = cli::check::Roots {
                boot_root: boot_root.as_deref(),
                artifacts: artifacts.as_deref(),
            };
            cli::check::check(&paths, &secrets, roots, server_ip, map_capacity)
        }
        Command::Detach { pin_dir, interface } => cli::xdp::detach(&pin_dir, &interface),
        Command::VethPeer {
            interface,
            redirect_to,
        } => cli::xdp::veth_peer(&interface, redirect_to.as_deref()),
        Command::Hosts {
            action: Some(HostsAction::Done { host, agent }),
            ..
        } => cli::hosts::done(&host, &agent),
        Command::Reprovision {
            host,
            no_power,
            agent,
        } => cli::hosts::reprovision(&host, no_power, &agent),
        Command::Hosts {
            discovered,
            format,
            api,
            action: None,
        } => cli::hosts::list(discovered, format, &api),
        Command::Leases { format, api } => cli::leases::list(format, &api),
        Command::Status {
            format,
            api,
            pin_dir,
        } => cli::status::status(format, &api, &pin_dir),
        Command::Stats { metrics_addr } => cli::stats::print(metrics_addr),
        Command::Trace { host, api, count } => cli::trace::trace(&api, &host, count),
        Command::Bmc { command } => cli::bmc::bmc(command),
        Command::Recover { hosts, select } => cli::oob::recover(hosts, &select),
    }
}

//! `cargo xtask <command>`: one module per command, each with a `run`.
//!
//! To add a command, add a variant to [`Command`] (a nested `Subcommand` enum
//! for groups such as `bench dhcp`) and a module holding its `run`.

mod demo;
mod test;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(about = "Project tasks for pxe-agent", arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Install what the project needs (Debian packages, nightly + rust-src,
    /// bpf-linker); skips whatever is already there.
    Setup,
    /// Set up, then run fmt, unit tests and the privileged suite (root).
    Test,
    /// Set up, then run the agent in a throw-away namespace pair against a
    /// real DHCP client using examples/inventory.yaml.
    Demo,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Setup => xtask::setup::run(),
        Command::Test => test::run(),
        Command::Demo => demo::run(),
    }
}

//! `cargo xtask <command>`: one module per command, each with a `run`.
//!
//! To add a command, add a variant to [`Command`] (a nested `Subcommand` enum
//! for groups such as `bench dhcp`) and a module holding its `run`.

mod bench;
mod demo;
mod fuzz;
mod image;
mod run;
mod storm;
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
    /// Set up, then network-boot a QEMU VM (SeaBIOS + iPXE) from the agent
    /// serving examples/inventory.yaml in a throw-away namespace: DHCP, iPXE
    /// script, kernel and initramfs, phone-home. Root.
    Demo,
    /// Build pxe-agent and run `pxe-agent run` with the arguments after
    /// `--`, through sudo when not root.
    Run(run::Options),
    /// Build the Debian package (release build): target/debian/pxe-agent_*.deb.
    Deb,
    /// Build the container image from the Containerfile with docker,
    /// podman or buildah, whichever is on PATH.
    Image(image::Options),
    /// Run each libFuzzer target of fuzz/ for a bounded time (cargo-fuzz,
    /// nightly; installs cargo-fuzz if missing); fails if any crashed.
    Fuzz(fuzz::Options),
    /// Benchmarks (root): `bench dhcp` compares pxe-agent with Kea and dnsmasq.
    #[command(subcommand)]
    Bench(bench::Bench),
    /// Boot storm (root): N simulated machines network-boot at once through
    /// the whole chain against pxe-agent, Kea + tftpd-hpa + nginx and
    /// dnsmasq + nginx; results in target/storm/, `--report` for the page.
    Storm(storm::Args),
}

/// `cargo xtask deb`: the release binary, packaged.
fn deb() -> anyhow::Result<()> {
    let status = std::process::Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "-p",
            "pxe-agent",
            "--bin",
            "pxe-agent",
        ])
        .current_dir(xtask::workspace_root())
        .status()?;
    anyhow::ensure!(status.success(), "cargo build --release failed");
    let target = xtask::target_dir();
    let out = target.join("debian");
    std::fs::create_dir_all(&out)?;
    let deb = xtask::deb::build(&target.join("release/pxe-agent"), &out)?;
    println!("{}", deb.display());
    Ok(())
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Setup => xtask::setup::run(),
        Command::Test => test::run(),
        Command::Demo => demo::run(),
        Command::Run(opts) => run::run(opts),
        Command::Deb => deb(),
        Command::Image(opts) => image::run(opts),
        Command::Fuzz(opts) => fuzz::run(opts),
        Command::Bench(bench) => bench::run(bench),
        Command::Storm(args) => storm::run(args),
    }
}

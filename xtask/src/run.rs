//! `cargo xtask run [--release] -- <pxe-agent run args>`: builds the agent
//! and runs `pxe-agent run` with the given arguments, through `sudo` when
//! not root (attaching XDP needs CAP_BPF and CAP_NET_ADMIN), as aya's
//! template projects do. The agent replaces this process, so Ctrl-C and
//! the exit status are its own.

use std::{
    ffi::OsString,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context as _;
use xtask::{process::run_forwarded, setup, target_dir, workspace_root};

#[derive(Debug, clap::Args)]
pub struct Options {
    /// Build and run the release profile.
    #[arg(long)]
    pub release: bool,
    /// Arguments of `pxe-agent run` (after `--`).
    #[arg(last = true)]
    pub args: Vec<OsString>,
}

pub fn run(opts: Options) -> anyhow::Result<()> {
    let mut build = setup::command("cargo");
    build
        .current_dir(workspace_root())
        .args(["build", "-p", "pxe-agent"]);
    if opts.release {
        build.arg("--release");
    }
    run_forwarded(&mut build).context("failed to build pxe-agent")?;
    let bin = agent_bin(&target_dir(), opts.release);
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let mut cmd = agent_command(&bin, &opts.args, root);
    let err = cmd.exec();
    Err(err).with_context(|| format!("failed to run {}", bin.display()))
}

fn agent_bin(target: &Path, release: bool) -> PathBuf {
    target
        .join(if release { "release" } else { "debug" })
        .join("pxe-agent")
}

/// `pxe-agent run <args>`, under `sudo` unless already `root`.
fn agent_command(bin: &Path, args: &[OsString], root: bool) -> Command {
    let mut cmd = if root {
        Command::new(bin)
    } else {
        let mut sudo = Command::new("sudo");
        // RUST_LOG reaches the agent; sudo keeps the rest of its policy.
        sudo.arg("--preserve-env=RUST_LOG").arg(bin);
        sudo
    };
    cmd.arg("run").args(args);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(cmd: &Command) -> Vec<String> {
        std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn the_agent_runs_directly_as_root_and_through_sudo_otherwise() {
        let bin = agent_bin(Path::new("/t"), false);
        assert_eq!(bin, Path::new("/t/debug/pxe-agent"));
        let args: Vec<OsString> = ["-i", "eth1"].map(OsString::from).to_vec();
        assert_eq!(
            line(&agent_command(&bin, &args, true)),
            ["/t/debug/pxe-agent", "run", "-i", "eth1"]
        );
        assert_eq!(
            line(&agent_command(&bin, &args, false)),
            [
                "sudo",
                "--preserve-env=RUST_LOG",
                "/t/debug/pxe-agent",
                "run",
                "-i",
                "eth1"
            ]
        );
        assert_eq!(
            agent_bin(Path::new("/t"), true),
            Path::new("/t/release/pxe-agent")
        );
    }
}

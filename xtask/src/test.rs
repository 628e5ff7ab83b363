//! `cargo xtask test`: formatting, lints, unprivileged unit tests, then the
//! privileged `pxe-tests` suite (netns labs and XDP, against the debug
//! `pxe-agent` binary built here), run serially as root.

use anyhow::Context as _;
use xtask::{ensure_root, process::run_forwarded, setup, workspace_root};

pub fn run() -> anyhow::Result<()> {
    setup::run()?;

    println!("==> fmt");
    cargo("fmt", &["fmt", "--all", "--check"])?;

    println!("==> clippy");
    let clippy = [
        "clippy",
        "--workspace",
        "--exclude",
        "pxe-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ];
    cargo("clippy", &clippy)?;

    println!("==> unit tests");
    // pxe-ebpf is a no_std binary for bpfel-unknown-none only (pxe-agent's
    // build.rs builds it); pxe-tests needs root and runs below.
    let unit = [
        "test",
        "--workspace",
        "--exclude",
        "pxe-tests",
        "--exclude",
        "pxe-ebpf",
    ];
    cargo("unit tests", &unit)?;

    println!("==> privileged tests");
    ensure_root()?;
    // The end-to-end tests run this binary (target/debug/pxe-agent).
    cargo("pxe-agent build", &["build", "-p", "pxe-agent"])?;
    // The Kubernetes source's tests run the fake API server, the storm
    // smoke test the simulator (target/debug/fake-kube-api, storm-client).
    cargo(
        "test binaries build",
        &[
            "build",
            "-p",
            "pxe-tests",
            "--bin",
            "fake-kube-api",
            "--bin",
            "storm-client",
        ],
    )?;
    // The tests build netns labs and attach XDP: they must not overlap.
    cargo(
        "privileged tests",
        &["test", "-p", "pxe-tests", "--", "--test-threads=1"],
    )?;

    println!("==> all tests passed");
    Ok(())
}

fn cargo(stage: &str, args: &[&str]) -> anyhow::Result<()> {
    run_forwarded(
        setup::command("cargo")
            .current_dir(workspace_root())
            .args(args),
    )
    .with_context(|| format!("{stage} failed"))
}

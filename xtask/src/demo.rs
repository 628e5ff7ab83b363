//! `cargo xtask demo`: the agent in a throw-away namespace pair serving
//! `examples/inventory.yaml` to a real DHCP client (busybox udhcpc), then
//! the agent's counters.
//!
//! Owns only the demo's flow; the namespaces come from [`xtask::Lab`].

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use xtask::{
    ChildGuard, Lab,
    process::{self, run_forwarded},
    setup, target_dir, workspace_root,
};

const METRICS_ADDR: &str = "127.0.0.1:9464";
const CLIENT_MAC: &str = "52:54:00:12:34:56";
/// What examples/inventory.yaml assigns to [`CLIENT_MAC`].
const EXPECTED_IP: &str = "10.66.1.10";
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Prints the lease fields udhcpc hands to its script; it configures nothing.
const LEASE_SCRIPT: &str = "#!/bin/sh\n\
echo \"$1 ip=$ip subnet=$subnet router=$router dns=$dns siaddr=$siaddr \
boot_file=$boot_file lease=$lease serverid=$serverid\"\n";

pub fn run() -> anyhow::Result<()> {
    setup::run()?;
    println!("==> building pxe-agent (release)");
    run_forwarded(setup::command("cargo").current_dir(workspace_root()).args([
        "build",
        "--release",
        "-p",
        "pxe-agent",
    ]))
    .context("failed to build pxe-agent")?;
    let agent = target_dir().join("release").join("pxe-agent");
    let scratch = Scratch::new()?;
    let lease = serve_one_client(&agent, &scratch.0)?;
    ensure!(
        lease.as_deref() == Some(EXPECTED_IP),
        "expected a lease of {EXPECTED_IP}, got {}",
        lease.as_deref().unwrap_or("none")
    );
    println!("==> demo passed: {CLIENT_MAC} leased {EXPECTED_IP}");
    Ok(())
}

/// Runs the agent in a fresh lab, one DHCP exchange against it, and prints
/// the agent's counters; returns the leased address, if any.
fn serve_one_client(agent: &Path, scratch: &Path) -> anyhow::Result<Option<String>> {
    let lab = Lab::new("pxdemo")?;
    println!(
        "==> lab: {} ({}) <-> {} ({})",
        lab.server_ns(),
        lab.server_if(),
        lab.client_ns(),
        lab.client_if()
    );
    let inventory = workspace_root().join("examples").join("inventory.yaml");
    let mut cmd = lab.cmd_in(lab.server_ns(), agent);
    cmd.current_dir(workspace_root())
        .args(["run", "--interface", lab.server_if(), "--inventory"])
        .arg(&inventory)
        .args(["--metrics-addr", METRICS_ADDR])
        // A throw-away lab keeps its lease database in its scratch directory.
        .arg("--state-dir")
        .arg(scratch.join("state"));
    // The guards are declared after `lab` so they drop first, and stopped
    // explicitly below: SIGTERM lets the agent detach XDP before the
    // namespaces go away.
    let (mut guard, mut pumps) = ChildGuard::spawn_prefixed(&mut cmd, "agent")?;
    let result = start_peer(&lab, agent).and_then(|(peer, peer_pumps)| {
        pumps.extend(peer_pumps);
        let lease = exchange(&lab, &mut guard, agent, scratch);
        stop(peer, "veth peer");
        lease
    });
    stop(guard, "agent");
    for pump in pumps {
        let _ = pump.join();
    }
    result
}

/// Attaches a pass-through XDP program to the client end (`pxe-agent
/// veth-peer`): on a veth pair, XDP_TX replies only reach a peer that runs
/// NAPI, and GRO alone did not give it that on kernel 6.18 (docs/veth.md).
fn start_peer(lab: &Lab, agent: &Path) -> anyhow::Result<(ChildGuard, Vec<JoinHandle<()>>)> {
    let mut cmd = lab.cmd_in(lab.client_ns(), agent);
    cmd.args(["veth-peer", "--interface", lab.client_if()]);
    let (mut peer, pumps) = ChildGuard::spawn_prefixed(&mut cmd, "veth-peer")?;
    let deadline = Instant::now() + READY_TIMEOUT;
    while !peer_attached(lab) {
        if let Some(status) = peer.try_wait()? {
            bail!("pxe-agent veth-peer exited before attaching ({status})");
        }
        ensure!(
            Instant::now() < deadline,
            "pxe-agent veth-peer did not attach"
        );
        thread::sleep(Duration::from_millis(100));
    }
    Ok((peer, pumps))
}

fn peer_attached(lab: &Lab) -> bool {
    let show = ["ip", "link", "show", "dev", lab.client_if()];
    lab.run_in(lab.client_ns(), &show)
        .is_ok_and(|out| out.contains(" xdp"))
}

fn stop(guard: ChildGuard, name: &str) {
    match guard.stop() {
        Ok(status) => println!("==> {name} stopped ({status})"),
        Err(err) => eprintln!("warning: {name}: {err:#}"),
    }
}

fn exchange(
    lab: &Lab,
    agent_proc: &mut ChildGuard,
    agent: &Path,
    scratch: &Path,
) -> anyhow::Result<Option<String>> {
    wait_ready(lab, agent_proc)?;
    lab.set_client_mac(CLIENT_MAC)?;
    let lease = request_lease(lab, scratch)?;
    print_stats(lab, agent);
    Ok(lease)
}

/// Polls `/healthz`, which answers 200 once XDP is attached and the maps are filled.
fn wait_ready(lab: &Lab, agent_proc: &mut ChildGuard) -> anyhow::Result<()> {
    println!("==> waiting for http://{METRICS_ADDR}/healthz");
    let url = format!("http://{METRICS_ADDR}/healthz");
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = agent_proc.try_wait()? {
            bail!("pxe-agent exited before it was ready ({status})");
        }
        if lab
            .run_in(lab.server_ns(), &["curl", "-sf", "-m", "1", &url])
            .is_ok()
        {
            println!("==> agent ready");
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "pxe-agent not ready after {}s",
            READY_TIMEOUT.as_secs()
        );
        thread::sleep(Duration::from_millis(200));
    }
}

/// One DISCOVER/OFFER/REQUEST/ACK as a BIOS PXE client (option 93 = 0).
fn request_lease(lab: &Lab, scratch: &Path) -> anyhow::Result<Option<String>> {
    let script = scratch.join("lease.sh");
    fs::write(&script, LEASE_SCRIPT)
        .with_context(|| format!("failed to write {}", script.display()))?;
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("failed to make {} executable", script.display()))?;
    println!("==> udhcpc in {} ({CLIENT_MAC})", lab.client_ns());
    let mut cmd = lab.cmd_in(lab.client_ns(), "busybox");
    cmd.args([
        "udhcpc",
        "-f",
        "-q",
        "-n",
        "-t",
        "5",
        "-T",
        "1",
        "-i",
        lab.client_if(),
    ])
    .args(["-V", "PXEClient", "-x", "0x5d:0000", "-s"])
    .arg(&script);
    let out = process::output(&mut cmd)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in String::from_utf8_lossy(&out.stderr)
        .lines()
        .chain(stdout.lines())
    {
        println!("[udhcpc] {line}");
    }
    if !out.status.success() {
        eprintln!("warning: udhcpc exited with {}", out.status);
    }
    Ok(bound_ip(&stdout))
}

/// The `ip=` field of the script's `bound` line.
fn bound_ip(script_output: &str) -> Option<String> {
    script_output
        .lines()
        .filter(|line| line.starts_with("bound "))
        .flat_map(str::split_whitespace)
        .find_map(|field| field.strip_prefix("ip="))
        .map(str::to_owned)
}

fn print_stats(lab: &Lab, agent: &Path) {
    let mut cmd = lab.cmd_in(lab.server_ns(), agent);
    cmd.args(["stats", "--metrics-addr", METRICS_ADDR]);
    match process::run(&mut cmd) {
        Ok(stats) => {
            println!("==> pxe-agent stats");
            print!("{stats}");
        }
        Err(err) => eprintln!("warning: {err:#}"),
    }
}

/// A private temporary directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("pxe-demo-{}", std::process::id()));
        fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_ip_reads_the_bound_line_only() {
        let out = "deconfig ip= subnet=\nbound ip=10.66.1.10 subnet=255.255.0.0 router=10.66.0.1\n";
        assert_eq!(bound_ip(out).as_deref(), Some("10.66.1.10"));
        assert_eq!(bound_ip("deconfig ip=\nleasefail ip=\n"), None);
    }
}

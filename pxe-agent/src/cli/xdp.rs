//! The commands that handle XDP attachments themselves, with no agent
//! running: `detach` (what `run --pin-dir` left) and `veth-peer` (the lab's
//! pass-through peer).

use std::{path::Path, process::ExitCode};

use anyhow::Context as _;
use pxe_agent::xdp::VethPeer;

use super::runtime::block_on_signal;

/// `pxe-agent detach`: detaches and unpins what `pin_dir` holds for
/// `interfaces` (every interface under it when empty), one line each.
pub fn detach(pin_dir: &Path, interfaces: &[String]) -> anyhow::Result<ExitCode> {
    let removed = pxe_agent::xdp::pin::detach(pin_dir, interfaces)
        .with_context(|| format!("failed to detach what {} pins", pin_dir.display()))?;
    if removed.is_empty() {
        println!("nothing pinned under {}", pin_dir.display());
    }
    for r in removed {
        let link = if r.link {
            "link detached and unpinned"
        } else {
            "no link pinned"
        };
        let maps = if r.maps.is_empty() {
            "no map pins".to_string()
        } else {
            format!("map pins removed: {}", r.maps.join(", "))
        };
        println!("{}: {link}; {maps}", r.iface);
    }
    Ok(ExitCode::SUCCESS)
}

/// `pxe-agent veth-peer`: the pass-through (or redirecting) program on
/// `interface`, until SIGINT or SIGTERM.
pub fn veth_peer(interface: &str, redirect_to: Option<&str>) -> anyhow::Result<ExitCode> {
    let _peer = match redirect_to {
        Some(target) => VethPeer::attach_redirect(interface, target)?,
        None => VethPeer::attach(interface)?,
    };
    block_on_signal(async { Ok(()) })?;
    Ok(ExitCode::SUCCESS)
}

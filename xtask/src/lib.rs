//! Helpers behind `cargo xtask`, shared with the privileged tests (`pxe-tests`)
//! and benchmarks: machine bootstrap ([`setup`]), throw-away network
//! namespaces ([`lab`]), child-process guards ([`process`]), QEMU
//! network boots with real firmware ([`vm`]), fleet-sized inventories
//! ([`fleet`]), the runtime image's root built without a registry
//! ([`rootfs`]) and the Debian package ([`deb`]).
//!
//! The eBPF object is not built here: `pxe-agent/build.rs` builds and embeds it.

pub mod deb;
pub mod fleet;
pub mod lab;
pub mod process;
pub mod rootfs;
pub mod setup;
pub mod vm;

pub use lab::Lab;
pub use process::{ChildGuard, ensure_root};

use std::path::PathBuf;

/// The workspace root (the directory holding the top-level `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(PathBuf::from)
        .unwrap_or(manifest_dir)
}

/// The cargo target directory (`CARGO_TARGET_DIR` or `<workspace>/target`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

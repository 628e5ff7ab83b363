//! Builds the XDP object (`pxe-ebpf`) with the nightly toolchain so that a
//! plain `cargo build` embeds it; `AYA_BUILD_SKIP=1` leaves an empty object
//! (for clippy and docs on machines without bpf-linker).
use std::{env, fs, path::PathBuf};

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest_dir
        .join("../pxe-ebpf")
        .canonicalize()
        .context("pxe-ebpf crate not found")?;
    let root_dir = ebpf_dir.to_str().context("pxe-ebpf path is not UTF-8")?;
    // The object depends on the program's and the shared crate's sources.
    for dir in [
        "../pxe-ebpf/src",
        "../pxe-ebpf/Cargo.toml",
        "../pxe-ebpf-common/src",
    ] {
        println!(
            "cargo:rerun-if-changed={}",
            manifest_dir.join(dir).display()
        );
    }
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let object = out_dir.join("pxe-ebpf");
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip && !object.exists() {
        fs::write(&object, []).context("failed to write the placeholder object")?;
    }
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "pxe-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
    .context(
        "failed to build the XDP program (run `cargo xtask setup` for bpf-linker and rust-src)",
    )
}

//! Debian's signed network-boot chain for Secure Boot guests: shim
//! (`shimx64.efi`, signed by Microsoft's UEFI CA, from `shim-signed`) and
//! grub's network image (`grubnetx64.efi`, signed by Debian, from
//! `grub-efi-amd64-signed`), cached under `~/.cache/pxe-agent/signed/`.
//!
//! The packages are fetched with `apt-get download` and unpacked with
//! `dpkg-deb -x`, as [`super::guest`] does: installing `shim-signed` would
//! pull grub's boot-loader configuration and efibootmgr into the machine.
//! [`ensure`] is idempotent: files already cached are used as they are.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::Context as _;

use super::guest::{TempDir, download, extract};
use crate::setup::cache_dir;

/// The name shim is served under; the DHCP boot file of a Secure Boot
/// profile.
pub const SHIM_FILE: &str = "shimx64.efi";
/// The name shim fetches next to itself (over TFTP from the same server and
/// directory it came from), so grub's network image is served under it.
pub const GRUB_FILE: &str = "grubx64.efi";

/// (package, file inside it, name in the cache).
const PARTS: &[(&str, &str, &str)] = &[
    ("shim-signed", "usr/lib/shim/shimx64.efi.signed", SHIM_FILE),
    (
        "grub-efi-amd64-signed",
        "usr/lib/grub/x86_64-efi-signed/grubnetx64.efi.signed",
        GRUB_FILE,
    ),
];

/// The cached signed boot files.
#[derive(Debug, Clone)]
pub struct SignedChain {
    pub shim: PathBuf,
    pub grub: PathBuf,
}

/// `~/.cache/pxe-agent/signed` (or under `$XDG_CACHE_HOME`).
pub fn signed_cache() -> anyhow::Result<PathBuf> {
    Ok(cache_dir()?.join("signed"))
}

/// Makes sure shim and grub are in the cache, downloading what is missing;
/// prints one line per file.
pub fn ensure() -> anyhow::Result<SignedChain> {
    let cache = signed_cache()?;
    fs::create_dir_all(&cache).with_context(|| format!("failed to create {}", cache.display()))?;
    for &(package, inner, name) in PARTS {
        ensure_file(&cache, package, inner, name)?;
    }
    Ok(SignedChain {
        shim: cache.join(SHIM_FILE),
        grub: cache.join(GRUB_FILE),
    })
}

fn ensure_file(cache: &Path, package: &str, inner: &str, name: &str) -> anyhow::Result<()> {
    let step = format!("signed {name}");
    let path = cache.join(name);
    if path.is_file() {
        println!("setup: {step:<20} ok ({package})");
        return Ok(());
    }
    println!("setup: {step:<20} fetching {package}");
    let work = TempDir::new(cache, package)?;
    let deb = download(package, &work.0)?;
    let tree = work.0.join("tree");
    extract(&deb, &tree)?;
    let source = tree.join(inner);
    let staged = work.0.join(name);
    fs::copy(&source, &staged)
        .with_context(|| format!("{package} has no {inner} ({})", source.display()))?;
    // Renamed into place last, so a present file is always complete.
    fs::rename(&staged, &path).with_context(|| format!("failed to store {}", path.display()))?;
    println!("setup: {step:<20} cached ({package})");
    Ok(())
}

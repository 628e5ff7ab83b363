//! The guest's kernel, NIC modules and busybox, taken from Debian packages
//! and cached under `~/.cache/pxe-agent/guest/`.
//!
//! Packages are fetched with `apt-get download` and unpacked with
//! `dpkg-deb -x` into a temporary directory: nothing is installed on the
//! machine. Only what the guest needs is kept: the kernel image, the modules
//! that drive QEMU's virtio-net and e1000 NICs (with the modules they depend
//! on, in load order), and the busybox-static binary. busybox-static is
//! unpacked rather than installed because Debian's `busybox-static` and
//! `busybox` packages conflict, and the tests drive the machine's `busybox`.
//!
//! [`ensure`] is idempotent: a complete cache entry is used as is.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail, ensure as check};

use crate::{process, setup::cache_dir};

/// The Debian metapackage whose dependency names the current kernel package.
const KERNEL_METAPACKAGE: &str = "linux-image-amd64";
/// The Debian package holding a statically linked busybox.
const BUSYBOX_PACKAGE: &str = "busybox-static";
/// Modules the guest loads to reach the network, dependencies added:
/// virtio-net (what the VMs use; OVMF only drives virtio NICs itself) and
/// e1000 (QEMU's default NIC).
const NIC_MODULES: &[&str] = &["virtio_pci", "virtio_net", "e1000"];
/// Names the load order inside a kernel cache entry; written last, so its
/// presence marks the entry complete.
const ORDER_FILE: &str = "modules.order";

/// A kernel taken from a Debian `linux-image-*` package.
#[derive(Debug, Clone)]
pub struct GuestKernel {
    /// The package it came from (`linux-image-6.1.0-57-amd64`).
    pub package: String,
    /// Its release (`uname -r`: `6.1.0-57-amd64`).
    pub release: String,
    pub vmlinuz: PathBuf,
    /// The NIC modules and their dependencies, in load order.
    pub modules: Vec<PathBuf>,
}

/// Everything an initramfs is built from.
#[derive(Debug, Clone)]
pub struct GuestAssets {
    pub kernel: GuestKernel,
    /// A statically linked busybox (it runs without a libc in the guest).
    pub busybox: PathBuf,
}

/// `~/.cache/pxe-agent/guest` (or under `$XDG_CACHE_HOME`).
pub fn guest_cache() -> anyhow::Result<PathBuf> {
    Ok(cache_dir()?.join("guest"))
}

/// Makes sure the guest kernel, its NIC modules and busybox-static are in
/// the cache, downloading what is missing; prints one line per part.
pub fn ensure() -> anyhow::Result<GuestAssets> {
    let cache = guest_cache()?;
    fs::create_dir_all(&cache).with_context(|| format!("failed to create {}", cache.display()))?;
    let kernel = ensure_kernel(&cache)?;
    let busybox = ensure_busybox(&cache)?;
    Ok(GuestAssets { kernel, busybox })
}

fn report(step: &str, state: &str) {
    println!("setup: {step:<20} {state}");
}

fn ensure_kernel(cache: &Path) -> anyhow::Result<GuestKernel> {
    // Prefer the kernel the archive currently points at; offline, any
    // complete entry already in the cache does.
    let package = match current_kernel_package() {
        Ok(package) => package,
        Err(err) => {
            if let Some(kernel) = any_cached_kernel(cache) {
                report("guest kernel", &format!("ok ({}, cached)", kernel.release));
                return Ok(kernel);
            }
            return Err(err);
        }
    };
    let entry = cache.join(&package);
    if let Ok(kernel) = load_kernel(&entry) {
        report("guest kernel", &format!("ok ({})", kernel.release));
        return Ok(kernel);
    }
    report("guest kernel", &format!("fetching {package} (~70 MB)"));
    let work = TempDir::new(cache, &package)?;
    let deb = download(&package, &work.0)?;
    let tree = work.0.join("tree");
    extract(&deb, &tree)?;
    let staged = work.0.join("entry");
    stage_kernel(&tree, &staged)?;
    replace_dir(&staged, &entry)?;
    let kernel = load_kernel(&entry)?;
    report("guest kernel", &format!("cached ({})", kernel.release));
    Ok(kernel)
}

/// `linux-image-amd64`'s kernel package, from the local package lists.
fn current_kernel_package() -> anyhow::Result<String> {
    let out = process::run(Command::new("apt-cache").args(["depends", KERNEL_METAPACKAGE]))
        .context("failed to ask apt-cache for the current Debian kernel")?;
    kernel_dependency(&out).with_context(|| {
        format!("`apt-cache depends {KERNEL_METAPACKAGE}` names no kernel package:\n{out}")
    })
}

/// The `Depends: linux-image-…` line of `apt-cache depends` output.
fn kernel_dependency(apt_cache_output: &str) -> Option<String> {
    apt_cache_output
        .lines()
        .filter_map(|line| {
            line.trim()
                .trim_start_matches('|')
                .strip_prefix("Depends: ")
        })
        .map(str::trim)
        .find(|pkg| pkg.starts_with("linux-image-") && !pkg.contains(' '))
        .map(str::to_owned)
}

fn any_cached_kernel(cache: &Path) -> Option<GuestKernel> {
    let mut entries: Vec<PathBuf> = fs::read_dir(cache)
        .ok()?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("linux-image-"))
        })
        .collect();
    entries.sort();
    entries.iter().rev().find_map(|p| load_kernel(p).ok())
}

/// Reads a complete cache entry: `vmlinuz`, `release`, `modules/*.ko` and
/// the load order.
fn load_kernel(entry: &Path) -> anyhow::Result<GuestKernel> {
    let order = fs::read_to_string(entry.join(ORDER_FILE))
        .with_context(|| format!("{} is incomplete", entry.display()))?;
    let names: Vec<&str> = order.split_whitespace().collect();
    for wanted in NIC_MODULES {
        check!(
            names.contains(wanted),
            "{} lacks module {wanted}",
            entry.display()
        );
    }
    let release = fs::read_to_string(entry.join("release"))?.trim().to_owned();
    let vmlinuz = entry.join("vmlinuz");
    check!(vmlinuz.is_file(), "{} is missing", vmlinuz.display());
    let modules = names
        .iter()
        .map(|name| entry.join("modules").join(format!("{name}.ko")))
        .collect::<Vec<_>>();
    for module in &modules {
        check!(module.is_file(), "{} is missing", module.display());
    }
    let package = entry
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_owned();
    Ok(GuestKernel {
        package,
        release,
        vmlinuz,
        modules,
    })
}

/// Copies the kernel image and the NIC modules (dependencies first) out of
/// an unpacked `linux-image-*` package into `dest`.
fn stage_kernel(tree: &Path, dest: &Path) -> anyhow::Result<()> {
    let boot = tree.join("boot");
    let vmlinuz = fs::read_dir(&boot)
        .with_context(|| format!("no /boot in the kernel package ({})", boot.display()))?
        .filter_map(|e| Some(e.ok()?.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .context("no /boot/vmlinuz-* in the kernel package")?;
    let release = vmlinuz
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .context("kernel image name")?
        .to_owned();
    // Debian 12 ships modules in /lib/modules, later releases in /usr/lib/modules.
    let modules_root = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|dir| tree.join(dir).join(&release))
        .find(|dir| dir.is_dir())
        .with_context(|| format!("no modules directory for {release} in the kernel package"))?;
    let available = index_modules(&modules_root)?;
    let order = load_order(NIC_MODULES, &available)?;

    let modules_dir = dest.join("modules");
    fs::create_dir_all(&modules_dir)
        .with_context(|| format!("failed to create {}", modules_dir.display()))?;
    fs::copy(&vmlinuz, dest.join("vmlinuz"))
        .with_context(|| format!("failed to copy {}", vmlinuz.display()))?;
    for name in &order {
        let src = &available[name];
        fs::copy(src, modules_dir.join(format!("{name}.ko")))
            .with_context(|| format!("failed to copy {}", src.display()))?;
    }
    fs::write(dest.join("release"), format!("{release}\n"))?;
    fs::write(dest.join(ORDER_FILE), order.join("\n") + "\n")?;
    Ok(())
}

/// Every `.ko` under `root`, by module name (`-` read as `_`, as the kernel does).
fn index_modules(root: &Path) -> anyhow::Result<BTreeMap<String, PathBuf>> {
    let mut found = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in
            fs::read_dir(&dir).with_context(|| format!("failed to read {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".ko"))
            {
                found.insert(name.replace('-', "_"), path);
            }
        }
    }
    check!(!found.is_empty(), "no modules under {}", root.display());
    Ok(found)
}

/// `roots` and everything they depend on, each after its dependencies.
/// Dependencies read from a module's `depends=` field that are not among
/// `available` are built into the kernel and skipped.
fn load_order(
    roots: &[&str],
    available: &BTreeMap<String, PathBuf>,
) -> anyhow::Result<Vec<String>> {
    fn visit(
        name: &str,
        available: &BTreeMap<String, PathBuf>,
        order: &mut Vec<String>,
        path: &mut Vec<String>,
    ) -> anyhow::Result<()> {
        if order.iter().any(|n| n == name) {
            return Ok(());
        }
        check!(
            !path.iter().any(|n| n == name),
            "module dependency cycle through {name}"
        );
        let Some(file) = available.get(name) else {
            return Ok(());
        };
        let bytes = fs::read(file).with_context(|| format!("failed to read {}", file.display()))?;
        path.push(name.to_owned());
        for dep in module_depends(&bytes) {
            visit(&dep, available, order, path)?;
        }
        path.pop();
        order.push(name.to_owned());
        Ok(())
    }
    let mut order = Vec::new();
    for root in roots {
        if !available.contains_key(*root) {
            bail!("the kernel package has no module {root}");
        }
        visit(root, available, &mut order, &mut Vec::new())?;
    }
    Ok(order)
}

/// The `depends=` entry of a module's `.modinfo` section: NUL-separated
/// `key=value` strings, found here by scanning the file.
fn module_depends(ko: &[u8]) -> Vec<String> {
    const KEY: &[u8] = b"\0depends=";
    let Some(start) = ko.windows(KEY.len()).position(|w| w == KEY) else {
        return Vec::new();
    };
    let value = &ko[start + KEY.len()..];
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end])
        .split(',')
        .map(|d| d.trim().replace('-', "_"))
        .filter(|d| !d.is_empty())
        .collect()
}

fn ensure_busybox(cache: &Path) -> anyhow::Result<PathBuf> {
    let path = cache.join("busybox");
    if path.is_file() {
        report("guest busybox", "ok (busybox-static)");
        return Ok(path);
    }
    report("guest busybox", &format!("fetching {BUSYBOX_PACKAGE}"));
    let work = TempDir::new(cache, BUSYBOX_PACKAGE)?;
    let deb = download(BUSYBOX_PACKAGE, &work.0)?;
    let tree = work.0.join("tree");
    extract(&deb, &tree)?;
    let binary = ["bin/busybox", "usr/bin/busybox"]
        .iter()
        .map(|p| tree.join(p))
        .find(|p| p.is_file())
        .with_context(|| format!("no busybox binary in {BUSYBOX_PACKAGE}"))?;
    let staged = work.0.join("busybox");
    fs::copy(&binary, &staged).with_context(|| format!("failed to copy {}", binary.display()))?;
    fs::rename(&staged, &path).with_context(|| format!("failed to store {}", path.display()))?;
    report("guest busybox", "cached (busybox-static)");
    Ok(path)
}

/// `apt-get download <package>` into `dir`; refreshes the package lists once
/// if the archive no longer has the version they name.
pub(super) fn download(package: &str, dir: &Path) -> anyhow::Result<PathBuf> {
    let fetch = || {
        process::run(
            Command::new("apt-get")
                // Root's downloads would otherwise warn that the _apt user
                // cannot write to a private directory.
                .args(["-q", "-o", "APT::Sandbox::User=root", "download", package])
                .current_dir(dir),
        )
    };
    if let Err(err) = fetch() {
        eprintln!("setup: apt-get download {package} failed ({err:#}); refreshing package lists");
        process::run_forwarded(Command::new("apt-get").arg("update"))
            .context("apt-get update failed")?;
        fetch().with_context(|| format!("failed to download {package}"))?;
    }
    fs::read_dir(dir)?
        .filter_map(|e| Some(e.ok()?.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download {package} left no .deb"))
}

pub(super) fn extract(deb: &Path, dest: &Path) -> anyhow::Result<()> {
    process::run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(dest))
        .with_context(|| format!("failed to unpack {}", deb.display()))?;
    Ok(())
}

/// Moves a fully staged directory into place, replacing an older one.
fn replace_dir(staged: &Path, dest: &Path) -> anyhow::Result<()> {
    if dest.exists() {
        fs::remove_dir_all(dest).with_context(|| format!("failed to remove {}", dest.display()))?;
    }
    fs::rename(staged, dest).with_context(|| format!("failed to store {}", dest.display()))
}

/// A work directory next to the cache entries (same file system, so staged
/// results are renamed into place), removed on drop with the package and
/// the unpacked tree.
pub(super) struct TempDir(pub(super) PathBuf);

impl TempDir {
    pub(super) fn new(cache: &Path, what: &str) -> anyhow::Result<Self> {
        let dir = cache.join(format!(".{what}.tmp-{}", std::process::id()));
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_dependency_reads_the_metapackage_depends_line() {
        let out = "linux-image-amd64\n  Depends: linux-image-6.1.0-57-amd64\n";
        assert_eq!(
            kernel_dependency(out).as_deref(),
            Some("linux-image-6.1.0-57-amd64")
        );
        assert_eq!(kernel_dependency("linux-image-amd64\n"), None);
        let alt = "linux-image-amd64\n |Depends: linux-image-6.12.0-1-amd64\n";
        assert_eq!(
            kernel_dependency(alt).as_deref(),
            Some("linux-image-6.12.0-1-amd64")
        );
    }

    #[test]
    fn module_depends_reads_the_modinfo_field() {
        let ko =
            b"\x7fELF...\0license=GPL\0depends=virtio_ring,virtio,net-failover\0name=virtio_net\0";
        assert_eq!(
            module_depends(ko),
            ["virtio_ring", "virtio", "net_failover"]
        );
        assert!(module_depends(b"\0depends=\0name=e1000\0").is_empty());
        assert!(module_depends(b"no modinfo here").is_empty());
    }

    #[test]
    fn load_order_puts_dependencies_first_and_skips_builtins() {
        let dir = std::env::temp_dir().join(format!("pxe-guest-order-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("temp dir");
        let write = |name: &str, deps: &str| {
            let path = dir.join(format!("{name}.ko"));
            fs::write(&path, format!("\0depends={deps}\0name={name}\0")).expect("write");
            (name.to_owned(), path)
        };
        let available: BTreeMap<String, PathBuf> = [
            write("virtio_ring", ""),
            write("virtio", "virtio_ring"),
            write("failover", ""),
            write("net_failover", "failover"),
            write(
                "virtio_net",
                "virtio_ring,virtio,net_failover,builtin_thing",
            ),
        ]
        .into_iter()
        .collect();
        let order = load_order(&["virtio_net"], &available).expect("order");
        assert_eq!(
            order,
            [
                "virtio_ring",
                "virtio",
                "failover",
                "net_failover",
                "virtio_net"
            ]
        );
        assert!(load_order(&["missing"], &available).is_err());
        let _ = fs::remove_dir_all(&dir);
    }
}

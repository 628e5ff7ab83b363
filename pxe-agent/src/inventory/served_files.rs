//! The files an inventory names on the agent's own servers: TFTP boot
//! files, which the boot root holds, and the `http://{server}…` URLs of
//! boot files, kernels and initrds, which the boot root or the artifacts
//! directory (`/artifacts/…`) hold. For `check --boot-root --artifacts`
//! and the warning of an agent started without a boot root. Names with a
//! placeholder in their path, and URLs of other servers, are not checked.

use std::path::{Path, PathBuf};

use super::{BootFiles, Inventory};

/// Which directory a named file is served from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Root {
    /// `--boot-root`: TFTP, and HTTP paths outside `/artifacts/`.
    Boot,
    /// `--artifacts`: HTTP `/artifacts/…`.
    Artifacts,
}

/// One file the inventory names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    /// Where: `profiles[worker].boot.bios`.
    pub field: String,
    pub root: Root,
    /// Relative to the root.
    pub path: String,
    /// Fetched over TFTP.
    pub tftp: bool,
}

/// Every file of the agent's own the profiles name, in profile order.
pub fn named(inv: &Inventory) -> Vec<Named> {
    let mut out = Vec::new();
    for profile in &inv.profiles {
        let at = |field: &str| format!("profiles[{}].{field}", profile.name);
        if let Some(boot) = &profile.boot {
            boot_files(boot, &at("boot"), &mut out);
        }
        for (i, rule) in profile.rules.iter().enumerate() {
            boot_files(&rule.boot, &at(&format!("rules[{i}].boot")), &mut out);
        }
        if let Some(kernel) = &profile.kernel {
            out.extend(url(kernel, at("kernel")));
        }
        for (i, initrd) in profile.initrd.iter().enumerate() {
            out.extend(url(initrd, at(&format!("initrd[{i}]"))));
        }
    }
    out
}

fn boot_files(boot: &BootFiles, at: &str, out: &mut Vec<Named>) {
    for (key, name) in [
        ("bios", &boot.bios),
        ("uefi", &boot.uefi),
        ("uefi_arm64", &boot.uefi_arm64),
    ] {
        if let Some(name) = name.as_deref().filter(|n| !n.contains('{')) {
            out.push(Named {
                field: format!("{at}.{key}"),
                root: Root::Boot,
                path: name.trim_start_matches('/').to_owned(),
                tftp: true,
            });
        }
    }
    for (key, link) in [
        ("http", &boot.http),
        ("http_arm64", &boot.http_arm64),
        ("http_ia32", &boot.http_ia32),
    ] {
        if let Some(link) = link {
            out.extend(url(link, format!("{at}.{key}")));
        }
    }
}

/// The file an `http://{server}[:port]/path` URL names, if it is one of
/// the agent's with no placeholder in its path.
fn url(link: &str, field: String) -> Option<Named> {
    let rest = link
        .strip_prefix("http://")
        .or_else(|| link.strip_prefix("https://"))?;
    let (host, path) = rest.split_once('/')?;
    if !host.starts_with("{server}") {
        return None;
    }
    let path = path.split(['?', '#']).next().unwrap_or_default();
    if path.is_empty() || path.contains('{') || path.starts_with("boot/") {
        // `/boot/…` is the agent's rendered iPXE scripts.
        return None;
    }
    let (root, path) = match path.strip_prefix("artifacts/") {
        Some(rest) => (Root::Artifacts, rest),
        None => (Root::Boot, path),
    };
    Some(Named {
        field,
        root,
        path: path.to_owned(),
        tftp: false,
    })
}

/// The named files missing under the directories given, each as a line
/// naming the field and the path looked for; a root not given is not
/// checked.
pub fn missing(named: &[Named], boot_root: Option<&Path>, artifacts: Option<&Path>) -> Vec<String> {
    let mut out = Vec::new();
    for file in named {
        let dir = match file.root {
            Root::Boot => boot_root,
            Root::Artifacts => artifacts,
        };
        let Some(dir) = dir else { continue };
        let path: PathBuf = dir.join(&file.path);
        if !path.is_file() {
            out.push(format!("{}: {} is not a file", file.field, path.display()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_the_agent_name_boot_root_or_artifact_files() {
        let named = |link: &str| url(link, "f".into()).map(|n| (n.root, n.path));
        assert_eq!(
            named("http://{server}:8080/artifacts/k/vmlinuz?x=1"),
            Some((Root::Artifacts, "k/vmlinuz".into()))
        );
        assert_eq!(
            named("http://{server}/ipxe.efi"),
            Some((Root::Boot, "ipxe.efi".into()))
        );
        assert_eq!(named("http://10.0.0.1/ipxe.efi"), None);
        assert_eq!(named("http://{server}:8080/artifacts/{mac}.img"), None);
        assert_eq!(named("http://{server}:8080/boot/{mac}.ipxe"), None);
    }
}

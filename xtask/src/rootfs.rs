//! The runtime image without a registry: a Debian bookworm root that
//! mmdebstrap builds from Debian's packages (the machine's own apt mirror),
//! with the iPXE binaries copied into the boot root and the agent binary
//! added, as a root tarball that `podman import` turns into an image with
//! [`image_changes`] (the Containerfile's ENTRYPOINT, CMD, USER and LABELs).
//!
//! This module is the source of truth for what the runtime stage of the
//! `Containerfile` repeats (packages, iPXE binaries, boot root, agent path,
//! image configuration); a unit test of `cargo xtask image` checks that the
//! two agree. It does not run containers.
//!
//! Roots are cached under `<target dir>/image/`: the Debian root is keyed by
//! its recipe (suite, packages, mirrors, iPXE binaries), the image tarball
//! by that key and the agent binary's hash. Delete the directory to pick up
//! newer Debian packages.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

use crate::process::{self, run_forwarded};

/// The Debian release of the runtime root; the agent is built on the same
/// release, so its glibc matches.
pub const SUITE: &str = "bookworm";
/// Packages on top of the minbase variant.
pub const PACKAGES: &[&str] = &["ipxe", "ca-certificates"];
/// Where Debian's ipxe package installs its binaries.
pub const IPXE_DIR: &str = "/usr/lib/ipxe";
/// The iPXE binaries copied into [`BOOT_ROOT`]: undionly.kpxe (BIOS PXE),
/// ipxe.efi and snponly.efi (UEFI x64), ipxe.pxe and undionly.kkpxe.
pub const IPXE_FILES: &[&str] = &[
    "undionly.kpxe",
    "undionly.kkpxe",
    "ipxe.pxe",
    "ipxe.efi",
    "snponly.efi",
];
/// The boot root inside the image, the DaemonSet's `--boot-root`.
pub const BOOT_ROOT: &str = "/usr/share/pxe-agent/boot";
/// The agent binary inside the image.
pub const AGENT_PATH: &str = "/usr/local/bin/pxe-agent";
/// `ENTRYPOINT` and `CMD` in exec form, and `USER`.
pub const ENTRYPOINT: &str = r#"["/usr/local/bin/pxe-agent"]"#;
pub const CMD: &str = r#"["--help"]"#;
pub const USER: &str = "0";
/// The image's labels (OCI annotation keys).
pub const LABELS: &[(&str, &str)] = &[
    ("org.opencontainers.image.title", "pxe-agent"),
    (
        "org.opencontainers.image.description",
        "XDP-accelerated network-boot responder for bare-metal fleets",
    ),
    (
        "org.opencontainers.image.licenses",
        "MIT OR Apache-2.0 (eBPF: MIT OR GPL-2.0)",
    ),
];

/// Bump when the recipe changes in a way the key does not see.
const RECIPE: u32 = 1;
/// Files dpkg leaves out, as Debian's slim images do; copyright files stay.
const DPKG_PATHS: &[&str] = &[
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
];
const APT_SOURCES: &str = "/etc/apt/sources.list";
const APT_SOURCES_DIR: &str = "/etc/apt/sources.list.d";

/// The `--change` instructions of `podman import` that give the image the
/// Containerfile's configuration.
pub fn image_changes() -> Vec<String> {
    let mut changes = vec![
        format!("ENTRYPOINT {ENTRYPOINT}"),
        format!("CMD {CMD}"),
        format!("USER {USER}"),
    ];
    changes.extend(
        LABELS
            .iter()
            .map(|(key, value)| format!("LABEL {key}=\"{value}\"")),
    );
    changes
}

/// The image's root as a tarball: the cached Debian root plus `agent`
/// (without its debug info) at [`AGENT_PATH`]. Builds what is not cached;
/// needs root, mmdebstrap and binutils.
pub fn build(agent: &Path) -> anyhow::Result<PathBuf> {
    let dir = crate::target_dir().join("image");
    fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let base = debian_root(&dir)?;
    let base_key = key_of(&base, "base-");
    let agent_key = &sha256_file(agent)?[..16];
    let image = dir.join(format!("pxe-agent-{base_key}-{agent_key}.tar"));
    if image.exists() {
        println!("image: root cached at {}", image.display());
        return Ok(image);
    }
    remove_stale(&dir, "pxe-agent-", &image)?;
    // Without debug info, as a release build is: a debug build's is most
    // of its size.
    let stage = dir.join("stage");
    fs::create_dir_all(&stage)?;
    let stripped = stage.join("pxe-agent");
    process::run(
        Command::new("strip")
            .arg("--strip-debug")
            .arg("-o")
            .arg(&stripped)
            .arg(agent),
    )
    .with_context(|| format!("failed to strip {} (binutils)", agent.display()))?;
    let tmp = image.with_extension("tar.tmp");
    fs::copy(&base, &tmp).with_context(|| format!("failed to copy {}", base.display()))?;
    // The binary is renamed to its place in the image as it is appended.
    let member = format!("s,^.*$,.{AGENT_PATH},");
    process::run(
        Command::new("tar")
            .args(["--append", "--file"])
            .arg(&tmp)
            .args(["--owner=0", "--group=0", "--numeric-owner", "--mode=0755"])
            .args(["--transform", &member, "-C"])
            .arg(&stage)
            .arg("pxe-agent"),
    )
    .context("failed to add the agent to the image root")?;
    fs::remove_dir_all(&stage)?;
    fs::rename(&tmp, &image)?;
    println!("image: root written to {}", image.display());
    Ok(image)
}

/// The cached Debian root for the current recipe, built by mmdebstrap when
/// missing.
fn debian_root(dir: &Path) -> anyhow::Result<PathBuf> {
    let mirrors = debian_mirrors()?;
    let recipe = format!(
        "{RECIPE}\n{SUITE}\n{PACKAGES:?}\n{mirrors:?}\n{IPXE_FILES:?}\n{BOOT_ROOT}\n{DPKG_PATHS:?}"
    );
    let key = &sha256_bytes(recipe.as_bytes())?[..16];
    let base = dir.join(format!("base-{key}.tar"));
    if base.exists() {
        return Ok(base);
    }
    remove_stale(dir, "base-", &base)?;
    process::ensure_root().context("mmdebstrap builds the image root as root")?;
    println!(
        "image: building the Debian {SUITE} root with mmdebstrap from {}",
        mirrors.join(", ")
    );
    let tmp = base.with_extension("tar.tmp");
    let copy_ipxe = format!(
        "mkdir -p \"$1{BOOT_ROOT}\" && cp {} \"$1{BOOT_ROOT}/\"",
        IPXE_FILES
            .iter()
            .map(|f| format!("\"$1{IPXE_DIR}/{f}\""))
            .collect::<Vec<_>>()
            .join(" ")
    );
    // The chroot on a tmpfs: on the disk, unpacking and removing it made
    // the build take twice as long.
    let scratch = Tmpfs::mount(&dir.join("build-tmp"))?;
    let mut cmd = Command::new("mmdebstrap");
    cmd.env("TMPDIR", &scratch.0)
        .args(["--variant=minbase", "--format=tar"])
        .arg(format!("--include={}", PACKAGES.join(",")))
        .arg("--aptopt=APT::Install-Recommends \"false\"")
        .args(DPKG_PATHS.iter().map(|p| format!("--dpkgopt={p}")))
        // Copies, not symlinks: the agent's servers follow no link out of
        // the boot root.
        .arg(format!("--customize-hook={copy_ipxe}"))
        .arg(SUITE)
        .arg(&tmp)
        .args(&mirrors);
    run_forwarded(&mut cmd).context("mmdebstrap failed (install it: `cargo xtask setup`)")?;
    drop(scratch);
    fs::rename(&tmp, &base)?;
    Ok(base)
}

/// A tmpfs mounted at a directory made for it; unmounted and removed on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path) -> anyhow::Result<Tmpfs> {
        // A mount left by a killed build.
        let _ = Command::new("umount").arg("-l").arg(dir).output();
        fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
        process::run(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=4g,mode=0700", "tmpfs"])
                .arg(dir),
        )
        .with_context(|| format!("failed to mount a tmpfs at {}", dir.display()))?;
        Ok(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
        let _ = fs::remove_dir(&self.0);
    }
}

/// `deb URI SUITE main` lines for the release, its updates and its
/// security suite, from the first source of each in the machine's apt
/// configuration.
fn debian_mirrors() -> anyhow::Result<Vec<String>> {
    let mut texts = Vec::new();
    if let Ok(text) = fs::read_to_string(APT_SOURCES) {
        texts.push((false, text));
    }
    if let Ok(entries) = fs::read_dir(APT_SOURCES_DIR) {
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
        paths.sort();
        for path in paths {
            let deb822 = path.extension().is_some_and(|e| e == "sources");
            if !deb822 && path.extension().is_none_or(|e| e != "list") {
                continue;
            }
            texts.push((deb822, fs::read_to_string(&path)?));
        }
    }
    let sources: Vec<(String, String)> = texts
        .iter()
        .flat_map(|(deb822, text)| {
            if *deb822 {
                parse_deb822(text)
            } else {
                parse_one_line(text)
            }
        })
        .collect();
    let lines = mirror_lines(&sources);
    if lines.is_empty() {
        bail!(
            "no apt source for Debian {SUITE} in {APT_SOURCES} or {APT_SOURCES_DIR}: \
             mmdebstrap takes the machine's mirror"
        );
    }
    Ok(lines)
}

/// One `deb URI SUITE main` line per suite of the release, from the first
/// source naming it; none unless the release itself has a source.
fn mirror_lines(sources: &[(String, String)]) -> Vec<String> {
    let suites = [
        SUITE.to_owned(),
        format!("{SUITE}-updates"),
        format!("{SUITE}-security"),
    ];
    if !sources.iter().any(|(_, suite)| *suite == SUITE) {
        return Vec::new();
    }
    suites
        .iter()
        .filter_map(|wanted| {
            let (uri, _) = sources.iter().find(|(_, suite)| suite == wanted)?;
            Some(format!("deb {uri} {wanted} main"))
        })
        .collect()
}

/// (URI, suite) of each enabled binary source of a deb822 `.sources` file.
fn parse_deb822(text: &str) -> Vec<(String, String)> {
    let mut sources = Vec::new();
    let paragraphs = text.split("\n\n");
    for paragraph in paragraphs {
        let field = |name: &str| {
            paragraph
                .lines()
                .filter(|l| !l.starts_with('#'))
                .find_map(|l| {
                    let (key, value) = l.split_once(':')?;
                    key.trim()
                        .eq_ignore_ascii_case(name)
                        .then(|| value.trim().to_owned())
                })
                .unwrap_or_default()
        };
        let binary = field("Types").split_whitespace().any(|t| t == "deb");
        if !binary || field("Enabled").eq_ignore_ascii_case("no") {
            continue;
        }
        for uri in field("URIs").split_whitespace() {
            for suite in field("Suites").split_whitespace() {
                sources.push((uri.to_owned(), suite.to_owned()));
            }
        }
    }
    sources
}

/// (URI, suite) of each `deb [options] URI SUITE COMPONENTS` line.
fn parse_one_line(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("deb ")?.trim_start();
            // Options in brackets hold no spaces around '=' but may hold
            // several words.
            let rest = match rest.strip_prefix('[') {
                Some(options) => options.split_once(']')?.1,
                None => rest,
            };
            let mut words = rest.split_whitespace();
            Some((words.next()?.to_owned(), words.next()?.to_owned()))
        })
        .collect()
}

/// The key in a cached file's name `<prefix><key>.tar`.
fn key_of<'a>(path: &'a Path, prefix: &str) -> &'a str {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix(prefix)?.strip_suffix(".tar"))
        .unwrap_or_default()
}

/// Removes the other `<prefix>*` files of `dir`: older roots.
fn remove_stale(dir: &Path, prefix: &str, keep: &Path) -> anyhow::Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let stale = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(prefix));
        if stale && path != keep {
            fs::remove_file(&path)
                .with_context(|| format!("failed to remove {}", path.display()))?;
        }
    }
    Ok(())
}

/// The hex SHA-256 of a file (coreutils' sha256sum).
fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let out = process::run(Command::new("sha256sum").arg(path))?;
    first_word(&out)
}

fn sha256_bytes(bytes: &[u8]) -> anyhow::Result<String> {
    use std::io::Write as _;
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("failed to run sha256sum")?;
    child
        .stdin
        .take()
        .context("sha256sum has no stdin")?
        .write_all(bytes)?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("sha256sum failed: {}", out.status);
    }
    first_word(&String::from_utf8_lossy(&out.stdout))
}

fn first_word(text: &str) -> anyhow::Result<String> {
    text.split_whitespace()
        .next()
        .map(str::to_owned)
        .context("sha256sum printed nothing")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(u, s)| ((*u).to_owned(), (*s).to_owned()))
            .collect()
    }

    #[test]
    fn deb822_sources_give_each_uri_and_suite_of_binary_entries() {
        let text = "Types: deb\n# a comment\nURIs: http://deb.debian.org/debian\n\
                    Suites: bookworm bookworm-updates\nComponents: main\n\n\
                    Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n\
                    Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n\n\
                    Types: deb\nURIs: http://deb.debian.org/debian-security\n\
                    Suites: bookworm-security\nComponents: main\n";
        assert_eq!(
            parse_deb822(text),
            pairs(&[
                ("http://deb.debian.org/debian", "bookworm"),
                ("http://deb.debian.org/debian", "bookworm-updates"),
                ("http://deb.debian.org/debian-security", "bookworm-security"),
            ])
        );
    }

    #[test]
    fn one_line_sources_skip_options_and_source_lines() {
        let text = "# deb http://commented.example/debian bookworm main\n\
                    deb [arch=amd64 signed-by=/k.gpg] http://m.example/debian bookworm main\n\
                    deb-src http://m.example/debian bookworm main\n\
                    deb https://packages.example/apt cloud-sdk-bookworm main\n";
        assert_eq!(
            parse_one_line(text),
            pairs(&[
                ("http://m.example/debian", "bookworm"),
                ("https://packages.example/apt", "cloud-sdk-bookworm"),
            ])
        );
    }

    #[test]
    fn mirrors_are_the_first_source_of_each_suite_of_the_release() {
        let sources = pairs(&[
            ("https://packages.example/apt", "cloud-sdk-bookworm"),
            ("http://a.example/debian", "bookworm"),
            ("http://b.example/debian", "bookworm"),
            ("http://a.example/debian-security", "bookworm-security"),
        ]);
        assert_eq!(
            mirror_lines(&sources),
            [
                "deb http://a.example/debian bookworm main",
                "deb http://a.example/debian-security bookworm-security main",
            ]
        );
        let elsewhere = pairs(&[("http://a.example/debian", "trixie")]);
        assert!(mirror_lines(&elsewhere).is_empty());
    }

    #[test]
    fn changes_set_the_entrypoint_cmd_user_and_each_label() {
        let changes = image_changes();
        assert_eq!(changes[0], r#"ENTRYPOINT ["/usr/local/bin/pxe-agent"]"#);
        assert!(ENTRYPOINT.contains(AGENT_PATH));
        assert_eq!(changes.len(), 3 + LABELS.len());
        assert_eq!(
            changes[3],
            r#"LABEL org.opencontainers.image.title="pxe-agent""#
        );
    }
}

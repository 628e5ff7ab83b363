//! `cargo xtask image [--tag T]`: builds the container image from the
//! repository's `Containerfile` with the first usable builder on PATH
//! (docker, podman or buildah), and says so clearly when there is none: the
//! Containerfile then builds anywhere one is.
//!
//! `cargo xtask image --rootfs` needs no registry: it builds the agent here
//! (release), puts it on a Debian root made by mmdebstrap from the
//! machine's apt mirror ([`xtask::rootfs`]) and imports that with podman,
//! configured as the Containerfile configures its image.
//!
//! It does not push, and it installs no builder (`cargo xtask setup`
//! installs mmdebstrap and podman).

use std::{
    env,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use xtask::{
    process::{self, run_forwarded},
    rootfs, setup, target_dir, workspace_root,
};

/// The builders tried, in this order.
const BUILDERS: &[&str] = &["docker", "podman", "buildah"];

#[derive(Debug, clap::Args)]
pub struct Options {
    /// Image name and tag; default pxe-agent:<pxe-agent's crate version>,
    /// the tag deploy/base sets.
    #[arg(long)]
    pub tag: Option<String>,
    /// Without a registry or a builder: the agent built here on a Debian
    /// root from mmdebstrap, imported into podman's storage (root).
    #[arg(long)]
    pub rootfs: bool,
}

pub fn run(opts: Options) -> anyhow::Result<()> {
    let root = workspace_root();
    let tag = match opts.tag {
        Some(tag) => tag,
        None => format!("pxe-agent:{}", crate_version(&root)?),
    };
    if opts.rootfs {
        return import_rootfs(&root, &tag);
    }
    let mut unusable = Vec::new();
    for name in BUILDERS {
        let Some(path) = find_on_path(name, env::var_os("PATH").as_deref()) else {
            continue;
        };
        if let Err(why) = usable(name, &path) {
            println!("image: {name} at {} is not usable: {why}", path.display());
            unusable.push(format!("{name} ({why})"));
            continue;
        }
        println!("image: building {tag} with {}", path.display());
        run_forwarded(
            Command::new(&path)
                .current_dir(&root)
                .args(build_args(&tag)),
        )
        .with_context(|| format!("{name} failed to build {tag}"))?;
        println!("image: built {tag}");
        return Ok(());
    }
    bail!("{}", no_builder_message(&unusable))
}

/// Builds the release agent and the image root around it, and imports the
/// root into podman's storage as `tag`.
fn import_rootfs(root: &Path, tag: &str) -> anyhow::Result<()> {
    process::ensure_root().context("`image --rootfs` runs mmdebstrap and podman as root")?;
    run_forwarded(setup::command("cargo").current_dir(root).args([
        "build",
        "--release",
        "--locked",
        "-p",
        "pxe-agent",
    ]))
    .context("failed to build pxe-agent")?;
    let tarball = rootfs::build(&target_dir().join("release").join("pxe-agent"))?;
    let mut import = Command::new("podman");
    import.arg("import");
    for change in rootfs::image_changes() {
        import.arg("--change").arg(change);
    }
    run_forwarded(import.arg(&tarball).arg(tag))
        .with_context(|| format!("podman failed to import {}", tarball.display()))?;
    println!(
        "image: imported {tag} into podman's storage; for a cluster's runtime: \
         podman save --format oci-archive -o pxe-agent.tar {tag}"
    );
    Ok(())
}

/// `docker build`, `podman build` and `buildah build` take the same
/// arguments.
fn build_args(tag: &str) -> Vec<String> {
    ["build", "-f", "Containerfile", "-t", tag, "."]
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// podman and buildah need no daemon; the docker CLI is only usable when
/// its daemon answers.
fn usable(name: &str, path: &Path) -> anyhow::Result<()> {
    if name == "docker" {
        process::run(Command::new(path).args(["version", "--format", "{{.Server.Version}}"]))
            .map_err(|_| anyhow::anyhow!("its daemon does not answer"))?;
    }
    Ok(())
}

fn no_builder_message(unusable: &[String]) -> String {
    let mut message = format!(
        "no container builder found: `cargo xtask image` needs one of {} on PATH",
        BUILDERS.join(", ")
    );
    if !unusable.is_empty() {
        message.push_str(&format!(" (found but unusable: {})", unusable.join(", ")));
    }
    message.push_str(
        "; install one, or build the Containerfile at the repository root wherever one \
         is (e.g. `podman build -f Containerfile -t pxe-agent:TAG .`)",
    );
    message
}

/// The first executable file called `name` in the directories of `path`.
fn find_on_path(name: &str, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    env::split_paths(path?)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            candidate
                .metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// `version` of pxe-agent/Cargo.toml's `[package]`.
fn crate_version(root: &Path) -> anyhow::Result<String> {
    let manifest = root.join("pxe-agent").join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("failed to read {}", manifest.display()))?;
    text.lines()
        .find_map(|line| {
            let value = line
                .strip_prefix("version")?
                .trim_start()
                .strip_prefix('=')?;
            Some(value.trim().trim_matches('"').to_owned())
        })
        .with_context(|| format!("no version in {}", manifest.display()))
}

#[cfg(test)]
mod tests {
    use std::{ffi::OsString, fs};

    use super::*;

    #[test]
    fn builders_are_found_only_as_executables_on_path() {
        let dir = env::temp_dir().join(format!("xtask-image-{}", std::process::id()));
        let (empty, bin) = (dir.join("empty"), dir.join("bin"));
        fs::create_dir_all(&empty).unwrap();
        fs::create_dir_all(&bin).unwrap();
        fs::write(bin.join("podman"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(bin.join("podman"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(bin.join("buildah"), "not executable").unwrap();
        let path: OsString = env::join_paths([&empty, &bin]).unwrap();
        assert_eq!(
            find_on_path("podman", Some(&path)),
            Some(bin.join("podman"))
        );
        assert_eq!(find_on_path("buildah", Some(&path)), None);
        assert_eq!(find_on_path("docker", Some(&path)), None);
        assert_eq!(find_on_path("podman", None), None);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn without_a_builder_the_message_names_all_three_and_the_containerfile() {
        let message = no_builder_message(&["docker (its daemon does not answer)".to_owned()]);
        for word in [
            "docker",
            "podman",
            "buildah",
            "Containerfile",
            "daemon does not answer",
        ] {
            assert!(message.contains(word), "{message}");
        }
    }

    /// The Containerfile repeats two facts kept elsewhere: the bpf-linker
    /// version of setup, and the boot root the DaemonSet passes.
    #[test]
    fn the_containerfile_agrees_with_setup_and_the_daemonset() {
        let root = workspace_root();
        let containerfile = fs::read_to_string(root.join("Containerfile")).unwrap();
        let pin = format!(
            "ARG BPF_LINKER_VERSION={}",
            xtask::setup::BPF_LINKER_VERSION
        );
        assert!(containerfile.contains(&pin), "Containerfile lacks {pin:?}");
        let daemonset = fs::read_to_string(root.join("deploy/base/daemonset.yaml")).unwrap();
        let boot_root = daemonset
            .lines()
            .find_map(|line| line.trim().strip_prefix("- --boot-root="))
            .expect("the DaemonSet passes --boot-root");
        assert!(
            containerfile.contains(&format!("install -d {boot_root}"))
                && containerfile.contains(&format!("{boot_root}/")),
            "the Containerfile does not fill the DaemonSet's boot root {boot_root}"
        );
    }

    /// The runtime stage installs, copies and configures what
    /// `image --rootfs` assembles (xtask::rootfs).
    #[test]
    fn the_containerfile_runtime_stage_is_the_rootfs_recipe() {
        let containerfile = fs::read_to_string(workspace_root().join("Containerfile")).unwrap();
        let runtime = containerfile
            .split("# --- runtime")
            .nth(1)
            .expect("a runtime stage");
        let mut expected = vec![
            format!("FROM docker.io/library/debian:{}-slim", rootfs::SUITE),
            format!(
                "apt-get install -y --no-install-recommends {}",
                rootfs::PACKAGES.join(" ")
            ),
            format!("install -d {}", rootfs::BOOT_ROOT),
            format!("COPY --from=build /out/pxe-agent {}", rootfs::AGENT_PATH),
            format!("ENTRYPOINT {}", rootfs::ENTRYPOINT),
            format!("CMD {}", rootfs::CMD),
            format!("USER {}", rootfs::USER),
            format!("{}/\n", rootfs::BOOT_ROOT),
        ];
        expected.extend(
            rootfs::LABELS
                .iter()
                .map(|(key, value)| format!("{key}=\"{value}\"")),
        );
        expected.extend(
            rootfs::IPXE_FILES
                .iter()
                .map(|f| format!("{}/{f} ", rootfs::IPXE_DIR)),
        );
        for line in &expected {
            assert!(
                runtime.contains(line.as_str()),
                "runtime stage lacks {line:?}"
            );
        }
        assert_eq!(
            runtime.matches(&format!("{}/", rootfs::IPXE_DIR)).count(),
            rootfs::IPXE_FILES.len(),
            "the runtime stage copies other iPXE binaries than rootfs::IPXE_FILES"
        );
        assert_eq!(
            runtime.matches("org.opencontainers.image.").count(),
            rootfs::LABELS.len(),
            "the runtime stage has other labels than rootfs::LABELS"
        );
    }

    #[test]
    fn the_default_tag_is_the_crate_version() {
        let version = crate_version(&workspace_root()).unwrap();
        assert!(version.split('.').count() == 3, "{version}");
        let base =
            fs::read_to_string(workspace_root().join("deploy/base/kustomization.yaml")).unwrap();
        assert!(
            base.contains(&format!("newTag: \"{version}\"")),
            "deploy/base sets another tag than pxe-agent:{version}"
        );
    }
}

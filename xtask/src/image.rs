//! `cargo xtask image [--tag T]`: builds the container image from the
//! repository's `Containerfile` with the first usable builder on PATH
//! (docker, podman or buildah), and says so clearly when there is none: the
//! Containerfile then builds anywhere one is.
//!
//! It does not push, and it installs no builder.

use std::{
    env,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use xtask::{
    process::{self, run_forwarded},
    workspace_root,
};

/// The builders tried, in this order.
const BUILDERS: &[&str] = &["docker", "podman", "buildah"];

#[derive(Debug, clap::Args)]
pub struct Options {
    /// Image name and tag; default pxe-agent:<pxe-agent's crate version>,
    /// the tag deploy/base sets.
    #[arg(long)]
    pub tag: Option<String>,
}

pub fn run(opts: Options) -> anyhow::Result<()> {
    let root = workspace_root();
    let tag = match opts.tag {
        Some(tag) => tag,
        None => format!("pxe-agent:{}", crate_version(&root)?),
    };
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

//! A podman of the test's own (Debian's podman 4.3 with runc): storage,
//! run, temporary, network-configuration and runc state directories on a
//! tmpfs of its own, its own `containers.conf` (`CONTAINERS_CONF`) and its
//! own cgroup parent. The machine's podman storage is never used, and
//! nothing stays behind: on drop its containers are removed, then its
//! cgroups, then the tmpfs. The tmpfs also spares the disk: vfs storage
//! copies the image's root for each container, and deleting those files
//! took longer than the whole boot.
//!
//! It does not decide what runs in a container: see `image.rs`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

use crate::mount::Mount;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// The tmpfs holding storage and state: an image root is about 200 MB,
/// and vfs stores it once for the image and once per container.
const TMPFS_OPTIONS: &str = "size=2g,mode=0700";

/// Where cgroup file systems are mounted: v2 at the top, v1 (and a hybrid's
/// v2) one level below.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Written under `dir` and named by `CONTAINERS_CONF`, which replaces the
/// machine's containers.conf.
const CONTAINERS_CONF: &str = r#"[containers]
# No rlimits of podman's own: its default (nofile 1048576) is above the
# open-files hard limit a test may run under, and runc then fails.
default_ulimits = []
# Files under --root, not the journal.
log_driver = "k8s-file"

[engine]
events_logger = "file"
"#;

/// Machine directories podman 4.3 writes whatever `--root` says: its
/// blob-info cache (`podman import`) and runc's default state root. Those
/// absent before the engine was made are removed with it.
const MACHINE_DIRS: &[&str] = &["/var/lib/containers", "/run/runc"];

/// A scratch podman; see the module docs. Its tmpfs is unmounted after
/// [`Drop::drop`] has removed the containers.
pub struct Podman {
    tmpfs: Mount,
    cgroup_parent: String,
    /// [`MACHINE_DIRS`] that did not exist when the engine was made.
    absent: Vec<PathBuf>,
}

impl Podman {
    /// A fresh engine named after `name`; panics if podman does not run.
    pub fn new(name: &str) -> Podman {
        let unique = format!(
            "{name}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let tmpfs = Mount::new(&format!("podman-{name}"), "tmpfs", Some(TMPFS_OPTIONS));
        let dir = tmpfs.path();
        for sub in ["root", "runroot", "tmp", "net", "runc"] {
            fs::create_dir_all(dir.join(sub)).expect("podman scratch dir");
        }
        fs::write(dir.join("containers.conf"), CONTAINERS_CONF).expect("containers.conf");
        let absent = MACHINE_DIRS
            .iter()
            .map(PathBuf::from)
            .filter(|d| !d.exists())
            .collect();
        let podman = Podman {
            tmpfs,
            cgroup_parent: format!("/pxe-podman-{unique}"),
            absent,
        };
        let version = podman.run(&["version", "--format", "{{.Client.Version}}"]);
        eprintln!("podman {}", version.trim());
        podman
    }

    /// `podman` with this engine's directories, runtime and configuration.
    pub fn cmd(&self) -> Command {
        self.cmd_from(Command::new("podman"))
    }

    /// `podman` in network namespace `ns` (`/run/netns/<ns>`), so that
    /// `--network=host` is that namespace. Through `nsenter --net`, which
    /// leaves the mounts alone: `ip netns exec` remounts /sys, and with it
    /// go the cgroup file systems runc needs.
    pub fn cmd_in_netns(&self, ns: &str) -> Command {
        let mut nsenter = Command::new("nsenter");
        nsenter.arg(format!("--net=/run/netns/{ns}")).arg("podman");
        self.cmd_from(nsenter)
    }

    fn cmd_from(&self, mut cmd: Command) -> Command {
        let dir = |sub: &str| self.tmpfs.path().join(sub);
        cmd.env("CONTAINERS_CONF", dir("containers.conf"))
            .arg("--root")
            .arg(dir("root"))
            .arg("--runroot")
            .arg(dir("runroot"))
            .arg("--tmpdir")
            .arg(dir("tmp"))
            .arg("--network-config-dir")
            .arg(dir("net"))
            // vfs: plain directories, no overlay mounts to undo.
            .args(["--storage-driver", "vfs"])
            // runc, with cgroups written directly (no systemd to ask).
            .args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"])
            .arg("--runtime-flag")
            .arg(format!("root={}", dir("runc").display()));
        cmd
    }

    /// The `--cgroup-parent` of this engine's containers, removed on drop.
    pub fn cgroup_parent(&self) -> &str {
        &self.cgroup_parent
    }

    /// Runs `podman <args>` to completion; panics with its stderr if it
    /// fails, returns its stdout.
    pub fn run(&self, args: &[&str]) -> String {
        let out = self
            .cmd()
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("podman is not installed (`cargo xtask setup`): {e}"));
        assert!(
            out.status.success(),
            "podman {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `podman import` of a root tarball as `tag`, with `changes` (`--change`).
    pub fn import(&self, tarball: &Path, tag: &str, changes: &[String]) {
        let mut args = vec!["import"];
        for change in changes {
            args.extend(["--change", change.as_str()]);
        }
        let tarball = tarball.to_str().expect("utf-8 path");
        args.extend([tarball, tag]);
        self.run(&args);
    }

    /// Removes the cgroup directory `cgroup_parent` in every hierarchy,
    /// innermost first: on a hybrid v1/v2 machine the container's and
    /// conmon's cgroups stay after `podman rm`.
    fn remove_cgroups(&self) {
        let relative = self.cgroup_parent.trim_start_matches('/');
        let mut roots = vec![PathBuf::from(CGROUP_ROOT)];
        if let Ok(entries) = fs::read_dir(CGROUP_ROOT) {
            roots.extend(entries.filter_map(|e| Some(e.ok()?.path())));
        }
        for root in roots {
            let dir = root.join(relative);
            if dir.is_dir()
                && let Err(err) = remove_cgroup_tree(&dir)
            {
                eprintln!("warning: cgroup {} stays: {err}", dir.display());
            }
        }
    }
}

/// rmdir of a cgroup and of the cgroups below it (their files go with them).
fn remove_cgroup_tree(dir: &Path) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            remove_cgroup_tree(&entry.path())?;
        }
    }
    fs::remove_dir(dir)
}

impl Drop for Podman {
    fn drop(&mut self) {
        match self
            .cmd()
            .args(["rm", "--all", "--force", "--time", "5"])
            .output()
        {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "warning: podman rm: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(err) => eprintln!("warning: podman rm: {err}"),
        }
        self.remove_cgroups();
        for dir in &self.absent {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

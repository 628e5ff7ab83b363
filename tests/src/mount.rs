//! Filesystems a test mounts at a scratch directory of its own (bpffs for
//! pinned programs, a small tmpfs for a state directory that fills up) and
//! unmounts on drop; never a mount point of the machine's.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A fresh mount of `fstype` at a directory made for it, so tests running
/// at once never share one; lazily unmounted and removed on drop.
pub struct Mount {
    dir: PathBuf,
}

impl Mount {
    /// Mounts `fstype` (with `options`, as `mount -o` takes them) at a new
    /// directory named after `name`; panics with mount's reason if it fails.
    pub fn new(name: &str, fstype: &str, options: Option<&str>) -> Mount {
        let dir = std::env::temp_dir().join(format!(
            "pxe-{fstype}-{name}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).expect("mount point");
        let mut cmd = Command::new("mount");
        cmd.args(["-t", fstype]);
        if let Some(options) = options {
            cmd.args(["-o", options]);
        }
        let out = cmd.arg(fstype).arg(&dir).output().expect("run mount");
        assert!(
            out.status.success(),
            "mount -t {fstype} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Mount { dir }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = fs::remove_dir(&self.dir);
    }
}

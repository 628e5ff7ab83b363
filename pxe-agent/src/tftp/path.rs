//! The root jail: turns a requested file name into an open regular file
//! beneath the served directory, or a refusal with the TFTP error code to
//! send. It owns the name rules and the filesystem checks; it never reads
//! file contents.
//!
//! Rules, in order:
//! - names longer than [`MAX_NAME`] bytes, or holding a NUL byte, are refused;
//! - `\` counts as `/` (some PXE firmwares send DOS-style paths);
//! - leading `/` are stripped: absolute names are taken relative to the root,
//!   as PXE firmwares send `/undionly.kpxe` as readily as `undionly.kpxe`;
//! - empty and `.` components are skipped; any `..` component is refused,
//!   even one that would stay inside the root;
//! - the path is canonicalized (symlinks resolved) and must stay beneath the
//!   canonical root: a symlink is followed only when its target is inside;
//! - the canonical, symlink-free path is then opened with `openat2(2)`
//!   relative to the root's descriptor with `RESOLVE_BENEATH |
//!   RESOLVE_NO_SYMLINKS`, so a symlink swapped in after the check fails the
//!   open instead of escaping;
//! - only regular files are served (checked before and after the open;
//!   `O_NONBLOCK` keeps a FIFO from blocking the open).

use std::{
    ffi::{CString, OsStr},
    fs::{self, File},
    io,
    os::{
        fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Path, PathBuf},
};

use super::packet::ErrorCode;

/// The longest file name accepted, in bytes.
pub const MAX_NAME: usize = 255;

/// Why the root directory cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    #[error("TFTP root {}: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error("TFTP root {} is not a directory", path.display())]
    NotDirectory { path: PathBuf },
    #[error("TFTP root {}: openat2(2) is not available (Linux 5.6 or later is needed): {source}", path.display())]
    Openat2 { path: PathBuf, source: io::Error },
}

/// Why a requested name is refused.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("empty file name")]
    Empty,
    #[error("file name longer than {MAX_NAME} bytes")]
    TooLong,
    #[error("file name contains a NUL byte")]
    Nul,
    #[error("file name has a `..` component")]
    Parent,
    #[error("{} not found", path.display())]
    NotFound { path: PathBuf },
    #[error("{} resolves outside the root", path.display())]
    Outside { path: PathBuf },
    #[error("{} is not a regular file", path.display())]
    NotRegular { path: PathBuf },
    #[error("{} is not readable: {source}", path.display())]
    Denied { path: PathBuf, source: io::Error },
    #[error("failed to open {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

impl PathError {
    /// The TFTP error code the client is sent (RFC 1350 appendix).
    pub fn code(&self) -> ErrorCode {
        match self {
            PathError::NotFound { .. } => ErrorCode::FileNotFound,
            PathError::Io { .. } => ErrorCode::NotDefined,
            PathError::Empty
            | PathError::TooLong
            | PathError::Nul
            | PathError::Parent
            | PathError::Outside { .. }
            | PathError::NotRegular { .. }
            | PathError::Denied { .. } => ErrorCode::AccessViolation,
        }
    }

    fn from_io(path: &Path, source: io::Error) -> PathError {
        let path = path.to_owned();
        match source.raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR) => PathError::NotFound { path },
            // EXDEV: RESOLVE_BENEATH refused; ELOOP: a symlink appeared on a
            // path checked to have none, or a symlink loop.
            Some(libc::EXDEV | libc::ELOOP) => PathError::Outside { path },
            Some(libc::EACCES | libc::EPERM) => PathError::Denied { path, source },
            _ => PathError::Io { path, source },
        }
    }
}

/// Applies the name rules (no filesystem access): the relative path to look
/// up beneath the root.
pub fn sanitize(name: &[u8]) -> Result<PathBuf, PathError> {
    if name.len() > MAX_NAME {
        return Err(PathError::TooLong);
    }
    if name.contains(&0) {
        return Err(PathError::Nul);
    }
    let mut rel = PathBuf::new();
    for part in name.split(|&b| b == b'/' || b == b'\\') {
        match part {
            b"" | b"." => {}
            b".." => return Err(PathError::Parent),
            part => rel.push(OsStr::from_bytes(part)),
        }
    }
    if rel.as_os_str().is_empty() {
        return Err(PathError::Empty);
    }
    Ok(rel)
}

/// The served directory.
#[derive(Debug)]
pub struct Root {
    /// Canonical path of the root.
    dir: PathBuf,
    /// `O_PATH` descriptor of the root, the anchor of every open.
    fd: OwnedFd,
}

/// A file opened for a transfer.
#[derive(Debug)]
pub struct Opened {
    pub file: File,
    pub size: u64,
    /// The path beneath the root, for logs.
    pub path: PathBuf,
}

impl Root {
    /// Opens `path` as the root; it must be a directory.
    pub fn open(path: &Path) -> Result<Root, RootError> {
        let open_err = |source| RootError::Open {
            path: path.to_owned(),
            source,
        };
        let dir = fs::canonicalize(path).map_err(open_err)?;
        if !fs::metadata(&dir).map_err(open_err)?.is_dir() {
            return Err(RootError::NotDirectory {
                path: path.to_owned(),
            });
        }
        let fd = File::open(&dir).map_err(open_err)?.into();
        let root = Root { dir, fd };
        // Fail at startup, not on the first request, where seccomp
        // profiles or old kernels lack openat2.
        openat2(
            root.fd.as_fd(),
            Path::new("."),
            libc::O_PATH | libc::O_DIRECTORY,
            libc::RESOLVE_BENEATH,
        )
        .map_err(|source| RootError::Openat2 {
            path: path.to_owned(),
            source,
        })?;
        Ok(root)
    }

    /// The canonical root directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Opens the regular file `name` names beneath the root. Blocking.
    pub fn open_file(&self, name: &[u8]) -> Result<Opened, PathError> {
        let rel = sanitize(name)?;
        let canonical =
            fs::canonicalize(self.dir.join(&rel)).map_err(|e| PathError::from_io(&rel, e))?;
        let inner = canonical
            .strip_prefix(&self.dir)
            .map_err(|_| PathError::Outside { path: rel.clone() })?
            .to_owned();
        let meta = fs::metadata(&canonical).map_err(|e| PathError::from_io(&rel, e))?;
        if inner.as_os_str().is_empty() || !meta.is_file() {
            return Err(PathError::NotRegular { path: rel });
        }
        let fd = openat2(
            self.fd.as_fd(),
            &inner,
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
        )
        .map_err(|e| PathError::from_io(&rel, e))?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| PathError::from_io(&rel, e))?;
        if !meta.is_file() {
            return Err(PathError::NotRegular { path: rel });
        }
        Ok(Opened {
            file,
            size: meta.len(),
            path: inner,
        })
    }
}

/// `openat2(2)` with `O_CLOEXEC` added to `flags`.
fn openat2(dir: BorrowedFd<'_>, path: &Path, flags: i32, resolve: u64) -> io::Result<OwnedFd> {
    let cpath = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: open_how is plain integers; all-zero is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = u64::from((flags | libc::O_CLOEXEC).cast_unsigned());
    how.resolve = resolve;
    loop {
        // SAFETY: valid dirfd, NUL-terminated path and an open_how of the
        // size passed; the kernel only reads them.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                cpath.as_ptr(),
                &raw const how,
                size_of::<libc::open_how>(),
            )
        };
        if rc >= 0 {
            let fd = i32::try_from(rc).map_err(io::Error::other)?;
            // SAFETY: the kernel returned a fresh descriptor we now own.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_taken_relative_to_the_root() {
        for (name, want) in [
            (&b"undionly.kpxe"[..], "undionly.kpxe"),
            (b"/undionly.kpxe", "undionly.kpxe"),
            (b"//efi//./ipxe.efi", "efi/ipxe.efi"),
            (b"\\boot\\x64\\ipxe.efi", "boot/x64/ipxe.efi"),
            (
                b"pxelinux.cfg/01-52-54-00-12-34-56",
                "pxelinux.cfg/01-52-54-00-12-34-56",
            ),
            (b"a..b/..c", "a..b/..c"),
        ] {
            assert_eq!(sanitize(name).ok(), Some(PathBuf::from(want)), "{name:?}");
        }
    }

    #[test]
    fn traversal_and_odd_names_are_refused() {
        for name in [
            &b"../etc/passwd"[..],
            b"a/../../x",
            b"a/..",
            b"/..",
            b"..\\..\\etc\\passwd",
            b"ok/../ok",
        ] {
            assert!(matches!(sanitize(name), Err(PathError::Parent)), "{name:?}");
        }
        assert!(matches!(sanitize(b"a\0b"), Err(PathError::Nul)));
        assert!(matches!(sanitize(b""), Err(PathError::Empty)));
        assert!(matches!(sanitize(b"/./"), Err(PathError::Empty)));
        assert!(matches!(sanitize(&[b'a'; 256]), Err(PathError::TooLong)));
        assert!(sanitize(&[b'a'; 255]).is_ok());
    }

    #[test]
    fn refusals_map_to_rfc1350_codes() {
        let p = || PathBuf::from("x");
        assert_eq!(
            PathError::NotFound { path: p() }.code(),
            ErrorCode::FileNotFound
        );
        assert_eq!(PathError::Parent.code(), ErrorCode::AccessViolation);
        assert_eq!(
            PathError::Outside { path: p() }.code(),
            ErrorCode::AccessViolation
        );
        assert_eq!(
            PathError::NotRegular { path: p() }.code(),
            ErrorCode::AccessViolation
        );
    }
}

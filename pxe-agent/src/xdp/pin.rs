//! The fast path's pins in bpffs (`--pin-dir DIR`): one directory per
//! interface, `DIR/<ifname>/`, holding the XDP link (`link`) and the maps
//! of the program that link runs, by their map names. While they are
//! pinned, the program keeps answering after the agent exits; the next
//! agent adopts them (see `loader::FastPath::start_pinned`), and
//! `pxe-agent detach` removes them.
//!
//! Owns the layout, the bpffs check, reading the pinned program, the
//! survey of what is pinned and still answering ([`survey`], for
//! `pxe-agent status` when no agent runs) and the removal; what is loaded
//! and attached is the loader's.

use std::{
    ffi::CString,
    io,
    os::{
        fd::{FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Path, PathBuf},
};

use aya_obj::generated::bpf_prog_info;
use pxe_ebpf_common::{
    BODIES_MAP, COUNTERS_MAP, EVENT_HEADS_MAP, EVENTS_MAP, HOSTS_MAP, TRACE_GATE_MAP, TRACE_MAP,
    TRACED_MAP,
};

/// `BPF_FS_MAGIC` (include/uapi/linux/magic.h).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Where the DaemonSet pins (`run --pin-dir`), and what the package's
/// defaults file suggests: where `pxe-agent status` looks unless told.
pub const DEFAULT_DIR: &str = "/sys/fs/bpf/pxe-agent";

/// The name of the link pin in an interface's directory.
pub const LINK: &str = "link";

/// The name of the pin of the program the link runs. The next agent reads
/// the program's tag and maps from it ([`read_program`]): finding a program
/// by its id (`BPF_PROG_GET_FD_BY_ID`) would need CAP_SYS_ADMIN, a pin
/// needs only CAP_BPF and the file's permissions.
pub const PROGRAM: &str = "program";

/// The maps the program uses, pinned by their names: everything the next
/// agent needs to keep serving, counting and tracing through a program it
/// adopts without replacing it (the event slots, with the last agent's
/// read marks, and the trace ring are pinned too, so it reads on where the
/// last agent stopped).
pub const MAPS: [&str; 8] = [
    HOSTS_MAP,
    BODIES_MAP,
    COUNTERS_MAP,
    EVENTS_MAP,
    EVENT_HEADS_MAP,
    TRACE_MAP,
    TRACED_MAP,
    TRACE_GATE_MAP,
];

/// Suffix of map pins made for a new program before it replaces the old
/// one; renamed over the old pins once it runs. Not a dot: bpffs refuses
/// names with one (EPERM).
pub const NEW_SUFFIX: &str = "-new";

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error(
        "{} is not on a BPF file system (bpffs); mount it with `mount -t bpf bpf /sys/fs/bpf`",
        .0.display()
    )]
    NotBpffs(PathBuf),
    #[error("failed to read the file system of {}", path.display())]
    Statfs { path: PathBuf, source: io::Error },
    #[error("failed to create {}", path.display())]
    Create { path: PathBuf, source: io::Error },
    #[error("failed to read {}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("failed to remove {}", path.display())]
    Remove { path: PathBuf, source: io::Error },
    #[error("failed to read the pinned program {}", path.display())]
    Program { path: PathBuf, source: io::Error },
}

/// The directory of `iface`'s pins under `dir`.
pub fn iface_dir(dir: &Path, iface: &str) -> PathBuf {
    dir.join(iface)
}

/// Makes sure `dir` is (or can be created) on bpffs, and creates it.
pub fn prepare(dir: &Path) -> Result<(), PinError> {
    let existing = dir
        .ancestors()
        .find(|a| a.exists())
        .unwrap_or(Path::new("/"));
    check_bpffs(existing)?;
    std::fs::create_dir_all(dir).map_err(|source| PinError::Create {
        path: dir.to_path_buf(),
        source,
    })?;
    check_bpffs(dir)
}

/// Refuses `path` unless it is on bpffs: pins anywhere else fail, and a
/// bpffs mounted in a container's own mount namespace only would vanish
/// with it.
pub fn check_bpffs(path: &Path) -> Result<(), PinError> {
    let c =
        CString::new(path.as_os_str().as_bytes()).map_err(|_| PinError::NotBpffs(path.into()))?;
    // SAFETY: statfs writes into the zeroed struct it is given.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated and st is a valid out pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(PinError::Statfs {
            path: path.into(),
            source: io::Error::last_os_error(),
        });
    }
    // f_type's type differs between architectures (i64 here, u32 on some).
    if st.f_type as i64 != BPF_FS_MAGIC {
        return Err(PinError::NotBpffs(path.into()));
    }
    Ok(())
}

/// What the kernel says of a pinned program: enough to tell whether the
/// pinned maps are its maps and whether it runs the same code as ours.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinnedProgram {
    pub id: u32,
    /// The kernel's hash of its instructions, as `aya`'s
    /// `ProgramInfo::tag` gives it (big-endian).
    pub tag: u64,
    /// The ids of the maps it uses.
    pub map_ids: Vec<u32>,
}

/// Reads the program pinned at `path` through the pin alone: `BPF_OBJ_GET`
/// (file permissions) and `BPF_OBJ_GET_INFO_BY_FD` on the descriptor it
/// gives, which fills in the map ids for a caller with CAP_BPF. Never
/// `BPF_PROG_GET_FD_BY_ID`, which needs CAP_SYS_ADMIN, as
/// `aya::programs::ProgramInfo::map_ids` does.
pub fn read_program(path: &Path) -> Result<PinnedProgram, PinError> {
    let failed = |source| PinError::Program {
        path: path.into(),
        source,
    };
    let fd = obj_get(path).map_err(failed)?;
    // First the count, then the ids into a buffer that large; a program's
    // maps never change once it is loaded.
    let info = prog_info(&fd, &mut []).map_err(failed)?;
    let mut map_ids = vec![0; info.nr_map_ids as usize];
    let info = prog_info(&fd, &mut map_ids).map_err(failed)?;
    map_ids.truncate(info.nr_map_ids as usize);
    Ok(PinnedProgram {
        id: info.id,
        tag: u64::from_be_bytes(info.tag),
        map_ids,
    })
}

/// What is pinned for one interface, read without changing anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Survey {
    pub iface: String,
    /// The program the pinned link runs; `None` when no link is pinned or
    /// it cannot be read (`problem` says which).
    pub program: Option<u32>,
    /// Whether that program is the one attached to the interface now:
    /// then it answers known hosts, with or without an agent.
    pub attached: bool,
    /// Distinct MACs in the pinned hosts map: the known hosts it answers.
    pub hosts: Option<usize>,
    /// What could not be read, in words.
    pub problem: Option<String>,
}

/// Reads what `dir` pins for each interface directory under it, by name:
/// the link's program, whether it is still the interface's (in this
/// network namespace), and how many hosts its pinned maps answer. Only
/// `BPF_OBJ_GET`, `BPF_OBJ_GET_INFO_BY_FD` and `BPF_MAP_GET_NEXT_KEY` on
/// pins, and netlink: nothing is attached, detached or removed.
pub fn survey(dir: &Path) -> Result<Vec<Survey>, PinError> {
    check_bpffs(dir)?;
    let read_error = |source| PinError::Read {
        path: dir.into(),
        source,
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_error)? {
        let entry = entry.map_err(read_error)?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names
        .into_iter()
        .map(|iface| survey_one(&iface_dir(dir, &iface), iface))
        .collect())
}

fn survey_one(idir: &Path, iface: String) -> Survey {
    use aya::{
        maps::{HashMap, Map, MapData},
        programs::links::{FdLink, PinnedLink},
    };
    use pxe_ebpf_common::{HostRecord, MacKey};

    let mut survey = Survey {
        iface,
        program: None,
        attached: false,
        hosts: None,
        problem: None,
    };
    let link = idir.join(LINK);
    if !link.exists() {
        survey.problem = Some("no link pinned".into());
        return survey;
    }
    match PinnedLink::from_pin(&link).map(FdLink::from) {
        Ok(fd) => match fd.info() {
            Ok(info) => survey.program = Some(info.program_id()),
            Err(e) => survey.problem = Some(format!("cannot read the pinned link: {e}")),
        },
        Err(e) => survey.problem = Some(format!("cannot open the pinned link: {e}")),
    }
    if let Some(id) = survey.program {
        match crate::netdev::xdp_program_id(&survey.iface) {
            Ok(running) => survey.attached = running == Some(id),
            Err(e) => {
                survey.problem = Some(format!(
                    "cannot read the XDP state of {}: {e}",
                    survey.iface
                ));
            }
        }
    }
    let hosts = MapData::from_pin(idir.join(HOSTS_MAP))
        .map_err(|e| e.to_string())
        .and_then(|map| {
            HashMap::<MapData, MacKey, HostRecord>::try_from(Map::HashMap(map))
                .map_err(|e| e.to_string())
        });
    match hosts {
        Ok(map) => {
            // One record per MAC and firmware class: count the MACs.
            let mut macs: Vec<[u8; 6]> = map.keys().filter_map(Result::ok).map(|k| k.mac).collect();
            macs.sort_unstable();
            macs.dedup();
            survey.hosts = Some(macs.len());
        }
        Err(e) if survey.problem.is_none() => {
            survey.problem = Some(format!("cannot read the pinned {HOSTS_MAP} map: {e}"));
        }
        Err(_) => {}
    }
    survey
}

/// Removes the map pins (and their `-new` leftovers) of one interface's
/// directory; the names removed.
pub fn remove_maps(dir: &Path) -> Result<Vec<String>, PinError> {
    let mut removed = Vec::new();
    for name in MAPS {
        for file in [name.to_string(), format!("{name}{NEW_SUFFIX}")] {
            if remove_if_there(&dir.join(&file))? {
                removed.push(file);
            }
        }
    }
    Ok(removed)
}

/// Removes `path`; whether it was there.
fn remove_if_there(path: &Path) -> Result<bool, PinError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(PinError::Remove {
            path: path.into(),
            source,
        }),
    }
}

/// What `detach` did on one interface.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Removed {
    pub iface: String,
    /// The link was pinned and is now detached.
    pub link: bool,
    /// Map pins removed, by name.
    pub maps: Vec<String>,
}

/// Detaches and unpins everything pinned for `ifaces` under `dir`, or for
/// every interface directory there (and then `dir` itself) when `ifaces`
/// is empty. Idempotent: what is not there is skipped.
pub fn detach(dir: &Path, ifaces: &[String]) -> Result<Vec<Removed>, PinError> {
    if !dir.exists() {
        // Never pinned, or removed by an earlier run: nothing to do, if
        // the place is right.
        let existing = dir
            .ancestors()
            .find(|a| a.exists())
            .unwrap_or(Path::new("/"));
        check_bpffs(existing)?;
        return Ok(Vec::new());
    }
    check_bpffs(dir)?;
    let all = ifaces.is_empty();
    let ifaces = if all {
        let mut names = Vec::new();
        let entries = std::fs::read_dir(dir).map_err(|source| PinError::Read {
            path: dir.into(),
            source,
        })?;
        for entry in entries {
            let entry = entry.map_err(|source| PinError::Read {
                path: dir.into(),
                source,
            })?;
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        names.sort();
        names
    } else {
        ifaces.to_vec()
    };
    let mut out = Vec::new();
    for iface in ifaces {
        let idir = iface_dir(dir, &iface);
        let link_path = idir.join(LINK);
        let mut removed = Removed {
            iface: iface.clone(),
            ..Removed::default()
        };
        if link_path.exists() {
            // Detach first: an agent still running holds the link open, and
            // unpinning alone would leave the program attached until it exits.
            if let Err(source) = link_detach(&link_path) {
                return Err(PinError::Remove {
                    path: link_path,
                    source,
                });
            }
            removed.link = remove_if_there(&link_path)?;
        }
        remove_if_there(&idir.join(PROGRAM))?;
        removed.maps = remove_maps(&idir)?;
        match std::fs::remove_dir(&idir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(PinError::Remove { path: idir, source });
            }
        }
        out.push(removed);
    }
    if all {
        // Empty now unless something else was put there: then it stays.
        let _ = std::fs::remove_dir(dir);
    }
    Ok(out)
}

/// `BPF_OBJ_GET`, `BPF_OBJ_GET_INFO_BY_FD` and `BPF_LINK_DETACH`
/// (include/uapi/linux/bpf.h).
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_DETACH: libc::c_long = 34;

/// `union bpf_attr`, large enough for the commands used here.
#[repr(C, align(8))]
struct Attr([u32; 32]);

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: attr is a zero-filled bpf_attr of the size passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr),
            size_of::<Attr>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Opens the object pinned at `path` (`BPF_OBJ_GET`).
fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let mut attr = Attr([0; 32]);
    let ptr = c.as_ptr() as u64;
    attr.0[0] = ptr as u32;
    attr.0[1] = (ptr >> 32) as u32;
    let fd = bpf(BPF_OBJ_GET, &mut attr)?;
    // SAFETY: BPF_OBJ_GET returned a new file descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `BPF_OBJ_GET_INFO_BY_FD` on the program `fd`, the ids of up to
/// `map_ids.len()` of its maps written into `map_ids`.
fn prog_info(fd: &OwnedFd, map_ids: &mut [u32]) -> io::Result<bpf_prog_info> {
    // SAFETY: bpf_prog_info is plain data; all zeroes is a valid value,
    // and the one the kernel expects in the fields we do not ask for.
    let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
    info.nr_map_ids = u32::try_from(map_ids.len()).map_err(io::Error::other)?;
    info.map_ids = map_ids.as_mut_ptr() as u64;
    let mut attr = Attr([0; 32]);
    let ptr = std::ptr::from_mut(&mut info) as u64;
    attr.0[0] = std::os::fd::AsRawFd::as_raw_fd(fd) as u32;
    attr.0[1] = size_of::<bpf_prog_info>() as u32;
    attr.0[2] = ptr as u32;
    attr.0[3] = (ptr >> 32) as u32;
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(info)
}

/// Detaches the link pinned at `path` from its interface, whoever holds it
/// open (forced `BPF_LINK_DETACH`, kernel 5.9); the link object lives on,
/// defunct, until its last reference goes. An already defunct link is
/// fine.
fn link_detach(path: &Path) -> io::Result<()> {
    let fd = obj_get(path)?;
    let mut attr = Attr([0; 32]);
    attr.0[0] = std::os::fd::AsRawFd::as_raw_fd(&fd) as u32;
    match bpf(BPF_LINK_DETACH, &mut attr) {
        Ok(_) => Ok(()),
        // ENOLINK: the link's interface went away, or it was detached already.
        Err(e) if e.raw_os_error() == Some(libc::ENOLINK) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_off_bpffs_is_refused_with_the_mount_command() {
        let dir = std::env::temp_dir().join(format!("pxe-pin-{}", std::process::id()));
        let err = prepare(&dir.join("sub")).expect_err("tmp is not bpffs");
        assert!(
            err.to_string()
                .contains("mount it with `mount -t bpf bpf /sys/fs/bpf`"),
            "{err}"
        );
        assert!(!dir.exists(), "nothing is created off bpffs");
    }
}

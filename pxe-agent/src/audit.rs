//! The audit log of actions on hardware: one JSON object per line, appended
//! and flushed to disk before the action's answer goes out, and read back
//! for `/api/v1/audit`.
//!
//! Owns the file and its format; what is recorded (never a secret) is the
//! caller's business: entries carry the caller's token name, not the token.

use std::{
    fs::{File, OpenOptions},
    io::{self, BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    sync::Mutex,
};

use serde::{Deserialize, Serialize};

use crate::sync::lock;

/// One action, as recorded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Unix milliseconds when the action started.
    pub at_ms: u64,
    /// Who called: the name of the token presented, or the Kubernetes
    /// user (`direct` for the CLI acting without an agent, `anonymous` for
    /// an open read).
    pub caller: String,
    /// The caller's Kubernetes groups, when it is a Kubernetes user.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Host name or MAC the action was for.
    pub host: String,
    /// `power`, `bootdev`, `recover`, ...
    pub action: String,
    /// The action's parameters, without secrets.
    pub params: serde_json::Value,
    /// `ok`, or the error.
    pub result: String,
    pub duration_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("failed to open the audit log {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("failed to append to the audit log {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("failed to read the audit log {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
}

/// The audit log file.
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<File>,
}

impl AuditLog {
    /// Opens `path` for appending, creating it (mode 0600) if missing.
    pub fn open(path: &Path) -> Result<AuditLog, AuditError> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| AuditError::Open {
                path: path.to_owned(),
                source,
            })?;
        // A line torn by a crash is ended, so the next entry starts a line
        // of its own.
        let torn = (|| -> io::Result<bool> {
            use std::io::{Read as _, Seek as _, SeekFrom};
            let mut reader = File::open(path)?;
            if reader.seek(SeekFrom::End(0))? == 0 {
                return Ok(false);
            }
            reader.seek(SeekFrom::End(-1))?;
            let mut last = [0u8];
            reader.read_exact(&mut last)?;
            Ok(last[0] != b'\n')
        })()
        .map_err(|source| AuditError::Open {
            path: path.to_owned(),
            source,
        })?;
        if torn {
            (&file)
                .write_all(b"\n")
                .map_err(|source| AuditError::Write {
                    path: path.to_owned(),
                    source,
                })?;
        }
        Ok(AuditLog {
            path: path.to_owned(),
            file: Mutex::new(file),
        })
    }

    /// Appends `entry` as one line and syncs it to disk.
    pub fn record(&self, entry: &Entry) -> Result<(), AuditError> {
        let mut line = serde_json::to_vec(entry).expect("an entry serializes");
        line.push(b'\n');
        let file = lock(&self.file);
        let write_error = |source| AuditError::Write {
            path: self.path.clone(),
            source,
        };
        // One write of the whole line: O_APPEND keeps lines whole.
        (&*file).write_all(&line).map_err(write_error)?;
        file.sync_data().map_err(write_error)
    }

    /// The last `limit` entries, oldest first. Lines that do not parse (a
    /// torn last line after a crash) are skipped.
    pub fn tail(&self, limit: usize) -> Result<Vec<Entry>, AuditError> {
        let read_error = |source| AuditError::Read {
            path: self.path.clone(),
            source,
        };
        let file = File::open(&self.path).map_err(read_error)?;
        let mut out = std::collections::VecDeque::with_capacity(limit.min(4096));
        for line in BufReader::new(file).lines() {
            let line = line.map_err(read_error)?;
            if let Ok(entry) = serde_json::from_str::<Entry>(&line) {
                if out.len() == limit {
                    out.pop_front();
                }
                if limit > 0 {
                    out.push_back(entry);
                }
            }
        }
        Ok(out.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u64) -> Entry {
        Entry {
            at_ms: n,
            caller: "ops".into(),
            groups: Vec::new(),
            host: "node-1".into(),
            action: "power".into(),
            params: serde_json::json!({"action": "cycle"}),
            result: "ok".into(),
            duration_ms: 12,
        }
    }

    #[test]
    fn entries_are_appended_as_lines_and_read_back_newest_last() {
        let dir = std::env::temp_dir().join(format!("pxe-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("audit.jsonl");
        let _ = std::fs::remove_file(&path);
        let log = AuditLog::open(&path).expect("open");
        for n in 0..5 {
            log.record(&entry(n)).expect("record");
        }
        // A torn line, as after a crash mid-write, is skipped.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(b"{\"at_ms\":9"))
            .expect("torn line");
        let got = log.tail(3).expect("tail");
        assert_eq!(got, vec![entry(2), entry(3), entry(4)]);
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text.lines().count(), 6);
        // Reopened, it ends the torn line and appends after it.
        let log = AuditLog::open(&path).expect("reopen");
        log.record(&entry(7)).expect("record");
        assert_eq!(log.tail(1).expect("tail"), vec![entry(7)]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

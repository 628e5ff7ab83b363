//! [`RecoveryStore`]: each host's recovery record in a redb file of its
//! own under the agent's state directory. Owns the table, the record's
//! on-disk form (JSON, so that a record can be read with `redb` tooling
//! and grown with defaulted fields) and batching a call's changes into one
//! commit; not what the records mean (`machine`).

use std::path::{Path, PathBuf};

use redb::{Database, TableDefinition};

use super::machine::Record;
use crate::{
    mac::MacAddr,
    mac_records::{self, ReadError},
};

/// The file name under the state directory.
pub const RECOVERY_FILE: &str = "recovery.redb";

/// MAC (lowercase colon form) -> JSON [`Record`]. The name carries the
/// record format, so a future format gets a table of its own.
const RECORDS: mac_records::Table = TableDefinition::new("recovery_v1");

/// A record is a few hundred bytes; a fleet's fit in a small cache.
const CACHE_BYTES: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("failed to open recovery store {}: {source}", .path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: Box<redb::Error>,
    },
    #[error("failed to read recovery store {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: Box<redb::Error>,
    },
    #[error("failed to write recovery store {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: Box<redb::Error>,
    },
    #[error("recovery store {}: bad record for {key:?}: {message}", .path.display())]
    Corrupt {
        path: PathBuf,
        key: String,
        message: String,
    },
}

/// The durable side of the controller. See the module documentation.
pub struct RecoveryStore {
    path: PathBuf,
    db: Database,
}

impl std::fmt::Debug for RecoveryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecoveryStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl RecoveryStore {
    /// Opens (creating if missing) [`RECOVERY_FILE`] in `state_dir`.
    pub fn open_in(state_dir: &Path) -> Result<RecoveryStore, StoreError> {
        RecoveryStore::open(&state_dir.join(RECOVERY_FILE))
    }

    /// Opens the database at `path`, creating it if missing. After a crash
    /// redb repairs the file on open, back to the last commit.
    pub fn open(path: &Path) -> Result<RecoveryStore, StoreError> {
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .map_err(|e| StoreError::Open {
                path: path.to_owned(),
                source: Box::new(e.into()),
            })?;
        let store = RecoveryStore {
            path: path.to_owned(),
            db,
        };
        // Creates the table in a new file, so that reads never meet a
        // missing table.
        store.write(&[])?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn read_error(&self, e: impl Into<redb::Error>) -> StoreError {
        StoreError::Read {
            path: self.path.clone(),
            source: Box::new(e.into()),
        }
    }

    fn write_error(&self, e: impl Into<redb::Error>) -> StoreError {
        StoreError::Write {
            path: self.path.clone(),
            source: Box::new(e.into()),
        }
    }

    /// Every record, by MAC.
    pub(super) fn load(&self) -> Result<Vec<(MacAddr, Record)>, StoreError> {
        mac_records::read_all(&self.db, RECORDS).map_err(|e| match e {
            ReadError::Db(e) => self.read_error(e),
            ReadError::Corrupt { key, message } => StoreError::Corrupt {
                path: self.path.clone(),
                key,
                message,
            },
        })
    }

    /// Writes every change in one durable commit: `Some` puts the record,
    /// `None` deletes the host's.
    pub(super) fn write(&self, changes: &[(MacAddr, Option<&Record>)]) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.write_error(e))?;
        {
            let mut table = txn.open_table(RECORDS).map_err(|e| self.write_error(e))?;
            for (mac, record) in changes {
                let key = mac.to_string();
                match record {
                    Some(record) => {
                        // Serializing plain data into a Vec cannot fail.
                        let value = serde_json::to_vec(record).unwrap_or_default();
                        table
                            .insert(key.as_str(), value.as_slice())
                            .map_err(|e| self.write_error(e))?;
                    }
                    None => {
                        table
                            .remove(key.as_str())
                            .map_err(|e| self.write_error(e))?;
                    }
                }
            }
        }
        txn.commit().map_err(|e| self.write_error(e))
    }
}

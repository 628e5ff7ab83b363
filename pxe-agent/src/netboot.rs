//! [`NetbootStore`]: whether each `netboot: once` host's provisioning is
//! done, since when and by what (its phone-home or an operator), one
//! record per host in a redb file of its own under the state directory
//! (each change one durable commit), with a copy in memory that every
//! route reads through [`crate::state::State`]. Owns the records and their
//! counters; not what a route does with them (`dhcp::decide`, `http::boot`,
//! `tftp::server`) nor how the fast path's maps follow (`rollout`).
//!
//! Records outlive the inventory: a host removed from it and listed again
//! keeps its record, so a mistaken edit never makes an installed fleet
//! install again; `reprovision` arms a host on purpose.
//!
//! With peers (`--peers kube`) the fleet's copy is the truth and this file
//! its cache: each local change is handed to [`NetbootStore::publish_to`]'s
//! channel for `kube::host_records` to write to the cluster, and a peer's
//! newer record comes back through [`NetbootStore::adopt`]. Records are
//! last-writer-wins by [`Record::since_ms`] ([`Record::supersedes`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use redb::{Database, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::{
    mac::MacAddr,
    mac_records::{self, ReadError},
    sync::lock,
};

/// The file name under the state directory.
pub const NETBOOT_FILE: &str = "netboot.redb";

/// MAC (lowercase colon form) -> JSON [`Record`].
const RECORDS: mac_records::Table = TableDefinition::new("netboot_v1");

/// Where a host's provisioning stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// It is given its boot file (no record says the same).
    Armed,
    /// It is given none until reprovisioned.
    Done,
}

impl Phase {
    /// Breaks a tie of two records changed in the same millisecond: done
    /// wins, so that a tie never makes an installed host install again.
    fn rank(self) -> u8 {
        match self {
            Phase::Armed => 0,
            Phase::Done => 1,
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Armed => "armed",
            Phase::Done => "done",
        })
    }
}

/// Who changed the record last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Actor {
    /// The booted system's phone-home.
    PhoneHome,
    /// `pxe-agent hosts done` / `reprovision`, or the API.
    Operator,
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Actor::PhoneHome => "phone-home",
            Actor::Operator => "operator",
        })
    }
}

/// One host's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub phase: Phase,
    /// Unix time in milliseconds.
    pub since_ms: u64,
    pub by: Actor,
}

impl Record {
    /// Whether this record is newer than `other` (`None`: no record, an
    /// armed host since forever): the later change wins, done on a tie.
    pub fn supersedes(&self, other: Option<&Record>) -> bool {
        match other {
            None => self.phase == Phase::Done || self.since_ms > 0,
            Some(o) => (self.since_ms, self.phase.rank()) > (o.since_ms, o.phase.rank()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("netboot store {}: {source}", .path.display())]
    Db {
        path: PathBuf,
        #[source]
        source: Box<redb::Error>,
    },
    #[error("netboot store {}: bad record for {key:?}: {message}", .path.display())]
    Corrupt {
        path: PathBuf,
        key: String,
        message: String,
    },
}

/// Changes and refusals, for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    pub done_phone_home: AtomicU64,
    pub done_operator: AtomicU64,
    pub armed: AtomicU64,
    /// Changes taken from a peer's newer record, to done and to armed.
    pub adopted_done: AtomicU64,
    pub adopted_armed: AtomicU64,
    pub refused_tftp: AtomicU64,
    pub refused_http: AtomicU64,
    pub exit_scripts: AtomicU64,
}

impl Counters {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// See the module documentation.
pub struct NetbootStore {
    /// `None`: kept in memory only (tests, tools).
    db: Option<(PathBuf, Database)>,
    records: Mutex<BTreeMap<MacAddr, Record>>,
    /// Where local changes go to be shared with peers.
    publish: Mutex<Option<tokio::sync::mpsc::UnboundedSender<(MacAddr, Record)>>>,
    pub counters: Counters,
}

impl NetbootStore {
    /// A store that forgets on exit.
    pub fn in_memory() -> NetbootStore {
        NetbootStore {
            db: None,
            records: Mutex::default(),
            publish: Mutex::default(),
            counters: Counters::default(),
        }
    }

    /// Opens (creating if missing) [`NETBOOT_FILE`] in `state_dir` and
    /// reads every record.
    pub fn open_in(state_dir: &Path) -> Result<NetbootStore, StoreError> {
        let path = state_dir.join(NETBOOT_FILE);
        let db_error = |e: redb::Error| StoreError::Db {
            path: path.clone(),
            source: Box::new(e),
        };
        let db = Database::create(&path).map_err(|e| db_error(e.into()))?;
        let txn = db.begin_write().map_err(|e| db_error(e.into()))?;
        txn.open_table(RECORDS).map_err(|e| db_error(e.into()))?;
        txn.commit().map_err(|e| db_error(e.into()))?;
        let records = mac_records::read_all(&db, RECORDS)
            .map_err(|e| match e {
                ReadError::Db(e) => db_error(e),
                ReadError::Corrupt { key, message } => StoreError::Corrupt {
                    path: path.clone(),
                    key,
                    message,
                },
            })?
            .into_iter()
            .collect();
        Ok(NetbootStore {
            db: Some((path, db)),
            records: Mutex::new(records),
            publish: Mutex::default(),
            counters: Counters::default(),
        })
    }

    /// The record of `mac`, if it has one.
    pub fn record(&self, mac: MacAddr) -> Option<Record> {
        self.lock().get(&mac).copied()
    }

    /// The hosts recorded as done.
    pub fn done(&self) -> BTreeSet<MacAddr> {
        self.lock()
            .iter()
            .filter(|(_, r)| r.phase == Phase::Done)
            .map(|(mac, _)| *mac)
            .collect()
    }

    /// Records `mac` as done by `by` at `now_ms`; `Ok(false)` when it was
    /// done already (the record keeps its first time).
    pub fn mark_done(&self, mac: MacAddr, by: Actor, now_ms: u64) -> Result<bool, StoreError> {
        let changed = self.set(mac, Phase::Done, by, now_ms)?;
        if changed {
            Counters::bump(match by {
                Actor::PhoneHome => &self.counters.done_phone_home,
                Actor::Operator => &self.counters.done_operator,
            });
        }
        Ok(changed)
    }

    /// Arms `mac` again; `Ok(false)` when it was armed already.
    pub fn arm(&self, mac: MacAddr, now_ms: u64) -> Result<bool, StoreError> {
        let changed = self.set(mac, Phase::Armed, Actor::Operator, now_ms)?;
        if changed {
            Counters::bump(&self.counters.armed);
        }
        Ok(changed)
    }

    /// Sends every local change from now on to `tx` (the peers' writer).
    pub fn publish_to(&self, tx: tokio::sync::mpsc::UnboundedSender<(MacAddr, Record)>) {
        *lock(&self.publish) = Some(tx);
    }

    /// Every record, for the peers' writer to share what it holds.
    pub fn records(&self) -> Vec<(MacAddr, Record)> {
        self.lock().iter().map(|(m, r)| (*m, *r)).collect()
    }

    /// Takes a peer's record of `mac` if it supersedes this store's;
    /// `Ok(true)` when it did (and the routes must follow). Not published
    /// again.
    pub fn adopt(&self, mac: MacAddr, record: Record) -> Result<bool, StoreError> {
        let mut records = self.lock();
        if !record.supersedes(records.get(&mac)) {
            return Ok(false);
        }
        let was = records.get(&mac).map_or(Phase::Armed, |r| r.phase);
        self.write(&mut records, mac, record)?;
        if was != record.phase {
            Counters::bump(match record.phase {
                Phase::Done => &self.counters.adopted_done,
                Phase::Armed => &self.counters.adopted_armed,
            });
        }
        Ok(was != record.phase)
    }

    /// Writes the record durably, then in memory; a failed write changes
    /// neither.
    fn set(&self, mac: MacAddr, phase: Phase, by: Actor, now_ms: u64) -> Result<bool, StoreError> {
        let mut records = self.lock();
        let was = records.get(&mac).map_or(Phase::Armed, |r| r.phase);
        if was == phase {
            return Ok(false);
        }
        // Never behind a peer's record the clock of this node is behind.
        let since_ms = records
            .get(&mac)
            .map_or(now_ms, |r| now_ms.max(r.since_ms + 1));
        let record = Record {
            phase,
            since_ms,
            by,
        };
        self.write(&mut records, mac, record)?;
        if let Some(tx) = &*lock(&self.publish) {
            let _ = tx.send((mac, record));
        }
        Ok(true)
    }

    fn write(
        &self,
        records: &mut BTreeMap<MacAddr, Record>,
        mac: MacAddr,
        record: Record,
    ) -> Result<(), StoreError> {
        if let Some((path, db)) = &self.db {
            let db_error = |e: redb::Error| StoreError::Db {
                path: path.clone(),
                source: Box::new(e),
            };
            let txn = db.begin_write().map_err(|e| db_error(e.into()))?;
            {
                let mut table = txn.open_table(RECORDS).map_err(|e| db_error(e.into()))?;
                // Serializing plain data into a Vec cannot fail.
                let value = serde_json::to_vec(&record).unwrap_or_default();
                table
                    .insert(mac.to_string().as_str(), value.as_slice())
                    .map_err(|e| db_error(e.into()))?;
            }
            txn.commit().map_err(|e| db_error(e.into()))?;
        }
        records.insert(mac, record);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<MacAddr, Record>> {
        lock(&self.records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 1]);

    #[test]
    fn done_and_armed_survive_a_reopen_and_count_only_changes() {
        let dir = std::env::temp_dir().join(format!("pxe-netboot-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        {
            let store = NetbootStore::open_in(&dir).expect("opens");
            assert_eq!(store.record(MAC), None);
            assert!(
                store
                    .mark_done(MAC, Actor::PhoneHome, 1_000)
                    .expect("writes")
            );
            assert!(
                !store
                    .mark_done(MAC, Actor::Operator, 2_000)
                    .expect("writes")
            );
            assert_eq!(store.counters.done_phone_home.load(Ordering::Relaxed), 1);
            assert_eq!(store.counters.done_operator.load(Ordering::Relaxed), 0);
        }
        let store = NetbootStore::open_in(&dir).expect("reopens");
        assert_eq!(
            store.record(MAC),
            Some(Record {
                phase: Phase::Done,
                since_ms: 1_000,
                by: Actor::PhoneHome
            })
        );
        assert_eq!(store.done(), BTreeSet::from([MAC]));
        assert!(store.arm(MAC, 3_000).expect("writes"));
        drop(store);
        let store = NetbootStore::open_in(&dir).expect("reopens");
        assert!(store.done().is_empty());
        assert_eq!(store.record(MAC).map(|r| r.by), Some(Actor::Operator));
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_peers_newer_record_is_adopted_and_only_local_changes_are_published() {
        let store = NetbootStore::in_memory();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        store.publish_to(tx);
        assert!(
            store
                .mark_done(MAC, Actor::PhoneHome, 1_000)
                .expect("writes")
        );
        let (mac, published) = rx.try_recv().expect("published");
        assert_eq!(
            (mac, published.phase, published.since_ms),
            (MAC, Phase::Done, 1_000)
        );
        // An older peer record loses; a newer one wins and is not echoed.
        let armed = |since_ms| Record {
            phase: Phase::Armed,
            since_ms,
            by: Actor::Operator,
        };
        assert!(!store.adopt(MAC, armed(999)).expect("reads"));
        assert!(store.adopt(MAC, armed(2_000)).expect("writes"));
        assert!(store.done().is_empty());
        assert!(rx.try_recv().is_err());
        assert_eq!(store.counters.adopted_armed.load(Ordering::Relaxed), 1);
        // A tie goes to done.
        let done = Record {
            phase: Phase::Done,
            since_ms: 2_000,
            by: Actor::PhoneHome,
        };
        assert!(done.supersedes(Some(&armed(2_000))));
        assert!(!armed(2_000).supersedes(Some(&done)));
        // A local change made on a clock behind the peer's still wins.
        assert!(
            store
                .mark_done(MAC, Actor::Operator, 1_500)
                .expect("writes")
        );
        assert_eq!(store.record(MAC).map(|r| r.since_ms), Some(2_001));
    }
}

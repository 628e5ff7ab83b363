//! The lease store on a disk that fills up: a write that fails commits
//! nothing and acknowledges nothing, a store that cannot write refuses new
//! leases, and once there is space again it recovers by itself with every
//! committed binding intact. The disk is a redb backend of the test's own,
//! because redb's own reaction to the failure (refusing everything after
//! it, `PreviousIo`, until the file is opened again) is what is tested.

use crate::sync::lock;

use super::{
    LeaseError, LeaseStore, RequestOutcome,
    tests::{POOL, T0, bind, mac},
};
use redb::{Database, StorageBackend, backends::InMemoryBackend};
use std::{
    io,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

/// One file's bytes, kept across opens as a file on a disk is, and whether
/// the disk is full: then every write and every growth fails with ENOSPC.
#[derive(Debug, Clone, Default)]
struct Disk {
    bytes: Arc<Mutex<InMemoryBackend>>,
    full: Arc<AtomicBool>,
}

impl Disk {
    fn file(&self) -> std::sync::MutexGuard<'_, InMemoryBackend> {
        lock(&self.bytes)
    }

    fn check_space(&self) -> Result<(), io::Error> {
        if self.full.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        Ok(())
    }

    fn set_full(&self, full: bool) {
        self.full.store(full, Ordering::SeqCst);
    }

    /// What the store opens its database with.
    fn opener(&self) -> super::store::Opener {
        let disk = self.clone();
        Box::new(move |_: &Path| Database::builder().create_with_backend(disk.clone()))
    }
}

impl StorageBackend for Disk {
    fn len(&self) -> Result<u64, io::Error> {
        self.file().len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.file().read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let file = self.file();
        if len > file.len()? {
            self.check_space()?;
        }
        file.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.file().sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.check_space()?;
        self.file().write(offset, data)
    }
}

fn open(disk: &Disk) -> LeaseStore {
    LeaseStore::open_with(Path::new("leases.redb"), disk.opener()).expect("open lease store")
}

fn is_enospc(e: &LeaseError) -> bool {
    e.to_string().contains("No space left on device")
}

#[test]
fn a_full_disk_acknowledges_nothing_and_refuses_new_leases_with_the_cause() {
    let disk = Disk::default();
    let mut store = open(&disk);
    let kept = bind(&mut store, mac(1), &POOL, T0);
    disk.set_full(true);

    // The first write to fail: its REQUEST gets no ACK, and says why.
    let offered = store
        .offer(mac(2), &POOL, None, T0)
        .expect("offer")
        .expect("pool has room");
    let err = store
        .request(mac(2), &POOL, offered, None, T0)
        .expect_err("a binding acknowledged on a full disk");
    assert!(is_enospc(&err), "{err}");
    assert!(
        store
            .lease_of(mac(2))
            .is_none_or(|l| l.state != super::LeaseState::Bound),
        "the failed binding is in the index"
    );
    // From now on no offer is made that could not be bound.
    let err = store
        .offer(mac(3), &POOL, None, T0)
        .expect_err("an offer while the store cannot write");
    assert!(
        matches!(err, LeaseError::Open { .. } | LeaseError::Storage { .. }),
        "{err}"
    );
    assert!(store.probe().is_err(), "the health probe passes");
    // What was committed before stays, in the index and in the file.
    assert_eq!(store.lease_of(mac(1)).map(|l| l.ip), Some(kept));
}

#[test]
fn once_space_returns_the_store_recovers_with_every_committed_binding() {
    let disk = Disk::default();
    let mut store = open(&disk);
    let first = bind(&mut store, mac(1), &POOL, T0);
    disk.set_full(true);
    let offered = store
        .offer(mac(2), &POOL, None, T0)
        .expect("offer")
        .expect("pool has room");
    assert!(store.request(mac(2), &POOL, offered, None, T0).is_err());
    assert!(store.probe().is_err());

    disk.set_full(false);
    store.probe().expect("the store writes again");
    let second = bind(&mut store, mac(2), &POOL, T0 + 1);
    assert_ne!(first, second);
    match store
        .request(mac(1), &POOL, first, None, T0 + 2)
        .expect("renewal")
    {
        RequestOutcome::Ack(lease) => assert_eq!(lease.ip, first),
        nak => panic!("renewal refused: {nak:?}"),
    }
    drop(store);

    // And in the file, as the next agent reads it.
    let reopened = open(&disk);
    let listed: Vec<_> = reopened
        .list()
        .expect("list")
        .into_iter()
        .map(|l| (l.mac, l.ip))
        .collect();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.contains(&(mac(1), first)), "{listed:?}");
    assert!(listed.contains(&(mac(2), second)), "{listed:?}");
}

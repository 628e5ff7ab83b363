//! What a pool lease belongs to: one machine through boot stages that send
//! different client identifiers, client-identifier keying, and lease files
//! written before client identifiers were kept.

use super::*;
use redb::{Database, TableDefinition};
use std::sync::atomic::{AtomicU32, Ordering};

const T0: u64 = 1_700_000_000;
const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x00, 0x10, 0x01];

const POOL: Pool = Pool {
    subnet: Ipv4Addr::new(10, 0, 0, 0),
    prefix: 24,
    start: Ipv4Addr::new(10, 0, 0, 10),
    end: Ipv4Addr::new(10, 0, 0, 200),
    lease_time: 3600,
};

/// Option 61 as the PXE ROM (type 0, a GUID), iPXE (type 1 + MAC) and an
/// installed system (a DUID, RFC 4361) send it.
const PXE_ROM: &[u8] = &[
    0, 0x4c, 0x4c, 0x45, 0x44, 0x00, 0x10, 0x38, 0x80, 0x4e, 0xb6, 0xc0, 0x4f, 0x51, 0x44, 0x32,
    0x31,
];
const IPXE: &[u8] = &[1, 0x52, 0x54, 0x00, 0x00, 0x10, 0x01];
const OS: &[u8] = &[
    0xff, 0, 0, 0, 1, 0, 4, 0x8a, 0x11, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f, 0x70, 0x81, 0x92, 0xa3, 0xb4,
    0xc5, 0xd6, 0xe7, 0xf8, 0x09,
];

fn stage(client_id: &[u8]) -> Client<'_> {
    Client {
        mac: MAC,
        client_id: Some(client_id),
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "pxe-agent-lease-key-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    fn db(&self) -> PathBuf {
        self.0.join("leases.redb")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// DISCOVER then REQUEST from `client`; the bound address.
fn bind(store: &mut LeaseStore, client: Client<'_>, now: u64) -> Ipv4Addr {
    let offered = store
        .offer(client, &POOL, None, now)
        .expect("offer")
        .expect("pool has room");
    match store
        .request(client, &POOL, offered, None, now)
        .expect("request")
    {
        RequestOutcome::Ack(lease) => lease.ip,
        nak => panic!("offered {offered} was refused: {nak:?}"),
    }
}

#[test]
fn one_machine_keeps_one_address_through_three_client_identifiers() {
    let dir = TempDir::new("chain");
    let mut store = LeaseStore::open(&dir.db()).expect("open");
    assert_eq!(store.lease_key(), LeaseKey::Mac);
    let rom = bind(&mut store, stage(PXE_ROM), T0);
    let ipxe = bind(&mut store, stage(IPXE), T0 + 5);
    let os = bind(&mut store, stage(OS), T0 + 60);
    assert_eq!([ipxe, os], [rom, rom]);
    assert_eq!(store.count(LeaseState::Bound), 1);
    // The record remembers the identifier of the last stage.
    assert_eq!(store.list().unwrap()[0].client_id.as_deref(), Some(OS));
    // Another machine still gets another address.
    let other = bind(&mut store, [0x52, 0x54, 0, 0, 0x10, 0x02].into(), T0 + 61);
    assert_ne!(other, rom);
}

#[test]
fn client_id_keying_gives_each_identifier_its_own_address() {
    let dir = TempDir::new("by-clid");
    let mut store = LeaseStore::open(&dir.db()).expect("open");
    store.set_lease_key(LeaseKey::ClientId);
    let rom = bind(&mut store, stage(PXE_ROM), T0);
    let ipxe = bind(&mut store, stage(IPXE), T0 + 5);
    let os = bind(&mut store, stage(OS), T0 + 60);
    assert!(rom != ipxe && ipxe != os && rom != os, "{rom} {ipxe} {os}");
    // Another identifier may not take an address held under the first one.
    assert_eq!(
        store.request(stage(OS), &POOL, rom, None, T0 + 61).unwrap(),
        RequestOutcome::Nak(NakReason::InUse)
    );
    // iPXE's identifier is the MAC's own form (type 1 + MAC): a request
    // without option 61 is the same client.
    assert_eq!(store.lease_of(MAC).map(|l| l.ip), Some(ipxe));
    // The newest bound lease of the MAC, whatever its identifier.
    assert_eq!(store.lease_of_mac(MAC).map(|l| l.ip), Some(os));
}

#[test]
fn records_made_by_client_identifier_become_the_machines_one_lease() {
    let dir = TempDir::new("rekey");
    let (rom, ipxe, os) = {
        let mut store = LeaseStore::open(&dir.db()).expect("open");
        store.set_lease_key(LeaseKey::ClientId);
        (
            bind(&mut store, stage(PXE_ROM), T0),
            bind(&mut store, stage(IPXE), T0 + 5),
            bind(&mut store, stage(OS), T0 + 60),
        )
    };
    // Reopened with the default key: the three records load, none is lost,
    // and the machine's address is the newest of them, whichever stage
    // asks next.
    let mut store = LeaseStore::open(&dir.db()).expect("reopen");
    assert_eq!(store.count(LeaseState::Bound), 3);
    let listed: Vec<Ipv4Addr> = store.list().unwrap().iter().map(|l| l.ip).collect();
    for ip in [rom, ipxe, os] {
        assert!(listed.contains(&ip), "{ip} lost: {listed:?}");
    }
    assert_eq!(store.lease_of(MAC).map(|l| l.ip), Some(os));
    for client in [stage(PXE_ROM), stage(IPXE), stage(OS), MAC.into()] {
        assert_eq!(
            store.offer(client, &POOL, None, T0 + 100).unwrap(),
            Some(os)
        );
    }
    assert_eq!(bind(&mut store, stage(PXE_ROM), T0 + 100), os);
    // The older records keep their addresses from other machines until
    // they expire, as committed.
    let stranger: [u8; 6] = [0x52, 0x54, 0, 0, 0x10, 0x09];
    assert_eq!(
        store.request(stranger, &POOL, rom, None, T0 + 100).unwrap(),
        RequestOutcome::Nak(NakReason::InUse)
    );
    store.expire(T0 + 3600 + 10).expect("expire");
    assert_eq!(store.count(LeaseState::Bound), 1);
    assert_eq!(store.lease_of(MAC).map(|l| l.ip), Some(os));
}

#[test]
fn lease_files_of_the_previous_format_load_and_keep_working() {
    let dir = TempDir::new("format-1");
    // What the previous version wrote: format 1 records, no identifier.
    const LEASES: TableDefinition<u32, &[u8]> = TableDefinition::new("leases_v1");
    let v1 = |state: u8, mac: [u8; 6], expires: u64, name: Option<&str>| {
        let mut out = vec![1, state];
        out.extend_from_slice(&mac);
        out.extend_from_slice(&expires.to_le_bytes());
        out.push(u8::from(name.is_some()));
        out.extend_from_slice(name.unwrap_or_default().as_bytes());
        out
    };
    let other: [u8; 6] = [0x52, 0x54, 0, 0, 0x10, 0x02];
    {
        let db = Database::create(dir.db()).expect("create");
        let txn = db.begin_write().expect("write");
        {
            let mut table = txn.open_table(LEASES).expect("table");
            let bound = v1(1, MAC, T0 + 3600, Some("node-a"));
            let released = v1(3, other, T0, None);
            table
                .insert(u32::from(Ipv4Addr::new(10, 0, 0, 10)), bound.as_slice())
                .expect("insert");
            table
                .insert(u32::from(Ipv4Addr::new(10, 0, 0, 11)), released.as_slice())
                .expect("insert");
        }
        txn.commit().expect("commit");
    }
    let mut store = LeaseStore::open(&dir.db()).expect("an old file opens");
    let lease = store.lease_of(MAC).expect("the bound lease loaded");
    assert_eq!(
        (
            lease.ip,
            lease.state,
            lease.hostname.as_deref(),
            lease.client_id
        ),
        (
            Ipv4Addr::new(10, 0, 0, 10),
            LeaseState::Bound,
            Some("node-a"),
            None
        )
    );
    assert_eq!(
        store.lease_of(other).map(|l| (l.ip, l.state)),
        Some((Ipv4Addr::new(10, 0, 0, 11), LeaseState::Released))
    );
    // The machine comes back with an identifier and keeps its address; the
    // renewal rewrites the record in the new format.
    assert_eq!(
        bind(&mut store, stage(OS), T0 + 100),
        Ipv4Addr::new(10, 0, 0, 10)
    );
    drop(store);
    let store = LeaseStore::open(&dir.db()).expect("reopen");
    let lease = store.lease_of(MAC).expect("bound");
    assert_eq!(lease.client_id.as_deref(), Some(OS));
    assert_eq!(lease.hostname.as_deref(), Some("node-a"));
}

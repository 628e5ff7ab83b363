//! IPv6 pool leases in the lease store: keyed by DUID and IAID, committed,
//! read back after a restart, released, declined, exhausted, expired; a
//! store written before IPv6 leases still loads; two agents' slices of
//! one pool never give one address twice.

use super::{tests::TempDir, *};
use crate::share::slice_of6;
use std::collections::BTreeSet;

const T0: u64 = 1_700_000_000;

fn a6(text: &str) -> Ipv6Addr {
    text.parse().expect("an IPv6 address")
}

/// fd00:66::1000 - fd00:66::100f in fd00:66::/64, one-hour leases.
fn pool() -> Pool6 {
    Pool6 {
        subnet: a6("fd00:66::"),
        prefix: 64,
        start: a6("fd00:66::1000"),
        end: a6("fd00:66::100f"),
        lease_time: 3600,
    }
}

/// A DUID-LLT of MAC 52:54:00:00:00:n.
fn duid(n: u8) -> Vec<u8> {
    vec![0, 1, 0, 1, 0x2c, 0x3d, 0x4e, 0x5f, 0x52, 0x54, 0, 0, 0, n]
}

fn client(duid: &[u8], iaid: u32) -> Client6<'_> {
    Client6 {
        duid,
        iaid,
        mac: None,
    }
}

/// Solicit then Request, as a client does; returns the bound address.
fn bind(store: &mut LeaseStore, c: Client6<'_>, pool: &Pool6, now: u64) -> Ipv6Addr {
    let offered = store
        .offer6(c, pool, &[], now)
        .expect("offer")
        .expect("pool has room");
    match store.bind6(c, pool, Some(offered), false, None, now) {
        Ok(BindOutcome6::Bound(lease)) => {
            assert_eq!(lease.ip, offered, "the Request gets what was advertised");
            lease.ip
        }
        other => panic!("bind: {other:?}"),
    }
}

#[test]
fn a_binding_is_durable_and_keyed_by_duid_and_iaid() {
    let dir = TempDir::new("six-durable");
    let (d1, d2) = (duid(1), duid(2));
    let first;
    {
        let mut store = LeaseStore::open(&dir.db()).expect("open");
        first = bind(&mut store, client(&d1, 7), &pool(), T0);
        assert_eq!(first, a6("fd00:66::1000"));
        // Another IA of the same DUID, and the same IAID of another DUID,
        // are other clients.
        let second = bind(&mut store, client(&d1, 8), &pool(), T0);
        let third = bind(&mut store, client(&d2, 7), &pool(), T0);
        assert_eq!(
            BTreeSet::from([first, second, third]).len(),
            3,
            "{first} {second} {third}"
        );
        // A Solicit again: the same address.
        let again = store.offer6(client(&d1, 7), &pool(), &[], T0 + 5);
        assert_eq!(again.expect("offer"), Some(first));
        // An IPv4 lease in the same store.
        let v4 = Pool {
            subnet: Ipv4Addr::new(10, 0, 0, 0),
            prefix: 24,
            start: Ipv4Addr::new(10, 0, 0, 10),
            end: Ipv4Addr::new(10, 0, 0, 20),
            lease_time: 600,
        };
        let ip = store
            .offer([2; 6], &v4, None, T0)
            .expect("offer")
            .expect("room");
        let acked = store.request([2; 6], &v4, ip, None, T0).expect("request");
        assert!(matches!(acked, RequestOutcome::Ack(_)));
    }
    // A restart: the file holds the bindings, both families.
    let mut store = LeaseStore::open(&dir.db()).expect("open again");
    let lease = store.lease6_of(client(&d1, 7)).expect("kept");
    assert_eq!(
        (lease.ip, lease.state, lease.expires, lease.iaid),
        (first, LeaseState::Bound, T0 + 3600, 7)
    );
    assert_eq!(lease.duid, d1);
    assert_eq!(store.list6().expect("list").len(), 3);
    assert_eq!(store.list().expect("list").len(), 1);
    assert_eq!(store.count6(LeaseState::Bound), 3);
    assert_eq!(store.count(LeaseState::Bound), 1);
    // A Renew after the restart extends the same address.
    match store.bind6(client(&d1, 7), &pool(), Some(first), true, None, T0 + 1800) {
        Ok(BindOutcome6::Bound(lease)) => {
            assert_eq!((lease.ip, lease.expires), (first, T0 + 1800 + 3600));
        }
        other => panic!("renew: {other:?}"),
    }
    // A Renew of another client's address, or of one outside the pool, is
    // refused.
    assert_eq!(
        store
            .bind6(client(&d2, 7), &pool(), Some(first), true, None, T0)
            .expect("renew"),
        BindOutcome6::Refused(NakReason::InUse)
    );
    assert_eq!(
        store
            .bind6(
                client(&d2, 7),
                &pool(),
                Some(a6("fd00:66::1")),
                true,
                None,
                T0
            )
            .expect("renew"),
        BindOutcome6::Refused(NakReason::OutsidePool)
    );
}

#[test]
fn release_frees_and_decline_quarantines() {
    let dir = TempDir::new("six-release");
    let mut store = LeaseStore::open(&dir.db()).expect("open");
    let small = Pool6 {
        end: a6("fd00:66::1001"),
        ..pool()
    };
    let (d1, d2, d3) = (duid(1), duid(2), duid(3));
    let one = bind(&mut store, client(&d1, 1), &small, T0);
    let two = bind(&mut store, client(&d2, 1), &small, T0);
    // Exhausted: no offer, no binding.
    assert_eq!(
        store
            .offer6(client(&d3, 1), &small, &[], T0)
            .expect("offer"),
        None
    );
    assert_eq!(
        store
            .bind6(client(&d3, 1), &small, None, false, None, T0)
            .expect("bind"),
        BindOutcome6::Exhausted
    );
    // Only the holder releases.
    assert!(!store.release6(client(&d3, 1), one, T0).expect("release"));
    assert!(
        store
            .release6(client(&d1, 1), one, T0 + 1)
            .expect("release")
    );
    let released = store.lease6_of(client(&d1, 1)).expect("remembered");
    assert_eq!(released.state, LeaseState::Released);
    // Freed for anyone.
    assert_eq!(bind(&mut store, client(&d3, 1), &small, T0 + 2), one);
    // A decline by someone it was not given to changes nothing; by its
    // holder, it is quarantined and no one is offered it.
    let limits = Quarantine::DEFAULT;
    assert_eq!(
        store
            .decline6(client(&d1, 1), &small, two, T0 + 3, &limits)
            .expect("decline"),
        DeclineOutcome::NotGiven
    );
    assert_eq!(
        store
            .decline6(client(&d2, 1), &small, two, T0 + 3, &limits)
            .expect("decline"),
        DeclineOutcome::Quarantined
    );
    assert_eq!(store.count6(LeaseState::Declined), 1);
    assert_eq!(
        store
            .offer6(client(&d2, 1), &small, &[], T0 + 4)
            .expect("offer"),
        None
    );
    // The quarantine ends and is swept; the address is free again.
    assert_eq!(store.expire(T0 + 3 + limits.secs).expect("expire"), 1);
    assert_eq!(
        store
            .offer6(client(&d2, 1), &small, &[], T0 + 3 + limits.secs)
            .expect("offer"),
        Some(two)
    );
}

#[test]
fn bindings_expire_with_their_lease_time() {
    let dir = TempDir::new("six-expire");
    let mut store = LeaseStore::open(&dir.db()).expect("open");
    let short = Pool6 {
        lease_time: 10,
        ..pool()
    };
    let d = duid(1);
    bind(&mut store, client(&d, 1), &short, T0);
    assert_eq!(store.expire(T0 + 9).expect("expire"), 0);
    assert_eq!(store.expire(T0 + 10).expect("expire"), 1);
    assert!(store.list6().expect("list").is_empty());
}

/// What the previous version wrote: the leases table only, a format 1 and
/// a format 2 record (a bound lease of node-17 with a host name; one with
/// a client identifier).
#[test]
fn a_store_written_before_ipv6_leases_loads() {
    let dir = TempDir::new("six-old");
    {
        const LEASES: redb::TableDefinition<u32, &[u8]> = redb::TableDefinition::new("leases_v1");
        let db = redb::Database::create(dir.db()).expect("create");
        let txn = db.begin_write().expect("write");
        {
            let mut table = txn.open_table(LEASES).expect("table");
            let mut v1 = vec![1, 1, 0x52, 0x54, 0, 0x12, 0x34, 0x56];
            v1.extend_from_slice(&(T0 + 600).to_le_bytes());
            v1.push(1);
            v1.extend_from_slice(b"node-17");
            table
                .insert(u32::from(Ipv4Addr::new(10, 0, 0, 10)), v1.as_slice())
                .expect("insert");
            let mut v2 = vec![2, 1, 0x52, 0x54, 0, 0x12, 0x34, 0x57];
            v2.extend_from_slice(&(T0 + 600).to_le_bytes());
            v2.extend_from_slice(&[3, 0xff, 0x01, 0x02, 0]);
            table
                .insert(u32::from(Ipv4Addr::new(10, 0, 0, 11)), v2.as_slice())
                .expect("insert");
        }
        txn.commit().expect("commit");
    }
    let dir_db = dir.db();
    let d = duid(9);
    let six;
    {
        let mut store = LeaseStore::open(&dir_db).expect("an old store opens");
        let list = store.list().expect("list");
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].hostname.as_deref(), Some("node-17"));
        assert_eq!(list[0].client_id, None);
        assert_eq!(list[1].client_id, Some(vec![0xff, 0x01, 0x02]));
        assert!(store.list6().expect("list6").is_empty());
        assert_eq!(
            store
                .lease_of([0x52, 0x54, 0, 0x12, 0x34, 0x56])
                .map(|l| l.ip),
            Some(Ipv4Addr::new(10, 0, 0, 10))
        );
        six = bind(&mut store, client(&d, 3), &pool(), T0);
    }
    let store = LeaseStore::open(&dir_db).expect("open again");
    assert_eq!(store.list().expect("list").len(), 2);
    assert_eq!(store.lease6_of(client(&d, 3)).map(|l| l.ip), Some(six));
}

/// Two agents, slots 0 and 1 of 2, each with its own store and its slice
/// of one pool, fill their slices: no address is handed out twice, and
/// together they hand out the whole pool.
#[test]
fn two_slots_share_an_ipv6_pool_without_overlap() {
    let whole = Pool6 {
        end: a6("fd00:66::1012"),
        ..pool()
    };
    let mut given = Vec::new();
    for slot in 0..2u16 {
        let dir = TempDir::new("six-slots");
        let mut store = LeaseStore::open(&dir.db()).expect("open");
        let slice = slice_of6(slot, 2, whole.start, whole.end).expect("a slice");
        let part = Pool6 {
            start: *slice.start(),
            end: *slice.end(),
            ..whole
        };
        // Both agents see the same clients; each binds until its slice is
        // exhausted.
        for n in 0..=255u8 {
            let d = duid(n);
            match store
                .bind6(client(&d, 1), &part, None, false, None, T0)
                .expect("bind")
            {
                BindOutcome6::Bound(lease) => {
                    assert!(part.contains(lease.ip));
                    given.push(lease.ip);
                }
                BindOutcome6::Exhausted => break,
                other => panic!("{other:?}"),
            }
        }
    }
    let distinct: BTreeSet<Ipv6Addr> = given.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        given.len(),
        "an address given twice: {given:?}"
    );
    let all: BTreeSet<Ipv6Addr> = (u128::from(whole.start)..=u128::from(whole.end))
        .map(Ipv6Addr::from)
        .collect();
    assert_eq!(distinct, all, "the two slices cover the pool");
}

#[test]
fn ipv6_pools_are_validated() {
    let bad = Pool6 {
        start: a6("fd00:67::1"),
        ..pool()
    };
    assert!(matches!(
        bad.validate(),
        Err(LeaseError::InvalidPool6 { .. })
    ));
    let backwards = Pool6 {
        start: pool().end,
        end: pool().start,
        ..pool()
    };
    assert!(backwards.validate().is_err());
    assert!(pool().validate().is_ok());
    // The widest and narrowest prefixes: the range check never overflows.
    let one = Pool6 {
        subnet: a6("fd00:66::7"),
        prefix: 128,
        start: a6("fd00:66::7"),
        end: a6("fd00:66::7"),
        ..pool()
    };
    assert!(one.validate().is_ok());
    let everything = Pool6 {
        subnet: a6("::"),
        prefix: 0,
        ..pool()
    };
    assert!(everything.validate().is_ok());
    let host_bits = Pool6 {
        subnet: a6("fd00:66::1"),
        ..pool()
    };
    assert!(matches!(
        host_bits.validate(),
        Err(LeaseError::InvalidPool6 {
            reason: "subnet address has host bits set",
            ..
        })
    ));
}

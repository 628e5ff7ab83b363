//! IPv6 leases in [`LeaseStore`]: their index, their offers, and the
//! rules for who may bind, release or decline an IPv6 address. The rules
//! are IPv4's (`store`), with the client filed under its DUID and IAID
//! ([`Client6::key`]) and the records in the leases6 table of the same
//! file, committed through the same transaction path.

use std::{
    collections::{BTreeMap, HashMap},
    net::Ipv6Addr,
};

use super::{Key, LeaseStore, Undo, offers::Offers};
use crate::lease::{
    BindOutcome6, Client6, DeclineOutcome, Lease6, LeaseError, LeaseState, NakReason, Pool6,
    Quarantine, lease_key6,
    record::{Record, Stored},
};

/// One change to an IPv6 record: the address and the record it had
/// before, so that a failed commit can put the index back.
pub(super) type Undo6 = Vec<(u128, Option<Record>)>;

/// The IPv6 side of the store: a mirror of the leases6 table, changed only
/// after a commit, and the pending offers.
#[derive(Default)]
pub(super) struct Index6 {
    leases: BTreeMap<u128, Record>,
    /// Client key -> address of its bound or released record.
    by_key: HashMap<Key, u128>,
    /// Pending offers, in memory only.
    offers: Offers<u128>,
    /// Where the search for a never-used address resumes.
    cursor: u128,
}

fn key_of(record: &Record) -> Key {
    lease_key6(
        record.client_id.as_deref().unwrap_or_default(),
        record.iaid.unwrap_or_default(),
    )
}

fn to_lease6(ip: u128, record: &Record) -> Lease6 {
    Lease6 {
        duid: record.client_id.clone().unwrap_or_default(),
        iaid: record.iaid.unwrap_or_default(),
        mac: (record.mac != [0; 6]).then_some(record.mac),
        ip: ip.into(),
        state: record.to_state(),
        expires: record.expires,
        hostname: record.hostname.clone(),
    }
}

impl Index6 {
    /// Replaces the index with `records`, as read from the file; pending
    /// offers stay.
    pub(super) fn load(&mut self, records: Vec<(u128, Record)>) {
        self.leases = records.into_iter().collect();
        self.by_key.clear();
        // As for IPv4: the binding over a release, then the later expiry.
        let rank = |r: &Record| (r.state == Stored::Bound, r.expires);
        for (&ip, record) in self.leases.iter().filter(|(_, r)| r.is_owned()) {
            let key = key_of(record);
            let better = match self.by_key.get(&key) {
                None => true,
                Some(other) => self
                    .leases
                    .get(other)
                    .is_none_or(|o| rank(record) > rank(o)),
            };
            if better {
                self.by_key.insert(key, ip);
            }
        }
    }

    /// Rebuilds the client index from the records, as [`Index6::load`]
    /// does; pending offers stay.
    pub(super) fn reindex(&mut self) {
        let records = std::mem::take(&mut self.leases).into_iter().collect();
        self.load(records);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// The addresses that have a record.
    pub(super) fn addresses(&self) -> Vec<u128> {
        self.leases.keys().copied().collect()
    }

    pub(super) fn clear_offers(&mut self) {
        self.offers.by_ip.clear();
        self.offers.of.clear();
    }

    pub(super) fn record(&self, ip: u128) -> Option<&Record> {
        self.leases.get(&ip)
    }

    /// Bindings that expired and quarantines that ended by `now`; lapsed
    /// offers are dropped.
    pub(super) fn ended(&mut self, now: u64) -> Vec<u128> {
        self.drop_lapsed(now);
        self.leases
            .iter()
            .filter(|(_, r)| r.state != Stored::Released && r.expires <= now)
            .map(|(&ip, _)| ip)
            .collect()
    }

    /// Sets the record for `ip`, keeping `by_key` in step, and remembers
    /// what was there in `undo`.
    pub(super) fn put(&mut self, ip: u128, record: Option<Record>, undo: &mut Undo6) {
        let new_owner = record.as_ref().filter(|r| r.is_owned()).map(key_of);
        let old = match record {
            Some(record) => self.leases.insert(ip, record),
            None => self.leases.remove(&ip),
        };
        if let Some(old) = old.as_ref().filter(|r| r.is_owned()) {
            let old_key = key_of(old);
            if self.by_key.get(&old_key) == Some(&ip) {
                self.by_key.remove(&old_key);
            }
        }
        if let Some(key) = new_owner {
            self.by_key.insert(key, ip);
        }
        undo.push((ip, old));
    }

    /// Whether the client filed under `key` may take `ip` now.
    fn claim(&self, key: &Key, ip: u128, now: u64) -> Result<(), NakReason> {
        if self.offers.held_from(key, ip, now) {
            return Err(NakReason::InUse);
        }
        match self.leases.get(&ip) {
            None => Ok(()),
            Some(r) => match r.state {
                Stored::Bound if &key_of(r) != key && r.expires > now => Err(NakReason::InUse),
                Stored::Declined if r.expires > now => Err(NakReason::Quarantined),
                Stored::Bound | Stored::Declined | Stored::Released => Ok(()),
            },
        }
    }

    /// An address for `key` in `pool`, in IPv4's order: the client's
    /// current or previous address, else a hint of the client's, else one
    /// never used (from the cursor on, then from the start), else the
    /// lowest free again. `None` when the pool is exhausted.
    fn pick(&mut self, key: &Key, pool: &Pool6, hints: &[Ipv6Addr], now: u64) -> Option<u128> {
        let usable = |ip: u128| pool.contains(ip.into()) && self.claim(key, ip, now).is_ok();
        let previous = [self.by_key.get(key), self.offers.of.get(key)]
            .into_iter()
            .flatten()
            .copied()
            .find(|&ip| usable(ip));
        let hinted = || hints.iter().map(|&a| u128::from(a)).find(|&ip| usable(ip));
        if let Some(ip) = previous.or_else(hinted) {
            return Some(ip);
        }
        let (start, end) = (u128::from(pool.start), u128::from(pool.end));
        let from = self.cursor.clamp(start, end);
        let unused = self
            .offers
            .first_unused(&self.leases, from, end)
            .or_else(|| {
                let before = from.checked_sub(1)?.max(start);
                self.offers.first_unused(&self.leases, start, before)
            });
        if let Some(ip) = unused {
            self.cursor = ip.saturating_add(1);
            return Some(ip);
        }
        self.leases
            .range(start..=end)
            .map(|(&ip, _)| ip)
            .find(|&ip| self.claim(key, ip, now).is_ok())
    }

    fn hold(&mut self, key: Key, mac: Option<[u8; 6]>, ip: u128, until: u64) {
        self.offers.hold(key, mac.unwrap_or_default(), ip, until);
    }

    fn drop_lapsed(&mut self, now: u64) {
        self.offers.drop_lapsed(now);
    }
}

impl LeaseStore {
    /// Picks an address of `pool` for an IA_NA of a Solicit and holds it for
    /// the client for the offer hold, as [`LeaseStore::offer`] does for a
    /// DHCPDISCOVER; `hints` are the addresses the IA_NA asks for. Nothing
    /// is written: a plain Advertise commits nothing. `None` when the pool
    /// is exhausted.
    pub fn offer6(
        &mut self,
        client: Client6<'_>,
        pool: &Pool6,
        hints: &[Ipv6Addr],
        now: u64,
    ) -> Result<Option<Ipv6Addr>, LeaseError> {
        pool.validate()?;
        // No offer that its Request could not be bound for.
        self.reopen()?;
        self.v6.drop_lapsed(now);
        let key = client.key();
        let chosen = self.v6.pick(&key, pool, hints, now);
        if let Some(ip) = chosen {
            let until = now.saturating_add(self.offer_hold);
            self.v6.hold(key, client.mac, ip, until);
        }
        Ok(chosen.map(Ipv6Addr::from))
    }

    /// Binds an address of `pool` to the client's IA_NA and commits it to
    /// disk before returning. With `exact` (a Renew or Rebind) only
    /// `wanted` is bound, when it is in the pool and not another client's;
    /// else (a Request, or a Solicit with rapid commit) the client's own
    /// address, `wanted`, or a free one, in [`LeaseStore::offer6`]'s
    /// order. A client's IA holds one address: binding a new one drops the
    /// old record. A renewal without a host name keeps the one it had.
    pub fn bind6(
        &mut self,
        client: Client6<'_>,
        pool: &Pool6,
        wanted: Option<Ipv6Addr>,
        exact: bool,
        hostname: Option<&str>,
        now: u64,
    ) -> Result<BindOutcome6, LeaseError> {
        pool.validate()?;
        self.reopen()?;
        self.v6.drop_lapsed(now);
        let key = client.key();
        let ip = if exact {
            let Some(ip) = wanted.filter(|&ip| pool.contains(ip)) else {
                return Ok(BindOutcome6::Refused(NakReason::OutsidePool));
            };
            if let Err(reason) = self.v6.claim(&key, ip.into(), now) {
                return Ok(BindOutcome6::Refused(reason));
            }
            u128::from(ip)
        } else {
            match self.v6.pick(&key, pool, wanted.as_slice(), now) {
                Some(ip) => ip,
                None => return Ok(BindOutcome6::Exhausted),
            }
        };
        let hostname = hostname.map(str::to_owned).or_else(|| {
            self.v6
                .leases
                .get(&ip)
                .filter(|r| key_of(r) == key && r.is_owned())
                .and_then(|r| r.hostname.clone())
        });
        let mut undo = Undo6::new();
        if let Some(&old) = self.v6.by_key.get(&key)
            && old != ip
        {
            self.v6.put(old, None, &mut undo);
        }
        let record = Record {
            mac: client.mac.unwrap_or_default(),
            state: Stored::Bound,
            expires: pool.expiry(now),
            hostname,
            client_id: Some(client.duid.to_vec()),
            iaid: Some(client.iaid),
        };
        let lease = to_lease6(ip, &record);
        self.v6.put(ip, Some(record), &mut undo);
        self.commit_both_or_undo(Undo::new(), undo)?;
        self.v6.offers.unhold(&key);
        Ok(BindOutcome6::Bound(lease))
    }

    /// A Release of `ip`: frees it if the client's IA holds it, keeping it
    /// as the IA's previous address. Returns whether anything was
    /// released.
    pub fn release6(
        &mut self,
        client: Client6<'_>,
        ip: Ipv6Addr,
        now: u64,
    ) -> Result<bool, LeaseError> {
        self.reopen()?;
        let key = client.key();
        let at = u128::from(ip);
        let Some(record) = self
            .v6
            .leases
            .get(&at)
            .filter(|r| key_of(r) == key && r.state == Stored::Bound)
        else {
            return Ok(false);
        };
        let released = Record {
            state: Stored::Released,
            expires: now,
            ..record.clone()
        };
        let mut undo = Undo6::new();
        self.v6.put(at, Some(released), &mut undo);
        self.commit_both_or_undo(Undo::new(), undo)?;
        self.v6.offers.unhold(&key);
        Ok(true)
    }

    /// A Decline of `ip`: quarantined as [`LeaseStore::decline`] does for
    /// DHCPDECLINE, under the same limits (per client IA and per pool).
    pub fn decline6(
        &mut self,
        client: Client6<'_>,
        pool: &Pool6,
        ip: Ipv6Addr,
        now: u64,
        limits: &Quarantine,
    ) -> Result<DeclineOutcome, LeaseError> {
        self.reopen()?;
        self.v6.drop_lapsed(now);
        let key = client.key();
        let at = u128::from(ip);
        let bound = self
            .v6
            .leases
            .get(&at)
            .is_some_and(|r| key_of(r) == key && r.state == Stored::Bound);
        let offered = self.v6.offers.by_ip.get(&at).is_some_and(|o| o.key == key);
        if !pool.contains(ip) || (!bound && !offered) {
            return Ok(DeclineOutcome::NotGiven);
        }
        let quarantined = |r: &Record| r.state == Stored::Declined && r.expires > now;
        let by_client = self
            .v6
            .leases
            .values()
            .filter(|r| key_of(r) == key && quarantined(r))
            .count();
        if by_client >= limits.per_mac {
            return Ok(DeclineOutcome::MacLimit);
        }
        let in_pool = self
            .v6
            .leases
            .range(u128::from(pool.start)..=u128::from(pool.end))
            .filter(|(_, r)| quarantined(r))
            .count();
        if in_pool >= pool_cap6(limits, pool) {
            return Ok(DeclineOutcome::PoolLimit);
        }
        let declined = Record {
            mac: client.mac.unwrap_or_default(),
            state: Stored::Declined,
            expires: now.saturating_add(limits.secs),
            hostname: None,
            client_id: Some(client.duid.to_vec()),
            iaid: Some(client.iaid),
        };
        let mut undo = Undo6::new();
        self.v6.put(at, Some(declined), &mut undo);
        self.commit_both_or_undo(Undo::new(), undo)?;
        self.v6.offers.unhold(&key);
        Ok(DeclineOutcome::Quarantined)
    }

    /// The IA's bound or released lease, else its pending offer, else
    /// `None`.
    pub fn lease6_of(&self, client: Client6<'_>) -> Option<Lease6> {
        let key = client.key();
        if let Some(&ip) = self.v6.by_key.get(&key)
            && let Some(record) = self.v6.leases.get(&ip)
        {
            return Some(to_lease6(ip, record));
        }
        let ip = *self.v6.offers.of.get(&key)?;
        let offer = self.v6.offers.by_ip.get(&ip)?;
        Some(Lease6 {
            duid: client.duid.to_vec(),
            iaid: client.iaid,
            mac: client.mac,
            ip: ip.into(),
            state: LeaseState::Offered,
            expires: offer.until,
            hostname: None,
        })
    }

    /// The MAC of the client bound to `ip`, when its DUID or link-local
    /// address carried one; from the in-memory index.
    pub fn bound6_at(&self, ip: Ipv6Addr) -> Option<[u8; 6]> {
        self.v6
            .leases
            .get(&u128::from(ip))
            .filter(|r| r.to_state() == LeaseState::Bound && r.mac != [0; 6])
            .map(|r| r.mac)
    }

    /// How many IPv6 records are in `state`, from the in-memory index.
    pub fn count6(&self, state: LeaseState) -> usize {
        self.v6
            .leases
            .values()
            .filter(|r| r.to_state() == state)
            .count()
    }

    /// Every IPv6 lease in the database (bound, released and declined),
    /// read from the file, by address.
    pub fn list6(&self) -> Result<Vec<Lease6>, LeaseError> {
        Ok(self
            .read_all6()?
            .iter()
            .map(|(ip, record)| to_lease6(*ip, record))
            .collect())
    }

    pub(super) fn read_all6(&self) -> Result<Vec<(u128, Record)>, LeaseError> {
        use redb::{ReadableDatabase, ReadableTable};
        let txn = self
            .db()?
            .begin_read()
            .map_err(|e| self.storage_error("begin a read transaction", e))?;
        let table = match txn.open_table(super::LEASES6) {
            Ok(table) => table,
            // A store written before IPv6 leases, opened read-only.
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(self.storage_error("open the IPv6 leases table", e)),
        };
        let entries = table
            .iter()
            .map_err(|e| self.storage_error("read the IPv6 leases table", e))?;
        let mut out = Vec::new();
        for entry in entries {
            let (ip, value) =
                entry.map_err(|e| self.storage_error("read the IPv6 leases table", e))?;
            let ip = ip.value();
            let record = Record::decode(value.value())
                .and_then(|r| match r.iaid {
                    Some(_) => Ok(r),
                    None => Err("an IPv4 record in the IPv6 table"),
                })
                .map_err(|reason| LeaseError::Corrupt {
                    path: self.path.clone(),
                    ip: Ipv6Addr::from(ip).into(),
                    reason,
                })?;
            out.push((ip, record));
        }
        Ok(out)
    }
}

/// How many addresses of `pool` may be in quarantine at once: the same
/// share as for IPv4 ([`Quarantine::pool_cap`]), at least one.
fn pool_cap6(limits: &Quarantine, pool: &Pool6) -> usize {
    let cap = pool.size() / 100 * u128::from(limits.pool_percent.min(100))
        + pool.size() % 100 * u128::from(limits.pool_percent.min(100)) / 100;
    usize::try_from(cap.max(1)).unwrap_or(usize::MAX)
}

//! [`LeaseStore`]: the redb file, the in-memory index that mirrors it, and
//! the pending offers. Owns address selection and the rules for who may
//! bind, release or decline an address; not the DHCP messages around them.
//! IPv6 leases live in the same file and store, in a table of their own
//! (`six`); leases carried from another server replace its records
//! (`carry`).

mod carry;
mod offers;
mod six;

use self::offers::Offers;
use super::{
    Client, DeclineOutcome, LeaseError, LeaseKey, LeaseRequest, NakReason, Pool, Quarantine,
    RequestOutcome, lease_key,
    record::{Record, Stored},
};
use crate::lease::{Lease, LeaseState};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::{
    collections::{BTreeMap, HashMap},
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

/// Address (host byte order) -> [`Record`] encoding. The records carry
/// their format (`record`), and every format is read.
const LEASES: TableDefinition<u32, &[u8]> = TableDefinition::new("leases_v1");

/// IPv6 address -> [`Record`] encoding (format 3). A store written before
/// IPv6 leases has no such table; opening it makes an empty one.
const LEASES6: TableDefinition<u128, &[u8]> = TableDefinition::new("leases6_v1");

/// How long an offered address is held for its MAC, in seconds, unless
/// [`LeaseStore::set_offer_hold`] says otherwise. Clients answer an OFFER
/// within a second or two; this covers a few retransmissions.
pub const DEFAULT_OFFER_HOLD: u64 = 30;

/// The lease tables are small (tens of bytes per address), so the page
/// cache does not need redb's 1 GiB default.
const CACHE_BYTES: usize = 16 << 20;

/// How the store opens its database, at first and after a failed write:
/// the file at the path ([`open_file`]); tests give a backend that can run
/// out of space.
pub(super) type Opener = Box<dyn Fn(&Path) -> Result<Database, redb::DatabaseError> + Send>;

fn open_file(path: &Path) -> Result<Database, redb::DatabaseError> {
    Database::builder().set_cache_size(CACHE_BYTES).create(path)
}

/// What a lease is filed under: [`Client::key`].
type Key = Vec<u8>;

/// An address held for a client between DHCPOFFER and DHCPREQUEST.
#[derive(Debug, Clone)]
struct Offer {
    key: Key,
    mac: [u8; 6],
    until: u64,
}

/// Durable dynamic leases. See the module documentation.
pub struct LeaseStore {
    path: PathBuf,
    opener: Opener,
    /// `None` after a failed write until [`LeaseStore::reopen`] succeeds:
    /// redb refuses every operation after an I/O error (`PreviousIo`), even
    /// once the cause (a full disk) is gone, until the file is opened
    /// again.
    db: Option<Database>,
    /// Mirror of the leases table, changed only after a commit.
    leases: BTreeMap<u32, Record>,
    /// What leases are filed under.
    lease_key: LeaseKey,
    /// Client key -> address of its bound or released record (at most
    /// one).
    by_key: HashMap<Key, u32>,
    /// Pending offers, in memory only.
    offers: Offers<u32>,
    offer_hold: u64,
    /// Where the search for a never-used address resumes: just past the
    /// last one handed out, so a burst of new clients costs O(1) each
    /// instead of a walk over every address already taken.
    cursor: u32,
    /// The second of the last sweep of lapsed offers.
    swept: Option<u64>,
    /// The IPv6 leases' index and offers (`six`).
    v6: six::Index6,
}

/// One change to a record: the address and the record it had before, so
/// that a failed commit can put the index back.
type Undo = Vec<(u32, Option<Record>)>;

impl LeaseStore {
    /// Opens the database at `path`, creating it if missing, and loads the
    /// index. After a crash redb repairs the file on open, back to the last
    /// commit; every binding this store acknowledged is in it.
    pub fn open(path: &Path) -> Result<LeaseStore, LeaseError> {
        LeaseStore::open_with(path, Box::new(open_file))
    }

    /// [`LeaseStore::open`] with the database `opener` opens.
    pub(super) fn open_with(path: &Path, opener: Opener) -> Result<LeaseStore, LeaseError> {
        let open_error = |source: redb::Error| LeaseError::Open {
            path: path.to_owned(),
            source: Box::new(source),
        };
        let db = opener(path).map_err(|e| open_error(e.into()))?;
        let mut store = LeaseStore {
            path: path.to_owned(),
            opener,
            db: Some(db),
            leases: BTreeMap::new(),
            lease_key: LeaseKey::default(),
            by_key: HashMap::new(),
            offers: Offers::default(),
            offer_hold: DEFAULT_OFFER_HOLD,
            cursor: 0,
            swept: None,
            v6: six::Index6::default(),
        };
        // Creates the table in a new file, so that reads never meet a
        // missing table.
        store.commit(&[])?;
        for (ip, record) in store.read_all()? {
            store.leases.insert(ip, record);
        }
        store.rebuild_by_key();
        store.v6.load(store.read_all6()?);
        Ok(store)
    }

    /// Sets what leases are filed under (default [`LeaseKey::Mac`]). The
    /// records stay as they are, each with its MAC and client identifier;
    /// the index is rebuilt, so that under [`LeaseKey::Mac`] the records a
    /// machine made with several client identifiers become one client's,
    /// whose address is the best of them (see `rebuild_by_key`): the
    /// others stay bound to their addresses until they expire, so no
    /// committed lease is lost. Pending offers are dropped: a client whose
    /// offer goes costs one retry.
    pub fn set_lease_key(&mut self, lease_key: LeaseKey) {
        if self.lease_key == lease_key {
            return;
        }
        self.lease_key = lease_key;
        self.offers.by_ip.clear();
        self.offers.of.clear();
        self.rebuild_by_key();
    }

    /// What leases are filed under.
    pub fn lease_key(&self) -> LeaseKey {
        self.lease_key
    }

    fn key_of(&self, record: &Record) -> Key {
        lease_key(self.lease_key, record.mac, record.client_id.as_deref())
    }

    /// Makes one durable commit that changes nothing: whether the store can
    /// be written at all, for health checks. After a failed write it opens
    /// the file again first, so a store whose disk had filled up recovers
    /// once there is space, with or without traffic.
    pub fn probe(&mut self) -> Result<(), LeaseError> {
        self.reopen()?;
        self.commit(&[])
    }

    /// After a failed write, opens the file again (redb repairs it back to
    /// its last commit) and rebuilds the index from it, so that the index
    /// says what the file says even if the failed commit reached the disk
    /// after all. Pending offers stay. Nothing to do while the store works.
    /// Every change calls it first, before it touches the index.
    fn reopen(&mut self) -> Result<(), LeaseError> {
        if self.db.is_some() {
            return Ok(());
        }
        // The handle that failed is dropped already: redb allows one
        // `Database` per file.
        let db = (self.opener)(&self.path).map_err(|e| LeaseError::Open {
            path: self.path.clone(),
            source: Box::new(e.into()),
        })?;
        self.db = Some(db);
        match self.read_all().and_then(|v4| Ok((v4, self.read_all6()?))) {
            Ok((records, records6)) => {
                self.leases = records.into_iter().collect();
                self.rebuild_by_key();
                self.v6.load(records6);
                Ok(())
            }
            Err(e) => {
                self.db = None;
                Err(e)
            }
        }
    }

    /// The open database, or the error that closed it.
    fn db(&self) -> Result<&Database, LeaseError> {
        self.db.as_ref().ok_or_else(|| LeaseError::Closed {
            path: self.path.clone(),
        })
    }

    /// Sets how long an offered address is held for its MAC, in seconds.
    pub fn set_offer_hold(&mut self, secs: u64) {
        self.offer_hold = secs;
    }

    /// Picks an address in `pool` for `mac`'s DHCPDISCOVER, in the order of
    /// RFC 2131 section 4.3.1: the MAC's current or previous address if no
    /// one else has it, else `requested` if it is in the pool and free, else
    /// an address never used (the lowest after the last one handed out, then
    /// the lowest from the start), else the lowest one free again
    /// (expired, released, or out of quarantine), so that addresses stay
    /// with their previous owners as long as the pool allows. The address is
    /// held for `mac` for the offer hold, so that a DISCOVER from another MAC
    /// meanwhile gets another one. `None` when the pool is exhausted.
    pub fn offer<'a>(
        &mut self,
        client: impl Into<Client<'a>>,
        pool: &Pool,
        requested: Option<Ipv4Addr>,
        now: u64,
    ) -> Result<Option<Ipv4Addr>, LeaseError> {
        let client = client.into();
        let key = client.key(self.lease_key);
        pool.validate()?;
        // No offer that its REQUEST could not be bound for.
        self.reopen()?;
        self.drop_lapsed_offers(now);
        let usable = |ip: u32| pool.contains(ip.into()) && self.claim(&key, ip, now).is_ok();
        let previous = [self.by_key.get(&key), self.offers.of.get(&key)]
            .into_iter()
            .flatten()
            .copied()
            .find(|&ip| usable(ip));
        let mut chosen = previous.or_else(|| requested.map(u32::from).filter(|&ip| usable(ip)));
        if chosen.is_none() {
            chosen = self.lowest_unused(pool);
            if let Some(ip) = chosen {
                self.cursor = ip.saturating_add(1);
            }
        }
        let chosen = chosen.or_else(|| self.lowest_reusable(&key, pool, now));
        if let Some(ip) = chosen {
            self.hold(key, client.mac, ip, now);
        }
        Ok(chosen.map(Ipv4Addr::from))
    }

    /// Binds `ip` to `mac` for a DHCPREQUEST: see [`LeaseStore::request_batch`].
    pub fn request<'a>(
        &mut self,
        client: impl Into<Client<'a>>,
        pool: &Pool,
        ip: Ipv4Addr,
        hostname: Option<&str>,
        now: u64,
    ) -> Result<RequestOutcome, LeaseError> {
        let client = client.into();
        let request = LeaseRequest {
            mac: client.mac,
            client_id: client.client_id,
            pool,
            ip,
            hostname,
        };
        let mut outcomes = self.request_batch(&[request], now)?;
        // One outcome per request, so the fallback is never used.
        Ok(outcomes
            .pop()
            .unwrap_or(RequestOutcome::Nak(NakReason::InUse)))
    }

    /// Applies DHCPREQUESTs in order, in one write transaction, and returns
    /// one outcome per request. A request is acknowledged when its address
    /// is in its pool and free, or already the MAC's (offered, bound, or
    /// expired or released but not taken by anyone since); it is refused
    /// when another MAC holds or was offered the address, when the address
    /// is quarantined, or when it is outside the pool. A MAC holds one
    /// address: binding a new one drops its old record. Every `Ack` is
    /// committed to disk before this returns; if the commit fails, nothing
    /// changes and the error is returned for the whole batch.
    pub fn request_batch(
        &mut self,
        requests: &[LeaseRequest<'_>],
        now: u64,
    ) -> Result<Vec<RequestOutcome>, LeaseError> {
        for request in requests {
            request.pool.validate()?;
        }
        self.reopen()?;
        self.drop_lapsed_offers(now);
        let mut undo = Undo::new();
        let mut outcomes = Vec::with_capacity(requests.len());
        for request in requests {
            let (mac, ip) = (request.mac, u32::from(request.ip));
            let key = lease_key(self.lease_key, mac, request.client_id);
            let claim = if request.pool.contains(request.ip) {
                self.claim(&key, ip, now)
            } else {
                Err(NakReason::OutsidePool)
            };
            if let Err(reason) = claim {
                outcomes.push(RequestOutcome::Nak(reason));
                continue;
            }
            // A renewal without option 12 keeps the name the client gave before.
            let hostname = request.hostname.map(str::to_owned).or_else(|| {
                self.leases
                    .get(&ip)
                    .filter(|r| self.key_of(r) == key && r.is_owned())
                    .and_then(|r| r.hostname.clone())
            });
            if let Some(&old) = self.by_key.get(&key)
                && old != ip
            {
                self.put(old, None, &mut undo);
            }
            let record = Record {
                mac,
                state: Stored::Bound,
                expires: request.pool.expiry(now),
                hostname,
                client_id: request.client_id.map(<[u8]>::to_vec),
                iaid: None,
            };
            outcomes.push(RequestOutcome::Ack(record.to_lease(request.ip)));
            self.put(ip, Some(record), &mut undo);
        }
        self.commit_or_undo(undo)?;
        for outcome in &outcomes {
            if let RequestOutcome::Ack(lease) = outcome {
                let key = lease_key(self.lease_key, lease.mac, lease.client_id.as_deref());
                self.offers.unhold(&key);
            }
        }
        Ok(outcomes)
    }

    /// DHCPRELEASE: frees `ip` if `mac` holds it, keeping it as the MAC's
    /// previous address. Returns whether anything was released; a release
    /// from any other MAC is ignored (RFC 2131 section 4.3.4).
    pub fn release<'a>(
        &mut self,
        client: impl Into<Client<'a>>,
        ip: Ipv4Addr,
        now: u64,
    ) -> Result<bool, LeaseError> {
        self.reopen()?;
        let client = client.into().key(self.lease_key);
        let key = u32::from(ip);
        let Some(record) = self
            .leases
            .get(&key)
            .filter(|r| self.key_of(r) == client && r.state == Stored::Bound)
        else {
            return Ok(false);
        };
        let released = Record {
            state: Stored::Released,
            expires: now,
            ..record.clone()
        };
        let mut undo = Undo::new();
        self.put(key, Some(released), &mut undo);
        self.commit_or_undo(undo)?;
        self.offers.unhold(&client);
        Ok(true)
    }

    /// DHCPDECLINE: `mac` found `ip` in use on the link, so the address is
    /// quarantined, offered to no one, until `now + limits.secs`
    /// (RFC 2131 section 4.3.3). A decline counts only when it is safe to
    /// believe, since any client can send one with any MAC: the address must
    /// be in `pool` and bound or offered to `mac` (the client declines what
    /// it was given), `mac` must have fewer than `limits.per_mac` addresses
    /// in quarantine, and the pool fewer than its share
    /// ([`Quarantine::pool_cap`]). Otherwise nothing changes and the outcome
    /// says why. Quarantines that ended by `now` count against neither
    /// limit, whether or not [`LeaseStore::expire`] has swept them yet.
    pub fn decline<'a>(
        &mut self,
        client: impl Into<Client<'a>>,
        pool: &Pool,
        ip: Ipv4Addr,
        now: u64,
        limits: &Quarantine,
    ) -> Result<DeclineOutcome, LeaseError> {
        let client = client.into();
        let (mac, owner) = (client.mac, client.key(self.lease_key));
        self.reopen()?;
        self.drop_lapsed_offers(now);
        let key = u32::from(ip);
        let bound = self
            .leases
            .get(&key)
            .is_some_and(|r| self.key_of(r) == owner && r.state == Stored::Bound);
        let offered = self.offers.by_ip.get(&key).is_some_and(|o| o.key == owner);
        if !pool.contains(ip) || (!bound && !offered) {
            return Ok(DeclineOutcome::NotGiven);
        }
        let quarantined = |r: &Record| r.state == Stored::Declined && r.expires > now;
        let by_mac = self
            .leases
            .values()
            .filter(|r| self.key_of(r) == owner && quarantined(r))
            .count();
        if by_mac >= limits.per_mac {
            return Ok(DeclineOutcome::MacLimit);
        }
        let in_pool = self
            .leases
            .range(u32::from(pool.start)..=u32::from(pool.end))
            .filter(|(_, r)| quarantined(r))
            .count();
        if in_pool >= limits.pool_cap(pool) {
            return Ok(DeclineOutcome::PoolLimit);
        }
        let declined = Record {
            mac,
            state: Stored::Declined,
            expires: now.saturating_add(limits.secs),
            hostname: None,
            client_id: client.client_id.map(<[u8]>::to_vec),
            iaid: None,
        };
        let mut undo = Undo::new();
        self.put(key, Some(declined), &mut undo);
        self.commit_or_undo(undo)?;
        self.offers.unhold(&owner);
        Ok(DeclineOutcome::Quarantined)
    }

    /// Deletes bindings that expired and quarantines that ended by `now`,
    /// in one commit, and returns how many. Released records stay, as their
    /// MACs' previous addresses, until someone else takes the address.
    pub fn expire(&mut self, now: u64) -> Result<usize, LeaseError> {
        self.reopen()?;
        self.drop_lapsed_offers(now);
        let ended: Vec<u32> = self
            .leases
            .iter()
            .filter(|(_, r)| r.state != Stored::Released && r.expires <= now)
            .map(|(&ip, _)| ip)
            .collect();
        let ended6 = self.v6.ended(now);
        let mut undo = Undo::new();
        for &ip in &ended {
            self.put(ip, None, &mut undo);
        }
        let mut undo6 = six::Undo6::new();
        for &ip in &ended6 {
            self.v6.put(ip, None, &mut undo6);
        }
        self.commit_both_or_undo(undo, undo6)?;
        Ok(ended.len() + ended6.len())
    }

    /// The client's bound or released lease, else its pending offer
    /// (whose `expires` says when the hold lapses), else `None`.
    pub fn lease_of<'a>(&self, client: impl Into<Client<'a>>) -> Option<Lease> {
        let client = client.into();
        let key = client.key(self.lease_key);
        if let Some(&ip) = self.by_key.get(&key)
            && let Some(record) = self.leases.get(&ip)
        {
            return Some(record.to_lease(ip.into()));
        }
        let ip = *self.offers.of.get(&key)?;
        let offer = self.offers.by_ip.get(&ip)?;
        Some(Lease {
            mac: offer.mac,
            ip: ip.into(),
            state: LeaseState::Offered,
            expires: offer.until,
            hostname: None,
            client_id: client.client_id.map(<[u8]>::to_vec),
        })
    }

    /// The newest lease (bound, else offered, else released) of any
    /// client with hardware address `mac`, whatever its client identifier:
    /// what boot HTTP and the API look a machine's pool address up by.
    pub fn lease_of_mac(&self, mac: [u8; 6]) -> Option<Lease> {
        // Only under `LeaseKey::ClientId` can a MAC have leases filed
        // under other keys.
        if self.lease_key == LeaseKey::Mac {
            return self.lease_of(mac);
        }
        let rank = |l: &Lease| {
            let state = match l.state {
                LeaseState::Bound => 2,
                LeaseState::Offered => 1,
                LeaseState::Released | LeaseState::Declined => 0,
            };
            (state, l.expires)
        };
        let recorded = self
            .leases
            .iter()
            .filter(|(_, r)| r.mac == mac && r.is_owned())
            .map(|(&ip, r)| r.to_lease(ip.into()));
        let offered = self
            .offers
            .by_ip
            .iter()
            .filter(|(_, o)| o.mac == mac)
            .map(|(&ip, o)| Lease {
                mac,
                ip: ip.into(),
                state: LeaseState::Offered,
                expires: o.until,
                hostname: None,
                client_id: None,
            });
        recorded.chain(offered).max_by_key(rank)
    }

    /// How many records are in `state`, from the in-memory index.
    pub fn count(&self, state: LeaseState) -> usize {
        self.leases
            .values()
            .filter(|r| r.to_state() == state)
            .count()
    }

    /// The MAC bound to `ip`, from the in-memory index.
    pub fn bound_at(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        self.leases
            .get(&u32::from(ip))
            .filter(|r| r.to_state() == LeaseState::Bound)
            .map(|r| r.mac)
    }

    /// Every lease in the database (bound, released and declined), read
    /// from the file, by address.
    pub fn list(&self) -> Result<Vec<Lease>, LeaseError> {
        Ok(self
            .read_all()?
            .into_iter()
            .map(|(ip, record)| record.to_lease(ip.into()))
            .collect())
    }

    /// Whether the client filed under `key` may take `ip` now, and if
    /// not, why.
    fn claim(&self, key: &Key, ip: u32, now: u64) -> Result<(), NakReason> {
        if self.offers.held_from(key, ip, now) {
            return Err(NakReason::InUse);
        }
        match self.leases.get(&ip) {
            None => Ok(()),
            Some(r) => match r.state {
                Stored::Bound if &self.key_of(r) != key && r.expires > now => Err(NakReason::InUse),
                Stored::Declined if r.expires > now => Err(NakReason::Quarantined),
                Stored::Bound | Stored::Declined | Stored::Released => Ok(()),
            },
        }
    }

    /// An address of `pool` with neither a record nor an offer: the first
    /// from the cursor to the end of the pool, else from its start.
    fn lowest_unused(&self, pool: &Pool) -> Option<u32> {
        let (start, end) = (u32::from(pool.start), u32::from(pool.end));
        let from = self.cursor.clamp(start, end);
        self.offers
            .first_unused(&self.leases, from, end)
            .or_else(|| {
                self.offers
                    .first_unused(&self.leases, start, from.checked_sub(1)?.max(start))
            })
    }

    /// The lowest address of `pool` whose record no longer holds it.
    fn lowest_reusable(&self, key: &Key, pool: &Pool, now: u64) -> Option<u32> {
        let range = u32::from(pool.start)..=u32::from(pool.end);
        self.leases
            .range(range)
            .map(|(&ip, _)| ip)
            .find(|&ip| self.claim(key, ip, now).is_ok())
    }

    fn hold(&mut self, key: Key, mac: [u8; 6], ip: u32, now: u64) {
        let until = now.saturating_add(self.offer_hold);
        self.offers.hold(key, mac, ip, until);
    }

    fn drop_lapsed_offers(&mut self, now: u64) {
        // Times are whole seconds: one sweep a second sees every lapse, and
        // a burst of requests within a second does not rescan every offer.
        if self.swept == Some(now) {
            return;
        }
        self.swept = Some(now);
        self.offers.drop_lapsed(now);
    }

    /// Sets the index's record for `ip`, keeping `by_key` in step, and
    /// remembers what was there in `undo`.
    fn put(&mut self, ip: u32, record: Option<Record>, undo: &mut Undo) {
        let new_owner = record
            .as_ref()
            .filter(|r| r.is_owned())
            .map(|r| self.key_of(r));
        let old = match record {
            Some(record) => self.leases.insert(ip, record),
            None => self.leases.remove(&ip),
        };
        if let Some(old) = old.as_ref().filter(|r| r.is_owned()) {
            let old_key = self.key_of(old);
            if self.by_key.get(&old_key) == Some(&ip) {
                self.by_key.remove(&old_key);
            }
        }
        if let Some(key) = new_owner {
            self.by_key.insert(key, ip);
        }
        undo.push((ip, old));
    }

    /// Commits the records `undo` touched, as the index now has them; if
    /// that fails, puts the index back as it was.
    fn commit_or_undo(&mut self, undo: Undo) -> Result<(), LeaseError> {
        self.commit_both_or_undo(undo, six::Undo6::new())
    }

    /// [`LeaseStore::commit_or_undo`] for IPv4 and IPv6 records at once.
    fn commit_both_or_undo(&mut self, undo: Undo, undo6: six::Undo6) -> Result<(), LeaseError> {
        if undo.is_empty() && undo6.is_empty() {
            return Ok(());
        }
        let mut touched: Vec<u32> = undo.iter().map(|&(ip, _)| ip).collect();
        touched.sort_unstable();
        touched.dedup();
        let mut touched6: Vec<u128> = undo6.iter().map(|&(ip, _)| ip).collect();
        touched6.sort_unstable();
        touched6.dedup();
        let result = self.commit_both(&touched, &touched6);
        if result.is_err() {
            let mut scratch = Undo::new();
            for (ip, old) in undo.into_iter().rev() {
                self.put(ip, old, &mut scratch);
            }
            let mut scratch = six::Undo6::new();
            for (ip, old) in undo6.into_iter().rev() {
                self.v6.put(ip, old, &mut scratch);
            }
        }
        result
    }

    /// Writes the index's records for `ips` (deleting those it has none
    /// for) in one durable commit. A failure closes the database, for
    /// [`LeaseStore::reopen`].
    fn commit(&mut self, ips: &[u32]) -> Result<(), LeaseError> {
        self.commit_both(ips, &[])
    }

    /// [`LeaseStore::commit`] of IPv4 records `ips` and IPv6 records
    /// `ips6`, in one transaction.
    fn commit_both(&mut self, ips: &[u32], ips6: &[u128]) -> Result<(), LeaseError> {
        let result = self.write(ips, ips6);
        if matches!(result, Err(LeaseError::Storage { .. })) {
            self.db = None;
        }
        result
    }

    fn write(&self, ips: &[u32], ips6: &[u128]) -> Result<(), LeaseError> {
        let mut txn = self
            .db()?
            .begin_write()
            .map_err(|e| self.storage_error("begin a write transaction", e))?;
        // Lease records carry data from untrusted clients (host names), and
        // the default one-phase commit trusts a non-cryptographic checksum
        // to tell a torn commit after a crash (redb docs/design.md, "Security
        // of 1PC+C").
        txn.set_two_phase_commit(true);
        {
            let mut table = txn
                .open_table(LEASES)
                .map_err(|e| self.storage_error("open the leases table", e))?;
            for &ip in ips {
                match self.leases.get(&ip) {
                    Some(record) => table
                        .insert(ip, record.encode().as_slice())
                        .map(drop)
                        .map_err(|e| self.storage_error("write a lease", e))?,
                    None => table
                        .remove(ip)
                        .map(drop)
                        .map_err(|e| self.storage_error("delete a lease", e))?,
                }
            }
            // Opened on every commit, so that the first one (in `open`)
            // adds the table to a store written before IPv6 leases.
            let mut table6 = txn
                .open_table(LEASES6)
                .map_err(|e| self.storage_error("open the IPv6 leases table", e))?;
            for &ip in ips6 {
                match self.v6.record(ip) {
                    Some(record) => table6
                        .insert(ip, record.encode().as_slice())
                        .map(drop)
                        .map_err(|e| self.storage_error("write an IPv6 lease", e))?,
                    None => table6
                        .remove(ip)
                        .map(drop)
                        .map_err(|e| self.storage_error("delete an IPv6 lease", e))?,
                }
            }
        }
        txn.commit()
            .map_err(|e| self.storage_error("commit leases", e))
    }

    fn read_all(&self) -> Result<Vec<(u32, Record)>, LeaseError> {
        let txn = self
            .db()?
            .begin_read()
            .map_err(|e| self.storage_error("begin a read transaction", e))?;
        let table = txn
            .open_table(LEASES)
            .map_err(|e| self.storage_error("open the leases table", e))?;
        let entries = table
            .iter()
            .map_err(|e| self.storage_error("read the leases table", e))?;
        let mut out = Vec::new();
        for entry in entries {
            let (ip, value) = entry.map_err(|e| self.storage_error("read the leases table", e))?;
            let ip = ip.value();
            let record = Record::decode(value.value()).map_err(|reason| LeaseError::Corrupt {
                path: self.path.clone(),
                ip: Ipv4Addr::from(ip).into(),
                reason,
            })?;
            out.push((ip, record));
        }
        Ok(out)
    }

    /// Points each client key at its record. A client holds one record at
    /// a time; a second one appears when records made under
    /// [`LeaseKey::ClientId`] by one machine (one per client identifier)
    /// are read under [`LeaseKey::Mac`], or after a crash between two
    /// versions. Then the newest wins: the binding over a release, then
    /// the later expiry, then the lower address. The others keep their
    /// addresses until they expire.
    fn rebuild_by_key(&mut self) {
        self.by_key.clear();
        for (&ip, record) in self.leases.iter().filter(|(_, r)| r.is_owned()) {
            let rank = |r: &Record| (r.state == Stored::Bound, r.expires);
            let key = self.key_of(record);
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

    fn storage_error(&self, operation: &'static str, source: impl Into<redb::Error>) -> LeaseError {
        LeaseError::Storage {
            path: self.path.clone(),
            operation,
            source: Box::new(source.into()),
        }
    }
}

//! [`LeaseStore`]: the redb file, the in-memory index that mirrors it, and
//! the pending offers. Owns address selection and the rules for who may
//! bind, release or decline an address; not the DHCP messages around them.

use super::{
    DeclineOutcome, LeaseError, LeaseRequest, NakReason, Pool, Quarantine, RequestOutcome,
    record::{Record, Stored},
};
use crate::lease::{Lease, LeaseState};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::{
    collections::{BTreeMap, HashMap},
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

/// Address (host byte order) -> [`Record`] encoding. The name carries the
/// record format, so a future format gets a table of its own.
const LEASES: TableDefinition<u32, &[u8]> = TableDefinition::new("leases_v1");

/// How long an offered address is held for its MAC, in seconds, unless
/// [`LeaseStore::set_offer_hold`] says otherwise. Clients answer an OFFER
/// within a second or two; this covers a few retransmissions.
pub const DEFAULT_OFFER_HOLD: u64 = 30;

/// The lease tables are small (tens of bytes per address), so the page
/// cache does not need redb's 1 GiB default.
const CACHE_BYTES: usize = 16 << 20;

/// An address held for a MAC between DHCPOFFER and DHCPREQUEST.
#[derive(Debug, Clone, Copy)]
struct Offer {
    mac: [u8; 6],
    until: u64,
}

/// Durable dynamic leases. See the module documentation.
pub struct LeaseStore {
    path: PathBuf,
    db: Database,
    /// Mirror of the leases table, changed only after a commit.
    leases: BTreeMap<u32, Record>,
    /// MAC -> address of its bound or released record (at most one).
    by_mac: HashMap<[u8; 6], u32>,
    /// Pending offers by address, in memory only.
    offers: BTreeMap<u32, Offer>,
    /// MAC -> address of its pending offer (at most one).
    offer_of: HashMap<[u8; 6], u32>,
    offer_hold: u64,
    /// Where the search for a never-used address resumes: just past the
    /// last one handed out, so a burst of new clients costs O(1) each
    /// instead of a walk over every address already taken.
    cursor: u32,
    /// The second of the last sweep of lapsed offers.
    swept: Option<u64>,
}

/// One change to a record: the address and the record it had before, so
/// that a failed commit can put the index back.
type Undo = Vec<(u32, Option<Record>)>;

impl LeaseStore {
    /// Opens the database at `path`, creating it if missing, and loads the
    /// index. After a crash redb repairs the file on open, back to the last
    /// commit; every binding this store acknowledged is in it.
    pub fn open(path: &Path) -> Result<LeaseStore, LeaseError> {
        let open_error = |source: redb::Error| LeaseError::Open {
            path: path.to_owned(),
            source: Box::new(source),
        };
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .map_err(|e| open_error(e.into()))?;
        let mut store = LeaseStore {
            path: path.to_owned(),
            db,
            leases: BTreeMap::new(),
            by_mac: HashMap::new(),
            offers: BTreeMap::new(),
            offer_of: HashMap::new(),
            offer_hold: DEFAULT_OFFER_HOLD,
            cursor: 0,
            swept: None,
        };
        // Creates the table in a new file, so that reads never meet a
        // missing table.
        store.commit(&[])?;
        for (ip, record) in store.read_all()? {
            store.leases.insert(ip, record);
        }
        store.rebuild_by_mac();
        Ok(store)
    }

    /// Makes one durable commit that changes nothing: whether the store can
    /// be written at all, for health checks.
    pub fn probe(&self) -> Result<(), LeaseError> {
        self.commit(&[])
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
    pub fn offer(
        &mut self,
        mac: [u8; 6],
        pool: &Pool,
        requested: Option<Ipv4Addr>,
        now: u64,
    ) -> Result<Option<Ipv4Addr>, LeaseError> {
        pool.validate()?;
        self.drop_lapsed_offers(now);
        let usable = |ip: u32| pool.contains(ip.into()) && self.claim(mac, ip, now).is_ok();
        let previous = [self.by_mac.get(&mac), self.offer_of.get(&mac)]
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
        let chosen = chosen.or_else(|| self.lowest_reusable(mac, pool, now));
        if let Some(ip) = chosen {
            self.hold(mac, ip, now);
        }
        Ok(chosen.map(Ipv4Addr::from))
    }

    /// Binds `ip` to `mac` for a DHCPREQUEST: see [`LeaseStore::request_batch`].
    pub fn request(
        &mut self,
        mac: [u8; 6],
        pool: &Pool,
        ip: Ipv4Addr,
        hostname: Option<&str>,
        now: u64,
    ) -> Result<RequestOutcome, LeaseError> {
        let request = LeaseRequest {
            mac,
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
        self.drop_lapsed_offers(now);
        let mut undo = Undo::new();
        let mut outcomes = Vec::with_capacity(requests.len());
        for request in requests {
            let (mac, ip) = (request.mac, u32::from(request.ip));
            let claim = if request.pool.contains(request.ip) {
                self.claim(mac, ip, now)
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
                    .filter(|r| r.mac == mac && r.is_owned())
                    .and_then(|r| r.hostname.clone())
            });
            if let Some(&old) = self.by_mac.get(&mac)
                && old != ip
            {
                self.put(old, None, &mut undo);
            }
            let record = Record {
                mac,
                state: Stored::Bound,
                expires: request.pool.expiry(now),
                hostname,
            };
            outcomes.push(RequestOutcome::Ack(record.to_lease(request.ip)));
            self.put(ip, Some(record), &mut undo);
        }
        self.commit_or_undo(undo)?;
        for outcome in &outcomes {
            if let RequestOutcome::Ack(lease) = outcome {
                self.unhold(lease.mac);
            }
        }
        Ok(outcomes)
    }

    /// DHCPRELEASE: frees `ip` if `mac` holds it, keeping it as the MAC's
    /// previous address. Returns whether anything was released; a release
    /// from any other MAC is ignored (RFC 2131 section 4.3.4).
    pub fn release(&mut self, mac: [u8; 6], ip: Ipv4Addr, now: u64) -> Result<bool, LeaseError> {
        let key = u32::from(ip);
        let Some(record) = self
            .leases
            .get(&key)
            .filter(|r| r.mac == mac && r.state == Stored::Bound)
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
        self.unhold(mac);
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
    pub fn decline(
        &mut self,
        mac: [u8; 6],
        pool: &Pool,
        ip: Ipv4Addr,
        now: u64,
        limits: &Quarantine,
    ) -> Result<DeclineOutcome, LeaseError> {
        self.drop_lapsed_offers(now);
        let key = u32::from(ip);
        let bound = self
            .leases
            .get(&key)
            .is_some_and(|r| r.mac == mac && r.state == Stored::Bound);
        let offered = self.offers.get(&key).is_some_and(|o| o.mac == mac);
        if !pool.contains(ip) || (!bound && !offered) {
            return Ok(DeclineOutcome::NotGiven);
        }
        let quarantined = |r: &Record| r.state == Stored::Declined && r.expires > now;
        let by_mac = self
            .leases
            .values()
            .filter(|r| r.mac == mac && quarantined(r))
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
        };
        let mut undo = Undo::new();
        self.put(key, Some(declined), &mut undo);
        self.commit_or_undo(undo)?;
        self.unhold(mac);
        Ok(DeclineOutcome::Quarantined)
    }

    /// Deletes bindings that expired and quarantines that ended by `now`,
    /// in one commit, and returns how many. Released records stay, as their
    /// MACs' previous addresses, until someone else takes the address.
    pub fn expire(&mut self, now: u64) -> Result<usize, LeaseError> {
        self.drop_lapsed_offers(now);
        let ended: Vec<u32> = self
            .leases
            .iter()
            .filter(|(_, r)| r.state != Stored::Released && r.expires <= now)
            .map(|(&ip, _)| ip)
            .collect();
        let mut undo = Undo::new();
        for &ip in &ended {
            self.put(ip, None, &mut undo);
        }
        self.commit_or_undo(undo)?;
        Ok(ended.len())
    }

    /// `mac`'s bound or released lease, else its pending offer (whose
    /// `expires` says when the hold lapses), else `None`.
    pub fn lease_of(&self, mac: [u8; 6]) -> Option<Lease> {
        if let Some(&ip) = self.by_mac.get(&mac)
            && let Some(record) = self.leases.get(&ip)
        {
            return Some(record.to_lease(ip.into()));
        }
        let ip = *self.offer_of.get(&mac)?;
        let offer = self.offers.get(&ip)?;
        Some(Lease {
            mac,
            ip: ip.into(),
            state: LeaseState::Offered,
            expires: offer.until,
            hostname: None,
        })
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

    /// Whether `mac` may take `ip` now, and if not, why.
    fn claim(&self, mac: [u8; 6], ip: u32, now: u64) -> Result<(), NakReason> {
        if self
            .offers
            .get(&ip)
            .is_some_and(|o| o.mac != mac && o.until > now)
        {
            return Err(NakReason::InUse);
        }
        match self.leases.get(&ip) {
            None => Ok(()),
            Some(r) => match r.state {
                Stored::Bound if r.mac != mac && r.expires > now => Err(NakReason::InUse),
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
        self.first_unused(from, end)
            .or_else(|| self.first_unused(start, from.checked_sub(1)?.max(start)))
    }

    /// The first address in `lo..=hi` with neither a record nor an offer.
    fn first_unused(&self, lo: u32, hi: u32) -> Option<u32> {
        if lo > hi {
            return None;
        }
        let mut records = self.leases.range(lo..=hi).map(|(&ip, _)| ip).peekable();
        let mut offers = self.offers.range(lo..=hi).map(|(&ip, _)| ip).peekable();
        // u64, so that a range ending at 255.255.255.255 cannot overflow.
        let mut next = u64::from(lo);
        loop {
            let taken = match (records.peek(), offers.peek()) {
                (Some(&a), Some(&b)) => a.min(b),
                (Some(&a), None) => a,
                (None, Some(&b)) => b,
                (None, None) => break,
            };
            if u64::from(taken) > next {
                break;
            }
            next = u64::from(taken) + 1;
            records.next_if_eq(&taken);
            offers.next_if_eq(&taken);
        }
        u32::try_from(next).ok().filter(|&ip| ip <= hi)
    }

    /// The lowest address of `pool` whose record no longer holds it.
    fn lowest_reusable(&self, mac: [u8; 6], pool: &Pool, now: u64) -> Option<u32> {
        let range = u32::from(pool.start)..=u32::from(pool.end);
        self.leases
            .range(range)
            .map(|(&ip, _)| ip)
            .find(|&ip| self.claim(mac, ip, now).is_ok())
    }

    fn hold(&mut self, mac: [u8; 6], ip: u32, now: u64) {
        self.unhold(mac);
        let until = now.saturating_add(self.offer_hold);
        self.offers.insert(ip, Offer { mac, until });
        self.offer_of.insert(mac, ip);
    }

    fn unhold(&mut self, mac: [u8; 6]) {
        if let Some(ip) = self.offer_of.remove(&mac)
            && self.offers.get(&ip).is_some_and(|o| o.mac == mac)
        {
            self.offers.remove(&ip);
        }
    }

    fn drop_lapsed_offers(&mut self, now: u64) {
        // Times are whole seconds: one sweep a second sees every lapse, and
        // a burst of requests within a second does not rescan every offer.
        if self.swept == Some(now) {
            return;
        }
        self.swept = Some(now);
        self.offers.retain(|_, o| o.until > now);
        let offers = &self.offers;
        self.offer_of
            .retain(|mac, ip| offers.get(ip).is_some_and(|o| o.mac == *mac));
    }

    /// Sets the index's record for `ip`, keeping `by_mac` in step, and
    /// remembers what was there in `undo`.
    fn put(&mut self, ip: u32, record: Option<Record>, undo: &mut Undo) {
        let new_owner = record.as_ref().filter(|r| r.is_owned()).map(|r| r.mac);
        let old = match record {
            Some(record) => self.leases.insert(ip, record),
            None => self.leases.remove(&ip),
        };
        if let Some(old) = old.as_ref().filter(|r| r.is_owned())
            && self.by_mac.get(&old.mac) == Some(&ip)
        {
            self.by_mac.remove(&old.mac);
        }
        if let Some(mac) = new_owner {
            self.by_mac.insert(mac, ip);
        }
        undo.push((ip, old));
    }

    /// Commits the records `undo` touched, as the index now has them; if
    /// that fails, puts the index back as it was.
    fn commit_or_undo(&mut self, undo: Undo) -> Result<(), LeaseError> {
        if undo.is_empty() {
            return Ok(());
        }
        let mut touched: Vec<u32> = undo.iter().map(|&(ip, _)| ip).collect();
        touched.sort_unstable();
        touched.dedup();
        let result = self.commit(&touched);
        if result.is_err() {
            let mut scratch = Undo::new();
            for (ip, old) in undo.into_iter().rev() {
                self.put(ip, old, &mut scratch);
            }
        }
        result
    }

    /// Writes the index's records for `ips` (deleting those it has none
    /// for) in one durable commit.
    fn commit(&self, ips: &[u32]) -> Result<(), LeaseError> {
        let mut txn = self
            .db
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
        }
        txn.commit()
            .map_err(|e| self.storage_error("commit leases", e))
    }

    fn read_all(&self) -> Result<Vec<(u32, Record)>, LeaseError> {
        let txn = self
            .db
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
                ip: ip.into(),
                reason,
            })?;
            out.push((ip, record));
        }
        Ok(out)
    }

    /// Points each MAC at its record. A MAC holds one record at a time, so
    /// a second one is not expected; should it appear, the binding wins over
    /// a release, then the later expiry, then the lower address.
    fn rebuild_by_mac(&mut self) {
        self.by_mac.clear();
        for (&ip, record) in self.leases.iter().filter(|(_, r)| r.is_owned()) {
            let rank = |r: &Record| (r.state == Stored::Bound, r.expires);
            let better = match self.by_mac.get(&record.mac) {
                None => true,
                Some(other) => self
                    .leases
                    .get(other)
                    .is_none_or(|o| rank(record) > rank(o)),
            };
            if better {
                self.by_mac.insert(record.mac, ip);
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

//! Dynamic leases for discovery pools: the addresses handed to machines the
//! inventory does not know yet. Owns choosing a free address in a pool for a
//! DHCPDISCOVER, binding it for a DHCPREQUEST, release, decline (quarantine)
//! and expiry, and keeping every binding durable in an embedded database
//! (redb) so that a crash never lets one address go to two clients. It does
//! not decide DHCP policy (whether to answer, with which options), parse or
//! build packets, touch sockets, or read the clock: callers pass the time in,
//! as unix seconds.
//!
//! Leases belong to a client as [`Client::key`] files it: by hardware
//! address by default, or by client identifier ([`LeaseKey`]).
//!
//! IPv6 leases ([`Lease6`], from a [`Pool6`]) are kept in the same store
//! and file, under the client's DUID and the IAID of its IA_NA
//! ([`Client6`]): RFC 8415 section 12 binds addresses to an IA, which
//! that pair names, and a DUID stays the same across the client's
//! interfaces and restarts, while a DHCPv6 message carries no `chaddr`.
//!
//! The database file is the truth; [`LeaseStore`] keeps an index of it in
//! memory, rebuilt on [`LeaseStore::open`], and changes the index only after
//! the change is committed. Offers are held in memory only: losing one in a
//! crash costs the client a retry, never a duplicate address, because the
//! REQUEST that follows is checked against the durable bindings.

#[cfg(test)]
mod full_disk_tests;
#[cfg(test)]
mod keying_tests;
mod record;
#[cfg(test)]
mod six_tests;
mod store;
#[cfg(test)]
mod tests;

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
};

pub use crate::inventory::LeaseKey;
pub use store::{DEFAULT_OFFER_HOLD, LeaseStore};

/// The lease store's file in the agent's state directory (`run
/// --state-dir`).
pub const STORE_FILE: &str = "leases.redb";

/// The client a request comes from, as the lease store tells clients
/// apart: by `mac`, or by `client_id` when the store keys leases by client
/// identifier ([`LeaseStore::set_lease_key`]). A bare MAC converts into one
/// without a client identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client<'a> {
    /// The hardware address (`chaddr`, Ethernet).
    pub mac: [u8; 6],
    /// Option 61, when the request carries a non-empty one.
    pub client_id: Option<&'a [u8]>,
}

impl From<[u8; 6]> for Client<'static> {
    fn from(mac: [u8; 6]) -> Client<'static> {
        Client {
            mac,
            client_id: None,
        }
    }
}

impl Client<'_> {
    /// What the client's lease is filed under with `key`: the hardware
    /// type (1, Ethernet) and address, which is also how RFC 2132 section
    /// 9.14 writes a MAC as a client identifier, or the client identifier
    /// when there is one and `key` is [`LeaseKey::ClientId`].
    pub fn key(&self, key: LeaseKey) -> Vec<u8> {
        lease_key(key, self.mac, self.client_id)
    }
}

/// See [`Client::key`].
fn lease_key(key: LeaseKey, mac: [u8; 6], client_id: Option<&[u8]>) -> Vec<u8> {
    match (key, client_id) {
        (LeaseKey::ClientId, Some(id)) if !id.is_empty() => id.to_vec(),
        _ => {
            let mut out = Vec::with_capacity(7);
            out.push(1);
            out.extend_from_slice(&mac);
            out
        }
    }
}

/// A range of addresses handed out dynamically, inside one subnet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pool {
    /// The subnet's network address (no host bits set).
    pub subnet: Ipv4Addr,
    /// The subnet's prefix length, 0 to 32.
    pub prefix: u8,
    /// First address handed out.
    pub start: Ipv4Addr,
    /// Last address handed out (inclusive).
    pub end: Ipv4Addr,
    /// Lease time given to bindings, in seconds; `u32::MAX` is infinite
    /// (RFC 2131 section 3.3).
    pub lease_time: u32,
}

/// When a binding of `lease_time` seconds made at `now` ends; never for
/// the infinite lease time (`u32::MAX`, RFC 2131 and RFC 8415 alike).
fn expiry(lease_time: u32, now: u64) -> u64 {
    if lease_time == u32::MAX {
        u64::MAX
    } else {
        now.saturating_add(u64::from(lease_time))
    }
}

/// The range check both families' pools share, on addresses of `bits`
/// bits widened to `u128`: the prefix fits, the subnet has no host bits,
/// and `start..=end` runs forward inside it. The subnet's network and its
/// mask on success.
fn range_in_subnet(
    bits: u8,
    prefix: u8,
    subnet: u128,
    (start, end): (u128, u128),
) -> Result<(u128, u128), &'static str> {
    if prefix > bits {
        return Err(if bits == 32 {
            "prefix is longer than 32 bits"
        } else {
            "prefix is longer than 128 bits"
        });
    }
    let width = u128::MAX >> (128 - u32::from(bits));
    let mask = width & !width.checked_shr(u32::from(prefix)).unwrap_or(0);
    if subnet & !mask != 0 {
        return Err("subnet address has host bits set");
    }
    if start > end {
        return Err("start is after end");
    }
    if start & mask != subnet || end & mask != subnet {
        return Err("range is not inside the subnet");
    }
    Ok((subnet, mask))
}

impl Pool {
    /// Whether `ip` lies between `start` and `end`, inclusive.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        (self.start..=self.end).contains(&ip)
    }

    /// Checks that the range lies inside the subnet and leaves out its
    /// network and broadcast addresses, and that the lease time is not zero.
    pub fn validate(&self) -> Result<(), LeaseError> {
        let invalid = |reason| {
            Err(LeaseError::InvalidPool {
                pool: *self,
                reason,
            })
        };
        let wide = |ip: Ipv4Addr| u128::from(u32::from(ip));
        let (start, end) = (wide(self.start), wide(self.end));
        let (network, mask) = range_in_subnet(32, self.prefix, wide(self.subnet), (start, end))
            .map_err(|reason| LeaseError::InvalidPool {
                pool: *self,
                reason,
            })?;
        let broadcast = network | (!mask & u128::from(u32::MAX));
        // A /31 has no network or broadcast address (RFC 3021), a /32 is one host.
        if self.prefix <= 30 && (start == network || end == broadcast) {
            return invalid("range includes the subnet's network or broadcast address");
        }
        if self.lease_time == 0 {
            return invalid("lease time is zero");
        }
        Ok(())
    }

    /// When a binding made at `now` ends.
    fn expiry(&self, now: u64) -> u64 {
        expiry(self.lease_time, now)
    }
}

impl fmt::Display for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{} in {}/{}",
            self.start, self.end, self.subnet, self.prefix
        )
    }
}

/// What an address is doing for the MAC a [`Lease`] names; `offered`,
/// `bound`, `declined` or `released` in the API and the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseState {
    /// Offered to the MAC and held for it for a short while; in memory only.
    Offered,
    /// Bound to the MAC until `expires` (committed to disk).
    Bound,
    /// Quarantined until `expires`: the MAC sent DHCPDECLINE, saying the
    /// address is already in use on the link; offered to no one meanwhile.
    Declined,
    /// Released by the MAC: free for anyone, and remembered as the MAC's
    /// previous address until someone else takes it.
    Released,
}

impl LeaseState {
    /// The API and metrics text, the same as the serde form.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Offered => "offered",
            LeaseState::Bound => "bound",
            LeaseState::Declined => "declined",
            LeaseState::Released => "released",
        }
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One address and the MAC it is (or was) leased to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The client's hardware address (`chaddr`).
    pub mac: [u8; 6],
    pub ip: Ipv4Addr,
    pub state: LeaseState,
    /// Unix seconds when the state ends: the binding expires, the offer or
    /// the quarantine lapses. For `Released`, when it was released.
    /// `u64::MAX` for an infinite lease.
    pub expires: u64,
    /// The client's host name (option 12), as it last sent it.
    pub hostname: Option<String>,
    /// The client identifier (option 61) of the request that made the
    /// lease, when it had one.
    pub client_id: Option<Vec<u8>>,
}

/// What DHCPDECLINE may quarantine (see [`LeaseStore::decline`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quarantine {
    /// How long a declined address is kept from every client, in seconds.
    pub secs: u64,
    /// Addresses one MAC may have in quarantine at once.
    pub per_mac: usize,
    /// Share of a pool that may be in quarantine at once, in percent; at
    /// least one address of any pool may be.
    pub pool_percent: u8,
}

impl Quarantine {
    /// Ten minutes, two addresses a MAC, a tenth of the pool: a client that
    /// really meets a conflict declines one address and takes the next,
    /// while spoofed DISCOVER+DECLINE pairs cannot empty the pool.
    pub const DEFAULT: Quarantine = Quarantine {
        secs: 600,
        per_mac: 2,
        pool_percent: 10,
    };

    /// How many addresses of `pool` may be in quarantine at once.
    pub fn pool_cap(&self, pool: &Pool) -> usize {
        let size = u64::from(u32::from(pool.end).saturating_sub(u32::from(pool.start))) + 1;
        let cap = size * u64::from(self.pool_percent.min(100)) / 100;
        usize::try_from(cap.max(1)).unwrap_or(usize::MAX)
    }
}

/// What became of a DHCPDECLINE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeclineOutcome {
    /// The address is quarantined.
    Quarantined,
    /// Refused: the address is not in the pool, or was neither bound nor
    /// offered to this MAC (RFC 2131 4.3.3: a client declines the address
    /// it was given).
    NotGiven,
    /// Refused: the MAC already has [`Quarantine::per_mac`] addresses in
    /// quarantine.
    MacLimit,
    /// Refused: the pool already has its share in quarantine.
    PoolLimit,
}

/// One DHCPREQUEST for [`LeaseStore::request_batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRequest<'a> {
    pub mac: [u8; 6],
    /// Option 61, when the request carries a non-empty one.
    pub client_id: Option<&'a [u8]>,
    pub pool: &'a Pool,
    /// The address asked for (option 50, or `ciaddr` when renewing).
    pub ip: Ipv4Addr,
    pub hostname: Option<&'a str>,
}

/// The answer to a DHCPREQUEST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestOutcome {
    /// The binding, already committed to disk.
    Ack(Lease),
    /// Refused; the caller answers DHCPNAK (RFC 2131 section 4.3.2).
    Nak(NakReason),
}

/// Why a DHCPREQUEST was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakReason {
    /// The address is not in the pool.
    OutsidePool,
    /// Another MAC holds the address, or has a pending offer for it.
    InUse,
    /// The address is quarantined after a DHCPDECLINE.
    Quarantined,
}

/// Failures of the lease store. Each says which database and what it was
/// doing; a failed change leaves both the file and the in-memory index as
/// they were.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("failed to open lease database {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: Box<redb::Error>,
    },
    /// `source` is in the message: "No space left on device" is what an
    /// operator needs to read in the log line.
    #[error("lease database {}: failed to {operation}: {source}", path.display())]
    Storage {
        path: PathBuf,
        operation: &'static str,
        #[source]
        source: Box<redb::Error>,
    },
    /// A write failed earlier and opening the file again failed too (see
    /// the error logged then); tried again on the next change.
    #[error("lease database {} is closed after a failed write; it is opened again on the next change", path.display())]
    Closed { path: PathBuf },
    #[error("lease database {}: unreadable record for {ip}: {reason}", path.display())]
    Corrupt {
        path: PathBuf,
        ip: IpAddr,
        reason: &'static str,
    },
    #[error("invalid pool {pool}: {reason}")]
    InvalidPool { pool: Pool, reason: &'static str },
    #[error("invalid IPv6 pool {pool}: {reason}")]
    InvalidPool6 { pool: Pool6, reason: &'static str },
}

/// A DHCPv6 client's IA_NA, as the lease store files its IPv6 lease: by
/// DUID and IAID (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client6<'a> {
    /// The client identifier (option 1), as sent.
    pub duid: &'a [u8],
    /// The IAID of the IA_NA.
    pub iaid: u32,
    /// The client's MAC, when its DUID or link-local address carries one:
    /// kept with the lease for the API, not part of the key.
    pub mac: Option<[u8; 6]>,
}

impl Client6<'_> {
    /// What the lease is filed under: the DUID, then the IAID (big-endian).
    pub fn key(&self) -> Vec<u8> {
        lease_key6(self.duid, self.iaid)
    }
}

fn lease_key6(duid: &[u8], iaid: u32) -> Vec<u8> {
    let mut key = Vec::with_capacity(duid.len() + 4);
    key.extend_from_slice(duid);
    key.extend_from_slice(&iaid.to_be_bytes());
    key
}

/// A range of IPv6 addresses handed out dynamically, inside one subnet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pool6 {
    /// The subnet's network address (no host bits set).
    pub subnet: Ipv6Addr,
    /// The subnet's prefix length, 0 to 128.
    pub prefix: u8,
    /// First address handed out.
    pub start: Ipv6Addr,
    /// Last address handed out (inclusive).
    pub end: Ipv6Addr,
    /// Valid lifetime of bindings, in seconds; `u32::MAX` is infinite
    /// (RFC 8415 section 7.7).
    pub lease_time: u32,
}

impl Pool6 {
    /// Whether `ip` lies between `start` and `end`, inclusive.
    pub fn contains(&self, ip: Ipv6Addr) -> bool {
        (self.start..=self.end).contains(&ip)
    }

    /// How many addresses the range holds, saturating at `u128::MAX`.
    pub fn size(&self) -> u128 {
        u128::from(self.end)
            .saturating_sub(u128::from(self.start))
            .saturating_add(1)
    }

    /// Checks that the range lies inside the subnet and that the lease
    /// time is not zero.
    pub fn validate(&self) -> Result<(), LeaseError> {
        let invalid = |reason| {
            Err(LeaseError::InvalidPool6 {
                pool: *self,
                reason,
            })
        };
        range_in_subnet(
            128,
            self.prefix,
            u128::from(self.subnet),
            (u128::from(self.start), u128::from(self.end)),
        )
        .map_err(|reason| LeaseError::InvalidPool6 {
            pool: *self,
            reason,
        })?;
        if self.lease_time == 0 {
            return invalid("lease time is zero");
        }
        Ok(())
    }

    fn expiry(&self, now: u64) -> u64 {
        expiry(self.lease_time, now)
    }
}

impl fmt::Display for Pool6 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{} in {}/{}",
            self.start, self.end, self.subnet, self.prefix
        )
    }
}

/// An IPv6 address and the IA_NA it is (or was) leased to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease6 {
    /// The client's DUID (option 1).
    pub duid: Vec<u8>,
    /// The IAID of its IA_NA.
    pub iaid: u32,
    /// The client's MAC, when its DUID or link-local address carried one.
    pub mac: Option<[u8; 6]>,
    pub ip: Ipv6Addr,
    pub state: LeaseState,
    /// Unix seconds when the state ends, as for [`Lease::expires`].
    pub expires: u64,
    pub hostname: Option<String>,
}

/// What became of a Request, Renew or Rebind for an IA_NA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindOutcome6 {
    /// The binding, already committed to disk.
    Bound(Lease6),
    /// The address asked for may not be the client's; the caller answers
    /// it with lifetimes of zero (RFC 8415 section 18.3.4).
    Refused(NakReason),
    /// No address is free in the pool (status NoAddrsAvail).
    Exhausted,
}

//! The on-disk form of one lease: the value stored under its address in the
//! leases table. Owns the byte layout and its validation, nothing else.
//!
//! Layout (format 1), all integers little-endian:
//!
//! | bytes  | field                                               |
//! |--------|-----------------------------------------------------|
//! | 0      | format, 1                                           |
//! | 1      | state: 1 bound, 2 declined, 3 released              |
//! | 2..8   | MAC, in transmission order                          |
//! | 8..16  | expires, unix seconds (u64)                         |
//! | 16     | 1 if a host name follows, else 0                    |
//! | 17..   | host name, UTF-8, to the end of the value           |

use super::{Lease, LeaseState};
use std::net::Ipv4Addr;

const FORMAT: u8 = 1;
const HEADER: usize = 17;

/// States that are written to disk; offers never are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stored {
    Bound,
    Declined,
    Released,
}

/// A lease as the leases table holds it, keyed by its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    pub mac: [u8; 6],
    pub state: Stored,
    pub expires: u64,
    pub hostname: Option<String>,
}

impl Record {
    /// Whether the record makes `mac`'s index point at this address: a
    /// binding or a release is the MAC's current or previous address, a
    /// decline is not.
    pub fn is_owned(&self) -> bool {
        matches!(self.state, Stored::Bound | Stored::Released)
    }

    pub fn to_state(&self) -> LeaseState {
        match self.state {
            Stored::Bound => LeaseState::Bound,
            Stored::Declined => LeaseState::Declined,
            Stored::Released => LeaseState::Released,
        }
    }

    pub fn to_lease(&self, ip: Ipv4Addr) -> Lease {
        Lease {
            mac: self.mac,
            ip,
            state: self.to_state(),
            expires: self.expires,
            hostname: self.hostname.clone(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let host = self.hostname.as_deref().map(str::as_bytes);
        let mut out = Vec::with_capacity(HEADER + host.map_or(0, <[u8]>::len));
        out.push(FORMAT);
        out.push(match self.state {
            Stored::Bound => 1,
            Stored::Declined => 2,
            Stored::Released => 3,
        });
        out.extend_from_slice(&self.mac);
        out.extend_from_slice(&self.expires.to_le_bytes());
        out.push(u8::from(host.is_some()));
        out.extend_from_slice(host.unwrap_or_default());
        out
    }

    /// Reads a value written by [`Record::encode`]; the error says what is
    /// wrong with it.
    pub fn decode(bytes: &[u8]) -> Result<Record, &'static str> {
        let Some((header, host)) = bytes.split_first_chunk::<HEADER>() else {
            return Err("shorter than the record header");
        };
        if header[0] != FORMAT {
            return Err("unknown record format");
        }
        let state = match header[1] {
            1 => Stored::Bound,
            2 => Stored::Declined,
            3 => Stored::Released,
            _ => return Err("unknown lease state"),
        };
        let mut mac = [0; 6];
        mac.copy_from_slice(&header[2..8]);
        let mut expires = [0; 8];
        expires.copy_from_slice(&header[8..16]);
        let hostname = match header[16] {
            0 if host.is_empty() => None,
            0 => return Err("trailing bytes after a record without host name"),
            1 => Some(
                std::str::from_utf8(host)
                    .map_err(|_| "host name is not UTF-8")?
                    .to_owned(),
            ),
            _ => return Err("unknown host name flag"),
        };
        Ok(Record {
            mac,
            state,
            expires: u64::from_le_bytes(expires),
            hostname,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_through_its_encoding() {
        for (state, hostname) in [
            (Stored::Bound, Some("node-17")),
            (Stored::Declined, None),
            (Stored::Released, Some("")),
        ] {
            let record = Record {
                mac: [0x52, 0x54, 0, 0x12, 0x34, 0x56],
                state,
                expires: 0x0102_0304_0506_0708,
                hostname: hostname.map(str::to_owned),
            };
            assert_eq!(Record::decode(&record.encode()), Ok(record));
        }
    }

    #[test]
    fn malformed_records_are_refused() {
        let good = Record {
            mac: [2; 6],
            state: Stored::Bound,
            expires: 7,
            hostname: None,
        }
        .encode();
        assert!(Record::decode(&good[..HEADER - 1]).is_err());
        let mut bad = good.clone();
        bad[0] = 9;
        assert_eq!(Record::decode(&bad), Err("unknown record format"));
        let mut bad = good.clone();
        bad[1] = 0;
        assert_eq!(Record::decode(&bad), Err("unknown lease state"));
        let mut bad = good.clone();
        bad.push(b'x');
        assert!(Record::decode(&bad).is_err());
        let mut bad = good;
        bad[16] = 1;
        bad.push(0xff);
        assert_eq!(Record::decode(&bad), Err("host name is not UTF-8"));
    }
}

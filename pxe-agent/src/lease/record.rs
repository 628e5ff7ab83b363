//! The on-disk form of one lease: the value stored under its address in the
//! leases table. Owns the byte layout and its validation, nothing else.
//!
//! Layout (format 2), all integers little-endian:
//!
//! | bytes  | field                                               |
//! |--------|-----------------------------------------------------|
//! | 0      | format, 2                                           |
//! | 1      | state: 1 bound, 2 declined, 3 released              |
//! | 2..8   | MAC, in transmission order                          |
//! | 8..16  | expires, unix seconds (u64)                         |
//! | 16     | n, the client identifier's length; 0: none          |
//! | 17..   | the client identifier (option 61), n bytes          |
//! | 17+n   | 1 if a host name follows, else 0                    |
//! | 18+n.. | host name, UTF-8, to the end of the value           |
//!
//! Format 1, written before client identifiers were kept, is format 2
//! without bytes 16.. of the identifier: byte 16 is the host name flag.
//! It is still read, as a record without a client identifier, so lease
//! files written by earlier versions load unchanged.
//!
//! Format 3 is an IPv6 lease (the leases6 table): format 2 with byte 0
//! set to 3, the client's DUID as the identifier (n bytes, at least one)
//! and its IAID (u32) right after it, before the host name flag. Its MAC
//! is all zeros when the client's DUID and address do not carry one. IPv4
//! leases are still written as format 2, so that an older agent reads a
//! store this one wrote.

use super::{Lease, LeaseState};
use std::net::Ipv4Addr;

const FORMAT_1: u8 = 1;
const FORMAT: u8 = 2;
const FORMAT_6: u8 = 3;
/// Format 1's header; format 2's is one byte longer.
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
    /// Option 61 of the request that made the record, when it had one;
    /// an IPv6 record's client DUID.
    pub client_id: Option<Vec<u8>>,
    /// The IAID of an IPv6 record's IA_NA; `None` for an IPv4 record.
    pub iaid: Option<u32>,
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
            client_id: self.client_id.clone(),
        }
    }

    /// The format 2 encoding, or format 3 for an IPv6 record. A client
    /// identifier longer than 255 bytes (option 61 cannot be, a DUID is at
    /// most 130) is cut to 255.
    pub fn encode(&self) -> Vec<u8> {
        let host = self.hostname.as_deref().map(str::as_bytes);
        let client_id = self.client_id.as_deref().unwrap_or_default();
        let client_id = &client_id[..client_id.len().min(255)];
        let mut out =
            Vec::with_capacity(HEADER + 5 + client_id.len() + host.map_or(0, <[u8]>::len));
        out.push(if self.iaid.is_some() {
            FORMAT_6
        } else {
            FORMAT
        });
        out.push(match self.state {
            Stored::Bound => 1,
            Stored::Declined => 2,
            Stored::Released => 3,
        });
        out.extend_from_slice(&self.mac);
        out.extend_from_slice(&self.expires.to_le_bytes());
        // Cut to 255 above.
        out.push(client_id.len() as u8);
        out.extend_from_slice(client_id);
        if let Some(iaid) = self.iaid {
            out.extend_from_slice(&iaid.to_le_bytes());
        }
        out.push(u8::from(host.is_some()));
        out.extend_from_slice(host.unwrap_or_default());
        out
    }

    /// Reads a value written by [`Record::encode`], or by format 1's; the
    /// error says what is wrong with it.
    pub fn decode(bytes: &[u8]) -> Result<Record, &'static str> {
        let Some((header, rest)) = bytes.split_first_chunk::<16>() else {
            return Err("shorter than the record header");
        };
        let mut iaid = None;
        let (client_id, rest) = match header[0] {
            FORMAT_1 => (None, rest),
            FORMAT_6 => {
                let Some((&len, rest)) = rest.split_first() else {
                    return Err("shorter than the record header");
                };
                if len == 0 {
                    return Err("IPv6 record without a DUID");
                }
                let Some((id, rest)) = rest.split_at_checked(usize::from(len)) else {
                    return Err("client identifier runs past the end of the record");
                };
                let Some((number, rest)) = rest.split_first_chunk::<4>() else {
                    return Err("IAID runs past the end of the record");
                };
                iaid = Some(u32::from_le_bytes(*number));
                (Some(id.to_vec()), rest)
            }
            FORMAT => {
                let Some((&len, rest)) = rest.split_first() else {
                    return Err("shorter than the record header");
                };
                let Some((id, rest)) = rest.split_at_checked(usize::from(len)) else {
                    return Err("client identifier runs past the end of the record");
                };
                ((len > 0).then(|| id.to_vec()), rest)
            }
            _ => return Err("unknown record format"),
        };
        let Some((&flag, host)) = rest.split_first() else {
            return Err("shorter than the record header");
        };
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
        let hostname = match flag {
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
            client_id,
            iaid,
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
                client_id: None,
                iaid: None,
            };
            assert_eq!(Record::decode(&record.encode()), Ok(record.clone()));
            let record = Record {
                client_id: Some(vec![0, 0x44, 0x45, 0x4c, 0x4c]),
                ..record
            };
            assert_eq!(Record::decode(&record.encode()), Ok(record.clone()));
            let record = Record {
                iaid: Some(0x0a0b_0c0d),
                ..record
            };
            let bytes = record.encode();
            assert_eq!(bytes[0], FORMAT_6);
            assert_eq!(Record::decode(&bytes), Ok(record));
        }
    }

    #[test]
    fn format_1_records_still_load_without_a_client_identifier() {
        // What the previous version wrote for a bound lease of node-17.
        let mut v1 = vec![1, 1, 0x52, 0x54, 0, 0x12, 0x34, 0x56];
        v1.extend_from_slice(&99u64.to_le_bytes());
        v1.push(1);
        v1.extend_from_slice(b"node-17");
        assert_eq!(
            Record::decode(&v1),
            Ok(Record {
                mac: [0x52, 0x54, 0, 0x12, 0x34, 0x56],
                state: Stored::Bound,
                expires: 99,
                hostname: Some("node-17".to_owned()),
                client_id: None,
                iaid: None,
            })
        );
        // Rewritten, it is format 2 and reads back the same.
        let record = Record::decode(&v1).expect("format 1");
        assert_eq!(record.encode()[0], FORMAT);
        assert_eq!(Record::decode(&record.encode()), Ok(record));
    }

    #[test]
    fn malformed_records_are_refused() {
        let good = Record {
            mac: [2; 6],
            state: Stored::Bound,
            expires: 7,
            hostname: None,
            client_id: None,
            iaid: None,
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
        let mut bad = good.clone();
        bad[17] = 1;
        bad.push(0xff);
        assert_eq!(Record::decode(&bad), Err("host name is not UTF-8"));
        let mut bad = good;
        bad[16] = 9;
        assert_eq!(
            Record::decode(&bad),
            Err("client identifier runs past the end of the record")
        );
        let six = Record {
            mac: [0; 6],
            state: Stored::Bound,
            expires: 7,
            hostname: None,
            client_id: Some(vec![0, 3, 0, 1, 2, 2, 2, 2, 2, 2]),
            iaid: Some(1),
        }
        .encode();
        assert_eq!(
            Record::decode(&six[..six.len() - 3]),
            Err("IAID runs past the end of the record")
        );
        let mut bad = six;
        bad[16] = 0;
        assert_eq!(Record::decode(&bad), Err("IPv6 record without a DUID"));
    }
}

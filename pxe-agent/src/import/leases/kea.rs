//! Kea's memfile lease files, `kea-leases4.csv` and `kea-leases6.csv`:
//! CSV with a header line naming the columns (read by name, so the
//! columns later versions add, such as `pool_id`, change nothing). The
//! file is append-only: every change to a lease appends a line, and the
//! last line for an address is the lease. A valid lifetime of 0 is a
//! deleted lease; `state` is 0 (held), 1 (declined), 2 (expired and
//! reclaimed) or 3 (released). Kea escapes a comma in a field as
//! `&#x2c`.
//!
//! IPv4 columns used: `address`, `hwaddr`, `client_id`,
//! `valid_lifetime`, `expire`, `hostname`, `state`. IPv6: `address`,
//! `duid`, `valid_lifetime`, `expire`, `lease_type` (0, IA_NA, is the only
//! kind carried), `iaid`, `hostname`, `hwaddr`, `state`.

use std::{collections::HashMap, net::IpAddr, path::Path};

use super::{Found, Holder, Reading, Skip};
use crate::{
    import::{ImportError, Origin, duid::parse_hex},
    mac::MacAddr,
};

/// The columns of a file, by name.
struct Columns {
    at: HashMap<String, usize>,
    v6: bool,
}

impl Columns {
    /// Column `name` of `fields`: `Ok(None)` when the file has no such
    /// column, an error when the line is too short to have it.
    fn get<'a>(&self, fields: &[&'a str], name: &str) -> Result<Option<&'a str>, String> {
        let Some(&i) = self.at.get(name) else {
            return Ok(None);
        };
        fields
            .get(i)
            .map(|f| Some(*f))
            .ok_or_else(|| format!("{} fields, too few for column {name}", fields.len()))
    }

    fn need<'a>(&self, fields: &[&'a str], name: &str) -> Result<&'a str, String> {
        self.get(fields, name)?
            .ok_or_else(|| format!("no column {name}"))
    }
}

/// Reads the memfile `text` (from `path`) into `reading`. A file without
/// a Kea lease header is refused whole.
pub fn read(reading: &mut Reading, path: &Path, text: &str) -> Result<(), ImportError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((header_at, header)) = lines.next() else {
        return Ok(());
    };
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    let v6 = match names.get(..2) {
        Some(["address", "hwaddr"]) => false,
        Some(["address", "duid"]) => true,
        _ => {
            return Err(ImportError::Parse {
                origin: Origin::new(path, header_at + 1),
                message: "not a Kea memfile lease file: the header does not start with \
                          address,hwaddr (kea-leases4.csv) or address,duid (kea-leases6.csv)"
                    .into(),
            });
        }
    };
    let columns = Columns {
        at: names
            .iter()
            .enumerate()
            .map(|(i, n)| ((*n).to_owned(), i))
            .collect(),
        v6,
    };
    for (index, line) in lines {
        let origin = Origin::new(path, index + 1);
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        match lease(&columns, &origin, &fields) {
            Ok(Line::Lease(found)) => reading.latest(found),
            Ok(Line::Other(ip, why, message)) => {
                // The line is the address's latest: an earlier lease of it
                // is gone too.
                reading.forget(ip);
                reading.skip(origin, why, message);
            }
            Err(message) => reading.skip(origin, Skip::Malformed, message),
        }
    }
    Ok(())
}

/// Kea's CSV escape for a comma inside a field.
fn unescape(field: &str) -> String {
    field.replace("&#x2c", ",")
}

fn number<T: std::str::FromStr>(name: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{name} {text:?} is not a number"))
}

/// What a readable lease line says.
enum Line {
    Lease(Found),
    /// The address's latest line is a lease the agent does not make, and
    /// why.
    Other(IpAddr, Skip, String),
}

/// A lease line: the lease, or its address and why it is not one the
/// agent makes; an error for a line that cannot be read.
fn lease(columns: &Columns, origin: &Origin, fields: &[&str]) -> Result<Line, String> {
    let address = columns.need(fields, "address")?;
    let ip: IpAddr = address
        .parse()
        .map_err(|_| format!("{address:?} is not an IP address"))?;
    if ip.is_ipv6() != columns.v6 {
        return Err(format!("{ip} in a file of the other family"));
    }
    let valid: u32 = number("valid_lifetime", columns.need(fields, "valid_lifetime")?)?;
    let expire: u64 = number("expire", columns.need(fields, "expire")?)?;
    let state: u32 = match columns.get(fields, "state")? {
        None | Some("") => 0,
        Some(s) => number("state", s)?,
    };
    let hostname = columns
        .get(fields, "hostname")?
        .filter(|h| !h.is_empty())
        .map(unescape);
    let hwaddr = match columns.get(fields, "hwaddr")?.filter(|h| !h.is_empty()) {
        None => None,
        Some(text) => Some(
            text.parse::<MacAddr>()
                .map_err(|_| format!("hwaddr {text:?} is not an Ethernet MAC address"))?,
        ),
    };
    let holder = if columns.v6 {
        let lease_type: u32 = number("lease_type", columns.need(fields, "lease_type")?)?;
        if lease_type != 0 {
            let kind = if lease_type == 2 {
                "a delegated prefix (IA_PD)"
            } else {
                "a temporary address (IA_TA)"
            };
            return Ok(Line::Other(ip, Skip::Kind, format!("{ip}: {kind}")));
        }
        let text = columns.need(fields, "duid")?;
        let duid = parse_hex(text).ok_or_else(|| format!("duid {text:?} is not hex bytes"))?;
        let iaid: u32 = number("iaid", columns.need(fields, "iaid")?)?;
        Holder::V6 {
            duid,
            iaid,
            mac: hwaddr,
        }
    } else {
        let Some(mac) = hwaddr else {
            return Ok(Line::Other(
                ip,
                Skip::Kind,
                format!("{ip}: no hardware address"),
            ));
        };
        let client_id = match columns.get(fields, "client_id")?.filter(|c| !c.is_empty()) {
            None => None,
            Some(text) => Some(
                parse_hex(text).ok_or_else(|| format!("client_id {text:?} is not hex bytes"))?,
            ),
        };
        Holder::V4 { mac, client_id }
    };
    let ended = match state {
        _ if valid == 0 => Some(Skip::Released),
        0 => None,
        1 => Some(Skip::Declined),
        2 => Some(Skip::Expired),
        3 => Some(Skip::Released),
        other => {
            return Ok(Line::Other(
                ip,
                Skip::Kind,
                format!("{ip}: lease state {other}"),
            ));
        }
    };
    Ok(Line::Lease(Found {
        origin: origin.clone(),
        ip,
        holder,
        // An infinite valid lifetime (RFC 2131 3.3, RFC 8415 7.7).
        expires: if valid == u32::MAX { u64::MAX } else { expire },
        hostname,
        ended,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASES4: &str = "\
address,hwaddr,client_id,valid_lifetime,expire,subnet_id,fqdn_fwd,fqdn_rev,hostname,state,user_context,pool_id
10.66.200.17,52:54:00:aa:00:01,01:52:54:00:aa:00:01,600,1733650000,1,0,0,node-a,0,,0
10.66.200.18,52:54:00:aa:00:02,,600,1733650000,1,0,0,,0,,0
10.66.200.18,52:54:00:aa:00:02,,600,1733650600,1,0,0,,0,,0
10.66.200.19,52:54:00:aa:00:03,,600,1733650000,1,0,0,,1,,0
10.66.200.20,52:54:00:aa:00:04,,600,1733650000,1,0,0,,2,,0
10.66.200.21,52:54:00:aa:00:05,,600,1733650000,1,0,0,,0,,0
10.66.200.21,52:54:00:aa:00:05,,0,1733650000,1,0,0,,0,,0
10.66.200.22,52:54:00:aa:00:06,,4294967295,1733650000,1,0,0,a&#x2cb,0,,0
10.66.200.23,not-a-mac,,600,1733650000,1,0,0,,0,,0
10.66.200.24,52:54:00:aa:00:08,,600
10.66.200.25,52:54:00:aa:00:09,,600,1733650000,1,0,0,,9,,0
";

    const LEASES6: &str = "\
address,duid,valid_lifetime,expire,subnet_id,pref_lifetime,lease_type,iaid,prefix_len,fqdn_fwd,fqdn_rev,hostname,hwaddr,state,user_context,hwtype,hwaddr_source,pool_id
fd00:66::17,00:03:00:01:52:54:00:aa:00:01,3600,1733650000,1,1800,0,7,128,0,0,node-a,52:54:00:aa:00:01,0,,1,2,0
fd00:66::,00:03:00:01:52:54:00:aa:00:02,3600,1733650000,1,1800,2,8,64,0,0,,,0,,1,2,0
fd00:66::19,zz,3600,1733650000,1,1800,0,9,128,0,0,,,0,,1,2,0
";

    fn read_one(text: &str) -> Reading {
        let mut reading = Reading::default();
        read(&mut reading, Path::new("kea-leases.csv"), text).expect("a memfile");
        reading
    }

    #[test]
    fn the_last_line_of_an_address_wins_and_states_are_read() {
        let reading = read_one(LEASES4);
        let found: Vec<(String, u64, Option<Skip>, usize)> = reading
            .found
            .iter()
            .map(|f| (f.ip.to_string(), f.expires, f.ended, f.origin.line))
            .collect();
        assert_eq!(
            found,
            vec![
                ("10.66.200.17".into(), 1_733_650_000, None, 2),
                ("10.66.200.18".into(), 1_733_650_600, None, 4),
                (
                    "10.66.200.19".into(),
                    1_733_650_000,
                    Some(Skip::Declined),
                    5
                ),
                ("10.66.200.20".into(), 1_733_650_000, Some(Skip::Expired), 6),
                (
                    "10.66.200.21".into(),
                    1_733_650_000,
                    Some(Skip::Released),
                    8
                ),
                ("10.66.200.22".into(), u64::MAX, None, 9),
            ]
        );
        assert_eq!(reading.found[5].hostname.as_deref(), Some("a,b"));
        assert_eq!(
            reading.found[0].holder,
            Holder::V4 {
                mac: MacAddr([0x52, 0x54, 0, 0xaa, 0, 1]),
                client_id: Some(vec![1, 0x52, 0x54, 0, 0xaa, 0, 1]),
            }
        );
        let skipped: Vec<(usize, Skip)> = reading
            .skipped
            .iter()
            .map(|(o, why, _)| (o.line, *why))
            .collect();
        assert_eq!(
            skipped,
            vec![
                (10, Skip::Malformed),
                (11, Skip::Malformed),
                (12, Skip::Kind)
            ]
        );
        assert!(
            reading.skipped[1].2.contains("too few"),
            "{:?}",
            reading.skipped
        );
    }

    #[test]
    fn ipv6_leases_carry_duid_and_iaid_and_prefixes_are_not_carried() {
        let reading = read_one(LEASES6);
        assert_eq!(reading.found.len(), 1, "{:?}", reading.found);
        assert_eq!(
            reading.found[0].holder,
            Holder::V6 {
                duid: vec![0, 3, 0, 1, 0x52, 0x54, 0, 0xaa, 0, 1],
                iaid: 7,
                mac: Some(MacAddr([0x52, 0x54, 0, 0xaa, 0, 1])),
            }
        );
        let skipped: Vec<(usize, Skip)> = reading
            .skipped
            .iter()
            .map(|(o, why, _)| (o.line, *why))
            .collect();
        assert_eq!(skipped, vec![(3, Skip::Kind), (4, Skip::Malformed)]);
    }

    #[test]
    fn a_file_that_is_not_a_memfile_is_refused_and_garbage_never_panics() {
        let mut reading = Reading::default();
        let err = read(
            &mut reading,
            Path::new("x.csv"),
            "1733650000 52:54:00:aa:00:01 10.0.0.1 * *\n",
        )
        .expect_err("not a memfile");
        assert!(err.to_string().contains("x.csv:1"), "{err}");
        let junk = "address,hwaddr\n\u{0},,,\n,,,,,,,,,,,,,\n10.0.0.1,52:54:00:aa:00:01\n";
        let reading = read_one(junk);
        assert!(reading.found.is_empty());
        assert_eq!(reading.skipped.len(), 3, "{:?}", reading.skipped);
    }
}

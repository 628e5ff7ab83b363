//! dnsmasq's lease file (`--dhcp-leasefile`, by default
//! `/var/lib/misc/dnsmasq.leases`), as dnsmasq's `lease_update_file`
//! writes it, one lease a line:
//!
//! - IPv4: `EXPIRY MAC ADDRESS HOSTNAME CLIENT-ID`; the MAC is
//!   `TYPE-xx:…` for hardware other than Ethernet;
//! - `duid SERVER-DUID`: dnsmasq's own DUID, before the IPv6 leases;
//! - IPv6: `EXPIRY IAID ADDRESS HOSTNAME CLIENT-DUID`; the IAID is
//!   `T<iaid>` for a temporary address (IA_TA).
//!
//! `EXPIRY` is unix seconds, 0 for a lease that never expires; `*` stands
//! for a missing host name or client identifier.

use std::{net::IpAddr, path::Path};

use super::{Found, Holder, Reading, Skip};
use crate::{
    import::{Origin, duid::parse_hex},
    mac::MacAddr,
};

/// Reads the lease file `text` (from `path`) into `reading`.
pub fn read(reading: &mut Reading, path: &Path, text: &str) {
    for (index, line) in text.lines().enumerate() {
        let origin = Origin::new(path, index + 1);
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [] => {}
            ["duid", _] => {}
            [expiry, id, ip, name, client] => match lease(&origin, [expiry, id, ip, name, client]) {
                Ok(Line::Lease(found)) => reading.latest(found),
                Ok(Line::Other(why, message)) => reading.skip(origin, why, message),
                Err(message) => reading.skip(origin, Skip::Malformed, message),
            },
            _ => reading.skip(
                origin,
                Skip::Malformed,
                format!(
                    "{} fields where a lease has 5 (expiry, MAC or IAID, address, host name, client id)",
                    fields.len()
                ),
            ),
        }
    }
}

/// What one well-formed line holds.
enum Line {
    Lease(Found),
    /// A lease the agent does not make, and why.
    Other(Skip, String),
}

/// The line of `origin` whose fields are `[expiry, id, ip, name, client]`.
fn lease(origin: &Origin, [expiry, id, ip, name, client]: [&str; 5]) -> Result<Line, String> {
    let expires = match expiry.parse::<u64>() {
        Ok(0) => u64::MAX,
        Ok(at) => at,
        Err(_) => return Err(format!("expiry {expiry:?} is not a number of seconds")),
    };
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| format!("{ip:?} is not an IP address"))?;
    let hostname = (name != "*").then(|| name.to_owned());
    let client = if client == "*" {
        None
    } else {
        Some(parse_hex(client).ok_or_else(|| format!("client id {client:?} is not hex bytes"))?)
    };
    let holder = match ip {
        IpAddr::V4(_) => {
            if let Some((kind, _)) = id.split_once('-') {
                return Ok(Line::Other(
                    Skip::Kind,
                    format!("{ip}: hardware type {kind} is not Ethernet"),
                ));
            }
            let mac: MacAddr = id
                .parse()
                .map_err(|_| format!("{id:?} is not a MAC address"))?;
            Holder::V4 {
                mac,
                client_id: client,
            }
        }
        IpAddr::V6(_) => {
            if id.starts_with('T') {
                return Ok(Line::Other(
                    Skip::Kind,
                    format!("{ip}: a temporary address (IA_TA)"),
                ));
            }
            let iaid: u32 = id
                .parse()
                .map_err(|_| format!("IAID {id:?} is not a number"))?;
            let Some(duid) = client else {
                return Err(format!("IPv6 lease of {ip} without a client DUID"));
            };
            Holder::V6 {
                duid,
                iaid,
                mac: None,
            }
        }
    };
    Ok(Line::Lease(Found {
        origin: origin.clone(),
        ip,
        holder,
        expires,
        hostname,
        ended: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
1733650000 52:54:00:aa:00:01 10.66.200.17 node-a 01:52:54:00:aa:00:01
0 52:54:00:aa:00:02 10.66.200.18 * *
1733650000 06-52:54:00:aa:00:03 10.66.200.19 * *
this line is not a lease
1733650000 52:54:00:aa:00:04 10.66.200.300 * *
soon 52:54:00:aa:00:05 10.66.200.20 * *
duid 00:01:00:01:2c:5e:7a:10:52:54:00:00:00:01
1733650000 305419896 fd00:66::17 node-a 00:03:00:01:52:54:00:aa:00:01
1733650000 T7 fd00:66::18 * 00:03:00:01:52:54:00:aa:00:02
1733650000 12 fd00:66::19 * *
";

    #[test]
    fn reads_both_families_and_names_each_bad_line_by_number() {
        let mut reading = Reading::default();
        read(&mut reading, Path::new("dnsmasq.leases"), FILE);
        let found: Vec<(String, &Holder, u64, Option<&str>, usize)> = reading
            .found
            .iter()
            .map(|f| {
                (
                    f.ip.to_string(),
                    &f.holder,
                    f.expires,
                    f.hostname.as_deref(),
                    f.origin.line,
                )
            })
            .collect();
        let mac = |n: u8| MacAddr([0x52, 0x54, 0, 0xaa, 0, n]);
        assert_eq!(
            found,
            vec![
                (
                    "10.66.200.17".to_string(),
                    &Holder::V4 {
                        mac: mac(1),
                        client_id: Some(vec![1, 0x52, 0x54, 0, 0xaa, 0, 1])
                    },
                    1_733_650_000,
                    Some("node-a"),
                    1
                ),
                (
                    "10.66.200.18".to_string(),
                    &Holder::V4 {
                        mac: mac(2),
                        client_id: None
                    },
                    u64::MAX,
                    None,
                    2
                ),
                (
                    "fd00:66::17".to_string(),
                    &Holder::V6 {
                        duid: vec![0, 3, 0, 1, 0x52, 0x54, 0, 0xaa, 0, 1],
                        iaid: 305_419_896,
                        mac: None
                    },
                    1_733_650_000,
                    Some("node-a"),
                    8
                ),
            ]
        );
        let skipped: Vec<(usize, Skip)> = reading
            .skipped
            .iter()
            .map(|(o, why, _)| (o.line, *why))
            .collect();
        assert_eq!(
            skipped,
            vec![
                (3, Skip::Kind),
                (4, Skip::Malformed),
                (5, Skip::Malformed),
                (6, Skip::Malformed),
                (9, Skip::Kind),
                (10, Skip::Malformed),
            ]
        );
        assert!(
            reading.skipped[1]
                .2
                .contains("6 fields where a lease has 5"),
            "{:?}",
            reading.skipped[1]
        );
        assert!(reading.skipped[2].2.contains("10.66.200.300"));
        assert_eq!(reading.skipped[0].0.to_string(), "dnsmasq.leases:3");
    }

    #[test]
    fn garbage_never_panics() {
        let mut reading = Reading::default();
        let junk = "\u{0}\u{ff}\n 1 2 3 4 5\n-1 :: :: :: ::\n18446744073709551616 x y z w\n\
                    1 52:54:00:aa:00:01 10.0.0.1 * zz:zz\n1 4294967296 ::1 * 00\n";
        read(&mut reading, Path::new("x"), junk);
        assert!(reading.found.is_empty(), "{:?}", reading.found);
        assert_eq!(reading.skipped.len(), 6, "{:?}", reading.skipped);
    }
}

//! DUIDs as dnsmasq (`dhcp-host=id:…`) and Kea (`"duid"`) write them, read
//! for what the inventory can match a DHCPv6 client by: the MAC of an
//! Ethernet DUID-LLT or DUID-LL, or the system UUID of a DUID-UUID (RFC
//! 8415 section 11, RFC 6355). The agent reads DUIDs off the wire in
//! `dhcp::v6::identity`, a layer above the importers; the two kinds needed
//! here are read again rather than imported upwards.

use crate::mac::MacAddr;

/// What a DUID names that a host of the inventory can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DuidName {
    /// The link-layer address of a DUID-LLT (type 1) or DUID-LL (type 3)
    /// of hardware type 1, Ethernet. A DUID-LLT names an interface the
    /// client had when it made the DUID, which is the one it boots from
    /// on a machine with one port.
    Mac(MacAddr),
    /// The 16 bytes of a DUID-UUID (type 4), in the order written. The
    /// agent matches a host's `uuid` against a DUID-UUID in both byte
    /// orders firmware sends (see `dhcp::v6::identity`), so the bytes as
    /// written are the host's `uuid`.
    Uuid([u8; 16]),
}

const DUID_LLT: u16 = 1;
const DUID_EN: u16 = 2;
const DUID_LL: u16 = 3;
const DUID_UUID: u16 = 4;
const HTYPE_ETHERNET: u16 = 1;

/// Hex bytes separated by colons, one or two digits each as dnsmasq
/// accepts (`0:3:0:1:…`), or an unseparated run of digit pairs as Kea also
/// accepts; `None` for anything else (dnsmasq's `id:` may also be text).
pub fn parse_hex(text: &str) -> Option<Vec<u8>> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    if text.contains(':') {
        return text
            .split(':')
            .map(|digits| {
                let hex = (1..=2).contains(&digits.len())
                    && digits.bytes().all(|b| b.is_ascii_hexdigit());
                hex.then(|| u8::from_str_radix(digits, 16).ok()).flatten()
            })
            .collect();
    }
    crate::inventory::decode_hex(text).ok()
}

/// What `duid` names, or why it names nothing the inventory can match
/// (for the report).
pub fn read(duid: &[u8]) -> Result<DuidName, String> {
    let (kind, rest) = split_u16(duid).ok_or("it is shorter than a DUID type")?;
    match kind {
        DUID_LLT | DUID_LL => {
            let (htype, rest) = split_u16(rest).ok_or("it has no hardware type")?;
            // DUID-LLT: seconds since 2000 (4 bytes) before the address.
            let address = if kind == DUID_LLT {
                rest.get(4..).unwrap_or(&[])
            } else {
                rest
            };
            let name = if kind == DUID_LLT {
                "DUID-LLT"
            } else {
                "DUID-LL"
            };
            if htype != HTYPE_ETHERNET {
                return Err(format!(
                    "it is a {name} of hardware type {htype}, not Ethernet"
                ));
            }
            <[u8; 6]>::try_from(address)
                .map(|mac| DuidName::Mac(MacAddr(mac)))
                .map_err(|_| format!("it is a {name} whose address is not 6 bytes"))
        }
        DUID_UUID => <[u8; 16]>::try_from(rest)
            .map(DuidName::Uuid)
            .map_err(|_| "it is a DUID-UUID whose UUID is not 16 bytes".to_string()),
        DUID_EN => Err("it is a DUID-EN, a vendor's number that names no MAC or UUID".to_string()),
        other => Err(format!(
            "its type {other} is not a DUID-LLT, DUID-LL or DUID-UUID"
        )),
    }
}

/// A big-endian u16 and what follows it.
fn split_u16(bytes: &[u8]) -> Option<(u16, &[u8])> {
    match bytes {
        [hi, lo, rest @ ..] => Some((u16::from_be_bytes([*hi, *lo]), rest)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> Result<DuidName, String> {
        read(&parse_hex(text).expect("hex"))
    }

    #[test]
    fn link_layer_duids_give_their_mac() {
        let mac: MacAddr = "52:54:00:12:34:56".parse().unwrap();
        // DUID-LL, as dnsmasq and Kea write it.
        assert_eq!(
            name("00:03:00:01:52:54:00:12:34:56"),
            Ok(DuidName::Mac(mac))
        );
        // DUID-LLT with its time, upper case and without separators (Kea).
        assert_eq!(name("000100012B3C4D5E525400123456"), Ok(DuidName::Mac(mac)));
        // One-digit groups, as dnsmasq's parser takes them.
        assert_eq!(name("0:3:0:1:52:54:0:12:34:56"), Ok(DuidName::Mac(mac)));
    }

    #[test]
    fn uuid_duid_gives_its_bytes_in_order() {
        let got = name("00:04:8a:5c:2e:6b:1e:0f:4c:1d:9b:7a:01:23:45:67:89:ab");
        let Ok(DuidName::Uuid(uuid)) = got else {
            panic!("{got:?}");
        };
        assert_eq!(
            crate::inventory::uuid_text(&uuid),
            "8a5c2e6b-1e0f-4c1d-9b7a-0123456789ab"
        );
    }

    #[test]
    fn other_duids_say_why_they_name_nothing() {
        for (text, says) in [
            ("00:02:00:00:00:09:0c:c0:84:d3:03:00:09:12", "DUID-EN"),
            ("00:03:00:06:52:54:00:12:34:56", "hardware type 6"),
            ("00:01:00:01:2b:3c:4d:5e:52:54:00:12:34", "not 6 bytes"),
            ("00:04:8a:5c:2e:6b", "not 16 bytes"),
            ("01:52:54:00:12:34:56", "type 338"),
            ("00", "shorter than a DUID type"),
        ] {
            let err = name(text).expect_err(text);
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn hex_forms() {
        assert_eq!(parse_hex("0a:B:00"), Some(vec![0x0a, 0x0b, 0]));
        assert_eq!(parse_hex("0aB0"), Some(vec![0x0a, 0xb0]));
        assert_eq!(parse_hex("0aB"), None);
        assert_eq!(parse_hex("clientidastext"), None);
        assert_eq!(parse_hex("01::02"), None);
        assert_eq!(parse_hex("001:02"), None);
        assert_eq!(parse_hex(""), None);
    }
}

//! Ethernet hardware addresses, the name every layer knows a host by. Owns
//! parsing (`52:54:00:12:34:56` or `52-54-00-12-34-56`, any case), the
//! canonical lowercase, colon-separated display and the serde form, which
//! is that same text; not the BOOTP `chaddr` handling, which belongs to the
//! DHCP code.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// A 48-bit Ethernet MAC address, in transmission order.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct MacAddr(pub [u8; 6]);

/// A string that is not six two-digit hex octets joined by `:` or `-`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{input:?} is not a mac address (expected six two-digit hex octets separated by ':' or '-')"
)]
pub struct ParseMacError {
    /// The rejected text, as written.
    pub input: String,
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for MacAddr {
    type Err = ParseMacError;

    fn from_str(s: &str) -> Result<MacAddr, ParseMacError> {
        let error = || ParseMacError {
            input: s.to_owned(),
        };
        // One separator per address: "52:54-00:..." is far more likely a typo
        // than a deliberate spelling, so it is refused.
        let separator = if s.contains(':') { ':' } else { '-' };
        let mut octets = [0u8; 6];
        let mut parts = s.split(separator);
        for octet in &mut octets {
            let part = parts.next().ok_or_else(error)?;
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(error());
            }
            *octet = u8::from_str_radix(part, 16).map_err(|_| error())?;
        }
        if parts.next().is_some() {
            return Err(error());
        }
        Ok(MacAddr(octets))
    }
}

/// The display form: `"52:54:00:12:34:56"`.
impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Any form [`FromStr`] takes.
impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<MacAddr, D::Error> {
        struct Text;

        impl de::Visitor<'_> for Text {
            type Value = MacAddr;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mac address such as \"52:54:00:12:34:56\"")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<MacAddr, E> {
                text.parse().map_err(E::custom)
            }
        }

        deserializer.deserialize_str(Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x5a]);

    #[test]
    fn displays_lowercase_with_colons() {
        assert_eq!(MAC.to_string(), "52:54:00:12:34:5a");
        assert_eq!(MacAddr([0; 6]).to_string(), "00:00:00:00:00:00");
    }

    #[test]
    fn parses_colon_and_dash_separated_in_any_case() {
        for text in [
            "52:54:00:12:34:5a",
            "52:54:00:12:34:5A",
            "52-54-00-12-34-5a",
            "52-54-00-12-34-5A",
        ] {
            assert_eq!(text.parse::<MacAddr>(), Ok(MAC), "{text}");
        }
    }

    #[test]
    fn display_round_trips_through_parse() {
        assert_eq!(MAC.to_string().parse::<MacAddr>(), Ok(MAC));
    }

    #[test]
    fn rejects_malformed_addresses() {
        for text in [
            "",
            "52:54:00:12:34",
            "52:54:00:12:34:5a:00",
            "52:54:00:12:34:5g",
            "52:54:0:12:34:5a",
            "052:54:00:12:34:5a",
            "52:54-00:12:34:5a",
            "52540012345a",
            "52.54.00.12.34.5a",
            " 52:54:00:12:34:5a",
            "+2:54:00:12:34:5a",
        ] {
            let err = text.parse::<MacAddr>().expect_err(text);
            assert_eq!(err.input, text);
        }
    }

    #[test]
    fn parse_error_names_the_input() {
        let err = "nope".parse::<MacAddr>().expect_err("malformed");
        assert!(
            err.to_string().contains("\"nope\" is not a mac address"),
            "{err}"
        );
    }

    #[test]
    fn serializes_as_its_display_text() {
        assert_eq!(
            serde_json::to_string(&MAC).expect("json"),
            "\"52:54:00:12:34:5a\""
        );
    }

    #[test]
    fn deserializes_every_form_it_parses() {
        for text in ["\"52:54:00:12:34:5a\"", "\"52-54-00-12-34-5A\""] {
            let mac: MacAddr = serde_json::from_str(text).expect(text);
            assert_eq!(mac, MAC, "{text}");
        }
    }

    #[test]
    fn deserializing_refuses_what_parsing_refuses_and_names_it() {
        let err = serde_json::from_str::<MacAddr>("\"52:54:00:12:34\"").expect_err("short");
        assert!(
            err.to_string()
                .contains("\"52:54:00:12:34\" is not a mac address"),
            "{err}"
        );
        assert!(serde_json::from_str::<MacAddr>("[82, 84, 0, 18, 52, 90]").is_err());
    }

    #[test]
    fn round_trips_as_a_map_key() {
        let map = std::collections::BTreeMap::from([(MAC, 1u32)]);
        let json = serde_json::to_string(&map).expect("json");
        assert_eq!(json, r#"{"52:54:00:12:34:5a":1}"#);
        let back: std::collections::BTreeMap<MacAddr, u32> =
            serde_json::from_str(&json).expect("map");
        assert_eq!(back, map);
    }
}

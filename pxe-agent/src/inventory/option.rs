//! Per-host extra DHCP options: which codes a host may set and how a YAML
//! value becomes option bytes. Owns the encoding table documented in
//! `docs/inventory.md`; not where the options go in a reply (that is
//! `dhcp::decide`).

use std::net::Ipv4Addr;

use serde_norway::Value;

/// Longest value a single DHCP option can carry (one length octet,
/// RFC 2132 section 2).
pub(super) const MAX_OPTION_LEN: usize = 255;

/// How an integer value is encoded for a given option code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Width {
    U8,
    U16,
    I32,
    U32,
}

impl Width {
    fn describe(self) -> &'static str {
        match self {
            Width::U8 => "1-byte unsigned integer (0..=255)",
            Width::U16 => "2-byte unsigned integer (0..=65535)",
            Width::I32 => "4-byte signed integer (-2147483648..=2147483647)",
            Width::U32 => "4-byte unsigned integer (0..=4294967295)",
        }
    }
}

/// Integer width for `code`, from the option definitions in RFC 2132
/// (and RFC 2563 for 116). Options not listed are 32-bit unsigned, which
/// covers every timer and most other numeric options.
pub(super) fn integer_width(code: u8) -> Width {
    match code {
        // Time offset, seconds east of UTC (RFC 2132 3.4).
        2 => Width::I32,
        // Flags and TTLs (RFC 2132 4.1-4.2, 5.1-5.9, 6.1-6.3, 7.1-7.3, 8.7;
        // RFC 2563 auto-configure).
        19 | 20 | 23 | 27 | 29 | 30 | 31 | 34 | 36 | 37 | 39 | 46 | 116 => Width::U8,
        // Boot file size in 512-byte blocks, max datagram reassembly size,
        // interface MTU, max DHCP message size (RFC 2132 3.16, 4.4, 5.1, 9.10).
        13 | 22 | 26 | 57 => Width::U16,
        _ => Width::U32,
    }
}

/// Why `code` may not be set per host, or `None` when it may.
///
/// 0 and 255 are the pad and end markers; the others are either sent by
/// the server from its own state or are client/relay-only (RFC 2132
/// section 9, RFC 3046).
pub(super) fn refusal(code: u8) -> Option<&'static str> {
    Some(match code {
        0 => "option code 0 is the pad marker; codes must be 1..=254",
        255 => "option code 255 is the end marker; codes must be 1..=254",
        50 => "option 50 (requested ip address) is sent by clients only",
        51 => "option 51 (lease time) is set by the server from the subnet's lease_time",
        52 => "option 52 (option overload) is managed by the server",
        53 => "option 53 (message type) is managed by the server",
        54 => "option 54 (server identifier) is managed by the server",
        55 => "option 55 (parameter request list) is sent by clients only",
        56 => "option 56 (message) is managed by the server",
        57 => "option 57 (maximum message size) is sent by clients only",
        58 => "option 58 (renewal time) is managed by the server",
        61 => "option 61 (client identifier) is sent by clients only",
        82 => "option 82 (relay agent information) is added by relays only",
        _ => return None,
    })
}

/// Encodes `value` as the payload of option `code`; the error is a
/// lowercase message for a [`Problem`](super::Problem).
pub(super) fn encode(code: u8, value: &Value) -> Result<Vec<u8>, String> {
    let bytes = match value {
        Value::String(text) => encode_string(text)?,
        Value::Sequence(items) => encode_address_list(items)?,
        Value::Number(number) => encode_integer(code, number)?,
        Value::Bool(flag) => vec![u8::from(*flag)],
        Value::Null => {
            return Err(
                "value is empty; write \"\" or \"hex:\" for a zero-length option".to_owned(),
            );
        }
        Value::Mapping(_) => return Err(unsupported("a mapping")),
        Value::Tagged(tagged) => {
            return Err(unsupported(&format!("a value tagged {}", tagged.tag)));
        }
    };
    if bytes.len() > MAX_OPTION_LEN {
        return Err(format!(
            "value encodes to {} bytes; a dhcp option holds at most {MAX_OPTION_LEN}",
            bytes.len()
        ));
    }
    Ok(bytes)
}

fn unsupported(what: &str) -> String {
    format!(
        "{what} is not a supported option value (use an ipv4 address, a list of them, \
         an integer, true/false, \"hex:...\" or text)"
    )
}

fn encode_string(text: &str) -> Result<Vec<u8>, String> {
    if let Some(hex) = text.strip_prefix("hex:") {
        return decode_hex(hex);
    }
    if let Ok(address) = text.parse::<Ipv4Addr>() {
        return Ok(address.octets().to_vec());
    }
    Ok(text.as_bytes().to_vec())
}

fn decode_hex(hex: &str) -> Result<Vec<u8>, String> {
    if let Some(bad) = hex.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(format!(
            "hex value contains {bad:?}, which is not a hex digit"
        ));
    }
    if !hex.len().is_multiple_of(2) {
        return Err(format!(
            "hex value has {} digits; it needs two per byte",
            hex.len()
        ));
    }
    // All digits are ASCII, so every two-byte slice is on a char boundary.
    (0..hex.len())
        .step_by(2)
        .map(|at| {
            u8::from_str_radix(&hex[at..at + 2], 16).map_err(|e| format!("bad hex value: {e}"))
        })
        .collect()
}

fn encode_address_list(items: &[Value]) -> Result<Vec<u8>, String> {
    if items.is_empty() {
        return Err("list is empty; a list value must hold at least one ipv4 address".to_owned());
    }
    let mut bytes = Vec::with_capacity(items.len() * 4);
    for (index, item) in items.iter().enumerate() {
        let address = match item {
            Value::String(text) => text.parse::<Ipv4Addr>().ok(),
            _ => None,
        };
        let address = address.ok_or_else(|| {
            format!(
                "list item {index} ({}) is not an ipv4 address; lists may only hold ipv4 addresses",
                show(item)
            )
        })?;
        bytes.extend_from_slice(&address.octets());
    }
    Ok(bytes)
}

fn encode_integer(code: u8, number: &serde_norway::Number) -> Result<Vec<u8>, String> {
    let width = integer_width(code);
    let value = match (number.as_i64(), number.as_u64()) {
        (Some(signed), _) => i128::from(signed),
        (None, Some(unsigned)) => i128::from(unsigned),
        (None, None) => {
            return Err(format!(
                "{number} is not an integer; fractional values are not supported"
            ));
        }
    };
    let out_of_range = || format!("{number} does not fit option {code}'s {}", width.describe());
    Ok(match width {
        Width::U8 => u8::try_from(value)
            .map_err(|_| out_of_range())?
            .to_be_bytes()
            .to_vec(),
        Width::U16 => u16::try_from(value)
            .map_err(|_| out_of_range())?
            .to_be_bytes()
            .to_vec(),
        Width::I32 => i32::try_from(value)
            .map_err(|_| out_of_range())?
            .to_be_bytes()
            .to_vec(),
        Width::U32 => u32::try_from(value)
            .map_err(|_| out_of_range())?
            .to_be_bytes()
            .to_vec(),
    })
}

/// A short rendering of a YAML value for messages.
pub(super) fn show(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(flag) => flag.to_string(),
        Value::Number(number) => number.to_string(),
        Value::String(text) => format!("{text:?}"),
        Value::Sequence(_) => "a list".to_owned(),
        Value::Mapping(_) => "a mapping".to_owned(),
        Value::Tagged(tagged) => format!("a value tagged {}", tagged.tag),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> Value {
        serde_norway::from_str(text).expect("test yaml parses")
    }

    fn encoded(code: u8, text: &str) -> Result<Vec<u8>, String> {
        encode(code, &yaml(text))
    }

    #[test]
    fn ipv4_string_encodes_as_four_bytes() {
        assert_eq!(encoded(42, "10.66.0.1"), Ok(vec![10, 66, 0, 1]));
        assert_eq!(encoded(42, "'10.66.0.1'"), Ok(vec![10, 66, 0, 1]));
    }

    #[test]
    fn ipv4_list_encodes_as_concatenation() {
        assert_eq!(
            encoded(6, "[10.66.0.1, 10.66.0.2]"),
            Ok(vec![10, 66, 0, 1, 10, 66, 0, 2])
        );
    }

    #[test]
    fn list_with_a_non_address_is_refused() {
        let err = encoded(6, "[10.66.0.1, nope]").expect_err("not an address");
        assert!(err.contains("list item 1 (\"nope\")"), "{err}");
        assert!(encoded(6, "[10.66.0.1, 7]").is_err());
        assert!(encoded(6, "[]").is_err());
    }

    #[test]
    fn integer_width_follows_the_known_code_table() {
        let cases: &[(u8, &str, &[u8])] = &[
            (23, "64", &[64]),
            (37, "128", &[128]),
            (19, "1", &[1]),
            (26, "1500", &[0x05, 0xdc]),
            (22, "576", &[0x02, 0x40]),
            (13, "65535", &[0xff, 0xff]),
            (2, "-3600", &(-3600i32).to_be_bytes()),
            (2, "3600", &[0, 0, 0x0e, 0x10]),
            (24, "600", &[0, 0, 0x02, 0x58]),
            (35, "60", &[0, 0, 0, 60]),
            (35, "4294967295", &[0xff; 4]),
            // Not in the table: 32-bit unsigned.
            (224, "1", &[0, 0, 0, 1]),
        ];
        for (code, value, bytes) in cases {
            assert_eq!(
                encoded(*code, value).as_deref(),
                Ok(*bytes),
                "option {code} = {value}"
            );
        }
    }

    #[test]
    fn integer_out_of_its_width_is_refused() {
        for (code, value) in [
            (23, "256"),
            (23, "-1"),
            (26, "65536"),
            (35, "-1"),
            (35, "4294967296"),
            (2, "2147483648"),
            (224, "18446744073709551615"),
        ] {
            let err = encoded(code, value).expect_err(value);
            assert!(err.contains("does not fit"), "{err}");
        }
    }

    #[test]
    fn float_is_refused() {
        assert!(encoded(26, "1.5").is_err());
    }

    #[test]
    fn bool_encodes_as_one_byte() {
        assert_eq!(encoded(19, "true"), Ok(vec![1]));
        assert_eq!(encoded(19, "false"), Ok(vec![0]));
        // Width comes from the type, not the code.
        assert_eq!(encoded(224, "true"), Ok(vec![1]));
    }

    #[test]
    fn hex_string_encodes_raw_bytes() {
        assert_eq!(encoded(43, "hex:0a0B0c"), Ok(vec![0x0a, 0x0b, 0x0c]));
        assert_eq!(encoded(80, "'hex:'"), Ok(vec![]));
        assert!(
            encoded(43, "hex:0a0")
                .expect_err("odd")
                .contains("3 digits")
        );
        assert!(
            encoded(43, "hex:0x0a")
                .expect_err("not hex")
                .contains("'x'")
        );
    }

    #[test]
    fn other_string_encodes_as_utf8() {
        assert_eq!(
            encoded(66, "tftp.lab.example"),
            Ok(b"tftp.lab.example".to_vec())
        );
        assert_eq!(encoded(26, "'1500'"), Ok(b"1500".to_vec()));
        assert_eq!(encoded(12, "'nœud'"), Ok("nœud".as_bytes().to_vec()));
        assert_eq!(encoded(80, "''"), Ok(vec![]));
    }

    #[test]
    fn value_longer_than_255_bytes_is_refused() {
        assert_eq!(
            encode(224, &Value::String("x".repeat(255))).map(|b| b.len()),
            Ok(255)
        );
        let err = encode(224, &Value::String("x".repeat(256))).expect_err("too long");
        assert!(err.contains("256 bytes"), "{err}");
    }

    #[test]
    fn null_mapping_and_tagged_values_are_refused() {
        for text in ["~", "{a: 1}", "!custom 1"] {
            assert!(encoded(224, text).is_err(), "{text}");
        }
    }

    #[test]
    fn pad_end_and_server_owned_codes_are_refused() {
        for code in [0, 255, 50, 51, 52, 53, 54, 55, 56, 57, 58, 61, 82] {
            assert!(refusal(code).is_some(), "option {code}");
        }
        for code in [1, 3, 6, 42, 49, 59, 60, 66, 67, 81, 83, 254] {
            assert_eq!(refusal(code), None, "option {code}");
        }
    }
}

//! Per-host extra DHCP options: which codes a host may set, what the codes
//! with a defined format hold, and how a YAML value becomes option bytes.
//! Owns the format and encoding tables documented in `docs/inventory.md`;
//! not where the options go in a reply (that is `dhcp::reply`).

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

    fn bytes(self) -> usize {
        match self {
            Width::U8 => 1,
            Width::U16 => 2,
            Width::I32 | Width::U32 => 4,
        }
    }
}

/// What the value of an option with a defined format holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Format {
    /// Exactly one IPv4 address.
    Address,
    /// One or more IPv4 addresses.
    Addresses,
    /// One or more pairs of IPv4 addresses (address and mask, or
    /// destination and router).
    AddressPairs,
    Integer(Width),
    /// One octet, 0 or 1.
    Flag,
    /// At least one character, none of them a control character.
    Text,
    /// A host or domain name: letters, digits, `-` and `.`.
    Name,
}

impl Format {
    fn describe(self) -> String {
        match self {
            Format::Address => "one ipv4 address".to_owned(),
            Format::Addresses => "one or more ipv4 addresses (an address or a list)".to_owned(),
            Format::AddressPairs => {
                "pairs of ipv4 addresses (a list with an even number of them)".to_owned()
            }
            Format::Integer(width) => format!("a {}", width.describe()),
            Format::Flag => "a flag (true or false, or 1 or 0)".to_owned(),
            Format::Text => "text of at least one character, without control characters".to_owned(),
            Format::Name => "a name of letters, digits, '-' and '.'".to_owned(),
        }
    }

    /// Whether `len` bytes written as `hex:` can be a value of this format.
    fn fits(self, len: usize) -> bool {
        match self {
            Format::Address => len == 4,
            Format::Addresses => len >= 4 && len.is_multiple_of(4),
            Format::AddressPairs => len >= 8 && len.is_multiple_of(8),
            Format::Integer(width) => len == width.bytes(),
            Format::Flag => len == 1,
            Format::Text | Format::Name => len >= 1,
        }
    }
}

/// Name and format of `code` where an RFC defines one: RFC 2132 and the
/// codes PXE and iPXE clients read (RFC 2563 116, RFC 5859 150, RFC 5071
/// 209-211). `None` for codes without a fixed format here (vendor
/// options 43 and 125, encapsulated 175, classless routes 121, ...) and
/// for the site-specific range 224-254: their values keep the encoding
/// their YAML type gives them.
pub(super) fn known(code: u8) -> Option<(&'static str, Format)> {
    use Format::*;
    Some(match code {
        1 => ("subnet mask", Address),
        2 => ("time offset", Integer(Width::I32)),
        3 => ("router", Addresses),
        4 => ("time server", Addresses),
        5 => ("name server", Addresses),
        6 => ("domain name server", Addresses),
        7 => ("log server", Addresses),
        8 => ("cookie server", Addresses),
        9 => ("lpr server", Addresses),
        10 => ("impress server", Addresses),
        11 => ("resource location server", Addresses),
        12 => ("host name", Name),
        13 => ("boot file size", Integer(Width::U16)),
        14 => ("merit dump file", Text),
        15 => ("domain name", Name),
        16 => ("swap server", Address),
        17 => ("root path", Text),
        18 => ("extensions path", Text),
        19 => ("ip forwarding", Flag),
        20 => ("non-local source routing", Flag),
        21 => ("policy filter", AddressPairs),
        22 => ("maximum datagram reassembly size", Integer(Width::U16)),
        23 => ("default ip ttl", Integer(Width::U8)),
        24 => ("path mtu aging timeout", Integer(Width::U32)),
        26 => ("interface mtu", Integer(Width::U16)),
        27 => ("all subnets are local", Flag),
        28 => ("broadcast address", Address),
        29 => ("perform mask discovery", Flag),
        30 => ("mask supplier", Flag),
        31 => ("perform router discovery", Flag),
        32 => ("router solicitation address", Address),
        33 => ("static route", AddressPairs),
        34 => ("trailer encapsulation", Flag),
        35 => ("arp cache timeout", Integer(Width::U32)),
        36 => ("ethernet encapsulation", Flag),
        37 => ("tcp default ttl", Integer(Width::U8)),
        38 => ("tcp keepalive interval", Integer(Width::U32)),
        39 => ("tcp keepalive garbage", Flag),
        40 => ("nis domain", Text),
        41 => ("nis servers", Addresses),
        42 => ("ntp servers", Addresses),
        44 => ("netbios name servers", Addresses),
        45 => ("netbios datagram distribution servers", Addresses),
        46 => ("netbios node type", Integer(Width::U8)),
        47 => ("netbios scope", Text),
        48 => ("x window font servers", Addresses),
        49 => ("x window display managers", Addresses),
        50 => ("requested ip address", Address),
        51 => ("lease time", Integer(Width::U32)),
        54 => ("server identifier", Address),
        57 => ("maximum dhcp message size", Integer(Width::U16)),
        58 => ("renewal time", Integer(Width::U32)),
        59 => ("rebinding time", Integer(Width::U32)),
        60 => ("vendor class identifier", Text),
        64 => ("nis+ domain", Text),
        65 => ("nis+ servers", Addresses),
        66 => ("tftp server name", Text),
        67 => ("bootfile name", Text),
        69 => ("smtp servers", Addresses),
        70 => ("pop3 servers", Addresses),
        71 => ("nntp servers", Addresses),
        72 => ("www servers", Addresses),
        73 => ("finger servers", Addresses),
        74 => ("irc servers", Addresses),
        75 => ("streettalk servers", Addresses),
        76 => ("streettalk directory assistance servers", Addresses),
        116 => ("auto-configure", Integer(Width::U8)),
        150 => ("tftp server address", Addresses),
        209 => ("pxelinux configuration file", Text),
        210 => ("pxelinux path prefix", Text),
        211 => ("pxelinux reboot time", Integer(Width::U32)),
        _ => return None,
    })
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

/// Encodes `value` as the payload of option `code` as every `options`
/// map takes it (a host's, a rule's, a profile's or a subnet's): refused
/// codes first ([`refusal`]), then [`encode`]. For the importers, which
/// carry options only when the inventory takes them.
pub fn encode_option(code: u8, value: &Value) -> Result<Vec<u8>, String> {
    match refusal(code) {
        Some(reason) => Err(reason.to_owned()),
        None => encode(code, value),
    }
}

/// Encodes `value` as the payload of option `code`; the error is a
/// lowercase message for a [`Problem`](super::Problem). The one place that
/// decides what an option value may be: a code with a [`known`] format
/// takes only values of that format, any other code takes what its YAML
/// type encodes to.
pub(super) fn encode(code: u8, value: &Value) -> Result<Vec<u8>, String> {
    let bytes = match known(code) {
        Some((name, format)) => encode_known(value, format).map_err(|detail| {
            format!(
                "option {code} ({name}) holds {}; {detail}",
                format.describe()
            )
        })?,
        None => encode_by_type(value)?,
    };
    if bytes.len() > MAX_OPTION_LEN {
        return Err(format!(
            "value encodes to {} bytes; a dhcp option holds at most {MAX_OPTION_LEN}",
            bytes.len()
        ));
    }
    Ok(bytes)
}

/// A value of a code without a known format: its YAML type picks the
/// encoding, integers are 4-byte unsigned.
fn encode_by_type(value: &Value) -> Result<Vec<u8>, String> {
    match value {
        Value::String(text) => encode_string(text),
        Value::Sequence(items) => encode_address_list(items),
        Value::Number(number) => encode_integer(Width::U32, number).map_err(|detail| {
            format!(
                "{detail}; an option without a defined format takes an integer as a {}",
                Width::U32.describe()
            )
        }),
        Value::Bool(flag) => Ok(vec![u8::from(*flag)]),
        Value::Null => Err(empty()),
        Value::Mapping(_) => Err(unsupported("a mapping")),
        Value::Tagged(tagged) => Err(unsupported(&format!("a value tagged {}", tagged.tag))),
    }
}

/// A value of a code with a known format, or why it is not one (the
/// caller says which format was expected). `hex:` stays possible for
/// every format, with the length the format needs.
fn encode_known(value: &Value, format: Format) -> Result<Vec<u8>, String> {
    let wrong = || format!("{} is not one", show(value));
    match value {
        Value::Null => return Err(empty()),
        Value::String(text) => {
            if let Some(hex) = text.strip_prefix("hex:") {
                let bytes = decode_hex(hex)?;
                if !format.fits(bytes.len()) {
                    return Err(format!(
                        "{} encodes to {} bytes, which is not one",
                        show(value),
                        bytes.len()
                    ));
                }
                return Ok(bytes);
            }
        }
        _ => {}
    }
    match (format, value) {
        (Format::Address | Format::Addresses, Value::String(text)) => text
            .parse::<Ipv4Addr>()
            .map(|address| address.octets().to_vec())
            .map_err(|_| wrong()),
        (Format::Addresses, Value::Sequence(items)) => encode_address_list(items),
        (Format::AddressPairs, Value::Sequence(items)) if items.len().is_multiple_of(2) => {
            encode_address_list(items)
        }
        (Format::AddressPairs, Value::Sequence(items)) => Err(format!(
            "the list has {} addresses, an odd number",
            items.len()
        )),
        (Format::Integer(width), Value::Number(number)) => encode_integer(width, number),
        (Format::Flag, Value::Bool(flag)) => Ok(vec![u8::from(*flag)]),
        (Format::Flag, Value::Number(number)) => match number.as_u64() {
            Some(flag @ (0 | 1)) => Ok(vec![u8::from(flag == 1)]),
            _ => Err(wrong()),
        },
        (Format::Text, Value::String(text)) => {
            if text.is_empty() {
                Err("the text is empty".to_owned())
            } else if let Some(bad) = text.chars().find(|c| c.is_control()) {
                Err(format!("{text:?} contains the control character {bad:?}"))
            } else {
                Ok(text.as_bytes().to_vec())
            }
        }
        (Format::Name, Value::String(text)) => {
            if text.is_empty() {
                Err("the name is empty".to_owned())
            } else if let Some(bad) = text
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '.'))
            {
                Err(format!("{text:?} contains {bad:?}"))
            } else {
                Ok(text.as_bytes().to_vec())
            }
        }
        _ => Err(wrong()),
    }
}

fn empty() -> String {
    "value is empty; write \"\" or \"hex:\" for a zero-length option".to_owned()
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

/// Bytes from an unseparated run of hex digit pairs, any case; the one
/// hex reader of option values, DUIDs kept on disk and imported DUIDs.
pub fn decode_hex(hex: &str) -> Result<Vec<u8>, String> {
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

fn encode_integer(width: Width, number: &serde_norway::Number) -> Result<Vec<u8>, String> {
    let value = match (number.as_i64(), number.as_u64()) {
        (Some(signed), _) => i128::from(signed),
        (None, Some(unsigned)) => i128::from(unsigned),
        (None, None) => {
            return Err(format!(
                "{number} is not an integer; fractional values are not supported"
            ));
        }
    };
    let out_of_range = || format!("{number} does not fit");
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
        assert_eq!(encoded(224, "'1500'"), Ok(b"1500".to_vec()));
        assert_eq!(encoded(224, "'nœud'"), Ok("nœud".as_bytes().to_vec()));
        assert_eq!(encoded(80, "''"), Ok(vec![]));
    }

    #[test]
    fn known_codes_take_values_of_their_format() {
        let cases: &[(u8, &str, &[u8])] = &[
            (1, "255.255.0.0", &[255, 255, 0, 0]),
            (1, "hex:ffff0000", &[255, 255, 0, 0]),
            (3, "10.66.0.1", &[10, 66, 0, 1]),
            (3, "[10.66.0.1, 10.66.0.2]", &[10, 66, 0, 1, 10, 66, 0, 2]),
            (33, "[10.1.0.0, 10.66.0.1]", &[10, 1, 0, 0, 10, 66, 0, 1]),
            (19, "true", &[1]),
            (46, "8", &[8]),
            (59, "3000", &[0, 0, 0x0b, 0xb8]),
            // A text option keeps an address-like value as text.
            (66, "10.66.0.1", b"10.66.0.1"),
            (67, "'pxelinux.0'", b"pxelinux.0"),
            // hex: reaches any byte, e.g. the NUL some PXE ROMs want.
            (67, "hex:61626300", b"abc\0"),
            (15, "lab.example", b"lab.example"),
            (150, "[10.66.0.1]", &[10, 66, 0, 1]),
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
    fn known_codes_refuse_values_of_another_format() {
        let cases: &[(u8, &str, &str)] = &[
            (
                3,
                "notanip",
                "option 3 (router) holds one or more ipv4 addresses (an address or a list); \
                 \"notanip\" is not one",
            ),
            (3, "7", "7 is not one"),
            (3, "hex:0a0b0c", "encodes to 3 bytes"),
            (6, "[10.66.0.1, nope]", "list item 1 (\"nope\")"),
            (
                1,
                "[255.255.0.0, 255.0.0.0]",
                "option 1 (subnet mask) holds one ipv4 address",
            ),
            (28, "true", "option 28 (broadcast address)"),
            (33, "[10.1.0.0, 10.66.0.1, 10.2.0.0]", "odd number"),
            (
                26,
                "'1500'",
                "option 26 (interface mtu) holds a 2-byte unsigned integer",
            ),
            (26, "65536", "65536 does not fit"),
            (23, "true", "option 23 (default ip ttl)"),
            (2, "hex:0e10", "encodes to 2 bytes"),
            (51, "10.0.0.1", "option 51 (lease time)"),
            (
                19,
                "2",
                "option 19 (ip forwarding) holds a flag (true or false, or 1 or 0); 2 is not one",
            ),
            (12, "'node_1'", "option 12 (host name)"),
            (12, "'nœud'", "contains 'œ'"),
            (12, "7", "option 12 (host name)"),
            (15, "[10.0.0.1]", "option 15 (domain name)"),
            (66, "''", "the text is empty"),
            (67, "\"undionly.kpxe\\nshell\"", "control character '\\n'"),
            (67, "'hex:'", "encodes to 0 bytes"),
            (66, "~", "value is empty"),
        ];
        for (code, value, expect) in cases {
            let err = encoded(*code, value).expect_err(value);
            assert!(err.contains(expect), "option {code} = {value}: {err}");
        }
    }

    #[test]
    fn unknown_and_site_specific_codes_keep_the_encoding_of_their_yaml_type() {
        assert_eq!(encoded(224, "notanip"), Ok(b"notanip".to_vec()));
        assert_eq!(encoded(254, "10.66.0.1"), Ok(vec![10, 66, 0, 1]));
        assert_eq!(encoded(43, "hex:0102"), Ok(vec![1, 2]));
        assert_eq!(encoded(175, "7"), Ok(vec![0, 0, 0, 7]));
        for code in 224..=254 {
            assert_eq!(known(code), None, "option {code}");
        }
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

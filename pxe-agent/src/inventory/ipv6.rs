//! The IPv6 side of the model: IPv6 subnets (written in the same
//! `subnets:` list as IPv4 ones, told apart by their CIDR) and what a host
//! has for IPv6 boot, its address and the system UUID its firmware's
//! DUID-UUID carries. Validation is in `validate`; the DHCPv6 policy that
//! reads it is `dhcp::v6`.

use std::{
    fmt::{self, Write as _},
    net::Ipv6Addr,
};

/// Valid lifetime of a DHCPv6 lease when a subnet does not set
/// `lease_time`, in seconds: as for IPv4.
pub const DEFAULT_LEASE_TIME_V6: u32 = super::DEFAULT_LEASE_TIME;

/// An IPv6 subnet the agent serves by DHCPv6.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subnet6 {
    /// Network address (host bits zero).
    pub network: Ipv6Addr,
    /// Prefix length, 0..=128.
    pub prefix: u8,
    /// DNS recursive name servers (option 23).
    pub dns: Vec<Ipv6Addr>,
    /// Domain search list (option 24): the subnet's `domain`.
    pub domain: Option<String>,
    /// Valid lifetime of its leases, seconds; the preferred lifetime and
    /// the renewal times derive from it.
    pub lease_time: u32,
    /// Addresses for machines that are not in the inventory.
    pub pool: Option<Range6>,
    /// Router advertisements the agent sends on the subnet's link, when
    /// the subnet asks for them (`ra:`).
    pub ra: Option<Advertise>,
    /// Where the raw subnet stood in `subnets:`, for messages.
    pub written_at: usize,
}

impl Subnet6 {
    fn mask(&self) -> u128 {
        match self.prefix {
            0 => 0,
            prefix => u128::MAX << (128 - u32::from(prefix.min(128))),
        }
    }

    pub fn contains(&self, ip: Ipv6Addr) -> bool {
        let mask = self.mask();
        u128::from(ip) & mask == u128::from(self.network) & mask
    }

    /// The network address with its host bits cleared.
    pub fn masked(address: Ipv6Addr, prefix: u8) -> Ipv6Addr {
        let subnet = Subnet6 {
            network: address,
            prefix,
            dns: Vec::new(),
            domain: None,
            lease_time: 0,
            pool: None,
            ra: None,
            written_at: 0,
        };
        Ipv6Addr::from(u128::from(address) & subnet.mask())
    }

    pub fn overlaps(&self, other: &Subnet6) -> bool {
        let prefix = self.prefix.min(other.prefix);
        Subnet6::masked(self.network, prefix) == Subnet6::masked(other.network, prefix)
    }
}

/// CIDR notation, e.g. `fd00:66::/64`.
impl fmt::Display for Subnet6 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// What the agent's router advertisements for a subnet say (RFC 4861
/// section 4.2): its prefix is on-link, not for SLAAC, and where the
/// addresses and other settings come from. The agent does not route, so
/// it never advertises itself as a default router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advertise {
    /// M: addresses from DHCPv6 (iPXE and UEFI start a stateful Solicit).
    pub managed: bool,
    /// O: other configuration from DHCPv6 (an Information-Request).
    pub other: bool,
}

/// An inclusive range of IPv6 addresses, `start` to `end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Range6 {
    pub start: Ipv6Addr,
    pub end: Ipv6Addr,
}

impl Range6 {
    pub fn contains(&self, ip: Ipv6Addr) -> bool {
        self.start <= ip && ip <= self.end
    }
}

/// `fd00:66::1000-fd00:66::1fff`.
impl fmt::Display for Range6 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

/// What a host has for IPv6 boot. Boxed in [`super::Host`], as its BMC
/// settings are: most hosts of an IPv4 fleet have none of it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Host6 {
    /// Its reserved IPv6 address (`ipv6:`), with the index of the subnet
    /// in [`super::Inventory::subnets6`] that holds it.
    pub ip: Option<(Ipv6Addr, usize)>,
    /// Its SMBIOS system UUID (`uuid:`), in the byte order of its text
    /// (RFC 4122, [`parse_uuid`]); `dhcp::v6::identity` reads a DUID-UUID
    /// into the same order.
    pub uuid: Option<[u8; 16]>,
}

/// The canonical text of a UUID's 16 bytes, read in order: 8-4-4-4-12
/// lowercase hex digits.
pub fn uuid_text(uuid: &[u8; 16]) -> String {
    let mut text = String::with_capacity(36);
    for (i, byte) in uuid.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        // Writing to a String cannot fail.
        let _ = write!(text, "{byte:02x}");
    }
    text
}

/// Reads the canonical text of a UUID (8-4-4-4-12 hex digits, any case,
/// optionally in braces) into its 16 bytes in the order the text reads
/// them.
pub fn parse_uuid(text: &str) -> Result<[u8; 16], String> {
    let inner = match (text.strip_prefix('{'), text.strip_suffix('}')) {
        (Some(_), Some(_)) if text.len() >= 2 => &text[1..text.len() - 1],
        (None, None) => text,
        _ => return Err(format!("{text:?} has an unmatched brace")),
    };
    let groups: Vec<&str> = inner.split('-').collect();
    if groups.len() != 5 || groups.iter().map(|g| g.len()).ne([8, 4, 4, 4, 12]) {
        return Err(format!(
            "{text:?} is not a uuid (expected 8-4-4-4-12 hex digits, such as \
             2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e)"
        ));
    }
    let digits = groups.concat();
    if let Some(bad) = digits.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(format!(
            "{text:?} is not a uuid: {bad:?} is not a hex digit"
        ));
    }
    let mut uuid = [0u8; 16];
    for (byte, pair) in uuid.iter_mut().zip(digits.as_bytes().chunks_exact(2)) {
        let pair = std::str::from_utf8(pair).map_err(|_| format!("{text:?} is not a uuid"))?;
        *byte = u8::from_str_radix(pair, 16).map_err(|_| format!("{text:?} is not a uuid"))?;
    }
    Ok(uuid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_text_is_canonical_and_parses_back() {
        let uuid = [
            0x2b, 0x6a, 0x81, 0xe4, 0x5b, 0x6f, 0x4c, 0x2a, 0x9d, 0x3e, 0x7f, 0x0a, 0x1b, 0x2c,
            0x3d, 0x4e,
        ];
        assert_eq!(uuid_text(&uuid), "2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e");
        for text in [
            "2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e",
            "2B6A81E4-5B6F-4C2A-9D3E-7F0A1B2C3D4E",
            "{2b6a81e4-5b6f-4C2A-9d3e-7f0a1b2c3d4e}",
        ] {
            assert_eq!(parse_uuid(text), Ok(uuid), "{text}");
        }
    }

    #[test]
    fn malformed_uuid_text_is_refused_with_the_reason() {
        for (text, says) in [
            ("", "expected 8-4-4-4-12"),
            ("2b6a81e45b6f4c2a9d3e7f0a1b2c3d4e", "expected 8-4-4-4-12"),
            ("2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4", "expected 8-4-4-4-12"),
            (
                "2b6a81e4-5b6f4-c2a-9d3e-7f0a1b2c3d4e",
                "expected 8-4-4-4-12",
            ),
            (
                "2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e-",
                "expected 8-4-4-4-12",
            ),
            ("{2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e", "unmatched brace"),
            ("2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e}", "unmatched brace"),
            ("{", "unmatched brace"),
            (
                "2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4g",
                "'g' is not a hex digit",
            ),
            (
                "2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d+e",
                "'+' is not a hex digit",
            ),
            // Twelve bytes in the last group, but not twelve digits.
            (
                "2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3dé",
                "'é' is not a hex digit",
            ),
        ] {
            let err = parse_uuid(text).expect_err(text);
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }

    #[test]
    fn subnets_contain_and_overlap_by_prefix() {
        let net = |text: &str, prefix| Subnet6 {
            network: text.parse().unwrap(),
            prefix,
            dns: Vec::new(),
            domain: None,
            lease_time: 3600,
            pool: None,
            ra: None,
            written_at: 0,
        };
        let a = net("fd00:66::", 64);
        assert!(a.contains("fd00:66::20".parse().unwrap()));
        assert!(!a.contains("fd00:67::20".parse().unwrap()));
        assert!(a.overlaps(&net("fd00::", 16)));
        assert!(!a.overlaps(&net("fd00:67::", 64)));
        assert_eq!(
            Subnet6::masked("fd00:66::1".parse().unwrap(), 64),
            a.network
        );
    }
}

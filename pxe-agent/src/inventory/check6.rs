//! The inventory's IPv6 rules: an IPv6 entry of `subnets:` and a host's
//! `ipv6` and `uuid`. `validate` calls them in file order and owns the
//! checks across hosts (an address or UUID used twice).

use std::net::Ipv6Addr;

use super::{
    Advertise, DEFAULT_LEASE_TIME_V6, Range6, Subnet6, SubnetMode, parse_uuid,
    raw::{RawRange, RawSubnet},
};

/// What an IPv4 entry of `subnets:` may not have.
pub(super) fn ipv6_only_keys(entry: &RawSubnet, report: &mut impl FnMut(&str, String)) {
    if entry.ra.is_some() {
        report(
            "ra",
            "router advertisements are IPv6's; an IPv4 subnet has none".to_owned(),
        );
    }
}

/// Whether a `subnets:` entry is an IPv6 subnet: its CIDR is written with
/// colons (also when it is malformed, so its message is an IPv6 one).
pub(super) fn is_ipv6(entry: &RawSubnet) -> bool {
    entry.cidr.contains(':')
}

/// Checks an IPv6 entry of `subnets:` (at `index` in the list); `None`
/// where its CIDR is unusable. A subnet with other problems is still
/// returned so hosts can be checked against it.
pub(super) fn subnet6(
    index: usize,
    entry: &RawSubnet,
    earlier: &[Option<Subnet6>],
    report: &mut impl FnMut(&str, String),
) -> Option<Subnet6> {
    if entry.router.is_some() {
        report(
            "router",
            "an IPv6 subnet has no router option: hosts learn their router from router \
             advertisements; leave router out"
                .to_owned(),
        );
    }
    if !entry.options.is_empty() {
        report(
            "options",
            "options are DHCPv4 option codes, for IPv4 subnets, profiles and hosts; \
             an IPv6 subnet takes none (its clients get dns, domain and the boot URL)"
                .to_owned(),
        );
    }
    if entry.mode == SubnetMode::Proxy {
        report(
            "mode",
            "proxy is for IPv4 (PXE 2.1 proxyDHCP); an IPv6 subnet is served in mode server"
                .to_owned(),
        );
    }
    let mut dns = Vec::with_capacity(entry.dns.len());
    for (position, text) in entry.dns.iter().enumerate() {
        match text.parse::<Ipv6Addr>() {
            Ok(server) => dns.push(server),
            Err(_) => report(&format!("dns[{position}]"), not_an_ipv6_address(text)),
        }
    }
    if entry.lease_time == Some(0) {
        report("lease_time", "must be at least 1 second".to_owned());
    }
    let (address, prefix) = match parse_cidr6(&entry.cidr) {
        Ok(parsed) => parsed,
        Err(message) => {
            report("cidr", message);
            return None;
        }
    };
    let mut subnet = Subnet6 {
        network: Subnet6::masked(address, prefix),
        prefix,
        dns,
        domain: entry.domain.clone(),
        lease_time: entry.lease_time.unwrap_or(DEFAULT_LEASE_TIME_V6),
        pool: None,
        ra: entry.ra.as_ref().map(|ra| Advertise {
            managed: ra.managed,
            other: ra.other,
        }),
        written_at: index,
    };
    if subnet.network != address {
        report(
            "cidr",
            format!("{} has host bits set; the network is {subnet}", entry.cidr),
        );
    }
    if prefix > 126 {
        report("cidr", format!("/{prefix} leaves no address to hand out"));
    }
    if let Some(other) = earlier.iter().flatten().find(|s| s.overlaps(&subnet)) {
        report(
            "cidr",
            format!("{subnet} overlaps subnets[{}] ({other})", other.written_at),
        );
    }
    subnet.pool = entry
        .pool
        .as_ref()
        .and_then(|pool| pool6(pool, &subnet, report));
    Some(subnet)
}

fn pool6(
    raw: &RawRange,
    subnet: &Subnet6,
    report: &mut impl FnMut(&str, String),
) -> Option<Range6> {
    let mut end_point = |key: &str, text: &str| match text.parse::<Ipv6Addr>() {
        Ok(address) if !subnet.contains(address) => {
            report(key, format!("{address} is outside {subnet}"));
            Some(address)
        }
        Ok(address) if address == subnet.network => {
            report(
                key,
                format!("{address} is the subnet-router anycast address of {subnet}"),
            );
            Some(address)
        }
        Ok(address) => Some(address),
        Err(_) => {
            report(key, not_an_ipv6_address(text));
            None
        }
    };
    let start = end_point("pool.start", &raw.start);
    let end = end_point("pool.end", &raw.end);
    let pool = Range6 {
        start: start?,
        end: end?,
    };
    if pool.end < pool.start {
        report(
            "pool",
            format!("start {} is after end {}", pool.start, pool.end),
        );
        return None;
    }
    Some(pool)
}

/// A host's `ipv6`: the address and the index of its subnet in `subnets6`.
pub(super) fn host_ipv6(
    text: &str,
    subnets6: &[Option<Subnet6>],
    report: &mut impl FnMut(&str, String),
) -> Option<(Ipv6Addr, usize)> {
    let Ok(ip) = text.parse::<Ipv6Addr>() else {
        report("ipv6", not_an_ipv6_address(text));
        return None;
    };
    let Some((at, subnet)) = subnets6
        .iter()
        .enumerate()
        .find_map(|(at, s)| s.as_ref().filter(|s| s.contains(ip)).map(|s| (at, s)))
    else {
        report("ipv6", format!("{ip} is outside every IPv6 subnet"));
        return None;
    };
    if ip == subnet.network {
        report(
            "ipv6",
            format!("{ip} is the subnet-router anycast address of {subnet}"),
        );
    } else if let Some(pool) = subnet.pool.filter(|pool| pool.contains(ip)) {
        report(
            "ipv6",
            format!(
                "{ip} is inside the discovery pool {pool} of subnets[{}] ({subnet}); \
                 reserve addresses outside it",
                subnet.written_at
            ),
        );
    }
    Some((ip, at))
}

/// A host's `uuid`.
pub(super) fn host_uuid(text: &str, report: &mut impl FnMut(&str, String)) -> Option<[u8; 16]> {
    match parse_uuid(text) {
        Ok(uuid) if uuid == [0; 16] || uuid == [0xff; 16] => {
            // Firmware of boards whose UUID was never set sends these; they
            // would match every such machine.
            report(
                "uuid",
                format!("{text} is the UUID of a board that has none set; it names no one machine"),
            );
            None
        }
        Ok(uuid) => Some(uuid),
        Err(message) => {
            report("uuid", message);
            None
        }
    }
}

/// `address/prefix`; host bits are checked by the caller.
fn parse_cidr6(text: &str) -> Result<(Ipv6Addr, u8), String> {
    let malformed =
        || format!("{text:?} is not a cidr (expected address/prefix, e.g. fd00:66::/64)");
    let (address, prefix) = text.split_once('/').ok_or_else(malformed)?;
    let address = address.parse::<Ipv6Addr>().map_err(|_| malformed())?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    match prefix.parse::<u8>() {
        Ok(prefix) if prefix <= 128 => Ok((address, prefix)),
        _ => Err(format!("prefix /{prefix} is out of range 0..=128")),
    }
}

fn not_an_ipv6_address(text: &str) -> String {
    format!("{text:?} is not an IPv6 address")
}

#[cfg(test)]
mod tests {
    use std::{net::Ipv4Addr, path::Path};

    use crate::inventory::{IPV6_PLACEHOLDER, Inventory, LoadError, Problem, parse_uuid};

    /// An IPv6 subnet written before the IPv4 one, so that a host's IPv4
    /// subnet index is its position among the IPv4 subnets only.
    const DUAL: &str = r#"
subnets:
  - cidr: fd00:66::/64
    dns: ["fd00:66::1"]
    domain: lab.example
    lease_time: 600
    pool: {start: "fd00:66::1000", end: "fd00:66::1fff"}
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
profiles:
  - name: worker
    boot: {uefi: ipxe.efi}
hosts:
  - mac: "52:54:00:12:34:56"
    ip: 10.66.1.10
    ipv6: "fd00:66::20"
    uuid: 8A5C2E6B-1E0F-4C1D-9B7A-0123456789AB
    hostname: node-1
    profile: worker
  - mac: "52:54:00:12:34:57"
    ip: 10.66.1.11
    profile: worker
"#;

    fn parse(text: &str) -> Result<Inventory, LoadError> {
        Inventory::parse(Path::new("hosts.yaml"), text)
    }

    fn problems(text: &str) -> Vec<String> {
        match parse(text) {
            Err(LoadError::Invalid { problems, .. }) => {
                problems.iter().map(Problem::to_string).collect()
            }
            other => panic!("expected validation problems, got {other:?}"),
        }
    }

    #[test]
    fn ipv6_subnets_share_the_list_and_hosts_carry_an_ipv6_address_and_uuid() {
        let inv = parse(DUAL).expect("valid");
        assert_eq!(inv.subnets.len(), 1);
        assert_eq!(inv.subnets6.len(), 1);
        let six = &inv.subnets6[0];
        assert_eq!(six.to_string(), "fd00:66::/64");
        assert_eq!(
            six.dns,
            ["fd00:66::1".parse::<std::net::Ipv6Addr>().unwrap()]
        );
        assert_eq!((six.lease_time, six.written_at), (600, 0));
        assert_eq!(six.pool.unwrap().to_string(), "fd00:66::1000-fd00:66::1fff");

        let host = &inv.hosts[0];
        assert_eq!(
            inv.subnet_of(host).map(|s| s.network),
            Some(Ipv4Addr::new(10, 66, 0, 0))
        );
        assert_eq!(host.ipv6(), Some("fd00:66::20".parse().unwrap()));
        let uuid = parse_uuid("8a5c2e6b-1e0f-4c1d-9b7a-0123456789ab").unwrap();
        assert_eq!(host.uuid(), Some(&uuid));
        assert_eq!(inv.subnet6_of(host), Some(six));
        assert_eq!(
            inv.host_by_ip6("fd00:66::20".parse().unwrap())
                .map(|h| h.mac),
            Some(host.mac)
        );
        assert_eq!(inv.host_by_uuid(&uuid).map(|h| h.mac), Some(host.mac));
        // An IPv4-only host carries nothing for IPv6.
        assert!(inv.hosts[1].v6.is_none());
        assert!(inv.host_by_ip6("fd00:66::21".parse().unwrap()).is_none());
    }

    #[test]
    fn a_host_may_have_only_an_ipv6_address_but_not_neither() {
        let text = DUAL.replace("    ip: 10.66.1.10\n", "");
        let inv = parse(&text).expect("an IPv6-only host is valid");
        let host = &inv.hosts[0];
        assert_eq!((host.ipv4(), inv.subnet_of(host)), (None, None));
        assert_eq!(host.ipv6(), Some("fd00:66::20".parse().unwrap()));
        assert_eq!(
            inv.host_by_ip6("fd00:66::20".parse().unwrap())
                .map(|h| h.mac),
            Some(host.mac)
        );
        // Its neighbour keeps its IPv4 address in the index.
        assert_eq!(
            inv.host_by_ip(Ipv4Addr::new(10, 66, 1, 11)).map(|h| h.mac),
            Some(inv.hosts[1].mac)
        );

        let text = DUAL.replace("    ip: 10.66.1.11\n", "");
        let found = problems(&text);
        assert_eq!(
            found,
            ["host 52:54:00:12:34:57: field ip: missing: a host needs an ip, an ipv6 or both"],
        );
    }

    #[test]
    fn ipv6_problems_name_the_host_and_field() {
        let text = DUAL
            .replace("    dns: [\"fd00:66::1\"]", "    router: fd00:66::1\n    dns: [10.0.0.1]")
            .replace(
                "    ip: 10.66.1.11\n",
                "    ip: 10.66.1.11\n    ipv6: \"fd00:66::20\"\n    uuid: 8a5c2e6b-1e0f-4c1d-9b7a-0123456789ab\n",
            )
            + r#"  - mac: "52:54:00:12:34:58"
    ip: 10.66.1.12
    ipv6: "fd00:67::1"
    uuid: not-a-uuid
    profile: worker
  - mac: "52:54:00:12:34:59"
    ip: 10.66.1.13
    ipv6: "fd00:66::1001"
    uuid: 00000000-0000-0000-0000-000000000000
    profile: worker
"#;
        let found = problems(&text);
        let expected = [
            "field subnets[0].router: an IPv6 subnet has no router option",
            "field subnets[0].dns[0]: \"10.0.0.1\" is not an IPv6 address",
            "host 52:54:00:12:34:57: field ipv6: fd00:66::20 is already assigned to node-1 (52:54:00:12:34:56)",
            "host 52:54:00:12:34:57: field uuid: 8a5c2e6b-1e0f-4c1d-9b7a-0123456789ab is already the uuid of node-1 (52:54:00:12:34:56)",
            "host 52:54:00:12:34:58: field ipv6: fd00:67::1 is outside every IPv6 subnet",
            "host 52:54:00:12:34:58: field uuid: \"not-a-uuid\" is not a uuid",
            "host 52:54:00:12:34:59: field ipv6: fd00:66::1001 is inside the discovery pool",
            "host 52:54:00:12:34:59: field uuid: 00000000-0000-0000-0000-000000000000 is the UUID of a board that has none set",
        ];
        assert_eq!(found.len(), expected.len(), "{found:#?}");
        for (found, expected) in found.iter().zip(expected) {
            assert!(
                found.starts_with(expected),
                "{found:?}\n  does not start with\n{expected:?}"
            );
        }
    }

    #[test]
    fn a_profile_that_puts_ipv6_in_the_boot_needs_hosts_with_one() {
        let uses = DUAL.replace(
            "    boot: {uefi: ipxe.efi}\n",
            "    boot: {uefi: ipxe.efi}\n    kernel: \"http://{server}/vmlinuz\"\n    \
             cmdline: \"ip=[{ipv6}]:::64::eth0:none ip={ip}:::16::eth0:none\"\n",
        );
        let found = problems(&uses);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].starts_with(
                "host 52:54:00:12:34:57: field ipv6: is required: profile \"worker\" \
                 puts the host's address in its boot with {ipv6}"
            ),
            "{found:#?}"
        );
        // With the IPv4-only host gone, node-1 (which has one) is fine.
        let fine = uses.replace(
            "  - mac: \"52:54:00:12:34:57\"\n    ip: 10.66.1.11\n    profile: worker\n",
            "",
        );
        let inv = parse(&fine).expect("valid");
        assert!(inv.profile_of(&inv.hosts[0]).uses(IPV6_PLACEHOLDER));
        // `{ip}` likewise needs the host's `ip`.
        let v6_only = fine.replace("    ip: 10.66.1.10\n", "");
        let found = problems(&v6_only);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].starts_with(
                "host node-1 (52:54:00:12:34:56): field ip: is required: profile \"worker\" \
                 puts the host's address in its boot with {ip}"
            ),
            "{found:#?}"
        );
        // The discovery profile may: a machine of an IPv6 pool booting
        // over IPv6 has its lease there.
        let discovery = fine.replace(
            "profiles:",
            "discovery: {policy: inspect, profile: worker}\nprofiles:",
        );
        parse(&discovery).expect("valid");
    }

    #[test]
    fn ipv6_subnets_are_checked_on_their_own_terms() {
        let text = r#"
subnets:
  - cidr: fd00:66::1/64
    mode: proxy
  - cidr: fd00:66:0:0:8000::/65
  - cidr: fd00::/129
  - cidr: "fd00:68::/64"
    pool: {start: "fd00:68::20", end: "fd00:68::10"}
profiles: []
hosts: []
"#;
        let found = problems(text);
        let expected = [
            "field subnets[0].mode: proxy is for IPv4",
            "field subnets[0].cidr: fd00:66::1/64 has host bits set; the network is fd00:66::/64",
            "field subnets[1].cidr: fd00:66:0:0:8000::/65 overlaps subnets[0] (fd00:66::/64)",
            "field subnets[2].cidr: prefix /129 is out of range 0..=128",
            "field subnets[3].pool: start fd00:68::20 is after end fd00:68::10",
        ];
        assert_eq!(found.len(), expected.len(), "{found:#?}");
        for (found, expected) in found.iter().zip(expected) {
            assert!(
                found.starts_with(expected),
                "{found:?}\n  does not start with\n{expected:?}"
            );
        }
    }
}

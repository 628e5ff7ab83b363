//! dnsmasq's IPv6 settings -> the IPv6 half of the translation: a
//! `dhcp-range` of IPv6 addresses that hands them out (a range, or
//! `static`) becomes an IPv6 subnet; ranges that hand out none
//! (`ra-only`, `ra-stateless`, `slaac` alone) and `constructor:` ranges,
//! whose network the import cannot see, are reported. Also the bracketed
//! addresses of `dhcp-host`, the `option6:` DNS settings, `option6:`
//! boot files (reported: profiles give them) and `enable-ra`. The DUIDs
//! of `dhcp-host=id:` are read in `import::duid`.

use std::net::Ipv6Addr;

use super::{State, TagCond, parse_lease, unquote};
use crate::import::{Origin, Subnet6Out, ipv6::masked};

/// dnsmasq's lease time for an IPv6 range that names none: one day (its
/// IPv4 default, an hour, is the inventory's default).
const DEFAULT_LEASE6: u32 = 86_400;

/// The `dhcp-range` keywords of IPv6 modes (dnsmasq(8), `--dhcp-range`).
const MODES: &[&str] = &[
    "static",
    "ra-only",
    "slaac",
    "ra-names",
    "ra-stateless",
    "ra-advrouter",
    "off-link",
];

impl State {
    /// `dhcp-range=START[,END|constructor:IF][,MODE...][,PREFIX-LEN][,LEASE]`
    /// with `rest` the parts after START, read in dnsmasq's order
    /// (`option.c`): end address, modes and constructor, then a bare
    /// prefix length, then the lease time.
    pub(super) fn range6(&mut self, value: &str, start: Ipv6Addr, rest: &[&str], origin: &Origin) {
        let mut end = None;
        let mut modes = Vec::new();
        let mut constructor = None;
        let mut at = 0;
        while let Some(&part) = rest.get(at) {
            if MODES.contains(&part) {
                modes.push(part);
            } else if let (0, Ok(address)) = (at, part.parse::<Ipv6Addr>()) {
                end = Some(address);
            } else if let Some(interface) = part.strip_prefix("constructor:") {
                constructor = Some(interface);
            } else {
                break;
            }
            at += 1;
        }
        let mut prefix = 64;
        if let Some(len) = rest
            .get(at)
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u8>().ok())
            .filter(|len| *len <= 128)
        {
            prefix = len;
            at += 1;
        }
        let mut lease = DEFAULT_LEASE6;
        match rest.get(at..).unwrap_or(&[]) {
            [] => {}
            [time] => match parse_lease(time) {
                Some(seconds) => lease = seconds,
                None if *time == "deprecated" => self.report.add(
                    origin,
                    "lease time `deprecated` not translated: the agent's preferred lifetime is the valid one; dnsmasq's one day applies",
                ),
                None => {
                    self.report.add(
                        origin,
                        format!("dhcp-range {value}: `{time}` not translated"),
                    );
                    return;
                }
            },
            more => {
                self.report.add(
                    origin,
                    format!("dhcp-range {value}: `{}` not translated", more.join(",")),
                );
                return;
            }
        }
        let is_static = modes.contains(&"static");
        let why = if let Some(interface) = constructor {
            Some(format!(
                "constructor:{interface} makes the range from the addresses of {interface}, which the import cannot see; write the IPv6 subnet with its cidr and pool"
            ))
        } else if start.is_unspecified() {
            Some("`::` answers Information-Requests on every interface and names no subnet".into())
        } else if modes.contains(&"ra-only") {
            Some("ra-only sends router advertisements and hands out no DHCPv6 addresses".into())
        } else if modes.contains(&"ra-stateless") {
            Some("ra-stateless hands out no DHCPv6 addresses (SLAAC, with DHCPv6 for other settings only)".into())
        } else if end.is_none() && !is_static {
            Some(if modes.contains(&"slaac") {
                "slaac without an end address hands out no DHCPv6 addresses (SLAAC only)".into()
            } else {
                "it has no end address and is not static, so dnsmasq hands out no addresses from it"
                    .into()
            })
        } else if prefix < 64 {
            Some(format!(
                "dnsmasq takes prefix lengths of 64 or more, not {prefix}"
            ))
        } else if end.is_some_and(|end| end < start || masked(end, prefix) != masked(start, prefix))
        {
            Some(format!(
                "the end address is not after the start in the same /{prefix}"
            ))
        } else {
            None
        };
        if let Some(why) = why {
            self.report
                .add(origin, format!("dhcp-range {value} not translated: {why}"));
            return;
        }
        for mode in modes.iter().filter(|m| **m != "static") {
            let why = match *mode {
                "slaac" => {
                    "the agent's router advertisements do not offer the prefix for SLAAC; addresses come from DHCPv6 only"
                }
                "ra-names" => "the agent publishes no DNS names",
                _ => "the agent's router advertisements have no such setting",
            };
            self.report.add(
                origin,
                format!("dhcp-range mode `{mode}` not translated: {why}"),
            );
        }
        let network = masked(start, prefix);
        let pool = if is_static {
            None
        } else {
            end.map(|end| (start, end))
        };
        if let Some(existing) = self
            .subnets6
            .iter_mut()
            .find(|s| s.network == network && s.prefix == prefix)
        {
            self.report.another_range(origin, &mut existing.pool, pool);
            return;
        }
        if pool.is_some() {
            self.report.add(
                origin,
                "IPv6 dynamic range kept as the subnet's pool, leased only to machines the inventory does not list and only under discovery.policy inspect, where dnsmasq leased the range to every machine asking",
            );
        }
        self.subnets6.push(Subnet6Out {
            lease_time: Some(lease),
            pool,
            ..Subnet6Out::new(network, prefix, origin.clone())
        });
    }

    /// A bracketed `dhcp-host` address: `[fd00:66::10]`, or
    /// `[fd00:66::10/126]` for an address per DUID the host asks with.
    pub(super) fn host_ipv6(&mut self, part: &str, origin: &Origin) -> Option<Ipv6Addr> {
        let inner = part.strip_prefix('[').and_then(|p| p.strip_suffix(']'));
        let (text, len) = match inner.map(|i| i.split_once('/').unwrap_or((i, ""))) {
            Some((text, len)) => (text, len),
            None => ("", ""),
        };
        let Ok(address) = text.parse::<Ipv6Addr>() else {
            self.report
                .add(origin, format!("IPv6 address {part} not understood"));
            return None;
        };
        if u128::from(address) >> 64 == 0 {
            self.report.add(
                origin,
                format!("IPv6 address {part} not translated: it is a host part only, which dnsmasq completes with the network of a constructor: range; write the whole address"),
            );
            return None;
        }
        if !len.is_empty() {
            self.report.add(
                origin,
                format!("IPv6 addresses {part} translated as {address} alone: dnsmasq gave each DUID the host asks with (each stage of a chain boot) an address of its own; the agent gives the host one address whichever DUID asks"),
            );
        }
        Some(address)
    }

    /// `dhcp-option=option6:NAME|CODE,...`: the IPv6 subnets' DNS servers
    /// and search domain; boot files are the profiles'.
    pub(super) fn option6(
        &mut self,
        key: &str,
        value: &str,
        tags: &[TagCond],
        code: &str,
        values: &[&str],
        origin: &Origin,
    ) {
        let code = match code {
            "dns-server" => "23",
            "domain-search" => "24",
            "bootfile-url" => "59",
            "bootfile-param" => "60",
            c => c,
        };
        if ["59", "60"].contains(&code) {
            self.report.add(
                origin,
                format!("{key}={value} not translated: over DHCPv6 the agent sends each host the boot files of its profile (read from the dhcp-boot lines, as for IPv4) as option 59 URLs: tftp://[its address]/FILE of `boot.uefi`, the `boot.http` URL, the iPXE script; change the profile to change them"),
            );
            return;
        }
        if !tags.is_empty() || !["23", "24"].contains(&code) {
            self.report.add(
                origin,
                format!("{key}={value} not translated: only untagged option6:dns-server and option6:domain-search are"),
            );
            return;
        }
        // As for IPv4, no value means no option, which is what the agent
        // does for an unset key.
        let values: Vec<&str> = values.iter().copied().filter(|v| !v.is_empty()).collect();
        let Some(first) = values.first() else {
            return;
        };
        if code == "24" {
            if values.len() > 1 {
                self.report.add(
                    origin,
                    format!("only the first search domain, {}, is translated: the inventory's domain is one name", unquote(first)),
                );
            }
            self.domain6 = Some(unquote(first).to_string());
            return;
        }
        let mut servers = Vec::new();
        for v in &values {
            let text = v.trim_start_matches('[').trim_end_matches(']');
            match text.parse::<Ipv6Addr>() {
                Ok(a) if stands_for_server(a) => {
                    self.report.add(
                        origin,
                        format!("{key}={value} not translated: {v} stands for an address of the dnsmasq machine; write the DNS server's address"),
                    );
                    return;
                }
                Ok(a) => servers.push(a),
                Err(_) => {
                    self.report.add(
                        origin,
                        format!("{key}={value} not translated: {v} is not an IPv6 address"),
                    );
                    return;
                }
            }
        }
        self.dns6 = servers;
    }

    /// `enable-ra`: the agent's router advertisements on every IPv6
    /// subnet, which differ from dnsmasq's in what they say.
    pub(super) fn enable_ra(&mut self, origin: &Origin) {
        self.ra = true;
        self.report.add(
            origin,
            "enable-ra translated as `ra: {}` on every IPv6 subnet (addresses and other settings from DHCPv6); unlike dnsmasq the agent does not advertise itself as the default router nor DNS servers in them: the link needs a router of its own",
        );
    }
}

/// `[::]`, `[fd00::]` and `[fe80::]`, which dnsmasq replaces with its own
/// global, ULA and link-local address.
fn stands_for_server(a: Ipv6Addr) -> bool {
    [0, 0xfd00, 0xfe80].contains(&a.segments()[0]) && u128::from(a) << 16 == 0
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use crate::{
        import::{Translation, dnsmasq::translate},
        inventory::{Advertise, Inventory, parse_uuid},
    };

    fn run(conf: &str) -> Translation {
        translate(
            "test",
            vec![(PathBuf::from("dnsmasq.conf"), conf.to_string())],
            false,
        )
        .expect("translates")
    }

    /// Each `(line, start of the message)` is in `report` as
    /// `dnsmasq.conf:LINE: MESSAGE...`.
    fn assert_reported(report: &str, wanted: &[(usize, &str)]) {
        for (line, message) in wanted {
            let want = format!("dnsmasq.conf:{line}: {message}");
            assert!(
                report.lines().any(|l| l.starts_with(&want)),
                "missing {want:?} in:\n{report}"
            );
        }
    }

    /// A dual-stack provisioning network: one host with both addresses on
    /// its line, one whose IPv6 reservation is by DUID-LL on a line of its
    /// own, one whose firmware sends a DUID-UUID, joined by hostname.
    const DUAL: &str = "\
interface=br-prov
dhcp-range=10.66.0.0,static,255.255.0.0
dhcp-range=fd00:66::1000,fd00:66::1fff,64,12h
enable-ra
dhcp-option=option6:dns-server,[fd00:66::53],[fd00:66::54]
dhcp-option=option6:domain-search,lab.example
dhcp-option=option6:bootfile-url,tftp://[fd00:66::1]/ipxe.efi
dhcp-userclass=set:ipxe,iPXE
dhcp-boot=tag:!ipxe,ipxe.efi
dhcp-boot=tag:ipxe,http://10.66.0.1:8080/boot.ipxe
dhcp-host=52:54:00:12:34:56,10.66.1.10,[fd00:66::10],node-1
dhcp-host=52:54:00:12:34:57,10.66.1.11,node-2
dhcp-host=id:00:03:00:01:52:54:00:12:34:57,[fd00:66::11]
dhcp-host=52:54:00:12:34:58,10.66.1.12,node-3
dhcp-host=id:00:04:8a:5c:2e:6b:1e:0f:4c:1d:9b:7a:01:23:45:67:89:ab,[fd00:66::12],node-3
";

    #[test]
    fn dual_stack_hosts_get_their_ipv6_address_and_uuid() {
        let imported = run(DUAL).finish().expect("validates");
        assert_eq!(
            imported.yaml,
            r#"# Imported from test by `pxe-agent import`.
# Check it with `pxe-agent check`; what was not translated is in the import report.

subnets:
  # dnsmasq.conf:2
  - cidr: 10.66.0.0/16
  # dnsmasq.conf:3
  - cidr: "fd00:66::/64"
    dns: ["fd00:66::53", "fd00:66::54"]
    domain: "lab.example"
    lease_time: 43200
    # Leased to machines no host names, under discovery.policy inspect only.
    pool: {start: "fd00:66::1000", end: "fd00:66::1fff"}
    ra: {}

profiles:
  - name: boot-1
    boot: {bios: "ipxe.efi", uefi: "ipxe.efi", uefi_arm64: "ipxe.efi"}
    chain: "http://10.66.0.1:8080/boot.ipxe"

hosts:
  # dnsmasq.conf:11
  - {mac: "52:54:00:12:34:56", ip: 10.66.1.10, profile: boot-1, ipv6: "fd00:66::10", hostname: "node-1"}
  # dnsmasq.conf:12, dnsmasq.conf:13
  - {mac: "52:54:00:12:34:57", ip: 10.66.1.11, profile: boot-1, ipv6: "fd00:66::11", hostname: "node-2"}
  # dnsmasq.conf:14, dnsmasq.conf:15
  - {mac: "52:54:00:12:34:58", ip: 10.66.1.12, profile: boot-1, ipv6: "fd00:66::12", uuid: "8a5c2e6b-1e0f-4c1d-9b7a-0123456789ab", hostname: "node-3"}
"#
        );
        let report = imported.report.to_string();
        assert_eq!(report.lines().count(), 3, "{report}");
        assert_reported(
            &report,
            &[
                (
                    3,
                    "IPv6 dynamic range kept as the subnet's pool, leased only to machines the inventory does not list",
                ),
                (4, "enable-ra translated as `ra: {}` on every IPv6 subnet"),
                (
                    7,
                    "dhcp-option=option6:bootfile-url,tftp://[fd00:66::1]/ipxe.efi not translated: over DHCPv6 the agent sends each host the boot files of its profile",
                ),
            ],
        );

        let inv = Inventory::parse(Path::new("imported.yaml"), &imported.yaml).expect("loads");
        let six = &inv.subnets6[0];
        assert_eq!(six.to_string(), "fd00:66::/64");
        assert_eq!(
            six.dns,
            [
                "fd00:66::53".parse::<std::net::Ipv6Addr>().unwrap(),
                "fd00:66::54".parse().unwrap()
            ]
        );
        assert_eq!(six.domain.as_deref(), Some("lab.example"));
        assert_eq!(six.lease_time, 43200);
        assert_eq!(six.pool.unwrap().to_string(), "fd00:66::1000-fd00:66::1fff");
        assert_eq!(
            six.ra,
            Some(Advertise {
                managed: true,
                other: true
            })
        );
        let ipv6: Vec<String> = inv
            .hosts
            .iter()
            .map(|h| h.ipv6().map(|a| a.to_string()).unwrap_or_default())
            .collect();
        assert_eq!(ipv6, ["fd00:66::10", "fd00:66::11", "fd00:66::12"]);
        let uuid = parse_uuid("8a5c2e6b-1e0f-4c1d-9b7a-0123456789ab").unwrap();
        assert_eq!(inv.hosts[2].uuid(), Some(&uuid));
        assert_eq!(inv.hosts[0].uuid(), None);
    }

    #[test]
    fn ipv6_ranges_become_subnets_only_when_they_hand_out_addresses() {
        let t = run("\
dhcp-range=10.66.0.0,static,255.255.0.0
dhcp-range=::,constructor:eth0,ra-only
dhcp-range=::1000,::1fff,constructor:eth0,64,12h
dhcp-range=fd00:67::,ra-only
dhcp-range=fd00:68::,ra-stateless,64
dhcp-range=fd00:69::,slaac
dhcp-range=fd00:6a::100,fd00:6a::1ff,slaac,64,1h
dhcp-range=fd00:6b::,static,80
dhcp-range=fd00:6c::1,fd00:6d::1
dhcp-range=::,static
dhcp-range=fd00:6e::1,fd00:6e::ff,48
dhcp-range=fd00:6a::200,fd00:6a::2ff
");
        let nets: Vec<String> = t
            .subnets6
            .iter()
            .map(|s| format!("{}/{} {:?} {:?}", s.network, s.prefix, s.pool, s.lease_time))
            .collect();
        assert_eq!(
            nets,
            [
                "fd00:6a::/64 Some((fd00:6a::100, fd00:6a::1ff)) Some(3600)",
                // No lease time: dnsmasq's IPv6 default, a day.
                "fd00:6b::/80 None Some(86400)",
            ]
        );
        let report = t.report.to_string();
        assert_reported(
            &report,
            &[
                (
                    2,
                    "dhcp-range ::,constructor:eth0,ra-only not translated: constructor:eth0 makes the range from the addresses of eth0, which the import cannot see",
                ),
                (
                    3,
                    "dhcp-range ::1000,::1fff,constructor:eth0,64,12h not translated: constructor:eth0",
                ),
                (
                    4,
                    "dhcp-range fd00:67::,ra-only not translated: ra-only sends router advertisements and hands out no DHCPv6 addresses",
                ),
                (
                    5,
                    "dhcp-range fd00:68::,ra-stateless,64 not translated: ra-stateless hands out no DHCPv6 addresses",
                ),
                (
                    6,
                    "dhcp-range fd00:69::,slaac not translated: slaac without an end address hands out no DHCPv6 addresses",
                ),
                (
                    7,
                    "dhcp-range mode `slaac` not translated: the agent's router advertisements do not offer the prefix for SLAAC",
                ),
                (7, "IPv6 dynamic range kept as the subnet's pool"),
                (
                    9,
                    "dhcp-range fd00:6c::1,fd00:6d::1 not translated: the end address is not after the start in the same /64",
                ),
                (
                    10,
                    "dhcp-range ::,static not translated: `::` answers Information-Requests on every interface and names no subnet",
                ),
                (
                    11,
                    "dhcp-range fd00:6e::1,fd00:6e::ff,48 not translated: dnsmasq takes prefix lengths of 64 or more, not 48",
                ),
                (
                    12,
                    "second range in one subnet: only the first is kept as the pool",
                ),
            ],
        );
        assert_eq!(report.lines().count(), 11, "{report}");
        t.finish().expect("validates");
    }

    #[test]
    fn ipv6_hosts_and_options_not_translated_are_reported() {
        let t = run("\
dhcp-range=10.66.0.0,static,255.255.0.0
dhcp-range=fd00:66::1000,fd00:66::1fff,64,12h
dhcp-option=option6:23,[fd00:66::53]
dhcp-option=tag:efi,option6:dns-server,[fd00:66::54]
dhcp-option=option6:dns-server,[::]
dhcp-option=option6:ntp-server,[fd00:66::1]
dhcp-option=option6:domain-search,lab.example,example.org
dhcp-host=52:54:00:00:00:01,10.66.1.1,[fd00:66::11],[fd00:66::111],n1
dhcp-host=52:54:00:00:00:02,10.66.1.2,[::12],n2
dhcp-host=52:54:00:00:00:03,10.66.1.3,[fd00:66::50/126],n3
dhcp-host=id:00:02:00:00:00:09:0c:c0:84:d3:03:00:09:12,[fd00:66::13]
dhcp-host=52:54:00:00:00:09,[fd00:66::19]
dhcp-host=id:00:04:2b:6a:81:e4:5b:6f:4c:2a:9d:3e:7f:0a:1b:2c:3d:4e,[fd00:66::20],nobody
dhcp-host=52:54:00:00:00:04,10.66.1.4,[fd00:99::1]
dhcp-host=52:54:00:00:00:05,10.66.1.5,[fd00:66::1500]
dhcp-host=id:00:03:00:01:52:54:00:00:00:06,10.66.1.6,[fd00:66::16],n6
dhcp-host=52:54:00:00:00:07,id:00:01:00:01:2b:3c:4d:5e:52:54:00:00:00:08,10.66.1.7
dhcp-host=52:54:00:00:00:01,[fd00:66::21]
");
        assert_eq!(
            t.subnets6[0].dns,
            ["fd00:66::53".parse::<std::net::Ipv6Addr>().unwrap()]
        );
        assert_eq!(t.subnets6[0].domain.as_deref(), Some("lab.example"));
        let report = t.report.to_string();
        assert_reported(
            &report,
            &[
                (
                    4,
                    "dhcp-option=tag:efi,option6:dns-server,[fd00:66::54] not translated: only untagged option6:dns-server and option6:domain-search are",
                ),
                (
                    5,
                    "dhcp-option=option6:dns-server,[::] not translated: [::] stands for an address of the dnsmasq machine",
                ),
                (
                    6,
                    "dhcp-option=option6:ntp-server,[fd00:66::1] not translated: only untagged",
                ),
                (
                    7,
                    "only the first search domain, lab.example, is translated",
                ),
                (
                    8,
                    "IPv6 address [fd00:66::111] not translated: the inventory holds one IPv6 address a host",
                ),
                (
                    9,
                    "IPv6 address [::12] not translated: it is a host part only",
                ),
                (
                    10,
                    "IPv6 addresses [fd00:66::50/126] translated as fd00:66::50 alone",
                ),
                (2, "IPv6 dynamic range kept as the subnet's pool"),
                (
                    11,
                    "client-id match id:00:02:00:00:00:09:0c:c0:84:d3:03:00:09:12 not translated (it is a DUID-EN",
                ),
                (
                    11,
                    "dhcp-host id:00:02:00:00:00:09:0c:c0:84:d3:03:00:09:12,[fd00:66::13] left out: it names no MAC and no system UUID",
                ),
                (
                    16,
                    "the DUID's MAC 52:54:00:00:00:06 gets the IPv4 address too",
                ),
                (
                    17,
                    "DUID of MAC 52:54:00:00:00:08 not translated: it is not one of the line's MACs",
                ),
            ],
        );
        assert_eq!(report.lines().count(), 12, "{report}");

        let imported = t.finish().expect("validates");
        let report = imported.report.to_string();
        assert_reported(
            &report,
            &[
                (
                    2,
                    "pool fd00:66::1000-fd00:66::1fff left out: it holds reserved addresses (fd00:66::1500 of 52:54:00:00:00:05)",
                ),
                (
                    12,
                    "host 52:54:00:00:00:09 has an IPv6 reservation only: translated with `ipv6` and no `ip`, and a profile that boots nothing; choose its profile",
                ),
                (
                    13,
                    "IPv6 reservation fd00:66::20 for uuid 2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e left out: it names no MAC, and not exactly one IPv4 reservation is named \"nobody\"; every host of the inventory has a MAC",
                ),
                (
                    14,
                    "IPv6 address fd00:99::1 of host 52:54:00:00:00:04 not translated: no IPv6 subnet holds it",
                ),
                (
                    18,
                    "IPv6 reservation fd00:66::21 for 52:54:00:00:00:01 left out: host 52:54:00:00:00:01 already has fd00:66::11",
                ),
            ],
        );
        assert_eq!(report.lines().count(), 17, "{report}");
        let inv = Inventory::parse(Path::new("imported.yaml"), &imported.yaml).expect("loads");
        let ipv6: Vec<String> = inv
            .hosts
            .iter()
            .map(|h| {
                format!(
                    "{} {}",
                    h.mac,
                    h.ipv6().map(|a| a.to_string()).unwrap_or_default()
                )
            })
            .collect();
        assert_eq!(
            ipv6,
            [
                "52:54:00:00:00:01 fd00:66::11",
                "52:54:00:00:00:02 ",
                "52:54:00:00:00:03 fd00:66::50",
                "52:54:00:00:00:04 ",
                "52:54:00:00:00:05 fd00:66::1500",
                "52:54:00:00:00:06 fd00:66::16",
                "52:54:00:00:00:07 ",
                "52:54:00:00:00:09 fd00:66::19",
            ]
        );
        assert!(inv.subnets6[0].pool.is_none());
    }

    #[test]
    fn ipv6_addresses_and_uuids_the_inventory_refuses_leave_their_hosts() {
        let t = run("\
dhcp-range=10.66.0.0,static,255.255.0.0
dhcp-range=fd00:66::,static
dhcp-host=52:54:00:00:00:01,10.66.1.1,[fd00:66::10]
dhcp-host=52:54:00:00:00:02,10.66.1.2,[fd00:66::10]
dhcp-host=52:54:00:00:00:03,10.66.1.3,[fd00:66::]
dhcp-host=52:54:00:00:00:04,id:00:04:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00,10.66.1.4
dhcp-host=52:54:00:00:00:05,id:00:04:2b:6a:81:e4:5b:6f:4c:2a:9d:3e:7f:0a:1b:2c:3d:4e,10.66.1.5
dhcp-host=52:54:00:00:00:06,id:00:04:2b:6a:81:e4:5b:6f:4c:2a:9d:3e:7f:0a:1b:2c:3d:4e,10.66.1.6
dhcp-host=52:54:00:00:00:05,id:00:04:8a:5c:2e:6b:1e:0f:4c:1d:9b:7a:01:23:45:67:89:ab,[fd00:66::15]
");
        assert!(t.report.is_empty(), "{}", t.report);
        let imported = t.finish().expect("validates");
        let report = imported.report.to_string();
        assert_reported(
            &report,
            &[
                (
                    4,
                    "IPv6 address fd00:66::10 of host 52:54:00:00:00:02 not translated: it is reserved for 52:54:00:00:00:01 too",
                ),
                (
                    5,
                    "IPv6 address fd00:66:: of host 52:54:00:00:00:03 not translated: it is the subnet-router anycast address of fd00:66::/64",
                ),
                (
                    6,
                    "uuid 00000000-0000-0000-0000-000000000000 of host 52:54:00:00:00:04 not translated: it is the UUID of a board that has none set",
                ),
                (
                    8,
                    "uuid 2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e of host 52:54:00:00:00:06 not translated: it is the uuid of 52:54:00:00:00:05 too",
                ),
                (
                    9,
                    "uuid 8a5c2e6b-1e0f-4c1d-9b7a-0123456789ab not translated: host 52:54:00:00:00:05 already has uuid 2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e",
                ),
            ],
        );
        assert_eq!(report.lines().count(), 5, "{report}");
        let inv = Inventory::parse(Path::new("imported.yaml"), &imported.yaml).expect("loads");
        let five = &inv.hosts[4];
        assert_eq!(five.ipv6(), Some("fd00:66::15".parse().unwrap()));
        assert_eq!(
            five.uuid(),
            Some(&parse_uuid("2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e").unwrap())
        );
        assert!(inv.hosts[1].ipv6().is_none() && inv.hosts[5].uuid().is_none());
    }
}

//! The reservation set every server is given: `count` hosts whose MAC and
//! address derive from their index, written out in each server's own format
//! (pxe-agent inventory, Kea configuration, dnsmasq hosts file) and as the
//! MAC list both load generators cycle over. For the slow-path loads
//! ([`Setup`]) the same reservations come with a dynamic pool above them,
//! or with an iPXE answer, and the pool load's clients come from a list of
//! MACs no server knows. For the DHCPv6 load ([`Setup::Dhcpv6`]) each host
//! also has an IPv6 address, reserved by the DUID-LL perfdhcp makes of its
//! MAC.
//!
//! Owns the subnet plan of the benchmark; starting the servers belongs to
//! [`super::server`].

use std::{
    fmt::Write as _,
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
};

use anyhow::ensure;

/// What the servers answer besides the reservations' plain PXE boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Setup {
    /// Reservations only (the fast-path loads).
    Reservations,
    /// Reservations, and a dynamic pool above them for unknown MACs.
    Pool,
    /// Reservations, and an iPXE answer for requests whose user class
    /// (option 77) is `iPXE`.
    Ipxe,
    /// The reservations with an IPv6 address each as well, answered over
    /// DHCPv6 (pxe-agent's slow path).
    Dhcpv6,
}

/// Lease time of pool addresses (pxe-agent's `discovery.lease_time`).
pub const POOL_LEASE_SECS: u32 = 600;
/// The last pool address: below [`CLIENT_IP`]'s third octet.
const POOL_END: Ipv4Addr = Ipv4Addr::new(10, 66, 249, 254);
/// What the peers tell an iPXE client to load. pxe-agent's answer is its
/// default `ipxe.script`, `http://{server}:8080/boot/{mac}.ipxe`: one URL
/// per host, which iPXE then fetches from the agent's HTTP server.
pub const IPXE_URL: &str = "http://10.66.0.1:8080/boot.ipxe";
/// Kea's test for an iPXE client. Kea 2.2 has no RFC 3004 parser for
/// option 77; iPXE sends the bare string `iPXE`, which this matches.
pub const KEA_IPXE_TEST: &str = "substring(option[77].hex,0,4) == 'iPXE'";

/// The subnet every reservation lies in; the server end of the lab has
/// [`SERVER_IP`] in it.
pub const SUBNET: &str = "10.66.0.0/16";
pub const NETMASK: &str = "255.255.0.0";
/// The server's address, also the router handed out.
pub const SERVER_IP: &str = "10.66.0.1";
/// The client end's address: perfdhcp puts it in giaddr, so it must lie in
/// the hosts' subnet, and outside every reservation.
pub const CLIENT_IP: &str = "10.66.250.2";
pub const CLIENT_CIDR: &str = "10.66.250.2/16";
pub const LEASE_SECS: u32 = 3600;
/// What a BIOS PXE client is told to boot.
pub const BIOS_BOOT_FILE: &str = "undionly.kpxe";
pub const UEFI_BOOT_FILE: &str = "ipxe.efi";

/// The IPv6 subnet of the DHCPv6 load; the server end has [`SERVER_CIDR6`]
/// in it, the client end only its link-local address.
pub const SUBNET6: &str = "fd00:66::/64";
pub const SERVER_CIDR6: &str = "fd00:66::1/64";

/// Hosts per third octet: addresses run 10.66.1.1 to 10.66.1.250, then
/// 10.66.2.1, ...
const PER_OCTET: usize = 250;
/// Keeps every reservation below 10.66.250.0, where [`CLIENT_IP`] lives.
pub const MAX_HOSTS: usize = 249 * PER_OCTET;

/// `count` reservations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hosts {
    pub count: usize,
}

impl Hosts {
    pub fn new(count: usize) -> anyhow::Result<Hosts> {
        ensure!(
            (1..=MAX_HOSTS).contains(&count),
            "host count {count} is outside 1..={MAX_HOSTS}"
        );
        Ok(Hosts { count })
    }

    /// Every reservation as (MAC, address).
    pub fn iter(self) -> impl Iterator<Item = (String, Ipv4Addr)> {
        (0..self.count).map(|i| (mac(i), ip(i)))
    }

    /// Every reservation as (MAC, IPv6 address).
    pub fn iter6(self) -> impl Iterator<Item = (String, Ipv6Addr)> {
        (0..self.count).map(|i| (mac(i), ip6(i)))
    }

    /// The dynamic pool of [`Setup::Pool`]: from the third octet after the
    /// reservations' last one up to [`POOL_END`].
    pub fn pool(self) -> (Ipv4Addr, Ipv4Addr) {
        let octet = 2 + (self.count - 1) / PER_OCTET;
        let start = Ipv4Addr::new(10, 66, u8::try_from(octet).unwrap_or(u8::MAX), 1);
        (start, POOL_END)
    }

    /// Addresses in [`Hosts::pool`]; 0 when the reservations leave no room.
    pub fn pool_size(self) -> u32 {
        let (start, end) = self.pool();
        (u32::from(end) + 1).saturating_sub(u32::from(start))
    }

    /// The pxe-agent inventory (docs/inventory.md). The pool setup adds
    /// the pool and `discovery: inspect` with the same profile; the iPXE
    /// setup needs nothing more, the default `ipxe` section answers it.
    pub fn inventory(self, setup: Setup) -> String {
        let pool = if setup == Setup::Pool {
            let (start, end) = self.pool();
            format!("    pool: {{start: {start}, end: {end}}}\n")
        } else {
            String::new()
        };
        let discovery = if setup == Setup::Pool {
            format!("discovery: {{policy: inspect, profile: pxe, lease_time: {POOL_LEASE_SECS}}}\n")
        } else {
            String::new()
        };
        let subnet6 = if setup == Setup::Dhcpv6 {
            format!("  - cidr: {SUBNET6}\n    lease_time: {LEASE_SECS}\n")
        } else {
            String::new()
        };
        let mut yaml = format!(
            "subnets:\n  - cidr: {SUBNET}\n    router: {SERVER_IP}\n    lease_time: {LEASE_SECS}\n{pool}\
             {subnet6}{discovery}\
             profiles:\n  - name: pxe\n    boot:\n      bios: {BIOS_BOOT_FILE}\n      uefi: {UEFI_BOOT_FILE}\n\
             hosts:\n"
        );
        for (i, (mac, ip)) in self.iter().enumerate() {
            let _ = write!(yaml, "  - mac: \"{mac}\"\n    ip: {ip}\n    profile: pxe\n");
            if setup == Setup::Dhcpv6 {
                let _ = writeln!(yaml, "    ipv6: \"{}\"", ip6(i));
            }
        }
        yaml
    }

    /// A kea-dhcp4 configuration: raw sockets on `iface`, in-memory leases
    /// (or, with `lease_file`, leases written to that CSV file as they
    /// change), the reservations out of any pool, logging to `log` at WARN.
    /// The pool setup adds the pool with [`POOL_LEASE_SECS`]; the iPXE setup
    /// a client class that answers iPXE with [`IPXE_URL`].
    pub fn kea_config(
        self,
        iface: &str,
        log: &Path,
        setup: Setup,
        lease_file: Option<&Path>,
    ) -> String {
        let reservations = self
            .iter()
            .map(|(mac, ip)| format!("{{\"hw-address\":\"{mac}\",\"ip-address\":\"{ip}\"}}"))
            .collect::<Vec<_>>()
            .join(",\n");
        let leases = match lease_file {
            None => r#""persist": false"#.to_owned(),
            Some(file) => format!(r#""persist": true, "name": "{}""#, file.display()),
        };
        let (lifetime, pools) = match setup {
            Setup::Pool => {
                let (start, end) = self.pool();
                (
                    POOL_LEASE_SECS,
                    format!("\n    \"pools\": [{{\"pool\": \"{start} - {end}\"}}],"),
                )
            }
            Setup::Reservations | Setup::Ipxe | Setup::Dhcpv6 => (LEASE_SECS, String::new()),
        };
        let classes = match setup {
            Setup::Ipxe => format!(
                "\n  \"client-classes\": [{{\"name\": \"ipxe\", \"test\": \"{KEA_IPXE_TEST}\", \
                 \"boot-file-name\": \"{IPXE_URL}\"}}],"
            ),
            Setup::Reservations | Setup::Pool | Setup::Dhcpv6 => String::new(),
        };
        format!(
            r#"{{"Dhcp4": {{
  "interfaces-config": {{"interfaces": ["{iface}"], "dhcp-socket-type": "raw"}},
  "lease-database": {{"type": "memfile", {leases}, "lfc-interval": 0}},
  "valid-lifetime": {lifetime},{classes}
  "subnet4": [{{
    "id": 1,
    "subnet": "{SUBNET}",{pools}
    "option-data": [{{"name": "routers", "data": "{SERVER_IP}"}}],
    "next-server": "{SERVER_IP}",
    "boot-file-name": "{BIOS_BOOT_FILE}",
    "reservations-in-subnet": true,
    "reservations-out-of-pool": true,
    "reservations": [
{reservations}
    ]
  }}],
  "loggers": [{{
    "name": "kea-dhcp4",
    "output_options": [{{"output": "{log}"}}],
    "severity": "WARN"
  }}]
}}}}
"#,
            log = log.display()
        )
    }

    /// A kea-dhcp6 configuration: `iface` (the subnet bound to it, as the
    /// clients are on its link), in-memory leases, each host reserved by
    /// the DUID-LL of its MAC (`host-reservation-identifiers` limited to
    /// `duid`, so no other lookup is tried first), no pool, lifetimes as
    /// pxe-agent gives them (T1 half, T2 four fifths of [`LEASE_SECS`]),
    /// logging to `log` at WARN. Its own DUID is a DUID-LL, as pxe-agent's,
    /// and not kept (Kea would write it under /var/lib/kea).
    pub fn kea6_config(self, iface: &str, log: &Path) -> String {
        let reservations = self
            .iter6()
            .map(|(mac, ip)| {
                format!(
                    "{{\"duid\":\"{}\",\"ip-addresses\":[\"{ip}\"]}}",
                    duid_ll(&mac)
                )
            })
            .collect::<Vec<_>>()
            .join(",\n");
        format!(
            r#"{{"Dhcp6": {{
  "interfaces-config": {{"interfaces": ["{iface}"]}},
  "lease-database": {{"type": "memfile", "persist": false, "lfc-interval": 0}},
  "host-reservation-identifiers": ["duid"],
  "server-id": {{"type": "LL", "persist": false}},
  "preferred-lifetime": {LEASE_SECS},
  "valid-lifetime": {LEASE_SECS},
  "renew-timer": {t1},
  "rebind-timer": {t2},
  "subnet6": [{{
    "id": 1,
    "subnet": "{SUBNET6}",
    "interface": "{iface}",
    "reservations-in-subnet": true,
    "reservations-out-of-pool": true,
    "reservations": [
{reservations}
    ]
  }}],
  "loggers": [{{
    "name": "kea-dhcp6",
    "output_options": [{{"output": "{log}"}}],
    "severity": "WARN"
  }}]
}}}}
"#,
            t1 = LEASE_SECS / 2,
            t2 = LEASE_SECS * 4 / 5,
            log = log.display()
        )
    }

    /// dnsmasq's `--dhcp-hostsfile` for DHCPv6: one `id:DUID,[address]` a
    /// line. dnsmasq matches a DHCPv6 client's MAC only as its neighbour
    /// table or a relay's option 79 gives it, never from the DUID, and
    /// every perfdhcp client sends from the one link-local address; so the
    /// reservations name the DUID-LL perfdhcp sends.
    pub fn dnsmasq6_hosts(self) -> String {
        self.iter6().fold(String::new(), |mut out, (mac, ip)| {
            let _ = writeln!(out, "id:{},[{ip}]", duid_ll(&mac));
            out
        })
    }

    /// dnsmasq's `--dhcp-hostsfile`: one `mac,ip` a line.
    pub fn dnsmasq_hosts(self) -> String {
        self.iter().fold(String::new(), |mut out, (mac, ip)| {
            let _ = writeln!(out, "{mac},{ip}");
            out
        })
    }

    /// One MAC a line, as perfdhcp's `-M` and dhcp-loadgen's `--macs` read it.
    pub fn mac_list(self) -> String {
        self.iter().fold(String::new(), |mut out, (mac, _)| {
            let _ = writeln!(out, "{mac}");
            out
        })
    }
}

/// `count` MACs no server has a reservation for (`02:00:00:` and the index
/// in 24 bits, locally administered), one a line: the pool load's clients.
pub fn unknown_mac_list(count: usize) -> String {
    (0..count).fold(String::new(), |mut out, i| {
        let _ = writeln!(
            out,
            "02:00:00:{:02x}:{:02x}:{:02x}",
            (i >> 16) & 0xff,
            (i >> 8) & 0xff,
            i & 0xff
        );
        out
    })
}

/// The DUID-LL (type 3, hardware type 1) perfdhcp -6 makes of a MAC from
/// its `-M` list, as Kea and dnsmasq spell DUIDs.
pub fn duid_ll(mac: &str) -> String {
    format!("00:03:00:01:{mac}")
}

/// Host `i`'s IPv6 address: `fd00:66::1:0` plus `i`, clear of the
/// server's `fd00:66::1`.
pub fn ip6(i: usize) -> Ipv6Addr {
    let i = u32::try_from(i).unwrap_or(u32::MAX);
    Ipv6Addr::new(
        0xfd00,
        0x66,
        0,
        0,
        0,
        0,
        1 + (i >> 16) as u16,
        (i & 0xffff) as u16,
    )
}

/// `52:54:00:` followed by the index in 24 bits.
fn mac(i: usize) -> String {
    format!(
        "52:54:00:{:02x}:{:02x}:{:02x}",
        (i >> 16) & 0xff,
        (i >> 8) & 0xff,
        i & 0xff
    )
}

fn ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 66, 1 + (i / PER_OCTET) as u8, 1 + (i % PER_OCTET) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_derive_from_the_index() {
        let hosts = Hosts::new(50_000).unwrap();
        let all: Vec<_> = hosts.iter().collect();
        assert_eq!(
            all[0],
            ("52:54:00:00:00:00".into(), Ipv4Addr::new(10, 66, 1, 1))
        );
        assert_eq!(
            all[251],
            ("52:54:00:00:00:fb".into(), Ipv4Addr::new(10, 66, 2, 2))
        );
        assert_eq!(
            all[49_999],
            ("52:54:00:00:c3:4f".into(), Ipv4Addr::new(10, 66, 200, 250))
        );
    }

    #[test]
    fn host_counts_stay_clear_of_the_client_address() {
        assert!(Hosts::new(0).is_err());
        assert!(Hosts::new(MAX_HOSTS + 1).is_err());
        let last = ip(MAX_HOSTS - 1);
        assert!(last < CLIENT_IP.parse::<Ipv4Addr>().unwrap(), "{last}");
    }

    #[test]
    fn every_format_lists_every_host() {
        let hosts = Hosts::new(3).unwrap();
        assert_eq!(
            hosts
                .inventory(Setup::Reservations)
                .matches("profile: pxe")
                .count(),
            3
        );
        assert_eq!(
            hosts
                .kea_config(
                    "pxsrv0",
                    Path::new("/tmp/kea.log"),
                    Setup::Reservations,
                    None
                )
                .matches("hw-address")
                .count(),
            3
        );
        assert_eq!(
            hosts.dnsmasq_hosts(),
            "52:54:00:00:00:00,10.66.1.1\n52:54:00:00:00:01,10.66.1.2\n52:54:00:00:00:02,10.66.1.3\n"
        );
        assert_eq!(hosts.mac_list().lines().count(), 3);
    }

    #[test]
    fn the_pool_lies_above_the_reservations_and_below_the_client() {
        let hosts = Hosts::new(1_000).unwrap();
        let last = hosts.iter().last().unwrap().1;
        let (start, end) = hosts.pool();
        assert_eq!(
            (last, start, end),
            (
                Ipv4Addr::new(10, 66, 4, 250),
                Ipv4Addr::new(10, 66, 5, 1),
                POOL_END
            )
        );
        assert_eq!(hosts.pool_size(), 62_718);
        assert!(end < CLIENT_IP.parse::<Ipv4Addr>().unwrap());
        assert_eq!(Hosts::new(MAX_HOSTS).unwrap().pool_size(), 0);
        let inv = hosts.inventory(Setup::Pool);
        assert!(inv.contains("pool: {start: 10.66.5.1, end: 10.66.249.254}"));
        assert!(inv.contains("discovery: {policy: inspect, profile: pxe, lease_time: 600}"));
        let kea = hosts.kea_config(
            "pxsrv0",
            Path::new("/tmp/kea.log"),
            Setup::Pool,
            Some(Path::new("/tmp/l.csv")),
        );
        assert!(kea.contains(r#""pools": [{"pool": "10.66.5.1 - 10.66.249.254"}]"#));
        assert!(kea.contains(r#""persist": true, "name": "/tmp/l.csv""#));
        let ipxe = hosts.kea_config("pxsrv0", Path::new("/tmp/kea.log"), Setup::Ipxe, None);
        assert!(ipxe.contains(KEA_IPXE_TEST) && ipxe.contains(IPXE_URL));
        let v6 = Hosts::new(MAX_HOSTS).unwrap();
        assert_eq!(ip6(0), "fd00:66::1:0".parse::<Ipv6Addr>().unwrap());
        assert_eq!(ip6(65_537), "fd00:66::2:1".parse::<Ipv6Addr>().unwrap());
        let inv6 = v6.inventory(Setup::Dhcpv6);
        assert!(inv6.contains("  - cidr: fd00:66::/64\n"));
        assert_eq!(inv6.matches("    ipv6: ").count(), MAX_HOSTS);
        assert!(!hosts.inventory(Setup::Reservations).contains("ipv6"));
        let kea6 = Hosts::new(2)
            .unwrap()
            .kea6_config("pxsrv0", Path::new("/tmp/kea6.log"));
        assert!(kea6.contains(
            r#"{"duid":"00:03:00:01:52:54:00:00:00:01","ip-addresses":["fd00:66::1:1"]}"#
        ));
        assert_eq!(
            Hosts::new(1).unwrap().dnsmasq6_hosts(),
            "id:00:03:00:01:52:54:00:00:00:00,[fd00:66::1:0]\n"
        );
        let unknown = unknown_mac_list(70_000);
        assert_eq!(unknown.lines().nth(65_537), Some("02:00:00:01:00:01"));
    }
}

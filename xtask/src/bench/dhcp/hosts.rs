//! The reservation set every server is given: `count` hosts whose MAC and
//! address derive from their index, written out in each server's own format
//! (pxe-agent inventory, Kea configuration, dnsmasq hosts file) and as the
//! MAC list both load generators cycle over.
//!
//! Owns the subnet plan of the benchmark; starting the servers belongs to
//! [`super::server`].

use std::{fmt::Write as _, net::Ipv4Addr, path::Path};

use anyhow::ensure;

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

    /// The pxe-agent inventory (docs/inventory.md).
    pub fn inventory(self) -> String {
        let mut yaml = format!(
            "subnets:\n  - cidr: {SUBNET}\n    router: {SERVER_IP}\n    lease_time: {LEASE_SECS}\n\
             profiles:\n  - name: pxe\n    boot:\n      bios: {BIOS_BOOT_FILE}\n      uefi: {UEFI_BOOT_FILE}\n\
             hosts:\n"
        );
        for (mac, ip) in self.iter() {
            let _ = write!(yaml, "  - mac: \"{mac}\"\n    ip: {ip}\n    profile: pxe\n");
        }
        yaml
    }

    /// A kea-dhcp4 configuration: raw sockets on `iface`, in-memory leases,
    /// the reservations out of any pool, logging to `log` at WARN.
    pub fn kea_config(self, iface: &str, log: &Path) -> String {
        let reservations = self
            .iter()
            .map(|(mac, ip)| format!("{{\"hw-address\":\"{mac}\",\"ip-address\":\"{ip}\"}}"))
            .collect::<Vec<_>>()
            .join(",\n");
        format!(
            r#"{{"Dhcp4": {{
  "interfaces-config": {{"interfaces": ["{iface}"], "dhcp-socket-type": "raw"}},
  "lease-database": {{"type": "memfile", "persist": false, "lfc-interval": 0}},
  "valid-lifetime": {LEASE_SECS},
  "subnet4": [{{
    "id": 1,
    "subnet": "{SUBNET}",
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
        assert_eq!(hosts.inventory().matches("profile: pxe").count(), 3);
        assert_eq!(
            hosts
                .kea_config("pxsrv0", Path::new("/tmp/kea.log"))
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
}

//! A validated inventory -> a dnsmasq hosts file (`--dhcp-hostsfile`): one
//! `dhcp-host` value per host, `MAC[,MAC...],IP[,[IPv6]][,hostname]`
//! (every port of a host with several, the bracketed IPv6 address of a
//! host that has one), so that a dnsmasq can stand in for the agent with
//! the same reservations. Owns only that text; boot files and subnets stay
//! with the dnsmasq configuration. A host's `uuid` is not written: dnsmasq
//! matches a DUID-UUID (`id:00:04:…`) in the one byte order written, where
//! firmware sends either (`dhcp::v6::identity`).

use std::fmt::Write as _;

use crate::inventory::Inventory;

/// The hosts file, one line per host in inventory order, after a comment
/// naming where it came from.
pub fn dnsmasq_hosts(inv: &Inventory, source: &str) -> String {
    let mut out = format!("# dnsmasq hosts file exported from {source} by `pxe-agent export`\n");
    for host in &inv.hosts {
        for mac in host.ports() {
            let _ = write!(out, "{mac},");
        }
        let addresses: Vec<String> = (host.ipv4().map(|ip| ip.to_string()).into_iter())
            .chain(host.ipv6().map(|ip| format!("[{ip}]")))
            .collect();
        out.push_str(&addresses.join(","));
        if let Some(name) = &host.hostname {
            let _ = write!(out, ",{name}");
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn hosts_file_lists_every_host() {
        let inv = Inventory::parse(
            Path::new("inv.yaml"),
            "subnets: [{cidr: 10.0.0.0/24}]\nprofiles: [{name: p}]\nhosts:\n  - {mac: \"AA-BB-CC-DD-EE-01\", ip: 10.0.0.11, profile: p, hostname: n1}\n  - {mac: \"aa:bb:cc:dd:ee:02\", ip: 10.0.0.12, profile: p}\n",
        )
        .expect("inventory");
        assert_eq!(
            dnsmasq_hosts(&inv, "inv.yaml"),
            "# dnsmasq hosts file exported from inv.yaml by `pxe-agent export`\n\
             aa:bb:cc:dd:ee:01,10.0.0.11,n1\naa:bb:cc:dd:ee:02,10.0.0.12\n"
        );
    }

    #[test]
    fn exported_hosts_import_back() {
        let inv = Inventory::parse(
            Path::new("inv.yaml"),
            "subnets: [{cidr: 10.0.0.0/24}]\nprofiles: [{name: p}]\nhosts:\n  - {mac: \"aa:bb:cc:dd:ee:01\", ip: 10.0.0.11, profile: p, hostname: n1}\n",
        )
        .expect("inventory");
        let conf = format!(
            "dhcp-range=10.0.0.0,static,255.255.255.0\n{}",
            dnsmasq_hosts(&inv, "inv.yaml")
        );
        let t = crate::import::dnsmasq::translate("test", vec![("hosts".into(), conf)], false)
            .expect("translates");
        assert!(t.report.is_empty(), "{}", t.report);
        assert_eq!(t.hosts.len(), 1);
        assert_eq!(t.hosts[0].hostname.as_deref(), Some("n1"));
        assert_eq!(t.hosts[0].ip, inv.hosts[0].ipv4());
    }

    #[test]
    fn a_host_with_several_ports_exports_every_mac_and_imports_back_as_one_host() {
        let inv = Inventory::parse(
            Path::new("inv.yaml"),
            "subnets: [{cidr: 10.0.0.0/24}]\nprofiles: [{name: p}]\nhosts:\n  - {macs: [\"aa:bb:cc:dd:ee:01\", \"aa:bb:cc:dd:ee:02\"], ip: 10.0.0.11, profile: p, hostname: n1}\n",
        )
        .expect("inventory");
        let hosts = dnsmasq_hosts(&inv, "inv.yaml");
        assert!(
            hosts.ends_with("\naa:bb:cc:dd:ee:01,aa:bb:cc:dd:ee:02,10.0.0.11,n1\n"),
            "{hosts}"
        );
        let conf = format!("dhcp-range=10.0.0.0,static,255.255.255.0\n{hosts}");
        let t = crate::import::dnsmasq::translate("test", vec![("hosts".into(), conf)], false)
            .expect("translates");
        assert!(t.report.is_empty(), "{}", t.report);
        assert_eq!(t.hosts.len(), 1);
        assert_eq!(t.hosts[0].macs, inv.hosts[0].macs);
        let yaml = t.finish().expect("the written inventory is valid").yaml;
        let back = Inventory::parse(Path::new("back.yaml"), &yaml).expect("inventory");
        assert_eq!(back.hosts[0].macs, inv.hosts[0].macs);
        assert_eq!(back.hosts[0].ip, inv.hosts[0].ip);
    }

    #[test]
    fn a_host_with_an_ipv6_address_exports_it_bracketed_and_imports_back() {
        let inv = Inventory::parse(
            Path::new("inv.yaml"),
            "subnets: [{cidr: 10.0.0.0/24}, {cidr: \"fd00:66::/64\"}]\nprofiles: [{name: p}]\nhosts:\n  - {mac: \"aa:bb:cc:dd:ee:01\", ip: 10.0.0.11, ipv6: \"fd00:66::11\", profile: p, hostname: n1}\n  - {mac: \"aa:bb:cc:dd:ee:02\", ip: 10.0.0.12, profile: p}\n",
        )
        .expect("inventory");
        let hosts = dnsmasq_hosts(&inv, "inv.yaml");
        assert!(
            hosts.ends_with(
                "\naa:bb:cc:dd:ee:01,10.0.0.11,[fd00:66::11],n1\naa:bb:cc:dd:ee:02,10.0.0.12\n"
            ),
            "{hosts}"
        );
        let conf = format!(
            "dhcp-range=10.0.0.0,static,255.255.255.0\ndhcp-range=fd00:66::,static,64\n{hosts}"
        );
        let t = crate::import::dnsmasq::translate("test", vec![("hosts".into(), conf)], false)
            .expect("translates");
        assert!(t.report.is_empty(), "{}", t.report);
        let yaml = t.finish().expect("the written inventory is valid").yaml;
        let back = Inventory::parse(Path::new("back.yaml"), &yaml).expect("inventory");
        assert_eq!(back.hosts[0].ipv6(), inv.hosts[0].ipv6());
        assert_eq!(back.hosts[1].ipv6(), None);
    }
}

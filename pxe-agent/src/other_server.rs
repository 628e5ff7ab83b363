//! Other DHCP servers answering this agent's hosts while agents share nothing
//! (file mode, no `--peers`): a DHCPREQUEST that names another server
//! (option 54) for a host whose netboot (`once`) or recovery (`bmc`) state
//! this agent keeps means that server boots the host whatever this agent
//! recorded. It owns which hosts were warned about (one warning a host, at
//! most one entry per host of the inventory in force) and the count of such
//! REQUESTs. Both paths report here: the slow path as it ignores the REQUEST,
//! the fast path through its event slots (`xdp::events`). See docs/peers.md.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use tracing::warn;

use crate::{
    inventory::{Host, Inventory, Netboot},
    mac::MacAddr,
    share::Share,
    sync::lock,
};

/// Whether `host` has state that only this agent keeps when agents share
/// nothing: the provisioning record of `netboot: once`, or a BMC it
/// recovers the host through. A host of a subnet in mode proxy is left out:
/// there every REQUEST on port 67 names the server that leases its address.
pub fn keeps_state(inv: &Inventory, host: &Host) -> bool {
    !inv.subnet_of(host)
        .is_some_and(crate::inventory::Subnet::is_proxy)
        && (inv.netboot_of(host) == Netboot::Once || host.bmc.is_some())
}

/// The hosts warned about and the REQUESTs counted (see the module doc).
#[derive(Debug, Default)]
pub struct OtherServers {
    /// Host (by its primary MAC) → the other server its first REQUEST named.
    warned: Mutex<BTreeMap<MacAddr, Ipv4Addr>>,
    requests: AtomicU64,
}

impl OtherServers {
    /// A DHCPREQUEST from `mac` named `server`, not this agent. Counted when
    /// `mac` is a port of a host that [`keeps_state`] and the agent shares
    /// nothing (`share`: with peers, the other server is one of them);
    /// warned about the first time for that host. Returns whether it warned.
    pub fn seen(&self, inv: &Inventory, share: &Share, mac: MacAddr, server: Ipv4Addr) -> bool {
        if share.is_shared() || inv.served.contains(&server) {
            return false;
        }
        let Some(host) = inv.host_by_mac(mac).filter(|h| keeps_state(inv, h)) else {
            return false;
        };
        self.requests.fetch_add(1, Ordering::Relaxed);
        {
            let mut warned = lock(&self.warned);
            if warned.contains_key(&host.mac) {
                return false;
            }
            warned.insert(host.mac, server);
        }
        let name = host
            .hostname
            .as_ref()
            .map_or_else(|| host.mac.to_string(), ToString::to_string);
        warn!(
            host = %name,
            mac = %host.mac,
            %server,
            "another DHCP server ({server}) answers {name}; its netboot and recovery state \
             are not shared (agents share them with --peers kube)"
        );
        true
    }

    /// Forgets the hosts that are not in `inv`, or no longer keep state
    /// here: such a host is warned about again if it comes back.
    pub fn retain(&self, inv: &Inventory) {
        lock(&self.warned)
            .retain(|mac, _| inv.host_by_mac(*mac).is_some_and(|h| keeps_state(inv, h)));
    }

    /// REQUESTs counted so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Hosts warned about (and still in the inventory).
    pub fn hosts(&self) -> usize {
        lock(&self.warned).len()
    }
}

#[cfg(test)]
mod tests {
    use std::{ffi::OsString, io, path::Path};

    use super::*;
    use crate::inventory::SecretSource;

    const INVENTORY: &str = r#"
subnets:
  - {cidr: 10.66.0.0/16}
  - {cidr: 10.67.0.0/16, mode: proxy}
profiles:
  - {name: worker, boot: {bios: undionly.kpxe}}
  - {name: once, boot: {bios: undionly.kpxe}, netboot: once}
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.1, hostname: node-1, profile: once}
  - {mac: "52:54:00:00:00:02", ip: 10.66.1.2, hostname: node-2, profile: worker,
     bmc: {address: "ipmi://10.66.9.2", username: admin, password_env: BMC}}
  - {mac: "52:54:00:00:00:03", ip: 10.66.1.3, hostname: node-3, profile: worker}
  - {macs: ["52:54:00:00:00:04", "52:54:00:00:00:14"], ip: 10.66.1.4, profile: worker,
     netboot: once}
  - {mac: "52:54:00:00:00:05", ip: 10.67.1.5, hostname: node-5, profile: once}
"#;

    struct Secrets;

    impl SecretSource for Secrets {
        fn read_file(&self, _: &Path) -> io::Result<Vec<u8>> {
            Err(io::ErrorKind::NotFound.into())
        }

        fn var(&self, _: &str) -> Option<OsString> {
            Some("bmc-password".into())
        }
    }

    fn inventory(yaml: &str) -> Inventory {
        let doc = serde_norway::from_str(yaml).expect("yaml");
        Inventory::from_document(Path::new("test.yaml"), doc, &Secrets).expect("valid")
    }

    fn mac(last: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, 0, last])
    }

    const OTHER: Ipv4Addr = Ipv4Addr::new(10, 66, 0, 2);

    #[test]
    fn once_and_bmc_hosts_are_warned_about_once_and_every_request_counted() {
        let (inv, alone) = (inventory(INVENTORY), Share::alone());
        let seen = OtherServers::default();
        assert!(seen.seen(&inv, &alone, mac(1), OTHER), "netboot: once");
        assert!(!seen.seen(&inv, &alone, mac(1), OTHER), "once a host");
        assert!(!seen.seen(&inv, &alone, mac(1), Ipv4Addr::new(10, 66, 0, 3)));
        assert!(seen.seen(&inv, &alone, mac(2), OTHER), "a bmc block");
        assert_eq!((seen.requests(), seen.hosts()), (4, 2));
        // Another port of a host is the same host.
        assert!(seen.seen(&inv, &alone, mac(0x14), OTHER));
        assert!(!seen.seen(&inv, &alone, mac(4), OTHER));
        assert_eq!((seen.requests(), seen.hosts()), (6, 3));
    }

    #[test]
    fn hosts_without_state_here_are_neither_warned_about_nor_counted() {
        let (inv, alone) = (inventory(INVENTORY), Share::alone());
        let seen = OtherServers::default();
        // A plain host, an unknown MAC, a host of a proxy subnet (whose
        // REQUESTs name the address server).
        for m in [3, 0x7f, 5] {
            assert!(!seen.seen(&inv, &alone, mac(m), OTHER), "{m}");
        }
        assert_eq!((seen.requests(), seen.hosts()), (0, 0));
    }

    #[test]
    fn peers_and_the_agents_own_addresses_are_not_other_servers() {
        let mut inv = inventory(INVENTORY);
        let seen = OtherServers::default();
        let peers = Share::new(0, 2).unwrap().with_live([0, 1]);
        assert!(!seen.seen(&inv, &peers, mac(1), OTHER));
        let unclaimed = Share::unclaimed(4).unwrap();
        assert!(!seen.seen(&inv, &unclaimed, mac(2), OTHER));
        // An agent on two interfaces: a REQUEST on one may name the other.
        inv.serve_on(&[Ipv4Addr::new(10, 66, 0, 1), OTHER]);
        assert!(!seen.seen(&inv, &Share::alone(), mac(1), OTHER));
        assert_eq!((seen.requests(), seen.hosts()), (0, 0));
    }

    #[test]
    fn hosts_that_leave_or_stop_keeping_state_are_forgotten() {
        let (inv, alone) = (inventory(INVENTORY), Share::alone());
        let seen = OtherServers::default();
        for m in [1, 2, 4] {
            assert!(seen.seen(&inv, &alone, mac(m), OTHER));
        }
        // node-1 leaves, node-2 loses its BMC, the host of port 4 stays.
        let changed = INVENTORY
            .replace(
                "  - {mac: \"52:54:00:00:00:01\", ip: 10.66.1.1, hostname: node-1, profile: once}\n",
                "",
            )
            .replace(
                "bmc: {address: \"ipmi://10.66.9.2\", username: admin, password_env: BMC}",
                "labels: {rack: r1}",
            );
        let changed = inventory(&changed);
        seen.retain(&changed);
        assert_eq!(seen.hosts(), 1);
        assert!(!seen.seen(&changed, &alone, mac(4), OTHER));
        // Back in the inventory, warned about again.
        seen.retain(&inv);
        assert!(seen.seen(&inv, &alone, mac(2), OTHER));
        assert_eq!(seen.hosts(), 2);
    }
}

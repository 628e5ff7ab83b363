//! The interfaces a node serves: named on the command line or in a file
//! per node, resolved to their index and address, and the pinned XDP links
//! of interfaces no longer served taken down.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

use anyhow::Context as _;
use tracing::{info, warn};

use crate::{
    dhcp::{Server, template},
    netdev,
    xdp::{self, AttachMode, Capacity, FastPath},
};

/// An interface to serve, as `--interface NAME[=IP[,IPV6]]` gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    /// The server address its replies name (option 54, siaddr, `{server}`);
    /// defaults to the interface's IPv4 address.
    pub server_ip: Option<Ipv4Addr>,
    /// The IPv6 address DHCPv6 answers and IPv6 clients' URLs name;
    /// defaults to the interface's first that is not link-local.
    pub server_ip6: Option<Ipv6Addr>,
}

impl std::str::FromStr for Interface {
    type Err = String;

    /// `eth0`, `eth0.100=10.100.0.1`, `eth0=fd00:66::1` or
    /// `eth0=10.66.0.1,fd00:66::1`: at most one address of each family.
    fn from_str(s: &str) -> Result<Interface, String> {
        let (name, addresses) = match s.split_once('=') {
            Some((name, addresses)) => (name, Some(addresses)),
            None => (s, None),
        };
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(['/', ' ']) {
            return Err(format!("{name:?} is not an interface name"));
        }
        let mut out = Interface {
            name: name.to_string(),
            server_ip: None,
            server_ip6: None,
        };
        for text in addresses.into_iter().flat_map(|a| a.split(',')) {
            match text.parse::<IpAddr>() {
                Ok(IpAddr::V4(ip)) if out.server_ip.is_none() => out.server_ip = Some(ip),
                Ok(IpAddr::V6(ip)) if out.server_ip6.is_none() => out.server_ip6 = Some(ip),
                Ok(_) => return Err(format!("{s:?} gives two addresses of one family")),
                Err(_) => return Err(format!("{text:?} is not an IPv4 or IPv6 address")),
            }
        }
        Ok(out)
    }
}

impl fmt::Display for Interface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        match (self.server_ip, self.server_ip6) {
            (Some(v4), Some(v6)) => write!(f, "={v4},{v6}"),
            (Some(v4), None) => write!(f, "={v4}"),
            (None, Some(v6)) => write!(f, "={v6}"),
            (None, None) => Ok(()),
        }
    }
}

/// The interfaces of node `node` in `dir` (`--interface-dir`): the file
/// named after the node, else the file `default`; one `NAME[=SERVER_IP]` a
/// line, blank lines and `#` comments ignored. `dir` is a ConfigMap keyed
/// by node name, mounted into the pod, so one DaemonSet serves each node's
/// own provisioning NICs.
pub fn interfaces_of_node(dir: &Path, node: &str) -> anyhow::Result<Vec<Interface>> {
    anyhow::ensure!(
        !node.is_empty() && node != "." && node != ".." && !node.contains('/'),
        "node name {node:?} cannot name a file in {}",
        dir.display()
    );
    let (path, text) = [node, "default"]
        .iter()
        .find_map(|name| {
            let path = dir.join(name);
            match std::fs::read_to_string(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                read => Some((path, read)),
            }
        })
        .with_context(|| {
            format!(
                "no interfaces for node {node:?} in {}: neither {node:?} nor \"default\" is there",
                dir.display()
            )
        })?;
    let text = text.with_context(|| format!("failed to read {}", path.display()))?;
    let mut interfaces = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let interface = line
            .parse::<Interface>()
            .map_err(|e| anyhow::anyhow!("{}:{}: {e}", path.display(), number + 1))?;
        interfaces.push(interface);
    }
    anyhow::ensure!(
        !interfaces.is_empty(),
        "{} names no interface",
        path.display()
    );
    Ok(interfaces)
}

/// An interface being served: its MAC and the address of each family it
/// serves. DHCPv4 (the XDP program, the slow path, the PXE boot server) is
/// served only where it has an IPv4 address, DHCPv6 only where it has an
/// IPv6 one; an IPv6-only provisioning segment has no IPv4 at all.
#[derive(Clone, Debug)]
pub(super) struct Iface {
    pub(super) name: String,
    pub(super) mac: [u8; 6],
    /// The address DHCPv4 replies name (option 54, siaddr, `{server}`).
    pub(super) ip: Option<Ipv4Addr>,
    /// Its IPv6 address a boot URL can name, if it has one: DHCPv6 is
    /// served there, and IPv6 clients are sent to it.
    pub(super) ip6: Option<Ipv6Addr>,
}

impl Iface {
    /// The DHCPv4 server this interface is, if it has an IPv4 address.
    pub(super) fn server(&self) -> Option<Server> {
        self.ip.map(|ip| Server { ip, mac: self.mac })
    }

    /// Its addresses, of both families: where the provisioning network
    /// reaches this node.
    pub(super) fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.ip
            .map(IpAddr::from)
            .into_iter()
            .chain(self.ip6.map(IpAddr::from))
    }
}

/// The server of each interface: its MAC, and its addresses as given or
/// read. An interface with neither an IPv4 address nor an IPv6 one beyond
/// link-local is refused: nothing could be served there.
pub(super) fn resolve(interfaces: &[Interface]) -> anyhow::Result<Vec<Iface>> {
    anyhow::ensure!(!interfaces.is_empty(), "no interface to serve");
    let mut out: Vec<Iface> = Vec::with_capacity(interfaces.len());
    for i in interfaces {
        anyhow::ensure!(
            out.iter().all(|o| o.name != i.name),
            "interface {} is given twice",
            i.name
        );
        let mac = netdev::mac_of(&i.name)?;
        let ip = match i.server_ip {
            Some(ip) => Some(ip),
            None => match netdev::ipv4_of(&i.name) {
                Ok(ip) => Some(ip),
                Err(netdev::NetdevError::NoIpv4 { .. }) => None,
                Err(e) => return Err(e.into()),
            },
        };
        let ip6 = match i.server_ip6 {
            Some(ip) => Some(ip),
            None => netdev::ipv6_of(&i.name)?,
        };
        anyhow::ensure!(
            ip.is_some() || ip6.is_some(),
            "interface {} has neither an IPv4 address nor an IPv6 address beyond link-local: \
             give it one, or name one with --interface {}=ADDRESS",
            i.name,
            i.name
        );
        if ip.is_none() {
            info!(iface = %i.name, "no IPv4 address: DHCPv4 and the XDP fast path are not served there");
        }
        out.push(Iface {
            name: i.name.clone(),
            mac,
            ip,
            ip6,
        });
    }
    Ok(out)
}

/// Detaches what a previous agent pinned under `dir` for interfaces this
/// one no longer serves: left alone, their programs would go on answering
/// from an inventory nobody updates.
pub(super) fn detach_unserved(dir: &Path, ifaces: &[Iface]) -> anyhow::Result<()> {
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("failed to read the pin directory {}", dir.display()))?;
    let mut unserved = Vec::new();
    for entry in entries {
        let entry =
            entry.with_context(|| format!("failed to read the pin directory {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().is_ok_and(|t| t.is_dir()) && ifaces.iter().all(|i| i.name != name) {
            unserved.push(name);
        }
    }
    if unserved.is_empty() {
        return Ok(());
    }
    for removed in xdp::pin::detach(dir, &unserved)? {
        warn!(
            iface = %removed.iface,
            link = removed.link,
            maps = removed.maps.len(),
            "detached the pinned XDP program of an interface no longer served"
        );
    }
    Ok(())
}

/// Starts `iface`'s fast path on its pins under `dir`, adopting what the
/// last agent left attached (see [`FastPath::start_pinned`]); with the map
/// writes of its first fill as far as they are known: every template on
/// fresh maps, none counted when the pinned maps were adopted (the loader
/// reports no diff for that fill).
pub(super) fn start_pinned(
    dir: &Path,
    iface: &str,
    mode: AttachMode,
    compiled: template::Compiled,
    capacity: Capacity,
) -> anyhow::Result<(FastPath, xdp::maps::SyncReport)> {
    let pins = xdp::pin::iface_dir(dir, iface);
    let (fast, adoption, report) =
        FastPath::start_pinned(&pins, iface, mode, compiled, capacity)
            .with_context(|| format!("failed to start the XDP fast path of {iface} on its pins"))?;
    let pins = pins.display();
    match adoption {
        xdp::Adoption::Fresh { program } => {
            info!(%iface, program, %pins, "XDP program attached fresh and pinned");
        }
        xdp::Adoption::Unchanged { program } => {
            info!(%iface, program, %pins, "adopted the pinned XDP program unchanged");
        }
        xdp::Adoption::Replaced {
            from,
            to,
            maps_reused,
        } => {
            let maps = if maps_reused {
                "on the pinned maps"
            } else {
                "on new maps (another layout)"
            };
            info!(
                %iface, %pins,
                "adopted the pinned XDP link and replaced its program {from} -> {to} atomically, {maps}"
            );
        }
    }
    Ok((fast, report))
}

#[cfg(test)]
mod tests {
    use std::{fs, path::PathBuf, process};

    use super::*;

    /// A directory laid out as the interfaces ConfigMap is mounted.
    fn interface_dir(files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "pxe-interface-dir-{}-{}",
            process::id(),
            files
                .iter()
                .map(|(name, _)| *name)
                .collect::<Vec<_>>()
                .join("+")
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            fs::write(dir.join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn interface_dir_reads_the_nodes_own_file_first() {
        let dir = interface_dir(&[
            (
                "worker-b",
                "# two NICs\neth2=10.66.0.2\n\n  eth2.100=10.100.0.2  # VLAN\n",
            ),
            ("default", "eth1\n"),
        ]);
        let got = interfaces_of_node(&dir, "worker-b").unwrap();
        assert_eq!(
            got,
            vec![
                "eth2=10.66.0.2".parse::<Interface>().unwrap(),
                "eth2.100=10.100.0.2".parse::<Interface>().unwrap(),
            ]
        );
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn interface_dir_falls_back_to_default() {
        let dir = interface_dir(&[("worker-a", "eth3\n"), ("default", "eth1\n")]);
        let got = interfaces_of_node(&dir, "worker-z").unwrap();
        assert_eq!(got, vec!["eth1".parse::<Interface>().unwrap()]);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn interface_dir_without_the_node_or_default_names_both() {
        let dir = interface_dir(&[("worker-a", "eth3\n")]);
        let err = interfaces_of_node(&dir, "worker-z")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&dir.display().to_string()) && err.contains("\"worker-z\""),
            "{err}"
        );
        assert!(err.contains("default"), "{err}");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn interface_dir_refuses_bad_lines_empty_files_and_path_names() {
        let dir = interface_dir(&[("bad", "eth1\neth2=10.0.0.300\n"), ("empty", "# none\n")]);
        let err = interfaces_of_node(&dir, "bad").unwrap_err().to_string();
        assert!(
            err.ends_with("bad:2: \"10.0.0.300\" is not an IPv4 or IPv6 address"),
            "{err}"
        );
        let err = interfaces_of_node(&dir, "empty").unwrap_err().to_string();
        assert!(err.ends_with("empty names no interface"), "{err}");
        for node in ["", "..", "a/b"] {
            assert!(interfaces_of_node(&dir, node).is_err(), "{node:?}");
        }
        fs::remove_dir_all(dir).unwrap();
    }
    #[test]
    fn interfaces_are_named_alone_or_with_their_server_address() {
        let vlan: Interface = "eth0.100=10.100.0.1".parse().expect("valid");
        assert_eq!(
            vlan,
            Interface {
                name: "eth0.100".into(),
                server_ip: Some(Ipv4Addr::new(10, 100, 0, 1)),
                server_ip6: None,
            }
        );
        assert_eq!(vlan.to_string(), "eth0.100=10.100.0.1");
        let plain: Interface = "eth0".parse().expect("valid");
        assert_eq!((plain.server_ip, plain.server_ip6), (None, None));
        for text in ["eth1=fd00:66::1", "eth1=10.66.0.1,fd00:66::1"] {
            let both: Interface = text.parse().expect("valid");
            assert_eq!(both.server_ip6, Some("fd00:66::1".parse().unwrap()));
            assert_eq!(both.to_string(), text);
        }
        for bad in [
            "",
            "=10.0.0.1",
            "eth0=10.0.0",
            "eth0=",
            "a-name-far-too-long0",
            "eth0=10.0.0.1,10.0.0.2",
            "eth0=fd00::1,fd00::2",
        ] {
            assert!(bad.parse::<Interface>().is_err(), "{bad:?} was accepted");
        }
    }
}

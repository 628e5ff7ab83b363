//! What a host boots next, decided once for every boot-loader language:
//! the profile's chain, local disk or kernel, with `{server}`, `{mac}`,
//! `{ip}`, `{ipv6}` and `{token}` expanded and the phone-home token put on
//! the kernel command line. The iPXE script (`http::script`) and grub.cfg
//! (`http::grub`) both render this plan; neither decides it.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use super::token::CMDLINE_PARAM;
use crate::{
    inventory::{
        Host, IP_PLACEHOLDER, IPV6_PLACEHOLDER, MAC_PLACEHOLDER, Profile, SERVER_PLACEHOLDER,
        server_in_url,
    },
    mac::MacAddr,
};

/// Placeholder for the boot's phone-home token in `kernel`, `initrd`,
/// `cmdline` and `chain`; empty when the boot carries no token.
pub const TOKEN_PLACEHOLDER: &str = "{token}";

/// Who the boot is for.
pub struct Target<'a> {
    pub mac: MacAddr,
    /// The address the host boots from now, of either family.
    pub ip: IpAddr,
    /// The host's own addresses, for `{ip}` and `{ipv6}`: its reservation
    /// of each family (a discovered machine's lease of the family it boots
    /// over); empty without one (the inventory refuses a host without the
    /// address its profile's boot uses).
    pub ipv4: Option<Ipv4Addr>,
    pub ipv6: Option<Ipv6Addr>,
    pub hostname: Option<&'a str>,
    pub labels: &'a BTreeMap<String, String>,
}

/// The addresses `{ip}` and `{ipv6}` become for a machine booting from
/// `ip`: `host`'s reservations when the inventory has it, else (a
/// discovered machine) its lease `ip`.
pub fn own_addresses(host: Option<&Host>, ip: IpAddr) -> (Option<Ipv4Addr>, Option<Ipv6Addr>) {
    match (host, ip) {
        (Some(host), _) => (host.ipv4(), host.ipv6()),
        (None, IpAddr::V4(v4)) => (Some(v4), None),
        (None, IpAddr::V6(v6)) => (None, Some(v6)),
    }
}

/// The next step of a host's boot, its strings expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootPlan {
    /// Hand over to another iPXE script.
    Chain(String),
    /// Exit to the firmware's next boot device.
    LocalDisk,
    /// Load a kernel and its initrds. `cmdline` is the whole command line
    /// (the token parameter included), `None` when empty.
    Kernel {
        kernel: String,
        initrd: Vec<String>,
        cmdline: Option<String>,
    },
    /// The profile names nothing to boot.
    Nothing,
}

/// The plan for `target` under `profile`. With a `token`, a kernel's
/// command line ends with `pxe_agent.token=<token>`.
pub fn plan(
    profile: &Profile,
    target: &Target,
    server: impl Into<IpAddr>,
    token: Option<&str>,
) -> BootPlan {
    let server = server_in_url(server.into());
    let text = |ip: Option<String>| ip.unwrap_or_default();
    let ipv4 = text(target.ipv4.map(|ip| ip.to_string()));
    let ipv6 = text(target.ipv6.map(|ip| ip.to_string()));
    let expand = |s: &str| {
        s.replace(SERVER_PLACEHOLDER, &server)
            .replace(MAC_PLACEHOLDER, &target.mac.to_string())
            .replace(IP_PLACEHOLDER, &ipv4)
            .replace(IPV6_PLACEHOLDER, &ipv6)
            .replace(TOKEN_PLACEHOLDER, token.unwrap_or_default())
    };
    if let Some(chain) = &profile.chain {
        return BootPlan::Chain(expand(chain));
    }
    if profile.local_disk {
        return BootPlan::LocalDisk;
    }
    let Some(kernel) = &profile.kernel else {
        return BootPlan::Nothing;
    };
    let parts: Vec<String> = profile
        .cmdline
        .as_deref()
        .map(expand)
        .into_iter()
        .chain(token.map(|t| format!("{CMDLINE_PARAM}={t}")))
        .filter(|p| !p.is_empty())
        .collect();
    BootPlan::Kernel {
        kernel: expand(kernel),
        initrd: profile.initrd.iter().map(|i| expand(i)).collect(),
        cmdline: (!parts.is_empty()).then(|| parts.join(" ")),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn profile(cmdline: &str) -> Profile {
        Profile {
            name: "six".into(),
            boot: None,
            kernel: Some("http://{server}:8080/artifacts/vmlinuz?for={ip}".into()),
            initrd: vec!["http://{server}:8080/artifacts/{ipv6}.img".into()],
            cmdline: Some(cmdline.into()),
            chain: None,
            local_disk: false,
            rules: Vec::new(),
            grub: None,
            netboot: Default::default(),
            options: Default::default(),
        }
    }

    #[test]
    fn the_hosts_own_addresses_fill_ip_and_ipv6_whichever_family_serves_it() {
        let labels = BTreeMap::new();
        let target = Target {
            mac: MacAddr([0x52, 0x54, 0, 0x66, 0x10, 0x01]),
            ip: "fd00:66::20".parse().unwrap(),
            ipv4: Some(Ipv4Addr::new(10, 66, 1, 20)),
            ipv6: Some("fd00:66::20".parse().unwrap()),
            hostname: None,
            labels: &labels,
        };
        let p = profile("ip=[{ipv6}]:::64::eth0:none ip={ip}::10.66.0.1:16::eth0:none");
        let server6: Ipv6Addr = "fd00:66::1".parse().unwrap();
        let BootPlan::Kernel {
            kernel,
            initrd,
            cmdline,
        } = plan(&p, &target, server6, None)
        else {
            panic!("a kernel plan");
        };
        assert_eq!(
            kernel,
            "http://[fd00:66::1]:8080/artifacts/vmlinuz?for=10.66.1.20"
        );
        assert_eq!(
            initrd,
            ["http://[fd00:66::1]:8080/artifacts/fd00:66::20.img"]
        );
        assert_eq!(
            cmdline.as_deref(),
            Some("ip=[fd00:66::20]:::64::eth0:none ip=10.66.1.20::10.66.0.1:16::eth0:none")
        );
        // Over IPv4 only `{server}` changes: both are the host's own.
        let BootPlan::Kernel { cmdline, .. } = plan(&p, &target, Ipv4Addr::new(10, 66, 0, 1), None)
        else {
            panic!("a kernel plan");
        };
        assert_eq!(
            cmdline.as_deref(),
            Some("ip=[fd00:66::20]:::64::eth0:none ip=10.66.1.20::10.66.0.1:16::eth0:none")
        );
        // A chain URL too; without an IPv6 address `{ipv6}` is empty (the
        // inventory refuses such a host for a profile that uses it).
        let chain = Profile {
            chain: Some("http://{server}/by-ip/{ip}/{ipv6}".into()),
            ..p
        };
        let bare = Target {
            ipv6: None,
            ..target
        };
        assert_eq!(
            plan(&chain, &bare, Ipv4Addr::new(10, 66, 0, 1), None),
            BootPlan::Chain("http://10.66.0.1/by-ip/10.66.1.20/".into())
        );
        // A discovered machine's are its lease of the family it boots over.
        let lease6: Ipv6Addr = "fd00:66::1001".parse().unwrap();
        assert_eq!(own_addresses(None, lease6.into()), (None, Some(lease6)));
        let lease4 = Ipv4Addr::new(10, 66, 200, 7);
        assert_eq!(own_addresses(None, lease4.into()), (Some(lease4), None));
    }
}

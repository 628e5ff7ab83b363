//! grub.cfg for the Secure Boot chain (firmware → shim → grub → signed
//! kernel): a grub profile's boot plan (`http::plan`, the same one the iPXE
//! script renders) written as grub commands, made per host when grub asks
//! for the profile's config name, over TFTP (by the requesting address) or
//! over HTTP (same rule, at `/<name>`).
//!
//! Owns the rendering and which request is a host's grub.cfg; not what a
//! host boots (`http::plan`), what a token is (`http::token`) or which URLs
//! grub can read (`inventory::grub_path`, which the inventory checks).

use std::{net::IpAddr, path::Path, sync::Arc};

use super::{
    BootState,
    plan::{BootPlan, Target, own_addresses, plan},
};
use crate::{
    clock,
    inventory::{Profile, grub_path},
    progress::Served,
    tftp,
    trace::TracePath,
};

/// One word for grub's parser: single-quoted, so `$`, `;`, `#` and quotes
/// reach the command as written (a `'` inside becomes `'\''`).
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The grub.cfg of `target` under `profile`. The kernel and initrd URLs
/// were checked when the inventory was loaded; one grub cannot read makes
/// a config that says so and stops.
pub fn render(
    profile: &Profile,
    target: &Target,
    server: impl Into<IpAddr>,
    token: Option<&str>,
) -> String {
    let who = target
        .hostname
        .map_or_else(|| target.mac.to_string(), str::to_owned);
    let mut out = format!(
        "# {who} ({}, {}), profile {}\n",
        target.mac, target.ip, profile.name
    )
    .replace(['\n', '\r'], " ")
    .trim_end()
    .to_owned();
    out.push('\n');
    let fail = |out: &mut String, message: String| {
        out.push_str(&format!("echo {}\nexit 1\n", quote(&message)));
    };
    match plan(profile, target, server, token) {
        BootPlan::Kernel {
            kernel,
            initrd,
            cmdline,
        } => {
            let Some(kernel_path) = grub_path(&kernel) else {
                fail(&mut out, format!("grub cannot fetch the kernel {kernel}"));
                return out;
            };
            let mut initrd_paths = Vec::with_capacity(initrd.len());
            for url in &initrd {
                let Some(path) = grub_path(url) else {
                    fail(&mut out, format!("grub cannot fetch the initrd {url}"));
                    return out;
                };
                initrd_paths.push(path);
            }
            out.push_str(&format!("echo {}\n", quote(&format!("Loading {kernel}"))));
            out.push_str(&format!("linux {}", quote(&kernel_path)));
            for word in cmdline.iter().flat_map(|c| c.split_whitespace()) {
                out.push(' ');
                out.push_str(&quote(word));
            }
            out.push('\n');
            if !initrd_paths.is_empty() {
                out.push_str("initrd");
                for path in &initrd_paths {
                    out.push(' ');
                    out.push_str(&quote(path));
                }
                out.push('\n');
            }
            out.push_str("boot\n");
        }
        BootPlan::LocalDisk => {
            out.push_str(&format!(
                "echo {}\nexit\n",
                quote(&format!("Booting {who} from its local disk"))
            ));
        }
        BootPlan::Chain(url) => fail(&mut out, format!("grub cannot chain the iPXE script {url}")),
        BootPlan::Nothing => fail(
            &mut out,
            format!(
                "Profile {} has nothing to boot for {}",
                profile.name, target.mac
            ),
        ),
    }
    out
}

/// Whether `name` (relative to the boot root, no leading `/`) is the
/// grub.cfg of `profile`.
fn is_config(profile: &Profile, name: &str) -> bool {
    profile
        .grub
        .as_ref()
        .is_some_and(|grub| grub.config == name.trim_start_matches('/'))
}

/// Whether `name` is the grub.cfg name of any profile: a cheap check before
/// looking the client up.
pub fn is_any_config(state: &BootState, name: &str) -> bool {
    state
        .shared
        .inventory()
        .profiles
        .iter()
        .any(|p| is_config(p, name))
}

/// The grub.cfg for the client at `ip` asking for `name`, if `name` is the
/// config of the profile that client boots; each one made is a new boot
/// with a new phone-home token. Looks pool clients up in the lease store
/// (which may block briefly).
pub fn config_for(state: &BootState, ip: IpAddr, name: &str, via: TracePath) -> Option<String> {
    let inv = state.shared.inventory();
    let (mac, host, address) = match (inv.host_at(ip), crate::wire::canonical(ip)) {
        (Some(host), at) => (host.mac, Some(host), at),
        (None, at) => (state.shared.mac_with_lease(at)?, None, at),
    };
    let profile = match host {
        Some(h) => inv.profile_of(h),
        None => inv.discovery_profile()?,
    };
    // A host given no boot file now (`netboot`) gets no config either: the
    // caller refuses the name as it refuses every boot file.
    if !is_config(profile, name) || host.is_some_and(|h| inv.withholds_boot(h)) {
        return None;
    }
    let no_labels = Default::default();
    let (ipv4, ipv6) = own_addresses(host, address);
    let target = Target {
        mac,
        ip: address,
        ipv4,
        ipv6,
        hostname: host.and_then(|h| h.hostname.as_deref()),
        labels: host.map_or(&no_labels, |h| &h.labels),
    };
    let now = clock::now_ms();
    let epoch = state.shared.progress.new_token_epoch(mac, now);
    let token = state.token_key.issue(mac, epoch);
    let text = render(profile, &target, state.server_for(ip), Some(&token));
    state.shared.progress.served(
        mac,
        now,
        Served::Script {
            via,
            what: "grub.cfg",
        },
        || format!("/{name} for {ip}"),
        format!("/{name} (grub)"),
    );
    Some(text)
}

/// Serves each host's grub.cfg over TFTP, by the requesting address.
pub struct TftpConfigs(pub Arc<BootState>);

impl tftp::Generated for TftpConfigs {
    fn file(&self, peer: IpAddr, name: &Path) -> Option<Vec<u8>> {
        let name = name.to_str()?;
        if !is_any_config(&self.0, name) {
            return None;
        }
        config_for(&self.0, peer, name, TracePath::Tftp).map(String::into_bytes)
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, net::Ipv4Addr};

    use super::*;
    use crate::{
        inventory::{DEFAULT_GRUB_CONFIG, GrubSettings},
        mac::MacAddr,
    };

    fn profile() -> Profile {
        Profile {
            name: "secure".into(),
            boot: None,
            kernel: Some("tftp://{server}/vmlinuz".into()),
            initrd: vec!["http://{server}:8080/artifacts/initrd.img".into()],
            cmdline: Some("console=ttyS0 mac={mac} home=http://{server}/h?t={token}".into()),
            chain: None,
            local_disk: false,
            rules: Vec::new(),
            grub: Some(GrubSettings {
                config: DEFAULT_GRUB_CONFIG.into(),
            }),
            netboot: Default::default(),
            options: Default::default(),
        }
    }

    fn target(labels: &BTreeMap<String, String>) -> Target<'_> {
        Target {
            mac: MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x60]),
            ip: Ipv4Addr::new(10, 66, 1, 20).into(),
            ipv4: Some(Ipv4Addr::new(10, 66, 1, 20)),
            ipv6: None,
            hostname: Some("node-sb"),
            labels,
        }
    }

    const SERVER: Ipv4Addr = Ipv4Addr::new(10, 66, 0, 1);

    #[test]
    fn kernel_profile_loads_kernel_and_initrd_with_the_token_last() {
        let labels = BTreeMap::new();
        let s = render(&profile(), &target(&labels), SERVER, Some("3e8-ab"));
        assert!(
            s.starts_with("# node-sb (52:54:00:12:34:60, 10.66.1.20), profile secure\n"),
            "{s}"
        );
        assert!(
            s.contains(
                "\nlinux '(tftp,10.66.0.1)/vmlinuz' 'console=ttyS0' 'mac=52:54:00:12:34:60' \
                 'home=http://10.66.0.1/h?t=3e8-ab' 'pxe_agent.token=3e8-ab'\n"
            ),
            "{s}"
        );
        assert!(
            s.contains("\ninitrd '(http,10.66.0.1:8080)/artifacts/initrd.img'\nboot\n"),
            "{s}"
        );
        // The same plan as the iPXE script: same command line, same token.
        let ipxe =
            super::super::script::render(&profile(), &target(&labels), SERVER, Some("3e8-ab"))
                .expect("renders");
        assert!(
            ipxe.contains(
                " console=ttyS0 mac=52:54:00:12:34:60 home=http://10.66.0.1/h?t=3e8-ab \
                 pxe_agent.token=3e8-ab\n"
            ),
            "{ipxe}"
        );
        let s = render(&profile(), &target(&labels), SERVER, None);
        assert!(!s.contains("pxe_agent.token"), "{s}");
    }

    #[test]
    fn quotes_keep_grub_from_reading_the_command_line() {
        let labels = BTreeMap::new();
        let p = Profile {
            cmdline: Some("a=$x;reboot b='q' #c".into()),
            ..profile()
        };
        let s = render(&p, &target(&labels), SERVER, None);
        assert!(s.contains(r"'a=$x;reboot' 'b='\''q'\''' '#c'"), "{s}");
    }

    #[test]
    fn local_disk_exits_and_nothing_to_boot_fails() {
        let labels = BTreeMap::new();
        let p = Profile {
            local_disk: true,
            ..profile()
        };
        let s = render(&p, &target(&labels), SERVER, None);
        assert!(s.ends_with("from its local disk'\nexit\n"), "{s}");
        assert!(!s.contains("linux "), "{s}");
        let p = Profile {
            kernel: None,
            initrd: vec![],
            cmdline: None,
            ..profile()
        };
        let s = render(&p, &target(&labels), SERVER, None);
        assert!(s.ends_with("exit 1\n"), "{s}");
        assert!(!s.contains("linux "), "{s}");
    }

    #[test]
    fn a_url_grub_cannot_read_stops_the_config() {
        let labels = BTreeMap::new();
        let p = Profile {
            kernel: Some("https://{server}/vmlinuz".into()),
            ..profile()
        };
        let s = render(&p, &target(&labels), SERVER, None);
        assert!(
            s.contains("grub cannot fetch the kernel https://10.66.0.1/vmlinuz"),
            "{s}"
        );
        assert!(s.ends_with("exit 1\n") && !s.contains("linux "), "{s}");
    }

    #[test]
    fn only_the_profiles_config_name_is_its_grub_cfg() {
        assert!(is_config(&profile(), "grub/grub.cfg"));
        assert!(is_config(&profile(), "/grub/grub.cfg"));
        assert!(!is_config(&profile(), "grub/x86_64-efi/grub.cfg"));
        assert!(!is_config(&profile(), "grub.cfg"));
        let ipxe = Profile {
            grub: None,
            ..profile()
        };
        assert!(!is_config(&ipxe, "grub/grub.cfg"));
    }
}

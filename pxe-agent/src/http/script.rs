//! iPXE scripts: a host's profile rendered with minijinja into what the
//! iPXE client fetching `/boot/<mac>.ipxe` runs next.
//!
//! Owns the built-in template and the variables a template sees (mac, ip,
//! hostname, labels, server, profile, kernel, initrd, cmdline, chain,
//! token); not what the host boots (`http::plan`), who may fetch a script
//! (`http::boot`) or what a token is (`http::token`).

use minijinja::{Environment, context};

use super::plan::{BootPlan, Target, plan};
use crate::{inventory::Profile, mac::MacAddr};

/// The script every profile renders with: chain elsewhere, boot the local
/// disk, or load a kernel and its initrds. EFI kernels loaded by iPXE find
/// their initrds by name, hence `initrd=<basename>` on the command line.
const TEMPLATE: &str = r#"#!ipxe
# {{ hostname or mac }} ({{ mac }}, {{ ip }}), profile {{ profile }}
{% if chain -%}
chain --autofree {{ chain }}
{%- elif local_disk -%}
echo Booting {{ hostname or mac }} from its local disk
exit
{%- elif kernel -%}
kernel {{ kernel }}{% for i in initrd %} initrd={{ i | basename }}{% endfor %}{% if cmdline %} {{ cmdline }}{% endif %}
{% for i in initrd -%}
initrd {{ i }}
{% endfor -%}
boot
{%- else -%}
echo Profile {{ profile }} has nothing to boot for {{ mac }}
exit 1
{%- endif %}
"#;

/// `profile` as it renders for a host given no boot file now (`netboot`):
/// the script exits to the next boot device.
pub fn local_disk(profile: &Profile) -> Profile {
    Profile {
        chain: None,
        local_disk: true,
        ..profile.clone()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("failed to render the iPXE script of {mac}: {source}")]
pub struct RenderError {
    mac: MacAddr,
    source: minijinja::Error,
}

/// Renders `profile`'s plan for `target` ([`plan`]: `{server}`, `{mac}`
/// and `{token}` expanded; with a `token`, a kernel's command line ends
/// with `pxe_agent.token=<token>`).
pub fn render(
    profile: &Profile,
    target: &Target,
    server: impl Into<std::net::IpAddr>,
    token: Option<&str>,
) -> Result<String, RenderError> {
    let server = server.into();
    let (chain, local_disk, kernel, initrd, cmdline) = match plan(profile, target, server, token) {
        BootPlan::Chain(url) => (Some(url), false, None, Vec::new(), None),
        BootPlan::LocalDisk => (None, true, None, Vec::new(), None),
        BootPlan::Kernel {
            kernel,
            initrd,
            cmdline,
        } => (None, false, Some(kernel), initrd, cmdline),
        BootPlan::Nothing => (None, false, None, Vec::new(), None),
    };
    let mut env = Environment::new();
    env.add_filter("basename", |s: String| {
        s.rsplit('/').next().unwrap_or_default().to_string()
    });
    let err = |source| RenderError {
        mac: target.mac,
        source,
    };
    env.add_template("boot.ipxe", TEMPLATE).map_err(err)?;
    let template = env.get_template("boot.ipxe").map_err(err)?;
    template
        .render(context! {
            mac => target.mac.to_string(),
            ip => target.ip.to_string(),
            hostname => target.hostname,
            labels => target.labels,
            server => crate::inventory::server_in_url(server),
            profile => profile.name,
            chain => chain,
            local_disk => local_disk,
            kernel => kernel,
            initrd => initrd,
            cmdline => cmdline,
            token => token,
        })
        .map_err(err)
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, net::Ipv4Addr};

    use super::*;

    fn profile() -> Profile {
        Profile {
            name: "worker".into(),
            boot: None,
            kernel: Some("http://{server}:8080/artifacts/vmlinuz".into()),
            initrd: vec!["http://{server}:8080/artifacts/initrd.img".into()],
            cmdline: Some("console=ttyS0 mac={mac}".into()),
            chain: None,
            local_disk: false,
            rules: Vec::new(),
            grub: None,
            netboot: Default::default(),
            options: Default::default(),
        }
    }

    fn target(labels: &BTreeMap<String, String>) -> Target<'_> {
        Target {
            mac: MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56]),
            ip: Ipv4Addr::new(10, 66, 1, 10).into(),
            ipv4: Some(Ipv4Addr::new(10, 66, 1, 10)),
            ipv6: None,
            hostname: Some("node-1"),
            labels,
        }
    }

    #[test]
    fn kernel_profile_loads_kernel_and_initrd_with_names_on_the_cmdline() {
        let labels = BTreeMap::new();
        let s = render(
            &profile(),
            &target(&labels),
            Ipv4Addr::new(10, 66, 0, 1),
            None,
        )
        .expect("renders");
        assert!(s.starts_with("#!ipxe\n"), "{s}");
        assert!(
            s.contains("kernel http://10.66.0.1:8080/artifacts/vmlinuz initrd=initrd.img console=ttyS0 mac=52:54:00:12:34:56\n"),
            "{s}"
        );
        assert!(
            s.contains("initrd http://10.66.0.1:8080/artifacts/initrd.img\n"),
            "{s}"
        );
        assert!(s.trim_end().ends_with("boot"), "{s}");
    }

    #[test]
    fn the_token_ends_the_kernel_command_line_and_fills_its_placeholder() {
        let labels = BTreeMap::new();
        let p = Profile {
            cmdline: Some("console=ttyS0 home=http://{server}/{mac}?token={token}".into()),
            ..profile()
        };
        let s = render(
            &p,
            &target(&labels),
            Ipv4Addr::new(10, 66, 0, 1),
            Some("3e8-ab"),
        )
        .expect("renders");
        assert!(
            s.contains(
                " console=ttyS0 home=http://10.66.0.1/52:54:00:12:34:56?token=3e8-ab \
                 pxe_agent.token=3e8-ab\n"
            ),
            "{s}"
        );
        let s = render(&p, &target(&labels), Ipv4Addr::new(10, 66, 0, 1), None).expect("renders");
        assert!(!s.contains("pxe_agent.token"), "{s}");
    }

    #[test]
    fn chain_profile_chains_and_loads_nothing() {
        let labels = BTreeMap::new();
        let p = Profile {
            chain: Some("http://installer.example/{mac}.ipxe".into()),
            ..profile()
        };
        let s = render(&p, &target(&labels), Ipv4Addr::new(10, 66, 0, 1), None).expect("renders");
        assert!(
            s.contains("chain --autofree http://installer.example/52:54:00:12:34:56.ipxe"),
            "{s}"
        );
        assert!(!s.contains("kernel "), "{s}");
    }

    #[test]
    fn local_disk_profile_exits_to_the_next_boot_device() {
        let labels = BTreeMap::new();
        let p = Profile {
            local_disk: true,
            ..profile()
        };
        let s = render(&p, &target(&labels), Ipv4Addr::new(10, 66, 0, 1), None).expect("renders");
        assert!(s.contains("from its local disk\nexit"), "{s}");
        assert!(!s.contains("kernel "), "{s}");
    }

    #[test]
    fn profile_with_nothing_to_boot_fails_loudly() {
        let labels = BTreeMap::new();
        let p = Profile {
            kernel: None,
            initrd: vec![],
            ..profile()
        };
        let s = render(&p, &target(&labels), Ipv4Addr::new(10, 66, 0, 1), None).expect("renders");
        assert!(s.contains("exit 1"), "{s}");
    }
}

//! What a host boots next, decided once for every boot-loader language:
//! the profile's chain, local disk or kernel, with `{server}`, `{mac}` and
//! `{token}` expanded and the phone-home token put on the kernel command
//! line. The iPXE script (`http::script`) and grub.cfg (`http::grub`)
//! both render this plan; neither decides it.

use std::{collections::BTreeMap, net::IpAddr};

use super::token::CMDLINE_PARAM;
use crate::{
    inventory::{MAC_PLACEHOLDER, Profile, SERVER_PLACEHOLDER, server_in_url},
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
    pub hostname: Option<&'a str>,
    pub labels: &'a BTreeMap<String, String>,
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
    let expand = |s: &str| {
        s.replace(SERVER_PLACEHOLDER, &server)
            .replace(MAC_PLACEHOLDER, &target.mac.to_string())
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

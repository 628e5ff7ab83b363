//! The inventory file's shape, exactly as written. Owns the YAML keys (and
//! refuses unknown ones); not their meaning: addresses, MACs and option
//! codes stay text here so that `validate` can report every bad value
//! together instead of stopping at the first.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawInventory {
    pub subnets: Vec<RawSubnet>,
    pub profiles: Vec<RawProfile>,
    pub hosts: Vec<RawHost>,
    pub discovery: Option<RawDiscovery>,
    pub ipxe: Option<RawIpxe>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDiscovery {
    /// `inspect` or `ignore`; text so that a typo is reported with the rest.
    pub policy: String,
    pub profile: Option<String>,
    /// Seconds; `None` means the pool's subnet's.
    pub lease_time: Option<u32>,
    /// `mac` or `client_id`; text so that a typo is reported with the rest.
    pub lease_key: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIpxe {
    pub user_class: Option<String>,
    pub script: Option<String>,
    /// `required` or `off`; text so that a typo is reported with the rest.
    pub phone_home_token: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSubnet {
    pub cidr: String,
    pub router: Option<String>,
    #[serde(default)]
    pub dns: Vec<String>,
    pub domain: Option<String>,
    /// Seconds; `None` means the default.
    pub lease_time: Option<u32>,
    pub pool: Option<RawRange>,
    #[serde(default)]
    pub mode: super::SubnetMode,
    /// IPv6 only: router advertisements the agent sends on the subnet's
    /// link.
    pub ra: Option<RawRa>,
    /// As [`RawHost::options`], for every client of the subnet.
    #[serde(default)]
    pub options: serde_norway::Mapping,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRa {
    /// The M flag: addresses come from DHCPv6.
    #[serde(default = "yes")]
    pub managed: bool,
    /// The O flag: other configuration comes from DHCPv6.
    #[serde(default = "yes")]
    pub other: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRange {
    pub start: String,
    pub end: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProfile {
    pub name: String,
    pub boot: Option<RawBoot>,
    pub kernel: Option<String>,
    #[serde(default)]
    pub initrd: Vec<String>,
    pub cmdline: Option<String>,
    pub chain: Option<String>,
    #[serde(default)]
    pub local_disk: bool,
    #[serde(default)]
    pub rules: Vec<RawRule>,
    /// Defaults for the `bmc` blocks of the profile's hosts.
    pub bmc: Option<RawBmc>,
    /// Defaults for the recovery policy of the profile's hosts.
    pub recovery: Option<RawRecovery>,
    /// `always`, `once` or `never`; `always` when missing. Text so that a
    /// typo is reported with the rest.
    pub netboot: Option<String>,
    /// The Secure Boot chain: grub reads a grub.cfg the agent renders.
    pub grub: Option<RawGrub>,
    /// As [`RawHost::options`], for every host of the profile.
    #[serde(default)]
    pub options: serde_norway::Mapping,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGrub {
    /// Where grub reads its configuration, beneath the TFTP root.
    pub config: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    /// Missing is reported by validation, as an empty match would be.
    #[serde(rename = "match", default)]
    pub when: RawMatch,
    pub boot: Option<RawBoot>,
    /// As [`RawHost::options`].
    #[serde(default)]
    pub options: serde_norway::Mapping,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMatch {
    #[serde(default)]
    pub arch: Vec<u16>,
    pub vendor_class: Option<String>,
    pub user_class: Option<String>,
    pub circuit_id: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBoot {
    pub bios: Option<String>,
    pub uefi: Option<String>,
    pub uefi_arm64: Option<String>,
    pub http: Option<String>,
    pub http_arm64: Option<String>,
    pub http_ia32: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHost {
    /// The host's one MAC; a host with several ports lists them in `macs`
    /// instead (validation wants exactly one of the two).
    pub mac: Option<String>,
    /// Every port the host may boot from, the primary first.
    #[serde(default)]
    pub macs: Option<Vec<String>>,
    /// Its reserved IPv4 address; a host served over IPv6 only has none
    /// (validation wants `ip`, `ipv6` or both).
    pub ip: Option<String>,
    /// Its reserved IPv6 address, in an IPv6 subnet of the list.
    pub ipv6: Option<String>,
    /// Its SMBIOS system UUID: how DHCPv6 knows a firmware whose DUID
    /// carries no MAC.
    pub uuid: Option<String>,
    pub hostname: Option<String>,
    pub profile: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Keys and values keep their YAML type: the type picks the encoding.
    #[serde(default)]
    pub options: serde_norway::Mapping,
    /// Boxed, as `recovery` is: most hosts have neither, and inline the two
    /// would double every host of a large file while it is read.
    pub bmc: Option<Box<RawBmc>>,
    pub recovery: Option<Box<RawRecovery>>,
    /// Overrides the profile's `netboot`; text as on a profile.
    pub netboot: Option<String>,
}

/// A `bmc` block, on a host or (as defaults) on a profile.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBmc {
    pub address: Option<String>,
    pub username: Option<String>,
    pub password_file: Option<String>,
    pub password_env: Option<String>,
    pub boot_mode: Option<String>,
    /// Redfish over HTTPS: PEM bundle of the CA that signs the BMC's
    /// certificate, relative to the inventory file.
    pub ca_file: Option<String>,
    /// Redfish over HTTPS: skip certificate verification.
    pub insecure: Option<bool>,
    /// The IPMI address of the same BMC beside a Redfish `address`.
    pub ipmi: Option<String>,
    /// The drivers to try, in order (`[redfish, ipmi]`).
    pub drivers: Option<Vec<String>>,
    /// How long calls start with the second driver after a fallback.
    pub fallback_hold: Option<String>,
    /// Accepted by the parser only to be refused with the reason; never
    /// read, so the value goes nowhere.
    pub password: Option<serde::de::IgnoredAny>,
}

/// A `recovery` block, on a host or (as defaults) on a profile. Durations
/// stay text so that validation can name a bad one.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRecovery {
    pub expect_boot: Option<bool>,
    pub deadline: Option<String>,
    pub max_attempts: Option<u32>,
    pub heartbeat: Option<String>,
    pub after_boot: Option<String>,
    pub stages: Option<RawStages>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStages {
    pub dhcp: Option<String>,
    pub boot_file: Option<String>,
    pub script: Option<String>,
}

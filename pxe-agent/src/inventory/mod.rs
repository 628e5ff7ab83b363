//! The host inventory: which machines this agent answers, with which address,
//! subnet settings, boot files and extra DHCP options, and how it treats
//! machines it does not know (discovery) and iPXE clients. Owns the model the
//! DHCP and XDP paths read, the YAML file format (`docs/inventory.md`), its
//! validation, which reports every problem at once so that a bad reload can
//! be refused with one complete message, and the evaluation of per-profile
//! rules (`rule`). It does not decide DHCP policy (`dhcp::decide`), read
//! options out of packets, substitute the `{server}` and `{mac}`
//! placeholders, hand out pool leases, or watch the file for changes.

mod check6;
mod error;
mod extra;
mod file;
mod grub_path;
mod hostname;
mod ipv6;
mod lines;
mod oob;
mod option;
mod patch;
mod raw;
mod rule;
pub mod served_files;
mod stream;
mod validate;

use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    sync::Arc,
};

use crate::mac::MacAddr;

pub use error::{LoadError, Problem};
pub use extra::ExtraOptions;
pub use file::Loaded;
pub use grub_path::grub_path;
pub use hostname::Hostname;
pub use ipv6::{Advertise, DEFAULT_LEASE_TIME_V6, Host6, Range6, Subnet6, parse_uuid, uuid_text};
pub use lines::Locator;
pub use oob::{
    AfterBoot, DEFAULT_BOOT_FILE_DEADLINE, DEFAULT_DHCP_DEADLINE, DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RECOVERY_DEADLINE, DEFAULT_SCRIPT_DEADLINE, RecoverySettings, SecretSource,
    StageDeadlines, parse_duration,
};
pub use option::{decode_hex, encode_option};
pub use patch::Layout;
pub(crate) use patch::{MOST_CHANGED, splice};
pub use rule::{BootAnswer, Match, Rule, Traits, circuit_id, parse_user_classes};

pub use crate::bmc::settings::{
    BmcSettings, BootMode, DriverKind, FallbackSettings, PasswordSource,
};

/// Placeholder in boot strings for the server's address, substituted when
/// answers are built; the inventory keeps it as written.
pub const SERVER_PLACEHOLDER: &str = "{server}";

/// What [`SERVER_PLACEHOLDER`] becomes for a server at `ip`: the address
/// as a URL's host writes it (`10.66.0.1`, `[fd00:66::1]`, RFC 3986
/// section 3.2.2).
pub fn server_in_url(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
    }
}

/// Placeholder in the iPXE script and chain URLs for the client's MAC in
/// lowercase colon form (`52:54:00:12:34:56`), substituted when answers are
/// built; the inventory keeps it as written.
pub const MAC_PLACEHOLDER: &str = "{mac}";

/// Placeholders in a profile's `kernel`, `initrd`, `cmdline` and `chain`
/// for the host's own IPv4 and IPv6 addresses (`10.66.1.10`,
/// `fd00:66::10`, unbracketed), substituted when its boot plan is made:
/// for a kernel command line that configures the address itself, such as
/// dracut's `ip=[{ipv6}]:::64::eth0:none` on a segment where the installed
/// system has no DHCPv6 client. A host whose profile uses one must have
/// that address; for a machine of a discovery pool they are its lease of
/// the family it boots over (the other is empty).
pub const IP_PLACEHOLDER: &str = "{ip}";
pub const IPV6_PLACEHOLDER: &str = "{ipv6}";

/// Lease time used when a subnet does not set `lease_time`, in seconds.
pub const DEFAULT_LEASE_TIME: u32 = 3600;

/// The option 77 entry that marks a client as iPXE when `ipxe.user_class`
/// is not set; iPXE sends it as `\x04iPXE`.
pub const DEFAULT_IPXE_USER_CLASS: &str = "iPXE";

/// The port `pxe-agent run` serves boot HTTP on when `--http-addr` does
/// not say otherwise. The default script URL points at it until the agent
/// calls [`Inventory::use_http_port`] with the port it really listens on.
pub const DEFAULT_HTTP_PORT: u16 = 8080;

/// The script URL iPXE clients get when `ipxe.script` is not set: the
/// agent's own script endpoint, on its boot HTTP port.
pub fn default_ipxe_script(http_port: u16) -> String {
    format!("http://{SERVER_PLACEHOLDER}:{http_port}/boot/{MAC_PLACEHOLDER}.ipxe")
}

/// A validated inventory. Hosts refer to subnets and profiles by index.
///
/// [`Inventory::host_by_mac`] uses an index built by [`Inventory::parse`]
/// (and [`Inventory::load`]). Code that changes `hosts` afterwards (tests,
/// mostly) calls [`Inventory::reindex`]: until then added and removed hosts
/// are still found, by a scan, but a MAC changed in place is not.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inventory {
    /// The IPv4 subnets of `subnets:`, in the order written.
    pub subnets: Vec<Subnet>,
    /// The IPv6 subnets of `subnets:`, in the order written.
    pub subnets6: Vec<Subnet6>,
    pub profiles: Vec<Profile>,
    pub hosts: Vec<Arc<Host>>,
    /// What to do with machines that are not in `hosts`.
    pub discovery: Discovery,
    /// How iPXE clients are recognised and what they are told to load.
    pub ipxe: IpxeSettings,
    /// The addresses of the interfaces the agent serves, when it serves
    /// more than one (see [`Inventory::serve_on`]); empty otherwise.
    pub served: Vec<Ipv4Addr>,
    /// The hosts whose provisioning the netboot store records as done, as
    /// of when this inventory was put in force (see
    /// [`Inventory::withholds_boot`]); not part of the file.
    pub provisioned: std::collections::BTreeSet<MacAddr>,
    index: HostIndex,
}

/// MAC and address -> index into [`Inventory::hosts`]. Derived data: two
/// inventories with the same contents are equal however their indices were
/// built.
///
/// Sorted slices searched by bisection rather than hash maps: exactly
/// 12 and 8 bytes a host, where a hash table rounds its buckets up to a
/// power of two and pays a control byte each, and a lookup in 250,000
/// hosts is 18 comparisons.
#[derive(Debug, Clone, Default)]
struct HostIndex {
    /// Every port of every host ([`Host::ports`]), by MAC.
    by_mac: Box<[(MacAddr, u32)]>,
    /// By address.
    by_ip: Box<[(Ipv4Addr, u32)]>,
    /// By IPv6 address and by system UUID, for the hosts that have them.
    by_ip6: Box<[(Ipv6Addr, u32)]>,
    by_uuid: Box<[([u8; 16], u32)]>,
    /// `hosts.len()` when the index was built.
    hosts: usize,
}

impl HostIndex {
    fn mac(&self, mac: MacAddr) -> Option<usize> {
        lookup(&self.by_mac, &mac)
    }

    fn ip(&self, ip: Ipv4Addr) -> Option<usize> {
        lookup(&self.by_ip, &ip)
    }

    fn ip6(&self, ip: Ipv6Addr) -> Option<usize> {
        lookup(&self.by_ip6, &ip)
    }

    fn uuid(&self, uuid: &[u8; 16]) -> Option<usize> {
        lookup(&self.by_uuid, uuid)
    }
}

/// The first entry for `key` in an index sorted by key and then position.
fn lookup<K: Ord>(index: &[(K, u32)], key: &K) -> Option<usize> {
    let at = index.partition_point(|(k, _)| k < key);
    index
        .get(at)
        .filter(|(k, _)| k == key)
        .and_then(|&(_, host)| usize::try_from(host).ok())
}

/// `entries` sorted by key, the first position of each key kept (as a scan
/// finds it), in a slice of exactly its length.
fn sorted_index<K: Ord + Copy>(mut entries: Vec<(K, u32)>) -> Box<[(K, u32)]> {
    entries.sort_unstable();
    entries.dedup_by_key(|(key, _)| *key);
    entries.into_boxed_slice()
}

impl PartialEq for HostIndex {
    fn eq(&self, _: &HostIndex) -> bool {
        true
    }
}

impl Eq for HostIndex {}

/// An IPv4 subnet that hosts get addresses in, with the settings they get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subnet {
    /// Network address (host bits zero).
    pub network: Ipv4Addr,
    /// Prefix length, 0..=32.
    pub prefix: u8,
    pub router: Option<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    pub domain: Option<String>,
    /// Seconds.
    pub lease_time: u32,
    /// Addresses leased to machines that are not in the inventory, when
    /// discovery is on. Inside the subnet; holds no reserved address.
    pub pool: Option<Range>,
    /// Whether this agent hands out the addresses or only boot information.
    pub mode: SubnetMode,
    /// Extra DHCP options for every client of the subnet: code -> encoded
    /// value bytes (at most 255), as in [`Host::options`]. They replace
    /// what `router`, `dns` and `domain` give for the same code; the
    /// profile's and the host's own replace them (`dhcp::reply`).
    pub options: BTreeMap<u8, Vec<u8>>,
}

/// Who gives a subnet's clients their addresses (docs/lifecycle.md,
/// "proxyDHCP").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SubnetMode {
    /// This agent: reservations and the discovery pool.
    #[default]
    Server,
    /// Another DHCP server: this agent answers PXE clients with boot
    /// information only (PXE 2.1 section 2.2.3 proxyDHCP), on port 67 and
    /// on port 4011, and never answers other clients.
    Proxy,
}

impl Subnet {
    pub fn is_proxy(&self) -> bool {
        self.mode == SubnetMode::Proxy
    }

    fn mask_bits(&self) -> u32 {
        match self.prefix {
            0 => 0,
            prefix => u32::MAX << (32 - u32::from(prefix.min(32))),
        }
    }

    pub fn netmask(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.mask_bits())
    }

    /// The all-ones host address of the subnet.
    pub fn broadcast(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) | !self.mask_bits())
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = self.mask_bits();
        u32::from(ip) & mask == u32::from(self.network) & mask
    }
}

/// CIDR notation, e.g. `10.66.0.0/16`.
impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// An inclusive range of IPv4 addresses, `start` to `end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Range {
    pub start: Ipv4Addr,
    pub end: Ipv4Addr,
}

impl Range {
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.start <= ip && ip <= self.end
    }

    /// Number of addresses; 0 when `end` is before `start`. A `u64`, as
    /// `0.0.0.0-255.255.255.255` holds 2^32.
    pub fn len(&self) -> u64 {
        if self.is_empty() {
            0
        } else {
            u64::from(u32::from(self.end) - u32::from(self.start)) + 1
        }
    }

    /// True only when `end` is before `start`, which validation refuses.
    pub fn is_empty(&self) -> bool {
        self.end < self.start
    }

    /// The addresses in order, `start` first.
    pub fn addresses(&self) -> impl Iterator<Item = Ipv4Addr> + use<> {
        (u32::from(self.start)..=u32::from(self.end)).map(Ipv4Addr::from)
    }
}

/// `10.66.200.1-10.66.200.250`.
impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

/// What a group of hosts boots. Strings are kept as written, including the
/// `{server}` and `{mac}` placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    /// `None`: hosts get an address but no boot answer (unless a rule gives
    /// one).
    pub boot: Option<BootFiles>,
    pub kernel: Option<String>,
    pub initrd: Vec<String>,
    pub cmdline: Option<String>,
    /// URL that iPXE clients of this profile's hosts load instead of
    /// [`IpxeSettings::script`].
    pub chain: Option<String>,
    /// The iPXE script boots the local disk (exits to the next boot device)
    /// instead of a kernel: for installed hosts whose BMC may ignore a
    /// boot-device change.
    pub local_disk: bool,
    /// Conditional changes to the boot answer and options, applied in order
    /// ([`Profile::boot_for`]).
    pub rules: Vec<Rule>,
    /// The profile boots through grub (the Secure Boot chain shim → grub →
    /// kernel): the agent renders the host's grub.cfg from `kernel`,
    /// `initrd` and `cmdline` (`http::grub`).
    pub grub: Option<GrubSettings>,
    /// Whether the profile's hosts are given a boot file (hosts may
    /// override it).
    pub netboot: Netboot,
    /// Extra DHCP options for every host of the profile: code -> encoded
    /// value bytes (at most 255), as in [`Host::options`]. They replace the
    /// subnet's of the same code; its rules' and the host's own replace
    /// them ([`Profile::boot_for`]).
    pub options: BTreeMap<u8, Vec<u8>>,
}

impl Profile {
    /// Whether its boot plan strings (`kernel`, `initrd`, `cmdline`,
    /// `chain`) contain `placeholder`.
    pub fn uses(&self, placeholder: &str) -> bool {
        self.kernel
            .iter()
            .chain(&self.initrd)
            .chain(&self.cmdline)
            .chain(&self.chain)
            .any(|s| s.contains(placeholder))
    }
}

/// Where a grub profile's hosts read their rendered grub.cfg.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrubSettings {
    /// The file name beneath the TFTP root (and `/` over HTTP), without a
    /// leading `/`: `grub/grub.cfg` unless the profile says otherwise, the
    /// name Debian's signed `grubnetx64.efi` (prefix `/grub`) asks for.
    pub config: String,
}

/// The grub.cfg name of Debian's signed network grub.
pub const DEFAULT_GRUB_CONFIG: &str = "grub/grub.cfg";

/// The first file each kind of firmware is told to fetch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BootFiles {
    /// TFTP file for legacy BIOS PXE (client arch 0).
    pub bios: Option<String>,
    /// TFTP file for UEFI x64 PXE (client arch 7 and 9).
    pub uefi: Option<String>,
    /// TFTP file for UEFI ARM64 PXE (client arch 11).
    pub uefi_arm64: Option<String>,
    /// URL for UEFI x64 HTTP boot (client arch 16).
    pub http: Option<String>,
    /// URL for UEFI arm64 HTTP boot (client arch 19).
    pub http_arm64: Option<String>,
    /// URL for UEFI IA32 HTTP boot (client arch 15).
    pub http_ia32: Option<String>,
}

/// One machine the agent answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The primary MAC: the one progress, recovery and messages name the
    /// host by, and the `{mac}` placeholder becomes.
    pub mac: MacAddr,
    /// Every MAC the host may boot from, `mac` first (see [`Host::ports`]);
    /// empty when `mac` is its only one, which spares most hosts of a
    /// fleet an allocation.
    pub macs: Vec<MacAddr>,
    /// Its reserved IPv4 address and the index into [`Inventory::subnets`]
    /// of the subnet that contains it; `None` for a host served over IPv6
    /// only (it has an `ipv6:`), which DHCPv4 leaves to other servers. The
    /// index is a `u32` so the pair takes the room the address and a
    /// `usize` index took before it was optional.
    pub ip: Option<(Ipv4Addr, u32)>,
    pub hostname: Option<Hostname>,
    /// Index into [`Inventory::profiles`].
    pub profile: usize,
    pub labels: BTreeMap<String, String>,
    /// Extra DHCP options: code -> encoded value bytes (at most 255).
    pub options: ExtraOptions,
    /// How to reach the host's BMC, password included (read at load).
    /// Boxed, as the recovery settings are: most hosts of a large fleet
    /// have neither, and inline they would triple the size of every host.
    pub bmc: Option<Box<BmcSettings>>,
    /// When the host is recovered through its BMC; `None`: only on request.
    pub recovery: Option<Box<RecoverySettings>>,
    /// Overrides its profile's [`Profile::netboot`].
    pub netboot: Option<Netboot>,
    /// Its IPv6 address and system UUID, when it has either.
    pub v6: Option<Box<Host6>>,
}

/// `netboot:` on a profile or host: when the host is given a boot file.
/// Every route follows it: DHCP on both paths, the iPXE script, TFTP and
/// HTTP boot (`docs/lifecycle.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Netboot {
    /// Every boot.
    #[default]
    Always,
    /// Until the host's provisioning is done (its phone-home, or an
    /// operator's `hosts done`); `reprovision` arms it again.
    Once,
    /// Never: the host gets its address only.
    Never,
}

impl fmt::Display for Netboot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Netboot::Always => "always",
            Netboot::Once => "once",
            Netboot::Never => "never",
        })
    }
}

impl Host {
    /// The MACs the host is answered on: `macs` when it starts with `mac`,
    /// else just `mac` (a host built in code, or one whose `mac` was
    /// changed in place after a clone).
    pub fn ports(&self) -> &[MacAddr] {
        if self.macs.first() == Some(&self.mac) {
            &self.macs
        } else {
            std::slice::from_ref(&self.mac)
        }
    }

    /// Its reserved IPv4 address, if it has one.
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        self.ip.map(|(ip, _)| ip)
    }

    /// Its reserved IPv6 address, if it has one.
    pub fn ipv6(&self) -> Option<Ipv6Addr> {
        self.v6.as_ref().and_then(|v6| v6.ip).map(|(ip, _)| ip)
    }

    /// Its system UUID (`uuid:`), if the inventory gives one.
    pub fn uuid(&self) -> Option<&[u8; 16]> {
        self.v6.as_ref().and_then(|v6| v6.uuid.as_ref())
    }

    /// How messages name this host: `node-1 (52:54:00:12:34:56)`, or just
    /// the MAC when it has no hostname. Matches [`Problem::host`].
    pub fn label(&self) -> String {
        match &self.hostname {
            Some(hostname) => format!("{hostname} ({})", self.mac),
            None => self.mac.to_string(),
        }
    }
}

/// What the agent does with requests from MACs that are not in the
/// inventory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Discovery {
    pub policy: DiscoveryPolicy,
    /// Index into [`Inventory::profiles`]: what unknown machines boot. Set
    /// whenever `policy` is [`DiscoveryPolicy::Inspect`].
    pub profile: Option<usize>,
    /// Seconds; `None`: the lease time of the pool's subnet.
    pub lease_time: Option<u32>,
    /// What a pool lease belongs to.
    pub lease_key: LeaseKey,
}

/// `discovery.lease_key`: what identifies the machine a pool lease belongs
/// to (docs/lifecycle.md, "Several NICs and client identifiers").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LeaseKey {
    /// The hardware address (`htype` and `chaddr`), whatever client
    /// identifier (option 61) the request carries: PXE ROM, iPXE and the
    /// installed system send different ones, and one machine keeps one
    /// address through the chain (dnsmasq's `dhcp-ignore-clid`).
    #[default]
    Mac,
    /// The client identifier when the request has one, else the hardware
    /// address, as RFC 2131 section 4.2 has it: each boot stage that sends
    /// its own identifier is its own client, with its own address.
    ClientId,
}

impl Discovery {
    /// Lease time for an unknown machine given an address in `subnet`.
    pub fn lease_time_in(&self, subnet: &Subnet) -> u32 {
        self.lease_time.unwrap_or(subnet.lease_time)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DiscoveryPolicy {
    /// Leave unknown machines to the rest of the network.
    #[default]
    Ignore,
    /// Lease them an address from a subnet's pool and answer them with the
    /// discovery profile, so they boot an inspection image and can be
    /// adopted into the inventory.
    Inspect,
}

/// How iPXE clients are recognised and which script they load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpxeSettings {
    /// A client whose user class option (77) has this entry is iPXE.
    pub user_class: String,
    /// URL of the iPXE script, with `{server}` and `{mac}` as written.
    pub script: String,
    /// `script` is [`default_ipxe_script`], not the file's, so it follows
    /// the agent's HTTP port ([`Inventory::use_http_port`]).
    pub default_script: bool,
    /// Whether a phone-home must carry the token of the host's rendered
    /// script.
    pub phone_home_token: PhoneHomeToken,
}

/// `ipxe.phone_home_token`: whether the phone-home endpoint requires the
/// per-boot token the agent's script puts on the kernel command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PhoneHomeToken {
    /// A phone-home without the current boot's token is refused (403).
    #[default]
    Required,
    /// The host's address is enough, as before tokens: for systems that
    /// phone home without having booted the agent's script (chained
    /// installers, installed systems) and are not given the token.
    Off,
}

impl Default for IpxeSettings {
    fn default() -> IpxeSettings {
        IpxeSettings {
            user_class: DEFAULT_IPXE_USER_CLASS.to_owned(),
            script: default_ipxe_script(DEFAULT_HTTP_PORT),
            default_script: true,
            phone_home_token: PhoneHomeToken::default(),
        }
    }
}

impl Inventory {
    /// Reads, parses and validates the inventory at `path`.
    pub fn load(path: &Path) -> Result<Inventory, LoadError> {
        file::load(path)
    }

    /// Reads the inventory at `path` for a running agent: [`Inventory::load`],
    /// with the layout of the file's host entries, so that the next reload
    /// parses only the entries that changed (`previous`: the inventory in
    /// force and the layout its load returned).
    pub fn reload(
        path: &Path,
        previous: Option<(&Inventory, &Layout)>,
    ) -> Result<Loaded, LoadError> {
        file::reload(path, previous)
    }

    /// Parses and validates `text`; `path` is only used in messages.
    ///
    /// Passwords named by `bmc` blocks are read now, from their files
    /// (relative paths are relative to `path`'s directory) or environment
    /// variables.
    pub fn parse(path: &Path, text: &str) -> Result<Inventory, LoadError> {
        Inventory::parse_with(path, text, &oob::System)
    }

    /// Validates a document of the file format's shape that another source
    /// assembled (the Kubernetes source, from its objects); `label` names
    /// the source in messages as the path names a file. The same checks
    /// and messages as a file's.
    pub fn from_document(
        label: &Path,
        document: serde_norway::Value,
        secrets: &dyn SecretSource,
    ) -> Result<Inventory, LoadError> {
        let raw: raw::RawInventory =
            serde_norway::from_value(document).map_err(|e| LoadError::Syntax {
                path: PathBuf::from(label),
                message: e.to_string(),
            })?;
        Inventory::validate_raw(label, raw, secrets)
    }

    /// [`Inventory::from_document`] of a document whose host entries come
    /// apart (`frame`'s own `hosts` are not read): `hosts`, the YAML text
    /// of one entry each, in order, parsed and checked a batch at a time
    /// (`stream`'s), so that the entries of a fleet never all exist at
    /// once as parsed. The same problems, in the same order.
    pub fn from_parts(
        label: &Path,
        frame: serde_norway::Value,
        hosts: &[&str],
        secrets: &dyn SecretSource,
    ) -> Result<Inventory, LoadError> {
        let syntax = |e: serde_norway::Error| LoadError::Syntax {
            path: PathBuf::from(label),
            message: e.to_string(),
        };
        let frame: raw::RawInventory = serde_norway::from_value(frame).map_err(syntax)?;
        let batches = hosts.chunks(stream::BATCH).map(|batch| {
            batch
                .iter()
                .map(|entry| serde_norway::from_str::<raw::RawHost>(entry))
                .collect::<Result<Vec<_>, _>>()
        });
        let mut secrets = oob::Secrets::new(secrets, label);
        let checked = validate::validate_in_batches(&frame, batches, hosts.len(), &mut secrets)
            .map_err(syntax)?;
        let mut inventory = checked.map_err(|problems| LoadError::Invalid {
            path: PathBuf::from(label),
            problems,
        })?;
        inventory.reindex();
        Ok(inventory)
    }

    /// Whether `document` has the file format's shape (keys and types),
    /// without validating values: the parser's message when it has not.
    pub fn check_shape(document: &serde_norway::Value) -> Result<(), String> {
        <raw::RawInventory as serde::Deserialize>::deserialize(document)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn validate_raw(
        path: &Path,
        raw: raw::RawInventory,
        secrets: &dyn SecretSource,
    ) -> Result<Inventory, LoadError> {
        let mut secrets = oob::Secrets::new(secrets, path);
        let mut inventory =
            validate::validate(raw, &mut secrets).map_err(|problems| LoadError::Invalid {
                path: PathBuf::from(path),
                problems,
            })?;
        inventory.reindex();
        Ok(inventory)
    }

    pub(crate) fn parse_with(
        path: &Path,
        text: &str,
        secrets: &dyn oob::SecretSource,
    ) -> Result<Inventory, LoadError> {
        if let Some(parsed) = stream::parse(path, text, secrets) {
            return parsed;
        }
        let raw: raw::RawInventory = serde_norway::from_str(text).map_err(|e| {
            let mut message = e.to_string();
            // Inside [...] and {...} YAML reads an unquoted `{server}` as a
            // mapping, which the parser reports as a bare type mismatch, or,
            // after other text, as a flow collection that does not close.
            if (message.contains("invalid type: map, expected a string")
                || message.contains("while parsing a flow"))
                && (text.contains(SERVER_PLACEHOLDER) || text.contains(MAC_PLACEHOLDER))
            {
                message.push_str(
                    " (quote values that contain {server} or {mac} inside [...] or {...})",
                );
            }
            LoadError::Syntax {
                path: PathBuf::from(path),
                message,
            }
        })?;
        Inventory::validate_raw(path, raw, secrets)
    }

    /// Whether a host that is the same in `self` and in `other` gets the
    /// same replies from both: everything but the hosts and who is
    /// provisioned is equal. Every field is named, so that a new one must
    /// be weighed here.
    pub fn same_replies_context(&self, other: &Inventory) -> bool {
        let Inventory {
            subnets,
            subnets6,
            profiles,
            hosts: _,
            discovery,
            ipxe,
            served,
            provisioned: _,
            index: _,
        } = self;
        *subnets == other.subnets
            && *subnets6 == other.subnets6
            && *profiles == other.profiles
            && *discovery == other.discovery
            && *ipxe == other.ipxe
            && *served == other.served
    }

    /// Whether `other` has the same hosts by MAC: the same ports, in hosts
    /// at the same places, with the same primary MACs.
    pub fn same_ports(&self, other: &Inventory) -> bool {
        self.index.by_mac == other.index.by_mac
            && self.hosts.len() == other.hosts.len()
            && self
                .hosts
                .iter()
                .zip(&other.hosts)
                .all(|(a, b)| a.mac == b.mac)
    }

    /// Rebuilds the index behind [`Inventory::host_by_mac`] after `hosts`
    /// changed. With duplicate MACs (which validation refuses) the first
    /// host wins, as a scan would find it.
    ///
    /// # Panics
    /// With more than `u32::MAX` hosts, which no map could hold.
    pub fn reindex(&mut self) {
        let position = |at: usize| u32::try_from(at).expect("fewer than 2^32 hosts");
        let ports = self.hosts.iter().map(|h| h.ports().len()).sum();
        let mut by_mac = Vec::with_capacity(ports);
        let mut by_ip = Vec::with_capacity(self.hosts.len());
        let (mut by_ip6, mut by_uuid) = (Vec::new(), Vec::new());
        for (at, host) in self.hosts.iter().enumerate() {
            by_mac.extend(host.ports().iter().map(|&mac| (mac, position(at))));
            by_ip.extend(host.ipv4().map(|ip| (ip, position(at))));
            by_ip6.extend(host.ipv6().map(|ip| (ip, position(at))));
            by_uuid.extend(host.uuid().map(|&uuid| (uuid, position(at))));
        }
        self.index = HostIndex {
            by_mac: sorted_index(by_mac),
            by_ip: sorted_index(by_ip),
            by_ip6: sorted_index(by_ip6),
            by_uuid: sorted_index(by_uuid),
            hosts: self.hosts.len(),
        };
    }

    /// The IPv4 subnet of `host`'s IPv4 address, if it has one.
    pub fn subnet_of(&self, host: &Host) -> Option<&Subnet> {
        let (_, at) = host.ip?;
        self.subnets.get(at as usize)
    }

    /// # Panics
    /// If `host.profile` is not an index into `self.profiles`, which cannot
    /// happen for a host of a loaded inventory.
    pub fn profile_of(&self, host: &Host) -> &Profile {
        &self.profiles[host.profile]
    }

    /// The host with `mac` among its ports ([`Host::ports`]), in O(1)
    /// through the index: the slow path looks
    /// up every packet, and fleets have tens of thousands of hosts. When
    /// the index is visibly stale (a hit that names another MAC, or a
    /// different host count) this scans instead; see [`Inventory`].
    pub fn host_by_mac(&self, mac: MacAddr) -> Option<&Host> {
        let indexed = self.index.mac(mac);
        if let Some(host) = indexed
            .and_then(|at| self.hosts.get(at))
            .filter(|host| host.ports().contains(&mac))
        {
            return Some(host);
        }
        if self.index.hosts == self.hosts.len() && indexed.is_none() {
            return None;
        }
        self.hosts
            .iter()
            .find(|host| host.ports().contains(&mac))
            .map(|h| &**h)
    }

    /// The host reserved `ip`, through the index like
    /// [`Inventory::host_by_mac`]: TFTP and HTTP look one up per request.
    pub fn host_by_ip(&self, ip: Ipv4Addr) -> Option<&Host> {
        self.indexed(self.index.ip(ip), |host| host.ipv4() == Some(ip))
    }

    /// The host reserved `ip`, of either family: TFTP and HTTP know a
    /// client by the address it comes from. An IPv4-mapped IPv6 address (as
    /// a dual-stack socket shows an IPv4 peer) is the IPv4 address.
    pub fn host_at(&self, ip: IpAddr) -> Option<&Host> {
        match crate::wire::canonical(ip) {
            IpAddr::V4(ip) => self.host_by_ip(ip),
            IpAddr::V6(ip) => self.host_by_ip6(ip),
        }
    }

    /// The host reserved the IPv6 address `ip`, through the index.
    pub fn host_by_ip6(&self, ip: Ipv6Addr) -> Option<&Host> {
        self.indexed(self.index.ip6(ip), |host| host.ipv6() == Some(ip))
    }

    /// The host whose `uuid:` is `uuid`, through the index.
    pub fn host_by_uuid(&self, uuid: &[u8; 16]) -> Option<&Host> {
        self.indexed(self.index.uuid(uuid), |host| host.uuid() == Some(uuid))
    }

    /// The host an index points at when it is the one `is` looks for; a
    /// scan when the index is visibly stale (see [`Inventory`]).
    fn indexed(&self, at: Option<usize>, is: impl Fn(&Host) -> bool) -> Option<&Host> {
        if let Some(host) = at.and_then(|at| self.hosts.get(at)).filter(|h| is(h)) {
            return Some(host);
        }
        if self.index.hosts == self.hosts.len() && at.is_none() {
            return None;
        }
        self.hosts.iter().find(|host| is(host)).map(|h| &**h)
    }

    /// The IPv6 subnet of `host`'s IPv6 address, if it has one.
    pub fn subnet6_of(&self, host: &Host) -> Option<&Subnet6> {
        let (_, at) = host.v6.as_ref()?.ip?;
        self.subnets6.get(at)
    }

    /// Points the default iPXE script URL at the agent's boot HTTP server
    /// on `http_port`; an `ipxe.script` set in the file is kept as written.
    pub fn use_http_port(&mut self, http_port: u16) {
        if self.ipxe.default_script {
            self.ipxe.script = default_ipxe_script(http_port);
        }
    }

    /// Tells the inventory the addresses of the interfaces the agent
    /// serves. With more than one, a host's broadcasts are answered only on
    /// the interface of its own segment (see `dhcp::decide`); with one,
    /// that interface hears every host, as before.
    pub fn serve_on(&mut self, addresses: &[Ipv4Addr]) {
        self.served = if addresses.len() > 1 {
            addresses.to_vec()
        } else {
            Vec::new()
        };
    }

    /// The `netboot` policy in force for `host`: its own, else its
    /// profile's.
    pub fn netboot_of(&self, host: &Host) -> Netboot {
        host.netboot.unwrap_or(self.profile_of(host).netboot)
    }

    /// Whether `host` is given no boot file on any route: `netboot: never`,
    /// or `once` with its provisioning done ([`Inventory::provisioned`]).
    pub fn withholds_boot(&self, host: &Host) -> bool {
        match self.netboot_of(host) {
            Netboot::Always => false,
            Netboot::Never => true,
            Netboot::Once => self.provisioned.contains(&host.mac),
        }
    }

    /// Whether the host reserved `ip` is given no boot file (TFTP and HTTP
    /// know a client by its address).
    pub fn withholds_boot_at(&self, ip: IpAddr) -> bool {
        self.host_at(ip).is_some_and(|h| self.withholds_boot(h))
    }

    /// The profile unknown machines get, when discovery names one.
    pub fn discovery_profile(&self) -> Option<&Profile> {
        self.discovery.profile.and_then(|at| self.profiles.get(at))
    }

    /// The subnets that have a discovery pool, with the pool.
    pub fn pools(&self) -> impl Iterator<Item = (&Subnet, &Range)> {
        self.subnets
            .iter()
            .filter_map(|subnet| subnet.pool.as_ref().map(|pool| (subnet, pool)))
    }
}

#[cfg(test)]
mod tests;

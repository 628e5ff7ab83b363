//! Translation of other DHCP servers' configurations (dnsmasq, kea-dhcp4
//! and kea-dhcp6) into an inventory file, and of an inventory back to a
//! dnsmasq hosts file. Owns the shared translation model (subnets, hosts
//! with the boot answers each firmware class gets; its IPv6 half is in
//! `ipv6`), the YAML it is written as, and the report of what could not be
//! translated, each item with its file and line. It does not decide what
//! is a valid inventory: the written text goes through
//! [`Inventory::parse`], the agent's own validation, before it is returned.
//! The servers' live leases, to carry into the agent's lease store, are
//! read and sorted in `leases`.

pub mod dnsmasq;
pub mod duid;
pub mod export;
pub mod ipv6;
pub mod kea;
pub mod leases;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    fmt::Write as _,
    net::{Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

pub use self::ipv6::{Reservation6, Subnet6Out};
use crate::{
    inventory::{Inventory, LoadError, encode_option, uuid_text},
    mac::MacAddr,
};

/// Why an import produced nothing.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("failed to read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to parse {origin}: {message}")]
    Parse { origin: Origin, message: String },
    /// The translation was written but the inventory validation refused it.
    #[error("the imported inventory does not validate: {0}")]
    Invalid(LoadError),
}

/// Where a setting was read: file and line (1-based).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Origin {
    pub file: String,
    pub line: usize,
}

impl Origin {
    pub fn new(file: &Path, line: usize) -> Origin {
        Origin {
            file: file.display().to_string(),
            line,
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// Everything the import left out or changed in meaning, in source order.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub items: Vec<(Origin, String)>,
}

impl Report {
    pub fn add(&mut self, origin: &Origin, message: impl Into<String>) {
        self.items.push((origin.clone(), message.into()));
    }

    /// A further dynamic range of a subnet already made: the first range
    /// of a subnet is its pool, a second one is reported (both families).
    pub(crate) fn another_range<A>(
        &mut self,
        origin: &Origin,
        kept: &mut Option<(A, A)>,
        pool: Option<(A, A)>,
    ) {
        if pool.is_none() {
            return;
        }
        if kept.is_some() {
            self.add(
                origin,
                "second range in one subnet: only the first is kept as the pool",
            );
        } else {
            *kept = pool;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// One `file:line: message` a line.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut items: Vec<_> = self.items.iter().collect();
        items.sort_by(|a, b| a.0.cmp(&b.0));
        for (origin, message) in items {
            writeln!(f, "{origin}: {message}")?;
        }
        Ok(())
    }
}

/// A subnet with its settings, as the inventory's `subnets` entry.
#[derive(Debug, Clone)]
pub struct SubnetOut {
    pub network: Ipv4Addr,
    pub prefix: u8,
    pub router: Option<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    pub domain: Option<String>,
    pub lease_time: Option<u32>,
    pub pool: Option<(Ipv4Addr, Ipv4Addr)>,
    /// `mode: proxy`: another DHCP server hands out the addresses and the
    /// agent answers PXE firmware with boot information only.
    pub proxy: bool,
    /// Extra options for every client of the subnet: code -> value as
    /// YAML text ([`option_yaml`]).
    pub options: BTreeMap<u8, String>,
    pub origin: Origin,
}

impl SubnetOut {
    fn mask(&self) -> u32 {
        match self.prefix {
            0 => 0,
            p => u32::MAX << (32 - u32::from(p.min(32))),
        }
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & self.mask() == u32::from(self.network)
    }
}

/// What each firmware class is told to load: a profile's `boot` plus its
/// `chain`. Hosts with equal boot sets share a profile.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct BootSet {
    pub bios: Option<String>,
    pub uefi: Option<String>,
    pub uefi_arm64: Option<String>,
    pub http: Option<String>,
    /// What iPXE clients load (the profile's `chain`).
    pub chain: Option<String>,
    /// The profile's `options`: code -> value as YAML text
    /// ([`option_yaml`]). Hosts with other options get another profile.
    pub options: BTreeMap<u8, String>,
}

impl BootSet {
    /// The boot set of a host whose server gives `file(arch, ipxe)` to a
    /// client of that architecture (option 93), iPXE or not; what the
    /// inventory cannot say the same way goes into `report`.
    pub fn from_probes(
        file: impl Fn(u16, bool) -> Option<String>,
        report: &mut Report,
        origin: &Origin,
    ) -> BootSet {
        let is_url = |f: &String| f.starts_with("http://") || f.starts_with("https://");
        let mut set = BootSet {
            bios: file(0, false),
            uefi: file(7, false),
            uefi_arm64: file(11, false),
            http: file(16, false).filter(is_url),
            chain: None,
            options: BTreeMap::new(),
        };
        if file(9, false) != set.uefi {
            report.add(
                origin,
                "UEFI x64 architectures 7 and 9 boot different files: the inventory gives both the file of 7",
            );
        }
        let ipxe = file(0, true);
        if file(7, true) != ipxe {
            report.add(
                origin,
                "iPXE clients get a different file per architecture: the BIOS one is used for all",
            );
        }
        match ipxe {
            Some(f) if is_url(&f) => set.chain = Some(f),
            Some(f) if [&set.bios, &set.uefi].contains(&&Some(f.clone())) => report.add(
                origin,
                format!("iPXE clients got {f:?} as other clients did: the agent sends them its iPXE script instead"),
            ),
            Some(f) => report.add(
                origin,
                format!("iPXE boot file {f:?} not translated: the agent chains iPXE to an http(s) URL only"),
            ),
            None => {}
        }
        set
    }

    fn files(&self) -> bool {
        self.bios.is_some()
            || self.uefi.is_some()
            || self.uefi_arm64.is_some()
            || self.http.is_some()
    }
}

/// A reserved host.
#[derive(Debug, Clone)]
pub struct HostOut {
    /// The primary MAC, `macs[0]`.
    pub mac: MacAddr,
    /// Every MAC of the host, `mac` first: a dnsmasq `dhcp-host` may list
    /// several, written as the inventory's `macs`.
    pub macs: Vec<MacAddr>,
    /// Its reserved IPv4 address; `None` for a host only an IPv6
    /// reservation made.
    pub ip: Option<Ipv4Addr>,
    pub hostname: Option<String>,
    pub boot: BootSet,
    /// Extra options: code -> value as YAML text (already quoted).
    pub options: BTreeMap<u8, String>,
    /// Its reserved IPv6 address (`ipv6`).
    pub ipv6: Option<Ipv6Addr>,
    /// Its system UUID (`uuid`), from a DUID-UUID.
    pub uuid: Option<[u8; 16]>,
    pub origin: Origin,
    /// Where its IPv6 side was read, when another reservation than the
    /// one at `origin` gave it.
    pub origin6: Option<Origin>,
}

impl HostOut {
    /// `macs`, or `[mac]` for a host built with `macs` left empty.
    fn ports(&self) -> &[MacAddr] {
        if self.macs.is_empty() {
            std::slice::from_ref(&self.mac)
        } else {
            &self.macs
        }
    }

    /// `mac: "…"` for one port, `macs: ["…", "…"]` for several.
    fn mac_field(&self) -> String {
        match self.ports() {
            [one] => format!("mac: \"{one}\""),
            ports => {
                let quoted: Vec<String> = ports.iter().map(|m| format!("\"{m}\"")).collect();
                format!("macs: [{}]", quoted.join(", "))
            }
        }
    }
}

/// A whole translation, before it is written.
#[derive(Debug, Default)]
pub struct Translation {
    /// What was imported, for the file's header (`dnsmasq a.conf b.hosts`).
    pub source: String,
    pub subnets: Vec<SubnetOut>,
    pub subnets6: Vec<Subnet6Out>,
    pub hosts: Vec<HostOut>,
    /// IPv6 reservations still to join their hosts (see `ipv6`).
    pub reservations6: Vec<Reservation6>,
    pub report: Report,
    /// Arguments of `pxe-agent run` the configuration implies: the
    /// interfaces it served, its TFTP root as `--boot-root`.
    pub run_flags: RunFlags,
}

/// What an imported configuration says about how to run the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunFlags {
    /// `--interface` values, in the order given (`eth1` or `eth1=ADDR`).
    pub interfaces: Vec<String>,
    /// `--boot-root`.
    pub boot_root: Option<String>,
}

impl RunFlags {
    /// The flags as arguments, with `--inventory FILE`.
    pub fn args(&self, inventory: &str) -> Vec<String> {
        let mut out = Vec::new();
        for i in &self.interfaces {
            out.extend(["--interface".to_owned(), i.clone()]);
        }
        out.extend(["--inventory".to_owned(), inventory.to_owned()]);
        if let Some(root) = &self.boot_root {
            out.extend(["--boot-root".to_owned(), root.clone()]);
        }
        out
    }

    pub(super) fn add_interface(&mut self, name: String) {
        if !self.interfaces.contains(&name) {
            self.interfaces.push(name);
        }
    }
}

/// The YAML text and what was left out.
#[derive(Debug)]
pub struct Imported {
    pub yaml: String,
    pub report: Report,
    pub hosts: usize,
    pub run_flags: RunFlags,
}

/// A hostname the inventory accepts (option 12: letters, digits, `-`, `.`,
/// at most 63 bytes).
pub fn valid_hostname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// An option's value as the other server writes it, comma-separated
/// items (quotes around one taken off), as the inventory's YAML text,
/// when the inventory takes it for `code`: a list of addresses, an
/// integer or text, the first of them that encodes as the inventory
/// encodes it ([`encode_option`]); else why not.
pub fn option_yaml(code: u8, items: &[&str]) -> Result<String, String> {
    use serde_norway::Value;
    let items: Vec<&str> = items.iter().map(|i| unquote(i)).collect();
    let mut candidates = Vec::new();
    if !items.is_empty() && items.iter().all(|i| i.parse::<Ipv4Addr>().is_ok()) {
        candidates.push(match items.as_slice() {
            [one] => Value::String((*one).to_owned()),
            many => Value::Sequence(
                many.iter()
                    .map(|i| Value::String((*i).to_owned()))
                    .collect(),
            ),
        });
    }
    if let [one] = items.as_slice()
        && let Ok(n) = one.parse::<i64>()
    {
        candidates.push(Value::Number(n.into()));
    }
    candidates.push(Value::String(items.join(",")));
    let mut why = None;
    for value in candidates {
        match encode_option(code, &value) {
            Ok(_) => {
                return Ok(match value {
                    Value::Number(n) => n.to_string(),
                    Value::Sequence(items) => format!(
                        "[{}]",
                        items
                            .iter()
                            .filter_map(Value::as_str)
                            .map(quote)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    Value::String(text) => quote(&text),
                    _ => unreachable!("only numbers, lists and strings are tried"),
                });
            }
            Err(message) => {
                why.get_or_insert(message);
            }
        }
    }
    Err(why.unwrap_or_default())
}

fn unquote(s: &str) -> &str {
    let s = s.trim();
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
}

/// `{42: "10.0.0.1", 15: "lab"}`.
fn options_flow(options: &BTreeMap<u8, String>) -> String {
    let items: Vec<String> = options.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    format!("{{{}}}", items.join(", "))
}

/// A double-quoted YAML scalar.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A subnet's DNS servers (as written: IPv6 ones quoted), domain and lease
/// time, the lines both families' subnets share.
fn write_settings(out: &mut String, dns: &[String], domain: Option<&str>, lease_time: Option<u32>) {
    if !dns.is_empty() {
        let _ = writeln!(out, "    dns: [{}]", dns.join(", "));
    }
    if let Some(d) = domain {
        let _ = writeln!(out, "    domain: {}", quote(d));
    }
    if let Some(l) = lease_time {
        let _ = writeln!(out, "    lease_time: {l}");
    }
}

/// Parses `a.b.c.d/len` into network and prefix, refusing host bits.
pub fn parse_cidr(text: &str) -> Option<(Ipv4Addr, u8)> {
    let (ip, len) = text.trim().split_once('/')?;
    let ip: Ipv4Addr = ip.trim().parse().ok()?;
    let len: u8 = len.trim().parse().ok().filter(|l| *l <= 32)?;
    let mask = if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    };
    (u32::from(ip) & !mask == 0).then_some((ip, len))
}

/// The prefix length of a contiguous netmask.
pub fn mask_prefix(mask: Ipv4Addr) -> Option<u8> {
    let bits = u32::from(mask);
    let len = bits.leading_ones();
    (bits.checked_shl(len).unwrap_or(0) == 0).then_some(len as u8)
}

impl Translation {
    /// Joins the IPv6 reservations to their hosts, drops what the
    /// inventory would refuse (hosts outside every subnet, duplicate MACs
    /// and addresses, hosts inside a pool) into the report, writes the
    /// YAML and validates it with [`Inventory::parse`].
    pub fn finish(mut self) -> Result<Imported, ImportError> {
        self.join6();
        self.prune();
        self.prune6();
        let yaml = self.render();
        Inventory::parse(Path::new("<imported inventory>"), &yaml).map_err(ImportError::Invalid)?;
        Ok(Imported {
            yaml,
            report: self.report,
            hosts: self.hosts.len(),
            run_flags: self.run_flags,
        })
    }

    /// Why a reserved IPv4 address cannot be a host's: no subnet holds it,
    /// or it is its subnet's network, broadcast or router address.
    fn ipv4_problem(&self, ip: Ipv4Addr) -> Option<String> {
        let Some(s) = self.subnets.iter().find(|s| s.contains(ip)) else {
            return Some(format!("no subnet holds its address {ip}"));
        };
        let broadcast = Ipv4Addr::from(u32::from(s.network) | !s.mask());
        (ip == s.network || ip == broadcast || Some(ip) == s.router).then(|| {
            format!(
                "{ip} is the network, broadcast or router address of {}/{}",
                s.network, s.prefix
            )
        })
    }

    fn prune(&mut self) {
        let mut macs = BTreeSet::new();
        let mut ips = BTreeSet::new();
        let hosts = std::mem::take(&mut self.hosts);
        for host in hosts {
            // An IPv6-only host's address is checked with the IPv6 subnets.
            if let Some(why) = host.ip.and_then(|ip| self.ipv4_problem(ip)) {
                self.report
                    .add(&host.origin, format!("host {} left out: {why}", host.mac));
                continue;
            }
            if let Some(twice) = host.ports().iter().find(|mac| macs.contains(*mac)) {
                self.report.add(
                    &host.origin,
                    format!(
                        "host {} left out: its MAC {twice} is reserved twice",
                        host.mac
                    ),
                );
                continue;
            }
            macs.extend(host.ports().iter().copied());
            if let Some(ip) = host.ip
                && !ips.insert(ip)
            {
                self.report.add(
                    &host.origin,
                    format!(
                        "host {} left out: its address {ip} is reserved twice",
                        host.mac
                    ),
                );
                continue;
            }
            self.hosts.push(host);
        }
        // The inventory keeps reserved addresses out of pools; a server that
        // allows both is translated without the pool.
        for subnet in &mut self.subnets {
            let Some((start, end)) = subnet.pool else {
                continue;
            };
            let broadcast = Ipv4Addr::from(u32::from(subnet.network) | !subnet.mask());
            let reserved = self.hosts.iter().find_map(|h| {
                let ip = h.ip.filter(|ip| (start..=end).contains(ip))?;
                Some((ip, h.mac))
            });
            let why = if let Some((ip, mac)) = reserved {
                format!("it holds reserved addresses ({ip} of {mac})")
            } else if start > end || !subnet.contains(start) || !subnet.contains(end) {
                "it is not a range inside the subnet".to_string()
            } else if [Some(subnet.network), Some(broadcast), subnet.router]
                .into_iter()
                .flatten()
                .any(|a| start <= a && a <= end)
            {
                "it covers the subnet's network, broadcast or router address".to_string()
            } else {
                continue;
            };
            self.report.add(
                &subnet.origin,
                format!("pool {start}-{end} left out: {why}"),
            );
            subnet.pool = None;
        }
    }

    /// The inventory as YAML: subnets, one profile per distinct boot set,
    /// then the hosts, each after a comment naming its source line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# Imported from {} by `pxe-agent import`.",
            self.source
        );
        let _ = writeln!(
            out,
            "# Check it with `pxe-agent check`; what was not translated is in the import report."
        );
        out.push_str("\nsubnets:\n");
        if self.subnets.is_empty() && self.subnets6.is_empty() {
            out.push_str("  []\n");
        }
        for s in &self.subnets {
            let _ = writeln!(out, "  # {}", s.origin);
            let _ = writeln!(out, "  - cidr: {}/{}", s.network, s.prefix);
            if s.proxy {
                let _ = writeln!(out, "    mode: proxy");
            }
            if let Some(r) = s.router {
                let _ = writeln!(out, "    router: {r}");
            }
            let dns: Vec<String> = s.dns.iter().map(ToString::to_string).collect();
            write_settings(&mut out, &dns, s.domain.as_deref(), s.lease_time);
            if !s.options.is_empty() {
                let _ = writeln!(out, "    options: {}", options_flow(&s.options));
            }
            if let Some((a, b)) = s.pool {
                let _ = writeln!(
                    out,
                    "    # Leased to unknown machines only with discovery on (see docs/inventory.md)."
                );
                let _ = writeln!(out, "    pool: {{start: {a}, end: {b}}}");
            }
        }
        // IPv6 addresses are quoted: unquoted in a flow mapping, the last
        // ':' of `fd00:66::` would be read as a key's.
        for s in &self.subnets6 {
            let _ = writeln!(out, "  # {}", s.origin);
            let _ = writeln!(out, "  - cidr: \"{}/{}\"", s.network, s.prefix);
            let dns: Vec<String> = s.dns.iter().map(|a| format!("\"{a}\"")).collect();
            write_settings(&mut out, &dns, s.domain.as_deref(), s.lease_time);
            if let Some((a, b)) = s.pool {
                let _ = writeln!(
                    out,
                    "    # Leased to machines no host names, under discovery.policy inspect only."
                );
                let _ = writeln!(out, "    pool: {{start: \"{a}\", end: \"{b}\"}}");
            }
            if s.ra {
                let _ = writeln!(out, "    ra: {{}}");
            }
        }
        let profiles = self.profiles();
        out.push_str("\nprofiles:\n");
        if profiles.is_empty() {
            out.push_str("  []\n");
        }
        for (boot, name) in &profiles {
            let _ = writeln!(out, "  - name: {name}");
            if boot.files() {
                let mut parts = Vec::new();
                for (key, value) in [
                    ("bios", &boot.bios),
                    ("uefi", &boot.uefi),
                    ("uefi_arm64", &boot.uefi_arm64),
                    ("http", &boot.http),
                ] {
                    if let Some(v) = value {
                        parts.push(format!("{key}: {}", quote(v)));
                    }
                }
                let _ = writeln!(out, "    boot: {{{}}}", parts.join(", "));
            }
            if let Some(chain) = &boot.chain {
                let _ = writeln!(out, "    chain: {}", quote(chain));
            }
            if !boot.options.is_empty() {
                let _ = writeln!(out, "    options: {}", options_flow(&boot.options));
            }
        }
        out.push_str("\nhosts:\n");
        if self.hosts.is_empty() {
            out.push_str("  []\n");
        }
        for h in &self.hosts {
            match &h.origin6 {
                Some(six) => {
                    let _ = writeln!(out, "  # {}, {six}", h.origin);
                }
                None => {
                    let _ = writeln!(out, "  # {}", h.origin);
                }
            }
            let _ = write!(out, "  - {{{}", h.mac_field());
            if let Some(ip) = h.ip {
                let _ = write!(out, ", ip: {ip}");
            }
            let _ = write!(out, ", profile: {}", profiles[&h.boot]);
            if let Some(ip) = h.ipv6 {
                let _ = write!(out, ", ipv6: \"{ip}\"");
            }
            if let Some(uuid) = &h.uuid {
                let _ = write!(out, ", uuid: \"{}\"", uuid_text(uuid));
            }
            if let Some(name) = &h.hostname {
                let _ = write!(out, ", hostname: {}", quote(name));
            }
            if !h.options.is_empty() {
                let _ = write!(out, ", options: {}", options_flow(&h.options));
            }
            out.push_str("}\n");
        }
        out
    }

    /// Boot set -> profile name, in order of first use: `no-boot` for the
    /// first that boots nothing, `boot-N` (or `no-boot-N`) otherwise.
    fn profiles(&self) -> BTreeMap<BootSet, String> {
        let mut names: BTreeMap<BootSet, String> = BTreeMap::new();
        for h in &self.hosts {
            if names.contains_key(&h.boot) {
                continue;
            }
            let n = names.len() + 1;
            let boots = h.boot.files() || h.boot.chain.is_some();
            let name = match boots {
                true => format!("boot-{n}"),
                false if names.values().any(|v| v == "no-boot") => format!("no-boot-{n}"),
                false => "no-boot".to_string(),
            };
            names.insert(h.boot.clone(), name);
        }
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_and_mask_helpers() {
        assert_eq!(
            parse_cidr("10.66.0.0/16"),
            Some(([10, 66, 0, 0].into(), 16))
        );
        assert_eq!(parse_cidr("10.66.0.1/16"), None);
        assert_eq!(mask_prefix([255, 255, 255, 0].into()), Some(24));
        assert_eq!(mask_prefix([255, 0, 255, 0].into()), None);
        assert_eq!(mask_prefix([255, 255, 255, 255].into()), Some(32));
    }

    #[test]
    fn quote_escapes() {
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}

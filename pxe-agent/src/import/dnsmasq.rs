//! dnsmasq configuration and `--dhcp-hostsfile` files -> [`Translation`].
//! Owns the reading of the options that decide a DHCP answer (`dhcp-range`,
//! `dhcp-host`, `dhcp-boot`, `dhcp-match`, `dhcp-userclass`, `dhcp-option`,
//! `domain`; their IPv6 forms and `enable-ra` in `ipv6`) and the evaluation
//! of dnsmasq's tag logic for each firmware class, so that every reserved
//! host gets the boot files dnsmasq would have sent it. Everything else is
//! reported, with its file and line.

mod ipv6;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

use super::{
    BootSet, HostOut, ImportError, Imported, Origin, Report, Reservation6, RunFlags, Subnet6Out,
    SubnetOut, Translation,
    duid::{self, DuidName},
    mask_prefix, option_yaml, valid_hostname,
};
use crate::mac::MacAddr;

/// Options that do not change a DHCP answer, read without a report line.
const QUIET: &[&str] = &[
    "interface",
    "except-interface",
    "listen-address",
    "bind-interfaces",
    "bind-dynamic",
    "port",
    "log-queries",
    "log-dhcp",
    "log-facility",
    "log-async",
    "no-daemon",
    "keep-in-foreground",
    "user",
    "group",
    "pid-file",
    "dhcp-leasefile",
    "leasefile-ro",
    "no-hosts",
    "no-resolv",
    "dhcp-authoritative",
    "no-ping",
    "quiet-dhcp",
    "dhcp-lease-max",
    "dhcp-no-override",
    "dhcp-broadcast",
    "dhcp-ignore-clid",
    "enable-tftp",
    "tftp-root",
    "tftp-secure",
    "tftp-no-fail",
    "domain-needed",
    "bogus-priv",
    "local",
    "expand-hosts",
    "server",
    "addn-hosts",
    "address",
];

/// Imports the named files (configuration files or hosts files; a
/// directory is read as a `dhcp-hostsdir`), and the hosts files, hosts
/// directories and configuration files they name that can be read.
pub fn import(paths: &[PathBuf]) -> Result<Imported, ImportError> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            files.extend(hosts_dir(path).map_err(|source| ImportError::Read {
                path: path.clone(),
                source,
            })?);
            continue;
        }
        let text = std::fs::read_to_string(path).map_err(|source| ImportError::Read {
            path: path.clone(),
            source,
        })?;
        files.push((path.clone(), text));
    }
    let source = format!(
        "dnsmasq {}",
        paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    translate(&source, files, true)?.finish()
}

/// A tag condition: `tag:NAME` or `tag:!NAME`.
#[derive(Debug, Clone)]
struct TagCond {
    negated: bool,
    name: String,
}

/// What sets a tag from the request.
#[derive(Debug, Clone, PartialEq)]
enum Cond {
    Arch(u16),
    Option175,
    UserClass(String),
}

#[derive(Debug)]
struct BootLine {
    tags: Vec<TagCond>,
    file: String,
}

/// A `dhcp-option` line the subnets' `options` may carry.
#[derive(Debug)]
struct OptionLine {
    tags: Vec<TagCond>,
    code: u8,
    items: Vec<String>,
    /// The line as written, for the report.
    line: String,
    origin: Origin,
}

#[derive(Debug)]
struct HostLine {
    /// Every MAC of the line, in order, each once.
    macs: Vec<MacAddr>,
    ip: Ipv4Addr,
    ipv6: Option<Ipv6Addr>,
    uuid: Option<[u8; 16]>,
    hostname: Option<String>,
    tags: BTreeSet<String>,
    origin: Origin,
}

/// A request kind the translation evaluates dnsmasq's logic for.
#[derive(Debug, Clone, Copy)]
struct Probe {
    arch: u16,
    ipxe: bool,
}

#[derive(Default)]
struct State {
    report: Report,
    subnets: Vec<SubnetOut>,
    matches: Vec<(String, Cond)>,
    boots: Vec<BootLine>,
    hosts: Vec<HostLine>,
    router: Option<Ipv4Addr>,
    dns: Vec<Ipv4Addr>,
    domain: Option<String>,
    /// `dhcp-option` lines for the subnets' `options`, in file order.
    options: Vec<OptionLine>,
    /// The tag each `dhcp-range=set:TAG,...` sets, with its subnet.
    range_tags: Vec<(String, usize)>,
    subnets6: Vec<Subnet6Out>,
    /// `dhcp-host` lines with an IPv6 address and no IPv4 one.
    reservations6: Vec<Reservation6>,
    /// `option6:dns-server`, `option6:domain-search`.
    dns6: Vec<Ipv6Addr>,
    domain6: Option<String>,
    /// `enable-ra`: router advertisements on every IPv6 subnet.
    ra: bool,
    /// Files already read, so that a file naming itself is read once.
    seen: BTreeSet<PathBuf>,
    /// `interface=` and `tftp-root=`, for the `run` flags.
    run_flags: RunFlags,
}

/// Translates `files` (path and text); with `follow`, the hosts and
/// configuration files they name are read too.
pub fn translate(
    source: &str,
    files: Vec<(PathBuf, String)>,
    follow: bool,
) -> Result<Translation, ImportError> {
    let mut st = State::default();
    for (path, text) in files {
        st.seen.insert(path.clone());
        st.read(&path, &text, follow)?;
    }
    Ok(st.finish(source))
}

/// An IPv4 option's code from its number or its dnsmasq name
/// (`dnsmasq --help dhcp`), for the names a PXE network's configuration
/// uses.
fn option_code(name: &str) -> Option<u8> {
    if let Ok(code) = name.parse() {
        return Some(code);
    }
    Some(match name {
        "netmask" => 1,
        "time-offset" => 2,
        "router" => 3,
        "dns-server" => 6,
        "log-server" => 7,
        "lpr-server" => 9,
        "hostname" => 12,
        "boot-file-size" => 13,
        "domain-name" => 15,
        "swap-server" => 16,
        "root-path" => 17,
        "extension-path" => 18,
        "ip-forward-enable" => 19,
        "policy-filter" => 21,
        "max-datagram-reassembly" => 22,
        "default-ttl" => 23,
        "mtu" => 26,
        "all-subnets-local" => 27,
        "broadcast" => 28,
        "router-discovery" => 31,
        "router-solicitation" => 32,
        "static-route" => 33,
        "trailer-encapsulation" => 34,
        "arp-timeout" => 35,
        "ethernet-encap" => 36,
        "tcp-ttl" => 37,
        "tcp-keepalive" => 38,
        "nis-domain" => 40,
        "nis-server" => 41,
        "ntp-server" => 42,
        "vendor-encap" => 43,
        "netbios-ns" => 44,
        "netbios-dd" => 45,
        "netbios-nodetype" => 46,
        "netbios-scope" => 47,
        "x-windows-fs" => 48,
        "x-windows-dm" => 49,
        "vendor-class" => 60,
        "nis+-domain" => 64,
        "nis+-server" => 65,
        "tftp-server" => 66,
        "bootfile-name" => 67,
        "mobile-ip-home" => 68,
        "smtp-server" => 69,
        "pop3-server" => 70,
        "nntp-server" => 71,
        "irc-server" => 74,
        "user-class" => 77,
        "classless-static-route" => 121,
        "vendor-id-encap" => 125,
        "tftp-server-address" => 150,
        _ => return None,
    })
}

fn strip_comment(line: &str) -> &str {
    // dnsmasq ends a line at a '#' at its start or after white space,
    // outside double quotes.
    let bytes = line.as_bytes();
    let mut quoted = false;
    for (i, b) in bytes.iter().enumerate() {
        match b {
            b'"' => quoted = !quoted,
            b'#' if !quoted && (i == 0 || bytes[i - 1].is_ascii_whitespace()) => {
                return &line[..i];
            }
            _ => {}
        }
    }
    line
}

fn unquote(s: &str) -> &str {
    let s = s.trim();
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
}

/// dnsmasq's lease time: seconds with an optional `s`/`m`/`h`/`d`/`w`, or
/// `infinite`.
fn parse_lease(s: &str) -> Option<u32> {
    if s == "infinite" {
        return Some(u32::MAX);
    }
    let (num, mult) = match s.as_bytes().last()? {
        b's' | b'S' => (&s[..s.len() - 1], 1),
        b'm' | b'M' => (&s[..s.len() - 1], 60),
        b'h' | b'H' => (&s[..s.len() - 1], 3600),
        b'd' | b'D' => (&s[..s.len() - 1], 86400),
        b'w' | b'W' => (&s[..s.len() - 1], 604_800),
        _ => (s, 1),
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    num.parse::<u32>().ok()?.checked_mul(mult)
}

/// Splits leading `tag:`/`net:` conditions off `parts`.
fn take_tags(parts: &mut Vec<&str>) -> Vec<TagCond> {
    let mut tags = Vec::new();
    while let Some(first) = parts.first() {
        let Some(name) = first
            .strip_prefix("tag:")
            .or_else(|| first.strip_prefix("net:"))
        else {
            break;
        };
        let (negated, name) = match name.strip_prefix('!') {
            Some(n) => (true, n),
            None => (false, name),
        };
        tags.push(TagCond {
            negated,
            name: name.to_string(),
        });
        parts.remove(0);
    }
    tags
}

impl State {
    fn read(&mut self, path: &Path, text: &str, follow: bool) -> Result<(), ImportError> {
        for (n, raw) in text.lines().enumerate() {
            let line = strip_comment(raw).trim();
            if line.is_empty() {
                continue;
            }
            let origin = Origin::new(path, n + 1);
            let (key, value) = match line.split_once('=') {
                Some((k, v)) => (k.trim().trim_start_matches("--"), v.trim()),
                None => (line.trim_start_matches("--"), ""),
            };
            // A hosts file holds dhcp-host values without the key.
            if looks_like_host(line) && !key_known(key) {
                self.host(line, &origin);
                continue;
            }
            match key {
                "interface" => {
                    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                        self.run_flags.add_interface(name.to_owned());
                    }
                }
                // `tftp-root=DIR[,INTERFACE]`.
                "tftp-root" => {
                    let dir = value.split(',').next().unwrap_or_default().trim();
                    if !dir.is_empty() {
                        self.run_flags.boot_root = Some(dir.to_owned());
                    }
                }
                "dhcp-host" => self.host(value, &origin),
                "dhcp-range" => self.range(value, &origin),
                "dhcp-boot" => self.boot(value, &origin),
                "dhcp-match" => self.dhcp_match(value, &origin),
                "dhcp-userclass" => self.userclass(value, &origin),
                "dhcp-option" | "dhcp-option-force" => self.option(key, value, &origin),
                "enable-ra" => self.enable_ra(&origin),
                "domain" => {
                    let domain = value.split(',').next().unwrap_or("").trim();
                    if value.contains(',') {
                        self.report.add(
                            &origin,
                            "domain for an address range: used for every subnet",
                        );
                    }
                    if !domain.is_empty() {
                        self.domain = Some(domain.to_string());
                    }
                }
                "dhcp-hostsfile" | "conf-file" if follow => {
                    let target = PathBuf::from(value);
                    if self.seen.insert(target.clone()) {
                        match std::fs::read_to_string(&target) {
                            Ok(text) => self.read(&target, &text, follow)?,
                            Err(e) => self.report.add(
                                &origin,
                                format!(
                                    "{key}={value} not read ({e}): pass it on the command line"
                                ),
                            ),
                        }
                    }
                }
                "dhcp-hostsdir" if follow => match hosts_dir(Path::new(value)) {
                    Ok(files) => {
                        for (file, text) in files {
                            if self.seen.insert(file.clone()) {
                                self.read(&file, &text, false)?;
                            }
                        }
                    }
                    Err(e) => self.report.add(
                        &origin,
                        format!("dhcp-hostsdir={value} not read ({e}): pass its files on the command line"),
                    ),
                },
                "dhcp-hostsdir" | "conf-dir" | "dhcp-optsfile" | "dhcp-optsdir" => {
                    self.report.add(
                        &origin,
                        format!("{key}={value} not followed: pass its files on the command line"),
                    );
                }
                key if QUIET.contains(&key) => {}
                _ => self
                    .report
                    .add(&origin, format!("`{line}` not translated: no equivalent")),
            }
        }
        Ok(())
    }

    fn host(&mut self, value: &str, origin: &Origin) {
        let mut macs = Vec::new();
        let mut ip = None;
        let mut ipv6 = None;
        let mut duid_mac = None;
        let mut uuid = None;
        let mut hostname = None;
        let mut tags = BTreeSet::new();
        let mut lease = None;
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "ignore" {
                self.report.add(
                    origin,
                    format!("dhcp-host {value} left out: `ignore` hosts are simply not listed"),
                );
                return;
            } else if let Some(id) = part.strip_prefix("id:") {
                // dnsmasq reads an id with colons as hex (a DHCPv4 client
                // id, a DHCPv6 DUID), one without as text.
                let named = id.contains(':').then(|| duid::parse_hex(id)).flatten();
                match named.as_deref().map(duid::read) {
                    Some(Ok(DuidName::Mac(mac))) => duid_mac = Some(mac),
                    Some(Ok(DuidName::Uuid(u))) => uuid = Some(u),
                    Some(Err(why)) => self.report.add(
                        origin,
                        format!("client-id match id:{id} not translated ({why}): the inventory matches MACs, and the system UUID of a DUID-UUID"),
                    ),
                    None => self.report.add(
                        origin,
                        format!("client-id match id:{id} not translated: the inventory matches MACs, and the system UUID of a DUID-UUID"),
                    ),
                }
            } else if let Some(tag) = part.strip_prefix("set:") {
                tags.insert(tag.to_string());
            } else if part.starts_with("tag:") || part.starts_with("net:") {
                self.report.add(
                    origin,
                    format!("dhcp-host {value} left out: a host that applies only under {part} cannot be expressed"),
                );
                return;
            } else if let Ok(addr) = part.parse::<Ipv4Addr>() {
                ip = Some(addr);
            } else if part.starts_with('[') {
                if let Some(address) = self.host_ipv6(part, origin) {
                    if ipv6.is_none() {
                        ipv6 = Some(address);
                    } else {
                        self.report.add(
                            origin,
                            format!("IPv6 address {part} not translated: the inventory holds one IPv6 address a host, the first of the line"),
                        );
                    }
                }
            } else if let Some(l) = parse_lease(part) {
                lease = Some(l);
            } else if let Ok(mac) = part.parse::<MacAddr>() {
                macs.push(mac);
            } else if part.contains(':') && part.len() >= 11 && !part.contains('.') {
                self.report.add(
                    origin,
                    format!("hardware address {part} not translated: wildcards and hardware types are not supported"),
                );
            } else {
                hostname = Some(part.to_string());
            }
        }
        if lease.is_some() {
            self.report.add(
                origin,
                "per-host lease time not translated: the subnet's lease time applies",
            );
        }
        if let Some(mac) = duid_mac {
            if macs.is_empty() {
                if ip.is_some() {
                    self.report.add(
                        origin,
                        format!("the DUID's MAC {mac} gets the IPv4 address too: dnsmasq gave it over DHCPv4 only to a client sending that DUID as its client id"),
                    );
                }
                macs.push(mac);
            } else if !macs.contains(&mac) {
                self.report.add(
                    origin,
                    format!("DUID of MAC {mac} not translated: it is not one of the line's MACs, which the host is matched by"),
                );
            }
        }
        if let Some(name) = &hostname
            && (ip.is_some() || ipv6.is_some())
            && !valid_hostname(name)
        {
            self.report.add(
                origin,
                format!("hostname {name:?} not translated: the inventory takes letters, digits, '-' and '.', at most 63 bytes"),
            );
            hostname = None;
        }
        let mut seen = BTreeSet::new();
        macs.retain(|mac| seen.insert(*mac));
        let Some(ip) = ip else {
            if let Some(ip) = ipv6 {
                if macs.is_empty() && uuid.is_none() {
                    self.report.add(
                        origin,
                        format!("dhcp-host {value} left out: it names no MAC and no system UUID"),
                    );
                    return;
                }
                self.reservations6.push(Reservation6 {
                    macs,
                    uuid,
                    ip,
                    hostname,
                    origin: origin.clone(),
                });
                return;
            }
            if !macs.is_empty() || uuid.is_some() {
                self.report.add(
                    origin,
                    format!("dhcp-host {value} left out: no fixed address (dnsmasq leased it one from the range)"),
                );
            }
            return;
        };
        if macs.is_empty() {
            self.report.add(
                origin,
                format!("dhcp-host {value} left out: no MAC address, which a host is matched by over DHCPv4"),
            );
            return;
        }
        // dnsmasq gives the address to whichever of the MACs asks: one host
        // with several ports (`macs`).
        self.hosts.push(HostLine {
            macs,
            ip,
            ipv6,
            uuid,
            hostname,
            tags,
            origin: origin.clone(),
        });
    }

    fn range(&mut self, value: &str, origin: &Origin) {
        let mut parts: Vec<&str> = value.split(',').map(str::trim).collect();
        if !take_tags(&mut parts).is_empty() {
            self.report.add(
                origin,
                "dhcp-range tag conditions not translated: the range applies to every request",
            );
        }
        let set = parts
            .first()
            .and_then(|p| p.strip_prefix("set:"))
            .map(str::to_owned);
        if set.is_some() {
            parts.remove(0);
        }
        if let Some(start) = parts.first().and_then(|p| p.parse::<Ipv6Addr>().ok()) {
            self.range6(value, start, &parts[1..], origin);
            return;
        }
        let mut ips = Vec::new();
        let mut mode = None;
        let mut lease = None;
        for part in &parts {
            if let Ok(ip) = part.parse::<Ipv4Addr>() {
                ips.push(ip);
            } else if ["static", "proxy"].contains(part) {
                mode = Some(*part);
            } else if let Some(l) = parse_lease(part) {
                lease = Some(l);
            } else {
                self.report.add(
                    origin,
                    format!("dhcp-range {value}: `{part}` not translated"),
                );
                return;
            }
        }
        let proxy = mode == Some("proxy");
        let Some(&start) = ips.first() else {
            self.report.add(
                origin,
                format!("dhcp-range {value} not translated: no address"),
            );
            return;
        };
        let (end, rest) = if mode.is_some() {
            (None, &ips[1..])
        } else {
            (ips.get(1).copied(), ips.get(2..).unwrap_or(&[]))
        };
        let prefix = match rest.first() {
            Some(mask) => match mask_prefix(*mask) {
                Some(p) => p,
                None => {
                    self.report.add(
                        origin,
                        format!("dhcp-range {value} not translated: {mask} is not a netmask"),
                    );
                    return;
                }
            },
            None => {
                self.report.add(
                    origin,
                    "dhcp-range without a netmask: /24 assumed (dnsmasq takes it from the interface); correct the subnet's cidr if it is not",
                );
                24
            }
        };
        let mask = if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(prefix))
        };
        let network = Ipv4Addr::from(u32::from(start) & mask);
        let pool = end.map(|end| (start, end));
        let at = self
            .subnets
            .iter()
            .position(|s| s.network == network && s.prefix == prefix)
            .unwrap_or(self.subnets.len());
        if let Some(tag) = set {
            self.report.add(
                origin,
                format!("dhcp-range set:{tag}: dhcp-option lines tagged {tag} become the subnet's options; other lines tagged with it are not translated"),
            );
            self.range_tags.push((tag, at));
        }
        if let Some(existing) = self.subnets.get_mut(at) {
            if proxy != existing.proxy {
                self.report.add(
                    origin,
                    "a proxy and an address range on one subnet: the subnet keeps the first",
                );
                return;
            }
            self.report.another_range(origin, &mut existing.pool, pool);
            return;
        }
        if proxy {
            self.report.add(
                origin,
                "proxy-DHCP range: the subnet in mode proxy, where another DHCP server hands out the addresses and the agent answers PXE firmware with boot information only",
            );
        }
        if pool.is_some() {
            self.report.add(
                origin,
                "dynamic range kept as the subnet's pool, used only with discovery on: dnsmasq leased it to every unknown machine",
            );
        }
        self.subnets.push(SubnetOut {
            network,
            prefix,
            router: None,
            dns: Vec::new(),
            domain: None,
            lease_time: lease,
            pool,
            proxy,
            options: BTreeMap::new(),
            origin: origin.clone(),
        });
    }

    fn boot(&mut self, value: &str, origin: &Origin) {
        let mut parts: Vec<&str> = value.split(',').map(str::trim).collect();
        let tags = take_tags(&mut parts);
        let Some(file) = parts.first().map(|f| unquote(f)).filter(|f| !f.is_empty()) else {
            self.report
                .add(origin, format!("dhcp-boot {value} has no file name"));
            return;
        };
        if let Some(server) = parts.get(2).filter(|s| !s.is_empty()) {
            self.report.add(
                origin,
                format!("TFTP server address {server} not translated: the agent names itself as the TFTP server"),
            );
        }
        self.boots.push(BootLine {
            tags,
            file: file.to_string(),
        });
    }

    fn dhcp_match(&mut self, value: &str, origin: &Origin) {
        let parts: Vec<&str> = value.split(',').map(str::trim).collect();
        let Some((tag, rest)) = parts.split_first() else {
            return;
        };
        let tag = tag
            .strip_prefix("set:")
            .or_else(|| tag.strip_prefix("net:"))
            .unwrap_or(tag)
            .to_string();
        let cond = match rest {
            ["option:client-arch" | "93", n] => n.parse().ok().map(Cond::Arch),
            ["175" | "option:175"] => Some(Cond::Option175),
            ["175" | "option:175", sub] => {
                self.report.add(
                    origin,
                    format!("dhcp-match on iPXE feature {sub} read as \"any iPXE\""),
                );
                Some(Cond::Option175)
            }
            ["77" | "option:user-class", class] => Some(Cond::UserClass(unquote(class).into())),
            _ => None,
        };
        match cond {
            Some(c) => self.matches.push((tag, c)),
            None => self.report.add(
                origin,
                format!("dhcp-match={value} not translated: tag {tag} is taken as never set"),
            ),
        }
    }

    fn userclass(&mut self, value: &str, origin: &Origin) {
        match value.split_once(',') {
            Some((tag, class)) => {
                let tag = tag
                    .trim()
                    .strip_prefix("set:")
                    .or_else(|| tag.trim().strip_prefix("net:"))
                    .unwrap_or(tag.trim());
                self.matches
                    .push((tag.to_string(), Cond::UserClass(unquote(class).to_string())));
            }
            None => self
                .report
                .add(origin, format!("dhcp-userclass={value} not understood")),
        }
    }

    fn option(&mut self, key: &str, value: &str, origin: &Origin) {
        let mut parts: Vec<&str> = value.split(',').map(str::trim).collect();
        let tags = take_tags(&mut parts);
        let Some((code, values)) = parts.split_first() else {
            return;
        };
        if let Some(code) = code.strip_prefix("option6:") {
            self.option6(key, value, &tags, code, values, origin);
            return;
        }
        let name = code.strip_prefix("option:").unwrap_or(code);
        let Some(number) = option_code(name) else {
            self.report.add(
                origin,
                format!("{key}={value} not translated: option {name} is not one the import knows by name; write its number"),
            );
            return;
        };
        let known = [3, 6, 15].contains(&number);
        if !tags.is_empty() || !known {
            // dnsmasq sends no option for an empty value.
            if values.iter().any(|v| !v.is_empty()) {
                self.options.push(OptionLine {
                    tags,
                    code: number,
                    items: values.iter().map(|v| (*v).to_owned()).collect(),
                    line: format!("{key}={value}"),
                    origin: origin.clone(),
                });
            }
            return;
        }
        let code = number.to_string();
        let code = code.as_str();
        // dnsmasq sends no option for an empty value (Ironic writes
        // `dhcp-option=3` to keep a router off the provisioning network),
        // which is what the agent does for an unset key.
        let values: Vec<&str> = values.iter().copied().filter(|v| !v.is_empty()).collect();
        if values.is_empty() {
            return;
        }
        match code {
            "15" => self.domain = Some(unquote(values[0]).to_string()),
            _ => {
                let mut ips = Vec::new();
                for v in &values {
                    match v.parse::<Ipv4Addr>() {
                        Ok(ip) => ips.push(ip),
                        Err(_) => {
                            self.report.add(
                                origin,
                                format!("{key}={value} not translated: {v} is not an address (0.0.0.0 for \"this server\" is not supported)"),
                            );
                            return;
                        }
                    }
                }
                if code == "3" {
                    self.router = ips.first().copied();
                    if ips.len() > 1 {
                        self.report
                            .add(origin, "only the first router is translated");
                    }
                } else {
                    self.dns = ips;
                }
            }
        }
    }

    /// The `dhcp-option` lines as the subnets' `options`: an untagged line
    /// for every subnet, a line tagged with the tag a `dhcp-range` sets for
    /// that range's subnet, winning over untagged ones as in dnsmasq. Lines
    /// tagged otherwise apply per request or host, which subnet options
    /// cannot say: reported.
    fn subnet_options(&mut self) {
        let lines = std::mem::take(&mut self.options);
        let (untagged, tagged): (Vec<_>, Vec<_>) = lines.iter().partition(|l| l.tags.is_empty());
        for line in untagged.into_iter().chain(tagged) {
            let subnets: Vec<usize> = match line.tags.as_slice() {
                [] => (0..self.subnets.len()).collect(),
                [tag] if !tag.negated => self
                    .range_tags
                    .iter()
                    .filter(|(t, _)| *t == tag.name)
                    .map(|(_, at)| *at)
                    .collect(),
                _ => Vec::new(),
            };
            if subnets.is_empty() {
                self.report.add(
                    &line.origin,
                    format!("{} not translated: only untagged lines and lines tagged with a dhcp-range's set: tag become subnet options", line.line),
                );
                continue;
            }
            let items: Vec<&str> = line.items.iter().map(String::as_str).collect();
            if items.contains(&"0.0.0.0") {
                self.report.add(
                    &line.origin,
                    format!(
                        "{} not translated: 0.0.0.0 for \"this server\" is not supported",
                        line.line
                    ),
                );
                continue;
            }
            match option_yaml(line.code, &items) {
                Ok(yaml) => {
                    for at in subnets {
                        if let Some(subnet) = self.subnets.get_mut(at) {
                            subnet.options.insert(line.code, yaml.clone());
                        }
                    }
                }
                Err(why) => self
                    .report
                    .add(&line.origin, format!("{} not translated: {why}", line.line)),
            }
        }
    }

    /// The tags dnsmasq would have for `probe` from a host with `host_tags`.
    fn tags_for(&self, host_tags: &BTreeSet<String>, probe: Probe) -> BTreeSet<String> {
        let mut tags = host_tags.clone();
        tags.insert("known".to_string());
        for (tag, cond) in &self.matches {
            let hit = match cond {
                Cond::Arch(a) => *a == probe.arch,
                Cond::Option175 => probe.ipxe,
                Cond::UserClass(c) => probe.ipxe && c == crate::inventory::DEFAULT_IPXE_USER_CLASS,
            };
            if hit {
                tags.insert(tag.clone());
            }
        }
        tags
    }

    /// dnsmasq's choice of `dhcp-boot`: lines with tag conditions first, then
    /// lines without; within each, the last line of the files wins (dnsmasq
    /// keeps its options in a list that later lines are put in front of).
    fn boot_for(&self, tags: &BTreeSet<String>) -> Option<&BootLine> {
        let matches = |line: &&BootLine| {
            line.tags
                .iter()
                .all(|t| tags.contains(&t.name) != t.negated)
        };
        self.boots
            .iter()
            .rev()
            .filter(|l| !l.tags.is_empty())
            .find(matches)
            .or_else(|| {
                self.boots
                    .iter()
                    .rev()
                    .filter(|l| l.tags.is_empty())
                    .find(matches)
            })
    }

    fn boot_set(
        &self,
        host_tags: &BTreeSet<String>,
        report: &mut Report,
        origin: &Origin,
    ) -> BootSet {
        let file = |arch, ipxe| {
            self.boot_for(&self.tags_for(host_tags, Probe { arch, ipxe }))
                .map(|l| l.file.clone())
        };
        let set = BootSet::from_probes(file, report, origin);
        for f in [&set.bios, &set.uefi, &set.uefi_arm64]
            .into_iter()
            .flatten()
        {
            if f.len() > 127 {
                report.add(origin, format!("boot file {f:?} is longer than 127 bytes"));
            }
        }
        set
    }

    fn finish(mut self, source: &str) -> Translation {
        for s in &mut self.subnets {
            s.router = self.router.filter(|r| {
                let m = if s.prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - u32::from(s.prefix))
                };
                u32::from(*r) & m == u32::from(s.network)
            });
            s.dns.clone_from(&self.dns);
            s.domain.clone_from(&self.domain);
        }
        self.subnet_options();
        for s in &mut self.subnets6 {
            s.dns.clone_from(&self.dns6);
            s.domain.clone_from(&self.domain6);
            s.ra = self.ra;
        }
        let mut report = std::mem::take(&mut self.report);
        // One evaluation (and one set of report lines) per distinct tag set.
        let mut sets: BTreeMap<BTreeSet<String>, BootSet> = BTreeMap::new();
        let mut hosts = Vec::new();
        for h in &self.hosts {
            let boot = match sets.get(&h.tags) {
                Some(b) => b.clone(),
                None => {
                    let b = self.boot_set(&h.tags, &mut report, &h.origin);
                    sets.insert(h.tags.clone(), b.clone());
                    b
                }
            };
            hosts.push(HostOut {
                mac: h.macs[0],
                macs: h.macs.clone(),
                ip: Some(h.ip),
                hostname: h.hostname.clone(),
                boot,
                options: BTreeMap::new(),
                ipv6: h.ipv6,
                uuid: h.uuid,
                origin: h.origin.clone(),
                origin6: None,
            });
        }
        Translation {
            source: source.to_string(),
            subnets: self.subnets,
            subnets6: self.subnets6,
            hosts,
            reservations6: self.reservations6,
            report,
            run_flags: self.run_flags,
        }
    }
}

/// The files of a `dhcp-hostsdir` directory, in name order (dnsmasq reads
/// every file in it, skipping names that start with '.' or end with '~').
fn hosts_dir(dir: &Path) -> std::io::Result<Vec<(PathBuf, String)>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !name.starts_with('.') && !name.ends_with('~')
        })
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| std::fs::read_to_string(&p).map(|t| (p, t)))
        .collect()
}

fn key_known(key: &str) -> bool {
    key.starts_with("dhcp-") || QUIET.contains(&key) || key == "domain" || key == "conf-file"
}

/// A hosts-file line: a dhcp-host value, starting with a MAC, `id:` or
/// `set:`/`tag:`.
fn looks_like_host(line: &str) -> bool {
    let first = line.split(',').next().unwrap_or("").trim();
    first.parse::<MacAddr>().is_ok()
        || first.starts_with("id:")
        || first.starts_with("set:")
        || (first.contains(':') && first.contains('*'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(conf: &str) -> Translation {
        translate(
            "test",
            vec![(PathBuf::from("dnsmasq.conf"), conf.to_string())],
            false,
        )
        .expect("translates")
    }

    fn report(t: &Translation) -> String {
        t.report.to_string()
    }

    const IRONIC: &str = "\
port=0
interface=br-prov
bind-interfaces
dhcp-range=10.66.200.1,10.66.200.250,255.255.0.0,1h
# Disable default router(s) and DNS over provisioning network
dhcp-option=3
dhcp-option=6
dhcp-match=set:ipxe,175 # iPXE sends a 175 option.
dhcp-match=set:efi,option:client-arch,7
dhcp-match=set:efi,option:client-arch,9
dhcp-match=set:arm64,option:client-arch,11
dhcp-userclass=set:ipxe,iPXE
dhcp-boot=tag:efi,tag:!ipxe,snponly.efi
dhcp-boot=tag:arm64,tag:!ipxe,ipxe-arm64.efi
dhcp-boot=tag:!efi,tag:!arm64,tag:!ipxe,undionly.kpxe,localhost.localdomain,10.66.0.1
dhcp-boot=tag:ipxe,http://10.66.0.1:8088/boot.ipxe
dhcp-host=52:54:00:00:00:01,10.66.1.1,node-1
dhcp-host=52:54:00:00:00:02,set:rack2,10.66.1.2,node-2,infinite
dhcp-boot=tag:rack2,tag:efi,tag:!ipxe,ipxe.efi
";

    #[test]
    fn ironic_config_splits_bios_uefi_and_ipxe() {
        let t = run(IRONIC);
        assert_eq!(t.hosts.len(), 2);
        let h = &t.hosts[0];
        assert_eq!(h.boot.bios.as_deref(), Some("undionly.kpxe"));
        assert_eq!(h.boot.uefi.as_deref(), Some("snponly.efi"));
        assert_eq!(h.boot.uefi_arm64.as_deref(), Some("ipxe-arm64.efi"));
        assert_eq!(
            h.boot.chain.as_deref(),
            Some("http://10.66.0.1:8088/boot.ipxe")
        );
        assert_eq!(h.hostname.as_deref(), Some("node-1"));
        // The later, also matching line wins for the rack2 host.
        assert_eq!(t.hosts[1].boot.uefi.as_deref(), Some("ipxe.efi"));
        let r = report(&t);
        assert!(
            r.contains("dnsmasq.conf:15: TFTP server address 10.66.0.1"),
            "{r}"
        );
        assert!(r.contains("dnsmasq.conf:18: per-host lease time"), "{r}");
        let imported = t.finish().expect("validates");
        assert!(
            imported
                .yaml
                .contains("# dnsmasq.conf:17\n  - {mac: \"52:54:00:00:00:01\"")
        );
        assert!(imported.yaml.contains("boot-1") && imported.yaml.contains("boot-2"));
        // The pool holds no reserved address, so it is kept.
        assert!(
            imported
                .yaml
                .contains("pool: {start: 10.66.200.1, end: 10.66.200.250}")
        );
    }

    #[test]
    fn dhcp_host_forms() {
        let t = run("\
dhcp-range=10.0.0.0,static,255.255.255.0
dhcp-host=AA:BB:CC:DD:EE:01,10.0.0.11
dhcp-host=aa:bb:cc:dd:ee:02,aa:bb:cc:dd:ee:03,10.0.0.12,two-nics,12h
dhcp-host=id:01:aa:bb:cc:dd:ee:04,aa:bb:cc:dd:ee:04,10.0.0.13,with-id
dhcp-host=aa:bb:cc:dd:ee:05,ignore
dhcp-host=aa:bb:cc:dd:ee:06,tag:lab,10.0.0.16
dhcp-host=aa:bb:cc:dd:ee:07,host-without-address
dhcp-host=aa:bb:cc:*:*:*,10.0.0.18
dhcp-host=aa:bb:cc:dd:ee:09,10.0.0.19,bad_name
aa:bb:cc:dd:ee:0a,10.0.0.20,from-hostsfile
");
        let macs: Vec<String> = t.hosts.iter().map(|h| h.mac.to_string()).collect();
        assert_eq!(
            macs,
            [
                "aa:bb:cc:dd:ee:01",
                "aa:bb:cc:dd:ee:02",
                "aa:bb:cc:dd:ee:04",
                "aa:bb:cc:dd:ee:09",
                "aa:bb:cc:dd:ee:0a"
            ]
        );
        assert_eq!(t.hosts[1].hostname.as_deref(), Some("two-nics"));
        let ports: Vec<String> = t.hosts[1].macs.iter().map(ToString::to_string).collect();
        assert_eq!(ports, ["aa:bb:cc:dd:ee:02", "aa:bb:cc:dd:ee:03"]);
        // `id:` is a client id, not a port: the line's one MAC remains.
        assert_eq!(t.hosts[2].macs.len(), 1);
        assert_eq!(t.hosts[3].hostname, None);
        let r = report(&t);
        for want in [
            "dnsmasq.conf:3: per-host lease time",
            "dnsmasq.conf:4: client-id match",
            "dnsmasq.conf:5: dhcp-host aa:bb:cc:dd:ee:05,ignore left out",
            "dnsmasq.conf:6: dhcp-host aa:bb:cc:dd:ee:06,tag:lab,10.0.0.16 left out",
            "dnsmasq.conf:7: dhcp-host aa:bb:cc:dd:ee:07,host-without-address left out: no fixed address",
            "dnsmasq.conf:8: hardware address aa:bb:cc:*:*:*",
            "dnsmasq.conf:9: hostname \"bad_name\"",
        ] {
            assert!(r.contains(want), "missing {want:?} in:\n{r}");
        }
        t.finish().expect("validates");
    }

    #[test]
    fn dhcp_boot_with_and_without_tags() {
        let t = run("\
dhcp-range=10.0.0.0,static,255.255.255.0
dhcp-option=option:router,10.0.0.1
dhcp-option=option:dns-server,10.0.0.2,10.0.0.3
domain=lab.example
dhcp-match=set:bios,option:client-arch,0
dhcp-boot=pxelinux.0
dhcp-boot=tag:bios,undionly.kpxe
dhcp-option=tag:bios,option:ntp-server,10.0.0.1
dhcp-option=42,10.0.0.1
dhcp-host=aa:bb:cc:dd:ee:01,10.0.0.11
");
        let h = &t.hosts[0];
        assert_eq!(h.boot.bios.as_deref(), Some("undionly.kpxe"));
        // Untagged line for everyone else; no iPXE split, reported.
        assert_eq!(h.boot.uefi.as_deref(), Some("pxelinux.0"));
        assert_eq!(h.boot.chain, None);
        assert_eq!(t.subnets[0].router, Some([10, 0, 0, 1].into()));
        assert_eq!(t.subnets[0].dns.len(), 2);
        assert_eq!(t.subnets[0].domain.as_deref(), Some("lab.example"));
        let r = report(&t);
        assert!(r.contains("dnsmasq.conf:8: dhcp-option=tag:bios"), "{r}");
        // The untagged one is the subnet's.
        assert!(!r.contains("dnsmasq.conf:9:"), "{r}");
        assert_eq!(t.subnets[0].options[&42], "\"10.0.0.1\"");
        // The bios tag also applies to iPXE on BIOS: dnsmasq split them.
        assert!(
            r.contains("dnsmasq.conf:10: iPXE clients get a different file per architecture"),
            "{r}"
        );
        t.finish().expect("validates");
    }

    #[test]
    fn untagged_and_range_tagged_dhcp_options_become_subnet_options() {
        let t = run("\
dhcp-range=set:lab,10.0.0.0,static,255.255.255.0
dhcp-range=10.1.0.0,static,255.255.255.0
dhcp-option=option:ntp-server,10.0.0.4,10.0.0.5
dhcp-option=26,1500
dhcp-option=tag:lab,option:ntp-server,10.0.0.9
dhcp-option=tag:lab,option:domain-name,\"lab.example\"
dhcp-option=tag:lab,66,tftp.lab.example
dhcp-option=tag:other,224,x
dhcp-option=option:mtu,huge
dhcp-option=option:tftp-server,0.0.0.0
dhcp-option=option:x-unheard-of,1
dhcp-option=119
dhcp-host=aa:bb:cc:dd:ee:01,10.0.0.11
dhcp-host=aa:bb:cc:dd:ee:02,10.1.0.11
");
        let lab = &t.subnets[0].options;
        let other = &t.subnets[1].options;
        assert_eq!(lab[&42], r#""10.0.0.9""#, "the tagged line wins");
        assert_eq!(other[&42], r#"["10.0.0.4", "10.0.0.5"]"#);
        assert_eq!(lab[&26], "1500");
        assert_eq!(other[&26], "1500");
        assert_eq!(lab[&15], r#""lab.example""#);
        assert_eq!(lab[&66], r#""tftp.lab.example""#);
        assert!(!other.contains_key(&15) && !other.contains_key(&66));
        let r = report(&t);
        for want in [
            "dnsmasq.conf:1: dhcp-range set:lab: dhcp-option lines tagged lab become the subnet's options",
            "dnsmasq.conf:8: dhcp-option=tag:other,224,x not translated",
            "dnsmasq.conf:9: dhcp-option=option:mtu,huge not translated: option 26 (interface mtu)",
            "dnsmasq.conf:10: dhcp-option=option:tftp-server,0.0.0.0 not translated",
            "dnsmasq.conf:11: dhcp-option=option:x-unheard-of,1 not translated",
        ] {
            assert!(r.contains(want), "missing {want:?} in:\n{r}");
        }
        let imported = t.finish().expect("validates");
        let inv = crate::inventory::Inventory::parse(Path::new("i.yaml"), &imported.yaml)
            .expect("the agent's own validation");
        assert_eq!(inv.subnets[0].options[&42], vec![10, 0, 0, 9]);
        assert_eq!(inv.subnets[1].options[&26], vec![0x05, 0xdc]);
    }

    #[test]
    fn hosts_dir_files_are_read_as_hosts_files() {
        let dir = std::env::temp_dir().join(format!("pxe-import-hostsdir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("a"), "aa:bb:cc:dd:ee:01,10.0.0.11,a\n").expect("write");
        std::fs::write(dir.join("b"), "aa:bb:cc:dd:ee:02,set:ironic\n").expect("write");
        std::fs::write(dir.join(".hidden"), "aa:bb:cc:dd:ee:03,10.0.0.13\n").expect("write");
        let conf = format!(
            "dhcp-range=10.0.0.0,static,255.255.255.0\ndhcp-hostsdir={}\n",
            dir.display()
        );
        let t = translate("test", vec![(PathBuf::from("dnsmasq.conf"), conf)], true);
        std::fs::remove_dir_all(&dir).expect("clean up");
        let t = t.expect("translates");
        assert_eq!(t.hosts.len(), 1);
        assert_eq!(t.hosts[0].hostname.as_deref(), Some("a"));
        let r = report(&t);
        assert!(
            r.contains("/b:1: dhcp-host aa:bb:cc:dd:ee:02,set:ironic left out: no fixed address"),
            "{r}"
        );
    }

    #[test]
    fn unsupported_lines_are_reported_with_file_and_line() {
        let t = run("\
dhcp-range=10.0.0.10,10.0.0.20,proxy
dhcp-range=10.0.0.100,10.0.0.200
dhcp-vendorclass=set:efi,PXEClient:Arch:00007
pxe-service=x86PC,\"boot\",pxelinux
dhcp-host=aa:bb:cc:dd:ee:01,10.0.0.150
");
        let r = report(&t);
        for want in [
            "dnsmasq.conf:1: dhcp-range 10.0.0.10,10.0.0.20,proxy not translated: 10.0.0.20 is not a netmask",
            "dnsmasq.conf:2: dhcp-range without a netmask",
            "dnsmasq.conf:3: `dhcp-vendorclass",
            "dnsmasq.conf:4: `pxe-service",
        ] {
            assert!(r.contains(want), "missing {want:?} in:\n{r}");
        }
        let imported = t.finish().expect("validates");
        // The host lies in the range: the pool goes, the host stays.
        assert!(
            imported
                .report
                .to_string()
                .contains("pool 10.0.0.100-10.0.0.200 left out")
        );
        assert_eq!(imported.hosts, 1);
    }

    #[test]
    fn a_proxy_range_becomes_a_subnet_in_mode_proxy_that_validates() {
        let t = run("\
dhcp-range=192.168.5.0,proxy,255.255.255.0
interface=br-prov,eth2
tftp-root=/var/lib/tftpboot,br-prov
dhcp-boot=undionly.kpxe
dhcp-host=aa:bb:cc:dd:ee:01,192.168.5.40,node-a
");
        let r = report(&t);
        assert!(
            r.contains("dnsmasq.conf:1: proxy-DHCP range: the subnet in mode proxy"),
            "{r}"
        );
        let imported = t.finish().expect("validates");
        assert_eq!(
            imported.run_flags.args("inv.yaml").join(" "),
            "--interface br-prov --interface eth2 --inventory inv.yaml --boot-root /var/lib/tftpboot"
        );
        assert!(
            imported
                .yaml
                .contains("  - cidr: 192.168.5.0/24\n    mode: proxy\n"),
            "{}",
            imported.yaml
        );
        assert!(!imported.yaml.contains("pool:"), "{}", imported.yaml);
        assert_eq!(imported.hosts, 1);
    }
}

//! The inventory's rules. Owns turning the raw file into an [`Inventory`]
//! and collecting every broken rule as a [`Problem`] in file order, never
//! stopping at the first; not the wording of the error around them
//! (`error`) nor option encoding (`option`).

use std::{
    collections::{BTreeMap, HashMap},
    net::Ipv4Addr,
};

use super::{
    BootFiles, DEFAULT_LEASE_TIME, Host, Inventory, MacAddr, Problem, Profile, SERVER_PLACEHOLDER,
    Subnet, option,
    raw::{RawBoot, RawHost, RawInventory, RawProfile, RawSubnet},
};

/// The BOOTP `file` field is 128 bytes and must end in a NUL (RFC 951).
const MAX_BOOT_FILE_LEN: usize = 127;
/// The HTTP boot URL travels in option 67, whose length is one octet.
const MAX_BOOT_URL_LEN: usize = 255;
/// One DNS label (RFC 1035 2.3.4); the hostname goes out as option 12.
const MAX_HOSTNAME_LEN: usize = 63;
/// A full domain name (RFC 1035 2.3.4); goes out as option 15.
const MAX_DOMAIN_LEN: usize = 253;
/// Length of the longest dotted-quad address, `255.255.255.255`.
const LONGEST_IPV4: usize = 15;

/// Checks `raw` and builds the inventory, or returns every problem found.
pub(super) fn validate(raw: RawInventory) -> Result<Inventory, Vec<Problem>> {
    let mut problems = Vec::new();
    let subnets = subnets(&raw.subnets, &mut problems);
    let profiles = profiles(&raw.profiles, &mut problems);
    let hosts = hosts(&raw.hosts, &subnets, &profiles, &mut problems);
    if !problems.is_empty() {
        return Err(problems);
    }
    // Every `None` below was recorded as a problem, so none is left here and
    // the host indices into `subnets` stay valid after flattening.
    Ok(Inventory {
        subnets: subnets.into_iter().flatten().collect(),
        profiles,
        hosts: hosts.into_iter().flatten().collect(),
    })
}

/// One entry per raw subnet, `None` where the CIDR is unusable. A subnet
/// with other problems is still returned so hosts can be checked against it.
fn subnets(raw: &[RawSubnet], problems: &mut Vec<Problem>) -> Vec<Option<Subnet>> {
    let mut out: Vec<Option<Subnet>> = Vec::with_capacity(raw.len());
    for (index, entry) in raw.iter().enumerate() {
        let mut report = |key: &str, message: String| {
            problems.push(Problem::new(
                None,
                format!("subnets[{index}].{key}"),
                message,
            ));
        };

        let subnet = match parse_cidr(&entry.cidr) {
            Ok((address, prefix)) => {
                let mut subnet = Subnet {
                    network: address,
                    prefix,
                    router: None,
                    dns: Vec::new(),
                    domain: entry.domain.clone(),
                    lease_time: entry.lease_time.unwrap_or(DEFAULT_LEASE_TIME),
                };
                subnet.network = Ipv4Addr::from(u32::from(address) & u32::from(subnet.netmask()));
                if subnet.network != address {
                    report(
                        "cidr",
                        format!("{} has host bits set; the network is {subnet}", entry.cidr),
                    );
                }
                if prefix > 30 {
                    report(
                        "cidr",
                        format!(
                            "/{prefix} leaves no address to hand out (network and broadcast are reserved)"
                        ),
                    );
                }
                if let Some((other, earlier)) = out.iter().enumerate().find_map(|(other, s)| {
                    s.as_ref()
                        .filter(|s| overlaps(s, &subnet))
                        .map(|s| (other, s))
                }) {
                    report(
                        "cidr",
                        format!("{subnet} overlaps subnets[{other}] ({earlier})"),
                    );
                }
                Some(subnet)
            }
            Err(message) => {
                report("cidr", message);
                None
            }
        };

        let router = entry
            .router
            .as_deref()
            .and_then(|text| match text.parse::<Ipv4Addr>() {
                Ok(router) => Some(router),
                Err(_) => {
                    report("router", not_an_address(text));
                    None
                }
            });
        if let (Some(router), Some(subnet)) = (router, &subnet)
            && let Some(message) = reserved_or_outside(router, subnet)
        {
            report("router", message);
        }

        let mut dns = Vec::with_capacity(entry.dns.len());
        for (position, text) in entry.dns.iter().enumerate() {
            match text.parse::<Ipv4Addr>() {
                Ok(server) => dns.push(server),
                Err(_) => report(&format!("dns[{position}]"), not_an_address(text)),
            }
        }

        if let Some(domain) = &entry.domain
            && let Some(message) = name_problem(domain, MAX_DOMAIN_LEN)
        {
            report("domain", message);
        }
        if entry.lease_time == Some(0) {
            report("lease_time", "must be at least 1 second".to_owned());
        }

        out.push(subnet.map(|subnet| Subnet {
            router,
            dns,
            ..subnet
        }));
    }
    out
}

/// `address/prefix`; host bits are checked by the caller.
fn parse_cidr(text: &str) -> Result<(Ipv4Addr, u8), String> {
    let malformed =
        || format!("{text:?} is not a cidr (expected address/prefix, e.g. 10.66.0.0/16)");
    let (address, prefix) = text.split_once('/').ok_or_else(malformed)?;
    let address = address.parse::<Ipv4Addr>().map_err(|_| malformed())?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    match prefix.parse::<u8>() {
        Ok(prefix) if prefix <= 32 => Ok((address, prefix)),
        _ => Err(format!("prefix /{prefix} is out of range 0..=32")),
    }
}

fn overlaps(a: &Subnet, b: &Subnet) -> bool {
    a.contains(b.network) || b.contains(a.network)
}

/// Why `address` cannot be a router or host in `subnet`, if it cannot.
fn reserved_or_outside(address: Ipv4Addr, subnet: &Subnet) -> Option<String> {
    if !subnet.contains(address) {
        Some(format!("{address} is outside {subnet}"))
    } else if address == subnet.network {
        Some(format!("{address} is the network address of {subnet}"))
    } else if address == subnet.broadcast() {
        Some(format!("{address} is the broadcast address of {subnet}"))
    } else {
        None
    }
}

fn not_an_address(text: &str) -> String {
    format!("{text:?} is not an ipv4 address")
}

/// Hostnames and domains: letters, digits, `-` and `.`, at most `limit`
/// bytes.
fn name_problem(name: &str, limit: usize) -> Option<String> {
    if name.is_empty() {
        return Some("must not be empty".to_owned());
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '.'))
    {
        return Some(format!(
            "{name:?} contains {bad:?}; only letters, digits, '-' and '.' are allowed"
        ));
    }
    if name.len() > limit {
        return Some(format!(
            "{name:?} is {} bytes; at most {limit} are allowed",
            name.len()
        ));
    }
    None
}

fn profiles(raw: &[RawProfile], problems: &mut Vec<Problem>) -> Vec<Profile> {
    let mut out: Vec<Profile> = Vec::with_capacity(raw.len());
    for (index, entry) in raw.iter().enumerate() {
        // Fields are named by profile name, which operators search for; the
        // name itself is named by position, as it may be empty or repeated.
        let prefix = if entry.name.is_empty() {
            format!("profiles[{index}]")
        } else {
            format!("profiles[{}]", entry.name)
        };
        if entry.name.is_empty() {
            problems.push(Problem::new(
                None,
                format!("profiles[{index}].name"),
                "must not be empty",
            ));
        } else if let Some(first) = out.iter().position(|p| p.name == entry.name) {
            problems.push(Problem::new(
                None,
                format!("profiles[{index}].name"),
                format!(
                    "profile name {:?} is already used by profiles[{first}]",
                    entry.name
                ),
            ));
        }
        let mut report = |key: &str, message: String| {
            problems.push(Problem::new(None, format!("{prefix}.{key}"), message));
        };

        if let Some(boot) = &entry.boot {
            check_boot(boot, &mut report);
        }
        if entry.kernel.as_deref() == Some("") {
            report("kernel", "must not be empty".to_owned());
        }
        for (position, initrd) in entry.initrd.iter().enumerate() {
            if initrd.is_empty() {
                report(
                    &format!("initrd[{position}]"),
                    "must not be empty".to_owned(),
                );
            }
        }
        if entry.kernel.is_none() {
            if !entry.initrd.is_empty() {
                report(
                    "initrd",
                    "is set but kernel is not; an initrd is only loaded with a kernel".to_owned(),
                );
            }
            if entry.cmdline.is_some() {
                report(
                    "cmdline",
                    "is set but kernel is not; a command line is only passed to a kernel"
                        .to_owned(),
                );
            }
        }

        out.push(Profile {
            name: entry.name.clone(),
            boot: entry.boot.as_ref().map(|boot| BootFiles {
                bios: boot.bios.clone(),
                uefi: boot.uefi.clone(),
                uefi_arm64: boot.uefi_arm64.clone(),
                http: boot.http.clone(),
            }),
            kernel: entry.kernel.clone(),
            initrd: entry.initrd.clone(),
            cmdline: entry.cmdline.clone(),
        });
    }
    out
}

fn check_boot(boot: &RawBoot, report: &mut impl FnMut(&str, String)) {
    let files = [
        ("boot.bios", &boot.bios),
        ("boot.uefi", &boot.uefi),
        ("boot.uefi_arm64", &boot.uefi_arm64),
    ];
    for (key, file) in files {
        let Some(file) = file else { continue };
        if file.is_empty() {
            report(key, "must not be empty".to_owned());
        } else if let Some(message) = too_long(file, MAX_BOOT_FILE_LEN, "the bootp file field") {
            report(key, message);
        }
    }
    if let Some(url) = &boot.http {
        let lower = url.to_ascii_lowercase();
        if !(lower.starts_with("http://") || lower.starts_with("https://")) {
            report(
                "boot.http",
                format!("{url:?} is not an http:// or https:// url"),
            );
        } else if let Some(message) = too_long(url, MAX_BOOT_URL_LEN, "dhcp option 67") {
            report("boot.http", message);
        }
    }
}

/// Length check that counts each `{server}` as the longest address it may
/// become, so a file that fits now still fits on any server.
fn too_long(text: &str, limit: usize, container: &str) -> Option<String> {
    let placeholders = text.matches(SERVER_PLACEHOLDER).count();
    let longest = text.len() + placeholders * (LONGEST_IPV4 - SERVER_PLACEHOLDER.len());
    if longest <= limit {
        None
    } else if placeholders == 0 {
        Some(format!(
            "is {longest} bytes; {container} holds at most {limit}"
        ))
    } else {
        Some(format!(
            "is {} bytes, up to {longest} once {SERVER_PLACEHOLDER} is replaced by an address; \
             {container} holds at most {limit}",
            text.len()
        ))
    }
}

/// One entry per raw host, `None` where the host has any problem.
fn hosts(
    raw: &[RawHost],
    subnets: &[Option<Subnet>],
    profiles: &[Profile],
    problems: &mut Vec<Problem>,
) -> Vec<Option<Host>> {
    let macs: Vec<Option<MacAddr>> = raw.iter().map(|h| h.mac.parse().ok()).collect();
    let labels: Vec<String> = raw
        .iter()
        .zip(&macs)
        .enumerate()
        .map(|(index, (host, mac))| match (mac, &host.hostname) {
            (Some(mac), Some(name)) => format!("{name} ({mac})"),
            (Some(mac), None) => mac.to_string(),
            (None, Some(name)) => format!("{name} (hosts[{index}])"),
            (None, None) => format!("hosts[{index}]"),
        })
        .collect();
    // For duplicate MACs, where the label cannot tell the hosts apart.
    let by_position = |index: usize| match &raw[index].hostname {
        Some(name) => format!("hosts[{index}] ({name})"),
        None => format!("hosts[{index}]"),
    };

    let mut mac_owner: HashMap<MacAddr, usize> = HashMap::new();
    let mut ip_owner: HashMap<Ipv4Addr, usize> = HashMap::new();
    let mut out = Vec::with_capacity(raw.len());
    for (index, entry) in raw.iter().enumerate() {
        let before = problems.len();
        let mut report = |field: &str, message: String| {
            problems.push(Problem::new(Some(labels[index].clone()), field, message))
        };

        let mac = match entry.mac.parse::<MacAddr>() {
            Ok(mac) => Some(mac),
            Err(e) => {
                report("mac", e.to_string());
                None
            }
        };
        if let Some(mac) = mac {
            if let Some(&first) = mac_owner.get(&mac) {
                report(
                    "mac",
                    format!(
                        "{mac} is used by both {} and {}",
                        by_position(first),
                        by_position(index)
                    ),
                );
            } else {
                mac_owner.insert(mac, index);
            }
        }

        if let Some(hostname) = &entry.hostname
            && let Some(message) = name_problem(hostname, MAX_HOSTNAME_LEN)
        {
            report("hostname", message);
        }

        let ip = match entry.ip.parse::<Ipv4Addr>() {
            Ok(ip) => Some(ip),
            Err(_) => {
                report("ip", not_an_address(&entry.ip));
                None
            }
        };
        let subnet = ip.and_then(|ip| {
            let found = subnets
                .iter()
                .enumerate()
                .find_map(|(at, s)| s.as_ref().filter(|s| s.contains(ip)).map(|s| (at, s)));
            let Some((at, subnet)) = found else {
                report("ip", format!("{ip} is outside every subnet"));
                return None;
            };
            if let Some(message) = reserved_or_outside(ip, subnet) {
                report("ip", message);
            } else if subnet.router == Some(ip) {
                report("ip", format!("{ip} is the router address of {subnet}"));
            }
            Some(at)
        });
        if let Some(ip) = ip {
            if let Some(&first) = ip_owner.get(&ip) {
                report(
                    "ip",
                    format!("{ip} is already assigned to {}", labels[first]),
                );
            } else {
                ip_owner.insert(ip, index);
            }
        }

        let profile = profiles.iter().position(|p| p.name == entry.profile);
        if profile.is_none() {
            let known: Vec<&str> = profiles.iter().map(|p| p.name.as_str()).collect();
            let known = if known.is_empty() {
                "no profiles are defined".to_owned()
            } else {
                format!("known: {}", known.join(", "))
            };
            report(
                "profile",
                format!("unknown profile {:?} ({known})", entry.profile),
            );
        }

        let mut options = BTreeMap::new();
        for (key, value) in &entry.options {
            let field = format!("options.{}", option_key_text(key));
            let code = key.as_u64().and_then(|code| u8::try_from(code).ok());
            let Some(code) = code else {
                report(
                    &field,
                    format!(
                        "option code {} is not an integer in 1..=254",
                        option::show(key)
                    ),
                );
                continue;
            };
            if let Some(reason) = option::refusal(code) {
                report(&field, reason.to_owned());
                continue;
            }
            match option::encode(code, value) {
                Ok(bytes) => {
                    options.insert(code, bytes);
                }
                Err(message) => report(&field, message),
            }
        }

        let host = match (mac, ip, subnet, profile) {
            (Some(mac), Some(ip), Some(subnet), Some(profile)) if problems.len() == before => {
                Some(Host {
                    mac,
                    ip,
                    hostname: entry.hostname.clone(),
                    profile,
                    subnet,
                    labels: entry.labels.clone(),
                    options,
                })
            }
            _ => None,
        };
        out.push(host);
    }
    out
}

/// The option key as the operator wrote it, for the `options.<key>` field.
fn option_key_text(key: &serde_yaml::Value) -> String {
    match key {
        serde_yaml::Value::String(text) => text.clone(),
        other => option::show(other),
    }
}

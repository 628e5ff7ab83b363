//! The inventory's rules. Owns turning the raw file into an [`Inventory`]
//! and collecting every broken rule as a [`Problem`] in file order, never
//! stopping at the first; not the wording of the error around them
//! (`error`) nor option encoding (`option`).

use std::{
    collections::{BTreeMap, HashMap},
    net::{Ipv4Addr, Ipv6Addr},
    sync::Arc,
};

use super::{
    BootFiles, DEFAULT_LEASE_TIME, Discovery, DiscoveryPolicy, Host, Host6, IP_PLACEHOLDER,
    IPV6_PLACEHOLDER, Inventory, IpxeSettings, LeaseKey, MAC_PLACEHOLDER, Match, Netboot,
    PhoneHomeToken, Problem, Profile, Range, Rule, SERVER_PLACEHOLDER, Subnet, Subnet6, SubnetMode,
    check6,
    oob::{self, Secrets},
    option,
    raw::{
        RawBoot, RawDiscovery, RawHost, RawInventory, RawIpxe, RawMatch, RawProfile, RawRange,
        RawRule, RawSubnet,
    },
};
use super::{DEFAULT_GRUB_CONFIG, GrubSettings, Hostname, raw::RawGrub};
use crate::mac::MacAddr;

mod profiles;
use profiles::{class_problem, profiles};

/// The BOOTP `file` field is 128 bytes and must end in a NUL (RFC 951).
const MAX_BOOT_FILE_LEN: usize = 127;
/// The HTTP boot URL travels in option 67, whose length is one octet.
const MAX_BOOT_URL_LEN: usize = 255;
/// One DNS label (RFC 1035 2.3.4); the hostname goes out as option 12.
const MAX_HOSTNAME_LEN: usize = super::hostname::MAX;
/// A full domain name (RFC 1035 2.3.4); goes out as option 15.
const MAX_DOMAIN_LEN: usize = 253;
/// Length of the longest dotted-quad address, `255.255.255.255`.
const LONGEST_IPV4: usize = 15;
/// Length of a MAC in colon form, `52:54:00:12:34:56`.
const MAC_TEXT_LEN: usize = 17;
/// Option 77 entries, option 60 and option 82 sub-options are all bounded
/// by one length octet.
const MAX_CLASS_LEN: usize = 255;

/// Checks `raw` and builds the inventory, or returns every problem found.
/// Passwords named by `bmc` blocks are read through `secrets`.
pub(super) fn validate(
    mut raw: RawInventory,
    secrets: &mut Secrets<'_>,
) -> Result<Inventory, Vec<Problem>> {
    let hosts = std::mem::take(&mut raw.hosts);
    let expected = hosts.len();
    let batches = std::iter::once(Ok::<_, std::convert::Infallible>(hosts));
    match validate_in_batches(&raw, batches, expected, secrets) {
        Ok(checked) => checked,
        Err(never) => match never {},
    }
}

/// [`validate`] of a file whose host list comes in batches, in file order,
/// after the rest of it (`frame`, whose own `hosts` are not read): each
/// batch is checked and dropped before the next is asked for, so the
/// entries as written never all exist at once. The problems are those of
/// [`validate`] on the whole file, in the same order. `expected` sizes the
/// tables of the hosts' MACs and addresses. A batch that cannot be read
/// ends the check with its error.
pub(super) fn validate_in_batches<E>(
    frame: &RawInventory,
    batches: impl IntoIterator<Item = Result<Vec<RawHost>, E>>,
    expected: usize,
    secrets: &mut Secrets<'_>,
) -> Result<Result<Inventory, Vec<Problem>>, E> {
    let mut problems = Vec::new();
    let (subnets, subnets6) = subnets(&frame.subnets, &mut problems);
    let profiles = profiles(&frame.profiles, &mut problems);
    let mut check = HostCheck::new(
        (&frame.subnets, &subnets, &subnets6),
        (&frame.profiles, &profiles),
        expected,
    );
    for batch in batches {
        check.batch(batch?, secrets, &mut problems);
    }
    let hosts = check.finish();
    let discovery = discovery(
        frame.discovery.as_ref(),
        &frame.subnets,
        &profiles,
        &mut problems,
    );
    let ipxe = ipxe(frame.ipxe.as_ref(), &mut problems);
    if !problems.is_empty() {
        return Ok(Err(problems));
    }
    // Every `None` below was recorded as a problem or stands for a subnet of
    // the other family, so the host indices into `subnets` and `subnets6`
    // (positions among their family's entries) stay valid after flattening.
    // The hosts
    // go into a vector of exactly their number: collected from a flatten,
    // which cannot tell its length, they would get up to twice that.
    let mut kept = Vec::with_capacity(hosts.len());
    kept.extend(hosts.into_iter().flatten());
    Ok(Ok(Inventory {
        subnets: subnets.into_iter().flatten().collect(),
        subnets6: subnets6.into_iter().flatten().collect(),
        profiles,
        hosts: kept,
        discovery,
        ipxe,
        served: Vec::new(),
        provisioned: Default::default(),
        index: Default::default(),
    }))
}

/// The IPv4 subnets, one entry per raw subnet (`None` where the CIDR is
/// unusable or is IPv6), and the IPv6 ones, one per IPv6 entry (`None`
/// where unusable). A subnet with other problems is still returned so hosts
/// can be checked against it.
fn subnets(
    raw: &[RawSubnet],
    problems: &mut Vec<Problem>,
) -> (Vec<Option<Subnet>>, Vec<Option<Subnet6>>) {
    let mut out: Vec<Option<Subnet>> = Vec::with_capacity(raw.len());
    let mut out6: Vec<Option<Subnet6>> = Vec::new();
    for (index, entry) in raw.iter().enumerate() {
        let mut report = |key: &str, message: String| {
            problems.push(Problem::new(
                None,
                format!("subnets[{index}].{key}"),
                message,
            ));
        };
        if check6::is_ipv6(entry) {
            out6.push(check6::subnet6(index, entry, &out6, &mut report));
            out.push(None);
            continue;
        }

        let subnet = match parse_cidr(&entry.cidr) {
            Ok((address, prefix)) => {
                let mut subnet = Subnet {
                    network: address,
                    prefix,
                    router: None,
                    dns: Vec::new(),
                    domain: entry.domain.clone(),
                    lease_time: entry.lease_time.unwrap_or(DEFAULT_LEASE_TIME),
                    pool: None,
                    mode: entry.mode,
                    options: BTreeMap::new(),
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

        let pool = entry
            .pool
            .as_ref()
            .and_then(|pool| check_pool(pool, subnet.as_ref(), router, &mut report));
        check_proxy(entry, &mut report);
        check6::ipv6_only_keys(entry, &mut report);
        let options = options(&entry.options, &mut |key, message| {
            report(&format!("options.{key}"), message)
        });

        out.push(subnet.map(|subnet| Subnet {
            router,
            dns,
            pool,
            options,
            ..subnet
        }));
    }
    (out, out6)
}

/// A proxyDHCP subnet hands out no addresses: the address server's pool is
/// configured there, not here.
fn check_proxy(entry: &RawSubnet, report: &mut impl FnMut(&str, String)) {
    if entry.mode == SubnetMode::Proxy && entry.pool.is_some() {
        report(
            "pool",
            "a subnet in mode proxy hands out no addresses (the other DHCP server \
             leases them): remove the pool, or use mode server"
                .to_owned(),
        );
    }
}

/// The pool, if its ends are addresses in order (so that hosts can still be
/// checked against it); problems with it are reported either way.
fn check_pool(
    raw: &RawRange,
    subnet: Option<&Subnet>,
    router: Option<Ipv4Addr>,
    report: &mut impl FnMut(&str, String),
) -> Option<Range> {
    let mut end_point = |key: &str, text: &str| match text.parse::<Ipv4Addr>() {
        Ok(address) => {
            if let Some(subnet) = subnet
                && !subnet.contains(address)
            {
                report(key, format!("{address} is outside {subnet}"));
            }
            Some(address)
        }
        Err(_) => {
            report(key, not_an_address(text));
            None
        }
    };
    let start = end_point("pool.start", &raw.start);
    let end = end_point("pool.end", &raw.end);
    let pool = Range {
        start: start?,
        end: end?,
    };
    if pool.is_empty() {
        report(
            "pool",
            format!("start {} is after end {}", pool.start, pool.end),
        );
        return None;
    }
    if let Some(subnet) = subnet
        && subnet.contains(pool.start)
        && subnet.contains(pool.end)
    {
        let reserved = [
            (Some(subnet.network), "network"),
            (Some(subnet.broadcast()), "broadcast"),
            (router, "router"),
        ];
        for (address, what) in reserved {
            if let Some(address) = address.filter(|a| pool.contains(*a)) {
                report(
                    "pool",
                    format!("{pool} covers {address}, the {what} address of {subnet}"),
                );
            }
        }
    }
    Some(pool)
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

/// Why `text` may not go into a boot answer or an iPXE script, if it may
/// not: a control character (a newline above all) would end the line it
/// is rendered on and start an iPXE command of the client's choosing.
fn control_problem(text: &str) -> Option<String> {
    let (at, bad) = text.char_indices().find(|(_, c)| c.is_control())?;
    Some(format!(
        "{text:?} contains the control character {bad:?} at byte {at}; \
         control characters (newlines, tabs, escapes) are not allowed"
    ))
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

/// Why `url` is not an `http://` or `https://` URL of at most `limit` bytes
/// once its placeholders are replaced, without control characters, if it
/// is not.
fn url_problem(url: &str, limit: usize, container: &str) -> Option<String> {
    let lower = url.to_ascii_lowercase();
    if let Some(message) = control_problem(url) {
        Some(message)
    } else if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        Some(format!("{url:?} is not an http:// or https:// url"))
    } else {
        too_long(url, limit, container)
    }
}

/// Length check that counts each `{server}` as the longest address it may
/// become and each `{mac}` as a MAC in colon form, so a file that fits now
/// still fits on any server and for any client.
fn too_long(text: &str, limit: usize, container: &str) -> Option<String> {
    let servers = text.matches(SERVER_PLACEHOLDER).count();
    let macs = text.matches(MAC_PLACEHOLDER).count();
    let longest = text.len()
        + servers * (LONGEST_IPV4 - SERVER_PLACEHOLDER.len())
        + macs * (MAC_TEXT_LEN - MAC_PLACEHOLDER.len());
    if longest <= limit {
        return None;
    }
    let replaced = match (servers, macs) {
        (0, 0) => {
            return Some(format!(
                "is {longest} bytes; {container} holds at most {limit}"
            ));
        }
        (_, 0) => format!("{SERVER_PLACEHOLDER} is replaced by an address"),
        (0, _) => format!("{MAC_PLACEHOLDER} is replaced by a mac"),
        _ => format!("{SERVER_PLACEHOLDER} and {MAC_PLACEHOLDER} are replaced"),
    };
    Some(format!(
        "is {} bytes, up to {longest} once {replaced}; {container} holds at most {limit}",
        text.len()
    ))
}

/// The host entries' check, fed in file order one batch at a time: each
/// entry is checked against the MACs and addresses of the entries before
/// it, and becomes a host (`None` where it has any problem). Only what a
/// later entry's message may name of an earlier one is kept per entry: its
/// first MAC and its hostname as written.
struct HostCheck<'a> {
    subnets: &'a [Option<Subnet>],
    subnets6: &'a [Option<Subnet6>],
    /// Per raw subnet: its position among the IPv4 subnets, the index a
    /// host keeps.
    v4_position: Vec<usize>,
    /// The profiles as written (for their `bmc` and `recovery` defaults)
    /// and as checked, one entry each.
    raw_profiles: &'a [RawProfile],
    profiles: &'a [Profile],
    /// Per entry so far: its first MAC, if it parses, and its hostname.
    names: Vec<(Option<MacAddr>, Option<Box<str>>)>,
    mac_owner: HashMap<MacAddr, usize>,
    ip_owner: HashMap<Ipv4Addr, usize>,
    /// Empty in a fleet without IPv6 or UUIDs.
    ip6_owner: HashMap<Ipv6Addr, usize>,
    uuid_owner: HashMap<[u8; 16], usize>,
    hosts: Vec<Option<Arc<Host>>>,
}

impl<'a> HostCheck<'a> {
    fn new(
        (raw_subnets, subnets, subnets6): (
            &[RawSubnet],
            &'a [Option<Subnet>],
            &'a [Option<Subnet6>],
        ),
        (raw_profiles, profiles): (&'a [RawProfile], &'a [Profile]),
        expected: usize,
    ) -> HostCheck<'a> {
        let v4_position = raw_subnets
            .iter()
            .scan(0, |next, entry| {
                let at = *next;
                *next += usize::from(!check6::is_ipv6(entry));
                Some(at)
            })
            .collect();
        HostCheck {
            subnets,
            subnets6,
            v4_position,
            raw_profiles,
            profiles,
            names: Vec::with_capacity(expected),
            mac_owner: HashMap::with_capacity(expected),
            ip_owner: HashMap::with_capacity(expected),
            ip6_owner: HashMap::new(),
            uuid_owner: HashMap::new(),
            hosts: Vec::with_capacity(expected),
        }
    }

    /// How messages name entry `index`. Made when a problem names the
    /// host, not ahead for every host.
    fn label(&self, index: usize) -> String {
        let (mac, name) = &self.names[index];
        host_label(index, *mac, name.as_deref())
    }

    /// For duplicate MACs, where the label cannot tell the hosts apart.
    fn by_position(&self, index: usize) -> String {
        match self.names[index].1.as_deref().map(str::escape_debug) {
            Some(name) => format!("hosts[{index}] ({name})"),
            None => format!("hosts[{index}]"),
        }
    }

    /// Checks the next entries of the list.
    fn batch(
        &mut self,
        entries: Vec<RawHost>,
        secrets: &mut Secrets<'_>,
        problems: &mut Vec<Problem>,
    ) {
        for entry in entries {
            let host = self.entry(&entry, secrets, problems);
            self.hosts.push(host.map(Arc::new));
        }
    }

    fn entry(
        &mut self,
        entry: &RawHost,
        secrets: &mut Secrets<'_>,
        problems: &mut Vec<Problem>,
    ) -> Option<Host> {
        let index = self.names.len();
        self.names.push((
            written_macs(entry).first().and_then(|m| m.parse().ok()),
            entry.hostname.as_deref().map(Box::from),
        ));
        let this = &*self;
        let before = problems.len();
        let mut found = Vec::new();
        let mut report = |field: &str, message: String| {
            problems.push(Problem::new(Some(this.label(index)), field, message));
        };

        let ports = host_macs(entry, &mut report);
        for (at, &mac) in ports.iter().enumerate() {
            let field = port_field(entry, at);
            match this.mac_owner.get(&mac) {
                Some(&first) => report(
                    &field,
                    format!(
                        "{mac} is used by both {} and {}",
                        this.by_position(first),
                        this.by_position(index)
                    ),
                ),
                None if found.contains(&mac) => {
                    report(&field, format!("{mac} is listed twice in this host's macs"));
                }
                None => found.push(mac),
            }
        }
        let mac = ports.first().copied();

        if let Some(hostname) = &entry.hostname
            && let Some(message) = name_problem(hostname, MAX_HOSTNAME_LEN)
        {
            report("hostname", message);
        }
        // Labels reach the iPXE script template as variables.
        for (key, value) in &entry.labels {
            if let Some(message) = control_problem(key).or_else(|| control_problem(value)) {
                report(&format!("labels.{}", key.escape_debug()), message);
            }
        }

        let ip = match entry.ip.as_deref().map(str::parse::<Ipv4Addr>) {
            Some(Ok(ip)) => Some(ip),
            Some(Err(_)) => {
                report(
                    "ip",
                    not_an_address(entry.ip.as_deref().unwrap_or_default()),
                );
                None
            }
            None => {
                if entry.ipv6.is_none() {
                    report(
                        "ip",
                        "missing: a host needs an ip, an ipv6 or both".to_string(),
                    );
                }
                None
            }
        };
        let subnet = ip.and_then(|ip| {
            let found = this
                .subnets
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
            } else if let Some(pool) = subnet.pool.filter(|pool| pool.contains(ip)) {
                // A discovered machine could be leased the same address.
                report(
                    "ip",
                    format!(
                        "{ip} is inside the discovery pool {pool} of subnets[{at}] ({subnet}); \
                         reserve addresses outside it"
                    ),
                );
            }
            Some(at)
        });
        let mut owns_ip = false;
        if let Some(ip) = ip {
            if let Some(&first) = this.ip_owner.get(&ip) {
                report(
                    "ip",
                    format!("{ip} is already assigned to {}", this.label(first)),
                );
            } else {
                owns_ip = true;
            }
        }

        let ipv6 = entry
            .ipv6
            .as_deref()
            .and_then(|text| check6::host_ipv6(text, this.subnets6, &mut report));
        let owns_ipv6 = match ipv6.and_then(|(ip, _)| this.ip6_owner.get(&ip).map(|&f| (ip, f))) {
            Some((ip, first)) => {
                report(
                    "ipv6",
                    format!("{ip} is already assigned to {}", this.label(first)),
                );
                false
            }
            None => true,
        };
        let uuid = entry
            .uuid
            .as_deref()
            .and_then(|text| check6::host_uuid(text, &mut report));
        let owns_uuid = match uuid.and_then(|uuid| this.uuid_owner.get(&uuid)) {
            Some(&first) => {
                report(
                    "uuid",
                    format!(
                        "{} is already the uuid of {}",
                        entry.uuid.as_deref().unwrap_or_default(),
                        this.label(first)
                    ),
                );
                false
            }
            None => true,
        };

        let profile = this.profiles.iter().position(|p| p.name == entry.profile);
        match profile.map(|at| &this.profiles[at]) {
            None => report("profile", unknown_profile(&entry.profile, this.profiles)),
            Some(p) => {
                // The boot puts the host's own address on its command line
                // (`http::plan`): it must have that address.
                let needs = [
                    ("ip", IP_PLACEHOLDER, entry.ip.is_some()),
                    ("ipv6", IPV6_PLACEHOLDER, entry.ipv6.is_some()),
                ];
                for (field, placeholder, has) in needs {
                    if !has && p.uses(placeholder) {
                        report(
                            field,
                            format!(
                                "is required: profile {:?} puts the host's address in its \
                                 boot with {placeholder}",
                                p.name
                            ),
                        );
                    }
                }
            }
        }

        let options = options(&entry.options, &mut |key, message| {
            report(&format!("options.{key}"), message)
        });

        let defaults = profile.and_then(|at| this.raw_profiles.get(at));
        let bmc = oob::bmc(
            defaults.and_then(|p| p.bmc.as_ref()),
            entry.bmc.as_deref(),
            secrets,
            &mut report,
        )
        .map(|b| {
            let name = entry.hostname.as_deref();
            oob::named(
                b,
                name.or(written_macs(entry).first().map(String::as_str))
                    .unwrap_or_default(),
            )
        });
        let recovery = oob::recovery(
            defaults.and_then(|p| p.recovery.as_ref()),
            entry.recovery.as_deref(),
            &mut report,
        );
        let netboot = netboot(entry.netboot.as_deref(), &mut report);
        if recovery.is_some() && entry.bmc.is_none() {
            report(
                "bmc",
                "is required with a recovery block (on the host or its profile): \
                 recovery acts through the host's BMC"
                    .to_owned(),
            );
        }

        // Taken once this entry's messages are made (they borrow the
        // tables); a MAC it lists twice was caught in `found`.
        for mac in found {
            self.mac_owner.insert(mac, index);
        }
        if let (Some(ip), true) = (ip, owns_ip) {
            self.ip_owner.insert(ip, index);
        }
        if let (Some((ip, _)), true) = (ipv6, owns_ipv6) {
            self.ip6_owner.insert(ip, index);
        }
        if let (Some(uuid), true) = (uuid, owns_uuid) {
            self.uuid_owner.insert(uuid, index);
        }
        let v6 = (ipv6.is_some() || uuid.is_some()).then(|| Box::new(Host6 { ip: ipv6, uuid }));
        // An address with no subnet was recorded as a problem.
        let ip = ip
            .zip(subnet)
            .map(|(ip, at)| (ip, u32::try_from(self.v4_position[at]).unwrap_or(u32::MAX)));
        match (mac, profile) {
            (Some(mac), Some(profile)) if problems.len() == before => {
                Some(Host {
                    mac,
                    // One port is `mac` alone (`Host::ports`).
                    macs: if ports.len() > 1 { ports } else { Vec::new() },
                    ip,
                    hostname: entry.hostname.as_deref().and_then(Hostname::new),
                    profile,
                    labels: entry.labels.clone(),
                    options: options.into(),
                    bmc: bmc.map(Box::new),
                    recovery: recovery.map(Box::new),
                    netboot,
                    v6,
                })
            }
            _ => None,
        }
    }

    /// One entry per entry checked, `None` where it has any problem.
    fn finish(self) -> Vec<Option<Arc<Host>>> {
        self.hosts
    }
}

/// The MACs a host entry writes, `mac` or `macs`, as text.
fn written_macs(entry: &RawHost) -> &[String] {
    match (&entry.mac, &entry.macs) {
        (Some(mac), _) => std::slice::from_ref(mac),
        (None, Some(macs)) => macs,
        (None, None) => &[],
    }
}

/// The field a host's `at`th MAC is reported under: `mac`, or `macs[at]`.
fn port_field(entry: &RawHost, at: usize) -> String {
    if entry.mac.is_some() {
        "mac".to_owned()
    } else {
        format!("macs[{at}]")
    }
}

/// A host's MACs, primary first: its `mac`, or every entry of `macs`.
/// Exactly one of the two is set, and `macs` lists at least one MAC; every
/// MAC that does not parse is reported. Duplicates are left to the caller,
/// which knows the other hosts.
fn host_macs(entry: &RawHost, report: &mut impl FnMut(&str, String)) -> Vec<MacAddr> {
    match (&entry.mac, &entry.macs) {
        (Some(_), Some(_)) => report(
            "macs",
            "set either mac (one port) or macs (several ports), not both".to_owned(),
        ),
        (None, None) => report(
            "mac",
            "is required (or macs, for a host with several ports)".to_owned(),
        ),
        (None, Some(macs)) if macs.is_empty() => {
            report("macs", "lists no MAC: a host needs at least one".to_owned());
        }
        _ => {}
    }
    let mut out = Vec::new();
    for (at, text) in written_macs(entry).iter().enumerate() {
        match text.parse::<MacAddr>() {
            Ok(mac) => out.push(mac),
            Err(e) => report(&port_field(entry, at), e.to_string()),
        }
    }
    out
}

/// A profile's or host's `netboot`, as written; `None` when missing or
/// reported.
fn netboot(raw: Option<&str>, report: &mut impl FnMut(&str, String)) -> Option<Netboot> {
    match raw? {
        "always" => Some(Netboot::Always),
        "once" => Some(Netboot::Once),
        "never" => Some(Netboot::Never),
        other => {
            report(
                "netboot",
                format!("{other:?} is not one of always, once, never"),
            );
            None
        }
    }
}

/// Encodes the `options` of a host, a rule, a profile or a subnet, alike;
/// `report` gets the key as written.
fn options(
    raw: &serde_norway::Mapping,
    report: &mut impl FnMut(&str, String),
) -> BTreeMap<u8, Vec<u8>> {
    let mut options = BTreeMap::new();
    for (key, value) in raw {
        let field = option_key_text(key);
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
        match option::encode_option(code, value) {
            Ok(bytes) => {
                options.insert(code, bytes);
            }
            Err(message) => report(&field, message),
        }
    }
    options
}

/// The `discovery` block; problems are named `discovery.<key>`.
fn discovery(
    raw: Option<&RawDiscovery>,
    subnets: &[RawSubnet],
    profiles: &[Profile],
    problems: &mut Vec<Problem>,
) -> Discovery {
    let Some(raw) = raw else {
        return Discovery::default();
    };
    let mut report = |key: &str, message: String| {
        problems.push(Problem::new(None, format!("discovery.{key}"), message));
    };
    let policy = match raw.policy.as_str() {
        "ignore" => Some(DiscoveryPolicy::Ignore),
        "inspect" => Some(DiscoveryPolicy::Inspect),
        other => {
            report(
                "policy",
                format!("unknown policy {other:?} (expected inspect or ignore)"),
            );
            None
        }
    };
    let profile = match &raw.profile {
        Some(name) => {
            let found = profiles.iter().position(|p| &p.name == name);
            if found.is_none() {
                report("profile", unknown_profile(name, profiles));
            }
            found
        }
        None => {
            if policy == Some(DiscoveryPolicy::Inspect) {
                report(
                    "profile",
                    "is required with policy inspect: it is what unknown machines boot".to_owned(),
                );
            }
            None
        }
    };
    // Looks at the pools as written: a pool with problems of its own was
    // still meant to be one, and is reported as such.
    if policy == Some(DiscoveryPolicy::Inspect) && !subnets.iter().any(|s| s.pool.is_some()) {
        report(
            "policy",
            "inspect needs addresses to lease: no subnet has a pool".to_owned(),
        );
    }
    if raw.lease_time == Some(0) {
        report("lease_time", "must be at least 1 second".to_owned());
    }
    Discovery {
        policy: policy.unwrap_or_default(),
        profile,
        lease_time: raw.lease_time,
        lease_key: lease_key(raw.lease_key.as_deref(), &mut report),
    }
}

/// `discovery.lease_key`; missing is the default, [`LeaseKey::Mac`].
fn lease_key(raw: Option<&str>, report: &mut impl FnMut(&str, String)) -> LeaseKey {
    match raw {
        None | Some("mac") => LeaseKey::Mac,
        Some("client_id") => LeaseKey::ClientId,
        Some(other) => {
            report(
                "lease_key",
                format!("unknown lease key {other:?} (expected mac or client_id)"),
            );
            LeaseKey::Mac
        }
    }
}

/// The `ipxe` block; problems are named `ipxe.<key>`.
fn ipxe(raw: Option<&RawIpxe>, problems: &mut Vec<Problem>) -> IpxeSettings {
    let mut settings = IpxeSettings::default();
    let Some(raw) = raw else {
        return settings;
    };
    let mut report = |key: &str, message: String| {
        problems.push(Problem::new(None, format!("ipxe.{key}"), message));
    };
    if let Some(user_class) = &raw.user_class {
        if let Some(message) = class_problem(user_class) {
            report("user_class", message);
        }
        settings.user_class.clone_from(user_class);
    }
    if let Some(script) = &raw.script {
        if let Some(message) = url_problem(script, MAX_BOOT_URL_LEN, "dhcp option 67") {
            report("script", message);
        }
        settings.script.clone_from(script);
        settings.default_script = false;
    }
    match raw.phone_home_token.as_deref() {
        None | Some("required") => {}
        Some("off") => settings.phone_home_token = PhoneHomeToken::Off,
        Some(other) => report(
            "phone_home_token",
            format!("{other:?} is not required or off"),
        ),
    }
    settings
}

fn unknown_profile(name: &str, profiles: &[Profile]) -> String {
    let known: Vec<String> = profiles
        .iter()
        .map(|p| p.name.escape_debug().to_string())
        .collect();
    let known = if known.is_empty() {
        "no profiles are defined".to_owned()
    } else {
        format!("known: {}", known.join(", "))
    };
    format!("unknown profile {name:?} ({known})")
}

/// The option key as the operator wrote it, for the `options.<key>` field.
fn option_key_text(key: &serde_norway::Value) -> String {
    match key {
        serde_norway::Value::String(text) => text.clone(),
        other => option::show(other),
    }
}

/// How problems name the host of entry `index`: by host name and first
/// MAC, or by position where the MAC is unusable (`Problem::host`).
pub fn host_label(index: usize, mac: Option<MacAddr>, name: Option<&str>) -> String {
    match (mac, name) {
        (Some(mac), Some(name)) => format!("{} ({mac})", name.escape_debug()),
        (Some(mac), None) => mac.to_string(),
        (None, Some(name)) => format!("{} (hosts[{index}])", name.escape_debug()),
        (None, None) => format!("hosts[{index}]"),
    }
}

//! The host inventory: which machines this agent answers, with which address,
//! subnet settings, boot files and extra DHCP options. Owns the model the
//! DHCP and XDP paths read, the YAML file format (`docs/inventory.md`) and
//! its validation, which reports every problem at once so that a bad reload
//! can be refused with one complete message. It does not decide DHCP policy
//! (`dhcp::decide`), substitute the `{server}` placeholder, or watch the file
//! for changes.

mod error;
mod file;
mod mac;
mod option;
mod raw;
mod validate;

use std::{
    collections::BTreeMap,
    fmt,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

pub use error::{LoadError, Problem};
pub use mac::{MacAddr, ParseMacError};

/// Placeholder in boot strings for the server's address, substituted when
/// answers are built; the inventory keeps it as written.
pub const SERVER_PLACEHOLDER: &str = "{server}";

/// Lease time used when a subnet does not set `lease_time`, in seconds.
pub const DEFAULT_LEASE_TIME: u32 = 3600;

/// A validated inventory. Hosts refer to subnets and profiles by index.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inventory {
    pub subnets: Vec<Subnet>,
    pub profiles: Vec<Profile>,
    pub hosts: Vec<Host>,
}

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
}

impl Subnet {
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

/// What a group of hosts boots. Strings are kept as written, including the
/// `{server}` placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    /// `None`: hosts get an address but no boot answer.
    pub boot: Option<BootFiles>,
    pub kernel: Option<String>,
    pub initrd: Vec<String>,
    pub cmdline: Option<String>,
}

/// The first file each kind of firmware is told to fetch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BootFiles {
    /// TFTP file for legacy BIOS PXE (client arch 0).
    pub bios: Option<String>,
    /// TFTP file for UEFI x64 PXE (client arch 7 and 9).
    pub uefi: Option<String>,
    /// TFTP file for UEFI ARM64 PXE (client arch 11).
    pub uefi_arm64: Option<String>,
    /// URL for UEFI HTTP boot (client arch 16 and 19).
    pub http: Option<String>,
}

/// One machine the agent answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub mac: MacAddr,
    pub ip: Ipv4Addr,
    pub hostname: Option<String>,
    /// Index into [`Inventory::profiles`].
    pub profile: usize,
    /// Index into [`Inventory::subnets`]: the subnet that contains `ip`.
    pub subnet: usize,
    pub labels: BTreeMap<String, String>,
    /// Extra DHCP options: code -> encoded value bytes (at most 255).
    pub options: BTreeMap<u8, Vec<u8>>,
}

impl Host {
    /// How messages name this host: `node-1 (52:54:00:12:34:56)`, or just
    /// the MAC when it has no hostname. Matches [`Problem::host`].
    pub fn label(&self) -> String {
        match &self.hostname {
            Some(hostname) => format!("{hostname} ({})", self.mac),
            None => self.mac.to_string(),
        }
    }
}

impl Inventory {
    /// Reads, parses and validates the inventory at `path`.
    pub fn load(path: &Path) -> Result<Inventory, LoadError> {
        file::load(path)
    }

    /// Parses and validates `text`; `path` is only used in messages.
    pub fn parse(path: &Path, text: &str) -> Result<Inventory, LoadError> {
        let raw: raw::RawInventory = serde_yaml::from_str(text).map_err(|e| {
            let mut message = e.to_string();
            // Inside [...] and {...} YAML reads an unquoted `{server}` as a
            // mapping, which the parser reports as a bare type mismatch.
            if message.contains("invalid type: map, expected a string")
                && text.contains(SERVER_PLACEHOLDER)
            {
                message.push_str(" (quote values that contain {server} inside [...] or {...})");
            }
            LoadError::Syntax {
                path: PathBuf::from(path),
                message,
            }
        })?;
        validate::validate(raw).map_err(|problems| LoadError::Invalid {
            path: PathBuf::from(path),
            problems,
        })
    }

    /// # Panics
    /// If `host.subnet` is not an index into `self.subnets`, which cannot
    /// happen for a host of a loaded inventory.
    pub fn subnet_of(&self, host: &Host) -> &Subnet {
        &self.subnets[host.subnet]
    }

    /// # Panics
    /// If `host.profile` is not an index into `self.profiles`, which cannot
    /// happen for a host of a loaded inventory.
    pub fn profile_of(&self, host: &Host) -> &Profile {
        &self.profiles[host.profile]
    }

    /// Linear scan: this serves the slow path only; the XDP fast path has its
    /// own map keyed by MAC.
    pub fn host_by_mac(&self, mac: MacAddr) -> Option<&Host> {
        self.hosts.iter().find(|host| host.mac == mac)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../../examples/inventory.yaml");

    /// The format as given in the reference, with every key set.
    const FULL: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    dns: [10.66.0.1]
    domain: lab.example
    lease_time: 7200
profiles:
  - name: worker
    boot:
      bios: undionly.kpxe
      uefi: snponly.efi
      uefi_arm64: snp-arm64.efi
      http: http://{server}:8080/ipxe.efi
    kernel: http://{server}:8080/artifacts/vmlinuz
    initrd: ["http://{server}:8080/artifacts/initrd.img"]
    cmdline: console=ttyS0
hosts:
  - mac: "52:54:00:12:34:56"
    ip: 10.66.1.10
    hostname: node-1
    profile: worker
    labels: {role: worker, rack: r1}
    options: {42: 10.66.0.1}
"#;

    const MAC1: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);

    fn path() -> &'static Path {
        Path::new("/etc/pxe-agent/inventory.yaml")
    }

    fn parse(text: &str) -> Result<Inventory, LoadError> {
        Inventory::parse(path(), text)
    }

    fn problems(text: &str) -> Vec<Problem> {
        match parse(text) {
            Err(LoadError::Invalid { problems, .. }) => problems,
            other => panic!("expected validation problems, got {other:?}"),
        }
    }

    /// One subnet, profiles `worker` (with boot) and `bare`, then `hosts`.
    fn with_hosts(hosts: &str) -> String {
        format!(
            "subnets:\n  - cidr: 10.66.0.0/16\n    router: 10.66.0.1\n\
             profiles:\n  - name: worker\n    boot: {{bios: undionly.kpxe}}\n  - name: bare\n\
             hosts:\n{hosts}"
        )
    }

    fn one_problem(text: &str) -> Problem {
        let mut found = problems(text);
        assert_eq!(found.len(), 1, "expected one problem, got {found:#?}");
        found.remove(0)
    }

    #[test]
    fn full_format_parses_into_the_model() {
        let inventory = parse(FULL).expect("valid");
        assert_eq!(
            inventory.subnets,
            vec![Subnet {
                network: Ipv4Addr::new(10, 66, 0, 0),
                prefix: 16,
                router: Some(Ipv4Addr::new(10, 66, 0, 1)),
                dns: vec![Ipv4Addr::new(10, 66, 0, 1)],
                domain: Some("lab.example".into()),
                lease_time: 7200,
            }]
        );
        assert_eq!(
            inventory.profiles,
            vec![Profile {
                name: "worker".into(),
                boot: Some(BootFiles {
                    bios: Some("undionly.kpxe".into()),
                    uefi: Some("snponly.efi".into()),
                    uefi_arm64: Some("snp-arm64.efi".into()),
                    http: Some("http://{server}:8080/ipxe.efi".into()),
                }),
                kernel: Some("http://{server}:8080/artifacts/vmlinuz".into()),
                initrd: vec!["http://{server}:8080/artifacts/initrd.img".into()],
                cmdline: Some("console=ttyS0".into()),
            }]
        );
        let labels = BTreeMap::from([
            ("rack".into(), "r1".into()),
            ("role".into(), "worker".into()),
        ]);
        assert_eq!(
            inventory.hosts,
            vec![Host {
                mac: MAC1,
                ip: Ipv4Addr::new(10, 66, 1, 10),
                hostname: Some("node-1".into()),
                profile: 0,
                subnet: 0,
                labels,
                options: BTreeMap::from([(42, vec![10, 66, 0, 1])]),
            }]
        );
    }

    #[test]
    fn shipped_example_is_valid() {
        let inventory = parse(EXAMPLE).expect("examples/inventory.yaml is valid");
        assert_eq!(inventory.subnets.len(), 1);
        assert_eq!(inventory.subnets[0].to_string(), "10.66.0.0/16");
        let names: Vec<_> = inventory.profiles.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["worker", "bare"]);
        let node3 = inventory
            .host_by_mac("52:54:00:12:34:58".parse().expect("mac"))
            .expect("node-3");
        assert_eq!(node3.hostname.as_deref(), Some("node-3"));
        assert_eq!(inventory.profile_of(node3).boot, None);
        let node1 = inventory.host_by_mac(MAC1).expect("node-1");
        assert_eq!(node1.options.get(&42), Some(&vec![10, 66, 0, 1]));
        assert_eq!(inventory.profile_of(node1).name, "worker");
    }

    #[test]
    fn lookups_follow_host_indices() {
        let inventory = parse(FULL).expect("valid");
        let host = inventory.host_by_mac(MAC1).expect("known mac");
        assert_eq!(inventory.subnet_of(host).lease_time, 7200);
        assert_eq!(inventory.profile_of(host).name, "worker");
        assert!(inventory.host_by_mac(MacAddr([0; 6])).is_none());
    }

    #[test]
    fn defaults_apply_to_optional_keys() {
        let text = "subnets: [{cidr: 10.0.0.0/8}]\nprofiles: [{name: p}]\n\
                    hosts: [{mac: 52:54:00:12:34:56, ip: 10.0.0.5, profile: p}]\n";
        let inventory = parse(text).expect("valid");
        let subnet = &inventory.subnets[0];
        assert_eq!(
            (subnet.router, subnet.dns.len(), subnet.domain.as_ref()),
            (None, 0, None)
        );
        assert_eq!(subnet.lease_time, DEFAULT_LEASE_TIME);
        let host = &inventory.hosts[0];
        assert_eq!(host.mac, MAC1, "an unquoted mac is read as text");
        assert!(host.hostname.is_none() && host.labels.is_empty() && host.options.is_empty());
        assert_eq!(host.label(), "52:54:00:12:34:56");
    }

    #[test]
    fn profile_without_boot_is_accepted() {
        let inventory = parse(&with_hosts(
            "  - {mac: 52:54:00:12:34:56, ip: 10.66.1.10, profile: bare}\n",
        ))
        .expect("valid");
        let host = &inventory.hosts[0];
        assert_eq!(inventory.profile_of(host).name, "bare");
        assert_eq!(inventory.profile_of(host).boot, None);
    }

    #[test]
    fn empty_lists_are_valid() {
        let inventory = parse("subnets: []\nprofiles: []\nhosts: []\n").expect("valid");
        assert_eq!(inventory, Inventory::default());
    }

    #[test]
    fn missing_top_level_key_is_a_syntax_error() {
        let err = parse("subnets: []\nprofiles: []\n").expect_err("no hosts key");
        assert!(
            matches!(&err, LoadError::Syntax { message, .. } if message.contains("hosts")),
            "{err}"
        );
        // An emptied file must not read as an empty inventory.
        let err = parse("").expect_err("empty file");
        assert!(
            matches!(&err, LoadError::Syntax { message, .. } if message.contains("missing field")),
            "{err}"
        );
    }

    #[test]
    fn unknown_key_is_named() {
        let text = FULL.replace("    hostname: node-1", "    hostnme: node-1");
        let err = parse(&text).expect_err("unknown key");
        let LoadError::Syntax { message, .. } = &err else {
            panic!("expected a syntax error, got {err:?}")
        };
        assert!(message.contains("unknown field `hostnme`"), "{message}");
        assert!(message.contains("line"), "{message}");
        let boot = FULL.replace("      bios:", "      legacy:");
        assert!(
            parse(&boot)
                .expect_err("unknown boot key")
                .to_string()
                .contains("`legacy`")
        );
    }

    #[test]
    fn unquoted_placeholder_in_a_flow_list_gets_a_quoting_hint() {
        let text = FULL.replace(
            "initrd: [\"http://{server}:8080/artifacts/initrd.img\"]",
            "initrd: [http://{server}:8080/i]",
        );
        let err = parse(&text).expect_err("flow list reads {server} as a mapping");
        let LoadError::Syntax { message, .. } = &err else {
            panic!("expected a syntax error, got {err:?}")
        };
        assert!(
            message.contains("profiles[0].initrd[0]") && message.contains("quote values"),
            "{message}"
        );
    }

    #[test]
    fn yaml_syntax_error_reports_file_line_and_column() {
        let err = parse("subnets: [\nprofiles: []\n").expect_err("broken yaml");
        assert!(matches!(err, LoadError::Syntax { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.starts_with("failed to parse inventory /etc/pxe-agent/inventory.yaml: "),
            "{text}"
        );
        assert!(text.contains("line") && text.contains("column"), "{text}");
    }

    #[test]
    fn malformed_mac_is_reported_by_position() {
        let problem = one_problem(&with_hosts(
            "  - {mac: 52:54:00:12:34, ip: 10.66.1.10, profile: bare}\n",
        ));
        assert_eq!(problem.host.as_deref(), Some("hosts[0]"));
        assert_eq!(problem.field, "mac");
        assert!(
            problem
                .message
                .contains("\"52:54:00:12:34\" is not a mac address"),
            "{problem}"
        );
    }

    #[test]
    fn malformed_mac_keeps_the_hostname_in_the_label() {
        let problem = one_problem(&with_hosts(
            "  - {mac: zz, ip: 10.66.1.10, profile: bare, hostname: node-9}\n",
        ));
        assert_eq!(problem.host.as_deref(), Some("node-9 (hosts[0])"));
    }

    #[test]
    fn duplicate_mac_names_both_hosts() {
        let problem = one_problem(&with_hosts(
            "  - {mac: 52:54:00:12:34:56, ip: 10.66.1.10, profile: bare, hostname: node-1}\n\
             \x20 - {mac: 52-54-00-12-34-56, ip: 10.66.1.11, profile: bare, hostname: node-2}\n",
        ));
        assert_eq!(problem.host.as_deref(), Some("node-2 (52:54:00:12:34:56)"));
        assert_eq!(problem.field, "mac");
        assert!(problem.message.contains("hosts[0] (node-1)"), "{problem}");
        assert!(problem.message.contains("hosts[1] (node-2)"), "{problem}");
    }

    #[test]
    fn duplicate_ip_names_the_other_host() {
        let problem = one_problem(&with_hosts(
            "  - {mac: 52:54:00:12:34:56, ip: 10.66.1.10, profile: bare, hostname: node-1}\n\
             \x20 - {mac: 52:54:00:12:34:57, ip: 10.66.1.10, profile: bare}\n",
        ));
        assert_eq!(problem.host.as_deref(), Some("52:54:00:12:34:57"));
        assert_eq!(problem.field, "ip");
        assert_eq!(
            problem.message,
            "10.66.1.10 is already assigned to node-1 (52:54:00:12:34:56)"
        );
    }

    #[test]
    fn ip_outside_every_subnet_is_refused() {
        let problem = one_problem(&with_hosts(
            "  - {mac: 52:54:00:12:34:56, ip: 10.9.9.9, profile: bare, hostname: node-1}\n",
        ));
        assert_eq!(
            problem.to_string(),
            "host node-1 (52:54:00:12:34:56): field ip: 10.9.9.9 is outside every subnet"
        );
    }

    #[test]
    fn malformed_ip_is_refused() {
        let problem = one_problem(&with_hosts(
            "  - {mac: 52:54:00:12:34:56, ip: 10.66.1, profile: bare}\n",
        ));
        assert_eq!(problem.field, "ip");
        assert!(
            problem
                .message
                .contains("\"10.66.1\" is not an ipv4 address"),
            "{problem}"
        );
    }

    #[test]
    fn network_broadcast_and_router_addresses_are_refused() {
        for (ip, what) in [
            ("10.66.0.0", "network address"),
            ("10.66.255.255", "broadcast address"),
            ("10.66.0.1", "router address"),
        ] {
            let problem = one_problem(&with_hosts(&format!(
                "  - {{mac: 52:54:00:12:34:56, ip: {ip}, profile: bare}}\n"
            )));
            assert_eq!(problem.field, "ip");
            assert!(problem.message.contains(what), "{ip}: {problem}");
            assert!(problem.message.contains("10.66.0.0/16"), "{ip}: {problem}");
        }
    }

    #[test]
    fn unknown_profile_lists_the_known_ones() {
        let problem = one_problem(&with_hosts(
            "  - {mac: 52:54:00:12:34:56, ip: 10.66.1.10, profile: wrker}\n",
        ));
        assert_eq!(problem.field, "profile");
        assert_eq!(
            problem.message,
            "unknown profile \"wrker\" (known: worker, bare)"
        );
    }

    #[test]
    fn duplicate_profile_names_are_refused() {
        let text =
            "subnets: []\nprofiles: [{name: worker}, {name: bare}, {name: worker}]\nhosts: []\n";
        let problem = one_problem(text);
        assert_eq!(problem.host, None);
        assert_eq!(problem.field, "profiles[2].name");
        assert!(problem.message.contains("profiles[0]"), "{problem}");
    }

    #[test]
    fn malformed_cidr_is_refused() {
        for cidr in [
            "10.66.0.0",
            "10.66.0/16",
            "10.66.0.0/33",
            "10.66.0.0/x",
            "10.66.1.0/16",
            "10.66.0.0/31",
        ] {
            let problem = one_problem(&format!(
                "subnets: [{{cidr: {cidr}}}]\nprofiles: []\nhosts: []\n"
            ));
            assert_eq!(
                (problem.host.as_deref(), problem.field.as_str()),
                (None, "subnets[0].cidr"),
                "{cidr}"
            );
        }
    }

    #[test]
    fn cidr_with_host_bits_suggests_the_network() {
        let problem = one_problem("subnets: [{cidr: 10.66.1.0/16}]\nprofiles: []\nhosts: []\n");
        assert!(problem.message.contains("10.66.0.0/16"), "{problem}");
    }

    #[test]
    fn router_outside_its_subnet_is_refused() {
        let problem = one_problem(
            "subnets: [{cidr: 10.66.0.0/16, router: 10.67.0.1}]\nprofiles: []\nhosts: []\n",
        );
        assert_eq!(problem.field, "subnets[0].router");
        assert_eq!(problem.message, "10.67.0.1 is outside 10.66.0.0/16");
    }

    #[test]
    fn malformed_dns_server_is_refused() {
        let problem = one_problem(
            "subnets: [{cidr: 10.66.0.0/16, dns: [10.66.0.1, dns1]}]\nprofiles: []\nhosts: []\n",
        );
        assert_eq!(problem.field, "subnets[0].dns[1]");
    }

    #[test]
    fn overlapping_subnets_are_refused() {
        let problem = one_problem(
            "subnets: [{cidr: 10.66.0.0/16}, {cidr: 10.66.4.0/24}]\nprofiles: []\nhosts: []\n",
        );
        assert_eq!(problem.field, "subnets[1].cidr");
        assert!(
            problem
                .message
                .contains("overlaps subnets[0] (10.66.0.0/16)"),
            "{problem}"
        );
    }

    #[test]
    fn zero_lease_time_is_refused() {
        let problem = one_problem(
            "subnets: [{cidr: 10.66.0.0/16, lease_time: 0}]\nprofiles: []\nhosts: []\n",
        );
        assert_eq!(problem.field, "subnets[0].lease_time");
    }

    #[test]
    fn bad_domain_is_refused() {
        let problem = one_problem(
            "subnets: [{cidr: 10.66.0.0/16, domain: lab_example}]\nprofiles: []\nhosts: []\n",
        );
        assert_eq!(problem.field, "subnets[0].domain");
    }

    #[test]
    fn bad_option_codes_are_refused() {
        for (code, expect) in [
            ("0", "pad"),
            ("255", "end"),
            ("256", "1..=254"),
            ("53", "message type"),
            ("61", "client"),
            ("82", "relay"),
            ("foo", "1..=254"),
        ] {
            let problem = one_problem(&with_hosts(&format!(
                "  - {{mac: 52:54:00:12:34:56, ip: 10.66.1.10, profile: bare, options: {{{code}: 1}}}}\n"
            )));
            assert_eq!(problem.field, format!("options.{code}"));
            assert!(problem.message.contains(expect), "{code}: {problem}");
        }
    }

    #[test]
    fn option_values_are_encoded_by_type() {
        let inventory = parse(&with_hosts(
            "  - mac: 52:54:00:12:34:56\n    ip: 10.66.1.10\n    profile: bare\n    options:\n\
             \x20     26: 1500\n      6: [10.66.0.1, 10.66.0.2]\n      19: false\n      43: hex:0102\n      12: node\n",
        ))
        .expect("valid");
        let options = &inventory.hosts[0].options;
        assert_eq!(options[&26], vec![0x05, 0xdc]);
        assert_eq!(options[&6], vec![10, 66, 0, 1, 10, 66, 0, 2]);
        assert_eq!(options[&19], vec![0]);
        assert_eq!(options[&43], vec![1, 2]);
        assert_eq!(options[&12], b"node".to_vec());
    }

    #[test]
    fn option_value_longer_than_255_bytes_is_refused() {
        let long = "x".repeat(256);
        let problem = one_problem(&with_hosts(&format!(
            "  - {{mac: 52:54:00:12:34:56, ip: 10.66.1.10, profile: bare, options: {{224: {long}}}}}\n"
        )));
        assert_eq!(problem.field, "options.224");
        assert!(problem.message.contains("256 bytes"), "{problem}");
    }

    #[test]
    fn boot_file_name_longer_than_127_bytes_is_refused() {
        let fits = "f".repeat(127);
        let text = format!(
            "subnets: []\nprofiles: [{{name: worker, boot: {{uefi: {fits}}}}}]\nhosts: []\n"
        );
        parse(&text).expect("127 bytes fit");
        let long = "f".repeat(128);
        let text = format!(
            "subnets: []\nprofiles: [{{name: worker, boot: {{uefi: {long}}}}}]\nhosts: []\n"
        );
        let problem = one_problem(&text);
        assert_eq!(problem.field, "profiles[worker].boot.uefi");
        assert!(problem.message.contains("127"), "{problem}");
    }

    #[test]
    fn boot_file_length_counts_the_server_placeholder_as_an_address() {
        // 120 bytes as written, 127 once "{server}" becomes 255.255.255.255.
        let name = format!("{{server}}/{}", "f".repeat(111));
        let text =
            format!("subnets: []\nprofiles: [{{name: w, boot: {{bios: '{name}'}}}}]\nhosts: []\n");
        parse(&text).expect("fits once expanded");
        let name = format!("{{server}}/{}", "f".repeat(112));
        let text =
            format!("subnets: []\nprofiles: [{{name: w, boot: {{bios: '{name}'}}}}]\nhosts: []\n");
        assert_eq!(one_problem(&text).field, "profiles[w].boot.bios");
    }

    #[test]
    fn http_boot_url_longer_than_255_bytes_is_refused() {
        let url = format!("http://{{server}}/{}", "a".repeat(240));
        let text = format!(
            "subnets: []\nprofiles: [{{name: worker, boot: {{http: '{url}'}}}}]\nhosts: []\n"
        );
        let problem = one_problem(&text);
        assert_eq!(problem.field, "profiles[worker].boot.http");
        assert!(problem.message.contains("255"), "{problem}");
    }

    #[test]
    fn http_boot_url_needs_an_http_scheme() {
        let text = "subnets: []\nprofiles: [{name: worker, boot: {http: ipxe.efi}}]\nhosts: []\n";
        assert_eq!(one_problem(text).field, "profiles[worker].boot.http");
    }

    #[test]
    fn initrd_without_kernel_is_refused() {
        let text = "subnets: []\nprofiles: [{name: worker, initrd: [initrd.img]}]\nhosts: []\n";
        assert_eq!(one_problem(text).field, "profiles[worker].initrd");
    }

    #[test]
    fn bad_hostnames_are_refused() {
        for hostname in ["node_1", "node 1", "'node-1;'", "''", &"n".repeat(64)] {
            let problem = one_problem(&with_hosts(&format!(
                "  - {{mac: 52:54:00:12:34:56, ip: 10.66.1.10, profile: bare, hostname: {hostname}}}\n"
            )));
            assert_eq!(problem.field, "hostname", "{hostname}");
        }
        let ok = "n".repeat(63);
        parse(&with_hosts(&format!(
            "  - {{mac: 52:54:00:12:34:56, ip: 10.66.1.10, profile: bare, hostname: {ok}.lab-1}}\n"
        )))
        .expect_err("63 bytes plus a domain is too long");
        parse(&with_hosts(&format!(
            "  - {{mac: 52:54:00:12:34:56, ip: 10.66.1.10, profile: bare, hostname: {ok}}}\n"
        )))
        .expect("63 bytes fit");
    }

    #[test]
    fn all_problems_are_reported_together() {
        let text = "subnets:\n  - {cidr: 10.66.0.0/16, router: 10.67.0.1, lease_time: 0}\n  - {cidr: bogus}\n\
                    profiles:\n  - {name: worker, boot: {http: tftp://x}}\n  - {name: worker}\n\
                    hosts:\n\
                    \x20 - {mac: 52:54:00:12:34:56, ip: 10.66.1.10, profile: worker, hostname: node-1}\n\
                    \x20 - {mac: 52:54:00:12:34:56, ip: 10.66.1.10, profile: nope, hostname: bad_name}\n\
                    \x20 - {mac: xx, ip: 10.9.9.9, profile: worker, options: {53: 1, 42: [nope]}}\n";
        let found = problems(text);
        let fields: Vec<_> = found
            .iter()
            .map(|p| (p.host.as_deref(), p.field.as_str()))
            .collect();
        assert_eq!(
            fields,
            [
                (None, "subnets[0].router"),
                (None, "subnets[0].lease_time"),
                (None, "subnets[1].cidr"),
                (None, "profiles[worker].boot.http"),
                (None, "profiles[1].name"),
                (Some("bad_name (52:54:00:12:34:56)"), "mac"),
                (Some("bad_name (52:54:00:12:34:56)"), "hostname"),
                (Some("bad_name (52:54:00:12:34:56)"), "ip"),
                (Some("bad_name (52:54:00:12:34:56)"), "profile"),
                (Some("hosts[2]"), "mac"),
                (Some("hosts[2]"), "ip"),
                (Some("hosts[2]"), "options.53"),
                (Some("hosts[2]"), "options.42"),
            ],
            "{found:#?}"
        );
    }

    #[test]
    fn invalid_error_display_names_file_host_and_field_one_per_line() {
        let err = parse(&with_hosts(
            "  - {mac: 52:54:00:12:34:56, ip: 10.9.9.9, profile: bare, hostname: node-1}\n\
             \x20 - {mac: 52:54:00:12:34:57, ip: 10.66.1.11, profile: nope}\n",
        ))
        .expect_err("invalid");
        assert_eq!(
            err.to_string(),
            "invalid inventory /etc/pxe-agent/inventory.yaml (2 problems):\n\
             \x20 host node-1 (52:54:00:12:34:56): field ip: 10.9.9.9 is outside every subnet\n\
             \x20 host 52:54:00:12:34:57: field profile: unknown profile \"nope\" (known: worker, bare)"
        );
    }

    #[test]
    fn problem_without_host_displays_field_only() {
        let problem = Problem::new(None, "subnets[0].cidr", "\"x\" is not a cidr");
        assert_eq!(
            problem.to_string(),
            "field subnets[0].cidr: \"x\" is not a cidr"
        );
    }

    #[test]
    fn host_label_matches_problem_host() {
        let inventory = parse(FULL).expect("valid");
        let host = &inventory.hosts[0];
        assert_eq!(host.label(), "node-1 (52:54:00:12:34:56)");
        let problem = Problem::new(Some(host.label()), "ip", "in use");
        assert_eq!(
            problem.to_string(),
            "host node-1 (52:54:00:12:34:56): field ip: in use"
        );
    }

    #[test]
    fn subnet_netmask_broadcast_and_contains() {
        let subnet = |network: [u8; 4], prefix| Subnet {
            network: Ipv4Addr::from(network),
            prefix,
            router: None,
            dns: vec![],
            domain: None,
            lease_time: DEFAULT_LEASE_TIME,
        };
        let lab = subnet([10, 66, 0, 0], 16);
        assert_eq!(lab.netmask(), Ipv4Addr::new(255, 255, 0, 0));
        assert_eq!(lab.broadcast(), Ipv4Addr::new(10, 66, 255, 255));
        assert!(lab.contains(Ipv4Addr::new(10, 66, 200, 1)));
        assert!(!lab.contains(Ipv4Addr::new(10, 67, 0, 1)));
        let everything = subnet([0, 0, 0, 0], 0);
        assert_eq!(everything.netmask(), Ipv4Addr::UNSPECIFIED);
        assert!(everything.contains(Ipv4Addr::new(192, 0, 2, 1)));
        let single = subnet([192, 0, 2, 7], 32);
        assert_eq!(single.netmask(), Ipv4Addr::BROADCAST);
        assert!(single.contains(Ipv4Addr::new(192, 0, 2, 7)));
        assert!(!single.contains(Ipv4Addr::new(192, 0, 2, 8)));
    }
}

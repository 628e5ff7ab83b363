use super::*;
use std::{collections::HashMap, sync::Arc, time::Duration};

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
            pool: None,
            mode: SubnetMode::Server,
            options: Default::default(),
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
                ..BootFiles::default()
            }),
            kernel: Some("http://{server}:8080/artifacts/vmlinuz".into()),
            initrd: vec!["http://{server}:8080/artifacts/initrd.img".into()],
            cmdline: Some("console=ttyS0".into()),
            chain: None,
            local_disk: false,
            rules: vec![],
            grub: None,
            netboot: Default::default(),
            options: Default::default(),
        }]
    );
    let labels = BTreeMap::from([
        ("rack".into(), "r1".into()),
        ("role".into(), "worker".into()),
    ]);
    assert_eq!(
        inventory.hosts,
        vec![Arc::new(Host {
            mac: MAC1,
            // A host's only port is its `mac`: no list to allocate.
            macs: Vec::new(),
            ip: Some((Ipv4Addr::new(10, 66, 1, 10), 0)),
            hostname: Some("node-1".into()),
            profile: 0,
            labels,
            options: BTreeMap::from([(42, vec![10, 66, 0, 1])]).into(),
            bmc: None,
            recovery: None,
            netboot: None,
            v6: None,
        })]
    );
}

#[test]
fn shipped_example_is_valid() {
    let inventory = parse(EXAMPLE).expect("examples/inventory.yaml is valid");
    assert_eq!(inventory.subnets.len(), 1);
    assert_eq!(inventory.subnets[0].to_string(), "10.66.0.0/16");
    let names: Vec<_> = inventory.profiles.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["worker", "bare", "inspector"]);
    let pool = inventory.subnets[0].pool.expect("the example has a pool");
    assert_eq!(pool.to_string(), "10.66.200.1-10.66.200.250");
    assert_eq!(inventory.discovery.policy, DiscoveryPolicy::Inspect);
    let inspector = inventory.discovery_profile().expect("discovery profile");
    assert_eq!(inspector.name, "inspector");
    assert!(inspector.boot.is_some() && inspector.kernel.is_some());
    let node2 = inventory
        .host_by_mac("52:54:00:12:34:57".parse().expect("mac"))
        .expect("node-2");
    let (boot, _) = inventory
        .profile_of(node2)
        .boot_for_arches(&node2.labels, &[Some(7), Some(9)])
        .expect("a label rule is decided without the request");
    assert_eq!(
        boot.and_then(|b| b.uefi).as_deref(),
        Some("snponly.efi"),
        "the example's rule applies to node-2 in rack r2"
    );
    let node3 = inventory
        .host_by_mac("52:54:00:12:34:58".parse().expect("mac"))
        .expect("node-3");
    assert_eq!(node3.hostname.as_deref(), Some("node-3"));
    assert_eq!(inventory.profile_of(node3).boot, None);
    let node1 = inventory.host_by_mac(MAC1).expect("node-1");
    assert_eq!(node1.options.get(42), Some(&[10, 66, 0, 1][..]));
    assert_eq!(inventory.profile_of(node1).name, "worker");
}

#[test]
fn lookups_follow_host_indices() {
    let inventory = parse(FULL).expect("valid");
    let host = inventory.host_by_mac(MAC1).expect("known mac");
    assert_eq!(inventory.subnet_of(host).map(|s| s.lease_time), Some(7200));
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

/// The YAML crate's shape errors carry the path to the value and where it
/// is; the whole message is pinned so that a change of YAML crate cannot
/// quietly drop either.
#[test]
fn shape_error_names_file_host_field_line_and_column() {
    let text = FULL.replace("ip: 10.66.1.10", "ip: [10.66.1.10]");
    let err = parse(&text).expect_err("a list is not an address");
    assert_eq!(
        err.to_string(),
        "failed to parse inventory /etc/pxe-agent/inventory.yaml: hosts[0].ip: \
         invalid type: sequence, expected a string at line 20 column 9"
    );
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
fn a_host_with_several_ports_is_found_by_each_of_its_macs() {
    let inventory = parse(&with_hosts(
        "  - {macs: [52:54:00:12:34:56, 52-54-00-AB-CD-EF], ip: 10.66.1.10, profile: bare, hostname: node-1}\n\
             \x20 - {mac: 52:54:00:12:34:57, ip: 10.66.1.11, profile: bare}\n",
    ))
    .expect("valid");
    let host = &inventory.hosts[0];
    let second = MacAddr([0x52, 0x54, 0x00, 0xab, 0xcd, 0xef]);
    assert_eq!(host.mac, MAC1, "the first of macs is the primary MAC");
    assert_eq!(host.ports(), [MAC1, second]);
    assert_eq!(host.label(), "node-1 (52:54:00:12:34:56)");
    for mac in [MAC1, second] {
        assert_eq!(inventory.host_by_mac(mac).map(|h| h.ip), Some(host.ip));
    }
    assert_eq!(
        inventory.host_by_ip(host.ipv4().unwrap()).map(|h| h.mac),
        Some(MAC1),
        "one host, one address"
    );
    assert_eq!(inventory.hosts[1].ports(), [inventory.hosts[1].mac]);
    assert!(
        inventory
            .host_by_mac(MacAddr([0x52, 0x54, 0x00, 0xab, 0xcd, 0xee]))
            .is_none()
    );
}

#[test]
fn a_mac_in_two_hosts_macs_names_both_hosts() {
    let problem = one_problem(&with_hosts(
        "  - {macs: [52:54:00:12:34:56, 52:54:00:00:00:02], ip: 10.66.1.10, profile: bare, hostname: node-1}\n\
             \x20 - {macs: [52:54:00:00:00:03, 52-54-00-00-00-02], ip: 10.66.1.11, profile: bare, hostname: node-2}\n",
    ));
    assert_eq!(problem.host.as_deref(), Some("node-2 (52:54:00:00:00:03)"));
    assert_eq!(problem.field, "macs[1]");
    assert_eq!(
        problem.message,
        "52:54:00:00:00:02 is used by both hosts[0] (node-1) and hosts[1] (node-2)"
    );
    // One host's mac against another's macs.
    let problem = one_problem(&with_hosts(
        "  - {mac: 52:54:00:00:00:02, ip: 10.66.1.10, profile: bare, hostname: node-1}\n\
             \x20 - {macs: [52:54:00:00:00:03, 52:54:00:00:00:02], ip: 10.66.1.11, profile: bare, hostname: node-2}\n",
    ));
    assert_eq!(problem.field, "macs[1]");
    assert!(
        problem
            .message
            .contains("hosts[0] (node-1) and hosts[1] (node-2)"),
        "{problem}"
    );
}

#[test]
fn macs_forms_are_checked() {
    let twice = one_problem(&with_hosts(
        "  - {macs: [52:54:00:12:34:56, 52-54-00-12-34-56], ip: 10.66.1.10, profile: bare, hostname: node-1}\n",
    ));
    assert_eq!(twice.field, "macs[1]");
    assert_eq!(
        twice.message,
        "52:54:00:12:34:56 is listed twice in this host's macs"
    );
    let both = one_problem(&with_hosts(
        "  - {mac: 52:54:00:12:34:56, macs: [52:54:00:12:34:57], ip: 10.66.1.10, profile: bare}\n",
    ));
    assert_eq!(both.field, "macs");
    assert!(both.message.contains("not both"), "{both}");
    let neither = one_problem(&with_hosts(
        "  - {ip: 10.66.1.10, profile: bare, hostname: node-3}\n",
    ));
    assert_eq!(neither.host.as_deref(), Some("node-3 (hosts[0])"));
    assert_eq!(neither.field, "mac");
    assert!(neither.message.contains("is required"), "{neither}");
    let empty = one_problem(&with_hosts(
        "  - {macs: [], ip: 10.66.1.10, profile: bare}\n",
    ));
    assert_eq!(empty.field, "macs");
    let bad = one_problem(&with_hosts(
        "  - {macs: [52:54:00:12:34:56, zz], ip: 10.66.1.10, profile: bare}\n",
    ));
    assert_eq!(bad.host.as_deref(), Some("52:54:00:12:34:56"));
    assert_eq!(bad.field, "macs[1]");
}

#[test]
fn discovery_lease_key_defaults_to_mac_and_refuses_unknown_keys() {
    let base = "subnets:\n  - cidr: 10.66.0.0/16\n    pool: {start: 10.66.200.1, end: 10.66.200.9}\n\
                profiles:\n  - name: inspector\nhosts: []\n\
                discovery: {policy: inspect, profile: inspector";
    let inv = parse(&format!("{base}}}\n")).expect("valid");
    assert_eq!(inv.discovery.lease_key, LeaseKey::Mac);
    let inv = parse(&format!("{base}, lease_key: client_id}}\n")).expect("valid");
    assert_eq!(inv.discovery.lease_key, LeaseKey::ClientId);
    let inv = parse(&format!("{base}, lease_key: mac}}\n")).expect("valid");
    assert_eq!(inv.discovery.lease_key, LeaseKey::Mac);
    let bad = one_problem(&format!("{base}, lease_key: clid}}\n"));
    assert_eq!(bad.field, "discovery.lease_key");
    assert_eq!(
        bad.message,
        "unknown lease key \"clid\" (expected mac or client_id)"
    );
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
    let text = "subnets: []\nprofiles: [{name: worker}, {name: bare}, {name: worker}]\nhosts: []\n";
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
    let problem =
        one_problem("subnets: [{cidr: 10.66.0.0/16, lease_time: 0}]\nprofiles: []\nhosts: []\n");
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
    assert_eq!(options.get(26).expect("option 26"), vec![0x05, 0xdc]);
    assert_eq!(
        options.get(6).expect("option 6"),
        vec![10, 66, 0, 1, 10, 66, 0, 2]
    );
    assert_eq!(options.get(19).expect("option 19"), vec![0]);
    assert_eq!(options.get(43).expect("option 43"), vec![1, 2]);
    assert_eq!(options.get(12).expect("option 12"), b"node".to_vec());
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
    let text =
        format!("subnets: []\nprofiles: [{{name: worker, boot: {{uefi: {fits}}}}}]\nhosts: []\n");
    parse(&text).expect("127 bytes fit");
    let long = "f".repeat(128);
    let text =
        format!("subnets: []\nprofiles: [{{name: worker, boot: {{uefi: {long}}}}}]\nhosts: []\n");
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
    let text =
        format!("subnets: []\nprofiles: [{{name: worker, boot: {{http: '{url}'}}}}]\nhosts: []\n");
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
        pool: None,
        mode: SubnetMode::Server,
        options: Default::default(),
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

/// [`FULL`] plus every key added for discovery, iPXE and rules.
const EXTENDED: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    pool: {start: 10.66.200.1, end: 10.66.200.250}
  - cidr: 10.67.0.0/24
discovery: {policy: inspect, profile: inspector, lease_time: 600}
ipxe:
  user_class: iPXE-lab
  script: "https://{server}/boot/{mac}.ipxe"
profiles:
  - name: worker
    boot: {bios: undionly.kpxe, uefi: ipxe.efi}
    chain: "http://installer.example/boot.ipxe"
    rules:
      - match:
          arch: [7, 9]
          vendor_class: "PXEClient:Arch:00007"
          user_class: iPXE
          circuit_id: rack1-sw1-port3
          labels: {rack: r1}
        boot: {uefi: snponly.efi}
        options: {66: 10.66.0.1}
      - match: {labels: {rack: r2}}
        options: {224: hex:0102}
  - name: inspector
    boot: {bios: undionly.kpxe}
hosts:
  - {mac: "52:54:00:12:34:56", ip: 10.66.1.10, profile: worker, labels: {rack: r1}}
"#;

#[test]
fn new_keys_parse_into_the_model() {
    let inventory = parse(EXTENDED).expect("valid");
    assert_eq!(
        inventory.subnets[0].pool,
        Some(Range {
            start: Ipv4Addr::new(10, 66, 200, 1),
            end: Ipv4Addr::new(10, 66, 200, 250),
        })
    );
    assert_eq!(inventory.subnets[1].pool, None);
    assert_eq!(
        inventory.discovery,
        Discovery {
            policy: DiscoveryPolicy::Inspect,
            profile: Some(1),
            lease_time: Some(600),
            lease_key: LeaseKey::Mac,
        }
    );
    assert_eq!(
        inventory.ipxe,
        IpxeSettings {
            user_class: "iPXE-lab".into(),
            script: "https://{server}/boot/{mac}.ipxe".into(),
            default_script: false,
            phone_home_token: PhoneHomeToken::Required,
        }
    );
    let worker = &inventory.profiles[0];
    assert_eq!(
        worker.chain.as_deref(),
        Some("http://installer.example/boot.ipxe")
    );
    assert_eq!(
        worker.rules,
        vec![
            Rule {
                when: Match {
                    arch: vec![7, 9],
                    vendor_class: Some("PXEClient:Arch:00007".into()),
                    user_class: Some("iPXE".into()),
                    circuit_id: Some("rack1-sw1-port3".into()),
                    labels: BTreeMap::from([("rack".into(), "r1".into())]),
                },
                boot: BootFiles {
                    uefi: Some("snponly.efi".into()),
                    ..BootFiles::default()
                },
                // Option 66 is a server name: text, even when it is an address.
                options: BTreeMap::from([(66, b"10.66.0.1".to_vec())]),
            },
            Rule {
                when: Match {
                    labels: BTreeMap::from([("rack".into(), "r2".into())]),
                    ..Match::default()
                },
                boot: BootFiles::default(),
                options: BTreeMap::from([(224, vec![1, 2])]),
            },
        ]
    );
    assert_eq!(inventory.profiles[1].chain, None);
    assert!(inventory.profiles[1].rules.is_empty());
}

#[test]
fn new_keys_default_when_absent() {
    let inventory = parse(FULL).expect("valid");
    assert_eq!(inventory.subnets[0].pool, None);
    assert_eq!(inventory.discovery, Discovery::default());
    assert_eq!(inventory.discovery.policy, DiscoveryPolicy::Ignore);
    assert_eq!(inventory.discovery_profile(), None);
    assert_eq!(inventory.ipxe.user_class, "iPXE");
    assert_eq!(
        inventory.ipxe.script,
        "http://{server}:8080/boot/{mac}.ipxe"
    );
    assert_eq!(inventory.pools().count(), 0);
    let partial = parse(&EXTENDED.replace("  user_class: iPXE-lab\n", "")).expect("valid");
    assert_eq!(partial.ipxe.user_class, DEFAULT_IPXE_USER_CLASS);
    assert_eq!(partial.ipxe.script, "https://{server}/boot/{mac}.ipxe");
}

#[test]
fn unknown_keys_in_new_blocks_are_refused() {
    for (from, to, key) in [
        ("pool: {start:", "pool: {first:", "first"),
        ("lease_time: 600}", "lease: 600}", "lease"),
        ("  script:", "  scrpt:", "scrpt"),
        ("vendor_class:", "vendor:", "vendor"),
        ("        options: {66", "        option: {66", "option"),
    ] {
        let err = parse(&EXTENDED.replacen(from, to, 1)).expect_err(key);
        let message = err.to_string();
        assert!(
            matches!(err, LoadError::Syntax { .. })
                && message.contains(&format!("unknown field `{key}`")),
            "{message}"
        );
    }
}

#[test]
fn discovery_lease_time_defaults_to_the_subnet() {
    let inventory = parse(EXTENDED).expect("valid");
    let subnet = &inventory.subnets[0];
    assert_eq!(inventory.discovery.lease_time_in(subnet), 600);
    let defaulted = parse(&EXTENDED.replace(", lease_time: 600", "")).expect("valid");
    assert_eq!(
        defaulted.discovery.lease_time_in(subnet),
        DEFAULT_LEASE_TIME
    );
}

/// One /16 subnet with `pool` (written as YAML), no profiles or hosts.
fn with_pool(pool: &str) -> String {
    format!(
        "subnets: [{{cidr: 10.66.0.0/16, router: 10.66.0.1, pool: {pool}}}]\n\
             profiles: []\nhosts: []\n"
    )
}

#[test]
fn pool_outside_its_subnet_is_refused() {
    let problem = one_problem(&with_pool("{start: 10.66.200.1, end: 10.67.0.9}"));
    assert_eq!(problem.field, "subnets[0].pool.end");
    assert_eq!(problem.message, "10.67.0.9 is outside 10.66.0.0/16");
    let problem = one_problem(&with_pool("{start: 10.65.0.1, end: 10.66.0.9}"));
    assert_eq!(problem.field, "subnets[0].pool.start");
}

#[test]
fn pool_with_start_after_end_is_refused() {
    let problem = one_problem(&with_pool("{start: 10.66.200.250, end: 10.66.200.1}"));
    assert_eq!(problem.field, "subnets[0].pool");
    assert_eq!(
        problem.message,
        "start 10.66.200.250 is after end 10.66.200.1"
    );
}

#[test]
fn pool_covering_network_broadcast_or_router_is_refused() {
    for (pool, covered) in [
        (
            "{start: 10.66.0.0, end: 10.66.0.0}",
            "10.66.0.0, the network",
        ),
        (
            "{start: 10.66.255.0, end: 10.66.255.255}",
            "10.66.255.255, the broadcast",
        ),
        (
            "{start: 10.66.0.1, end: 10.66.0.20}",
            "10.66.0.1, the router",
        ),
    ] {
        let problem = one_problem(&with_pool(pool));
        assert_eq!(problem.field, "subnets[0].pool", "{pool}");
        assert!(problem.message.contains(covered), "{pool}: {problem}");
    }
    let all = problems(&with_pool("{start: 10.66.0.0, end: 10.66.255.255}"));
    assert_eq!(all.len(), 3, "{all:#?}");
}

#[test]
fn malformed_pool_addresses_are_refused_together() {
    let found = problems(&with_pool("{start: 10.66.200, end: pool-end}"));
    let fields: Vec<_> = found.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(fields, ["subnets[0].pool.start", "subnets[0].pool.end"]);
    assert!(
        found[0].message.contains("not an ipv4 address"),
        "{found:#?}"
    );
}

#[test]
fn reservation_inside_a_pool_is_refused() {
    let text = EXTENDED.replace("ip: 10.66.1.10", "ip: 10.66.200.7");
    let problem = one_problem(&text);
    assert_eq!(problem.host.as_deref(), Some("52:54:00:12:34:56"));
    assert_eq!(problem.field, "ip");
    assert!(
        problem
            .message
            .contains("inside the discovery pool 10.66.200.1-10.66.200.250 of subnets[0]"),
        "{problem}"
    );
    // Just outside both ends is fine.
    for ip in ["10.66.200.0", "10.66.200.251"] {
        parse(&EXTENDED.replace("ip: 10.66.1.10", &format!("ip: {ip}"))).expect(ip);
    }
}

#[test]
fn inspect_without_a_pool_is_refused() {
    let text = EXTENDED.replace("    pool: {start: 10.66.200.1, end: 10.66.200.250}\n", "");
    let problem = one_problem(&text);
    assert_eq!(problem.field, "discovery.policy");
    assert!(
        problem.message.contains("no subnet has a pool"),
        "{problem}"
    );
}

#[test]
fn inspect_without_a_profile_is_refused() {
    let text = EXTENDED.replace(" profile: inspector,", "");
    let problem = one_problem(&text);
    assert_eq!(problem.field, "discovery.profile");
    assert!(problem.message.contains("required"), "{problem}");
    let text = EXTENDED.replace("profile: inspector", "profile: inspecter");
    let problem = one_problem(&text);
    assert_eq!(problem.field, "discovery.profile");
    assert_eq!(
        problem.message,
        "unknown profile \"inspecter\" (known: worker, inspector)"
    );
}

#[test]
fn discovery_policy_and_lease_time_are_checked() {
    let text = EXTENDED.replace("policy: inspect", "policy: inspekt");
    let problem = one_problem(&text);
    assert_eq!(problem.field, "discovery.policy");
    assert!(problem.message.contains("\"inspekt\""), "{problem}");
    let problem = one_problem(&EXTENDED.replace("lease_time: 600", "lease_time: 0"));
    assert_eq!(problem.field, "discovery.lease_time");
}

#[test]
fn ignore_policy_needs_neither_pool_nor_profile() {
    let inventory = parse("subnets: []\nprofiles: []\nhosts: []\ndiscovery: {policy: ignore}\n")
        .expect("valid");
    assert_eq!(inventory.discovery, Discovery::default());
    let err = parse("subnets: []\nprofiles: []\nhosts: []\ndiscovery: {profile: x}\n")
        .expect_err("policy is required in the block");
    assert!(err.to_string().contains("missing field `policy`"), "{err}");
}

#[test]
fn phone_home_token_is_required_unless_turned_off() {
    assert_eq!(
        parse(EXTENDED).expect("valid").ipxe.phone_home_token,
        PhoneHomeToken::Required
    );
    let with = |value: &str| {
        EXTENDED.replace(
            "  user_class: iPXE-lab\n",
            &format!("  user_class: iPXE-lab\n  phone_home_token: {value}\n"),
        )
    };
    assert_eq!(
        parse(&with("required"))
            .expect("valid")
            .ipxe
            .phone_home_token,
        PhoneHomeToken::Required
    );
    assert_eq!(
        parse(&with("off")).expect("valid").ipxe.phone_home_token,
        PhoneHomeToken::Off
    );
    let problem = one_problem(&with("optional"));
    assert_eq!(problem.field, "ipxe.phone_home_token");
    assert!(problem.message.contains("required or off"), "{problem}");
}

#[test]
fn ipxe_user_class_must_fit_an_option() {
    let problem = one_problem(&EXTENDED.replace("user_class: iPXE-lab", "user_class: ''"));
    assert_eq!(problem.field, "ipxe.user_class");
    let long = "u".repeat(256);
    let problem = one_problem(&EXTENDED.replace("iPXE-lab", &long));
    assert_eq!(problem.field, "ipxe.user_class");
    assert!(problem.message.contains("255"), "{problem}");
}

#[test]
fn ipxe_script_must_be_an_http_url() {
    let problem = one_problem(&EXTENDED.replace(
        "script: \"https://{server}/boot/{mac}.ipxe\"",
        "script: boot.ipxe",
    ));
    assert_eq!(problem.field, "ipxe.script");
    assert!(problem.message.contains("http://"), "{problem}");
}

#[test]
fn ipxe_script_length_counts_server_and_mac_placeholders() {
    // "http://{server}/{mac}" is 21 bytes as written and 7 + 15 + 1 + 17
    // = 40 once expanded, so 215 more fit and 216 do not.
    let script = |pad: usize| {
        EXTENDED.replace(
            "\"https://{server}/boot/{mac}.ipxe\"",
            &format!("'http://{{server}}/{{mac}}{}'", "x".repeat(pad)),
        )
    };
    parse(&script(215)).expect("255 bytes once expanded");
    let problem = one_problem(&script(216));
    assert_eq!(problem.field, "ipxe.script");
    assert!(
        problem
            .message
            .contains("up to 256 once {server} and {mac}"),
        "{problem}"
    );
}

#[test]
fn profile_chain_must_be_a_short_http_url() {
    let text = EXTENDED.replace("http://installer.example/boot.ipxe", "boot.ipxe");
    let problem = one_problem(&text);
    assert_eq!(problem.field, "profiles[worker].chain");
    let long = format!("http://installer.example/{}", "c".repeat(231));
    let problem = one_problem(&EXTENDED.replace("http://installer.example/boot.ipxe", &long));
    assert_eq!(problem.field, "profiles[worker].chain");
    assert!(problem.message.contains("255"), "{problem}");
}

/// A profile `worker` whose only rule is `rule` (flow YAML).
fn with_rule(rule: &str) -> String {
    format!("subnets: []\nprofiles:\n  - name: worker\n    rules: [{rule}]\nhosts: []\n")
}

#[test]
fn rule_without_match_keys_is_refused() {
    for rule in [
        "{match: {}, options: {66: x}}",
        "{match: {arch: [], labels: {}}, options: {66: x}}",
        "{options: {66: x}}",
    ] {
        let problem = one_problem(&with_rule(rule));
        assert_eq!(problem.field, "profiles[worker].rules[0].match", "{rule}");
        assert!(
            problem.message.contains("matches every request"),
            "{problem}"
        );
    }
}

#[test]
fn rule_without_boot_or_options_is_refused() {
    for rule in ["{match: {arch: [7]}}", "{match: {arch: [7]}, boot: {}}"] {
        let problem = one_problem(&with_rule(rule));
        assert_eq!(problem.field, "profiles[worker].rules[0]", "{rule}");
        assert!(problem.message.contains("changes nothing"), "{problem}");
    }
}

#[test]
fn rule_match_strings_must_be_non_empty_and_fit_an_option() {
    let long = "v".repeat(256);
    let found = problems(&with_rule(&format!(
        "{{match: {{vendor_class: '', user_class: {long}, circuit_id: ''}}, options: {{66: x}}}}"
    )));
    let fields: Vec<_> = found.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "profiles[worker].rules[0].match.vendor_class",
            "profiles[worker].rules[0].match.user_class",
            "profiles[worker].rules[0].match.circuit_id",
        ]
    );
}

#[test]
fn rule_arch_outside_u16_is_a_syntax_error() {
    let err =
        parse(&with_rule("{match: {arch: [65536]}, options: {66: x}}")).expect_err("too large");
    assert!(matches!(err, LoadError::Syntax { .. }), "{err}");
}

#[test]
fn rule_options_and_boot_are_checked_like_hosts_and_profiles() {
    let long = "f".repeat(128);
    let found = problems(&with_rule(&format!(
        "{{match: {{arch: [7]}}, boot: {{uefi: {long}, http: tftp://x}}, options: {{53: 1, 42: [nope], 66: ok}}}}"
    )));
    let fields: Vec<_> = found.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "profiles[worker].rules[0].boot.uefi",
            "profiles[worker].rules[0].boot.http",
            "profiles[worker].rules[0].options.53",
            "profiles[worker].rules[0].options.42",
        ],
        "{found:#?}"
    );
    assert!(found[2].message.contains("message type"), "{found:#?}");
}

#[test]
fn rules_apply_through_boot_for_after_parsing() {
    let inventory = parse(EXTENDED).expect("valid");
    let host = inventory.host_by_mac(MAC1).expect("host");
    let profile = inventory.profile_of(host);
    let ipxe = parse_user_classes(b"\x04iPXE");
    let option82 = b"\x01\x0frack1-sw1-port3\x02\x04\x0a\x0b\x0c\x0d";
    let traits = Traits {
        arch: Some(7),
        vendor_class: Some(b"PXEClient:Arch:00007:UNDI:003016"),
        user_classes: &ipxe,
        circuit_id: circuit_id(option82),
    };
    let (boot, options) = profile.boot_for(&host.labels, &traits);
    assert_eq!(boot.expect("boot").uefi.as_deref(), Some("snponly.efi"));
    assert_eq!(options, BTreeMap::from([(66, b"10.66.0.1".to_vec())]));
    let bios = Traits {
        arch: Some(0),
        ..traits
    };
    let (boot, options) = profile.boot_for(&host.labels, &bios);
    assert_eq!(boot, profile.boot);
    assert!(options.is_empty());
}

#[test]
fn new_problems_are_reported_together_in_order() {
    let text = "subnets:\n  - {cidr: 10.66.0.0/16, pool: {start: 10.66.9.9, end: 10.66.0.1}}\n\
                    profiles:\n  - {name: w, chain: ftp://x, rules: [{match: {}}]}\n\
                    hosts: [{mac: 52:54:00:12:34:56, ip: 10.66.5.5, profile: w}]\n\
                    discovery: {policy: inspect, lease_time: 0}\n\
                    ipxe: {user_class: '', script: tftp://x}\n";
    let found = problems(text);
    let fields: Vec<_> = found
        .iter()
        .map(|p| (p.host.as_deref(), p.field.as_str()))
        .collect();
    assert_eq!(
        fields,
        [
            (None, "subnets[0].pool"),
            (None, "profiles[w].chain"),
            (None, "profiles[w].rules[0].match"),
            (None, "profiles[w].rules[0]"),
            (None, "discovery.profile"),
            (None, "discovery.lease_time"),
            (None, "ipxe.user_class"),
            (None, "ipxe.script"),
        ],
        "{found:#?}"
    );
}

#[test]
fn unquoted_mac_placeholder_gets_a_quoting_hint() {
    for text in [
        "subnets: []\nprofiles: []\nhosts: []\nipxe: {script: http://x/{mac}.ipxe}\n",
        "subnets: []\nprofiles: [{name: w, chain: http://{server}/c}]\nhosts: []\n",
    ] {
        let err = parse(text).expect_err("a flow mapping cannot hold {mac} unquoted");
        let message = err.to_string();
        assert!(
            message.contains("line") && message.contains("quote values"),
            "{message}"
        );
    }
}

#[test]
fn range_contains_len_and_display() {
    let pool = Range {
        start: Ipv4Addr::new(10, 66, 200, 1),
        end: Ipv4Addr::new(10, 66, 200, 250),
    };
    assert_eq!(pool.len(), 250);
    assert!(!pool.is_empty());
    assert!(pool.contains(Ipv4Addr::new(10, 66, 200, 1)));
    assert!(pool.contains(Ipv4Addr::new(10, 66, 200, 250)));
    assert!(!pool.contains(Ipv4Addr::new(10, 66, 200, 251)));
    assert!(!pool.contains(Ipv4Addr::new(10, 66, 200, 0)));
    assert_eq!(pool.to_string(), "10.66.200.1-10.66.200.250");
    assert_eq!(pool.addresses().count(), 250);
    assert_eq!(pool.addresses().last(), Some(pool.end));
    let single = Range {
        start: pool.start,
        end: pool.start,
    };
    assert_eq!(single.len(), 1);
    let everything = Range {
        start: Ipv4Addr::UNSPECIFIED,
        end: Ipv4Addr::BROADCAST,
    };
    assert_eq!(everything.len(), 1 << 32);
    let backwards = Range {
        start: pool.end,
        end: pool.start,
    };
    assert!(backwards.is_empty());
    assert_eq!(backwards.len(), 0);
    assert_eq!(backwards.addresses().count(), 0);
}

fn fleet(count: u32) -> Inventory {
    let mut inventory = parse(FULL).expect("valid");
    let template = Host::clone(&inventory.hosts[0]);
    inventory.hosts = (0..count)
        .map(|n| {
            let [_, a, b, c] = n.to_be_bytes();
            let mac = MacAddr([0x52, 0x54, 0x00, a, b, c]);
            Host {
                mac,
                macs: vec![mac],
                ip: Some((
                    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 66, 0, 2)) + n),
                    0,
                )),
                ..template.clone()
            }
        })
        .map(Arc::new)
        .collect();
    inventory
}

#[test]
fn host_by_mac_uses_the_index_built_by_reindex() {
    let mut inventory = fleet(50_000);
    inventory.reindex();
    assert_eq!(inventory.index.by_mac.len(), 50_000);
    for n in [0u32, 1, 31_337, 49_999] {
        let [_, a, b, c] = n.to_be_bytes();
        let host = inventory
            .host_by_mac(MacAddr([0x52, 0x54, 0x00, a, b, c]))
            .expect("known");
        assert_eq!(
            host.ipv4(),
            Some(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 66, 0, 2)) + n))
        );
    }
    assert!(
        inventory
            .host_by_mac(MacAddr([0x52, 0x54, 1, 0, 0, 0]))
            .is_none()
    );
}

#[test]
fn host_by_mac_survives_hosts_changed_after_parse() {
    let mut inventory = parse(FULL).expect("valid");
    assert_eq!(inventory.index.by_mac.len(), 1, "parse builds the index");
    let added = MacAddr([0x52, 0x54, 0, 0, 0, 9]);
    let mut host = Host::clone(&inventory.hosts[0]);
    host.mac = added;
    inventory.hosts.insert(0, Arc::new(host));
    // Stale index: node-1 moved to position 1 and `added` is unknown to it.
    assert_eq!(inventory.host_by_mac(MAC1).map(|h| h.mac), Some(MAC1));
    assert_eq!(inventory.host_by_mac(added).map(|h| h.mac), Some(added));
    inventory.hosts.remove(1);
    assert!(inventory.host_by_mac(MAC1).is_none());
    inventory.reindex();
    assert_eq!(inventory.host_by_mac(added).map(|h| h.mac), Some(added));
    assert!(inventory.host_by_mac(MAC1).is_none());
}

#[test]
fn equality_ignores_how_the_index_was_built() {
    let parsed = parse(FULL).expect("valid");
    let mut rebuilt = Inventory {
        index: HostIndex::default(),
        ..parsed.clone()
    };
    assert_eq!(parsed, rebuilt);
    rebuilt.reindex();
    assert_eq!(parsed, rebuilt);
}

/// A YAML double-quoted string that ends the line it is rendered on and
/// starts an iPXE shell.
const INJECTED: &str = r#""undionly.kpxe\n#!ipxe\nshell""#;

#[test]
fn control_characters_in_boot_strings_are_refused() {
    let url = r#""http://{server}/ipxe.efi\nshell""#;
    let cases = [
        (
            format!("{{name: w, boot: {{bios: {INJECTED}}}}}"),
            "profiles[w].boot.bios",
        ),
        (
            format!("{{name: w, boot: {{uefi: {INJECTED}}}}}"),
            "profiles[w].boot.uefi",
        ),
        (
            format!("{{name: w, boot: {{uefi_arm64: {INJECTED}}}}}"),
            "profiles[w].boot.uefi_arm64",
        ),
        (
            format!("{{name: w, boot: {{http: {url}}}}}"),
            "profiles[w].boot.http",
        ),
        (format!("{{name: w, chain: {url}}}"), "profiles[w].chain"),
        (format!("{{name: w, kernel: {url}}}"), "profiles[w].kernel"),
        (
            format!("{{name: w, kernel: vmlinuz, initrd: [a, {url}]}}"),
            "profiles[w].initrd[1]",
        ),
        (
            r#"{name: w, kernel: vmlinuz, cmdline: "console=ttyS0\r\nshell"}"#.to_owned(),
            "profiles[w].cmdline",
        ),
        (
            r#"{name: w, kernel: vmlinuz, cmdline: "console=ttyS0 \e[2J"}"#.to_owned(),
            "profiles[w].cmdline",
        ),
        (
            format!("{{name: w, rules: [{{match: {{arch: [7]}}, boot: {{uefi: {INJECTED}}}}}]}}"),
            "profiles[w].rules[0].boot.uefi",
        ),
        (
            format!("{{name: w, rules: [{{match: {{arch: [16]}}, boot: {{http: {url}}}}}]}}"),
            "profiles[w].rules[0].boot.http",
        ),
    ];
    for (profile, field) in cases {
        let text = format!("subnets: []\nprofiles: [{profile}]\nhosts: []\n");
        let problem = one_problem(&text);
        assert_eq!(problem.field, field, "{text}");
        assert!(problem.message.contains("control character"), "{problem}");
    }
    let script = format!("subnets: []\nprofiles: []\nhosts: []\nipxe: {{script: {url}}}\n");
    let problem = one_problem(&script);
    assert_eq!(problem.field, "ipxe.script");
    assert!(problem.message.contains("control character"), "{problem}");
}

#[test]
fn control_character_message_is_escaped_and_names_the_character() {
    let text =
        format!("subnets: []\nprofiles: [{{name: w, boot: {{bios: {INJECTED}}}}}]\nhosts: []\n");
    let err = parse(&text).expect_err("newline in a boot file");
    let shown = err.to_string();
    assert_eq!(
        shown,
        "invalid inventory /etc/pxe-agent/inventory.yaml (1 problem):\n  \
         field profiles[w].boot.bios: \"undionly.kpxe\\n#!ipxe\\nshell\" contains the control \
         character '\\n' at byte 13; control characters (newlines, tabs, escapes) are not allowed"
    );
}

#[test]
fn control_character_in_a_profile_name_is_refused_and_shown_escaped() {
    let text = "subnets: []\nprofiles: [{name: \"w\\n#!ipxe\", kernel: \"\"}]\nhosts: []\n";
    let found = problems(text);
    let fields: Vec<_> = found.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        ["profiles[0].name", "profiles[w\\n#!ipxe].kernel"],
        "{found:#?}"
    );
    assert!(found[0].message.contains("control character"), "{found:#?}");
}

#[test]
fn control_character_in_a_hostname_is_refused_and_shown_escaped() {
    let problem = one_problem(&with_hosts(
        "  - {mac: 52:54:00:12:34:56, ip: 10.66.1.10, profile: bare, hostname: \"n1\\e[2J\"}\n",
    ));
    assert_eq!(problem.field, "hostname");
    assert_eq!(
        problem.host.as_deref(),
        Some("n1\\u{1b}[2J (52:54:00:12:34:56)")
    );
    assert!(!problem.to_string().contains('\x1b'), "{problem}");
}

#[test]
fn control_character_in_a_label_is_refused() {
    let problem = one_problem(&with_hosts(
        "  - {mac: 52:54:00:12:34:56, ip: 10.66.1.10, profile: bare, labels: {rack: \"r1\\nshell\"}}\n",
    ));
    assert_eq!(problem.field, "labels.rack");
    assert!(problem.message.contains("control character"), "{problem}");
}

#[test]
fn option_with_a_value_of_the_wrong_format_is_refused_naming_host_field_and_format() {
    let err = parse(&with_hosts(
        "  - {mac: 52:54:00:12:34:56, ip: 10.66.1.10, hostname: node-1, profile: bare, options: {3: notanip}}\n",
    ))
    .expect_err("option 3 holds addresses");
    assert_eq!(
        err.to_string(),
        "invalid inventory /etc/pxe-agent/inventory.yaml (1 problem):\n  \
         host node-1 (52:54:00:12:34:56): field options.3: option 3 (router) holds one or more \
         ipv4 addresses (an address or a list); \"notanip\" is not one"
    );
    let problem = one_problem(&with_rule("{match: {arch: [7]}, options: {26: '1500'}}"));
    assert_eq!(problem.field, "profiles[worker].rules[0].options.26");
    assert!(
        problem.message.contains("2-byte unsigned integer"),
        "{problem}"
    );
}

#[test]
fn default_ipxe_script_follows_the_http_port_and_a_written_one_stays() {
    let mut inventory = parse(FULL).expect("valid");
    assert!(inventory.ipxe.default_script);
    inventory.use_http_port(9090);
    assert_eq!(
        inventory.ipxe.script,
        "http://{server}:9090/boot/{mac}.ipxe"
    );
    let mut written = parse(EXTENDED).expect("valid");
    assert!(!written.ipxe.default_script);
    written.use_http_port(9090);
    assert_eq!(written.ipxe.script, "https://{server}/boot/{mac}.ipxe");
}

/// Passwords for the `bmc` tests: files and environment variables that
/// exist only here.
struct FakeSecrets {
    files: HashMap<PathBuf, Vec<u8>>,
    vars: HashMap<String, String>,
}

impl oob::SecretSource for FakeSecrets {
    fn read_file(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        self.files
            .get(path)
            .cloned()
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
    }

    fn var(&self, name: &str) -> Option<std::ffi::OsString> {
        self.vars.get(name).map(Into::into)
    }
}

const BMC_SECRET: &str = "s3cr3t-bmc-pass";

fn secrets() -> FakeSecrets {
    FakeSecrets {
        files: HashMap::from([
            (
                PathBuf::from("/etc/pxe-agent/bmc/node-1.password"),
                format!("{BMC_SECRET}\n").into_bytes(),
            ),
            (PathBuf::from("/etc/pxe-agent/bmc/empty"), Vec::new()),
            (
                PathBuf::from("/etc/pxe-agent/bmc/long"),
                b"x".repeat(21).into_iter().collect(),
            ),
        ]),
        vars: HashMap::from([("NODE2_BMC".to_owned(), "env-secret".to_owned())]),
    }
}

fn parse_oob(text: &str) -> Result<Inventory, LoadError> {
    Inventory::parse_with(path(), text, &secrets())
}

fn oob_problems(text: &str) -> Vec<Problem> {
    match parse_oob(text) {
        Err(LoadError::Invalid { problems, .. }) => problems,
        other => panic!("expected validation problems, got {other:?}"),
    }
}

/// One host `node-1` with `block` (indented as host keys) and profile
/// `worker` with `profile` (indented as profile keys).
fn oob_host(profile: &str, block: &str) -> String {
    format!(
        "subnets: [{{cidr: 10.66.0.0/16}}]\n\
         profiles:\n  - name: worker\n{profile}\
         hosts:\n  - mac: \"52:54:00:12:34:56\"\n    ip: 10.66.1.10\n    hostname: node-1\n    profile: worker\n{block}"
    )
}

const NODE1_BMC: &str = "    bmc:
      address: ipmi://10.77.0.2:623
      username: admin
      password_file: /etc/pxe-agent/bmc/node-1.password
";

fn only_oob_problem(text: &str) -> Problem {
    let mut found = oob_problems(text);
    assert_eq!(found.len(), 1, "expected one problem, got {found:#?}");
    found.remove(0)
}

fn node1() -> Option<String> {
    Some("node-1 (52:54:00:12:34:56)".to_owned())
}

#[test]
fn bmc_and_recovery_blocks_parse_into_the_model() {
    let text = oob_host(
        "",
        "    bmc:
      address: ipmi://10.77.0.2:623
      username: admin
      password_file: /etc/pxe-agent/bmc/node-1.password
      boot_mode: uefi
    recovery:
      expect_boot: true
      deadline: 10m
      max_attempts: 3
      heartbeat: 5m
      after_boot: disk
      stages: {dhcp: 90s, boot_file: 1m, script: 1m30s}
",
    );
    let inventory = parse_oob(&text).expect("valid");
    let host = &inventory.hosts[0];
    let bmc = host.bmc.as_ref().expect("bmc");
    assert_eq!(
        bmc.address,
        crate::bmc::BmcAddress::Ipmi {
            host: "10.77.0.2".into(),
            port: 623
        }
    );
    assert_eq!(bmc.credentials.user(), "admin");
    assert_eq!(
        bmc.credentials.password().expose(),
        BMC_SECRET.as_bytes(),
        "read at load, without the file's trailing newline"
    );
    assert_eq!(bmc.boot_mode, BootMode::Uefi);
    assert_eq!(
        bmc.password_from,
        PasswordSource::File("/etc/pxe-agent/bmc/node-1.password".into())
    );
    assert_eq!(
        host.recovery.as_deref().copied(),
        Some(RecoverySettings {
            expect_boot: true,
            deadline: Duration::from_secs(600),
            max_attempts: 3,
            heartbeat: Some(Duration::from_secs(300)),
            after_boot: AfterBoot::Disk,
            stages: StageDeadlines {
                dhcp: Duration::from_secs(90),
                boot_file: Duration::from_secs(60),
                script: Duration::from_secs(90),
            },
        })
    );
    assert!(
        !format!("{inventory:?}").contains(BMC_SECRET),
        "the password never prints"
    );
}

#[test]
fn bmc_defaults_are_port_623_legacy_and_no_recovery() {
    let text = oob_host(
        "",
        "    bmc: {address: \"ipmi://bmc-1.rack3\", username: admin, password_env: NODE2_BMC}\n",
    );
    let inventory = parse_oob(&text).expect("valid");
    let host = &inventory.hosts[0];
    let bmc = host.bmc.as_ref().expect("bmc");
    assert_eq!(bmc.address.endpoint(), "bmc-1.rack3:623");
    assert_eq!(bmc.boot_mode, BootMode::Legacy);
    assert_eq!(bmc.credentials.password().expose(), b"env-secret");
    assert_eq!(host.recovery, None, "recovery only on request");
}

#[test]
fn recovery_block_defaults_fill_unset_keys() {
    let text = oob_host(
        "",
        &format!("{NODE1_BMC}    recovery: {{expect_boot: true}}\n"),
    );
    let recovery = parse_oob(&text).expect("valid").hosts[0]
        .recovery
        .as_deref()
        .copied();
    assert_eq!(
        recovery,
        Some(RecoverySettings {
            expect_boot: true,
            ..RecoverySettings::default()
        })
    );
    let defaults = RecoverySettings::default();
    assert_eq!(
        (defaults.deadline, defaults.max_attempts, defaults.heartbeat),
        (Duration::from_secs(600), 3, None)
    );
    assert_eq!(defaults.after_boot, AfterBoot::Disk);
    assert_eq!(
        defaults.stages,
        StageDeadlines {
            dhcp: Duration::from_secs(180),
            boot_file: Duration::from_secs(120),
            script: Duration::from_secs(120),
        }
    );
}

#[test]
fn profile_bmc_and_recovery_are_defaults_that_hosts_override() {
    let text = oob_host(
        "    bmc: {username: ops, password_file: /etc/pxe-agent/bmc/node-1.password, boot_mode: uefi}
    recovery: {expect_boot: true, deadline: 20m, heartbeat: 5m, max_attempts: 5}
",
        "    bmc: {address: ipmi://10.77.0.2, password_env: NODE2_BMC}
    recovery: {deadline: 15m, heartbeat: \"off\", after_boot: none}
",
    );
    let inventory = parse_oob(&text).expect("valid");
    let host = &inventory.hosts[0];
    let bmc = host.bmc.as_ref().expect("bmc");
    assert_eq!(bmc.credentials.user(), "ops", "from the profile");
    assert_eq!(bmc.boot_mode, BootMode::Uefi, "from the profile");
    assert_eq!(
        bmc.password_from,
        PasswordSource::Env("NODE2_BMC".into()),
        "the host's source replaces the profile's"
    );
    assert_eq!(
        host.recovery.as_deref().copied(),
        Some(RecoverySettings {
            expect_boot: true,
            deadline: Duration::from_secs(900),
            max_attempts: 5,
            heartbeat: None,
            after_boot: AfterBoot::None,
            stages: StageDeadlines::default(),
        })
    );
}

#[test]
fn relative_password_file_is_read_next_to_the_inventory() {
    let text = oob_host(
        "",
        "    bmc: {address: ipmi://10.77.0.2, username: admin, password_file: bmc/node-1.password}\n",
    );
    let inventory = parse_oob(&text).expect("valid");
    assert_eq!(
        inventory.hosts[0].bmc.as_ref().map(|b| &b.password_from),
        Some(&PasswordSource::File(
            "/etc/pxe-agent/bmc/node-1.password".into()
        ))
    );
}

#[test]
fn inline_password_is_refused_with_the_reason_and_not_echoed() {
    let text = oob_host(
        "",
        "    bmc: {address: ipmi://10.77.0.2, username: admin, password: hunter2}\n",
    );
    let problems = oob_problems(&text);
    let inline = problems
        .iter()
        .find(|p| p.field == "bmc.password")
        .expect("inline password refused");
    assert_eq!(inline.host, node1());
    assert!(
        inline.message.contains("inline passwords are refused")
            && inline.message.contains("password_file")
            && inline.message.contains("password_env"),
        "{inline}"
    );
    let all = format!("{:?}", parse_oob(&text).unwrap_err());
    assert!(!all.contains("hunter2"), "{all}");
    // In a profile too.
    let profile = oob_host("    bmc: {password: hunter2}\n", "");
    let problem = only_oob_problem(&profile);
    assert_eq!(problem.field, "profiles[worker].bmc.password");
}

#[test]
fn both_password_sources_are_refused() {
    let text = oob_host(
        "",
        "    bmc: {address: ipmi://10.77.0.2, username: admin, password_env: NODE2_BMC, password_file: /etc/pxe-agent/bmc/node-1.password}\n",
    );
    let problem = only_oob_problem(&text);
    assert_eq!(
        (problem.host, problem.field.as_str()),
        (node1(), "bmc.password_env")
    );
    assert!(problem.message.contains("not both"), "{}", problem.message);
}

#[test]
fn missing_password_file_names_file_host_and_field() {
    let text = oob_host(
        "",
        "    bmc: {address: ipmi://10.77.0.2, username: admin, password_file: /etc/pxe-agent/bmc/missing}\n",
    );
    let err = parse_oob(&text).expect_err("unreadable");
    let LoadError::Invalid { problems, .. } = &err else {
        panic!("expected problems, got {err:?}")
    };
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(problems[0].host, node1());
    assert_eq!(problems[0].field, "bmc.password_file");
    assert!(
        problems[0]
            .message
            .starts_with("cannot read password file /etc/pxe-agent/bmc/missing: "),
        "{}",
        problems[0].message
    );
    let shown = err.to_string();
    assert!(
        shown.contains("/etc/pxe-agent/inventory.yaml")
            && shown.contains("host node-1 (52:54:00:12:34:56): field bmc.password_file"),
        "{shown}"
    );
}

#[test]
fn real_unreadable_password_file_is_a_problem() {
    // Through the real file system: a directory cannot be read as a file.
    let text = oob_host(
        "",
        &format!(
            "    bmc: {{address: ipmi://10.77.0.2, username: admin, password_file: {}}}\n",
            std::env::temp_dir().display()
        ),
    );
    let err = parse(&text).expect_err("a directory");
    let LoadError::Invalid { problems, .. } = &err else {
        panic!("expected problems, got {err:?}")
    };
    assert_eq!(problems[0].field, "bmc.password_file", "{problems:#?}");
}

#[test]
fn empty_password_file_is_refused() {
    let text = oob_host(
        "",
        "    bmc: {address: ipmi://10.77.0.2, username: admin, password_file: /etc/pxe-agent/bmc/empty}\n",
    );
    let problem = only_oob_problem(&text);
    assert_eq!(problem.field, "bmc.password_file");
    assert!(problem.message.contains("is empty"), "{}", problem.message);
}

#[test]
fn unset_password_variable_is_a_problem() {
    let text = oob_host(
        "",
        "    bmc: {address: ipmi://10.77.0.2, username: admin, password_env: NOT_SET_ANYWHERE}\n",
    );
    let problem = only_oob_problem(&text);
    assert_eq!(
        (problem.host, problem.field.as_str()),
        (node1(), "bmc.password_env")
    );
    assert_eq!(
        problem.message,
        "environment variable NOT_SET_ANYWHERE is not set"
    );
}

#[test]
fn password_longer_than_ipmi_allows_is_refused_without_its_content() {
    let text = oob_host(
        "",
        "    bmc: {address: ipmi://10.77.0.2, username: admin, password_file: /etc/pxe-agent/bmc/long}\n",
    );
    let problem = only_oob_problem(&text);
    assert_eq!(problem.field, "bmc.password_file");
    assert!(
        problem.message.contains("longer than 20 bytes") && !problem.message.contains("xxx"),
        "{}",
        problem.message
    );
}

#[test]
fn missing_or_bad_bmc_keys_are_named() {
    let missing = oob_problems(&oob_host("", "    bmc: {boot_mode: bios}\n"));
    let fields: Vec<&str> = missing.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "bmc.address",
            "bmc.username",
            "bmc.boot_mode",
            "bmc.password_file"
        ],
        "{missing:#?}"
    );
    assert!(missing[2].message.contains("expected legacy or uefi"));
    let bad = only_oob_problem(&oob_host(
        "",
        &NODE1_BMC.replace("ipmi://10.77.0.2:623", "ipmi://10.77.0.2:99999"),
    ));
    assert_eq!(bad.field, "bmc.address");
    assert!(bad.message.contains("invalid port"), "{}", bad.message);
    let scheme = only_oob_problem(&oob_host("", &NODE1_BMC.replace("ipmi://", "idrac://")));
    assert!(scheme.message.contains("unknown BMC address scheme"));
    let user = only_oob_problem(&oob_host("", &NODE1_BMC.replace("admin", &"u".repeat(17))));
    assert_eq!(user.field, "bmc.username");
}

#[test]
fn bmc_address_in_a_profile_is_refused() {
    let problem = only_oob_problem(&oob_host(
        "    bmc: {address: ipmi://10.77.0.2}\n",
        NODE1_BMC,
    ));
    assert_eq!(
        (problem.host, problem.field.as_str()),
        (None, "profiles[worker].bmc.address")
    );
}

#[test]
fn bad_recovery_values_are_named() {
    let text = oob_host(
        "",
        &format!(
            "{NODE1_BMC}    recovery: {{deadline: 10, heartbeat: 5x, max_attempts: 0, after_boot: pxe, stages: {{dhcp: 100ms}}}}\n"
        ),
    );
    let problems = oob_problems(&text);
    let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "recovery.deadline",
            "recovery.heartbeat",
            "recovery.stages.dhcp",
            "recovery.max_attempts",
            "recovery.after_boot"
        ],
        "{problems:#?}"
    );
    assert!(problems.iter().all(|p| p.host == node1()));
    assert!(problems[0].message.contains("not a duration"));
    assert!(problems[2].message.contains("minimum of 1s"));
    assert!(problems[3].message.contains("out of range 1..=100"));
}

#[test]
fn bad_profile_recovery_is_reported_once_with_the_profile() {
    let problem = only_oob_problem(&oob_host("    recovery: {deadline: soon}\n", NODE1_BMC));
    assert_eq!(
        (problem.host, problem.field.as_str()),
        (None, "profiles[worker].recovery.deadline")
    );
}

#[test]
fn recovery_without_a_bmc_is_refused() {
    let problem = only_oob_problem(&oob_host("", "    recovery: {expect_boot: true}\n"));
    assert_eq!((problem.host, problem.field.as_str()), (node1(), "bmc"));
    // A profile's recovery block applies to every host of it.
    let problem = only_oob_problem(&oob_host("    recovery: {expect_boot: true}\n", ""));
    assert_eq!(problem.field, "bmc");
}

#[test]
fn unknown_keys_in_bmc_and_recovery_are_syntax_errors() {
    let err = parse_oob(&oob_host("", "    bmc: {adress: ipmi://x}\n")).expect_err("typo");
    assert!(err.to_string().contains("unknown field `adress`"), "{err}");
    let err = parse_oob(&oob_host("", "    recovery: {deadlin: 1m}\n")).expect_err("typo");
    assert!(err.to_string().contains("unknown field `deadlin`"), "{err}");
}

#[test]
fn redfish_bmc_takes_ca_file_or_insecure() {
    let text = oob_host(
        "",
        "    bmc:
      address: redfish://10.77.0.2/redfish/v1/Systems/1
      username: admin
      password_file: /etc/pxe-agent/bmc/node-1.password
      ca_file: /etc/pxe-agent/bmc-ca.pem
",
    );
    let inventory = parse_oob(&text).expect("valid");
    let bmc = inventory.hosts[0].bmc.as_ref().expect("bmc");
    assert_eq!(
        bmc.tls.ca_file.as_deref(),
        Some(Path::new("/etc/pxe-agent/bmc-ca.pem"))
    );
    assert!(!bmc.tls.insecure, "never the default");

    let text = oob_host(
        "    bmc: {insecure: true}\n",
        "    bmc:
      address: redfish+https://10.77.0.2:8443
      username: admin
      password_file: /etc/pxe-agent/bmc/node-1.password
",
    );
    let inventory = parse_oob(&text).expect("valid");
    let bmc = inventory.hosts[0].bmc.as_ref().expect("bmc");
    assert!(bmc.tls.insecure, "from the profile");
}

#[test]
fn tls_settings_outside_redfish_over_https_are_refused() {
    for (address, key) in [
        ("ipmi://10.77.0.2", "ca_file: /etc/ca.pem"),
        ("redfish+http://10.77.0.2", "insecure: true"),
    ] {
        let problem = only_oob_problem(&oob_host(
            "",
            &format!(
                "    bmc:
      address: {address}
      username: admin
      password_file: /etc/pxe-agent/bmc/node-1.password
      {key}
"
            ),
        ));
        assert!(
            problem.message.contains("Redfish over HTTPS only"),
            "{problem:?}"
        );
    }
    let problem = only_oob_problem(&oob_host(
        "",
        "    bmc:
      address: redfish://10.77.0.2
      username: admin
      password_file: /etc/pxe-agent/bmc/node-1.password
      ca_file: /etc/ca.pem
      insecure: true
",
    ));
    assert!(problem.message.contains("not both"), "{problem:?}");
}

#[test]
fn subnet_mode_defaults_to_server_and_proxy_refuses_a_pool() {
    let inv = parse(&with_hosts(
        "  - {mac: \"52:54:00:00:00:01\", ip: 10.66.1.10, profile: worker}\n",
    ))
    .expect("valid");
    assert_eq!(inv.subnets[0].mode, SubnetMode::Server);
    let proxy = "subnets:\n  - {cidr: 10.66.0.0/16, mode: proxy}\nprofiles:\n  - name: worker\n    \
                 boot: {bios: undionly.kpxe}\nhosts:\n  - {mac: \"52:54:00:00:00:01\", ip: 10.66.1.10, profile: worker}\n";
    assert_eq!(
        parse(proxy).expect("valid").subnets[0].mode,
        SubnetMode::Proxy
    );
    let with_pool = proxy.replace(
        "mode: proxy}",
        "mode: proxy, pool: {start: 10.66.200.1, end: 10.66.200.9}}",
    );
    let problem = one_problem(&with_pool).to_string();
    assert!(
        problem.contains("subnets[0].pool") && problem.contains("mode proxy"),
        "{problem}"
    );
    let unknown = proxy.replace("mode: proxy", "mode: relay");
    assert!(parse(&unknown).is_err());
}

const FALLBACK_BMC: &str = "    bmc:
      address: redfish+https://10.77.0.2/redfish/v1/Systems/1
      ipmi: ipmi://10.77.0.2:623
      username: admin
      password_file: /etc/pxe-agent/bmc/node-1.password
";

#[test]
fn redfish_with_an_ipmi_address_falls_back_in_the_default_order() {
    let inventory = parse_oob(&oob_host("", FALLBACK_BMC)).expect("valid");
    let bmc = inventory.hosts[0].bmc.as_ref().expect("bmc");
    let fallback = bmc.fallback.as_ref().expect("fallback");
    assert_eq!(
        fallback.ipmi,
        crate::bmc::BmcAddress::Ipmi {
            host: "10.77.0.2".into(),
            port: 623
        }
    );
    assert_eq!(fallback.first, DriverKind::Redfish);
    assert_eq!(fallback.hold, Duration::from_secs(600));
    assert_eq!(fallback.host, "node-1");
    // The single-address form is unchanged.
    let plain = parse_oob(&oob_host("", NODE1_BMC)).expect("valid");
    assert_eq!(plain.hosts[0].bmc.as_ref().unwrap().fallback, None);
}

#[test]
fn drivers_order_and_hold_come_from_the_host_over_its_profile() {
    let text = oob_host(
        "    bmc: {drivers: [ipmi, redfish], fallback_hold: 30s}\n",
        &format!("{FALLBACK_BMC}      fallback_hold: 2m\n"),
    );
    let inventory = parse_oob(&text).expect("valid");
    let fallback = inventory.hosts[0].bmc.as_ref().unwrap().fallback.clone();
    let fallback = fallback.expect("fallback");
    assert_eq!(fallback.first, DriverKind::Ipmi, "from the profile");
    assert_eq!(fallback.hold, Duration::from_secs(120), "the host's own");
}

#[test]
fn inconsistent_driver_settings_name_host_and_field() {
    let cases = [
        (
            "    bmc: {address: ipmi://10.77.0.2, ipmi: ipmi://10.77.0.3, username: admin, password_env: NODE2_BMC}\n",
            "bmc.ipmi",
            "already an IPMI address",
        ),
        (
            "    bmc: {address: redfish://10.77.0.2, ipmi: redfish://10.77.0.3, username: admin, password_env: NODE2_BMC}\n",
            "bmc.ipmi",
            "must be an ipmi:// address",
        ),
        (
            "    bmc: {address: redfish://10.77.0.2, drivers: [redfish, ipmi], username: admin, password_env: NODE2_BMC}\n",
            "bmc.drivers",
            "set bmc.ipmi",
        ),
        (
            "    bmc: {address: redfish://10.77.0.2, ipmi: ipmi://10.77.0.2, drivers: [redfish], username: admin, password_env: NODE2_BMC}\n",
            "bmc.drivers",
            "lists only redfish",
        ),
        (
            "    bmc: {address: redfish://10.77.0.2, ipmi: ipmi://10.77.0.2, drivers: [redfish, redfish], username: admin, password_env: NODE2_BMC}\n",
            "bmc.drivers",
            "twice",
        ),
        (
            "    bmc: {address: redfish://10.77.0.2, ipmi: ipmi://10.77.0.2, drivers: [redfish, snmp], username: admin, password_env: NODE2_BMC}\n",
            "bmc.drivers",
            "unknown driver \"snmp\"",
        ),
        (
            "    bmc: {address: redfish://10.77.0.2, fallback_hold: 5m, username: admin, password_env: NODE2_BMC}\n",
            "bmc.fallback_hold",
            "two drivers",
        ),
        (
            "    bmc: {address: redfish://10.77.0.2, ipmi: ipmi://10.77.0.2, fallback_hold: soon, username: admin, password_env: NODE2_BMC}\n",
            "bmc.fallback_hold",
            "not a duration",
        ),
    ];
    for (block, field, says) in cases {
        let problem = only_oob_problem(&oob_host("", block));
        assert_eq!(
            (problem.host.clone(), problem.field.as_str()),
            (node1(), field),
            "{block}"
        );
        assert!(problem.message.contains(says), "{block}: {problem}");
    }
    let profile = only_oob_problem(&oob_host("    bmc: {ipmi: ipmi://10.77.0.2}\n", ""));
    assert_eq!(profile.field, "profiles[worker].bmc.ipmi");
}

#[test]
fn ipmi_password_limit_applies_only_to_hosts_spoken_to_over_ipmi() {
    let long = "      password_file: /etc/pxe-agent/bmc/long\n";
    let redfish_only = oob_host(
        "",
        &format!(
            "    bmc:\n      address: redfish://10.77.0.2/redfish/v1/Systems/1\n      username: a-long-redfish-user-name\n{long}"
        ),
    );
    let inventory = parse_oob(&redfish_only).expect("a long Redfish password is fine");
    let bmc = inventory.hosts[0].bmc.as_ref().unwrap();
    assert_eq!(bmc.credentials.password().expose().len(), 21);

    let with_ipmi = oob_host(
        "",
        &format!(
            "    bmc:\n      address: redfish://10.77.0.2/redfish/v1/Systems/1\n      ipmi: ipmi://10.77.0.2\n      username: admin\n{long}"
        ),
    );
    let problem = only_oob_problem(&with_ipmi);
    assert_eq!(problem.field, "bmc.password_file");
    assert!(
        problem.message.contains("longer than 20 bytes") && problem.message.contains("bmc.ipmi"),
        "{problem}"
    );
}

/// An inventory with one grub profile; `@GRUB@` and `@URLS@` are filled in.
const GRUB: &str = "subnets: [{cidr: 10.66.0.0/16}]
profiles:
  - name: secure
    boot: {uefi: shimx64.efi}
    grub: @GRUB@
@URLS@
hosts: [{mac: '52:54:00:12:34:60', ip: 10.66.1.20, profile: secure}]
";

fn grub_inventory(grub: &str, urls: &str) -> String {
    GRUB.replace("@GRUB@", grub).replace("@URLS@", urls)
}

const GRUB_URLS: &str = "    kernel: tftp://{server}/vmlinuz
    initrd: ['http://{server}:8080/artifacts/initrd.img']
    cmdline: console=ttyS0";

#[test]
fn grub_profile_defaults_to_debians_config_name() {
    let inv = parse(&grub_inventory("{}", GRUB_URLS)).expect("valid");
    assert_eq!(
        inv.profiles[0].grub,
        Some(GrubSettings {
            config: "grub/grub.cfg".into()
        })
    );
    let inv = parse(&grub_inventory(
        "{config: /debian-installer/amd64/grub/grub.cfg}",
        GRUB_URLS,
    ))
    .expect("valid");
    assert_eq!(
        inv.profiles[0].grub.as_ref().map(|g| g.config.as_str()),
        Some("debian-installer/amd64/grub/grub.cfg")
    );
    let plain = GRUB
        .replace("    grub: @GRUB@\n", "")
        .replace("@URLS@", GRUB_URLS);
    assert_eq!(parse(&plain).expect("valid").profiles[0].grub, None);
}

#[test]
fn grub_profile_problems_name_the_field() {
    for (config, why) in [
        ("'grub/'", "names no file"),
        ("../grub.cfg", "`..`"),
        ("'grub/my grub.cfg'", "whitespace"),
    ] {
        let problem = one_problem(&grub_inventory(&format!("{{config: {config}}}"), GRUB_URLS));
        assert_eq!(problem.field, "profiles[secure].grub.config", "{problem}");
        assert!(problem.message.contains(why), "{problem}");
    }
    let https = GRUB_URLS.replace("tftp://{server}/vmlinuz", "https://{server}/vmlinuz");
    let problem = one_problem(&grub_inventory("{}", &https));
    assert_eq!(problem.field, "profiles[secure].kernel");
    assert!(problem.message.contains("tftp:// or http://"), "{problem}");
    let relative = GRUB_URLS.replace("'http://{server}:8080/artifacts/initrd.img'", "initrd.img");
    let problem = one_problem(&grub_inventory("{}", &relative));
    assert_eq!(problem.field, "profiles[secure].initrd[0]");
    let chained = "    chain: http://{server}/x.ipxe";
    let problem = one_problem(&grub_inventory("{}", chained));
    assert_eq!(problem.field, "profiles[secure].chain");
    assert!(problem.message.contains("grub cannot chain"), "{problem}");
    let unknown = parse(&grub_inventory("{prefix: /grub}", GRUB_URLS)).expect_err("unknown key");
    assert!(unknown.to_string().contains("prefix"), "{unknown}");
}

#[test]
fn subnet_and_profile_options_are_checked_as_a_hosts_are() {
    let text = r#"
subnets:
  - {cidr: 10.66.0.0/16, options: {42: 10.66.0.4, 53: 1, 3: notanip}}
  - {cidr: "fd00:66::/64", options: {42: 10.66.0.4}}
profiles:
  - {name: worker, options: {15: lab.example, 51: 60, 300: x, 26: "1500"}}
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.1, profile: worker, options: {53: 1}}
"#;
    let found = problems(text);
    let fields: Vec<_> = found.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "subnets[0].options.53",
            "subnets[0].options.3",
            "subnets[1].options",
            "profiles[worker].options.51",
            "profiles[worker].options.300",
            "profiles[worker].options.26",
            "options.53",
        ],
        "{found:#?}"
    );
    // The same words as for a host, from the same code path.
    assert_eq!(found[0].message, found[6].message);
    assert!(found[0].host.is_none() && found[6].host.is_some());
    assert!(found[1].message.contains("option 3 (router)"), "{found:#?}");
    assert!(found[2].message.contains("DHCPv4"), "{found:#?}");
    assert!(found[3].message.contains("lease_time"), "{found:#?}");
    assert!(
        found[5].message.contains("2-byte unsigned integer"),
        "{found:#?}"
    );
}

#[test]
fn subnet_and_profile_options_are_encoded_into_the_model() {
    let inventory = parse(
        r#"
subnets:
  - {cidr: 10.66.0.0/16, options: {42: [10.66.0.4, 10.66.0.5], 15: lab.example}}
profiles:
  - {name: worker, options: {26: 1500, 224: rack}}
hosts: []
"#,
    )
    .expect("valid");
    assert_eq!(
        inventory.subnets[0].options,
        BTreeMap::from([
            (15, b"lab.example".to_vec()),
            (42, vec![10, 66, 0, 4, 10, 66, 0, 5]),
        ])
    );
    assert_eq!(
        inventory.profiles[0].options,
        BTreeMap::from([(26, vec![0x05, 0xdc]), (224, b"rack".to_vec())])
    );
    // What rules build on: a profile's boot_for starts from its options.
    let (_, options) = inventory.profiles[0].boot_for(&BTreeMap::new(), &Traits::default());
    assert_eq!(options, inventory.profiles[0].options);
}

//! Objects to document: every field of the file format through its
//! camelCase twin, problems pinned on the objects they came from.

use std::{
    ffi::OsString,
    io,
    path::{Path, PathBuf},
};

use serde_json::{Value, json};

use super::*;
use crate::inventory::{Inventory, SecretSource};

const LABEL: &str = "kubernetes namespace/lab";

/// The inventory, as a file, with every key the format has (profiles in
/// name order, as the objects come).
const FILE: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    dns: [10.66.0.2, 10.66.0.3]
    domain: lab.example
    lease_time: 600
    pool: {start: 10.66.200.1, end: 10.66.200.50}
    options: {42: [10.66.0.4, 10.66.0.5], 26: 9000}
profiles:
  - name: chained
    chain: "http://{server}:8080/chain/{mac}.ipxe"
    local_disk: true
    netboot: once
  - name: worker
    boot:
      bios: undionly.kpxe
      uefi: ipxe.efi
      uefi_arm64: ipxe-arm64.efi
      http: "http://{server}:8080/ipxe.efi"
      http_arm64: "http://{server}:8080/ipxe-arm64.efi"
      http_ia32: "http://{server}:8080/ipxe-ia32.efi"
    kernel: "http://{server}:8080/artifacts/vmlinuz"
    initrd: ["http://{server}:8080/artifacts/initrd.img"]
    cmdline: console=ttyS0
    grub: {config: boot/grub/grub.cfg}
    options: {15: workers.lab.example, 224: worker}
    rules:
      - match:
          arch: [7, 9]
          vendor_class: PXEClient
          user_class: iPXE
          circuit_id: eth0
          labels: {rack: r1}
        boot: {uefi: special.efi}
        options: {66: 10.66.0.9}
    bmc: {username: admin, boot_mode: uefi}
    recovery:
      expect_boot: true
      deadline: 10m
      max_attempts: 2
      heartbeat: 1h
      after_boot: disk
      stages: {dhcp: 2m, boot_file: 1m, script: 1m}
hosts:
  - mac: 52:54:00:12:34:56
    ip: 10.66.1.10
    hostname: node-1
    profile: worker
    labels: {rack: r1}
    options: {42: 10.66.0.5, 252: "http://wpad"}
    bmc:
      address: ipmi://10.77.0.2:623
      username: root
      password_env: kubernetes Secret bmc-node-1
      boot_mode: legacy
    recovery: {expect_boot: false, max_attempts: 3, after_boot: none}
    netboot: never
  - macs: [52:54:00:12:34:57, 52:54:00:12:34:58]
    ip: 10.66.1.11
    profile: chained
discovery: {policy: inspect, profile: worker, lease_time: 300, lease_key: client_id}
ipxe: {user_class: iPXE, script: "http://{server}:8080/boot/{mac}.ipxe"}
"#;

fn object(kind: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "pxe-agent.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "lab", "generation": 1},
        "spec": spec,
    })
}

/// The same inventory as objects.
fn snapshot() -> Snapshot {
    let mut s = Snapshot {
        namespace: "lab".into(),
        ..Snapshot::default()
    };
    s.networks.insert(
        "lab".into(),
        object(
            "BootNetwork",
            "lab",
            json!({
                "subnets": [{
                    "cidr": "10.66.0.0/16", "router": "10.66.0.1",
                    "dns": ["10.66.0.2", "10.66.0.3"], "domain": "lab.example",
                    "leaseTime": 600, "pool": {"start": "10.66.200.1", "end": "10.66.200.50"},
                    "options": {"42": ["10.66.0.4", "10.66.0.5"], "26": 9000},
                }],
                "discovery": {"policy": "inspect", "profile": "worker", "leaseTime": 300,
                              "leaseKey": "client_id"},
                "ipxe": {"userClass": "iPXE", "script": "http://{server}:8080/boot/{mac}.ipxe"},
            }),
        ),
    );
    s.profiles.insert(
        "worker".into(),
        object(
            "BootProfile",
            "worker",
            json!({
                "boot": {
                    "bios": "undionly.kpxe", "uefi": "ipxe.efi", "uefiArm64": "ipxe-arm64.efi",
                    "http": "http://{server}:8080/ipxe.efi",
                    "httpArm64": "http://{server}:8080/ipxe-arm64.efi",
                    "httpIa32": "http://{server}:8080/ipxe-ia32.efi",
                },
                "kernel": "http://{server}:8080/artifacts/vmlinuz",
                "initrd": ["http://{server}:8080/artifacts/initrd.img"],
                "cmdline": "console=ttyS0",
                "grub": {"config": "boot/grub/grub.cfg"},
                "options": {"15": "workers.lab.example", "224": "worker"},
                "rules": [{
                    "match": {"arch": [7, 9], "vendorClass": "PXEClient", "userClass": "iPXE",
                              "circuitId": "eth0", "labels": {"rack": "r1"}},
                    "boot": {"uefi": "special.efi"},
                    "options": {"66": "10.66.0.9"},
                }],
                "bmc": {"bootMode": "uefi", "credentialsName": "bmc-admin"},
                "recovery": {
                    "expectBoot": true, "deadline": "10m", "maxAttempts": 2, "heartbeat": "1h",
                    "afterBoot": "disk",
                    "stages": {"dhcp": "2m", "bootFile": "1m", "script": "1m"},
                },
            }),
        ),
    );
    s.profiles.insert(
        "chained".into(),
        object(
            "BootProfile",
            "chained",
            json!({"chain": "http://{server}:8080/chain/{mac}.ipxe", "localDisk": true,
                   "netboot": "once"}),
        ),
    );
    s.hosts.insert(
        "node-1".into(),
        object(
            "BootHost",
            "node-1",
            json!({
                "mac": "52:54:00:12:34:56", "ip": "10.66.1.10", "hostname": "node-1",
                "profile": "worker", "labels": {"rack": "r1"},
                "options": {"42": "10.66.0.5", "252": "http://wpad"},
                "bmc": {"address": "ipmi://10.77.0.2:623", "credentialsName": "bmc-node-1",
                        "bootMode": "legacy"},
                "recovery": {"expectBoot": false, "maxAttempts": 3, "afterBoot": "none"},
                "netboot": "never",
            }),
        ),
    );
    s.hosts.insert(
        "node-2".into(),
        object(
            "BootHost",
            "node-2",
            json!({"macs": ["52:54:00:12:34:57", "52:54:00:12:34:58"], "ip": "10.66.1.11",
                   "profile": "chained"}),
        ),
    );
    for (name, user) in [("bmc-node-1", "root"), ("bmc-admin", "admin")] {
        s.secrets.insert(
            name.into(),
            SecretKeys {
                username: Some(user.into()),
                password: Some(Password::new(b"s3cret-pw".to_vec())),
            },
        );
    }
    s
}

/// The file's password for the same Secret.
struct FileSecrets;

impl SecretSource for FileSecrets {
    fn read_file(&self, _: &Path) -> io::Result<Vec<u8>> {
        Err(io::ErrorKind::NotFound.into())
    }

    fn var(&self, name: &str) -> Option<OsString> {
        (name == "kubernetes Secret bmc-node-1").then(|| OsString::from("s3cret-pw"))
    }
}

fn build_plain(s: &Snapshot) -> Built<Inventory> {
    build(s, Path::new(LABEL), &|inv, _| Ok(inv))
}

#[test]
fn camel_case_keys_become_the_files() {
    assert_eq!(snake("uefiArm64"), "uefi_arm64");
    assert_eq!(snake("httpIa32"), "http_ia32");
    assert_eq!(snake("bootFile"), "boot_file");
    assert_eq!(snake("cidr"), "cidr");
}

#[test]
fn objects_with_every_field_equal_the_same_inventory_as_a_file() {
    let built = build_plain(&snapshot());
    assert!(built.refused.is_empty(), "{:#?}", built.refused);
    let from_objects = built.result.expect("valid");
    let from_file =
        Inventory::parse_with(Path::new("inventory.yaml"), FILE, &FileSecrets).expect("file");
    assert_eq!(from_objects, from_file);
    assert_eq!(built.accepted.len(), 5);
    // Subnet and profile options come through, codes as integers.
    assert_eq!(
        from_objects.subnets[0].options[&42],
        [10, 66, 0, 4, 10, 66, 0, 5]
    );
    assert_eq!(from_objects.subnets[0].options[&26], [0x23, 0x28]);
    let worker = from_objects
        .profiles
        .iter()
        .find(|p| p.name == "worker")
        .expect("worker");
    assert_eq!(worker.options[&15], b"workers.lab.example");
    let bmc = from_objects.hosts[0].bmc.as_ref().expect("bmc");
    assert_eq!(bmc.credentials.password().expose(), b"s3cret-pw");
}

#[test]
fn bmc_ca_file_and_insecure_reach_the_redfish_tls_settings() {
    let tls_of = |bmc: Value| {
        let mut s = snapshot();
        s.hosts.get_mut("node-1").expect("node-1")["spec"]["bmc"] = bmc;
        let built = build_plain(&s);
        assert!(built.refused.is_empty(), "{:#?}", built.refused);
        let inv = built.result.expect("valid");
        let host = inv
            .hosts
            .iter()
            .find(|h| h.hostname.as_deref() == Some("node-1"))
            .expect("node-1");
        host.bmc.as_ref().expect("bmc").tls.clone()
    };
    let tls = tls_of(json!({
        "address": "redfish://10.77.0.2/redfish/v1/Systems/1",
        "credentialsName": "bmc-node-1",
        "caFile": "/etc/pxe-agent/bmc-ca.pem",
    }));
    assert_eq!(
        tls.ca_file,
        Some(PathBuf::from("/etc/pxe-agent/bmc-ca.pem"))
    );
    assert!(!tls.insecure);
    let tls = tls_of(json!({
        "address": "redfish+https://10.77.0.2:8443",
        "credentialsName": "bmc-node-1",
        "insecure": true,
    }));
    assert!(tls.insecure && tls.ca_file.is_none());
}

#[test]
fn bmc_ipmi_drivers_and_fallback_hold_reach_the_fallback_settings() {
    let mut s = snapshot();
    s.hosts.get_mut("node-1").expect("node-1")["spec"]["bmc"] = json!({
        "address": "redfish://10.77.0.2/redfish/v1/Systems/1",
        "ipmi": "ipmi://10.77.0.2:623",
        "drivers": ["ipmi", "redfish"],
        "fallbackHold": "90s",
        "credentialsName": "bmc-node-1",
    });
    let built = build_plain(&s);
    assert!(built.refused.is_empty(), "{:#?}", built.refused);
    let inv = built.result.expect("valid");
    let host = inv
        .hosts
        .iter()
        .find(|h| h.hostname.as_deref() == Some("node-1"))
        .expect("node-1");
    let fallback = host.bmc.as_ref().expect("bmc").fallback.clone();
    let fallback = fallback.expect("fallback");
    assert_eq!(fallback.first, crate::inventory::DriverKind::Ipmi);
    assert_eq!(fallback.hold, std::time::Duration::from_secs(90));
    assert_eq!(fallback.ipmi.to_string(), "ipmi://10.77.0.2:623");
}

#[test]
fn the_password_never_reaches_a_debug_print_or_a_message() {
    let mut s = snapshot();
    let built = build_plain(&s);
    let text = format!("{built:?}{s:?}");
    assert!(!text.contains("s3cret-pw"), "password in a Debug print");
    // A missing key names the Secret and key, not a value.
    s.secrets.get_mut("bmc-node-1").expect("secret").password = None;
    let built = build_plain(&s);
    let problems = &built.refused[&ObjRef::new(Kind::BootHost, "node-1")];
    assert_eq!(
        problems,
        &vec![r#"bmc.credentialsName: Secret lab/bmc-node-1 has no key "password""#.to_owned()]
    );
    assert!(!format!("{built:?}").contains("s3cret-pw"));
}

#[test]
fn a_bad_host_is_refused_and_the_others_kept() {
    let mut s = snapshot();
    s.hosts.get_mut("node-2").expect("node-2")["spec"]["ip"] = "10.99.0.1".into();
    s.secrets.remove("bmc-node-1");
    let built = build_plain(&s);
    let inv = built.result.expect("the rest is valid");
    assert!(inv.hosts.is_empty(), "{:?}", inv.hosts);
    assert_eq!(
        built.refused[&ObjRef::new(Kind::BootHost, "node-2")],
        vec!["host 52:54:00:12:34:57: field ip: 10.99.0.1 is outside every subnet".to_owned()]
    );
    assert_eq!(
        built.refused[&ObjRef::new(Kind::BootHost, "node-1")],
        vec!["bmc.credentialsName: Secret lab/bmc-node-1 not found".to_owned()]
    );
    assert!(
        built
            .accepted
            .contains(&ObjRef::new(Kind::BootProfile, "worker"))
    );
}

#[test]
fn a_mac_in_two_boothosts_is_refused_on_the_later_one_naming_both() {
    let mut s = snapshot();
    s.hosts.insert(
        "node-3".into(),
        object(
            "BootHost",
            "node-3",
            json!({"macs": ["52:54:00:12:34:59", "52:54:00:12:34:58"], "ip": "10.66.1.12",
                   "profile": "chained"}),
        ),
    );
    let built = build_plain(&s);
    assert_eq!(
        built.refused[&ObjRef::new(Kind::BootHost, "node-3")],
        vec![
            "host 52:54:00:12:34:59: field macs[1]: 52:54:00:12:34:58 is used by both \
             hosts[1] and hosts[2]"
                .to_owned()
        ]
    );
    let inv = built.result.expect("the others are valid");
    assert_eq!(inv.hosts.len(), 2);
}

#[test]
fn a_refused_profile_refuses_its_hosts_saying_so() {
    let mut s = snapshot();
    s.profiles.get_mut("chained").expect("chained")["spec"]["chain"] = "ftp://x".into();
    let built = build_plain(&s);
    let inv = built.result.expect("the rest is valid");
    assert_eq!(inv.hosts.len(), 1);
    let profile = &built.refused[&ObjRef::new(Kind::BootProfile, "chained")];
    assert!(
        profile[0].starts_with("field profiles[chained].chain: "),
        "{profile:?}"
    );
    assert_eq!(
        built.refused[&ObjRef::new(Kind::BootHost, "node-2")],
        vec!["field profile: BootProfile chained is refused, so its hosts are too".to_owned()]
    );
}

#[test]
fn duplicates_refuse_the_later_object_only() {
    let mut s = snapshot();
    let mut dup = s.hosts["node-2"].clone();
    dup["metadata"]["name"] = "node-3".into();
    dup["spec"]["ip"] = "10.66.1.12".into();
    s.hosts.insert("node-3".into(), dup);
    let built = build_plain(&s);
    let inv = built.result.expect("the rest is valid");
    assert_eq!(inv.hosts.len(), 2);
    assert!(
        built
            .refused
            .contains_key(&ObjRef::new(Kind::BootHost, "node-3"))
    );
    assert!(
        built
            .accepted
            .contains(&ObjRef::new(Kind::BootHost, "node-2"))
    );
}

#[test]
fn unknown_fields_and_a_second_discovery_are_refused_per_object() {
    let mut s = snapshot();
    s.hosts.get_mut("node-2").expect("node-2")["spec"]["colour"] = "blue".into();
    let mut second = s.networks["lab"].clone();
    second["spec"]["subnets"] = json!([{"cidr": "10.67.0.0/16"}]);
    s.networks.insert("other".into(), second);
    let built = build_plain(&s);
    assert!(built.result.is_ok());
    let host = &built.refused[&ObjRef::new(Kind::BootHost, "node-2")];
    assert!(host[0].contains("unknown field `colour`"), "{host:?}");
    let net = &built.refused[&ObjRef::new(Kind::BootNetwork, "other")];
    assert!(net[0].contains("already set by BootNetwork lab"), "{net:?}");
}

#[test]
fn a_bare_metal_host_becomes_a_host() {
    let mut s = snapshot();
    s.bare_metal.insert(
        "worker-7".into(),
        json!({
            "apiVersion": "metal3.io/v1alpha1",
            "kind": "BareMetalHost",
            "metadata": {"name": "worker-7", "annotations": {
                "pxe-agent.io/ip": "10.66.1.77", "pxe-agent.io/profile": "chained"}},
            "spec": {"bootMACAddress": "52:54:00:aa:bb:07", "online": false,
                     "bootMode": "UEFISecureBoot",
                     "bmc": {"address": "redfish+https://10.77.0.7/redfish/v1/Systems/1",
                             "credentialsName": "bmc-admin",
                             "disableCertificateVerification": true}},
        }),
    );
    s.bare_metal.insert(
        "worker-8".into(),
        json!({
            "apiVersion": "metal3.io/v1alpha1",
            "kind": "BareMetalHost",
            "metadata": {"name": "worker-8"},
            "spec": {"bootMACAddress": "52:54:00:aa:bb:08"},
        }),
    );
    let built = build_plain(&s);
    let inv = built.result.expect("valid");
    let host = inv
        .host_by_mac("52:54:00:aa:bb:07".parse().expect("mac"))
        .expect("the BareMetalHost is a host");
    assert_eq!(host.hostname.as_deref(), Some("worker-7"));
    assert_eq!(host.ipv4(), Some([10, 66, 1, 77].into()));
    let bmc = host.bmc.as_ref().expect("bmc");
    assert!(bmc.boot_mode.is_efi());
    assert!(bmc.tls.insecure, "from disableCertificateVerification");
    let refused = &built.refused[&ObjRef::new(Kind::BareMetalHost, "worker-8")];
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(refused[0].contains("pxe-agent.io/ip"));
}

#[test]
fn ipv6_reaches_the_inventory_from_boot_networks_boot_hosts_and_bare_metal_hosts() {
    let mut s = snapshot();
    let subnets = s.networks.get_mut("lab").expect("lab")["spec"]["subnets"]
        .as_array_mut()
        .expect("subnets");
    subnets.push(
        json!({"cidr": "fd00:66::/64", "dns": ["fd00:66::53"], "leaseTime": 600,
                        "ra": {"other": false}}),
    );
    let node_2 = s.hosts.get_mut("node-2").expect("node-2");
    node_2["spec"]["ipv6"] = "fd00:66::2".into();
    node_2["spec"]["uuid"] = "2B6A81E4-5B6F-4C2A-9D3E-7F0A1B2C3D4E".into();
    s.bare_metal.insert(
        "worker-9".into(),
        json!({
            "apiVersion": "metal3.io/v1alpha1",
            "kind": "BareMetalHost",
            "metadata": {"name": "worker-9", "annotations": {
                "pxe-agent.io/ip": "10.66.1.79", "pxe-agent.io/profile": "chained",
                "pxe-agent.io/ipv6": "fd00:66::79",
                "pxe-agent.io/uuid": "8a5c2e6b-1e0f-4c1d-9b7a-0123456789ab"}},
            "spec": {"bootMACAddress": "52:54:00:aa:bb:09"},
        }),
    );
    s.bare_metal.insert(
        "worker-10".into(),
        json!({
            "apiVersion": "metal3.io/v1alpha1",
            "kind": "BareMetalHost",
            "metadata": {"name": "worker-10", "annotations": {
                "pxe-agent.io/ip": "10.66.1.80", "pxe-agent.io/profile": "chained",
                "pxe-agent.io/ipv6": "fd00:99::80"}},
            "spec": {"bootMACAddress": "52:54:00:aa:bb:10"},
        }),
    );
    let built = build_plain(&s);
    let inv = built.result.expect("valid");
    let six = &inv.subnets6[0];
    assert_eq!(six.to_string(), "fd00:66::/64");
    assert_eq!(six.ra.map(|ra| (ra.managed, ra.other)), Some((true, false)));
    let uuid = crate::inventory::parse_uuid("2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e").expect("uuid");
    let node = inv.host_by_uuid(&uuid).expect("node-2 by its uuid");
    assert_eq!(node.ipv6(), Some("fd00:66::2".parse().expect("address")));
    let worker = inv
        .host_by_ip6("fd00:66::79".parse().expect("address"))
        .expect("the BareMetalHost's IPv6 address");
    assert_eq!(worker.hostname.as_deref(), Some("worker-9"));
    assert!(worker.uuid().is_some());
    let refused = &built.refused[&ObjRef::new(Kind::BareMetalHost, "worker-10")];
    assert!(
        refused
            .iter()
            .any(|p| p.contains("fd00:99::80 is outside every IPv6 subnet")),
        "{refused:?}"
    );
}

#[test]
fn a_refused_discovery_profile_turns_discovery_off_not_the_subnets() {
    let mut s = snapshot();
    s.profiles.get_mut("worker").expect("worker")["spec"]["kernel"] = Value::Null;
    let built = build_plain(&s);
    let inv = built.result.expect("the rest is valid");
    assert_eq!(inv.hosts.len(), 1, "node-2 (profile chained) is served");
    assert_eq!(
        inv.discovery.policy,
        crate::inventory::DiscoveryPolicy::Ignore
    );
    let network = ObjRef::new(Kind::BootNetwork, "lab");
    assert!(built.accepted.contains(&network));
    assert!(built.degraded[&network][0].contains("BootProfile worker is refused"));
}

#[test]
fn a_subnet_problem_refuses_its_network_only() {
    let mut s = snapshot();
    s.networks.insert(
        "overlapping".into(),
        object(
            "BootNetwork",
            "overlapping",
            json!({"subnets": [{"cidr": "10.66.128.0/17"}]}),
        ),
    );
    let built = build_plain(&s);
    let inv = built.result.expect("the rest is valid");
    assert_eq!(inv.subnets.len(), 1);
    assert_eq!(inv.hosts.len(), 2);
    assert_eq!(
        built.refused[&ObjRef::new(Kind::BootNetwork, "overlapping")],
        vec!["field subnets[1].cidr: 10.66.128.0/17 overlaps subnets[0] (10.66.0.0/16)".to_owned()]
    );
}

#[test]
fn a_boot_network_subnet_in_mode_proxy_is_a_proxy_subnet() {
    let mut s = snapshot();
    let network = s.networks.get_mut("lab").expect("network");
    network["spec"]["subnets"]
        .as_array_mut()
        .expect("subnets")
        .push(json!({"cidr": "10.99.0.0/16", "mode": "proxy"}));
    let built = build_plain(&s);
    assert!(built.refused.is_empty(), "{:#?}", built.refused);
    let inv = built.result.expect("valid");
    let modes: Vec<_> = inv.subnets.iter().map(|s| s.mode).collect();
    assert_eq!(
        modes,
        vec![
            crate::inventory::SubnetMode::Server,
            crate::inventory::SubnetMode::Proxy
        ]
    );
}

/// The fixture and `n` more BootHosts, `rack-0` to `rack-{n-1}`.
fn fleet(n: u8) -> Snapshot {
    let mut s = snapshot();
    for i in 0..n {
        let name = format!("rack-{i}");
        s.hosts.insert(
            name.clone(),
            object(
                "BootHost",
                &name,
                json!({"mac": format!("52:54:00:00:01:{i:02x}"), "ip": format!("10.66.2.{i}"),
                       "profile": "chained"}),
            ),
        );
    }
    s
}

/// A patch from `previous` (built whole from `before`) to `after`.
fn patched(before: &Snapshot, after: &Snapshot) -> Option<Inventory> {
    let whole = build_plain(before);
    assert!(whole.refused.is_empty(), "{:?}", whole.refused);
    let previous = whole.result.expect("valid");
    let (built, basis) = patch(
        after,
        Path::new(LABEL),
        &|inv, _| Ok(inv),
        &previous,
        &before.basis(),
    )?;
    assert_eq!(basis, after.basis());
    assert!(built.refused.is_empty() && built.degraded.is_empty());
    assert_eq!(built.accepted.len(), after.objects().len());
    Some(built.result.expect("valid"))
}

#[test]
fn a_patch_for_changed_added_and_removed_boothosts_equals_a_whole_build() {
    let before = fleet(8);
    let mut after = before.clone();
    after.hosts.get_mut("rack-3").expect("host")["spec"]["ip"] = json!("10.66.3.3");
    after.hosts.remove("rack-5");
    after.hosts.insert(
        "rack-9".into(),
        object(
            "BootHost",
            "rack-9",
            json!({"mac": "52:54:00:00:01:99", "ip": "10.66.2.99", "profile": "chained"}),
        ),
    );
    let patched = patched(&before, &after).expect("a patch");
    let whole = build_plain(&after).result.expect("valid");
    assert_eq!(patched, whole);
    assert_eq!(patched.hosts.len(), 10);
    // Nothing changed: the same inventory, every host kept.
    let same = self::patched(&before, &before).expect("a patch");
    assert_eq!(same, build_plain(&before).result.expect("valid"));
}

#[test]
fn what_a_patch_cannot_vouch_for_is_built_whole() {
    let before = fleet(8);
    // A MAC another host has: the whole build refuses the later object.
    let mut dup = before.clone();
    dup.hosts.get_mut("rack-3").expect("host")["spec"]["mac"] = json!("52:54:00:00:01:04");
    assert_eq!(patched(&before, &dup), None);
    assert_eq!(build_plain(&dup).refused.len(), 1);
    // A changed profile, network or Secret username: every host may change.
    let mut profile = before.clone();
    profile.profiles.get_mut("chained").expect("profile")["spec"]["localDisk"] = json!(false);
    assert_eq!(patched(&before, &profile), None);
    let mut user = before.clone();
    user.secrets.get_mut("bmc-admin").expect("secret").username = Some("other".into());
    assert_eq!(patched(&before, &user), None);
    // A changed password, with the Secret's name and username the same.
    let mut password = before.clone();
    password
        .secrets
        .get_mut("bmc-node-1")
        .expect("secret")
        .password = Some(Password::new(b"rotated".to_vec()));
    let mut changed = password.clone();
    changed.hosts.get_mut("rack-1").expect("host")["spec"]["ip"] = json!("10.66.3.1");
    assert_eq!(patched(&before, &changed), None);
    // More than a quarter of the hosts changed.
    let mut many = before.clone();
    for i in 0..4 {
        many.hosts.get_mut(&format!("rack-{i}")).expect("host")["spec"]["ip"] =
            json!(format!("10.66.4.{i}"));
    }
    assert_eq!(patched(&before, &many), None);
    assert!(build_plain(&many).refused.is_empty());
}

//! The `Dhcp6` object of a kea-dhcp6 configuration -> the IPv6 half of
//! the translation: `subnet6` with its first pool and `valid-lifetime`,
//! the `dns-servers` and `domain-search` options, and reservations by
//! `hw-address` or by a `duid` that names a MAC (DUID-LL, DUID-LLT) or a
//! system UUID (DUID-UUID), each with its first `ip-addresses` entry; they
//! join the hosts of the Dhcp4 reservations in `import::ipv6`. Boot files
//! are the profiles' (read from the Dhcp4 configuration), so
//! `bootfile-url` and client classes are reported, as are prefix
//! delegation and what has no IPv6 meaning in the inventory.

use std::net::Ipv6Addr;

use serde_json::Value;

use super::{Ctx, text};
use crate::{
    import::{
        Origin, Reservation6, Subnet6Out, Translation,
        duid::{self, DuidName},
        ipv6::parse_cidr6,
        valid_hostname,
    },
    inventory::uuid_text,
    mac::MacAddr,
};

/// Subnet-level settings read from `option-data`.
#[derive(Default, Clone)]
struct Net6 {
    dns: Vec<Ipv6Addr>,
    domain: Option<String>,
}

/// What the report says of a DHCPv6 boot file Kea sends.
const BOOT_FILES: &str = "over DHCPv6 the agent sends each host the boot files of its profile (read from the Dhcp4 configuration) as option 59 URLs: tftp://[its address]/FILE of `boot.uefi`, the `boot.http` URL, the iPXE script; change the profile to change them";

/// The translation of a `Dhcp6` object: its subnets and reservations.
pub(super) fn translate(mut ctx: Ctx<'_>, dhcp6: &Value) -> Translation {
    let file = ctx.file;
    let mut global = Net6::default();
    let base = ctx.base;
    read_options6(dhcp6, Some(&mut global), &mut ctx, "global", base);
    let global_lease = dhcp6.get("valid-lifetime").and_then(Value::as_u64);
    for (key, why) in [
        ("hooks-libraries", "hook libraries can change any answer"),
        ("option-def", "custom option definitions"),
        (
            "shared-networks",
            "move their subnet6 entries to the top level",
        ),
    ] {
        if dhcp6.get(key).is_some() {
            ctx.report.add(
                &Origin::new(file, ctx.key_line(key)),
                format!("{key} not translated: {why}"),
            );
        }
    }
    for class in array(dhcp6, "client-classes") {
        let name = text(class, "name").unwrap_or("");
        let origin = ctx.origin(name);
        ctx.report.add(
            &origin,
            format!("client class {name} not translated: the agent's DHCPv6 answer is the host's profile and its subnet's settings, whatever the class (boot files are the profile's, sent as option 59 URLs)"),
        );
    }

    let mut subnets6 = Vec::new();
    let mut reservations = Vec::new();
    for s in array(dhcp6, "subnet6") {
        let cidr = text(s, "subnet").unwrap_or("");
        let origin = ctx.origin(cidr);
        let Some((network, prefix)) = parse_cidr6(cidr) else {
            ctx.report.add(
                &origin,
                format!("subnet {cidr:?} not translated: not an IPv6 network/prefix"),
            );
            continue;
        };
        let mut net = global.clone();
        read_options6(
            s,
            Some(&mut net),
            &mut ctx,
            &format!("subnet {cidr}"),
            origin.line,
        );
        if s.get("client-class").is_some() || s.get("client-classes").is_some() {
            ctx.report.add(
                &origin,
                format!("subnet {cidr} restricted to client classes: the agent serves it to every client"),
            );
        }
        if !array(s, "pd-pools").is_empty() {
            ctx.report.add(
                &Origin::new(file, ctx.origin_after("pd-pools", origin.line).line),
                format!("subnet {cidr} pd-pools not translated: the agent delegates no prefixes"),
            );
        }
        let mut pool = None;
        for (i, p) in array(s, "pools").iter().enumerate() {
            let range = text(p, "pool").unwrap_or("");
            let at = ctx.origin_after(range, origin.line);
            match pool_range6(range) {
                Some(r) if i == 0 => pool = Some(r),
                Some(_) => ctx.report.add(
                    &at,
                    format!("pool {range} not translated: the inventory keeps one pool a subnet"),
                ),
                None => ctx
                    .report
                    .add(&at, format!("pool {range:?} not understood")),
            }
        }
        if pool.is_some() {
            ctx.report.add(
                &origin,
                "pool kept, leased only to machines the inventory does not list and only under discovery.policy inspect, where Kea leased it to every machine asking",
            );
        }
        subnets6.push(Subnet6Out {
            dns: net.dns,
            domain: net.domain,
            lease_time: s
                .get("valid-lifetime")
                .and_then(Value::as_u64)
                .or(global_lease)
                .and_then(|l| u32::try_from(l).ok()),
            pool,
            ..Subnet6Out::new(network, prefix, origin)
        });
        reservations.extend(array(s, "reservations"));
    }
    reservations.extend(array(dhcp6, "reservations"));
    let reservations6 = reservations
        .into_iter()
        .filter_map(|r| reservation(&mut ctx, r))
        .collect();
    Translation {
        source: format!("kea-dhcp6 {}", file.display()),
        subnets6,
        reservations6,
        report: ctx.report,
        ..Translation::default()
    }
}

fn array<'v>(obj: &'v Value, key: &str) -> &'v [Value] {
    obj.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// A reservation by `hw-address` or by a `duid` the inventory can match;
/// `None`, reported, for the rest.
fn reservation(ctx: &mut Ctx<'_>, r: &Value) -> Option<Reservation6> {
    let (macs, uuid, origin) = if let Some(hw) = text(r, "hw-address") {
        let origin = ctx.origin(hw);
        let Ok(mac) = hw.parse::<MacAddr>() else {
            ctx.report.add(
                &origin,
                format!("reservation hw-address {hw:?} not understood"),
            );
            return None;
        };
        (vec![mac], None, origin)
    } else if let Some(id) = text(r, "duid") {
        let origin = ctx.origin(id);
        let named = duid::parse_hex(id)
            .ok_or_else(|| "it is not hex".to_string())
            .and_then(|bytes| duid::read(&bytes));
        match named {
            Ok(DuidName::Mac(mac)) => (vec![mac], None, origin),
            Ok(DuidName::Uuid(uuid)) => (Vec::new(), Some(uuid), origin),
            Err(why) => {
                ctx.report.add(
                    &origin,
                    format!("reservation by duid {id} left out: {why}; a DHCPv6 client is matched by the MAC of a DUID-LL or DUID-LLT, or the system UUID of a DUID-UUID"),
                );
                return None;
            }
        }
    } else {
        let other = ["flex-id", "client-id", "circuit-id"]
            .into_iter()
            .find(|k| r.get(*k).is_some())
            .unwrap_or("no identifier");
        let value = text(r, other).unwrap_or("");
        ctx.report.add(
            &ctx.origin(value),
            format!("reservation by {other} {value} left out: a DHCPv6 client is matched by a MAC or a system UUID only"),
        );
        return None;
    };
    let who = match (macs.first(), &uuid) {
        (Some(mac), _) => mac.to_string(),
        (None, Some(uuid)) => format!("uuid {}", uuid_text(uuid)),
        (None, None) => String::new(),
    };
    if !array(r, "prefixes").is_empty() {
        ctx.report.add(
            &origin,
            format!("reservation {who} prefixes not translated: the agent delegates no prefixes"),
        );
    }
    read_options6(r, None, ctx, &format!("reservation {who}"), origin.line);
    let addresses: Vec<&str> = array(r, "ip-addresses")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let Some(first) = addresses.first() else {
        ctx.report.add(
            &origin,
            format!("reservation {who} left out: no ip-addresses (Kea leased it one from a pool)"),
        );
        return None;
    };
    let Ok(ip) = first.trim().parse::<Ipv6Addr>() else {
        ctx.report.add(
            &origin,
            format!("reservation {who} left out: {first:?} is not an IPv6 address"),
        );
        return None;
    };
    if addresses.len() > 1 {
        ctx.report.add(
            &origin,
            format!(
                "reservation {who} addresses {} not translated: the inventory holds one IPv6 address a host, the first",
                addresses[1..].join(", ")
            ),
        );
    }
    let mut hostname = text(r, "hostname").map(str::to_string);
    if let Some(name) = &hostname
        && !valid_hostname(name)
    {
        ctx.report.add(
            &origin,
            format!("hostname {name:?} not translated: the inventory takes letters, digits, '-' and '.', at most 63 bytes"),
        );
        hostname = None;
    }
    Some(Reservation6 {
        macs,
        uuid,
        ip,
        hostname,
        origin,
    })
}

/// `option-data` of a global scope or a subnet (`net`), or of a
/// reservation (`None`: nothing of a single host's is translated).
fn read_options6(
    obj: &Value,
    mut net: Option<&mut Net6>,
    ctx: &mut Ctx<'_>,
    what: &str,
    base: usize,
) {
    for o in array(obj, "option-data") {
        let name = text(o, "name");
        let code = o.get("code").and_then(Value::as_u64);
        let data = text(o, "data").unwrap_or("");
        let from = name.map_or(base, |n| ctx.origin_after(n, base).line);
        let origin = ctx.origin_after(data, from);
        let shown = name.map_or_else(|| code.unwrap_or(0).to_string(), str::to_string);
        let kind = match (name, code) {
            (Some("bootfile-url" | "bootfile-param"), _) | (None, Some(59 | 60)) => {
                ctx.report.add(
                    &origin,
                    format!("{what} option {shown} = {data:?} not translated: {BOOT_FILES}"),
                );
                continue;
            }
            (Some("dns-servers"), _) | (None, Some(23)) => 23,
            (Some("domain-search"), _) | (None, Some(24)) => 24,
            _ => {
                ctx.report.add(
                    &origin,
                    format!("{what} option {shown} = {data:?} not translated: only dns-servers and domain-search are"),
                );
                continue;
            }
        };
        let Some(net) = net.as_deref_mut() else {
            ctx.report.add(
                &origin,
                format!("{what} option {shown} = {data:?} not translated: a host's own DHCPv6 options are not; its subnet's apply"),
            );
            continue;
        };
        if kind == 24 {
            let mut domains = data.split(',').map(str::trim).filter(|d| !d.is_empty());
            net.domain = domains.next().map(str::to_string);
            let rest: Vec<&str> = domains.collect();
            if !rest.is_empty() {
                ctx.report.add(
                    &origin,
                    format!("{what} search domains {} not translated: the inventory's domain is one name, the first", rest.join(", ")),
                );
            }
            continue;
        }
        match data
            .split(',')
            .map(|a| a.trim().parse::<Ipv6Addr>().ok())
            .collect::<Option<Vec<_>>>()
        {
            Some(servers) => net.dns = servers,
            None => ctx.report.add(
                &origin,
                format!("{what} dns-servers {data:?} not translated: not a list of IPv6 addresses"),
            ),
        }
    }
}

/// `"fd00:66::1000 - fd00:66::1fff"` or a prefix, `"fd00:66::/112"`.
fn pool_range6(text: &str) -> Option<(Ipv6Addr, Ipv6Addr)> {
    if let Some((a, b)) = text.split_once('-') {
        return Some((a.trim().parse().ok()?, b.trim().parse().ok()?));
    }
    let (net, len) = parse_cidr6(text)?;
    let host_bits = match len {
        0 => u128::MAX,
        l => (1u128 << (128 - u32::from(l))) - 1,
    };
    Some((net, Ipv6Addr::from(u128::from(net) | host_bits)))
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use crate::{
        import::{ImportError, Translation, kea::translate_files},
        inventory::{Inventory, parse_uuid},
    };

    const KEA4: &str = r#"{
  "Dhcp4": {
    "interfaces-config": { "interfaces": ["eth0"] },
    "valid-lifetime": 3600,
    "client-classes": [
      { "name": "ipxe", "test": "option[77].hex == 'iPXE'",
        "boot-file-name": "http://10.66.0.1:8080/boot.ipxe" }
    ],
    "boot-file-name": "ipxe.efi",
    "subnet4": [{
      "id": 1, "subnet": "10.66.0.0/16",
      "option-data": [ { "name": "routers", "data": "10.66.0.1" } ],
      "reservations": [
        { "hw-address": "52:54:00:00:00:01", "ip-address": "10.66.1.1" },
        { "hw-address": "52:54:00:00:00:02", "ip-address": "10.66.1.2", "hostname": "n2" },
        { "hw-address": "52:54:00:00:00:03", "ip-address": "10.66.1.3", "hostname": "n3" },
        { "hw-address": "52:54:00:00:00:04", "ip-address": "10.66.1.4" }
      ]
    }]
  }
}"#;

    const KEA6: &str = r#"{
  "Dhcp6": {
    // The same provisioning network, over DHCPv6.
    "interfaces-config": { "interfaces": ["eth0"] },
    "preferred-lifetime": 3000,
    "valid-lifetime": 4000,
    "option-data": [
      { "name": "dns-servers", "data": "fd00:66::53, fd00:66::54" },
      { "name": "domain-search", "data": "lab.example, example.org" },
      { "name": "bootfile-url", "data": "tftp://[fd00:66::1]/ipxe.efi" }
    ],
    "client-classes": [
      { "name": "ipxe6", "test": "option[15].text == 'iPXE'",
        "option-data": [ { "name": "bootfile-url", "data": "http://[fd00:66::1]/boot.ipxe" } ] }
    ],
    "subnet6": [{
      "id": 1, "subnet": "fd00:66::/64",
      "pools": [ { "pool": "fd00:66::1000 - fd00:66::1fff" }, { "pool": "fd00:66::2000/116" } ],
      "pd-pools": [ { "prefix": "fd00:6600::", "prefix-len": 40, "delegated-len": 56 } ],
      "reservations": [
        { "hw-address": "52:54:00:00:00:01", "ip-addresses": [ "fd00:66::11" ], "hostname": "n1" },
        { "duid": "00:03:00:01:52:54:00:00:00:02", "ip-addresses": [ "fd00:66::12", "fd00:66::112" ] },
        { "duid": "00:04:8a:5c:2e:6b:1e:0f:4c:1d:9b:7a:01:23:45:67:89:ab",
          "ip-addresses": [ "fd00:66::13" ], "hostname": "n3" },
        { "duid": "00:01:00:01:2b:3c:4d:5e:52:54:00:00:00:09", "ip-addresses": [ "fd00:66::19" ] },
        { "duid": "00:02:00:00:00:09:0c:c0:84:d3:03:00:09:12", "ip-addresses": [ "fd00:66::20" ] },
        { "hw-address": "52:54:00:00:00:04", "prefixes": [ "fd00:6600:100::/56" ] },
        { "flex-id": "'port-7'", "ip-addresses": [ "fd00:66::21" ] }
      ]
    }]
  }
}"#;

    fn run(files: &[(&str, &str)]) -> Result<Translation, ImportError> {
        let files: Vec<(PathBuf, String)> = files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect();
        translate_files(&files)
    }

    #[test]
    fn dhcp4_and_dhcp6_reservations_join_into_dual_stack_hosts() {
        let t = run(&[("kea-dhcp4.conf", KEA4), ("kea-dhcp6.conf", KEA6)]).expect("translates");
        let imported = t.finish().expect("validates");
        assert_eq!(
            imported.yaml,
            r#"# Imported from kea-dhcp4 kea-dhcp4.conf, kea-dhcp6 kea-dhcp6.conf by `pxe-agent import`.
# Check it with `pxe-agent check`; what was not translated is in the import report.

subnets:
  # kea-dhcp4.conf:11
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    lease_time: 3600
  # kea-dhcp6.conf:17
  - cidr: "fd00:66::/64"
    dns: ["fd00:66::53", "fd00:66::54"]
    domain: "lab.example"
    lease_time: 4000
    # Leased to machines no host names, under discovery.policy inspect only.
    pool: {start: "fd00:66::1000", end: "fd00:66::1fff"}

profiles:
  - name: no-boot
  - name: boot-1
    boot: {bios: "ipxe.efi", uefi: "ipxe.efi", uefi_arm64: "ipxe.efi"}
    chain: "http://10.66.0.1:8080/boot.ipxe"

hosts:
  # kea-dhcp4.conf:14, kea-dhcp6.conf:21
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.1, profile: boot-1, ipv6: "fd00:66::11", hostname: "n1"}
  # kea-dhcp4.conf:15, kea-dhcp6.conf:22
  - {mac: "52:54:00:00:00:02", ip: 10.66.1.2, profile: boot-1, ipv6: "fd00:66::12", hostname: "n2"}
  # kea-dhcp4.conf:16, kea-dhcp6.conf:23
  - {mac: "52:54:00:00:00:03", ip: 10.66.1.3, profile: boot-1, ipv6: "fd00:66::13", uuid: "8a5c2e6b-1e0f-4c1d-9b7a-0123456789ab", hostname: "n3"}
  # kea-dhcp4.conf:17
  - {mac: "52:54:00:00:00:04", ip: 10.66.1.4, profile: boot-1}
  # kea-dhcp6.conf:25
  - {mac: "52:54:00:00:00:09", profile: no-boot, ipv6: "fd00:66::19"}
"#
        );
        let inv = Inventory::parse(Path::new("imported.yaml"), &imported.yaml).expect("loads");
        assert_eq!(inv.subnets.len(), 1);
        let six = &inv.subnets6[0];
        assert_eq!(six.to_string(), "fd00:66::/64");
        assert_eq!(six.lease_time, 4000);
        assert_eq!(six.ra, None);
        let got: Vec<(String, Option<String>)> = inv
            .hosts
            .iter()
            .map(|h| (h.mac.to_string(), h.ipv6().map(|a| a.to_string())))
            .collect();
        assert_eq!(
            got,
            [
                ("52:54:00:00:00:01".into(), Some("fd00:66::11".into())),
                // Joined by the MAC of its DUID-LL.
                ("52:54:00:00:00:02".into(), Some("fd00:66::12".into())),
                // Joined by hostname: its DUID-UUID names no MAC.
                ("52:54:00:00:00:03".into(), Some("fd00:66::13".into())),
                ("52:54:00:00:00:04".into(), None),
                // An IPv6 reservation only: a host of its own.
                ("52:54:00:00:00:09".into(), Some("fd00:66::19".into())),
            ]
        );
        let uuid = parse_uuid("8a5c2e6b-1e0f-4c1d-9b7a-0123456789ab").unwrap();
        assert_eq!(inv.hosts[2].uuid(), Some(&uuid));
        assert_eq!(
            inv.host_by_uuid(&uuid)
                .and_then(crate::inventory::Host::ipv4),
            Some([10, 66, 1, 3].into())
        );
    }

    #[test]
    fn dhcp6_items_not_translated_are_reported_with_lines() {
        let t = run(&[("kea-dhcp4.conf", KEA4), ("kea-dhcp6.conf", KEA6)]).expect("translates");
        let report = t.finish().expect("validates").report.to_string();
        let wanted = [
            "kea-dhcp6.conf:9: global search domains example.org not translated: the inventory's domain is one name",
            "kea-dhcp6.conf:10: global option bootfile-url = \"tftp://[fd00:66::1]/ipxe.efi\" not translated: over DHCPv6 the agent sends each host the boot files of its profile",
            "kea-dhcp6.conf:13: client class ipxe6 not translated: the agent's DHCPv6 answer is the host's profile",
            "kea-dhcp6.conf:17: pool kept, leased only to machines the inventory does not list",
            "kea-dhcp6.conf:18: pool fd00:66::2000/116 not translated: the inventory keeps one pool a subnet",
            "kea-dhcp6.conf:19: subnet fd00:66::/64 pd-pools not translated: the agent delegates no prefixes",
            "kea-dhcp6.conf:22: reservation 52:54:00:00:00:02 addresses fd00:66::112 not translated: the inventory holds one IPv6 address a host",
            "kea-dhcp6.conf:25: host 52:54:00:00:00:09 has an IPv6 reservation only: translated with `ipv6` and no `ip`, and a profile that boots nothing; choose its profile",
            "kea-dhcp6.conf:26: reservation by duid 00:02:00:00:00:09:0c:c0:84:d3:03:00:09:12 left out: it is a DUID-EN",
            "kea-dhcp6.conf:27: reservation 52:54:00:00:00:04 prefixes not translated: the agent delegates no prefixes",
            "kea-dhcp6.conf:27: reservation 52:54:00:00:00:04 left out: no ip-addresses",
            "kea-dhcp6.conf:28: reservation by flex-id 'port-7' left out: a DHCPv6 client is matched by a MAC or a system UUID only",
        ];
        let lines: Vec<&str> = report.lines().collect();
        assert_eq!(lines.len(), wanted.len(), "{report}");
        for (line, want) in lines.iter().zip(wanted) {
            assert!(
                line.starts_with(want),
                "{line:?}\n  does not start with\n{want:?}"
            );
        }
    }

    #[test]
    fn a_file_may_hold_both_objects_but_each_comes_once() {
        // Kea reads one file holding both servers' objects as well.
        let both = format!(
            "{{{}, {}}}",
            &KEA4[1..KEA4.len() - 1],
            &KEA6[1..KEA6.len() - 1]
        );
        let t = run(&[("kea.conf", &both)]).expect("translates");
        assert_eq!(t.source, "kea-dhcp4 kea.conf, kea-dhcp6 kea.conf");
        assert!(
            t.report
                .to_string()
                .contains("kea.conf:38: pool fd00:66::2000/116 not translated"),
            "{}",
            t.report
        );
        // Lookups start at each object's own line: the Dhcp6 reservation
        // of 52:54:00:00:00:01 is found below the Dhcp4 object, not in it.
        let imported = t.finish().expect("validates");
        assert!(
            imported
                .yaml
                .contains("  # kea.conf:14, kea.conf:41\n  - {mac: \"52:54:00:00:00:01\""),
            "{}",
            imported.yaml
        );

        let twice = run(&[("a.conf", KEA4), ("b.conf", KEA4)])
            .map(|_| ())
            .unwrap_err();
        assert_eq!(
            twice.to_string(),
            "failed to parse b.conf:2: a second Dhcp4 configuration (the first is in a.conf): give one kea-dhcp4 and one kea-dhcp6 configuration at most"
        );
        let neither = run(&[("ctrl.conf", r#"{"Control-agent": {}}"#)])
            .map(|_| ())
            .unwrap_err();
        assert_eq!(
            neither.to_string(),
            "failed to parse ctrl.conf:1: no Dhcp4 or Dhcp6 object"
        );
    }

    #[test]
    fn a_dhcp6_file_alone_keeps_its_subnets_and_reports_every_reservation() {
        let t = run(&[("kea-dhcp6.conf", KEA6)]).expect("translates");
        let imported = t.finish().expect("validates");
        // Hosts with an IPv6 reservation only; one naming a UUID and no MAC
        // is left out.
        assert_eq!(imported.hosts, 3);
        let inv = Inventory::parse(Path::new("imported.yaml"), &imported.yaml).expect("loads");
        assert_eq!(inv.subnets6.len(), 1);
        assert!(
            inv.hosts
                .iter()
                .all(|h| h.ipv4().is_none() && h.ipv6().is_some())
        );
        let report = imported.report.to_string();
        for want in [
            "kea-dhcp6.conf:21: host 52:54:00:00:00:01 has an IPv6 reservation only",
            "kea-dhcp6.conf:22: host 52:54:00:00:00:02 has an IPv6 reservation only",
            "kea-dhcp6.conf:23: IPv6 reservation fd00:66::13 for uuid 8a5c2e6b-1e0f-4c1d-9b7a-0123456789ab left out: it names no MAC, and not exactly one IPv4 reservation is named \"n3\"; every host of the inventory has a MAC",
        ] {
            assert!(report.contains(want), "missing {want:?} in:\n{report}");
        }
    }
}

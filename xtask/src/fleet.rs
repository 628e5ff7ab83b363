//! Fleet-sized inventories for `cargo xtask bench scale` and the privileged
//! reload test at fleet scale: one subnet, one profile with every boot
//! class, and hosts whose MAC, address, host name and one extra option
//! derive from their index, so any two inventories of the same size agree
//! host for host; as an inventory file, or as the BootNetwork, BootProfile
//! and BootHost objects the Kubernetes source reads.
//!
//! Owns the fleet's address plan; starting agents on it belongs to the bench
//! and the tests.

use std::{fmt::Write as _, net::Ipv4Addr};

/// The fleet's subnet: a /12 holds the largest fleet (250,000 hosts and the
/// 1,000 a reload adds) and the lab's server address, 10.66.0.1, that the
/// replies name as server and router.
pub const FLEET_SUBNET: &str = "10.64.0.0/12";
/// The first host's address: above 10.66.x.x, where the lab's server and
/// client ends live, so no host is given theirs.
const FIRST_HOST: Ipv4Addr = Ipv4Addr::new(10, 68, 0, 1);
/// Hosts the address plan holds: up to 10.79.255.254.
pub const MAX_FLEET: usize = (0x0a4f_fffe - 0x0a44_0001) + 1;
/// The subnet's lease time, seconds; [`fleet_inventory_leasing`] changes it.
pub const FLEET_LEASE_TIME: u32 = 3600;
/// The site-specific option every host carries (RFC 2132 section 2: 224 to
/// 254 are for local use), with a short text of its own.
pub const FLEET_OPTION: u8 = 224;

/// The MAC of fleet host `index` (`02:fe:` and the index in 32 bits).
pub fn fleet_mac(index: usize) -> [u8; 6] {
    let [a, b, c, d] = u32::try_from(index).unwrap_or(u32::MAX).to_be_bytes();
    [0x02, 0xfe, a, b, c, d]
}

/// The reserved address of fleet host `index`.
pub fn fleet_ip(index: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(FIRST_HOST) + u32::try_from(index).unwrap_or(u32::MAX))
}

/// An inventory of `hosts` fleet hosts followed by `extra` more (hosts
/// `hosts..hosts + extra`): the first `hosts` are those of
/// `fleet_inventory(hosts, 0)`, entry for entry, so a reload from one to
/// the other adds `extra` hosts and changes nothing else.
///
/// # Panics
/// If `hosts + extra` exceeds [`MAX_FLEET`].
pub fn fleet_inventory(hosts: usize, extra: usize) -> String {
    render(hosts + extra, None, FLEET_LEASE_TIME)
}

/// `fleet_inventory(hosts, 0)` with the subnet's lease time set to
/// `lease_time`: every host's replies change, and the text outside the
/// host list with them, so a reload to it parses the whole file.
///
/// # Panics
/// If `hosts` exceeds [`MAX_FLEET`].
pub fn fleet_inventory_leasing(hosts: usize, lease_time: u32) -> String {
    render(hosts, None, lease_time)
}

/// `fleet_inventory(hosts, 0)` with host `changed`'s extra option given
/// another value: a reload to it changes that one host's replies only.
///
/// # Panics
/// If `hosts` exceeds [`MAX_FLEET`] or `changed` is not below `hosts`.
pub fn fleet_inventory_changed(hosts: usize, changed: usize) -> String {
    assert!(
        changed < hosts,
        "host {changed} is not in a fleet of {hosts}"
    );
    render(hosts, Some(changed), FLEET_LEASE_TIME)
}

fn render(count: usize, changed: Option<usize>, lease_time: u32) -> String {
    assert!(
        count <= MAX_FLEET,
        "{count} hosts exceed the fleet's address plan ({MAX_FLEET})"
    );
    let mut yaml = format!(
        "subnets:\n  - cidr: {FLEET_SUBNET}\n    router: 10.66.0.1\n    dns: [10.66.0.1]\n    \
         domain: fleet.example\n    lease_time: {lease_time}\n\
         profiles:\n  - name: fleet\n    boot:\n      bios: undionly.kpxe\n      uefi: ipxe.efi\n      \
         uefi_arm64: ipxe-arm64.efi\n      http: \"http://{{server}}:8080/ipxe.efi\"\n\
         hosts:\n"
    );
    // About 110 bytes a host.
    yaml.reserve(count * 112);
    for i in 0..count {
        let [_, _, a, b, c, d] = fleet_mac(i);
        let _ = writeln!(
            yaml,
            "  - {{mac: \"02:fe:{a:02x}:{b:02x}:{c:02x}:{d:02x}\", ip: {ip}, hostname: node-{i}, \
             profile: fleet, options: {{{FLEET_OPTION}: \"{tag}\"}}}}",
            ip = fleet_ip(i),
            tag = fleet_option_text(i, changed == Some(i)),
        );
    }
    yaml
}

/// The BootHost named after fleet host `index`.
pub fn fleet_host_name(index: usize) -> String {
    format!("node-{index}")
}

/// [`fleet_inventory`]`(hosts, 0)` as Kubernetes objects, YAML documents
/// separated by `---`: a BootNetwork `fleet` (the subnet), a BootProfile
/// `fleet` and a BootHost per host named [`fleet_host_name`].
///
/// # Panics
/// If `hosts` exceeds [`MAX_FLEET`].
pub fn fleet_objects(hosts: usize) -> String {
    assert!(
        hosts <= MAX_FLEET,
        "{hosts} hosts exceed the fleet's address plan ({MAX_FLEET})"
    );
    let mut yaml = format!(
        "apiVersion: pxe-agent.io/v1alpha1\nkind: BootNetwork\nmetadata: {{name: fleet}}\n\
         spec:\n  subnets:\n    - {}\n\
         ---\napiVersion: pxe-agent.io/v1alpha1\nkind: BootProfile\nmetadata: {{name: fleet}}\n\
         spec:\n  boot: {{bios: undionly.kpxe, uefi: ipxe.efi, uefiArm64: ipxe-arm64.efi, \
         http: \"http://{{server}}:8080/ipxe.efi\"}}\n",
        fleet_subnet_object(FLEET_LEASE_TIME)
    );
    // About 260 bytes a host.
    yaml.reserve(hosts * 264);
    for i in 0..hosts {
        let [_, _, a, b, c, d] = fleet_mac(i);
        let _ = writeln!(
            yaml,
            "---\napiVersion: pxe-agent.io/v1alpha1\nkind: BootHost\nmetadata: {{name: {name}}}\n\
             spec: {{mac: \"02:fe:{a:02x}:{b:02x}:{c:02x}:{d:02x}\", ip: {ip}, hostname: {name}, \
             profile: fleet, options: {{\"{FLEET_OPTION}\": \"{tag}\"}}}}",
            name = fleet_host_name(i),
            ip = fleet_ip(i),
            tag = fleet_option_text(i, false),
        );
    }
    yaml
}

/// The BootNetwork's one subnet with `lease_time`, as JSON (which YAML
/// reads as a flow mapping): the objects' text and a patch's.
pub fn fleet_subnet_object(lease_time: u32) -> String {
    format!(
        r#"{{"cidr":"{FLEET_SUBNET}","router":"10.66.0.1","dns":["10.66.0.1"],"domain":"fleet.example","leaseTime":{lease_time}}}"#
    )
}

/// Host `index`'s option 224 text; `changed`: the value
/// [`fleet_inventory_changed`] gives it.
pub fn fleet_option_text(index: usize, changed: bool) -> String {
    let tag = if changed { "moved" } else { "rack" };
    format!("{tag}-{}/{index}", index / 40)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_hosts_follow_the_same_hosts_unchanged() {
        let base = fleet_inventory(3, 0);
        let grown = fleet_inventory(3, 2);
        assert!(grown.starts_with(&base), "{grown}");
        assert_eq!(grown.lines().count(), base.lines().count() + 2);
        assert!(grown.contains("mac: \"02:fe:00:00:00:04\", ip: 10.68.0.5, hostname: node-4"));
    }

    #[test]
    fn a_changed_host_differs_in_its_option_only() {
        let base = fleet_inventory(3, 0);
        let changed = fleet_inventory_changed(3, 1);
        let diff: Vec<(&str, &str)> = base
            .lines()
            .zip(changed.lines())
            .filter(|(a, b)| a != b)
            .collect();
        assert_eq!(diff.len(), 1, "{diff:?}");
        assert!(diff[0].0.contains("224: \"rack-0/1\""));
        assert!(diff[0].1.contains("224: \"moved-0/1\""));
    }

    #[test]
    fn objects_hold_the_same_hosts_as_the_file() {
        let objects = fleet_objects(3);
        assert_eq!(objects.matches("kind: BootHost\n").count(), 3);
        assert!(objects.contains(
            "spec: {mac: \"02:fe:00:00:00:02\", ip: 10.68.0.3, hostname: node-2, profile: fleet, \
             options: {\"224\": \"rack-0/2\"}}"
        ));
        assert!(objects.contains(r#""leaseTime":3600}"#), "{objects}");
        let leasing = fleet_inventory_leasing(3, 600);
        assert!(leasing.contains("lease_time: 600\n"), "{leasing}");
        assert_eq!(leasing.replace("600", "3600"), fleet_inventory(3, 0));
    }

    #[test]
    fn the_largest_fleet_stays_in_the_subnet_clear_of_the_lab() {
        let last = fleet_ip(MAX_FLEET - 1);
        assert_eq!(last, Ipv4Addr::new(10, 79, 255, 254));
        assert!(fleet_ip(251_000).octets()[1] < 80);
        assert!(fleet_ip(0).octets()[1] > 66);
    }
}

//! Who a DHCPv6 client is: the DUID it names itself by (RFC 8415 section
//! 11), the MAC an EUI-64 link-local address carries, and the text form of
//! a system UUID an operator writes in the inventory. It does not decide
//! which of these a host is matched by; that is the policy's.
//!
//! # The system UUID in a DUID-UUID
//!
//! RFC 6355 puts a 128-bit UUID after the type (4), in the network byte
//! order of RFC 4122: the 16 bytes as the canonical text reads them, the
//! text `dmidecode -s system-uuid` prints and QEMU's `-uuid` takes. SMBIOS
//! 2.6 and later store the system UUID with its first three fields
//! (4, 2 and 2 bytes) little-endian, as an EFI GUID is laid out in memory;
//! dmidecode swaps them back before printing, and QEMU swaps them when it
//! builds the table (`hw/smbios/smbios.c`, `smbios_encode_uuid`).
//!
//! The two firmware families that boot over the network here do not agree
//! on which of the two layouts goes into DUID-UUID:
//!
//! - iPXE sends the RFC 4122 order. `src/net/udp/dhcpv6.c`, `start_dhcpv6`,
//!   copies `fetch_uuid_setting(NULL, &uuid_setting, ..)` into the DUID
//!   unchanged, and `src/interface/smbios/smbios_settings.c`,
//!   `smbios_fetch`, has already swapped the first three fields of an
//!   SMBIOS 2.6+ UUID into network order (the same rule dmidecode follows).
//!   Its DHCPv4 option 97, by contrast, is swapped back to the EFI layout
//!   (`src/net/udp/dhcp.c`, `dhcp_create_request`, `uuid_mangle`).
//! - edk2 (OVMF, and the UEFI PXE and HTTP boot drivers built on its
//!   DHCPv6 driver) sends the SMBIOS layout. `NetworkPkg/Dhcp6Dxe/
//!   Dhcp6Utility.c`, `Dhcp6GenerateClientId`, copies the `EFI_GUID` that
//!   `NetworkPkg/Library/DxeNetLib/DxeNetLib.c`, `NetLibGetSystemGuid`,
//!   byte-copied out of the SMBIOS type 1 table, without a swap. It does
//!   so only when `PcdDhcp6UidType` is 4 (the NetworkPkg default) and the
//!   UUID is not all zeros (as it is under QEMU without `-uuid`);
//!   otherwise it sends a DUID-LLT. It keeps the first DUID it made in the
//!   non-volatile `ClientId` variable, so a machine whose UUID is set or
//!   changed later goes on sending the old DUID until that variable goes.
//!
//! So for `-uuid 2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e`, iPXE sends
//! `2b 6a 81 e4 5b 6f 4c 2a 9d 3e 7f 0a 1b 2c 3d 4e` and OVMF sends
//! `e4 81 6a 2b 6f 5b 2a 4c 9d 3e 7f 0a 1b 2c 3d 4e`. [`Duid::Uuid`] holds
//! the 16 bytes as sent, so [`uuid_text`](crate::inventory::uuid_text) of it is the operator's text for
//! iPXE, and [`uuid_text`](crate::inventory::uuid_text) of [`swap_uuid_fields`] of it is for edk2;
//! [`Duid::system_uuids`] gives both and [`Duid::names_uuid`] matches
//! either. Nothing in a DUID says which firmware sent it (a request's user
//! class `iPXE` does). Matching either would take two machines whose UUIDs
//! are each other's field swap for each other; real UUIDs are not such
//! pairs.

use std::net::Ipv6Addr;

use crate::mac::MacAddr;

/// What a DUID says about its client (RFC 8415 section 11, RFC 6355).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Duid {
    /// DUID-LLT (type 1) of an Ethernet address.
    LinkLayerTime(MacAddr),
    /// DUID-LL (type 3) of an Ethernet address.
    LinkLayer(MacAddr),
    /// DUID-UUID (type 4): the 16 bytes as sent; see the module
    /// documentation for their order.
    Uuid([u8; 16]),
    /// DUID-EN (type 2), a link-layer DUID of another hardware type or
    /// length, an unknown type or a malformed DUID.
    Other,
}

/// DUID types (RFC 8415 section 11.1, RFC 6355 section 4).
const DUID_LLT: u16 = 1;
const DUID_LL: u16 = 3;
const DUID_UUID: u16 = 4;

/// Hardware type 1, Ethernet (IANA ARP parameters), as link-layer DUIDs
/// and the client link-layer address option (RFC 6939) name it.
pub(super) const HTYPE_ETHERNET: u16 = 1;

impl Duid {
    /// Reads a DUID (the value of option 1 or 2). Never fails: what is not
    /// an Ethernet link-layer DUID or a well-formed DUID-UUID is `Other`.
    pub fn parse(bytes: &[u8]) -> Duid {
        let Some((kind, rest)) = split_u16(bytes) else {
            return Duid::Other;
        };
        match kind {
            // Type, hardware type, time (seconds since 2000), address.
            DUID_LLT => split_u16(rest)
                .and_then(|(htype, rest)| ethernet(htype, rest.get(4..)?))
                .map_or(Duid::Other, Duid::LinkLayerTime),
            // Type, hardware type, address.
            DUID_LL => split_u16(rest)
                .and_then(|(htype, rest)| ethernet(htype, rest))
                .map_or(Duid::Other, Duid::LinkLayer),
            DUID_UUID => <[u8; 16]>::try_from(rest).map_or(Duid::Other, Duid::Uuid),
            _ => Duid::Other,
        }
    }

    /// The MAC of a link-layer DUID. A DUID-LLT names an interface of the
    /// client when the DUID was made, not necessarily the one it asks on.
    pub fn mac(&self) -> Option<MacAddr> {
        match self {
            Duid::LinkLayerTime(mac) | Duid::LinkLayer(mac) => Some(*mac),
            Duid::Uuid(_) | Duid::Other => None,
        }
    }

    /// The system UUID of a DUID-UUID in the order its text reads, under
    /// both conventions: first as sent (RFC 6355; iPXE), then with the
    /// first three fields swapped (the SMBIOS layout; edk2).
    pub fn system_uuids(&self) -> Option<[[u8; 16]; 2]> {
        match self {
            Duid::Uuid(sent) => Some([*sent, swap_uuid_fields(*sent)]),
            _ => None,
        }
    }

    /// Whether this is a DUID-UUID of `uuid` (in text order, as
    /// [`parse_uuid`](crate::inventory::parse_uuid) returns it) under either convention.
    pub fn names_uuid(&self, uuid: &[u8; 16]) -> bool {
        self.system_uuids()
            .is_some_and(|readings| readings.contains(uuid))
    }
}

/// A big-endian u16 and what follows it.
fn split_u16(bytes: &[u8]) -> Option<(u16, &[u8])> {
    match bytes {
        [hi, lo, rest @ ..] => Some((u16::from_be_bytes([*hi, *lo]), rest)),
        _ => None,
    }
}

/// An Ethernet address: hardware type 1 and six bytes, nothing else.
pub(super) fn ethernet(htype: u16, addr: &[u8]) -> Option<MacAddr> {
    if htype != HTYPE_ETHERNET {
        return None;
    }
    <[u8; 6]>::try_from(addr).ok().map(MacAddr)
}

/// Swaps the first three fields of a UUID (4, 2 and 2 bytes) end for end:
/// the RFC 4122 order to the SMBIOS 2.6+ / EFI GUID layout and back.
pub fn swap_uuid_fields(uuid: [u8; 16]) -> [u8; 16] {
    let mut out = uuid;
    out[..4].reverse();
    out[4..6].reverse();
    out[6..8].reverse();
    out
}

/// The MAC in a modified EUI-64 interface identifier (RFC 4291 appendix A)
/// of a link-local address in fe80::/64: the interface id with `ff:fe` in
/// its middle, the universal/local bit (0x02 of the first octet) flipped
/// back. Addresses with privacy or stable-opaque interface ids (RFC 8981,
/// RFC 7217) carry no MAC and give `None`.
pub fn mac_from_eui64(addr: Ipv6Addr) -> Option<MacAddr> {
    let o = addr.octets();
    if o[..8] != [0xfe, 0x80, 0, 0, 0, 0, 0, 0] || o[11] != 0xff || o[12] != 0xfe {
        return None;
    }
    Some(MacAddr([o[8] ^ 0x02, o[9], o[10], o[13], o[14], o[15]]))
}

/// The fe80::/64 address whose modified EUI-64 interface identifier holds
/// `mac`, as SLAAC forms it (RFC 4862, RFC 4291 appendix A).
pub fn eui64_link_local(mac: MacAddr) -> Ipv6Addr {
    let [a, b, c, d, e, f] = mac.0;
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        a ^ 0x02,
        b,
        c,
        0xff,
        0xfe,
        d,
        e,
        f,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{parse_uuid, uuid_text};

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);

    #[test]
    fn a_duid_llt_of_an_ethernet_address_names_its_mac() {
        let duid = [
            0x00, 0x01, // DUID-LLT
            0x00, 0x01, // hardware type 1, Ethernet
            0x2c, 0xa9, 0x3f, 0x79, // time
            0x52, 0x54, 0x00, 0x12, 0x34, 0x56, // link-layer address
        ];
        assert_eq!(Duid::parse(&duid), Duid::LinkLayerTime(MAC));
        assert_eq!(Duid::parse(&duid).mac(), Some(MAC));
    }

    #[test]
    fn a_duid_ll_of_an_ethernet_address_names_its_mac() {
        let duid = [0x00, 0x03, 0x00, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        assert_eq!(Duid::parse(&duid), Duid::LinkLayer(MAC));
        assert_eq!(Duid::parse(&duid).mac(), Some(MAC));
    }

    #[test]
    fn link_layer_duids_of_other_hardware_or_lengths_name_no_mac() {
        for duid in [
            // DUID-LL, hardware type 6 (IEEE 802).
            &[0x00, 0x03, 0x00, 0x06, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56][..],
            // DUID-LLT, hardware type 32 (InfiniBand), 20-byte address.
            &[
                0x00, 0x01, 0x00, 0x20, 0, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                15, 16, 17, 18, 19, 20,
            ],
            // Ethernet, but five bytes, or seven.
            &[0x00, 0x03, 0x00, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34],
            &[
                0x00, 0x03, 0x00, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x78,
            ],
            // DUID-LLT cut inside its time field.
            &[0x00, 0x01, 0x00, 0x01, 0x2c, 0xa9],
            // DUID-EN (enterprise 311).
            &[0x00, 0x02, 0x00, 0x00, 0x01, 0x37, 0xaa, 0xbb],
            // Unknown type, and too short for a type.
            &[0x00, 0x09, 0x01],
            &[0x00],
            &[],
        ] {
            assert_eq!(Duid::parse(duid).mac(), None, "{duid:02x?}");
            assert!(
                matches!(Duid::parse(duid), Duid::Other),
                "{duid:02x?} is {:?}",
                Duid::parse(duid)
            );
        }
    }

    #[test]
    fn a_duid_uuid_holds_the_sixteen_bytes_as_sent() {
        let mut duid = vec![0x00, 0x04];
        duid.extend(0u8..16);
        let sent: [u8; 16] = std::array::from_fn(|i| i as u8);
        assert_eq!(Duid::parse(&duid), Duid::Uuid(sent));
        assert_eq!(Duid::parse(&duid).mac(), None);
        // Fifteen or seventeen bytes are not a UUID.
        assert_eq!(Duid::parse(&duid[..17]), Duid::Other);
        duid.push(16);
        assert_eq!(Duid::parse(&duid), Duid::Other);
    }

    #[test]
    fn ipxe_and_edk2_duid_uuids_both_name_the_operators_uuid() {
        // `qemu -uuid 2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e`.
        let uuid = parse_uuid("2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e").expect("parses");
        let ipxe = Duid::Uuid([
            0x2b, 0x6a, 0x81, 0xe4, 0x5b, 0x6f, 0x4c, 0x2a, 0x9d, 0x3e, 0x7f, 0x0a, 0x1b, 0x2c,
            0x3d, 0x4e,
        ]);
        let edk2 = Duid::Uuid([
            0xe4, 0x81, 0x6a, 0x2b, 0x6f, 0x5b, 0x2a, 0x4c, 0x9d, 0x3e, 0x7f, 0x0a, 0x1b, 0x2c,
            0x3d, 0x4e,
        ]);
        let [as_sent, _] = ipxe.system_uuids().expect("a uuid");
        assert_eq!(uuid_text(&as_sent), "2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e");
        let [_, swapped] = edk2.system_uuids().expect("a uuid");
        assert_eq!(uuid_text(&swapped), "2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4e");
        assert!(ipxe.names_uuid(&uuid) && edk2.names_uuid(&uuid));
        let other = parse_uuid("2b6a81e4-5b6f-4c2a-9d3e-7f0a1b2c3d4f").expect("parses");
        assert!(!ipxe.names_uuid(&other) && !edk2.names_uuid(&other));
        assert!(!Duid::LinkLayer(MAC).names_uuid(&uuid));
    }

    #[test]
    fn swapping_the_uuid_fields_twice_is_no_swap() {
        let uuid: [u8; 16] = std::array::from_fn(|i| i as u8);
        assert_eq!(
            swap_uuid_fields(uuid),
            [3, 2, 1, 0, 5, 4, 7, 6, 8, 9, 10, 11, 12, 13, 14, 15]
        );
        assert_eq!(swap_uuid_fields(swap_uuid_fields(uuid)), uuid);
    }

    #[test]
    fn eui64_link_locals_round_trip_to_their_mac() {
        let addr = eui64_link_local(MAC);
        assert_eq!(addr, "fe80::5054:ff:fe12:3456".parse::<Ipv6Addr>().unwrap());
        assert_eq!(mac_from_eui64(addr), Some(MAC));
        // A locally administered MAC has the U/L bit set; it comes out clear.
        let local = MacAddr([0x02, 0, 0, 0, 0, 1]);
        assert_eq!(
            eui64_link_local(local),
            "fe80::ff:fe00:1".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(mac_from_eui64(eui64_link_local(local)), Some(local));
    }

    #[test]
    fn addresses_without_an_eui64_link_local_id_give_no_mac() {
        for addr in [
            // Stable opaque (RFC 7217) and privacy interface ids.
            "fe80::1c2b:3a4d:5e6f:7081",
            "fe80::1",
            // EUI-64 shaped, but not link-local, or not in fe80::/64.
            "2001:db8::5054:ff:fe12:3456",
            "fe80:0:0:1:5054:ff:fe12:3456",
            // ff:fe one byte early.
            "fe80::5054:fffe:1234:5600",
        ] {
            let addr: Ipv6Addr = addr.parse().expect("an address");
            assert_eq!(mac_from_eui64(addr), None, "{addr}");
        }
    }
}

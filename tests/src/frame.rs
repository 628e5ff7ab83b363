//! Test frames: DHCP requests as clients and relays send them, and a parser
//! for the frames the fast path sends back.

use std::net::Ipv4Addr;

use dhcproto::{
    Encodable as _, Encoder,
    v4::{DhcpOption, Flags, HType, Message, MessageType, Opcode, OptionCode, UnknownOption},
};

/// What a test request carries.
#[derive(Clone, Debug)]
pub struct Req {
    pub mac: [u8; 6],
    pub msg_type: MessageType,
    pub xid: u32,
    pub broadcast: bool,
    pub ciaddr: Ipv4Addr,
    pub giaddr: Ipv4Addr,
    pub requested_ip: Option<Ipv4Addr>,
    pub server_id: Option<Ipv4Addr>,
    pub arch: Option<u16>,
    pub vendor: Option<&'static [u8]>,
    pub user_class: Option<&'static [u8]>,
    pub opt175: bool,
    pub relay_info: bool,
    /// Raw options appended before the end option.
    pub extra: Vec<(u8, Vec<u8>)>,
}

impl Req {
    pub fn discover(mac: [u8; 6]) -> Req {
        Req {
            mac,
            msg_type: MessageType::Discover,
            xid: 0x1234_5678,
            broadcast: false,
            ciaddr: Ipv4Addr::UNSPECIFIED,
            giaddr: Ipv4Addr::UNSPECIFIED,
            requested_ip: None,
            server_id: None,
            arch: None,
            vendor: None,
            user_class: None,
            opt175: false,
            relay_info: false,
            extra: Vec::new(),
        }
    }

    pub fn pxe(mut self, arch: u16) -> Req {
        self.arch = Some(arch);
        self.vendor = Some(match arch {
            0 => b"PXEClient:Arch:00000:UNDI:002001",
            7 => b"PXEClient:Arch:00007:UNDI:003016",
            11 => b"PXEClient:Arch:00011:UNDI:003016",
            _ => b"PXEClient",
        });
        self
    }

    pub fn http(mut self) -> Req {
        self.arch = Some(16);
        self.vendor = Some(b"HTTPClient:Arch:00016:UNDI:003001");
        self
    }

    pub fn request(mut self) -> Req {
        self.msg_type = MessageType::Request;
        self
    }

    /// The BOOTP/DHCP message, padded to the 300 bytes clients send.
    pub fn payload(&self) -> Vec<u8> {
        let mut msg = Message::default();
        msg.set_opcode(Opcode::BootRequest)
            .set_htype(HType::Eth)
            .set_xid(self.xid)
            .set_flags(if self.broadcast {
                Flags::default().set_broadcast()
            } else {
                Flags::default()
            })
            .set_ciaddr(self.ciaddr)
            .set_giaddr(self.giaddr)
            .set_chaddr(&self.mac);
        if !self.giaddr.is_unspecified() {
            msg.set_hops(1);
        }
        let opts = msg.opts_mut();
        opts.insert(DhcpOption::MessageType(self.msg_type));
        opts.insert(DhcpOption::ParameterRequestList(vec![
            OptionCode::SubnetMask,
            OptionCode::Router,
            OptionCode::DomainNameServer,
            OptionCode::BootfileName,
        ]));
        if let Some(ip) = self.requested_ip {
            opts.insert(DhcpOption::RequestedIpAddress(ip));
        }
        if let Some(ip) = self.server_id {
            opts.insert(DhcpOption::ServerIdentifier(ip));
        }
        if let Some(arch) = self.arch {
            opts.insert(DhcpOption::ClientSystemArchitecture(arch.into()));
        }
        if let Some(v) = self.vendor {
            opts.insert(DhcpOption::ClassIdentifier(v.to_vec()));
        }
        if let Some(u) = self.user_class {
            opts.insert(DhcpOption::UserClass(u.to_vec()));
        }
        if self.opt175 {
            opts.insert(DhcpOption::Unknown(UnknownOption::new(
                175.into(),
                vec![19, 1, 1],
            )));
        }
        if self.relay_info {
            // Circuit id "eth0" (RFC 3046 sub-option 1).
            opts.insert(DhcpOption::Unknown(UnknownOption::new(
                82.into(),
                vec![1, 4, b'e', b't', b'h', b'0'],
            )));
        }
        for (code, value) in &self.extra {
            opts.insert(DhcpOption::Unknown(UnknownOption::new(
                (*code).into(),
                value.clone(),
            )));
        }
        let mut buf = Vec::new();
        msg.encode(&mut Encoder::new(&mut buf))
            .expect("test request encodes");
        if buf.len() < 300 {
            buf.resize(300, 0);
        }
        buf
    }

    /// The frame as the client (or, with a giaddr, the relay) sends it.
    pub fn frame(&self) -> Vec<u8> {
        self.frame_for(&self.payload())
    }

    /// The frame this request's sender would carry `payload` in.
    pub fn frame_for(&self, payload: &[u8]) -> Vec<u8> {
        if self.giaddr.is_unspecified() {
            let src = if self.ciaddr.is_unspecified() {
                Ipv4Addr::UNSPECIFIED
            } else {
                self.ciaddr
            };
            udp_frame(
                self.mac,
                [0xff; 6],
                src,
                Ipv4Addr::BROADCAST,
                68,
                67,
                payload,
            )
        } else {
            udp_frame(
                RELAY_MAC,
                SERVER_MAC,
                self.giaddr,
                SERVER_IP,
                67,
                67,
                payload,
            )
        }
    }
}

pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 66, 0, 1);
pub const SERVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const RELAY_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x99];

/// Ethernet + IPv4 + UDP around `payload`, with a valid IPv4 checksum and a
/// zero UDP checksum, as DHCP clients commonly send.
pub fn udp_frame(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::with_capacity(42 + payload.len());
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let total = (20 + 8 + payload.len()) as u16;
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let c = !fold(sum_words(&ip));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// `payload` broadcast from a client without an address, as PXE firmware
/// sends its DISCOVER.
pub fn client_broadcast(mac: [u8; 6], payload: &[u8]) -> Vec<u8> {
    udp_frame(
        mac,
        [0xff; 6],
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::BROADCAST,
        68,
        67,
        payload,
    )
}

/// Inserts an 802.1Q tag after the MAC addresses.
pub fn vlan_tagged(frame: &[u8], vid: u16) -> Vec<u8> {
    let mut f = frame[..12].to_vec();
    f.extend_from_slice(&0x8100u16.to_be_bytes());
    f.extend_from_slice(&vid.to_be_bytes());
    f.extend_from_slice(&frame[12..]);
    f
}

fn sum_words(bytes: &[u8]) -> u32 {
    bytes
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum()
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// A reply frame taken apart, with its checksums verified.
#[derive(Debug)]
pub struct Reply {
    pub eth_dst: [u8; 6],
    pub eth_src: [u8; 6],
    pub ip_src: Ipv4Addr,
    pub ip_dst: Ipv4Addr,
    pub ip_csum_ok: bool,
    pub sport: u16,
    pub dport: u16,
    pub udp_csum_ok: bool,
    pub payload: Vec<u8>,
}

pub fn parse_reply(f: &[u8]) -> Reply {
    assert!(
        f.len() >= 42,
        "reply frame of {} bytes is too short",
        f.len()
    );
    assert_eq!(&f[12..14], &[0x08, 0x00], "reply is not IPv4");
    let ip = &f[14..34];
    assert_eq!(ip[0], 0x45, "reply has IP options");
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    assert_eq!(
        14 + total,
        f.len(),
        "IP total length disagrees with the frame"
    );
    let udp = &f[34..42];
    let udp_len = u16::from_be_bytes([udp[4], udp[5]]) as usize;
    assert_eq!(udp_len + 20, total, "UDP length disagrees with IP");
    let src: [u8; 4] = ip[12..16].try_into().unwrap();
    let dst: [u8; 4] = ip[16..20].try_into().unwrap();
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src);
    pseudo.extend_from_slice(&dst);
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&(udp_len as u16).to_be_bytes());
    let udp_sum = sum_words(&pseudo) + sum_words(&f[34..34 + udp_len]);
    Reply {
        eth_dst: f[0..6].try_into().unwrap(),
        eth_src: f[6..12].try_into().unwrap(),
        ip_src: src.into(),
        ip_dst: dst.into(),
        ip_csum_ok: fold(sum_words(ip)) == 0xffff,
        sport: u16::from_be_bytes([udp[0], udp[1]]),
        dport: u16::from_be_bytes([udp[2], udp[3]]),
        udp_csum_ok: udp[6..8] != [0, 0] && fold(udp_sum) == 0xffff,
        payload: f[42..].to_vec(),
    }
}

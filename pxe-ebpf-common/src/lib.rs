//! Types and rules shared by the XDP program (`pxe-ebpf`) and the agent.
//!
//! Owns the layout of every BPF map key and value, the counter indices, the
//! BOOTP/DHCP wire constants and the small scalar rules (boot class,
//! reply destination) that both the fast path and the slow path must apply
//! identically. It does not own DHCP policy: that is `pxe_agent::dhcp`.
#![no_std]

use core::mem::size_of;

/// Name of the hash map of per-host reply records ([`HostRecord`]), keyed
/// by [`MacKey`]: one entry per port of every host.
pub const HOSTS_MAP: &str = "HOSTS";
/// Name of the array of reply bodies ([`ReplyBody`]): the parts of replies
/// that hosts share, indexed by the slots of [`HostRecord::bodies`].
pub const BODIES_MAP: &str = "BODIES";
/// Name of the per-CPU counter array, indexed by [`Counter`].
pub const COUNTERS_MAP: &str = "COUNTERS";
/// Name of the XDP program inside the object.
pub const PROGRAM_NAME: &str = "pxe_xdp";
/// Name of the pass-through program for veth peers in labs.
pub const PASS_PROGRAM_NAME: &str = "pxe_pass";
/// Name of the lab program that redirects every frame to another interface.
pub const REDIRECT_PROGRAM_NAME: &str = "pxe_redirect";
/// Name of its one-slot device map.
pub const REDIRECT_MAP: &str = "REDIRECT_TO";
/// Name of the array of [`ServedEvent`] slots: [`EVENT_SLOTS`] for each
/// possible CPU, CPU `c`'s from `c * EVENT_SLOTS`, each CPU's used as a
/// ring that overwrites its oldest event. Memory-mapped by the agent, which
/// keeps how far it has read each CPU's slots in entries after them.
pub const EVENTS_MAP: &str = "EVENTS";
/// Name of the per-CPU count of events the program wrote ([`EVENTS_MAP`]).
pub const EVENT_HEADS_MAP: &str = "EVENT_HEADS";
/// Event slots per CPU (a power of two): at the agent's drain interval,
/// the most replies one CPU can send between two drains without losing
/// the oldest.
pub const EVENT_SLOTS: u32 = 8192;
/// The map flag that lets userspace `mmap` an array (`BPF_F_MMAPABLE`).
pub const BPF_F_MMAPABLE: u32 = 1 << 10;
/// Capacity of [`HOSTS_MAP`] as compiled into the object, and the least the
/// agent gives it when it sizes the map to the inventory at load time. The
/// map allocates entries as they are written; its capacity costs only the
/// hash buckets (16 bytes each), so an agent started with a few hosts can
/// take a reload to a quarter of a million.
pub const DEFAULT_HOSTS: u32 = 262_144;
/// Capacity of [`BODIES_MAP`] as compiled into the object; sized like
/// [`DEFAULT_HOSTS`].
pub const DEFAULT_BODIES: u32 = 1024;
/// Name of the hash map of traced MACs, keyed by [`TraceKey`].
pub const TRACED_MAP: &str = "TRACED";
/// Name of the one-slot array holding how many MACs [`TRACED_MAP`] holds:
/// the XDP program reads it first, so an untraced agent pays one array
/// read per request.
pub const TRACE_GATE_MAP: &str = "TRACE_GATE";
/// Name of the ring buffer of [`TraceRecord`]s.
pub const TRACE_MAP: &str = "TRACE";
/// Capacity of [`TRACE_MAP`] in bytes.
pub const TRACE_BYTES: u32 = 64 * 1024;
/// MACs traced at once.
pub const MAX_TRACED: u32 = 64;

/// BOOTP/DHCP wire layout (RFC 2131 section 2, RFC 2132).
pub mod bootp {
    pub const SERVER_PORT: u16 = 67;
    pub const CLIENT_PORT: u16 = 68;
    pub const OP_REQUEST: u8 = 1;
    pub const OP_REPLY: u8 = 2;
    pub const HTYPE_ETHER: u8 = 1;
    pub const HLEN_ETHER: u8 = 6;
    /// Offsets inside the BOOTP message (the UDP payload).
    pub const OFF_OP: usize = 0;
    pub const OFF_HTYPE: usize = 1;
    pub const OFF_HLEN: usize = 2;
    pub const OFF_XID: usize = 4;
    pub const OFF_SECS: usize = 8;
    pub const OFF_FLAGS: usize = 10;
    pub const OFF_CIADDR: usize = 12;
    pub const OFF_YIADDR: usize = 16;
    pub const OFF_SIADDR: usize = 20;
    pub const OFF_GIADDR: usize = 24;
    pub const OFF_CHADDR: usize = 28;
    pub const OFF_SNAME: usize = 44;
    pub const OFF_FILE: usize = 108;
    pub const OFF_COOKIE: usize = 236;
    pub const OFF_OPTIONS: usize = 240;
    pub const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];
    /// The broadcast bit of `flags` (RFC 2131 section 2, figure 2).
    pub const FLAG_BROADCAST: u16 = 0x8000;

    pub const OPT_PAD: u8 = 0;
    pub const OPT_END: u8 = 255;
    pub const OPT_REQUESTED_IP: u8 = 50;
    pub const OPT_OVERLOAD: u8 = 52;
    pub const OPT_MESSAGE_TYPE: u8 = 53;
    pub const OPT_SERVER_ID: u8 = 54;
    pub const OPT_VENDOR_CLASS: u8 = 60;
    pub const OPT_USER_CLASS: u8 = 77;
    pub const OPT_RELAY_AGENT_INFO: u8 = 82;
    pub const OPT_CLIENT_ARCH: u8 = 93;
    /// Client machine identifier (RFC 4578 section 2.3), echoed in
    /// proxyDHCP answers.
    pub const OPT_CLIENT_UUID: u8 = 97;
    /// Vendor-specific information (RFC 2132 section 8.4): PXE's options.
    pub const OPT_VENDOR_INFO: u8 = 43;
    /// The PXE boot server port a proxyDHCP client sends its follow-up
    /// DHCPREQUEST to (PXE 2.1 section 2.2.3).
    pub const PXE_PORT: u16 = 4011;
    /// iPXE's encapsulated options (sent by iPXE itself, never by a PXE ROM).
    pub const OPT_IPXE_ENCAP: u8 = 175;

    pub const DHCPDISCOVER: u8 = 1;
    pub const DHCPOFFER: u8 = 2;
    pub const DHCPREQUEST: u8 = 3;
    pub const DHCPACK: u8 = 5;

    /// Vendor class prefixes (RFC 4578 section 2.1, UEFI 2.5 HTTP boot).
    pub const PXE_CLIENT: &[u8; 9] = b"PXEClient";
    pub const HTTP_CLIENT: &[u8; 10] = b"HTTPClient";

    /// Room for a reply in a template: the 576-byte minimum IP datagram every
    /// client accepts (RFC 2131 section 2) minus the IPv4 and UDP headers.
    pub const TEMPLATE_BYTES: usize = 548;
    /// Largest reply: a little under `TEMPLATE_BYTES` so the XDP program can
    /// bound its copy length with a 9-bit mask the verifier understands.
    pub const MAX_REPLY: usize = 544;
    /// Replies are padded to the BOOTP minimum (RFC 1542 section 3.4).
    pub const MIN_REPLY: usize = 300;
    /// Room for a host's own options in its [`super::HostRecord`]: host
    /// name and a few extra options. A host whose own options need more
    /// gets bodies of its own that hold them.
    pub const HOST_BYTES: usize = 128;
    /// The padding and end option after the host's options: at most
    /// `MIN_REPLY - (OFF_OPTIONS + 1)` bytes, since every reply carries at
    /// least one option, the message type.
    pub const MAX_TAIL: usize = 64;
}

/// What the firmware is asking for, from option 93 and option 60.
///
/// A host's [`HostRecord`] names one [`ReplyBody`] per class its profile
/// can answer.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BootClass {
    /// A plain DHCP client: an address, no boot answer.
    Plain = 0,
    /// Legacy BIOS PXE (arch 0).
    Bios = 1,
    /// UEFI x86-64 PXE (arch 7 or 9).
    UefiX64 = 2,
    /// UEFI arm64 PXE (arch 11).
    UefiArm64 = 3,
    /// UEFI x64 HTTP boot (vendor class "HTTPClient", arch 16, or no
    /// option 93).
    Http = 4,
    /// UEFI arm64 HTTP boot ("HTTPClient", arch 19).
    HttpArm64 = 5,
    /// UEFI IA32 HTTP boot ("HTTPClient", arch 15).
    HttpIa32 = 6,
}

impl BootClass {
    /// The option 93 values (`None`: no option 93) of the requests
    /// [`boot_class`] puts in this class; rules are compiled per class when
    /// their outcome is the same for all of them.
    pub const fn arches(self) -> &'static [Option<u16>] {
        match self {
            BootClass::Plain => &[None],
            BootClass::Bios => &[None, Some(0)],
            BootClass::UefiX64 => &[Some(7), Some(9)],
            BootClass::UefiArm64 => &[Some(11)],
            BootClass::Http => &[None, Some(16)],
            BootClass::HttpArm64 => &[Some(19)],
            BootClass::HttpIa32 => &[Some(15)],
        }
    }

    pub const ALL: [BootClass; 7] = [
        BootClass::Plain,
        BootClass::Bios,
        BootClass::UefiX64,
        BootClass::UefiArm64,
        BootClass::Http,
        BootClass::HttpArm64,
        BootClass::HttpIa32,
    ];
}

/// The vendor class (option 60) as far as boot selection cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VendorClass {
    None,
    PxeClient,
    HttpClient,
    Other,
}

impl VendorClass {
    /// Classifies an option 60 value by its prefix.
    pub fn from_prefix(value: &[u8]) -> VendorClass {
        if has_prefix(value, bootp::HTTP_CLIENT) {
            VendorClass::HttpClient
        } else if has_prefix(value, bootp::PXE_CLIENT) {
            VendorClass::PxeClient
        } else {
            VendorClass::Other
        }
    }
}

/// `value.starts_with(prefix)` compared a byte at a time: the slice method
/// compiles to a call to `memcmp`, which the XDP program pays for as a
/// function call on every request.
#[inline(always)]
fn has_prefix<const N: usize>(value: &[u8], prefix: &[u8; N]) -> bool {
    let Some(head) = value.first_chunk::<N>() else {
        return false;
    };
    let mut diff = 0;
    let mut i = 0;
    while i < N {
        diff |= head[i] ^ prefix[i];
        i += 1;
    }
    diff == 0
}

/// Picks the boot class of a request (RFC 4578 section 2.1 architecture
/// types). `None` means the request names a firmware we have no rule for:
/// neither path guesses, the slow path decides.
pub fn boot_class(arch: Option<u16>, vendor: VendorClass) -> Option<BootClass> {
    match (vendor, arch) {
        (VendorClass::HttpClient, Some(16) | None) => Some(BootClass::Http),
        (VendorClass::HttpClient, Some(19)) => Some(BootClass::HttpArm64),
        (VendorClass::HttpClient, Some(15)) => Some(BootClass::HttpIa32),
        (VendorClass::HttpClient, Some(_)) => None,
        (VendorClass::PxeClient, None | Some(0)) => Some(BootClass::Bios),
        (VendorClass::PxeClient, Some(7 | 9)) => Some(BootClass::UefiX64),
        (VendorClass::PxeClient, Some(11)) => Some(BootClass::UefiArm64),
        (VendorClass::PxeClient, Some(_)) => None,
        // Option 93 without a PXE vendor class is not a PXE client we know.
        (VendorClass::None | VendorClass::Other, Some(_)) => None,
        (VendorClass::None | VendorClass::Other, None) => Some(BootClass::Plain),
    }
}

/// Where a reply goes (RFC 2131 section 4.1, "the server ... sends ...").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyDestination {
    /// Unicast to the relay at `giaddr`, server port 67.
    Relay,
    /// Unicast to `ciaddr`, client port 68 (renewing client).
    Ciaddr,
    /// Broadcast 255.255.255.255:68 (client asked for broadcast).
    Broadcast,
    /// Unicast to `yiaddr` and `chaddr`, client port 68.
    Yiaddr,
}

/// RFC 2131 section 4.1: giaddr first, then ciaddr, then the broadcast bit.
/// A reply without an address (`yiaddr` 0: a proxyDHCP offer) has no
/// unicast destination on the client's segment and is broadcast, as the
/// PXE specification (2.1, section 2.2.3) has proxy offers sent.
/// Addresses are in network byte order as read off the wire.
pub fn reply_destination(flags: u16, ciaddr: u32, giaddr: u32, yiaddr: u32) -> ReplyDestination {
    if giaddr != 0 {
        ReplyDestination::Relay
    } else if ciaddr != 0 {
        ReplyDestination::Ciaddr
    } else if flags & bootp::FLAG_BROADCAST != 0 || yiaddr == 0 {
        ReplyDestination::Broadcast
    } else {
        ReplyDestination::Yiaddr
    }
}

/// Key of [`HOSTS_MAP`] and of the trace filter: a client MAC.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacKey {
    pub mac: [u8; 6],
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<MacKey>() == 8);

impl MacKey {
    pub const fn new(mac: [u8; 6]) -> MacKey {
        MacKey { mac, _pad: [0; 2] }
    }
}

/// A slot of [`HostRecord::bodies`] for a class the host is not answered
/// in by the fast path.
pub const NO_BODY: u32 = u32::MAX;
/// Flag of a [`HostRecord::bodies`] slot: the body is the whole reply, the
/// host's own options included (they did not fit the record, or differ
/// between classes), so the record's `options` are not inserted.
pub const BODY_WHOLE: u32 = 1 << 31;

/// Value of [`HOSTS_MAP`]: what is the host's own in its replies.
///
/// A reply is `body.payload[..body.len]` (everything up to where the
/// host's options go, with yiaddr zero), then `options[..len]`, then the
/// end option and zero padding to [`bootp::MIN_REPLY`]; yiaddr is patched
/// in. Both parts are cut by the agent from one encoding of the reply.
/// When `len` leaves room, `options[len]` holds the end option and the
/// rest zeros, so the program copies options, end and padding at once.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostRecord {
    /// The reserved address, network byte order (yiaddr; 0 for proxy).
    pub yiaddr: [u8; 4],
    /// The [`BODIES_MAP`] slot of each [`BootClass`] (by discriminant),
    /// [`NO_BODY`] for a class the kernel passes, [`BODY_WHOLE`] set when
    /// the body holds the host's options itself.
    pub bodies: [u32; 7],
    /// One's-complement sum (RFC 1071, folded, host order) of
    /// `options[..len]` placed at an even offset.
    pub sum: u16,
    /// Bytes of `options` in use, at most [`bootp::HOST_BYTES`].
    pub len: u16,
    /// The host's own options (host name, extra options), encoded.
    pub options: [u8; bootp::HOST_BYTES],
}
const _: () = assert!(size_of::<HostRecord>() == 36 + bootp::HOST_BYTES);

impl HostRecord {
    pub const fn zeroed() -> HostRecord {
        HostRecord {
            yiaddr: [0; 4],
            bodies: [NO_BODY; 7],
            sum: 0,
            len: 0,
            options: [0; bootp::HOST_BYTES],
        }
    }

    /// The body slot for `class` and whether the record's options go in,
    /// or `None` when the class is not answered.
    pub fn body(&self, class: BootClass) -> Option<(u32, bool)> {
        // black_box keeps the bounds check, which the verifier needs: the
        // compiler knows the discriminant is below 7, the verifier does not.
        match *self.bodies.get(core::hint::black_box(class as usize))? {
            NO_BODY => None,
            slot => Some((slot & !BODY_WHOLE, slot & BODY_WHOLE == 0)),
        }
    }
}

/// Value of [`BODIES_MAP`]: the shared part of a DHCP reply compiled by
/// the agent, ready to be spliced into the request's frame with a host's
/// [`HostRecord`].
///
/// `payload[..len]` is the BOOTP message as the agent's encoder wrote it
/// for a DHCPOFFER, up to the host's own options, with the per-request
/// fields (xid, flags, ciaddr, giaddr, chaddr) and yiaddr zeroed. The XDP
/// program copies it, keeps the request's xid, flags, giaddr and chaddr,
/// sets ciaddr for an ACK, puts in the host's address and options, ends
/// and pads the options, and patches the message type byte at
/// `msg_type_off`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReplyBody {
    /// The server's address, network byte order (IPv4 source, option 54).
    pub server_ip: [u8; 4],
    /// The hosts' subnet, network byte order, for checking a relay's giaddr.
    pub subnet: [u8; 4],
    /// Netmask of `subnet`, network byte order.
    pub netmask: [u8; 4],
    /// One's-complement sum (folded to 16 bits, host order) of
    /// `payload[..len]` as a DHCPOFFER and as a DHCPACK; the XDP program
    /// adds the host's part, the request's fields and the pseudo header to
    /// get the UDP checksum.
    pub csum_offer: u16,
    pub csum_ack: u16,
    /// Bytes of `payload` in use: more than [`bootp::OFF_OPTIONS`], less
    /// than [`bootp::MAX_REPLY`] with the host's options and the end.
    pub len: u16,
    /// Offset in `payload` of the option 53 value byte.
    pub msg_type_off: u16,
    /// The server interface's MAC, the Ethernet source of every reply.
    pub server_mac: [u8; 6],
    /// Nonzero for a proxyDHCP offer (a host of a subnet in mode proxy):
    /// DISCOVERs get it, REQUESTs on port 67 are the address server's.
    pub proxy: u8,
    pub _pad: [u8; 1],
    pub payload: [u8; bootp::TEMPLATE_BYTES],
}
const _: () = assert!(size_of::<ReplyBody>() == 28 + bootp::TEMPLATE_BYTES);

impl ReplyBody {
    pub const fn zeroed() -> ReplyBody {
        ReplyBody {
            server_ip: [0; 4],
            subnet: [0; 4],
            netmask: [0; 4],
            csum_offer: 0,
            csum_ack: 0,
            len: 0,
            msg_type_off: 0,
            server_mac: [0; 6],
            proxy: 0,
            _pad: [0; 1],
            payload: [0; bootp::TEMPLATE_BYTES],
        }
    }
}

/// One reply the fast path sent, streamed to the agent for boot progress;
/// or one DHCPREQUEST it dropped because the client selected another
/// server (`msg_type` [`bootp::DHCPREQUEST`]), streamed so the agent can
/// tell when another DHCP server answers its hosts.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServedEvent {
    /// When the reply was sent (or the REQUEST dropped):
    /// `bpf_ktime_get_coarse_ns`, i.e.
    /// `CLOCK_MONOTONIC_COARSE`: `CLOCK_MONOTONIC`'s base at tick resolution
    /// (read once a tick on each CPU, so up to a tick early).
    /// The agent drains the ring on a timer, so it needs the send time to
    /// order the answer against the host's later boot steps.
    pub at_ns: u64,
    /// The client's MAC (chaddr).
    pub mac: [u8; 6],
    /// `bootp::DHCPOFFER` or `bootp::DHCPACK` for a reply;
    /// `bootp::DHCPREQUEST` for a REQUEST naming another server, dropped.
    pub msg_type: u8,
    /// A [`BootClass`] discriminant.
    pub class: u8,
    /// The address answered, network byte order; for a dropped REQUEST,
    /// the server identifier (option 54) it named.
    pub yiaddr: [u8; 4],
    /// The slot's sequence number: the writing CPU's event count with this
    /// event (so never 0 for a written event, but for a wrap every 2^32).
    /// The program sets it to 0 before it overwrites a slot and writes it
    /// with `yiaddr`, in the slot's last 8-byte store; a reader that finds
    /// the number it expects both before and after copying the slot has an
    /// event that was not overwritten meanwhile.
    pub seq: u32,
}
const _: () = assert!(size_of::<ServedEvent>() == 24);

/// Key of [`TRACED_MAP`]: a client MAC (chaddr, or the Ethernet source).
pub type TraceKey = MacKey;

/// The fast path's verdict on one request of a traced MAC.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceRecord {
    /// `bpf_ktime_get_ns`: `CLOCK_MONOTONIC`, nanoseconds.
    pub at_ns: u64,
    /// The [`Counter`] the request was counted under.
    pub counter: u32,
    /// The XDP action returned (`XDP_PASS` 2, `XDP_TX` 3, `XDP_DROP` 1).
    pub action: u32,
    /// The request's xid, as on the wire.
    pub xid: [u8; 4],
    /// yiaddr of the frame as it left the program, network byte order:
    /// the address answered for `XDP_TX`, the request's (0) otherwise.
    pub yiaddr: [u8; 4],
    /// The traced MAC that matched.
    pub mac: [u8; 6],
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<TraceRecord>() == 32);

/// Indices of the per-CPU counter array: one per exit of the XDP program.
///
/// Keep the order; append new counters before `Count`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// DHCP requests seen (UDP to port 67, any outcome).
    Rx = 0,
    TxOffer,
    TxAck,
    /// MAC not in the map, or its host not answered in this boot class.
    PassUnknownHost,
    /// iPXE (user class, option 175): the slow path chains the script.
    PassIpxe,
    /// Relayed with option 82, or from a giaddr outside the host's subnet.
    PassRelay,
    /// VLAN-tagged frame.
    PassVlan,
    /// IPv4 options or fragments.
    PassIp,
    /// Truncated, inconsistent lengths, bad cookie, no end option.
    PassMalformed,
    /// More options than the bounded walk reads, or option overload.
    PassOptions,
    /// Firmware we have no rule for (option 93 value, vendor class).
    PassUnsupportedClient,
    /// Message types other than DISCOVER and REQUEST.
    PassMessageType,
    /// A REQUEST for an address that is not the reservation.
    PassRequestMismatch,
    /// The frame could not grow to the reply's size.
    PassNoRoom,
    /// A REQUEST selecting another server (RFC 2131 section 4.3.2).
    DropOtherServer,
    /// A helper failed.
    Error,
    /// The event ring buffer was full; the reply was still sent.
    EventLost,
    /// The trace ring buffer was full; the verdict stood.
    TraceLost,
    /// Ethernet destination neither broadcast nor this interface's, or IP
    /// destination neither broadcast nor this server's (a promiscuous
    /// port, a bridge member, a subnet-directed broadcast): left to the
    /// stack, which delivers what is this host's.
    PassNotForUs,
    /// A proxyDHCP offer sent (counted instead of `TxOffer`).
    TxProxyOffer,
    /// A request from a client that is not PXE firmware (no vendor class
    /// `PXEClient`) in a subnet in mode proxy: never answered, by either
    /// path. The slow path counts it; the kernel passes such requests as
    /// unknown hosts (it holds no template for them).
    IgnoreNotPxe,
    /// A PXE request with a client machine identifier (97) for a proxy
    /// template: the answer echoes it, so the slow path gives it.
    PassClientUuid,
    Count,
}

impl Counter {
    pub const ALL: [Counter; Counter::Count as usize] = [
        Counter::Rx,
        Counter::TxOffer,
        Counter::TxAck,
        Counter::PassUnknownHost,
        Counter::PassIpxe,
        Counter::PassRelay,
        Counter::PassVlan,
        Counter::PassIp,
        Counter::PassMalformed,
        Counter::PassOptions,
        Counter::PassUnsupportedClient,
        Counter::PassMessageType,
        Counter::PassRequestMismatch,
        Counter::PassNoRoom,
        Counter::DropOtherServer,
        Counter::Error,
        Counter::EventLost,
        Counter::TraceLost,
        Counter::PassNotForUs,
        Counter::TxProxyOffer,
        Counter::IgnoreNotPxe,
        Counter::PassClientUuid,
    ];

    /// Metric-friendly name.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::Rx => "rx",
            Counter::TxOffer => "tx_offer",
            Counter::TxAck => "tx_ack",
            Counter::PassUnknownHost => "pass_unknown_host",
            Counter::PassIpxe => "pass_ipxe",
            Counter::PassRelay => "pass_relay",
            Counter::PassVlan => "pass_vlan",
            Counter::PassIp => "pass_ip",
            Counter::PassMalformed => "pass_malformed",
            Counter::PassOptions => "pass_options",
            Counter::PassUnsupportedClient => "pass_unsupported_client",
            Counter::PassMessageType => "pass_message_type",
            Counter::PassRequestMismatch => "pass_request_mismatch",
            Counter::PassNoRoom => "pass_no_room",
            Counter::PassNotForUs => "pass_not_for_us",
            Counter::DropOtherServer => "drop_other_server",
            Counter::Error => "error",
            Counter::EventLost => "event_lost",
            Counter::TraceLost => "trace_lost",
            Counter::TxProxyOffer => "tx_proxy_offer",
            Counter::IgnoreNotPxe => "ignore_not_pxe",
            Counter::PassClientUuid => "pass_client_uuid",
            Counter::Count => "count",
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are repr(C) with explicit padding and no pointers.
    unsafe impl aya::Pod for super::MacKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::HostRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ReplyBody {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_class_follows_rfc4578_arch_types() {
        use BootClass::*;
        use VendorClass as V;
        let cases = [
            (None, V::None, Some(Plain)),
            (None, V::Other, Some(Plain)),
            (Some(0), V::PxeClient, Some(Bios)),
            (None, V::PxeClient, Some(Bios)),
            (Some(7), V::PxeClient, Some(UefiX64)),
            (Some(9), V::PxeClient, Some(UefiX64)),
            (Some(11), V::PxeClient, Some(UefiArm64)),
            (Some(16), V::HttpClient, Some(Http)),
            (None, V::HttpClient, Some(Http)),
            (Some(19), V::HttpClient, Some(HttpArm64)),
            (Some(15), V::HttpClient, Some(HttpIa32)),
            (Some(6), V::PxeClient, None),
            (Some(7), V::HttpClient, None),
            (Some(7), V::None, None),
        ];
        for (arch, vendor, want) in cases {
            assert_eq!(
                boot_class(arch, vendor),
                want,
                "arch {arch:?} vendor {vendor:?}"
            );
        }
    }

    #[test]
    fn class_arches_are_exactly_what_boot_class_maps_there() {
        let vendors = [
            VendorClass::None,
            VendorClass::PxeClient,
            VendorClass::HttpClient,
        ];
        for class in BootClass::ALL {
            for arch in [
                None,
                Some(0),
                Some(6),
                Some(7),
                Some(9),
                Some(11),
                Some(15),
                Some(16),
                Some(19),
            ] {
                let in_class = vendors.iter().any(|v| boot_class(arch, *v) == Some(class));
                assert_eq!(
                    in_class,
                    class.arches().contains(&arch),
                    "{class:?} arch {arch:?}"
                );
            }
        }
    }

    #[test]
    fn vendor_class_matches_prefixes() {
        assert_eq!(
            VendorClass::from_prefix(b"PXEClient:Arch:00007:UNDI:003016"),
            VendorClass::PxeClient
        );
        assert_eq!(
            VendorClass::from_prefix(b"HTTPClient:Arch:00016"),
            VendorClass::HttpClient
        );
        assert_eq!(VendorClass::from_prefix(b"udhcp 1.36"), VendorClass::Other);
    }

    #[test]
    fn reply_destination_prefers_giaddr_then_ciaddr_then_broadcast() {
        use ReplyDestination::*;
        assert_eq!(reply_destination(0x8000, 1, 2, 3), Relay);
        assert_eq!(reply_destination(0x8000, 1, 0, 3), Ciaddr);
        assert_eq!(reply_destination(0x8000, 0, 0, 3), Broadcast);
        assert_eq!(reply_destination(0, 0, 0, 3), Yiaddr);
        // A proxy offer names no address to unicast to.
        assert_eq!(reply_destination(0, 0, 0, 0), Broadcast);
    }

    #[test]
    fn counters_have_distinct_names() {
        for (i, a) in Counter::ALL.iter().enumerate() {
            for b in &Counter::ALL[i + 1..] {
                assert_ne!(a.name(), b.name());
            }
        }
    }

    #[test]
    fn counters_are_dense() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
    }
}

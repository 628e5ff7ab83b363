//! The fast-path decision and the in-place rewrite of a request into the
//! reply the agent compiled.
//!
//! The XDP program never builds reply content: it copies the bytes of a
//! `ReplyBody` and of the host's `HostRecord`, ends and pads the options,
//! and patches the per-request fields of RFC 2131 table 3 (xid, flags,
//! ciaddr, giaddr, chaddr) plus the L2/L3/L4 headers.

use aya_ebpf::{helpers::generated::bpf_xdp_adjust_tail, programs::XdpContext};
use network_types::{eth::EthHdr, ip::Ipv4Hdr, udp::UdpHdr};
use pxe_ebpf_common::{
    BootClass, Counter, HostRecord, MacKey, ReplyBody, ReplyDestination, ServedEvent, boot_class,
    bootp::*, reply_destination,
};

use crate::{
    BODIES, HOSTS, Outcome, csum,
    parse::{L2L3L4, OptionsError, load, ptr_at, walk_options},
};

const ETH_P_IP: u16 = 0x0800;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const IPPROTO_UDP: u8 = 17;
/// `ETH + IP + UDP + BOOTP up to chaddr end`: the part of the request kept
/// across the rewrite.
const KEPT: usize = L2L3L4 + OFF_SNAME;

/// True when the IPv4 packet at `l3` carries UDP to the DHCP server port.
#[inline(always)]
fn is_dhcp_at(ctx: &XdpContext, l3: usize) -> bool {
    let Some(ip) = load::<20>(ctx, l3) else {
        return false;
    };
    if ip[0] >> 4 != 4 || ip[9] != IPPROTO_UDP {
        return false;
    }
    // A non-first fragment has no UDP header to look at.
    if u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff != 0 {
        return false;
    }
    let l4 = l3 + ((ip[0] & 0x0f) as usize) * 4;
    matches!(load::<4>(ctx, l4), Some(udp) if u16::from_be_bytes([udp[2], udp[3]]) == SERVER_PORT)
}

/// Per-request fields read before the frame is rewritten.
struct Request {
    /// The frame's Ethernet source: the client, its relay, or the router a
    /// renewing client's unicast came through.
    client_mac: [u8; 6],
    /// The frame's Ethernet and IP destinations.
    eth_dst: [u8; 6],
    ip_dst: [u8; 4],
    xid: [u8; 4],
    flags: [u8; 2],
    ciaddr: [u8; 4],
    giaddr: [u8; 4],
    chaddr: [u8; 6],
}

#[inline(always)]
pub fn handle(ctx: &XdpContext) -> Outcome {
    let Some(eth) = ptr_at::<EthHdr>(ctx, 0) else {
        return Outcome::NotDhcp;
    };
    // SAFETY: `ptr_at` checked the header lies inside the packet.
    let ether_type = u16::from_be(unsafe { (*eth).ether_type });
    if ether_type == ETH_P_8021Q || ether_type == ETH_P_8021AD {
        // Only DHCP inside the tag is ours to count.
        return match load::<2>(ctx, 16) {
            Some(t) if u16::from_be_bytes(t) == ETH_P_IP && is_dhcp_at(ctx, 18) => {
                Outcome::Pass(Counter::PassVlan)
            }
            _ => Outcome::NotDhcp,
        };
    }
    if ether_type != ETH_P_IP {
        return Outcome::NotDhcp;
    }
    let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, 14) else {
        return Outcome::NotDhcp;
    };
    // SAFETY: checked by `ptr_at`.
    let (vihl, proto, frags, tot_len) =
        unsafe { ((*ip).vihl, (*ip).proto, (*ip).frags, (*ip).tot_len) };
    if vihl != 0x45 {
        // IP options (or not IPv4): only DHCP among them is ours to count.
        return if is_dhcp_at(ctx, 14) {
            Outcome::Pass(Counter::PassIp)
        } else {
            Outcome::NotDhcp
        };
    }
    // The same test as `is_dhcp_at`, through packet pointers: a helper call
    // costs more than the rest of the header checks together.
    let frags = u16::from_be_bytes(frags);
    if proto != IPPROTO_UDP || frags & 0x1fff != 0 {
        return Outcome::NotDhcp;
    }
    match ptr_at::<[u8; 4]>(ctx, 34) {
        // SAFETY: checked by `ptr_at`.
        Some(udp) if unsafe { u16::from_be_bytes([(*udp)[2], (*udp)[3]]) } == SERVER_PORT => {}
        _ => return Outcome::NotDhcp,
    }
    if frags & 0x3fff != 0 {
        return Outcome::Pass(Counter::PassIp);
    }
    match answer(ctx, u16::from_be_bytes(tot_len) as usize) {
        Ok(outcome) => outcome,
        Err(counter) => Outcome::Pass(counter),
    }
}

/// Every error is a reason to pass, counted under its own name.
#[inline(always)]
fn answer(ctx: &XdpContext, ip_len: usize) -> Result<Outcome, Counter> {
    let Some(udp) = ptr_at::<UdpHdr>(ctx, 34) else {
        return Err(Counter::PassMalformed);
    };
    // SAFETY: checked by `ptr_at`.
    let udp_len = u16::from_be_bytes(unsafe { (*udp).len }) as usize;
    let frame_len = ctx.data_end() - ctx.data();
    if udp_len + 20 != ip_len || 14 + ip_len > frame_len || udp_len < 8 + OFF_OPTIONS + 1 {
        return Err(Counter::PassMalformed);
    }
    let bootp = ptr_at::<[u8; OFF_OPTIONS]>(ctx, L2L3L4).ok_or(Counter::PassMalformed)?;
    // SAFETY: checked by `ptr_at`: all 240 fixed bytes are in the packet.
    let b = unsafe { &*bootp };
    if b[OFF_OP] != OP_REQUEST
        || b[OFF_HTYPE] != HTYPE_ETHER
        || b[OFF_HLEN] != HLEN_ETHER
        || b[OFF_COOKIE..OFF_OPTIONS] != MAGIC_COOKIE
    {
        return Err(Counter::PassMalformed);
    }
    // SAFETY: the Ethernet header was checked in `handle`.
    let eth = unsafe { &*(ctx.data() as *const EthHdr) };
    let ip = ptr_at::<Ipv4Hdr>(ctx, 14).ok_or(Counter::PassMalformed)?;
    let req = Request {
        client_mac: eth.src_addr,
        eth_dst: eth.dst_addr,
        // SAFETY: checked by `ptr_at`.
        ip_dst: unsafe { (*ip).dst_addr },
        xid: [b[4], b[5], b[6], b[7]],
        flags: [b[10], b[11]],
        ciaddr: [b[12], b[13], b[14], b[15]],
        giaddr: [b[24], b[25], b[26], b[27]],
        chaddr: [b[28], b[29], b[30], b[31], b[32], b[33]],
    };
    let opts = match walk_options(ctx, 14 + ip_len) {
        Ok(o) => o,
        Err(OptionsError::Malformed) => return Err(Counter::PassMalformed),
        Err(OptionsError::Unsupported) => return Err(Counter::PassOptions),
    };
    if opts.msg_type == 0 {
        // BOOTP without DHCP: not ours.
        return Err(Counter::PassMessageType);
    }
    if opts.ipxe {
        return Err(Counter::PassIpxe);
    }
    let ack = match opts.msg_type {
        DHCPDISCOVER => false,
        DHCPREQUEST => true,
        _ => return Err(Counter::PassMessageType),
    };
    let relayed = req.giaddr != [0; 4];
    // Option 82 is echoed by the slow path (RFC 3046 2.2), whether a relay
    // or a snooping switch that left giaddr 0 added it.
    if opts.relay_info {
        return Err(Counter::PassRelay);
    }
    let class: BootClass =
        boot_class(opts.arch(), opts.vendor()).ok_or(Counter::PassUnsupportedClient)?;
    let host = HOSTS
        .get_ptr(&MacKey::new(req.chaddr))
        .ok_or(Counter::PassUnknownHost)?;
    // SAFETY: a map value pointer stays valid for this program run.
    let host: &HostRecord = unsafe { &*host };
    let (slot, with_host) = host.body(class).ok_or(Counter::PassUnknownHost)?;
    // A slot past the array is the agent's bug, not the client's.
    let t: &ReplyBody = BODIES.get(slot).ok_or(Counter::Error)?;
    // Only what the stack would deliver to this server: frames to another
    // machine reach XDP on a promiscuous port or a bridge member.
    if !(req.eth_dst == [0xff; 6] || req.eth_dst == t.server_mac)
        || !(req.ip_dst == [0xff; 4] || req.ip_dst == t.server_ip)
    {
        return Err(Counter::PassNotForUs);
    }
    if relayed && mask(req.giaddr, t.netmask) != t.subnet {
        return Err(Counter::PassRelay);
    }
    // A proxy answer echoes option 97, which no template holds.
    if t.proxy != 0 && opts.client_uuid {
        return Err(Counter::PassClientUuid);
    }
    if ack {
        // RFC 2131 4.3.2: SELECTING names a server; INIT-REBOOT asks for an
        // address; RENEWING/REBINDING fills ciaddr.
        let wanted = match (opts.server_id(), opts.requested_ip()) {
            (Some(sid), _) if sid != t.server_ip => {
                // Not ours to answer. The agent is told which server the
                // client chose: one that shares none of this agent's state
                // is worth a warning (see `ServedEvent::msg_type`).
                crate::served(&ServedEvent {
                    at_ns: crate::coarse_ns(),
                    mac: req.chaddr,
                    msg_type: DHCPREQUEST,
                    class: class as u8,
                    yiaddr: sid,
                    seq: 0,
                });
                return Ok(Outcome::Drop(Counter::DropOtherServer));
            }
            (Some(_), requested) => requested,
            (None, Some(requested)) if req.ciaddr == [0; 4] => Some(requested),
            (None, _) => Some(req.ciaddr),
        };
        // A proxy subnet's REQUESTs on port 67 are the address server's.
        if t.proxy != 0 || wanted != Some(host.yiaddr) {
            return Err(Counter::PassRequestMismatch);
        }
    }
    splice(ctx, t, host, with_host, &req, ack, class)
}

#[inline(always)]
fn mask(a: [u8; 4], m: [u8; 4]) -> [u8; 4] {
    [a[0] & m[0], a[1] & m[1], a[2] & m[2], a[3] & m[3]]
}

/// Bytes the body is copied in: one packet bounds check each.
const BLOCK: usize = 64;

/// Copies the body's `payload[OFF_CHADDR + 6..body_len]` to the same place
/// in the reply through packet pointers, in whole blocks from the start
/// and one more block that ends at `body_len` (overlapping the one before
/// it): no helper call, and a bounds check a block instead of a byte.
#[inline(always)]
fn copy_body(ctx: &XdpContext, t: &ReplyBody, body_len: usize) -> Result<(), Counter> {
    const START: usize = OFF_CHADDR + 6;
    // Verifier workaround: the compiler drops compares it can prove from
    // the caller's; black_box keeps this one, which bounds the loop and
    // the last block's offset for the verifier.
    let body_len = core::hint::black_box(body_len);
    if !(START + BLOCK..=MAX_REPLY).contains(&body_len) {
        return Err(Counter::Error);
    }
    let mut off = START;
    while off + BLOCK <= body_len {
        copy_block(ctx, t, off)?;
        off += BLOCK;
    }
    // Verifier workaround: as its own value, not body_len less a constant
    // the compiler would fold into a negative offset from the packet check.
    let last = core::hint::black_box(body_len - BLOCK);
    if last > MAX_REPLY - BLOCK {
        return Err(Counter::Error);
    }
    copy_block(ctx, t, last)
}

/// Copies `payload[off..off + BLOCK]` to `off` from the start of the
/// BOOTP message, eight bytes at a time.
#[inline(always)]
fn copy_block(ctx: &XdpContext, t: &ReplyBody, off: usize) -> Result<(), Counter> {
    let to = ptr_at::<[u8; BLOCK]>(ctx, L2L3L4 + off).ok_or(Counter::Error)?;
    let to = to.cast::<u64>();
    // SAFETY: `off + BLOCK` is at most MAX_REPLY, inside `payload`.
    let from = unsafe { t.payload.as_ptr().add(off) }.cast::<u64>();
    let mut i = 0;
    while i < BLOCK / 8 {
        // SAFETY: both ranges were checked above; unaligned by design.
        unsafe { to.add(i).write_unaligned(from.add(i).read_unaligned()) };
        i += 1;
    }
    Ok(())
}

// The words below are put together and taken apart as little-endian: the
// program is built for bpfel only.
const _: () = assert!(cfg!(target_endian = "little"));

/// Copies `n` bytes (at most `MAX`, a multiple of 8) from `from` to `off`
/// from the start of the BOOTP message.
#[inline(always)]
fn copy_to_packet<const MAX: usize>(
    ctx: &XdpContext,
    off: usize,
    from: *const u8,
    n: usize,
) -> Result<(), Counter> {
    // SAFETY: `write_words` asks for words that start at a multiple of 8
    // below `n <= MAX` and end at most at MAX, readable at `from`.
    write_words::<MAX>(ctx, off, n, |i| unsafe {
        from.add(i).cast::<u64>().read_unaligned()
    })
}

/// Writes the end option at `off` from the start of the BOOTP message and
/// zeros after it, `n` bytes in all (at most `MAX_TAIL`).
#[inline(always)]
fn end_options(ctx: &XdpContext, off: usize, n: usize) -> Result<(), Counter> {
    write_words::<MAX_TAIL>(ctx, off, n, |i| if i == 0 { OPT_END as u64 } else { 0 })
}

/// Writes `n` bytes (1..=MAX, MAX a multiple of 8) at `off` from the
/// start of the BOOTP message, the eight from byte `i` being `word_at(i)`
/// (little-endian): whole words, then the bytes left over merged into the
/// word that ends at `off + n`.
#[inline(always)]
fn write_words<const MAX: usize>(
    ctx: &XdpContext,
    off: usize,
    n: usize,
    word_at: impl Fn(usize) -> u64,
) -> Result<(), Counter> {
    // Verifier workaround: black_box keeps the compares, which bound the
    // offsets for the packet and the source.
    let off = core::hint::black_box(off);
    let n = core::hint::black_box(n);
    if !(OFF_OPTIONS..MAX_REPLY).contains(&off) || n == 0 || n > MAX {
        return Err(Counter::Error);
    }
    let mut i = 0;
    while i + 8 <= MAX && i + 8 <= n {
        store_word(ctx, off + i, word_at(i))?;
        i += 8;
    }
    if i < n {
        merge_last(ctx, off + n, word_at(i), n - i)?;
    }
    Ok(())
}

/// Stores `word` (little-endian) at `off` from the start of the BOOTP
/// message.
#[inline(always)]
fn store_word(ctx: &XdpContext, off: usize, word: u64) -> Result<(), Counter> {
    let to = ptr_at::<[u8; 8]>(ctx, L2L3L4 + off).ok_or(Counter::Error)?;
    // SAFETY: checked by `ptr_at`; unaligned by design.
    unsafe { to.cast::<u64>().write_unaligned(word) };
    Ok(())
}

/// Writes the first `r` (1..=7) bytes of `word` (little-endian) so they
/// end at `end` from the start of the BOOTP message, keeping the 8 - r
/// bytes before them: a copy's last bytes without a packet check for each,
/// which the verifier cannot follow for single bytes at a variable offset.
#[inline(always)]
fn merge_last(ctx: &XdpContext, end: usize, word: u64, r: usize) -> Result<(), Counter> {
    let at = ptr_at::<[u8; 8]>(ctx, L2L3L4 + end - 8).ok_or(Counter::Error)?;
    let at = at.cast::<u64>();
    // Bits of the bytes kept, 8..=56 for r in 1..=7 (the mask shows the
    // compiler the shift stays below 64).
    let kept = 8 * (8 - (r & 7)) as u64;
    // SAFETY: checked by `ptr_at`; unaligned by design.
    unsafe {
        let old = at.read_unaligned();
        at.write_unaligned((old & ((1u64 << kept) - 1)) | (word << kept));
    }
    Ok(())
}

#[inline(always)]
fn splice(
    ctx: &XdpContext,
    t: &ReplyBody,
    host: &HostRecord,
    with_host: bool,
    req: &Request,
    ack: bool,
    class: BootClass,
) -> Result<Outcome, Counter> {
    let body_len = t.len as usize;
    let host_len = if with_host { host.len as usize } else { 0 };
    let type_off = t.msg_type_off as usize;
    // Where the end option goes, and the reply's length with its padding.
    let end = body_len + host_len;
    if !(OFF_OPTIONS < body_len && host_len <= HOST_BYTES && end < MAX_REPLY && type_off < body_len)
    {
        return Err(Counter::Error);
    }
    let len = if end + 1 < MIN_REPLY {
        MIN_REPLY
    } else {
        end + 1
    };
    let new_len = L2L3L4 + len;
    let old_len = ctx.data_end() - ctx.data();
    if new_len != old_len {
        let delta = new_len as i32 - old_len as i32;
        // SAFETY: the helper validates delta against the frame's tailroom.
        if unsafe { bpf_xdp_adjust_tail(ctx.ctx, delta) } != 0 {
            return Err(Counter::PassNoRoom);
        }
    }
    // Packet pointers are stale after adjust_tail: every access below goes
    // through `ptr_at`, which re-reads data/data_end.
    // The fixed fields before chaddr are written with the headers, below;
    // chaddr bytes 6..16 are zero in the reply; sname, file and options follow.
    copy_body(ctx, t, body_len)?;
    let mut sum = if ack {
        t.csum_ack as u32
    } else {
        t.csum_offer as u32
    };
    // The end option, then zeros up to the BOOTP minimum.
    let tail_len = len - end;
    if host_len != 0 {
        // The record's sum is of its bytes at an even offset.
        sum = csum::add16(
            sum,
            if body_len % 2 == 0 {
                host.sum
            } else {
                host.sum.swap_bytes()
            },
        );
    }
    if host_len != 0 && host_len + tail_len <= HOST_BYTES {
        // A record with room after its options holds the end option and
        // zeros there: options, end and padding in one copy.
        copy_to_packet::<HOST_BYTES>(ctx, body_len, host.options.as_ptr(), host_len + tail_len)?;
    } else {
        if host_len != 0 {
            copy_to_packet::<HOST_BYTES>(ctx, body_len, host.options.as_ptr(), host_len)?;
        }
        end_options(ctx, end, tail_len)?;
    }
    sum = csum::add16(sum, if end % 2 == 0 { 0xff00 } else { 0x00ff });
    sum = csum::add4(sum, host.yiaddr);
    if ack {
        // Exactly type_off (below body_len, itself below MAX_REPLY), masked
        // so the verifier can bound the packet pointer.
        let at = core::hint::black_box(type_off) & (MAX_REPLY.next_power_of_two() - 1);
        let msg_type = ptr_at::<u8>(ctx, L2L3L4 + at).ok_or(Counter::Error)?;
        // SAFETY: checked by `ptr_at`.
        unsafe { *msg_type = DHCPACK };
        sum = csum::add4(sum, req.ciaddr);
    }

    let dest = reply_destination(
        u16::from_be_bytes(req.flags),
        u32::from_be_bytes(req.ciaddr),
        u32::from_be_bytes(req.giaddr),
        u32::from_be_bytes(host.yiaddr),
    );
    let (dst_mac, dst_ip, dst_port) = match dest {
        ReplyDestination::Relay => (req.client_mac, req.giaddr, SERVER_PORT),
        // To the frame's source, as the stack's routing would: the client,
        // or the router its unicast renewal came through.
        ReplyDestination::Ciaddr => (req.client_mac, req.ciaddr, CLIENT_PORT),
        ReplyDestination::Broadcast => ([0xff; 6], [0xff; 4], CLIENT_PORT),
        ReplyDestination::Yiaddr => (req.chaddr, host.yiaddr, CLIENT_PORT),
    };

    let headers = ptr_at::<[u8; KEPT]>(ctx, 0).ok_or(Counter::Error)?;
    // SAFETY: checked by `ptr_at`; nothing else aliases the frame.
    let h = unsafe { &mut *headers };
    // The body's fixed fields, around the request's own (xid, flags,
    // giaddr, chaddr, and ciaddr in an ACK), which stay as they came.
    let at = |off: usize| L2L3L4 + off;
    let p = &t.payload;
    h[at(OFF_OP)..at(OFF_OP) + 4].copy_from_slice(&p[OFF_OP..OFF_OP + 4]);
    h[at(OFF_SECS)..at(OFF_SECS) + 2].copy_from_slice(&p[OFF_SECS..OFF_SECS + 2]);
    if !ack {
        h[at(OFF_CIADDR)..at(OFF_CIADDR) + 4].copy_from_slice(&p[OFF_CIADDR..OFF_CIADDR + 4]);
    }
    h[at(OFF_YIADDR)..at(OFF_YIADDR) + 4].copy_from_slice(&host.yiaddr);
    h[at(OFF_SIADDR)..at(OFF_SIADDR) + 4].copy_from_slice(&p[OFF_SIADDR..OFF_SIADDR + 4]);
    h[0..6].copy_from_slice(&dst_mac);
    h[6..12].copy_from_slice(&t.server_mac);
    // IPv4 header (RFC 791): no options, no fragmentation, TTL 64.
    let ip_len = (20 + 8 + len) as u16;
    let ip = [
        0x45,
        0,
        (ip_len >> 8) as u8,
        ip_len as u8,
        0,
        0,
        0,
        0,
        64,
        IPPROTO_UDP,
        0,
        0,
        t.server_ip[0],
        t.server_ip[1],
        t.server_ip[2],
        t.server_ip[3],
        dst_ip[0],
        dst_ip[1],
        dst_ip[2],
        dst_ip[3],
    ];
    let mut ip_sum = 0u32;
    let mut i = 0;
    while i < 20 {
        ip_sum = csum::add16(ip_sum, u16::from_be_bytes([ip[i], ip[i + 1]]));
        i += 2;
    }
    h[14..34].copy_from_slice(&ip);
    h[24..26].copy_from_slice(&csum::finish(ip_sum).to_be_bytes());

    let udp_len = (8 + len) as u16;
    let mut sum = csum::add4(sum, req.xid);
    sum = csum::add16(sum, u16::from_be_bytes(req.flags));
    sum = csum::add4(sum, req.giaddr);
    sum = csum::add4(
        sum,
        [req.chaddr[0], req.chaddr[1], req.chaddr[2], req.chaddr[3]],
    );
    sum = csum::add16(sum, u16::from_be_bytes([req.chaddr[4], req.chaddr[5]]));
    // Pseudo header (RFC 768) and the UDP header itself.
    sum = csum::add4(sum, t.server_ip);
    sum = csum::add4(sum, dst_ip);
    sum = csum::add16(sum, IPPROTO_UDP as u16);
    sum = csum::add16(sum, udp_len);
    sum = csum::add16(sum, SERVER_PORT);
    sum = csum::add16(sum, dst_port);
    sum = csum::add16(sum, udp_len);
    h[34..36].copy_from_slice(&SERVER_PORT.to_be_bytes());
    h[36..38].copy_from_slice(&dst_port.to_be_bytes());
    h[38..40].copy_from_slice(&udp_len.to_be_bytes());
    h[40..42].copy_from_slice(&csum::finish(sum).to_be_bytes());
    crate::served(&ServedEvent {
        at_ns: crate::coarse_ns(),
        mac: req.chaddr,
        msg_type: if ack { DHCPACK } else { DHCPOFFER },
        class: class as u8,
        yiaddr: host.yiaddr,
        seq: 0,
    });
    Ok(Outcome::Tx(if ack {
        Counter::TxAck
    } else if t.proxy != 0 {
        Counter::TxProxyOffer
    } else {
        Counter::TxOffer
    }))
}

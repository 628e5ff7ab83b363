//! The DHCPv6 load's correctness check: every Advertise and Reply a
//! server sent during a short perfdhcp -6 run, read back from a tcpdump
//! capture of the client end, and compared with the reservation of the
//! MAC in the client DUID it echoes (DUID-LL or DUID-LLT).
//!
//! Owns reading the capture (pcap, Ethernet, IPv6, UDP, DHCPv6 options)
//! and the tally; running tcpdump and perfdhcp belongs to
//! [`super::load::Runner::check_replies6`].

use std::net::Ipv6Addr;

use anyhow::{Context as _, bail, ensure};

use super::hosts::ip6;

const ADVERTISE: u8 = 2;
const REPLY: u8 = 7;
const OPTION_CLIENTID: u16 = 1;
const OPTION_IA_NA: u16 = 3;
const OPTION_IAADDR: u16 = 5;
/// The reservations' MACs: `52:54:00:` and the host's index.
const RESERVED_OUI: [u8; 3] = [0x52, 0x54, 0x00];

/// What the answers of one check run carried.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Check {
    /// Exchanges perfdhcp completed in the run.
    pub exchanges: u64,
    pub advertises: u64,
    pub replies: u64,
    /// Advertises and Replies whose IA_NA holds the client's reserved
    /// address, and nothing else.
    pub reserved: u64,
    /// Answers with another address, or with more than one.
    pub wrong: u64,
    /// Answers without an address (a status such as NoAddrsAvail).
    pub no_address: u64,
    /// Answers to a DUID that names no reserved MAC.
    pub unknown_client: u64,
    /// A few answers as "MAC → address", for the report.
    pub samples: Vec<String>,
}

impl Check {
    /// Every answer carried the reservation, and there were answers.
    pub fn all_reserved(&self) -> bool {
        let answers = self.advertises + self.replies;
        answers > 0 && self.reserved == answers
    }

    /// One line for the report.
    pub fn summary(&self) -> String {
        let mut text = format!(
            "{} of the {} Advertises and Replies captured ({} exchanges completed) carried the \
             client's reserved address",
            self.reserved,
            self.advertises + self.replies,
            self.exchanges
        );
        for (n, what) in [
            (self.wrong, "another address"),
            (self.no_address, "no address"),
            (self.unknown_client, "an unknown DUID"),
        ] {
            if n > 0 {
                text.push_str(&format!(", {n} {what}"));
            }
        }
        if !self.samples.is_empty() {
            text.push_str(&format!(" (e.g. {})", self.samples.join(", ")));
        }
        text
    }
}

/// Reads a pcap capture (Ethernet) and tallies its DHCPv6 answers.
pub fn check_capture(pcap: &[u8]) -> anyhow::Result<Check> {
    let mut check = Check::default();
    for frame in frames(pcap)? {
        if let Some(msg) = dhcpv6_payload(frame) {
            tally(&mut check, msg);
        }
    }
    Ok(check)
}

/// The frames of a classic pcap file (microsecond or nanosecond, either
/// byte order), Ethernet link type only.
fn frames(pcap: &[u8]) -> anyhow::Result<Vec<&[u8]>> {
    ensure!(pcap.len() >= 24, "capture shorter than a pcap header");
    let magic = [pcap[0], pcap[1], pcap[2], pcap[3]];
    let little = match magic {
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => true,
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => false,
        _ => bail!("not a pcap file (magic {magic:02x?})"),
    };
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        let bytes: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        Some(if little {
            u32::from_le_bytes(bytes)
        } else {
            u32::from_be_bytes(bytes)
        })
    };
    let link = u32_at(pcap, 20).context("no link type")?;
    ensure!(link == 1, "capture link type {link}, expected Ethernet (1)");
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let len = u32_at(pcap, at + 8).context("truncated record header")? as usize;
        let start = at + 16;
        let frame = pcap
            .get(start..start + len)
            .context("truncated record in the capture")?;
        out.push(frame);
        at = start + len;
    }
    Ok(out)
}

/// The DHCPv6 message of an Ethernet/IPv6/UDP frame to port 546.
fn dhcpv6_payload(frame: &[u8]) -> Option<&[u8]> {
    if frame.get(12..14)? != [0x86, 0xdd] {
        return None;
    }
    let ip = frame.get(14..)?;
    if *ip.get(6)? != 17 {
        return None;
    }
    let udp = ip.get(40..)?;
    let port = u16::from_be_bytes([*udp.get(2)?, *udp.get(3)?]);
    (port == 546).then(|| udp.get(8..)).flatten()
}

/// The options of a DHCPv6 message or of an option's body: (code, value).
fn options(mut bytes: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while bytes.len() >= 4 {
        let code = u16::from_be_bytes([bytes[0], bytes[1]]);
        let len = usize::from(u16::from_be_bytes([bytes[2], bytes[3]]));
        let Some(value) = bytes.get(4..4 + len) else {
            break;
        };
        out.push((code, value));
        bytes = &bytes[4 + len..];
    }
    out
}

/// The MAC in a DUID-LL (type 3) or DUID-LLT (type 1) of hardware type 1.
fn duid_mac(duid: &[u8]) -> Option<[u8; 6]> {
    let at = match duid.get(..4)? {
        [0, 3, 0, 1] => 4,
        [0, 1, 0, 1] => 8,
        _ => return None,
    };
    duid.get(at..at + 6)?.try_into().ok()
}

fn tally(check: &mut Check, msg: &[u8]) {
    let Some(&kind) = msg.first() else { return };
    match kind {
        ADVERTISE => check.advertises += 1,
        REPLY => check.replies += 1,
        _ => return,
    }
    let opts = options(msg.get(4..).unwrap_or_default());
    let mac = opts
        .iter()
        .find(|(code, _)| *code == OPTION_CLIENTID)
        .and_then(|(_, duid)| duid_mac(duid));
    let Some(mac) = mac.filter(|m| m[..3] == RESERVED_OUI) else {
        check.unknown_client += 1;
        return;
    };
    let index = usize::from(mac[3]) << 16 | usize::from(mac[4]) << 8 | usize::from(mac[5]);
    let expected = ip6(index);
    let addresses: Vec<Ipv6Addr> = opts
        .iter()
        .filter(|(code, _)| *code == OPTION_IA_NA)
        .flat_map(|(_, ia)| options(ia.get(12..).unwrap_or_default()))
        .filter(|(code, _)| *code == OPTION_IAADDR)
        .filter_map(|(_, addr)| {
            let octets: [u8; 16] = addr.get(..16)?.try_into().ok()?;
            Some(Ipv6Addr::from(octets))
        })
        .collect();
    match addresses.as_slice() {
        [] => check.no_address += 1,
        [one] if *one == expected => {
            check.reserved += 1;
            if check.samples.len() < 3 && kind == REPLY {
                let mac: Vec<String> = mac.iter().map(|b| format!("{b:02x}")).collect();
                check.samples.push(format!("{} → {one}", mac.join(":")));
            }
        }
        _ => check.wrong += 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet/IPv6/UDP frame to port 546 carrying `dhcp`.
    fn frame(dhcp: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend([0x86, 0xdd]);
        let mut ip = vec![0x60, 0, 0, 0];
        ip.extend(u16::try_from(8 + dhcp.len()).unwrap().to_be_bytes());
        ip.extend([17, 64]);
        ip.extend([0u8; 32]);
        f.extend(ip);
        f.extend(547u16.to_be_bytes());
        f.extend(546u16.to_be_bytes());
        f.extend(u16::try_from(8 + dhcp.len()).unwrap().to_be_bytes());
        f.extend([0, 0]);
        f.extend(dhcp);
        f
    }

    fn option(code: u16, value: &[u8]) -> Vec<u8> {
        let mut o = code.to_be_bytes().to_vec();
        o.extend(u16::try_from(value.len()).unwrap().to_be_bytes());
        o.extend(value);
        o
    }

    fn answer(kind: u8, mac_last: u8, addr: Option<Ipv6Addr>) -> Vec<u8> {
        let mut m = vec![kind, 1, 2, 3];
        m.extend(option(1, &[0, 3, 0, 1, 0x52, 0x54, 0, 0, 1, mac_last]));
        let mut ia = vec![0u8; 12];
        if let Some(addr) = addr {
            let mut a = addr.octets().to_vec();
            a.extend([0u8; 8]);
            ia.extend(option(5, &a));
        }
        m.extend(option(3, &ia));
        m
    }

    fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut p = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0];
        p.extend([0u8; 8]);
        p.extend(65535u32.to_le_bytes());
        p.extend(1u32.to_le_bytes());
        for f in frames {
            p.extend([0u8; 8]);
            p.extend(u32::try_from(f.len()).unwrap().to_le_bytes());
            p.extend(u32::try_from(f.len()).unwrap().to_le_bytes());
            p.extend(f);
        }
        p
    }

    #[test]
    fn answers_are_checked_against_the_duid_reservation() {
        let right = ip6(0x102);
        let capture = pcap(&[
            frame(&answer(ADVERTISE, 2, Some(right))),
            frame(&answer(REPLY, 2, Some(right))),
            frame(&answer(REPLY, 3, Some(right))),
            frame(&answer(REPLY, 4, None)),
            frame(&[11, 0, 0, 0]),
        ]);
        let check = check_capture(&capture).unwrap();
        assert_eq!(
            (
                check.advertises,
                check.replies,
                check.reserved,
                check.wrong,
                check.no_address
            ),
            (1, 3, 2, 1, 1)
        );
        assert_eq!(check.samples, vec!["52:54:00:00:01:02 → fd00:66::1:102"]);
        assert!(!check.all_reserved());
        assert!(check_capture(b"not a capture at all....").is_err());
    }

    #[test]
    fn duid_llt_carries_its_mac_after_the_time() {
        assert_eq!(
            duid_mac(&[0, 1, 0, 1, 9, 9, 9, 9, 1, 2, 3, 4, 5, 6]),
            Some([1, 2, 3, 4, 5, 6])
        );
        assert_eq!(duid_mac(&[0, 4, 1, 2]), None);
    }
}

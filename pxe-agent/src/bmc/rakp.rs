//! A diagnostic replay of the first two unauthenticated RMCP+ exchanges
//! (Open Session, RAKP 1/2; IPMI 2.0 §13.17-13.20) that reads the raw status
//! byte of each answer.
//!
//! It exists because ipmi-rs 0.6.0 loses that byte: it reads RAKP message 2's
//! status from a reserved byte and rejects the 8-byte error form as too
//! short, and it does not export its Open Session status type. The IPMI
//! driver runs this only after a handshake already failed at one of those
//! steps, to tell a wrong user or missing privilege from a garbled answer.
//! It derives no session keys; it uses the password only to check which
//! privilege the BMC's RAKP 2 auth code was computed for.

use hmac::{Hmac, Mac};
use sha1::Sha1;
use std::{
    net::{SocketAddr, UdpSocket},
    time::Duration,
};

/// The first non-zero status the BMC answered with, or `None` when the
/// answers were missing or malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    OpenSession(u8),
    Rakp2(u8),
    /// Both steps succeeded; the BMC's RAKP 2 auth code verifies with the
    /// password at this privilege byte (`None`: at none of 1-4).
    Accepted {
        verified_at: Option<u8>,
    },
}

const RMCP_IPMI: [u8; 4] = [0x06, 0x00, 0xff, 0x07];
const OPEN_SESSION_REQUEST: u8 = 0x10;
const OPEN_SESSION_RESPONSE: u8 = 0x11;
const RAKP1: u8 = 0x12;
const RAKP2: u8 = 0x13;
const ADMINISTRATOR: u8 = 0x04;
/// Arbitrary non-zero remote console session ID for the probe.
const CONSOLE_SESSION: [u8; 4] = [0x70, 0x78, 0x65, 0x01];

/// Name-only lookup (RAKP 1 byte 25 bit 4) at User privilege: finds the
/// user whatever its maximum privilege.
pub(super) const NAME_ONLY_USER: u8 = 0x12;
/// Role-based lookup at Administrator, as ipmi-rs requests.
pub(super) const ADMIN: u8 = ADMINISTRATOR;

pub(super) fn probe(
    addr: SocketAddr,
    user: &str,
    password: &[u8],
    privilege: u8,
    timeout: Duration,
) -> Option<Status> {
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse().ok()?
    } else {
        "[::]:0".parse().ok()?
    };
    let sock = UdpSocket::bind(bind).ok()?;
    sock.set_read_timeout(Some(timeout)).ok()?;
    sock.connect(addr).ok()?;

    let mut open = vec![0x00, privilege & 0x0f, 0, 0];
    open.extend_from_slice(&CONSOLE_SESSION);
    for (ty, alg) in [(0x00, 0x01), (0x01, 0x01), (0x02, 0x01)] {
        open.extend_from_slice(&[ty, 0, 0, 0x08, alg, 0, 0, 0]);
    }
    let answer = exchange(&sock, OPEN_SESSION_REQUEST, &open, OPEN_SESSION_RESPONSE)?;
    match answer.get(1)? {
        0 => {}
        &code => return Some(Status::OpenSession(code)),
    }
    let managed: [u8; 4] = answer.get(8..12)?.try_into().ok()?;

    let mut rakp1 = vec![0x00, 0, 0, 0];
    rakp1.extend_from_slice(&managed);
    rakp1.extend_from_slice(&[0x5a; 16]);
    rakp1.extend_from_slice(&[privilege, 0, 0, u8::try_from(user.len()).ok()?]);
    rakp1.extend_from_slice(user.as_bytes());
    let answer = exchange(&sock, RAKP1, &rakp1, RAKP2)?;
    match answer.get(1)? {
        0 => {}
        &code => return Some(Status::Rakp2(code)),
    }
    let (managed_random, guid, code) = (answer.get(8..24)?, answer.get(24..40)?, answer.get(40..)?);
    // RAKP 2 auth code (§13.31): HMAC-SHA1 keyed with the password over
    // both session IDs, both randoms, the GUID, the role byte and the name.
    // Some BMCs (ipmi_sim) compute it with the user's own maximum privilege
    // when that is below the one requested.
    let verified_at = (1..=4u8).rev().find(|&level| {
        let role = (privilege & 0xf0) | level;
        let Ok(mut mac) = <Hmac<Sha1> as Mac>::new_from_slice(password) else {
            return false;
        };
        mac.update(&CONSOLE_SESSION);
        mac.update(&managed);
        mac.update(&[0x5a; 16]);
        mac.update(managed_random);
        mac.update(guid);
        mac.update(&[role, rakp1[27]]);
        mac.update(user.as_bytes());
        mac.verify_slice(code).is_ok()
    });
    Some(Status::Accepted { verified_at })
}

/// Sends one session-less RMCP+ payload and returns the payload of the answer
/// of type `want`.
fn exchange(sock: &UdpSocket, ty: u8, payload: &[u8], want: u8) -> Option<Vec<u8>> {
    let mut pkt = RMCP_IPMI.to_vec();
    // Auth type RMCP+ (6), payload type, session ID 0, sequence 0, length.
    pkt.extend_from_slice(&[0x06, ty, 0, 0, 0, 0, 0, 0, 0, 0]);
    pkt.extend_from_slice(&u16::try_from(payload.len()).ok()?.to_le_bytes());
    pkt.extend_from_slice(payload);
    sock.send(&pkt).ok()?;
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).ok()?;
    parse(buf.get(..n)?, want)
}

fn parse(pkt: &[u8], want: u8) -> Option<Vec<u8>> {
    if pkt.get(..4)? != RMCP_IPMI || *pkt.get(4)? != 0x06 || pkt.get(5)? & 0x3f != want {
        return None;
    }
    let len = usize::from(u16::from_le_bytes(pkt.get(14..16)?.try_into().ok()?));
    pkt.get(16..16 + len).map(<[u8]>::to_vec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_of_another_type_or_truncated_are_ignored() {
        let mut ok = RMCP_IPMI.to_vec();
        ok.extend_from_slice(&[0x06, 0x13, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0]);
        ok.extend_from_slice(&[0, 0x0d, 0, 0, 1, 2, 3, 4]);
        assert_eq!(parse(&ok, RAKP2).unwrap()[1], 0x0d);
        assert_eq!(parse(&ok, OPEN_SESSION_RESPONSE), None);
        assert_eq!(parse(&ok[..20], RAKP2), None);
        assert_eq!(parse(&ok[..5], RAKP2), None);
    }
}

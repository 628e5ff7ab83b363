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
pub(crate) enum Status {
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
/// RMCP+ status 0Dh (Table 13-15): "unauthorized name".
const UNAUTHORIZED_NAME: u8 = 0x0d;
/// Arbitrary non-zero remote console session ID for the probe.
const CONSOLE_SESSION: [u8; 4] = [0x70, 0x78, 0x65, 0x01];
/// The probe's remote console random number; it derives no keys.
const CONSOLE_RANDOM: [u8; 16] = [0x5a; 16];

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

    let open = open_session_request(privilege);
    let answer = exchange(&sock, OPEN_SESSION_REQUEST, &open, OPEN_SESSION_RESPONSE)?;
    let managed = match opened(&answer)? {
        Ok(managed) => managed,
        Err(status) => return Some(status),
    };
    let rakp1 = rakp1_request(managed, privilege, user)?;
    let answer = exchange(&sock, RAKP1, &rakp1, RAKP2)?;
    rakp2_status(&answer, managed, privilege, user, password)
}

/// The probe's decoding of two received datagrams, without a socket: what
/// `probe` concludes when the BMC answers `open_session` and `rakp2`.
/// The fuzz target for IPMI answers calls this; nothing else does.
pub(crate) fn decode_answers(
    open_session: &[u8],
    rakp2: &[u8],
    user: &str,
    password: &[u8],
    privilege: u8,
) -> Option<Status> {
    let answer = parse(open_session, OPEN_SESSION_RESPONSE)?;
    let managed = match opened(&answer)? {
        Ok(managed) => managed,
        Err(status) => return Some(status),
    };
    rakp1_request(managed, privilege, user)?;
    let answer = parse(rakp2, RAKP2)?;
    rakp2_status(&answer, managed, privilege, user, password)
}

fn open_session_request(privilege: u8) -> Vec<u8> {
    let mut open = vec![0x00, privilege & 0x0f, 0, 0];
    open.extend_from_slice(&CONSOLE_SESSION);
    for (ty, alg) in [(0x00, 0x01), (0x01, 0x01), (0x02, 0x01)] {
        open.extend_from_slice(&[ty, 0, 0, 0x08, alg, 0, 0, 0]);
    }
    open
}

/// The managed system's session ID from an Open Session response payload,
/// or the non-zero status it refused with; `None` when malformed.
fn opened(answer: &[u8]) -> Option<Result<[u8; 4], Status>> {
    match answer.get(1)? {
        0 => {}
        &code => return Some(Err(Status::OpenSession(code))),
    }
    Some(Ok(answer.get(8..12)?.try_into().ok()?))
}

fn rakp1_request(managed: [u8; 4], privilege: u8, user: &str) -> Option<Vec<u8>> {
    let mut rakp1 = vec![0x00, 0, 0, 0];
    rakp1.extend_from_slice(&managed);
    rakp1.extend_from_slice(&CONSOLE_RANDOM);
    rakp1.extend_from_slice(&[privilege, 0, 0, u8::try_from(user.len()).ok()?]);
    rakp1.extend_from_slice(user.as_bytes());
    Some(rakp1)
}

/// What a RAKP 2 payload says: its non-zero status, or at which privilege
/// its auth code verifies; `None` when malformed.
fn rakp2_status(
    answer: &[u8],
    managed: [u8; 4],
    privilege: u8,
    user: &str,
    password: &[u8],
) -> Option<Status> {
    match answer.get(1)? {
        0 => {}
        &code => return Some(Status::Rakp2(code)),
    }
    let (managed_random, guid, code) = (answer.get(8..24)?, answer.get(24..40)?, answer.get(40..)?);
    let verified_at = verified_level(
        &Rakp2Input {
            managed,
            managed_random,
            guid,
            role: privilege,
            user: user.as_bytes(),
        },
        password,
        code,
    );
    Some(Status::Accepted { verified_at })
}

/// What a RAKP 2 key exchange auth code covers besides the password (the
/// console's session ID and random number are the probe's constants).
struct Rakp2Input<'a> {
    managed: [u8; 4],
    managed_random: &'a [u8],
    guid: &'a [u8],
    /// The role byte sent in RAKP 1 (lookup bit and requested privilege).
    role: u8,
    user: &'a [u8],
}

/// The privilege level (1-4, highest first) whose role byte makes `code`
/// the RAKP 2 auth code for `password`, or `None` when none does (a wrong
/// password, or an auth code computed for another user).
///
/// IPMI 2.0 §13.31: HMAC-SHA1 keyed with the password over both session
/// IDs, both random numbers, the BMC's GUID, the role byte, the name length
/// and the name. A conforming BMC uses the role byte as sent; some compute
/// it over the user's own lower maximum privilege, so every level is tried
/// with the lookup bit kept.
fn verified_level(input: &Rakp2Input<'_>, password: &[u8], code: &[u8]) -> Option<u8> {
    let name_len = u8::try_from(input.user.len()).ok()?;
    (1..=4u8).rev().find(|&level| {
        let role = (input.role & 0xf0) | level;
        let Ok(mut mac) = <Hmac<Sha1> as Mac>::new_from_slice(password) else {
            return false;
        };
        mac.update(&CONSOLE_SESSION);
        mac.update(&input.managed);
        mac.update(&CONSOLE_RANDOM);
        mac.update(input.managed_random);
        mac.update(input.guid);
        mac.update(&[role, name_len]);
        mac.update(input.user);
        mac.verify_slice(code).is_ok()
    })
}

/// What the replay says about a failed handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Finding {
    /// The BMC answered a non-zero RMCP+ status at this step.
    OpenSession(u8),
    Rakp2(u8),
    /// The user exists and the password is right, but the BMC will not give
    /// it Administrator.
    BelowAdministrator,
    /// No answer, a malformed one, or a handshake that succeeded at
    /// Administrator: nothing to attribute the failure to.
    Inconclusive,
}

/// Attributes a failed handshake from a replay at Administrator
/// (role-based lookup, as ipmi-rs asks) and, only when that one is refused
/// as "unauthorized name", a second one by name only at User.
///
/// A role-based lookup finds only users whose maximum privilege is the one
/// requested (ipmi_sim matches it exactly), so "unauthorized name" means an
/// unknown user or one below Administrator. The name-only lookup finds the
/// user whatever its privilege; when its auth code verifies with the
/// password, the user and password are right and the privilege is what is
/// missing. A wrong password stays "unauthorized name" (`AuthFailed`).
pub(super) fn attribute(
    admin: Option<Status>,
    name_only: impl FnOnce() -> Option<Status>,
) -> Finding {
    match admin {
        Some(Status::OpenSession(code)) => Finding::OpenSession(code),
        Some(Status::Rakp2(UNAUTHORIZED_NAME)) => match name_only() {
            Some(Status::Accepted {
                verified_at: Some(_),
            }) => Finding::BelowAdministrator,
            _ => Finding::Rakp2(UNAUTHORIZED_NAME),
        },
        Some(Status::Rakp2(code)) => Finding::Rakp2(code),
        // The BMC lowered the role to the user's own maximum privilege.
        Some(Status::Accepted {
            verified_at: Some(level),
        }) if level < ADMINISTRATOR => Finding::BelowAdministrator,
        Some(Status::Accepted { .. }) | None => Finding::Inconclusive,
    }
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

    /// ipmi_sim (OpenIPMI 2.0.33)'s RAKP 2 to the name-only probe at User
    /// (role byte 12h) for user "viewer", password "pxe-sim-secret", managed
    /// session ID 0x00000102, console session and random as in `probe`.
    const SIM_NAME_ONLY_RAKP2: [u8; 76] = [
        0x06, 0x00, 0xff, 0x07, 0x06, 0x13, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x3c,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x70, 0x78, 0x65, 0x01, 0xdb, 0xe6, 0xcc, 0x49, 0xd8, 0x61,
        0x62, 0xd2, 0x17, 0xb7, 0x9d, 0x08, 0xfb, 0x36, 0xa8, 0x55, 0xa1, 0x23, 0x45, 0x67, 0x89,
        0xab, 0xcd, 0xef, 0xa1, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x93, 0xaa, 0x0f, 0x7f,
        0xb8, 0x09, 0xe4, 0x35, 0x58, 0xc6, 0xd3, 0x62, 0xb4, 0xbb, 0x45, 0x97, 0x8b, 0x37, 0xa4,
        0x9f,
    ];

    fn sim_auth_code_level(role: u8, password: &[u8], user: &[u8]) -> Option<u8> {
        let answer = parse(&SIM_NAME_ONLY_RAKP2, RAKP2).unwrap();
        assert_eq!(answer[1], 0, "status");
        let input = Rakp2Input {
            managed: [0x02, 0x01, 0x00, 0x00],
            managed_random: &answer[8..24],
            guid: &answer[24..40],
            role,
            user,
        };
        verified_level(&input, password, &answer[40..])
    }

    #[test]
    fn the_rakp2_auth_code_verifies_over_the_role_byte_as_sent() {
        // The name-only bit is part of the role byte the code covers.
        assert_eq!(
            sim_auth_code_level(NAME_ONLY_USER, b"pxe-sim-secret", b"viewer"),
            Some(2)
        );
        assert_eq!(
            sim_auth_code_level(ADMIN, b"pxe-sim-secret", b"viewer"),
            None
        );
        assert_eq!(
            sim_auth_code_level(NAME_ONLY_USER, b"wrong", b"viewer"),
            None
        );
        assert_eq!(
            sim_auth_code_level(NAME_ONLY_USER, b"pxe-sim-secret", b"admin"),
            None
        );
    }

    #[test]
    fn a_code_keyed_with_a_lowered_role_is_found_at_that_level() {
        let input = Rakp2Input {
            managed: [1, 2, 3, 4],
            managed_random: &[7; 16],
            guid: &[9; 16],
            role: ADMIN,
            user: b"op",
        };
        let mut mac = <Hmac<Sha1> as Mac>::new_from_slice(b"pw").unwrap();
        for part in [
            &CONSOLE_SESSION[..],
            &[1, 2, 3, 4],
            &CONSOLE_RANDOM,
            &[7; 16],
            &[9; 16],
            &[0x03, 2],
            b"op",
        ] {
            mac.update(part);
        }
        let code = mac.finalize().into_bytes();
        assert_eq!(verified_level(&input, b"pw", &code), Some(3));
        assert_eq!(verified_level(&input, b"pw", &code[..12]), None);
    }

    #[test]
    fn unauthorized_name_at_administrator_is_attributed_by_the_name_only_replay() {
        let refused = Some(Status::Rakp2(UNAUTHORIZED_NAME));
        let verified = || {
            Some(Status::Accepted {
                verified_at: Some(2),
            })
        };
        // User and password right, privilege too low (ipmi_sim).
        assert_eq!(attribute(refused, verified), Finding::BelowAdministrator);
        // Wrong password: the name-only code does not verify.
        let unverified = || Some(Status::Accepted { verified_at: None });
        assert_eq!(attribute(refused, unverified), Finding::Rakp2(0x0d));
        // Unknown user, or no answer to the second replay.
        assert_eq!(
            attribute(refused, || Some(Status::Rakp2(0x0d))),
            Finding::Rakp2(0x0d)
        );
        assert_eq!(attribute(refused, || None), Finding::Rakp2(0x0d));
    }

    #[test]
    fn other_answers_need_no_second_replay() {
        let never = || -> Option<Status> { panic!("second replay") };
        assert_eq!(
            attribute(Some(Status::OpenSession(0x11)), never),
            Finding::OpenSession(0x11)
        );
        assert_eq!(
            attribute(Some(Status::Rakp2(0x0a)), never),
            Finding::Rakp2(0x0a)
        );
        // A BMC that lowered the role and keyed the code with it.
        let lowered = Some(Status::Accepted {
            verified_at: Some(2),
        });
        assert_eq!(attribute(lowered, never), Finding::BelowAdministrator);
        let admin = Some(Status::Accepted {
            verified_at: Some(4),
        });
        assert_eq!(attribute(admin, never), Finding::Inconclusive);
        let wrong = Some(Status::Accepted { verified_at: None });
        assert_eq!(attribute(wrong, never), Finding::Inconclusive);
        assert_eq!(attribute(None, never), Finding::Inconclusive);
    }

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

//! TFTP wire format: parsing and building packets (RFC 1350 section 5,
//! RFC 2347 for options and OACK). Pure functions over byte slices; what the
//! fields mean for a transfer is decided elsewhere.

/// Opcodes (RFC 1350 section 5, RFC 2347 for OACK).
pub const RRQ: u16 = 1;
pub const WRQ: u16 = 2;
pub const DATA: u16 = 3;
pub const ACK: u16 = 4;
pub const ERROR: u16 = 5;
pub const OACK: u16 = 6;

/// Bytes before the payload of a DATA packet: opcode and block number.
pub const DATA_HEADER: usize = 4;

/// Error codes (RFC 1350 appendix, RFC 2347 for code 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum ErrorCode {
    NotDefined = 0,
    FileNotFound = 1,
    AccessViolation = 2,
    DiskFull = 3,
    IllegalOperation = 4,
    UnknownTransferId = 5,
    FileExists = 6,
    NoSuchUser = 7,
    OptionRefused = 8,
}

/// Why a datagram is not a TFTP packet this server understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("packet shorter than its opcode")]
    Short,
    #[error("unknown opcode {0}")]
    Opcode(u16),
    #[error("request without a NUL-terminated file name")]
    Filename,
    #[error("request without a NUL-terminated mode")]
    Mode,
    #[error("truncated ACK")]
    Ack,
    #[error("truncated DATA")]
    Data,
    #[error("truncated ERROR")]
    Error,
}

/// A read or write request (RFC 1350 section 5, options per RFC 2347).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// The file name as sent: any bytes but NUL, not interpreted here.
    pub filename: &'a [u8],
    /// The transfer mode as sent (case is not normalised).
    pub mode: &'a [u8],
    /// Option name/value pairs in the order sent. Unterminated trailing
    /// bytes, a name without a value and NUL padding are ignored, as some
    /// PXE ROMs pad their requests.
    pub options: Vec<(&'a [u8], &'a [u8])>,
}

/// One parsed packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packet<'a> {
    Rrq(Request<'a>),
    Wrq(Request<'a>),
    Data { block: u16, data: &'a [u8] },
    Ack { block: u16 },
    Error { code: u16, message: &'a [u8] },
    Oack { options: Vec<(&'a [u8], &'a [u8])> },
}

/// Parses one datagram.
pub fn parse(buf: &[u8]) -> Result<Packet<'_>, ParseError> {
    let (op, rest) = split_u16(buf).ok_or(ParseError::Short)?;
    match op {
        RRQ => parse_request(rest).map(Packet::Rrq),
        WRQ => parse_request(rest).map(Packet::Wrq),
        DATA => {
            let (block, data) = split_u16(rest).ok_or(ParseError::Data)?;
            Ok(Packet::Data { block, data })
        }
        ACK => {
            // Trailing bytes after the block number are tolerated: some
            // firmwares pad short frames.
            let (block, _) = split_u16(rest).ok_or(ParseError::Ack)?;
            Ok(Packet::Ack { block })
        }
        ERROR => {
            let (code, rest) = split_u16(rest).ok_or(ParseError::Error)?;
            let message = rest.split(|&b| b == 0).next().unwrap_or_default();
            Ok(Packet::Error { code, message })
        }
        OACK => Ok(Packet::Oack {
            options: parse_options(rest),
        }),
        other => Err(ParseError::Opcode(other)),
    }
}

fn split_u16(buf: &[u8]) -> Option<(u16, &[u8])> {
    let (head, rest) = buf.split_first_chunk::<2>()?;
    Some((u16::from_be_bytes(*head), rest))
}

/// Splits off one NUL-terminated string.
fn take_str(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = buf.iter().position(|&b| b == 0)?;
    Some((&buf[..end], &buf[end + 1..]))
}

fn parse_request(buf: &[u8]) -> Result<Request<'_>, ParseError> {
    let (filename, rest) = take_str(buf).ok_or(ParseError::Filename)?;
    let (mode, rest) = take_str(rest).ok_or(ParseError::Mode)?;
    Ok(Request {
        filename,
        mode,
        options: parse_options(rest),
    })
}

fn parse_options(mut buf: &[u8]) -> Vec<(&[u8], &[u8])> {
    let mut options = Vec::new();
    while let Some((name, rest)) = take_str(buf) {
        if name.is_empty() {
            break;
        }
        let Some((value, rest)) = take_str(rest) else {
            break;
        };
        options.push((name, value));
        buf = rest;
    }
    options
}

/// Appends a DATA header for `block` to `out` (the payload follows).
pub fn data_header(out: &mut Vec<u8>, block: u16) {
    out.extend_from_slice(&DATA.to_be_bytes());
    out.extend_from_slice(&block.to_be_bytes());
}

/// An ACK packet.
pub fn ack(block: u16) -> [u8; 4] {
    let [o0, o1] = ACK.to_be_bytes();
    let [b0, b1] = block.to_be_bytes();
    [o0, o1, b0, b1]
}

/// An ERROR packet. NUL bytes in `message` would end it early on the
/// client's side, so they are dropped.
pub fn error(code: ErrorCode, message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + message.len());
    out.extend_from_slice(&ERROR.to_be_bytes());
    out.extend_from_slice(&(code as u16).to_be_bytes());
    out.extend(message.bytes().filter(|&b| b != 0));
    out.push(0);
    out
}

/// An OACK packet with `options` in the given order (RFC 2347).
pub fn oack(options: &[(&str, String)]) -> Vec<u8> {
    let mut out = OACK.to_be_bytes().to_vec();
    for (name, value) in options {
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(value.as_bytes());
        out.push(0);
    }
    out
}

/// A request packet; servers never send one, clients (and tests) do.
pub fn request(op: u16, filename: &[u8], mode: &str, options: &[(&str, &str)]) -> Vec<u8> {
    let mut out = op.to_be_bytes().to_vec();
    out.extend_from_slice(filename);
    out.push(0);
    out.extend_from_slice(mode.as_bytes());
    out.push(0);
    for (name, value) in options {
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(value.as_bytes());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rrq_with_options_parses_in_order() {
        let pkt = request(
            RRQ,
            b"/undionly.kpxe",
            "octet",
            &[("blksize", "1428"), ("tsize", "0")],
        );
        let Ok(Packet::Rrq(req)) = parse(&pkt) else {
            panic!("not an RRQ: {pkt:?}");
        };
        assert_eq!(req.filename, b"/undionly.kpxe");
        assert_eq!(req.mode, b"octet");
        assert_eq!(
            req.options,
            [(&b"blksize"[..], &b"1428"[..]), (b"tsize", b"0")]
        );
    }

    #[test]
    fn request_padding_and_dangling_names_are_ignored() {
        let mut pkt = request(RRQ, b"f", "octet", &[("tsize", "0")]);
        pkt.extend_from_slice(b"blksize\0");
        assert_eq!(
            parse(&pkt),
            Ok(Packet::Rrq(Request {
                filename: b"f",
                mode: b"octet",
                options: vec![(b"tsize", b"0")],
            }))
        );
        let mut padded = request(RRQ, b"f", "octet", &[]);
        padded.extend_from_slice(&[0; 8]);
        let Ok(Packet::Rrq(req)) = parse(&padded) else {
            panic!("padded RRQ rejected");
        };
        assert!(req.options.is_empty());
    }

    #[test]
    fn requests_need_terminated_name_and_mode() {
        assert_eq!(parse(&[0, 1, b'f']), Err(ParseError::Filename));
        assert_eq!(parse(b"\0\x01f\0octet"), Err(ParseError::Mode));
        assert_eq!(parse(&[0]), Err(ParseError::Short));
        assert_eq!(parse(&[0, 9, 0, 0]), Err(ParseError::Opcode(9)));
    }

    #[test]
    fn a_nul_inside_a_name_ends_the_name() {
        // The rest becomes the mode, which the server then refuses.
        let Ok(Packet::Rrq(req)) = parse(b"\0\x01ok\0../../etc/passwd\0octet\0") else {
            panic!("not an RRQ");
        };
        assert_eq!(req.filename, b"ok");
        assert_eq!(req.mode, b"../../etc/passwd");
    }

    #[test]
    fn ack_data_error_oack_round_trip() {
        assert_eq!(parse(&ack(65535)), Ok(Packet::Ack { block: 65535 }));
        let mut data = Vec::new();
        data_header(&mut data, 7);
        data.extend_from_slice(b"xyz");
        assert_eq!(
            parse(&data),
            Ok(Packet::Data {
                block: 7,
                data: b"xyz"
            })
        );
        assert_eq!(
            parse(&error(ErrorCode::AccessViolation, "no\0pe")),
            Ok(Packet::Error {
                code: 2,
                message: b"nope"
            })
        );
        let oack = oack(&[("blksize", "1428".into()), ("tsize", "0".into())]);
        assert_eq!(oack, b"\0\x06blksize\x001428\x00tsize\x000\x00");
        assert_eq!(
            parse(&oack),
            Ok(Packet::Oack {
                options: vec![(b"blksize", b"1428"), (b"tsize", b"0")]
            })
        );
    }

    #[test]
    fn truncated_fixed_packets_are_errors() {
        assert_eq!(parse(&[0, 4, 1]), Err(ParseError::Ack));
        assert_eq!(parse(&[0, 3]), Err(ParseError::Data));
        assert_eq!(parse(&[0, 5, 0]), Err(ParseError::Error));
        assert_eq!(
            parse(&[0, 3, 0, 1]),
            Ok(Packet::Data {
                block: 1,
                data: b""
            })
        );
    }
}

//! The benchmark's TFTP client: one read transfer at a time over std UDP
//! sockets, timed from the request to the last block, the same code against
//! every server.
//!
//! It speaks RFC 1350 with option negotiation (RFC 2347), `blksize`
//! (RFC 2348), `tsize` (RFC 2349) and `windowsize` (RFC 7440):
//!
//! - Without an OACK (no options asked for, or none accepted) the transfer
//!   is plain lock-step with 512-byte blocks.
//! - With a window of `w` blocks it acknowledges every `w`-th block and
//!   the last one. A block after a gap is dropped and the last block
//!   received in order is acknowledged at once, which makes the server
//!   resend from the gap (RFC 7440 section 4); duplicates are ignored.
//! - When nothing arrives for [`RETRY_AFTER`] it repeats its last packet
//!   (the request or the last ACK).
//!
//! The payload is kept in memory and compared with the file afterwards, so a
//! transfer only counts when the bytes are right.

use std::{
    net::{SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};

const RRQ: u16 = 1;
const DATA: u16 = 3;
const ACK: u16 = 4;
const ERROR: u16 = 5;
const OACK: u16 = 6;

/// How long the client waits for a packet before repeating its own.
const RETRY_AFTER: Duration = Duration::from_millis(500);
/// A transfer that takes longer has failed.
const TRANSFER_LIMIT: Duration = Duration::from_secs(90);

/// What the client asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// `blksize` to ask for; `None` sends no options at all (plain RFC 1350).
    pub blksize: Option<u16>,
    /// `windowsize` to ask for (only sent together with `blksize`).
    pub windowsize: Option<u16>,
}

impl Options {
    /// The options as the report shows them.
    pub fn describe(self) -> String {
        match (self.blksize, self.windowsize) {
            (None, _) => "none (blksize 512, lock-step)".into(),
            (Some(b), None) => format!("blksize {b}, tsize"),
            (Some(b), Some(w)) => format!("blksize {b}, tsize, windowsize {w}"),
        }
    }
}

/// One finished transfer.
#[derive(Clone, Debug)]
pub struct Fetched {
    pub elapsed: Duration,
    pub bytes: usize,
    /// What the server granted: block size and window (1 without the option).
    pub blksize: u16,
    pub windowsize: u16,
    /// Packets the client repeated after a silence, and gaps it reported.
    pub repeats: u32,
    pub gaps: u32,
}

/// Downloads `file` from `server` with `options` and checks the bytes
/// against `expected`. The calling thread must be in the client namespace.
pub fn fetch(
    server: SocketAddr,
    file: &str,
    options: Options,
    expected: &[u8],
) -> anyhow::Result<Fetched> {
    let socket = UdpSocket::bind("0.0.0.0:0").context("failed to bind the TFTP client socket")?;
    socket
        .set_read_timeout(Some(RETRY_AFTER))
        .context("failed to set the read timeout")?;
    let request = read_request(file, options);
    let started = Instant::now();
    let mut client = Client {
        socket,
        last_sent: request,
        to: server,
        repeats: 0,
        started,
    };
    client.send_last()?;
    let mut buf = vec![0u8; 65_536 + 4];

    // The first answer fixes the server's transfer ID and the parameters.
    let (mut blksize, mut windowsize) = (512u16, 1u16);
    let mut data = Vec::with_capacity(expected.len());
    let mut first_data = None;
    let tid = loop {
        let Some((len, from)) = client.recv(&mut buf)? else {
            continue;
        };
        if from.ip() != server.ip() {
            continue;
        }
        match opcode(&buf[..len]) {
            OACK => {
                let oack = parse_oack(&buf[2..len])?;
                for (name, value) in oack {
                    match name.as_str() {
                        "blksize" => blksize = value.parse().context("bad blksize in OACK")?,
                        "windowsize" => {
                            windowsize = value.parse().context("bad windowsize in OACK")?
                        }
                        _ => {}
                    }
                }
                client.to = from;
                client.last_sent = ack(0);
                client.send_last()?;
                break from;
            }
            DATA => {
                client.to = from;
                first_data = Some(buf[..len].to_vec());
                break from;
            }
            ERROR => bail!("server refused {file}: {}", error_text(&buf[..len])),
            other => bail!("unexpected opcode {other} in the first answer"),
        }
    };

    let mut expect: u16 = 1;
    let mut in_window: u16 = 0;
    let mut gaps = 0;
    let mut gap_reported = false;
    let mut pending = first_data;
    loop {
        let packet_len = if let Some(pkt) = pending.take() {
            let n = pkt.len();
            buf[..n].copy_from_slice(&pkt);
            n
        } else {
            let Some((len, from)) = client.recv(&mut buf)? else {
                continue;
            };
            if from != tid {
                continue;
            }
            len
        };
        let pkt = &buf[..packet_len];
        match opcode(pkt) {
            DATA if pkt.len() >= 4 => {
                let block = u16::from_be_bytes([pkt[2], pkt[3]]);
                if block != expect {
                    // Before the window: a duplicate. Otherwise a gap: ask
                    // for the window again from the first missing block.
                    let behind = expect.wrapping_sub(block) < 0x8000;
                    if !behind && !gap_reported {
                        gaps += 1;
                        gap_reported = true;
                        in_window = 0;
                        client.last_sent = ack(expect.wrapping_sub(1));
                        client.send_last()?;
                    }
                    continue;
                }
                gap_reported = false;
                let payload = &pkt[4..];
                data.extend_from_slice(payload);
                in_window += 1;
                let last = payload.len() < usize::from(blksize);
                if last || in_window == windowsize {
                    in_window = 0;
                    client.last_sent = ack(block);
                    client.send_last()?;
                }
                expect = expect.wrapping_add(1);
                if last {
                    break;
                }
            }
            ERROR => bail!(
                "server aborted {file} after {} bytes: {}",
                data.len(),
                error_text(pkt)
            ),
            _ => {}
        }
    }
    let elapsed = started.elapsed();
    ensure!(
        data.len() == expected.len(),
        "{file}: received {} bytes, expected {}",
        data.len(),
        expected.len()
    );
    ensure!(
        data == expected,
        "{file}: received bytes differ from the file"
    );
    Ok(Fetched {
        elapsed,
        bytes: data.len(),
        blksize,
        windowsize,
        repeats: client.repeats,
        gaps,
    })
}

struct Client {
    socket: UdpSocket,
    last_sent: Vec<u8>,
    to: SocketAddr,
    repeats: u32,
    started: Instant,
}

impl Client {
    fn send_last(&self) -> anyhow::Result<()> {
        self.socket
            .send_to(&self.last_sent, self.to)
            .with_context(|| format!("failed to send to {}", self.to))?;
        Ok(())
    }

    /// One datagram, or `None` after a silence (the last packet was repeated).
    fn recv(&mut self, buf: &mut [u8]) -> anyhow::Result<Option<(usize, SocketAddr)>> {
        ensure!(
            self.started.elapsed() < TRANSFER_LIMIT,
            "transfer took longer than {} s",
            TRANSFER_LIMIT.as_secs()
        );
        match self.socket.recv_from(buf) {
            Ok(got) => Ok(Some(got)),
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                self.repeats += 1;
                self.send_last()?;
                Ok(None)
            }
            Err(err) => Err(err).context("failed to receive"),
        }
    }
}

fn read_request(file: &str, options: Options) -> Vec<u8> {
    let mut pkt = RRQ.to_be_bytes().to_vec();
    let mut field = |s: &str| {
        pkt.extend_from_slice(s.as_bytes());
        pkt.push(0);
    };
    field(file);
    field("octet");
    if let Some(blksize) = options.blksize {
        field("blksize");
        field(&blksize.to_string());
        field("tsize");
        field("0");
        if let Some(windowsize) = options.windowsize {
            field("windowsize");
            field(&windowsize.to_string());
        }
    }
    pkt
}

fn ack(block: u16) -> Vec<u8> {
    let mut pkt = ACK.to_be_bytes().to_vec();
    pkt.extend_from_slice(&block.to_be_bytes());
    pkt
}

fn opcode(pkt: &[u8]) -> u16 {
    match pkt {
        [a, b, ..] => u16::from_be_bytes([*a, *b]),
        _ => 0,
    }
}

/// The name/value pairs of an OACK body (after the opcode), names lowercased.
fn parse_oack(body: &[u8]) -> anyhow::Result<Vec<(String, String)>> {
    let mut fields = body
        .split(|&b| b == 0)
        .map(|f| String::from_utf8_lossy(f).into_owned());
    let mut pairs = Vec::new();
    while let Some(name) = fields.next() {
        if name.is_empty() {
            break;
        }
        let value = fields.next().context("OACK option without a value")?;
        pairs.push((name.to_ascii_lowercase(), value));
    }
    Ok(pairs)
}

fn error_text(pkt: &[u8]) -> String {
    let code = pkt
        .get(2..4)
        .map_or(0, |c| u16::from_be_bytes([c[0], c[1]]));
    let message = pkt.get(4..).unwrap_or_default();
    let message = message.split(|&b| b == 0).next().unwrap_or_default();
    format!("error {code}: {}", String::from_utf8_lossy(message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_carry_the_options_in_order() {
        let plain = read_request(
            "a",
            Options {
                blksize: None,
                windowsize: Some(16),
            },
        );
        assert_eq!(plain, b"\x00\x01a\0octet\0");
        let windowed = read_request(
            "a",
            Options {
                blksize: Some(1468),
                windowsize: Some(16),
            },
        );
        assert_eq!(
            windowed,
            b"\x00\x01a\0octet\0blksize\x001468\0tsize\x000\0windowsize\x0016\0"
        );
    }

    #[test]
    fn oack_fields_parse_into_pairs() {
        let pairs = parse_oack(b"BLKSIZE\x001468\0tsize\x00123\0").expect("parse");
        assert_eq!(
            pairs,
            [
                ("blksize".to_owned(), "1468".to_owned()),
                ("tsize".to_owned(), "123".to_owned())
            ]
        );
    }
}

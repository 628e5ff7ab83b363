//! The firmware's TFTP client: a `tsize` probe it aborts once the size is
//! known, then the transfer with `blksize` (and `windowsize` when the
//! firmware asks it), resending its last packet after 1 s, 5 tries.

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    time::Duration,
};

use anyhow::{Context as _, bail};
use tokio::net::UdpSocket;

use pxe_agent::tftp::packet::{self, DATA, ERROR, ErrorCode, OACK, RRQ};

use super::record::{Event, Timeline};

/// The block size firmware asks for (fits a 1500-byte MTU).
pub const BLKSIZE: u16 = 1456;
const RESEND_AFTER: Duration = Duration::from_secs(1);
const TRIES: u32 = 5;

/// A read request for `file` with `options`.
pub fn rrq(file: &str, options: &[(&str, String)]) -> Vec<u8> {
    let options: Vec<(&str, &str)> = options.iter().map(|(n, v)| (*n, v.as_str())).collect();
    packet::request(RRQ, file.as_bytes(), "octet", &options)
}

/// What the server agreed to in its OACK.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Agreed {
    pub blksize: Option<u16>,
    pub windowsize: Option<u16>,
    pub tsize: Option<u64>,
}

/// Reads an OACK body (after the opcode); options the client did not ask
/// are an error, as firmware treats them.
pub fn parse_oack(body: &[u8], asked: &[&str]) -> anyhow::Result<Agreed> {
    let mut agreed = Agreed::default();
    let mut parts = body.split(|b| *b == 0);
    while let Some(name) = parts.next().filter(|n| !n.is_empty()) {
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        let value = parts.next().context("OACK option without a value")?;
        let value = std::str::from_utf8(value).context("OACK value is not text")?;
        if !asked.contains(&name.as_str()) {
            bail!("OACK has option {name} that was not asked");
        }
        let bad = || format!("OACK {name}={value:?}");
        match name.as_str() {
            "blksize" => agreed.blksize = Some(value.parse().with_context(bad)?),
            "windowsize" => agreed.windowsize = Some(value.parse().with_context(bad)?),
            "tsize" => agreed.tsize = Some(value.parse().with_context(bad)?),
            _ => {}
        }
    }
    if agreed.blksize.is_some_and(|b| !(8..=BLKSIZE).contains(&b)) {
        bail!("OACK blksize {:?} outside 8..={BLKSIZE}", agreed.blksize);
    }
    if agreed.windowsize == Some(0) {
        bail!("OACK windowsize 0");
    }
    Ok(agreed)
}

/// One firmware boot-file download over TFTP from a machine's address.
pub struct Client<'a> {
    socket: UdpSocket,
    server: SocketAddrV4,
    timeline: &'a Timeline,
    /// Resends so far.
    pub retx: u32,
    buf: Vec<u8>,
}

impl<'a> Client<'a> {
    /// A socket on `local` for talking to `server:69`.
    pub async fn bind(
        local: Ipv4Addr,
        server: Ipv4Addr,
        timeline: &'a Timeline,
    ) -> anyhow::Result<Client<'a>> {
        let socket = UdpSocket::bind((local, 0))
            .await
            .with_context(|| format!("failed to bind a TFTP socket on {local}"))?;
        Ok(Client {
            socket,
            server: SocketAddrV4::new(server, 69),
            timeline,
            retx: 0,
            buf: vec![0; 65536],
        })
    }

    async fn send(&self, packet: &[u8], to: SocketAddr, resend: bool) -> anyhow::Result<()> {
        self.socket
            .send_to(packet, to)
            .await
            .context("TFTP send failed")?;
        self.timeline.count(if resend {
            Event::Retransmission
        } else {
            Event::Sent
        });
        Ok(())
    }

    /// Sends `packet` to `to` (unless `sent` already) and waits for a reply,
    /// resending after each silent second, 5 tries; returns the reply's
    /// opcode, body and source. An ERROR fails, except ERROR 0 to a read
    /// request, which counts as no answer.
    async fn call(
        &mut self,
        packet: &[u8],
        to: SocketAddr,
        sent: bool,
    ) -> anyhow::Result<(u16, Vec<u8>, SocketAddr)> {
        let mut busy = false;
        for attempt in 0..TRIES {
            if attempt > 0 || !sent {
                self.send(packet, to, attempt > 0).await?;
            }
            if attempt > 0 {
                self.retx += 1;
            }
            let started = tokio::time::Instant::now();
            let Ok(got) =
                tokio::time::timeout(RESEND_AFTER, self.socket.recv_from(&mut self.buf)).await
            else {
                continue;
            };
            let (len, from) = got.context("TFTP receive failed")?;
            self.timeline.count(Event::Recv);
            if len < 4 {
                bail!("short TFTP packet");
            }
            let opcode = u16::from_be_bytes([self.buf[0], self.buf[1]]);
            let body = self.buf[2..len].to_vec();
            if opcode == ERROR && body[..2] == [0, 0] && to == SocketAddr::V4(self.server) {
                // A refused read request ("server busy"): firmware asks
                // again as if it had gone unanswered.
                tokio::time::sleep_until(started + RESEND_AFTER).await;
                busy = true;
                continue;
            }
            if opcode == ERROR {
                let text = String::from_utf8_lossy(&body[2..]);
                bail!(
                    "TFTP error {}: {}",
                    u16::from_be_bytes([body[0], body[1]]),
                    text.trim_end_matches('\0')
                );
            }
            return Ok((opcode, body, from));
        }
        if busy {
            bail!("TFTP server busy or silent for {TRIES} tries");
        }
        bail!("no TFTP answer after {TRIES} tries")
    }

    /// The `tsize 0` probe: returns the size and aborts with ERROR 0.
    pub async fn probe(&mut self, file: &str) -> anyhow::Result<Option<u64>> {
        let server = SocketAddr::V4(self.server);
        let (opcode, body, from) = self
            .call(&rrq(file, &[("tsize", "0".into())]), server, false)
            .await?;
        let size = match opcode {
            OACK => parse_oack(&body, &["tsize"])?.tsize,
            DATA => None,
            other => bail!("probe answered with opcode {other}"),
        };
        self.send(
            &packet::error(ErrorCode::NotDefined, "tsize probe"),
            from,
            false,
        )
        .await?;
        Ok(size)
    }

    /// Downloads `file`; returns its size.
    pub async fn fetch(&mut self, file: &str, windowsize: u16) -> anyhow::Result<u64> {
        let mut options = vec![("blksize", BLKSIZE.to_string())];
        let mut asked = vec!["blksize"];
        if windowsize > 0 {
            options.push(("windowsize", windowsize.to_string()));
            asked.push("windowsize");
        }
        let server = SocketAddr::V4(self.server);
        let (opcode, body, peer) = self.call(&rrq(file, &options), server, false).await?;
        let mut last = packet::ack(0).to_vec();
        let (blksize, window, mut pending) = match opcode {
            OACK => {
                let agreed = parse_oack(&body, &asked)?;
                self.send(&last, peer, false).await?;
                let window = agreed.windowsize.unwrap_or(1);
                (agreed.blksize.unwrap_or(512), window, None)
            }
            // The server ignored the options: an RFC 1350 transfer.
            DATA => (512, 1, Some(body)),
            other => bail!("RRQ answered with opcode {other}"),
        };
        let (mut size, mut block, mut in_window, mut asked_again) = (0u64, 0u16, 0u16, false);
        loop {
            let body = match pending.take() {
                Some(body) => body,
                None => {
                    let (opcode, body, from) = self.call(&last, peer, true).await?;
                    if from != peer || opcode != DATA {
                        continue;
                    }
                    body
                }
            };
            let got = u16::from_be_bytes([body[0], body[1]]);
            if got != block.wrapping_add(1) {
                // A gap (not a duplicate): ask once from the last good block.
                let ahead = got.wrapping_sub(block) < 0x8000 && got != block;
                if ahead && !asked_again {
                    last = packet::ack(block).to_vec();
                    self.send(&last, peer, true).await?;
                    self.retx += 1;
                    asked_again = true;
                    in_window = 0;
                }
                continue;
            }
            asked_again = false;
            block = got;
            let len = body.len() - 2;
            size += len as u64;
            in_window += 1;
            let end = len < usize::from(blksize);
            if end || in_window >= window {
                last = packet::ack(block).to_vec();
                in_window = 0;
                self.send(&last, peer, false).await?;
                if end {
                    return Ok(size);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_carry_their_options() {
        let packet = rrq(
            "bios/undionly.kpxe",
            &[("blksize", "1456".into()), ("windowsize", "4".into())],
        );
        assert_eq!(
            packet,
            b"\x00\x01bios/undionly.kpxe\0octet\0blksize\x001456\0windowsize\x004\0"
        );
    }

    #[test]
    fn oacks_are_checked_against_what_was_asked() {
        let agreed = parse_oack(
            b"blksize\x001456\0windowsize\x004\0",
            &["blksize", "windowsize"],
        )
        .expect("agreed");
        assert_eq!(
            agreed,
            Agreed {
                blksize: Some(1456),
                windowsize: Some(4),
                tsize: None
            }
        );
        assert_eq!(
            parse_oack(b"tsize\x0012345\0", &["tsize"])
                .expect("tsize")
                .tsize,
            Some(12345)
        );
        assert!(
            parse_oack(b"windowsize\x004\0", &["blksize"]).is_err(),
            "not asked"
        );
        assert!(
            parse_oack(b"blksize\x0065000\0", &["blksize"]).is_err(),
            "too big"
        );
        assert!(parse_oack(b"blksize\0", &["blksize"]).is_err(), "no value");
    }
}

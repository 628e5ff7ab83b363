//! A minimal HTTP/1.1 client as firmware and iPXE use it: one request per
//! connection from the machine's own address, bodies framed by
//! Content-Length (anything else fails clearly).

use std::net::{Ipv4Addr, SocketAddr};

use anyhow::{Context as _, bail};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpSocket,
};

use super::{
    record::{Event, Timeline},
    script::Url,
};

/// What came back.
pub struct Response {
    pub status: u16,
    /// The body when it was kept, else empty.
    pub body: Vec<u8>,
    /// The body's length.
    pub len: u64,
}

/// Sends `method url` from `local` and reads the response; the body is kept
/// only with `keep`.
pub async fn request(
    local: Ipv4Addr,
    method: &str,
    url: &Url,
    keep: bool,
    timeline: &Timeline,
) -> anyhow::Result<Response> {
    let socket = TcpSocket::new_v4().context("failed to open a TCP socket")?;
    socket
        .bind(SocketAddr::from((local, 0)))
        .with_context(|| format!("failed to bind {local}"))?;
    let mut stream = socket
        .connect(SocketAddr::V4(url.addr))
        .await
        .with_context(|| format!("connect to {} failed", url.addr))?;
    // iPXE names a length only for a request with content: its POST.
    let length = if method == "POST" {
        "Content-Length: 0\r\n"
    } else {
        ""
    };
    let head = format!(
        "{method} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: iPXE/1.21.1\r\nConnection: close\r\n{length}\r\n",
        url.path, url.authority
    );
    stream
        .write_all(head.as_bytes())
        .await
        .context("HTTP send failed")?;
    timeline.count(Event::Sent);
    let mut buf = Vec::with_capacity(4096);
    let (status, length, header_len) = loop {
        let mut chunk = [0u8; 4096];
        let n = stream
            .read(&mut chunk)
            .await
            .context("HTTP receive failed")?;
        if n == 0 {
            bail!("connection closed before the response head");
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut parsed = httparse::Response::new(&mut headers);
        match parsed.parse(&buf).context("bad HTTP response")? {
            httparse::Status::Partial if buf.len() > 65536 => bail!("response head too long"),
            httparse::Status::Partial => continue,
            httparse::Status::Complete(header_len) => {
                let status = parsed.code.context("no status")?;
                let length = parsed
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .map(|h| {
                        std::str::from_utf8(h.value)
                            .ok()
                            .and_then(|v| v.trim().parse::<u64>().ok())
                            .context("bad Content-Length")
                    })
                    .transpose()?;
                break (status, length, header_len);
            }
        }
    };
    timeline.count(Event::Recv);
    let Some(length) = length else {
        if method == "HEAD" || status == 204 || status == 304 {
            return Ok(Response {
                status,
                body: Vec::new(),
                len: 0,
            });
        }
        bail!("HTTP {status} without Content-Length (chunked bodies are not supported)");
    };
    let mut got = (buf.len() - header_len) as u64;
    let mut body = if keep {
        buf[header_len..].to_vec()
    } else {
        Vec::new()
    };
    let mut chunk = vec![0u8; 65536];
    while got < length {
        let n = stream
            .read(&mut chunk)
            .await
            .context("HTTP body receive failed")?;
        if n == 0 {
            bail!("body ended at {got} of {length} bytes");
        }
        got += n as u64;
        if keep {
            body.extend_from_slice(&chunk[..n]);
        }
    }
    body.truncate(length as usize);
    Ok(Response {
        status,
        body,
        len: length,
    })
}

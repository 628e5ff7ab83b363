//! The boot listener's connection loop. GET and HEAD of boot files and
//! artifacts, the bulk of a boot storm's bytes, are answered here with
//! sendfile(2), so file data goes from the page cache to the socket without
//! a copy through userspace; every other request (scripts, phone-home,
//! anything unusual) is handed, with the bytes already read, to the axum
//! router over hyper.

use std::{
    io,
    net::SocketAddr,
    os::fd::AsRawFd as _,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    Router,
    extract::ConnectInfo,
    http::{HeaderMap, HeaderName, HeaderValue, Method},
};
use hyper_util::{rt::TokioIo, service::TowerToHyperService};
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, Interest, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::watch,
};
use tracing::debug;

use super::{BootState, artifacts, boot::record_fetch};

/// Largest request head read before a request is handed to hyper as is.
const MAX_HEAD: usize = 16 * 1024;
/// How long an idle keep-alive connection is kept.
const IDLE: Duration = Duration::from_secs(60);
/// Bytes per sendfile call.
const SENDFILE_CHUNK: usize = 4 << 20;

/// Accepts connections until shutdown.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    state: Arc<BootState>,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        debug!(error = %e, "accept failed");
                        continue;
                    }
                };
                let (router, state) = (router.clone(), state.clone());
                tokio::spawn(async move {
                    if let Err(e) = connection(stream, peer, router, state).await {
                        debug!(%peer, error = %e, "boot HTTP connection ended");
                    }
                });
            }
        }
    }
}

/// A parsed request head, owned.
struct Head {
    method: Method,
    path: String,
    headers: HeaderMap,
    keep_alive: bool,
    /// Bytes of the head, including the blank line.
    len: usize,
}

/// Serves one connection: file requests here, the rest through hyper.
async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    state: Arc<BootState>,
) -> io::Result<()> {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        let head = loop {
            match parse_head(&buf) {
                Parsed::Head(h) => break Some(h),
                Parsed::Other => break None,
                Parsed::Partial if buf.len() >= MAX_HEAD => break None,
                Parsed::Partial => {
                    let mut chunk = [0u8; 4096];
                    let n = tokio::time::timeout(IDLE, stream.read(&mut chunk))
                        .await
                        .map_err(|_| io::ErrorKind::TimedOut)??;
                    if n == 0 {
                        return Ok(());
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
            }
        };
        let file = match &head {
            Some(h) => file_for(&state, h).await,
            None => None,
        };
        let (Some(head), Some(path)) = (head, file) else {
            return hand_over(stream, buf, peer, router).await;
        };
        buf.drain(..head.len);
        let sent = match artifacts::prepare(&path, &head.method, &head.headers).await {
            Ok(prepared) => send_file(&mut stream, prepared, head.keep_alive).await?,
            Err(response) => {
                write_head(
                    &mut stream,
                    response.status(),
                    response.headers(),
                    0,
                    head.keep_alive,
                )
                .await?;
                false
            }
        };
        if sent {
            record_fetch(&state, peer, &head.path);
        }
        if !head.keep_alive {
            return stream.shutdown().await;
        }
    }
}

enum Parsed {
    Head(Head),
    Partial,
    /// Not a request this loop answers (a body, a bad head): hyper's.
    Other,
}

fn parse_head(buf: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Other,
    };
    let (Some(method), Some(path), Some(version)) = (req.method, req.path, req.version) else {
        return Parsed::Other;
    };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::Other;
    };
    let mut map = HeaderMap::new();
    let mut keep_alive = version == 1;
    for h in req.headers.iter() {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(h.name.as_bytes()),
            HeaderValue::from_bytes(h.value),
        ) else {
            return Parsed::Other;
        };
        if name == axum::http::header::CONNECTION {
            let v = value.to_str().unwrap_or("").to_ascii_lowercase();
            keep_alive = if v.contains("close") {
                false
            } else {
                keep_alive || v.contains("keep-alive")
            };
        }
        if name == axum::http::header::CONTENT_LENGTH
            || name == axum::http::header::TRANSFER_ENCODING
        {
            // A request with a body is not a file fetch.
            return Parsed::Other;
        }
        map.append(name, value);
    }
    Parsed::Head(Head {
        method,
        path: path.to_string(),
        headers: map,
        keep_alive,
        len,
    })
}

/// The file a GET or HEAD names, when this loop serves it.
async fn file_for(state: &BootState, head: &Head) -> Option<std::path::PathBuf> {
    if head.method != Method::GET && head.method != Method::HEAD {
        return None;
    }
    // Percent-encoded or query-carrying paths, scripts and the API: axum's.
    let path = head.path.strip_prefix('/')?;
    if path.contains(['%', '?', '#']) || path.starts_with("boot/") || path.starts_with("api/") {
        return None;
    }
    let (root, rel) = match path.strip_prefix("artifacts/") {
        Some(rel) => (state.artifacts.as_deref()?, rel),
        None => (state.boot_root.as_deref()?, path),
    };
    artifacts::resolve(root, rel).await
}

async fn write_head(
    stream: &mut TcpStream,
    status: axum::http::StatusCode,
    headers: &HeaderMap,
    body: u64,
    keep_alive: bool,
) -> io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
    for (name, value) in headers {
        out.push_str(name.as_str());
        out.push_str(": ");
        out.push_str(value.to_str().unwrap_or(""));
        out.push_str("\r\n");
    }
    if !headers.contains_key(axum::http::header::CONTENT_LENGTH) {
        out.push_str(&format!("content-length: {body}\r\n"));
    }
    out.push_str(if keep_alive {
        "connection: keep-alive\r\n\r\n"
    } else {
        "connection: close\r\n\r\n"
    });
    stream.write_all(out.as_bytes()).await
}

/// Writes the head, then the body with sendfile(2). True when the whole
/// body went out.
async fn send_file(
    stream: &mut TcpStream,
    p: artifacts::Prepared,
    keep_alive: bool,
) -> io::Result<bool> {
    write_head(stream, p.status, &p.headers, p.len, keep_alive).await?;
    let file = p.file.into_std().await;
    let mut offset = i64::try_from(p.start).map_err(io::Error::other)?;
    let mut left = p.len;
    while left > 0 {
        let want = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(SENDFILE_CHUNK);
        let sent = stream
            .async_io(Interest::WRITABLE, || {
                // SAFETY: both fds are open for the call; offset is ours.
                let n = unsafe {
                    libc::sendfile(stream.as_raw_fd(), file.as_raw_fd(), &mut offset, want)
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as u64)
                }
            })
            .await?;
        if sent == 0 {
            return Ok(false);
        }
        left -= sent;
    }
    Ok(true)
}

/// Serves the rest of the connection with the axum router, starting with
/// the bytes already read.
async fn hand_over(
    stream: TcpStream,
    read: Vec<u8>,
    peer: SocketAddr,
    router: Router,
) -> io::Result<()> {
    let service = TowerToHyperService::new(router.layer(axum::Extension(ConnectInfo(peer))));
    hyper::server::conn::http1::Builder::new()
        .serve_connection(
            TokioIo::new(Rewind {
                read,
                pos: 0,
                inner: stream,
            }),
            service,
        )
        .await
        .map_err(io::Error::other)
}

/// A stream that yields `read` before the rest of `inner`.
struct Rewind {
    read: Vec<u8>,
    pos: usize,
    inner: TcpStream,
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.read.len() {
            let n = (self.read.len() - self.pos).min(buf.remaining());
            let pos = self.pos;
            buf.put_slice(&self.read[pos..pos + n]);
            self.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_parsed_or_left_to_hyper() {
        let Parsed::Head(h) = parse_head(
            b"GET /artifacts/vmlinuz HTTP/1.1\r\nHost: x\r\nRange: bytes=0-9\r\n\r\nGET",
        ) else {
            panic!("not parsed")
        };
        assert_eq!(
            (h.method, h.path.as_str(), h.keep_alive, h.len),
            (Method::GET, "/artifacts/vmlinuz", true, 62)
        );
        assert!(h.headers.contains_key("range"));
        let Parsed::Head(h) = parse_head(b"HEAD /ipxe.efi HTTP/1.0\r\n\r\n") else {
            panic!("not parsed")
        };
        assert!(!h.keep_alive);
        assert!(matches!(
            parse_head(b"GET /x HTTP/1.1\r\nHost"),
            Parsed::Partial
        ));
        assert!(matches!(
            parse_head(b"POST /api/v1/hosts/x/booted HTTP/1.1\r\nContent-Length: 2\r\n\r\nok"),
            Parsed::Other
        ));
        assert!(matches!(
            parse_head(b"\x16\x03\x01 not http\r\n\r\n"),
            Parsed::Other
        ));
    }
}

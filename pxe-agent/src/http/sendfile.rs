//! The boot listener's connection loop. GET and HEAD of boot files and
//! artifacts, the bulk of a boot storm's bytes, are answered here with
//! sendfile(2), so file data goes from the page cache to the socket without
//! a copy through userspace; every other request (scripts, phone-home,
//! anything unusual) is handed, with the bytes already read, to the axum
//! router over hyper.
//!
//! The loop also applies the listener's [`Limits`]: a bound on connections
//! served at once, a deadline for each request head (here and in hyper), a
//! deadline for each stalled write, and a pause after a failed accept.
//!
//! An artifact's body is sent only in a turn of its interface's
//! [`Admission`](crate::admission::Admission). Until its turn the
//! connection is parked, request read and no byte answered, and gives its
//! connection slot back (up to [`Limits::max_parked`] parked at once), so
//! scripts and phone-homes on new connections are never queued behind
//! waiting artifacts. File bodies leave at the best-effort priority, the
//! rest at the listener's interactive one ([`limit::SMALL_PRIORITY`]), so
//! on a priority queue (`pfifo_fast`) a script is not queued behind them
//! on the link either.

use std::{
    future::Future,
    io,
    net::SocketAddr,
    os::fd::AsRawFd as _,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};

use axum::{
    Router,
    extract::ConnectInfo,
    http::{HeaderMap, HeaderName, HeaderValue, Method},
};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, Interest, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    time::{Instant, Sleep},
};
use tracing::debug;

use crate::{
    admission::{Admission, Turn},
    shutdown::Shutdown,
};

use super::{
    BootState, artifacts,
    boot::record_fetch,
    limit::{self, AcceptBackoff, Limits, OpenConnection, Stats},
};

/// Largest request head read before a request is handed to hyper as is.
const MAX_HEAD: usize = 16 * 1024;
/// Bytes per sendfile call.
const SENDFILE_CHUNK: usize = 4 << 20;

/// Accepts connections until shutdown, at most `limits.max_connections` at
/// once.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    state: Arc<BootState>,
    limits: Limits,
    mut shutdown: Shutdown,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut backoff = AcceptBackoff::default();
    loop {
        // A slot before the accept: past the bound, connections wait in the
        // listen backlog, where they cost no descriptor and no CPU, and the
        // ones being served keep theirs.
        let permit = match slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                Stats::bump(&state.http_stats.at_limit);
                debug!(
                    max = limits.max_connections,
                    "every boot HTTP connection slot taken"
                );
                tokio::select! {
                    () = shutdown.stopped() => return Ok(()),
                    permit = slots.clone().acquire_owned() => {
                        permit.map_err(io::Error::other)?
                    }
                }
            }
        };
        let accepted = tokio::select! {
            () = shutdown.stopped() => return Ok(()),
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) if limit::is_per_connection(&e) => {
                debug!(error = %e, "accept failed");
                continue;
            }
            Err(e) => {
                Stats::bump(&state.http_stats.accept_errors);
                let pause = backoff.failed(&e);
                tokio::select! {
                    () = shutdown.stopped() => return Ok(()),
                    () = tokio::time::sleep(pause) => continue,
                }
            }
        };
        backoff.succeeded();
        // An IPv4 client of the dual-stack listener is its IPv4 address.
        let peer = SocketAddr::new(crate::wire::canonical(peer.ip()), peer.port());
        let (router, state, slots) = (router.clone(), state.clone(), slots.clone());
        tokio::spawn(async move {
            let _open = OpenConnection::new(&state.http_stats);
            let slot = Slot {
                slots,
                permit: Some(permit),
            };
            if let Err(e) = connection(stream, peer, router, state.clone(), limits, slot).await {
                debug!(%peer, error = %e, "boot HTTP connection ended");
            }
        });
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

/// A connection's slot of the listener's bound: given back while the
/// connection is parked waiting for a turn, and when it ends.
struct Slot {
    slots: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
}

/// Serves one connection: file requests here, the rest through hyper. The
/// connection's slot is given back when it ends.
async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    state: Arc<BootState>,
    limits: Limits,
    mut slot: Slot,
) -> io::Result<()> {
    let stats = &state.http_stats;
    let local = stream
        .local_addr()
        .map_or(peer.ip(), |a| crate::wire::canonical(a.ip()));
    let admission = state.shared.admission.for_local(local);
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut served = 0u64;
    loop {
        // One deadline for the whole head, however it is dripped.
        let deadline = Instant::now() + limits.header_timeout;
        let head = loop {
            match parse_head(&buf) {
                Parsed::Head(h) => break Some(h),
                Parsed::Other => break None,
                Parsed::Partial if buf.len() >= MAX_HEAD => break None,
                Parsed::Partial => {
                    let mut chunk = [0u8; 4096];
                    let Ok(read) = tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await
                    else {
                        // A keep-alive connection idle since its last
                        // response is simply closed; one that never sent a
                        // whole head held its slot for nothing.
                        if served == 0 || !buf.is_empty() {
                            Stats::bump(&stats.head_timeouts);
                            abort(&stream);
                        }
                        return Err(io::ErrorKind::TimedOut.into());
                    };
                    let n = read?;
                    if n == 0 {
                        return Ok(());
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
            }
        };
        let file = match &head {
            Some(h) => file_for(&state, h, peer).await,
            None => None,
        };
        let (Some(head), Some(path)) = (head, file) else {
            return hand_over(stream, buf, peer, router, state.clone(), limits).await;
        };
        buf.drain(..head.len);
        // An artifact's body is sent in a turn; a HEAD has none to send.
        let turn = if head.method == Method::GET && head.path.starts_with("/artifacts/") {
            Some(take_turn(&admission, peer, &mut slot, stats, limits.max_parked).await)
        } else {
            admission.place(peer.ip());
            None
        };
        limit::set_priority(&stream, limit::FILE_PRIORITY);
        let mut body = 0;
        let sent = match artifacts::prepare(&path, &head.method, &head.headers).await {
            Ok(prepared) => {
                body = prepared.len;
                send_file(&mut stream, prepared, head.keep_alive, limits.write_timeout).await
            }
            Err(response) => write_head(
                &mut stream,
                response.status(),
                response.headers(),
                0,
                head.keep_alive,
                limits.write_timeout,
            )
            .await
            .map(|()| false),
        };
        let sent = match sent {
            Ok(sent) => sent,
            Err(e) => {
                // Mid-response: the connection cannot carry another one.
                // A short body ends in a plain close, after the bytes the
                // file still had.
                match e.kind() {
                    io::ErrorKind::TimedOut => {
                        Stats::bump(&stats.write_timeouts);
                        abort(&stream);
                    }
                    io::ErrorKind::UnexpectedEof => Stats::bump(&stats.short_bodies),
                    _ => {}
                }
                return Err(e);
            }
        };
        served += 1;
        if sent {
            Stats::bump(&stats.transfers);
            stats
                .bytes
                .fetch_add(body, std::sync::atomic::Ordering::Relaxed);
            record_fetch(&state, peer, &head.path);
        }
        drop(turn);
        limit::set_priority(&stream, limit::SMALL_PRIORITY);
        if !head.keep_alive {
            return tokio::time::timeout(limits.write_timeout, stream.shutdown())
                .await
                .map_err(|_| io::ErrorKind::TimedOut)?;
        }
        if slot.permit.is_none() {
            // Parked for its turn: a slot again before its next request.
            let permit = slot.slots.clone().acquire_owned().await;
            slot.permit = Some(permit.map_err(io::Error::other)?);
        }
    }
}

/// The connection's turn to send an artifact: at once if one is free,
/// else after waiting parked, its slot given back meanwhile (kept when
/// `max_parked` connections are parked already).
async fn take_turn(
    admission: &Arc<Admission>,
    peer: SocketAddr,
    slot: &mut Slot,
    stats: &Stats,
    max_parked: usize,
) -> Turn {
    if let Some(turn) = admission.try_turn(peer.ip()) {
        return turn;
    }
    let parked = limit::Parked::enter(stats, max_parked);
    if parked.is_some() {
        slot.permit = None;
    }
    let turn = admission.turn(peer.ip()).await;
    drop(parked);
    turn
}

/// Makes the close of a dropped connection a reset: what the kernel still
/// holds for a client that stopped reading is freed at once instead of
/// being retried for minutes.
fn abort(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
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
        // A request with a body is not a file fetch; `Content-Length: 0`,
        // which some clients send on every request, announces none.
        let body = name == axum::http::header::TRANSFER_ENCODING
            || (name == axum::http::header::CONTENT_LENGTH
                && value.as_bytes().trim_ascii() != b"0");
        if body {
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

/// The file a GET or HEAD names, when this loop serves it. A host that
/// `netboot` gives no boot file now is axum's, which refuses it.
async fn file_for(state: &BootState, head: &Head, peer: SocketAddr) -> Option<std::path::PathBuf> {
    if head.method != Method::GET && head.method != Method::HEAD {
        return None;
    }
    if state.shared.inventory().withholds_boot_at(peer.ip()) {
        return None;
    }
    // Percent-encoded or query-carrying paths, scripts and the API: axum's.
    let path = head.path.strip_prefix('/')?;
    if path.contains(['%', '?', '#']) || path.starts_with("boot/") || path.starts_with("api/") {
        return None;
    }
    let (root, rel) = match path.strip_prefix("artifacts/") {
        Some(rel) => (state.artifacts.as_deref()?, rel),
        // A grub profile's config name is rendered per host (axum's route),
        // even where a file of that name exists.
        None if super::grub::is_any_config(state, path) => return None,
        None => (state.boot_root.as_deref()?, path),
    };
    artifacts::resolve(root, rel).await
}

/// Writes a response head; fails with `TimedOut` when the client has not
/// taken it within `write_timeout`.
async fn write_head(
    stream: &mut TcpStream,
    status: axum::http::StatusCode,
    headers: &HeaderMap,
    body: u64,
    keep_alive: bool,
    write_timeout: Duration,
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
    tokio::time::timeout(write_timeout, stream.write_all(out.as_bytes()))
        .await
        .map_err(|_| io::ErrorKind::TimedOut)?
}

/// Writes the head, then the body with sendfile(2). True when there was a
/// body (not HEAD). The whole range goes out or the call fails: with
/// `TimedOut` when the client took nothing for `write_timeout`, with
/// `UnexpectedEof` when the file ended early (it shrank since the head
/// announced its length). Either way the caller must close the connection,
/// which is mid-body.
async fn send_file(
    stream: &mut TcpStream,
    p: artifacts::Prepared,
    keep_alive: bool,
    write_timeout: Duration,
) -> io::Result<bool> {
    write_head(
        stream,
        p.status,
        &p.headers,
        p.len,
        keep_alive,
        write_timeout,
    )
    .await?;
    let file = p.file.into_std().await;
    let mut offset = i64::try_from(p.start).map_err(io::Error::other)?;
    let mut left = p.len;
    while left > 0 {
        let want = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(SENDFILE_CHUNK);
        // sendfile(2) sends what the socket buffer takes and returns; each
        // call that waits is a wait for the client to read.
        let wrote = stream.async_io(Interest::WRITABLE, || {
            // SAFETY: both fds are open for the call; offset is ours.
            let n =
                unsafe { libc::sendfile(stream.as_raw_fd(), file.as_raw_fd(), &mut offset, want) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as u64)
            }
        });
        let sent = tokio::time::timeout(write_timeout, wrote)
            .await
            .map_err(|_| io::ErrorKind::TimedOut)??;
        if sent == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("file ended {left} bytes before the announced length"),
            ));
        }
        left -= sent;
    }
    Ok(p.len > 0)
}

/// Serves the rest of the connection with the axum router, starting with
/// the bytes already read, under the same head and write deadlines.
async fn hand_over(
    stream: TcpStream,
    read: Vec<u8>,
    peer: SocketAddr,
    router: Router,
    state: Arc<BootState>,
    limits: Limits,
) -> io::Result<()> {
    let service = TowerToHyperService::new(router.layer(axum::Extension(ConnectInfo(peer))));
    let io = Rewind {
        read,
        pos: 0,
        inner: stream,
        write_timeout: limits.write_timeout,
        stall: None,
        state: state.clone(),
    };
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(io), service)
        .await;
    match served {
        Err(e) if e.is_timeout() => {
            Stats::bump(&state.http_stats.head_timeouts);
            Err(io::Error::new(io::ErrorKind::TimedOut, e))
        }
        other => other.map_err(io::Error::other),
    }
}

/// A stream that yields `read` before the rest of `inner`, and fails a
/// write the client has not taken for `write_timeout`.
struct Rewind {
    read: Vec<u8>,
    pos: usize,
    inner: TcpStream,
    write_timeout: Duration,
    /// Armed while a write waits for the client.
    stall: Option<Pin<Box<Sleep>>>,
    /// Whose counters a write timeout bumps.
    state: Arc<BootState>,
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

impl Rewind {
    /// Polls a write; past `write_timeout` without progress, `TimedOut`.
    fn poll_progress<T>(
        &mut self,
        cx: &mut Context<'_>,
        op: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if let Poll::Ready(done) = op(Pin::new(&mut self.inner), cx) {
            self.stall = None;
            return Poll::Ready(done);
        }
        let timeout = self.write_timeout;
        let stall = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(stall.as_mut().poll(cx));
        self.stall = None;
        Stats::bump(&self.state.http_stats.write_timeouts);
        abort(&self.inner);
        Poll::Ready(Err(io::ErrorKind::TimedOut.into()))
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_progress(cx, |s, cx| s.poll_write(cx, data))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_progress(cx, |s, cx| s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_progress(cx, |s, cx| s.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_progress(cx, |s, cx| s.poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use std::{
        net::Ipv4Addr,
        path::{Path, PathBuf},
        sync::{
            OnceLock,
            atomic::{AtomicU32, Ordering},
        },
    };

    use tokio::net::TcpSocket;

    use super::*;
    use crate::{
        dhcp::Server, http::boot, inventory::Inventory, lease::LeaseStore, progress::Progress,
        shutdown::Trigger, state::State,
    };

    const INV: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    lease_time: 600
profiles:
  - name: bare
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, profile: bare}
"#;

    static SEQ: AtomicU32 = AtomicU32::new(0);

    /// A boot listener on 127.0.0.1 serving a scratch boot root; stops and
    /// removes the root on drop.
    struct TestServer {
        addr: SocketAddr,
        state: Arc<BootState>,
        root: PathBuf,
        _stop: Trigger,
    }

    impl Drop for TestServer {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    impl TestServer {
        async fn start(limits: Limits, files: &[(&str, usize)]) -> TestServer {
            let root = std::env::temp_dir().join(format!(
                "pxe-http-limits-{}-{}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(root.join("boot")).expect("scratch dir");
            for (name, len) in files {
                std::fs::write(root.join("boot").join(name), pattern(*len)).expect("boot file");
            }
            let inv = Inventory::parse(Path::new("t.yaml"), INV).expect("valid inventory");
            let leases = LeaseStore::open(&root.join("leases.redb")).expect("lease store");
            let state = Arc::new(BootState {
                shared: Arc::new(State::new(
                    Arc::new(inv),
                    leases,
                    16,
                    Arc::new(Progress::default()),
                    Arc::default(),
                )),
                servers: vec![Server {
                    ip: Ipv4Addr::LOCALHOST,
                    mac: [2, 0, 0, 0, 0, 1],
                }],
                servers6: Vec::new(),
                boot_root: Some(root.join("boot")),
                artifacts: None,
                tftp_stats: OnceLock::new(),
                http_stats: Stats::default(),
                token_key: crate::http::token::TokenKey::random().expect("token key"),
                refusal_log: Default::default(),
            });
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("address");
            let (stop, shutdown) = Shutdown::new();
            tokio::spawn(serve(
                listener,
                boot::router(state.clone()),
                state.clone(),
                limits,
                shutdown,
            ));
            TestServer {
                addr,
                state,
                root,
                _stop: stop,
            }
        }

        fn file(&self, name: &str) -> PathBuf {
            self.root.join("boot").join(name)
        }

        fn stats(&self) -> limit::StatsSnapshot {
            self.state.http_stats.snapshot()
        }

        /// Waits until `open` connections are being served.
        async fn wait_open(&self, open: u64) {
            let deadline = Instant::now() + Duration::from_secs(5);
            while self.stats().open != open {
                assert!(Instant::now() < deadline, "open: {:?}", self.stats());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn limits(header_ms: u64, write_ms: u64) -> Limits {
        Limits {
            max_connections: 64,
            max_parked: 64,
            header_timeout: Duration::from_millis(header_ms),
            write_timeout: Duration::from_millis(write_ms),
        }
    }

    /// A connection whose receive buffer is a few KiB, so a response it
    /// does not read stalls the server's writes quickly.
    async fn small_window(addr: SocketAddr) -> TcpStream {
        let sock = TcpSocket::new_v4().expect("socket");
        sock.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        sock.connect(addr).await.expect("connect")
    }

    /// Reads until the server closes or `quiet` passes without a byte;
    /// the bytes, and whether the server closed.
    async fn read_until_closed(stream: &mut TcpStream, quiet: Duration) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        let mut chunk = vec![0u8; 1 << 16];
        loop {
            match tokio::time::timeout(quiet, stream.read(&mut chunk)).await {
                Err(_) => return (out, false),
                Ok(Ok(0) | Err(_)) => return (out, true),
                Ok(Ok(n)) => out.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Splits a response into head and body.
    fn split(response: &[u8]) -> (String, &[u8]) {
        let end = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a whole response head")
            + 4;
        (
            String::from_utf8_lossy(&response[..end]).into_owned(),
            &response[end..],
        )
    }

    /// `GET /<name>` on a fresh connection that asks to be closed after.
    async fn get(addr: SocketAddr, name: &str) -> (String, Vec<u8>) {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(
            format!("GET /{name} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("request");
        let (response, closed) = read_until_closed(&mut s, Duration::from_secs(5)).await;
        assert!(closed, "response not finished");
        let (head, body) = split(&response);
        (head, body.to_vec())
    }

    /// Sends `head` a byte every 50 ms, checking for a close in between;
    /// how long until the server closed, or `None` if it had not by `give_up`.
    async fn drip(stream: &mut TcpStream, head: &[u8], give_up: Duration) -> Option<Duration> {
        let start = Instant::now();
        let mut chunk = [0u8; 1024];
        for byte in head.iter().cycle() {
            if start.elapsed() > give_up {
                return None;
            }
            if stream.write_all(&[*byte]).await.is_err() {
                return Some(start.elapsed());
            }
            match tokio::time::timeout(Duration::from_millis(50), stream.read(&mut chunk)).await {
                Err(_) => {}
                Ok(Ok(0) | Err(_)) => return Some(start.elapsed()),
                Ok(Ok(_)) => panic!("a response to a head never finished"),
            }
        }
        None
    }

    #[tokio::test]
    async fn a_dripped_request_head_is_cut_at_the_head_deadline() {
        let server = TestServer::start(limits(400, 5_000), &[("ipxe.efi", 100)]).await;
        let mut s = TcpStream::connect(server.addr).await.expect("connect");
        let closed = drip(
            &mut s,
            b"GET /ipxe.efi HTTP/1.1\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            Duration::from_secs(4),
        )
        .await
        .expect("a dripping client still connected after 4 s");
        assert!(
            closed < Duration::from_millis(1500),
            "closed after {closed:?}"
        );
        assert_eq!(server.stats().head_timeouts, 1);
        let (head, body) = get(server.addr, "ipxe.efi").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(body, pattern(100));
    }

    #[tokio::test]
    async fn a_dripped_head_on_a_connection_handed_to_hyper_is_cut_at_the_head_deadline() {
        let server = TestServer::start(limits(400, 5_000), &[]).await;
        let mut s = TcpStream::connect(server.addr).await.expect("connect");
        // A script request: the router's, so hyper serves the connection on.
        s.write_all(b"GET /boot/52:54:00:00:00:09.ipxe HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .expect("request");
        let mut response = Vec::new();
        let mut chunk = [0u8; 1024];
        while !response.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut chunk))
                .await
                .expect("answered")
                .expect("read");
            assert!(n > 0, "closed before answering");
            response.extend_from_slice(&chunk[..n]);
        }
        assert!(response.starts_with(b"HTTP/1.1 404"));
        let closed = drip(
            &mut s,
            b"GET /boot/52:54:00:00:00:09.ipxe HTTP/1.1\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaa",
            Duration::from_secs(4),
        )
        .await
        .expect("a dripping client still connected to hyper after 4 s");
        assert!(
            closed < Duration::from_millis(1500),
            "closed after {closed:?}"
        );
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_is_dropped_after_the_write_timeout() {
        const LEN: usize = 24 << 20;
        let server = TestServer::start(limits(5_000, 300), &[("big.img", LEN)]).await;
        let mut s = small_window(server.addr).await;
        s.write_all(b"GET /big.img HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .expect("request");
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let (response, closed) = read_until_closed(&mut s, Duration::from_secs(3)).await;
        assert!(closed, "connection kept after the client stalled");
        assert!(response.len() < LEN, "the whole body went out");
        assert_eq!(server.stats().write_timeouts, 1);
        let (head, body) = get(server.addr, "big.img").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(body == pattern(LEN), "second download differs");
    }

    #[tokio::test]
    async fn a_file_that_shrinks_mid_body_ends_the_keep_alive_connection() {
        const LEN: usize = 16 << 20;
        const LEFT: u64 = 8 << 20;
        let server = TestServer::start(limits(5_000, 5_000), &[("shrinks.img", LEN)]).await;
        let mut s = small_window(server.addr).await;
        s.write_all(b"GET /shrinks.img HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .expect("request");
        // The head announced LEN; the server now waits on the window, well
        // before LEFT.
        tokio::time::sleep(Duration::from_millis(200)).await;
        std::fs::OpenOptions::new()
            .write(true)
            .open(server.file("shrinks.img"))
            .expect("open")
            .set_len(LEFT)
            .expect("truncate");
        let (response, closed) = read_until_closed(&mut s, Duration::from_secs(2)).await;
        let (head, body) = split(&response);
        assert!(head.contains(&format!("content-length: {LEN}")), "{head}");
        assert_eq!(body.len() as u64, LEFT);
        assert!(closed, "keep-alive connection left open mid-body");
        assert_eq!(server.stats().short_bodies, 1);
    }

    #[tokio::test]
    async fn connections_past_the_bound_wait_for_a_slot() {
        let server = TestServer::start(
            Limits {
                max_connections: 2,
                ..limits(5_000, 5_000)
            },
            &[("ipxe.efi", 1000)],
        )
        .await;
        let idle1 = TcpStream::connect(server.addr).await.expect("connect");
        let _idle2 = TcpStream::connect(server.addr).await.expect("connect");
        server.wait_open(2).await;
        let mut third = TcpStream::connect(server.addr).await.expect("connect");
        third
            .write_all(b"GET /ipxe.efi HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .await
            .expect("request");
        let mut chunk = [0u8; 64];
        let early = tokio::time::timeout(Duration::from_millis(300), third.read(&mut chunk)).await;
        assert!(early.is_err(), "answered past the bound: {early:?}");
        assert_eq!(server.stats().open, 2);
        assert!(server.stats().at_limit >= 1);
        drop(idle1);
        let (response, closed) = read_until_closed(&mut third, Duration::from_secs(2)).await;
        assert!(closed, "no answer once a slot freed");
        let (head, body) = split(&response);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(body, pattern(1000));
    }

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

    #[test]
    fn an_empty_announced_body_is_still_a_file_fetch() {
        let Parsed::Head(h) =
            parse_head(b"GET /artifacts/vmlinuz HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        else {
            panic!("GET with Content-Length: 0 left to hyper")
        };
        assert_eq!(h.path, "/artifacts/vmlinuz");
        for head in [
            &b"GET /x HTTP/1.1\r\nContent-Length: 1\r\n\r\nx"[..],
            b"GET /x HTTP/1.1\r\nContent-Length: 00\r\n\r\n",
            b"GET /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ] {
            assert!(matches!(parse_head(head), Parsed::Other), "{head:?}");
        }
    }
}

//! The benchmark's HTTP client: `clients` concurrent downloads of one file,
//! one thread and one connection per download, all released at once, the
//! same code against every server.
//!
//! Each download is a plain HTTP/1.1 GET with `Connection: close`; the
//! status must be 200 and the body exactly `Content-Length` bytes of the
//! expected size. Bodies are read into a reused buffer and dropped. A round
//! lasts from the release until the last download has its last byte.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};

use super::netns;

/// Read buffer per download.
const READ_BUF: usize = 256 * 1024;
/// A download that takes longer has failed.
const DOWNLOAD_LIMIT: Duration = Duration::from_secs(120);

/// One round of concurrent downloads.
#[derive(Clone, Debug)]
pub struct Round {
    /// From the release until the last download completed.
    pub elapsed: Duration,
    /// Each download's own time, from its release to its last byte.
    pub downloads: Vec<Duration>,
    pub bytes: u64,
}

/// Runs `clients` concurrent GETs of `path` from `server`, each on a thread
/// in the namespace `ns`, and checks every body is `size` bytes.
pub fn round(
    ns: &str,
    server: SocketAddr,
    path: &str,
    clients: usize,
    size: u64,
) -> anyhow::Result<Round> {
    let gate = Arc::new(Gate::default());
    let mut workers = Vec::with_capacity(clients);
    for i in 0..clients {
        let (ns, path, waiter) = (ns.to_owned(), path.to_owned(), gate.clone());
        let worker = thread::Builder::new().name(format!("http-{i}")).spawn(
            move || -> anyhow::Result<(Instant, u64)> {
                let entered = netns::enter(&ns);
                ensure!(waiter.ready_and_wait(), "round abandoned");
                entered?;
                let body = download(server, &path, size)?;
                Ok((Instant::now(), body))
            },
        );
        match worker {
            Ok(worker) => workers.push(worker),
            Err(err) => {
                gate.open(false);
                for worker in workers {
                    let _ = worker.join();
                }
                return Err(err).context("failed to spawn a download thread");
            }
        }
    }
    gate.wait_ready(clients);
    let started = Instant::now();
    gate.open(true);
    let mut downloads = Vec::with_capacity(clients);
    let mut bytes = 0;
    let mut first_error = None;
    for worker in workers {
        match worker.join() {
            Ok(Ok((done, body))) => {
                downloads.push(done.saturating_duration_since(started));
                bytes += body;
            }
            Ok(Err(err)) => {
                first_error.get_or_insert(err);
            }
            Err(_) => {
                first_error.get_or_insert(anyhow::anyhow!("a download thread panicked"));
            }
        }
    }
    if let Some(err) = first_error {
        return Err(err);
    }
    let elapsed = downloads.iter().copied().max().unwrap_or_default();
    Ok(Round {
        elapsed,
        downloads,
        bytes,
    })
}

/// Holds the download threads until all of them are ready, then releases
/// them at once (or tells them to give up).
#[derive(Default)]
struct Gate {
    /// Threads waiting, and whether to go (`None` while closed).
    state: Mutex<(usize, Option<bool>)>,
    changed: Condvar,
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, (usize, Option<bool>)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts the caller as ready and waits for the gate; true means go.
    fn ready_and_wait(&self) -> bool {
        let mut state = self.lock();
        state.0 += 1;
        self.changed.notify_all();
        loop {
            if let Some(go) = state.1 {
                return go;
            }
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn wait_ready(&self, count: usize) {
        let mut state = self.lock();
        while state.0 < count {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn open(&self, go: bool) {
        self.lock().1 = Some(go);
        self.changed.notify_all();
    }
}

/// One GET; returns the body's length after checking it.
pub fn download(server: SocketAddr, path: &str, size: u64) -> anyhow::Result<u64> {
    let started = Instant::now();
    let mut stream =
        TcpStream::connect(server).with_context(|| format!("failed to connect to {server}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .context("failed to set a read timeout")?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {server}\r\nUser-Agent: pxe-bench\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .context("failed to send the request")?;
    let mut buf = vec![0u8; READ_BUF];
    let mut filled = 0;
    let header_end = loop {
        if let Some(end) = find(&buf[..filled], b"\r\n\r\n") {
            break end + 4;
        }
        ensure!(filled < 16 * 1024, "response header too long");
        let n = stream
            .read(&mut buf[filled..])
            .context("failed to read the response header")?;
        ensure!(n > 0, "connection closed before the response header ended");
        filled += n;
    };
    let header = String::from_utf8_lossy(&buf[..header_end]).into_owned();
    let status = header.split_whitespace().nth(1).unwrap_or_default();
    ensure!(
        status == "200",
        "{path}: status {status}: {}",
        header.lines().next().unwrap_or_default()
    );
    let length: u64 = header
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .context("response has no Content-Length")?;
    ensure!(
        length == size,
        "{path}: Content-Length {length}, expected {size}"
    );
    let mut body = (filled - header_end) as u64;
    while body < length {
        let n = stream.read(&mut buf).context("failed to read the body")?;
        if n == 0 {
            bail!("{path}: connection closed after {body} of {length} bytes");
        }
        body += n as u64;
        ensure!(
            started.elapsed() < DOWNLOAD_LIMIT,
            "{path}: download took longer than {} s",
            DOWNLOAD_LIMIT.as_secs()
        );
    }
    ensure!(
        body == length,
        "{path}: {body} body bytes, expected {length}"
    );
    Ok(body)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

//! The server over loopback against a scripted client: each test binds port
//! 0 on 127.0.0.1, so none needs privileges.

use super::{
    packet::{ErrorCode, Packet, RRQ, WRQ, parse, request},
    *,
};
use std::{
    fs,
    os::unix::fs::symlink,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};
use tokio::{net::UdpSocket, sync::mpsc, task::JoinHandle, time::timeout};

use crate::shutdown::{Shutdown, Trigger};

/// How long a test waits for a packet it expects.
const EXPECT: Duration = Duration::from_secs(5);

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A scratch directory removed on drop: `root/` is served, files beside it
/// are outside the root.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "pxe-tftp-unit-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(dir.join("root")).expect("scratch dir");
        Scratch(dir)
    }

    fn root(&self) -> PathBuf {
        self.0.join("root")
    }

    /// Writes `contents` to `name` beneath the root.
    fn file(&self, name: &str, contents: &[u8]) {
        let path = self.root().join(name);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("mkdir");
        }
        fs::write(path, contents).expect("write file");
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Deterministic file contents that differ from block to block.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

struct Harness {
    addr: SocketAddr,
    stats: Arc<Stats>,
    events: mpsc::Receiver<TransferEvent>,
    stop: Trigger,
    task: JoinHandle<Result<(), ServeError>>,
    dir: Scratch,
}

impl Harness {
    async fn start(tune: impl FnOnce(&mut TftpConfig)) -> Harness {
        Harness::start_with(tune, None).await
    }

    /// A server that asks `generated` before its root.
    async fn start_with(
        tune: impl FnOnce(&mut TftpConfig),
        generated: Option<Arc<dyn Generated>>,
    ) -> Harness {
        let dir = Scratch::new();
        let mut cfg = TftpConfig::new(dir.root());
        cfg.timeout = Duration::from_millis(200);
        cfg.retries = 3;
        tune(&mut cfg);
        let mut server = Server::new(cfg).expect("server");
        if let Some(generated) = generated {
            server = server.with_generated(generated);
        }
        let stats = server.stats();
        let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        let addr = socket.local_addr().expect("addr");
        let (stop, stopped) = Shutdown::new();
        let (tx, events) = mpsc::channel(64);
        let task = tokio::spawn(server.serve(socket, Some(tx), stopped));
        Harness {
            addr,
            stats,
            events,
            stop,
            task,
            dir,
        }
    }

    async fn client(&self) -> Client {
        Client {
            sock: UdpSocket::bind("127.0.0.1:0").await.expect("bind client"),
            server: self.addr,
        }
    }

    async fn event(&mut self) -> TransferEvent {
        timeout(EXPECT, self.events.recv())
            .await
            .expect("no transfer event")
            .expect("event channel closed")
    }

    async fn shutdown(self) {
        assert!(!self.task.is_finished(), "server gone before shutdown");
        self.stop.stop();
        let result = timeout(EXPECT, self.task)
            .await
            .expect("server did not stop");
        result.expect("server task").expect("server error");
    }
}

struct Client {
    sock: UdpSocket,
    server: SocketAddr,
}

/// One received packet, owned.
#[derive(Debug, PartialEq, Eq)]
enum Got {
    Data(u16, Vec<u8>),
    Oack(Vec<(String, String)>),
    Error(u16, String),
}

impl Client {
    async fn rrq(&self, name: &[u8], options: &[(&str, &str)]) {
        self.rrq_mode(name, "octet", options).await;
    }

    async fn rrq_mode(&self, name: &[u8], mode: &str, options: &[(&str, &str)]) {
        self.raw(&request(RRQ, name, mode, options)).await;
    }

    async fn raw(&self, pkt: &[u8]) {
        self.sock.send_to(pkt, self.server).await.expect("send");
    }

    async fn ack(&self, tid: SocketAddr, block: u16) {
        self.sock
            .send_to(&packet::ack(block), tid)
            .await
            .expect("send ack");
    }

    async fn try_recv(&self, wait: Duration) -> Option<(Got, SocketAddr)> {
        let mut buf = vec![0u8; 70000];
        let (len, from) = timeout(wait, self.sock.recv_from(&mut buf))
            .await
            .ok()?
            .ok()?;
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let got = match parse(&buf[..len]).expect("server sent a malformed packet") {
            Packet::Data { block, data } => Got::Data(block, data.to_vec()),
            Packet::Oack { options } => {
                Got::Oack(options.iter().map(|(n, v)| (text(n), text(v))).collect())
            }
            Packet::Error { code, message } => Got::Error(code, text(message)),
            other => panic!("unexpected packet from the server: {other:?}"),
        };
        Some((got, from))
    }

    async fn recv(&self) -> (Got, SocketAddr) {
        self.try_recv(EXPECT)
            .await
            .expect("no packet from the server")
    }

    async fn expect_error(&self) -> (u16, String) {
        match self.recv().await.0 {
            Got::Error(code, msg) => (code, msg),
            other => panic!("expected an ERROR, got {other:?}"),
        }
    }

    /// Downloads `name` acking every `window` blocks (and the last one);
    /// returns the file and the OACK, if any.
    async fn get(
        &self,
        name: &str,
        options: &[(&str, &str)],
        window: usize,
    ) -> (Vec<u8>, Option<Vec<(String, String)>>) {
        self.rrq(name.as_bytes(), options).await;
        self.receive(window).await
    }

    /// Receives the file a request already sent is answered with, as
    /// [`Client::get`] does.
    async fn receive(&self, window: usize) -> (Vec<u8>, Option<Vec<(String, String)>>) {
        let (mut got, mut tid) = self.recv().await;
        let mut oack = None;
        let mut blksize = 512;
        if let Got::Oack(opts) = &got {
            blksize = opts
                .iter()
                .find(|(n, _)| n == "blksize")
                .map_or(512, |(_, v)| v.parse().expect("blksize"));
            oack = Some(opts.clone());
            self.ack(tid, 0).await;
            (got, tid) = self.recv().await;
        }
        let mut file = Vec::new();
        let mut expected: u64 = 1;
        let mut unacked = 0;
        loop {
            let Got::Data(block, data) = got else {
                panic!("expected DATA, got {got:?}");
            };
            if block == transfer::wire(expected) {
                assert!(data.len() <= blksize, "block larger than blksize");
                file.extend_from_slice(&data);
                expected += 1;
                unacked += 1;
                let last = data.len() < blksize;
                if last || unacked == window {
                    self.ack(tid, block).await;
                    unacked = 0;
                }
                if last {
                    return (file, oack);
                }
            }
            (got, tid) = self.recv().await;
        }
    }
}

fn oack_pairs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// Makes `grub/grub.cfg` for 127.0.0.1 only, naming the client in it.
struct PerClient;

impl Generated for PerClient {
    fn file(&self, peer: std::net::IpAddr, name: &Path) -> Option<Vec<u8>> {
        (name == Path::new("grub/grub.cfg") && peer.is_loopback())
            .then(|| format!("made for {peer}\n").into_bytes())
    }
}

#[tokio::test]
async fn generated_files_shadow_the_root_and_other_names_fall_through() {
    let mut h = Harness::start_with(|_| {}, Some(Arc::new(PerClient))).await;
    h.dir.file("grub/grub.cfg", b"on disk\n");
    h.dir.file("shimx64.efi", &pattern(700));
    let client = h.client().await;
    // Leading `/` and `\\` are sanitized before the provider sees the name.
    let (got, oack) = client.get("/grub\\grub.cfg", &[("tsize", "0")], 1).await;
    assert_eq!(got, b"made for 127.0.0.1\n");
    assert_eq!(oack, Some(oack_pairs(&[("tsize", "19")])));
    assert!(matches!(h.event().await.outcome, Outcome::Done));
    let (got, _) = client.get("shimx64.efi", &[], 1).await;
    assert_eq!(got, pattern(700));
    assert!(matches!(h.event().await.outcome, Outcome::Done));
    // Netascii translates generated bytes too.
    client.rrq_mode(b"grub/grub.cfg", "netascii", &[]).await;
    let (got, tid) = client.recv().await;
    assert_eq!(got, Got::Data(1, b"made for 127.0.0.1\r\n".to_vec()));
    client.ack(tid, 1).await;
    assert!(matches!(h.event().await.outcome, Outcome::Done));
    h.shutdown().await;
}

#[tokio::test]
async fn small_file_is_served_in_one_short_block() {
    let mut h = Harness::start(|_| {}).await;
    let body = pattern(100);
    h.dir.file("small.bin", &body);
    let client = h.client().await;
    let (got, oack) = client.get("small.bin", &[], 1).await;
    assert_eq!(got, body);
    assert_eq!(oack, None);
    let event = h.event().await;
    assert!(matches!(event.outcome, Outcome::Done), "{event:?}");
    assert_eq!((event.file.as_str(), event.bytes), ("small.bin", 100));
    assert_eq!(event.peer, client.sock.local_addr().expect("addr"));
    let stats = h.stats.snapshot();
    assert_eq!((stats.requests, stats.done, stats.bytes), (1, 1, 100));
    assert_eq!(stats.active, 0);
    h.shutdown().await;
}

#[tokio::test]
async fn exact_multiple_of_the_block_size_ends_with_an_empty_block() {
    let mut h = Harness::start(|_| {}).await;
    let body = pattern(1024);
    h.dir.file("exact.bin", &body);
    let client = h.client().await;
    client.rrq(b"exact.bin", &[]).await;
    let mut blocks = Vec::new();
    loop {
        let (Got::Data(n, data), tid) = client.recv().await else {
            panic!("expected DATA");
        };
        client.ack(tid, n).await;
        let last = data.len() < 512;
        blocks.push((n, data));
        if last {
            break;
        }
    }
    let sizes: Vec<(u16, usize)> = blocks.iter().map(|(n, d)| (*n, d.len())).collect();
    assert_eq!(sizes, [(1, 512), (2, 512), (3, 0)]);
    let data: Vec<u8> = blocks.into_iter().flat_map(|(_, d)| d).collect();
    assert_eq!(data, body);
    assert!(matches!(h.event().await.outcome, Outcome::Done));
    h.shutdown().await;
}

#[tokio::test]
async fn empty_file_is_one_empty_block() {
    let mut h = Harness::start(|_| {}).await;
    h.dir.file("empty", b"");
    let client = h.client().await;
    client.rrq(b"empty", &[]).await;
    let (got, tid) = client.recv().await;
    assert_eq!(got, Got::Data(1, Vec::new()));
    client.ack(tid, 1).await;
    let event = h.event().await;
    assert!(matches!(event.outcome, Outcome::Done));
    assert_eq!(event.bytes, 0);
    h.shutdown().await;
}

#[tokio::test]
async fn options_are_negotiated_with_blksize_clamped_and_tsize_reported() {
    let mut h = Harness::start(|cfg| cfg.max_blksize = 1000).await;
    let body = pattern(5000);
    h.dir.file("ipxe.efi", &body);
    let client = h.client().await;
    let (got, oack) = client
        .get(
            "/ipxe.efi",
            &[
                ("blksize", "65464"),
                ("tsize", "0"),
                ("timeout", "2"),
                ("x-unknown", "1"),
            ],
            1,
        )
        .await;
    assert_eq!(got, body);
    assert_eq!(
        oack,
        Some(oack_pairs(&[
            ("blksize", "1000"),
            ("tsize", "5000"),
            ("timeout", "2")
        ]))
    );
    assert!(matches!(h.event().await.outcome, Outcome::Done));
    h.shutdown().await;
}

#[tokio::test]
async fn a_window_of_blocks_is_sent_before_waiting_for_its_ack() {
    let mut h = Harness::start(|cfg| cfg.max_windowsize = 4).await;
    let body = pattern(8 * 100 + 30);
    h.dir.file("win.bin", &body);
    let client = h.client().await;
    client
        .rrq(b"win.bin", &[("blksize", "100"), ("windowsize", "8")])
        .await;
    let (got, tid) = client.recv().await;
    assert_eq!(
        got,
        Got::Oack(oack_pairs(&[("blksize", "100"), ("windowsize", "4")]))
    );
    client.ack(tid, 0).await;
    // Four blocks, then silence until they are acknowledged.
    for n in 1..=4 {
        assert!(matches!(client.recv().await.0, Got::Data(b, _) if b == n));
    }
    assert_eq!(client.try_recv(Duration::from_millis(100)).await, None);
    client.ack(tid, 4).await;
    for n in 5..=8 {
        assert!(matches!(client.recv().await.0, Got::Data(b, _) if b == n));
    }
    // The client saw a gap after 6: the window restarts at 7.
    client.ack(tid, 6).await;
    let mut rest = Vec::new();
    for _ in 0..3 {
        let (Got::Data(n, data), _) = client.recv().await else {
            panic!("expected DATA");
        };
        rest.push((n, data.len()));
    }
    assert_eq!(rest, [(7, 100), (8, 100), (9, 30)]);
    client.ack(tid, 9).await;
    let event = h.event().await;
    assert!(matches!(event.outcome, Outcome::Done), "{event:?}");
    assert_eq!(event.bytes, body.len() as u64);
    // Blocks 7 and 8 went out twice, but in answer to an ACK, not a timeout.
    assert_eq!(h.stats.snapshot().retransmits, 0);
    h.shutdown().await;
}

#[tokio::test]
async fn windowed_download_matches_the_file() {
    let mut h = Harness::start(|cfg| cfg.max_windowsize = 16).await;
    let body = pattern(1 << 20 | 7);
    h.dir.file("big.bin", &body);
    let client = h.client().await;
    let (got, _) = client
        .get(
            "big.bin",
            &[("blksize", "1428"), ("windowsize", "16"), ("tsize", "0")],
            16,
        )
        .await;
    assert!(got == body, "download differs");
    assert!(matches!(h.event().await.outcome, Outcome::Done));
    h.shutdown().await;
}

#[tokio::test]
async fn a_missing_ack_is_answered_by_a_retransmission() {
    let mut h = Harness::start(|cfg| cfg.timeout = Duration::from_millis(100)).await;
    let body = pattern(700);
    h.dir.file("f", &body);
    let client = h.client().await;
    client.rrq(b"f", &[]).await;
    let (first, tid) = client.recv().await;
    assert!(matches!(&first, Got::Data(1, _)));
    // No ACK: the same block comes again after the timeout.
    let (again, again_tid) = client.recv().await;
    assert_eq!((again, again_tid), (first, tid));
    client.ack(tid, 1).await;
    let (Got::Data(2, tail), _) = client.recv().await else {
        panic!("expected block 2");
    };
    assert_eq!(tail, body[512..]);
    client.ack(tid, 2).await;
    assert!(matches!(h.event().await.outcome, Outcome::Done));
    assert_eq!(h.stats.snapshot().retransmits, 1);
    h.shutdown().await;
}

#[tokio::test]
async fn duplicate_acks_do_not_trigger_retransmission() {
    let mut h = Harness::start(|cfg| cfg.timeout = Duration::from_millis(400)).await;
    h.dir.file("f", &pattern(1500));
    let client = h.client().await;
    client.rrq(b"f", &[]).await;
    let (_, tid) = client.recv().await;
    client.ack(tid, 1).await;
    assert!(matches!(client.recv().await.0, Got::Data(2, _)));
    // A delayed duplicate of ACK 1 must not make the server send block 2
    // again (Sorcerer's Apprentice).
    client.ack(tid, 1).await;
    client.ack(tid, 1).await;
    assert_eq!(client.try_recv(Duration::from_millis(200)).await, None);
    client.ack(tid, 2).await;
    assert!(matches!(client.recv().await.0, Got::Data(3, d) if d.len() == 1500 - 1024));
    client.ack(tid, 3).await;
    assert!(matches!(h.event().await.outcome, Outcome::Done));
    assert_eq!(h.stats.snapshot().retransmits, 0);
    h.shutdown().await;
}

#[tokio::test]
async fn block_numbers_roll_over_to_zero() {
    let mut h = Harness::start(|cfg| cfg.max_windowsize = 64).await;
    // 65535 full 8-byte blocks, then 3 more and a short one: numbers run
    // 65535, 0, 1, 2, 3.
    let body = pattern(65535 * 8 + 3 * 8 + 5);
    h.dir.file("wrap.bin", &body);
    let client = h.client().await;
    client
        .rrq(b"wrap.bin", &[("blksize", "8"), ("windowsize", "64")])
        .await;
    let (_, tid) = client.recv().await;
    client.ack(tid, 0).await;
    let mut file = Vec::with_capacity(body.len());
    let mut expected: u64 = 1;
    let mut seen_after_wrap = Vec::new();
    loop {
        let (Got::Data(n, data), _) = client.recv().await else {
            panic!("expected DATA");
        };
        assert_eq!(n, transfer::wire(expected), "out of order");
        if expected > 65535 {
            seen_after_wrap.push(n);
        }
        file.extend_from_slice(&data);
        expected += 1;
        let last = data.len() < 8;
        if last || (expected - 1).is_multiple_of(64) {
            client.ack(tid, n).await;
        }
        if last {
            break;
        }
    }
    assert_eq!(seen_after_wrap, [0, 1, 2, 3]);
    assert!(file == body, "download differs");
    assert!(matches!(h.event().await.outcome, Outcome::Done));
    h.shutdown().await;
}

#[tokio::test]
async fn write_requests_are_refused() {
    let h = Harness::start(|_| {}).await;
    let client = h.client().await;
    client.raw(&request(WRQ, b"upload.bin", "octet", &[])).await;
    let (code, _) = client.expect_error().await;
    assert_eq!(code, ErrorCode::AccessViolation as u16);
    assert!(!h.dir.root().join("upload.bin").exists());
    assert_eq!(h.stats.snapshot().refused, 1);
    h.shutdown().await;
}

#[tokio::test]
async fn traversal_attempts_are_refused() {
    let mut h = Harness::start(|_| {}).await;
    h.dir.file("a/inside.bin", b"inside");
    fs::write(h.dir.0.join("secret"), b"outside").expect("write secret");
    symlink(h.dir.0.join("secret"), h.dir.root().join("escape")).expect("symlink");
    symlink("../secret", h.dir.root().join("escape-rel")).expect("symlink");
    symlink(h.dir.0.join("."), h.dir.root().join("up")).expect("symlink");
    let fifo = std::ffi::CString::new(h.dir.root().join("fifo").as_os_str().as_encoded_bytes())
        .expect("path");
    // SAFETY: plain mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let access = ErrorCode::AccessViolation as u16;
    let missing = ErrorCode::FileNotFound as u16;
    for (name, want) in [
        (&b"../etc/passwd"[..], access),
        (b"a/../../x", access),
        (b"a/../inside.bin", access),
        (b"/../secret", access),
        (b"..\\secret", access),
        (b"escape", access),
        (b"escape-rel", access),
        (b"up/secret", access),
        (b"a", access),
        (b"/", access),
        (b"fifo", access),
        (b"nope.bin", missing),
        (b"a/inside.bin/x", missing),
    ] {
        let client = h.client().await;
        client.rrq(name, &[]).await;
        let (code, msg) = client.expect_error().await;
        assert_eq!(
            code,
            want,
            "{} answered {code} {msg}",
            String::from_utf8_lossy(name)
        );
        let event = h.event().await;
        assert!(
            matches!(event.outcome, Outcome::Failed(TransferError::Path(_))),
            "{event:?}"
        );
    }
    let long = vec![b'a'; 300];
    let client = h.client().await;
    client.rrq(&long, &[]).await;
    assert_eq!(client.expect_error().await.0, access);
    // A NUL inside the name ends it; the rest is taken as the mode and
    // refused.
    client
        .raw(b"\0\x01a/inside.bin\0../../secret\0octet\0")
        .await;
    assert_eq!(
        client.expect_error().await.0,
        ErrorCode::IllegalOperation as u16
    );
    // What stays inside is served, with or without a leading slash.
    for name in ["a/inside.bin", "/a/inside.bin", "//a/./inside.bin"] {
        let (got, _) = h.client().await.get(name, &[], 1).await;
        assert_eq!(got, b"inside");
    }
    h.shutdown().await;
}

#[test]
fn symlinks_that_stay_inside_the_root_are_followed() {
    let dir = Scratch::new();
    dir.file("real/ipxe.efi", b"efi");
    symlink(dir.root().join("real/ipxe.efi"), dir.root().join("abs")).expect("symlink");
    symlink("real/ipxe.efi", dir.root().join("rel")).expect("symlink");
    symlink("real", dir.root().join("dir")).expect("symlink");
    let root = path::Root::open(&dir.root()).expect("root");
    for name in [&b"abs"[..], b"rel", b"dir/ipxe.efi"] {
        let opened = root.open_file(name).expect("open");
        assert_eq!(opened.size, 3);
        assert_eq!(opened.path, Path::new("real/ipxe.efi"));
    }
    assert!(matches!(root.open_file(b"a\0b"), Err(PathError::Nul)));
}

#[test]
fn a_root_that_is_not_a_directory_is_refused() {
    let dir = Scratch::new();
    dir.file("file", b"x");
    assert!(matches!(
        Server::new(TftpConfig::new(dir.root().join("file"))),
        Err(ConfigError::Root(RootError::NotDirectory { .. }))
    ));
    assert!(matches!(
        Server::new(TftpConfig::new(dir.0.join("missing"))),
        Err(ConfigError::Root(RootError::Open { .. }))
    ));
}

#[test]
fn limits_are_validated() {
    let ok = TftpConfig::new("/");
    assert!(ok.validate().is_ok());
    let bad = [
        TftpConfig {
            max_blksize: 7,
            ..ok.clone()
        },
        TftpConfig {
            max_blksize: 65465,
            ..ok.clone()
        },
        TftpConfig {
            max_windowsize: 0,
            ..ok.clone()
        },
        TftpConfig {
            max_windowsize: 65,
            ..ok.clone()
        },
        TftpConfig {
            max_transfers: 0,
            ..ok.clone()
        },
        TftpConfig {
            timeout: Duration::ZERO,
            ..ok.clone()
        },
        TftpConfig {
            timeout: Duration::from_secs(256),
            ..ok.clone()
        },
    ];
    for cfg in bad {
        assert!(cfg.validate().is_err(), "{cfg:?} accepted");
    }
    assert_eq!(TftpConfig::blksize_for_mtu(1500), 1468);
    assert_eq!(TftpConfig::blksize_for_mtu(9000), 8968);
    assert_eq!(TftpConfig::blksize_for_mtu(65536), 65464);
    assert_eq!(TftpConfig::blksize_for_mtu(20), 8);
}

/// A server of one transfer slot and `max_waiting` places, whose slot a
/// first client's transfer of a 4-block file holds; returns the client and
/// its transfer's TID.
async fn one_slot_taken(max_waiting: usize) -> (Harness, Client, SocketAddr) {
    let h = Harness::start(|cfg| {
        cfg.max_transfers = 1;
        cfg.max_waiting = max_waiting;
        cfg.timeout = Duration::from_secs(2);
    })
    .await;
    h.dir.file("f", &pattern(2000));
    let first = h.client().await;
    first.rrq(b"f", &[]).await;
    let (_, tid) = first.recv().await;
    (h, first, tid)
}

/// Acks the rest of [`one_slot_taken`]'s transfer, which frees the slot.
async fn finish_first(h: &mut Harness, first: &Client, tid: SocketAddr) {
    for n in 1..=3 {
        first.ack(tid, n).await;
        assert!(matches!(first.recv().await.0, Got::Data(b, _) if b == n + 1));
    }
    first.ack(tid, 4).await;
    assert!(matches!(h.event().await.outcome, Outcome::Done));
}

#[tokio::test]
async fn requests_beyond_the_bound_and_the_queue_get_server_busy() {
    let (mut h, first, tid) = one_slot_taken(0).await;
    let second = h.client().await;
    second.rrq(b"f", &[]).await;
    let (code, msg) = second.expect_error().await;
    assert_eq!((code, msg.as_str()), (0, "server busy"));
    let event = h.event().await;
    assert!(matches!(
        event.outcome,
        Outcome::Failed(TransferError::Busy { active: 1 })
    ));
    assert_eq!(event.peer, second.sock.local_addr().expect("addr"));
    // The first transfer goes on; once it ends there is room again.
    finish_first(&mut h, &first, tid).await;
    let (got, _) = second.get("f", &[], 1).await;
    assert_eq!(got.len(), 2000);
    assert!(matches!(h.event().await.outcome, Outcome::Done));
    let stats = h.stats.snapshot();
    assert_eq!((stats.busy, stats.done), (1, 2));
    h.shutdown().await;
}

#[tokio::test]
async fn requests_beyond_the_bound_wait_their_turn() {
    let (mut h, first, tid) = one_slot_taken(2).await;
    // Two wait (one of them resends, keeping its place); a third finds the
    // queue full.
    let (second, third, fourth) = (h.client().await, h.client().await, h.client().await);
    second.rrq(b"f", &[]).await;
    third.rrq(b"f", &[]).await;
    second.rrq(b"f", &[]).await;
    fourth.rrq(b"f", &[]).await;
    let (code, msg) = fourth.expect_error().await;
    assert_eq!((code, msg.as_str()), (0, "server busy"));
    assert!(matches!(
        h.event().await.outcome,
        Outcome::Failed(TransferError::Busy { active: 1 })
    ));
    assert!(
        second.try_recv(Duration::from_millis(300)).await.is_none(),
        "a waiting request was answered while the slot was taken"
    );
    let stats = h.stats.snapshot();
    assert_eq!((stats.waiting, stats.waited, stats.duplicates), (2, 2, 1));
    // The slot frees: the waiting ones get their files, in order, without
    // asking again.
    finish_first(&mut h, &first, tid).await;
    for waiter in [&second, &third] {
        let (got, _) = waiter.receive(1).await;
        assert_eq!(got, pattern(2000));
        assert!(matches!(h.event().await.outcome, Outcome::Done));
    }
    let stats = h.stats.snapshot();
    assert_eq!((stats.busy, stats.done, stats.waiting), (1, 3, 0));
    h.shutdown().await;
}

#[tokio::test]
async fn a_repeated_request_is_answered_by_the_running_transfer() {
    let mut h = Harness::start(|cfg| cfg.timeout = Duration::from_secs(5)).await;
    h.dir.file("f", &pattern(10));
    let client = h.client().await;
    client.rrq(b"f", &[("tsize", "0")]).await;
    let (oack, tid) = client.recv().await;
    // As if the OACK was lost: the same OACK comes again at once, from the
    // same TID, long before the retransmission timeout.
    client.rrq(b"f", &[("tsize", "0")]).await;
    let (again, again_tid) = client
        .try_recv(Duration::from_secs(1))
        .await
        .expect("no answer to the repeated request");
    assert_eq!((again, again_tid), (oack, tid));
    client.ack(tid, 0).await;
    assert!(matches!(client.recv().await.0, Got::Data(1, _)));
    client.ack(tid, 1).await;
    assert!(matches!(h.event().await.outcome, Outcome::Done));
    let stats = h.stats.snapshot();
    assert_eq!((stats.requests, stats.duplicates, stats.done), (2, 1, 1));
    h.shutdown().await;
}

#[tokio::test]
async fn a_new_request_from_the_same_port_supersedes_the_running_transfer() {
    let mut h = Harness::start(|cfg| {
        cfg.timeout = Duration::from_secs(5);
        cfg.max_transfers = 1;
    })
    .await;
    h.dir.file("kernel", &pattern(5000));
    h.dir.file("initrd", &pattern(700));
    let client = h.client().await;
    client.rrq(b"kernel", &[]).await;
    let (_, first) = client.recv().await;
    client.ack(first, 1).await;
    assert!(matches!(client.recv().await.0, Got::Data(2, _)));
    // The client moves on without finishing; it needs no second slot.
    let (got, _) = client.get("initrd", &[], 1).await;
    assert_eq!(got, pattern(700));
    let old = h.event().await;
    assert_eq!((old.file.as_str(), old.bytes), ("kernel", 512));
    assert!(
        matches!(&old.outcome, Outcome::Failed(TransferError::Superseded { file }) if file == "initrd"),
        "{old:?}"
    );
    let new = h.event().await;
    assert!(matches!(new.outcome, Outcome::Done), "{new:?}");
    assert_eq!(new.file, "initrd");
    assert_eq!(h.stats.snapshot().busy, 0);
    h.shutdown().await;
}

// On two workers, so the request loop and the transfer really race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_size_probe_aborted_by_the_client_is_followed_at_once() {
    // UEFI PXE asks for tsize, aborts after the OACK, then asks again for
    // the download, possibly from the same port.
    let mut h = Harness::start(|cfg| cfg.timeout = Duration::from_secs(5)).await;
    h.dir.file("ipxe.efi", &pattern(3000));
    let client = h.client().await;
    client.rrq(b"ipxe.efi", &[("tsize", "0")]).await;
    let (probe, probe_tid) = client.recv().await;
    assert_eq!(probe, Got::Oack(oack_pairs(&[("tsize", "3000")])));
    client
        .sock
        .send_to(
            &packet::error(ErrorCode::OptionRefused, "size only"),
            probe_tid,
        )
        .await
        .expect("send");
    client
        .rrq(b"ipxe.efi", &[("tsize", "0"), ("blksize", "1024")])
        .await;
    let (oack, tid) = client
        .try_recv(Duration::from_secs(1))
        .await
        .expect("no answer to the download request");
    assert_eq!(
        oack,
        Got::Oack(oack_pairs(&[("tsize", "3000"), ("blksize", "1024")]))
    );
    assert_ne!(tid, probe_tid, "the download needs its own TID");
    client.ack(tid, 0).await;
    let mut file = Vec::new();
    for n in 1..=3 {
        let (Got::Data(block, data), _) = client.recv().await else {
            panic!("expected DATA");
        };
        assert_eq!(block, n);
        file.extend_from_slice(&data);
        client.ack(tid, n).await;
    }
    assert_eq!(file, pattern(3000));
    let probe = h.event().await;
    assert!(
        matches!(
            probe.outcome,
            Outcome::Failed(TransferError::Peer { code: 8, .. })
        ),
        "{probe:?}"
    );
    assert!(matches!(h.event().await.outcome, Outcome::Done));
    h.shutdown().await;
}

#[tokio::test]
async fn a_client_that_never_answers_is_resent_to_without_backoff() {
    // Backoff is for a client that has answered; one that never did (it
    // gave up while its request waited) gets the first packet a plain
    // timeout apart, so its slot frees soon.
    let mut h = Harness::start(|cfg| {
        cfg.timeout = Duration::from_millis(100);
        cfg.retries = 3;
    })
    .await;
    h.dir.file("f", &pattern(10));
    let client = h.client().await;
    let started = std::time::Instant::now();
    client.rrq(b"f", &[]).await;
    for _ in 0..4 {
        assert!(matches!(client.recv().await.0, Got::Data(1, _)));
    }
    let event = h.event().await;
    assert!(
        matches!(
            event.outcome,
            Outcome::Failed(TransferError::Timeout {
                block: 1,
                retries: 3
            })
        ),
        "{event:?}"
    );
    // Four plain timeouts (400 ms), not 100 + 200 + 400 + 800 ms.
    assert!(
        started.elapsed() < Duration::from_millis(1200),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(h.stats.snapshot().active, 0);
    h.shutdown().await;
}

#[tokio::test]
async fn a_client_that_goes_away_times_out() {
    let mut h = Harness::start(|cfg| {
        cfg.timeout = Duration::from_millis(50);
        cfg.retries = 2;
    })
    .await;
    h.dir.file("f", &pattern(10));
    let client = h.client().await;
    client.rrq(b"f", &[("tsize", "0")]).await;
    // OACK, then two retransmissions, then nothing.
    for _ in 0..3 {
        assert!(matches!(client.recv().await.0, Got::Oack(_)));
    }
    let event = h.event().await;
    assert!(
        matches!(
            event.outcome,
            Outcome::Failed(TransferError::Timeout {
                block: 0,
                retries: 2
            })
        ),
        "{event:?}"
    );
    assert_eq!(client.try_recv(Duration::from_millis(100)).await, None);
    let stats = h.stats.snapshot();
    assert_eq!((stats.failed, stats.retransmits, stats.active), (1, 2, 0));
    h.shutdown().await;
}

#[tokio::test]
async fn a_client_error_ends_the_transfer() {
    let mut h = Harness::start(|_| {}).await;
    h.dir.file("f", &pattern(10));
    let client = h.client().await;
    client.rrq(b"f", &[("blksize", "1024")]).await;
    let (_, tid) = client.recv().await;
    client
        .sock
        .send_to(&packet::error(ErrorCode::OptionRefused, "no thanks"), tid)
        .await
        .expect("send");
    let event = h.event().await;
    assert!(
        matches!(&event.outcome, Outcome::Failed(TransferError::Peer { code: 8, message }) if message == "no thanks"),
        "{event:?}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn strangers_get_unknown_transfer_id_and_the_transfer_goes_on() {
    let mut h = Harness::start(|_| {}).await;
    h.dir.file("f", &pattern(600));
    let client = h.client().await;
    client.rrq(b"f", &[]).await;
    let (_, tid) = client.recv().await;
    let stranger = h.client().await;
    stranger.ack(tid, 1).await;
    let (code, _) = stranger.expect_error().await;
    assert_eq!(code, ErrorCode::UnknownTransferId as u16);
    client.ack(tid, 1).await;
    assert!(matches!(client.recv().await.0, Got::Data(2, _)));
    client.ack(tid, 2).await;
    assert!(matches!(h.event().await.outcome, Outcome::Done));
    h.shutdown().await;
}

#[tokio::test]
async fn netascii_translates_line_ends_and_omits_tsize() {
    let mut h = Harness::start(|_| {}).await;
    h.dir.file("boot.ipxe", b"#!ipxe\nchain x\r\n");
    let client = h.client().await;
    client
        .rrq_mode(b"boot.ipxe", "NETASCII", &[("tsize", "0")])
        .await;
    let (got, tid) = client.recv().await;
    assert_eq!(got, Got::Data(1, b"#!ipxe\r\nchain x\r\0\r\n".to_vec()));
    client.ack(tid, 1).await;
    assert!(matches!(h.event().await.outcome, Outcome::Done));
    h.shutdown().await;
}

#[tokio::test]
async fn unknown_modes_and_stray_packets_are_refused() {
    let h = Harness::start(|_| {}).await;
    h.dir.file("f", b"x");
    let client = h.client().await;
    client.rrq_mode(b"f", "mail", &[]).await;
    assert_eq!(
        client.expect_error().await.0,
        ErrorCode::IllegalOperation as u16
    );
    client.raw(&packet::ack(1)).await;
    assert_eq!(
        client.expect_error().await.0,
        ErrorCode::IllegalOperation as u16
    );
    client.raw(b"\0\x01no-terminator").await;
    assert_eq!(
        client.expect_error().await.0,
        ErrorCode::IllegalOperation as u16
    );
    // An ERROR is never answered.
    client
        .raw(&packet::error(ErrorCode::NotDefined, "whatever"))
        .await;
    assert_eq!(client.try_recv(Duration::from_millis(100)).await, None);
    assert_eq!(h.stats.snapshot().refused, 4);
    h.shutdown().await;
}

#[tokio::test]
async fn shutdown_abandons_transfers_in_progress() {
    let mut h = Harness::start(|cfg| cfg.timeout = Duration::from_secs(5)).await;
    h.dir.file("f", &pattern(2000));
    // One transfer waits for its client's first answer, the other one
    // has heard from its client (the two ways a transfer waits).
    let silent = h.client().await;
    silent.rrq(b"f", &[]).await;
    silent.recv().await;
    let answered = h.client().await;
    answered.rrq(b"f", &[]).await;
    let (_, tid) = answered.recv().await;
    answered.ack(tid, 1).await;
    assert!(matches!(answered.recv().await.0, Got::Data(2, _)));
    let stats = h.stats.clone();
    assert_eq!(stats.snapshot().active, 2);
    let started = std::time::Instant::now();
    assert!(!h.task.is_finished(), "server gone before shutdown");
    h.stop.stop();
    timeout(EXPECT, &mut h.task)
        .await
        .expect("server did not stop")
        .expect("server task")
        .expect("server error");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "waited for a timeout"
    );
    assert_eq!(stats.snapshot().active, 0);
    for _ in 0..2 {
        let event = h.event().await;
        assert!(
            matches!(event.outcome, Outcome::Failed(TransferError::Abandoned)),
            "{event:?}"
        );
    }
    assert_eq!(stats.snapshot().failed, 2);
}

#[test]
fn server_thread_serves_without_a_runtime() {
    let dir = Scratch::new();
    dir.file("f", &pattern(3000));
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let server = ServerThread::spawn(socket, TftpConfig::new(dir.root())).expect("spawn");
    let client = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind client");
    client.set_read_timeout(Some(EXPECT)).expect("read timeout");
    client
        .send_to(&request(RRQ, b"f", "octet", &[]), server.local_addr())
        .expect("send");
    let mut file = Vec::new();
    let mut buf = [0u8; 600];
    loop {
        let (len, tid) = client.recv_from(&mut buf).expect("recv");
        let Ok(Packet::Data { block, data }) = parse(&buf[..len]) else {
            panic!("expected DATA");
        };
        file.extend_from_slice(data);
        client.send_to(&packet::ack(block), tid).expect("ack");
        if data.len() < 512 {
            break;
        }
    }
    assert_eq!(file, pattern(3000));
    let event = server.next_event(EXPECT).expect("event");
    assert!(matches!(event.outcome, Outcome::Done));
    assert_eq!(server.stats().snapshot().bytes, 3000);
    server.stop().expect("stop");
}

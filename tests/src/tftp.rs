//! The TFTP server against real clients: tftp-hpa, atftp and curl download
//! files (empty, one block, 1 MiB + 7, the Debian `ipxe` package's binaries)
//! and must get them byte for byte; path traversal is refused as those
//! clients see it; and a veth link in a lab namespace that drops a tenth of
//! the server's UDP packets (iptables `statistic`, inside the lab only)
//! still yields identical files.
//!
//! The server runs in this process ([`ServerThread`]): on 127.0.0.1 with an
//! ephemeral port, or bound inside the lab's server namespace.

use std::{
    fs,
    net::UdpSocket,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use pxe_agent::tftp::{Outcome, ServerThread, TftpConfig, TransferEvent};
use xtask::Lab;

use crate::{agent::Scratch, fixture::assert_root, raw::in_netns};

/// Where the Debian `ipxe` package installs its binaries.
const IPXE_DIR: &str = "/usr/lib/ipxe";
const ONE_MIB_7: usize = (1 << 20) + 7;
/// How long the server waits for an event after a client exits.
const EVENT_WAIT: Duration = Duration::from_secs(10);

pub(crate) fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 + i / 509) as u8).collect()
}

/// A served root with the test files, and the files' contents by name.
struct Files {
    dir: Scratch,
    files: Vec<(&'static str, Vec<u8>)>,
}

impl Files {
    fn new(name: &str) -> Files {
        assert_root();
        for tool in ["tftp", "atftp", "curl", "iptables"] {
            let found = std::env::var_os("PATH")
                .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(tool).exists()));
            assert!(found, "{tool} missing: run `cargo xtask setup`");
        }
        let dir = Scratch::new(name);
        let root = dir.path("root");
        fs::create_dir_all(root.join("efi")).expect("root");
        let mut files = vec![
            ("empty.bin", Vec::new()),
            ("block.bin", pattern(512)),
            ("big.bin", pattern(ONE_MIB_7)),
        ];
        for (file, name) in [("ipxe.efi", "ipxe.efi"), ("undionly.kpxe", "undionly.kpxe")] {
            // ipxe.efi is a symlink into /boot; the copy makes it a file of
            // the root (a symlink out of the root would be refused).
            let src = Path::new(IPXE_DIR).join(file);
            let bytes = fs::read(&src).unwrap_or_else(|e| {
                panic!(
                    "{}: {e}: install the `ipxe` package (cargo xtask setup)",
                    src.display()
                )
            });
            files.push((name, bytes));
        }
        for (name, bytes) in &files {
            fs::write(root.join(name), bytes).expect("write test file");
        }
        fs::write(root.join("efi/nested.bin"), pattern(3000)).expect("nested");
        fs::write(dir.path("secret"), b"outside the root").expect("secret");
        std::os::unix::fs::symlink(dir.path("secret"), root.join("escape")).expect("symlink");
        Files { dir, files }
    }

    fn root(&self) -> PathBuf {
        self.dir.path("root")
    }

    fn out(&self, name: &str) -> PathBuf {
        self.dir.path(&format!("out-{name}"))
    }

    fn config(&self) -> TftpConfig {
        TftpConfig::new(self.root())
    }
}

/// Serves `files` on 127.0.0.1 with an ephemeral port.
fn serve_loopback(files: &Files) -> ServerThread {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind TFTP socket");
    ServerThread::spawn(socket, files.config()).expect("start TFTP server")
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("failed to run {cmd:?}: {e}"))
}

/// Checks the client's copy and the server's record of the transfer.
fn assert_downloaded(server: &ServerThread, client: &str, name: &str, want: &[u8], out: &Path) {
    let got = fs::read(out).unwrap_or_else(|e| panic!("{client} {name}: no output file: {e}"));
    assert!(
        got == want,
        "{client} {name}: {} bytes differ from the {} served",
        got.len(),
        want.len()
    );
    let event = next_event(server, client, name);
    assert!(
        matches!(event.outcome, Outcome::Done),
        "{client} {name}: {event:?}"
    );
    assert_eq!(event.file.trim_start_matches('/'), name, "{client}");
    assert_eq!(event.bytes, want.len() as u64, "{client} {name}");
}

fn next_event(server: &ServerThread, client: &str, name: &str) -> TransferEvent {
    server
        .next_event(EVENT_WAIT)
        .unwrap_or_else(|| panic!("{client} {name}: the server recorded no transfer"))
}

fn tftp_hpa(port: u16, name: &str, out: &Path) -> Output {
    run(Command::new("tftp")
        .args([
            "-v",
            "-m",
            "binary",
            "127.0.0.1",
            &port.to_string(),
            "-c",
            "get",
            name,
        ])
        .arg(out))
}

#[test]
fn tftp_hpa_downloads_are_byte_identical() {
    let files = Files::new("tftphpa");
    let server = serve_loopback(&files);
    let port = server.local_addr().port();
    for (name, want) in &files.files {
        let out = files.out(name);
        let result = tftp_hpa(port, name, &out);
        assert!(result.status.success(), "tftp {name}: {}", text(&result));
        assert_downloaded(&server, "tftp-hpa", name, want, &out);
    }
    // PXE firmwares send absolute names; they are taken from the root.
    let out = files.out("abs");
    let result = tftp_hpa(port, "/efi/nested.bin", &out);
    assert!(result.status.success(), "{}", text(&result));
    assert_eq!(fs::read(&out).expect("nested"), pattern(3000));
    // The client exits once it has sent its last ACK; the transfer is done
    // on the server when that ACK arrives, which may be a moment later.
    let event = next_event(&server, "tftp-hpa", "/efi/nested.bin");
    assert!(matches!(event.outcome, Outcome::Done), "{event:?}");
    let stats = server.stats().snapshot();
    assert_eq!(stats.done, files.files.len() as u64 + 1);
    assert_eq!(stats.failed, 0);
}

#[test]
fn tftp_hpa_netascii_round_trips_a_text_file() {
    let files = Files::new("tftpascii");
    let script = b"#!ipxe\ndhcp\nchain http://10.66.0.1:8080/boot/${mac}.ipxe\r\nboot\n";
    fs::write(files.root().join("boot.ipxe"), script).expect("script");
    let server = serve_loopback(&files);
    let out = files.out("boot.ipxe");
    let result = run(Command::new("tftp")
        .args(["-v", "-m", "netascii", "127.0.0.1"])
        .arg(server.local_addr().port().to_string())
        .args(["-c", "get", "boot.ipxe"])
        .arg(&out));
    assert!(result.status.success(), "{}", text(&result));
    // The client turns CR LF back into LF and CR NUL into CR.
    assert_eq!(fs::read(&out).expect("script"), script);
    let event = next_event(&server, "tftp-hpa", "boot.ipxe");
    assert!(matches!(event.outcome, Outcome::Done), "{event:?}");
}

fn atftp(port: u16, name: &str, out: &Path, options: &[&str]) -> Output {
    let mut cmd = Command::new("atftp");
    for option in options {
        cmd.args(["--option", option]);
    }
    run(cmd
        .args(["--verbose", "--tftp-timeout", "2", "-g", "-r", name, "-l"])
        .arg(out)
        .args(["127.0.0.1", &port.to_string()]))
}

#[test]
fn atftp_downloads_with_options_are_byte_identical() {
    let files = Files::new("atftp");
    let server = serve_loopback(&files);
    let port = server.local_addr().port();
    let negotiated = ["blksize 1428", "tsize enable", "windowsize 8"];
    for (name, want) in &files.files {
        let out = files.out(name);
        let result = atftp(port, name, &out, &negotiated);
        assert!(result.status.success(), "atftp {name}: {}", text(&result));
        let said = text(&result);
        assert!(
            said.contains("blksize") && said.contains("windowsize"),
            "atftp {name} did not negotiate: {said}"
        );
        assert_downloaded(&server, "atftp", name, want, &out);
    }
    // The largest block atftp can ask for is clamped to the MTU's.
    let out = files.out("big-max");
    let result = atftp(port, "big.bin", &out, &["blksize 65464", "tsize enable"]);
    assert!(result.status.success(), "{}", text(&result));
    assert_downloaded(&server, "atftp", "big.bin", &pattern(ONE_MIB_7), &out);
    // And no options at all is plain RFC 1350.
    let out = files.out("big-plain");
    let result = atftp(port, "big.bin", &out, &["blksize disable", "tsize disable"]);
    assert!(result.status.success(), "{}", text(&result));
    assert_downloaded(&server, "atftp", "big.bin", &pattern(ONE_MIB_7), &out);
}

fn curl(url: &str, out: &Path, extra: &[&str]) -> Output {
    run(Command::new("curl")
        .args([
            "--silent",
            "--show-error",
            "--max-time",
            "60",
            "--path-as-is",
        ])
        .args(extra)
        .arg("--output")
        .arg(out)
        .arg(url))
}

#[test]
fn curl_downloads_are_byte_identical() {
    let files = Files::new("curltftp");
    let server = serve_loopback(&files);
    let base = format!("tftp://127.0.0.1:{}", server.local_addr().port());
    for extra in [&["--tftp-blksize", "1428"][..], &["--tftp-no-options"]] {
        for (name, want) in &files.files {
            // curl asks for tsize whenever it sends options, and rejects
            // the answer 0 ("invalid tsize value in OACK"): an empty file
            // is only fetched without options.
            if want.is_empty() && extra[0] != "--tftp-no-options" {
                continue;
            }
            let out = files.out(name);
            let _ = fs::remove_file(&out);
            let result = curl(&format!("{base}/{name}"), &out, extra);
            assert!(
                result.status.success(),
                "curl {extra:?} {name}: {}",
                text(&result)
            );
            // curl writes no file for an empty download.
            if want.is_empty() && !out.exists() {
                fs::write(&out, b"").expect("empty output");
            }
            assert_downloaded(&server, "curl", name, want, &out);
        }
    }
}

#[test]
fn traversal_is_refused_as_real_clients_see_it() {
    let files = Files::new("tftpjail");
    let server = serve_loopback(&files);
    let port = server.local_addr().port();
    for (name, code) in [
        ("../secret", 2),
        ("efi/../../secret", 2),
        ("../../../../etc/passwd", 2),
        ("escape", 2),
        ("efi", 2),
        ("missing.bin", 1),
    ] {
        let out = files.out("refused");
        let result = tftp_hpa(port, name, &out);
        let said = text(&result);
        assert!(
            said.contains(&format!("Error code {code}")),
            "tftp-hpa {name}: expected error {code}: {said}"
        );
        assert!(
            fs::read(&out).unwrap_or_default().is_empty(),
            "tftp-hpa {name}: got data"
        );
        // curl maps TFTP errors 1 and 2 to its exit codes 68 and 69.
        let result = curl(&format!("tftp://127.0.0.1:{port}/{name}"), &out, &[]);
        assert_eq!(
            result.status.code(),
            Some(67 + code),
            "curl {name}: {}",
            text(&result)
        );
        assert!(
            fs::read(&out).unwrap_or_default().is_empty(),
            "curl {name}: got data"
        );
    }
    // atftp sends write requests too; this server takes none.
    fs::write(files.out("upload"), b"upload").expect("upload");
    let result = run(Command::new("atftp")
        .args(["-p", "-r", "uploaded.bin", "-l"])
        .arg(files.out("upload"))
        .args(["127.0.0.1", &port.to_string()]));
    assert!(
        !result.status.success(),
        "upload accepted: {}",
        text(&result)
    );
    assert!(!files.root().join("uploaded.bin").exists());
    let stats = server.stats().snapshot();
    assert_eq!(stats.done, 0);
    assert_eq!(stats.bytes, 0);
}

/// The share of UDP packets into and out of the lab's server namespace
/// that are dropped.
const LOSS: &str = "0.1";
const SERVER_IP: &str = "10.66.0.1";
const CLIENT_CIDR: &str = "10.66.0.2/16";
const LOSSY_PORT: u16 = 6969;
/// `iptables -m u32` tests on the TFTP header (the 4 bytes after the UDP
/// header): an OACK, and ACK 0.
const U32_OACK: &str = "0>>22&0x3C@8>>16=0x6";
const U32_ACK0: &str = "0>>22&0x3C@8=0x40000";

/// Replaces the server namespace's filter rules: `exempt` (a u32 test per
/// chain) is accepted, then `LOSS` of all other UDP packets is dropped.
fn lossy_rules(lab: &Lab, exempt: &[(&str, &str)]) {
    let ns = lab.server_ns();
    lab.run_in(ns, &["iptables", "-F"]).expect("iptables -F");
    for (chain, test) in exempt {
        lab.run_in(
            ns,
            &[
                "iptables", "-A", chain, "-p", "udp", "-m", "u32", "--u32", test, "-j", "ACCEPT",
            ],
        )
        .expect("iptables u32 in the lab's server namespace");
    }
    for chain in ["INPUT", "OUTPUT"] {
        lab.run_in(
            ns,
            &[
                "iptables",
                "-A",
                chain,
                "-p",
                "udp",
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                LOSS,
                "-j",
                "DROP",
            ],
        )
        .expect("iptables statistic in the lab's server namespace");
    }
}

/// Checks the client's copy; the server's record is shown when it differs.
fn assert_same(server: &ServerThread, client: &str, out: &Path, want: &[u8], result: &Output) {
    let got = fs::read(out).unwrap_or_default();
    if got != want {
        let events: Vec<_> =
            std::iter::from_fn(|| server.next_event(Duration::from_millis(100))).collect();
        panic!(
            "{client} over the lossy link: {} of {} bytes: {}\nserver: {events:#?}",
            got.len(),
            want.len(),
            text(result)
        );
    }
}

#[test]
fn lossy_link_downloads_stay_byte_identical() {
    let files = Files::new("tftploss");
    let small = pattern((64 << 10) + 7);
    let medium = pattern((128 << 10) + 7);
    fs::write(files.root().join("small.bin"), &small).expect("small");
    fs::write(files.root().join("medium.bin"), &medium).expect("medium");
    let lab = Lab::new("pxtftp").expect("lab");
    let (srv, cli) = (lab.server_ns().to_owned(), lab.client_ns().to_owned());
    lab.run_in(
        &cli,
        &["ip", "addr", "add", CLIENT_CIDR, "dev", lab.client_if()],
    )
    .expect("client address");
    let mut cfg = files.config();
    // A short timeout keeps a lossy run short (it backs off when a client
    // stays silent); ten retries make a spurious failure vanishingly rare.
    cfg.timeout = Duration::from_millis(200);
    cfg.retries = 10;
    // Started from a thread inside the namespace, the server thread and the
    // transfer sockets it opens live there.
    let server = in_netns(&srv, move || {
        let socket = UdpSocket::bind((SERVER_IP, LOSSY_PORT))?;
        ServerThread::spawn(socket, cfg).map_err(std::io::Error::other)
    })
    .expect("enter the server namespace")
    .expect("start TFTP server in the lab");
    let port = LOSSY_PORT.to_string();

    lossy_rules(&lab, &[]);
    // tftp-hpa, lockstep at 512 bytes; `rexmt 1` resends a lost request
    // after one second instead of five.
    let out = files.out("hpa");
    let commands = format!("rexmt 1\nbinary\nget small.bin {}\nquit\n", out.display());
    let mut child = lab
        .cmd_in(&cli, "tftp")
        .args(["-v", SERVER_IP, &port])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tftp");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(commands.as_bytes()).expect("tftp commands");
    }
    let result = child.wait_with_output().expect("tftp");
    assert_same(&server, "tftp-hpa", &out, &small, &result);

    // curl, lockstep at 512 bytes. With options curl also asks for its
    // own `timeout` (5 s at the least), which the server then must use:
    // correct, but slow over this link, so no options here.
    let out = files.out("curl");
    let result = run(lab
        .cmd_in(&cli, "curl")
        .args(["--silent", "--show-error", "--max-time", "120"])
        .args(["--tftp-no-options", "--output"])
        .arg(&out)
        .arg(format!("tftp://{SERVER_IP}:{port}/medium.bin")));
    assert_same(&server, "curl", &out, &medium, &result);

    // atftp with windows of 8 blocks of 1428 bytes. atftp 0.8.0 aborts
    // when it sees a second OACK ("unexpected OACK"), which a lost ACK 0
    // makes any server send, so the handshake is exempt from loss here;
    // every DATA and every later ACK is still dropped at random.
    lossy_rules(&lab, &[("OUTPUT", U32_OACK), ("INPUT", U32_ACK0)]);
    let out = files.out("atftp");
    let result = run(lab
        .cmd_in(&cli, "atftp")
        .args(["--option", "blksize 1428", "--option", "windowsize 8"])
        .args(["--option", "tsize enable", "--tftp-timeout", "1"])
        .args(["-g", "-r", "big.bin", "-l"])
        .arg(&out)
        .args([SERVER_IP, &port]));
    assert_same(&server, "atftp", &out, &pattern(ONE_MIB_7), &result);

    let stats = server.stats().snapshot();
    assert!(stats.retransmits > 0, "nothing was lost: {stats:?}");
    eprintln!("lossy link: {stats:?}");
    drop(server);
    drop(lab);
    let left = run(Command::new("ip").args(["netns", "list"]));
    let listing = String::from_utf8_lossy(&left.stdout);
    assert!(
        !listing.contains(&srv) && !listing.contains(&cli),
        "lab namespaces left behind: {listing}"
    );
}

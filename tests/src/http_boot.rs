//! End to end over the boot HTTP server with curl: per-host iPXE scripts
//! (only to the host's own address), artifacts with ranges and validators,
//! and the phone-home that completes a host's boot progress; and the
//! server's bounds under abuse (slow and silent clients, clients that stop
//! reading, more connections than descriptors or slots).

use std::{
    fs,
    io::{ErrorKind, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    process::{Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::{
    agent::{Scratch, Served, agent_bin},
    slow_path::INVENTORY,
};

pub(crate) const SCRIPT_URL: &str = "http://10.66.0.1:8080/boot/52:54:00:12:34:56.ipxe";

fn inventory() -> String {
    INVENTORY.replace(
        "  - name: worker\n    boot:\n",
        "  - name: worker\n    kernel: \"http://{server}:8080/artifacts/vmlinuz\"\n    initrd: [\"http://{server}:8080/artifacts/initrd.img\"]\n    cmdline: console=ttyS0\n    boot:\n",
    )
}

/// Serves the test inventory with an artifacts directory holding a kernel
/// of `size` bytes, and gives the client the given address.
fn served(name: &str, client_ip: &str, size: usize) -> (Served, Scratch, Vec<u8>) {
    let artifacts = Scratch::new("artifacts");
    let kernel: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(artifacts.path("vmlinuz"), &kernel).expect("kernel");
    fs::write(artifacts.path("initrd.img"), b"initrd").expect("initrd");
    let dir = artifacts.0.to_str().expect("utf-8 path").to_string();
    let served = Served::start_with(name, &inventory(), &["--artifacts", &dir]);
    served.set_client_mac("52:54:00:12:34:56");
    served.add_client_address(client_ip);
    (served, artifacts, kernel)
}

pub(crate) fn curl(served: &Served, args: &[&str]) -> Output {
    served
        .client_cmd("curl")
        .args(["-s", "--max-time", "10"])
        .args(args)
        .output()
        .expect("run curl")
}

pub(crate) fn status(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn host_gets_its_ipxe_script_and_others_get_403() {
    let (served, _artifacts, _) = served("pxhttp", "10.66.1.10/16", 10);
    let out = curl(&served, &[SCRIPT_URL]);
    let script = String::from_utf8_lossy(&out.stdout);
    assert!(script.starts_with("#!ipxe"), "{script}");
    assert!(
        script.contains(
            "kernel http://10.66.0.1:8080/artifacts/vmlinuz initrd=initrd.img console=ttyS0"
        ),
        "{script}"
    );
    assert!(
        script.contains("initrd http://10.66.0.1:8080/artifacts/initrd.img"),
        "{script}"
    );
    // From an address that is not the host's reservation.
    served
        .lab
        .run_in(
            served.lab.client_ns(),
            &[
                "ip",
                "addr",
                "add",
                "10.66.1.99/16",
                "dev",
                served.lab.client_if(),
            ],
        )
        .expect("second address");
    let out = curl(
        &served,
        &[
            "--interface",
            "10.66.1.99",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}\n",
            SCRIPT_URL,
        ],
    );
    assert_eq!(status(&out), "403");
}

#[test]
fn artifacts_honour_range_head_and_etag() {
    let (served, _artifacts, kernel) = served("pxhttp", "10.66.1.10/16", 3 * 1024 * 1024 + 17);
    let url = "http://10.66.0.1:8080/artifacts/vmlinuz";
    let out = curl(&served, &[url]);
    assert!(
        out.stdout == kernel,
        "full download differs ({} bytes)",
        out.stdout.len()
    );
    let out = curl(&served, &["-r", "1000-1999", url]);
    assert_eq!(out.stdout, kernel[1000..2000]);
    let head = curl(&served, &["-I", url]);
    let head = String::from_utf8_lossy(&head.stdout).to_lowercase();
    assert!(
        head.contains(&format!("content-length: {}", kernel.len())),
        "{head}"
    );
    assert!(
        head.contains("accept-ranges: bytes") && head.contains("last-modified:"),
        "{head}"
    );
    let etag = head
        .lines()
        .find_map(|l| l.strip_prefix("etag: "))
        .expect("etag")
        .trim()
        .to_string();
    let out = curl(
        &served,
        &[
            "-H",
            &format!("If-None-Match: {etag}"),
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}\n",
            url,
        ],
    );
    assert_eq!(status(&out), "304");
    let out = curl(
        &served,
        &[
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}\n",
            "http://10.66.0.1:8080/artifacts/../inventory.yaml",
        ],
    );
    assert_ne!(status(&out), "200");
    // Concurrency: 8 parallel ranged downloads are each exact.
    let parts: Vec<String> = (0..8)
        .map(|i| format!("{}-{}", i * 393_216, i * 393_216 + 393_215))
        .collect();
    let children: Vec<_> = parts
        .iter()
        .map(|r| {
            served
                .client_cmd("curl")
                .args(["-s", "--max-time", "20", "-r", r, url])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("curl")
        })
        .collect();
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().expect("curl");
        assert_eq!(
            out.stdout,
            kernel[i * 393_216..(i + 1) * 393_216],
            "part {i}"
        );
    }
}

#[test]
fn phone_home_completes_the_boot_progress() {
    let (served, _artifacts, _) = served("pxhttp", "10.66.1.10/16", 10);
    let script = curl(&served, &[SCRIPT_URL]);
    let script = String::from_utf8_lossy(&script.stdout);
    let token = script
        .split_whitespace()
        .find_map(|a| a.strip_prefix("pxe_agent.token="))
        .unwrap_or_else(|| panic!("no token in the script:\n{script}"));
    let url = format!("http://10.66.0.1:8080/api/v1/hosts/52:54:00:12:34:56/booted?token={token}");
    curl(
        &served,
        &["-o", "/dev/null", "http://10.66.0.1:8080/artifacts/vmlinuz"],
    );
    let out = curl(
        &served,
        &[
            "-X",
            "POST",
            "-d",
            "ramdisk up",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}\n",
            &url,
        ],
    );
    assert_eq!(status(&out), "204");
    let table = served
        .lab
        .cmd_in(served.lab.server_ns(), agent_bin())
        .arg("hosts")
        .output()
        .expect("hosts");
    let table = String::from_utf8_lossy(&table.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("52:54:00:12:34:56"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row.contains("booted")
            && row.contains("ramdisk up")
            && row.contains("/boot/52:54:00:12:34:56.ipxe"),
        "{row}"
    );
}

#[test]
fn boot_root_is_served_over_tftp_and_http_and_recorded() {
    let boot = Scratch::new("bootroot");
    let payload: Vec<u8> = (0..70_000u32).map(|i| (i % 253) as u8).collect();
    fs::write(boot.path("undionly.kpxe"), &payload).expect("boot file");
    let root = boot.0.to_str().expect("utf-8 path").to_string();
    let served = Served::start_with("pxtftp", &inventory(), &["--boot-root", &root]);
    served.set_client_mac("52:54:00:12:34:56");
    served.add_client_address("10.66.1.10/16");
    let out = served.dir.path("got.kpxe");
    let get = served
        .client_cmd("tftp")
        .args(["-m", "binary", "10.66.0.1", "-c", "get", "undionly.kpxe"])
        .arg(&out)
        .output()
        .expect("run tftp");
    assert!(
        get.status.success(),
        "tftp: {}",
        String::from_utf8_lossy(&get.stderr)
    );
    assert!(
        fs::read(&out).expect("downloaded") == payload,
        "TFTP download differs"
    );
    let http = curl(&served, &["http://10.66.0.1:8080/undionly.kpxe"]);
    assert!(http.stdout == payload, "HTTP download differs");
    let table = served
        .lab
        .cmd_in(served.lab.server_ns(), agent_bin())
        .arg("hosts")
        .output()
        .expect("hosts");
    let table = String::from_utf8_lossy(&table.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("52:54:00:12:34:56"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains("undionly.kpxe 70000 B done"), "{row}");
    let stats = served.stats();
    assert_eq!(stats["pxe_tftp_transfers_total{outcome=\"done\"}"], 1);
}

// The boot HTTP server under abuse: slow and silent clients, clients that
// stop reading, more connections than the agent has descriptors or slots.

const BOOT_FILE_URL: &str = "http://10.66.0.1:8080/ipxe.efi";
const BIG_URL: &str = "http://10.66.0.1:8080/artifacts/big.img";
const BOOT_ADDR: ([u8; 4], u16) = ([10, 66, 0, 1], 8080);

/// An agent serving a boot root (`ipxe.efi`, 100 KiB) and an artifact
/// (`big.img`, `big` bytes) with `extra` arguments, under an open-files
/// limit when `nofile` is given; the client end has 10.66.1.10.
pub(crate) struct Abused {
    pub(crate) served: Served,
    pub(crate) efi: Vec<u8>,
    pub(crate) big: Vec<u8>,
    _boot: Scratch,
    _artifacts: Scratch,
}

impl Abused {
    pub(crate) fn start(big: usize, extra: &[&str], nofile: Option<u64>) -> Abused {
        Abused::start_with(big, extra, nofile, None)
    }

    /// Like [`Abused::start`], the agent started with `privileges` (and no
    /// open-files limit of the test's own) when given.
    pub(crate) fn start_with(
        big: usize,
        extra: &[&str],
        nofile: Option<u64>,
        privileges: Option<crate::agent::Privileges>,
    ) -> Abused {
        let boot = Scratch::new("bootroot");
        let artifacts = Scratch::new("artifacts");
        let efi: Vec<u8> = (0..100 * 1024u32).map(|i| (i % 241) as u8).collect();
        let big: Vec<u8> = (0..big).map(|i| (i * 7 % 251) as u8).collect();
        fs::write(boot.path("ipxe.efi"), &efi).expect("boot file");
        fs::write(artifacts.path("big.img"), &big).expect("artifact");
        let mut args = vec![
            "--boot-root",
            boot.0.to_str().expect("utf-8 path"),
            "--artifacts",
            artifacts.0.to_str().expect("utf-8 path"),
        ];
        args.extend_from_slice(extra);
        let served = match privileges {
            Some(privileges) => Served::start_as("pxabuse", &inventory(), &args, privileges),
            None => Served::start_limited("pxabuse", &inventory(), &args, nofile),
        };
        served.add_client_address("10.66.1.10/16");
        Abused {
            served,
            efi,
            big,
            _boot: boot,
            _artifacts: artifacts,
        }
    }

    fn pid(&self) -> u32 {
        self.served.agent_pid()
    }

    /// `n` connections from the client namespace, each sending nothing.
    fn idle_connections(&self, n: usize) -> Vec<TcpStream> {
        let conns = crate::raw::in_netns(self.served.lab.client_ns(), move || {
            (0..n)
                .map(|_| {
                    TcpStream::connect_timeout(&SocketAddr::from(BOOT_ADDR), Duration::from_secs(5))
                })
                .collect::<std::io::Result<Vec<_>>>()
        })
        .expect("client namespace");
        conns.unwrap_or_else(|e| panic!("connect: {e}; agent log:\n{}", self.served.log()))
    }

    pub(crate) fn connect(&self) -> TcpStream {
        self.idle_connections(1).pop().expect("one connection")
    }

    /// Fetches the boot file with curl; panics with the agent's log unless
    /// it arrives whole within `within`.
    fn fetch_boot_file(&self, within: Duration) {
        let start = Instant::now();
        let out = self
            .served
            .client_cmd("curl")
            .args(["-s", "--max-time"])
            .arg(within.as_secs().to_string())
            .arg(BOOT_FILE_URL)
            .output()
            .expect("run curl");
        assert!(
            out.stdout == self.efi,
            "boot file not served within {within:?} ({} bytes after {:?}, curl {}); agent log:\n{}",
            out.stdout.len(),
            start.elapsed(),
            out.status,
            self.served.log()
        );
    }

    fn metric(&self, name: &str) -> u64 {
        self.served
            .stats()
            .get(name)
            .copied()
            .unwrap_or_else(|| panic!("no metric {name}; agent log:\n{}", self.served.log()))
    }
}

/// CPU time (user and system) the process has used.
fn cpu_time(pid: u32) -> Duration {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    // Fields after the command name, which may hold spaces; utime and
    // stime are fields 14 and 15 (proc(5)), in clock ticks.
    let rest = &stat[stat.rfind(')').expect("stat comm") + 2..];
    let fields: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|f| f.parse().expect("stat number"))
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).expect("CLK_TCK");
    Duration::from_millis((fields[0] + fields[1]) * 1000 / hz)
}

/// Sockets the process holds open.
fn open_sockets(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("read fds")
        .filter_map(Result::ok)
        .filter(|e| {
            fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
        })
        .count()
}

/// True once the peer closed (EOF or reset) within `within`.
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).expect("read timeout");
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return false;
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn a_slowloris_client_is_disconnected_by_the_head_deadline() {
    let agent = Abused::start(1024, &["--http-header-timeout", "1s"], None);
    let mut slow = agent.connect();
    slow.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("read timeout");
    let start = Instant::now();
    let head = b"GET /ipxe.efi HTTP/1.1\r\nHost: 10.66.0.1\r\nX-Slow: ";
    let mut closed = None;
    let mut buf = [0u8; 256];
    // A byte every 100 ms, for up to 6 s: each read would have come well
    // within a per-read timeout.
    for byte in head.iter().chain([b'a'; 60].iter()) {
        if slow.write_all(&[*byte]).is_err() {
            closed = Some(start.elapsed());
            break;
        }
        match slow.read(&mut buf) {
            Ok(0) => {
                closed = Some(start.elapsed());
                break;
            }
            Ok(_) => panic!("answered an unfinished head"),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => {
                closed = Some(start.elapsed());
                break;
            }
        }
    }
    let closed = closed.unwrap_or_else(|| {
        panic!(
            "a client dripping its head still connected after {:?}",
            start.elapsed()
        )
    });
    assert!(
        closed < Duration::from_millis(2500),
        "closed after {closed:?}"
    );
    assert_eq!(
        agent.metric("pxe_http_dropped_total{reason=\"head_timeout\"}"),
        1
    );
    agent.fetch_boot_file(Duration::from_secs(5));
}

#[test]
fn bounds_past_the_descriptor_limit_are_lowered_so_accepts_never_fail() {
    // The default bounds (1,024 connections, 128 transfers) are past what
    // 256 descriptors hold: the agent lowers them to fit, says so, and the
    // connections past the bound wait in the backlog instead of failing
    // with EMFILE. Heads may take 30 s, so the connections stay.
    let agent = Abused::start(1024, &["--http-header-timeout", "30s"], Some(256));
    let (wall, before) = (Instant::now(), cpu_time(agent.pid()));
    let idle = agent.idle_connections(400);
    thread::sleep(Duration::from_secs(3));
    let (wall, used) = (wall.elapsed(), cpu_time(agent.pid()) - before);
    assert!(
        used < wall / 10,
        "agent used {used:?} of CPU in {wall:?} with 400 connections open; log:\n{}",
        agent.served.log()
    );
    let log = agent.served.log();
    assert!(
        log.contains("holds fewer transfers and connections than asked"),
        "no word of the lowered bounds; log:\n{log}"
    );
    assert!(
        !log.contains("boot HTTP accept failed"),
        "accepts failed; log:\n{log}"
    );
    drop(idle);
    agent.fetch_boot_file(Duration::from_secs(10));
    assert_eq!(agent.metric("pxe_http_accept_errors_total"), 0);
    assert!(agent.metric("pxe_http_at_limit_total") > 0);
}

#[test]
fn a_bound_below_the_descriptor_limit_serves_while_idle_connections_are_open() {
    // 90 slots and a transfer fit 256 descriptors; 300 connections do not.
    let agent = Abused::start(
        1024,
        &[
            "--http-max-connections",
            "90",
            "--tftp-max-transfers",
            "1",
            "--http-header-timeout",
            "1s",
        ],
        Some(256),
    );
    let idle = agent.idle_connections(300);
    thread::sleep(Duration::from_millis(500));
    let before = cpu_time(agent.pid());
    agent.fetch_boot_file(Duration::from_secs(10));
    assert_eq!(agent.metric("pxe_http_accept_errors_total"), 0);
    assert!(agent.metric("pxe_http_at_limit_total") > 0);
    let used = cpu_time(agent.pid()) - before;
    assert!(used < Duration::from_secs(1), "agent used {used:?} of CPU");
    drop(idle);
}

#[test]
fn a_client_that_stops_reading_is_dropped_and_the_next_download_works() {
    const BIG: usize = 64 << 20;
    let agent = Abused::start(BIG, &["--http-write-timeout", "1s"], None);
    let mut stalled = agent.connect();
    stalled
        .write_all(b"GET /artifacts/big.img HTTP/1.1\r\nHost: 10.66.0.1\r\n\r\n")
        .expect("request");
    // Socket buffers take a few MiB; the rest waits for a reader that
    // does not come.
    thread::sleep(Duration::from_millis(2500));
    stalled
        .set_read_timeout(Some(Duration::from_secs(3)))
        .expect("read timeout");
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    let closed = loop {
        match stalled.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                break false;
            }
            Err(_) => break true,
        }
    };
    assert!(
        closed && got < BIG,
        "a stalled client kept its connection (closed: {closed}, {got} bytes)"
    );
    assert_eq!(
        agent.metric("pxe_http_dropped_total{reason=\"write_timeout\"}"),
        1
    );
    let out = agent
        .served
        .client_cmd("curl")
        .args(["-s", "--max-time", "20", BIG_URL])
        .output()
        .expect("run curl");
    assert!(
        out.stdout == agent.big,
        "next download differs ({} bytes)",
        out.stdout.len()
    );
}

#[test]
fn connections_past_the_bound_do_not_break_a_normal_request() {
    const BIG: usize = 32 << 20;
    let agent = Abused::start(
        BIG,
        &[
            "--http-max-connections",
            "32",
            "--http-header-timeout",
            "1s",
        ],
        None,
    );
    let sockets = open_sockets(agent.pid());
    // A download under way when the flood starts, about 3 s long.
    let download = agent
        .served
        .client_cmd("curl")
        .args(["-s", "--max-time", "30", "--limit-rate", "10M", BIG_URL])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run curl");
    thread::sleep(Duration::from_millis(300));
    let mut idle = agent.idle_connections(100);
    thread::sleep(Duration::from_millis(500));
    let held = open_sockets(agent.pid()) - sockets;
    assert!(
        held <= 32,
        "agent holds {held} connections past a bound of 32"
    );
    agent.fetch_boot_file(Duration::from_secs(10));
    let out = download.wait_with_output().expect("curl");
    assert!(
        out.stdout == agent.big,
        "download under way differs ({} bytes)",
        out.stdout.len()
    );
    // The silent connections were dropped at their head deadline.
    assert!(closed_within(&mut idle[0], Duration::from_secs(1)));
    assert!(agent.metric("pxe_http_dropped_total{reason=\"head_timeout\"}") > 0);
}

#[test]
fn hosts_table_cuts_long_cells_in_line_and_json_keeps_them_whole() {
    let long = "a-hostname-much-longer-than-its-column-of-the-table";
    let inventory = inventory().replace("hostname: node-1", &format!("hostname: {long}"));
    let served = Served::start_with("pxtable", &inventory, &[]);
    served.set_client_mac("52:54:00:12:34:56");
    served.add_client_address("10.66.1.10/16");
    curl(&served, &[SCRIPT_URL]);
    let table = served.cli(&["hosts"]);
    let lines: Vec<&str> = table.lines().collect();
    let row = lines
        .iter()
        .find(|l| l.starts_with("52:54:00:12:34:56"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains("a-hostname-much-longer-…"), "{row}");
    assert!(!row.contains(long), "{row}");
    // STAGE starts where its title does, in characters (the row has a `…`).
    let at = lines[0].find("STAGE").expect("STAGE title");
    let stage: String = row.chars().skip(at).take(6).collect();
    assert_eq!(stage, "script", "{table}");
    let json: serde_json::Value =
        serde_json::from_str(&served.cli(&["hosts", "--format", "json"])).expect("hosts json");
    let host = json
        .as_array()
        .and_then(|a| a.iter().find(|h| h["mac"] == "52:54:00:12:34:56"))
        .unwrap_or_else(|| panic!("{json}"));
    assert_eq!(host["hostname"], long);
    assert_eq!(host["stage"], "script");
}

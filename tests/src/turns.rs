//! Turns for boot transfers (`--boot-transfers`) with real connections:
//! with one turn, a client holding it makes the next file requests wait,
//! parked with nothing answered; they are served one at a time, a boot
//! file (HTTP or TFTP) before artifacts and artifacts in the order asked,
//! while a script is served at once; metrics and `hosts` show the waiting.

use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::TcpStream,
    thread,
    time::{Duration, Instant},
};

use crate::http_boot::{Abused, SCRIPT_URL, curl, status};

/// A GET sent on a new connection from the client namespace.
fn request(agent: &Abused, path: &str) -> TcpStream {
    let mut conn = agent.connect();
    write!(conn, "GET {path} HTTP/1.1\r\nHost: 10.66.0.1\r\n\r\n").expect("request");
    // Each request reaches the agent before the next is sent.
    thread::sleep(Duration::from_millis(200));
    conn
}

/// Bytes that arrive on `conn` within `within` (0: still waiting).
fn arrived(conn: &mut TcpStream, within: Duration) -> usize {
    conn.set_read_timeout(Some(within)).expect("read timeout");
    let mut buf = vec![0u8; 64 * 1024];
    match conn.read(&mut buf) {
        Ok(n) => n,
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => 0,
        Err(e) => panic!("read: {e}"),
    }
}

/// The whole response on `conn`, head included.
fn whole(conn: &mut TcpStream) -> Vec<u8> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut out = Vec::new();
    conn.read_to_end(&mut out).expect("read response");
    out
}

/// The sum of a metric's samples on lane `lane`.
fn lane_metric(agent: &Abused, name: &str, lane: &str) -> u64 {
    agent
        .served
        .stats()
        .iter()
        .filter(|(k, _)| {
            k.starts_with(&format!("{name}{{")) && k.contains(&format!("lane=\"{lane}\""))
        })
        .map(|(_, v)| *v)
        .sum()
}

#[test]
fn one_turn_serves_a_boot_file_first_then_artifacts_in_order_and_scripts_at_once() {
    const BIG: usize = 64 << 20;
    let agent = Abused::start(BIG, &["--boot-transfers", "1"], None);
    agent.served.set_client_mac("52:54:00:12:34:56");
    // The holder takes the one turn and stops reading: the socket buffers
    // take a few MiB, the rest of its artifact waits for it.
    let mut holder = request(&agent, "/artifacts/big.img");
    assert!(
        arrived(&mut holder, Duration::from_secs(2)) > 0,
        "holder served"
    );
    let mut first = request(&agent, "/artifacts/big.img");
    let mut second = request(&agent, "/artifacts/big.img");
    let mut boot = request(&agent, "/ipxe.efi");
    for (name, conn) in [
        ("first", &mut first),
        ("second", &mut second),
        ("boot", &mut boot),
    ] {
        assert_eq!(
            arrived(conn, Duration::from_millis(300)),
            0,
            "{name} answered while the turn is held; agent log:\n{}",
            agent.served.log()
        );
    }
    assert_eq!(
        lane_metric(&agent, "pxe_boot_transfers_running", "artifact"),
        1
    );
    assert_eq!(
        lane_metric(&agent, "pxe_boot_transfers_waiting", "artifact"),
        2
    );
    assert_eq!(lane_metric(&agent, "pxe_boot_transfers_waiting", "boot"), 1);
    let stats = agent.served.stats();
    assert_eq!(stats["pxe_http_parked_connections"], 3);

    // A script takes no turn.
    let started = Instant::now();
    let script = curl(&agent.served, &["-w", "\n%{http_code}", SCRIPT_URL]);
    assert_eq!(status(&script), "200", "script while files wait");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "script took {:?}",
        started.elapsed()
    );
    // `hosts` shows the host waiting for its turn: its first request in
    // line, the boot file (ahead of its artifacts).
    let hosts: serde_json::Value =
        serde_json::from_str(&agent.served.cli(&["hosts", "--format", "json"])).expect("json");
    let host = hosts
        .as_array()
        .and_then(|h| h.iter().find(|h| h["ip"] == "10.66.1.10"))
        .expect("the host");
    assert_eq!(host["turn"]["lane"], "boot", "{host}");
    assert_eq!(host["turn"]["ahead"], 0, "{host}");
    let table = agent.served.cli(&["hosts"]);
    assert!(table.contains("WAITING FOR TURN"), "{table}");

    // A TFTP read request takes a turn of the same interface: it waits too.
    let tftp = agent
        .served
        .client_cmd("curl")
        .args(["-s", "--max-time", "20", "tftp://10.66.0.1/ipxe.efi"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run curl");
    thread::sleep(Duration::from_millis(500));
    assert_eq!(lane_metric(&agent, "pxe_boot_transfers_waiting", "boot"), 2);
    // The holder goes: the boot file is next though it asked last, whole.
    drop(holder);
    let got = whole(&mut boot);
    assert!(
        got.ends_with(&agent.efi) && got.starts_with(b"HTTP/1.1 200"),
        "boot file ({} bytes)",
        got.len()
    );
    // Then the TFTP transfer (a boot file too), before the artifacts.
    let tftp = tftp.wait_with_output().expect("curl");
    assert!(
        tftp.stdout == agent.efi,
        "TFTP boot file ({} bytes)",
        tftp.stdout.len()
    );
    // Then the artifacts, in the order asked, one at a time.
    assert!(
        arrived(&mut first, Duration::from_secs(5)) > 0,
        "first after the boot file"
    );
    assert_eq!(
        arrived(&mut second, Duration::from_millis(500)),
        0,
        "second waits for first"
    );
    drop(first);
    assert!(
        arrived(&mut second, Duration::from_secs(5)) > 0,
        "second after first"
    );
    drop(second);
    let turns = lane_metric(&agent, "pxe_boot_transfer_turns_total", "artifact");
    let waited = lane_metric(&agent, "pxe_boot_transfer_waited_total", "artifact");
    assert_eq!((turns, waited), (3, 2), "artifact turns and waits");
    assert_eq!(
        lane_metric(&agent, "pxe_boot_transfer_waited_total", "boot"),
        2
    );
    // And a download with the turn free again arrives whole.
    let out = agent
        .served
        .client_cmd("curl")
        .args([
            "-s",
            "--max-time",
            "20",
            "http://10.66.0.1:8080/artifacts/big.img",
        ])
        .output()
        .expect("run curl");
    assert!(out.stdout == agent.big, "download after the storm differs");
}

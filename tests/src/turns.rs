//! Turns for artifact downloads (`--artifact-transfers`) with real
//! connections: with one turn, a client holding it makes the next
//! artifact requests wait, parked with nothing answered; they are served
//! one at a time in the order their machines first asked for a boot file,
//! not the order they asked for the artifact, while a script, a boot file
//! over HTTP and one over TFTP are served at once; metrics and `hosts`
//! show the waiting. The agent runs as the DaemonSet runs it.

use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    thread,
    time::{Duration, Instant},
};

use crate::{
    agent::Privileges,
    http_boot::{Abused, SCRIPT_URL, curl, status},
};

const BIG_PATH: &str = "/artifacts/big.img";

/// A GET of `path` sent on a new connection from `from` in the client
/// namespace.
fn request(agent: &Abused, from: Ipv4Addr, path: &str) -> TcpStream {
    let ns = agent.served.lab.client_ns().to_string();
    let mut conn = crate::raw::in_netns(&ns, move || {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        sock.bind(&SocketAddr::from((from, 0)).into())?;
        sock.connect_timeout(
            &SocketAddr::from(([10, 66, 0, 1], 8080)).into(),
            Duration::from_secs(5),
        )?;
        std::io::Result::Ok(TcpStream::from(sock))
    })
    .expect("client namespace")
    .expect("connect");
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

/// The sum of a metric's samples over the interfaces.
fn metric(agent: &Abused, name: &str) -> u64 {
    agent
        .served
        .stats()
        .iter()
        .filter(|(k, _)| *k == name || k.starts_with(&format!("{name}{{")))
        .map(|(_, v)| *v)
        .sum()
}

#[test]
fn one_turn_serves_artifacts_by_their_machines_place_and_the_rest_at_once() {
    const BIG: usize = 64 << 20;
    // As the DaemonSet runs it: five capabilities, no_new_privs.
    let agent = Abused::start_with(
        BIG,
        &["--artifact-transfers", "1"],
        None,
        Some(Privileges::DaemonSet),
    );
    crate::agent::assert_daemonset_privileges(agent.served.agent_pid());
    agent.served.set_client_mac("52:54:00:12:34:56");
    let [host, early, late] = [10, 11, 12].map(|n| Ipv4Addr::new(10, 66, 1, n));
    for extra in [early, late] {
        agent.served.add_client_address(&format!("{extra}/16"));
    }
    // `early` gets its place by its boot file, before anyone asks for an
    // artifact.
    let mut boot = request(&agent, early, "/ipxe.efi");
    assert!(arrived(&mut boot, Duration::from_secs(2)) > 0, "boot file");
    drop(boot);
    // The holder takes the one turn and stops reading: the socket buffers
    // take a few MiB, the rest of its artifact waits for it.
    let mut holder = request(&agent, host, BIG_PATH);
    assert!(
        arrived(&mut holder, Duration::from_secs(2)) > 0,
        "holder served"
    );
    // `late` asks for its artifact before `early` does.
    let mut from_late = request(&agent, late, BIG_PATH);
    let mut from_early = request(&agent, early, BIG_PATH);
    for (name, conn) in [("late", &mut from_late), ("early", &mut from_early)] {
        assert_eq!(
            arrived(conn, Duration::from_millis(300)),
            0,
            "{name} answered while the turn is held; agent log:\n{}",
            agent.served.log()
        );
    }
    assert_eq!(metric(&agent, "pxe_artifact_transfers_running"), 1);
    assert_eq!(metric(&agent, "pxe_artifact_transfers_waiting"), 2);
    assert_eq!(metric(&agent, "pxe_http_parked_connections"), 2);

    // What takes no turn is served while artifacts wait: a script, a boot
    // file over HTTP and over TFTP.
    let started = Instant::now();
    let script = curl(&agent.served, &["-w", "\n%{http_code}", SCRIPT_URL]);
    assert_eq!(status(&script), "200", "script while artifacts wait");
    let efi = curl(&agent.served, &["http://10.66.0.1:8080/ipxe.efi"]);
    assert!(
        efi.stdout == agent.efi,
        "boot file over HTTP while artifacts wait"
    );
    let tftp = curl(&agent.served, &["tftp://10.66.0.1/ipxe.efi"]);
    assert!(
        tftp.stdout == agent.efi,
        "boot file over TFTP while artifacts wait"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    // `hosts` shows a host whose artifact waits for its turn.
    agent.served.set_client_mac("52:54:00:12:34:56");
    let mut waiting_host = request(&agent, host, BIG_PATH);
    let hosts: serde_json::Value =
        serde_json::from_str(&agent.served.cli(&["hosts", "--format", "json"])).expect("json");
    let row = hosts
        .as_array()
        .and_then(|h| h.iter().find(|h| h["ip"] == "10.66.1.10"))
        .expect("the host");
    assert_eq!(row["turn"]["ahead"], 1, "behind `early` only: {row}");
    let table = agent.served.cli(&["hosts"]);
    assert!(table.contains("WAITING FOR TURN"), "{table}");

    // The holder goes: `early` first (its boot file made its place the
    // oldest), then the host (its first artifact came next), then `late`,
    // though it asked before both: one at a time.
    drop(holder);
    assert!(
        arrived(&mut from_early, Duration::from_secs(5)) > 0,
        "early first"
    );
    assert_eq!(arrived(&mut waiting_host, Duration::from_millis(300)), 0);
    drop(from_early);
    assert!(
        arrived(&mut waiting_host, Duration::from_secs(5)) > 0,
        "then the host"
    );
    assert_eq!(
        arrived(&mut from_late, Duration::from_millis(500)),
        0,
        "late waits"
    );
    drop(waiting_host);
    assert!(
        arrived(&mut from_late, Duration::from_secs(5)) > 0,
        "late last"
    );
    drop(from_late);
    assert_eq!(metric(&agent, "pxe_artifact_turns_total"), 4);
    assert_eq!(metric(&agent, "pxe_artifact_turns_waited_total"), 3);
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
    assert!(out.stdout == agent.big, "download after the wait differs");
}

//! Faults injected into a running agent, each while real clients or the
//! load generator keep asking: packet loss on the lab link, a missing and a
//! hung artifact source, SIGKILL and a pinned restart under load, a full
//! state filesystem, and an invalid inventory replacing a good one. What
//! the agent does about each is described in docs/faults.md; each test
//! fails when the agent stops doing it.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::Write as _,
    net::Ipv4Addr,
    os::unix::fs::OpenOptionsExt as _,
    path::Path,
    process::{Command, Output, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use pxe_agent::metrics;

use crate::{
    agent::{Scratch, Served},
    http_boot::{curl, status},
    loadgen::{self, Options, Report},
    mount::Mount,
    persistence::{Dora, Mac, POOL_INVENTORY, lease_all, leases, mac_str, macs},
    raw::in_netns,
    restart::{Bpffs, attached, inventory_with},
    slow_path::INVENTORY,
    tftp::pattern,
};

const NODE1: &str = "52:54:00:12:34:56";
const NODE1_IP: &str = "10.66.1.10";
/// What PXE firmware sends: the fast path answers it for known hosts.
const PXE: [&str; 4] = ["-V", "PXEClient", "-x", "0x5d:0000"];
const SERVER: &str = "http://10.66.0.1:8080";

fn sample(served: &Served, name: &str) -> u64 {
    served.stats().get(name).copied().unwrap_or(0)
}

/// tftp-hpa in the client namespace fetching `file` into `out`, resending
/// its request or ACK after a second of silence, for up to a minute.
fn tftp_get(served: &Served, file: &str, out: &Path) -> std::process::Child {
    let mut child = served
        .client_cmd("tftp")
        .args(["-v", "10.66.0.1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tftp");
    let commands = format!(
        "rexmt 1\ntimeout 60\nbinary\nget {file} {}\nquit\n",
        out.display()
    );
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(commands.as_bytes())
        .expect("tftp commands");
    child
}

fn text(out: &Output) -> String {
    format!(
        "{}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

// ---------------------------------------------------------------------------
// Packet loss

/// The share of UDP frames dropped, each way, on the lab link, in
/// percent: low enough that the clients' own retry limits are never what
/// the test measures. At 30 % busybox udhcpc gives up now and then after
/// three unanswered REQUESTs (see docs/faults.md).
const LOSS_PERCENT: u32 = 10;

/// Drops `percent` of the UDP frames that arrive at either end of the lab
/// link, at random, with an nf_tables netdev `ingress` hook on each end: a
/// frame is lost on the wire, and its sender sees no error (a drop on the
/// egress hook fails the sender's `sendto` with ENOBUFS, which udhcpc
/// gives up on). The hook on the client end runs
/// before frames reach the clients' packet sockets, so it drops every kind
/// of answer, the fast path's XDP_TX replies too. The one on the server end
/// runs after the XDP program: the requests it answers in the kernel are
/// lost only on their way back, everything it passes up (TFTP, the slow
/// path) both ways. iptables' `statistic` match would see neither the XDP
/// replies nor the clients' raw frames.
fn drop_share(served: &Served, percent: u32) {
    for (ns, iface) in [
        (served.lab.client_ns(), served.lab.client_if()),
        (served.lab.server_ns(), served.lab.server_if()),
    ] {
        let rules = format!(
            "table netdev pxloss {{\n\
             \x20 chain in {{ type filter hook ingress device \"{iface}\" priority 0; \
             ip protocol udp numgen random mod 100 < {percent} counter drop; }}\n\
             }}\n"
        );
        let file = served.dir.path(&format!("loss-{iface}.nft"));
        fs::write(&file, rules).expect("nft rules");
        served
            .lab
            .run_in(ns, &["nft", "-f", file.to_str().expect("utf-8 path")])
            .expect("nft in a lab namespace (install nftables: cargo xtask setup)");
    }
}

/// Frames the rules of [`drop_share`] dropped so far, at both ends.
fn dropped(served: &Served) -> u64 {
    [served.lab.client_ns(), served.lab.server_ns()]
        .into_iter()
        .map(|ns| {
            served
                .lab
                .run_in(ns, &["nft", "list", "table", "netdev", "pxloss"])
                .expect("nft list")
                .split("counter packets ")
                .skip(1)
                .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

#[test]
fn over_a_lossy_link_clients_still_get_leases_and_their_boot_file() {
    let boot = Scratch::new("faultloss");
    let image = pattern((32 << 10) + 7);
    fs::write(boot.path("undionly.kpxe"), &image).expect("boot file");
    let root = boot.0.to_str().expect("utf-8 path").to_string();
    let served = Served::start_with("pxfloss", INVENTORY, &["--boot-root", &root]);
    drop_share(&served, LOSS_PERCENT);

    // A known host through the fast path; udhcpc resends for up to 20 s.
    served.set_client_mac(NODE1);
    let acks = served.counter("tx_ack");
    let mut args = PXE.to_vec();
    args.extend(["-t", "20"]);
    assert_eq!(served.udhcpc(&args)["ip"], NODE1_IP);
    assert!(served.counter("tx_ack") > acks, "not answered by XDP");

    // An unknown one through the slow path and the pool.
    served.set_client_mac("52:54:00:aa:dd:01");
    let pool = served.udhcpc(&["-t", "20"]);
    let ip: Ipv4Addr = pool["ip"].parse().expect("pool address");
    assert!(
        (Ipv4Addr::new(10, 66, 200, 1)..=Ipv4Addr::new(10, 66, 200, 20)).contains(&ip),
        "{ip} is outside the pool"
    );

    // The boot file, block by block through the same loss.
    served.set_client_mac(NODE1);
    served.add_client_address(&format!("{NODE1_IP}/16"));
    let out = served.dir.path("got.kpxe");
    let retransmits = sample(&served, metrics::TFTP_RETRANSMITS);
    let result = tftp_get(&served, "undionly.kpxe", &out)
        .wait_with_output()
        .expect("tftp");
    let got = fs::read(&out).unwrap_or_default();
    assert!(
        got == image,
        "tftp over the lossy link: {} of {} bytes: {}\nagent log:\n{}",
        got.len(),
        image.len(),
        text(&result),
        served.log()
    );
    let lost = dropped(&served);
    let resent = sample(&served, metrics::TFTP_RETRANSMITS) - retransmits;
    println!(
        "lossy link ({LOSS_PERCENT} % each way): {lost} frames dropped, {resent} TFTP retransmits"
    );
    assert!(lost > 0, "the rules dropped nothing");
    assert!(
        resent > 0,
        "the agent counted no TFTP retransmits though {lost} frames were dropped"
    );
}

// ---------------------------------------------------------------------------
// Missing and hung artifacts

#[test]
fn a_missing_artifact_is_a_logged_404_and_a_hung_one_holds_up_only_its_own_client() {
    let artifacts = Scratch::new("faultart");
    let big: Vec<u8> = pattern(8 << 20);
    fs::write(artifacts.path("big.img"), &big).expect("artifact");
    fs::write(artifacts.path("undionly.kpxe"), pattern(4096)).expect("boot file");
    // An artifact whose source went: a link into a store that no longer
    // has it.
    std::os::unix::fs::symlink(artifacts.path("store/gone.img"), artifacts.path("gone.img"))
        .expect("dangling symlink");
    // A source that hangs, as a file on a stuck network mount does: a FIFO
    // blocks its reader's open() until a writer comes.
    let fifo = artifacts.path("stuck.img");
    let c_path = std::ffi::CString::new(fifo.to_str().expect("utf-8 path")).expect("path");
    // SAFETY: mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0, "mkfifo");
    let dir = artifacts.0.to_str().expect("utf-8 path").to_string();
    let served = Served::start_with(
        "pxfart",
        INVENTORY,
        &["--artifacts", &dir, "--boot-root", &dir],
    );
    served.set_client_mac(NODE1);
    served.add_client_address(&format!("{NODE1_IP}/16"));

    let stuck = fetch_stuck(&served);
    // The agent is waiting on the source now: a writer finds a reader.
    let deadline = Instant::now() + Duration::from_secs(10);
    let writer = loop {
        match fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
        {
            Ok(w) => break w,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                assert!(
                    Instant::now() < deadline,
                    "the agent never opened the hung artifact; log:\n{}",
                    served.log()
                );
                thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("open the FIFO for writing: {e}"),
        }
    };
    // Its open() returned when the writer came; hold it up again with a
    // second client, and this time leave it hanging meanwhile.
    drop(writer);
    let first = stuck.wait_with_output().expect("curl");
    assert_eq!(
        String::from_utf8_lossy(&first.stdout),
        "404",
        "a FIFO is not a file to serve: {}",
        text(&first)
    );
    let log = served.log();
    assert!(
        log.lines()
            .any(|l| l.contains("stuck.img") && l.contains("not served: not a regular file")),
        "no log line for the FIFO; log:\n{log}"
    );
    let mut hung = fetch_stuck(&served);
    thread::sleep(Duration::from_millis(500));

    // Meanwhile every other client is served in full.
    let out = served.dir.path("big.out");
    let result = curl(
        &served,
        &[
            "-o",
            out.to_str().expect("utf-8 path"),
            "-w",
            "%{http_code}",
            &format!("{SERVER}/artifacts/big.img"),
        ],
    );
    assert_eq!(status(&result), "200", "{}", text(&result));
    assert!(
        fs::read(&out).expect("downloaded") == big,
        "big.img differs"
    );
    let tftp_out = served.dir.path("boot.out");
    let result = tftp_get(&served, "undionly.kpxe", &tftp_out)
        .wait_with_output()
        .expect("tftp");
    assert_eq!(
        fs::read(&tftp_out).unwrap_or_default(),
        pattern(4096),
        "TFTP while an artifact hangs: {}",
        text(&result)
    );
    assert_eq!(served.udhcpc(&PXE)["ip"], NODE1_IP);

    // The missing source: a 404 and a log line that names it.
    let result = curl(
        &served,
        &[
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("{SERVER}/artifacts/gone.img"),
        ],
    );
    assert_eq!(status(&result), "404", "{}", text(&result));
    let log = served.log();
    assert!(
        log.lines()
            .any(|l| l.contains("gone.img") && l.contains("not served: no such file")),
        "no log line names the missing artifact; log:\n{log}"
    );

    assert!(
        hung.try_wait().expect("poll curl").is_none(),
        "the second request for the hung artifact ended: {:?}",
        hung.wait_with_output().map(|o| text(&o))
    );
    // Released, it gets its answer too.
    let writer = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .expect("the agent still waits on the hung artifact");
    drop(writer);
    let second = hung.wait_with_output().expect("curl");
    assert_eq!(
        String::from_utf8_lossy(&second.stdout),
        "404",
        "{}",
        text(&second)
    );
}

// ---------------------------------------------------------------------------
// SIGKILL and a pinned restart under load

/// Runs `busybox udhcpc` for NODE1 with PXE's options in `ns` on `iface`
/// until `stop`; how many runs got a lease, and the output of those that
/// did not.
fn udhcpc_loop(ns: String, iface: String, stop: Arc<AtomicBool>) -> (u32, Vec<String>) {
    let (mut ok, mut failed) = (0, Vec::new());
    while !stop.load(Ordering::Relaxed) {
        let out = Command::new("ip")
            .args(["netns", "exec", &ns, "busybox", "udhcpc", "-f", "-q", "-n"])
            .args(["-t", "3", "-T", "1", "-i", &iface, "-s", "/bin/true"])
            .args(PXE)
            .output()
            .expect("run udhcpc");
        if out.status.success() {
            ok += 1;
        } else {
            failed.push(text(&out));
        }
    }
    (ok, failed)
}

fn load_options(served: &Served, macs: Vec<Mac>, rate: u32, secs: u64) -> Options {
    Options {
        iface: served.lab.client_if().to_string(),
        send_iface: None,
        macs,
        rate: Some(rate),
        duration: Duration::from_secs(secs),
        drain: Duration::from_secs(1),
        timeout: Duration::from_millis(500),
        window: 4_096,
        user_class: None,
        relay: None,
    }
}

fn spawn_load(served: &Served, opts: Options) -> thread::JoinHandle<Report> {
    let ns = served.lab.client_ns().to_string();
    thread::spawn(move || {
        in_netns(&ns, move || loadgen::run(&opts))
            .expect("enter client namespace")
            .expect("load generator")
    })
}

fn assert_all_answered(report: &Report, what: &str, served: &Served) {
    let sent = report.discovers + report.requests;
    let answered = report.offers + report.acks;
    println!(
        "{what}: sent {sent}, answered {answered}; {}",
        report.line()
    );
    assert!(
        report.discovers > 1_000,
        "{what}: the load was too thin to say anything: {}",
        report.line()
    );
    assert_eq!(
        sent - answered,
        0,
        "{what}: requests went unanswered; agent log:\n{}",
        served.log()
    );
}

#[test]
fn kill_9_and_restart_under_load_leave_real_clients_and_the_load_answered() {
    let bpffs = Bpffs::mount("faultkill");
    let pin = bpffs.pin_arg();
    let boot = Scratch::new("faultkill");
    fs::write(boot.path("undionly.kpxe"), pattern(64 << 10)).expect("boot file");
    let root = boot.0.to_str().expect("utf-8 path").to_string();
    let (inventory, hosts) = inventory_with(200);
    let args = ["--pin-dir", pin.as_str(), "--boot-root", root.as_str()];
    let mut served = Served::start_with("pxfkill", &inventory, &args);
    served.set_client_mac(NODE1);
    served.add_client_address(&format!("{NODE1_IP}/16"));
    let program = attached(&served).expect("a program attached");

    let load = spawn_load(&served, load_options(&served, hosts, 2_000, 6));
    let stop = Arc::new(AtomicBool::new(false));
    let client = {
        let (ns, iface) = (
            served.lab.client_ns().to_string(),
            served.lab.client_if().to_string(),
        );
        let stop = stop.clone();
        thread::spawn(move || udhcpc_loop(ns, iface, stop))
    };
    thread::sleep(Duration::from_secs(2));
    served.signal_agent(libc::SIGKILL);
    // A boot file asked for while no agent runs: the client's resent
    // request finds the next one.
    let out = served.dir.path("gap.kpxe");
    let tftp = tftp_get(&served, "undionly.kpxe", &out);
    thread::sleep(Duration::from_millis(500));
    served.restart(&args);
    let report = load.join().expect("load thread");
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = client.join().expect("client thread");
    let result = tftp.wait_with_output().expect("tftp");

    assert_all_answered(&report, "kill -9 under load", &served);
    println!("udhcpc meanwhile: {ok} leases, {} failures", failed.len());
    assert!(
        failed.is_empty(),
        "udhcpc failed across the restart: {failed:#?}"
    );
    assert!(ok >= 3, "udhcpc ran only {ok} times");
    assert_eq!(attached(&served), Some(program), "the program was replaced");
    assert_eq!(
        fs::read(&out).unwrap_or_default(),
        pattern(64 << 10),
        "TFTP across the restart: {}",
        text(&result)
    );
}

// ---------------------------------------------------------------------------
// A full state filesystem

/// Fills the filesystem under `dir` with one file; its path.
fn fill(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("filler");
    let mut file = fs::File::create(&path).expect("filler");
    let chunk = vec![0u8; 64 << 10];
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("fill {}: {e}", dir.display()),
        }
    }
    // The last bytes, smaller than a chunk.
    while file.write(&[0u8; 512]).is_ok_and(|n| n > 0) {}
    path
}

fn lease_map(served: &Served) -> BTreeMap<String, (Ipv4Addr, String)> {
    leases(served)
        .into_iter()
        .map(|(mac, ip, state)| (mac, (ip, state)))
        .collect()
}

#[test]
fn a_full_state_disk_refuses_new_leases_keeps_known_hosts_and_loses_nothing() {
    let state = Mount::new("faultstate", "tmpfs", Some("size=4m,mode=0700"));
    let state_dir = state.path().to_str().expect("utf-8 path").to_string();
    let args = ["--state-dir", state_dir.as_str()];
    let mut served = Served::start_with("pxfull", POOL_INVENTORY, &args);
    let mut dora = Dora::open(&served);
    let first = macs(0x30, 20);
    let before = lease_all(&mut dora, &first, 20);
    assert_eq!(before.acked.len(), first.len(), "{before:?}");

    let filler = fill(state.path());
    let errors = metrics::SLOW_ERRORS.to_string() + "{kind=\"lease_store\"}";
    let failed_before = sample(&served, &errors);
    let refused = lease_all(&mut dora, &macs(0x31, 20), 20);
    println!(
        "disk full: {} offered, {} acknowledged, {} refused",
        refused.offered.len(),
        refused.acked.len(),
        refused.naked.len()
    );
    assert!(
        refused.acked.is_empty(),
        "new leases were ACKed with the state disk full: {refused:?}"
    );
    assert!(
        sample(&served, &errors) > failed_before,
        "no lease store failure counted"
    );
    let log = served.log();
    assert!(
        log.contains("lease store failed") && log.contains("No space left on device"),
        "no clear log line for the full disk; log:\n{log}"
    );
    // Known hosts are answered on both paths: PXE by XDP, iPXE by the
    // slow path, neither of which writes the state store.
    served.set_client_mac(NODE1);
    assert_eq!(served.udhcpc(&["-V", "PXEClient"])["ip"], NODE1_IP);
    assert_eq!(
        served.udhcpc(&[
            "-V",
            "PXEClient",
            "-x",
            "0x5d:0000",
            "-x",
            "0x4d:0469505845"
        ])["ip"],
        NODE1_IP
    );

    // Space returns: new leases are given again.
    fs::remove_file(&filler).expect("remove filler");
    let deadline = Instant::now() + Duration::from_secs(15);
    let later = macs(0x32, 20);
    let recovered = loop {
        let round = lease_all(&mut dora, &later, 20);
        if round.acked.len() == later.len() || Instant::now() > deadline {
            break round;
        }
        thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(
        recovered.acked.len(),
        later.len(),
        "no recovery once space returned: {recovered:?}\nagent log:\n{}",
        served.log()
    );

    // Nothing committed was lost, across a restart too.
    served.signal_agent(libc::SIGKILL);
    served.restart(&args);
    let listed = lease_map(&served);
    let mut taken = BTreeSet::new();
    for (mac, ip) in before.acked.iter().chain(&recovered.acked) {
        assert_eq!(
            listed.get(&mac_str(mac)),
            Some(&(*ip, "bound".to_string())),
            "{} was ACKed {ip}, the restarted agent lists {:?}",
            mac_str(mac),
            listed.get(&mac_str(mac))
        );
        assert!(taken.insert(*ip), "{ip} went twice");
    }
}

// ---------------------------------------------------------------------------
// An invalid inventory under load

#[test]
fn an_invalid_inventory_under_load_is_refused_and_the_last_good_one_answers_every_request() {
    let (inventory, hosts) = inventory_with(200);
    let served = Served::start("pxfinv", &inventory);
    let rejected = format!("{}{{result=\"rejected\"}}", metrics::INVENTORY_RELOADS);
    let applied = format!("{}{{result=\"ok\"}}", metrics::INVENTORY_RELOADS);
    let (rejected_before, applied_before) = (sample(&served, &rejected), sample(&served, &applied));

    // iPXE's requests, which the slow path answers from the inventory in
    // force, and PXE's, which XDP answers from the maps.
    let mut slow = load_options(&served, hosts.clone(), 500, 4);
    slow.user_class = Some(b"iPXE".to_vec());
    let slow = spawn_load(&served, slow);
    thread::sleep(Duration::from_secs(1));
    // One host's address outside every subnet.
    let bad = inventory.replace("ip: 10.66.3.7,", "ip: 10.99.3.7,");
    assert!(bad != inventory, "the invalid inventory is the same");
    served.replace_inventory(&bad);
    let slow = slow.join().expect("load thread");
    assert_all_answered(
        &slow,
        "iPXE requests while the invalid inventory is refused",
        &served,
    );
    let fast = spawn_load(&served, load_options(&served, hosts, 2_000, 2))
        .join()
        .expect("load thread");
    assert_all_answered(&fast, "PXE requests after the refusal", &served);
    served.set_client_mac(NODE1);
    assert_eq!(served.udhcpc(&PXE)["ip"], NODE1_IP);

    assert_eq!(sample(&served, &rejected), rejected_before + 1);
    assert_eq!(sample(&served, &applied), applied_before);
    let log = served.log();
    let path = served.inventory.display().to_string();
    let line = log
        .lines()
        .find(|l| l.contains("inventory change refused"))
        .unwrap_or_else(|| panic!("no refusal logged; log:\n{log}"));
    let refusal: String = log[log.find(line).expect("line")..]
        .lines()
        .take(3)
        .collect::<Vec<_>>()
        .join("\n");
    for part in [path.as_str(), "02:5e:00:00:00:07", "field ip"] {
        assert!(
            refusal.contains(part),
            "the refusal does not name {part}: {refusal}"
        );
    }

    // The watcher goes on: the next valid file is put in force.
    served.replace_inventory(&inventory.replace("ip: 10.66.1.10", "ip: 10.66.1.77"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while sample(&served, &applied) == applied_before {
        assert!(
            Instant::now() < deadline,
            "the valid inventory was not applied"
        );
        thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(served.udhcpc(&PXE)["ip"], "10.66.1.77");
}

/// A client fetching the FIFO artifact, printing the HTTP status it gets.
fn fetch_stuck(served: &Served) -> std::process::Child {
    served
        .client_cmd("curl")
        .args([
            "-s",
            "--max-time",
            "60",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg(format!("{SERVER}/artifacts/stuck.img"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn curl")
}

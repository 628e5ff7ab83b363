//! A running agent while it reloads a large inventory, and its health as
//! the kernel sees it: `/metrics`, TFTP and HTTP keep answering while a
//! 50,000-host inventory is loaded, compiled and written to the maps, and
//! `/healthz` stops answering 200 once our XDP program is detached.

use std::{
    fmt::Write as _,
    fs,
    process::Command,
    time::{Duration, Instant},
};

use crate::{
    agent::{Scratch, Served},
    slow_path::INVENTORY,
};

/// Hosts in the inventory the agent reloads.
const BIG: u32 = 50_000;
/// What a request may take while the reload runs. Nothing on the agent's
/// runtime blocks for long, so this is a client-side bound with room for a
/// loaded CI machine; requests queued behind a reload's map writes took
/// seconds before.
const ANSWER_WITHIN: Duration = Duration::from_millis(750);

/// The slow-path inventory plus `BIG` hosts with every boot class.
fn big_inventory() -> String {
    let mut text = INVENTORY.to_string();
    for n in 0..BIG {
        let [_, a, b, c] = (n + 0x0100).to_be_bytes();
        // Clear of node-1 (10.66.1.x) and of the pool (10.66.200.x).
        let third = 2 + n / 250;
        let third = if third >= 200 { third + 1 } else { third };
        let _ = writeln!(
            text,
            "  - {{mac: \"02:10:{a:02x}:{b:02x}:{c:02x}:01\", ip: 10.66.{third}.{}, profile: worker}}",
            1 + (n % 250)
        );
    }
    text
}

fn timed(mut cmd: Command) -> (bool, Duration) {
    let start = Instant::now();
    let ok = cmd.output().is_ok_and(|o| o.status.success());
    (ok, start.elapsed())
}

#[test]
fn metrics_tftp_and_http_answer_while_a_large_inventory_reloads() {
    let boot = Scratch::new("reloadroot");
    fs::write(boot.path("undionly.kpxe"), vec![7u8; 4096]).expect("boot file");
    let root = boot.0.to_str().expect("utf-8 path").to_string();
    let served = Served::start_with("pxreload", INVENTORY, &["--boot-root", &root]);
    served.add_client_address("10.66.1.10/16");
    let big = big_inventory();
    let reloads = |s: &Served| {
        s.stats()
            .get("pxe_inventory_reloads_total{result=\"ok\"}")
            .copied()
            .unwrap_or(0)
    };
    let before = reloads(&served);
    served.replace_inventory(&big);
    let started = Instant::now();
    let (mut metrics, mut tftp, mut http) = (Vec::new(), Vec::new(), Vec::new());
    let out = served.dir.path("got.kpxe");
    while reloads(&served) == before {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the reload did not finish; log:\n{}",
            served.log()
        );
        let mut m = served.lab.cmd_in(served.lab.server_ns(), "curl");
        m.args(["-sf", "--max-time", "5", "http://127.0.0.1:9464/metrics"]);
        metrics.push(timed(m));
        let mut t = served.client_cmd("tftp");
        t.args(["-m", "binary", "10.66.0.1", "-c", "get", "undionly.kpxe"])
            .arg(&out);
        tftp.push(timed(t));
        let mut h = served.client_cmd("curl");
        h.args([
            "-sf",
            "--max-time",
            "5",
            "-o",
            "/dev/null",
            "http://10.66.0.1:8080/undionly.kpxe",
        ]);
        http.push(timed(h));
    }
    let took = started.elapsed();
    assert_eq!(
        served.stats().get("pxe_inventory_hosts").copied(),
        Some(u64::from(BIG) + 1),
        "the big inventory is not in force"
    );
    println!(
        "reload of {BIG} hosts took {:.1} s; {} rounds of /metrics, TFTP and HTTP meanwhile",
        took.as_secs_f64(),
        metrics.len()
    );
    assert!(
        metrics.len() >= 2,
        "the reload finished before requests could be made during it ({took:?})"
    );
    for (what, results) in [("/metrics", &metrics), ("TFTP", &tftp), ("HTTP", &http)] {
        let worst = results.iter().map(|(_, d)| *d).max().unwrap_or_default();
        assert!(
            results.iter().all(|(ok, _)| *ok),
            "a {what} request failed during the reload"
        );
        assert!(
            worst < ANSWER_WITHIN,
            "a {what} request took {worst:?} during the reload"
        );
    }
}

/// The link id of the XDP link whose program is attached to `iface` in the
/// server namespace.
pub(crate) fn xdp_link_of(served: &Served) -> String {
    let link = served
        .lab
        .run_in(
            served.lab.server_ns(),
            &["ip", "-d", "link", "show", "dev", served.lab.server_if()],
        )
        .expect("ip link");
    let prog = link
        .split("prog/xdp id ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no XDP program on the server end: {link}"))
        .to_string();
    let links = served
        .lab
        .run_in(served.lab.server_ns(), &["bpftool", "link", "show"])
        .expect("bpftool link show");
    links
        .lines()
        .find(|l| l.contains(" xdp ") && l.contains(&format!("prog {prog}")))
        .and_then(|l| l.split(':').next())
        .unwrap_or_else(|| panic!("no link for program {prog}: {links}"))
        .trim()
        .to_string()
}

pub(crate) fn healthz(served: &Served) -> (String, String) {
    let out = served
        .lab
        .run_in(
            served.lab.server_ns(),
            &[
                "curl",
                "-s",
                "-w",
                "\n%{http_code}",
                "http://127.0.0.1:9464/healthz",
            ],
        )
        .unwrap_or_default();
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", ""));
    (code.to_string(), body.to_string())
}

#[test]
fn healthz_fails_once_the_xdp_program_is_detached_behind_the_agents_back() {
    let served = Served::start("pxhealth", INVENTORY);
    assert_eq!(healthz(&served).0, "200");
    let link = xdp_link_of(&served);
    served
        .lab
        .run_in(
            served.lab.server_ns(),
            &["bpftool", "link", "detach", "id", &link],
        )
        .expect("detach the XDP link");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (code, body) = healthz(&served);
        if code == "503" {
            assert!(
                body.contains("no XDP program attached"),
                "healthz says: {body}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "healthz still {code} 5 s after the program was detached: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(served.stats().get("pxe_ready").copied(), Some(0));
}

//! The storm simulator against a real agent on the routed storm topology:
//! 200 machines of every class behind a relay at 10.66.0.1, all booted
//! through both DHCP rounds, the boot file, the script, its artifacts and
//! the phone-home, the first round answered by the fast path and the iPXE
//! round passed up to the slow path.
//!
//! ```text
//! server ns                         client ns
//! pxsrv0 10.64.0.1/16 ───────────── 10.64.0.2/16, lo: 10.66.0.1/32 + local 10.66.0.0/15
//! agent + XDP, route 10.66.0.0/15   storm-client (relay socket 10.66.0.1:67)
//!   via 10.64.0.2
//! ```

use std::{fmt::Write as _, fs};

use crate::agent::{Scratch, Served};

const MACHINES: usize = 200;
const CLASSES: [&str; 4] = ["bios", "uefi", "uefi_http", "arm64"];

/// Machine `i`'s MAC and address as the storm topology fixes them.
pub(crate) fn machine(i: usize) -> (String, String) {
    let b = (i as u32).to_be_bytes();
    let ip = u32::from(std::net::Ipv4Addr::new(10, 66, 0, 0)) + 2 + i as u32;
    (
        format!("02:57:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3]),
        std::net::Ipv4Addr::from(ip).to_string(),
    )
}

/// The storm topology's subnet and the profile its machines boot: an
/// inventory without its hosts.
pub(crate) const INVENTORY_HEAD: &str = r#"subnets:
  - cidr: 10.66.0.0/15
    router: 10.66.0.1
    lease_time: 3600
profiles:
  - name: storm
    boot:
      bios: undionly.kpxe
      uefi: ipxe.efi
      uefi_arm64: ipxe-arm64.efi
      http: "http://{server}:8080/ipxe.efi"
    kernel: "http://{server}:8080/artifacts/vmlinuz"
    initrd: ["http://{server}:8080/artifacts/initrd.img"]
    cmdline: console=ttyS0
hosts:
"#;

fn inventory() -> String {
    let mut out = String::from(INVENTORY_HEAD);
    for i in 0..MACHINES {
        let (mac, ip) = machine(i);
        let _ = writeln!(out, "  - {{mac: \"{mac}\", ip: {ip}, profile: storm}}");
    }
    out
}

pub(crate) fn storm_client_bin() -> std::path::PathBuf {
    let bin = xtask::target_dir().join("debug/storm-client");
    assert!(
        bin.exists(),
        "{} missing: build it with `cargo build -p pxe-tests`",
        bin.display()
    );
    bin
}

/// A file of `len` bytes that is not all one byte.
pub(crate) fn synthetic(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

/// The boot files and artifacts every machine class fetches, in a scratch
/// directory: the directory and the agent's `--boot-root` and
/// `--artifacts`.
pub(crate) fn boot_files() -> (Scratch, String, String) {
    let files = Scratch::new("storm-files");
    let boot = files.path("boot");
    let artifacts = files.path("artifacts");
    for dir in [&boot, &artifacts] {
        fs::create_dir_all(dir).expect("dir");
    }
    // Sizes that end mid-block and span several windows.
    fs::write(boot.join("undionly.kpxe"), synthetic(70_001)).expect("bios file");
    fs::write(boot.join("ipxe.efi"), synthetic(100_000)).expect("uefi file");
    fs::write(boot.join("ipxe-arm64.efi"), synthetic(1456 * 20)).expect("arm64 file");
    fs::write(artifacts.join("vmlinuz"), synthetic(300_000)).expect("kernel");
    fs::write(artifacts.join("initrd.img"), synthetic(50_000)).expect("initrd");
    let (boot_dir, artifacts_dir) = (
        boot.to_str().expect("utf-8").to_owned(),
        artifacts.to_str().expect("utf-8").to_owned(),
    );
    (files, boot_dir, artifacts_dir)
}

/// The routed storm topology of the module header: the machines' relay
/// address on the client side, the route to them on the server side.
pub(crate) fn routed_lab(lab: &mut xtask::lab::Lab) {
    let client = lab.client_ns().to_owned();
    let client_if = lab.client_if().to_owned();
    for args in [
        &["ip", "addr", "add", "10.64.0.2/16", "dev", &client_if][..],
        &["ip", "link", "set", "lo", "up"],
        &["ip", "addr", "add", "10.66.0.1/32", "dev", "lo"],
        &["ip", "route", "add", "local", "10.66.0.0/15", "dev", "lo"],
        &["sysctl", "-qw", "net.ipv4.ip_nonlocal_bind=1"],
    ] {
        lab.run_in(&client, args).expect("client namespace setup");
    }
    let server = lab.server_ns().to_owned();
    lab.run_in(
        &server,
        &["ip", "route", "add", "10.66.0.0/15", "via", "10.64.0.2"],
    )
    .expect("route to the machines");
}

#[test]
fn two_hundred_machines_of_every_class_boot_to_phone_home() {
    let (_files, boot_dir, artifacts_dir) = boot_files();
    let served = Served::start_on(
        "pxstc",
        "10.64.0.1/16",
        &inventory(),
        &["--boot-root", &boot_dir, "--artifacts", &artifacts_dir],
        routed_lab,
    );
    let mut tsv = String::new();
    for i in 0..MACHINES {
        let windowsize = if i % 3 == 0 { 4 } else { 0 };
        let _ = writeln!(tsv, "{}\t{}\t{windowsize}", machine(i).0, CLASSES[i % 4]);
    }
    let machines = served.dir.path("machines.tsv");
    fs::write(&machines, tsv).expect("machines file");
    let out_dir = served.dir.path("out");
    let (offers, acks, ipxe_passed) = (
        served.counter("tx_offer"),
        served.counter("tx_ack"),
        served.counter("pass_ipxe"),
    );

    let out = served
        .lab
        .cmd_in(served.lab.client_ns(), storm_client_bin())
        .arg("--machines")
        .arg(&machines)
        .args([
            "--server",
            "10.64.0.1",
            "--relay",
            "10.66.0.1",
            "--spread",
            "1",
            "--limit",
            "120",
        ])
        .arg("--out")
        .arg(&out_dir)
        .output()
        .expect("run storm-client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "storm-client failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let csv = fs::read_to_string(out_dir.join("machines.csv")).expect("machines.csv");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), MACHINES, "{stdout}");
    let col = |name: &str| header.iter().position(|h| *h == name).expect("column");
    let stages = [
        "start_ms",
        "offer_ms",
        "ack_ms",
        "bootfile_ms",
        "ipxe_ack_ms",
        "script_ms",
        "kernel_ms",
        "initrd_ms",
        "phone_home_ms",
    ];
    for row in &rows {
        let failed = &row[col("failed_stage")];
        assert!(
            failed.is_empty(),
            "{} failed at {failed}: {}\nagent log:\n{}",
            row[0],
            row[col("error")],
            served.log()
        );
        let times: Vec<f64> = stages
            .iter()
            .map(|s| {
                row[col(s)]
                    .parse()
                    .unwrap_or_else(|_| panic!("{} has no {s}", row[0]))
            })
            .collect();
        assert!(
            times.windows(2).all(|w| w[0] <= w[1]),
            "{} out of order: {times:?}",
            row[0]
        );
        assert!(
            times[0] <= 10_000.0,
            "{} started late: {}",
            row[0],
            times[0]
        );
    }
    let summary: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(out_dir.join("summary.json")).expect("summary"))
            .expect("summary is JSON");
    assert_eq!(summary["completed"], MACHINES, "{summary}");
    let timeline = fs::read_to_string(out_dir.join("timeline.csv")).expect("timeline.csv");
    let completed: u64 = timeline
        .lines()
        .skip(1)
        .filter_map(|l| l.split(',').nth(5)?.parse::<u64>().ok())
        .sum();
    assert_eq!(completed, MACHINES as u64, "completions in the timeline");

    // The firmware round is the fast path's, the iPXE round the slow path's.
    let fast_offers = served.counter("tx_offer") - offers;
    let fast_acks = served.counter("tx_ack") - acks;
    assert!(
        fast_offers >= MACHINES as u64 && fast_acks >= MACHINES as u64,
        "fast path answered {fast_offers} DISCOVERs and {fast_acks} REQUESTs"
    );
    let passed = served.counter("pass_ipxe") - ipxe_passed;
    assert!(
        passed >= 2 * MACHINES as u64,
        "only {passed} iPXE requests passed to the slow path"
    );
    let slow_acks = served.stats()["pxe_slow_replies_total{type=\"ack\"}"];
    assert!(
        slow_acks >= MACHINES as u64,
        "slow path sent {slow_acks} ACKs"
    );
}

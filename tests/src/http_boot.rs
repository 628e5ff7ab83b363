//! End to end over the boot HTTP server with curl: per-host iPXE scripts
//! (only to the host's own address), artifacts with ranges and validators,
//! and the phone-home that completes a host's boot progress.

use std::{fs, process::Output};

use crate::{
    agent::{Scratch, Served, agent_bin},
    slow_path::INVENTORY,
};

const SCRIPT_URL: &str = "http://10.66.0.1:8080/boot/52:54:00:12:34:56.ipxe";

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
    served
        .lab
        .run_in(
            served.lab.client_ns(),
            &[
                "ip",
                "addr",
                "add",
                client_ip,
                "dev",
                served.lab.client_if(),
            ],
        )
        .expect("client address");
    (served, artifacts, kernel)
}

fn curl(served: &Served, args: &[&str]) -> Output {
    served
        .client_cmd("curl")
        .args(["-s", "--max-time", "10"])
        .args(args)
        .output()
        .expect("run curl")
}

fn status(out: &Output) -> String {
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
    curl(&served, &[SCRIPT_URL]);
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
            "http://10.66.0.1:8080/api/v1/hosts/52:54:00:12:34:56/booted",
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
    served
        .lab
        .run_in(
            served.lab.client_ns(),
            &[
                "ip",
                "addr",
                "add",
                "10.66.1.10/16",
                "dev",
                served.lab.client_if(),
            ],
        )
        .expect("client address");
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

//! The phone-home token end to end, with curl from the client namespace at
//! the host's own address: the script iPXE fetches carries the boot's token
//! on its kernel command line, a phone-home with it makes the host booted,
//! and one without it, with a wrong one or with the token of an earlier
//! boot is refused with 403 and counted; `ipxe.phone_home_token: off` takes
//! the address alone, as before tokens.

use std::fs;

use crate::{
    agent::{Privileges, Scratch, Served},
    slow_path::INVENTORY,
};

pub(crate) const MAC: &str = "52:54:00:12:34:56";
const SCRIPT_URL: &str = "http://10.66.0.1:8080/boot/52:54:00:12:34:56.ipxe";
pub(crate) const PHONE_HOME_URL: &str =
    "http://10.66.0.1:8080/api/v1/hosts/52:54:00:12:34:56/booted";
pub(crate) const MISSING: &str = "pxe_http_phone_home_rejected_total{reason=\"missing\"}";
pub(crate) const MISMATCH: &str = "pxe_http_phone_home_rejected_total{reason=\"mismatch\"}";

fn inventory(ipxe: &str) -> String {
    INVENTORY.replace(
        "  - name: worker\n    boot:\n",
        "  - name: worker\n    kernel: \"http://{server}:8080/artifacts/vmlinuz\"\n    initrd: [\"http://{server}:8080/artifacts/initrd.img\"]\n    cmdline: console=ttyS0\n    boot:\n",
    ) + ipxe
}

/// The agent serving the host's profile, the client at the host's address.
fn served(name: &str, ipxe: &str) -> (Served, Scratch) {
    served_as(name, ipxe, Privileges::Root)
}

/// [`served`], the agent run with `privileges`.
pub(crate) fn served_as(name: &str, ipxe: &str, privileges: Privileges) -> (Served, Scratch) {
    let artifacts = Scratch::new("artifacts");
    fs::write(artifacts.path("vmlinuz"), b"kernel").expect("kernel");
    fs::write(artifacts.path("initrd.img"), b"initrd").expect("initrd");
    let dir = artifacts.0.to_str().expect("utf-8 path").to_string();
    let served = Served::start_as(name, &inventory(ipxe), &["--artifacts", &dir], privileges);
    served.set_client_mac(MAC);
    served.add_client_address("10.66.1.10/16");
    (served, artifacts)
}

/// Fetches the host's script as iPXE does and returns the token on its
/// kernel line.
pub(crate) fn script_token(served: &Served) -> String {
    let out = served
        .client_cmd("curl")
        .args(["-sf", "--max-time", "10", SCRIPT_URL])
        .output()
        .expect("run curl");
    let script = String::from_utf8_lossy(&out.stdout);
    let kernel = script
        .lines()
        .find(|l| l.starts_with("kernel "))
        .unwrap_or_else(|| panic!("no kernel line in the script:\n{script}"));
    kernel
        .split_whitespace()
        .find_map(|a| a.strip_prefix("pxe_agent.token="))
        .unwrap_or_else(|| panic!("no pxe_agent.token= on the kernel line: {kernel}"))
        .to_string()
}

/// POSTs the phone-home with `token` (none: no query) and returns the
/// HTTP status.
fn phone_home(served: &Served, token: Option<&str>) -> String {
    let url = match token {
        Some(t) => format!("{PHONE_HOME_URL}?token={t}"),
        None => PHONE_HOME_URL.to_string(),
    };
    let out = served
        .client_cmd("curl")
        .args(["-s", "--max-time", "10", "-X", "POST", "-d", "ramdisk up"])
        .args(["-o", "/dev/null", "-w", "%{http_code}", &url])
        .output()
        .expect("run curl");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The host's stage in `pxe-agent hosts` (MAC, IP, HOSTNAME, STAGE, ...).
pub(crate) fn stage(served: &Served) -> String {
    let table = served.cli(&["hosts"]);
    let row = table
        .lines()
        .find(|l| l.starts_with(MAC))
        .unwrap_or_else(|| panic!("{MAC} not listed:\n{table}"));
    row.split_whitespace()
        .nth(3)
        .unwrap_or_default()
        .to_string()
}

#[test]
fn spoofed_phone_home_from_the_hosts_own_address_without_the_token_is_refused_and_counted() {
    let (served, _artifacts) = served("pxhome", "");
    let token = script_token(&served);
    assert_eq!(phone_home(&served, None), "403", "no token");
    let stats = served.stats();
    assert_eq!((stats[MISSING], stats[MISMATCH]), (1, 0), "{stats:?}");
    assert_eq!(stage(&served), "script", "a refused phone-home is no boot");
    // A wrong token: the right shape, another tag.
    let (epoch, tag) = token.split_once('-').expect("epoch-tag");
    let flipped: String = tag
        .chars()
        .rev()
        .map(|c| if c == '0' { '1' } else { '0' })
        .collect();
    assert_eq!(
        phone_home(&served, Some(&format!("{epoch}-{flipped}"))),
        "403"
    );
    assert_eq!(phone_home(&served, Some("nonsense")), "403");
    let stats = served.stats();
    assert_eq!((stats[MISSING], stats[MISMATCH]), (1, 2), "{stats:?}");
    // The host's own token makes it booted.
    assert_eq!(phone_home(&served, Some(&token)), "204");
    assert_eq!(stage(&served), "booted");
    // The refusals were logged, never with the token.
    let log = served.log();
    assert!(log.contains("phone-home refused"), "{log}");
    assert!(!log.contains(tag), "the token is in the log:\n{log}");
}

#[test]
fn the_token_of_an_earlier_boot_is_refused_after_the_next_script() {
    let (served, _artifacts) = served("pxhome", "");
    let first = script_token(&served);
    assert_eq!(phone_home(&served, Some(&first)), "204");
    // The host boots again: a new script, a new token.
    let second = script_token(&served);
    assert_ne!(first, second);
    assert_eq!(phone_home(&served, Some(&first)), "403", "previous boot");
    assert_eq!(served.stats()[MISMATCH], 1);
    assert_eq!(phone_home(&served, Some(&second)), "204");
    // Heartbeats repeat the current token.
    assert_eq!(phone_home(&served, Some(&second)), "204");
}

#[test]
fn a_restarted_agent_takes_the_tokens_it_issued() {
    let (mut served, _artifacts) = served("pxhome", "");
    let token = script_token(&served);
    served.signal_agent(libc::SIGTERM);
    served.restart(&[]);
    assert_eq!(phone_home(&served, Some(&token)), "204");
    assert_eq!(phone_home(&served, None), "403");
}

#[test]
fn with_the_token_off_the_address_is_enough() {
    let (served, _artifacts) = served("pxhome", "ipxe: {phone_home_token: off}\n");
    assert_eq!(phone_home(&served, None), "204");
    assert_eq!(stage(&served), "booted");
    assert_eq!(served.stats()[MISSING], 0);
}

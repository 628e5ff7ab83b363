//! The Debian package (`cargo xtask deb`) installed on this machine: its
//! files land where the unit and defaults say, `systemd-analyze verify`
//! passes the unit, and the installed binary, run as the unit runs it (its
//! user, its five ambient capabilities and nothing else, `no_new_privs`,
//! its arguments from `/etc/default/pxe-agent` with the lab's interface)
//! leases a reserved address to a real DHCP client. The package is purged
//! afterwards, whatever happens.

use std::{
    collections::BTreeMap,
    fs,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use xtask::{ChildGuard, Lab};

use crate::agent::{Scratch, agent_bin, capability_bit};

const UNIT: &str = "/usr/lib/systemd/system/pxe-agent.service";

/// Purges the package when dropped.
struct Installed;

impl Installed {
    fn install(deb: &Path) -> Installed {
        let out = Command::new("dpkg")
            .arg("-i")
            .arg(deb)
            .output()
            .expect("run dpkg");
        assert!(
            out.status.success(),
            "dpkg -i failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Installed
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg")
            .args(["--purge", "pxe-agent"])
            .stdout(Stdio::null())
            .status();
    }
}

/// `Key=value` lines of the unit's `[Service]` section.
fn service(unit: &str) -> BTreeMap<String, String> {
    unit.lines()
        .skip_while(|l| l.trim() != "[Service]")
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

fn status_field(pid: u32, name: &str) -> String {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("read the status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
        .trim()
        .to_owned()
}

#[test]
fn the_debian_package_installs_a_unit_whose_agent_leases_an_address() {
    let scratch = Scratch::new("deb");
    let deb = xtask::deb::build(&agent_bin(), &scratch.0).expect("build the package");
    let _installed = Installed::install(&deb);
    for path in [
        "/usr/bin/pxe-agent",
        UNIT,
        "/etc/default/pxe-agent",
        "/etc/pxe-agent/inventory.yaml",
        "/usr/lib/pxe-agent/phone-home/pxe-phone-home",
        "/usr/lib/ipxe/undionly.kpxe",
    ] {
        assert!(Path::new(path).exists(), "{path} is not installed");
    }
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(UNIT)
        .output()
        .expect("run systemd-analyze");
    assert!(
        verify.status.success(),
        "systemd-analyze verify {UNIT}:\n{}",
        String::from_utf8_lossy(&verify.stderr)
    );

    // The unit as systemd would run it.
    let unit = service(&fs::read_to_string(UNIT).expect("read the unit"));
    let user = &unit["User"];
    let caps: Vec<String> = unit["AmbientCapabilities"]
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_owned())
        .collect();
    assert_eq!(
        unit["CapabilityBoundingSet"], unit["AmbientCapabilities"],
        "the unit bounds what it grants"
    );
    assert_eq!(unit["NoNewPrivileges"], "yes");
    assert_eq!(
        unit["ExecStart"], "/usr/bin/pxe-agent run $PXE_AGENT_ARGS",
        "the test reads the arguments from the defaults file"
    );
    let defaults = fs::read_to_string(&unit["EnvironmentFile"]).expect("read the defaults");
    let args = defaults
        .lines()
        .find_map(|l| l.strip_prefix("PXE_AGENT_ARGS="))
        .expect("PXE_AGENT_ARGS")
        .trim_matches('"')
        .to_owned();
    let state = fs::metadata("/var/lib/pxe-agent").expect("the state directory");
    let uid: u32 = String::from_utf8(
        Command::new("id")
            .args(["-u", user])
            .output()
            .expect("id")
            .stdout,
    )
    .expect("uid")
    .trim()
    .parse()
    .expect("a uid");
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&state),
        uid,
        "the state directory is the agent user's"
    );

    let lab = Lab::new("pxdeb").expect("lab");
    let args: Vec<String> = args
        .split_whitespace()
        .map(|a| {
            if a == "eth1" {
                lab.server_if().to_owned()
            } else {
                a.to_owned()
            }
        })
        .collect();
    assert!(args.iter().any(|a| a == lab.server_if()), "{args:?}");
    let list = caps
        .iter()
        .map(|c| format!("+{}", c.to_lowercase()))
        .collect::<Vec<_>>()
        .join(",");
    let log = scratch.path("agent.log");
    let out = fs::File::create(&log).expect("log");
    let mut cmd = lab.cmd_in(lab.server_ns(), "setpriv");
    cmd.args([
        "--reuid",
        user,
        "--regid",
        user,
        "--init-groups",
        "--no-new-privs",
    ])
    .arg(format!("--inh-caps=-all,{list}"))
    .arg(format!("--ambient-caps=-all,{list}"))
    .arg(format!("--bounding-set=-all,{list}"))
    .arg("/usr/bin/pxe-agent")
    .arg("run")
    .args(&args)
    .stdout(out.try_clone().expect("log"))
    .stderr(out);
    let agent = ChildGuard::spawn(&mut cmd).expect("start the installed agent");
    let _peer = ChildGuard::spawn(
        lab.cmd_in(lab.client_ns(), agent_bin())
            .args(["veth-peer", "--interface", lab.client_if()])
            .stdout(Stdio::null()),
    )
    .expect("veth peer");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("serving /metrics and /healthz")
        && Instant::now() < deadline
    {
        thread::sleep(Duration::from_millis(100));
    }

    // The process: the unit's user, its capabilities and no others.
    let pid = agent.0.id();
    let want = caps
        .iter()
        .fold(0u64, |set, c| set | 1 << capability_bit(c));
    for set in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
        let have = u64::from_str_radix(&status_field(pid, set), 16).expect("hex");
        assert_eq!(have, want, "{set} of the installed agent");
    }
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert!(
        status_field(pid, "Uid")
            .split_whitespace()
            .all(|u| u == uid.to_string()),
        "the agent runs as {user}"
    );

    lab.set_client_mac("52:54:00:12:34:56").expect("client MAC");
    let got = lab
        .cmd_in(lab.client_ns(), "busybox")
        .args([
            "udhcpc",
            "-f",
            "-q",
            "-n",
            "-t",
            "5",
            "-T",
            "1",
            "-i",
            lab.client_if(),
        ])
        .args(["-s", "/bin/true"])
        .output()
        .expect("udhcpc");
    let text =
        String::from_utf8_lossy(&got.stdout).to_string() + &String::from_utf8_lossy(&got.stderr);
    assert!(
        got.status.success() && text.contains("10.66.1.10"),
        "no lease of 10.66.1.10 from the installed agent:\n{text}\nagent log:\n{}",
        fs::read_to_string(&log).unwrap_or_default()
    );
}

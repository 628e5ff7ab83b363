//! The whole recovery loop of the running agent with real firmware: an
//! `ipmi_sim` whose chassis powers a QEMU guest (SeaBIOS and iPXE) booting
//! through the agent ([`GuestBmc`]). `pxe-agent recover` boots it to
//! `booted` (its phone-home the one shipped for installed systems, run as
//! its systemd unit runs it) and leaves the disk set; a boot that cannot
//! finish is retried with back-off, then `failed`; a booted host whose
//! heartbeat stops is recovered by the watchdog; a guest running from its
//! disk when it is added with `expect_boot` is never power-cycled for it. Without a guest: a recovery survives
//! `kill -9` of the agent and goes on from the stage and deadline it was at.
//!
//! The first of these also runs with a Redfish-only host (the fixture of
//! [`crate::redfish_fixture`] holding the power and driving the same guest
//! watcher ipmi_sim's chassis does) and with a host that has both drivers,
//! its Redfish answering 500 so that the recovery falls back to ipmi_sim.
//!
//! The recovery state is read from `GET /api/v1/hosts` (what
//! `pxe-agent hosts` prints); each lab has one host with a BMC.

use std::{
    fs, thread,
    time::{Duration, Instant},
};

use xtask::vm::{BootLab, BootLabConfig, BootReport, BootSource, Firmware, initramfs};

use crate::{
    agent::{Scratch, agent_bin, daemonset_wrapper},
    bmc_lab::{GuestBmc, bmc_ip},
    bmc_sim::{ADMIN, PASSWORD},
    fixture::assert_root,
    oob::Rig,
    redfish_fixture::{self as fixture, RedfishFixture},
};

/// The Redfish fixture's port on the BMC's address.
const REDFISH_PORT: u16 = 8000;

/// Which drivers the host's BMC has.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Drivers {
    /// ipmi_sim powers the guest.
    Ipmi,
    /// The Redfish fixture powers the guest; ipmi_sim is not named.
    Redfish,
    /// `[redfish, ipmi]`: the fixture answers 500, ipmi_sim powers the guest.
    FailingRedfishThenIpmi,
}

impl Drivers {
    /// The host's BMC address keys.
    fn address(self) -> String {
        let ip = bmc_ip(0);
        let redfish = format!("redfish+http://{ip}:{REDFISH_PORT}{}", fixture::SYSTEM);
        match self {
            Drivers::Ipmi => format!("address: ipmi://{ip}:623"),
            Drivers::Redfish => format!("address: {redfish}"),
            Drivers::FailingRedfishThenIpmi => format!(
                "address: {redfish}\n      ipmi: ipmi://{ip}:623\n      drivers: [redfish, ipmi]"
            ),
        }
    }
}

/// One boot takes 8–25 s under TCG; room for a busy machine.
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
const GUEST_MAC: &str = "52:54:00:12:36:01";
const GUEST_IP: &str = "10.66.1.30";
const HOST: &str = "vm-node-1";
const TOKEN: &str = "fedcba9876543210fedcba9876543210";

const INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    dns: [10.66.0.1]
    lease_time: 3600
profiles:
  - name: installed
    boot:
      bios: undionly.kpxe
      uefi: ipxe.efi
    kernel: "http://{server}:8080/artifacts/@KERNEL@"
    initrd: ["http://{server}:8080/artifacts/initrd.img"]
    cmdline: "@CMDLINE@"
hosts:
  - mac: "52:54:00:12:36:01"
    ip: 10.66.1.30
    hostname: vm-node-1
    profile: installed
    bmc:
      @BMC_ADDRESS@
      username: admin
      password_file: @PASSWORD_FILE@
    recovery: @RECOVERY@
"#;

/// A boot lab whose one host's BMC is a [`GuestBmc`]. Field order: the
/// guest and its BMC stop before the agent's lab, the files go last.
struct VmRig {
    redfish: Option<RedfishFixture>,
    bmc: GuestBmc,
    lab: BootLab,
    dir: Scratch,
    /// The inventory the agent started with.
    inventory: String,
}

/// What to start a [`VmRig`] with.
struct Setup<'a> {
    prefix: &'a str,
    /// The host's `recovery` block, as a YAML flow mapping.
    recovery: &'a str,
    /// The profile's kernel file under `/artifacts/`.
    kernel: &'a str,
    /// Kernel command line parameters besides the phone-home and `pxe.stay`.
    cmdline: &'a str,
    backoff_ms: u64,
    drivers: Drivers,
    /// The agent runs as the DaemonSet runs it.
    daemonset: bool,
}

impl VmRig {
    fn start(setup: &Setup<'_>) -> VmRig {
        assert_root();
        let dir = Scratch::new(&format!("{}-files", setup.prefix));
        fs::write(dir.path("bmc.password"), PASSWORD).expect("write password");
        fs::write(dir.path("tokens"), format!("ops {TOKEN}\n")).expect("write tokens");
        fs::write(dir.path("token"), format!("{TOKEN}\n")).expect("write token");
        let cmdline = format!(
            "{} {} {}",
            initramfs::PROFILE_CMDLINE,
            initramfs::STAY_PARAM,
            setup.cmdline
        );
        let inventory = INVENTORY
            .replace("@KERNEL@", setup.kernel)
            .replace("@CMDLINE@", cmdline.trim())
            .replace("@BMC_ADDRESS@", &setup.drivers.address())
            .replace(
                "@PASSWORD_FILE@",
                &dir.path("bmc.password").display().to_string(),
            )
            .replace("@RECOVERY@", setup.recovery);
        let tokens = dir.path("tokens").display().to_string();
        let backoff = format!("{}ms", setup.backoff_ms);
        let mut cfg = BootLabConfig::new(setup.prefix, &agent_bin(), &inventory);
        if setup.daemonset {
            cfg = cfg.wrapper(daemonset_wrapper());
        }
        let cfg = cfg
            .xdp_mode("native")
            .arg("--api-token-file")
            .arg(&tokens)
            .arg("--bmc-boot-flag-echo")
            .arg("device-only")
            .arg("--recovery-backoff")
            .arg(&backoff);
        let lab =
            BootLab::start(&cfg).unwrap_or_else(|e| panic!("boot lab {}: {e:#}", setup.prefix));
        let spec = lab.vm_spec("recguest", GUEST_MAC, Firmware::Bios, 0);
        let bmc = GuestBmc::start(&lab, 0, spec);
        let redfish = (setup.drivers != Drivers::Ipmi).then(|| {
            let fx = RedfishFixture::start_in(
                lab.server_ns(),
                &bmc_ip(0),
                REDFISH_PORT,
                ADMIN,
                PASSWORD,
            );
            match setup.drivers {
                Drivers::Redfish => fx.drive_chassis(bmc.sim().chassis_dir()),
                _ => fx.fail_all(Some(500)),
            }
            fx
        });
        VmRig {
            redfish,
            bmc,
            lab,
            dir,
            inventory,
        }
    }

    /// `pxe-agent recover HOST` with the token.
    fn recover(&self) -> String {
        let token = self.dir.path("token").display().to_string();
        let out = self
            .lab
            .cli(&["recover", HOST, "--token-file", &token])
            .unwrap_or_else(|e| panic!("pxe-agent recover: {e:#}\n{}", self.context()));
        assert!(out.contains("ok"), "{out}\n{}", self.context());
        out
    }

    /// The host's recovery state and attempts from the API.
    fn recovery(&self) -> (String, u32) {
        parse_recovery(&self.hosts())
    }

    /// `GET /api/v1/hosts`.
    fn hosts(&self) -> String {
        let out = self
            .lab
            .cmd("curl")
            .args([
                "-s",
                "-H",
                &format!("Authorization: Bearer {TOKEN}"),
                &format!("http://{}/api/v1/hosts", xtask::vm::bootlab::API_ADDR),
            ])
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until the host is in `state` at `attempt`; returns when it
    /// was first seen there.
    fn wait_recovery(&self, state: &str, attempt: u32, timeout: Duration) -> Instant {
        let deadline = Instant::now() + timeout;
        loop {
            let now = Instant::now();
            let seen = self.recovery();
            if seen.0 == state && seen.1 == attempt {
                return now;
            }
            assert!(
                now < deadline,
                "not {state} at attempt {attempt} after {timeout:?}: {seen:?}\n{}",
                self.context()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn phoned_home(&self) -> BootReport {
        let report = self.bmc.guest().wait_phoned_home(BOOT_TIMEOUT);
        eprintln!("{}", report.summary());
        assert!(
            report.phoned_home && report.ip.as_deref() == Some(GUEST_IP),
            "the recovered guest did not boot\n{}",
            self.context()
        );
        report
    }

    fn context(&self) -> String {
        let guest = self.bmc.guest();
        format!(
            "{}\n--- chassis calls ---\n{}\n--- console (last 30 lines) ---\n{}\n\
             --- agent log (last 40 lines) ---\n{}",
            guest.report().map(|r| r.summary()).unwrap_or_default(),
            self.bmc.sim().state("calls.log"),
            guest.console_tail(30),
            self.lab.agent_log_tail(40),
        )
    }
}

/// `recovery` and `attempts` of the first host of a `/api/v1/hosts` answer.
fn parse_recovery(json: &str) -> (String, u32) {
    let value = |key: &str| -> Option<&str> {
        let at = json.find(&format!("\"{key}\":"))? + key.len() + 3;
        let rest = &json[at..];
        let end = rest.find([',', '}']).unwrap_or(rest.len());
        Some(rest[..end].trim().trim_matches('"'))
    };
    (
        value("recovery").unwrap_or("none").to_owned(),
        value("attempts").and_then(|a| a.parse().ok()).unwrap_or(0),
    )
}

/// `log` without its ANSI colour sequences (the agent colours its text
/// log even into a file).
pub(crate) fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters, ended by a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Positions of `needles` in `calls`, which must be in that order.
fn assert_in_order(calls: &str, needles: &[&str]) {
    let mut from = 0;
    for needle in needles {
        let at = calls[from..]
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not after byte {from} of the calls:\n{calls}"));
        from += at + needle.len();
    }
}

/// The guest phones home as an installed system does: with the script of
/// `deploy/phone-home/`, which its systemd unit runs, reading the URL and
/// the boot's token from the kernel command line.
#[test]
fn recover_boots_the_powered_off_guest_through_pxe_and_leaves_disk_set() {
    let rig = recover_to_booted("pxrecvm", Drivers::Ipmi, initramfs::INSTALLED_PARAM);
    assert_ipmi_booted_the_guest(&rig);
    let console = rig.bmc.guest().console_tail(usize::MAX);
    assert!(
        console.contains(&format!(
            "pxe-phone-home: phoned home to http://{}:8080/api/v1/hosts/{GUEST_MAC}/booted",
            xtask::vm::SERVER_IP
        )),
        "the shipped phone-home did not run\n{}",
        rig.context()
    );
}

/// Recovers the powered-off guest through `drivers` until it phoned home
/// and is `booted`; `cmdline` is added to the guest's kernel command line.
fn recover_to_booted(prefix: &str, drivers: Drivers, cmdline: &str) -> VmRig {
    let rig = VmRig::start(&Setup {
        prefix,
        recovery: "{deadline: 2m, max_attempts: 1, after_boot: disk, stages: {dhcp: 90s}}",
        kernel: "vmlinuz",
        cmdline,
        backoff_ms: 30_000,
        drivers,
        daemonset: false,
    });
    assert!(!rig.bmc.guest().is_on());
    assert_eq!(rig.recovery(), ("idle".to_owned(), 0));

    let asked = Instant::now();
    rig.recover();
    let boots = rig.bmc.guest().wait_boots(1, Duration::from_secs(30));
    assert_eq!(
        boots.len(),
        1,
        "the guest was not powered on\n{}",
        rig.context()
    );
    assert_eq!(boots[0].source, BootSource::Network);
    let report = rig.phoned_home();
    rig.wait_recovery("booted", 1, Duration::from_secs(10));
    eprintln!(
        "recover to booted: {:.1}s (power on to phone-home {:.1}s)",
        asked.elapsed().as_secs_f64(),
        report.phoned_home_after.unwrap_or_default().as_secs_f64()
    );
    let table = rig.lab.cli(&["hosts"]).expect("pxe-agent hosts");
    assert!(table.contains("booted"), "{table}");
    rig
}

/// ipmi_sim set PXE, powered the guest on and was left at disk.
fn assert_ipmi_booted_the_guest(rig: &VmRig) {
    // The boot device is set (and read back) before the power-on, the disk
    // once the guest booted.
    let deadline = Instant::now() + Duration::from_secs(15);
    while rig.bmc.sim().state("boot") != "default" {
        assert!(
            Instant::now() < deadline,
            "the boot device was not left at disk\n{}",
            rig.context()
        );
        thread::sleep(Duration::from_millis(200));
    }
    let calls = rig.bmc.sim().state("calls.log");
    assert_in_order(
        &calls,
        &[
            "set boot pxe",
            "get power",
            "set power 1",
            "set boot default",
        ],
    );
    assert_eq!(rig.bmc.sim().power_ons().len(), 1, "{calls}");
    let bootparam = rig
        .bmc
        .ipmitool(&["chassis", "bootparam", "get", "5"])
        .expect("ipmitool bootparam");
    assert!(
        bootparam.contains("Force Boot from default Hard-Drive")
            || bootparam.contains("No override"),
        "{bootparam}"
    );
    let log = plain(&rig.lab.agent_log());
    assert!(
        log.contains("to=booted") && log.contains("reason=phone-home"),
        "{}",
        rig.context()
    );
}

/// A guest that runs from its disk (powered on, never network-booting),
/// added to the inventory with `expect_boot`, is asked whether it is on and
/// then left alone: not power-cycled when its deadline passes, `hosts`
/// showing it waiting. The agent runs as the DaemonSet runs it.
#[test]
fn a_running_guest_added_with_expect_boot_is_not_power_cycled() {
    let rig = VmRig::start(&Setup {
        prefix: "pxrecrun",
        recovery: "{max_attempts: 1}",
        kernel: "vmlinuz",
        cmdline: "",
        backoff_ms: 30_000,
        drivers: Drivers::Ipmi,
        daemonset: true,
    });
    let (head, _) = rig.inventory.split_once("hosts:\n").expect("hosts");
    rig.lab
        .replace_inventory(&format!("{head}hosts: []\n"))
        .expect("replace the inventory");
    let wait_hosts = |what: &str, present: bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let hosts = rig.hosts();
            if hosts.contains(what) == present {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what} present: {}: {hosts}\n{}",
                !present,
                rig.context()
            );
            thread::sleep(Duration::from_millis(200));
        }
    };
    wait_hosts(GUEST_MAC, false);

    // The machine runs what is on its disk, outside any inventory.
    for args in [["chassis", "bootdev", "disk"], ["chassis", "power", "on"]] {
        rig.bmc
            .ipmitool(&args)
            .unwrap_or_else(|e| panic!("ipmitool {args:?}: {e:#}"));
    }
    let boots = rig.bmc.guest().wait_boots(1, Duration::from_secs(30));
    assert_eq!(boots.len(), 1, "not powered on\n{}", rig.context());
    assert_eq!(boots[0].source, BootSource::Disk);
    let before = rig.bmc.sim().state("calls.log").len();

    // Added with `expect_boot` and a short deadline.
    rig.lab
        .replace_inventory(&rig.inventory.replace(
            "recovery: {max_attempts: 1}",
            "recovery: {expect_boot: true, deadline: 5s, max_attempts: 1}",
        ))
        .expect("replace the inventory");
    wait_hosts(r#""recovery_watch":"until-boot-activity""#, true);
    thread::sleep(Duration::from_secs(10));
    let calls = rig.bmc.sim().state("calls.log");
    let since = &calls[before..];
    assert!(
        since.contains("get power") && !since.contains("set power") && !since.contains("set boot"),
        "the running guest was acted on: {since}\n{}",
        rig.context()
    );
    let guest = rig.bmc.guest();
    assert!(guest.is_on(), "{}", rig.context());
    assert_eq!(guest.boots().len(), 1, "{}", rig.context());
    assert_eq!(rig.recovery(), ("idle".to_owned(), 0));
    let table = rig.lab.cli(&["hosts"]).expect("pxe-agent hosts");
    assert!(table.contains("idle (running)"), "{table}");
}

#[test]
fn recover_boots_a_redfish_only_guest_and_leaves_disk_set() {
    let rig = recover_to_booted("pxrecrf", Drivers::Redfish, "");
    let fx = rig.redfish.as_ref().expect("fixture");
    let deadline = Instant::now() + Duration::from_secs(15);
    while rig.bmc.sim().state("boot") != "default" {
        assert!(
            Instant::now() < deadline,
            "the boot device was not left at disk\n{}",
            rig.context()
        );
        thread::sleep(Duration::from_millis(200));
    }
    let acts: Vec<String> = fx
        .seen()
        .into_iter()
        .filter(|s| s.method == "PATCH" || s.path.ends_with("ComputerSystem.Reset"))
        .map(|s| {
            let boot = &s.body["Boot"];
            match s.method.as_str() {
                "PATCH" => format!(
                    "{} {}",
                    boot["BootSourceOverrideTarget"].as_str().unwrap_or(""),
                    boot["BootSourceOverrideEnabled"].as_str().unwrap_or("")
                ),
                _ => s.body["ResetType"].as_str().unwrap_or("").to_owned(),
            }
        })
        .collect();
    assert_eq!(
        acts,
        ["Pxe Once", "On", "Hdd Continuous"],
        "{}",
        rig.context()
    );
    let calls = rig.bmc.sim().state("calls.log");
    assert!(calls.is_empty(), "IPMI was used: {calls}");
    let hosts = rig.lab.cli(&["hosts", "--format", "json"]).expect("hosts");
    assert!(
        hosts.contains("bmc_driver") && hosts.contains("\"redfish\""),
        "{hosts}"
    );
}

#[test]
fn recover_falls_back_to_ipmi_when_redfish_fails_and_boots_the_guest() {
    let rig = recover_to_booted("pxrecfb", Drivers::FailingRedfishThenIpmi, "");
    assert_ipmi_booted_the_guest(&rig);
    let fx = rig.redfish.as_ref().expect("fixture");
    // Only the first call reached Redfish: the rest started with IPMI.
    let paths: Vec<String> = fx.seen().into_iter().map(|s| s.path).collect();
    assert!(paths.iter().all(|p| p == "/redfish/v1/"), "{paths:?}");
    let metrics = rig
        .lab
        .cmd("curl")
        .args([
            "-s",
            &format!("http://{}/metrics", xtask::vm::bootlab::METRICS_ADDR),
        ])
        .output()
        .expect("curl");
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        metrics.contains(
            "pxe_bmc_fallback_total{from=\"redfish\",to=\"ipmi\",reason=\"http-status\"} 1"
        ),
        "{metrics}"
    );
    let log = plain(&rig.lab.agent_log());
    assert!(
        log.contains("falling back to the other driver"),
        "{}",
        rig.context()
    );
}

#[test]
fn recovery_whose_boot_cannot_finish_retries_with_backoff_then_fails() {
    const BACKOFF_MS: u64 = 3_000;
    const PHONE_HOME_DEADLINE: Duration = Duration::from_secs(5);
    let rig = VmRig::start(&Setup {
        prefix: "pxrecfail",
        recovery: "{deadline: 5s, max_attempts: 2, stages: {dhcp: 60s, boot_file: 30s, \
                   script: 30s}}",
        kernel: "vmlinuz-missing",
        cmdline: "",
        backoff_ms: BACKOFF_MS,
        drivers: Drivers::Ipmi,
        daemonset: false,
    });
    let asked = Instant::now();
    rig.recover();
    rig.wait_recovery("backoff", 1, BOOT_TIMEOUT);
    rig.wait_recovery("failed", 2, BOOT_TIMEOUT);
    eprintln!("recover to failed: {:.1}s", asked.elapsed().as_secs_f64());

    let ons = rig.bmc.sim().power_ons();
    assert_eq!(ons.len(), 2, "one power-up per attempt\n{}", rig.context());
    let gap = ons[1].duration_since(ons[0]).unwrap_or_default();
    // Each attempt reached its script, then waited out the phone-home stage.
    assert!(
        gap >= Duration::from_millis(BACKOFF_MS) + PHONE_HOME_DEADLINE,
        "power-ups {gap:?} apart\n{}",
        rig.context()
    );
    let boots = rig.bmc.guest().boots();
    assert!(
        boots.len() == 2 && boots.iter().all(|b| b.source == BootSource::Network),
        "{boots:?}\n{}",
        rig.context()
    );
    assert!(!rig.bmc.guest().report().is_some_and(|r| r.phoned_home));
    let log = plain(&rig.lab.agent_log());
    for want in [
        "to=backoff reason=phone-home-timeout attempt=1",
        "to=recovering reason=retry attempt=2",
        "to=failed reason=phone-home-timeout attempt=2",
    ] {
        assert!(log.contains(want), "{want} missing\n{}", rig.context());
    }
    // Nothing powers the host up once it failed.
    thread::sleep(Duration::from_millis(BACKOFF_MS + 1_000));
    assert_eq!(rig.bmc.sim().power_ons().len(), 2);
    assert_eq!(rig.recovery(), ("failed".to_owned(), 2));
}

#[test]
fn watchdog_recovers_a_booted_guest_whose_heartbeat_stops() {
    let cmdline = format!(
        "{}=3 {}=2",
        initramfs::HEARTBEATS_PARAM,
        initramfs::HEARTBEAT_EVERY_PARAM
    );
    let rig = VmRig::start(&Setup {
        prefix: "pxrecdog",
        recovery: "{heartbeat: 8s, deadline: 2m, max_attempts: 2, stages: {dhcp: 90s}}",
        kernel: "vmlinuz",
        cmdline: &cmdline,
        backoff_ms: 2_000,
        drivers: Drivers::Ipmi,
        daemonset: false,
    });
    rig.recover();
    rig.phoned_home();
    let booted = rig.wait_recovery("booted", 1, Duration::from_secs(10));

    // Three heartbeats 2 s apart keep it booted; 8 s after the last one the
    // watchdog power-cycles it, without being asked.
    let boots = rig.bmc.guest().wait_boots(2, Duration::from_secs(60));
    assert_eq!(
        boots.len(),
        2,
        "the watchdog did not act\n{}",
        rig.context()
    );
    let silent = boots[1].at.duration_since(booted);
    assert!(
        silent >= Duration::from_secs(8 + 6) - Duration::from_secs(2),
        "recovered {silent:?} after the phone-home, before its heartbeats stopped\n{}",
        rig.context()
    );
    assert_eq!(boots[1].source, BootSource::Network);
    rig.phoned_home();
    rig.wait_recovery("booted", 1, Duration::from_secs(10));
    eprintln!(
        "phone-home to watchdog power-up {:.1}s",
        silent.as_secs_f64()
    );
    assert_eq!(rig.bmc.sim().power_ons().len(), 2, "{}", rig.context());
    let log = plain(&rig.lab.agent_log());
    assert!(
        log.contains("to=recovering reason=heartbeat-lost attempt=1"),
        "{}",
        rig.context()
    );
}

#[test]
fn recovery_survives_kill_9_and_goes_on_from_its_stage_and_deadline() {
    const DHCP_STAGE: Duration = Duration::from_secs(8);
    let mut rig = Rig::start_with(
        "pxreckill",
        "    recovery: {max_attempts: 2, stages: {dhcp: 8s}}\n",
        &["--recovery-backoff", "2s"],
    );
    let token = rig.token();
    rig.ok(&["recover", "node-1", "--token-file", &token]);
    let awaiting = wait_rig(&rig, "awaiting-dhcp", 1, Duration::from_secs(15));
    assert_eq!(rig.sim.power_ons().len(), 1);

    // Well into the stage, so a restarted deadline would show.
    thread::sleep(Duration::from_secs(4));
    let status = rig.served.signal_agent(libc::SIGKILL);
    assert!(!status.success(), "{status:?}");
    rig.restart_agent();
    let restarted = Instant::now();
    assert_eq!(
        rig_recovery(&rig),
        ("awaiting-dhcp".to_owned(), 1),
        "log:\n{}",
        rig.served.log()
    );
    assert_eq!(rig.sim.power_ons().len(), 1, "the restart powered up again");

    // The DHCP stage ends when it would have without the restart.
    let deadline = Instant::now() + Duration::from_secs(20);
    let left = loop {
        let now = Instant::now();
        if rig_recovery(&rig) != ("awaiting-dhcp".to_owned(), 1) {
            break now;
        }
        assert!(now < deadline, "still awaiting-dhcp\n{}", rig.served.log());
        thread::sleep(Duration::from_millis(100));
    };
    let waited = left.duration_since(awaiting);
    eprintln!(
        "stage ended {:.1}s after it began ({:.1}s after the restart)",
        waited.as_secs_f64(),
        left.duration_since(restarted).as_secs_f64()
    );
    assert!(
        waited >= DHCP_STAGE - Duration::from_millis(500)
            && left < restarted + DHCP_STAGE - Duration::from_secs(1),
        "the DHCP stage ended {waited:?} after it began\n{}",
        rig.served.log()
    );
    wait_rig(&rig, "awaiting-dhcp", 2, Duration::from_secs(10));
    // The sim is on, so attempt 2 is a cycle: its power-on comes 1 s later.
    let deadline = Instant::now() + Duration::from_secs(5);
    while rig.sim.power_ons().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "no power-up for attempt 2: {}",
            rig.sim.state("calls.log")
        );
        thread::sleep(Duration::from_millis(100));
    }
    wait_rig(&rig, "failed", 2, DHCP_STAGE + Duration::from_secs(5));
    let log = plain(&rig.served.log());
    assert!(
        log.contains("to=backoff reason=dhcp-timeout attempt=1"),
        "{log}"
    );
}

fn rig_recovery(rig: &Rig) -> (String, u32) {
    parse_recovery(&rig.get("/api/v1/hosts"))
}

fn wait_rig(rig: &Rig, state: &str, attempt: u32, timeout: Duration) -> Instant {
    let deadline = Instant::now() + timeout;
    loop {
        let now = Instant::now();
        let seen = rig_recovery(rig);
        if seen.0 == state && seen.1 == attempt {
            return now;
        }
        assert!(
            now < deadline,
            "not {state} at attempt {attempt} after {timeout:?}: {seen:?}\nlog:\n{}",
            rig.served.log()
        );
        thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn parse_recovery_reads_state_and_attempts() {
    let json =
        r#"[{"mac":"52:54:00:12:36:01","bmc":true,"recovery":"awaiting-dhcp","attempts":2}]"#;
    assert_eq!(parse_recovery(json), ("awaiting-dhcp".to_owned(), 2));
    assert_eq!(parse_recovery("[]"), ("none".to_owned(), 0));
    assert_eq!(plain("\x1b[3mto\x1b[0m\x1b[2m=\x1b[0mbooted"), "to=booted");
}

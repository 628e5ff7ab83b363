//! The Redfish driver against sushy-tools' emulator (fake driver) on
//! loopback ports: power, boot override and its read-back, discovery,
//! credentials, TLS trust, and the CLI's `--direct` path; an unreachable
//! BMC on a closed loopback port and on an unowned address inside a lab
//! namespace; and against the Dell-shaped fixture service of
//! [`crate::redfish_fixture`] for what the emulator does not do (Once
//! versus Continuous, ETags, advertised reset types, Redfish error
//! messages, sessions). No traffic leaves this machine's loopback or the
//! lab.

use std::{
    fs,
    future::Future,
    process::Command,
    time::{Duration, Instant},
};

use pxe_agent::bmc::{
    Bmc, BmcError, BootDevice, BootTarget, Credentials, Password, PowerAction, PowerState,
    RedfishBmc, RetryPolicy, TlsOptions,
};
use xtask::Lab;

use crate::{
    agent::{Scratch, agent_bin},
    bmc_sim::block_on_in,
    redfish_fixture::{self as fixture, RedfishFixture, Seen},
    redfish_lab::{PASSWORD, SYSTEM_1, SYSTEM_2, SushyEmulator, driver, free_port},
};

/// How long the fake driver may take to apply a power change (1-11 s),
/// with room to spare.
const POWER_SETTLE: Duration = Duration::from_secs(20);

fn block_on<T>(f: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// Deadlines short enough for failure tests, long enough for Flask.
fn quick() -> RetryPolicy {
    RetryPolicy {
        deadline: Duration::from_secs(5),
        attempt_timeout: Duration::from_millis(800),
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(400),
        max_attempts: 4,
    }
}

/// Polls until the system reports `want`, within [`POWER_SETTLE`].
async fn wait_power(bmc: &RedfishBmc, want: PowerState) {
    let end = Instant::now() + POWER_SETTLE;
    loop {
        let now = bmc.power_status().await.expect("power status");
        if now == want {
            return;
        }
        assert!(
            Instant::now() < end,
            "power still {now:?}, not {want:?}, after {POWER_SETTLE:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[test]
fn power_status_on_cycle_and_off_reach_the_emulated_system() {
    let emu = SushyEmulator::start(1);
    let bmc = emu.driver(
        &emu.system(SYSTEM_1),
        TlsOptions::default(),
        RetryPolicy::default(),
    );
    block_on(async {
        assert_eq!(bmc.power_status().await.unwrap(), PowerState::Off);
        bmc.power(PowerAction::On).await.expect("power on");
        wait_power(&bmc, PowerState::On).await;
        // Advertised without PowerCycle: sent as ForceRestart, which the
        // fake driver shows as off, then on again after its delay.
        bmc.power(PowerAction::Cycle).await.expect("power cycle");
        wait_power(&bmc, PowerState::On).await;
        bmc.power(PowerAction::Off).await.expect("power off");
        wait_power(&bmc, PowerState::Off).await;
    });
    let log = emu.log();
    assert!(
        log.contains("Reset"),
        "no reset in the emulator's log:\n{log}"
    );
}

#[test]
fn boot_override_is_set_and_read_back() {
    let emu = SushyEmulator::start(1);
    let bmc = emu.driver(&emu.system(SYSTEM_1), TlsOptions::default(), quick());
    block_on(async {
        // Once is accepted although the fake driver reads back Continuous.
        let pxe_once_uefi = BootTarget {
            device: BootDevice::Pxe,
            persistent: false,
            efi: true,
        };
        bmc.set_boot_device(pxe_once_uefi)
            .await
            .expect("set pxe once uefi");
        let flags = bmc.boot_device().await.unwrap();
        assert_eq!(flags.device(), Some(BootDevice::Pxe), "{flags:?}");
        assert!(flags.valid && flags.efi, "{flags:?}");

        let disk_always_legacy = BootTarget {
            device: BootDevice::Disk,
            persistent: true,
            efi: false,
        };
        bmc.set_boot_device(disk_always_legacy)
            .await
            .expect("set hdd continuous legacy");
        let flags = bmc.boot_device().await.unwrap();
        assert_eq!(flags.device(), Some(BootDevice::Disk), "{flags:?}");
        assert!(flags.valid && flags.persistent && !flags.efi, "{flags:?}");

        // The emulator does not advertise BiosSetup: refused before a PATCH.
        let err = bmc
            .set_boot_device(BootTarget {
                device: BootDevice::BiosSetup,
                persistent: false,
                efi: false,
            })
            .await
            .unwrap_err();
        assert!(
            matches!(err, BmcError::NotAdvertised { .. }) && err.to_string().contains("Pxe"),
            "{err}"
        );

        let info = bmc.info().await.expect("info");
        assert!(info.vendor.is_some() || info.model.is_some(), "{info:?}");
    });
}

#[test]
fn system_is_discovered_when_the_address_names_none() {
    let one = SushyEmulator::start(1);
    let bmc = one.driver(&one.address(""), TlsOptions::default(), quick());
    assert_eq!(
        block_on(bmc.power_status()).expect("discovered system"),
        PowerState::Off
    );

    let two = SushyEmulator::start(2);
    let bmc = two.driver(&two.address("/redfish/v1"), TlsOptions::default(), quick());
    let err = block_on(bmc.power_status()).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, BmcError::SystemNotFound { .. }), "{text}");
    assert!(text.contains(SYSTEM_1) && text.contains(SYSTEM_2), "{text}");
}

#[test]
fn wrong_password_is_an_auth_error_that_never_shows_the_password() {
    let emu = SushyEmulator::start(1);
    let wrong = "wrong-password-7731";
    let bmc = driver(&emu.system(SYSTEM_1), wrong, TlsOptions::default(), quick());
    let started = Instant::now();
    let err = block_on(bmc.power_status()).unwrap_err();
    let text = format!("{err} {err:?} {bmc:?}");
    assert!(matches!(err, BmcError::AuthFailed { .. }), "{text}");
    assert!(err.is_permanent());
    assert!(!text.contains(wrong) && !text.contains(PASSWORD), "{text}");
    assert!(started.elapsed() < Duration::from_secs(3), "not retried");
}

#[test]
fn tls_certificate_of_a_private_ca_is_refused_unless_trusted_or_insecure() {
    let emu = SushyEmulator::start_tls();
    let address = emu.system(SYSTEM_1);

    let started = Instant::now();
    let err = block_on(
        emu.driver(&address, TlsOptions::default(), quick())
            .power_status(),
    )
    .unwrap_err();
    assert!(matches!(err, BmcError::TlsRejected { .. }), "{err}");
    assert!(err.to_string().contains("ca_file"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3), "not retried");

    let trusted = TlsOptions {
        ca_file: Some(emu.ca_file()),
        insecure: false,
    };
    assert_eq!(
        block_on(emu.driver(&address, trusted, quick()).power_status()).expect("with ca_file"),
        PowerState::Off
    );

    let insecure = TlsOptions {
        ca_file: None,
        insecure: true,
    };
    assert_eq!(
        block_on(emu.driver(&address, insecure, quick()).power_status()).expect("insecure"),
        PowerState::Off
    );

    // Plain HTTP to a TLS port is not mistaken for a Redfish answer.
    let http = address.replacen("redfish+https", "redfish+http", 1);
    assert!(
        block_on(
            emu.driver(&http, TlsOptions::default(), quick())
                .power_status()
        )
        .is_err()
    );
}

#[test]
fn closed_port_fails_within_the_deadline_with_a_connection_error() {
    let port = free_port();
    let bmc = driver(
        &format!("redfish+http://127.0.0.1:{port}/redfish/v1/Systems/1"),
        PASSWORD,
        TlsOptions::default(),
        quick(),
    );
    let started = Instant::now();
    let err = block_on(bmc.power_status()).unwrap_err();
    assert!(
        started.elapsed() < quick().deadline + Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(err, BmcError::Connect { .. }), "{err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}

#[test]
fn unanswered_bmc_address_fails_within_the_deadline() {
    // 10.67.0.9 is in the lab's subnet but nobody owns it: SYNs go
    // nowhere (ARP is never answered).
    let lab = Lab::new_with("pxrf", "10.67.0.1/16").expect("create lab");
    lab.run_in(
        lab.client_ns(),
        &["ip", "addr", "add", "10.67.0.2/16", "dev", lab.client_if()],
    )
    .expect("address client end");
    let (err, waited) = block_on_in(lab.client_ns(), || async {
        let bmc = driver(
            "redfish://10.67.0.9/redfish/v1/Systems/1",
            PASSWORD,
            TlsOptions::default(),
            quick(),
        );
        let started = Instant::now();
        let err = bmc.power_status().await.unwrap_err();
        (err, started.elapsed())
    });
    assert!(
        waited < quick().deadline + Duration::from_secs(1),
        "{waited:?}: {err}"
    );
    assert!(
        matches!(
            err,
            BmcError::Unreachable { .. } | BmcError::Timeout { .. } | BmcError::Connect { .. }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("10.67.0.9:443"), "{err}");
}

#[test]
fn cli_direct_reads_and_sets_a_redfish_host() {
    let emu = SushyEmulator::start(1);
    let dir = Scratch::new("redfish-cli");
    fs::write(dir.path("bmc.password"), PASSWORD).unwrap();
    let inventory = format!(
        "subnets: [{{cidr: 10.66.0.0/16}}]\n\
         profiles: [{{name: w, boot: {{bios: undionly.kpxe}}}}]\n\
         hosts:\n  - mac: \"02:00:00:00:00:10\"\n    ip: 10.66.1.10\n    \
         hostname: node-1\n    profile: w\n    bmc:\n      \
         address: {}\n      username: admin\n      \
         password_file: {}\n",
        emu.system(SYSTEM_1),
        dir.path("bmc.password").display()
    );
    fs::write(dir.path("inventory.yaml"), inventory).unwrap();
    let cli = |args: &[&str]| {
        let out = Command::new(agent_bin())
            .args(args)
            .args(["node-1", "--direct", "--format", "json", "--inventory"])
            .arg(dir.path("inventory.yaml"))
            .arg("--audit-log")
            .arg(dir.path("audit.jsonl"))
            .output()
            .expect("run pxe-agent");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {stdout}\n{stderr}");
        stdout
    };
    let status = cli(&["bmc", "power", "status"]);
    assert!(status.contains("\"off\""), "{status}");
    let boot = cli(&["bmc", "bootdev", "pxe", "--efi"]);
    assert!(boot.contains("pxe"), "{boot}");
    let audit = fs::read_to_string(dir.path("audit.jsonl")).unwrap();
    assert!(audit.contains("direct"), "{audit}");
    let _ = fs::remove_dir_all(&dir.0);
}

/// A driver for the fixture, as its user with `password`.
fn fixture_driver(fx: &RedfishFixture, password: &str) -> RedfishBmc {
    RedfishBmc::new(
        &fx.address().parse().unwrap(),
        Credentials::new(fixture::USER, Password::new(password)).unwrap(),
        &TlsOptions::default(),
        quick(),
    )
    .expect("driver")
}

#[test]
fn once_and_continuous_are_told_apart_on_a_bmc_that_keeps_them() {
    let fx = RedfishFixture::start(true);
    let bmc = fixture_driver(&fx, fixture::PASSWORD);
    block_on(async {
        let once = BootTarget {
            device: BootDevice::Pxe,
            persistent: false,
            efi: true,
        };
        bmc.set_boot_device(once).await.expect("pxe once");
        let flags = bmc.boot_device().await.unwrap();
        assert!(flags.valid && !flags.persistent && flags.efi, "{flags:?}");
        assert_eq!(flags.device(), Some(BootDevice::Pxe));
        // The next boot consumes it.
        fx.reboot();
        assert!(!bmc.boot_device().await.unwrap().valid);

        let always = BootTarget {
            device: BootDevice::Disk,
            persistent: true,
            efi: false,
        };
        bmc.set_boot_device(always).await.expect("hdd continuous");
        let flags = bmc.boot_device().await.unwrap();
        assert!(flags.valid && flags.persistent && !flags.efi, "{flags:?}");
        fx.reboot();
        assert!(bmc.boot_device().await.unwrap().valid, "continuous stays");
    });
    let patches: Vec<Seen> = fx
        .seen()
        .into_iter()
        .filter(|s| s.method == "PATCH")
        .collect();
    assert_eq!(patches.len(), 2, "{patches:#?}");
    assert_eq!(patches[0].body["Boot"]["BootSourceOverrideEnabled"], "Once");
    assert_eq!(patches[0].body["Boot"]["BootSourceOverrideMode"], "UEFI");
    assert_eq!(patches[1].body["Boot"]["BootSourceOverrideTarget"], "Hdd");
    assert_eq!(
        patches[1].body["Boot"]["BootSourceOverrideEnabled"],
        "Continuous"
    );
}

#[test]
fn boot_patch_carries_the_etag_and_rereads_it_once_after_412() {
    let fx = RedfishFixture::start(true);
    let bmc = fixture_driver(&fx, fixture::PASSWORD);
    let pxe = BootTarget {
        device: BootDevice::Pxe,
        persistent: false,
        efi: true,
    };
    block_on(bmc.set_boot_device(pxe)).expect("set with If-Match");
    let seen = fx.seen();
    let patch = seen.iter().find(|s| s.method == "PATCH").expect("a PATCH");
    assert_eq!(patch.if_match.as_deref(), Some("W/\"1\""), "{patch:#?}");

    // Another client changes the system between our GET and PATCH: the
    // first PATCH gets 412; the driver reads the new ETag and succeeds.
    let fx = RedfishFixture::start(true);
    let bmc = fixture_driver(&fx, fixture::PASSWORD);
    block_on(async {
        bmc.power_status().await.unwrap(); // session and first GET
        fx.bump_etag();
        bmc.set_boot_device(pxe)
            .await
            .expect("set after a stale ETag");
    });
    let if_matches: Vec<Option<String>> = fx
        .seen()
        .into_iter()
        .filter(|s| s.method == "PATCH")
        .map(|s| s.if_match)
        .collect();
    assert_eq!(if_matches, vec![Some("W/\"2\"".to_owned())]);
}

#[test]
fn reset_types_come_from_allowable_values_and_unadvertised_ones_are_not_sent() {
    let fx = RedfishFixture::start(true);
    let bmc = fixture_driver(&fx, fixture::PASSWORD);
    block_on(async {
        bmc.power(PowerAction::Cycle).await.expect("cycle");
        let err = bmc.power(PowerAction::SoftOff).await.unwrap_err();
        assert!(matches!(err, BmcError::NotAdvertised { .. }), "{err}");
        assert!(err.to_string().contains("PowerCycle"), "{err}");
        bmc.power(PowerAction::Off).await.expect("off");
        assert_eq!(bmc.power_status().await.unwrap(), PowerState::Off);
    });
    let resets: Vec<String> = fx
        .seen()
        .into_iter()
        .filter(|s| s.method == "POST" && s.path.ends_with("ComputerSystem.Reset"))
        .map(|s| s.body["ResetType"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(resets, ["PowerCycle", "ForceOff"], "SoftOff never sent");
}

#[test]
fn server_error_shows_the_redfish_message_and_a_failed_cycle_is_sent_once() {
    let fx = RedfishFixture::start(true);
    let bmc = fixture_driver(&fx, fixture::PASSWORD);
    fx.fail_next_reset();
    let err = block_on(bmc.power(PowerAction::Cycle)).unwrap_err();
    assert!(matches!(err, BmcError::Http { status: 500, .. }), "{err}");
    assert!(err.to_string().contains("server is busy"), "{err}");
    let cycles = fx
        .seen()
        .into_iter()
        .filter(|s| s.path.ends_with("ComputerSystem.Reset"))
        .count();
    assert_eq!(cycles, 1, "a non-idempotent reset is sent once");

    // An idempotent one is retried past a 500.
    fx.fail_next_reset();
    block_on(bmc.power(PowerAction::Off)).expect("off after one 500");
}

#[test]
fn session_token_is_used_when_offered_and_basic_auth_otherwise() {
    let fx = RedfishFixture::start(true);
    let bmc = fixture_driver(&fx, fixture::PASSWORD);
    let info = block_on(async {
        bmc.power_status().await.unwrap();
        bmc.info().await.unwrap()
    });
    assert_eq!(info.vendor.as_deref(), Some("Dell Inc."));
    assert_eq!(info.firmware_version.as_deref(), Some("6.10.30.00"));
    let seen = fx.seen();
    let posts = seen
        .iter()
        .filter(|s| s.method == "POST" && s.path.contains("Sessions"))
        .count();
    assert_eq!(posts, 1, "one session for several calls: {seen:#?}");
    assert!(
        seen.iter()
            .filter(|s| s.path.starts_with(fixture::SYSTEM))
            .all(|s| s.token.is_some() && !s.basic),
        "{seen:#?}"
    );
    // Dropping the driver gives the session back.
    block_on(async {
        drop(bmc);
        tokio::time::sleep(Duration::from_millis(300)).await;
    });
    assert!(
        fx.seen().iter().any(|s| s.method == "DELETE"),
        "session deleted"
    );

    let fx = RedfishFixture::start(false);
    let bmc = fixture_driver(&fx, fixture::PASSWORD);
    assert_eq!(block_on(bmc.power_status()).unwrap(), PowerState::On);
    let seen = fx.seen();
    assert!(
        seen.iter()
            .filter(|s| s.path.starts_with(fixture::SYSTEM))
            .all(|s| s.basic && s.token.is_none()),
        "{seen:#?}"
    );

    // Wrong password for the session: an auth error without the password.
    let fx = RedfishFixture::start(true);
    let bmc = fixture_driver(&fx, "not-the-password-55");
    let err = block_on(bmc.power_status()).unwrap_err();
    assert!(matches!(err, BmcError::AuthFailed { .. }), "{err}");
    assert!(!format!("{err}{err:?}").contains("not-the-password-55"));
}

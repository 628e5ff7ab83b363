//! Per-host fallback from Redfish to IPMI in the running agent: a host with
//! `bmc.drivers: [redfish, ipmi]` whose Redfish service (the fixture of
//! [`crate::redfish_fixture`], inside the agent's namespace) fails in each
//! of three ways, stopped, answering 500, or reading back another boot
//! target than the one set, while its IPMI (`ipmi_sim`) works. Each time
//! the action is done over IPMI (ipmi_sim's chassis state and `ipmitool`
//! say so), the fallback shows in `/metrics`, `/api/v1/hosts`,
//! `pxe-agent hosts` and the audit log, and the next action, within the
//! hold-down, goes to IPMI without a request to the Redfish service.

use crate::{
    bmc_sim::{ADMIN, PASSWORD},
    oob::{Rig, SIM_IP},
    redfish_fixture::{self as fixture, RedfishFixture},
};

/// The fixture's port in the agent's namespace (fresh: nothing else
/// listens there).
const FIXTURE_PORT: u16 = 8000;

/// How the Redfish service fails.
enum Break {
    Stop,
    Status500,
    LieOnReadBack,
}

/// The agent with the fallback host, and its Redfish fixture, healthy and
/// answering the agent.
fn rig(name: &str) -> (Rig, RedfishFixture) {
    let bmc = format!(
        "address: redfish+http://127.0.0.1:{FIXTURE_PORT}{}\n      \
         ipmi: ipmi://{SIM_IP}:623\n      drivers: [redfish, ipmi]\n      \
         fallback_hold: 10m",
        fixture::SYSTEM
    );
    let rig = Rig::launch(name, &bmc, "", &[]);
    let fx = RedfishFixture::start_in(
        rig.served.lab.server_ns(),
        "127.0.0.1",
        FIXTURE_PORT,
        ADMIN,
        PASSWORD,
    );
    rig.wait_ready();
    assert!(fx.requests() > 0, "the ready check did not go to Redfish");
    let metrics = rig.get("/metrics");
    assert!(
        !metrics.contains("pxe_bmc_fallback_total{"),
        "a fallback before the test: {metrics}"
    );
    (rig, fx)
}

/// `pxe-agent bmc ARGS node-1` through the agent, as JSON.
fn bmc(rig: &Rig, args: &[&str]) -> String {
    let token = rig.token();
    let mut full = vec!["bmc"];
    full.extend_from_slice(args);
    full.extend(["node-1", "--token-file", &token, "--format", "json"]);
    let out = rig.ok(&full);
    assert!(out.contains("\"result\": \"ok\""), "{args:?}: {out}");
    out
}

fn ipmitool(rig: &Rig, args: &[&str]) -> String {
    rig.sim
        .ipmitool(rig.served.lab.client_ns(), args)
        .expect("ipmitool")
}

/// The fallback is in every place an operator looks.
fn assert_recorded(rig: &Rig, reason: &str, call: &str) {
    let metrics = rig.get("/metrics");
    let want =
        format!("pxe_bmc_fallback_total{{from=\"redfish\",to=\"ipmi\",reason=\"{reason}\"}} 1");
    assert!(metrics.contains(&want), "{want} missing:\n{metrics}");
    assert!(
        metrics.contains("pxe_bmc_fallback_held_hosts 1"),
        "{metrics}"
    );
    let hosts = rig.get("/api/v1/hosts");
    assert!(hosts.contains(r#""bmc_driver":"ipmi""#), "{hosts}");
    assert!(hosts.contains(r#""bmc_fallback_until_ms":1"#), "{hosts}");
    assert!(
        hosts.contains(&format!(r#""reason":"{reason}","call":"{call}""#)),
        "{hosts}"
    );
    let table = rig.ok(&["hosts"]);
    assert!(table.contains("ipmi fallback 9m"), "{table}");
    assert!(table.contains("BMC"), "{table}");
    let audit = rig.get("/api/v1/audit");
    for want in [
        r#""host":"node-1","action":"bmc-fallback""#.to_owned(),
        format!(r#""reason":"{reason}""#),
        r#""to":"ipmi""#.to_owned(),
    ] {
        assert!(audit.contains(&want), "{want} missing from {audit}");
    }
    let log = rig.served.log();
    assert!(log.contains("falling back to the other driver"), "{log}");
    for (what, text) in [
        ("log", &log),
        ("metrics", &metrics),
        ("hosts", &hosts),
        ("audit", &audit),
    ] {
        assert!(!text.contains(PASSWORD), "the password is in the {what}");
    }
}

fn falls_back(name: &str, how: Break) {
    let (rig, fx) = rig(name);
    assert_ne!(rig.sim_state("power"), "1", "ipmi_sim powered on already");
    let mut fx = Some(fx);
    let reason = match how {
        Break::Stop => {
            drop(fx.take());
            "unreachable"
        }
        Break::Status500 => {
            fx.as_ref().unwrap().fail_all(Some(500));
            "http-status"
        }
        Break::LieOnReadBack => {
            fx.as_ref().unwrap().lie_on_read_back("Hdd");
            "read-back"
        }
    };
    let requests = || fx.as_ref().map(RedfishFixture::requests);
    if let Break::LieOnReadBack = how {
        // Power works over Redfish: the boot override is what fails.
        bmc(&rig, &["bootdev", "http"]);
        let patch = fx
            .as_ref()
            .unwrap()
            .seen()
            .into_iter()
            .find(|s| s.method == "PATCH")
            .expect("the override was tried over Redfish");
        assert_eq!(patch.body["Boot"]["BootSourceOverrideTarget"], "UefiHttp");
        assert_eq!(
            rig.sim_state("boot"),
            "pxe",
            "UefiHttp is EFI PXE over IPMI"
        );
        let flags = ipmitool(&rig, &["chassis", "bootparam", "get", "5"]);
        assert!(flags.contains("PXE"), "{flags}");
        assert_recorded(&rig, reason, "bootdev");

        let before = requests();
        bmc(&rig, &["power", "on"]);
        assert_eq!(requests(), before, "a Redfish request within the hold-down");
        assert_eq!(rig.sim_state("power"), "1");
    } else {
        let out = bmc(&rig, &["power", "on"]);
        assert!(out.contains("\"power\": \"on\""), "{out}");
        assert_eq!(rig.sim_state("power"), "1", "powered on over IPMI");
        let status = ipmitool(&rig, &["chassis", "power", "status"]);
        assert!(status.contains("is on"), "{status}");
        assert_recorded(&rig, reason, "power");

        let before = requests();
        bmc(&rig, &["bootdev", "pxe", "--efi"]);
        assert_eq!(requests(), before, "a Redfish request within the hold-down");
        assert_eq!(rig.sim_state("boot"), "pxe");
    }
    // Only the first action fell back: the second started with IPMI.
    let metrics = rig.get("/metrics");
    let count: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("pxe_bmc_fallback_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(count, 1, "{metrics}");
}

#[test]
fn stopped_redfish_falls_back_to_ipmi_and_holds_down() {
    falls_back("pxfbstop", Break::Stop);
}

#[test]
fn redfish_answering_500_falls_back_to_ipmi_and_holds_down() {
    falls_back("pxfb500", Break::Status500);
}

#[test]
fn redfish_reading_back_another_target_falls_back_to_ipmi_and_holds_down() {
    falls_back("pxfblie", Break::LieOnReadBack);
}

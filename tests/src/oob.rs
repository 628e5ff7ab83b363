//! Out-of-band control in the running agent against OpenIPMI's `ipmi_sim`:
//! the `bmc` and `recover` commands through the API with a bearer token,
//! refused without one, audited, and the BMC password in nothing the agent
//! or the CLI shows.
//!
//! The simulator listens on a second address of the lab's client end
//! (10.66.0.250); the agent reaches it from the server namespace. No guest
//! boots: the recovery test stops at awaiting-dhcp.

use std::{fs, thread, time::Duration, time::Instant};

use crate::{
    agent::{Privileges, Scratch, Served, agent_bin, assert_daemonset_privileges},
    bmc_sim::{IpmiSim, PASSWORD},
};

pub(crate) const SIM_IP: &str = "10.66.0.250";
const TOKEN: &str = "0123456789abcdef0123456789abcdef";

/// The agent with a host whose BMC is the simulator, and the simulator.
/// Field order matters: the simulator stops before the agent's lab goes.
pub(crate) struct Rig {
    pub(crate) sim: IpmiSim,
    sim_dir: Scratch,
    pub(crate) served: Served,
    /// The agent's `run` arguments besides the lab's own.
    args: Vec<String>,
}

impl Rig {
    fn start(name: &str) -> Rig {
        Rig::start_with(name, "", &[])
    }

    /// Like [`Rig::start`], with `host_extra` appended to the host's YAML
    /// (indented keys such as a `recovery` block) and `extra` arguments to
    /// `pxe-agent run`.
    pub(crate) fn start_with(name: &str, host_extra: &str, extra: &[&str]) -> Rig {
        let rig = Rig::launch(
            name,
            &format!("address: ipmi://{SIM_IP}:623"),
            host_extra,
            extra,
        );
        rig.wait_ready();
        rig
    }

    /// Like [`Rig::start`], the agent run with `privileges`.
    fn start_as(name: &str, privileges: Privileges) -> Rig {
        let rig = Rig::launch_as(
            name,
            &format!("address: ipmi://{SIM_IP}:623"),
            "",
            &[],
            privileges,
        );
        rig.wait_ready();
        rig
    }

    /// The agent and the simulator, not yet waited for: `bmc` is the
    /// host's BMC address keys (indented as the block's other keys are).
    pub(crate) fn launch(name: &str, bmc: &str, host_extra: &str, extra: &[&str]) -> Rig {
        Rig::launch_as(name, bmc, host_extra, extra, Privileges::Root)
    }

    /// [`Rig::launch`], the agent run with `privileges`.
    fn launch_as(
        name: &str,
        bmc: &str,
        host_extra: &str,
        extra: &[&str],
        privileges: Privileges,
    ) -> Rig {
        let sim_dir = Scratch::new(&format!("{name}-sim"));
        fs::write(sim_dir.path("bmc.password"), PASSWORD).unwrap();
        fs::write(sim_dir.path("tokens"), format!("ops {TOKEN}\n")).unwrap();
        fs::write(sim_dir.path("token"), format!("{TOKEN}\n")).unwrap();
        let inventory = format!(
            "subnets: [{{cidr: 10.66.0.0/16}}]\n\
             profiles: [{{name: w, boot: {{bios: undionly.kpxe}}}}]\n\
             hosts:\n  - mac: \"02:00:00:00:00:10\"\n    ip: 10.66.1.10\n    \
             hostname: node-1\n    profile: w\n    labels: {{rack: r3}}\n    bmc:\n      \
             {bmc}\n      username: admin\n      \
             password_file: {}\n{host_extra}",
            sim_dir.path("bmc.password").display()
        );
        let tokens = sim_dir.path("tokens");
        let args: Vec<String> = [
            "--api-token-file",
            tokens.to_str().unwrap(),
            "--bmc-boot-flag-echo",
            "device-only",
        ]
        .into_iter()
        .chain(extra.iter().copied())
        .map(str::to_owned)
        .collect();
        let served = Served::start_as(
            name,
            &inventory,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
            privileges,
        );
        served.add_client_address(&format!("{SIM_IP}/16"));
        let sim = IpmiSim::start(served.lab.client_ns(), SIM_IP);
        Rig {
            sim,
            sim_dir,
            served,
            args,
        }
    }

    /// Waits until the host's BMC answers through the agent.
    pub(crate) fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            let (ok, _, _) = self.cli(&[
                "bmc",
                "power",
                "status",
                "node-1",
                "--token-file",
                &self.token(),
            ]);
            if ok {
                return;
            }
            thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "the BMC did not answer the agent; log:\n{}",
            self.served.log()
        );
    }

    /// Starts the agent again (after it was stopped) with the same arguments.
    pub(crate) fn restart_agent(&mut self) {
        let args = self.args.clone();
        self.served
            .restart(&args.iter().map(String::as_str).collect::<Vec<_>>());
    }

    pub(crate) fn token(&self) -> String {
        self.sim_dir.path("token").display().to_string()
    }

    /// `pxe-agent ARGS` in the agent's namespace: success, stdout, stderr.
    pub(crate) fn cli(&self, args: &[&str]) -> (bool, String, String) {
        self.cli_as(args, None)
    }

    /// [`Rig::cli`] with `$PXE_AGENT_TOKEN_FILE` set to `token_file`.
    fn cli_as(&self, args: &[&str], token_file: Option<&str>) -> (bool, String, String) {
        let mut cmd = self
            .served
            .lab
            .cmd_in(self.served.lab.server_ns(), agent_bin());
        if let Some(file) = token_file {
            cmd.env("PXE_AGENT_TOKEN_FILE", file);
        }
        let out = cmd.args(args).output().expect("run pxe-agent");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `pxe-agent ARGS` as the operator (with the token), which must
    /// succeed: its stdout.
    pub(crate) fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.cli_as(args, Some(&self.token()));
        assert!(
            ok,
            "`pxe-agent {}` failed:\n{out}\n{err}\nagent log:\n{}",
            args.join(" "),
            self.served.log()
        );
        out
    }

    pub(crate) fn sim_state(&self, file: &str) -> String {
        self.sim.state(file)
    }

    pub(crate) fn get(&self, path: &str) -> String {
        let out = self
            .served
            .lab
            .cmd_in(self.served.lab.server_ns(), "curl")
            .args([
                "-s",
                "-H",
                &format!("Authorization: Bearer {TOKEN}"),
                &format!("http://{}{path}", crate::agent::listener_for(path)),
            ])
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

#[test]
fn bmc_commands_act_through_the_api_with_a_token_and_are_audited() {
    let rig = Rig::start("pxoob");
    let token = rig.token();
    let mut printed = String::new();
    for args in [
        &["bmc", "power", "on", "node-1"][..],
        &["bmc", "power", "status", "--label", "rack=r3"],
        &["bmc", "power", "cycle", "02:00:00:00:00:10"],
        &["bmc", "bootdev", "pxe", "--all"],
        &["bmc", "info", "node-1"],
    ] {
        let mut full = args.to_vec();
        full.extend(["--token-file", &token]);
        printed.push_str(&rig.ok(&full));
    }
    let json = rig.ok(&[
        "bmc",
        "power",
        "status",
        "node-1",
        "--token-file",
        &token,
        "--format",
        "json",
    ]);
    // Right after a cycle ipmi_sim may still report the host off.
    assert!(
        json.contains("\"result\": \"ok\"") && json.contains("\"power\": \"o"),
        "{json}"
    );
    printed.push_str(&json);
    let calls = rig.sim_state("calls.log");
    assert!(
        calls.contains("set power 1"),
        "power on not recorded: {calls}"
    );
    assert_eq!(rig.sim_state("boot"), "pxe", "calls: {calls}");

    // Without the token, or with a wrong one: refused, nothing reaches the BMC.
    let before = rig.sim_state("calls.log");
    let (ok, out, _) = rig.cli(&["bmc", "power", "off", "node-1"]);
    assert!(!ok && out.contains("bearer token"), "{out}");
    fs::write(rig.sim_dir.path("wrong"), "wrong-token-wrong-token-00\n").unwrap();
    let wrong = rig.sim_dir.path("wrong").display().to_string();
    let (ok, out, _) = rig.cli(&["bmc", "power", "off", "node-1", "--token-file", &wrong]);
    assert!(!ok && out.contains("bearer token"), "{out}");
    assert_eq!(
        rig.sim_state("calls.log"),
        before,
        "a refused call reached the BMC"
    );

    let audit = rig.get("/api/v1/audit");
    for want in [
        r#""caller":"ops","host":"node-1","action":"power","params":{"action":"on"}"#,
        r#""host":"02:00:00:00:00:10","action":"power","params":{"action":"cycle"}"#,
        r#""action":"bootdev","params":{"device":"pxe""#,
    ] {
        assert!(audit.contains(want), "{want} missing from {audit}");
    }
    let hosts = rig.get("/api/v1/hosts");
    assert!(hosts.contains(r#""power":"o"#), "{hosts}");
    assert!(hosts.contains(r#""recovery":"idle""#), "{hosts}");
    printed.push_str(&rig.ok(&["hosts"]));

    // The password is in nothing the agent printed, exported or answered,
    // nor in what the CLI printed.
    let metrics = rig.get("/metrics");
    let log = rig.served.log();
    let audit_file =
        fs::read_to_string(rig.served.dir.path("state").join("audit.jsonl")).unwrap_or_default();
    assert!(
        !audit_file.is_empty(),
        "no audit log in the state directory"
    );
    for (what, text) in [
        ("agent log", &log),
        ("/metrics", &metrics),
        ("/api/v1/audit", &audit),
        ("/api/v1/hosts", &hosts),
        ("audit file", &audit_file),
        ("CLI output", &printed),
    ] {
        assert!(
            !text.contains(PASSWORD),
            "the BMC password is in the {what}:\n{text}"
        );
        assert!(!text.contains(TOKEN), "the API token is in the {what}");
    }
    assert!(
        metrics.contains("pxe_recovery_hosts{state=\"idle\"} 1"),
        "{metrics}"
    );
}

#[test]
fn recover_sets_pxe_and_powers_the_host_up_then_awaits_dhcp() {
    let rig = Rig::start("pxrec");
    let token = rig.token();
    let out = rig.ok(&["recover", "node-1", "--token-file", &token]);
    assert!(out.contains("ok"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let hosts = rig.get("/api/v1/hosts");
        if hosts.contains(r#""recovery":"awaiting-dhcp""#) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not awaiting-dhcp after 20 s: {hosts}\nlog:\n{}",
            rig.served.log()
        );
        thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(rig.sim_state("boot"), "pxe");
    let calls = rig.sim_state("calls.log");
    assert!(
        calls.contains("set power 1"),
        "no power-up recorded: {calls}"
    );
    let log = rig.served.log();
    assert!(log.contains("recovery transition"), "{log}");
    assert!(log.contains("awaiting-dhcp"), "{log}");
    let table = rig.ok(&["hosts"]);
    assert!(table.contains("awaiting-dhcp"), "{table}");
    let audit = rig.get("/api/v1/audit");
    assert!(audit.contains(r#""action":"recover""#), "{audit}");
}

/// A host added to the inventory with `expect_boot` while it runs is asked
/// about, never power-cycled when its deadline passes; one added while it
/// is off is recovered. The agent runs as the DaemonSet runs it.
#[test]
fn a_running_host_added_with_expect_boot_is_left_alone_and_an_off_one_is_recovered() {
    let rig = Rig::start_as("pxadded", Privileges::DaemonSet);
    assert_daemonset_privileges(rig.served.agent_pid());
    let power_file = rig.sim.chassis_dir().join(crate::bmc_sim::POWER_FILE);
    let base = fs::read_to_string(&rig.served.inventory).expect("inventory");
    let (head, _) = base.split_once("hosts:\n").expect("a hosts list");
    let wait_for = |what: &str, present: bool, within: Duration| {
        let deadline = Instant::now() + within;
        loop {
            let hosts = rig.get("/api/v1/hosts");
            if hosts.contains(what) == present {
                return hosts;
            }
            assert!(
                Instant::now() < deadline,
                "{what} {} in {within:?}: {hosts}\nlog:\n{}",
                if present { "not seen" } else { "still there" },
                rig.served.log()
            );
            thread::sleep(Duration::from_millis(200));
        }
    };
    // Takes the host out of the inventory, then adds it with `expect_boot`
    // and `deadline`; returns how much of the BMC's call log came before.
    let add = |deadline: &str| {
        rig.served.replace_inventory(&format!("{head}hosts: []\n"));
        wait_for("02:00:00:00:00:10", false, Duration::from_secs(15));
        let before = rig.sim_state("calls.log").len();
        rig.served.replace_inventory(&format!(
            "{base}    recovery: {{expect_boot: true, deadline: {deadline}, max_attempts: 1}}\n"
        ));
        before
    };

    // The host runs an installed system that does not phone home.
    fs::write(&power_file, "1\n").expect("power on");
    let before = add("3s");
    wait_for(
        r#""recovery_watch":"until-boot-activity""#,
        true,
        Duration::from_secs(15),
    );
    // Well past its deadline: asked whether it runs, nothing else.
    thread::sleep(Duration::from_secs(6));
    let calls = rig.sim_state("calls.log");
    let since = &calls[before..];
    assert!(
        !since.contains("set power") && since.contains("get power"),
        "a running host added to the inventory was acted on: {since}"
    );
    let hosts = rig.get("/api/v1/hosts");
    assert!(hosts.contains(r#""recovery":"idle""#), "{hosts}");
    let table = rig.ok(&["hosts"]);
    assert!(table.contains("idle (running)"), "{table}");

    // Added while off: its deadline counts, and it is recovered as always.
    fs::write(&power_file, "0\n").expect("power off");
    let before = add("4s");
    wait_for(
        r#""recovery":"awaiting-dhcp""#,
        true,
        Duration::from_secs(30),
    );
    let calls = rig.sim_state("calls.log");
    let since = &calls[before..];
    let asked = since
        .find("get power")
        .unwrap_or_else(|| panic!("not asked: {since}"));
    let powered = since
        .find("set power 1")
        .unwrap_or_else(|| panic!("not powered up: {since}"));
    assert!(asked < powered, "{since}");
}

/// A host added with `expect_boot` whose BMC does not answer is never
/// power-cycled on a guess: it stays `checking-power` past its deadline,
/// the BMC's error shown. The agent runs as the DaemonSet runs it.
#[test]
fn a_host_added_with_expect_boot_whose_bmc_does_not_answer_is_left_alone() {
    // Nothing answers at this address on the lab's segment.
    let rig = Rig::launch_as(
        "pxmute",
        "address: ipmi://10.66.0.251:623",
        "    recovery: {expect_boot: true, deadline: 3s, max_attempts: 1}\n",
        &[],
        Privileges::DaemonSet,
    );
    assert_daemonset_privileges(rig.served.agent_pid());
    let deadline = Instant::now() + Duration::from_secs(60);
    let hosts = loop {
        let hosts = rig.get("/api/v1/hosts");
        if hosts.contains(r#""recovery_error""#) {
            break hosts;
        }
        assert!(
            Instant::now() < deadline,
            "no BMC error in 60s: {hosts}\nlog:\n{}",
            rig.served.log()
        );
        thread::sleep(Duration::from_millis(500));
    };
    assert!(
        hosts.contains(r#""recovery_watch":"checking-power""#),
        "{hosts}"
    );
    // Well past its deadline: still only waiting for its BMC to say.
    thread::sleep(Duration::from_secs(6));
    let hosts = rig.get("/api/v1/hosts");
    assert!(
        hosts.contains(r#""recovery":"idle""#)
            && hosts.contains(r#""recovery_watch":"checking-power""#),
        "{hosts}\nlog:\n{}",
        rig.served.log()
    );
    let table = rig.ok(&["hosts"]);
    assert!(table.contains("idle (checking)"), "{table}");
    assert!(!rig.served.log().contains(crate::bmc_sim::PASSWORD));
}

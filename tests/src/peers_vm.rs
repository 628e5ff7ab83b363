//! Two agents as the DaemonSet runs them (`--kube --peers kube`) on one
//! boot lab segment, and one BootHost whose BMC is an `ipmi_sim` powering a
//! real QEMU guest (SeaBIOS and iPXE): its `expect_boot` watch runs out,
//! its owner alone sets PXE and powers it on, the guest boots through
//! whichever agent's OFFER it takes, and the recovery reaches `booted` once
//! (the BootHost's status says so, and names the owner), with no power
//! cycle after the phone-home, however the boot chain and the ownership
//! were split.
//!
//! Agent A runs on the lab's bridge (the boot lab's own agent), agent B in
//! a namespace on the same segment (10.66.0.2), reaching the BMC on A's
//! namespace through A's address. The fake Kubernetes API (the objects,
//! their status, the Leases) listens on A's bridge address, the objects
//! loaded before the agents start.

use std::{
    fs, thread,
    time::{Duration, Instant},
};

use serde_json::Value;
use xtask::vm::{BootLab, BootLabConfig, Firmware, initramfs};

use crate::{
    agent::{Scratch, agent_bin, daemonset_wrapper},
    bmc_lab::{GuestBmc, bmc_ip},
    fixture::assert_root,
    kube_api,
    recovery_vm::plain,
};

const GUEST_MAC: &str = "52:54:00:12:37:01";
const GUEST_IP: &str = "10.66.1.31";
/// Where the fake API listens: agent A's address on the bridge.
const API: &str = "10.66.0.1:6443";
const AGENT_B_CIDR: &str = "10.66.0.2/16";
/// One boot takes 8–25 s under TCG; room for a busy machine.
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

/// The cluster's objects, shaped by the CRDs' schemas. The watch (and,
/// after the script, the phone-home deadline) is long enough for a TCG
/// boot: the power-on comes about 40 s after the start.
const OBJECTS: &str = r#"
apiVersion: pxe-agent.io/v1alpha1
kind: BootNetwork
metadata: {name: lab}
spec:
  subnets:
    - {cidr: 10.66.0.0/16, router: 10.66.0.1, leaseTime: 3600}
---
apiVersion: pxe-agent.io/v1alpha1
kind: BootProfile
metadata: {name: installed}
spec:
  boot: {bios: undionly.kpxe}
  kernel: "http://{server}:8080/artifacts/vmlinuz"
  initrd: ["http://{server}:8080/artifacts/initrd.img"]
  cmdline: "@CMDLINE@"
---
apiVersion: v1
kind: Secret
metadata: {name: bmc-vm-node-2}
type: Opaque
data: {username: YWRtaW4=, password: cHhlLXNpbS1zZWNyZXQ=}
---
apiVersion: pxe-agent.io/v1alpha1
kind: BootHost
metadata: {name: vm-node-2}
spec:
  mac: "52:54:00:12:37:01"
  ip: 10.66.1.31
  hostname: vm-node-2
  profile: installed
  bmc: {address: "ipmi://@BMC@:623", credentialsName: bmc-vm-node-2, bootMode: legacy}
  recovery: {expectBoot: true, deadline: 40s, maxAttempts: 1, afterBoot: disk, stages: {dhcp: 90s}}
"#;

/// The arguments both agents share besides their own and `--kube`.
/// The operator's token in both agents' token file.
const TOKEN: &str = "fedcba9876543210fedcba9876543210";

fn peer_args(node: &str, tokens: &str) -> Vec<String> {
    [
        "--api-token-file",
        tokens,
        "--bmc-boot-flag-echo",
        "device-only",
        "--peers",
        "kube",
        "--pool-slots",
        "2",
        "--peer-lease",
        "2s",
        "--kube-namespace",
        "pxe",
        "--node-name",
        node,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The guest's host as agent `ns` shows it (`None`: the boot lab's agent).
fn host(lab: &BootLab, ns: Option<&str>) -> Value {
    let url = format!("http://{}/api/v1/hosts", xtask::vm::bootlab::API_ADDR);
    let auth = format!("Authorization: Bearer {TOKEN}");
    let out = match ns {
        None => lab
            .cmd("curl")
            .args(["-s", "-m", "2", "-H", &auth, &url])
            .output(),
        Some(ns) => std::process::Command::new("ip")
            .args([
                "netns", "exec", ns, "curl", "-s", "-m", "2", "-H", &auth, &url,
            ])
            .output(),
    }
    .expect("curl");
    serde_json::from_slice::<Value>(&out.stdout)
        .ok()
        .and_then(|v| v.as_array()?.first().cloned())
        .unwrap_or(Value::Null)
}

#[test]
fn two_agents_recover_a_guest_once_whichever_serves_its_boot() {
    assert_root();
    let dir = Scratch::new("pxpeervm-files");
    fs::write(dir.path("tokens"), format!("ops {TOKEN}\n")).expect("tokens");
    fs::write(
        dir.path("kubeconfig"),
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{API}\n\
             users:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, \
             user: fake, namespace: pxe}}\ncurrent-context: fake\n"
        ),
    )
    .expect("kubeconfig");
    let cmdline = format!("{} {}", initramfs::PROFILE_CMDLINE, initramfs::STAY_PARAM);
    let objects = OBJECTS
        .replace("@CMDLINE@", &cmdline)
        .replace("@BMC@", &bmc_ip(0));
    fs::write(dir.path("objects.yaml"), objects).expect("objects");
    let (kubeconfig, tokens, preload) = (
        dir.path("kubeconfig").display().to_string(),
        dir.path("tokens").display().to_string(),
        format!("pxe={}", dir.path("objects.yaml").display()),
    );
    let api = kube_api::fake_api_bin().display().to_string();
    // The file inventory is not read (`--kube`).
    let mut cfg = BootLabConfig::new("pxpeervm", &agent_bin(), "")
        .bridge(1)
        .kube()
        .helper("kube-api", &[&api, "--listen", API, "--objects", &preload])
        .env("KUBECONFIG", &kubeconfig)
        .wrapper(daemonset_wrapper());
    for arg in peer_args("node-a", &tokens) {
        cfg = cfg.arg(&arg);
    }
    let mut lab = BootLab::start(&cfg).unwrap_or_else(|e| panic!("boot lab: {e:#}"));
    let b = lab
        .add_segment_ns("agentb", Some(AGENT_B_CIDR))
        .expect("agent B's namespace");
    let ns_cmd = |args: &[&str]| {
        let ok = std::process::Command::new("ip")
            .args(["netns", "exec", &b])
            .args(args)
            .status()
            .expect("run")
            .success();
        assert!(ok, "{args:?} in {b}");
    };
    // The BMC is on A's loopback; B reaches it through A's address.
    ns_cmd(&["ip", "route", "add", "10.67.0.0/24", "via", "10.66.0.1"]);
    let spec = lab.vm_spec("peerguest", GUEST_MAC, Firmware::Bios, 0);
    let bmc = GuestBmc::start(&lab, 0, spec);
    let (agent, state_b) = (
        agent_bin().display().to_string(),
        lab.dir().join("state-b").display().to_string(),
    );
    let (root, artifacts) = (
        lab.boot_root().display().to_string(),
        lab.artifacts().display().to_string(),
    );
    let env = format!("KUBECONFIG={kubeconfig}");
    let mut b_args: Vec<String> = vec!["env".to_owned(), env];
    b_args.extend(daemonset_wrapper());
    b_args.extend(
        [
            &agent,
            "run",
            "--interface",
            "pxcli0",
            "--kube",
            "--state-dir",
            &state_b,
            "--boot-root",
            &root,
            "--artifacts",
            &artifacts,
            "--xdp-mode",
            "skb",
        ]
        .map(str::to_owned),
    );
    b_args.extend(peer_args("node-b", &tokens));
    let b_args: Vec<&str> = b_args.iter().map(String::as_str).collect();
    lab.spawn_helper_in(&b, "agent-b", &b_args)
        .expect("agent B");
    let context = |lab: &BootLab| {
        format!(
            "--- chassis calls ---\n{}\n--- console ---\n{}\n--- agent A ---\n{}\n--- agent B ---\n{}",
            bmc.sim().state("calls.log"),
            bmc.guest().console_tail(20),
            lab.agent_log_tail(30),
            lab.helper_log("agent-b")
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .join("\n"),
        )
    };

    // Both agents see each other and name one owner.
    let started = Instant::now();
    let owner = loop {
        let (a, bv) = (host(&lab, None), host(&lab, Some(&b)));
        if a["owner"].is_string() && a["owner"] == bv["owner"] {
            break a["owner"].as_str().unwrap_or_default().to_owned();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no agreed owner: {} / {}\n{}",
            a["owner"],
            bv["owner"],
            context(&lab)
        );
        thread::sleep(Duration::from_millis(200));
    };
    println!("owner of {GUEST_MAC}: {owner}");

    // The watch runs out; the owner powers the guest on; it boots.
    let boots = bmc.guest().wait_boots(1, Duration::from_secs(90));
    assert_eq!(boots.len(), 1, "not powered on\n{}", context(&lab));
    let report = bmc.guest().wait_phoned_home(BOOT_TIMEOUT);
    println!("{}", report.summary());
    assert!(
        report.phoned_home && report.ip.as_deref() == Some(GUEST_IP),
        "the guest did not boot\n{}",
        context(&lab)
    );
    let booted = Instant::now();
    loop {
        let (a, bv) = (host(&lab, None), host(&lab, Some(&b)));
        if a["recovery"] == "booted" && bv["recovery"] == "booted" {
            break;
        }
        assert!(
            booted.elapsed() < Duration::from_secs(15),
            "not booted on both: {} / {}\n{}",
            a["recovery"],
            bv["recovery"],
            context(&lab)
        );
        thread::sleep(Duration::from_millis(200));
    }
    // A step another agent saw ends in "(seen by <node>)" in the view.
    let script = host(&lab, None)["progress"]["script"]["detail"].clone();
    println!(
        "booted on both agents {:.1} s after the phone-home; agent A's view of the script \
         fetch: {script}",
        booted.elapsed().as_secs_f64(),
    );
    // Long enough for a wrong recovery by either agent to show.
    thread::sleep(Duration::from_secs(8));
    let calls = bmc.sim().state("calls.log");
    let count = |needle: &str| calls.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(
        (
            count("set boot pxe"),
            bmc.sim().power_ons().len(),
            count("set power 0")
        ),
        (1, 1, 0),
        "one PXE set, one power-on, no power cycle\n{}",
        context(&lab)
    );
    assert_eq!(bmc.guest().boots().len(), 1, "{}", context(&lab));
    let logs = [plain(&lab.agent_log()), plain(&lab.helper_log("agent-b"))];
    let to_booted: usize = logs.iter().map(|l| l.matches("to=booted").count()).sum();
    assert_eq!(to_booted, 1, "one transition to booted\n{}", context(&lab));
    // The BootHost, as the cluster holds it: booted at attempt 1, its owner
    // named, written by the owner.
    let status = loop {
        let out = lab
            .cmd("curl")
            .args(["-s", "-m", "2"])
            .arg(format!(
                "http://{API}/apis/pxe-agent.io/v1alpha1/namespaces/pxe/boothosts/vm-node-2"
            ))
            .output()
            .expect("curl");
        let object: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let status = object["status"].clone();
        if status["recovery"]["state"] == "booted" {
            break status;
        }
        assert!(
            booted.elapsed() < Duration::from_secs(30),
            "the BootHost's status never said booted: {status}\n{}",
            context(&lab)
        );
        thread::sleep(Duration::from_millis(200));
    };
    println!("BootHost status: {status}");
    assert_eq!(status["recovery"]["attempts"], 1, "{status}");
    assert_eq!(status["owner"], owner.as_str(), "{status}");
    assert_eq!(status["servingNode"], owner.as_str(), "{status}");
}

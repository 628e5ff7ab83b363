//! The runtime image as the DaemonSet runs it: the image is assembled
//! without a registry (`xtask::rootfs`: a Debian root from mmdebstrap plus
//! the agent under test), imported into a scratch podman, and run with the
//! pod spec of `deploy/base/daemonset.yaml` translated to podman: its
//! arguments, volume mounts, capabilities, read-only root, no privilege
//! escalation, seccomp profile and host network, the "host" being the boot
//! lab's server namespace. Only what needs an API server differs: the
//! inventory is a file mounted read-only instead of `--kube` (and no
//! `--peers=kube`), and the JSON API listens on loopback without
//! `--api-auth=kubernetes` (the `api_access` and `api_kube_auth` tests
//! cover those).
//!
//! From outside, the test checks the agent's capabilities, `no_new_privs`,
//! read-only root and pins; then a UEFI guest network-boots through the
//! containerised agent: DHCP from the fast path, ipxe.efi over TFTP from
//! the image's own boot root, the iPXE script, kernel and initrd over HTTP,
//! and the phone-home. The agent must log JSON and exit 0 on SIGTERM.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use serde_norway::Value;
use xtask::{
    rootfs,
    vm::{BootLab, BootLabConfig, Firmware},
};

use crate::{
    agent::{agent_bin, assert_daemonset_privileges, daemonset_capabilities},
    boot_vm::{
        WORKER_IP, WORKER_MAC, assert_fast_path_answered_twice,
        assert_worker_booted_through_script, boot, inventory, require_tftp, stats, uefi_pxe_steps,
    },
    fixture::assert_root,
    mount::Mount,
    podman::Podman,
};

const IMAGE: &str = "localhost/pxe-agent:test";
/// Debian's podman default seccomp profile (golang-github-containers-common).
const DEBIAN_SECCOMP: &str = "/usr/share/containers/seccomp.json";
/// Where the inventory file is mounted in place of `--kube`.
const INVENTORY_PATH: &str = "/etc/pxe-agent/inventory.yaml";
/// `NODE_NAME`, which the DaemonSet takes from the pod's node: it names
/// the file of `--interface-dir` that lists the lab's interface.
const NODE_NAME: &str = "lab-node";

/// The agent's container in the DaemonSet, as read from the manifest.
struct PodSpec {
    args: Vec<String>,
    /// (volume name, mount path, read-only, propagation).
    mounts: Vec<(String, String, bool, Option<String>)>,
    env: Vec<String>,
    host_network: bool,
    read_only_root: bool,
    no_new_privileges: bool,
    user: u64,
    /// The pod's `seccompProfile` type.
    seccomp: String,
}

fn daemonset() -> PodSpec {
    let path = xtask::workspace_root().join("deploy/base/daemonset.yaml");
    let text = fs::read_to_string(&path).expect("read the DaemonSet manifest");
    let doc: Value = serde_norway::from_str(&text).expect("DaemonSet YAML");
    let pod = &doc["spec"]["template"]["spec"];
    let agent = pod["containers"]
        .as_sequence()
        .expect("containers")
        .iter()
        .find(|c| c["name"].as_str() == Some("pxe-agent"))
        .expect("the pxe-agent container");
    let strings = |v: &Value| -> Vec<String> {
        v.as_sequence()
            .map(|s| {
                s.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let security = &agent["securityContext"];
    PodSpec {
        args: strings(&agent["args"]),
        mounts: agent["volumeMounts"]
            .as_sequence()
            .expect("volumeMounts")
            .iter()
            .map(|m| {
                (
                    m["name"].as_str().expect("volume name").to_owned(),
                    m["mountPath"].as_str().expect("mountPath").to_owned(),
                    m["readOnly"].as_bool().unwrap_or(false),
                    m["mountPropagation"].as_str().map(str::to_owned),
                )
            })
            .collect(),
        env: agent["env"]
            .as_sequence()
            .map(|s| {
                s.iter()
                    .filter_map(|e| e["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
        host_network: pod["hostNetwork"].as_bool() == Some(true),
        read_only_root: security["readOnlyRootFilesystem"].as_bool() == Some(true),
        no_new_privileges: security["allowPrivilegeEscalation"].as_bool() == Some(false),
        user: security["runAsUser"].as_u64().expect("runAsUser"),
        seccomp: pod["securityContext"]["seccompProfile"]["type"]
            .as_str()
            .expect("seccompProfile")
            .to_owned(),
    }
}

/// The DaemonSet's arguments with a mounted inventory file instead of the
/// Kubernetes sources: `--kube` becomes `--inventory`, `--peers=kube` and
/// `--api-auth=kubernetes` go, and the API listens on loopback.
fn agent_args(spec: &PodSpec) -> Vec<String> {
    let kube_only = ["--peers=kube", "--api-auth=kubernetes"];
    assert!(
        spec.args.iter().any(|a| a == "--kube")
            && kube_only.iter().all(|k| spec.args.iter().any(|a| a == k)),
        "the DaemonSet's arguments changed: {:?}",
        spec.args
    );
    spec.args
        .iter()
        .filter(|a| !kube_only.contains(&a.as_str()))
        .map(|a| match a.as_str() {
            "--kube" => format!("--inventory={INVENTORY_PATH}"),
            a if a.starts_with("--api-addr=") => "--api-addr=127.0.0.1:9465".to_string(),
            _ => a.to_string(),
        })
        .collect()
}

/// The value of the DaemonSet's `--<flag>=VALUE`.
fn arg_value<'a>(spec: &'a PodSpec, flag: &str) -> &'a str {
    spec.args
        .iter()
        .find_map(|a| a.strip_prefix(&format!("--{flag}=")))
        .unwrap_or_else(|| panic!("the DaemonSet passes no --{flag}"))
}

/// The lab's directories standing in for the node's volumes.
struct Volumes {
    bpffs: PathBuf,
    state: PathBuf,
    interfaces: PathBuf,
    artifacts: PathBuf,
}

impl Volumes {
    /// Makes the host side of each volume in `lab` (the bpffs is the test's).
    fn prepare(lab: &BootLab, bpffs: &Path) -> Volumes {
        let volumes = Volumes {
            bpffs: bpffs.to_path_buf(),
            state: lab.dir().join("state"),
            interfaces: lab.dir().join("interfaces"),
            artifacts: lab.artifacts(),
        };
        fs::create_dir_all(&volumes.state).expect("state dir");
        fs::create_dir_all(&volumes.interfaces).expect("interfaces dir");
        fs::write(volumes.interfaces.join(NODE_NAME), lab.iface()).expect("interface file");
        volumes
    }

    fn host_path(&self, volume: &str) -> &Path {
        match volume {
            "bpffs" => &self.bpffs,
            "state" => &self.state,
            "interfaces" => &self.interfaces,
            "artifacts" => &self.artifacts,
            other => {
                panic!("the DaemonSet mounts volume {other}, which this test does not provide")
            }
        }
    }
}

/// `podman run` of the image in the lab's server namespace with the pod
/// spec of the DaemonSet; the agent's output is the container's.
fn podman_run(podman: &Podman, lab: &BootLab, name: &str, bpffs: &Path) -> Command {
    let spec = daemonset();
    assert!(
        spec.host_network,
        "the DaemonSet's pod no longer uses hostNetwork"
    );
    let volumes = Volumes::prepare(lab, bpffs);
    let mut cmd = podman.cmd_in_netns(lab.server_ns());
    cmd.args(["run", "--name", name, "--network=host"])
        .arg(format!("--cgroup-parent={}", podman.cgroup_parent()))
        .arg(format!("--user={}", spec.user))
        .arg("--cap-drop=all");
    for cap in daemonset_capabilities() {
        cmd.arg(format!("--cap-add={cap}"));
    }
    if spec.no_new_privileges {
        cmd.arg("--security-opt=no-new-privileges");
    }
    assert_eq!(
        spec.seccomp, "RuntimeDefault",
        "the DaemonSet's seccomp profile changed"
    );
    let seccomp = lab.dir().join("seccomp.json");
    runtime_default_seccomp(&seccomp);
    cmd.arg(format!("--security-opt=seccomp={}", seccomp.display()));
    if spec.read_only_root {
        // As readOnlyRootFilesystem: no tmpfs on /run and /tmp either.
        cmd.args(["--read-only", "--read-only-tmpfs=false"]);
    }
    for (volume, path, read_only, propagation) in &spec.mounts {
        let mut options = Vec::new();
        if *read_only {
            options.push("ro");
        }
        match propagation.as_deref() {
            Some("HostToContainer") => options.push("rslave"),
            Some(other) => panic!("mountPropagation {other} has no podman option here"),
            None => {}
        }
        let host = volumes.host_path(volume).display();
        let options = if options.is_empty() {
            String::new()
        } else {
            format!(":{}", options.join(","))
        };
        cmd.arg(format!("--volume={host}:{path}{options}"));
    }
    cmd.arg(format!(
        "--volume={}:{INVENTORY_PATH}:ro",
        lab.inventory_path().display()
    ));
    for var in &spec.env {
        match var.as_str() {
            "NODE_NAME" => cmd.arg(format!("--env=NODE_NAME={NODE_NAME}")),
            "POD_NAMESPACE" => cmd.arg("--env=POD_NAMESPACE=pxe-system"),
            // Only --api-addr uses it, which the test sets to loopback.
            "POD_IP" => cmd.arg("--env=POD_IP=127.0.0.1"),
            other => panic!("the DaemonSet sets {other}, which this test does not"),
        };
    }
    cmd.arg(IMAGE).args(agent_args(&spec));
    cmd
}

/// The DaemonSet's `RuntimeDefault` seccomp profile as current runtimes
/// have it, written to `path`: Debian's podman default with the change that
/// allows bpf() to CAP_BPF and perf_event_open() to CAP_PERFMON
/// (containers/common 6dd328a2 and daa81f13, 2024; moby 7b7d1132, 2022).
/// Debian's own (containers-common 0.50) still ties both to CAP_SYS_ADMIN,
/// so under it the agent fails with EPERM, as the DaemonSet's
/// `seccompProfile` comment says of older runtimes.
fn runtime_default_seccomp(path: &Path) {
    let text = fs::read_to_string(DEBIAN_SECCOMP)
        .unwrap_or_else(|e| panic!("{DEBIAN_SECCOMP} (podman's default profile): {e}"));
    let mut profile: serde_json::Value = serde_json::from_str(&text).expect("seccomp JSON");
    let rules = profile["syscalls"].as_array_mut().expect("syscalls");
    let gated = ["bpf", "perf_event_open"];
    for rule in rules.iter_mut() {
        let denies_without_sys_admin = rule["action"] == "SCMP_ACT_ERRNO"
            && rule["excludes"]["caps"] == serde_json::json!(["CAP_SYS_ADMIN"]);
        if denies_without_sys_admin {
            let names = rule["names"].as_array_mut().expect("names");
            names.retain(|n| !gated.iter().any(|g| n == g));
        }
    }
    for (syscall, cap) in [("bpf", "CAP_BPF"), ("perf_event_open", "CAP_PERFMON")] {
        rules.push(serde_json::json!({
            "names": [syscall],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": 1,
            "excludes": {"caps": ["CAP_SYS_ADMIN", cap]},
        }));
        rules.push(serde_json::json!({
            "names": [syscall],
            "action": "SCMP_ACT_ALLOW",
            "includes": {"caps": [cap]},
        }));
    }
    fs::write(path, profile.to_string()).expect("write the seccomp profile");
}

/// The imported image has the Containerfile's configuration.
fn assert_image_config(podman: &Podman) {
    let config: serde_json::Value = serde_json::from_str(&podman.run(&[
        "image",
        "inspect",
        "--format",
        "{{json .Config}}",
        IMAGE,
    ]))
    .expect("image config JSON");
    let json_list = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
    assert_eq!(
        config["Entrypoint"],
        json_list(rootfs::ENTRYPOINT),
        "{config}"
    );
    assert_eq!(config["Cmd"], json_list(rootfs::CMD), "{config}");
    assert_eq!(config["User"], rootfs::USER, "{config}");
    for (key, value) in rootfs::LABELS {
        assert_eq!(config["Labels"][key], *value, "{config}");
    }
}

/// The agent's root file system is mounted read-only.
fn assert_read_only_root(pid: u32) {
    let mountinfo = fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
    let root = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .unwrap_or_else(|| panic!("no / in the agent's mountinfo:\n{mountinfo}"));
    let options = root.split_whitespace().nth(5).unwrap_or_default();
    assert!(
        options.split(',').any(|o| o == "ro"),
        "the agent's root is writable: {root}"
    );
}

/// Every line of the agent's log is a JSON object (`--log-format=json`);
/// returns them.
fn json_log(lab: &BootLab) -> Vec<serde_json::Value> {
    lab.agent_log()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("log line is not JSON ({e}): {l}"))
        })
        .collect()
}

#[test]
fn daemonset_image_under_podman_network_boots_a_uefi_guest() {
    assert_root();
    let spec = daemonset();
    let started = Instant::now();
    let podman = Podman::new("image");
    let tarball = rootfs::build(&agent_bin()).unwrap_or_else(|e| {
        panic!("the image root (`cargo xtask setup` installs mmdebstrap): {e:#}")
    });
    let built = started.elapsed();
    podman.import(&tarball, IMAGE, &rootfs::image_changes());
    eprintln!(
        "image root ready after {:.1}s, imported after {:.1}s",
        built.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert_image_config(&podman);

    let bpffs = Mount::new("image", "bpf", None);
    let name = format!("pxe-agent-{}", std::process::id());
    let cfg = BootLabConfig::new("pxvmimg", &agent_bin(), &inventory(""));
    let lab = BootLab::start_launched(&cfg, |lab| {
        Ok(podman_run(&podman, lab, &name, bpffs.path()))
    })
    .unwrap_or_else(|e| panic!("the containerised agent: {e:#}"));
    eprintln!(
        "agent healthy after {:.1}s",
        started.elapsed().as_secs_f64()
    );

    let pid: u32 = podman
        .run(&["inspect", "--format", "{{.State.Pid}}", &name])
        .trim()
        .parse()
        .expect("the container's PID");
    assert_daemonset_privileges(pid);
    assert_read_only_root(pid);
    // The agent pinned its program and link into the node's bpffs.
    let pins = bpffs.path().join(
        Path::new(arg_value(&spec, "pin-dir"))
            .strip_prefix("/sys/fs/bpf")
            .expect("the pin dir is in /sys/fs/bpf"),
    );
    for pin in ["link", "program"] {
        let path = pins.join(lab.iface()).join(pin);
        assert!(path.exists(), "{} not pinned", path.display());
    }

    require_tftp(&lab);
    let (vm, report) = boot(&lab, "image", WORKER_MAC, Firmware::UefiPxe, WORKER_IP);
    eprintln!("guest booted after {:.1}s", started.elapsed().as_secs_f64());
    assert_worker_booted_through_script(&lab, &vm, &report, uefi_pxe_steps());
    assert_fast_path_answered_twice(&lab);
    // ipxe.efi came from the image's boot root, over TFTP.
    let boot_root = arg_value(&spec, "boot-root");
    let ipxe_efi = fs::metadata(format!("/proc/{pid}/root{boot_root}/ipxe.efi"))
        .expect("ipxe.efi in the image's boot root")
        .len();
    let counters = stats(&lab);
    let counter = |name: &str| counters.get(name).copied().unwrap_or(0);
    assert!(
        counter("pxe_tftp_transfers_total{outcome=\"done\"}") >= 1
            && counter("pxe_tftp_bytes_total") >= ipxe_efi,
        "no TFTP transfer of ipxe.efi ({ipxe_efi} bytes): {counters:?}"
    );

    let log = json_log(&lab);
    let attached = log
        .iter()
        .find(|l| l["message"] == "XDP program attached")
        .unwrap_or_else(|| panic!("no XDP attach in the log:\n{}", lab.agent_log_tail(30)));
    assert_eq!(attached["iface"], lab.iface(), "{attached}");
    // The lease store is on the state volume, on the "node".
    let state = lab.dir().join("state");
    let stored = fs::read_dir(&state).map_or(0, |d| d.count());
    assert!(stored > 0, "the agent wrote nothing to {}", state.display());

    // The kubelet's way to end a pod: SIGTERM, then wait for the exit.
    podman.run(&["stop", "--time", "20", &name]);
    let exit = podman.run(&["inspect", "--format", "{{.State.ExitCode}}", &name]);
    assert_eq!(
        exit.trim(),
        "0",
        "the agent did not exit cleanly on SIGTERM:\n{}",
        lab.agent_log_tail(20)
    );
    eprintln!("done after {:.1}s", started.elapsed().as_secs_f64());
}

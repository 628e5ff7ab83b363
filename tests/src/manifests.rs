//! The Kubernetes manifests under `deploy/`: every kustomization (the base
//! and each overlay) is built with `kubectl kustomize` and validated
//! strictly against the Kubernetes 1.33 schemas by kubernetes-validate, and
//! `deploy/tests/check_crds.py` validates the custom resources against the
//! CRDs' schemas, checks that the bad objects are rejected, and that each
//! DaemonSet's flags, mounts, ports and capabilities agree.
//!
//! No cluster and no root: these only need kubectl and the Python tools
//! `cargo xtask setup` installs, and fail when either is missing.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use crate::agent::Scratch;

/// The Kubernetes version the manifests are validated against.
const KUBERNETES: &str = "1.33";

/// Kinds kubernetes-validate has no schema for (it warns and passes them):
/// `check_crds.py` validates each of them instead.
const CHECKED_BY_CHECK_CRDS: &[&str] = &[
    "BootHost",
    "BootProfile",
    "BootNetwork",
    "PodMonitor",
    "SecurityContextConstraints",
];

fn deploy_dir() -> PathBuf {
    xtask::workspace_root().join("deploy")
}

/// `deploy/base` and every directory under `deploy/overlays` holding a
/// kustomization, so that a new overlay is validated without a new test.
fn kustomizations() -> Vec<PathBuf> {
    let deploy = deploy_dir();
    let mut dirs = vec![deploy.join("base")];
    let overlays = deploy.join("overlays");
    let mut found = fs::read_dir(&overlays)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", overlays.display()))
        .map(|entry| entry.expect("overlay entry").path())
        .filter(|dir| dir.join("kustomization.yaml").is_file())
        .collect::<Vec<_>>();
    found.sort();
    assert!(!found.is_empty(), "no overlay in {}", overlays.display());
    dirs.extend(found);
    dirs
}

fn python_bin(name: &str) -> PathBuf {
    let venv = xtask::setup::python_tools_dir().expect("cache directory");
    let bin = venv.join("bin").join(name);
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo xtask setup`, which installs kubernetes-validate \
         and jsonschema into {}",
        bin.display(),
        venv.display()
    );
    bin
}

fn run(cmd: &mut Command) -> Output {
    let program = cmd.get_program().to_string_lossy().into_owned();
    cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run {program}: {e}; the manifest tests need kubectl (with Kustomize v5) \
             on PATH and the Python tools of `cargo xtask setup`"
        )
    })
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `kubectl kustomize DIR`, written to `out`.
fn build(dir: &Path, out: &Path) {
    let built = run(Command::new("kubectl").arg("kustomize").arg(dir));
    assert!(
        built.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        text(&built.stderr)
    );
    fs::write(out, &built.stdout).expect("write the built manifests");
}

/// The name `deploy/overlays/example` is built under: `overlay-example.yaml`.
fn built_name(dir: &Path) -> String {
    let name = dir.file_name().unwrap().to_string_lossy();
    if name == "base" {
        "base.yaml".to_owned()
    } else {
        format!("overlay-{name}.yaml")
    }
}

/// Runs kubernetes-validate on `file`; returns its problems (errors, and
/// warnings other than "no schema" for the kinds `check_crds.py` checks)
/// and the number of resources it passed.
pub(crate) fn validate(file: &Path) -> (Vec<String>, usize) {
    let out = run(Command::new(python_bin("kubernetes-validate"))
        .args(["--strict", "-k", KUBERNETES])
        .arg(file));
    let report = text(&out.stdout) + &text(&out.stderr);
    let mut problems = Vec::new();
    let mut passed = 0;
    for line in report.lines() {
        if line.starts_with("INFO") && line.contains(" passed for resource ") {
            passed += 1;
        } else if line.starts_with("WARN") {
            let known = CHECKED_BY_CHECK_CRDS
                .iter()
                .any(|kind| line.contains(&format!("Couldn't find schema for kind {kind} ")));
            if !known {
                problems.push(line.to_owned());
            }
        } else if !line.trim().is_empty() && !line.starts_with("INFO") {
            problems.push(line.to_owned());
        }
    }
    if !out.status.success() && problems.is_empty() {
        problems.push(format!(
            "kubernetes-validate failed ({}):\n{report}",
            out.status
        ));
    }
    (problems, passed)
}

fn check_crds(deploy: &Path, built: &[PathBuf]) -> Output {
    run(Command::new(python_bin("python"))
        .arg(deploy.join("tests").join("check_crds.py"))
        .arg(deploy)
        .args(built))
}

#[test]
fn every_kustomization_validates_strictly_against_kubernetes_1_33() {
    let scratch = Scratch::new("manifests");
    let mut failures = Vec::new();
    for dir in kustomizations() {
        let file = scratch.path(&built_name(&dir));
        build(&dir, &file);
        let (problems, passed) = validate(&file);
        // Namespace, CRDs, RBAC, ConfigMap and DaemonSet at the least.
        if passed < 8 {
            failures.push(format!("{}: only {passed} resources passed", dir.display()));
        }
        failures.extend(
            problems
                .into_iter()
                .map(|p| format!("{}: {p}", dir.display())),
        );
    }
    assert!(
        failures.is_empty(),
        "manifests do not validate against Kubernetes {KUBERNETES}:\n{}",
        failures.join("\n")
    );
}

#[test]
fn custom_resources_match_their_crds_and_bad_objects_are_rejected() {
    let scratch = Scratch::new("manifests");
    let built = kustomizations()
        .iter()
        .map(|dir| {
            let file = scratch.path(&built_name(dir));
            build(dir, &file);
            file
        })
        .collect::<Vec<_>>();
    let out = check_crds(&deploy_dir(), &built);
    let report = text(&out.stdout) + &text(&out.stderr);
    assert!(out.status.success(), "check_crds.py failed:\n{report}");
    // Each CRD, the examples, every bad object and the foreign kinds ran.
    for expected in [
        "BootHost is structural",
        "examples/boothosts.yaml: BootHost/node-1 is valid",
        "BootHost/password-in-spec is rejected",
        "examples/boothosts.yaml: BootHost/node-4 is valid",
        "BootHost/bad-fallback-address is rejected",
        "BootNetwork/bad-discovery-policy is rejected",
        "overlay-example.yaml: BootHost/node-1 is valid",
        "overlay-openshift.yaml: SecurityContextConstraints/pxe-agent is valid",
        "base.yaml: PodMonitor/pxe-agent is valid",
        "overlay-example.yaml: the DaemonSet's flags, mounts and ports agree",
    ] {
        assert!(
            report.contains(expected),
            "check_crds.py did not report {expected:?}:\n{report}"
        );
    }
}

/// The checks can fail: a copy of deploy/ with one broken example, and a
/// built manifest with a misspelt field, are refused.
#[test]
fn a_broken_example_and_a_misspelt_field_are_refused() {
    let scratch = Scratch::new("manifests");
    let copy = scratch.path("deploy");
    copy_dir(&deploy_dir(), &copy);
    let hosts = copy.join("examples").join("boothosts.yaml");
    let original = fs::read_to_string(&hosts).expect("read example");
    let broken = original.replacen("\"52:54:00:12:34:56\"", "\"52:54:00:12:34\"", 1);
    assert_ne!(broken, original, "the example's first MAC moved");
    fs::write(&hosts, broken).expect("write the broken example");
    let out = check_crds(&copy, &[]);
    let report = text(&out.stdout);
    assert!(
        !out.status.success() && report.contains("FAIL  examples/boothosts.yaml: BootHost/node-1"),
        "check_crds.py accepted a MAC with five octets:\n{report}"
    );

    let file = scratch.path("misspelt.yaml");
    build(&deploy_dir().join("base"), &file);
    let manifests = fs::read_to_string(&file).expect("read the build");
    let misspelt = manifests.replacen("hostNetwork: true", "hostNetwrk: true", 1);
    assert_ne!(misspelt, manifests, "the DaemonSet has no hostNetwork");
    fs::write(&file, misspelt).expect("write the misspelt build");
    let (problems, _) = validate(&file);
    assert!(
        problems.iter().any(|p| p.contains("hostNetwrk")),
        "kubernetes-validate --strict accepted an unknown DaemonSet field: {problems:?}"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("create the copy");
    for entry in fs::read_dir(from).expect("read deploy/") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}

/// `pxe-agent check PATH... [--secrets PATH]`: its exit status and output
/// (stdout then stderr).
fn agent_check(args: &[&Path]) -> (bool, String) {
    let out = run(Command::new(crate::agent::agent_bin())
        .arg("check")
        .args(args));
    (out.status.success(), text(&out.stdout) + &text(&out.stderr))
}

/// Two Secrets as a cluster would hold them for the examples' BMCs.
const EXAMPLE_SECRETS: &str = "\
apiVersion: v1
kind: Secret
metadata: {name: bmc-node-1}
stringData: {username: admin, password: example-only}
---
apiVersion: v1
kind: Secret
metadata: {name: bmc-node-4}
data: {username: YWRtaW4=, password: ZXhhbXBsZS1vbmx5}
";

/// Every shipped example passes `pxe-agent check`, read as `run` and `run
/// --kube` read them: the README's inventory file, the example objects
/// (with their Secrets), and each kustomization as built, where the
/// agent's RBAC says which Secrets it may read.
#[test]
fn every_shipped_example_passes_the_agents_own_check() {
    let scratch = Scratch::new("manifests");
    let root = xtask::workspace_root();
    let secrets = scratch.path("secrets.yaml");
    fs::write(&secrets, EXAMPLE_SECRETS).expect("write the Secrets");
    let inventory = root.join("examples").join("inventory.yaml");
    let examples = deploy_dir().join("examples");
    let (ok, out) = agent_check(&[&inventory, &examples, Path::new("--secrets"), &secrets]);
    assert!(ok, "check refused a shipped example:\n{out}");
    assert!(
        out.contains("examples/inventory.yaml: ok, 4 hosts"),
        "{out}"
    );
    assert!(
        out.contains("8 objects") && out.contains("ok, 4 hosts"),
        "{out}"
    );
    assert!(!out.contains("not checked"), "{out}");
    for dir in kustomizations() {
        let file = scratch.path(&built_name(&dir));
        build(&dir, &file);
        let (ok, out) = agent_check(&[&file]);
        assert!(ok, "check refused {} as built:\n{out}", dir.display());
    }
}

/// Each way the examples had been broken is refused, naming file, line,
/// object and field: a MAC two BootHosts use, a recovery block on a host
/// without a BMC, and a Secret the agent's Role does not let it read.
#[test]
fn check_refuses_a_duplicate_mac_recovery_without_a_bmc_and_an_unreadable_secret() {
    let scratch = Scratch::new("manifests");
    let copy = scratch.path("examples");
    copy_dir(&deploy_dir().join("examples"), &copy);
    let hosts = copy.join("boothosts.yaml");
    let original = fs::read_to_string(&hosts).expect("read example");
    // The line of the document holding `needle`: its `apiVersion`.
    let line_of = |text: &str, needle: &str| {
        let at = text.find(needle).expect("needle");
        let starts = text[..at].lines().enumerate();
        let (index, _) = starts
            .filter(|(_, l)| l.starts_with("apiVersion:"))
            .last()
            .expect("a document start");
        index + 1
    };

    let duplicate = original.replacen("\"52:54:00:12:34:5a\"", "\"52:54:00:12:34:59\"", 1);
    assert_ne!(duplicate, original, "node-4's MAC moved");
    fs::write(&hosts, &duplicate).expect("write");
    let (ok, out) = agent_check(&[&copy]);
    let line = line_of(&duplicate, "name: node-4");
    let want = format!(
        "{}:{line}: BootHost node-4: host node-4 (52:54:00:12:34:59): field mac: \
         52:54:00:12:34:59 is used by both",
        hosts.display()
    );
    assert!(!ok && out.contains(&want), "wanted {want:?} in:\n{out}");

    let bare = original.replacen(
        "  profile: worker\n  labels: {rack: r2}",
        "  profile: worker\n  labels: {rack: r2}\n  recovery: {expectBoot: false}",
        1,
    );
    assert_ne!(bare, original, "node-2 moved");
    fs::write(&hosts, &bare).expect("write");
    let (ok, out) = agent_check(&[&copy]);
    let want = format!(
        "{}:{}: BootHost node-2: host node-2 (52:54:00:12:34:57): field bmc: is required \
         with a recovery block",
        hosts.display(),
        line_of(&bare, "name: node-2")
    );
    assert!(!ok && out.contains(&want), "wanted {want:?} in:\n{out}");

    let built = scratch.path("overlay-example.yaml");
    build(&deploy_dir().join("overlays").join("example"), &built);
    let manifests = fs::read_to_string(&built).expect("read the build");
    let narrowed = manifests.replacen("  - bmc-node-4\n", "", 1);
    assert_ne!(narrowed, manifests, "the Role no longer names bmc-node-4");
    fs::write(&built, &narrowed).expect("write");
    let (ok, out) = agent_check(&[&built]);
    let want = format!(
        "{}:{}: BootHost node-4: bmc.credentialsName: Secret pxe-lab/bmc-node-4 not found",
        built.display(),
        line_of(&narrowed, "name: node-4")
    );
    assert!(
        !ok && out.contains(&want)
            && out.contains("Secret bmc-node-4: the agent's ServiceAccount may not read it"),
        "wanted {want:?} in:\n{out}"
    );
}

/// `check --boot-root --artifacts` finds every file the example inventory
/// names where `run` would serve it from, and names the field of one that
/// is missing.
#[test]
fn check_finds_the_files_the_profiles_name_under_the_roots_given() {
    let scratch = Scratch::new("manifests");
    let inventory = xtask::workspace_root()
        .join("examples")
        .join("inventory.yaml");
    let (boot_root, artifacts) = (scratch.path("boot"), scratch.path("artifacts"));
    for file in [
        "boot/undionly.kpxe",
        "boot/ipxe.efi",
        "boot/ipxe-arm64.efi",
        "boot/snponly.efi",
        "boot/inspector/vmlinuz",
        "boot/inspector/initramfs.img",
        "artifacts/vmlinuz",
        "artifacts/initrd.img",
    ] {
        let path = scratch.path(file);
        fs::create_dir_all(path.parent().unwrap()).expect("mkdir");
        fs::write(&path, b"x").expect("write");
    }
    let args = |inventory: &Path| {
        agent_check(&[
            inventory,
            Path::new("--boot-root"),
            &boot_root,
            Path::new("--artifacts"),
            &artifacts,
        ])
    };
    let (ok, out) = args(&inventory);
    assert!(ok, "check missed a file that is there:\n{out}");
    fs::remove_file(artifacts.join("initrd.img")).expect("remove");
    let (ok, out) = args(&inventory);
    let want = format!(
        "profiles[worker].initrd[0]: {} is not a file",
        artifacts.join("initrd.img").display()
    );
    assert!(!ok && out.contains(&want), "wanted {want:?} in:\n{out}");
}

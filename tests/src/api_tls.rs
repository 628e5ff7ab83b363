//! The JSON API over TLS, end to end: the agent serves it with a
//! certificate from files (made by the `openssl` CLI, signed by a test CA,
//! for the IP 127.0.0.1); the CLI verifies it against `--ca-file`, refuses
//! it without, and skips the check only with `--insecure`; TLS below 1.2
//! and plain HTTP are refused; clients that never handshake delay nobody;
//! and a new certificate published in the files serves new connections
//! while a bad one leaves the previous serving.

use std::{
    fs,
    path::Path,
    process::Output,
    thread,
    time::{Duration, Instant},
};

use crate::{
    agent::{API_ADDR, Scratch, Served, agent_bin},
    certs::{make_ca, make_server},
};

const TOKEN: &str = "0123456789abcdef0123456789abcdef";
const INVENTORY: &str = "subnets: [{cidr: 10.66.0.0/16}]\n\
     profiles: [{name: w, boot: {bios: undionly.kpxe}}]\n\
     hosts:\n  - {mac: \"02:00:00:00:00:10\", ip: 10.66.1.10, hostname: node-1, profile: w}\n";

/// Publishes `crt` and `key` (files of `dir`) in `dir/secret` as the
/// kubelet updates a Secret volume: `tls.crt` and `tls.key` link through
/// `..data`, a link to the directory of the current version, and a new
/// version is put in force by renaming a new link over `..data`; the files
/// the agent was given never change, what they resolve to does.
fn publish(dir: &Path, version: &str, crt: &str, key: &str) {
    use std::os::unix::fs::symlink;
    let secret = dir.join("secret");
    let data = secret.join(format!("..{version}"));
    fs::create_dir_all(&data).expect("version dir");
    fs::copy(dir.join(crt), data.join("tls.crt")).expect("copy certificate");
    fs::copy(dir.join(key), data.join("tls.key")).expect("copy key");
    symlink(format!("..{version}"), secret.join("..data_tmp")).expect("link");
    fs::rename(secret.join("..data_tmp"), secret.join("..data")).expect("swap ..data");
    for file in ["tls.crt", "tls.key"] {
        if !secret.join(file).exists() {
            symlink(format!("..data/{file}"), secret.join(file)).expect("link");
        }
    }
}

/// An agent serving its API over TLS with `secret/tls.crt` and
/// `secret/tls.key` of a scratch directory: the pair `a` (serial 1001)
/// the CA `ca-a` signed.
struct Rig {
    certs: Scratch,
    served: Served,
}

impl Rig {
    fn start(name: &str) -> Rig {
        let certs = Scratch::new(&format!("{name}-certs"));
        make_ca(&certs.0, "ca-a");
        make_server(&certs.0, "ca-a", "a", "1001");
        publish(&certs.0, "v1", "a.crt", "a.key");
        fs::write(certs.path("tokens"), format!("ops {TOKEN}\n")).expect("tokens");
        fs::write(certs.path("token"), format!("{TOKEN}\n")).expect("token");
        let arg = |file: &str| certs.path(file).display().to_string();
        let served = Served::start_with(
            name,
            INVENTORY,
            &[
                "--api-token-file",
                &arg("tokens"),
                "--api-tls-cert",
                &arg("secret/tls.crt"),
                "--api-tls-key",
                &arg("secret/tls.key"),
            ],
        );
        Rig { certs, served }
    }

    fn path(&self, file: &str) -> String {
        self.certs.path(file).display().to_string()
    }

    /// `program ARGS` in the agent's namespace.
    fn run(&self, program: &str, args: &[&str]) -> Output {
        self.served
            .lab
            .cmd_in(self.served.lab.server_ns(), program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {program}: {e}"))
    }

    /// `pxe-agent hosts` with the token and `args`: success, stdout,
    /// stderr.
    fn hosts(&self, args: &[&str]) -> (bool, String, String) {
        let out = self
            .served
            .lab
            .cmd_in(self.served.lab.server_ns(), agent_bin())
            .env_remove("PXE_AGENT_CA_FILE")
            .args(["hosts", "--token-file", &self.path("token")])
            .args(args)
            .output()
            .expect("run pxe-agent");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The serial (hex) of the certificate a new connection gets.
    fn served_serial(&self) -> String {
        let out = self.run(
            "sh",
            &[
                "-c",
                &format!(
                    "openssl s_client -connect {API_ADDR} </dev/null 2>/dev/null \
                     | openssl x509 -noout -serial"
                ),
            ],
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .trim_start_matches("serial=")
            .to_string()
    }

    /// One TLS metric sample.
    fn metric(&self, sample: &str) -> u64 {
        *self
            .served
            .stats()
            .get(sample)
            .unwrap_or_else(|| panic!("no {sample} in the metrics; log:\n{}", self.served.log()))
    }
}

fn https() -> String {
    format!("https://{API_ADDR}")
}

#[test]
fn the_cli_trusts_the_api_only_through_its_ca_and_tls_below_1_2_is_refused() {
    let rig = Rig::start("apitls");
    let api = https();
    let ca = rig.path("ca-a.pem");

    let (ok, out, err) = rig.hosts(&["--agent", &api, "--ca-file", &ca]);
    assert!(
        ok,
        "hosts with --ca-file failed: {err}\nlog:\n{}",
        rig.served.log()
    );
    assert!(out.contains("node-1"), "{out}");

    // Without the CA: the system's roots do not know it.
    let (ok, _, err) = rig.hosts(&["--agent", &api]);
    assert!(!ok, "the certificate was trusted without --ca-file");
    assert!(err.contains("not trusted"), "{err}");
    // Another CA does not do either.
    make_ca(&rig.certs.0, "ca-other");
    let (ok, _, err) = rig.hosts(&["--agent", &api, "--ca-file", &rig.path("ca-other.pem")]);
    assert!(!ok && err.contains("not trusted"), "{err}");
    // Nor a name the certificate does not carry (localhost is not an IP
    // SAN of it).
    let (ok, _, err) = rig.hosts(&["--agent", "https://localhost:9465", "--ca-file", &ca]);
    assert!(!ok && err.contains("not valid for localhost"), "{err}");

    let (ok, out, err) = rig.hosts(&["--agent", &api, "--insecure"]);
    assert!(ok && out.contains("node-1"), "--insecure failed: {err}");
    assert!(err.contains("warning: --insecure"), "no warning: {err}");

    // Plain HTTP to the TLS listener: the CLI and curl both fail.
    let (ok, _, err) = rig.hosts(&["--agent", &format!("http://{API_ADDR}")]);
    assert!(!ok, "plain http was answered: {err}");
    let plain = rig.run(
        "curl",
        &["-s", "-m", "5", &format!("http://{API_ADDR}/api/v1/hosts")],
    );
    assert!(!plain.status.success(), "curl over plain http succeeded");
    // And the reverse hint: TLS to a plain listener (the metrics one).
    let (ok, _, err) = rig.hosts(&["--agent", "https://127.0.0.1:9464", "--insecure"]);
    assert!(!ok && err.contains("does not answer in TLS"), "{err}");

    // TLS 1.2 and 1.3 are served; 1.1 is refused by the agent (the
    // client's own floor lowered, so the refusal is the agent's alert).
    for version in ["1.2", "1.3"] {
        let out = rig.run(
            "curl",
            &[
                "-s",
                "-m",
                "5",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                &format!("--tlsv{version}"),
                "--tls-max",
                version,
                "--cacert",
                &ca,
                "-H",
                &format!("Authorization: Bearer {TOKEN}"),
                &format!("{api}/api/v1/hosts"),
            ],
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "200",
            "TLS {version}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let old = rig.run(
        "sh",
        &[
            "-c",
            &format!(
                "openssl s_client -connect {API_ADDR} -tls1_1 -cipher DEFAULT@SECLEVEL=0 \
                 </dev/null 2>&1"
            ),
        ],
    );
    // rustls answers a client without TLS 1.2 with a handshake_failure
    // alert (protocol_version is the other possible answer).
    let text = String::from_utf8_lossy(&old.stdout);
    assert!(
        !old.status.success()
            && (text.contains("alert handshake failure")
                || text.contains("alert protocol version")),
        "TLS 1.1 was not refused by the agent:\n{text}"
    );

    // Clients that connect and never handshake delay nobody, and are
    // dropped at the handshake deadline (10 s).
    let idle: Vec<xtask::ChildGuard> = (0..3)
        .map(|_| {
            xtask::ChildGuard::spawn(
                rig.served
                    .lab
                    .cmd_in(rig.served.lab.server_ns(), "bash")
                    .args([
                        "-c",
                        &format!(
                            "exec 3<>/dev/tcp/127.0.0.1/{}; sleep 30",
                            API_ADDR.rsplit_once(':').expect("port").1
                        ),
                    ]),
            )
            .expect("spawn an idle client")
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let (ok, _, err) = rig.hosts(&["--agent", &api, "--ca-file", &ca]);
    assert!(
        ok && started.elapsed() < Duration::from_secs(5),
        "behind idle clients: {err}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while rig.metric("pxe_api_tls_handshake_failures_total{reason=\"timeout\"}") < 3 {
        assert!(Instant::now() < deadline, "idle handshakes not timed out");
        thread::sleep(Duration::from_millis(500));
    }
    drop(idle);

    // The failed handshakes are counted, and the agent still serves.
    assert!(
        rig.metric("pxe_api_tls_handshake_failures_total{reason=\"error\"}") >= 5,
        "{:?}",
        rig.served.stats()
    );
    let (ok, _, err) = rig.hosts(&["--agent", &api, "--ca-file", &ca]);
    assert!(ok, "after the failures: {err}");
}

#[test]
fn a_new_certificate_serves_new_connections_and_a_bad_one_leaves_the_previous() {
    let rig = Rig::start("apitlsrot");
    let dir = &rig.certs.0;
    assert_eq!(rig.served_serial(), "1001");
    let not_after = rig.metric("pxe_api_tls_cert_not_after_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    assert!(
        (now + 2 * 86_400 - 600..=now + 2 * 86_400 + 600).contains(&not_after),
        "notAfter {not_after}, now {now}"
    );

    // A certificate of another CA, published as a Secret update.
    make_ca(dir, "ca-b");
    make_server(dir, "ca-b", "b", "2002");
    publish(dir, "v2", "b.crt", "b.key");
    let deadline = Instant::now() + Duration::from_secs(15);
    while rig.served_serial() != "2002" {
        assert!(
            Instant::now() < deadline,
            "the new certificate is not served after 15 s; log:\n{}",
            rig.served.log()
        );
        thread::sleep(Duration::from_millis(250));
    }
    let (ok, _, err) = rig.hosts(&["--agent", &https(), "--ca-file", &rig.path("ca-b.pem")]);
    assert!(ok, "the new CA is not trusted: {err}");
    let (ok, _, err) = rig.hosts(&["--agent", &https(), "--ca-file", &rig.path("ca-a.pem")]);
    assert!(!ok && err.contains("not trusted"), "{err}");
    assert_eq!(
        rig.metric("pxe_api_tls_reloads_total{result=\"ok\"}"),
        1,
        "log:\n{}",
        rig.served.log()
    );

    // Garbage for a certificate: refused, logged with the file's name, and
    // the previous certificate keeps serving.
    fs::write(dir.join("garbage.crt"), "not a certificate\n").expect("write");
    publish(dir, "v3", "garbage.crt", "b.key");
    let deadline = Instant::now() + Duration::from_secs(15);
    while rig.metric("pxe_api_tls_reloads_total{result=\"error\"}") == 0 {
        assert!(
            Instant::now() < deadline,
            "the bad certificate was not refused after 15 s; log:\n{}",
            rig.served.log()
        );
        thread::sleep(Duration::from_millis(250));
    }
    let log = rig.served.log();
    assert!(
        log.contains(&rig.path("secret/tls.crt")) && log.contains("previous one keeps serving"),
        "the refusal does not name the file:\n{log}"
    );
    assert_eq!(rig.served_serial(), "2002");
    let (ok, _, err) = rig.hosts(&["--agent", &https(), "--ca-file", &rig.path("ca-b.pem")]);
    assert!(ok, "the previous certificate does not serve: {err}");
    assert_eq!(rig.metric("pxe_api_tls_reloads_total{result=\"ok\"}"), 1);
    assert_eq!(rig.metric("pxe_api_tls_reloads_total{result=\"error\"}"), 1);
    // The key never reaches the log.
    let key = fs::read_to_string(dir.join("b.key")).expect("key");
    for line in key.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!log.contains(line), "the log quotes the key");
    }
}

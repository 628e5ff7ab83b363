//! The API as the DaemonSet exposes it, seen from the provisioning network:
//! the agent runs with the DaemonSet's capabilities and its listener flags
//! (`--metrics-addr 0.0.0.0:9464`), and a machine on the provisioning
//! segment, with no credentials, tries every API path. Without a token
//! nothing answers but 401 (or no connection at all); the same paths answer
//! a token holder; `/metrics` and `/healthz` stay open and name no host;
//! failed attempts are counted, logged with the caller's address and
//! throttled.

use crate::{
    agent::{Privileges, Scratch, Served, assert_daemonset_privileges},
    slow_path::INVENTORY,
};

const TOKEN: &str = "0123456789abcdef0123456789abcdef";
/// The agent's address on the provisioning segment.
const SERVER: &str = "10.66.0.1";
/// A machine on the provisioning segment.
const CLIENT_CIDR: &str = "10.66.1.99/16";
/// The node's cluster-facing address (a veth of the server namespace's
/// own), which the provisioning segment has no route to.
const CLUSTER_IP: &str = "198.51.100.7";

/// Every API path: method, path, JSON body.
const PATHS: &[(&str, &str, &str)] = &[
    ("GET", "/api/v1/hosts", ""),
    ("GET", "/api/v1/discovered", ""),
    ("GET", "/api/v1/leases", ""),
    ("GET", "/api/v1/peers", ""),
    ("GET", "/api/v1/audit", ""),
    ("GET", "/api/v1/metrics", ""),
    ("GET", "/api/v1/trace/52:54:00:12:34:56", ""),
    ("GET", "/api/v1/hosts/node-1/bmc", ""),
    (
        "POST",
        "/api/v1/hosts/node-1/power",
        r#"{"action":"status"}"#,
    ),
    (
        "POST",
        "/api/v1/hosts/node-1/bootdev",
        r#"{"device":"pxe"}"#,
    ),
    ("POST", "/api/v1/hosts/node-1/recover", ""),
    (
        "POST",
        "/api/v1/hosts/node-1/reprovision",
        r#"{"power":false}"#,
    ),
    ("POST", "/api/v1/hosts/node-1/netboot/done", ""),
    ("GET", "/api/v1/fleet", ""),
    ("GET", "/api/v1/fleet/events", ""),
    ("GET", "/api/v1/hosts/node-1/detail", ""),
    ("GET", "/api/v1/no-such-path", ""),
];

/// `curl` in namespace `ns`: the HTTP status (`000` when it could not
/// connect) and the body.
fn curl(
    served: &Served,
    ns: &str,
    method: &str,
    url: &str,
    body: &str,
    token: Option<&str>,
) -> (String, String) {
    let mut cmd = served.lab.cmd_in(ns, "curl");
    cmd.args([
        "-s",
        "--max-time",
        "2",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    if !body.is_empty() {
        cmd.args(["-H", "Content-Type: application/json", "--data", body]);
    }
    let out = cmd.arg(url).output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().to_owned(), body.to_owned())
}

/// An agent with the token file kept in a scratch directory of its own.
struct Rig {
    served: Served,
    _tokens: Scratch,
}

impl std::ops::Deref for Rig {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.served
    }
}

fn start(name: &str, api_addr: &str, setup_cluster_ip: bool) -> Rig {
    let dir = Scratch::new(&format!("{name}-tokens"));
    let path = dir.path("tokens");
    std::fs::write(&path, format!("ops {TOKEN}\n")).expect("tokens");
    let tokens = path.display().to_string();
    let inventory = format!("{INVENTORY}    labels: {{rack: r1}}\n");
    let extra = [
        "--metrics-addr",
        "0.0.0.0:9464",
        "--api-addr",
        api_addr,
        "--api-token-file",
        &tokens,
    ];
    let served = if setup_cluster_ip {
        Served::start_as_prepared(name, &inventory, &extra, Privileges::DaemonSet, |lab| {
            for args in [
                &[
                    "ip", "link", "add", "cluster0", "type", "veth", "peer", "name", "cluster1",
                ][..],
                &[
                    "ip",
                    "addr",
                    "add",
                    &format!("{CLUSTER_IP}/32"),
                    "dev",
                    "cluster0",
                ],
                &["ip", "link", "set", "cluster0", "up"],
            ] {
                lab.run_in(lab.server_ns(), args)
                    .expect("cluster-facing address");
            }
        })
    } else {
        Served::start_as(name, &inventory, &extra, Privileges::DaemonSet)
    };
    served.add_client_address(CLIENT_CIDR);
    Rig {
        served,
        _tokens: dir,
    }
}

#[test]
fn from_the_provisioning_side_the_api_answers_only_a_token_holder() {
    // The worst case an operator could configure: the API on every
    // address, the provisioning interface included.
    let served = start("pxapiw", "0.0.0.0:9465", false);
    assert_daemonset_privileges(served.agent_pid());
    assert!(
        served
            .log()
            .contains("the API listens on a provisioning interface"),
        "no warning about the API on the provisioning interface:\n{}",
        served.log()
    );
    let client = served.lab.client_ns().to_string();
    let api = format!("http://{SERVER}:9465");
    // Each path is tried from a machine of its own (an address of the
    // client namespace), so that no address fails often enough to be
    // throttled, then by the operator from another.
    for (n, (method, path, body)) in PATHS.iter().enumerate() {
        let machine = format!("10.66.2.{}", n + 1);
        served.add_client_address(&format!("{machine}/16"));
        let from = |token: Option<&str>| {
            let mut cmd = served.lab.cmd_in(&client, "curl");
            cmd.args([
                "-s",
                "--interface",
                &machine,
                "--max-time",
                "1",
                "-X",
                method,
            ]);
            cmd.args(["-w", "\n%{http_code}"]);
            if let Some(t) = token {
                cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
            }
            if !body.is_empty() {
                cmd.args(["-H", "Content-Type: application/json", "--data", body]);
            }
            let out = cmd.arg(format!("{api}{path}")).output().expect("curl");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let (answer, code) = text.rsplit_once('\n').unwrap_or(("", &text));
            (code.trim().to_owned(), answer.to_owned())
        };
        let (code, answer) = from(None);
        assert_eq!(code, "401", "{method} {path} without a token: {answer}");
        assert!(
            !answer.contains("node-1") && !answer.contains("52:54:00"),
            "{answer}"
        );
        let (code, _) = from(Some("not-the-token-not-the-token-0000"));
        assert_eq!(code, "401", "{method} {path} with a wrong token");
        let (code, _) = from(Some(TOKEN));
        assert!(
            !["000", "401", "403", "429"].contains(&code.as_str()),
            "{method} {path} with the token: {code}\n{}",
            served.log()
        );
    }
    // Ten failures from one address: then even the right token is refused
    // from there for a while.
    let get = |url: &str, token| curl(&served, &client, "GET", url, "", token);
    let hosts = format!("{api}/api/v1/hosts");
    for _ in 0..10 {
        assert_eq!(get(&hosts, None).0, "401");
    }
    assert_eq!(
        get(&hosts, Some(TOKEN)).0,
        "429",
        "ten failures did not throttle the address"
    );

    // The fleet page: open, since it holds no data; what it reads is not.
    let (code, page) = get(&format!("{api}/fleet"), None);
    assert_eq!(code, "200", "{page}");
    assert!(page.contains("pxe-agent fleet"), "{page}");
    for private in ["52:54:00", "node-1", "10.66.1.10", TOKEN] {
        assert!(!page.contains(private), "the fleet page holds {private}");
    }

    // The metrics listener: open, and names no host.
    let (code, metrics) = get(&format!("http://{SERVER}:9464/metrics"), None);
    assert_eq!(code, "200");
    for private in ["52:54:00", "node-1", "10.66.1.10", "r1"] {
        assert!(
            !metrics
                .lines()
                .filter(|l| !l.starts_with('#'))
                .any(|l| l.contains(private)),
            "/metrics names {private}"
        );
    }
    assert_eq!(get(&format!("http://{SERVER}:9464/healthz"), None).0, "200");
    let (code, _) = get(&format!("http://{SERVER}:9464/api/v1/hosts"), None);
    assert_eq!(code, "404", "the metrics listener serves the API");
    let refused = |reason: &str| {
        served
            .stats()
            .get(&format!(
                "pxe_api_auth_failures_total{{reason=\"{reason}\"}}"
            ))
            .copied()
            .unwrap_or(0)
    };
    assert!(refused("missing") >= 10, "missing: {}", refused("missing"));
    assert!(refused("invalid") >= 1, "invalid: {}", refused("invalid"));
    assert!(
        refused("throttled") >= 1,
        "throttled: {}",
        refused("throttled")
    );
    // Failures are logged with the caller's address, never the token.
    let log = served.log();
    assert!(
        log.lines()
            .any(|l| l.contains("API call refused") && l.contains("10.66.1.99")),
        "no refusal logged with the client's address:\n{log}"
    );
    assert!(
        !log.contains("not-the-token") && !log.contains(TOKEN),
        "a token reached the log"
    );
}

#[test]
fn on_a_cluster_facing_address_the_provisioning_side_cannot_connect() {
    let served = start("pxapic", &format!("{CLUSTER_IP}:9465"), true);
    assert_daemonset_privileges(served.agent_pid());
    let client = served.lab.client_ns().to_string();
    for target in [SERVER, CLUSTER_IP] {
        let (code, _) = curl(
            &served,
            &client,
            "GET",
            &format!("http://{target}:9465/api/v1/hosts"),
            "",
            None,
        );
        assert_eq!(
            code, "000",
            "the provisioning side reached the API at {target}"
        );
    }
    // The node itself reaches it, with the token.
    let server = served.lab.server_ns().to_string();
    let url = format!("http://{CLUSTER_IP}:9465/api/v1/hosts");
    let (code, hosts) = curl(&served, &server, "GET", &url, "", Some(TOKEN));
    assert_eq!(code, "200", "{hosts}");
    assert!(hosts.contains("node-1"), "{hosts}");
    let (code, _) = curl(&served, &server, "GET", &url, "", None);
    assert_eq!(code, "401");
}

#[test]
fn an_api_beyond_loopback_without_identities_is_refused_at_start() {
    let (status, log) = Served::start_refused(
        "pxapin",
        INVENTORY,
        &["--api-addr", "0.0.0.0:9465"],
        Privileges::DaemonSet,
    );
    assert!(!status.success(), "the agent started:\n{log}");
    assert!(
        log.contains("beyond loopback") && log.contains("--api-token-file"),
        "the refusal does not say how to fix it:\n{log}"
    );
}

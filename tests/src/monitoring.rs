//! The alerts and the dashboard of `deploy/monitoring/`: `promtool check
//! rules` and `promtool test rules` (the unit tests in `tests.yml`), the
//! PrometheusRule carrying the rules file's groups unchanged, a runbook
//! section in docs/operations.md for every alert, and, in the lab, a real
//! Prometheus (Debian's) scraping a running agent with the shipped rules
//! file: a host stuck in `awaiting-boot-file` and an XDP program detached
//! behind the agent's back fire their alerts in Prometheus's own
//! `/api/v1/alerts`, naming the host and the interface, and takes every
//! dashboard query. The dashboard's and the rules' metric names are checked
//! against a running agent's scrape.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use serde_json::Value as Json;
use serde_norway::Value as Yaml;
use xtask::ChildGuard;

use crate::{
    agent::{Privileges, Scratch, Served, agent_bin},
    bmc_sim::{IpmiSim, PASSWORD},
};

const TOKEN: &str = "0123456789abcdef0123456789abcdef";
/// The host's BMC: the simulator on a second address of the client end.
const SIM_IP: &str = "10.66.0.250";
const HOST_MAC: &str = "02:00:00:00:00:10";
/// Prometheus's listener, on the loopback of the agent's namespace.
const PROMETHEUS: &str = "127.0.0.1:9090";

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring")
}

fn rules_file() -> PathBuf {
    monitoring_dir().join("pxe-agent.rules.yml")
}

fn yaml(path: &Path) -> Yaml {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// Every rule of the rules file.
fn rules() -> Vec<Yaml> {
    yaml(&rules_file())["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules").clone())
        .collect()
}

fn text(v: &Yaml) -> &str {
    v.as_str().unwrap_or_default()
}

/// `promtool ARGS` in `deploy/monitoring/`; panics with its output unless
/// it succeeds.
fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(monitoring_dir())
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool: {e} (Debian's prometheus package; `cargo xtask setup` installs it)")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {}:\n{text}", args.join(" "));
    text
}

#[test]
fn promtool_accepts_the_rules_and_their_unit_tests_pass() {
    let checked = promtool(&["check", "rules", "pxe-agent.rules.yml"]);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", rules().len())),
        "{checked}"
    );
    let tested = promtool(&["test", "rules", "tests.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Every alert is fired by a unit test.
    let tests = fs::read_to_string(monitoring_dir().join("tests.yml")).expect("tests.yml");
    for rule in rules() {
        let name = text(&rule["alert"]);
        assert!(
            tests.contains(&format!(
                "alertname: {name}\n        exp_alerts:\n          - "
            )),
            "no unit test fires {name}"
        );
    }
}

#[test]
fn the_prometheusrule_carries_the_rules_file_unchanged() {
    let plain = yaml(&rules_file());
    let operator = yaml(&monitoring_dir().join("prometheusrule.yaml"));
    assert_eq!(text(&operator["kind"]), "PrometheusRule");
    assert_eq!(text(&operator["apiVersion"]), "monitoring.coreos.com/v1");
    assert_eq!(
        operator["spec"], plain,
        "prometheusrule.yaml's spec differs from pxe-agent.rules.yml"
    );
}

#[test]
fn every_alert_has_a_summary_description_severity_and_runbook_section() {
    let docs =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"))
            .expect("docs/operations.md");
    let rules = rules();
    assert!(rules.len() >= 12, "{} rules", rules.len());
    for rule in rules {
        let name = text(&rule["alert"]);
        assert!(!name.is_empty(), "a rule without an alert name: {rule:?}");
        assert!(
            ["critical", "warning"].contains(&text(&rule["labels"]["severity"])),
            "{name}: severity"
        );
        let notes = &rule["annotations"];
        assert!(!text(&notes["summary"]).is_empty(), "{name}: summary");
        let description = text(&notes["description"]);
        assert!(
            ["$labels.instance", "$labels.interface", "$labels.job"]
                .iter()
                .any(|l| description.contains(l)),
            "{name}: the description names no node or interface: {description}"
        );
        assert_eq!(
            text(&notes["runbook_url"]),
            format!("docs/operations.md#{}", name.to_lowercase()),
            "{name}: runbook"
        );
        assert!(
            docs.contains(&format!("\n### {name}\n")),
            "docs/operations.md has no section for {name}"
        );
    }
}

/// Metric names an expression or a template's query uses.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut i = 0;
    while let Some(at) = text[i..].find("pxe_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && word(bytes[end]) {
            end += 1;
        }
        if start == 0 || !word(bytes[start - 1]) {
            out.insert(text[start..end].to_owned());
        }
        i = end.max(start + 1);
    }
    out
}

/// The names a scrape shows: families (`# TYPE`) and samples.
fn exported_names(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter_map(|l| match l.strip_prefix("# TYPE ") {
            Some(rest) => rest.split_whitespace().next(),
            None if l.starts_with('#') => None,
            None => l.split(['{', ' ']).next(),
        })
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The agent with a host whose BMC is the simulator, the simulator, and
/// Prometheus when started. Field order: Prometheus and the simulator stop
/// before the agent's lab goes.
struct Rig {
    prometheus: Option<ChildGuard>,
    _sim: IpmiSim,
    dir: Scratch,
    served: Served,
}

impl Rig {
    /// The agent as the DaemonSet runs it, its API on loopback with a
    /// token, TFTP and boot HTTP from a boot root; `recovery` is the
    /// host's recovery block (YAML flow map).
    fn start(name: &str, recovery: &str) -> Rig {
        let dir = Scratch::new(&format!("{name}-mon"));
        fs::write(dir.path("bmc.password"), PASSWORD).unwrap();
        fs::write(dir.path("tokens"), format!("prometheus {TOKEN}\n")).unwrap();
        fs::write(dir.path("token"), format!("{TOKEN}\n")).unwrap();
        fs::create_dir_all(dir.path("root")).unwrap();
        fs::write(dir.path("root/undionly.kpxe"), b"not a boot file").unwrap();
        let inventory = format!(
            "subnets: [{{cidr: 10.66.0.0/16, pool: {{start: 10.66.9.1, end: 10.66.9.254}}}}]\n\
             profiles: [{{name: w, boot: {{bios: undionly.kpxe}}}}]\n\
             hosts:\n  - mac: \"{HOST_MAC}\"\n    ip: 10.66.1.10\n    \
             hostname: node-1\n    profile: w\n    bmc:\n      \
             address: ipmi://{SIM_IP}:623\n      username: admin\n      \
             password_file: {}\n    recovery: {recovery}\n",
            dir.path("bmc.password").display()
        );
        let (tokens, root) = (dir.path("tokens"), dir.path("root"));
        let served = Served::start_as(
            name,
            &inventory,
            &[
                "--api-token-file",
                tokens.to_str().unwrap(),
                "--bmc-boot-flag-echo",
                "device-only",
                "--boot-root",
                root.to_str().unwrap(),
            ],
            Privileges::DaemonSet,
        );
        served.add_client_address(&format!("{SIM_IP}/16"));
        let sim = IpmiSim::start(served.lab.client_ns(), SIM_IP);
        Rig {
            prometheus: None,
            _sim: sim,
            dir,
            served,
        }
    }

    /// `curl -s ARGS` in the agent's namespace: stdout.
    fn curl(&self, args: &[&str]) -> String {
        let out = self
            .served
            .lab
            .cmd_in(self.served.lab.server_ns(), "curl")
            .args(["-s", "--max-time", "5"])
            .args(args)
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn metrics(&self) -> String {
        self.curl(&["http://127.0.0.1:9464/metrics"])
    }

    /// The API listener's series that name hosts, as the token holder.
    fn api_metrics(&self) -> String {
        self.curl(&[
            "-H",
            &format!("Authorization: Bearer {TOKEN}"),
            "http://127.0.0.1:9465/api/v1/metrics",
        ])
    }

    /// The host's recovery state, from the API.
    fn recovery(&self) -> String {
        let hosts = self.curl(&[
            "-H",
            &format!("Authorization: Bearer {TOKEN}"),
            "http://127.0.0.1:9465/api/v1/hosts",
        ]);
        serde_json::from_str::<Json>(&hosts)
            .ok()
            .and_then(|h| h[0]["recovery"].as_str().map(str::to_owned))
            .unwrap_or_else(|| format!("(no answer: {hosts})"))
    }

    fn wait_recovery(&self, state: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let now = self.recovery();
            if now == state {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "recovery {now}, not {state}, after {within:?}\nlog:\n{}",
                self.served.log()
            );
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// Starts Prometheus in the agent's namespace: 1 s scrapes of
    /// `/metrics` and, with the token, of the API's `/api/v1/metrics`; 1 s
    /// rule evaluation of the shipped rules file.
    fn start_prometheus(&mut self) {
        let config = format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: [{rules}]\n\
             scrape_configs:\n\
             \x20 - job_name: pxe-agent\n\
             \x20   static_configs: [{{targets: ['127.0.0.1:9464']}}]\n\
             \x20 - job_name: pxe-agent-api\n\
             \x20   metrics_path: /api/v1/metrics\n\
             \x20   authorization: {{credentials_file: {token}}}\n\
             \x20   static_configs: [{{targets: ['127.0.0.1:9465']}}]\n",
            rules = rules_file().canonicalize().expect("rules file").display(),
            token = self.dir.path("token").display(),
        );
        fs::write(self.dir.path("prometheus.yml"), config).unwrap();
        let log = fs::File::create(self.dir.path("prometheus.log")).unwrap();
        let lab = &self.served.lab;
        let guard = ChildGuard::spawn(
            lab.cmd_in(lab.server_ns(), "prometheus")
                .arg(format!(
                    "--config.file={}",
                    self.dir.path("prometheus.yml").display()
                ))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    self.dir.path("tsdb").display()
                ))
                .arg(format!("--web.listen-address={PROMETHEUS}"))
                .stdout(log.try_clone().unwrap())
                .stderr(log),
        )
        .expect("start prometheus (Debian's prometheus package; `cargo xtask setup` installs it)");
        self.prometheus = Some(guard);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self
            .curl(&[&format!("http://{PROMETHEUS}/-/ready")])
            .contains("Ready")
        {
            assert!(
                Instant::now() < deadline,
                "Prometheus not ready after 20 s:\n{}",
                self.prometheus_log()
            );
            thread::sleep(Duration::from_millis(200));
        }
        // Its discovery hands targets on after up to 5 s: the scenario
        // starts once both jobs were scraped.
        while self
            .curl(&[&format!(
                "http://{PROMETHEUS}/api/v1/query?query=count(up%3D%3D1)"
            )])
            .split("\"value\":[")
            .nth(1)
            .is_none_or(|v| !v.contains("\"2\""))
        {
            assert!(
                Instant::now() < deadline,
                "Prometheus does not scrape both jobs after 20 s:\n{}\n{}",
                self.curl(&[&format!("http://{PROMETHEUS}/api/v1/targets")]),
                self.prometheus_log()
            );
            thread::sleep(Duration::from_millis(200));
        }
    }

    fn prometheus_log(&self) -> String {
        fs::read_to_string(self.dir.path("prometheus.log")).unwrap_or_default()
    }

    /// Prometheus's alerts (`/api/v1/alerts`).
    fn alerts(&self) -> Vec<Json> {
        let body = self.curl(&[&format!("http://{PROMETHEUS}/api/v1/alerts")]);
        serde_json::from_str::<Json>(&body)
            .ok()
            .and_then(|v| v["data"]["alerts"].as_array().cloned())
            .unwrap_or_default()
    }
}

/// The `for:` of alert `name` in the shipped rules, in seconds.
fn for_of(name: &str) -> u64 {
    let rule = rules()
        .into_iter()
        .find(|r| text(&r["alert"]) == name)
        .unwrap_or_else(|| panic!("no rule {name}"));
    let window = text(&rule["for"]);
    pxe_agent::inventory::parse_duration(window)
        .unwrap_or_else(|e| panic!("{name}'s for: {e}"))
        .as_secs()
}

/// A sample's value on a scrape page (`name{labels}` as written).
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn prometheus_fires_the_stuck_stage_and_detached_alerts_from_a_running_agent() {
    const BOOT_FILE_DEADLINE: u64 = 4;
    // What an alert may take beyond its `for:`: the health monitor's look
    // (1 s), a scrape (1 s), an evaluation (1 s), this test's polling and a
    // loaded machine's scheduling.
    const LATENCY: u64 = 8;
    let mut rig = Rig::start(
        "pxmon",
        &format!("{{max_attempts: 1, stages: {{boot_file: {BOOT_FILE_DEADLINE}s}}}}"),
    );
    rig.start_prometheus();
    // Recovered: PXE set, powered on; then its DHCP answered by the fast
    // path, and no boot file fetched.
    let out = rig
        .served
        .lab
        .cmd_in(rig.served.lab.server_ns(), agent_bin())
        .args(["recover", "node-1", "--token-file"])
        .arg(rig.dir.path("token"))
        .output()
        .expect("pxe-agent recover");
    assert!(
        out.status.success(),
        "recover: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    rig.wait_recovery("awaiting-dhcp", Duration::from_secs(15));
    rig.served.set_client_mac(HOST_MAC);
    rig.served.udhcpc(&[]);
    rig.wait_recovery("awaiting-boot-file", Duration::from_secs(10));
    let awaiting = Instant::now();
    // Behind the agent's back: the XDP link goes.
    let link = crate::reload::xdp_link_of(&rig.served);
    let iface = rig.served.lab.server_if().to_owned();
    rig.served
        .lab
        .run_in(
            rig.served.lab.server_ns(),
            &["bpftool", "link", "detach", "id", &link],
        )
        .expect("detach the XDP link");
    let detached = Instant::now();

    let stalled_series = "pxe_recovery_stalled_hosts{stage=\"awaiting-boot-file\"}";
    let (stuck_for, detached_for) = (for_of("PxeBootStageStalled"), for_of("PxeXdpDetached"));
    let mut stalled_at = None;
    let (mut stuck, mut gone) = (None, None);
    let give_up =
        Instant::now() + Duration::from_secs(BOOT_FILE_DEADLINE + stuck_for.max(detached_for) + 20);
    while stuck.is_none() || gone.is_none() {
        assert!(
            Instant::now() < give_up,
            "alerts not firing (stuck: {stuck:?}, detached: {gone:?}):\n{:#?}\n\
             /metrics stalled: {:?}\nagent log:\n{}\nprometheus log:\n{}",
            rig.alerts(),
            sample(&rig.metrics(), stalled_series),
            rig.served.log(),
            rig.prometheus_log()
        );
        if stalled_at.is_none() && sample(&rig.metrics(), stalled_series) == Some(1.0) {
            stalled_at = Some(Instant::now());
        }
        for alert in rig.alerts() {
            if alert["state"] != "firing" {
                continue;
            }
            let labels = &alert["labels"];
            match labels["alertname"].as_str() {
                Some("PxeBootStageStalled") if stuck.is_none() => {
                    stuck = Some((Instant::now(), alert.clone()));
                }
                Some("PxeXdpDetached") if gone.is_none() => {
                    gone = Some((Instant::now(), alert.clone()));
                }
                _ => {}
            }
        }
        thread::sleep(Duration::from_millis(250));
    }
    let (stuck_at, stuck) = stuck.unwrap();
    let (gone_at, gone) = gone.unwrap();
    eprintln!("stuck-stage alert:\n{stuck:#}\ndetached alert:\n{gone:#}");
    eprintln!(
        "stuck at +{:?} after awaiting-boot-file, its alert firing {:?} later; \
         detached alert firing {:?} after the detach",
        stalled_at.map(|t| t.duration_since(awaiting)),
        stalled_at.map(|t| stuck_at.duration_since(t)),
        gone_at.duration_since(detached)
    );

    // The stuck host: counted on /metrics once its deadline passed, named
    // in the alert through the API's series, firing once `for:` passed.
    let stalled_at = stalled_at.expect("the stalled gauge was never seen at 1");
    assert!(
        stalled_at.duration_since(awaiting) >= Duration::from_secs(BOOT_FILE_DEADLINE - 1),
        "counted as stuck before its deadline"
    );
    assert_eq!(stuck["labels"]["stage"], "awaiting-boot-file");
    assert_eq!(stuck["labels"]["severity"], "warning");
    let description = stuck["annotations"]["description"].as_str().unwrap_or("");
    assert!(
        description.contains("Stuck: node-1 ") && description.contains("awaiting-boot-file"),
        "the alert does not name the host: {description}"
    );
    let took = stuck_at.duration_since(stalled_at);
    assert!(
        took <= Duration::from_secs(stuck_for + LATENCY),
        "PxeBootStageStalled fired {took:?} after the host was stuck (for: {stuck_for}s)"
    );
    assert!(
        took + Duration::from_secs(2) >= Duration::from_secs(stuck_for),
        "PxeBootStageStalled fired {took:?} after the host was stuck, before its for: {stuck_for}s"
    );

    // The detached program: the interface named, firing once `for:` passed.
    assert_eq!(gone["labels"]["interface"].as_str(), Some(iface.as_str()));
    assert_eq!(gone["labels"]["severity"], "critical");
    let description = gone["annotations"]["description"].as_str().unwrap_or("");
    assert!(description.contains(&iface), "{description}");
    let took = gone_at.duration_since(detached);
    assert!(
        took <= Duration::from_secs(detached_for + LATENCY),
        "PxeXdpDetached fired {took:?} after the detach (for: {detached_for}s)"
    );
    assert!(
        took + Duration::from_secs(1) >= Duration::from_secs(detached_for),
        "PxeXdpDetached fired {took:?} after the detach, before its for: {detached_for}s"
    );
    // The open page still names no host; the API's does, for the token.
    let page = rig.metrics();
    assert!(
        !page.contains("node-1") && !page.contains(HOST_MAC),
        "/metrics names the host"
    );
    assert!(
        rig.api_metrics().contains(
            "pxe_recovery_stalled_host_info{host=\"node-1\",stage=\"awaiting-boot-file\"} 1"
        ),
        "{}",
        rig.api_metrics()
    );
    // Every dashboard query is PromQL this Prometheus takes.
    for expr in dashboard_exprs() {
        let expr = expr.replace("$instance", ".*").replace("$interface", ".*");
        let answer = rig.curl(&[
            "-G",
            &format!("http://{PROMETHEUS}/api/v1/query"),
            "--data-urlencode",
            &format!("query={expr}"),
        ]);
        assert!(
            answer.contains("\"status\":\"success\""),
            "{expr}: {answer}"
        );
    }
    let refused = rig.curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "http://127.0.0.1:9465/api/v1/metrics",
    ]);
    assert_eq!(refused, "401", "the named series without a token");
}

/// The dashboard's panel queries.
fn dashboard_exprs() -> Vec<String> {
    let dashboard: Json = serde_json::from_str(
        &fs::read_to_string(monitoring_dir().join("pxe-agent-dashboard.json")).expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().expect("expr").to_owned())
        .collect()
}

#[test]
fn the_dashboard_and_the_rules_query_only_metrics_a_running_agent_exports() {
    let rig = Rig::start("pxdash", "{max_attempts: 1}");
    // TFTP runs (a boot root), and the API's series come with the token.
    let exported: BTreeSet<String> = exported_names(&rig.metrics())
        .union(&exported_names(&rig.api_metrics()))
        .cloned()
        .collect();
    for family in [
        "pxe_tftp_transfers_total",
        "pxe_recovery_stalled_host_info",
        "pxe_slow_reply_seconds_bucket",
        "pxe_bmc_calls_total",
        "pxe_xdp_interface_packets_total",
    ] {
        assert!(
            exported.contains(family),
            "{family} not in the scrape:\n{exported:#?}"
        );
    }
    let dashboard: Json = serde_json::from_str(
        &fs::read_to_string(monitoring_dir().join("pxe-agent-dashboard.json")).expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut used = BTreeSet::new();
    let mut exprs = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("expr");
            let names = metric_names(expr);
            assert!(
                !names.is_empty(),
                "{}: {expr} names no metric",
                panel["title"]
            );
            used.extend(names);
            exprs += 1;
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        used.extend(metric_names(variable["query"].as_str().unwrap_or("")));
    }
    assert!(exprs >= 20, "{exprs} expressions");
    for rule in rules() {
        used.extend(metric_names(text(&rule["expr"])));
        used.extend(metric_names(text(&rule["annotations"]["description"])));
    }
    let missing: Vec<&String> = used.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the dashboard or the rules query metrics the agent does not export: {missing:?}"
    );
}

#[test]
fn metric_names_are_read_from_expressions_and_pages() {
    assert_eq!(
        metric_names(
            "sum by (le) (rate(pxe_slow_reply_seconds_bucket{instance=~\"$i\"}[5m])) / pxe_x_total"
        ),
        BTreeSet::from(["pxe_slow_reply_seconds_bucket".into(), "pxe_x_total".into()])
    );
    assert_eq!(
        exported_names("# HELP pxe_a A.\n# TYPE pxe_a counter\npxe_a{k=\"v\"} 1\npxe_b 2\n"),
        BTreeSet::from(["pxe_a".into(), "pxe_b".into()])
    );
}

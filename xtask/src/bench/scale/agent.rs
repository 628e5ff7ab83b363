//! One pxe-agent under measurement: started on the lab's server end with a
//! fleet inventory, from a file or as BootHost objects served by the fake
//! Kubernetes API server (`fake-kube-api`, started beside it in the server
//! namespace), with its program pinned under a bpffs directory of its own,
//! and read from the outside while it runs: `/healthz` and `/metrics` over
//! its metrics address (from a thread inside the server namespace),
//! `/proc/<pid>/status` (its peak memory reset between phases through
//! `/proc/<pid>/clear_refs`), and bpftool for the maps of the program
//! attached to the interface, whatever their layout.
//!
//! Owns the agent's command line, its readiness wait, the changes it is
//! asked to apply and the removal of its pins; what the numbers mean is
//! [`super::report`]'s.

use std::{
    collections::BTreeMap,
    fs,
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use xtask::{ChildGuard, Lab, process};

use super::super::boot::netns;

/// Where the agent serves `/metrics` and `/healthz`, inside the server
/// namespace.
const METRICS_ADDR: &str = "127.0.0.1:9464";
/// The Kubernetes namespace of the fleet's objects.
const KUBE_NS: &str = "fleet";
/// Start-up allowance: reading, compiling and writing 250,000 hosts.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// A reload's allowance, from the rename to its counter moving.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(120);
/// How often readiness and reloads are polled: each poll is one HTTP
/// request on loopback, well below a millisecond.
const POLL: Duration = Duration::from_millis(2);
/// Time after a phase before memory is read: the agent gives memory back
/// after a change is in force, and the Kubernetes source's status writer
/// starts on its objects.
pub const SETTLE: Duration = Duration::from_secs(2);

/// What the agent reported once ready.
#[derive(Clone, Copy, Debug)]
pub struct Started {
    /// From spawning `ip netns exec` (which execs the agent in place) to the
    /// first `/healthz` 200.
    pub ready: Duration,
    /// Reading and checking the inventory, as the agent logs it
    /// (`read_ms` of its `inventory loaded` line), if it does.
    pub read: Option<Duration>,
}

/// A reload, as the agent's own metrics show it.
#[derive(Clone, Copy, Debug)]
pub struct Reload {
    /// `pxe_inventory_reload_seconds` after it.
    pub seconds: f64,
    /// The change of `pxe_xdp_map_writes_total` over it.
    pub map_writes: u64,
    /// The part of `seconds` the agent logs for reading and checking the
    /// file (`read_ms` of its `inventory reload timing` line).
    pub read: Option<Duration>,
    /// Whether the agent parsed only the changed host entries (`patched`);
    /// `None` for the Kubernetes source, which rebuilds from its objects.
    pub patched: Option<bool>,
    /// `VmHWM` over the reload (reset before it), KiB.
    pub peak_kib: u64,
}

impl Reload {
    /// `0.1107 s (read 0.0351 s, patched)`.
    pub fn timing(&self) -> String {
        let read = self
            .read
            .map_or_else(String::new, |r| format!("read {:.4} s, ", r.as_secs_f64()));
        format!("{:.4} s ({read}{})", self.seconds, self.how())
    }

    /// `patched`, `whole file` or `objects`.
    pub fn how(&self) -> &'static str {
        match self.patched {
            Some(true) => "patched",
            Some(false) => "whole file",
            None => "objects",
        }
    }
}

/// Where the agent reads its inventory from.
pub enum Source<'a> {
    /// A file with this text.
    File(&'a str),
    /// These objects (YAML documents), held by a `fake-kube-api` (this
    /// binary) from its start.
    Kube { objects: &'a str, api: &'a Path },
}

/// A running `fake-kube-api`: the port it listens on in the server
/// namespace.
struct FakeApi {
    guard: ChildGuard,
    port: u16,
}

/// A running agent. Field order matters: the agent stops before its API
/// server and its pins are removed, and all before the caller's lab goes.
pub struct Agent {
    guard: ChildGuard,
    api: Option<FakeApi>,
    pins: Pins,
    ns: String,
    iface: String,
    inventory: PathBuf,
    log: PathBuf,
}

impl Agent {
    /// Starts `bin` on the lab's server end with the inventory of
    /// `source` (a file in `dir`, or the objects of a `fake-kube-api`
    /// started first); waits until `/healthz` answers 200, or fails with
    /// the agent's own error line if it exits first.
    pub fn start(
        bin: &Path,
        lab: &Lab,
        dir: &Path,
        source: &Source,
    ) -> anyhow::Result<(Agent, Started)> {
        fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
        let inventory = dir.join("inventory.yaml");
        let log = dir.join("agent.log");
        let out = fs::File::create(&log)
            .with_context(|| format!("failed to create {}", log.display()))?;
        let mut cmd = lab.cmd_in(lab.server_ns(), bin);
        cmd.args([
            "run",
            "--interface",
            lab.server_if(),
            "--xdp-mode",
            "native",
        ])
        .args(["--metrics-addr", METRICS_ADDR, "--log-format", "json"])
        .arg("--state-dir")
        .arg(dir.join("state"));
        let api = match source {
            Source::File(yaml) => {
                write(&inventory, yaml)?;
                cmd.arg("--inventory").arg(&inventory);
                None
            }
            Source::Kube { objects, api } => {
                let objects_file = dir.join("objects.yaml");
                write(&objects_file, objects)?;
                let api = FakeApi::start(api, lab, &objects_file)?;
                let kubeconfig = dir.join("kubeconfig");
                write(&kubeconfig, &api.kubeconfig())?;
                cmd.args([
                    "--kube",
                    "--kube-namespace",
                    KUBE_NS,
                    "--node-name",
                    "bench",
                ])
                .env("KUBECONFIG", &kubeconfig);
                Some(api)
            }
        };
        let pins = Pins::new(bin, lab, dir)?;
        cmd.arg("--pin-dir")
            .arg(&pins.dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone().context("failed to clone the log handle")?)
            .stderr(out);
        let started = Instant::now();
        let guard = ChildGuard::spawn(&mut cmd)?;
        let mut agent = Agent {
            guard,
            api,
            pins,
            ns: lab.server_ns().to_owned(),
            iface: lab.server_if().to_owned(),
            inventory,
            log,
        };
        let ready = agent.wait_ready(started)?;
        let read = read_time(&fs::read_to_string(&agent.log).unwrap_or_default());
        Ok((agent, Started { ready, read }))
    }

    fn wait_ready(&mut self, started: Instant) -> anyhow::Result<Duration> {
        let ns = self.ns.clone();
        loop {
            if let Some(status) = self.guard.try_wait()? {
                bail!("{} ({status})", self.error_line());
            }
            let probe = netns::run_in(&ns, || http_get("/healthz"));
            let at = started.elapsed();
            if probe.is_ok_and(|(code, _)| code == 200) {
                return Ok(at);
            }
            if at > READY_TIMEOUT {
                bail!(
                    "not ready after {} s: {}",
                    READY_TIMEOUT.as_secs(),
                    self.error_line()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// The agent's PID (`ip netns exec` execs it in place).
    pub fn pid(&self) -> u32 {
        self.guard.id()
    }

    /// Its samples by name (`pxe_inventory_reloads_total{result="ok"}`).
    pub fn metrics(&self) -> anyhow::Result<BTreeMap<String, f64>> {
        let (code, body) = netns::run_in(&self.ns, || http_get("/metrics"))?;
        if code != 200 {
            bail!("/metrics answered {code}");
        }
        Ok(body
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                Some((name.to_owned(), value.parse().ok()?))
            })
            .collect())
    }

    /// Replaces the inventory with `yaml` (a new file renamed over it, as
    /// deployment tooling does) and waits until the agent has applied it.
    pub fn reload(&mut self, yaml: &str) -> anyhow::Result<Reload> {
        let tmp = self.inventory.with_extension("yaml.new");
        write(&tmp, yaml)?;
        self.apply(|agent| {
            fs::rename(&tmp, &agent.inventory)
                .with_context(|| format!("failed to rename over {}", agent.inventory.display()))
        })
    }

    /// Merges `patch` (JSON) into the object at `path` (below
    /// `/apis/pxe-agent.io/v1alpha1/namespaces/NS/`, e.g. `boothosts/node-7`)
    /// of the agent's API server, and waits until the agent has applied
    /// the inventory it makes.
    pub fn patch_object(&mut self, path: &str, patch: &str) -> anyhow::Result<Reload> {
        let port = self
            .api
            .as_ref()
            .context("the agent reads no Kubernetes objects")?
            .port;
        let url = format!(
            "http://127.0.0.1:{port}/apis/pxe-agent.io/v1alpha1/namespaces/{KUBE_NS}/{path}"
        );
        let ns = self.ns.clone();
        self.apply(|_| {
            process::run(Command::new("ip").args([
                "netns",
                "exec",
                &ns,
                "curl",
                "-sS",
                "--fail-with-body",
                "-X",
                "PATCH",
                "-H",
                "Content-Type: application/merge-patch+json",
                "--data",
                patch,
                &url,
            ]))
            .map(drop)
            .with_context(|| format!("failed to patch {path}"))
        })
    }

    /// Makes a change with `change`, with the peak memory reset first, and
    /// waits until the agent counts a reload applied (or refused).
    fn apply(
        &mut self,
        change: impl FnOnce(&Agent) -> anyhow::Result<()>,
    ) -> anyhow::Result<Reload> {
        const OK: &str = "pxe_inventory_reloads_total{result=\"ok\"}";
        const REJECTED: &str = "pxe_inventory_reloads_total{result=\"rejected\"}";
        let before = self.metrics()?;
        self.reset_peak()?;
        change(self)?;
        let started = Instant::now();
        loop {
            if let Some(status) = self.guard.try_wait()? {
                bail!(
                    "the agent exited during the reload ({status}): {}",
                    self.error_line()
                );
            }
            let now = self.metrics()?;
            let get = |m: &BTreeMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(0.0);
            if get(&now, REJECTED) > get(&before, REJECTED) {
                bail!("the agent refused the reload: {}", self.error_line());
            }
            if get(&now, OK) > get(&before, OK) {
                let writes = get(&now, "pxe_xdp_map_writes_total")
                    - get(&before, "pxe_xdp_map_writes_total");
                let log = fs::read_to_string(&self.log).unwrap_or_default();
                let line = log
                    .lines()
                    .rfind(|l| l.contains("inventory reload timing"))
                    .unwrap_or_default();
                let patched = line.contains("\"patched\":true") || line.contains("patched=true");
                // Given back memory shows in RSS, not in the peak.
                std::thread::sleep(SETTLE);
                return Ok(Reload {
                    seconds: get(&now, "pxe_inventory_reload_seconds"),
                    map_writes: writes as u64,
                    read: field_ms(line, "read_ms"),
                    patched: self.api.is_none().then_some(patched),
                    peak_kib: self.rss_kib()?.1,
                });
            }
            if started.elapsed() > RELOAD_TIMEOUT {
                bail!(
                    "reload not applied after {} s; the agent's last warning: {}; its last lines: {}",
                    RELOAD_TIMEOUT.as_secs(),
                    self.warning_line(),
                    self.last_lines(8)
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Resets the agent's `VmHWM` to its `VmRSS` (`clear_refs` 5), so the
    /// next reading is the peak of what happens in between.
    pub fn reset_peak(&self) -> anyhow::Result<()> {
        let path = format!("/proc/{}/clear_refs", self.pid());
        fs::write(&path, "5").with_context(|| format!("failed to write {path}"))
    }

    /// VmRSS and VmHWM of the agent, in KiB.
    pub fn rss_kib(&self) -> anyhow::Result<(u64, u64)> {
        let path = format!("/proc/{}/status", self.pid());
        let status = fs::read_to_string(&path).with_context(|| format!("failed to read {path}"))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
                .with_context(|| format!("no {name} in {path}"))
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?))
    }

    /// Locked kernel memory of every map the program attached to the
    /// interface uses (`bytes_memlock`, summed), in bytes.
    pub fn map_memlock(&self) -> anyhow::Result<u64> {
        let link = process::run(Command::new("ip").args([
            "-n",
            &self.ns,
            "-d",
            "link",
            "show",
            "dev",
            &self.iface,
        ]))?;
        let prog = link
            .split("prog/xdp id ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .with_context(|| format!("no XDP program on {}: {link}", self.iface))?;
        let info =
            process::run(Command::new("bpftool").args(["prog", "show", "id", prog, "--json"]))?;
        let ids = json_array(&info, "map_ids")
            .with_context(|| format!("no map_ids for program {prog}: {info}"))?;
        let mut total = 0;
        for id in ids {
            let map = process::run(Command::new("bpftool").args([
                "map",
                "show",
                "id",
                &id.to_string(),
                "--json",
            ]))?;
            total += json_number(&map, "bytes_memlock")
                .with_context(|| format!("no bytes_memlock for map {id}: {map}"))?;
        }
        Ok(total)
    }

    /// The interface's pin directory, where the program is pinned.
    pub fn pin_dir(&self) -> PathBuf {
        self.pins.dir.join(&self.iface)
    }

    /// The agent's fatal error (its `error:` line and the lines of detail
    /// after it, joined), else the last line of its log.
    fn error_line(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        match lines.iter().rposition(|l| l.starts_with("error:")) {
            Some(at) => lines[at..].join(" "),
            None => lines
                .last()
                .map_or_else(|| "no log output".to_owned(), |l| (*l).to_owned()),
        }
    }

    /// The agent's last warning or error in its log (JSON lines).
    fn warning_line(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .rfind(|l| l.contains("\"level\":\"WARN\"") || l.contains("\"level\":\"ERROR\""))
            .map_or_else(|| "none".to_owned(), |l| l.trim().to_owned())
    }

    /// The last `n` lines of the agent's log, one after another.
    fn last_lines(&self, n: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join(" | ")
    }

    /// SIGTERM, then SIGKILL after a grace period; then its API server
    /// and the pins go.
    pub fn stop(self) -> anyhow::Result<()> {
        self.guard.stop().context("failed to stop pxe-agent")?;
        if let Some(api) = self.api {
            api.guard.stop().context("failed to stop fake-kube-api")?;
        }
        drop(self.pins);
        Ok(())
    }
}

impl FakeApi {
    /// Starts `bin` in the lab's server namespace holding the objects of
    /// `objects` in [`KUBE_NS`]; waits for the port it prints.
    fn start(bin: &Path, lab: &Lab, objects: &Path) -> anyhow::Result<FakeApi> {
        let mut guard = ChildGuard::spawn(
            lab.cmd_in(lab.server_ns(), bin)
                .args(["--listen", "127.0.0.1:0", "--objects"])
                .arg(format!("{KUBE_NS}={}", objects.display()))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit()),
        )?;
        let stdout = guard
            .0
            .stdout
            .take()
            .context("no stdout of fake-kube-api")?;
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
            .context("failed to read the port of fake-kube-api")?;
        let port = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("fake-kube-api printed {line:?}"))?;
        Ok(FakeApi { guard, port })
    }

    /// A kubeconfig pointing at it, in [`KUBE_NS`] (a token user: it checks
    /// no credentials).
    fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    \
             server: http://127.0.0.1:{}\nusers:\n- name: fake\n  user:\n    token: fake\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    \
             namespace: {KUBE_NS}\ncurrent-context: fake\n",
            self.port
        )
    }
}

/// The agent's `--pin-dir`: a bpffs instance of its own, mounted at a
/// scratch directory (a fresh instance per mount, so nothing is shared with
/// the machine's /sys/fs/bpf, which need not be mounted). The program
/// stays attached through its pinned link after the agent exits, so
/// dropping this detaches it (`pxe-agent detach`), then unmounts.
struct Pins {
    dir: PathBuf,
    bin: PathBuf,
    ns: String,
}

impl Pins {
    fn new(bin: &Path, lab: &Lab, scratch: &Path) -> anyhow::Result<Pins> {
        let dir = scratch.join("bpffs");
        fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
        process::run(Command::new("mount").args(["-t", "bpf", "bpf"]).arg(&dir))
            .context("failed to mount a bpffs for the agent's pins")?;
        Ok(Pins {
            dir,
            bin: bin.to_owned(),
            ns: lab.server_ns().to_owned(),
        })
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let detach = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(&self.bin)
            .arg("detach")
            .arg("--pin-dir")
            .arg(&self.dir)
            .output();
        if !detach.is_ok_and(|o| o.status.success()) {
            eprintln!(
                "warning: `pxe-agent detach --pin-dir {}` failed",
                self.dir.display()
            );
        }
        if let Err(err) = process::run(Command::new("umount").arg(&self.dir)) {
            eprintln!("warning: {err:#}");
        }
    }
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    fs::write(path, text).with_context(|| format!("failed to write {}", path.display()))
}

/// `GET path` on the agent's metrics address: status code and body. Runs
/// on a thread inside the server namespace.
fn http_get(path: &str) -> anyhow::Result<(u16, String)> {
    let mut conn = TcpStream::connect(METRICS_ADDR)?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(conn, "GET {path} HTTP/1.0\r\nHost: {METRICS_ADDR}\r\n\r\n")?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no HTTP status in the answer to {path}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok((code, body))
}

/// `read_ms` of the agent's `inventory loaded` line (JSON or text logs).
fn read_time(log: &str) -> Option<Duration> {
    field_ms(
        log.lines().find(|l| l.contains("inventory loaded"))?,
        "read_ms",
    )
}

/// The milliseconds of field `name` in a log line (JSON or text).
fn field_ms(line: &str, name: &str) -> Option<Duration> {
    let rest = &line[line.find(name)? + name.len()..];
    let number: String = rest
        .trim_start_matches(['"', ':', '='])
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let ms: f64 = number.parse().ok()?;
    Some(Duration::from_secs_f64(ms / 1e3))
}

/// The numbers of the first `"key": [..]` array in bpftool's JSON.
fn json_array(json: &str, key: &str) -> Option<Vec<u64>> {
    let rest = &json[json.find(&format!("\"{key}\""))?..];
    let inner = &rest[rest.find('[')? + 1..rest.find(']')?];
    inner
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().ok())
        .collect()
}

/// The first `"key": number` in bpftool's JSON.
fn json_number(json: &str, key: &str) -> Option<u64> {
    let rest = &json[json.find(&format!("\"{key}\""))? + key.len() + 2..];
    let digits: String = rest
        .trim_start_matches([':', ' '])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_time_is_taken_from_json_and_text_logs() {
        let json = r#"{"level":"INFO","message":"inventory loaded","hosts":3,"read_ms":12.5}"#;
        assert_eq!(read_time(json), Some(Duration::from_micros(12_500)));
        let text = "INFO pxe_agent::app: inventory loaded hosts=3 read_ms=7";
        assert_eq!(read_time(text), Some(Duration::from_millis(7)));
        assert_eq!(read_time("INFO inventory loaded hosts=3"), None);
    }

    #[test]
    fn bpftool_fields_are_read() {
        let prog = r#"{"id":42,"type":"xdp","map_ids":[7,8,19],"btf_id":3}"#;
        assert_eq!(json_array(prog, "map_ids"), Some(vec![7, 8, 19]));
        let map = r#"{"id":7,"type":"hash","bytes_memlock": 166273024,"frozen":0}"#;
        assert_eq!(json_number(map, "bytes_memlock"), Some(166_273_024));
    }
}

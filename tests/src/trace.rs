//! `pxe-agent trace MAC|HOST` against a running agent: the XDP verdicts and
//! the slow path's answers of the traced MAC (named by MAC or by host name)
//! appear, another MAC's do not, and the MAC leaves the XDP filter when the
//! last watcher goes. `pxe-agent status` of the same agent: ready, the
//! interface's XDP attach mode (as `/metrics` says it too), the inventory
//! and the hosts per stage.

use std::{
    fs,
    process::Stdio,
    thread,
    time::{Duration, Instant},
};

use xtask::ChildGuard;

use crate::{
    agent::{Served, agent_bin},
    slow_path::INVENTORY,
};

const TRACED: &str = "52:54:00:12:34:56";
/// Unknown to the inventory: answered from the pool by the slow path.
const UNTRACED: &str = "52:54:00:aa:bb:07";

/// A plain PXE ROM: answered in the kernel.
const PXE: &[&str] = &["-V", "PXEClient", "-x", "0x5d:0000"];
/// iPXE (user class "iPXE"): passed up and answered by the slow path.
const IPXE: &[&str] = &[
    "-V",
    "PXEClient",
    "-x",
    "0x5d:0000",
    "-x",
    "0x4d:0469505845",
];

struct Tracer {
    _child: ChildGuard,
    out: std::path::PathBuf,
    err: std::path::PathBuf,
}

impl Tracer {
    /// `pxe-agent trace TARGET EXTRA...`, TARGET a MAC or a host name.
    fn start(served: &Served, name: &str, target: &str, extra: &[&str]) -> Tracer {
        let (out, err) = (
            served.dir.path(&format!("{name}.out")),
            served.dir.path(&format!("{name}.err")),
        );
        let child = ChildGuard::spawn(
            served
                .lab
                .cmd_in(served.lab.server_ns(), agent_bin())
                .args(["trace", target])
                .args(extra)
                .stdin(Stdio::null())
                .stdout(fs::File::create(&out).expect("trace output"))
                .stderr(fs::File::create(&err).expect("trace errors")),
        )
        .expect("spawn pxe-agent trace");
        let tracer = Tracer {
            _child: child,
            out,
            err,
        };
        tracer.wait_for(served, "registered", |t| {
            fs::read_to_string(&t.err).is_ok_and(|e| e.contains("tracing "))
        });
        tracer
    }

    fn lines(&self) -> Vec<String> {
        fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn wait_for(&self, served: &Served, what: &str, done: impl Fn(&Tracer) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "trace never showed {what}; trace:\n{}\nerrors:\n{}\nagent log:\n{}",
                self.lines().join("\n"),
                fs::read_to_string(&self.err).unwrap_or_default(),
                served.log()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the trace holds a line with every word of `words`.
    fn expect(&self, served: &Served, words: &[&str]) {
        self.wait_for(served, &words.join(" "), |t| {
            t.lines()
                .iter()
                .any(|l| words.iter().all(|w| l.contains(w)))
        });
    }
}

fn traced_macs(served: &Served) -> u64 {
    served.stats()["pxe_traced_macs"]
}

#[test]
fn trace_follows_one_mac_through_the_fast_and_the_slow_path() {
    let served = Served::start("trace", INVENTORY);
    let tracer = Tracer::start(&served, "trace", TRACED, &[]);
    // A second watcher of the same MAC, named by its host name, that leaves
    // after two events.
    let counted = Tracer::start(&served, "counted", "node-1", &["--count", "2"]);
    assert_eq!(traced_macs(&served), 1, "one MAC, two watchers");

    served.set_client_mac(TRACED);
    let lease = served.udhcpc(PXE);
    assert_eq!(lease["ip"], "10.66.1.10");
    tracer.expect(&served, &["xdp", "tx_offer", "XDP_TX offer 10.66.1.10"]);
    tracer.expect(&served, &["xdp", "tx_ack", "XDP_TX ack 10.66.1.10"]);

    let lease = served.udhcpc(IPXE);
    assert_eq!(lease["ip"], "10.66.1.10");
    tracer.expect(&served, &["xdp", "pass_ipxe", "XDP_PASS"]);
    tracer.expect(&served, &["dhcp", "offer", "Discover", "10.66.1.10"]);
    tracer.expect(&served, &["dhcp", "ack", "Request", "10.66.1.10"]);

    // The counted watcher printed its two events and left; the MAC is
    // still traced for the other one.
    counted.wait_for(&served, "two events", |t| t.lines().len() == 2);
    assert!(
        counted.lines()[0].contains("tx_offer"),
        "{:?}",
        counted.lines()
    );
    assert_eq!(traced_macs(&served), 1);

    // Another machine's requests, through both paths, leave no line; the
    // traced MAC's next exchange shows the trace is still live after them.
    let before = tracer.lines().len();
    served.set_client_mac(UNTRACED);
    let lease = served.udhcpc(PXE);
    assert!(lease["ip"].starts_with("10.66.200."), "{lease:?}");
    served.set_client_mac(TRACED);
    served.udhcpc(PXE);
    tracer.wait_for(&served, "the second exchange", |t| {
        t.lines().len() >= before + 2
    });
    thread::sleep(Duration::from_millis(500));
    let after = tracer.lines();
    assert_eq!(
        after.len(),
        before + 2,
        "lines besides the traced exchange: {:?}",
        &after[before..]
    );
    assert!(after[before].contains("tx_offer") && after[before + 1].contains("tx_ack"));

    // The last watcher leaves: the MAC leaves the filter (noticed at the
    // next heartbeat).
    drop(tracer);
    let deadline = Instant::now() + Duration::from_secs(10);
    while traced_macs(&served) != 0 {
        assert!(
            Instant::now() < deadline,
            "MAC still traced 10 s after its watchers left"
        );
        thread::sleep(Duration::from_millis(200));
    }

    // A name no host has is refused, saying so.
    let unknown = served
        .lab
        .cmd_in(served.lab.server_ns(), agent_bin())
        .args(["trace", "node-9"])
        .output()
        .expect("run pxe-agent trace");
    let err = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        !unknown.status.success() && err.contains("\"node-9\" is neither a MAC"),
        "{err}"
    );

    status_of_the_running_agent(&served);
}

/// `pxe-agent status` of an agent that served node-1 and one unknown
/// machine: ready, its one interface in the XDP mode the lab asked for
/// (native on veth), which `/metrics` reports too, the inventory's one
/// host at the DHCP stage.
fn status_of_the_running_agent(served: &Served) {
    let json: serde_json::Value =
        serde_json::from_str(&served.cli(&["status", "--format", "json"])).expect("status JSON");
    let iface = served.lab.server_if();
    assert_eq!(json["ready"], true, "{json}");
    assert_eq!(json["problems"], serde_json::json!([]), "{json}");
    assert_eq!(
        json["interfaces"],
        serde_json::json!([{"name": iface, "xdp_mode": "native"}]),
        "{json}"
    );
    assert_eq!(json["inventory"]["generation"], 1, "{json}");
    assert_eq!(json["inventory"]["hosts"], 1, "{json}");
    assert_eq!(json["stages"], serde_json::json!({"dhcp": 1}), "{json}");
    assert!(json.get("peers").is_none(), "no peers: {json}");

    let text = served.cli(&["status"]);
    assert!(text.starts_with("ready:       yes\n"), "{text}");
    assert!(
        text.contains(&format!("interface:   {iface} (XDP native)")),
        "{text}"
    );
    assert!(text.contains("stages:      dhcp 1\n"), "{text}");

    let stats = served.stats();
    let mode =
        |m: &str| stats[&format!("pxe_xdp_attach_mode{{interface=\"{iface}\",mode=\"{m}\"}}")];
    assert_eq!(
        ["native", "generic", "offload", "none"].map(mode),
        [1, 0, 0, 0]
    );
}

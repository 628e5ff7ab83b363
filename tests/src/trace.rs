//! `pxe-agent trace MAC` against a running agent: the XDP verdicts and the
//! slow path's answers of the traced MAC appear, another MAC's do not, and
//! the MAC leaves the XDP filter when the last watcher goes.

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
    fn start(served: &Served, name: &str, extra: &[&str]) -> Tracer {
        let (out, err) = (
            served.dir.path(&format!("{name}.out")),
            served.dir.path(&format!("{name}.err")),
        );
        let child = ChildGuard::spawn(
            served
                .lab
                .cmd_in(served.lab.server_ns(), agent_bin())
                .args(["trace", TRACED])
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
    let tracer = Tracer::start(&served, "trace", &[]);
    // A second watcher of the same MAC that leaves after two events.
    let counted = Tracer::start(&served, "counted", &["--count", "2"]);
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
}

//! Restarts without a gap (`run --pin-dir`): the XDP program, its link and
//! its maps pinned in bpffs keep answering known hosts while no agent runs;
//! the next agent adopts them, applies the inventory as it is now, and
//! replaces a program of another version through the same link; `pxe-agent
//! detach` removes it all. Each test mounts a bpffs instance of its own at a
//! scratch directory, never /sys/fs/bpf.

use std::{
    fs,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use aya::{
    maps::{HashMap, MapData},
    programs::{
        Xdp, XdpMode,
        links::{FdLink, PinnedLink},
    },
};
use pxe_agent::xdp::pin;
use pxe_ebpf_common::{HOSTS_MAP, HostRecord, MacKey, PASS_PROGRAM_NAME};

use crate::{
    agent::{Privileges, Served, agent_bin, assert_daemonset_privileges},
    loadgen::{self, Options},
    mount::Mount,
    raw::in_netns,
    reload::healthz,
    slow_path::INVENTORY,
};

/// A bpffs instance of the test's own: a fresh instance per mount, so
/// tests running at once never share pins.
pub(crate) struct Bpffs {
    mount: Mount,
}

impl Bpffs {
    pub(crate) fn mount(name: &str) -> Bpffs {
        Bpffs {
            mount: Mount::new(name, "bpf", None),
        }
    }

    /// The `--pin-dir` given to the agent: a directory it creates.
    fn pin_dir(&self) -> PathBuf {
        self.mount.path().join("pxe-agent")
    }

    pub(crate) fn pin_arg(&self) -> String {
        self.pin_dir().to_str().expect("utf-8 path").to_string()
    }
}

/// The program attached to the server end, as the kernel reports it.
pub(crate) fn attached(served: &Served) -> Option<u32> {
    let ns = served.lab.server_ns().to_string();
    let iface = served.lab.server_if().to_string();
    in_netns(&ns, move || pxe_agent::netdev::xdp_program_id(&iface))
        .expect("enter server namespace")
        .expect("read the XDP state")
}

/// The link pinned for the server end: its id and its program's.
fn pinned_link(served: &Served, pins: &Path) -> (u32, u32) {
    let path = pins.join(served.lab.server_if()).join("link");
    let link =
        PinnedLink::from_pin(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let info = FdLink::from(link).info().expect("link info");
    (info.id(), info.program_id())
}

/// The ids of the maps pinned for the server end, by name: the same ids
/// after a restart mean the same maps, counters and rings included.
fn pinned_map_ids(served: &Served, pins: &Path) -> Vec<(&'static str, u32)> {
    let dir = pins.join(served.lab.server_if());
    pin::MAPS
        .iter()
        .map(|name| {
            let path = dir.join(name);
            let map =
                MapData::from_pin(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
            (*name, map.info().expect("map info").id())
        })
        .collect()
}

/// Checks that the agent runs with the `privileges` it was started with.
fn assert_privileges(served: &Served) {
    if served.privileges == Privileges::DaemonSet {
        assert_daemonset_privileges(served.agent_pid());
    }
}

/// The MACs the pinned hosts map holds records for.
fn pinned_macs(served: &Served, pins: &Path) -> Vec<[u8; 6]> {
    let path = pins.join(served.lab.server_if()).join(HOSTS_MAP);
    let map = MapData::from_pin(&path).expect("open the pinned hosts map");
    let map: HashMap<MapData, MacKey, HostRecord> =
        HashMap::try_from(aya::maps::Map::HashMap(map)).expect("a hash map");
    let mut macs: Vec<[u8; 6]> = map.keys().filter_map(Result::ok).map(|k| k.mac).collect();
    macs.sort_unstable();
    macs.dedup();
    macs
}

/// `INVENTORY` plus `n` known hosts 02:5e:00:00:00:01.. at 10.66.3.x.
pub(crate) fn inventory_with(n: u8) -> (String, Vec<[u8; 6]>) {
    let mut text = INVENTORY.to_string();
    let mut macs = Vec::new();
    for i in 1..=n {
        let mac = [0x02, 0x5e, 0, 0, 0, i];
        text.push_str(&format!(
            "  - {{mac: \"02:5e:00:00:00:{i:02x}\", ip: 10.66.3.{i}, profile: worker}}\n"
        ));
        macs.push(mac);
    }
    (text, macs)
}

const NODE1: &str = "52:54:00:12:34:56";
const PXE: [&str; 4] = ["-V", "PXEClient", "-x", "0x5d:0000"];

/// Attaches the pass-through program (from the agent's own object) to
/// `iface` in `ns` and pins its link in `dir`, as an agent of another
/// version would leave it; the link's id and its program's.
fn pin_pass_program(ns: &str, iface: &str, mode: XdpMode, dir: &Path) -> (u32, u32) {
    let (iface, dir) = (iface.to_string(), dir.to_path_buf());
    in_netns(ns, move || {
        let mut ebpf = aya::Ebpf::load(pxe_agent::xdp::loader::object()).expect("load");
        let prog: &mut Xdp = ebpf
            .program_mut(PASS_PROGRAM_NAME)
            .expect("pass program")
            .try_into()
            .expect("an XDP program");
        prog.load().expect("verify");
        let id = prog.attach(&iface, mode).expect("attach");
        let link: FdLink = prog
            .take_link(id)
            .expect("take link")
            .try_into()
            .expect("a bpf_link");
        let info = link.info().expect("link info");
        fs::create_dir_all(&dir).expect("pin directory");
        link.pin(dir.join("link")).expect("pin the link");
        (info.id(), info.program_id())
    })
    .expect("enter server namespace")
}

#[test]
fn kill_9_under_load_leaves_no_known_host_unanswered() {
    kill_9_under_load("pxkill9", Privileges::Root);
}

/// The DaemonSet's capabilities (no CAP_SYS_ADMIN) are enough to adopt the
/// program unchanged, on its maps.
#[test]
fn kill_9_under_load_as_the_daemonset_runs_it_keeps_the_program_and_its_maps() {
    kill_9_under_load("pxkill9ds", Privileges::DaemonSet);
}

/// Known hosts under load, `kill -9` of an agent started with `privileges`
/// and a restart the same way: every request answered, the same program
/// and the same maps after the restart.
fn kill_9_under_load(name: &str, privileges: Privileges) {
    let bpffs = Bpffs::mount(name);
    let (inventory, macs) = inventory_with(200);
    let pin = bpffs.pin_arg();
    let mut served = Served::start_as(name, &inventory, &["--pin-dir", &pin], privileges);
    assert_privileges(&served);
    let before = attached(&served).expect("a program attached");
    let maps = pinned_map_ids(&served, &bpffs.pin_dir());
    let opts = Options {
        iface: served.lab.client_if().to_string(),
        send_iface: None,
        macs,
        rate: Some(2_000),
        duration: Duration::from_secs(6),
        drain: Duration::from_secs(1),
        timeout: Duration::from_millis(500),
        window: 4_096,
        user_class: None,
        relay: None,
    };
    let ns = served.lab.client_ns().to_string();
    let load = thread::spawn(move || in_netns(&ns, move || loadgen::run(&opts)));
    thread::sleep(Duration::from_secs(2));
    let killed = Instant::now();
    let status = served.signal_agent(libc::SIGKILL);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    served.restart(&["--pin-dir", &pin]);
    let gap = killed.elapsed();
    assert_privileges(&served);
    let report = load
        .join()
        .expect("load thread")
        .expect("enter client namespace")
        .expect("load generator");
    let unanswered_discovers = report.discovers - report.offers;
    let unanswered_requests = report.requests - report.acks;
    let sent = report.discovers + report.requests;
    let answered = report.offers + report.acks;
    println!(
        "restart under load: sent {sent} requests ({} DISCOVER, {} REQUEST), answered {answered}, \
         unanswered {} ({unanswered_discovers} DISCOVER, {unanswered_requests} REQUEST); \
         gap from kill -9 to the new agent ready: {} ms; {}",
        report.discovers,
        report.requests,
        sent - answered,
        gap.as_millis(),
        report.line()
    );
    assert!(
        report.discovers > 10_000,
        "the load was too thin to say anything: {}",
        report.line()
    );
    assert_eq!(
        sent - answered,
        0,
        "requests went unanswered across the restart; agent log:\n{}",
        served.log()
    );
    assert_eq!(
        attached(&served),
        Some(before),
        "the program was replaced; agent log:\n{}",
        served.log()
    );
    assert_eq!(
        pinned_map_ids(&served, &bpffs.pin_dir()),
        maps,
        "the maps were replaced"
    );
    assert!(
        served
            .log()
            .contains("adopted the pinned XDP program unchanged"),
        "{}",
        served.log()
    );
}

#[test]
fn a_restarted_agent_adopts_the_program_and_applies_the_inventory_changed_meanwhile() {
    adopts_and_applies_the_inventory_changed_meanwhile("pxadopt", Privileges::Root);
}

/// The same under the DaemonSet's capabilities: the program id, the link,
/// the maps and the counters' count all survive the restart.
#[test]
fn as_the_daemonset_runs_it_a_restarted_agent_adopts_the_program_and_its_maps() {
    adopts_and_applies_the_inventory_changed_meanwhile("pxadoptds", Privileges::DaemonSet);
}

/// An agent started with `privileges` serves and pins, is killed with
/// `kill -9`, and the inventory changes; the pinned program answers
/// meanwhile, and the next agent, started the same way, adopts it and its
/// maps unchanged and applies the change.
fn adopts_and_applies_the_inventory_changed_meanwhile(name: &str, privileges: Privileges) {
    let bpffs = Bpffs::mount(name);
    let pin = bpffs.pin_arg();
    let (inventory, macs) = inventory_with(1);
    let mut served = Served::start_as(name, &inventory, &["--pin-dir", &pin], privileges);
    assert_privileges(&served);
    let program = attached(&served).expect("a program attached");
    let maps = pinned_map_ids(&served, &bpffs.pin_dir());
    let (link, linked) = pinned_link(&served, &bpffs.pin_dir());
    assert_eq!(linked, program);
    served.set_client_mac(NODE1);
    assert_eq!(served.udhcpc(&PXE)["ip"], "10.66.1.10");
    let acks = served.counter("tx_ack");
    assert!(acks >= 1);
    served.signal_agent(libc::SIGKILL);

    // No agent: the pinned program still answers, from the pinned map.
    assert_eq!(attached(&served), Some(program));
    assert_eq!(served.udhcpc(&PXE)["ip"], "10.66.1.10");
    assert!(pinned_macs(&served, &bpffs.pin_dir()).contains(&macs[0]));

    // Meanwhile node-1 moves and the other host goes.
    served.replace_inventory(&INVENTORY.replace("ip: 10.66.1.10", "ip: 10.66.1.77"));
    served.restart(&["--pin-dir", &pin]);
    assert_privileges(&served);
    assert_eq!(
        attached(&served),
        Some(program),
        "same program kept; agent log:\n{}",
        served.log()
    );
    assert_eq!(pinned_link(&served, &bpffs.pin_dir()), (link, program));
    assert_eq!(
        pinned_map_ids(&served, &bpffs.pin_dir()),
        maps,
        "same maps kept"
    );
    assert!(
        served
            .log()
            .contains("adopted the pinned XDP program unchanged"),
        "{}",
        served.log()
    );
    assert_eq!(served.udhcpc(&PXE)["ip"], "10.66.1.77");
    assert!(
        !pinned_macs(&served, &bpffs.pin_dir()).contains(&macs[0]),
        "the removed host is still in the map"
    );
    // The counters map was adopted too: the count goes on.
    assert!(
        served.counter("tx_ack") >= acks + 2,
        "the fast path's counters restarted from zero"
    );
    // And the health check accepts the adopted program.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (code, body) = healthz(&served);
        if code == "200" {
            break;
        }
        assert!(Instant::now() < deadline, "healthz {code}: {body}");
        thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_program_of_another_version_is_replaced_through_the_same_link() {
    let bpffs = Bpffs::mount("replace");
    let pin = bpffs.pin_arg();
    let pins = bpffs.pin_dir();
    let mut old = (0, 0);
    let old_ref = &mut old;
    let served =
        Served::start_prepared("pxreplace", INVENTORY, &["--pin-dir", &pin], None, |lab| {
            // Another program on a pinned link, as an older agent leaves it:
            // the pass-through one from the same object.
            let ns = lab.server_ns().to_string();
            let iface = lab.server_if().to_string();
            let dir = pins.join(&iface);
            *old_ref = pin_pass_program(&ns, &iface, XdpMode::Driver, &dir);
        });
    let (old_link, old_program) = old;
    let now = attached(&served).expect("a program attached");
    assert_ne!(now, old_program, "the old program still runs");
    assert_eq!(
        pinned_link(&served, &pins),
        (old_link, now),
        "not the same link"
    );
    let log = served.log();
    assert!(
        log.contains(&format!(
            "replaced its program {old_program} -> {now} atomically, on new maps"
        )),
        "{log}"
    );
    served.set_client_mac(NODE1);
    let acks = served.counter("tx_ack");
    assert_eq!(served.udhcpc(&PXE)["ip"], "10.66.1.10");
    assert!(served.counter("tx_ack") > acks, "not answered by XDP");
    // The maps pinned are the new program's, with no leftovers.
    let mut files: Vec<String> = fs::read_dir(pins.join(served.lab.server_if()))
        .expect("pin directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "BODIES",
            "COUNTERS",
            "EVENTS",
            "EVENT_HEADS",
            "HOSTS",
            "TRACE",
            "TRACED",
            "TRACE_GATE",
            "link",
            "program"
        ]
    );
}

#[test]
fn detach_removes_the_link_and_the_pins_and_is_idempotent() {
    let bpffs = Bpffs::mount("detach");
    let pin = bpffs.pin_arg();
    let mut served = Served::start_with("pxdetach", INVENTORY, &["--pin-dir", &pin]);
    let program = attached(&served).expect("a program attached");
    // SIGTERM, as a rolling update stops the pod: the program stays.
    assert!(served.signal_agent(libc::SIGTERM).success());
    assert_eq!(attached(&served), Some(program));
    served.restart(&["--pin-dir", &pin]);
    assert_eq!(attached(&served), Some(program));
    // Detach while the agent runs and holds the link open: forced.
    let out = served.cli(&["detach", "--pin-dir", &pin]);
    let iface = served.lab.server_if().to_string();
    assert!(
        out.contains(&format!("{iface}: link detached and unpinned")) && out.contains("HOSTS"),
        "{out}"
    );
    assert_eq!(attached(&served), None, "a program is still attached");
    assert!(!bpffs.pin_dir().exists(), "the pin directory is left");
    let again = served.cli(&["detach", "--pin-dir", &pin]);
    assert!(again.contains("nothing pinned"), "{again}");
    let off = served
        .lab
        .cmd_in(served.lab.server_ns(), agent_bin())
        .args(["detach", "--pin-dir", "/tmp"])
        .output()
        .expect("run detach");
    assert!(!off.status.success());
    assert!(
        String::from_utf8_lossy(&off.stderr).contains("mount -t bpf bpf /sys/fs/bpf"),
        "{}",
        String::from_utf8_lossy(&off.stderr)
    );
}

#[test]
fn without_a_pin_dir_kill_9_leaves_nothing_attached() {
    let mut served = Served::start("pxnopin", INVENTORY);
    assert!(attached(&served).is_some());
    served.signal_agent(libc::SIGKILL);
    assert_eq!(attached(&served), None);
}

#[test]
fn a_pinned_link_detached_meanwhile_is_replaced_by_a_fresh_attachment() {
    let bpffs = Bpffs::mount("stale");
    let pin = bpffs.pin_arg();
    let mut served = Served::start_with("pxstale", INVENTORY, &["--pin-dir", &pin]);
    let (link, _) = pinned_link(&served, &bpffs.pin_dir());
    served.signal_agent(libc::SIGKILL);
    // Detached behind the pins' back: the link object stays pinned, defunct.
    served
        .lab
        .run_in(
            served.lab.server_ns(),
            &["bpftool", "link", "detach", "id", &link.to_string()],
        )
        .expect("detach the XDP link");
    assert_eq!(attached(&served), None);
    served.restart(&["--pin-dir", &pin]);
    let log = served.log();
    assert!(
        log.contains("removing the stale link pin") && log.contains("attached fresh and pinned"),
        "{log}"
    );
    let program = attached(&served).expect("a program attached");
    let (new_link, linked) = pinned_link(&served, &bpffs.pin_dir());
    assert_ne!(new_link, link);
    assert_eq!(linked, program);
    served.set_client_mac(NODE1);
    assert_eq!(served.udhcpc(&PXE)["ip"], "10.66.1.10");
}

#[test]
fn pins_of_an_interface_no_longer_served_are_detached() {
    let bpffs = Bpffs::mount("unserved");
    let pin = bpffs.pin_arg();
    let pins = bpffs.pin_dir();
    let served =
        Served::start_prepared("pxunserved", INVENTORY, &["--pin-dir", &pin], None, |lab| {
            // An interface an earlier agent served, its program left pinned.
            let ns = lab.server_ns().to_string();
            for args in [
                &[
                    "ip", "link", "add", "ghost0", "type", "veth", "peer", "name", "ghost1",
                ][..],
                &["ip", "link", "set", "ghost0", "up"],
            ] {
                lab.run_in(&ns, args).expect("add the interface");
            }
            let dir = pins.join("ghost0");
            pin_pass_program(&ns, "ghost0", XdpMode::Skb, &dir);
        });
    let ns = served.lab.server_ns().to_string();
    let ghost = in_netns(&ns, || pxe_agent::netdev::xdp_program_id("ghost0"))
        .expect("enter server namespace")
        .expect("read the XDP state");
    assert_eq!(ghost, None, "the unserved interface still runs a program");
    assert!(!pins.join("ghost0").exists());
    assert!(
        served
            .log()
            .contains("detached the pinned XDP program of an interface no longer served"),
        "{}",
        served.log()
    );
    assert!(attached(&served).is_some());
}

/// A log line without its terminal colour sequences (`ESC [ ... m`).
fn without_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `pxe-agent status --pin-dir DIR` in the server namespace, where no
/// agent answers: its exit status and standard output.
fn status_without_agent(served: &Served, pin: &str) -> (std::process::ExitStatus, String) {
    let out = served
        .lab
        .cmd_in(served.lab.server_ns(), agent_bin())
        .args(["status", "--pin-dir", pin])
        .env_remove("PXE_AGENT_ADDR")
        .output()
        .expect("run pxe-agent status");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn a_stopped_agent_logs_and_status_reports_the_pinned_program_that_keeps_answering() {
    let name = "pxpinstat";
    let bpffs = Bpffs::mount(name);
    let pin = bpffs.pin_arg();
    let (inventory, _) = inventory_with(5);
    let mut served = Served::start_as(
        name,
        &inventory,
        &["--pin-dir", &pin],
        Privileges::DaemonSet,
    );
    assert_privileges(&served);
    let program = attached(&served).expect("a program attached");
    let iface = served.lab.server_if().to_string();
    let attached_line =
        format!("XDP program id {program} still attached to {iface}: answering the 6 known hosts");

    // SIGTERM: the agent says at exit that the program stays and answers.
    let status = served.signal_agent(libc::SIGTERM);
    assert!(status.success(), "agent did not stop cleanly: {status}");
    let log = served.log();
    let exit_line = log
        .lines()
        .find(|l| l.contains("exiting with the XDP program pinned"))
        .map(without_colours)
        .unwrap_or_else(|| panic!("no exit line about the pinned program:\n{log}"));
    for part in [
        format!("program={program}"),
        format!("iface={iface}"),
        "generation=1".to_string(),
        "hosts=6".to_string(),
        format!("pxe-agent detach --pin-dir {pin}"),
    ] {
        assert!(exit_line.contains(&part), "{part:?} not in: {exit_line}");
    }
    let (code, said) = status_without_agent(&served, &pin);
    assert!(!code.success(), "status succeeded without an agent: {said}");
    assert!(
        said.contains(&attached_line),
        "{attached_line:?} not in:\n{said}"
    );

    // kill -9: no exit line, and status says the same.
    served.restart(&["--pin-dir", &pin]);
    assert_eq!(
        attached(&served),
        Some(program),
        "the program was not adopted"
    );
    served.signal_agent(libc::SIGKILL);
    let (code, said) = status_without_agent(&served, &pin);
    assert!(!code.success(), "status succeeded without an agent: {said}");
    assert!(
        said.starts_with("ready:       no\n  agent not reachable at "),
        "{said}"
    );
    assert!(
        said.contains(&attached_line),
        "{attached_line:?} not in:\n{said}"
    );
    assert!(
        said.contains(&format!(
            "pxe-agent detach --pin-dir {pin} --interface {iface}"
        )),
        "{said}"
    );
    // What it says is so: the program answers a known host with no agent.
    served.set_client_mac(NODE1);
    assert_eq!(served.udhcpc(&PXE)["ip"], "10.66.1.10");

    // Once detached, nothing is reported as answering.
    let out = served
        .lab
        .cmd_in(served.lab.server_ns(), agent_bin())
        .args(["detach", "--pin-dir", &pin])
        .output()
        .expect("run pxe-agent detach");
    assert!(out.status.success(), "detach failed: {out:?}");
    let (code, said) = status_without_agent(&served, &pin);
    assert!(!code.success());
    assert!(!said.contains("still attached"), "{said}");
}

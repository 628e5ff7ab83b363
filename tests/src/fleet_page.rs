//! The fleet page in a real browser: an agent serving 10,000 hosts behind
//! a token, on the routed storm topology ([`crate::storm_smoke`]), with
//! Debian's headless Chromium in the server namespace opening `/fleet` on
//! the API listener. The page asks for the token; 200 of the hosts then
//! boot in a storm while the test reads the cells' states from the DOM,
//! clicks a host that has not booted yet and sees its live trace, and
//! takes a screenshot of the storm. At the end every cell shows the stage
//! `/api/v1/hosts` shows.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    time::{Duration, Instant},
};

use serde_json::Value;
use xtask::ChildGuard;

use crate::{
    agent::{API_ADDR, Served},
    browser::Browser,
    storm_smoke::{INVENTORY_HEAD, boot_files, machine, routed_lab, storm_client_bin},
};

const HOSTS: usize = 10_000;
const STORMED: usize = 200;
const CLASSES: [&str; 4] = ["bios", "uefi", "uefi_http", "arm64"];
const TOKEN: &str = "fleet-page-token-0123456789abcdef";
/// Where the screenshot goes; `docs/fleet-page.png` is one of these.
const SCREENSHOT: &str = "fleet-page.png";

/// The storm topology's inventory with `HOSTS` hosts: the first `STORMED`
/// boot in the storm (profile `storm`), the others wait (`spare`).
fn inventory() -> String {
    let spare = INVENTORY_HEAD[INVENTORY_HEAD.find("  - name: storm").expect("profile")..]
        .trim_end_matches("hosts:\n")
        .replace("name: storm", "name: spare");
    let mut out = INVENTORY_HEAD.replace("hosts:\n", &format!("{spare}hosts:\n"));
    for i in 0..HOSTS {
        let (mac, ip) = machine(i);
        let profile = if i < STORMED { "storm" } else { "spare" };
        let _ = writeln!(
            out,
            "  - {{mac: \"{mac}\", ip: {ip}, hostname: node-{i:05}, profile: {profile}, \
             labels: {{rack: r{:02}}}}}",
            i / 250
        );
    }
    out
}

/// The cells' states as the DOM shows them: state -> cells.
const CELL_COUNTS: &str = "(() => { const c = {}; \
     for (const d of document.querySelectorAll('#grid .cell')) \
     c[d.dataset.state] = (c[d.dataset.state] || 0) + 1; return c; })()";

fn counts(value: &Value) -> BTreeMap<String, u64> {
    value
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default()
}

fn count(c: &BTreeMap<String, u64>, state: &str) -> u64 {
    c.get(state).copied().unwrap_or(0)
}

/// Cells in a stage between none and booted.
fn midway(c: &BTreeMap<String, u64>) -> u64 {
    ["dhcp", "tftp", "script", "artifacts"]
        .iter()
        .map(|s| count(c, s))
        .sum()
}

#[test]
fn the_fleet_page_shows_a_storm_and_a_hosts_trace_in_a_browser() {
    let started = Instant::now();
    let (_files, boot_dir, artifacts_dir) = boot_files();
    let tokens = crate::agent::Scratch::new("fleet-tokens");
    let token_file = tokens.path("tokens");
    fs::write(&token_file, format!("ops {TOKEN}\n")).expect("token file");
    let mut served = Served::start_on(
        "pxflp",
        "10.64.0.1/16",
        &inventory(),
        &[
            "--boot-root",
            &boot_dir,
            "--artifacts",
            &artifacts_dir,
            "--api-token-file",
            token_file.to_str().expect("utf-8"),
        ],
        routed_lab,
    );

    let mut browser = Browser::start(&served.lab, served.lab.server_ns(), 1280, 860);
    browser.open(&format!("http://{API_ADDR}/fleet"));
    // No data without the token: the page asks for it.
    browser.wait_for(
        "the page to ask for a token",
        "document.getElementById('auth').classList.contains('shown')",
        Duration::from_secs(10),
    );
    assert_eq!(
        browser.eval("document.querySelectorAll('#grid .cell').length"),
        0
    );
    browser.eval("document.getElementById('auth-token').focus()");
    browser.type_text(TOKEN);
    browser.eval("document.querySelector('#auth button').click()");
    browser.wait_for(
        "10,000 cells",
        &format!("document.querySelectorAll('#grid .cell').length === {HOSTS}"),
        Duration::from_secs(20),
    );
    browser.wait_for(
        "the event stream",
        "document.getElementById('status').className === 'live'",
        Duration::from_secs(10),
    );
    let before = counts(&browser.eval(CELL_COUNTS));
    assert_eq!(
        count(&before, "none"),
        HOSTS as u64,
        "before the storm: {before:?}"
    );
    assert_eq!(
        browser.eval("sessionStorage.getItem('pxe-agent-token') !== null"),
        true
    );

    // Every change of a cell's state, as the DOM sees it: MAC -> states.
    browser.eval(
        "window.changes = new Map(); new MutationObserver(records => { \
           for (const r of records) { const d = r.target; \
             const seen = window.changes.get(d.dataset.mac) || []; \
             if (seen[seen.length - 1] !== d.dataset.state) seen.push(d.dataset.state); \
             window.changes.set(d.dataset.mac, seen); } \
         }).observe(document.getElementById('grid'), \
           {subtree: true, attributes: true, attributeFilter: ['data-state']}); true",
    );

    // The storm: 200 machines starting over 15 s.
    let mut tsv = String::new();
    for i in 0..STORMED {
        let _ = writeln!(tsv, "{}\t{}\t0", machine(i).0, CLASSES[i % 4]);
    }
    let machines = served.dir.path("machines.tsv");
    fs::write(&machines, tsv).expect("machines file");
    let storm_log = fs::File::create(served.dir.path("storm.log")).expect("storm log");
    let mut storm = ChildGuard::spawn(
        served
            .lab
            .cmd_in(served.lab.client_ns(), storm_client_bin())
            .arg("--machines")
            .arg(&machines)
            .args([
                "--server",
                "10.64.0.1",
                "--relay",
                "10.66.0.1",
                "--spread",
                "15",
                "--limit",
                "45",
            ])
            .arg("--out")
            .arg(served.dir.path("out"))
            .stdout(storm_log.try_clone().expect("log"))
            .stderr(storm_log),
    )
    .expect("spawn storm-client");

    // The first cells change colour.
    browser.wait_for(
        "cells to leave `none`",
        &format!(
            "document.querySelectorAll('#grid .cell:not([data-state=none])').length > 0 \
             && document.querySelectorAll('#grid .cell').length === {HOSTS}"
        ),
        Duration::from_secs(15),
    );

    // Click a storm host that has not started yet, and watch its trace.
    let target = browser.eval(&format!(
        "(() => {{ const cells = [...document.querySelectorAll('#grid .cell')].slice(0, {STORMED}); \
         const c = cells.reverse().find(d => d.dataset.state === 'none'); if (!c) return null; \
         c.scrollIntoView({{block: 'center'}}); const r = c.getBoundingClientRect(); \
         return {{mac: c.dataset.mac, x: r.x + r.width / 2, y: r.y + r.height / 2}}; }})()"
    ));
    let mac = target["mac"]
        .as_str()
        .unwrap_or_else(|| panic!("every storm host started before the click: {target}"))
        .to_owned();
    browser.click_at(
        target["x"].as_f64().expect("x"),
        target["y"].as_f64().expect("y"),
    );
    browser.wait_for(
        "the host's panel",
        &format!(
            "document.getElementById('detail').dataset.mac === '{mac}' \
             && document.getElementById('d-name').textContent.startsWith('node-')"
        ),
        Duration::from_secs(10),
    );

    // Read the cells while the storm runs. The screenshot is of the storm
    // halfway, with the clicked host's trace, and cells midway if a
    // reading catches some.
    let mut seen = vec![before.clone()];
    let mut shot: Option<(u64, Vec<u8>)> = None;
    // What makes one better than another: the trace, then cells midway.
    let mut traced = Value::Null;
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let now = counts(&browser.eval(CELL_COUNTS));
        if traced.is_null() {
            let lines = browser.eval(
                "[...document.querySelectorAll('#trace .trace-line')].map(d => d.textContent)",
            );
            if lines.as_array().is_some_and(|l| l.len() >= 2) {
                traced = lines;
            }
        }
        let (booted, mid) = (count(&now, "booted"), midway(&now));
        let halfway = (STORMED as u64 / 5..STORMED as u64 * 9 / 10).contains(&booted);
        let score = 1 + 2 * u64::from(!traced.is_null()) + u64::from(mid > 0);
        if halfway && shot.as_ref().is_none_or(|(best, _)| score > *best) {
            shot = Some((score, browser.screenshot()));
        }
        let done = count(&now, "booted") == STORMED as u64;
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        if done && !traced.is_null() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the storm did not finish on the page: {:?}; trace: {}; storm log:\n{}\nagent log:\n{}",
            seen.last(),
            browser.eval("document.getElementById('trace').textContent"),
            fs::read_to_string(served.dir.path("storm.log")).unwrap_or_default(),
            served.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let status = storm.0.wait().expect("storm-client");
    assert!(
        status.success(),
        "storm-client failed: {}",
        fs::read_to_string(served.dir.path("storm.log")).unwrap_or_default()
    );

    // The cells changed colour as the machines booted: each of the 200
    // changed, to booted at last, and none of the other 9,800; the booted
    // count grew over several readings.
    let changes = browser.eval(&format!(
        "(() => {{ const storm = new Set([...document.querySelectorAll('#grid .cell')] \
             .slice(0, {STORMED}).map(d => d.dataset.mac)); \
           const all = [...window.changes.entries()]; \
           return {{ changed: all.length, \
             others: all.filter(([m]) => !storm.has(m)).length, \
             unbooted: all.filter(([, s]) => s[s.length - 1] !== 'booted').length, \
             midway: all.filter(([, s]) => s.some(x => x !== 'booted' && x !== 'none')).length }}; }})()"
    ));
    assert_eq!(changes["changed"], STORMED, "{changes}");
    assert_eq!(changes["others"], 0, "{changes}");
    assert_eq!(changes["unbooted"], 0, "{changes}");
    let last = seen.last().expect("readings").clone();
    let booted: Vec<u64> = seen.iter().map(|c| count(c, "booted")).collect();
    assert!(
        booted
            .iter()
            .filter(|&&b| b > 0 && b < STORMED as u64)
            .count()
            >= 3,
        "the booted count did not grow in steps: {booted:?}"
    );
    assert_eq!(count(&last, "none"), (HOSTS - STORMED) as u64, "{last:?}");
    assert_eq!(count(&last, "booted"), STORMED as u64, "{last:?}");

    // The host clicked: its trace shows its boot, through the fast path
    // and the boot servers.
    let lines: Vec<&str> = traced
        .as_array()
        .expect("trace lines")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" xdp ") || l.contains(" dhcp ")),
        "no DHCP answer in {mac}'s trace: {lines:?}"
    );
    browser.wait_for(
        "the host's progress to show its phone-home",
        "[...document.querySelectorAll('#d-progress tr')].some(r => \
         r.cells[0].textContent === 'booted' && r.cells[1].textContent !== '\u{2013}')",
        Duration::from_secs(10),
    );
    let trace = browser.eval("document.getElementById('trace').textContent");
    assert!(
        trace.as_str().is_some_and(|t| t.contains("phone-home")),
        "{mac}'s trace has no phone-home: {trace}"
    );

    // One source of truth: each cell shows the stage `/api/v1/hosts` shows.
    let mismatches = browser.eval(&format!(
        "(async () => {{ \
           const r = await fetch('/api/v1/hosts', {{headers: {{Authorization: 'Bearer {TOKEN}'}}}}); \
           const hosts = await r.json(); const bad = []; \
           for (const h of hosts) {{ \
             const c = document.querySelector(`#grid .cell[data-mac='${{h.mac}}']`); \
             const want = h.stage || 'none'; \
             if (!c || c.dataset.state !== want) bad.push([h.mac, want, c && c.dataset.state]); \
           }} \
           return {{hosts: hosts.length, bad: bad.slice(0, 10), count: bad.length}}; }})()"
    ));
    assert_eq!(mismatches["hosts"], HOSTS, "{mismatches}");
    assert_eq!(mismatches["count"], 0, "cells unlike the API: {mismatches}");

    // The filters: a label and a state, answered by the agent.
    browser.eval(
        "document.getElementById('f-label').value = 'rack=r00'; \
         document.getElementById('f-state').value = 'booted'; \
         document.getElementById('apply').click()",
    );
    browser.wait_for(
        "the filtered page",
        &format!(
            "document.querySelectorAll('#grid .cell[data-state=booted]').length === {STORMED} \
                  && document.querySelectorAll('#grid .cell').length === {STORMED}"
        ),
        Duration::from_secs(10),
    );

    // The agent stops on SIGTERM with the page's event stream and trace
    // open, and the page says it lost them.
    let status = served.signal_agent(libc::SIGTERM);
    assert!(
        status.success(),
        "agent exit: {status}; log:\n{}",
        served.log()
    );
    browser.wait_for(
        "the page to notice the agent left",
        "document.getElementById('status').className === 'down'",
        Duration::from_secs(10),
    );

    let (_, png) = shot.unwrap_or_else(|| {
        panic!("no reading halfway through the storm after the trace showed: {seen:?}")
    });
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    let path = xtask::target_dir().join(SCREENSHOT);
    fs::write(&path, &png).expect("write screenshot");
    eprintln!(
        "fleet page: {} readings, {} ms in all, cells seen changing: {changes}, \
         screenshot ({} bytes) at {}",
        seen.len(),
        started.elapsed().as_millis(),
        png.len(),
        path.display()
    );
}

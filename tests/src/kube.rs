//! The Kubernetes inventory source end to end: a real agent with `--kube`
//! reading BootHosts, BootProfiles, BootNetworks, Secrets and Metal3
//! BareMetalHosts from the fake API server (`kube_api`; no real API server
//! installs here) in its namespace, answering a real DHCP client from the
//! XDP fast path (and, for hosts with only an IPv6 address, a real
//! `dhclient -6` from the DHCPv6 slow path), and writing status and Events
//! back. Every change made in
//! the "cluster" is timed until it is in force in both paths.

use std::{
    thread,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::{agent::Served, kube_api::FakeApi};

/// The namespace of the objects.
const NS: &str = "pxe";
/// The fixtures, shaped by the CRDs' schemas.
const FIXTURES: &str = include_str!("../fixtures/kube/inventory.yaml");
/// What a change may take to be in force: the agent's target is under a
/// second (watch event, 100 ms debounce, rebuild, map writes); this bound
/// leaves room for a loaded machine.
const IN_FORCE_WITHIN: Duration = Duration::from_secs(3);

const API: &str = "pxe-agent.io/v1alpha1";
const NODE_1: &str = "52:54:00:12:34:56";
const NODE_2: &str = "52:54:00:12:34:57";

fn start(name: &str, extra: &[&str]) -> Served {
    Served::start_kube(name, NS, extra, |api| api.put_yaml(NS, FIXTURES))
}

/// `/api/v1/hosts` of the agent.
fn hosts(served: &Served) -> Vec<Value> {
    let out = served
        .lab
        .cmd_in(served.lab.server_ns(), "curl")
        .args(["-sS", "http://127.0.0.1:9465/api/v1/hosts"])
        .output()
        .expect("curl hosts");
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

fn host_ip(served: &Served, mac: &str) -> Option<String> {
    hosts(served)
        .into_iter()
        .find(|h| h["mac"] == mac)
        .and_then(|h| h["ip"].as_str().map(str::to_owned))
}

/// Polls `done` until it holds; the time it took. Panics after `within`.
fn until(
    served: &Served,
    what: &str,
    within: Duration,
    mut done: impl FnMut() -> bool,
) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < within,
            "{what}: not within {within:?}; agent log:\n{}",
            served.log()
        );
        thread::sleep(Duration::from_millis(20));
    }
    let took = start.elapsed();
    println!("{what}: {} ms", took.as_millis());
    took
}

/// A DHCP exchange from `mac`, answered from XDP: the address offered.
fn dhcp_from_xdp(served: &Served, mac: &str) -> String {
    served.set_client_mac(mac);
    let offers = served.counter("tx_offer");
    let vars = served.udhcpc(&[]);
    assert!(
        served.counter("tx_offer") > offers,
        "the OFFER did not come from XDP; log:\n{}",
        served.log()
    );
    vars["ip"].clone()
}

fn boot_host(name: &str, mac: &str, ip: &str) -> Value {
    json!({
        "apiVersion": API,
        "kind": "BootHost",
        "metadata": {"name": name},
        "spec": {"mac": mac, "ip": ip, "hostname": name, "profile": "worker"},
    })
}

fn condition(object: &Value) -> Option<Value> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Accepted")
        .cloned()
}

fn metric(served: &Served, name: &str) -> u64 {
    served.stats().get(name).copied().unwrap_or(0)
}

#[test]
fn kube_hosts_are_listed_added_changed_and_deleted_in_both_paths() {
    let served = start("pxkube", &[]);
    // The initial list.
    assert_eq!(dhcp_from_xdp(&served, NODE_1), "10.66.1.10");

    // Added.
    let api = served.api();
    api.put("boothosts", NS, &boot_host("node-2", NODE_2, "10.66.1.11"));
    let took = until(&served, "BootHost added in force", IN_FORCE_WITHIN, || {
        host_ip(&served, NODE_2).as_deref() == Some("10.66.1.11")
    });
    assert!(took < IN_FORCE_WITHIN);
    assert_eq!(dhcp_from_xdp(&served, NODE_2), "10.66.1.11");

    // Changed.
    api.put("boothosts", NS, &boot_host("node-2", NODE_2, "10.66.1.22"));
    until(
        &served,
        "BootHost changed in force",
        IN_FORCE_WITHIN,
        || host_ip(&served, NODE_2).as_deref() == Some("10.66.1.22"),
    );
    assert_eq!(dhcp_from_xdp(&served, NODE_2), "10.66.1.22");

    // Deleted: no longer a host, not answered from XDP any more.
    api.delete(API, "boothosts", NS, "node-2");
    until(
        &served,
        "BootHost deleted in force",
        IN_FORCE_WITHIN,
        || host_ip(&served, NODE_2).is_none(),
    );
    served.set_client_mac(NODE_2);
    let offers = served.counter("tx_offer");
    let unknown = served.counter("pass_unknown_host");
    let _ = served
        .client_cmd("busybox")
        .args(["udhcpc", "-q", "-n", "-t", "1", "-T", "1", "-i"])
        .arg(served.lab.client_if())
        .output();
    assert_eq!(
        served.counter("tx_offer"),
        offers,
        "a deleted host was answered"
    );
    assert!(served.counter("pass_unknown_host") > unknown);
    assert!(metric(&served, "pxe_kube_watch_events_total") >= 3);
}

#[test]
fn kube_watch_that_breaks_resumes_and_410_forces_a_relist() {
    let served = start("pxkwatch", &[]);
    let api = served.api();
    // A watch that breaks: the agent watches again from where it was.
    api.drop_watches();
    api.put("boothosts", NS, &boot_host("node-2", NODE_2, "10.66.1.11"));
    until(
        &served,
        "change after a dropped watch in force",
        IN_FORCE_WITHIN,
        || host_ip(&served, NODE_2).is_some(),
    );

    // Compacted history: the next watch from the old resourceVersion is
    // told 410 Gone and the agent lists again.
    // A change the BootHost watch does not see moves the resourceVersion
    // on; compacting there leaves that watch's resourceVersion expired.
    let lists_before = lists_of(api, "boothosts");
    api.put(
        "secrets",
        NS,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "unrelated"}}),
    );
    api.compact();
    api.drop_watches();
    api.put("boothosts", NS, &boot_host("node-2", NODE_2, "10.66.1.33"));
    // The 410 costs one back-off step of the watcher (under a second).
    until(
        &served,
        "change after a 410 in force",
        IN_FORCE_WITHIN + Duration::from_secs(2),
        || host_ip(&served, NODE_2).as_deref() == Some("10.66.1.33"),
    );
    let expired = api
        .log()
        .iter()
        .filter(|r| {
            r["code"] == 410
                && r["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with("/boothosts"))
        })
        .count();
    assert!(expired >= 1, "no watch was told 410");
    assert!(
        lists_of(api, "boothosts") > lists_before,
        "no re-list after the 410; log:\n{}",
        served.log()
    );
    assert_eq!(dhcp_from_xdp(&served, NODE_2), "10.66.1.33");
}

/// A fleet larger than a list page (kube-runtime's watcher asks for 500
/// objects at a time) is read in pages, as the API server serves it, each
/// after the first continuing the list at its resourceVersion, and served
/// whole.
#[test]
fn kube_a_fleet_of_several_list_pages_is_read_whole() {
    const MANY: usize = 1_001;
    let mac = |i: usize| format!("52:54:01:00:{:02x}:{:02x}", i / 256, i % 256);
    let served = Served::start_kube("pxkpage", NS, &[], |api| {
        api.put_yaml(NS, FIXTURES);
        for i in 0..MANY {
            let ip = format!("10.66.{}.{}", 10 + i / 200, 10 + i % 200);
            api.put(
                "boothosts",
                NS,
                &boot_host(&format!("paged-{i:04}"), &mac(i), &ip),
            );
        }
    });
    let paged = hosts(&served)
        .iter()
        .filter(|h| {
            h["mac"]
                .as_str()
                .is_some_and(|m| m.starts_with("52:54:01:00:"))
        })
        .count();
    assert_eq!(paged, MANY, "log:\n{}", served.log());
    let queries: Vec<String> = served
        .api()
        .log()
        .iter()
        .filter(|r| {
            r["method"] == "GET"
                && r["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with("/boothosts"))
                && !r["query"].as_str().unwrap_or("").contains("watch=true")
        })
        .map(|r| r["query"].as_str().unwrap_or("").to_owned())
        .collect();
    assert!(
        queries.len() >= 3
            && queries.iter().all(|q| q.contains("limit=500"))
            && queries.iter().filter(|q| q.contains("continue=")).count() >= 2,
        "the BootHosts were not listed in pages of 500: {queries:?}"
    );
    // The last host, on the last page, answers from XDP.
    assert_eq!(dhcp_from_xdp(&served, &mac(MANY - 1)), "10.66.15.10");
}

/// List (not watch) requests for `resource` so far.
fn lists_of(api: &FakeApi, resource: &str) -> usize {
    api.log()
        .iter()
        .filter(|r| {
            r["method"] == "GET"
                && r["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with(&format!("/{resource}")))
                && !r["query"].as_str().unwrap_or("").contains("watch=true")
        })
        .count()
}

#[test]
fn kube_status_is_written_back_conflicts_are_retried_and_patches_rate_limited() {
    // Twenty more hosts, all needing their first status at once.
    let served = Served::start_kube("pxkstatus", NS, &["--kube-status-qps", "4"], |api| {
        api.put_yaml(NS, FIXTURES);
        for n in 0..20 {
            api.put(
                "boothosts",
                NS,
                &boot_host(
                    &format!("bulk-{n}"),
                    &format!("02:00:00:00:01:{n:02x}"),
                    &format!("10.66.3.{}", n + 1),
                ),
            );
        }
    });
    let api = served.api();
    let status_of = |name: &str| {
        api.get(API, "boothosts", NS, name)
            .and_then(|o| o.get("status").cloned())
    };
    until(
        &served,
        "Accepted condition on node-1",
        Duration::from_secs(15),
        || status_of("node-1").is_some_and(|s| s["conditions"][0]["status"] == "True"),
    );
    // The DHCP exchange shows up in the status.
    dhcp_from_xdp(&served, NODE_1);
    until(
        &served,
        "stage and last DHCP in status",
        Duration::from_secs(15),
        || status_of("node-1").is_some_and(|s| s["stage"] == "dhcp" && s["lastDhcp"].is_string()),
    );
    let status = status_of("node-1").expect("status");
    assert_eq!(status["servingNode"], "node-a");
    assert_eq!(status["observedGeneration"], 1);

    // Every bulk host got its status, no faster than the limit allows.
    until(
        &served,
        "status on every bulk host",
        Duration::from_secs(30),
        || (0..20).all(|n| status_of(&format!("bulk-{n}")).is_some()),
    );
    let patches: Vec<u64> = api
        .log()
        .iter()
        .filter(|r| {
            r["method"] == "PATCH" && r["path"].as_str().is_some_and(|p| p.ends_with("/status"))
        })
        .map(|r| r["at_ms"].as_u64().unwrap_or(0))
        .collect();
    let busiest = patches
        .iter()
        .map(|&from| {
            patches
                .iter()
                .filter(|&&t| t >= from && t < from + 1000)
                .count()
        })
        .max()
        .unwrap_or(0);
    println!(
        "{} status patches, at most {busiest} in one second (qps 4, burst 4)",
        patches.len()
    );
    assert!(patches.len() >= 21, "{} patches", patches.len());
    assert!(
        busiest <= 8,
        "{busiest} patches in one second with --kube-status-qps 4"
    );

    // A stale resourceVersion: two 409s, re-read, retried, written.
    let conflicts = metric(
        &served,
        "pxe_kube_status_patches_total{result=\"conflict\"}",
    );
    api.fail_status(2);
    thread::sleep(Duration::from_millis(1100));
    let before = status_of("node-1").expect("status")["lastDhcp"].clone();
    dhcp_from_xdp(&served, NODE_1);
    until(
        &served,
        "status written after two conflicts",
        Duration::from_secs(15),
        || status_of("node-1").is_some_and(|s| s["lastDhcp"] != before),
    );
    let after = metric(
        &served,
        "pxe_kube_status_patches_total{result=\"conflict\"}",
    );
    println!("conflicts counted: {}", after - conflicts);
    assert!(after >= conflicts + 2, "conflicts {conflicts} -> {after}");
    // Status never touches spec.
    let node = api.get(API, "boothosts", NS, "node-1").expect("node-1");
    assert_eq!(node["spec"]["ip"], "10.66.1.10");
    assert_eq!(node["metadata"]["generation"], 1);
}

#[test]
fn kube_bad_objects_are_refused_with_a_condition_and_an_event_the_rest_serve() {
    let served = Served::start_kube("pxkbad", NS, &[], |api| {
        api.put_yaml(NS, FIXTURES);
        api.put(
            "boothosts",
            NS,
            &boot_host("outside", "52:54:00:00:0b:01", "10.99.0.1"),
        );
        let mut no_secret = boot_host("no-secret", "52:54:00:00:0b:02", "10.66.1.50");
        no_secret["spec"]["bmc"] =
            json!({"address": "ipmi://10.77.0.9", "credentialsName": "nosuch"});
        api.put("boothosts", NS, &no_secret);
    });
    let api = served.api();
    let refused = |name: &str, message: &str| {
        until(
            &served,
            &format!("{name} refused with a condition"),
            Duration::from_secs(15),
            || {
                api.get(API, "boothosts", NS, name)
                    .and_then(|o| condition(&o))
                    .is_some_and(|c| {
                        c["status"] == "False"
                            && c["reason"] == "Invalid"
                            && c["message"] == message
                    })
            },
        );
    };
    refused(
        "outside",
        "host outside (52:54:00:00:0b:01): field ip: 10.99.0.1 is outside every subnet",
    );
    refused(
        "no-secret",
        "bmc.credentialsName: Secret pxe/nosuch not found",
    );
    until(
        &served,
        "one InvalidSpec Event each",
        Duration::from_secs(15),
        || {
            let events = api.list("v1", "events", NS);
            ["outside", "no-secret"].iter().all(|name| {
                events
                    .iter()
                    .filter(|e| {
                        e["reason"] == "InvalidSpec" && e["involvedObject"]["name"] == *name
                    })
                    .count()
                    == 1
            })
        },
    );
    // The others keep serving, from XDP.
    assert_eq!(dhcp_from_xdp(&served, NODE_1), "10.66.1.10");
    assert!(host_ip(&served, "52:54:00:00:0b:01").is_none());
    assert_eq!(metric(&served, "pxe_kube_objects_refused"), 2);
    let node = api.get(API, "boothosts", NS, "node-1").expect("node-1");
    assert_eq!(condition(&node).expect("condition")["status"], "True");
    // Events are created once per generation, not on every rebuild.
    thread::sleep(Duration::from_secs(2));
    let events = api.list("v1", "events", NS);
    assert_eq!(events.len(), 2, "{events:#?}");
    // The password of the Secret that exists never reaches the log.
    assert!(
        !served.log().contains("hunter2-bmc"),
        "a password in the log"
    );
}

#[test]
fn kube_bare_metal_host_is_read_as_a_host_and_never_written() {
    let served = start("pxkbmh", &["--metal3-selector", "pxe-agent.io/serve=true"]);
    let api = served.api();
    // Selected and annotated: answered like a BootHost.
    assert_eq!(dhcp_from_xdp(&served, "52:54:00:12:34:58"), "10.66.1.30");
    let bmh = hosts(&served)
        .into_iter()
        .find(|h| h["mac"] == "52:54:00:12:34:58")
        .expect("the BareMetalHost is a host");
    assert_eq!(bmh["hostname"], "worker-bmh");
    assert_eq!(bmh["bmc"], true);
    // Not selected: not a host.
    assert!(host_ip(&served, "52:54:00:12:34:59").is_none());
    thread::sleep(Duration::from_secs(2));
    let writes: Vec<Value> = api
        .log()
        .into_iter()
        .filter(|r| r["method"] != "GET")
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.contains("baremetalhosts"))
        })
        // The tests' own seeding is curl's.
        .filter(|r| !r["user_agent"].as_str().unwrap_or("").starts_with("curl"))
        .collect();
    assert!(writes.is_empty(), "wrote to BareMetalHosts: {writes:#?}");
    let watched = api.log().into_iter().any(|r| {
        r["path"]
            .as_str()
            .is_some_and(|p| p.contains("baremetalhosts"))
            && r["query"]
                .as_str()
                .is_some_and(|q| q.contains("labelSelector"))
    });
    assert!(watched, "BareMetalHosts read without the selector");
    let untouched = api
        .get("metal3.io/v1alpha1", "baremetalhosts", NS, "worker-bmh")
        .expect("bmh");
    assert!(untouched.get("status").is_none(), "{untouched}");
}

#[test]
fn kube_hosts_with_ipv6_only_get_their_reservations_over_dhcpv6_and_status() {
    let network = json!({
        "apiVersion": API,
        "kind": "BootNetwork",
        "metadata": {"name": "six"},
        "spec": {"subnets": [{"cidr": "fd00:66::/64", "leaseTime": 600, "ra": {}}]},
    });
    let six = json!({
        "apiVersion": API,
        "kind": "BootHost",
        "metadata": {"name": "six-1"},
        "spec": {"mac": "52:54:00:66:00:01", "ipv6": "fd00:66::101", "profile": "worker"},
    });
    let served = Served::start_kube_prepared(
        "pxkube6",
        NS,
        &["--metal3-selector", "pxe-agent.io/serve=true"],
        crate::dhcp6::add_ipv6,
        |api| {
            api.put_yaml(NS, FIXTURES);
            api.put("bootnetworks", NS, &network);
            api.put("boothosts", NS, &six);
        },
    );
    // A BareMetalHost with an IPv6 address and no IPv4 one is a host too.
    let api = served.api();
    api.put(
        "baremetalhosts",
        NS,
        &json!({
            "apiVersion": "metal3.io/v1alpha1",
            "kind": "BareMetalHost",
            "metadata": {
                "name": "six-bmh",
                "labels": {"pxe-agent.io/serve": "true"},
                "annotations": {
                    "pxe-agent.io/ipv6": "fd00:66::102",
                    "pxe-agent.io/profile": "worker",
                },
            },
            "spec": {"bootMACAddress": "52:54:00:66:00:02", "online": true},
        }),
    );
    let ipv6_of = |mac: &str| {
        hosts(&served)
            .into_iter()
            .find(|h| h["mac"] == mac)
            .and_then(|h| h["ipv6"].as_str().map(str::to_owned))
    };
    until(
        &served,
        "the IPv6-only BareMetalHost in force",
        IN_FORCE_WITHIN,
        || ipv6_of("52:54:00:66:00:02").as_deref() == Some("fd00:66::102"),
    );
    assert_eq!(
        ipv6_of("52:54:00:66:00:01").as_deref(),
        Some("fd00:66::101")
    );
    assert_eq!(host_ip(&served, "52:54:00:66:00:01"), None);

    for (mac, address) in [
        ("52:54:00:66:00:01", "fd00:66::101"),
        ("52:54:00:66:00:02", "fd00:66::102"),
    ] {
        crate::dhcp6::become_machine(&served, mac);
        let lease = crate::dhcp6::dhclient6(&served, mac, 15);
        assert!(
            lease.contains(&format!("iaaddr {address} {{")),
            "dhclient -6 as {mac} did not get {address}:\n{lease}\nagent log:\n{}",
            served.log()
        );
    }
    // The BootHost's status says what the agent saw, as for IPv4.
    until(
        &served,
        "the BootHost's status shows its DHCPv6 exchange",
        IN_FORCE_WITHIN,
        || {
            api.get(API, "boothosts", NS, "six-1").is_some_and(|o| {
                o.pointer("/status/stage").and_then(Value::as_str) == Some("dhcp")
                    && o.pointer("/status/lastDhcp").is_some_and(Value::is_string)
            })
        },
    );
    let accepted = api
        .get(API, "boothosts", NS, "six-1")
        .as_ref()
        .and_then(condition)
        .expect("an Accepted condition");
    assert_eq!(accepted["status"], "True", "{accepted}");
}

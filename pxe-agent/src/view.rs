//! What the API, the CLI and the Kubernetes status show of the agent's
//! state: hosts with their boot progress, power, recovery and netboot
//! state, leases, how the discovery pools are shared, and the one-page
//! status (readiness, interfaces, inventory, stages, peers). Built from the
//! shared state, the control task's view and the BMC fallbacks; the JSON
//! of these types is the API's answer.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
};

use serde::{Deserialize, Serialize};

use crate::{
    bmc::{Fallbacks, PowerState, driver, fallback::FallbackEvent},
    control::{self, Outcome},
    inventory::{Host, Inventory, Netboot},
    lease::{Lease, Lease6, LeaseState},
    mac::MacAddr,
    netboot::{Actor, NetbootStore, Phase},
    progress::{HostProgress, Stage},
    recovery::{self, Watch},
    share::Share,
    state::State,
};

/// A lease as the API shows it, IPv4 or IPv6 (by its `ip`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct LeaseView {
    /// The client's MAC; an IPv6 lease has one when the client's DUID or
    /// link-local address carried it, else `null`.
    pub mac: Option<MacAddr>,
    pub ip: IpAddr,
    pub state: LeaseState,
    /// Unix seconds.
    pub expires: u64,
    pub hostname: Option<String>,
    /// The client identifier (option 61) of the request that made the
    /// lease, in hex with colons (`01:52:54:00:12:34:56`).
    #[serde(default)]
    pub client_id: Option<String>,
    /// An IPv6 lease's key, with `iaid`: the client's DUID, in hex with
    /// colons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duid: Option<String>,
    /// The IAID of an IPv6 lease's IA_NA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iaid: Option<u32>,
}

/// Bytes in hex with colons.
fn colon_hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

impl From<&Lease> for LeaseView {
    fn from(l: &Lease) -> LeaseView {
        LeaseView {
            mac: Some(MacAddr(l.mac)),
            ip: l.ip.into(),
            state: l.state,
            expires: l.expires,
            hostname: l.hostname.clone(),
            client_id: l.client_id.as_deref().map(colon_hex),
            duid: None,
            iaid: None,
        }
    }
}

impl From<&Lease6> for LeaseView {
    fn from(l: &Lease6) -> LeaseView {
        LeaseView {
            mac: l.mac.map(MacAddr),
            ip: l.ip.into(),
            state: l.state,
            expires: l.expires,
            hostname: l.hostname.clone(),
            client_id: None,
            duid: Some(colon_hex(&l.duid)),
            iaid: Some(l.iaid),
        }
    }
}

/// The agent at a glance (`GET /api/v1/status`, `pxe-agent status`).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct StatusView {
    /// Whether `/healthz` answers 200.
    pub ready: bool,
    /// Why not: `/healthz`'s lines; empty when ready.
    pub problems: Vec<String>,
    /// Each served interface and how the fast path runs there.
    pub interfaces: Vec<InterfaceView>,
    pub inventory: InventoryView,
    /// Hosts by boot stage reached (`dhcp` ... `booted`; `none` for hosts
    /// not seen yet).
    pub stages: BTreeMap<String, usize>,
    /// How the discovery pools are shared; absent without peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers: Option<PeersView>,
}

/// A served interface in the status.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct InterfaceView {
    pub name: String,
    /// How the XDP program is attached: `native`, `generic`, `offload`,
    /// or `none` when it is not (the health check's last look).
    pub xdp_mode: String,
}

/// The inventory in force, in the status.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct InventoryView {
    /// 1 for the inventory loaded at start, one more for each reload put
    /// in force since.
    pub generation: u64,
    pub hosts: usize,
    /// Reloads refused since start (the previous inventory serves on).
    pub reloads_rejected: u64,
}

/// The status of the agent whose state is `state`: `xdp_modes` as the
/// health check found them, `inventory` from the reload's gauges, the
/// stages of `hosts` (the hosts' views).
pub fn status_view(
    state: &State,
    xdp_modes: Vec<(String, &'static str)>,
    inventory: InventoryView,
    hosts: &[HostView],
) -> StatusView {
    let problems = state.health.check();
    let mut stages = BTreeMap::new();
    for h in hosts {
        let stage = h.stage.map_or("none", Stage::as_str);
        *stages.entry(stage.to_string()).or_insert(0) += 1;
    }
    let peers = (*state.share() != crate::share::Share::alone()).then(|| peers_view(state));
    StatusView {
        ready: problems.is_empty(),
        problems,
        interfaces: xdp_modes
            .into_iter()
            .map(|(name, mode)| InterfaceView {
                name,
                xdp_mode: mode.to_string(),
            })
            .collect(),
        inventory,
        stages,
        peers,
    }
}

/// How this agent shares the discovery pools (`GET /api/v1/peers`).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PeersView {
    /// None until a slot is claimed.
    pub slot: Option<u16>,
    pub slots: u16,
    pub live: Vec<u16>,
    /// Whether this agent's own slot is live (it answers unknown MACs).
    pub serving: bool,
    /// RFC 3074 buckets of 256 this agent answers.
    pub buckets: usize,
    /// This agent's slice of each pool: the IPv4 pools', then the IPv6
    /// pools'.
    pub slices: Vec<SliceView>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SliceView {
    pub subnet: String,
    pub start: IpAddr,
    pub end: IpAddr,
}

/// How this agent shares the discovery pools now: what `GET /api/v1/peers`
/// shows.
pub fn peers_view(state: &State) -> PeersView {
    let share = state.share();
    let inv = state.inventory();
    let slices = inv.subnets.iter().filter_map(|sub| {
        let pool = sub.pool?;
        let slice = share.slice(pool.start, pool.end)?;
        Some(SliceView {
            subnet: format!("{}/{}", sub.network, sub.prefix),
            start: (*slice.start()).into(),
            end: (*slice.end()).into(),
        })
    });
    let slices6 = inv.subnets6.iter().filter_map(|sub| {
        let pool = sub.pool?;
        let slice = share.slice6(pool.start, pool.end)?;
        Some(SliceView {
            subnet: sub.to_string(),
            start: (*slice.start()).into(),
            end: (*slice.end()).into(),
        })
    });
    let slices = slices.chain(slices6).collect();
    PeersView {
        slot: share.slot(),
        slots: share.slots(),
        live: share.live().iter().copied().collect(),
        serving: share.is_live(),
        buckets: share.buckets_owned(),
        slices,
    }
}

/// An inventory host with its boot progress.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct HostView {
    pub mac: MacAddr,
    /// Its reserved IPv4 address; a host served over IPv6 only has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<Ipv4Addr>,
    /// Its reserved IPv6 address, when it has one (DHCPv6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<std::net::Ipv6Addr>,
    /// Its system UUID (`uuid:`), as DUID-UUID firmware is known by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    pub hostname: Option<String>,
    pub profile: String,
    pub stage: Option<Stage>,
    pub progress: HostProgress,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Has a `bmc` block.
    #[serde(default)]
    pub bmc: bool,
    /// Last known power state, from the last BMC call.
    #[serde(default)]
    pub power: Option<PowerState>,
    /// Unix milliseconds the power state was learnt.
    #[serde(default)]
    pub power_at_ms: Option<u64>,
    /// Recovery state (`idle`, `awaiting-dhcp`, ...) of a host with a BMC.
    #[serde(default)]
    pub recovery: Option<recovery::State>,
    /// Recovery attempts made in the current recovery.
    #[serde(default)]
    pub attempts: Option<u32>,
    /// An idle `expect_boot` host whose deadline does not count:
    /// `checking-power` (asking its BMC whether it runs) or
    /// `until-boot-activity` (it ran when added); never `counting`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_watch: Option<Watch>,
    /// The last BMC error of the host's recovery (it names the BMC, never
    /// a password): why a host stays `checking-power`, say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_error: Option<String>,
    /// The BMC driver the host's next call starts with (`redfish`,
    /// `ipmi`).
    #[serde(default)]
    pub bmc_driver: Option<String>,
    /// Until when (unix ms) a host with two drivers starts with its second
    /// one, after a fallback.
    #[serde(default)]
    pub bmc_fallback_until_ms: Option<u64>,
    /// The host's last fallback from one driver to the other.
    #[serde(default)]
    pub bmc_last_fallback: Option<FallbackEvent>,
    /// Every MAC of the host, `mac` first.
    #[serde(default)]
    pub macs: Vec<MacAddr>,
    /// The MAC the host last booted from: the port of its last DHCP
    /// request (`progress.boot_mac`).
    #[serde(default)]
    pub boot_mac: Option<MacAddr>,
    /// The host's `netboot` policy and provisioning state.
    #[serde(default)]
    pub netboot: NetbootView,
    /// With peers, for a host with a BMC: the agent (node) that owns its
    /// BMC and recovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// A host whose artifact download waits for its turn (`admission`): a
    /// boot storm's line, not a fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<TurnView>,
}

/// An artifact download waiting for its turn.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct TurnView {
    /// How long it has waited.
    pub waiting_ms: u64,
    /// Requests ahead of it on its interface.
    pub ahead: usize,
}

/// The hosts' waiting requests by client address, read once for a page.
type Turns = std::collections::HashMap<std::net::IpAddr, crate::admission::Wait>;

/// Every inventory host with its boot progress, power and recovery state:
/// what `/api/v1/hosts` shows and the Kubernetes source writes back.
pub fn host_views(
    state: &State,
    control: &control::Handle,
    fallbacks: &Fallbacks,
) -> Vec<HostView> {
    let mut views = Vec::new();
    for_each_host_view(state, control, fallbacks, |v| views.push(v));
    views
}

/// [`host_views`] one at a time, none kept: a fleet's views are some
/// hundred bytes a host.
pub fn for_each_host_view(
    state: &State,
    control: &control::Handle,
    fallbacks: &Fallbacks,
    f: impl FnMut(HostView),
) {
    let inv = state.inventory();
    let share = state.share();
    let view = control.view();
    let turns = state.admission.waiting();
    inv.hosts
        .iter()
        .map(|h| view_of(state, &inv, &share, &view, fallbacks, &turns, h))
        .for_each(f);
}

/// One host's view, as [`host_views`] shows it: for a caller that asks
/// about one host of a fleet.
pub fn host_view(
    state: &State,
    control: &control::Handle,
    fallbacks: &Fallbacks,
    host: &Host,
) -> HostView {
    let inv = state.inventory();
    let share = state.share();
    let view = control.view();
    let turns = state.admission.waiting();
    view_of(state, &inv, &share, &view, fallbacks, &turns, host)
}

fn view_of(
    state: &State,
    inv: &Inventory,
    share: &Share,
    view: &control::View,
    fallbacks: &Fallbacks,
    turns: &Turns,
    h: &Host,
) -> HostView {
    let turn = [
        h.ipv4().map(std::net::IpAddr::from),
        h.ipv6().map(std::net::IpAddr::from),
    ]
    .into_iter()
    .flatten()
    .find_map(|ip| turns.get(&ip))
    .map(|w| TurnView {
        waiting_ms: u64::try_from(w.since.elapsed().as_millis()).unwrap_or(u64::MAX),
        ahead: w.ahead,
    });
    let progress = state
        .progress
        .get(h.mac)
        .unwrap_or_else(|| HostProgress::new(h.mac));
    let driver_status = h.bmc.as_ref().map(|b| driver::status(b, fallbacks));
    let recovery = view.recovery.get(&h.mac);
    let boot_mac = progress.boot_mac;
    HostView {
        mac: h.mac,
        ip: h.ipv4(),
        ipv6: h.ipv6(),
        uuid: h.uuid().map(crate::inventory::uuid_text),
        hostname: h.hostname.as_deref().map(str::to_owned),
        profile: inv.profile_of(h).name.clone(),
        stage: progress.stage(),
        progress,
        labels: h.labels.clone(),
        bmc: h.bmc.is_some(),
        power: view.power.get(&h.mac).map(|(p, _)| *p),
        power_at_ms: view.power.get(&h.mac).map(|(_, at)| *at),
        recovery: recovery.map(|r| r.state),
        attempts: recovery.map(|r| r.attempt),
        recovery_watch: recovery.map(|r| r.watch).filter(|w| *w != Watch::Counting),
        recovery_error: recovery.and_then(|r| r.last_error.clone()),
        bmc_driver: driver_status.as_ref().map(|d| d.driver.clone()),
        bmc_fallback_until_ms: driver_status.as_ref().and_then(|d| d.held_until_ms),
        bmc_last_fallback: driver_status.and_then(|d| d.last_fallback),
        macs: h.ports().to_vec(),
        boot_mac,
        netboot: netboot_view(inv, &state.netboot, h),
        // Owners act on BMCs: hosts without one have none.
        owner: (share.is_shared() && h.bmc.is_some())
            .then(|| share.host_owner_name(h.mac).map(str::to_owned))
            .flatten(),
        turn,
    }
}

/// A host's `netboot` policy and, for `once`, where its provisioning
/// stands: in `/api/v1/hosts` and the answers of the netboot endpoints.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct NetbootView {
    /// `always`, `once` or `never`.
    pub policy: Netboot,
    /// `armed` or `done` for `once`; `None` otherwise.
    #[serde(default)]
    pub state: Option<Phase>,
    /// Unix milliseconds of the last change, when recorded.
    #[serde(default)]
    pub since_ms: Option<u64>,
    /// `phone-home` or `operator`, when recorded.
    #[serde(default)]
    pub by: Option<Actor>,
    /// Whether every route gives the host its boot file now.
    pub boots: bool,
}

pub fn netboot_view(inv: &Inventory, store: &NetbootStore, host: &Host) -> NetbootView {
    let policy = inv.netboot_of(host);
    let record = store.record(host.mac);
    let once = policy == Netboot::Once;
    NetbootView {
        policy,
        // No record: armed.
        state: once.then(|| record.map_or(Phase::Armed, |r| r.phase)),
        since_ms: record.filter(|_| once).map(|r| r.since_ms),
        by: record.filter(|_| once).map(|r| r.by),
        boots: !inv.withholds_boot(host),
    }
}

/// The answer of `/reprovision`: the netboot state, and the BMC outcome
/// when the host was power-cycled.
#[derive(Serialize, Deserialize, Debug)]
pub struct ReprovisionView {
    /// The host as asked (name or MAC).
    pub host: String,
    pub mac: MacAddr,
    pub netboot: NetbootView,
    pub power: Option<Outcome>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host as `/api/v1/hosts` showed it when these fields were text:
    /// the typed view reads it and writes it back the same.
    #[test]
    fn a_host_view_reads_and_writes_the_api_text_unchanged() {
        let text = serde_json::json!({
            "mac": "52:54:00:12:34:5a",
            "ip": "10.66.1.10",
            "hostname": "node-1",
            "profile": "worker",
            "stage": "dhcp",
            "progress": {
                "mac": "52:54:00:12:34:5a",
                "boot_mac": "52:54:00:12:34:5b",
                "dhcp": {"at_ms": 1000, "detail": "ack 10.66.1.10"},
                "tftp": null,
                "script": null,
                "artifact": null,
                "artifacts_fetched": 0,
                "booted": null,
                "declined": null,
            },
            "labels": {"rack": "r1"},
            "bmc": true,
            "power": "on",
            "power_at_ms": 900,
            "recovery": "awaiting-boot-file",
            "attempts": 1,
            "recovery_watch": "until-boot-activity",
            "bmc_driver": "ipmi",
            "bmc_fallback_until_ms": null,
            "bmc_last_fallback": null,
            "macs": ["52:54:00:12:34:5a", "52:54:00:12:34:5b"],
            "boot_mac": "52:54:00:12:34:5b",
            "netboot": {
                "policy": "once",
                "state": "done",
                "since_ms": 2000,
                "by": "phone-home",
                "boots": false,
            },
            "owner": "node-b",
        });
        let view: HostView = serde_json::from_value(text.clone()).expect("a host view");
        assert_eq!(view.power, Some(PowerState::On));
        assert_eq!(view.recovery, Some(recovery::State::AwaitingBootFile));
        assert_eq!(view.recovery_watch, Some(Watch::UntilBootActivity));
        assert_eq!(
            view.boot_mac,
            Some(MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x5b]))
        );
        assert_eq!(
            (view.netboot.policy, view.netboot.state, view.netboot.by),
            (Netboot::Once, Some(Phase::Done), Some(Actor::PhoneHome))
        );
        assert_eq!(serde_json::to_value(&view).expect("json"), text);
    }

    #[test]
    fn a_lease_shows_its_mac_and_state_as_text() {
        for (state, text) in [
            (LeaseState::Offered, "offered"),
            (LeaseState::Bound, "bound"),
            (LeaseState::Declined, "declined"),
            (LeaseState::Released, "released"),
        ] {
            let lease = Lease {
                mac: [0x52, 0x54, 0, 0x12, 0x34, 0x5a],
                ip: Ipv4Addr::new(10, 66, 200, 7),
                state,
                expires: 1_000,
                hostname: None,
                client_id: Some(vec![1, 0x52, 0x54, 0, 0x12, 0x34, 0x5a]),
            };
            let view = LeaseView::from(&lease);
            let json = serde_json::to_value(&view).expect("json");
            assert_eq!(json["mac"], "52:54:00:12:34:5a");
            assert_eq!(json["state"], text);
            assert_eq!(json["client_id"], "01:52:54:00:12:34:5a");
            assert_eq!(state.to_string(), text);
            assert_eq!(
                serde_json::from_value::<LeaseView>(json).expect("back"),
                view
            );
        }
    }

    #[test]
    fn an_ipv6_lease_shows_its_duid_and_iaid() {
        let lease = Lease6 {
            duid: vec![
                0, 1, 0, 1, 0x2c, 0x3d, 0x4e, 0x5f, 0x52, 0x54, 0, 0x12, 0x34, 0x5a,
            ],
            iaid: 7,
            mac: None,
            ip: "fd00:66::1000".parse().expect("address"),
            state: LeaseState::Bound,
            expires: 1_000,
            hostname: None,
        };
        let view = LeaseView::from(&lease);
        let json = serde_json::to_value(&view).expect("json");
        assert_eq!(json["ip"], "fd00:66::1000");
        assert_eq!(json["mac"], serde_json::Value::Null);
        assert_eq!(json["duid"], "00:01:00:01:2c:3d:4e:5f:52:54:00:12:34:5a");
        assert_eq!(json["iaid"], 7);
        assert_eq!(
            serde_json::from_value::<LeaseView>(json).expect("back"),
            view
        );
        // An IPv4 lease's JSON has neither key.
        let v4 = LeaseView::from(&Lease {
            mac: [2; 6],
            ip: Ipv4Addr::new(10, 0, 0, 9),
            state: LeaseState::Bound,
            expires: 1,
            hostname: None,
            client_id: None,
        });
        let json = serde_json::to_value(&v4).expect("json");
        assert!(json.get("duid").is_none() && json.get("iaid").is_none());
        assert_eq!(json["ip"], "10.0.0.9");
    }
}

//! Routes of the two admin listeners. The metrics listener serves
//! `/metrics` and `/healthz`, open, with no per-host identifier. The API
//! listener serves the JSON API behind the [`gate`](crate::api::gate):
//! `/api/v1/discovered`, `/api/v1/leases`, `/api/v1/peers`,
//! `/api/v1/status`, `/api/v1/hosts`, `/api/v1/metrics` (the series that
//! name hosts), the live trace of one machine
//! (`/api/v1/trace/<mac>`), and the out-of-band endpoints
//! (`/api/v1/hosts/<host>/{power,bootdev,bmc,recover}`, `/api/v1/audit`),
//! where every call on hardware is in the audit log before its answer goes
//! out. The netboot endpoints (`/api/v1/hosts/<host>/netboot/done`,
//! `/reprovision`) act under the same gate and audit log, and answer once
//! the change is in force on every route. The fleet page and what it reads
//! are [`fleet`](crate::api::fleet)'s.

use std::sync::Arc;

use axum::{
    Json, Router,
    body::Body,
    extract::{Extension, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use aya::maps::{MapData, PerCpuArray};
use serde::Deserialize;

use crate::{
    api::{
        access::Caller,
        fleet,
        gate::{self, Gate},
        metrics,
    },
    audit::{AuditLog, Entry},
    bmc::{BootTarget, Fallbacks},
    clock,
    control::{self, Failure, Op, Outcome},
    discovered::Discovered,
    http::BootState,
    inventory::{Host, Inventory, Netboot},
    lease::LeaseState,
    mac::MacAddr,
    netboot::Actor,
    rollout::Serving,
    sync::lock,
    trace::{Next, TraceEvent, TracePath},
    view::{HostView, LeaseView, PeersView, ReprovisionView, host_views, netboot_view, peers_view},
    xdp::Stats,
};

/// What the admin endpoints read.
pub struct AdminState {
    /// The fast path's maps, the gauges and the lock of the reload.
    pub serving: Arc<Serving>,
    /// Read by `/metrics` without waiting for a reload: every interface's
    /// counters, summed there.
    pub counters: Vec<Arc<PerCpuArray<MapData, u64>>>,
    /// The interface of each of `counters`, in the same order.
    pub interfaces: Vec<String>,
    /// Inventory, leases, progress and the TFTP counters.
    pub boot: Arc<BootState>,
    /// Out-of-band control: BMC calls, recovery, audit.
    pub oob: Arc<OobState>,
    /// The Kubernetes source's counters, when the inventory comes from it.
    pub kube: std::sync::OnceLock<Arc<crate::kube::KubeStats>>,
    /// Who may call the JSON API.
    pub gate: Arc<Gate>,
    /// The API's TLS counters, when it serves TLS.
    pub api_tls: Option<Arc<super::tls::TlsStats>>,
    /// Ends the fleet page's event streams, which never end by
    /// themselves, so that the server can stop.
    pub shutdown: crate::shutdown::Shutdown,
    /// The fleet's cells, shared by the fleet page's readers.
    pub fleet: fleet::Snapshots,
}

/// What the out-of-band endpoints need.
pub struct OobState {
    pub control: control::Handle,
    pub audit: Arc<AuditLog>,
    /// Which driver each host with two starts with, and the fallbacks.
    pub fallbacks: Arc<Fallbacks>,
    /// The BMC calls the agent made.
    pub bmc_calls: Arc<crate::bmc::counted::Calls>,
}

/// The out-of-band routes alone, on their own state and without the gate
/// (the API router merges them), so that they are testable without a fast
/// path.
pub fn oob_routes(state: Arc<OobState>) -> Router {
    Router::new()
        .route("/api/v1/hosts/{host}/power", post(power))
        .route("/api/v1/hosts/{host}/bootdev", post(bootdev))
        .route("/api/v1/hosts/{host}/bmc", get(bmc_info))
        .route("/api/v1/hosts/{host}/recover", post(recover))
        .route("/api/v1/audit", get(audit))
        .with_state(state)
}

/// The metrics listener's routes: for the kubelet's probes and Prometheus.
pub fn metrics_router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(healthz))
        .with_state(state)
}

/// The JSON API, behind its gate.
pub fn api_router(state: Arc<AdminState>) -> Router {
    let oob = oob_routes(state.oob.clone());
    let gate = state.gate.clone();
    let routes = Router::new()
        .route("/api/v1/discovered", get(discovered))
        .route("/api/v1/leases", get(leases))
        .route("/api/v1/peers", get(peers))
        .route("/api/v1/status", get(super::status::status))
        .route("/api/v1/hosts", get(hosts))
        .route("/api/v1/metrics", get(api_metrics))
        .route("/api/v1/trace/{mac}", get(trace))
        .route("/api/v1/hosts/{host}/netboot/done", post(netboot_done))
        .route("/api/v1/hosts/{host}/reprovision", post(reprovision))
        .merge(fleet::routes())
        .with_state(state)
        .merge(oob);
    // The fleet page holds no data: it is open, and what it reads is not.
    // Every other path, unknown ones included, passes the gate.
    fleet::open_routes().fallback_service(gate::protect(routes, gate))
}

type ApiError = (StatusCode, String);

fn internal(what: &str, e: impl std::fmt::Display) -> ApiError {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("failed to read {what}: {e}"),
    )
}

async fn metrics_page(State(s): State<Arc<AdminState>>) -> Result<String, ApiError> {
    let fast =
        Stats::read_all(s.counters.iter().map(|c| &**c)).map_err(|e| internal("counters", e))?;
    let gauges = *lock(&s.serving.gauges);
    // The lease store's lock may be held through a commit (an fsync).
    let (leases, leases6) = {
        let state = s.boot.shared.clone();
        tokio::task::spawn_blocking(move || {
            let store = lock(&state.leases);
            let states = [LeaseState::Bound, LeaseState::Declined];
            (
                states.map(|st| (st, store.count(st))),
                states.map(|st| (st, store.count6(st))),
            )
        })
        .await
        .map_err(|e| internal("leases", e))?
    };
    let discovered = lock(&s.boot.shared.discovered).len();
    let tftp = s.boot.tftp_stats.get().map(|t| t.snapshot());
    let recovery = s.oob.control.view().metrics.clone();
    let mut page = metrics::render(&metrics::Page {
        fast: &fast,
        gauges: &gauges,
        slow: &s.boot.shared.stats,
        slow6: &s.boot.shared.stats6,
        health: &s.boot.shared.health,
        discovered,
        traced: s.boot.shared.progress.trace().traced(),
        xdp_events_lost: s.boot.shared.progress.xdp_events_lost(),
        leases: &leases,
        leases6: &leases6,
        tftp,
        http: s.boot.http_stats.snapshot(),
    });
    let pool: u64 = s
        .boot
        .shared
        .inventory()
        .pools()
        .map(|(_, r)| u64::from(u32::from(r.end).saturating_sub(u32::from(r.start))) + 1)
        .sum();
    page.push_str(&metrics::render_pool(pool));
    let turns: Vec<_> = s
        .boot
        .shared
        .admission
        .each()
        .into_iter()
        .map(|(iface, a)| (iface, a.snapshot()))
        .collect();
    page.push_str(&metrics::render_admission(&turns));
    page.push_str(&metrics::render_boot_stages(
        &s.boot.shared.progress.inventory_stages(),
    ));
    let per_interface = s
        .interfaces
        .iter()
        .zip(&s.counters)
        .map(|(iface, c)| Stats::read(c).map(|stats| (iface.as_str(), stats)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| internal("counters", e))?;
    page.push_str(&metrics::render_xdp_interfaces(&per_interface));
    page.push_str(&metrics::render_share(&s.boot.shared.share()));
    let owned = s
        .oob
        .control
        .view()
        .recovery
        .values()
        .filter(|h| h.managed && h.owned)
        .count();
    page.push_str(&metrics::render_host_records(
        &s.boot.shared.host_records,
        owned,
    ));
    page.push_str(&metrics::render_other_servers(&s.boot.shared.other_servers));
    let netboot = &s.boot.shared.netboot;
    page.push_str(&metrics::render_netboot(
        &netboot.counters,
        netboot.done().len(),
    ));
    page.push_str(&recovery);
    page.push_str(&s.oob.fallbacks.render());
    page.push_str(&s.oob.bmc_calls.render());
    page.push_str(&metrics::render_api_auth(&s.gate.stats.snapshot()));
    page.push_str(&metrics::render_xdp_attach(
        &s.boot.shared.health.xdp_modes(),
    ));
    if let Some(tls) = &s.api_tls {
        page.push_str(&tls.render());
    }
    if let Some(kube) = s.kube.get() {
        page.push_str(&kube.render());
    }
    Ok(page)
}

/// `GET /api/v1/metrics`: the series that name hosts, for identified
/// callers (a Prometheus job with a token): hosts stuck in a stage past
/// its deadline and hosts whose recovery failed, by host name (the MAC
/// when the host has none). The open `/metrics` counts them without
/// naming any.
async fn api_metrics(State(s): State<Arc<AdminState>>) -> String {
    let inv = s.boot.shared.inventory();
    let view = s.oob.control.view();
    let name = |mac: MacAddr| {
        inv.host_by_mac(mac)
            .and_then(|host| host.hostname.as_ref())
            .map_or_else(|| mac.to_string(), |n| n.to_string())
    };
    let owned = || view.recovery.values().filter(|h| h.managed && h.owned);
    let mut stalled: Vec<(String, crate::recovery::State)> = owned()
        .filter_map(|h| Some((name(h.mac), h.stalled?)))
        .collect();
    stalled.sort();
    let mut failed: Vec<String> = owned()
        .filter(|h| h.state == crate::recovery::State::Failed)
        .map(|h| name(h.mac))
        .collect();
    failed.sort();
    crate::recovery::metrics::render_named(
        &stalled
            .iter()
            .map(|(n, stage)| (n.as_str(), *stage))
            .collect::<Vec<_>>(),
        &failed.iter().map(String::as_str).collect::<Vec<_>>(),
    )
}

/// Ready (200) while the program is attached, the maps hold the inventory
/// in force, the slow path runs and the state store can be written;
/// otherwise 503 with one line per problem.
async fn healthz(State(s): State<Arc<AdminState>>) -> (StatusCode, String) {
    let problems = s.boot.shared.health.check();
    if problems.is_empty() {
        (StatusCode::OK, "ok\n".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            problems.iter().map(|p| format!("{p}\n")).collect(),
        )
    }
}

/// Unknown clients, most recently seen first.
async fn discovered(State(s): State<Arc<AdminState>>) -> Json<Vec<Discovered>> {
    Json(lock(&s.boot.shared.discovered).list())
}

/// How this agent shares the discovery pools.
async fn peers(State(s): State<Arc<AdminState>>) -> Json<PeersView> {
    Json(peers_view(&s.boot.shared))
}

/// Pool leases, including quarantined addresses: IPv4's, then IPv6's.
async fn leases(State(s): State<Arc<AdminState>>) -> Result<Json<Vec<LeaseView>>, ApiError> {
    let state = s.boot.shared.clone();
    let (list, list6) = tokio::task::spawn_blocking(move || {
        let store = lock(&state.leases);
        Ok::<_, crate::lease::LeaseError>((store.list()?, store.list6()?))
    })
    .await
    .map_err(|e| internal("leases", e))?
    .map_err(|e| internal("leases", e))?;
    let views = list.iter().map(LeaseView::from);
    Ok(Json(
        views.chain(list6.iter().map(LeaseView::from)).collect(),
    ))
}

/// A trace stream writes an empty line this often, so that a watcher that
/// left is noticed (the write fails) and its MAC leaves the XDP filter.
const TRACE_HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET /api/v1/trace/<mac>`: the MAC's steps through both paths as they
/// happen, one JSON [`TraceEvent`] a line, empty lines as heartbeats. The
/// MAC is traced (in the XDP program too) while a client is connected.
async fn trace(
    State(s): State<Arc<AdminState>>,
    axum::extract::Path(mac): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let mac: MacAddr = mac
        .parse()
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("{e}\n")))?;
    let watch = s
        .boot
        .shared
        .progress
        .trace()
        .watch(mac)
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")))?;
    let lines = futures_util::stream::unfold(watch, |mut watch| async move {
        let line = tokio::select! {
            next = watch.next() => match next {
                Next::Event(event) => json_line(&event),
                Next::Lost(n) => json_line(&TraceEvent {
                    at_ms: clock::now_ms(),
                    mac: watch.mac(),
                    path: TracePath::Agent,
                    what: "lost".into(),
                    detail: format!("{n} events lost: this watcher fell behind"),
                }),
                Next::Closed => return None,
            },
            () = tokio::time::sleep(TRACE_HEARTBEAT) => "\n".to_string(),
        };
        Some((Ok::<_, std::convert::Infallible>(line), watch))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

fn json_line(event: &TraceEvent) -> String {
    let mut line = serde_json::to_string(event).unwrap_or_default();
    line.push('\n');
    line
}

/// Every inventory host, with how far its current boot got.
async fn hosts(State(s): State<Arc<AdminState>>) -> Json<Vec<HostView>> {
    Json(host_views(&s.boot.shared, &s.oob.control, &s.oob.fallbacks))
}

/// `POST /api/v1/hosts/<host>/power` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PowerBody {
    action: String,
}

/// `POST /api/v1/hosts/<host>/bootdev` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BootdevBody {
    device: String,
    #[serde(default)]
    persistent: bool,
    #[serde(default)]
    efi: bool,
}

/// An acting endpoint's JSON body, or the answer that refuses it.
#[expect(
    clippy::result_large_err,
    reason = "the error is the handler's answer, returned at once"
)]
fn json_body<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, Response> {
    serde_json::from_slice(body).map_err(|e| bad_request(format!("malformed {what} request: {e}")))
}

fn bad_request(message: String) -> Response {
    (StatusCode::BAD_REQUEST, format!("{message}\n")).into_response()
}

/// Runs `op` through the control task, records it in the audit log and
/// answers with the outcome. An action that cannot be recorded is
/// answered 500: it happened, but the log must say so first.
async fn act(s: Arc<OobState>, caller: Caller, host: String, op: Op) -> Response {
    // On a task of its own: a client that hangs up must not leave an action
    // that runs later without its audit entry.
    match tokio::spawn(act_and_record(s, caller, host, op)).await {
        Ok(response) => response,
        Err(e) => internal("the action", e).into_response(),
    }
}

async fn act_and_record(s: Arc<OobState>, caller: Caller, host: String, op: Op) -> Response {
    match call_and_record(s, caller, host, op).await {
        Ok(outcome) => outcome_response(outcome),
        Err(refused) => refused,
    }
}

/// Runs `op` and records it in the audit log; the answer when the entry
/// cannot be written.
async fn call_and_record(
    s: Arc<OobState>,
    caller: Caller,
    host: String,
    op: Op,
) -> Result<Outcome, Response> {
    let at_ms = clock::now_ms();
    let outcome = s.control.call(&host, op).await;
    let entry = Entry {
        at_ms,
        caller: caller.name,
        groups: caller.groups,
        host: host.clone(),
        action: op.name().to_string(),
        params: op.params(),
        result: outcome.audit_result(),
        duration_ms: outcome.duration_ms,
    };
    record_entry(&s, entry).await?;
    Ok(outcome)
}

/// Writes `entry` to the audit log; the answer when it cannot be written.
async fn record_entry(s: &Arc<OobState>, entry: Entry) -> Result<(), Response> {
    let logged = {
        let s = s.clone();
        tokio::task::spawn_blocking(move || s.audit.record(&entry)).await
    };
    match logged {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "audit entry not written");
            Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the action ran but its audit entry was not written: {e}\n"),
            )
                .into_response())
        }
        Err(e) => Err(internal("the audit log", e).into_response()),
    }
}

fn outcome_status(outcome: &Outcome) -> StatusCode {
    match outcome.failure {
        None => StatusCode::OK,
        Some(Failure::UnknownHost | Failure::NoBmc) => StatusCode::NOT_FOUND,
        Some(Failure::Refused) => StatusCode::CONFLICT,
        Some(Failure::Bmc) => StatusCode::BAD_GATEWAY,
        Some(Failure::Unavailable) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

fn outcome_response(outcome: Outcome) -> Response {
    (outcome_status(&outcome), Json::<Outcome>(outcome)).into_response()
}

/// `POST /api/v1/hosts/<host>/reprovision` body: `{"power": false}` only
/// arms the host; by default a host with a BMC is also set to PXE and
/// power-cycled through the recovery controller.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReprovisionBody {
    #[serde(default = "yes")]
    power: bool,
}

fn yes() -> bool {
    true
}

/// How long a netboot endpoint waits for the change to be in force on
/// every route (the fast path's maps included) before it answers.
const NETBOOT_IN_FORCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Finds `name` and checks that `netboot` lets it be changed; the answer
/// that refuses otherwise.
#[expect(
    clippy::result_large_err,
    reason = "the error is the handler's answer, returned at once"
)]
fn netboot_host(inv: &Inventory, name: &str, done: bool) -> Result<Host, Response> {
    let Some(host) = control::find_host(inv, name) else {
        return Err((
            StatusCode::NOT_FOUND,
            format!("no inventory host is named {name:?}\n"),
        )
            .into_response());
    };
    let policy = inv.netboot_of(host);
    let refuse = match (policy, done) {
        (Netboot::Once, _) | (Netboot::Always, false) => None,
        (Netboot::Always, true) => Some("it boots every time (netboot: always)"),
        (Netboot::Never, _) => Some("it is never given a boot file (netboot: never)"),
    };
    if let Some(why) = refuse {
        return Err((
            StatusCode::CONFLICT,
            format!(
                "host {}: nothing to {}: {why}; set netboot: once\n",
                host.label(),
                if done { "mark done" } else { "arm" }
            ),
        )
            .into_response());
    }
    Ok(host.clone())
}

/// Records a netboot change in the audit log and waits until it is in
/// force; the answer when either fails.
async fn netboot_settle(
    s: &AdminState,
    caller: Caller,
    name: &str,
    action: &str,
    changed: bool,
) -> Result<(), Response> {
    let entry = Entry {
        at_ms: clock::now_ms(),
        caller: caller.name,
        groups: caller.groups,
        host: name.to_string(),
        action: action.to_string(),
        params: serde_json::json!({ "changed": changed }),
        result: "ok".into(),
        duration_ms: 0,
    };
    record_entry(&s.oob, entry).await?;
    if !s.boot.shared.netboot_in_force(NETBOOT_IN_FORCE).await {
        return Err((
            StatusCode::SERVICE_UNAVAILABLE,
            "recorded, but not yet in force on the fast path (see the agent's log)\n",
        )
            .into_response());
    }
    Ok(())
}

fn store_failed(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("failed to record the netboot state: {e}\n"),
    )
        .into_response()
}

/// `POST /api/v1/hosts/<host>/netboot/done`: the operator says the host's
/// provisioning is done, as its phone-home would.
async fn netboot_done(
    State(s): State<Arc<AdminState>>,
    axum::extract::Path(name): axum::extract::Path<String>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let inv = s.boot.shared.inventory();
    let host = match netboot_host(&inv, &name, true) {
        Ok(host) => host,
        Err(refused) => return refused,
    };
    let changed = match s.boot.shared.netboot_done(host.mac, Actor::Operator) {
        Ok(changed) => changed,
        Err(e) => return store_failed(e),
    };
    if let Err(answer) = netboot_settle(&s, caller, &name, "netboot-done", changed).await {
        return answer;
    }
    let inv = s.boot.shared.inventory();
    Json(netboot_view(&inv, &s.boot.shared.netboot, &host)).into_response()
}

/// `POST /api/v1/hosts/<host>/reprovision`: arms the host again and, with
/// a BMC and unless `{"power": false}`, hands it to the recovery
/// controller, which sets PXE and power-cycles it.
async fn reprovision(
    State(s): State<Arc<AdminState>>,
    axum::extract::Path(name): axum::extract::Path<String>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Response {
    let body: ReprovisionBody = if body.iter().all(u8::is_ascii_whitespace) {
        ReprovisionBody { power: true }
    } else {
        match serde_json::from_slice(&body) {
            Ok(body) => body,
            Err(e) => return bad_request(format!("malformed reprovision request: {e}")),
        }
    };
    let inv = s.boot.shared.inventory();
    let host = match netboot_host(&inv, &name, false) {
        Ok(host) => host,
        Err(refused) => return refused,
    };
    let changed = match s.boot.shared.netboot_arm(host.mac) {
        Ok(changed) => changed,
        Err(e) => return store_failed(e),
    };
    if let Err(answer) = netboot_settle(&s, caller.clone(), &name, "reprovision", changed).await {
        return answer;
    }
    let power = if body.power && host.bmc.is_some() {
        match call_and_record(s.oob.clone(), caller, name.clone(), Op::Recover).await {
            Ok(outcome) => Some(outcome),
            Err(refused) => return refused,
        }
    } else {
        None
    };
    let status = power.as_ref().map_or(StatusCode::OK, outcome_status);
    let inv = s.boot.shared.inventory();
    let view = ReprovisionView {
        host: name,
        mac: host.mac,
        netboot: netboot_view(&inv, &s.boot.shared.netboot, &host),
        power,
    };
    (status, Json(view)).into_response()
}

async fn power(
    State(s): State<Arc<OobState>>,
    axum::extract::Path(host): axum::extract::Path<String>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Response {
    let body: PowerBody = match json_body(&body, "power") {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let Some(op) = control::parse_power(&body.action) else {
        return bad_request(format!(
            "unknown power action {:?} (on, off, cycle, reset, soft, status)",
            body.action
        ));
    };
    act(s, caller, host, op).await
}

async fn bootdev(
    State(s): State<Arc<OobState>>,
    axum::extract::Path(host): axum::extract::Path<String>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Response {
    let body: BootdevBody = match json_body(&body, "bootdev") {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let Some(device) = control::parse_device(&body.device) else {
        return bad_request(format!(
            "unknown boot device {:?} (pxe, disk, bios, http)",
            body.device
        ));
    };
    let op = Op::BootDevice(BootTarget {
        device,
        persistent: body.persistent,
        efi: body.efi,
    });
    act(s, caller, host, op).await
}

async fn recover(
    State(s): State<Arc<OobState>>,
    axum::extract::Path(host): axum::extract::Path<String>,
    Extension(caller): Extension<Caller>,
) -> Response {
    act(s, caller, host, Op::Recover).await
}

/// A read; audited as the hardware call it is, under the caller's name
/// (`anonymous` for an open read).
async fn bmc_info(
    State(s): State<Arc<OobState>>,
    axum::extract::Path(host): axum::extract::Path<String>,
    Extension(caller): Extension<Caller>,
) -> Response {
    act(s, caller, host, Op::Info).await
}

/// `GET /api/v1/audit?limit=N`: the last N entries (default 100), oldest first.
async fn audit(
    State(s): State<Arc<OobState>>,
    axum::extract::Query(q): axum::extract::Query<AuditQuery>,
) -> Result<Json<Vec<Entry>>, Response> {
    let limit = q.limit.unwrap_or(100);
    let entries = tokio::task::spawn_blocking(move || s.audit.tail(limit))
        .await
        .map_err(|e| internal("the audit log", e).into_response())?
        .map_err(|e| internal("the audit log", e).into_response())?;
    Ok(Json(entries))
}

#[derive(Deserialize)]
struct AuditQuery {
    limit: Option<usize>,
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use axum::{body::to_bytes, http::Request};
    use tower_service::Service as _;

    use super::*;
    use crate::{
        bmc::{PowerState, fake::FakeBmc},
        inventory::Inventory,
        progress::Progress,
        recovery::{Controller, Policy, RecoveryStore, SequencePolicy, Sequencer},
    };

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";
    const SECRET: &str = "fake-bmc-secret-9f2c";

    struct Fixture {
        router: Router,
        fake: FakeBmc,
        dir: PathBuf,
        _stop: Trigger,
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    use crate::shutdown::{Shutdown, Trigger};

    async fn fixture(name: &str, with_tokens: bool) -> Fixture {
        let dir = std::env::temp_dir().join(format!("pxe-admin-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("bmc.password"), SECRET).expect("password");
        let inv_path = dir.join("inventory.yaml");
        std::fs::write(
            &inv_path,
            format!(
                "subnets: [{{cidr: 10.66.0.0/16}}]\n\
                 profiles: [{{name: w, boot: {{bios: undionly.kpxe}}}}]\n\
                 hosts:\n  - mac: \"02:00:00:00:00:10\"\n    ip: 10.66.1.10\n    \
                 hostname: node-1\n    profile: w\n    bmc:\n      \
                 address: ipmi://10.77.0.2:623\n      username: admin\n      \
                 password_file: {}\n",
                dir.join("bmc.password").display()
            ),
        )
        .expect("inventory");
        let inv = Arc::new(Inventory::load(&inv_path).expect("valid inventory"));
        let store = RecoveryStore::open_in(&dir).expect("store");
        let fake = FakeBmc::new("10.77.0.2:623", PowerState::Off);
        let given = fake.clone();
        let inputs = control::Inputs {
            controller: Controller::new(store, Policy::default()).expect("controller"),
            sequencer: Sequencer::new(SequencePolicy::default()),
            make_bmc: Box::new(move |_| Ok(given.clone())),
            progress: Arc::new(Progress::default()),
            slow_path_rx: Box::new(|| 0),
            share: Box::new(|| Arc::new(crate::share::Share::alone())),
            fleet: None,
        };
        let (stop, shutdown) = Shutdown::new();
        let (handle, _task) = control::start(inputs, inv, shutdown);
        let identities = if with_tokens {
            std::fs::write(dir.join("tokens"), format!("ops {TOKEN}\n")).expect("tokens");
            gate::Identities::Tokens(
                crate::api::auth::Tokens::load(&dir.join("tokens")).expect("tokens load"),
            )
        } else {
            gate::Identities::None
        };
        let state = Arc::new(OobState {
            control: handle,
            audit: Arc::new(AuditLog::open(&dir.join("audit.jsonl")).expect("audit")),
            fallbacks: Arc::default(),
            bmc_calls: Arc::default(),
        });
        Fixture {
            router: gate::protect(oob_routes(state), Arc::new(Gate::new(identities))),
            fake,
            dir,
            _stop: stop,
        }
    }

    async fn send(
        router: &Router,
        method: &str,
        uri: &str,
        token: Option<&str>,
        body: &str,
    ) -> (StatusCode, String) {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(t) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        // A Router is always ready: no poll_ready needed.
        let resp = router
            .clone()
            .call(req.body(Body::from(body.to_string())).expect("request"))
            .await
            .expect("answer");
        let status = resp.status();
        let bytes = to_bytes(resp.into_body(), 1 << 20).await.expect("body");
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tokio::test]
    async fn acting_endpoints_need_a_known_token() {
        let f = fixture("auth", true).await;
        for (uri, body) in [
            ("/api/v1/hosts/node-1/power", r#"{"action":"on"}"#),
            ("/api/v1/hosts/node-1/bootdev", r#"{"device":"pxe"}"#),
            ("/api/v1/hosts/node-1/recover", ""),
        ] {
            let (status, _) = send(&f.router, "POST", uri, None, body).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{uri} without a token");
            let (status, _) = send(
                &f.router,
                "POST",
                uri,
                Some("wrong-token-wrong-token-0"),
                body,
            )
            .await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{uri} with a wrong token");
        }
        assert!(f.fake.calls().is_empty(), "a refused call reached the BMC");
        // With a token file, reading the audit log takes a token too.
        let (status, _) = send(&f.router, "GET", "/api/v1/audit", None, "").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, body) = send(&f.router, "GET", "/api/v1/audit", Some(TOKEN), "").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "[]"));
    }

    #[tokio::test]
    async fn without_a_token_file_acting_endpoints_refuse_everyone() {
        let f = fixture("notokens", false).await;
        let (status, body) = send(
            &f.router,
            "POST",
            "/api/v1/hosts/node-1/power",
            Some(TOKEN),
            r#"{"action":"cycle"}"#,
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(body.contains("--api-token-file"), "{body}");
        assert!(f.fake.calls().is_empty());
    }

    #[tokio::test]
    async fn actions_answer_their_result_and_are_audited_without_secrets() {
        let f = fixture("audit", true).await;
        let (status, body) = send(
            &f.router,
            "POST",
            "/api/v1/hosts/node-1/power",
            Some(TOKEN),
            r#"{"action":"on"}"#,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let out: Outcome = serde_json::from_str(&body).expect("outcome");
        assert_eq!(out.power, Some(PowerState::On));
        assert_eq!(f.fake.power_state(), PowerState::On);
        let (status, body) = send(
            &f.router,
            "POST",
            "/api/v1/hosts/02:00:00:00:00:10/bootdev",
            Some(TOKEN),
            r#"{"device":"pxe","persistent":true}"#,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let out: Outcome = serde_json::from_str(&body).expect("outcome");
        assert_eq!(out.boot_device.as_deref(), Some("pxe persistent"));
        let (status, _) = send(
            &f.router,
            "POST",
            "/api/v1/hosts/nobody/power",
            Some(TOKEN),
            r#"{"action":"status"}"#,
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, body) = send(&f.router, "GET", "/api/v1/audit", Some(TOKEN), "").await;
        assert_eq!(status, StatusCode::OK);
        let entries: Vec<Entry> = serde_json::from_str(&body).expect("entries");
        let got: Vec<_> = entries
            .iter()
            .map(|e| {
                (
                    e.caller.as_str(),
                    e.host.as_str(),
                    e.action.as_str(),
                    e.result.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got[..2],
            [
                ("ops", "node-1", "power", "ok"),
                ("ops", "02:00:00:00:00:10", "bootdev", "ok"),
            ]
        );
        assert_eq!(entries[0].params, serde_json::json!({"action": "on"}));
        assert_eq!(entries[2].host, "nobody");
        assert_ne!(entries[2].result, "ok");
        let log = std::fs::read_to_string(f.dir.join("audit.jsonl")).expect("audit log");
        for text in [&log, &body] {
            assert!(!text.contains(SECRET) && !text.contains(TOKEN), "{text}");
        }
    }
}

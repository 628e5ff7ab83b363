//! Routes of the admin listener: `/metrics`, `/healthz`, and the JSON API
//! (`/api/v1/discovered`, `/api/v1/leases`, `/api/v1/hosts`), and the live
//! trace of one machine (`/api/v1/trace/<mac>`).

use std::{
    net::Ipv4Addr,
    sync::{Arc, Mutex, PoisonError},
};

use axum::{
    Json, Router,
    body::Body,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use aya::maps::{MapData, PerCpuArray};
use serde::{Deserialize, Serialize};

use crate::{
    discovered::Discovered,
    http::BootState,
    inventory::MacAddr,
    lease::{Lease, LeaseState},
    metrics::{self, AgentGauges},
    progress::{self, HostProgress, Stage},
    trace::{Next, TraceEvent, TracePath},
    xdp::{FastPath, Stats},
};

/// What the admin endpoints read.
pub struct AdminState {
    /// One per served interface, in the order given; owned by the reload,
    /// which holds them while it writes the maps.
    pub fast: Mutex<Vec<FastPath>>,
    /// Read by `/metrics` without waiting for a reload: every interface's
    /// counters, summed there.
    pub counters: Vec<Arc<PerCpuArray<MapData, u64>>>,
    pub gauges: Mutex<AgentGauges>,
    /// Inventory, leases, progress and the TFTP counters.
    pub boot: Arc<BootState>,
}

pub fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(healthz))
        .route("/api/v1/discovered", get(discovered))
        .route("/api/v1/leases", get(leases))
        .route("/api/v1/hosts", get(hosts))
        .route("/api/v1/trace/{mac}", get(trace))
        .with_state(state)
}

type ApiError = (StatusCode, String);

fn internal(what: &str, e: impl std::fmt::Display) -> ApiError {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("failed to read {what}: {e}"),
    )
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn metrics_page(State(s): State<Arc<AdminState>>) -> Result<String, ApiError> {
    let fast =
        Stats::read_all(s.counters.iter().map(|c| &**c)).map_err(|e| internal("counters", e))?;
    let gauges = *lock(&s.gauges);
    let leases = {
        let store = lock(&s.boot.state.leases);
        [LeaseState::Bound, LeaseState::Declined].map(|state| (state, store.count(state)))
    };
    let discovered = lock(&s.boot.state.discovered).len();
    let tftp = s.boot.tftp_stats.get().map(|t| t.snapshot());
    Ok(metrics::render(&metrics::Page {
        fast: &fast,
        gauges: &gauges,
        slow: &s.boot.state.stats,
        health: &s.boot.state.health,
        discovered,
        traced: s.boot.state.progress.trace().traced(),
        leases: &leases,
        tftp,
        http: s.boot.http_stats.snapshot(),
    }))
}

/// Ready (200) while the program is attached, the maps hold the inventory
/// in force, the slow path runs and the state store can be written;
/// otherwise 503 with one line per problem.
async fn healthz(State(s): State<Arc<AdminState>>) -> (StatusCode, String) {
    let problems = s.boot.state.health.check();
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
    Json(lock(&s.boot.state.discovered).list())
}

/// A lease as the API shows it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct LeaseView {
    pub mac: String,
    pub ip: Ipv4Addr,
    pub state: String,
    /// Unix seconds.
    pub expires: u64,
    pub hostname: Option<String>,
}

impl From<&Lease> for LeaseView {
    fn from(l: &Lease) -> LeaseView {
        LeaseView {
            mac: MacAddr(l.mac).to_string(),
            ip: l.ip,
            state: format!("{:?}", l.state).to_lowercase(),
            expires: l.expires,
            hostname: l.hostname.clone(),
        }
    }
}

/// Pool leases, including quarantined addresses.
async fn leases(State(s): State<Arc<AdminState>>) -> Result<Json<Vec<LeaseView>>, ApiError> {
    let list = lock(&s.boot.state.leases)
        .list()
        .map_err(|e| internal("leases", e))?;
    Ok(Json(list.iter().map(LeaseView::from).collect()))
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
        .state
        .progress
        .trace()
        .watch(mac)
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")))?;
    let lines = futures_util::stream::unfold(watch, |mut watch| async move {
        let line = tokio::select! {
            next = watch.next() => match next {
                Next::Event(event) => json_line(&event),
                Next::Lost(n) => json_line(&TraceEvent {
                    at_ms: progress::now_ms(),
                    mac: watch.mac().to_string(),
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

/// An inventory host with its boot progress.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct HostView {
    pub mac: String,
    pub ip: Ipv4Addr,
    pub hostname: Option<String>,
    pub profile: String,
    pub stage: Option<Stage>,
    pub progress: HostProgress,
}

/// Every inventory host, with how far its current boot got.
async fn hosts(State(s): State<Arc<AdminState>>) -> Json<Vec<HostView>> {
    let inv = s.boot.state.inventory();
    Json(
        inv.hosts
            .iter()
            .map(|h| {
                let progress = s
                    .boot
                    .state
                    .progress
                    .get(h.mac)
                    .unwrap_or_else(|| HostProgress {
                        mac: h.mac.to_string(),
                        ..Default::default()
                    });
                HostView {
                    mac: h.mac.to_string(),
                    ip: h.ip,
                    hostname: h.hostname.clone(),
                    profile: inv.profile_of(h).name.clone(),
                    stage: progress.stage(),
                    progress,
                }
            })
            .collect(),
    )
}

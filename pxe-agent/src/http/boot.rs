//! Routes of the boot listener: `/boot/<mac>.ipxe`, `/artifacts/...`, boot
//! files at `/`, and `POST /api/v1/hosts/<mac>/booted`. Scripts and the
//! phone-home are served only to the host's own address; anyone else gets 403.
//! Each script rendered starts a new boot with a new phone-home token
//! (`http::token`); unless `ipxe.phone_home_token` is `off`, a phone-home
//! without the current one gets 403 too, and is counted. A host that
//! `netboot` gives no boot file now gets a script that exits to the next
//! boot device and 403 for boot files and artifacts; the phone-home of a
//! `netboot: once` host records its provisioning as done.

use std::{net::SocketAddr, sync::Arc};

use axum::{
    Router,
    extract::{ConnectInfo, Path, RawQuery, State},
    http::{HeaderMap, Method, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use tracing::{debug, error, info, warn};

use super::{
    BootState, artifacts, grub, limit, plan, script,
    token::{self, Refusal},
};
use crate::{
    clock,
    inventory::{Netboot, PhoneHomeToken},
    mac::MacAddr,
    netboot::Actor,
    progress::Served,
    sync::lock,
    trace::TracePath,
};

/// How often a host's refused phone-homes are logged, in milliseconds.
const REFUSAL_LOG_EVERY_MS: u64 = 60_000;

pub fn router(state: Arc<BootState>) -> Router {
    Router::new()
        .route("/boot/{name}", get(boot_script))
        .route("/api/v1/hosts/{mac}/booted", post(booted))
        .route("/artifacts/{*path}", get(artifact).head(artifact))
        .route("/{*path}", get(boot_file).head(boot_file))
        .with_state(state)
}

/// The client's address as policy knows it (an IPv4 peer of a dual-stack
/// listener is its IPv4 address).
fn client_ip(peer: SocketAddr) -> std::net::IpAddr {
    crate::wire::canonical(peer.ip())
}

/// `GET /boot/<mac>.ipxe`.
async fn boot_script(
    State(state): State<Arc<BootState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(name): Path<String>,
) -> Response {
    let Some(mac) = name
        .strip_suffix(".ipxe")
        .and_then(|m| m.parse::<MacAddr>().ok())
    else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let Some(ip) = state.shared.address_of(mac, peer.ip()).await else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if crate::wire::canonical(peer.ip()) != ip {
        let why = || format!("/boot/{name} from {peer}, not {ip}");
        state
            .shared
            .progress
            .trace()
            .publish(mac, TracePath::Http, "refused", why);
        warn!(%mac, %peer, expected = %ip, "script refused: not the host's address");
        return StatusCode::FORBIDDEN.into_response();
    }
    let inv = state.shared.inventory();
    let host = inv.host_by_mac(mac);
    let Some(profile) = host
        .map(|h| inv.profile_of(h))
        .or_else(|| inv.discovery_profile())
    else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let no_labels = Default::default();
    let (ipv4, ipv6) = plan::own_addresses(host, ip);
    let target = plan::Target {
        mac,
        ip,
        ipv4,
        ipv6,
        hostname: host.and_then(|h| h.hostname.as_deref()),
        labels: host.map_or(&no_labels, |h| &h.labels),
    };
    // A script fetched is a new boot: its token replaces the last one.
    let epoch = state.shared.progress.new_token_epoch(mac, clock::now_ms());
    let token = state.token_key.issue(mac, epoch);
    // A host given no boot file now boots its disk, whatever it fetched
    // the script for.
    let exit_profile;
    let profile = if host.is_some_and(|h| inv.withholds_boot(h)) {
        crate::netboot::Counters::bump(&state.shared.netboot.counters.exit_scripts);
        exit_profile = script::local_disk(profile);
        &exit_profile
    } else {
        profile
    };
    match script::render(
        profile,
        &target,
        state.server_for(client_ip(peer)),
        Some(&token),
    ) {
        Ok(text) => {
            state.shared.progress.served(
                mac,
                clock::now_ms(),
                Served::Script {
                    via: TracePath::Http,
                    what: "script",
                },
                || format!("/boot/{name} from {peer}"),
                format!("/boot/{name}"),
            );
            ([("content-type", "text/plain; charset=utf-8")], text).into_response()
        }
        Err(e) => {
            warn!(error = %e, "script rendering failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// `POST /api/v1/hosts/<mac>/booted`: the booted system (or ramdisk) says so.
async fn booted(
    State(state): State<Arc<BootState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(mac): Path<String>,
    RawQuery(query): RawQuery,
    body: String,
) -> StatusCode {
    let Ok(mac) = mac.parse::<MacAddr>() else {
        return StatusCode::NOT_FOUND;
    };
    let Some(ip) = state.shared.address_of(mac, peer.ip()).await else {
        return StatusCode::NOT_FOUND;
    };
    if crate::wire::canonical(peer.ip()) != ip {
        let why = || format!("from {peer}, not {ip}");
        state
            .shared
            .progress
            .trace()
            .publish(mac, TracePath::PhoneHome, "refused", why);
        warn!(%mac, %peer, "phone-home refused: not the host's address");
        return StatusCode::FORBIDDEN;
    }
    if state.shared.inventory().ipxe.phone_home_token == PhoneHomeToken::Required
        && let Err(refusal) = check_token(&state, mac, query.as_deref())
    {
        refuse_phone_home(&state, mac, peer, refusal);
        return StatusCode::FORBIDDEN;
    }
    let note: String = body.chars().take(200).filter(|c| !c.is_control()).collect();
    let detail = if note.is_empty() {
        "booted".to_string()
    } else {
        note.clone()
    };
    state.shared.progress.served(
        mac,
        clock::now_ms(),
        Served::PhoneHome,
        || format!("{note:?} from {peer}"),
        detail,
    );
    let inv = state.shared.inventory();
    if let Some(host) = inv.host_by_mac(mac)
        && inv.netboot_of(host) == Netboot::Once
    {
        match state.shared.netboot_done(mac, Actor::PhoneHome) {
            Ok(true) => info!(%mac, "provisioning done: no boot file from now on"),
            Ok(false) => {}
            Err(e) => {
                error!(%mac, "failed to record that provisioning is done: {e}");
                return StatusCode::INTERNAL_SERVER_ERROR;
            }
        }
    }
    StatusCode::NO_CONTENT
}

/// Whether the phone-home of `mac` carries the token of its current boot.
fn check_token(state: &BootState, mac: MacAddr, query: Option<&str>) -> Result<(), Refusal> {
    let presented = token::from_query(query).ok_or(Refusal::Missing)?;
    let epoch = state.token_key.check(mac, presented)?;
    if state.shared.progress.accept_token_epoch(mac, epoch) {
        Ok(())
    } else {
        Err(Refusal::Stale)
    }
}

/// Counts a refused phone-home and logs it at most once a minute per host,
/// never with the token presented.
fn refuse_phone_home(state: &BootState, mac: MacAddr, peer: SocketAddr, refusal: Refusal) {
    let (counter, why) = match refusal {
        Refusal::Missing => (&state.http_stats.phone_home_missing, "no token"),
        Refusal::Mismatch => (&state.http_stats.phone_home_mismatch, "wrong token"),
        Refusal::Stale => (
            &state.http_stats.phone_home_mismatch,
            "token of an earlier boot",
        ),
    };
    limit::Stats::bump(counter);
    state
        .shared
        .progress
        .trace()
        .publish(mac, TracePath::PhoneHome, "refused", || {
            format!("{why}, from {peer}")
        });
    let now = clock::now_ms();
    let mut logged = lock(&state.refusal_log);
    let last = logged.get(&mac).copied();
    if last.is_none_or(|at| now.saturating_sub(at) >= REFUSAL_LOG_EVERY_MS) {
        // Only hosts with an address reach here, so the map is bounded by
        // the inventory and the pools; old entries go in bulk.
        if logged.len() >= 65_536 {
            logged.retain(|_, at| now.saturating_sub(*at) < REFUSAL_LOG_EVERY_MS);
        }
        logged.insert(mac, now);
        warn!(%mac, %peer, reason = why, "phone-home refused (logged once a minute per host)");
    }
}

/// Notes a boot file or artifact fetched by the host at `peer`. A pool
/// client is found through the lease store, whose lock the slow path holds
/// while it commits: that lookup, and the note, go to the blocking pool.
pub fn record_fetch(state: &BootState, peer: SocketAddr, path: &str) {
    let ip = client_ip(peer);
    let shared = state.shared.clone();
    let path = path.to_string();
    let record = move |shared: &crate::state::State, mac: MacAddr| {
        shared.progress.served(
            mac,
            clock::now_ms(),
            Served::Artifact,
            || format!("{path} from {peer}"),
            path.trim_start_matches('/').to_string(),
        );
    };
    if let Some(host) = shared.inventory().host_at(ip) {
        let mac = host.mac;
        return record(&shared, mac);
    }
    tokio::task::spawn_blocking(move || {
        if let Some(mac) = shared.mac_with_lease(ip) {
            record(&shared, mac);
        }
    });
}

async fn artifact(
    State(state): State<Arc<BootState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    headers: HeaderMap,
    Path(path): Path<String>,
) -> Response {
    serve_from(
        &state,
        state.artifacts.as_deref(),
        &path,
        peer,
        &method,
        &headers,
    )
    .await
}

async fn boot_file(
    State(state): State<Arc<BootState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    headers: HeaderMap,
    Path(path): Path<String>,
) -> Response {
    // shim over UEFI HTTP boot asks for `<dir>//grubx64.efi`: leading `/`
    // are dropped, as the TFTP server drops them.
    let path = path.trim_start_matches('/').to_owned();
    if grub::is_any_config(&state, &path) {
        let ip = client_ip(peer);
        let shared = state.clone();
        let name = path.clone();
        let config = tokio::task::spawn_blocking(move || {
            grub::config_for(&shared, ip, &name, TracePath::Http)
        })
        .await
        .ok()
        .flatten();
        if let Some(text) = config {
            return ([("content-type", "text/plain; charset=utf-8")], text).into_response();
        }
    }
    serve_from(
        &state,
        state.boot_root.as_deref(),
        &path,
        peer,
        &method,
        &headers,
    )
    .await
}

async fn serve_from(
    state: &BootState,
    root: Option<&std::path::Path>,
    path: &str,
    peer: SocketAddr,
    method: &Method,
    headers: &HeaderMap,
) -> Response {
    let Some(root) = root else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if state.shared.inventory().withholds_boot_at(client_ip(peer)) {
        crate::netboot::Counters::bump(&state.shared.netboot.counters.refused_http);
        debug!(%path, %peer, "refused: netboot gives this host no boot file now");
        return (
            StatusCode::FORBIDDEN,
            "netboot: this host is given no boot file now\n",
        )
            .into_response();
    }
    let Some(file) = artifacts::resolve(root, path).await else {
        // Client-chosen text: logged escaped.
        info!(?path, %peer, root = %root.display(), "not served: no such file under the root");
        return StatusCode::NOT_FOUND.into_response();
    };
    let response = artifacts::serve(&file, method, headers).await;
    if response.status().is_success() && method == Method::GET {
        record_fetch(state, peer, path);
    }
    response
}

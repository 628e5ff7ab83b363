//! The live fleet page: `GET /fleet`, a static page with no data in it
//! (HTML, CSS and script compiled into the binary, nothing fetched from
//! elsewhere), and the endpoints it reads behind the gate like every other
//! read: `GET /api/v1/fleet` (counts per stage and one page of compact
//! cells, filtered by label, profile and state), `GET /api/v1/fleet/events`
//! (server-sent events: the cells whose state changed, batched) and
//! `GET /api/v1/hosts/<host>/detail` (one host's progress, recovery record
//! and the audit log's actions on it). The live trace of a host is
//! `/api/v1/trace/<mac>` itself.
//!
//! A cell's state is read from the records the rest of the API reads: the
//! stage from [`Progress`](crate::progress::Progress), the recovery mark
//! from the control task's view. It keeps only copies: the last snapshot
//! of every host's cell, which all readers share so that a fleet is read
//! about once a [`TICK`] however many pages watch it, and what each event
//! stream last sent.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    body::Body,
    extract::{Path, Query, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use serde::{Deserialize, Serialize};

use crate::{
    api::admin::AdminState,
    audit::Entry,
    control,
    inventory::{Host, Inventory},
    mac::MacAddr,
    progress::Stage,
    recovery::{self, HostStatus},
    sync::lock,
    view::{HostView, host_view},
};

/// The page, whole: the agent serves it as it is.
const PAGE: &str = include_str!("fleet.html");

/// The states of a cell, by their code in `cells`: no boot seen yet, then
/// the stages in boot-chain order.
const STATES: [&str; 6] = ["none", "dhcp", "tftp", "script", "artifacts", "booted"];

/// Cells a page holds by default and at most: a browser draws ten thousand
/// cells at once without effort; a fleet larger than that is paged.
const DEFAULT_LIMIT: usize = 10_000;
const MAX_LIMIT: usize = 20_000;

/// How often an event stream looks for changes, and how often it writes a
/// comment when nothing changed, so that a watcher that left is noticed.
const TICK: Duration = Duration::from_millis(400);
const KEEPALIVE: Duration = Duration::from_secs(2);

/// Past this many changed cells in one batch, the stream tells the page to
/// fetch its page again instead of listing them.
const MAX_BATCH: usize = 5_000;

/// The page's routes that are not behind the gate: only the page, which
/// holds no data.
pub fn open_routes() -> Router {
    Router::new().route("/fleet", get(page))
}

/// The data the page reads, behind the gate with the rest of the API.
pub fn routes() -> Router<Arc<AdminState>> {
    Router::new()
        .route("/api/v1/fleet", get(fleet))
        .route("/api/v1/fleet/events", get(events))
        .route("/api/v1/hosts/{host}/detail", get(detail))
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // The page runs its own inline script and talks to this origin
            // alone.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
                 frame-ancestors 'none'",
            ),
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
        .into_response()
}

/// Which hosts a page or a stream is about.
#[derive(Deserialize, Debug, Default, Clone)]
pub struct Filter {
    /// `key=value`, or `key` for any value.
    #[serde(default)]
    pub label: Option<String>,
    #[serde(default)]
    pub profile: Option<String>,
    /// One of [`STATES`], `recovering` or `failed`: for a page only.
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub offset: Option<usize>,
    #[serde(default)]
    pub limit: Option<usize>,
}

impl Filter {
    fn blank(s: &Option<String>) -> Option<&str> {
        s.as_deref().map(str::trim).filter(|s| !s.is_empty())
    }

    /// Whether `host` matches the label and profile asked.
    fn selects(&self, inv: &Inventory, host: &Host) -> bool {
        let label = Self::blank(&self.label).is_none_or(|l| match l.split_once('=') {
            Some((k, v)) => host.labels.get(k.trim()).is_some_and(|x| x == v.trim()),
            None => host.labels.contains_key(l),
        });
        label && Self::blank(&self.profile).is_none_or(|p| inv.profile_of(host).name == p)
    }

    fn state_selects(&self, cell: Cell) -> Result<bool, ApiError> {
        let Some(state) = Self::blank(&self.state) else {
            return Ok(true);
        };
        Ok(match state {
            "recovering" => cell.mark == Mark::Recovering,
            "failed" => cell.mark == Mark::Failed,
            s => {
                let code = STATES.iter().position(|x| *x == s).ok_or_else(|| {
                    (
                        StatusCode::BAD_REQUEST,
                        format!("unknown state {s:?}: one of {STATES:?}, recovering, failed\n"),
                    )
                })?;
                usize::from(cell.state) == code
            }
        })
    }
}

/// A recovery in progress or given up: a mark on the cell, whose colour is
/// its stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
enum Mark {
    #[default]
    None,
    Recovering,
    Failed,
}

impl Mark {
    fn of(status: Option<&HostStatus>) -> Mark {
        match status.map(|s| s.state) {
            None | Some(recovery::State::Idle | recovery::State::Booted) => Mark::None,
            Some(recovery::State::Failed) => Mark::Failed,
            Some(_) => Mark::Recovering,
        }
    }
}

/// One host's cell: its state's code (an index into [`STATES`]) and mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
struct Cell {
    state: u8,
    mark: Mark,
}

impl Cell {
    fn of(stage: Option<Stage>, status: Option<&HostStatus>) -> Cell {
        let state = match stage {
            None => 0,
            Some(Stage::Dhcp) => 1,
            Some(Stage::Tftp) => 2,
            Some(Stage::Script) => 3,
            Some(Stage::Artifacts) => 4,
            Some(Stage::Booted) => 5,
        };
        Cell {
            state,
            mark: Mark::of(status),
        }
    }

    fn mark_code(self) -> u8 {
        match self.mark {
            Mark::None => 0,
            Mark::Recovering => 1,
            Mark::Failed => 2,
        }
    }
}

/// A snapshot is reused for this long: however many pages watch, the
/// fleet's cells are read about once a [`TICK`].
const FRESH: Duration = Duration::from_millis(200);

/// The cells of every host of the inventory in force, in its order, as
/// last read; the pages and streams share them.
#[derive(Default)]
pub struct Snapshots(Mutex<Option<Snapshot>>);

#[derive(Clone)]
struct Snapshot {
    at: Instant,
    inventory: Arc<Inventory>,
    cells: Arc<[Cell]>,
}

impl Snapshots {
    /// The cells now: the last snapshot if it is fresh and of the
    /// inventory in force, else a new one. Takes milliseconds for a large
    /// fleet: call it off the async runtime.
    fn read(&self, s: &AdminState) -> Snapshot {
        let mut latest = lock(&self.0);
        let inv = s.boot.shared.inventory();
        if let Some(snap) = latest
            .as_ref()
            .filter(|l| Arc::ptr_eq(&l.inventory, &inv) && l.at.elapsed() < FRESH)
        {
            return snap.clone();
        }
        let stages = s
            .boot
            .shared
            .progress
            .stages(inv.hosts.iter().map(|h| &**h));
        let cells = {
            let view = s.oob.control.view();
            inv.hosts
                .iter()
                .zip(stages)
                .map(|(h, stage)| Cell::of(stage, view.recovery.get(&h.mac)))
                .collect()
        };
        let snap = Snapshot {
            at: Instant::now(),
            inventory: inv,
            cells,
        };
        *latest = Some(snap.clone());
        snap
    }
}

/// The indices of the hosts `filter` selects by label and profile.
fn select(inv: &Inventory, filter: &Filter) -> Arc<[u32]> {
    (0u32..)
        .zip(inv.hosts.iter())
        .filter(|(_, h)| filter.selects(inv, h))
        .map(|(i, _)| i)
        .collect()
}

/// How many cells are in each state, and how many carry each mark.
#[derive(Serialize, Debug, Default, PartialEq, Eq)]
struct Counts {
    /// By state code, in [`STATES`] order.
    states: [usize; STATES.len()],
    recovering: usize,
    failed: usize,
}

impl Counts {
    fn of(cells: &[Cell]) -> Counts {
        let mut counts = Counts::default();
        for c in cells {
            counts.states[usize::from(c.state)] += 1;
            match c.mark {
                Mark::None => {}
                Mark::Recovering => counts.recovering += 1,
                Mark::Failed => counts.failed += 1,
            }
        }
        counts
    }
}

/// `GET /api/v1/fleet`'s answer.
#[derive(Serialize, Debug)]
struct FleetPage {
    /// Hosts in the inventory.
    total: usize,
    /// Hosts the label and profile select: what `counts` counts.
    selected: usize,
    /// Of those, the ones the state selects too: what `cells` pages.
    matched: usize,
    offset: usize,
    limit: usize,
    states: [&'static str; STATES.len()],
    counts: Counts,
    /// Every profile of the inventory, for the page's filter.
    profiles: Vec<String>,
    /// `[name, mac, state, mark]` a host: `name` its hostname or MAC,
    /// `state` an index into `states`, `mark` 0, 1 (recovering) or 2
    /// (failed). Compact, since a page holds thousands.
    cells: Vec<(String, MacAddr, u8, u8)>,
}

type ApiError = (StatusCode, String);

async fn fleet(
    State(s): State<Arc<AdminState>>,
    Query(filter): Query<Filter>,
) -> Result<Json<FleetPage>, ApiError> {
    let snap = {
        let s = s.clone();
        tokio::task::spawn_blocking(move || s.fleet.read(&s))
            .await
            .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")))?
    };
    let inv = &snap.inventory;
    let selected = select(inv, &filter);
    let cells: Vec<Cell> = selected.iter().map(|&i| snap.cells[i as usize]).collect();
    let offset = filter.offset.unwrap_or(0);
    let limit = filter.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let mut matched = 0;
    let mut page = Vec::new();
    for (&i, c) in selected.iter().zip(&cells) {
        if !filter.state_selects(*c)? {
            continue;
        }
        if matched >= offset && page.len() < limit {
            let h = &inv.hosts[i as usize];
            let name = h
                .hostname
                .as_deref()
                .map_or_else(|| h.mac.to_string(), str::to_owned);
            page.push((name, h.mac, c.state, c.mark_code()));
        }
        matched += 1;
    }
    Ok(Json(FleetPage {
        total: inv.hosts.len(),
        selected: selected.len(),
        matched,
        offset,
        limit,
        states: STATES,
        counts: Counts::of(&cells),
        profiles: inv.profiles.iter().map(|p| p.name.clone()).collect(),
        cells: page,
    }))
}

/// One batch of an event stream.
#[derive(Serialize, Debug)]
struct Batch {
    /// The page must fetch its cells again: the inventory changed, or
    /// more changed at once than a batch lists.
    resync: bool,
    counts: Counts,
    /// `[mac, state, mark]` of each cell that changed since the last batch.
    cells: Vec<(MacAddr, u8, u8)>,
}

/// What one event stream last sent.
struct Sent {
    inventory: Arc<Inventory>,
    /// The indices of the hosts its filter selects in `inventory`.
    selected: Arc<[u32]>,
    cells: Vec<Cell>,
}

/// The selected hosts' cells now: what a stream sends and keeps. The
/// selection is made again only for a new inventory.
fn read_cells(s: &AdminState, filter: &Filter, sent: Option<&Sent>) -> Sent {
    let snap = s.fleet.read(s);
    let selected = match sent {
        Some(sent) if Arc::ptr_eq(&sent.inventory, &snap.inventory) => sent.selected.clone(),
        _ => select(&snap.inventory, filter),
    };
    let cells = selected.iter().map(|&i| snap.cells[i as usize]).collect();
    Sent {
        inventory: snap.inventory,
        selected,
        cells,
    }
}

/// What a stream sends after `sent` when the cells are `now`: nothing when
/// none changed.
fn batch(sent: Option<&Sent>, now: &Sent) -> Option<Batch> {
    let counts = Counts::of(&now.cells);
    let now_inventory = &now.inventory;
    match sent {
        Some(sent)
            if Arc::ptr_eq(&sent.inventory, &now.inventory) && sent.selected == now.selected =>
        {
            let changed: Vec<_> = now
                .selected
                .iter()
                .zip(now.cells.iter().zip(&sent.cells))
                .filter(|(_, (now, then))| now != then)
                .map(|(&i, (now, _))| {
                    let mac = now_inventory.hosts[i as usize].mac;
                    (mac, now.state, now.mark_code())
                })
                .collect();
            let resync = changed.len() > MAX_BATCH;
            (!changed.is_empty()).then(|| Batch {
                resync,
                counts,
                cells: if resync { Vec::new() } else { changed },
            })
        }
        // A new stream starts with the counts; a new inventory resyncs.
        _ => Some(Batch {
            resync: sent.is_some(),
            counts,
            cells: Vec::new(),
        }),
    }
}

/// `GET /api/v1/fleet/events?label=&profile=`: server-sent events, one
/// `data:` line of a [`Batch`] when cells changed (looked at every
/// [`TICK`]), a comment line every [`KEEPALIVE`] otherwise.
async fn events(
    State(s): State<Arc<AdminState>>,
    Query(filter): Query<Filter>,
) -> Result<Response, ApiError> {
    struct Stream {
        s: Arc<AdminState>,
        filter: Arc<Filter>,
        sent: Option<Sent>,
        quiet: Duration,
        ticker: tokio::time::Interval,
        shutdown: crate::shutdown::Shutdown,
    }
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let start = Stream {
        shutdown: s.shutdown.clone(),
        s,
        filter: Arc::new(filter),
        sent: None,
        quiet: Duration::ZERO,
        ticker,
    };
    let stream = futures_util::stream::unfold(start, |mut st| async move {
        loop {
            tokio::select! {
                _ = st.ticker.tick() => {}
                () = st.shutdown.stopped() => return None,
            }
            let (s, filter) = (st.s.clone(), st.filter.clone());
            let sent = st.sent.take();
            // Reading a large fleet takes milliseconds: off the runtime.
            let (batch, now) = tokio::task::spawn_blocking(move || {
                let now = read_cells(&s, &filter, sent.as_ref());
                (batch(sent.as_ref(), &now), now)
            })
            .await
            .ok()?;
            st.sent = Some(now);
            if let Some(batch) = batch {
                st.quiet = Duration::ZERO;
                let json = serde_json::to_string(&batch).unwrap_or_default();
                return Some((
                    Ok::<_, std::convert::Infallible>(format!("data: {json}\n\n")),
                    st,
                ));
            }
            st.quiet += TICK;
            if st.quiet >= KEEPALIVE {
                st.quiet = Duration::ZERO;
                return Some((Ok(": keepalive\n\n".to_string()), st));
            }
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// `GET /api/v1/hosts/<host>/detail`'s answer.
#[derive(Serialize, Debug)]
struct Detail {
    /// The host as `/api/v1/hosts` shows it, progress included.
    host: HostView,
    /// Its recovery record: state, attempt, last transition and error.
    recovery: Option<HostStatus>,
    /// The audit log's last actions on it (power, boot device, recovery,
    /// netboot), oldest first.
    actions: Vec<Entry>,
}

/// Audit entries read for a host's actions, and kept of them.
const AUDIT_SCAN: usize = 10_000;
const AUDIT_KEEP: usize = 50;

async fn detail(
    State(s): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<Json<Detail>, ApiError> {
    let inv = s.boot.shared.inventory();
    let host = control::find_host(&inv, &name)
        .ok_or_else(|| (StatusCode::NOT_FOUND, format!("no host {name}\n")))?;
    let view = host_view(&s.boot.shared, &s.oob.control, &s.oob.fallbacks, host);
    let recovery = s.oob.control.view().recovery.get(&host.mac).cloned();
    let names = [
        Some(host.mac.to_string()),
        host.hostname.as_deref().map(str::to_owned),
    ];
    let audit = s.oob.audit.clone();
    let actions = tokio::task::spawn_blocking(move || audit.tail(AUDIT_SCAN))
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")))?
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")))?;
    let mut actions: Vec<Entry> = actions
        .into_iter()
        .filter(|e| names.iter().flatten().any(|n| *n == e.host))
        .collect();
    actions.drain(..actions.len().saturating_sub(AUDIT_KEEP));
    Ok(Json(Detail {
        host: view,
        recovery,
        actions,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_its_stage_with_its_recovery_mark() {
        assert_eq!(Cell::of(None, None), Cell::default());
        assert_eq!(Cell::of(Some(Stage::Booted), None).state, 5);
        assert_eq!(
            STATES[usize::from(Cell::of(Some(Stage::Tftp), None).state)],
            "tftp"
        );
        let counts = Counts::of(&[
            Cell::of(Some(Stage::Dhcp), None),
            Cell::of(Some(Stage::Dhcp), None),
            Cell {
                state: 0,
                mark: Mark::Failed,
            },
        ]);
        assert_eq!(counts.states, [1, 2, 0, 0, 0, 0]);
        assert_eq!((counts.recovering, counts.failed), (0, 1));
    }

    #[test]
    fn an_unknown_state_filter_is_refused() {
        let filter = Filter {
            state: Some("rebooting".into()),
            ..Filter::default()
        };
        assert!(filter.state_selects(Cell::default()).is_err());
        let booted = Filter {
            state: Some("booted".into()),
            ..Filter::default()
        };
        assert!(!booted.state_selects(Cell::default()).expect("known"));
    }

    fn sent(inventory: &Arc<Inventory>, cells: &[Cell]) -> Sent {
        Sent {
            inventory: inventory.clone(),
            selected: select(inventory, &Filter::default()),
            cells: cells.to_vec(),
        }
    }

    #[test]
    fn a_stream_sends_the_cells_that_changed_and_resyncs_on_a_new_inventory() {
        let text = "subnets: [{cidr: 10.0.0.0/24}]\nprofiles: [{name: p}]\nhosts:\n  - {mac: \"02:00:00:00:00:01\", ip: 10.0.0.11, profile: p}\n  - {mac: \"02:00:00:00:00:02\", ip: 10.0.0.12, profile: p}\n";
        let parse = || {
            Arc::new(Inventory::parse(std::path::Path::new("inv.yaml"), text).expect("inventory"))
        };
        let inv = parse();
        let idle = [Cell::default(); 2];
        let first = batch(None, &sent(&inv, &idle)).expect("a first batch");
        assert!(!first.resync && first.cells.is_empty());
        assert_eq!(first.counts.states[0], 2);
        assert!(batch(Some(&sent(&inv, &idle)), &sent(&inv, &idle)).is_none());
        let booting = [Cell::default(), Cell::of(Some(Stage::Dhcp), None)];
        let changed = batch(Some(&sent(&inv, &idle)), &sent(&inv, &booting)).expect("a change");
        assert!(!changed.resync);
        assert_eq!(changed.cells, [(inv.hosts[1].mac, 1, 0)]);
        assert_eq!(changed.counts.states[..2], [1, 1]);
        let reloaded = batch(Some(&sent(&inv, &idle)), &sent(&parse(), &idle)).expect("a resync");
        assert!(reloaded.resync && reloaded.cells.is_empty());
    }

    #[test]
    fn the_page_fetches_nothing_from_elsewhere() {
        for needle in ["http://", "https://", "//cdn", "<link", "src="] {
            assert!(!PAGE.contains(needle), "the page has {needle}");
        }
    }
}

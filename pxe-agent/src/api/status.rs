//! `GET /api/v1/status`: the agent at a glance for `pxe-agent status`:
//! ready or not and why, each interface's XDP attach mode, the inventory
//! in force, hosts per boot stage, and the peers.

use std::sync::Arc;

use axum::{Json, extract::State};

use crate::{
    api::admin::AdminState,
    sync::lock,
    view::{InventoryView, StatusView, host_views, status_view},
};

pub(super) async fn status(State(s): State<Arc<AdminState>>) -> Json<StatusView> {
    let inventory = {
        let gauges = lock(&s.serving.gauges);
        InventoryView {
            generation: gauges.reloads_ok + 1,
            hosts: gauges.hosts,
            reloads_rejected: gauges.reloads_rejected,
        }
    };
    let shared = &s.boot.shared;
    let hosts = host_views(shared, &s.oob.control, &s.oob.fallbacks);
    Json(status_view(
        shared,
        shared.health.xdp_modes(),
        inventory,
        &hosts,
    ))
}

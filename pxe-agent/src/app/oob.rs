//! Starting the out-of-band side: the recovery controller and sequencer
//! with the control task, the API's gate and its TLS certificate.

use std::sync::{Arc, atomic::Ordering};

use anyhow::Context as _;
use tracing::{error, info, warn};

use super::config::{ApiAuth, ApiConfig, RunConfig};
use crate::{
    api::{
        admin::{self},
        auth::Tokens,
        gate::{Gate, Identities},
        kube_auth::Reviewer,
        tls::{Reloader, ServingCert, TlsStats},
    },
    audit::AuditLog,
    bmc::{
        Driver, Fallbacks, RetryPolicy,
        counted::{Calls, Counted},
    },
    control,
    recovery::{Controller, RecoveryStore, Sequencer},
    shutdown::Shutdown,
    state::State,
};

/// Opens the recovery store and the audit log, and starts the out-of-band
/// control task over each host's BMC driver for the inventory in force.
/// Fails (the agent does not start) on a recovery store or audit log it
/// cannot open: acting without either is not an option.
pub(super) fn start_recovery(
    cfg: &RunConfig,
    state: &Arc<State>,
    fleet: Option<control::Fleet>,
    shutdown: Shutdown,
) -> anyhow::Result<(Arc<admin::OobState>, tokio::task::JoinHandle<()>)> {
    let store =
        RecoveryStore::open_in(&cfg.state_dir).context("failed to open the recovery store")?;
    let controller =
        Controller::new(store, cfg.oob.recovery).context("failed to load the recovery state")?;
    let audit_path = cfg
        .oob
        .audit_log
        .clone()
        .unwrap_or_else(|| cfg.state_dir.join("audit.jsonl"));
    let audit = Arc::new(AuditLog::open(&audit_path)?);
    let fallbacks = Arc::new(Fallbacks::new(Some(audit.clone())));
    let rx_of = state.clone();
    let share_of = state.clone();
    let echo = cfg.oob.boot_flag_echo;
    let record = fallbacks.clone();
    let bmc_calls = Arc::new(Calls::default());
    let counted = bmc_calls.clone();
    let inputs = control::Inputs {
        controller,
        sequencer: Sequencer::new(cfg.oob.sequence),
        make_bmc: Box::new(move |settings| {
            Driver::for_host_in(settings, RetryPolicy::default(), echo, &record)
                .map(|driver| Counted::new(driver, counted.clone()))
        }),
        progress: state.progress.clone(),
        slow_path_rx: Box::new(move || rx_of.stats.rx.load(Ordering::Relaxed)),
        share: Box::new(move || share_of.share()),
        fleet,
    };
    let (handle, task) = control::start(inputs, state.inventory(), shutdown);
    info!(audit = %audit_path.display(), "out-of-band control running");
    Ok((
        Arc::new(admin::OobState {
            control: handle,
            audit,
            fallbacks,
            bmc_calls,
        }),
        task,
    ))
}

/// Reports out-of-band control that ends before shutdown (a panic in its
/// task) in the agent's health, instead of letting BMC actions and recovery
/// stop unnoticed.
pub(super) fn watch_recovery(
    task: tokio::task::JoinHandle<()>,
    state: Arc<State>,
    shutdown: Shutdown,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let ended = task.await;
        if shutdown.is_stopped() {
            return;
        }
        let why = match ended {
            Err(e) if e.is_panic() => "panicked",
            _ => "stopped",
        };
        error!("out-of-band control {why}: BMC actions and recovery are off until a restart");
        state
            .health
            .set_oob(Err(format!("{why}; BMC actions and recovery are off")));
    })
}

/// The API's gate: how callers are identified, checked against where the
/// API listens and the node's addresses on the provisioning networks
/// (both families).
pub(super) async fn api_gate(
    api: &ApiConfig,
    provisioning: &[std::net::IpAddr],
) -> anyhow::Result<Gate> {
    let identities = match (&api.auth, &api.token_file) {
        (ApiAuth::Kubernetes { .. }, Some(_)) => {
            anyhow::bail!("--api-auth kubernetes and --api-token-file exclude each other")
        }
        (ApiAuth::Kubernetes { namespace }, None) => {
            let (client, namespace) = crate::kube::connect(namespace.clone())
                .await
                .context("--api-auth kubernetes needs the Kubernetes API")?;
            info!(
                %namespace,
                "API callers are checked by the Kubernetes API server: their bearer token with a \
                 TokenReview, each call with a SubjectAccessReview of its verb on boothosts/api"
            );
            let reviewer = Reviewer::new(client, namespace)
                .context("failed to read random bytes for the review cache's key")?;
            Identities::Kubernetes(Box::new(reviewer))
        }
        (ApiAuth::Tokens, Some(path)) => {
            info!("API callers are identified by the bearer tokens of --api-token-file");
            Identities::Tokens(Tokens::load(path)?)
        }
        (ApiAuth::Tokens, None) => {
            warn!(
                "no --api-token-file: API reads are open on loopback, and power, bootdev, \
                 recover and netboot calls are refused"
            );
            Identities::None
        }
    };
    Ok(Gate::for_listener(identities, api.addr, provisioning)?)
}

/// The API's serving certificate, loaded at start, and what reloads it.
pub(super) struct ApiTls {
    pub(super) reloader: Reloader,
    pub(super) serving: Arc<ServingCert>,
    pub(super) stats: Arc<TlsStats>,
}

/// The API's TLS, when configured: a pair that does not load stops the
/// start. Without it, an API beyond loopback is warned about.
pub(super) fn api_tls(api: &ApiConfig) -> anyhow::Result<Option<ApiTls>> {
    let Some(files) = &api.tls else {
        if !api.addr.ip().is_loopback() {
            warn!(
                addr = %api.addr,
                "the API listens beyond loopback without TLS: bearer tokens cross the network \
                 in clear; serve it over TLS with --api-tls-cert and --api-tls-key"
            );
        }
        return Ok(None);
    };
    let (reloader, loaded) =
        Reloader::start(files.clone()).context("failed to load the API's TLS certificate")?;
    let stats = Arc::new(TlsStats::default());
    stats.not_after.store(loaded.not_after, Ordering::Relaxed);
    info!(
        cert = %files.cert.display(),
        not_after = loaded.not_after,
        "loaded the API's TLS certificate"
    );
    Ok(Some(ApiTls {
        reloader,
        serving: Arc::new(ServingCert::new(loaded.certified)),
        stats,
    }))
}

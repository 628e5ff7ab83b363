//! What `run` is given: the agent's configuration as the CLI (or a test)
//! builds it, with the API's and the out-of-band task's parts.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use super::interfaces::Interface;
use crate::{
    api::tls::TlsFiles,
    bmc::BootFlagEcho,
    dhcp::server::Limits,
    http::limit,
    kube::membership,
    recovery::{self, SequencePolicy},
    xdp::AttachMode,
};

/// Everything `pxe-agent run` needs.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The interfaces served, in the order given (at least one).
    pub interfaces: Vec<Interface>,
    /// The inventory file; unused when `kube` is set.
    pub inventory: PathBuf,
    /// Read the inventory from the Kubernetes API instead of the file.
    pub kube: Option<crate::kube::KubeSettings>,
    /// `/metrics` and `/healthz`: open, no per-host identifier.
    pub metrics_addr: SocketAddr,
    /// The JSON API: where it listens and who may call it.
    pub api: ApiConfig,
    pub xdp_mode: AttachMode,
    /// How often the inventory file is checked for changes.
    pub reload_interval: Duration,
    /// Where the agent's records live: leases, netboot and recovery state,
    /// the phone-home token key and, by default, the audit log.
    pub state_dir: PathBuf,
    /// The slow path's storm guard.
    pub limits: Limits,
    /// Where scripts, boot files and artifacts are served.
    pub http_addr: SocketAddr,
    /// Connection bound and deadlines of that listener.
    pub http_limits: limit::Limits,
    /// Served over HTTP at `/` (and TFTP): iPXE binaries.
    pub boot_root: Option<PathBuf>,
    /// Largest TFTP `windowsize` granted (1..=64).
    pub tftp_max_windowsize: u16,
    /// TFTP transfers served at once.
    pub tftp_max_transfers: usize,
    /// TFTP read requests held, past `tftp_max_transfers`, until a slot
    /// frees.
    pub tftp_max_waiting: usize,
    /// Artifact downloads served at once per interface; the rest wait for
    /// a turn (`admission`).
    pub artifact_transfers: usize,
    /// How long a TFTP transfer busy-polls before it sleeps.
    pub tftp_busy_poll: std::time::Duration,
    /// Served over HTTP at `/artifacts/`.
    pub artifacts: Option<PathBuf>,
    /// Out-of-band control: sequencing, tokens, audit log.
    pub oob: OobConfig,
    /// A bpffs directory to pin each interface's XDP link and maps in
    /// (`<dir>/<ifname>/`): they outlive the agent, and the next one adopts
    /// them. Without it, exiting detaches.
    pub pin_dir: Option<PathBuf>,
    /// Sharing the discovery pools with peer agents (`--peers kube`).
    pub peers: Option<membership::Config>,
    /// Host entries (ports) the fast path's maps hold; without it, twice
    /// what the inventory at start needs.
    pub map_capacity: Option<u32>,
}

/// The out-of-band knobs of `pxe-agent run`.
#[derive(Clone, Debug, Default)]
pub struct OobConfig {
    pub sequence: SequencePolicy,
    pub recovery: recovery::Policy,
    /// Defaults to `<state-dir>/audit.jsonl`.
    pub audit_log: Option<PathBuf>,
    /// What the BMCs echo of the boot flags (every BMC of the agent).
    pub boot_flag_echo: BootFlagEcho,
}

/// The JSON API of `pxe-agent run`.
#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// Loopback unless the operator says otherwise; beyond loopback the
    /// API needs a way to identify callers.
    pub addr: SocketAddr,
    /// Serve it over TLS with this certificate and key, reloaded when
    /// they change.
    pub tls: Option<TlsFiles>,
    /// `name token` lines; without it, reads are open (on loopback) and
    /// every other call is refused.
    pub token_file: Option<PathBuf>,
    /// How callers are identified.
    pub auth: ApiAuth,
}

impl Default for ApiConfig {
    fn default() -> ApiConfig {
        ApiConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 9465)),
            tls: None,
            token_file: None,
            auth: ApiAuth::Tokens,
        }
    }
}

/// How the JSON API identifies its callers (`--api-auth`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiAuth {
    /// The tokens of `token_file`, if any.
    Tokens,
    /// TokenReviews and SubjectAccessReviews, in `namespace`
    /// (`--kube-namespace`; `None`: the service account's or the
    /// kubeconfig's).
    Kubernetes { namespace: Option<String> },
}

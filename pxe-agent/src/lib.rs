//! pxe-agent, a network-boot responder: DHCP answered by an XDP program
//! from maps compiled from a host inventory (a file or Kubernetes objects)
//! and, for what it passes up, by a userspace slow path; TFTP and HTTP
//! boot; BMC control and recovery; the JSON API, `/metrics` and the
//! command line's client.
//!
//! The modules are in layers, bottom to top; each imports only its own
//! layer and those below (`tests/layers.rs` checks it):
//!
//! - vocabulary: `mac`, `clock`, `netdev`, `wire`, `rawsock`, `logging`,
//!   `audit`, `health`, `terminal`, `when`, `trust`, `open_files`,
//!   `metrics`, `share`, `shutdown`, `sync`;
//! - engines: `admission`, `bmc`, `tftp`, `trace`, `discovered`, `ratelimit`,
//!   `mac_records`, `client`;
//! - model: `inventory`, `netboot`;
//! - records: `lease`, `progress`, `recovery`, `import`, `other_server`;
//! - shared state: `state`, `control`;
//! - paths: `dhcp`, `view`;
//! - services: `xdp`, `http`;
//! - serving: `rollout`;
//! - sources: `kube`, `fuzzing`;
//! - front door: `api`;
//! - wiring: `app`.
//!
//! docs/architecture.md, "The agent", says what each owns.

pub mod admission;
pub mod api;
pub mod app;
pub mod audit;
pub mod bmc;
pub mod client;
pub mod clock;
pub mod control;
pub mod dhcp;
pub mod discovered;
#[doc(hidden)]
pub mod fuzzing;
pub mod health;
pub mod http;
pub mod import;
pub mod inventory;
pub mod kube;
pub mod lease;
pub mod logging;
pub mod mac;
pub mod mac_records;
pub mod metrics;
pub mod netboot;
pub mod netdev;
pub mod open_files;
pub mod other_server;
pub mod progress;
pub mod ratelimit;
pub mod rawsock;
pub mod recovery;
pub mod rollout;
pub mod share;
pub mod shutdown;
pub mod state;
pub mod sync;
pub mod terminal;
pub mod tftp;
pub mod trace;
pub mod trust;
pub mod view;
pub mod when;
pub mod wire;
pub mod xdp;

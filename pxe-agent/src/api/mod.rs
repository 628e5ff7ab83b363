//! The agent's front door: the metrics and health listener and the JSON
//! API behind its gate (who may call, in token or Kubernetes terms), over
//! TLS when configured. It reads what the layers below hold and acts
//! through their handles; nothing below imports it.

pub mod access;
pub mod admin;
pub mod auth;
pub mod fleet;
pub mod gate;
pub mod kube_auth;
pub mod metrics;
mod status;
pub mod tls;
pub mod tls_listener;

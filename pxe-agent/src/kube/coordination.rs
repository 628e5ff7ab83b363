//! The coordination.k8s.io/v1 Leases the agents of a fleet share, of two
//! kinds: one per pool slot (`membership`) and one per inventory host
//! (`host_records`). Owns the handle to them and the label that tells the
//! two kinds apart; what each kind holds is its own module's.

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};

/// The label every host record carries, its value the MAC in hex; the
/// membership's list of slot Leases leaves these out by it.
pub const HOST_LABEL: &str = "pxe-agent.io/host";

/// The Leases of `namespace`, else of the client's default namespace (the
/// service account's or the kubeconfig's), and that namespace.
pub fn leases_api(client: Client, namespace: Option<&str>) -> (Api<Lease>, String) {
    let namespace = namespace.map_or_else(|| client.default_namespace().to_string(), str::to_owned);
    (Api::namespaced(client, &namespace), namespace)
}

//! What an API call asks to do and who asks: the [`Verb`] and the host it
//! is about ([`Access`]), the identified [`Caller`], and why a call is
//! refused before its handler runs ([`Refusal`]). The gate decides; the
//! token file and the Kubernetes reviewer answer in these terms.

use axum::{
    http::{Method, StatusCode, header},
    response::{IntoResponse, Response},
};

/// What a throttled caller is told to wait, in seconds.
pub(super) const RETRY_AFTER_SECS: u64 = 6;

/// What a call does, as authorization sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    /// Any `GET`: hosts, leases, discovered clients, peers, the audit log,
    /// a host's BMC information, a live trace.
    Read,
    Power,
    Bootdev,
    Recover,
    Reprovision,
    NetbootDone,
}

impl Verb {
    /// The verb's name: in Kubernetes access reviews, logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Verb::Read => "read",
            Verb::Power => "power",
            Verb::Bootdev => "bootdev",
            Verb::Recover => "recover",
            Verb::Reprovision => "reprovision",
            Verb::NetbootDone => "netboot-done",
        }
    }
}

/// A call's verb and the host it is about, if one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Access {
    pub verb: Verb,
    pub host: Option<String>,
}

impl Access {
    /// What `method path` does. Paths the API does not serve are reads: the
    /// gate still asks for an identity, so a caller without one cannot
    /// tell which paths exist.
    pub fn of(method: &Method, path: &str) -> Access {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let host = match parts.as_slice() {
            ["api", "v1", "hosts", host, _, ..] | ["api", "v1", "trace", host] => {
                Some((*host).to_string())
            }
            _ => None,
        };
        let verb = if method == Method::POST {
            match parts.as_slice() {
                ["api", "v1", "hosts", _, "power"] => Verb::Power,
                ["api", "v1", "hosts", _, "bootdev"] => Verb::Bootdev,
                ["api", "v1", "hosts", _, "recover"] => Verb::Recover,
                ["api", "v1", "hosts", _, "reprovision"] => Verb::Reprovision,
                ["api", "v1", "hosts", _, "netboot", "done"] => Verb::NetbootDone,
                _ => Verb::Read,
            }
        } else {
            Verb::Read
        };
        Access { verb, host }
    }
}

/// Who made a call: a token's name (or a Kubernetes user) and groups; the
/// handlers find it in the request's extensions and the audit log records
/// it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub name: String,
    pub groups: Vec<String>,
}

impl Caller {
    /// A reader on loopback without a token.
    pub fn anonymous() -> Caller {
        Caller {
            name: "anonymous".into(),
            groups: Vec::new(),
        }
    }
}

/// Why a call was refused before its handler ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The agent has no way to identify callers, and the call is not an
    /// open read.
    NoIdentities,
    /// No bearer token.
    Missing,
    /// A token that is not one of ours.
    Invalid,
    /// A known caller without the right to this verb.
    Forbidden,
    /// Too many failed attempts from this address lately.
    Throttled,
    /// The identity could not be checked (the reviewer is unreachable).
    Unavailable,
}

impl Refusal {
    /// The `reason` label of `pxe_api_auth_failures_total`.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::NoIdentities => "no-identities",
            Refusal::Missing => "missing",
            Refusal::Invalid => "invalid",
            Refusal::Forbidden => "forbidden",
            Refusal::Throttled => "throttled",
            Refusal::Unavailable => "unavailable",
        }
    }

    /// Whether the attempt counts against the caller's address.
    pub(super) fn charges(self) -> bool {
        matches!(
            self,
            Refusal::Missing | Refusal::Invalid | Refusal::Forbidden
        )
    }

    pub(super) const ALL: [Refusal; 6] = [
        Refusal::NoIdentities,
        Refusal::Missing,
        Refusal::Invalid,
        Refusal::Forbidden,
        Refusal::Throttled,
        Refusal::Unavailable,
    ];
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let bearer = [(header::WWW_AUTHENTICATE, "Bearer")];
        match self {
            Refusal::NoIdentities => (
                StatusCode::FORBIDDEN,
                "this call needs an identity, and the agent has no way to check one: start it \
                 with --api-token-file FILE or --api-auth kubernetes\n",
            )
                .into_response(),
            Refusal::Missing | Refusal::Invalid => (
                StatusCode::UNAUTHORIZED,
                bearer,
                "a valid bearer token is required (Authorization: Bearer <token>)\n",
            )
                .into_response(),
            Refusal::Forbidden => (
                StatusCode::FORBIDDEN,
                "the caller may not do this (see the agent's access rules)\n",
            )
                .into_response(),
            Refusal::Throttled => (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, RETRY_AFTER_SECS.to_string())],
                "too many failed authentications from this address; try again later\n",
            )
                .into_response(),
            Refusal::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "the caller's identity cannot be checked now; try again\n",
            )
                .into_response(),
        }
    }
}

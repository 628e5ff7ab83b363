//! Who may call the JSON API: every request passes this gate before its
//! handler. It names what the call does (a [`Verb`], about one host or
//! all), identifies the caller from its bearer token, authorizes the verb,
//! and counts, logs and rate-limits failed attempts per client address.
//! Reads are open only to an agent with no way to identify callers, which
//! may listen on loopback alone.

use std::{
    collections::HashMap,
    fmt,
    net::{IpAddr, Ipv6Addr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use axum::{
    Router,
    extract::{ConnectInfo, Request, State},
    http::{HeaderMap, header},
    middleware::Next,
    response::{IntoResponse, Response},
};

use crate::{
    api::{
        access::{Access, Caller, Refusal, Verb},
        auth::{Tokens, bearer},
        kube_auth::Reviewer,
    },
    sync::lock,
};

/// How callers prove who they are.
pub enum Identities {
    /// No way: reads are open on loopback, every other call is refused.
    None,
    /// Bearer tokens from `--api-token-file`; a token may do everything.
    Tokens(Tokens),
    /// `--api-auth kubernetes`: the API server reviews the bearer token
    /// and whether its user may do the call.
    Kubernetes(Box<Reviewer>),
}

impl Identities {
    pub fn is_none(&self) -> bool {
        matches!(self, Identities::None)
    }

    /// The caller presenting `headers`, allowed to do `access`.
    async fn check(&self, headers: &HeaderMap, access: &Access) -> Result<Caller, Refusal> {
        match self {
            Identities::None => Err(Refusal::NoIdentities),
            Identities::Tokens(tokens) => {
                let name = tokens.caller(headers).ok_or(if bearer_present(headers) {
                    Refusal::Invalid
                } else {
                    Refusal::Missing
                })?;
                Ok(Caller {
                    name: name.to_string(),
                    groups: Vec::new(),
                })
            }
            Identities::Kubernetes(reviewer) => {
                let token = bearer(headers).ok_or(if bearer_present(headers) {
                    Refusal::Invalid
                } else {
                    Refusal::Missing
                })?;
                reviewer.check(token, access).await
            }
        }
    }
}

fn bearer_present(headers: &HeaderMap) -> bool {
    headers.contains_key(header::AUTHORIZATION)
}

/// Failed attempts an address may make at once, and how fast that allowance
/// comes back: ten, then one every six seconds.
const FAILURE_BURST: f64 = 10.0;
const FAILURE_REFILL_PER_SEC: f64 = 1.0 / 6.0;
/// Addresses tracked at most; past it, the address idle longest is
/// forgotten.
const TRACKED_ADDRESSES: usize = 4096;

/// Failed-attempt allowances of client addresses: IPv4 addresses one by
/// one, IPv6 by /64, since one client holds a whole /64.
struct Failures {
    buckets: HashMap<IpAddr, (f64, Instant)>,
}

impl Failures {
    fn key(ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => {
                    let s = v6.segments();
                    IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
                }
            },
            v4 => v4,
        }
    }

    fn allowance(&self, key: IpAddr, now: Instant) -> f64 {
        self.buckets.get(&key).map_or(FAILURE_BURST, |(left, at)| {
            let back = now.saturating_duration_since(*at).as_secs_f64() * FAILURE_REFILL_PER_SEC;
            (left + back).min(FAILURE_BURST)
        })
    }

    /// Whether `ip` has used up its failed attempts.
    fn throttled(&self, ip: IpAddr, now: Instant) -> bool {
        self.allowance(Self::key(ip), now) < 1.0
    }

    /// Charges one failed attempt to `ip`; true when that used up its
    /// allowance.
    fn charge(&mut self, ip: IpAddr, now: Instant) -> bool {
        let key = Self::key(ip);
        let left = self.allowance(key, now) - 1.0;
        if !self.buckets.contains_key(&key) && self.buckets.len() >= TRACKED_ADDRESSES {
            self.buckets.retain(|_, (l, at)| {
                (*l + now.saturating_duration_since(*at).as_secs_f64() * FAILURE_REFILL_PER_SEC)
                    < FAILURE_BURST
            });
            if self.buckets.len() >= TRACKED_ADDRESSES
                && let Some(oldest) = self
                    .buckets
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(k, _)| *k)
            {
                self.buckets.remove(&oldest);
            }
        }
        self.buckets.insert(key, (left, now));
        left < 1.0
    }
}

/// The gate's counters, for `/metrics`.
#[derive(Default)]
pub struct GateStats {
    refused: [AtomicU64; 6],
}

impl GateStats {
    fn count(&self, refusal: Refusal) {
        let i = Refusal::ALL.iter().position(|r| *r == refusal).unwrap_or(0);
        self.refused[i].fetch_add(1, Ordering::Relaxed);
    }

    /// `(reason, count)` of every refusal.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        Refusal::ALL
            .iter()
            .zip(&self.refused)
            .map(|(r, n)| (r.name(), n.load(Ordering::Relaxed)))
            .collect()
    }
}

/// The JSON API's gate: how callers are identified, whether reads are
/// open, and the failures seen.
pub struct Gate {
    identities: Identities,
    reads_open: bool,
    failures: Mutex<Failures>,
    pub stats: GateStats,
}

impl Gate {
    /// With [`Identities::None`] reads are open (the agent then listens on
    /// loopback only); otherwise every call needs an identity.
    pub fn new(identities: Identities) -> Gate {
        Gate {
            reads_open: identities.is_none(),
            identities,
            failures: Mutex::new(Failures {
                buckets: HashMap::new(),
            }),
            stats: GateStats::default(),
        }
    }

    /// The caller of `access` from `peer` with `headers`, or why it is
    /// refused. Failures are counted and charged to `peer`'s address; an
    /// address that used up its allowance is refused without a check.
    pub async fn admit(
        &self,
        peer: IpAddr,
        headers: &HeaderMap,
        access: &Access,
    ) -> Result<Caller, Refusal> {
        if self.lock().throttled(peer, Instant::now()) {
            self.stats.count(Refusal::Throttled);
            return Err(Refusal::Throttled);
        }
        if access.verb == Verb::Read && self.reads_open {
            return Ok(Caller::anonymous());
        }
        let refusal = match self.identities.check(headers, access).await {
            Ok(caller) => return Ok(caller),
            Err(refusal) => refusal,
        };
        self.stats.count(refusal);
        let exhausted = refusal.charges() && self.lock().charge(peer, Instant::now());
        tracing::warn!(
            client = %peer,
            verb = access.verb.name(),
            host = access.host.as_deref().unwrap_or("-"),
            reason = refusal.name(),
            "API call refused{}",
            if exhausted {
                "; this address is throttled for a while"
            } else {
                ""
            }
        );
        Err(refusal)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Failures> {
        lock(&self.failures)
    }
}

/// The API's listener and identities do not fit together.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GateError {
    #[error(
        "the API would listen on {addr}, beyond loopback, with no way to identify callers: \
         anyone who reaches it could read every host and act on them. Start the agent with \
         --api-token-file FILE or --api-auth kubernetes, or keep the API on loopback (--api-addr 127.0.0.1:9465)"
    )]
    OpenBeyondLoopback { addr: SocketAddr },
}

impl Gate {
    /// The gate of an API listening on `addr`: refused when `addr` is not
    /// loopback and `identities` is [`Identities::None`]. An API that also
    /// listens on a `provisioning` address (one the agent serves DHCP on)
    /// is allowed, with a warning: the machines being installed can reach
    /// it.
    pub fn for_listener(
        identities: Identities,
        addr: SocketAddr,
        provisioning: &[IpAddr],
    ) -> Result<Gate, GateError> {
        let ip = addr.ip();
        if !ip.is_loopback() && identities.is_none() {
            return Err(GateError::OpenBeyondLoopback { addr });
        }
        if ip.is_unspecified() || provisioning.contains(&ip) {
            tracing::warn!(
                %addr,
                "the API listens on a provisioning interface: the machines being installed \
                 can reach it (every call still needs an identity); bind it to a \
                 cluster-facing address or loopback with --api-addr"
            );
        }
        Ok(Gate::new(identities))
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("reads_open", &self.reads_open)
            .finish_non_exhaustive()
    }
}

/// `router` behind `gate`: each request reaches its handler with a
/// [`Caller`] in its extensions, or is answered by the refusal.
pub fn protect(router: Router, gate: Arc<Gate>) -> Router {
    router.layer(axum::middleware::from_fn_with_state(gate, check))
}

async fn check(State(gate): State<Arc<Gate>>, mut req: Request, next: Next) -> Response {
    // Served with connect info; a request without it (a unit test's) is
    // from loopback.
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::from([127, 0, 0, 1]), |c| c.0.ip());
    let access = Access::of(req.method(), req.uri().path());
    match gate.admit(peer, req.headers(), &access).await {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(refusal) => refusal.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::Method;

    use super::*;

    #[test]
    fn each_path_names_its_verb_and_host() {
        let cases = [
            (Method::GET, "/api/v1/hosts", Verb::Read, None),
            (
                Method::GET,
                "/api/v1/trace/52:54:00:00:00:01",
                Verb::Read,
                Some("52:54:00:00:00:01"),
            ),
            (Method::GET, "/api/v1/hosts/n1/bmc", Verb::Read, Some("n1")),
            (
                Method::GET,
                "/api/v1/hosts/n1/detail",
                Verb::Read,
                Some("n1"),
            ),
            (Method::GET, "/api/v1/fleet", Verb::Read, None),
            (Method::GET, "/api/v1/fleet/events", Verb::Read, None),
            (
                Method::POST,
                "/api/v1/hosts/n1/power",
                Verb::Power,
                Some("n1"),
            ),
            (
                Method::POST,
                "/api/v1/hosts/n1/bootdev",
                Verb::Bootdev,
                Some("n1"),
            ),
            (
                Method::POST,
                "/api/v1/hosts/n1/recover",
                Verb::Recover,
                Some("n1"),
            ),
            (
                Method::POST,
                "/api/v1/hosts/n1/reprovision",
                Verb::Reprovision,
                Some("n1"),
            ),
            (
                Method::POST,
                "/api/v1/hosts/n1/netboot/done",
                Verb::NetbootDone,
                Some("n1"),
            ),
            (Method::POST, "/api/v1/nothing", Verb::Read, None),
        ];
        for (method, path, verb, host) in cases {
            assert_eq!(
                Access::of(&method, path),
                Access {
                    verb,
                    host: host.map(str::to_string)
                },
                "{method} {path}"
            );
        }
    }

    #[test]
    fn an_address_is_throttled_after_its_burst_and_recovers_at_the_refill_rate() {
        let mut f = Failures {
            buckets: HashMap::new(),
        };
        let t0 = Instant::now();
        let a: IpAddr = "10.66.0.9".parse().expect("ip");
        let b: IpAddr = "10.66.0.10".parse().expect("ip");
        for n in 1..=10 {
            assert!(!f.throttled(a, t0), "attempt {n}");
            assert_eq!(f.charge(a, t0), n == 10);
        }
        assert!(f.throttled(a, t0));
        assert!(!f.throttled(b, t0), "another address is not");
        // One attempt back every six seconds.
        assert!(f.throttled(a, t0 + std::time::Duration::from_secs(5)));
        assert!(!f.throttled(a, t0 + std::time::Duration::from_secs(6)));
        // An IPv6 client is one /64.
        let v6a: IpAddr = "fd00::1".parse().expect("ip");
        let v6b: IpAddr = "fd00::2".parse().expect("ip");
        for _ in 0..10 {
            f.charge(v6a, t0);
        }
        assert!(f.throttled(v6b, t0));
    }

    #[test]
    fn the_table_stays_bounded() {
        let mut f = Failures {
            buckets: HashMap::new(),
        };
        let t0 = Instant::now();
        for i in 0..(TRACKED_ADDRESSES as u32 + 100) {
            f.charge(IpAddr::from(i.to_be_bytes()), t0);
        }
        assert!(f.buckets.len() <= TRACKED_ADDRESSES);
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {token}").parse().expect("header"),
        );
        h
    }

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    fn tokens() -> Identities {
        let dir = std::env::temp_dir().join(format!("pxe-gate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("tokens");
        std::fs::write(&path, format!("ops {TOKEN}\n")).expect("tokens");
        let tokens = Tokens::load(&path).expect("tokens");
        let _ = std::fs::remove_dir_all(&dir);
        Identities::Tokens(tokens)
    }

    #[tokio::test]
    async fn with_tokens_reads_need_one_and_failures_are_counted_and_throttled() {
        let gate = Gate::new(tokens());
        let peer: IpAddr = "10.66.0.50".parse().expect("ip");
        let read = Access::of(&Method::GET, "/api/v1/hosts");
        assert_eq!(
            gate.admit(peer, &HeaderMap::new(), &read).await,
            Err(Refusal::Missing)
        );
        assert_eq!(
            gate.admit(peer, &bearer(TOKEN), &read)
                .await
                .map(|c| c.name),
            Ok("ops".to_string())
        );
        for _ in 0..9 {
            assert_eq!(
                gate.admit(peer, &bearer("not-the-token-not-the-token"), &read)
                    .await,
                Err(Refusal::Invalid)
            );
        }
        // Ten failures: even the right token is refused for now.
        assert_eq!(
            gate.admit(peer, &bearer(TOKEN), &read).await,
            Err(Refusal::Throttled)
        );
        let other: IpAddr = "10.66.0.51".parse().expect("ip");
        assert!(gate.admit(other, &bearer(TOKEN), &read).await.is_ok());
        let counts: HashMap<_, _> = gate.stats.snapshot().into_iter().collect();
        assert_eq!(
            (counts["missing"], counts["invalid"], counts["throttled"]),
            (1, 9, 1)
        );
    }

    #[test]
    fn an_api_beyond_loopback_without_identities_is_refused() {
        let wide: SocketAddr = "0.0.0.0:9465".parse().expect("addr");
        let err = Gate::for_listener(Identities::None, wide, &[]).expect_err("refused");
        assert!(err.to_string().contains("--api-token-file"), "{err}");
        let pod: SocketAddr = "192.0.2.10:9465".parse().expect("addr");
        assert!(Gate::for_listener(Identities::None, pod, &[]).is_err());
        assert!(Gate::for_listener(tokens(), pod, &[]).is_ok());
        let lo: SocketAddr = "127.0.0.1:9465".parse().expect("addr");
        assert!(Gate::for_listener(Identities::None, lo, &[]).is_ok());
        let lo6: SocketAddr = "[::1]:9465".parse().expect("addr");
        assert!(Gate::for_listener(Identities::None, lo6, &[]).is_ok());
    }

    #[tokio::test]
    async fn without_identities_reads_are_open_but_acting_is_refused() {
        let gate = Gate::new(Identities::None);
        let peer = IpAddr::from([127, 0, 0, 1]);
        let read = Access::of(&Method::GET, "/api/v1/audit");
        assert_eq!(
            gate.admit(peer, &HeaderMap::new(), &read).await,
            Ok(Caller::anonymous())
        );
        let act = Access::of(&Method::POST, "/api/v1/hosts/n1/recover");
        assert_eq!(
            gate.admit(peer, &bearer(TOKEN), &act).await,
            Err(Refusal::NoIdentities)
        );
        // Refusing for want of identities charges nobody.
        for _ in 0..20 {
            let _ = gate.admit(peer, &HeaderMap::new(), &act).await;
        }
        assert!(gate.admit(peer, &HeaderMap::new(), &read).await.is_ok());
    }
}

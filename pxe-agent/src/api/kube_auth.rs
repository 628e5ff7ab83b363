//! Who may call the API in Kubernetes terms (`--api-auth kubernetes`): the
//! bearer token is checked with a TokenReview and the call with a
//! SubjectAccessReview of its verb on `boothosts/api` (group
//! `pxe-agent.io`) in the agent's namespace, the way kube-rbac-proxy and
//! controller-runtime protect metrics and controller endpoints. Both
//! answers are kept a few seconds. This module owns the review calls and
//! their cache; what a call does ([`Access`]) and how a refusal is answered
//! belong to the gate. A token is never kept, logged or used as a key:
//! the cache holds a keyed hash of it.

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    hash::Hash,
    sync::Mutex,
    time::{Duration, Instant},
};

use hmac::{Hmac, Mac as _};
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus},
    authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
    },
};
use kube::{Api, Client, api::PostParams};
use sha1::Sha1;

use crate::{
    api::access::{Access, Caller, Refusal},
    http::token::fill_random,
    sync::lock,
};

/// The API group, resource and subresource a Role grants the API's verbs
/// on: `apiGroups: [pxe-agent.io]`, `resources: [boothosts/api]`.
pub const GROUP: &str = "pxe-agent.io";
pub const RESOURCE: &str = "boothosts";
pub const SUBRESOURCE: &str = "api";

/// How long an answer is kept: an identity or a permission for ten
/// seconds, so a granted token or Role revoked takes effect within that; a
/// refusal for five, so one granted shortly after is seen soon.
const GRANTED_FOR: Duration = Duration::from_secs(10);
const REFUSED_FOR: Duration = Duration::from_secs(5);
/// A review the API server has not answered by then counts as failed.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// Answers kept of each kind, at most.
const CACHED: usize = 1024;

/// A token as the cache knows it: HMAC-SHA1 under a key of this process.
type Digest = [u8; 20];

/// Who a token belongs to, as its TokenReview answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub username: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The Kubernetes API server's reviews of callers, cached.
pub struct Reviewer {
    client: Client,
    /// Where the BootHosts are: the SubjectAccessReviews' namespace.
    namespace: String,
    key: [u8; 32],
    /// `None`: the token authenticates no one.
    users: Mutex<Expiring<Digest, Option<User>>>,
    /// Whether the token's user may do the access.
    decisions: Mutex<Expiring<(Digest, Access), bool>>,
}

impl fmt::Debug for Reviewer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reviewer")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Reviewer {
    /// Reviews through `client`, authorizing in `namespace`.
    pub fn new(client: Client, namespace: String) -> std::io::Result<Reviewer> {
        let mut key = [0u8; 32];
        fill_random(&mut key)?;
        Ok(Reviewer {
            client,
            namespace,
            key,
            users: Mutex::new(Expiring::new(CACHED)),
            decisions: Mutex::new(Expiring::new(CACHED)),
        })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The caller presenting `token`, if it may do `access`: `Invalid`
    /// when the token authenticates no one, `Forbidden` when its user may
    /// not, `Unavailable` when the API server did not answer.
    pub async fn check(&self, token: &[u8], access: &Access) -> Result<Caller, Refusal> {
        let token = std::str::from_utf8(token)
            .ok()
            .filter(|t| !t.is_empty())
            .ok_or(Refusal::Invalid)?;
        let digest = self.digest(token);
        let known = lock(&self.users).get(&digest, Instant::now());
        let user = match known {
            Some(user) => user,
            None => {
                let user = self.review_token(token).await?;
                let keep = if user.is_some() {
                    GRANTED_FOR
                } else {
                    REFUSED_FOR
                };
                lock(&self.users).put(digest, user.clone(), keep, Instant::now());
                user
            }
        };
        let user = user.ok_or(Refusal::Invalid)?;
        let question = (digest, access.clone());
        let known = lock(&self.decisions).get(&question, Instant::now());
        let allowed = match known {
            Some(allowed) => allowed,
            None => {
                let allowed = self.review_access(&user, access).await?;
                let keep = if allowed { GRANTED_FOR } else { REFUSED_FOR };
                lock(&self.decisions).put(question, allowed, keep, Instant::now());
                allowed
            }
        };
        if allowed {
            Ok(Caller {
                name: user.username,
                groups: user.groups,
            })
        } else {
            Err(Refusal::Forbidden)
        }
    }

    fn digest(&self, token: &str) -> Digest {
        let mut hmac = <Hmac<Sha1> as hmac::Mac>::new_from_slice(&self.key)
            .expect("HMAC takes a key of any length");
        hmac.update(token.as_bytes());
        hmac.finalize().into_bytes().into()
    }

    async fn review_token(&self, token: &str) -> Result<Option<User>, Refusal> {
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let review = token_review(token);
        let answer = reviewed(
            "TokenReview",
            api.create(&PostParams::default(), &review),
            Some(token),
        )
        .await?;
        if let Some(error) = answer.status.as_ref().and_then(|s| s.error.as_deref()) {
            // The authenticator's own reason, which names no token.
            tracing::debug!(error, "the TokenReview authenticated no one");
        }
        Ok(answer.status.as_ref().and_then(user_of))
    }

    async fn review_access(&self, user: &User, access: &Access) -> Result<bool, Refusal> {
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let review = access_review(user, access, &self.namespace);
        let answer = reviewed(
            "SubjectAccessReview",
            api.create(&PostParams::default(), &review),
            None,
        )
        .await?;
        Ok(answer.status.as_ref().is_some_and(allowed))
    }
}

/// The answer of a review `call`, or `Unavailable` when it failed or took
/// too long; the failure is logged with `secret` blanked out of it.
async fn reviewed<T>(
    what: &'static str,
    call: impl Future<Output = Result<T, kube::Error>>,
    secret: Option<&str>,
) -> Result<T, Refusal> {
    let error = match tokio::time::timeout(REVIEW_TIMEOUT, call).await {
        Ok(Ok(answer)) => return Ok(answer),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {} s", REVIEW_TIMEOUT.as_secs()),
    };
    let error = match secret {
        Some(secret) => error.replace(secret, "<redacted>"),
        None => error,
    };
    tracing::warn!(review = what, %error, "the Kubernetes API server did not review an API call");
    Err(Refusal::Unavailable)
}

/// The TokenReview of `token`, for the API server's own audiences.
fn token_review(token: &str) -> TokenReview {
    TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_owned()),
            audiences: None,
        },
        ..TokenReview::default()
    }
}

/// The user a TokenReview's `status` authenticated, if any.
fn user_of(status: &TokenReviewStatus) -> Option<User> {
    if status.authenticated != Some(true) {
        return None;
    }
    let info = status.user.as_ref()?;
    Some(User {
        username: info.username.clone().filter(|u| !u.is_empty())?,
        uid: info.uid.clone().filter(|u| !u.is_empty()),
        groups: info.groups.clone().unwrap_or_default(),
        extra: info.extra.clone().unwrap_or_default(),
    })
}

/// The SubjectAccessReview of `user` doing `access`: its verb on
/// `boothosts/api` in `namespace`, named after the host the call is about
/// (as the URL gives it) or unnamed for calls about every host.
fn access_review(user: &User, access: &Access, namespace: &str) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.username.clone()),
            uid: user.uid.clone(),
            groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_owned()),
                group: Some(GROUP.to_owned()),
                resource: Some(RESOURCE.to_owned()),
                subresource: Some(SUBRESOURCE.to_owned()),
                verb: Some(access.verb.name().to_owned()),
                name: access.host.clone(),
                ..ResourceAttributes::default()
            }),
            non_resource_attributes: None,
        },
        ..SubjectAccessReview::default()
    }
}

/// Whether a SubjectAccessReview's `status` allows: `allowed`, and not
/// `denied` (which wins, as the API server documents).
fn allowed(status: &SubjectAccessReviewStatus) -> bool {
    status.allowed && status.denied != Some(true)
}

/// Answers kept until they expire, at most `capacity` of them: past it the
/// expired go, then the one expiring first.
struct Expiring<K, V> {
    entries: HashMap<K, (V, Instant)>,
    capacity: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> Expiring<K, V> {
    fn new(capacity: usize) -> Expiring<K, V> {
        Expiring {
            entries: HashMap::new(),
            capacity,
        }
    }

    fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.entries
            .get(key)
            .filter(|(_, until)| *until > now)
            .map(|(value, _)| value.clone())
    }

    fn put(&mut self, key: K, value: V, keep: Duration, now: Instant) {
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            self.entries.retain(|_, (_, until)| *until > now);
            if self.entries.len() >= self.capacity
                && let Some(first) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, until))| *until)
                    .map(|(k, _)| k.clone())
            {
                self.entries.remove(&first);
            }
        }
        self.entries.insert(key, (value, now + keep));
    }
}

#[cfg(test)]
mod tests {
    use axum::http::Method;
    use k8s_openapi::api::authentication::v1::UserInfo;

    use super::*;

    fn alice() -> User {
        User {
            username: "alice".into(),
            uid: Some("u-1".into()),
            groups: vec!["ops".into(), "system:authenticated".into()],
            extra: BTreeMap::new(),
        }
    }

    #[test]
    fn each_call_is_reviewed_as_its_verb_on_the_host_it_names() {
        let cases = [
            (Method::GET, "/api/v1/hosts", "read", None),
            (Method::GET, "/api/v1/hosts/n1/bmc", "read", Some("n1")),
            (
                Method::GET,
                "/api/v1/trace/52:54:00:00:00:01",
                "read",
                Some("52:54:00:00:00:01"),
            ),
            (Method::POST, "/api/v1/hosts/n1/power", "power", Some("n1")),
            (
                Method::POST,
                "/api/v1/hosts/n1/bootdev",
                "bootdev",
                Some("n1"),
            ),
            (
                Method::POST,
                "/api/v1/hosts/n1/recover",
                "recover",
                Some("n1"),
            ),
            (
                Method::POST,
                "/api/v1/hosts/n1/reprovision",
                "reprovision",
                Some("n1"),
            ),
            (
                Method::POST,
                "/api/v1/hosts/n1/netboot/done",
                "netboot-done",
                Some("n1"),
            ),
        ];
        for (method, path, verb, name) in cases {
            let review = access_review(&alice(), &Access::of(&method, path), "pxe");
            let json = serde_json::to_value(&review).expect("serializes");
            let mut want = serde_json::json!({
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "metadata": {},
                "spec": {
                    "user": "alice",
                    "uid": "u-1",
                    "groups": ["ops", "system:authenticated"],
                    "resourceAttributes": {
                        "namespace": "pxe",
                        "group": "pxe-agent.io",
                        "resource": "boothosts",
                        "subresource": "api",
                        "verb": verb,
                    },
                },
            });
            if let Some(name) = name {
                want["spec"]["resourceAttributes"]["name"] = name.into();
            }
            assert_eq!(json, want, "{method} {path}");
        }
    }

    #[test]
    fn a_token_review_asks_for_the_api_servers_audiences() {
        let json = serde_json::to_value(token_review("t0k3n")).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!({
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "metadata": {},
                "spec": {"token": "t0k3n"},
            })
        );
    }

    #[test]
    fn only_an_authenticated_named_user_is_a_caller() {
        let info = UserInfo {
            username: Some("alice".into()),
            uid: Some("u-1".into()),
            groups: Some(vec!["ops".into(), "system:authenticated".into()]),
            extra: None,
        };
        let status = |authenticated, user: Option<UserInfo>| TokenReviewStatus {
            authenticated,
            user,
            ..TokenReviewStatus::default()
        };
        assert_eq!(
            user_of(&status(Some(true), Some(info.clone()))),
            Some(alice())
        );
        // What the API server answers an unknown token: nothing set, or an
        // error beside `authenticated: false`.
        assert_eq!(user_of(&status(None, Some(UserInfo::default()))), None);
        assert_eq!(user_of(&status(Some(false), Some(info.clone()))), None);
        let nameless = UserInfo {
            username: Some(String::new()),
            ..info
        };
        assert_eq!(user_of(&status(Some(true), Some(nameless))), None);
        assert_eq!(user_of(&status(Some(true), None)), None);
    }

    #[test]
    fn denied_wins_over_allowed() {
        let status = |allowed, denied| SubjectAccessReviewStatus {
            allowed,
            denied,
            ..SubjectAccessReviewStatus::default()
        };
        assert!(allowed(&status(true, None)));
        assert!(allowed(&status(true, Some(false))));
        assert!(!allowed(&status(false, None)));
        assert!(!allowed(&status(true, Some(true))));
    }

    #[test]
    fn answers_expire_and_the_cache_stays_bounded() {
        let t0 = Instant::now();
        let mut cache: Expiring<u32, bool> = Expiring::new(3);
        cache.put(1, true, GRANTED_FOR, t0);
        cache.put(2, false, REFUSED_FOR, t0);
        assert_eq!(cache.get(&1, t0 + Duration::from_secs(9)), Some(true));
        assert_eq!(cache.get(&2, t0 + Duration::from_secs(4)), Some(false));
        assert_eq!(cache.get(&2, t0 + Duration::from_secs(5)), None);
        assert_eq!(cache.get(&1, t0 + Duration::from_secs(10)), None);
        // Full: the expired go first, then the one expiring first.
        cache.put(3, true, GRANTED_FOR, t0);
        let t6 = t0 + Duration::from_secs(6);
        cache.put(4, true, GRANTED_FOR, t6);
        assert_eq!(cache.get(&2, t6), None);
        assert_eq!(cache.entries.len(), 3);
        cache.put(5, true, GRANTED_FOR, t6);
        assert_eq!(cache.entries.len(), 3);
        assert_eq!(cache.get(&4, t6), Some(true));
        assert_eq!(cache.get(&5, t6), Some(true));
        assert_eq!(
            cache.get(&1, t6).is_some() as u8 + cache.get(&3, t6).is_some() as u8,
            1,
            "one of the two expiring first was dropped"
        );
    }

    #[tokio::test]
    async fn an_unreachable_api_server_is_unavailable_and_names_no_token() {
        // A port nothing listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let config = kube::Config::new(
            format!("http://127.0.0.1:{port}")
                .parse()
                .expect("cluster URL"),
        );
        let client = Client::try_from(config).expect("client");
        let reviewer = Reviewer::new(client, "pxe".into()).expect("reviewer");
        let access = Access::of(&Method::POST, "/api/v1/hosts/n1/recover");
        assert_eq!(
            reviewer.check(b"secret-token-value", &access).await,
            Err(Refusal::Unavailable)
        );
        // Nothing was kept: the next call asks again.
        assert!(lock(&reviewer.users).entries.is_empty());
        assert_eq!(
            reviewer.check(b"", &access).await,
            Err(Refusal::Invalid),
            "an empty token is no one's"
        );
        assert_eq!(
            reviewer.check(&[0xff, 0xfe], &access).await,
            Err(Refusal::Invalid),
            "nor is one that is not UTF-8"
        );
        assert!(!format!("{reviewer:?}").contains("secret"));
    }
}

//! A fake Kubernetes API server for the tests of the Kubernetes inventory
//! source, and a client-side handle to drive it. No real API server can be
//! installed on the machines these tests run on, so this one reproduces the
//! parts of the protocol the agent depends on:
//!
//! - list (`GET .../resource`, `labelSelector` with `=`, `==`, `!=`,
//!   existence and `!` absence terms) with `metadata.resourceVersion` in the
//!   list, paged as etcd pages it: `limit=N` returns at most N items in key
//!   order and, when more remain, `metadata.continue` (base64url of
//!   `{"v":"meta.k8s.io/v1","rv":RV,"start":"KEY\u0000"}`) and
//!   `metadata.remainingItemCount` (without a selector); a `continue` reads
//!   the rest of the list as it was at the first page's resourceVersion, a
//!   token older than the compaction point gets 410 `Expired`, and
//!   `continue` with `resourceVersion` 400;
//! - watch (`?watch=true&resourceVersion=N`): a chunked stream of one JSON
//!   event a line (`ADDED`, `MODIFIED`, `DELETED`), `BOOKMARK`s when
//!   `allowWatchBookmarks=true`, an `ERROR` event carrying a `Status` with
//!   code 410 when `N` is older than the compaction point, and
//!   `timeoutSeconds`;
//! - get, create (`POST`, 409 `AlreadyExists`, `generateName`), replace
//!   (`PUT`, 409 `Conflict` on a stale `metadata.resourceVersion`), delete;
//! - `PATCH` with `application/merge-patch+json` (RFC 7386; 409 on a stale
//!   `metadata.resourceVersion` when the patch carries one) and
//!   `application/apply-patch+yaml` (server-side apply, reproduced as a merge
//!   of the applied object: there are no field managers, so a field an
//!   applier stops sending is not removed);
//! - the `/status` subresource: writes through it change only `status`,
//!   writes to the main resource leave `status` alone; `metadata.generation`
//!   is bumped when `spec` changes;
//! - errors as `Status` bodies (`kind: Status`, `code`, `reason`), which is
//!   how kube-rs parses them;
//! - TokenReviews against static tokens and SubjectAccessReviews judged by
//!   the stored RBAC objects ([`review`]).
//!
//! One generic store holds every kind, keyed by API group, version,
//! resource, namespace and name, so it serves the agent's CRDs, Metal3
//! BareMetalHosts, Secrets, Events and Leases alike. A global counter is the
//! resourceVersion.
//!
//! Test controls live under `/fake/`: `POST /fake/drop-watches` ends every
//! open watch, `POST /fake/compact` moves the compaction point to the
//! current resourceVersion (the next watch from an older one gets 410),
//! `POST /fake/fail-status?count=N` makes the next N writes to a `/status`
//! subresource fail with 409, `POST /fake/tokens` replaces the static
//! tokens with its body (kube-apiserver's `--token-auth-file` format:
//! `token,user,uid,"group1,group2"` lines), `GET /fake/log` returns the requests seen so
//! far, one JSON object a line (`method`, `path`, `query`, `content_type`,
//! `user_agent`, `code`, `at_ms`). Bookmarks carry the resourceVersion of
//! the last event the watch delivered.
//!
//! The server speaks plain HTTP/1.1 (kubeconfig `server: http://...`) with
//! keep-alive; it is the binary `fake-kube-api` (`--listen ADDR`,
//! `--objects NAMESPACE=FILE` to hold a YAML file's objects from the start,
//! for an agent that lists them as it starts, and `--token-auth-file FILE`
//! for the static tokens). [`FakeApi`] starts it in a
//! network namespace and talks to it with curl run in that namespace.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use serde_json::{Map, Value, json};

mod review;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::Notify,
};

/// Group (empty for core), version, resource (plural), namespace, name.
type Key = (String, String, String, String, String);

/// One change, as watchers replay it.
#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    kind: &'static str,
    key: Key,
    object: Value,
}

/// Everything the server holds.
#[derive(Default)]
struct Store {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    /// Every change since the compaction point.
    history: Vec<Change>,
    compacted: u64,
    /// Bumped by `/fake/drop-watches`: watches of an older epoch end.
    epoch: u64,
    fail_status: u32,
    log: Vec<Value>,
    uid: u64,
    /// Whom each static token authenticates.
    tokens: Vec<review::StaticToken>,
    /// Lists being paged out, newest last.
    pages: Vec<Paged>,
}

/// A list held at the resourceVersion of its first page, which its
/// continue tokens read the rest of: etcd reads them at that revision.
struct Paged {
    rv: u64,
    /// Resource, namespace and selector: what a continuing request repeats.
    scope: String,
    /// Each item under its key below the list's prefix (`name`, or
    /// `namespace/name` for a list across namespaces), in key order.
    items: Arc<Vec<(String, Value)>>,
}

/// Lists held for their continue tokens at once; an older one expires.
const PAGED_LISTS: usize = 8;

/// The server's state, shared by its connections.
#[derive(Default)]
pub struct Server {
    store: Mutex<Store>,
    changed: Notify,
}

/// A parsed request.
struct Request {
    method: String,
    path: String,
    query: HashMap<String, String>,
    raw_query: String,
    content_type: String,
    user_agent: String,
    body: Vec<u8>,
    /// The client asked to close the connection after this request.
    close: bool,
}

/// A response: status code and JSON body, or a watch stream.
enum Reply {
    Json(u16, Value),
    Watch(Box<WatchSpec>),
}

struct WatchSpec {
    group: String,
    version: String,
    resource: String,
    namespace: Option<String>,
    selector: Vec<Term>,
    from: u64,
    bookmarks: bool,
    timeout: Option<Duration>,
}

/// One term of a label selector.
#[derive(Clone, Debug)]
enum Term {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    /// `!key`: the label is absent.
    Absent(String),
}

fn parse_selector(text: &str) -> Vec<Term> {
    text.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            if let Some((k, v)) = t.split_once("!=") {
                Term::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                Term::Eq(k.trim().into(), v.trim().into())
            } else if let Some(k) = t.strip_prefix('!') {
                Term::Absent(k.trim().into())
            } else {
                Term::Exists(t.into())
            }
        })
        .collect()
}

fn matches(selector: &[Term], object: &Value) -> bool {
    let labels = object.pointer("/metadata/labels");
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    selector.iter().all(|term| match term {
        Term::Eq(k, v) => label(k) == Some(v.as_str()),
        Term::Ne(k, v) => label(k) != Some(v.as_str()),
        Term::Exists(k) => label(k).is_some(),
        Term::Absent(k) => label(k).is_none(),
    })
}

/// `Status` body of a failure, as the API server sends it.
/// A continue token as the API server writes it (`k8s.io/apiserver`'s
/// `storage.EncodeContinue`): base64url, unpadded, of the revision the
/// list is read at and the key to start from.
fn encode_continue(rv: u64, start: &str) -> String {
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start});
    URL_SAFE_NO_PAD.encode(token.to_string())
}

/// The revision and start key of a continue token.
fn decode_continue(token: &str) -> Option<(u64, String)> {
    let text = URL_SAFE_NO_PAD.decode(token).ok()?;
    let token: Value = serde_json::from_slice(&text).ok()?;
    if token["v"] != "meta.k8s.io/v1" {
        return None;
    }
    Some((token["rv"].as_u64()?, token["start"].as_str()?.to_owned()))
}

fn status(code: u16, reason: &str, message: impl Into<String>) -> Reply {
    Reply::Json(code, status_body(code, reason, message))
}

fn status_body(code: u16, reason: &str, message: impl Into<String>) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message.into(),
        "reason": reason,
        "code": code,
    })
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(patch) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let map = target.as_object_mut().expect("an object");
            for (k, v) in patch {
                if v.is_null() {
                    map.remove(k);
                } else {
                    merge(map.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// What a path names: `/api/v1/...` or `/apis/GROUP/VERSION/...`, then
/// `namespaces/NS/RESOURCE[/NAME[/SUBRESOURCE]]` or `RESOURCE` (all
/// namespaces).
struct Target {
    group: String,
    version: String,
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

fn parse_path(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => (String::new(), (*version).to_owned(), rest),
        ["apis", group, version, rest @ ..] => ((*group).to_owned(), (*version).to_owned(), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        rest => (None, rest),
    };
    let (resource, name, status) = match rest {
        [resource] => (*resource, None, false),
        [resource, name] => (*resource, Some((*name).to_owned()), false),
        [resource, name, "status"] => (*resource, Some((*name).to_owned()), true),
        _ => return None,
    };
    Some(Target {
        group,
        version,
        resource: resource.to_owned(),
        namespace,
        name,
        status,
    })
}

impl Server {
    /// Creates every YAML document of `text` in `namespace`; the resource
    /// is the kind's plural, lowercase with an `s` (as
    /// [`FakeApi::put_yaml`] names it).
    pub fn preload(&self, namespace: &str, text: &str) {
        for doc in text.split("\n---") {
            if doc.trim().is_empty() {
                continue;
            }
            let object: Value = serde_norway::from_str(doc).expect("object YAML");
            let api_version = object["apiVersion"].as_str().expect("apiVersion");
            let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
            let target = Target {
                group: group.to_owned(),
                version: version.to_owned(),
                resource: format!("{}s", object["kind"].as_str().expect("kind").to_lowercase()),
                namespace: Some(namespace.to_owned()),
                name: None,
                status: false,
            };
            if let Err(Reply::Json(code, body)) = self.create(&target, object) {
                panic!("preload: {code} {body}");
            }
        }
    }

    /// Replaces the static tokens (`token,user,uid,"group1,group2"`
    /// lines, as kube-apiserver's `--token-auth-file`).
    pub fn set_tokens(&self, csv: &str) {
        self.lock().tokens = review::parse_token_file(csv).expect("a token file");
    }

    /// The requests seen so far, as `GET /fake/log` lists them.
    pub fn requests(&self) -> Vec<Value> {
        self.lock().log.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn handle(&self, req: &Request) -> Reply {
        let reply = self.route(req);
        let code = match &reply {
            Reply::Json(code, _) => *code,
            // Logged as the ERROR event the stream carries.
            Reply::Watch(spec) if spec.from < self.lock().compacted => 410,
            Reply::Watch(_) => 200,
        };
        self.lock().log.push(json!({
            "method": req.method,
            "path": req.path,
            "query": req.raw_query,
            "content_type": req.content_type,
            "user_agent": req.user_agent,
            "code": code,
            "at_ms": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        }));
        reply
    }

    fn route(&self, req: &Request) -> Reply {
        if let Some(control) = req.path.strip_prefix("/fake/") {
            return self.control(control, req);
        }
        if req.method == "POST" {
            match req.path.as_str() {
                "/apis/authentication.k8s.io/v1/tokenreviews" => {
                    return review::token_review(&self.lock().tokens, &req.body);
                }
                "/apis/authorization.k8s.io/v1/subjectaccessreviews" => {
                    return review::access_review(&self.lock().objects, &req.body);
                }
                _ => {}
            }
        }
        let Some(target) = parse_path(&req.path) else {
            return status(404, "NotFound", format!("no route {}", req.path));
        };
        let body = || -> Result<Value, Reply> {
            if req.body.is_empty() {
                return Err(status(400, "BadRequest", "empty body"));
            }
            // JSON is YAML: an apply body may be either.
            serde_json::from_slice(&req.body)
                .or_else(|_| {
                    serde_norway::from_slice::<Value>(&req.body).map_err(|e| e.to_string())
                })
                .map_err(|e| status(400, "BadRequest", format!("malformed body: {e}")))
        };
        let result = match (req.method.as_str(), &target.name) {
            ("GET", None)
                if req
                    .query
                    .get("watch")
                    .is_some_and(|w| w == "true" || w == "1") =>
            {
                return self.watch(&target, req);
            }
            ("GET", None) => Ok(self.list(&target, req)),
            ("GET", Some(name)) => self.get(&target, name),
            ("POST", None) => body().and_then(|b| self.create(&target, b)),
            ("PUT", Some(name)) => body().and_then(|b| self.replace(&target, name, b)),
            ("PATCH", Some(name)) => body().and_then(|b| self.patch(&target, name, req, b)),
            ("DELETE", Some(name)) => self.delete(&target, name),
            _ => Err(status(405, "MethodNotAllowed", "method not allowed")),
        };
        match result {
            Ok(reply) | Err(reply) => reply,
        }
    }

    fn control(&self, what: &str, req: &Request) -> Reply {
        let mut store = self.lock();
        match what {
            "drop-watches" => {
                store.epoch += 1;
                drop(store);
                self.changed.notify_waiters();
                Reply::Json(200, json!({"dropped": true}))
            }
            "compact" => {
                store.compacted = store.rv;
                let rv = store.rv;
                store.history.retain(|c| c.rv > rv);
                store.pages.retain(|p| p.rv >= rv);
                Reply::Json(200, json!({"compacted": rv}))
            }
            "fail-status" => {
                store.fail_status = req
                    .query
                    .get("count")
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(1);
                Reply::Json(200, json!({"fail_status": store.fail_status}))
            }
            "tokens" => match review::parse_token_file(&String::from_utf8_lossy(&req.body)) {
                Ok(tokens) => {
                    store.tokens = tokens;
                    Reply::Json(200, json!({"tokens": store.tokens.len()}))
                }
                Err(e) => status(400, "BadRequest", e),
            },
            "log" => Reply::Json(200, Value::Array(store.log.clone())),
            _ => status(404, "NotFound", format!("no control {what}")),
        }
    }

    fn key(target: &Target, namespace: &str, name: &str) -> Key {
        (
            target.group.clone(),
            target.version.clone(),
            target.resource.clone(),
            namespace.to_owned(),
            name.to_owned(),
        )
    }

    fn in_scope(target: &Target, key: &Key) -> bool {
        key.0 == target.group
            && key.1 == target.version
            && key.2 == target.resource
            && target.namespace.as_ref().is_none_or(|ns| *ns == key.3)
    }

    fn list(&self, target: &Target, req: &Request) -> Reply {
        let selector_text = req.query.get("labelSelector").map_or("", String::as_str);
        let selector = parse_selector(selector_text);
        let limit = req
            .query
            .get("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|&l| l > 0);
        let scope = format!(
            "{}/{}/{}/{}?{selector_text}",
            target.group,
            target.version,
            target.resource,
            target.namespace.as_deref().unwrap_or("")
        );
        let mut store = self.lock();
        let (rv, items, start) = match req.query.get("continue").filter(|c| !c.is_empty()) {
            Some(token) => {
                if req
                    .query
                    .get("resourceVersion")
                    .is_some_and(|v| !v.is_empty())
                {
                    return status(
                        400,
                        "BadRequest",
                        "specifying resource version is not allowed when using continue",
                    );
                }
                let Some((rv, start)) = decode_continue(token) else {
                    return status(400, "BadRequest", "continue key is not valid");
                };
                let held = store
                    .pages
                    .iter()
                    .find(|p| p.rv == rv && p.scope == scope && rv >= store.compacted);
                let Some(held) = held else {
                    return status(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent \
                         list result. You can start a new list without the continue parameter.",
                    );
                };
                let from = held.items.partition_point(|(key, _)| *key < start);
                (rv, held.items.clone(), from)
            }
            None => {
                let items: Vec<(String, Value)> = store
                    .objects
                    .iter()
                    .filter(|(key, object)| {
                        Self::in_scope(target, key) && matches(&selector, object)
                    })
                    .map(|(key, object)| {
                        let below = match target.namespace {
                            Some(_) => key.4.clone(),
                            None => format!("{}/{}", key.3, key.4),
                        };
                        (below, object.clone())
                    })
                    .collect();
                (store.rv, Arc::new(items), 0)
            }
        };
        let end = limit.map_or(items.len(), |l| items.len().min(start + l));
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if end < items.len() {
            if start == 0 && !store.pages.iter().any(|p| p.rv == rv && p.scope == scope) {
                if store.pages.len() == PAGED_LISTS {
                    store.pages.remove(0);
                }
                store.pages.push(Paged {
                    rv,
                    scope,
                    items: items.clone(),
                });
            }
            metadata["continue"] = encode_continue(rv, &format!("{}\0", items[end - 1].0)).into();
            if selector.is_empty() {
                metadata["remainingItemCount"] = (items.len() - end).into();
            }
        }
        let page: Vec<Value> = items[start..end].iter().map(|(_, o)| o.clone()).collect();
        Reply::Json(
            200,
            json!({
                "kind": "List",
                "apiVersion": "v1",
                "metadata": metadata,
                "items": page,
            }),
        )
    }

    fn get(&self, target: &Target, name: &str) -> Result<Reply, Reply> {
        let ns = target.namespace.clone().unwrap_or_default();
        let store = self.lock();
        store
            .objects
            .get(&Self::key(target, &ns, name))
            .map(|o| Reply::Json(200, o.clone()))
            .ok_or_else(|| not_found(target, name))
    }

    /// Records a change and wakes the watchers.
    fn commit(&self, store: &mut Store, kind: &'static str, key: Key, object: Value) {
        store.history.push(Change {
            rv: store.rv,
            kind,
            key: key.clone(),
            object: object.clone(),
        });
        if kind == "DELETED" {
            store.objects.remove(&key);
        } else {
            store.objects.insert(key, object);
        }
        self.changed.notify_waiters();
    }

    fn create(&self, target: &Target, mut object: Value) -> Result<Reply, Reply> {
        let ns = target.namespace.clone().unwrap_or_default();
        let mut store = self.lock();
        let meta = object
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| status(400, "BadRequest", "metadata is required"))?;
        let name = match meta.get("name").and_then(Value::as_str) {
            Some(name) => name.to_owned(),
            None => match meta.get("generateName").and_then(Value::as_str) {
                Some(prefix) => format!("{prefix}{:05x}", store.uid + 1),
                None => return Err(status(400, "BadRequest", "metadata.name is required")),
            },
        };
        let key = Self::key(target, &ns, &name);
        if store.objects.contains_key(&key) {
            return Err(status(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", target.resource),
            ));
        }
        store.rv += 1;
        store.uid += 1;
        meta.insert("name".into(), name.into());
        meta.insert("namespace".into(), ns.into());
        meta.insert("resourceVersion".into(), store.rv.to_string().into());
        meta.insert(
            "uid".into(),
            format!("00000000-0000-0000-0000-{:012}", store.uid).into(),
        );
        meta.insert("generation".into(), 1.into());
        meta.insert("creationTimestamp".into(), "2026-01-01T00:00:00Z".into());
        self.commit(&mut store, "ADDED", key, object.clone());
        Ok(Reply::Json(201, object))
    }

    /// Writes `next` over the stored object: through `/status` only its
    /// status, else all but its status; checks `resourceVersion` when
    /// `next` carries one.
    fn update(
        &self,
        target: &Target,
        name: &str,
        change: impl FnOnce(&Value) -> Value,
    ) -> Result<Reply, Reply> {
        let ns = target.namespace.clone().unwrap_or_default();
        let key = Self::key(target, &ns, name);
        let mut store = self.lock();
        let Some(current) = store.objects.get(&key).cloned() else {
            return Err(not_found(target, name));
        };
        if target.status && store.fail_status > 0 {
            store.fail_status -= 1;
            return Err(conflict(target, name));
        }
        let next = change(&current);
        let current_rv = current.pointer("/metadata/resourceVersion").cloned();
        if let Some(rv) = next.pointer("/metadata/resourceVersion")
            && Some(rv) != current_rv.as_ref()
        {
            return Err(conflict(target, name));
        }
        let mut stored = current.clone();
        if target.status {
            match next.get("status") {
                Some(s) => {
                    stored["status"] = s.clone();
                }
                None => {
                    if let Some(o) = stored.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
        } else {
            let status = current.get("status").cloned();
            let meta = current.get("metadata").cloned().unwrap_or(json!({}));
            stored = next.clone();
            match status {
                Some(s) => stored["status"] = s,
                None => {
                    if let Some(o) = stored.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
            // Server-owned metadata stays; labels and annotations follow.
            let mut merged = meta.clone();
            for k in ["labels", "annotations", "finalizers", "ownerReferences"] {
                match next.pointer(&format!("/metadata/{k}")) {
                    Some(v) => merged[k] = v.clone(),
                    None => {
                        if let Some(o) = merged.as_object_mut() {
                            o.remove(k);
                        }
                    }
                }
            }
            stored["metadata"] = merged;
            if current.get("spec") != stored.get("spec") {
                let generation = meta.get("generation").and_then(Value::as_u64).unwrap_or(1);
                stored["metadata"]["generation"] = (generation + 1).into();
            }
        }
        if stored == current {
            return Ok(Reply::Json(200, current));
        }
        store.rv += 1;
        stored["metadata"]["resourceVersion"] = store.rv.to_string().into();
        self.commit(&mut store, "MODIFIED", key, stored.clone());
        Ok(Reply::Json(200, stored))
    }

    fn replace(&self, target: &Target, name: &str, object: Value) -> Result<Reply, Reply> {
        self.update(target, name, |_| object)
    }

    fn patch(
        &self,
        target: &Target,
        name: &str,
        req: &Request,
        patch: Value,
    ) -> Result<Reply, Reply> {
        let kind = req.content_type.split(';').next().unwrap_or("").trim();
        match kind {
            "application/merge-patch+json" | "application/apply-patch+yaml" => {}
            other => {
                return Err(status(
                    415,
                    "UnsupportedMediaType",
                    format!("unsupported patch type {other:?}"),
                ));
            }
        }
        if kind == "application/apply-patch+yaml" && !req.query.contains_key("fieldManager") {
            return Err(status(
                422,
                "Invalid",
                "fieldManager is required for apply patch",
            ));
        }
        self.update(target, name, |current| {
            let mut next = current.clone();
            // resourceVersion is compared, not merged: drop it from the
            // merged object unless the patch set it.
            if let Some(m) = next.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("resourceVersion");
            }
            merge(&mut next, &patch);
            next
        })
    }

    fn delete(&self, target: &Target, name: &str) -> Result<Reply, Reply> {
        let ns = target.namespace.clone().unwrap_or_default();
        let key = Self::key(target, &ns, name);
        let mut store = self.lock();
        let Some(mut object) = store.objects.get(&key).cloned() else {
            return Err(not_found(target, name));
        };
        store.rv += 1;
        object["metadata"]["resourceVersion"] = store.rv.to_string().into();
        self.commit(&mut store, "DELETED", key, object.clone());
        Ok(Reply::Json(200, object))
    }

    fn watch(&self, target: &Target, req: &Request) -> Reply {
        let from = req
            .query
            .get("resourceVersion")
            .and_then(|rv| rv.parse().ok())
            .unwrap_or_else(|| self.lock().rv);
        Reply::Watch(Box::new(WatchSpec {
            group: target.group.clone(),
            version: target.version.clone(),
            resource: target.resource.clone(),
            namespace: target.namespace.clone(),
            selector: parse_selector(req.query.get("labelSelector").map_or("", String::as_str)),
            from,
            bookmarks: req
                .query
                .get("allowWatchBookmarks")
                .is_some_and(|b| b == "true"),
            timeout: req
                .query
                .get("timeoutSeconds")
                .and_then(|t| t.parse().ok())
                .map(Duration::from_secs),
        }))
    }
}

fn not_found(target: &Target, name: &str) -> Reply {
    let group = if target.group.is_empty() {
        String::new()
    } else {
        format!(".{}", target.group)
    };
    status(
        404,
        "NotFound",
        format!("{}{group} \"{name}\" not found", target.resource),
    )
}

fn conflict(target: &Target, name: &str) -> Reply {
    status(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
             please apply your changes to the latest version and try again",
            target.resource
        ),
    )
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        410 => "Gone",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        _ => "Error",
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match u8::from_str_radix(&text[i + 1..i + 3], 16) {
                Ok(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                Err(_) => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads one request off `conn`, keeping what follows it in `buf`; `None`
/// when the peer closed.
async fn read_request(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Request> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Request::new(&mut headers);
        if let Ok(httparse::Status::Complete(head)) = parsed.parse(buf) {
            let method = parsed.method?.to_owned();
            let target = parsed.path?.to_owned();
            let header = |name: &str| {
                parsed
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .map(|h| String::from_utf8_lossy(h.value).into_owned())
            };
            let content_type = header("content-type").unwrap_or_default();
            let user_agent = header("user-agent").unwrap_or_default();
            let close = header("connection").is_some_and(|c| c.eq_ignore_ascii_case("close"));
            let chunked = header("transfer-encoding").is_some_and(|t| t.contains("chunked"));
            let length: usize = header("content-length")
                .and_then(|l| l.trim().parse().ok())
                .unwrap_or(0);
            buf.drain(..head);
            let body = if chunked {
                read_chunked(conn, buf).await?
            } else {
                while buf.len() < length {
                    read_more(conn, buf).await?;
                }
                buf.drain(..length).collect()
            };
            let (path, raw_query) = match target.split_once('?') {
                Some((p, q)) => (p.to_owned(), q.to_owned()),
                None => (target, String::new()),
            };
            let query = raw_query
                .split('&')
                .filter(|kv| !kv.is_empty())
                .map(|kv| match kv.split_once('=') {
                    Some((k, v)) => (percent_decode(k), percent_decode(v)),
                    None => (percent_decode(kv), String::new()),
                })
                .collect();
            return Some(Request {
                method,
                path,
                query,
                raw_query,
                content_type,
                user_agent,
                body,
                close,
            });
        }
        read_more(conn, buf).await?;
    }
}

async fn read_more(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 16384];
    let n = conn.read(&mut chunk).await.ok()?;
    if n == 0 {
        return None;
    }
    buf.extend_from_slice(&chunk[..n]);
    Some(())
}

async fn read_chunked(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(at) = buf.windows(2).position(|w| w == b"\r\n") {
                break at;
            }
            read_more(conn, buf).await?;
        };
        let size_text = String::from_utf8_lossy(&buf[..line_end]).into_owned();
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        buf.drain(..line_end + 2);
        while buf.len() < size + 2 {
            read_more(conn, buf).await?;
        }
        body.extend(buf.drain(..size));
        buf.drain(..2);
        if size == 0 {
            return Some(body);
        }
    }
}

/// Serves one connection until the peer closes it or a watch ends.
async fn connection(server: Arc<Server>, mut conn: TcpStream) {
    let mut buf = Vec::new();
    while let Some(req) = read_request(&mut conn, &mut buf).await {
        match server.handle(&req) {
            Reply::Json(code, body) => {
                let body = serde_json::to_vec(&body).expect("json");
                let head = format!(
                    "HTTP/1.1 {code} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    reason_phrase(code),
                    body.len()
                );
                if conn.write_all(head.as_bytes()).await.is_err()
                    || conn.write_all(&body).await.is_err()
                    || req.close
                {
                    return;
                }
            }
            Reply::Watch(spec) => {
                stream_watch(&server, &mut conn, *spec).await;
                return;
            }
        }
    }
}

async fn write_chunk(conn: &mut TcpStream, event: &Value) -> bool {
    let mut line = serde_json::to_vec(event).expect("json");
    line.push(b'\n');
    let mut chunk = format!("{:x}\r\n", line.len()).into_bytes();
    chunk.extend_from_slice(&line);
    chunk.extend_from_slice(b"\r\n");
    conn.write_all(&chunk).await.is_ok()
}

/// A watch: the changes after `spec.from`, then live ones, until the
/// timeout, a drop, or the client going away.
async fn stream_watch(server: &Server, conn: &mut TcpStream, spec: WatchSpec) {
    let head =
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
    if conn.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let scope = Target {
        group: spec.group.clone(),
        version: spec.version.clone(),
        resource: spec.resource.clone(),
        namespace: spec.namespace.clone(),
        name: None,
        status: false,
    };
    let (epoch, expired) = {
        let store = server.lock();
        (store.epoch, spec.from < store.compacted)
    };
    if expired {
        let body = status_body(
            410,
            "Expired",
            format!("too old resource version: {} ({})", spec.from, epoch),
        );
        let _ = write_chunk(conn, &json!({"type": "ERROR", "object": body})).await;
        let _ = conn.write_all(b"0\r\n\r\n").await;
        return;
    }
    let deadline = spec.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut last = spec.from;
    let mut delivered = spec.from;
    let bookmark_every = Duration::from_secs(1);
    let mut next_bookmark = tokio::time::Instant::now() + bookmark_every;
    loop {
        let notified = server.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let (events, current_rv, dropped) = {
            let store = server.lock();
            let events: Vec<Change> = store
                .history
                .iter()
                .filter(|c| c.rv > last && Server::in_scope(&scope, &c.key))
                .cloned()
                .collect();
            (events, store.rv, store.epoch != epoch)
        };
        if dropped {
            // An abrupt end, as when the API server or a proxy restarts.
            return;
        }
        for change in events {
            last = change.rv;
            if !matches(&spec.selector, &change.object) {
                continue;
            }
            delivered = change.rv;
            let event = json!({"type": change.kind, "object": change.object});
            if !write_chunk(conn, &event).await {
                return;
            }
        }
        last = last.max(current_rv);
        let now = tokio::time::Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            let _ = conn.write_all(b"0\r\n\r\n").await;
            return;
        }
        if spec.bookmarks && now >= next_bookmark {
            next_bookmark = now + bookmark_every;
            let api_version = if spec.group.is_empty() {
                spec.version.clone()
            } else {
                format!("{}/{}", spec.group, spec.version)
            };
            let event = json!({"type": "BOOKMARK", "object": {
                "apiVersion": api_version,
                "kind": "Bookmark",
                "metadata": {"resourceVersion": delivered.to_string()},
            }});
            if !write_chunk(conn, &event).await {
                return;
            }
        }
        let wake = deadline.map_or(next_bookmark, |d| d.min(next_bookmark));
        tokio::select! {
            () = notified => {}
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Serves on `listener` forever.
pub async fn serve(listener: TcpListener, server: Arc<Server>) {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            continue;
        };
        let _ = conn.set_nodelay(true);
        tokio::spawn(connection(server.clone(), conn));
    }
}

/// The `fake-kube-api` binary: `--listen ADDR` (default `127.0.0.1:0`),
/// prints `listening on PORT` once bound.
pub fn main_with_args(args: impl Iterator<Item = String>) {
    let mut listen: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let server = Arc::new(Server::default());
    let mut args = args.skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => {
                listen = args
                    .next()
                    .and_then(|a| a.parse().ok())
                    .expect("--listen ADDR:PORT");
            }
            // `--objects NAMESPACE=FILE`: the YAML documents of FILE exist
            // in NAMESPACE from the start, as if created one by one.
            "--objects" => {
                let arg = args.next().expect("--objects NAMESPACE=FILE");
                let (ns, file) = arg.split_once('=').expect("--objects NAMESPACE=FILE");
                let text = std::fs::read_to_string(file).expect("read --objects");
                server.preload(ns, &text);
            }
            // `--token-auth-file FILE`: kube-apiserver's static tokens.
            "--token-auth-file" => {
                let file = args.next().expect("--token-auth-file FILE");
                let text = std::fs::read_to_string(file).expect("read --token-auth-file");
                server.set_tokens(&text);
            }
            other => panic!("unknown argument {other}"),
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let listener = TcpListener::bind(listen).await.expect("bind");
        let port = listener.local_addr().expect("local addr").port();
        println!("listening on {port}");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        serve(listener, server).await;
    });
}

pub use handle::{FakeApi, bin as fake_api_bin};

mod handle {
    //! Starting the fake server in a namespace and driving it.

    use std::{
        io::{BufRead as _, BufReader},
        path::{Path, PathBuf},
        process::Stdio,
    };

    use serde_json::Value;
    use xtask::{ChildGuard, Lab};

    /// A running `fake-kube-api` in a namespace of a lab.
    pub struct FakeApi {
        pub child: ChildGuard,
        /// The namespace it runs in; curl reaches it from there.
        pub ns: String,
        pub port: u16,
        /// `ip netns exec` prefix for curl.
        lab_cmd: Box<dyn Fn(&str) -> std::process::Command + Send + Sync>,
    }

    /// The binary, next to the test binary's deps directory.
    pub fn bin() -> PathBuf {
        let bin = xtask::target_dir().join("debug/fake-kube-api");
        assert!(
            bin.exists(),
            "{} missing: build it with `cargo build -p pxe-tests --bin fake-kube-api` \
             (`cargo test -p pxe-tests` does)",
            bin.display()
        );
        bin
    }

    impl FakeApi {
        /// Starts the server in `ns` of `lab`, listening on `listen`
        /// (`127.0.0.1:0`: loopback of that namespace).
        pub fn start(lab: &Lab, ns: &str, listen: &str) -> FakeApi {
            let mut child = ChildGuard::spawn(
                lab.cmd_in(ns, bin())
                    .args(["--listen", listen])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit()),
            )
            .expect("spawn fake-kube-api");
            let stdout = child.0.stdout.take().expect("stdout");
            let mut line = String::new();
            BufReader::new(stdout)
                .read_line(&mut line)
                .expect("read port");
            let port = line
                .trim()
                .strip_prefix("listening on ")
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("fake-kube-api printed {line:?}"));
            let ns_owned = ns.to_owned();
            FakeApi {
                child,
                ns: ns.to_owned(),
                port,
                lab_cmd: Box::new(move |program| {
                    let mut cmd = std::process::Command::new("ip");
                    cmd.args(["netns", "exec", &ns_owned, program]);
                    cmd
                }),
            }
        }

        pub fn url(&self) -> String {
            format!("http://127.0.0.1:{}", self.port)
        }

        /// Writes a kubeconfig pointing at the server (a token user: the
        /// fake checks no credentials).
        pub fn write_kubeconfig(&self, path: &Path, namespace: &str) {
            let text = format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
                 users:\n- name: fake\n  user:\n    token: fake-token\n\
                 contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {namespace}\n\
                 current-context: fake\n",
                self.url()
            );
            std::fs::write(path, text).expect("write kubeconfig");
        }

        /// Sends one request; the status code and the body as JSON (or as
        /// a string when it is not JSON).
        pub fn request(
            &self,
            method: &str,
            path: &str,
            content_type: &str,
            body: Option<&Value>,
        ) -> (u16, Value) {
            let mut cmd = (self.lab_cmd)("curl");
            cmd.args(["-sS", "-X", method, "-w", "\n%{http_code}"]);
            if let Some(body) = body {
                cmd.args(["-H", &format!("content-type: {content_type}")])
                    .args(["--data-binary", &body.to_string()]);
            }
            cmd.arg(format!("{}{path}", self.url()));
            let out = cmd.output().expect("run curl");
            assert!(
                out.status.success(),
                "curl {method} {path}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let (body, code) = text.rsplit_once('\n').expect("status line");
            let code = code.trim().parse().expect("status code");
            let body = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.into()));
            (code, body)
        }

        /// The API path of an object's collection.
        pub fn collection(api_version: &str, resource: &str, ns: &str) -> String {
            match api_version.split_once('/') {
                Some((group, version)) => {
                    format!("/apis/{group}/{version}/namespaces/{ns}/{resource}")
                }
                None => format!("/api/{api_version}/namespaces/{ns}/{resource}"),
            }
        }

        /// Creates `object`, or replaces it (keeping its status) when it
        /// exists; returns the stored object.
        pub fn put(&self, resource: &str, ns: &str, object: &Value) -> Value {
            let api_version = object["apiVersion"].as_str().expect("apiVersion");
            let name = object["metadata"]["name"].as_str().expect("name");
            let coll = FakeApi::collection(api_version, resource, ns);
            let (code, body) = self.request("POST", &coll, "application/json", Some(object));
            if code == 409 {
                let (code, current) = self.request("GET", &format!("{coll}/{name}"), "", None);
                assert_eq!(code, 200, "{current}");
                let mut next = object.clone();
                next["metadata"]["resourceVersion"] =
                    current["metadata"]["resourceVersion"].clone();
                let (code, body) = self.request(
                    "PUT",
                    &format!("{coll}/{name}"),
                    "application/json",
                    Some(&next),
                );
                assert_eq!(code, 200, "replace {name}: {body}");
                return body;
            }
            assert_eq!(code, 201, "create {name}: {body}");
            body
        }

        /// Every YAML document of `text`, created or replaced; the resource
        /// is the kind's plural, lowercase with an `s`.
        pub fn put_yaml(&self, ns: &str, text: &str) {
            for doc in text.split("\n---") {
                if doc.trim().is_empty() {
                    continue;
                }
                let object: Value = serde_norway::from_str(doc).expect("fixture YAML");
                let kind = object["kind"].as_str().expect("kind").to_lowercase();
                self.put(&format!("{kind}s"), ns, &object);
            }
        }

        pub fn get(
            &self,
            api_version: &str,
            resource: &str,
            ns: &str,
            name: &str,
        ) -> Option<Value> {
            let path = format!("{}/{name}", FakeApi::collection(api_version, resource, ns));
            match self.request("GET", &path, "", None) {
                (200, body) => Some(body),
                (404, _) => None,
                (code, body) => panic!("GET {path}: {code} {body}"),
            }
        }

        pub fn list(&self, api_version: &str, resource: &str, ns: &str) -> Vec<Value> {
            let (code, body) = self.request(
                "GET",
                &FakeApi::collection(api_version, resource, ns),
                "",
                None,
            );
            assert_eq!(code, 200, "{body}");
            body["items"].as_array().cloned().unwrap_or_default()
        }

        pub fn delete(&self, api_version: &str, resource: &str, ns: &str, name: &str) {
            let path = format!("{}/{name}", FakeApi::collection(api_version, resource, ns));
            let (code, body) = self.request("DELETE", &path, "", None);
            assert_eq!(code, 200, "{body}");
        }

        pub fn drop_watches(&self) {
            self.request("POST", "/fake/drop-watches", "", None);
        }

        pub fn compact(&self) {
            self.request("POST", "/fake/compact", "", None);
        }

        pub fn fail_status(&self, count: u32) {
            self.request(
                "POST",
                &format!("/fake/fail-status?count={count}"),
                "",
                None,
            );
        }

        /// Replaces the static tokens: `token,user,uid,"group1,group2"`
        /// lines, as kube-apiserver's `--token-auth-file`.
        pub fn set_tokens(&self, csv: &str) {
            let mut cmd = (self.lab_cmd)("curl");
            cmd.args(["-sS", "-X", "POST", "--data-binary", csv])
                .arg(format!("{}/fake/tokens", self.url()));
            let out = cmd.output().expect("run curl");
            assert!(
                out.status.success() && String::from_utf8_lossy(&out.stdout).contains("tokens"),
                "POST /fake/tokens: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }

        /// The requests seen so far.
        pub fn log(&self) -> Vec<Value> {
            let (_, body) = self.request("GET", "/fake/log", "", None);
            body.as_array().cloned().unwrap_or_default()
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! The server in-process on loopback, driven over raw HTTP.

    use super::*;

    /// `head` (request line and any headers) and `body` to the in-process
    /// server at `addr` over one raw HTTP/1.1 connection: status and body.
    pub(crate) async fn send(addr: SocketAddr, head: &str, body: &str) -> (u16, String) {
        let mut conn = TcpStream::connect(addr).await.expect("connect");
        let req = format!(
            "{head}\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(req.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        conn.read_to_end(&mut out).await.expect("read");
        let text = String::from_utf8_lossy(&out).into_owned();
        let code = text[9..12].parse().expect("code");
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (code, body)
    }

    async fn start() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(serve(listener, Arc::new(Server::default())));
        addr
    }

    const COLL: &str = "/apis/pxe-agent.io/v1alpha1/namespaces/ns/boothosts";

    /// `limit` pages a list in key order at the first page's
    /// resourceVersion: a change after it is not in the later pages, and a
    /// compaction expires the token.
    #[tokio::test]
    async fn lists_page_at_one_resource_version() {
        let addr = start().await;
        for name in ["c", "a", "d", "b", "e"] {
            let obj = format!(r#"{{"metadata":{{"name":"{name}"}},"spec":{{}}}}"#);
            let (code, body) = send(addr, &format!("POST {COLL} HTTP/1.1"), &obj).await;
            assert_eq!(code, 201, "{body}");
        }
        let page = |body: &str| -> (Vec<String>, Value) {
            let list: Value = serde_json::from_str(body).expect("json");
            let names = list["items"]
                .as_array()
                .expect("items")
                .iter()
                .map(|o| o["metadata"]["name"].as_str().expect("name").to_owned())
                .collect();
            (names, list["metadata"].clone())
        };
        let (code, body) = send(addr, &format!("GET {COLL}?limit=2 HTTP/1.1"), "").await;
        assert_eq!(code, 200, "{body}");
        let (names, meta) = page(&body);
        assert_eq!(names, ["a", "b"]);
        assert_eq!(meta["resourceVersion"], "5");
        assert_eq!(meta["remainingItemCount"], 3);
        let token = meta["continue"].as_str().expect("continue").to_owned();
        assert_eq!(decode_continue(&token), Some((5, "b\0".to_owned())));
        // A change after the first page is not in the rest of the list.
        let obj = r#"{"metadata":{"name":"bb"},"spec":{}}"#;
        send(addr, &format!("POST {COLL} HTTP/1.1"), obj).await;
        send(addr, &format!("DELETE {COLL}/e HTTP/1.1"), "").await;
        let (code, body) = send(
            addr,
            &format!("GET {COLL}?limit=2&continue={token} HTTP/1.1"),
            "",
        )
        .await;
        assert_eq!(code, 200, "{body}");
        let (names, meta) = page(&body);
        assert_eq!(names, ["c", "d"]);
        assert_eq!(meta["resourceVersion"], "5");
        assert_eq!(meta["remainingItemCount"], 1);
        let last = meta["continue"].as_str().expect("continue").to_owned();
        let (_, body) = send(
            addr,
            &format!("GET {COLL}?limit=2&continue={last} HTTP/1.1"),
            "",
        )
        .await;
        let (names, meta) = page(&body);
        assert_eq!(names, ["e"]);
        assert!(meta.get("continue").is_none(), "{meta}");
        // A continue with a resourceVersion is refused; a new list sees now.
        let (code, _) = send(
            addr,
            &format!("GET {COLL}?limit=2&continue={token}&resourceVersion=5 HTTP/1.1"),
            "",
        )
        .await;
        assert_eq!(code, 400);
        let (_, body) = send(addr, &format!("GET {COLL} HTTP/1.1"), "").await;
        assert_eq!(page(&body).0, ["a", "b", "bb", "c", "d"]);
        // A compaction expires the token.
        send(addr, "POST /fake/compact HTTP/1.1", "").await;
        let (code, body) = send(
            addr,
            &format!("GET {COLL}?limit=2&continue={token} HTTP/1.1"),
            "",
        )
        .await;
        assert_eq!(code, 410, "{body}");
        assert!(body.contains("\"reason\":\"Expired\""), "{body}");
    }

    #[tokio::test]
    async fn create_conflict_status_and_410() {
        let addr = start().await;
        let obj = r#"{"apiVersion":"pxe-agent.io/v1alpha1","kind":"BootHost","metadata":{"name":"a","labels":{"x":"1"}},"spec":{"mac":"52:54:00:00:00:01"}}"#;
        let (code, body) = send(addr, &format!("POST {COLL} HTTP/1.1"), obj).await;
        assert_eq!(code, 201, "{body}");
        let (code, body) = send(addr, &format!("POST {COLL} HTTP/1.1"), obj).await;
        assert_eq!(code, 409);
        assert!(body.contains("AlreadyExists"), "{body}");
        // A stale resourceVersion in a status patch conflicts.
        let stale = r#"{"metadata":{"resourceVersion":"0"},"status":{"stage":"dhcp"}}"#;
        let (code, body) = send(
            addr,
            &format!(
                "PATCH {COLL}/a/status HTTP/1.1\r\ncontent-type: application/merge-patch+json"
            ),
            stale,
        )
        .await;
        assert_eq!(code, 409, "{body}");
        assert!(body.contains("\"reason\":\"Conflict\""), "{body}");
        let fresh =
            r#"{"metadata":{"resourceVersion":"1"},"status":{"stage":"dhcp"},"spec":{"mac":"x"}}"#;
        let (code, body) = send(
            addr,
            &format!(
                "PATCH {COLL}/a/status HTTP/1.1\r\ncontent-type: application/merge-patch+json"
            ),
            fresh,
        )
        .await;
        assert_eq!(code, 200, "{body}");
        let stored: Value = serde_json::from_str(&body).expect("json");
        assert_eq!(stored["status"]["stage"], "dhcp");
        assert_eq!(
            stored["spec"]["mac"], "52:54:00:00:00:01",
            "status ignores spec"
        );
        assert_eq!(stored["metadata"]["generation"], 1);
        // Label selectors filter lists.
        let (_, list) = send(
            addr,
            &format!("GET {COLL}?labelSelector=x%3D2 HTTP/1.1"),
            "",
        )
        .await;
        assert!(list.contains("\"items\":[]"), "{list}");
        let (_, list) = send(
            addr,
            &format!("GET {COLL}?labelSelector=x%3D1 HTTP/1.1"),
            "",
        )
        .await;
        assert!(list.contains("52:54:00:00:00:01"), "{list}");
        // After compaction an old watch is told 410.
        send(addr, "POST /fake/compact HTTP/1.1", "").await;
        let (code, body) = send(
            addr,
            &format!("GET {COLL}?watch=true&resourceVersion=1 HTTP/1.1"),
            "",
        )
        .await;
        assert_eq!(code, 200);
        assert!(body.contains("\"code\":410"), "{body}");
    }

    #[tokio::test]
    async fn watch_replays_then_times_out() {
        let addr = start().await;
        let obj = r#"{"apiVersion":"pxe-agent.io/v1alpha1","kind":"BootHost","metadata":{"name":"a"},"spec":{"mac":"m"}}"#;
        send(addr, &format!("POST {COLL} HTTP/1.1"), obj).await;
        let (code, body) = send(
            addr,
            &format!("GET {COLL}?watch=true&resourceVersion=0&timeoutSeconds=1 HTTP/1.1"),
            "",
        )
        .await;
        assert_eq!(code, 200);
        assert!(body.contains("\"type\":\"ADDED\""), "{body}");
    }
}

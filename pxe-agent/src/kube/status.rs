//! What the agent writes back to its own objects' `status`: the Accepted
//! condition, and for BootHosts a projection of what the agent observed
//! (stage, last DHCP, boot file, last phone-home, power and recovery state,
//! serving node) and, with peers, the agent that owns the host. Owns
//! composing that status and the per-object coalescing (the latest wanted
//! status wins; nothing is sent when it is already there). The token bucket
//! that bounds patches a second, so a boot storm does not flood the API
//! server, is `ratelimit`'s. The status is never read back as the source
//! of a decision. Sending is `mod.rs`'s, over merge patches guarded by the
//! object's resourceVersion.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    hash::{DefaultHasher, Hash as _, Hasher as _},
    sync::Arc,
};

use serde_json::{Value, json};

use super::objects::ObjRef;
use crate::{recovery::State, view::HostView};

/// The statuses waiting to be written, one per object, oldest first, as
/// compact JSON text shared between the objects that want the same (at
/// fleet size a first round queues one per object, most of them alike).
#[derive(Debug, Default)]
pub struct Outbox {
    /// A hash of what was last written (or seen) per object.
    written: HashMap<ObjRef, u64>,
    pending: BTreeMap<ObjRef, Arc<str>>,
    order: VecDeque<ObjRef>,
}

/// One copy of each distinct status text in use: the same status wanted
/// for a hundred thousand objects (accepted, not seen booting yet) is held
/// once, not once an object.
#[derive(Debug, Default)]
pub struct Interner {
    texts: HashMap<u64, Arc<str>>,
}

impl Interner {
    /// The shared copy of `text`.
    pub fn get(&mut self, text: String) -> Arc<str> {
        let texts = self
            .texts
            .entry(digest(&text))
            .or_insert_with(|| Arc::from(text.as_str()));
        if **texts == *text {
            texts.clone()
        } else {
            // A hash shared by two texts: this one is not interned.
            Arc::from(text)
        }
    }

    /// Forgets the texts no one else holds.
    pub fn prune(&mut self) {
        self.texts.retain(|_, text| Arc::strong_count(text) > 1);
    }
}

/// What `written` keeps of a status.
fn digest(status: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    status.hash(&mut hasher);
    hasher.finish()
}

impl Outbox {
    /// Wants `status` on `at`: queued unless it is what is already there
    /// (`shown`: the object's status as last watched has it, see [`same`];
    /// or it is what was last written). A newer wanted status replaces a
    /// queued one in place.
    pub fn offer(&mut self, at: &ObjRef, status: Arc<str>, shown: bool) {
        if shown {
            self.written.insert(at.clone(), digest(&status));
            self.pending.remove(at);
            return;
        }
        if self.written.get(at) == Some(&digest(&status)) {
            self.pending.remove(at);
            return;
        }
        if self.pending.insert(at.clone(), status).is_none() {
            self.order.push_back(at.clone());
        }
    }

    /// The oldest queued status.
    pub fn take(&mut self) -> Option<(ObjRef, Arc<str>)> {
        while let Some(at) = self.order.pop_front() {
            if let Some(status) = self.pending.remove(&at) {
                return Some((at, status));
            }
        }
        None
    }

    pub fn sent(&mut self, at: &ObjRef, status: &str) {
        self.written.insert(at.clone(), digest(status));
    }

    /// Writing failed: queue it again unless something newer is waiting.
    pub fn retry(&mut self, at: &ObjRef, status: Arc<str>) {
        if !self.pending.contains_key(at) {
            self.pending.insert(at.clone(), status);
            self.order.push_back(at.clone());
        }
    }

    /// Forgets an object that is gone.
    pub fn remove(&mut self, at: &ObjRef) {
        self.written.remove(at);
        self.pending.remove(at);
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

/// RFC 3339 of unix milliseconds.
pub fn rfc3339(ms: u64) -> Option<String> {
    let ms = i64::try_from(ms).ok()?;
    k8s_openapi::jiff::Timestamp::from_millisecond(ms)
        .ok()
        .map(|t| {
            t.round(k8s_openapi::jiff::Unit::Second)
                .unwrap_or(t)
                .to_string()
        })
}

/// The Accepted condition: `Valid`, or `Invalid` with the problems. Its
/// `lastTransitionTime` is kept from `previous` (the object's status) while
/// the condition's status stays the same.
pub fn accepted(
    problems: Option<&[String]>,
    generation: Option<i64>,
    previous: Option<&Value>,
    now_ms: u64,
) -> Value {
    let (status, reason, message) = match problems {
        None => ("True", "Valid", "accepted into the inventory".to_owned()),
        Some(problems) => ("False", "Invalid", problems.join("; ")),
    };
    let since = previous
        .and_then(|p| p.get("conditions"))
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["type"] == "Accepted"))
        .filter(|c| c["status"] == status)
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| rfc3339(now_ms).into());
    let mut condition = json!({
        "type": "Accepted",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    });
    if let Some(g) = generation {
        condition["observedGeneration"] = g.into();
    }
    condition
}

/// The status wanted on an object: its condition, and for an accepted
/// BootHost that this agent has seen (a boot step, a power state, a
/// recovery under way) what it knows of it (`view`), every key present
/// (`null` when unknown) so that a merge patch clears what is gone. A host
/// the agent has seen nothing of gets only the condition, so an agent that
/// does not serve it leaves the serving agent's fields alone.
pub fn status_of(
    condition: Value,
    generation: Option<i64>,
    view: Option<&HostView>,
    node: &str,
    host: bool,
) -> Value {
    let mut status = json!({
        "conditions": [condition],
        "observedGeneration": generation,
    });
    let seen = view.is_some_and(seen);
    // With peers, every agent writes the same owner, and only the owner
    // what it observed, so that agents never undo each other's writes.
    let owner = view.and_then(|v| v.owner.as_deref());
    if host && let Some(owner) = owner {
        status["owner"] = owner.into();
    }
    if !host || !seen || owner.is_some_and(|o| o != node) {
        return status;
    }
    let p = view.map(|v| &v.progress);
    let step = |f: fn(&crate::progress::HostProgress) -> &Option<crate::progress::Step>| {
        p.and_then(|p| f(p).as_ref())
    };
    status["stage"] = view
        .and_then(|v| v.stage)
        .map(|s| serde_json::to_value(s).unwrap_or(Value::Null))
        .unwrap_or(Value::Null);
    status["lastDhcp"] = step(|p| &p.dhcp).and_then(|s| rfc3339(s.at_ms)).into();
    status["bootFile"] = step(|p| &p.tftp).map(|s| s.detail.clone()).into();
    status["lastPhoneHome"] = step(|p| &p.booted).and_then(|s| rfc3339(s.at_ms)).into();
    status["powerState"] = json!(view.and_then(|v| v.power));
    status["recovery"] = match view.and_then(|v| v.recovery) {
        Some(state) => json!({"state": state, "attempts": view.and_then(|v| v.attempts)}),
        None => Value::Null,
    };
    status["servingNode"] = if view.is_some() {
        node.into()
    } else {
        Value::Null
    };
    status
}

/// Whether the agent has seen something of the host (a boot step, a power
/// state, a recovery under way), so that its status says what.
pub fn seen(view: &HostView) -> bool {
    view.stage.is_some()
        || view.progress.dhcp.is_some()
        || view.power.is_some()
        || view.recovery.is_some_and(|r| r != State::Idle)
}

/// Whether `view` changes the status [`status_of`] makes: the host was
/// seen, or it has an owner. Other views give what no view gives.
pub fn matters(view: &HostView) -> bool {
    seen(view) || view.owner.is_some()
}

/// A merge patch of `wanted` over `observed` (the object's status as last
/// seen) would change nothing: every key of `wanted` is in `observed` with
/// the same value, and every `null` of `wanted` is absent there. Keys
/// `wanted` leaves out do not count (another agent's).
pub fn same(wanted: &Value, observed: Option<&Value>) -> bool {
    fn covers(wanted: &Value, observed: Option<&Value>) -> bool {
        match (wanted, observed) {
            (Value::Null, None | Some(Value::Null)) => true,
            (Value::Object(w), Some(Value::Object(o))) => {
                w.iter().all(|(k, v)| covers(v, o.get(k)))
            }
            (Value::Object(_), _) => false,
            (w, Some(o)) => w == o,
            (_, None) => false,
        }
    }
    observed.is_some() && covers(wanted, observed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::objects::Kind;

    #[test]
    fn interner_holds_one_copy_of_each_text_while_it_is_used() {
        let mut texts = Interner::default();
        let a = texts.get(r#"{"x":1}"#.to_owned());
        let b = texts.get(r#"{"x":1}"#.to_owned());
        let c = texts.get(r#"{"x":2}"#.to_owned());
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*c, r#"{"x":2}"#);
        drop((b, c));
        texts.prune();
        assert_eq!(texts.texts.len(), 1, "the text still in use stays");
        drop(a);
        texts.prune();
        assert!(texts.texts.is_empty());
    }

    #[test]
    fn outbox_coalesces_per_object_latest_wins() {
        let a = ObjRef::new(Kind::BootHost, "a");
        let b = ObjRef::new(Kind::BootHost, "b");
        let mut out = Outbox::default();
        let n = |n: u32| Arc::<str>::from(json!({"n": n}).to_string());
        for i in 0..50 {
            out.offer(&a, n(i), false);
        }
        out.offer(&b, n(1), false);
        assert_eq!(out.len(), 2);
        assert_eq!(out.take(), Some((a.clone(), n(49))));
        out.sent(&a, &n(49));
        // Already written: not queued again.
        out.offer(&a, n(49), false);
        assert_eq!(out.take(), Some((b.clone(), n(1))));
        assert_eq!(out.take(), None);
        // Already on the object: not queued.
        out.offer(&b, n(2), true);
        assert!(out.is_empty());
        // A failed write is retried, unless something newer is queued.
        out.retry(&a, n(50));
        out.offer(&a, n(51), false);
        out.retry(&a, n(50));
        assert_eq!(out.take(), Some((a, n(51))));
    }

    #[test]
    fn condition_keeps_its_transition_time_while_unchanged() {
        let first = accepted(None, Some(1), None, 1_000);
        assert_eq!(first["lastTransitionTime"], "1970-01-01T00:00:01Z");
        let status = json!({"conditions": [first]});
        let again = accepted(None, Some(2), Some(&status), 99_000);
        assert_eq!(again["lastTransitionTime"], "1970-01-01T00:00:01Z");
        let flipped = accepted(Some(&["bad".into()]), Some(2), Some(&status), 99_000);
        assert_eq!(flipped["lastTransitionTime"], "1970-01-01T00:01:39Z");
        assert_eq!(flipped["reason"], "Invalid");
        assert_eq!(flipped["message"], "bad");
    }

    #[test]
    fn with_peers_every_agent_names_the_owner_and_only_the_owner_writes_the_rest() {
        let view: HostView = serde_json::from_value(json!({
            "mac": "52:54:00:00:00:01",
            "ip": "10.66.1.10",
            "hostname": "node-1",
            "profile": "w",
            "stage": "dhcp",
            "progress": {"mac": "52:54:00:00:00:01", "dhcp": {"at_ms": 1000, "detail": "offer"},
                         "artifacts_fetched": 0},
            "recovery": "awaiting-boot-file",
            "attempts": 1,
            "owner": "node-b",
        }))
        .expect("a host view");
        let condition = accepted(None, Some(1), None, 1_000);
        let other = status_of(condition.clone(), Some(1), Some(&view), "node-a", true);
        assert_eq!(other["owner"], "node-b");
        assert!(other.get("stage").is_none() && other.get("servingNode").is_none());
        let owner = status_of(condition, Some(1), Some(&view), "node-b", true);
        assert_eq!(owner["owner"], "node-b");
        assert_eq!(owner["stage"], "dhcp");
        assert_eq!(owner["recovery"]["state"], "awaiting-boot-file");
        assert_eq!(owner["servingNode"], "node-b");
        // What the other writes leaves the owner's fields alone.
        assert!(same(&other, Some(&owner)));
    }

    #[test]
    fn nulls_are_absent_keys() {
        let wanted = json!({"stage": null, "servingNode": "n1"});
        assert!(same(&wanted, Some(&json!({"servingNode": "n1"}))));
        assert!(!same(&wanted, Some(&json!({"servingNode": "n2"}))));
        assert!(!same(
            &wanted,
            Some(&json!({"servingNode": "n1", "stage": "dhcp"}))
        ));
        assert!(!same(&wanted, None));
        // Keys left out are another agent's.
        let condition_only = json!({"conditions": [{"type": "Accepted"}]});
        assert!(same(
            &condition_only,
            Some(&json!({"conditions": [{"type": "Accepted"}], "stage": "booted"}))
        ));
    }
}

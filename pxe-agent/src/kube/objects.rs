//! The kinds the Kubernetes source reads and writes: the agent's own
//! `pxe-agent.io/v1alpha1` BootHost, BootProfile and BootNetwork, Metal3's
//! BareMetalHost (read only) and core Secrets, as `ApiResource`s for
//! `DynamicObject`s. The CRDs' schemas are hand-written YAML in
//! `deploy/base/crds/`; here the objects stay JSON until `document` turns
//! their specs into the inventory file's shape, so one validation (the
//! file's) applies, instead of a second set of Rust types to keep in step.

use std::{
    borrow::Cow,
    fmt,
    hash::{DefaultHasher, Hash as _, Hasher as _},
    sync::Arc,
};

use kube::{api::DynamicObject, core::ApiResource};
use serde_json::{Value, json};

use crate::mac::MacAddr;

/// The agent's API group and version.
pub const GROUP: &str = "pxe-agent.io";
pub const VERSION: &str = "v1alpha1";

/// Metal3's.
pub const METAL3_GROUP: &str = "metal3.io";
pub const METAL3_VERSION: &str = "v1alpha1";

/// Annotations giving a BareMetalHost what Metal3 has no field for.
pub const ANNOTATION_IP: &str = "pxe-agent.io/ip";
pub const ANNOTATION_PROFILE: &str = "pxe-agent.io/profile";
/// The host's reserved IPv6 address, optional.
pub const ANNOTATION_IPV6: &str = "pxe-agent.io/ipv6";
/// The host's SMBIOS system UUID, optional: a BareMetalHost's status has
/// the system's manufacturer, product and serial number, not its UUID.
pub const ANNOTATION_UUID: &str = "pxe-agent.io/uuid";

/// The kinds an inventory is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    BootNetwork,
    BootProfile,
    BootHost,
    BareMetalHost,
}

impl Kind {
    pub const ALL: [Kind; 4] = [
        Kind::BootNetwork,
        Kind::BootProfile,
        Kind::BootHost,
        Kind::BareMetalHost,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::BootNetwork => "BootNetwork",
            Kind::BootProfile => "BootProfile",
            Kind::BootHost => "BootHost",
            Kind::BareMetalHost => "BareMetalHost",
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            Kind::BootNetwork => "bootnetworks",
            Kind::BootProfile => "bootprofiles",
            Kind::BootHost => "boothosts",
            Kind::BareMetalHost => "baremetalhosts",
        }
    }

    /// The agent writes status and Events only on its own kinds: another
    /// controller owns BareMetalHosts.
    pub fn is_ours(self) -> bool {
        self != Kind::BareMetalHost
    }

    pub fn resource(self) -> ApiResource {
        let (group, version) = if self.is_ours() {
            (GROUP, VERSION)
        } else {
            (METAL3_GROUP, METAL3_VERSION)
        };
        ApiResource {
            group: group.to_owned(),
            version: version.to_owned(),
            api_version: format!("{group}/{version}"),
            kind: self.name().to_owned(),
            plural: self.plural().to_owned(),
        }
    }
}

/// One object by kind and name (the namespace is the source's). The
/// name is shared by its clones: the status round, the writer's queue and
/// the rebuild's sets each hold one per object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjRef {
    pub kind: Kind,
    pub name: Arc<str>,
}

impl ObjRef {
    pub fn new(kind: Kind, name: &str) -> ObjRef {
        ObjRef {
            kind,
            name: Arc::from(name),
        }
    }
}

/// `BootHost node-1`.
impl fmt::Display for ObjRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind.name(), self.name)
    }
}

/// What a rebuild reads of an object: its JSON (`metadata` and `spec`),
/// whole or held compactly.
pub trait AsObject {
    /// The object as JSON.
    fn value(&self) -> Cow<'_, Value>;
    /// Its `spec.bmc.credentialsName`.
    fn credentials_name(&self) -> Option<String>;
    /// A hash of what a rebuild reads of it: equal for objects a rebuild
    /// reads the same.
    fn body_hash(&self) -> u64;
}

impl AsObject for Value {
    fn value(&self) -> Cow<'_, Value> {
        Cow::Borrowed(self)
    }

    fn credentials_name(&self) -> Option<String> {
        self.pointer("/spec/bmc/credentialsName")
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    fn body_hash(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        self.get("metadata").map(Value::to_string).hash(&mut hasher);
        self.get("spec").map(Value::to_string).hash(&mut hasher);
        hasher.finish()
    }
}

/// One watched object as kept between rebuilds, at fleet size most of the
/// source's memory: what a rebuild depends on (name, labels, annotations
/// and spec) as compact JSON text, parsed again only while a rebuild reads
/// it, its status as text, and the few fields the status writer reads on
/// every round. A `serde_json::Value` of the same object takes some
/// kilobytes (a map node per nested object); this, its text.
#[derive(Clone, Debug)]
pub struct Stored {
    /// `{"metadata": {name, labels, annotations}, "spec": ...}`.
    body: Box<str>,
    /// `status`, as written by the agent or another.
    status: Option<Box<str>>,
    pub generation: Option<i64>,
    pub resource_version: Option<Box<str>>,
    pub uid: Option<Box<str>>,
    /// `spec.mac` (BootHosts).
    pub mac: Option<MacAddr>,
    credentials: Option<Box<str>>,
    /// A hash of what the watch last showed beyond the body: status,
    /// generation and resourceVersion.
    pub seen: u64,
    /// The status writer's fingerprint of what it last wanted for this
    /// object (0: nothing yet); the object replaced, it starts over.
    pub offered: u64,
}

impl Stored {
    pub fn new(object: &DynamicObject) -> Stored {
        let meta = &object.metadata;
        let spec = object.data.get("spec");
        let mut metadata = json!({"name": meta.name});
        if let Some(labels) = &meta.labels {
            metadata["labels"] = json!(labels);
        }
        if let Some(annotations) = &meta.annotations {
            metadata["annotations"] = json!(annotations);
        }
        let body = json!({"metadata": metadata, "spec": spec}).to_string();
        let status = object
            .data
            .get("status")
            .filter(|s| !s.is_null())
            .map(|s| Box::from(s.to_string()));
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(Box::<str>::from);
        let mut hasher = DefaultHasher::new();
        (&status, meta.generation, &meta.resource_version).hash(&mut hasher);
        Stored {
            body: body.into(),
            status,
            generation: meta.generation,
            resource_version: meta.resource_version.as_deref().map(Box::from),
            uid: meta.uid.as_deref().map(Box::from),
            mac: spec
                .and_then(|s| s.get("mac"))
                .and_then(Value::as_str)
                .and_then(|m| m.parse().ok()),
            credentials: text(spec.and_then(|s| s.pointer("/bmc/credentialsName"))),
            seen: hasher.finish(),
            offered: 0,
        }
    }

    /// Whether a rebuild would read the same of both.
    pub fn same_body(&self, other: &Stored) -> bool {
        self.body == other.body
    }

    /// The status as last watched.
    pub fn status(&self) -> Option<Value> {
        self.status
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok())
    }
}

impl AsObject for Stored {
    fn value(&self) -> Cow<'_, Value> {
        Cow::Owned(serde_json::from_str(&self.body).unwrap_or(Value::Null))
    }

    fn credentials_name(&self) -> Option<String> {
        self.credentials.as_deref().map(str::to_owned)
    }

    fn body_hash(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        self.body.hash(&mut hasher);
        hasher.finish()
    }
}

//! The kinds the Kubernetes source reads and writes: the agent's own
//! `pxe-agent.io/v1alpha1` BootHost, BootProfile and BootNetwork, Metal3's
//! BareMetalHost (read only) and core Secrets, as `ApiResource`s for
//! `DynamicObject`s. The CRDs' schemas are hand-written YAML in
//! `deploy/base/crds/`; here the objects stay JSON until `document` turns
//! their specs into the inventory file's shape, so one validation (the
//! file's) applies, instead of a second set of Rust types to keep in step.

use std::fmt;

use kube::core::ApiResource;

/// The agent's API group and version.
pub const GROUP: &str = "pxe-agent.io";
pub const VERSION: &str = "v1alpha1";

/// Metal3's.
pub const METAL3_GROUP: &str = "metal3.io";
pub const METAL3_VERSION: &str = "v1alpha1";

/// Annotations giving a BareMetalHost what Metal3 has no field for.
pub const ANNOTATION_IP: &str = "pxe-agent.io/ip";
pub const ANNOTATION_PROFILE: &str = "pxe-agent.io/profile";

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

/// One object by kind and name (the namespace is the source's).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjRef {
    pub kind: Kind,
    pub name: String,
}

impl ObjRef {
    pub fn new(kind: Kind, name: &str) -> ObjRef {
        ObjRef {
            kind,
            name: name.to_owned(),
        }
    }
}

/// `BootHost node-1`.
impl fmt::Display for ObjRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind.name(), self.name)
    }
}

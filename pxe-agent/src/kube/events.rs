//! The Events the Kubernetes source creates: one `InvalidSpec` warning (core
//! v1 Event) for each refused object of the agent's own kinds, once per
//! generation and message. Owns their shape; when to create one is
//! `mod.rs`'s. Never about a BareMetalHost, and never carrying a secret
//! (messages are validation problems, which name Secrets and keys only).

use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time},
    jiff::Timestamp,
};

use super::objects::ObjRef;
use crate::clock;

/// A refused object and why.
#[derive(Debug, Clone)]
pub struct Invalid {
    pub at: ObjRef,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub message: String,
}

/// The reason every such Event carries.
pub const REASON: &str = "InvalidSpec";
const COMPONENT: &str = "pxe-agent";

/// The Event for `invalid` in `namespace`, reported by `node`.
pub fn invalid_spec(invalid: &Invalid, namespace: &str, node: &str) -> Event {
    // As `Timestamp::now` does, from the one wall clock.
    let now = Timestamp::try_from(clock::now()).expect("system time is valid");
    let resource = invalid.at.kind.resource();
    Event {
        metadata: ObjectMeta {
            // Unique per object and moment, as client-go's recorder names them.
            name: Some(format!("{}.{:x}", invalid.at.name, now.as_nanosecond())),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some(resource.api_version),
            kind: Some(resource.kind),
            name: Some(invalid.at.name.to_string()),
            namespace: Some(namespace.to_owned()),
            uid: invalid.uid.clone(),
            resource_version: invalid.resource_version.clone(),
            ..Default::default()
        },
        reason: Some(REASON.to_owned()),
        message: Some(invalid.message.clone()),
        type_: Some("Warning".to_owned()),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        action: Some("Validate".to_owned()),
        reporting_component: Some(COMPONENT.to_owned()),
        reporting_instance: Some(node.to_owned()),
        source: Some(EventSource {
            component: Some(COMPONENT.to_owned()),
            host: Some(node.to_owned()),
        }),
        ..Default::default()
    }
}

//! The fake API server's reviews, as kube-apiserver answers them:
//! TokenReviews (`POST /apis/authentication.k8s.io/v1/tokenreviews`)
//! against static tokens in kube-apiserver's `--token-auth-file` format,
//! and SubjectAccessReviews
//! (`POST /apis/authorization.k8s.io/v1/subjectaccessreviews`) evaluated
//! against the stored Roles, ClusterRoles, RoleBindings and
//! ClusterRoleBindings the way the RBAC authorizer does (plus the
//! `system:masters` group, which may do everything). Both answer 201 with
//! the request echoed and its `status` set; a body that is not the kind
//! gets 400, an invalid spec 422, each as a `Status`. Requests and answers
//! go through the k8s-openapi 1.33 types, so their shape is the schema's.
//!
//! Not reproduced: who may create a review (the fake authorizes no
//! request), ServiceAccount JWTs, aggregated ClusterRoles.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewStatus, UserInfo},
    authorization::v1::{
        NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewStatus,
    },
    rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject},
};
use serde_json::Value;

use super::{Key, Reply, status};

/// The audience of tokens that name none, as a cluster's API server has it.
const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
/// The group kube-apiserver adds to every authenticated user.
const AUTHENTICATED: &str = "system:authenticated";
/// The group the API server lets do everything.
const MASTERS: &str = "system:masters";
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// A static token and whom it authenticates.
pub(super) type StaticToken = (String, UserInfo);

/// kube-apiserver's `--token-auth-file`: `token,user,uid` and optionally
/// `,"group1,group2"`, one a line; `#` lines and blank lines skipped.
pub(super) fn parse_token_file(text: &str) -> Result<Vec<StaticToken>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.splitn(4, ',');
        let (Some(token), Some(user), Some(uid)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(format!("line {}: want token,user,uid[,\"groups\"]", n + 1));
        };
        let groups: Vec<String> = fields
            .next()
            .map(|g| g.trim_matches('"'))
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|g| !g.is_empty())
            .map(str::to_owned)
            .collect();
        out.push((
            token.to_owned(),
            UserInfo {
                username: Some(user.to_owned()),
                uid: Some(uid.to_owned()),
                groups: Some(groups),
                extra: None,
            },
        ));
    }
    Ok(out)
}

/// The body as `T`, or the 400 the API server answers a body it cannot
/// decode (k8s-openapi checks `apiVersion` and `kind` too).
fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Reply> {
    serde_json::from_slice(body).map_err(|e| status(400, "BadRequest", format!("{e}")))
}

/// `metadata` of a review as the API server returns it: nothing stored,
/// a zero creation time.
fn echoed(mut object: Value) -> Reply {
    object["metadata"] = serde_json::json!({"creationTimestamp": null});
    Reply::Json(201, object)
}

/// `POST .../tokenreviews`.
pub(super) fn token_review(tokens: &[StaticToken], body: &[u8]) -> Reply {
    let mut review: TokenReview = match decode(body) {
        Ok(review) => review,
        Err(reply) => return reply,
    };
    let token = review.spec.token.clone().unwrap_or_default();
    if token.is_empty() {
        return status(
            400,
            "BadRequest",
            "token is required for TokenReview in authentication",
        );
    }
    // Static tokens hold no audience: they are good for the API server's,
    // and for a request naming it among others.
    let wanted = review
        .spec
        .audiences
        .clone()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| vec![API_AUDIENCE.to_owned()]);
    let known = tokens
        .iter()
        .find(|(t, _)| *t == token)
        .filter(|_| wanted.iter().any(|a| a == API_AUDIENCE));
    review.status = Some(match known {
        Some((_, user)) => {
            let mut user = user.clone();
            user.groups
                .get_or_insert_with(Vec::new)
                .push(AUTHENTICATED.to_owned());
            TokenReviewStatus {
                authenticated: Some(true),
                user: Some(user),
                audiences: Some(vec![API_AUDIENCE.to_owned()]),
                error: None,
            }
        }
        // What the API server answers a token no authenticator knows:
        // `authenticated` false (left out) and an empty user.
        None => TokenReviewStatus {
            user: Some(UserInfo::default()),
            ..TokenReviewStatus::default()
        },
    });
    echoed(serde_json::to_value(review).expect("a TokenReview serializes"))
}

/// `POST .../subjectaccessreviews`, judged by the RBAC objects among
/// `objects`.
pub(super) fn access_review(objects: &BTreeMap<Key, Value>, body: &[u8]) -> Reply {
    let mut review: SubjectAccessReview = match decode(body) {
        Ok(review) => review,
        Err(reply) => return reply,
    };
    let spec = &review.spec;
    let mut problems = Vec::new();
    if spec.resource_attributes.is_some() == spec.non_resource_attributes.is_some() {
        problems.push(
            "spec.resourceAttributes: Invalid value: \"null\": exactly one of \
             nonResourceAttributes or resourceAttributes must be specified",
        );
    }
    if spec.user.as_deref().unwrap_or_default().is_empty()
        && spec.groups.as_deref().unwrap_or_default().is_empty()
    {
        problems.push(
            "spec.user: Invalid value: \"\": at least one of user or group must be specified",
        );
    }
    if !problems.is_empty() {
        return status(
            422,
            "Invalid",
            format!(
                "SubjectAccessReview.authorization.k8s.io \"\" is invalid: [{}]",
                problems.join(", ")
            ),
        );
    }
    let subject = Requester {
        user: spec.user.clone().unwrap_or_default(),
        groups: spec.groups.clone().unwrap_or_default(),
    };
    let reason = if subject.groups.iter().any(|g| g == MASTERS) {
        Some(String::new())
    } else {
        Rbac::of(objects).allows(&subject, &Request::of(spec))
    };
    review.status = Some(SubjectAccessReviewStatus {
        allowed: reason.is_some(),
        reason: reason.filter(|r| !r.is_empty()),
        ..SubjectAccessReviewStatus::default()
    });
    echoed(serde_json::to_value(review).expect("a SubjectAccessReview serializes"))
}

/// The user a review asks about.
struct Requester {
    user: String,
    groups: Vec<String>,
}

/// What the user would do.
enum Request<'a> {
    Resource(&'a ResourceAttributes),
    NonResource(&'a NonResourceAttributes),
}

impl<'a> Request<'a> {
    fn of(spec: &'a k8s_openapi::api::authorization::v1::SubjectAccessReviewSpec) -> Request<'a> {
        match (&spec.resource_attributes, &spec.non_resource_attributes) {
            (Some(r), _) => Request::Resource(r),
            (None, Some(n)) => Request::NonResource(n),
            (None, None) => unreachable!("validated"),
        }
    }

    fn namespace(&self) -> &str {
        match self {
            Request::Resource(r) => r.namespace.as_deref().unwrap_or_default(),
            Request::NonResource(_) => "",
        }
    }
}

/// The RBAC objects the store holds.
#[derive(Default)]
struct Rbac {
    roles: Vec<Role>,
    cluster_roles: Vec<ClusterRole>,
    bindings: Vec<RoleBinding>,
    cluster_bindings: Vec<ClusterRoleBinding>,
}

impl Rbac {
    fn of(objects: &BTreeMap<Key, Value>) -> Rbac {
        let mut rbac = Rbac::default();
        for ((group, _, resource, _, _), object) in objects {
            if group != RBAC_GROUP {
                continue;
            }
            let object = object.clone();
            let parsed = match resource.as_str() {
                "roles" => serde_json::from_value(object).map(|o| rbac.roles.push(o)),
                "clusterroles" => {
                    serde_json::from_value(object).map(|o| rbac.cluster_roles.push(o))
                }
                "rolebindings" => serde_json::from_value(object).map(|o| rbac.bindings.push(o)),
                "clusterrolebindings" => {
                    serde_json::from_value(object).map(|o| rbac.cluster_bindings.push(o))
                }
                _ => Ok(()),
            };
            if let Err(e) = parsed {
                panic!("a stored {resource} object is not one: {e}");
            }
        }
        rbac
    }

    fn cluster_role(&self, name: &str) -> Option<&ClusterRole> {
        self.cluster_roles
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name))
    }

    /// The reason the RBAC authorizer gives when a binding allows
    /// `request`; `None` when none does (its "no opinion").
    fn allows(&self, who: &Requester, request: &Request) -> Option<String> {
        for binding in &self.cluster_bindings {
            let Some(subject) = applies(binding.subjects.as_deref(), who, "") else {
                continue;
            };
            let role = &binding.role_ref.name;
            let rules = self
                .cluster_role(role)
                .and_then(|r| r.rules.as_deref())
                .unwrap_or_default();
            if rules.iter().any(|rule| rule_allows(rule, request)) {
                return Some(format!(
                    "RBAC: allowed by ClusterRoleBinding {:?} of ClusterRole {role:?} to {} {:?}",
                    binding.metadata.name.as_deref().unwrap_or_default(),
                    subject.kind,
                    subject.name
                ));
            }
        }
        let namespace = request.namespace();
        if namespace.is_empty() {
            return None;
        }
        for binding in &self.bindings {
            if binding.metadata.namespace.as_deref() != Some(namespace) {
                continue;
            }
            let Some(subject) = applies(binding.subjects.as_deref(), who, namespace) else {
                continue;
            };
            let role = &binding.role_ref.name;
            let rules = match binding.role_ref.kind.as_str() {
                "Role" => self
                    .roles
                    .iter()
                    .find(|r| {
                        r.metadata.name.as_deref() == Some(role)
                            && r.metadata.namespace.as_deref() == Some(namespace)
                    })
                    .and_then(|r| r.rules.as_deref()),
                "ClusterRole" => self.cluster_role(role).and_then(|r| r.rules.as_deref()),
                _ => None,
            }
            .unwrap_or_default();
            if rules.iter().any(|rule| rule_allows(rule, request)) {
                return Some(format!(
                    "RBAC: allowed by RoleBinding \"{}/{namespace}\" of {} {role:?} to {} {:?}",
                    binding.metadata.name.as_deref().unwrap_or_default(),
                    binding.role_ref.kind,
                    subject.kind,
                    subject.name
                ));
            }
        }
        None
    }
}

/// The subject among `subjects` that is `who`: a User by name, a Group
/// among its groups, a ServiceAccount as the user
/// `system:serviceaccount:NAMESPACE:NAME` (the binding's namespace when
/// the subject names none).
fn applies<'s>(
    subjects: Option<&'s [Subject]>,
    who: &Requester,
    namespace: &str,
) -> Option<&'s Subject> {
    subjects
        .unwrap_or_default()
        .iter()
        .find(|s| match s.kind.as_str() {
            "User" => s.name == who.user,
            "Group" => who.groups.contains(&s.name),
            "ServiceAccount" => {
                let ns = s
                    .namespace
                    .as_deref()
                    .filter(|n| !n.is_empty())
                    .unwrap_or(namespace);
                who.user == format!("system:serviceaccount:{ns}:{}", s.name)
            }
            _ => false,
        })
}

/// Whether one rule allows `request`, as the RBAC authorizer's
/// `RuleAllows` decides: verbs, API groups, resources (`resource`,
/// `resource/subresource`, `*`, `*/subresource`) and resource names, or
/// non-resource URLs (`*` suffixes as prefixes).
fn rule_allows(rule: &PolicyRule, request: &Request) -> bool {
    let any = |list: Option<&[String]>, want: &str| {
        list.unwrap_or_default()
            .iter()
            .any(|item| item == "*" || item == want)
    };
    match request {
        Request::Resource(r) => {
            let verb = r.verb.as_deref().unwrap_or_default();
            let group = r.group.as_deref().unwrap_or_default();
            let resource = r.resource.as_deref().unwrap_or_default();
            let subresource = r.subresource.as_deref().unwrap_or_default();
            let combined = if subresource.is_empty() {
                resource.to_owned()
            } else {
                format!("{resource}/{subresource}")
            };
            let resource_matches = rule
                .resources
                .as_deref()
                .unwrap_or_default()
                .iter()
                .any(|rr| {
                    rr == "*"
                        || *rr == combined
                        || (!subresource.is_empty() && *rr == format!("*/{subresource}"))
                });
            let names = rule.resource_names.as_deref().unwrap_or_default();
            let name = r.name.as_deref().unwrap_or_default();
            any(Some(&rule.verbs), verb)
                && any(rule.api_groups.as_deref(), group)
                && resource_matches
                && (names.is_empty() || names.iter().any(|n| n == name))
        }
        Request::NonResource(n) => {
            let verb = n.verb.as_deref().unwrap_or_default();
            let path = n.path.as_deref().unwrap_or_default();
            any(Some(&rule.verbs), verb)
                && rule
                    .non_resource_urls
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .any(|url| {
                        url == "*"
                            || url == path
                            || url
                                .strip_suffix('*')
                                .is_some_and(|prefix| path.starts_with(prefix))
                    })
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn objects(yaml: &str) -> BTreeMap<Key, Value> {
        let server = super::super::Server::default();
        server.preload("pxe", yaml);
        let store = server.lock();
        store.objects.clone()
    }

    const RBAC: &str = "\
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: operator}
rules:
  - apiGroups: [pxe-agent.io]
    resources: [boothosts/api]
    verbs: [read, recover]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: one-host}
rules:
  - apiGroups: [pxe-agent.io]
    resources: [boothosts/api]
    verbs: [power]
    resourceNames: [n1]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: alice-operator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: operator}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: ops-one-host}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: one-host}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: ops}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: everything-api}
rules:
  - apiGroups: ['*']
    resources: ['*/api']
    verbs: ['*']
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: robot}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: everything-api}
subjects: [{kind: ServiceAccount, name: robot, namespace: infra}]
";

    fn review(user: &str, groups: &[&str], verb: &str, name: Option<&str>) -> Reply {
        let mut attributes = json!({
            "namespace": "pxe", "group": "pxe-agent.io", "resource": "boothosts",
            "subresource": "api", "verb": verb,
        });
        if let Some(name) = name {
            attributes["name"] = name.into();
        }
        let body = json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": attributes},
        });
        access_review(&objects(RBAC), body.to_string().as_bytes())
    }

    fn allowed(reply: Reply) -> bool {
        let Reply::Json(201, body) = reply else {
            panic!("not a 201");
        };
        body["status"]["allowed"].as_bool().expect("status.allowed")
    }

    #[test]
    fn rbac_decides_by_verb_subresource_name_and_subject() {
        assert!(allowed(review("alice", &[], "recover", Some("n1"))));
        assert!(allowed(review("alice", &[], "read", None)));
        assert!(!allowed(review("alice", &[], "power", Some("n1"))));
        assert!(!allowed(review("bob", &[], "read", None)));
        // resourceNames: one host, and never a call about all of them.
        assert!(allowed(review("bob", &["ops"], "power", Some("n1"))));
        assert!(!allowed(review("bob", &["ops"], "power", Some("n2"))));
        assert!(!allowed(review("bob", &["ops"], "power", None)));
        // `*/api` and `*` verbs, to a ServiceAccount of another namespace.
        assert!(allowed(review(
            "system:serviceaccount:infra:robot",
            &[],
            "reprovision",
            None
        )));
        assert!(!allowed(review(
            "system:serviceaccount:pxe:robot",
            &[],
            "read",
            None
        )));
        assert!(allowed(review("root", &["system:masters"], "power", None)));
    }

    #[test]
    fn the_reason_names_the_binding() {
        let Reply::Json(_, body) = review("alice", &[], "recover", Some("n1")) else {
            panic!("no body");
        };
        assert_eq!(
            body["status"]["reason"],
            "RBAC: allowed by RoleBinding \"alice-operator/pxe\" of Role \"operator\" to User \"alice\""
        );
        let Reply::Json(_, body) = review("bob", &[], "read", None) else {
            panic!("no body");
        };
        assert_eq!(body["status"], json!({"allowed": false}));
    }

    #[test]
    fn bad_reviews_are_refused_as_the_api_server_does() {
        let rbac = objects(RBAC);
        let code = |reply: Reply| match reply {
            Reply::Json(code, body) => (code, body["reason"].as_str().unwrap_or("").to_owned()),
            Reply::Watch(_) => panic!("a watch"),
        };
        assert_eq!(
            code(access_review(&rbac, b"{not json")),
            (400, "BadRequest".into())
        );
        assert_eq!(
            code(access_review(
                &rbac,
                br#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{}}"#
            )),
            (400, "BadRequest".into()),
            "another kind"
        );
        assert_eq!(
            code(access_review(
                &rbac,
                br#"{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"user":"a"}}"#
            )),
            (422, "Invalid".into())
        );
        assert_eq!(
            code(access_review(
                &rbac,
                br#"{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"nonResourceAttributes":{"path":"/x","verb":"get"}}}"#
            )),
            (422, "Invalid".into())
        );
        assert_eq!(
            code(token_review(
                &[],
                br#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{}}"#
            )),
            (400, "BadRequest".into())
        );
    }

    #[test]
    fn a_static_token_authenticates_its_user_with_the_authenticated_group() {
        let tokens = parse_token_file("# users\ntok-a,alice,u-1,\"ops,lab\"\ntok-b,bob,u-2\n")
            .expect("file");
        let review = |token: &str, audiences: Option<&[&str]>| {
            let mut body = json!({
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            });
            if let Some(a) = audiences {
                body["spec"]["audiences"] = json!(a);
            }
            match token_review(&tokens, body.to_string().as_bytes()) {
                Reply::Json(201, body) => body,
                _ => panic!("not a 201"),
            }
        };
        let alice = review("tok-a", None);
        assert_eq!(alice["status"]["authenticated"], true);
        assert_eq!(
            alice["status"]["user"],
            json!({"username": "alice", "uid": "u-1", "groups": ["ops", "lab", "system:authenticated"]})
        );
        assert_eq!(alice["status"]["audiences"], json!([API_AUDIENCE]));
        assert_eq!(alice["spec"]["token"], "tok-a", "the spec is echoed");
        assert_eq!(
            review("tok-b", None)["status"]["user"]["groups"],
            json!(["system:authenticated"])
        );
        assert_eq!(review("nope", None)["status"], json!({"user": {}}));
        assert_eq!(
            review("tok-a", Some(&["https://elsewhere"]))["status"],
            json!({"user": {}}),
            "a static token is not good for another audience"
        );
    }
}

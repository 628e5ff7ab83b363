//! `--api-auth kubernetes`: the agent's API callers are Kubernetes users,
//! their tokens checked with TokenReviews and their calls with
//! SubjectAccessReviews by the fake API server (`kube_api`), which judges
//! them by the example overlay's Roles (deploy/overlays/example) and the
//! bindings each test makes. The fake's answers are validated against the
//! Kubernetes 1.33 schemas as the manifests are.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use axum::http::{HeaderMap, Method};
use pxe_agent::api::{
    access::{Access, Refusal},
    gate::{Gate, Identities},
    kube_auth::Reviewer,
};
use serde_json::{Value, json};

use crate::{
    agent::{Scratch, Served},
    kube_api::{self, Server},
};

const NS: &str = "pxe";
/// The Kubernetes inventory fixtures: node-1 has a BMC (unreachable here).
const FIXTURES: &str = include_str!("../fixtures/kube/inventory.yaml");
const ALICE: &str = "alice-token-5f1c0a9e7d3b2468";
const BOB: &str = "bob-token-0e9d8c7b6a594837";
/// kube-apiserver's `--token-auth-file` lines.
const TOKENS: &str = "alice-token-5f1c0a9e7d3b2468,alice,u-alice,\"lab-ops\"\n\
                      bob-token-0e9d8c7b6a594837,bob,u-bob\n";

/// The example overlay's Roles, as an operator applies them.
fn operator_roles() -> String {
    let path = xtask::workspace_root().join("deploy/overlays/example/operator-rbac.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// alice bound to the example's `pxe-agent-operator`; bob to nothing.
const ALICE_BINDING: &str = "\
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: alice-pxe-agent-operator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: pxe-agent-operator}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}]
";

fn bearer(token: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    h
}

/// A kube-rs client of the fake at `addr`.
fn fake_client(addr: SocketAddr) -> kube::Client {
    let config = kube::Config::new(format!("http://{addr}").parse().expect("URL"));
    kube::Client::try_from(config).expect("client")
}

/// The fake in this process, holding the example Roles, alice's binding
/// and the tokens.
async fn fake() -> (SocketAddr, Arc<Server>) {
    let server = Arc::new(Server::default());
    server.preload(NS, &operator_roles());
    server.preload(NS, ALICE_BINDING);
    server.set_tokens(TOKENS);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(kube_api::serve(listener, server.clone()));
    (addr, server)
}

fn posts(server: &Server, resource: &str) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| {
            r["method"] == "POST" && r["path"].as_str().is_some_and(|p| p.ends_with(resource))
        })
        .count()
}

/// The agent's gate against the fake, no root needed: who passes, what
/// it answers the rest, and how often it asks.
#[tokio::test]
async fn the_gate_asks_the_api_server_and_keeps_its_answers_briefly() {
    let (addr, server) = fake().await;
    let reviewer = Reviewer::new(fake_client(addr), NS.into()).expect("reviewer");
    let gate = Gate::new(Identities::Kubernetes(Box::new(reviewer)));
    let peer: IpAddr = "10.66.0.9".parse().expect("ip");
    let recover = Access::of(&Method::POST, "/api/v1/hosts/node-1/recover");
    let read = Access::of(&Method::GET, "/api/v1/hosts");

    let alice = gate
        .admit(peer, &bearer(ALICE), &recover)
        .await
        .expect("alice");
    assert_eq!(alice.name, "alice");
    assert_eq!(alice.groups, ["lab-ops", "system:authenticated"]);
    assert!(gate.admit(peer, &bearer(ALICE), &read).await.is_ok());
    assert!(gate.admit(peer, &bearer(ALICE), &recover).await.is_ok());
    // One TokenReview for her three calls, one SubjectAccessReview per
    // kind of call.
    assert_eq!(posts(&server, "/tokenreviews"), 1);
    assert_eq!(posts(&server, "/subjectaccessreviews"), 2);

    assert_eq!(
        gate.admit(peer, &bearer(BOB), &recover).await,
        Err(Refusal::Forbidden)
    );
    assert_eq!(
        gate.admit(peer, &bearer(BOB), &read).await,
        Err(Refusal::Forbidden)
    );
    assert_eq!(
        gate.admit(peer, &bearer("no-such-token-anywhere"), &read)
            .await,
        Err(Refusal::Invalid)
    );
    assert_eq!(
        gate.admit(peer, &HeaderMap::new(), &read).await,
        Err(Refusal::Missing)
    );
    let counts: std::collections::HashMap<_, _> = gate.stats.snapshot().into_iter().collect();
    assert_eq!(
        (counts["forbidden"], counts["invalid"], counts["missing"]),
        (2, 1, 1)
    );
}

/// The fake's reviews, as the agent sends them and as the fake answers,
/// validate strictly against the Kubernetes 1.33 schemas.
#[tokio::test]
async fn the_fakes_reviews_validate_against_kubernetes_1_33() {
    let (addr, _server) = fake().await;
    let client = reqwestless::Client(addr);
    let token_review = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": ALICE},
    });
    let access_review = |user: &str| {
        json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "uid": "u-x",
                "groups": ["system:authenticated"],
                "resourceAttributes": {
                    "namespace": NS, "group": "pxe-agent.io", "resource": "boothosts",
                    "subresource": "api", "verb": "recover", "name": "node-1",
                },
            },
        })
    };
    let mut answers = Vec::new();
    for (path, body) in [
        (
            "/apis/authentication.k8s.io/v1/tokenreviews",
            token_review.clone(),
        ),
        (
            "/apis/authentication.k8s.io/v1/tokenreviews",
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                   "spec": {"token": "unknown"}}),
        ),
        (
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            access_review("alice"),
        ),
        (
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            access_review("bob"),
        ),
    ] {
        let (code, answer) = client.post(path, &body).await;
        assert_eq!(code, 201, "{path}: {answer}");
        answers.push(body);
        answers.push(answer);
    }
    assert_eq!(answers[3]["status"]["authenticated"], Value::Null);
    assert_eq!(answers[5]["status"]["allowed"], true);
    assert_eq!(answers[7]["status"]["allowed"], false);
    let (code, status) = client
        .post(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            &token_review,
        )
        .await;
    assert_eq!((code, status["kind"].as_str()), (400, Some("Status")));

    let scratch = Scratch::new("kauth-schema");
    let file = scratch.path("reviews.yaml");
    // kubernetes-validate names each object in its report by
    // metadata.name, which reviews do not have: one is added (a field
    // every ObjectMeta may hold).
    let named = |n: usize, object: &Value| {
        let mut object = object.clone();
        object["metadata"]["name"] = format!("review-{n}").into();
        serde_norway::to_string(&object).expect("yaml")
    };
    let docs: Vec<String> = answers
        .iter()
        .enumerate()
        .map(|(n, a)| named(n, a))
        .collect();
    std::fs::write(&file, docs.join("---\n")).expect("write");
    let (problems, passed) = crate::manifests::validate(&file);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(passed, answers.len());
    // The check can fail: a status field the schema does not have.
    let mut wrong = answers[5].clone();
    wrong["status"]["permitted"] = true.into();
    std::fs::write(&file, named(0, &wrong)).expect("write");
    let (problems, _) = crate::manifests::validate(&file);
    assert!(
        problems.iter().any(|p| p.contains("permitted")),
        "an unknown status field passed: {problems:?}"
    );
}

/// A tiny HTTP/1.1 client for the in-process fake.
mod reqwestless {
    use std::net::SocketAddr;

    use serde_json::Value;

    pub struct Client(pub SocketAddr);

    impl Client {
        pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
            let head = format!("POST {path} HTTP/1.1\r\ncontent-type: application/json");
            let (code, body) = crate::kube_api::tests::send(self.0, &head, &body.to_string()).await;
            (code, serde_json::from_str(&body).expect("JSON answer"))
        }
    }
}

/// `curl` in the agent's namespace with `token`: the status code and body.
fn call(served: &Served, method: &str, path: &str, token: &str) -> (u16, String) {
    let out = served
        .lab
        .cmd_in(served.lab.server_ns(), "curl")
        .args([
            "-sS",
            "--max-time",
            "60",
            "-X",
            method,
            "-w",
            "\n%{http_code}",
        ])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .arg(format!("http://{}{path}", crate::agent::API_ADDR))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn review_posts(served: &Served, resource: &str) -> usize {
    served
        .api()
        .log()
        .iter()
        .filter(|r| {
            r["method"] == "POST" && r["path"].as_str().is_some_and(|p| p.ends_with(resource))
        })
        .count()
}

#[test]
fn a_user_bound_to_the_example_operator_role_may_recover_others_get_403() {
    let mut served = Served::start_kube(
        "pxkauth",
        NS,
        &[
            "--api-auth",
            "kubernetes",
            "--bmc-boot-flag-echo",
            "device-only",
        ],
        |api| {
            api.put_yaml(NS, FIXTURES);
            api.put_yaml(NS, &operator_roles());
            api.put_yaml(NS, ALICE_BINDING);
            api.set_tokens(TOKENS);
        },
    );
    assert!(
        served.log().contains("TokenReview"),
        "the agent did not say how it checks callers:\n{}",
        served.log()
    );

    // Two quick reads by alice: one TokenReview, one SubjectAccessReview.
    let (code, hosts) = call(&served, "GET", "/api/v1/hosts", ALICE);
    assert_eq!(code, 200, "{hosts}\n{}", served.log());
    assert!(hosts.contains("node-1"), "{hosts}");
    assert_eq!(call(&served, "GET", "/api/v1/hosts", ALICE).0, 200);
    assert_eq!(review_posts(&served, "/tokenreviews"), 1);
    assert_eq!(review_posts(&served, "/subjectaccessreviews"), 1);

    // alice may recover node-1: past the gate, to the BMC (unreachable
    // here, which the answer and the audit entry say).
    let (code, answer) = call(&served, "POST", "/api/v1/hosts/node-1/recover", ALICE);
    println!("alice's recover: {code} {answer}");
    assert!(
        ![401, 403, 429, 503].contains(&code),
        "alice's recover was refused at the gate: {code} {answer}\n{}",
        served.log()
    );
    // bob is someone, with no binding: 403 to acting and to reading.
    assert_eq!(
        call(&served, "POST", "/api/v1/hosts/node-1/recover", BOB).0,
        403
    );
    assert_eq!(call(&served, "GET", "/api/v1/hosts", BOB).0, 403);
    // A token no one has: 401.
    assert_eq!(
        call(
            &served,
            "GET",
            "/api/v1/hosts",
            "garbage-token-garbage-token"
        )
        .0,
        401
    );

    let (code, audit) = call(&served, "GET", "/api/v1/audit", ALICE);
    assert_eq!(code, 200, "{audit}");
    println!("audit: {audit}");
    let entries: Vec<Value> = serde_json::from_str(&audit).expect("audit JSON");
    let recover = entries
        .iter()
        .find(|e| e["action"] == "recover" && e["host"] == "node-1")
        .unwrap_or_else(|| panic!("no recover entry in {audit}"));
    assert_eq!(recover["caller"], "alice", "{recover}");
    assert_eq!(
        recover["groups"],
        json!(["lab-ops", "system:authenticated"]),
        "{recover}"
    );

    let stats = served.stats();
    let failures = |reason: &str| {
        stats
            .get(&format!(
                "pxe_api_auth_failures_total{{reason=\"{reason}\"}}"
            ))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(
        (failures("forbidden"), failures("invalid")),
        (2, 1),
        "{stats:?}"
    );

    // The API server gone: a caller not seen yet cannot be checked (503),
    // and that is charged to no one.
    served.api.take();
    assert_eq!(
        call(
            &served,
            "GET",
            "/api/v1/hosts",
            "carol-token-never-seen-before"
        )
        .0,
        503
    );
    let log = served.log();
    for secret in [ALICE, BOB, "garbage-token", "carol-token"] {
        assert!(!log.contains(secret), "a token reached the agent's log");
    }
}

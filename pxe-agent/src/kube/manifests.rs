//! Manifest files read as the objects the API server would hold: the
//! BootNetworks, BootProfiles, BootHosts and BareMetalHosts of YAML files
//! (many documents a file, directories read file by file), each with the
//! file and line it starts at, and the Secrets among them. `check` builds
//! them with the Kubernetes source's own conversion and validation
//! (`document::build`), so a manifest it passes is one `--kube` accepts.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt, fs,
    path::{Path, PathBuf},
};

use k8s_openapi::api::core::v1::Secret;
use serde_json::Value;

use super::{
    document::{SECRET_PASSWORD, SECRET_USERNAME, SecretKeys, Snapshot},
    objects::{Kind, ObjRef},
};
use crate::bmc::Password;

/// Where an object's document starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    pub file: PathBuf,
    pub line: usize,
}

/// `deploy/examples/boothosts.yaml:23`.
impl fmt::Display for Located {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// What a set of manifest files holds.
#[derive(Debug, Default)]
pub struct Manifests {
    /// The objects as a rebuild reads them; `secrets` are the Secrets
    /// found among the manifests.
    pub snapshot: Snapshot<Value>,
    /// Where each object was read.
    pub located: BTreeMap<ObjRef, Located>,
    /// Documents that could not be read, and objects given twice.
    pub problems: Vec<(Located, String)>,
    /// Documents of other kinds (a Kustomization, a Service), not checked.
    pub other: usize,
    /// The Secrets the agent may read, from the RBAC of its DaemonSet's
    /// ServiceAccount; `None` when the manifests hold no DaemonSet.
    pub readable: Option<Readable>,
    rbac: Rbac,
}

/// Which Secrets a ServiceAccount may `get`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readable {
    All,
    /// These names only, and the roles that grant them.
    Only {
        names: BTreeSet<String>,
        roles: Vec<String>,
    },
}

impl Readable {
    pub fn allows(&self, name: &str) -> bool {
        match self {
            Readable::All => true,
            Readable::Only { names, .. } => names.contains(name),
        }
    }
}

/// The RBAC objects and DaemonSets read, to work out [`Readable`].
#[derive(Debug, Default)]
struct Rbac {
    /// ServiceAccounts DaemonSets run as.
    accounts: BTreeSet<String>,
    /// `(kind, name)` of a role to its rules.
    roles: BTreeMap<(String, String), Vec<Value>>,
    /// Bindings: the ServiceAccounts bound, and the role they bind.
    bindings: Vec<(BTreeSet<String>, (String, String))>,
}

impl Rbac {
    fn add(&mut self, kind: &str, object: &Value) -> bool {
        let name = || {
            object
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        match kind {
            "DaemonSet" => {
                let account = object
                    .pointer("/spec/template/spec/serviceAccountName")
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                self.accounts.insert(account.to_owned());
            }
            "Role" | "ClusterRole" => {
                let rules = object
                    .get("rules")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                self.roles.insert((kind.to_owned(), name()), rules);
            }
            "RoleBinding" | "ClusterRoleBinding" => {
                let accounts = object
                    .get("subjects")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter(|s| s.get("kind").and_then(Value::as_str) == Some("ServiceAccount"))
                    .filter_map(|s| s.get("name").and_then(Value::as_str))
                    .map(str::to_owned)
                    .collect();
                let role = |key: &str| {
                    object
                        .pointer(&format!("/roleRef/{key}"))
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned()
                };
                self.bindings.push((accounts, (role("kind"), role("name"))));
            }
            _ => return false,
        }
        true
    }

    /// What the DaemonSets' ServiceAccounts may read of Secrets.
    fn readable(&self) -> Option<Readable> {
        if self.accounts.is_empty() {
            return None;
        }
        let (mut names, mut roles) = (BTreeSet::new(), Vec::new());
        let has = |rule: &Value, key: &str, want: &str| {
            rule.get(key)
                .and_then(Value::as_array)
                .is_some_and(|v| v.iter().any(|x| x == want || x == "*"))
        };
        for (accounts, role) in &self.bindings {
            if accounts.is_disjoint(&self.accounts) {
                continue;
            }
            let rules = self.roles.get(role).map(Vec::as_slice).unwrap_or_default();
            for rule in rules {
                if !(has(rule, "resources", "secrets") && has(rule, "verbs", "get")) {
                    continue;
                }
                match rule.get("resourceNames").and_then(Value::as_array) {
                    None => return Some(Readable::All),
                    Some(list) => {
                        names.extend(list.iter().filter_map(Value::as_str).map(str::to_owned));
                        roles.push(format!("{} {}", role.0, role.1));
                    }
                }
            }
        }
        Some(Readable::Only { names, roles })
    }
}

impl Manifests {
    /// Reads `paths`: files, and the `.yaml` and `.yml` files of
    /// directories (not their subdirectories), in name order.
    pub fn read(paths: &[PathBuf]) -> Manifests {
        let mut out = Manifests::default();
        for file in files(paths, &mut out.problems) {
            match fs::read_to_string(&file) {
                Ok(text) => out.add_text(&file, &text),
                Err(e) => out.problems.push((
                    Located {
                        file: file.clone(),
                        line: 1,
                    },
                    format!("cannot be read: {e}"),
                )),
            }
        }
        out
    }

    /// Adds the documents of one file's text.
    pub fn add_text(&mut self, file: &Path, text: &str) {
        for (line, document) in documents(text) {
            let at = Located {
                file: file.to_path_buf(),
                line,
            };
            let value: Value = match serde_norway::from_str(document) {
                Ok(Value::Null) => continue,
                Ok(value) => value,
                Err(e) => {
                    self.problems
                        .push((at, format!("not a YAML document of one object: {e}")));
                    continue;
                }
            };
            self.add(at, value);
        }
    }

    fn add(&mut self, at: Located, object: Value) {
        let api_version = object.get("apiVersion").and_then(Value::as_str);
        let kind = object.get("kind").and_then(Value::as_str);
        let name = object.pointer("/metadata/name").and_then(Value::as_str);
        let kind = match (api_version, kind) {
            (Some("v1"), Some("Secret")) => {
                match name.map(|name| (name.to_owned(), secret_keys(&object))) {
                    Some((name, Ok(keys))) => {
                        self.snapshot.secrets.insert(name, keys);
                    }
                    Some((name, Err(e))) => self.problems.push((at, format!("Secret {name}: {e}"))),
                    None => self
                        .problems
                        .push((at, "Secret: metadata.name is required".into())),
                }
                return;
            }
            (Some(version), Some(kind)) => {
                let ours = Kind::ALL
                    .into_iter()
                    .find(|k| k.name() == kind && version == k.resource().api_version);
                if ours.is_none() && self.rbac.add(kind, &object) {
                    self.readable = self.rbac.readable();
                    return;
                }
                ours
            }
            _ => None,
        };
        let Some(kind) = kind else {
            self.other += 1;
            return;
        };
        if let Some(namespace) = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            && self.snapshot.namespace.is_empty()
        {
            self.snapshot.namespace = namespace.to_owned();
        }
        let Some(name) = name else {
            self.problems
                .push((at, format!("{}: metadata.name is required", kind.name())));
            return;
        };
        let objects = match kind {
            Kind::BootNetwork => &mut self.snapshot.networks,
            Kind::BootProfile => &mut self.snapshot.profiles,
            Kind::BootHost => &mut self.snapshot.hosts,
            Kind::BareMetalHost => &mut self.snapshot.bare_metal,
        };
        let object_ref = ObjRef::new(kind, name);
        if let Some(first) = self.located.get(&object_ref) {
            // The API server holds one object a name: the last applied.
            self.problems.push((
                at,
                format!("{object_ref} is also at {first}; an apply keeps only the last"),
            ));
            return;
        }
        objects.insert(name.to_owned(), object);
        self.located.insert(object_ref, at);
    }

    /// Adds the Secrets of `paths` (files or directories of Secret
    /// manifests); anything but a Secret there is a problem.
    pub fn add_secrets(&mut self, paths: &[PathBuf]) {
        let mut read = Manifests::read(paths);
        for (object, at) in std::mem::take(&mut read.located) {
            read.problems.push((
                at,
                format!("{object} is not a Secret (--secrets reads Secrets only)"),
            ));
        }
        self.snapshot.secrets.append(&mut read.snapshot.secrets);
        self.problems.append(&mut read.problems);
    }
}

/// The files of `paths`, directories read one level deep.
fn files(paths: &[PathBuf], problems: &mut Vec<(Located, String)>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for path in paths {
        if !path.is_dir() {
            out.push(path.clone());
            continue;
        }
        match fs::read_dir(path) {
            Ok(entries) => {
                let mut found: Vec<PathBuf> = entries
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| {
                        p.is_file() && p.extension().is_some_and(|e| e == "yaml" || e == "yml")
                    })
                    .collect();
                found.sort();
                out.extend(found);
            }
            Err(e) => problems.push((
                Located {
                    file: path.clone(),
                    line: 1,
                },
                format!("cannot be read: {e}"),
            )),
        }
    }
    out
}

/// The documents of a YAML stream, each with the line of its first line
/// that is neither blank nor a comment (1-based).
fn documents(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut first: Option<usize> = None;
    let mut offset = 0;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let bare = line.trim_end();
        if bare == "---" || bare.starts_with("--- ") {
            if let Some(first) = first.take() {
                out.push((first, &text[start..offset]));
            }
            start = offset + line.len();
        } else if first.is_none() && !bare.trim_start().is_empty() && !bare.starts_with('#') {
            first = Some(index + 1);
        }
        offset += line.len();
    }
    if let Some(first) = first {
        out.push((first, &text[start..]));
    }
    out
}

/// A Secret's `username` and `password` keys, from `data` (base64) or
/// `stringData`, as the API server would hold them.
fn secret_keys(object: &Value) -> Result<SecretKeys, String> {
    let secret: Secret =
        serde_json::from_value(object.clone()).map_err(|e| format!("not a valid Secret: {e}"))?;
    let key = |name: &str| -> Option<Vec<u8>> {
        secret
            .string_data
            .as_ref()
            .and_then(|d| d.get(name))
            .map(|s| s.as_bytes().to_vec())
            .or_else(|| {
                secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(name))
                    .map(|b| b.0.clone())
            })
    };
    Ok(SecretKeys {
        username: key(SECRET_USERNAME).and_then(|b| String::from_utf8(b).ok()),
        password: key(SECRET_PASSWORD).map(Password::new),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_start_at_their_first_line_of_content() {
        let text = "# a comment\napiVersion: v1\nkind: A\n---\n\n# b\nkind: B\n--- \n";
        let docs = documents(text);
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].0, 2);
        assert_eq!(docs[1].0, 7);
        assert!(docs[1].1.contains("kind: B"));
    }

    #[test]
    fn objects_are_read_by_kind_with_their_lines_and_secrets_decoded() {
        let text = "\
apiVersion: pxe-agent.io/v1alpha1
kind: BootHost
metadata: {name: node-1}
spec: {mac: \"52:54:00:00:00:01\", ip: 10.0.0.5, profile: p}
---
apiVersion: v1
kind: Secret
metadata: {name: bmc}
data: {username: YWRtaW4=, password: c2VjcmV0}
---
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
---
apiVersion: pxe-agent.io/v1alpha1
kind: BootHost
metadata: {name: node-1}
spec: {}
";
        let mut m = Manifests::default();
        m.add_text(Path::new("a.yaml"), text);
        assert_eq!(m.snapshot.hosts.len(), 1);
        assert_eq!(
            m.located[&ObjRef::new(Kind::BootHost, "node-1")].to_string(),
            "a.yaml:1"
        );
        let keys = &m.snapshot.secrets["bmc"];
        assert_eq!(keys.username.as_deref(), Some("admin"));
        assert_eq!(keys.password.as_ref().unwrap().expose(), b"secret");
        assert_eq!(m.other, 1);
        assert_eq!(m.problems.len(), 1, "{:?}", m.problems);
        assert_eq!(m.problems[0].0.line, 14);
        assert!(m.problems[0].1.contains("also at a.yaml:1"));
    }
}

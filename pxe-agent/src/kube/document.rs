//! From the cluster's objects to an inventory: each BootHost, BootProfile,
//! BootNetwork and selected BareMetalHost becomes its part of a document of
//! the inventory file's shape (camelCase keys turned into the file's
//! snake_case ones), which the file source's own validation checks, so the
//! messages are the file's. Problems are mapped back to the objects they
//! came from; those objects are refused and the rest validated again, so
//! one bad object never takes the others down. Owns that mapping and the
//! reading of BMC credentials from Secrets; not the watching, nor writing
//! anything back.

use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet, HashMap},
    ffi::OsString,
    hash::{DefaultHasher, Hash as _, Hasher as _},
    io,
    path::Path,
};

use serde_json::Value;
use serde_norway::Value as Yaml;

use super::objects::{
    ANNOTATION_IP, ANNOTATION_IPV6, ANNOTATION_PROFILE, ANNOTATION_UUID, AsObject, Kind, ObjRef,
};
use crate::{
    bmc::Password,
    inventory::{Inventory, LoadError, MOST_CHANGED, Problem, SecretSource, splice},
    mac::MacAddr,
};

/// The two keys of a BMC credentials Secret.
pub const SECRET_USERNAME: &str = "username";
pub const SECRET_PASSWORD: &str = "password";

/// A BMC credentials Secret as read: its `username` and `password` keys,
/// decoded. The password is only ever held as a [`Password`].
#[derive(Clone, Debug, Default)]
pub struct SecretKeys {
    pub username: Option<String>,
    pub password: Option<Password>,
}

/// Everything the inventory is built from: objects by name, as watched
/// (`O`: whole JSON, or as the source keeps them, `objects::Stored`).
#[derive(Clone, Debug)]
pub struct Snapshot<O = Value> {
    pub namespace: String,
    pub hosts: BTreeMap<String, O>,
    pub profiles: BTreeMap<String, O>,
    pub networks: BTreeMap<String, O>,
    pub bare_metal: BTreeMap<String, O>,
    /// The Secrets the objects name, by name; a name missing here was not
    /// found.
    pub secrets: BTreeMap<String, SecretKeys>,
}

impl<O> Default for Snapshot<O> {
    fn default() -> Self {
        Snapshot {
            namespace: String::new(),
            hosts: BTreeMap::new(),
            profiles: BTreeMap::new(),
            networks: BTreeMap::new(),
            bare_metal: BTreeMap::new(),
            secrets: BTreeMap::new(),
        }
    }
}

impl<O: AsObject> Snapshot<O> {
    /// The `credentialsName`s the objects refer to.
    pub fn secret_names(&self) -> BTreeSet<String> {
        secret_names(&self.hosts, &self.profiles, &self.bare_metal)
    }

    /// Networks first, then profiles, BootHosts and BareMetalHosts, each
    /// by name: the document's order.
    fn objects(&self) -> Vec<(ObjRef, &O)> {
        let mut out = Vec::new();
        for (kind, map) in [
            (Kind::BootNetwork, &self.networks),
            (Kind::BootProfile, &self.profiles),
            (Kind::BootHost, &self.hosts),
            (Kind::BareMetalHost, &self.bare_metal),
        ] {
            out.extend(map.iter().map(|(name, o)| (ObjRef::new(kind, name), o)));
        }
        out
    }

    /// What a build of these objects depends on, for a later [`patch`].
    pub fn basis(&self) -> Basis {
        let mut frame = DefaultHasher::new();
        self.namespace.hash(&mut frame);
        for map in [&self.networks, &self.profiles, &self.bare_metal] {
            map.len().hash(&mut frame);
            for (name, o) in map {
                (name, o.body_hash()).hash(&mut frame);
            }
        }
        // A Secret's username is read into the hosts' entries; a password
        // is checked by the patch itself (`inventory::splice`).
        for (name, keys) in &self.secrets {
            (name, &keys.username, keys.password.is_some()).hash(&mut frame);
        }
        Basis {
            frame: frame.finish(),
            hosts: self
                .hosts
                .iter()
                .map(|(name, o)| {
                    let mut h = DefaultHasher::new();
                    (name, o.body_hash()).hash(&mut h);
                    h.finish()
                })
                .collect(),
        }
    }
}

/// What the objects of a build that refused nothing were, so that the next
/// build, when only BootHosts changed, checks only those: a hash of all
/// but the BootHosts (networks, profiles, BareMetalHosts, the Secrets'
/// usernames) and one of each BootHost, in the inventory's host order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Basis {
    frame: u64,
    hosts: Vec<u64>,
}

/// The `credentialsName`s of these BootHosts, BootProfiles and
/// BareMetalHosts.
pub fn secret_names<O: AsObject>(
    hosts: &BTreeMap<String, O>,
    profiles: &BTreeMap<String, O>,
    bare_metal: &BTreeMap<String, O>,
) -> BTreeSet<String> {
    hosts
        .values()
        .chain(profiles.values())
        .chain(bare_metal.values())
        .filter_map(AsObject::credentials_name)
        .collect()
}

/// What a rebuild found.
#[derive(Debug)]
pub struct Built<P> {
    /// The inventory of the accepted objects, compiled; an error only when
    /// a problem could not be pinned on an object (the previous inventory
    /// then stays in force).
    pub result: Result<P, LoadError>,
    /// Refused objects with the problems that refused them (the file
    /// source's wording).
    pub refused: BTreeMap<ObjRef, Vec<String>>,
    /// Every object that is part of `result`.
    pub accepted: BTreeSet<ObjRef>,
    /// Accepted objects of which a part was left out, and why: a
    /// BootNetwork whose discovery names a refused BootProfile keeps its
    /// subnets, without discovery.
    pub degraded: BTreeMap<ObjRef, Vec<String>>,
}

/// Where each entry of the document came from: the hosts' by reference to
/// their parts (at fleet size a copy of each name would be megabytes).
#[derive(Default)]
struct Origins<'a> {
    subnets: Vec<ObjRef>,
    profiles: Vec<(String, ObjRef)>,
    hosts: Vec<(&'a ObjRef, &'a HostEntry)>,
    discovery: Option<ObjRef>,
    ipxe: Option<ObjRef>,
}

/// Turns a camelCase key into the file's snake_case (`uefiArm64` ->
/// `uefi_arm64`, `bootFile` -> `boot_file`).
pub fn snake(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 4);
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// A spec (or part of one) in the file's shape: keys snake_case, except
/// inside `labels` and `options`, whose keys are data. Option keys that are
/// numbers become integers, as the file writes them.
pub fn to_file_shape(value: &Value) -> Yaml {
    match value {
        Value::Object(map) => {
            let mut out = serde_norway::Mapping::new();
            for (k, v) in map {
                let key = snake(k);
                let converted = match key.as_str() {
                    "labels" => json_to_yaml(v, false),
                    "options" => json_to_yaml(v, true),
                    _ => to_file_shape(v),
                };
                out.insert(Yaml::String(key), converted);
            }
            Yaml::Mapping(out)
        }
        Value::Array(items) => Yaml::Sequence(items.iter().map(to_file_shape).collect()),
        other => json_to_yaml(other, false),
    }
}

/// JSON as YAML, keys verbatim; with `numeric_keys`, keys that are decimal
/// numbers become integers (only at the top level: option codes).
fn json_to_yaml(value: &Value, numeric_keys: bool) -> Yaml {
    match value {
        Value::Null => Yaml::Null,
        Value::Bool(b) => Yaml::Bool(*b),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                Yaml::Number(u.into())
            } else if let Some(i) = n.as_i64() {
                Yaml::Number(i.into())
            } else {
                Yaml::Number(n.as_f64().unwrap_or_default().into())
            }
        }
        Value::String(s) => Yaml::String(s.clone()),
        Value::Array(items) => {
            Yaml::Sequence(items.iter().map(|v| json_to_yaml(v, false)).collect())
        }
        Value::Object(map) => {
            let mut out = serde_norway::Mapping::new();
            for (k, v) in map {
                let key = match k.parse::<u64>() {
                    Ok(code) if numeric_keys => Yaml::Number(code.into()),
                    _ => Yaml::String(k.clone()),
                };
                out.insert(key, json_to_yaml(v, false));
            }
            Yaml::Mapping(out)
        }
    }
}

/// The `password_env` name the document gives a Secret's password; only
/// [`KubeSecrets`] answers it.
fn secret_var(name: &str) -> String {
    format!("kubernetes Secret {name}")
}

/// Passwords of the Secrets read, behind the inventory's secret mechanism:
/// they reach the BMC settings without passing through the document, a log
/// or a message.
struct KubeSecrets<'a>(&'a BTreeMap<String, SecretKeys>);

impl SecretSource for KubeSecrets<'_> {
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "password files are not read for the Kubernetes inventory ({})",
                path.display()
            ),
        ))
    }

    fn var(&self, name: &str) -> Option<OsString> {
        let secret = name.strip_prefix("kubernetes Secret ")?;
        let password = self.0.get(secret)?.password.as_ref()?;
        Some(OsString::from_vec(password.expose().to_vec()))
    }
}

use std::os::unix::ffi::OsStringExt as _;

/// The `bmc` block of a spec in the file's shape, its `credentialsName`
/// replaced by the Secret's user name and a reference to its password.
/// `Err` names the Secret and key that are missing, never a value.
fn bmc_block<O>(bmc: &Value, snapshot: &Snapshot<O>, field: &str) -> Result<Yaml, String> {
    let mut bmc = bmc.clone();
    let name = bmc
        .as_object_mut()
        .and_then(|m| m.remove("credentialsName"));
    let mut block = to_file_shape(&bmc);
    let Some(name) = name else {
        return Ok(block);
    };
    let Some(name) = name.as_str() else {
        return Err(format!(
            "{field}.credentialsName: must be the name of a Secret"
        ));
    };
    let ns = &snapshot.namespace;
    let Some(secret) = snapshot.secrets.get(name) else {
        return Err(format!(
            "{field}.credentialsName: Secret {ns}/{name} not found"
        ));
    };
    let missing =
        |key: &str| format!("{field}.credentialsName: Secret {ns}/{name} has no key {key:?}");
    let username = secret
        .username
        .clone()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| missing(SECRET_USERNAME))?;
    if secret
        .password
        .as_ref()
        .is_none_or(|p| p.expose().is_empty())
    {
        return Err(missing(SECRET_PASSWORD));
    }
    if let Yaml::Mapping(map) = &mut block {
        map.insert("username".into(), Yaml::String(username));
        map.insert("password_env".into(), Yaml::String(secret_var(name)));
    }
    Ok(block)
}

/// A spec as an object, or why not.
fn spec(object: &Value) -> Result<&serde_json::Map<String, Value>, String> {
    object
        .get("spec")
        .and_then(Value::as_object)
        .ok_or_else(|| "spec is required".to_owned())
}

/// One object's contribution, in the file's shape.
enum Part {
    Network {
        subnets: Vec<Yaml>,
        // Boxed, as the profile's entry: a fleet has a part a host, and
        // each is as large as the largest variant.
        discovery: Option<Box<Yaml>>,
        ipxe: Option<Box<Yaml>>,
    },
    Profile(Box<Yaml>),
    Host {
        entry: HostEntry,
        profile: String,
    },
}

/// A host's entry, once its shape is checked: YAML text (a fleet's
/// entries as parsed values would be kilobytes a host, all at once), and
/// the first MAC and host name validation labels it by.
struct HostEntry {
    yaml: Box<str>,
    mac: Option<MacAddr>,
    hostname: Option<String>,
}

/// A host's part, its entry's shape checked on its own.
fn host_part(entry: Yaml, profile: String) -> Result<Part, Vec<String>> {
    fits(&mapping(vec![
        ("subnets", Yaml::Sequence(Vec::new())),
        ("profiles", Yaml::Sequence(Vec::new())),
        ("hosts", Yaml::Sequence(vec![entry.clone()])),
    ]))?;
    let field = |k: &str| entry.get(k).and_then(Yaml::as_str).map(str::to_owned);
    // Validation labels a host by its first MAC, `mac` or `macs[0]`.
    let first_of_macs = || {
        entry
            .get("macs")
            .and_then(Yaml::as_sequence)
            .and_then(|s| s.first())
            .and_then(Yaml::as_str)
            .map(str::to_owned)
    };
    let mac = field("mac")
        .or_else(first_of_macs)
        .and_then(|m| m.parse::<MacAddr>().ok());
    let yaml =
        serde_norway::to_string(&entry).map_err(|e| vec![format!("spec does not fit: {e}")])?;
    Ok(Part::Host {
        entry: HostEntry {
            yaml: yaml.into(),
            mac,
            hostname: field("hostname"),
        },
        profile,
    })
}

/// Whether a document has the file's shape; the problem that refuses the
/// object when not.
fn fits(document: &Yaml) -> Result<(), Vec<String>> {
    Inventory::check_shape(document).map_err(|m| vec![format!("spec does not fit: {m}")])
}

fn mapping(pairs: Vec<(&str, Yaml)>) -> Yaml {
    let mut map = serde_norway::Mapping::new();
    for (k, v) in pairs {
        map.insert(Yaml::String(k.to_owned()), v);
    }
    Yaml::Mapping(map)
}

/// The document with only `part`, to check its shape on its own (a host's
/// is checked as it is made, [`host_part`]).
fn alone(part: &Part) -> Option<Yaml> {
    let empty = || Yaml::Sequence(Vec::new());
    match part {
        Part::Network {
            subnets,
            discovery,
            ipxe,
        } => {
            let mut pairs = vec![
                ("subnets", Yaml::Sequence(subnets.clone())),
                ("profiles", empty()),
                ("hosts", empty()),
            ];
            if let Some(d) = discovery {
                pairs.push(("discovery", (**d).clone()));
            }
            if let Some(i) = ipxe {
                pairs.push(("ipxe", (**i).clone()));
            }
            Some(mapping(pairs))
        }
        Part::Profile(p) => Some(mapping(vec![
            ("subnets", empty()),
            ("profiles", Yaml::Sequence(vec![(**p).clone()])),
            ("hosts", empty()),
        ])),
        Part::Host { .. } => None,
    }
}

/// The object's part of the document, or the problems that refuse it
/// before validation.
fn part_of<O>(at: &ObjRef, object: &Value, snapshot: &Snapshot<O>) -> Result<Part, Vec<String>> {
    let one = |m: String| vec![m];
    let part = match at.kind {
        Kind::BootNetwork => {
            let spec = spec(object).map_err(one)?;
            let subnets = match spec.get("subnets") {
                None => Vec::new(),
                Some(Value::Array(items)) => items.iter().map(to_file_shape).collect(),
                Some(_) => return Err(one("field subnets: must be a list".to_owned())),
            };
            Part::Network {
                subnets,
                discovery: spec.get("discovery").map(|d| Box::new(to_file_shape(d))),
                ipxe: spec.get("ipxe").map(|i| Box::new(to_file_shape(i))),
            }
        }
        Kind::BootProfile => {
            let spec = spec(object).map_err(one)?;
            let mut spec = spec.clone();
            let bmc = spec.remove("bmc");
            let mut entry = to_file_shape(&Value::Object(spec));
            if let Yaml::Mapping(map) = &mut entry {
                // The profile's name is the object's.
                map.insert("name".into(), Yaml::String(at.name.to_string()));
                if let Some(bmc) = bmc {
                    let block = bmc_block(&bmc, snapshot, "bmc").map_err(one)?;
                    map.insert("bmc".into(), block);
                }
            }
            Part::Profile(Box::new(entry))
        }
        Kind::BootHost => {
            let spec = spec(object).map_err(one)?;
            let mut spec = spec.clone();
            let bmc = spec.remove("bmc");
            let profile = spec
                .get("profile")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let mut entry = to_file_shape(&Value::Object(spec));
            if let (Yaml::Mapping(map), Some(bmc)) = (&mut entry, bmc) {
                let block = bmc_block(&bmc, snapshot, "bmc").map_err(one)?;
                map.insert("bmc".into(), block);
            }
            host_part(entry, profile)?
        }
        Kind::BareMetalHost => {
            let spec = spec(object).map_err(one)?;
            let annotation = |key: &str| {
                object
                    .pointer("/metadata/annotations")
                    .and_then(|a| a.get(key))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            let mut problems = Vec::new();
            let mac = spec.get("bootMACAddress").and_then(Value::as_str);
            if mac.is_none() {
                problems.push("spec.bootMACAddress is required to answer the host".to_owned());
            }
            let ip = annotation(ANNOTATION_IP);
            if ip.is_none() && annotation(ANNOTATION_IPV6).is_none() {
                problems.push(format!(
                    "annotation {ANNOTATION_IP} or {ANNOTATION_IPV6} is required: Metal3 has no \
                     field for the address the agent reserves the host"
                ));
            }
            let profile = annotation(ANNOTATION_PROFILE);
            if profile.is_none() {
                problems.push(format!(
                    "annotation {ANNOTATION_PROFILE} is required: the BootProfile the host boots"
                ));
            }
            let mut pairs = vec![
                ("mac", Yaml::String(mac.unwrap_or_default().to_owned())),
                ("hostname", Yaml::String(at.name.to_string())),
                ("profile", Yaml::String(profile.clone().unwrap_or_default())),
            ];
            if let Some(ip) = ip {
                pairs.push(("ip", Yaml::String(ip)));
            }
            // Checked as the file's `ipv6` and `uuid` are.
            for (key, annotation_key) in [("ipv6", ANNOTATION_IPV6), ("uuid", ANNOTATION_UUID)] {
                if let Some(value) = annotation(annotation_key) {
                    pairs.push((key, Yaml::String(value)));
                }
            }
            if let Some(bmc) = spec.get("bmc").and_then(Value::as_object) {
                let mut block = serde_json::Map::new();
                if let Some(a) = bmc.get("address") {
                    block.insert("address".into(), a.clone());
                }
                if let Some(c) = bmc.get("credentialsName") {
                    block.insert("credentialsName".into(), c.clone());
                }
                // Metal3's name for a BMC with a self-signed certificate.
                if let Some(v) = bmc.get("disableCertificateVerification") {
                    block.insert("insecure".into(), v.clone());
                }
                // Metal3's boot modes on the file's two.
                match spec.get("bootMode").and_then(Value::as_str) {
                    Some("UEFI" | "UEFISecureBoot") => {
                        block.insert("bootMode".into(), "uefi".into());
                    }
                    Some("legacy") => {
                        block.insert("bootMode".into(), "legacy".into());
                    }
                    Some(other) => problems.push(format!(
                        "spec.bootMode {other:?} is not one of UEFI, UEFISecureBoot, legacy"
                    )),
                    None => {}
                }
                match bmc_block(&Value::Object(block), snapshot, "spec.bmc") {
                    Ok(block) => pairs.push(("bmc", block)),
                    Err(m) => problems.push(m),
                }
            }
            if !problems.is_empty() {
                return Err(problems);
            }
            host_part(mapping(pairs), profile.unwrap_or_default())?
        }
    };
    if let Some(document) = alone(&part) {
        fits(&document)?;
    }
    Ok(part)
}

/// Builds, validates and prepares (`prepare`: compile the templates) the
/// inventory of the objects in `snapshot`, refusing the objects that have
/// problems and keeping the rest. `label` names the source in messages.
pub fn build<P, O: AsObject>(
    snapshot: &Snapshot<O>,
    label: &Path,
    prepare: &dyn Fn(Inventory, &Path) -> Result<P, LoadError>,
) -> Built<P> {
    let mut refused: BTreeMap<ObjRef, Vec<String>> = BTreeMap::new();
    let objects = snapshot.objects();
    // Sized up front: a list grown by doubling holds its old and new
    // buffers at once, at fleet size tens of megabytes.
    let mut parts: Vec<(ObjRef, Part)> = Vec::with_capacity(objects.len());
    for (at, object) in objects {
        // Parsed one at a time: the objects are kept as text.
        let object: Cow<'_, Value> = object.value();
        match part_of(&at, &object, snapshot) {
            Ok(part) => parts.push((at, part)),
            Err(problems) => {
                refused.insert(at, problems);
            }
        }
    }
    // At most one network sets discovery and ipxe: the first by name.
    let mut owner: BTreeMap<&str, ObjRef> = BTreeMap::new();
    for (at, part) in &parts {
        if let Part::Network {
            discovery, ipxe, ..
        } = part
        {
            for (key, set) in [("discovery", discovery.is_some()), ("ipxe", ipxe.is_some())] {
                if !set {
                    continue;
                }
                match owner.get(key) {
                    Some(first) => {
                        refused.entry(at.clone()).or_default().push(format!(
                            "field {key}: is already set by BootNetwork {}; at most one \
                             BootNetwork may set it",
                            first.name
                        ));
                    }
                    None => {
                        owner.insert(key, at.clone());
                    }
                }
            }
        }
    }
    // Each round refuses at least one more object or ends.
    for _ in 0..=parts.len() {
        cascade(&parts, &mut refused);
        let live: Vec<&(ObjRef, Part)> = parts
            .iter()
            .filter(|(at, _)| !refused.contains_key(at))
            .collect();
        let bad_profiles: BTreeSet<&str> = refused
            .keys()
            .filter(|at| at.kind == Kind::BootProfile)
            .map(|at| &*at.name)
            .collect();
        let (document, hosts, origins, degraded) = assemble(&live, &bad_profiles);
        let result =
            Inventory::from_parts(label, document, &hosts, &KubeSecrets(&snapshot.secrets))
                .and_then(|inv| prepare(inv, label));
        let problems = match result {
            Ok(prepared) => {
                return Built {
                    result: Ok(prepared),
                    accepted: live.iter().map(|(at, _)| at.clone()).collect(),
                    refused,
                    degraded,
                };
            }
            Err(LoadError::Invalid { problems, .. }) => problems,
            Err(e) => {
                return Built {
                    result: Err(e),
                    accepted: BTreeSet::new(),
                    refused,
                    degraded: BTreeMap::new(),
                };
            }
        };
        let mut pinned = 0;
        let mut unpinned = Vec::new();
        for problem in problems {
            match attribute(&problem, &origins) {
                Some(at) => {
                    refused.entry(at).or_default().push(problem.to_string());
                    pinned += 1;
                }
                None => unpinned.push(problem),
            }
        }
        if !unpinned.is_empty() || pinned == 0 {
            return Built {
                result: Err(LoadError::Invalid {
                    path: label.to_owned(),
                    problems: unpinned,
                }),
                accepted: BTreeSet::new(),
                refused,
                degraded: BTreeMap::new(),
            };
        }
    }
    Built {
        result: Err(LoadError::Invalid {
            path: label.to_owned(),
            problems: Vec::new(),
        }),
        accepted: BTreeSet::new(),
        refused,
        degraded: BTreeMap::new(),
    }
}

/// The build of `snapshot` made from `previous`, the inventory of the
/// objects `basis` describes (a build that refused nothing), when only
/// BootHosts changed since: the changed and added ones are checked in the
/// frame of the networks and profiles, the others keep their hosts, as a
/// reload of a file patches its changed entries (`inventory::splice`).
/// With it, the new basis. `None` when the patch cannot vouch for the
/// result, and [`build`] then reads every object: anything but BootHosts
/// changed, more than a quarter of them did, there are BareMetalHosts, or
/// a changed host has a problem (which a whole build pins on its object).
pub fn patch<P, O: AsObject>(
    snapshot: &Snapshot<O>,
    label: &Path,
    prepare: &dyn Fn(Inventory, &Path) -> Result<P, LoadError>,
    previous: &Inventory,
    basis: &Basis,
) -> Option<(Built<P>, Basis)> {
    if !snapshot.bare_metal.is_empty() {
        return None;
    }
    let now = snapshot.basis();
    if now.frame != basis.frame || basis.hosts.len() != previous.hosts.len() {
        return None;
    }
    // Each host hash covers its object's name: an object kept unchanged
    // is found wherever the others moved it.
    let was: HashMap<u64, usize> = basis
        .hosts
        .iter()
        .enumerate()
        .map(|(i, &h)| (h, i))
        .collect();
    let keep: Vec<Option<usize>> = now.hosts.iter().map(|h| was.get(h).copied()).collect();
    let changed: BTreeSet<usize> = (0..keep.len()).filter(|&i| keep[i].is_none()).collect();
    if changed.len() * MOST_CHANGED > now.hosts.len().max(1) {
        return None;
    }
    let mut parts = Vec::new();
    let frame = [
        (Kind::BootNetwork, &snapshot.networks),
        (Kind::BootProfile, &snapshot.profiles),
    ];
    for (kind, map) in frame {
        for (name, o) in map {
            let at = ObjRef::new(kind, name);
            let part = part_of(&at, &o.value(), snapshot).ok()?;
            parts.push((at, part));
        }
    }
    for (i, (name, o)) in snapshot.hosts.iter().enumerate() {
        if changed.contains(&i) {
            let at = ObjRef::new(Kind::BootHost, name);
            let part = part_of(&at, &o.value(), snapshot).ok()?;
            parts.push((at, part));
        }
    }
    let live: Vec<&(ObjRef, Part)> = parts.iter().collect();
    let (document, entries, _, degraded) = assemble(&live, &BTreeSet::new());
    if !degraded.is_empty() {
        return None;
    }
    let secrets = KubeSecrets(&snapshot.secrets);
    let fresh = Inventory::from_parts(label, document, &entries, &secrets).ok()?;
    let inventory = splice(previous, &keep, fresh, label, &secrets)?;
    let prepared = prepare(inventory, label).ok()?;
    let built = Built {
        result: Ok(prepared),
        refused: BTreeMap::new(),
        accepted: snapshot.objects().into_iter().map(|(at, _)| at).collect(),
        degraded: BTreeMap::new(),
    };
    Some((built, now))
}

/// Refuses the hosts whose profile is refused, saying so.
fn cascade(parts: &[(ObjRef, Part)], refused: &mut BTreeMap<ObjRef, Vec<String>>) {
    let bad: BTreeSet<String> = refused
        .keys()
        .filter(|at| at.kind == Kind::BootProfile)
        .map(|at| at.name.to_string())
        .collect();
    for (at, part) in parts {
        if let Part::Host { profile, .. } = part
            && bad.contains(profile)
            && !refused.contains_key(at)
        {
            refused.insert(
                at.clone(),
                vec![format!(
                    "field profile: BootProfile {profile} is refused, so its hosts are too"
                )],
            );
        }
    }
}

/// The document of the `live` parts but their host entries, those
/// entries, where each entry came from, and the networks whose discovery
/// was left out because it names one of `bad_profiles`.
fn assemble<'a>(
    live: &[&'a (ObjRef, Part)],
    bad_profiles: &BTreeSet<&str>,
) -> (
    Yaml,
    Vec<&'a str>,
    Origins<'a>,
    BTreeMap<ObjRef, Vec<String>>,
) {
    let mut degraded = BTreeMap::new();
    let mut origins = Origins {
        hosts: Vec::with_capacity(live.len()),
        ..Origins::default()
    };
    let (mut subnets, mut profiles) = (Vec::new(), Vec::new());
    let mut hosts = Vec::with_capacity(live.len());
    let (mut discovery, mut ipxe) = (None, None);
    for (at, part) in live {
        match part {
            Part::Network {
                subnets: s,
                discovery: d,
                ipxe: i,
            } => {
                for subnet in s {
                    subnets.push(subnet.clone());
                    origins.subnets.push(at.clone());
                }
                let refused_profile = d
                    .as_ref()
                    .and_then(|d| d.get("profile"))
                    .and_then(Yaml::as_str)
                    .filter(|p| bad_profiles.contains(p));
                if let Some(profile) = refused_profile {
                    degraded.insert(
                        at.clone(),
                        vec![format!(
                            "field discovery.profile: BootProfile {profile} is refused, so \
                             discovery is off; the subnets are served"
                        )],
                    );
                } else if let Some(d) = d {
                    discovery = Some((**d).clone());
                    origins.discovery = Some(at.clone());
                }
                if let Some(i) = i {
                    ipxe = Some((**i).clone());
                    origins.ipxe = Some(at.clone());
                }
            }
            Part::Profile(p) => {
                profiles.push((**p).clone());
                origins.profiles.push((at.name.to_string(), at.clone()));
            }
            Part::Host { entry, .. } => {
                origins.hosts.push((at, entry));
                hosts.push(&*entry.yaml);
            }
        }
    }
    let mut pairs = vec![
        ("subnets", Yaml::Sequence(subnets)),
        ("profiles", Yaml::Sequence(profiles)),
        ("hosts", Yaml::Sequence(Vec::new())),
    ];
    if let Some(d) = discovery {
        pairs.push(("discovery", d));
    }
    if let Some(i) = ipxe {
        pairs.push(("ipxe", i));
    }
    (mapping(pairs), hosts, origins, degraded)
}

/// The object a problem is about: by the host it names (the label
/// validation gives it), or by the `subnets[i]`, `profiles[...]`,
/// `discovery` or `ipxe` its field starts with.
fn attribute(problem: &Problem, origins: &Origins) -> Option<ObjRef> {
    if let Some(label) = &problem.host {
        // Later hosts carry duplicate problems: the last match wins.
        return origins
            .hosts
            .iter()
            .enumerate()
            .rev()
            .find(|(index, (_, entry))| {
                let name = entry
                    .hostname
                    .as_deref()
                    .map(|h| h.escape_debug().to_string());
                let labels = [
                    match (entry.mac, &name) {
                        (Some(mac), Some(name)) => Some(format!("{name} ({mac})")),
                        (Some(mac), None) => Some(mac.to_string()),
                        _ => None,
                    },
                    Some(match &name {
                        Some(name) => format!("{name} (hosts[{index}])"),
                        None => format!("hosts[{index}]"),
                    }),
                ];
                labels.iter().flatten().any(|l| l == label)
            })
            .map(|(_, (at, _))| (*at).clone());
    }
    let field = problem.field.as_str();
    let indexed = |prefix: &str| -> Option<&str> {
        let rest = field.strip_prefix(prefix)?.strip_prefix('[')?;
        rest.split_once(']').map(|(inside, _)| inside)
    };
    if let Some(inside) = indexed("subnets") {
        return inside
            .parse::<usize>()
            .ok()
            .and_then(|i| origins.subnets.get(i).cloned());
    }
    if let Some(inside) = indexed("profiles") {
        if let Ok(i) = inside.parse::<usize>()
            && let Some((_, at)) = origins.profiles.get(i)
        {
            return Some(at.clone());
        }
        return origins
            .profiles
            .iter()
            .find(|(name, _)| name.escape_debug().to_string() == inside)
            .map(|(_, at)| at.clone());
    }
    if field == "discovery" || field.starts_with("discovery.") {
        return origins.discovery.clone();
    }
    if field == "ipxe" || field.starts_with("ipxe.") {
        return origins.ipxe.clone();
    }
    None
}

#[cfg(test)]
mod tests;

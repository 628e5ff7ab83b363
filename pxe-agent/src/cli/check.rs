//! `pxe-agent check`: inventory files validated and compiled as `run`
//! would, and Kubernetes manifests as `run --kube` would read them from
//! the API server, without running.

use std::{
    fmt::Write as _,
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::ExitCode,
};

use pxe_agent::{
    bmc::Password,
    dhcp::{Server, template::Compiled},
    inventory::{self, Inventory, LoadError, Locator, Problem, served_files},
    kube::{
        document::{self, SecretKeys},
        manifests::{Manifests, Readable},
    },
    rollout,
    xdp::Capacity,
};

/// `pxe-agent check PATH... [--secrets PATH]...`: each inventory file, and
/// the manifests among `paths` as one namespace's objects. One line for
/// each that passes, every problem of those that do not (and a failure).
/// Where `run` would serve files from: `--boot-root` and `--artifacts`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Roots<'a> {
    pub boot_root: Option<&'a Path>,
    pub artifacts: Option<&'a Path>,
}

impl Roots<'_> {
    /// The files `inv` names that are missing under the roots given; each
    /// printed. True when none is.
    fn hold(&self, label: &Path, inv: &Inventory) -> bool {
        let named = served_files::named(inv);
        let missing = served_files::missing(&named, self.boot_root, self.artifacts);
        for problem in &missing {
            eprintln!("{}: {problem}", label.display());
        }
        missing.is_empty()
    }
}

pub fn check(
    paths: &[PathBuf],
    secrets: &[PathBuf],
    roots: Roots<'_>,
    server_ip: Option<Ipv4Addr>,
    map_capacity: Option<u32>,
) -> anyhow::Result<ExitCode> {
    let server = Server {
        ip: server_ip.unwrap_or(Ipv4Addr::BROADCAST),
        mac: [0; 6],
    };
    let (manifests, files): (Vec<PathBuf>, Vec<PathBuf>) =
        paths.iter().cloned().partition(|p| is_manifest(p));
    let mut ok = true;
    for file in &files {
        ok &= check_file(file, &server, roots, map_capacity);
    }
    if !manifests.is_empty() || !secrets.is_empty() {
        ok &= check_manifests(&manifests, secrets, &server, roots, map_capacity);
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// A directory, or a file with a document that has an `apiVersion`: an
/// inventory file has none.
fn is_manifest(path: &Path) -> bool {
    path.is_dir()
        || fs::read_to_string(path)
            .is_ok_and(|text| text.lines().any(|l| l.starts_with("apiVersion:")))
}

/// Compiles `inv` for `server` and checks it against the maps' limits.
fn compile(
    inv: Inventory,
    label: &Path,
    server: &Server,
    map_capacity: Option<u32>,
) -> Result<(Inventory, Compiled, Capacity), LoadError> {
    let (inv, mut compiled) = rollout::compile_each(
        inv,
        label,
        std::slice::from_ref(server),
        inventory::DEFAULT_HTTP_PORT,
    )?;
    let compiled = compiled.pop().expect("one server, one compiled inventory");
    let capacity = Capacity::for_inventory([&compiled], map_capacity);
    capacity
        .fits(&compiled, inv.hosts.len())
        .map_err(|problem| LoadError::Invalid {
            path: label.to_path_buf(),
            problems: vec![problem],
        })?;
    Ok((inv, compiled, capacity))
}

fn summary(inv: &Inventory, compiled: &Compiled, capacity: &Capacity) -> String {
    format!(
        "ok, {} hosts, {} compiled replies sharing {} bodies, maps for {} host entries",
        inv.hosts.len(),
        compiled.replies(),
        compiled.bodies.len(),
        capacity.hosts
    )
}

fn check_file(file: &Path, server: &Server, roots: Roots<'_>, map_capacity: Option<u32>) -> bool {
    match Inventory::load(file).and_then(|inv| compile(inv, file, server, map_capacity)) {
        Ok((inv, compiled, capacity)) => {
            println!(
                "{}: {}",
                file.display(),
                summary(&inv, &compiled, &capacity)
            );
            roots.hold(file, &inv)
        }
        Err(LoadError::Invalid { path, problems }) => {
            eprint!("{}", located(&path, &problems));
            false
        }
        Err(e) => {
            eprintln!("{e}");
            false
        }
    }
}

/// One line a problem, `file:line:` where the file shows the entry it
/// names (a host, a subnet, a profile or one of its rules) or its
/// top-level key, `file:` otherwise. Two entries with one label (a MAC
/// given twice, no host names) point at the later, which validation
/// blames.
fn located(path: &Path, problems: &[Problem]) -> String {
    let locator = fs::read_to_string(path)
        .map(|text| Locator::new(&text))
        .unwrap_or_default();
    let mut out = String::new();
    for problem in problems {
        let _ = match locator.line(problem) {
            Some(line) => writeln!(out, "{}:{line}: {problem}", path.display()),
            None => writeln!(out, "{}: {problem}", path.display()),
        };
    }
    out
}

/// The manifests built as the Kubernetes source builds the API server's
/// objects; each refused object's problems with its file and line.
fn check_manifests(
    paths: &[PathBuf],
    secrets: &[PathBuf],
    server: &Server,
    roots: Roots<'_>,
    map_capacity: Option<u32>,
) -> bool {
    let mut read = Manifests::read(paths);
    read.add_secrets(secrets);
    if read.snapshot.namespace.is_empty() {
        read.snapshot.namespace = "default".to_owned();
    }
    let named = read.snapshot.secret_names();
    let given = !secrets.is_empty() || !read.snapshot.secrets.is_empty();
    let mut ok = true;
    let mut unread = Vec::new();
    for name in &named {
        // What the agent's ServiceAccount may not get, it cannot read:
        // the objects naming it are refused as they would be in the cluster.
        if let Some(readable) = &read.readable
            && !readable.allows(name)
        {
            read.snapshot.secrets.remove(name);
            let granted = match readable {
                Readable::Only { names, roles } if !roles.is_empty() => format!(
                    "{}: get on Secrets {} only",
                    roles.join(", "),
                    names.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
                _ => "no role grants get on Secrets".to_owned(),
            };
            eprintln!("Secret {name}: the agent's ServiceAccount may not read it ({granted})");
            ok = false;
        } else if !given {
            // Nothing to check them against: taken as readable, and said so.
            let keys = SecretKeys {
                username: Some(name.clone()),
                password: Some(Password::new(b"not read".to_vec())),
            };
            read.snapshot.secrets.insert(name.clone(), keys);
            unread.push(name.as_str());
        }
    }
    let label = PathBuf::from(
        paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    );
    let built = document::build(&read.snapshot, &label, &|inv, label: &Path| {
        compile(inv, label, server, map_capacity)
    });
    ok &= read.problems.is_empty() && built.refused.is_empty();
    for (at, problem) in &read.problems {
        eprintln!("{at}: {problem}");
    }
    for (object, problems) in &built.refused {
        let at = read
            .located
            .get(object)
            .map_or_else(|| label.display().to_string(), ToString::to_string);
        for problem in problems {
            eprintln!("{at}: {object}: {problem}");
        }
    }
    for (object, problems) in &built.degraded {
        let at = read.located.get(object).map(ToString::to_string);
        for problem in problems {
            eprintln!(
                "{}: {object}: warning: {problem}",
                at.as_deref().unwrap_or("?")
            );
        }
    }
    match built.result {
        Ok((inv, compiled, capacity)) => {
            println!(
                "{}: {} objects, {} other documents; {}",
                label.display(),
                read.located.len(),
                read.other,
                summary(&inv, &compiled, &capacity)
            );
            ok &= roots.hold(&label, &inv);
        }
        Err(e) => {
            eprintln!("{e}");
            ok = false;
        }
    }
    if !unread.is_empty() {
        println!(
            "BMC credentials not checked: no Secrets given (--secrets) for {}",
            unread.join(", ")
        );
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `check` prints for an invalid inventory of `text`, and the
    /// path it was written to (since removed).
    fn check_output(name: &str, text: &str) -> (String, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("pxe-check-{name}-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("inventory.yaml");
        fs::write(&file, text).expect("write");
        let Err(LoadError::Invalid { path, problems }) = Inventory::load(&file) else {
            panic!("the inventory is valid");
        };
        let out = located(&path, &problems);
        fs::remove_dir_all(&dir).expect("clean up");
        (out, file)
    }

    #[test]
    fn a_hosts_problems_name_the_line_of_its_entry() {
        let text = "\
subnets:
  - cidr: 10.66.0.0/16
profiles:
  - name: p
hosts:
  - mac: 52:54:00:00:00:01
    ip: 10.66.1.1
    profile: p

  # the second
  - mac: 52:54:00:00:00:02
    hostname: two
    ip: 10.99.1.1
    profile: p
  - macs: [52:54:00:00:00:01]
    ip: 10.66.1.3
    profile: nope
";
        let (out, file) = check_output("lines", text);
        let at = |line: usize| format!("{}:{line}: ", file.display());
        assert!(
            out.lines().any(|l| l.starts_with(&at(11))
                && l.contains("two (52:54:00:00:00:02)")
                && l.contains("field ip")),
            "{out}"
        );
        assert!(
            out.lines()
                .any(|l| l.starts_with(&at(15)) && l.contains("field profile")),
            "{out}"
        );
    }

    #[test]
    fn subnet_and_profile_problems_name_the_line_of_their_entry() {
        let text = "\
subnets:
  - cidr: 10.66.0.0/16
  # the second, with a bad option
  - cidr: 10.67.0.0/16
    options: {3: notanip}
profiles:
  - name: p

  # between profiles
  - name: q
    options: {53: 1}
hosts: []
";
        let (out, file) = check_output("entries", text);
        let at = |line: usize| format!("{}:{line}: ", file.display());
        assert!(
            out.lines()
                .any(|l| l.starts_with(&at(4)) && l.contains("field subnets[1].options.3")),
            "{out}"
        );
        assert!(
            out.lines()
                .any(|l| l.starts_with(&at(10)) && l.contains("field profiles[q].options.53")),
            "{out}"
        );
    }
}

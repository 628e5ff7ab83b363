//! A throw-away network lab: a server namespace and one or more client
//! namespaces joined by veth pairs, torn down on drop.
//!
//! The lab owns its namespaces, their veths and their `/etc/netns/<ns>`
//! directories; it never touches the machine's own interfaces or files.
//! Processes started in it belong to the caller (see [`ChildGuard`]).
//!
//! Namespaces are named `<prefix>-<pid>-<n>-<role>`; [`Lab::new`] first
//! removes leftovers of the same prefix whose owning process has died.

use std::{
    ffi::OsStr,
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{Context as _, ensure};

use crate::process::run;
pub use crate::process::{ChildGuard, ensure_root};

/// The server end's address when none is given.
pub const DEFAULT_SERVER_CIDR: &str = "10.66.0.1/16";
/// The server end of the first veth pair, inside the server namespace.
pub const SERVER_IF: &str = "pxsrv0";
/// The client end of every veth pair, inside its client namespace.
pub const CLIENT_IF: &str = "pxcli0";

/// Where `ip netns exec` finds a namespace's own resolver file.
const NETNS_ETC: &str = "/etc/netns";

/// Labs created by this process so far; keeps names unique per process.
static SEQ: AtomicU32 = AtomicU32::new(0);

/// One veth pair: `server_if` in the server namespace, `client_if` in `client_ns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub client_ns: String,
    pub server_if: String,
    pub client_if: String,
}

/// A server namespace and client namespaces joined by veth pairs.
///
/// ```no_run
/// let lab = xtask::Lab::new("pxdoc")?;
/// lab.run_in(lab.server_ns(), &["ip", "addr"])?;
/// # anyhow::Ok(())
/// ```
#[derive(Debug)]
pub struct Lab {
    base: String,
    server_ns: String,
    links: Vec<Link>,
    /// Every namespace created so far, deleted in reverse order on drop.
    namespaces: Vec<String>,
}

/// Queues of the first veth pair: the server end's transmit queues and the
/// client end's receive queues (each receive queue has its own ring and
/// NAPI). One each unless a lab asks for more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queues {
    pub server_tx: u32,
    pub client_rx: u32,
}

impl Default for Queues {
    fn default() -> Queues {
        Queues {
            server_tx: 1,
            client_rx: 1,
        }
    }
}

impl Lab {
    /// Creates a lab whose server end has [`DEFAULT_SERVER_CIDR`].
    pub fn new(prefix: &str) -> anyhow::Result<Self> {
        Self::new_with(prefix, DEFAULT_SERVER_CIDR)
    }

    /// Creates a lab whose server end has `server_cidr` (e.g. `10.66.0.1/16`).
    pub fn new_with(prefix: &str, server_cidr: &str) -> anyhow::Result<Self> {
        Self::new_with_queues(prefix, server_cidr, Queues::default())
    }

    /// [`Lab::new_with`] with `queues` on the first veth pair.
    pub fn new_with_queues(
        prefix: &str,
        server_cidr: &str,
        queues: Queues,
    ) -> anyhow::Result<Self> {
        ensure_root()?;
        validate_prefix(prefix)?;
        remove_stale(prefix);
        let base = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let server_ns = format!("{base}-srv");
        // Built before anything exists so that Drop cleans up whatever the
        // `?`s below leave half-made.
        let mut lab = Self {
            base,
            server_ns: server_ns.clone(),
            links: Vec::new(),
            namespaces: Vec::new(),
        };
        lab.create_ns(&server_ns)?;
        lab.connect_client("cli", SERVER_IF, queues)?;
        lab.run_ip(&["addr", "add", server_cidr, "dev", SERVER_IF])
            .with_context(|| format!("failed to assign {server_cidr} to {SERVER_IF}"))?;
        Ok(lab)
    }

    /// The server namespace.
    pub fn server_ns(&self) -> &str {
        &self.server_ns
    }

    /// The first client namespace.
    pub fn client_ns(&self) -> &str {
        &self.links[0].client_ns
    }

    /// The server end of the first veth pair (the agent's interface).
    pub fn server_if(&self) -> &str {
        &self.links[0].server_if
    }

    /// The client end of the first veth pair.
    pub fn client_if(&self) -> &str {
        &self.links[0].client_if
    }

    /// Every veth pair, the first one created by [`Lab::new`] first.
    pub fn links(&self) -> &[Link] {
        &self.links
    }

    /// Adds a client namespace `<base>-<name>` with its own veth pair to the
    /// server namespace (server end `pxsrv<N>`, no address; client end
    /// [`CLIENT_IF`]).
    pub fn add_client_ns(&mut self, name: &str) -> anyhow::Result<Link> {
        validate_prefix(name)?;
        let server_if = format!("pxsrv{}", self.links.len());
        ensure!(
            server_if.len() <= 15,
            "too many client namespaces in one lab"
        );
        self.connect_client(name, &server_if, Queues::default())
    }

    /// Sets the MAC address of the first client end.
    pub fn set_client_mac(&self, mac: &str) -> anyhow::Result<()> {
        let (ns, iface) = (self.client_ns(), self.client_if());
        self.run_in(ns, &["ip", "link", "set", "dev", iface, "address", mac])
            .with_context(|| format!("failed to set {iface} address to {mac}"))?;
        Ok(())
    }

    /// A command that runs `program` inside `ns` (`ip netns exec <ns> program`).
    pub fn cmd_in(&self, ns: &str, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(program);
        cmd
    }

    /// Runs `args` (program first) inside `ns` to completion and returns its
    /// stdout; fails with its stderr when it exits unsuccessfully.
    pub fn run_in(&self, ns: &str, args: &[&str]) -> anyhow::Result<String> {
        let (program, rest) = args.split_first().context("run_in needs a program")?;
        run(self.cmd_in(ns, program).args(rest))
    }

    fn run_ip(&self, args: &[&str]) -> anyhow::Result<String> {
        run(Command::new("ip").args(["-n", &self.server_ns]).args(args))
    }

    fn create_ns(&mut self, ns: &str) -> anyhow::Result<()> {
        run(Command::new("ip").args(["netns", "add", ns]))
            .with_context(|| format!("failed to create namespace {ns}"))?;
        self.namespaces.push(ns.to_owned());
        // DHCP client scripts rewrite /etc/resolv.conf, which is not per
        // namespace; `ip netns exec` bind-mounts this file over it instead.
        let dir = Path::new(NETNS_ETC).join(ns);
        fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
        fs::write(dir.join("resolv.conf"), "")
            .with_context(|| format!("failed to write {}/resolv.conf", dir.display()))?;
        run(Command::new("ip").args(["-n", ns, "link", "set", "lo", "up"]))
            .with_context(|| format!("failed to bring up lo in {ns}"))?;
        Ok(())
    }

    fn connect_client(
        &mut self,
        role: &str,
        server_if: &str,
        queues: Queues,
    ) -> anyhow::Result<Link> {
        let client_ns = format!("{}-{role}", self.base);
        self.create_ns(&client_ns)?;
        // Created inside the server namespace with the peer placed straight
        // into the client one, so no name ever appears in the host namespace.
        // veth takes queue counts only when both ends name both; the
        // counts not asked for go back to one afterwards.
        let most = queues.server_tx.max(queues.client_rx).to_string();
        let counts = ["numtxqueues", &most, "numrxqueues", &most];
        let mut add = vec!["link", "add", server_if];
        add.extend(counts);
        add.extend(["type", "veth", "peer", "name", CLIENT_IF]);
        add.extend(counts);
        add.extend(["netns", &client_ns]);
        self.run_ip(&add)
            .with_context(|| format!("failed to create veth {server_if}/{CLIENT_IF}"))?;
        if queues != Queues::default() {
            let (server_tx, client_rx) =
                (queues.server_tx.to_string(), queues.client_rx.to_string());
            // The client end's transmit count first: veth refuses fewer
            // receive queues on one end than transmit queues on the other.
            let steps = [
                (client_ns.as_str(), CLIENT_IF, ["tx", "1", "rx", &client_rx]),
                (
                    self.server_ns.as_str(),
                    server_if,
                    ["rx", "1", "tx", &server_tx],
                ),
            ];
            for (ns, iface, set) in steps {
                let mut cmd = vec!["ethtool", "-L", iface];
                cmd.extend(set);
                self.run_in(ns, &cmd)
                    .with_context(|| format!("failed to set {iface}'s queues in {ns}"))?;
            }
        }
        self.run_ip(&["link", "set", server_if, "up"])
            .with_context(|| format!("failed to bring up {server_if}"))?;
        run(Command::new("ip").args(["-n", &client_ns, "link", "set", CLIENT_IF, "up"]))
            .with_context(|| format!("failed to bring up {CLIENT_IF} in {client_ns}"))?;
        // XDP_TX on a veth only reaches the peer when the peer runs NAPI;
        // GRO on the peer is the documented way to get it. On kernel 6.18
        // that alone still lost the replies silently (the sender counted
        // rx_queue_0_xdp_tx, the peer received nothing); an XDP program on
        // the peer (`pxe-agent veth-peer`) delivers them. See docs/veth.md.
        self.run_in(&client_ns, &["ethtool", "-K", CLIENT_IF, "gro", "on"])
            .with_context(|| format!("failed to enable GRO on {CLIENT_IF} in {client_ns}"))?;
        let link = Link {
            client_ns,
            server_if: server_if.to_owned(),
            client_if: CLIENT_IF.to_owned(),
        };
        self.links.push(link.clone());
        Ok(link)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Deleting a namespace destroys the veth ends inside it.
        for ns in self.namespaces.iter().rev() {
            if let Err(err) = delete_ns(ns) {
                let _ = writeln!(std::io::stderr(), "warning: {err:#}");
            }
        }
    }
}

/// Prefixes and client names become part of namespace names and are parsed
/// back by the stale-lab cleaner.
fn validate_prefix(prefix: &str) -> anyhow::Result<()> {
    let valid = !prefix.is_empty()
        && prefix.len() <= 32
        && prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    ensure!(
        valid,
        "invalid lab name {prefix:?}: use 1-32 lowercase letters or digits"
    );
    Ok(())
}

fn delete_ns(ns: &str) -> anyhow::Result<()> {
    let netns = run(Command::new("ip").args(["netns", "delete", ns]))
        .with_context(|| format!("failed to delete namespace {ns}"));
    let dir = PathBuf::from(NETNS_ETC).join(ns);
    let etc = match fs::remove_dir_all(&dir) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            Err(err).with_context(|| format!("failed to remove {}", dir.display()))
        }
        _ => Ok(()),
    };
    netns.and(etc)
}

/// Deletes namespaces named `<prefix>-<pid>-…` whose pid is no longer alive,
/// left behind by runs that were killed before their labs dropped.
fn remove_stale(prefix: &str) {
    let Ok(listing) = run(Command::new("ip").args(["netns", "list"])) else {
        return;
    };
    for ns in stale_namespaces(&listing, prefix, pid_alive) {
        let _ = writeln!(std::io::stderr(), "removing stale namespace {ns}");
        if let Err(err) = delete_ns(&ns) {
            let _ = writeln!(std::io::stderr(), "warning: {err:#}");
        }
    }
}

/// Parses `ip netns list` output ("name" or "name (id: N)" per line).
fn stale_namespaces(listing: &str, prefix: &str, alive: impl Fn(u32) -> bool) -> Vec<String> {
    listing
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|ns| owner_pid(ns, prefix).is_some_and(|pid| !alive(pid)))
        .map(str::to_owned)
        .collect()
}

/// The pid encoded in `<prefix>-<pid>-<n>-<role>`, if `ns` has that shape.
fn owner_pid(ns: &str, prefix: &str) -> Option<u32> {
    let rest = ns.strip_prefix(prefix)?.strip_prefix('-')?;
    let mut parts = rest.splitn(3, '-');
    let pid = parts.next()?.parse().ok()?;
    parts.next()?.parse::<u32>().ok()?;
    parts.next().filter(|role| !role.is_empty())?;
    Some(pid)
}

fn pid_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_parses_lab_names_only() {
        assert_eq!(owner_pid("pxdemo-123-0-srv", "pxdemo"), Some(123));
        assert_eq!(owner_pid("pxdemo-123-4-extra1", "pxdemo"), Some(123));
        assert_eq!(owner_pid("pxdemo-123-srv", "pxdemo"), None);
        assert_eq!(owner_pid("pxdemox-123-0-srv", "pxdemo"), None);
        assert_eq!(owner_pid("other-123-0-srv", "pxdemo"), None);
        assert_eq!(owner_pid("pxdemo-abc-0-srv", "pxdemo"), None);
    }

    #[test]
    fn stale_namespaces_skips_live_owners_and_other_prefixes() {
        let listing = "pxt-10-0-cli (id: 3)\npxt-10-0-srv (id: 2)\npxt-20-0-srv\nfoo-10-0-srv\n";
        let stale = stale_namespaces(listing, "pxt", |pid| pid == 20);
        assert_eq!(stale, ["pxt-10-0-cli", "pxt-10-0-srv"]);
    }

    #[test]
    fn prefixes_must_be_plain_names() {
        assert!(validate_prefix("pxdemo").is_ok());
        assert!(validate_prefix("").is_err());
        assert!(validate_prefix("px-demo").is_err());
        assert!(validate_prefix("px/demo").is_err());
    }
}

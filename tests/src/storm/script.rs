//! The iPXE script as the simulator reads it: the `kernel` and `initrd`
//! URLs (relative ones resolved against the script's URL) and the
//! phone-home token on the kernel line.

use anyhow::{Context as _, bail};

/// An `http://host:port/path` URL, all the simulator fetches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    /// `host[:port]` as written, for the Host header.
    pub authority: String,
    /// Where to connect.
    pub addr: std::net::SocketAddrV4,
    /// Path with query, starting with `/`.
    pub path: String,
}

impl Url {
    /// Parses an absolute `http://` URL with an IPv4 host.
    pub fn parse(text: &str) -> anyhow::Result<Url> {
        let rest = text
            .strip_prefix("http://")
            .with_context(|| format!("{text:?} is not an http:// URL"))?;
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, "/"),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) => (
                host,
                port.parse()
                    .with_context(|| format!("bad port in {text:?}"))?,
            ),
            None => (authority, 80),
        };
        let ip = host
            .parse()
            .with_context(|| format!("{text:?}: host is not an IPv4 address"))?;
        Ok(Url {
            authority: authority.to_owned(),
            addr: std::net::SocketAddrV4::new(ip, port),
            path: path.to_owned(),
        })
    }

    /// `reference` resolved against this URL (absolute, or a path: RFC 3986
    /// in the forms iPXE scripts use).
    pub fn join(&self, reference: &str) -> anyhow::Result<Url> {
        if reference.contains("://") {
            return Url::parse(reference);
        }
        let path = if reference.starts_with('/') {
            reference.to_owned()
        } else {
            let base = self.path.split('?').next().unwrap_or("/");
            let dir = &base[..base.rfind('/').map_or(0, |at| at + 1)];
            format!("{dir}{reference}")
        };
        Ok(Url {
            path,
            ..self.clone()
        })
    }
}

/// What a script asks the machine to load.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// The kernel.
    pub kernel: Url,
    /// The initrds, in order.
    pub initrds: Vec<Url>,
    /// `pxe_agent.token=VALUE` from the kernel line.
    pub token: Option<String>,
}

/// Reads the `kernel` and `initrd` lines of the script fetched from `base`.
pub fn parse(body: &str, base: &Url) -> anyhow::Result<Plan> {
    if !body.trim_start().starts_with("#!ipxe") {
        bail!("not an iPXE script");
    }
    let mut kernel = None;
    let mut token = None;
    let mut initrds = Vec::new();
    for line in body.lines() {
        let mut words = line.split_whitespace();
        let Some(cmd) = words.next() else { continue };
        if cmd != "kernel" && cmd != "initrd" {
            continue;
        }
        let args: Vec<&str> = words.collect();
        let (uri, rest) = uri_of(&args).with_context(|| format!("no URL in {line:?}"))?;
        if uri.contains("${") {
            bail!("iPXE settings are not supported: {uri}");
        }
        let url = base.join(uri)?;
        if cmd == "kernel" {
            token = rest
                .iter()
                .find_map(|a| a.strip_prefix("pxe_agent.token="))
                .map(str::to_owned);
            kernel = Some(url);
        } else {
            initrds.push(url);
        }
    }
    Ok(Plan {
        kernel: kernel.context("the script loads no kernel")?,
        initrds,
        token,
    })
}

/// The URI among `kernel`/`initrd` arguments (after `--name N` style
/// options) and the words after it.
fn uri_of<'a>(args: &'a [&'a str]) -> Option<(&'a str, &'a [&'a str])> {
    let mut at = 0;
    while let Some(arg) = args.get(at) {
        if *arg == "--name" || *arg == "-n" {
            at += 2;
        } else if arg.starts_with('-') {
            at += 1;
        } else {
            return Some((arg, &args[at + 1..]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_initrd_and_token_resolve_against_the_script() {
        let base = Url::parse("http://10.64.0.1:8080/boot/02:57:00:00:00:01.ipxe").expect("url");
        let plan = parse(
            "#!ipxe\ndhcp\nkernel /artifacts/vmlinuz console=ttyS0 pxe_agent.token=7-abc\n\
             initrd --name init initrd.img\ninitrd http://10.64.0.9/x.img\nboot\n",
            &base,
        )
        .expect("parses");
        assert_eq!(plan.kernel.path, "/artifacts/vmlinuz");
        assert_eq!(plan.token.as_deref(), Some("7-abc"));
        assert_eq!(plan.initrds[0].path, "/boot/initrd.img");
        assert_eq!(plan.initrds[1].addr.to_string(), "10.64.0.9:80");
    }

    #[test]
    fn settings_and_missing_kernels_fail_clearly() {
        let base = Url::parse("http://10.64.0.1/s").expect("url");
        let err = parse("#!ipxe\nkernel ${base}/vmlinuz\n", &base).expect_err("settings");
        assert!(err.to_string().contains("not supported"), "{err}");
        assert!(parse("#!ipxe\nboot\n", &base).is_err());
        assert!(parse("<html>", &base).is_err());
    }
}

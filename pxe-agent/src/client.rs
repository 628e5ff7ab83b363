//! The command line's client of a running agent: where its API and
//! metrics listeners are, the caller's bearer token, TLS for an https://
//! API (verifying the agent's certificate as [`Trust`] says, and telling
//! plainly why a certificate is refused), and one HTTP/1.0 request a
//! connection (the answer runs until the agent closes, so there are no
//! chunks to decode).

use std::{
    io::{self, BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream, ToSocketAddrs},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::Context as _;
use rustls::{
    CertificateError, ClientConfig, ClientConnection, StreamOwned, pki_types::ServerName,
};

use crate::trust::{self, Trust, TrustError};

/// Where `pxe-agent run` serves its JSON API unless told otherwise.
pub const DEFAULT_API: &str = "http://127.0.0.1:9465";
/// Where it serves `/metrics` and `/healthz` unless told otherwise.
pub const DEFAULT_METRICS: &str = "127.0.0.1:9464";

/// How long a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the agent may take to answer a TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The running agent's API, as the caller reaches it.
#[derive(Clone, Debug)]
pub struct Api {
    /// `host:port` of the listener.
    authority: String,
    /// For an https:// API.
    tls: Option<Tls>,
    token: Option<String>,
}

/// How an https:// API is reached.
#[derive(Clone, Debug)]
struct Tls {
    config: Arc<ClientConfig>,
    /// What the certificate must name: the URL's host, a DNS name or an
    /// IP address (which needs an IP subjectAltName).
    name: ServerName<'static>,
    trust: Trust,
}

impl Api {
    /// `url` is `https://HOST:PORT`, `http://HOST:PORT` or a bare
    /// `HOST:PORT`; `token_file` holds the bearer token (a bare token, or a
    /// `name token` line of the agent's token file); `trust` says which
    /// certificates an https:// API may present (it is unused for http).
    pub fn new(url: &str, token_file: Option<&Path>, trust: Trust) -> anyhow::Result<Api> {
        let (https, authority) = match url.split_once("://") {
            None => (false, url),
            Some(("http", rest)) => (false, rest),
            Some(("https", rest)) => (true, rest),
            Some((scheme, _)) => anyhow::bail!("--agent {url:?}: unknown scheme {scheme:?}"),
        };
        let authority = authority.trim_end_matches('/').to_string();
        let Some((host, _)) = authority
            .rsplit_once(':')
            .filter(|(_, p)| p.parse::<u16>().is_ok())
        else {
            anyhow::bail!(
                "--agent {url:?} is not HOST:PORT, http://HOST:PORT or https://HOST:PORT"
            );
        };
        let tls = if https {
            Some(Tls::new(host, trust)?)
        } else {
            None
        };
        let token = token_file.map(read_token).transpose()?;
        Ok(Api {
            authority,
            tls,
            token,
        })
    }

    /// A connection to the API; over TLS, handshaken already, so that a
    /// refused certificate is told as such.
    fn connect(&self, read_timeout: Option<Duration>) -> anyhow::Result<Conn> {
        let Some(tls) = &self.tls else {
            return Ok(Conn::Plain(connect(&self.authority, read_timeout)?));
        };
        let mut tcp = connect(&self.authority, Some(HANDSHAKE_TIMEOUT))?;
        let mut session = ClientConnection::new(tls.config.clone(), tls.name.clone())
            .context("failed to start a TLS session")?;
        session
            .complete_io(&mut tcp)
            .map_err(|e| tls.refusal(&self.authority, e))?;
        tcp.set_read_timeout(read_timeout)?;
        Ok(Conn::Tls(Box::new(StreamOwned::new(session, tcp))))
    }

    /// `method path` with an optional JSON body: the status code and the
    /// body.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<(u16, String)> {
        // BMC calls wait for the sequencer and their own deadlines.
        let mut conn = self.connect(Some(Duration::from_secs(300)))?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        conn.send(&format!(
            "{method} {path} HTTP/1.0\r\nHost: {}\r\n{}Content-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            self.authority,
            self.auth_header(),
            body.len()
        ))?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer)
            .with_context(|| format!("failed to read the answer to {path}"))?;
        let (head, page) = answer
            .split_once("\r\n\r\n")
            .context("malformed HTTP response")?;
        Ok((status_of(head)?, page.to_string()))
    }

    /// The body of `GET path`; an answer other than 200 is an error that
    /// carries the agent's reason.
    pub fn get(&self, path: &str) -> anyhow::Result<String> {
        let (status, page) = self.request("GET", path, None)?;
        anyhow::ensure!(
            status == 200,
            "agent answered {path} with {status}: {}{}",
            page.trim(),
            hint(status, self.token.is_some())
        );
        Ok(page)
    }

    /// `GET path` as a stream of lines, once the agent answered 200.
    pub fn stream(&self, path: &str) -> anyhow::Result<impl BufRead + use<>> {
        let mut conn = self.connect(None)?;
        conn.send(&format!(
            "GET {path} HTTP/1.0\r\nHost: {}\r\n{}\r\n",
            self.authority,
            self.auth_header()
        ))?;
        let mut reader = BufReader::new(conn);
        let mut head = String::new();
        reader.read_line(&mut head)?;
        let mut line = String::new();
        while reader.read_line(&mut line)? > 0 && !line.trim_end().is_empty() {
            line.clear();
        }
        let status = status_of(&head)?;
        if status != 200 {
            let mut body = String::new();
            let _ = reader.read_to_string(&mut body);
            anyhow::bail!(
                "agent refused {path}: {status} {}{}",
                body.trim_end(),
                hint(status, self.token.is_some())
            );
        }
        Ok(reader)
    }

    /// Where the API is, for messages.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    fn auth_header(&self) -> String {
        self.token
            .as_deref()
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default()
    }
}

impl Tls {
    fn new(host: &str, trust: Trust) -> anyhow::Result<Tls> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .with_context(|| format!("--agent: {host:?} is not a host name or an IP address"))?;
        let config = trust::client_config(&trust).map_err(|e| match e {
            TrustError::NoSystemRoots => anyhow::anyhow!(
                "no --ca-file and no system CA certificates: give the CA that signed the \
                 agent's certificate with --ca-file FILE"
            ),
            e => e.into(),
        })?;
        if trust == Trust::Insecure {
            eprintln!(
                "warning: --insecure: the agent's certificate is not verified; whoever answers \
                 gets the token"
            );
        }
        Ok(Tls {
            config: Arc::new(config),
            name,
            trust,
        })
    }

    /// Why the handshake with `authority` failed, in plain words.
    fn refusal(&self, authority: &str, e: io::Error) -> anyhow::Error {
        let tls = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        let what = match tls {
            Some(rustls::Error::InvalidCertificate(cert)) => self.certificate_refused(cert),
            Some(rustls::Error::InvalidMessage(_)) => format!(
                "{authority} does not answer in TLS: is the API plain http? \
                 (--agent http://{authority})"
            ),
            Some(rustls::Error::AlertReceived(alert)) => {
                format!("the agent refused the TLS handshake ({alert:?})")
            }
            Some(other) => other.to_string(),
            None if e.kind() == io::ErrorKind::UnexpectedEof => {
                "the agent closed the connection during the TLS handshake".to_string()
            }
            None => {
                return anyhow::Error::new(e)
                    .context(format!("TLS handshake with {authority} failed"));
            }
        };
        anyhow::anyhow!("TLS handshake with {authority} failed: {what}")
    }

    fn certificate_refused(&self, e: &CertificateError) -> String {
        let name = self.name.to_str();
        let detail = rustls::Error::InvalidCertificate(e.clone());
        match e {
            CertificateError::UnknownIssuer => match &self.trust {
                Trust::CaFile(path) => format!(
                    "the agent's certificate is not trusted: no CA of {} signed it",
                    path.display()
                ),
                _ => "the agent's certificate is not trusted: no system CA signed it; give \
                      the CA that did with --ca-file FILE"
                    .to_string(),
            },
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                format!(
                    "the agent's certificate is not valid for {name} (a name mismatch; an IP \
                     address needs an IP subjectAltName): {detail}"
                )
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                format!("the agent's certificate has expired: {detail}")
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                format!(
                    "the agent's certificate is not valid yet (are the clocks right?): {detail}"
                )
            }
            _ => format!("the agent's certificate is refused: {detail}"),
        }
    }
}

/// A connection to the agent, plain or TLS.
enum Conn {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Conn {
    /// Writes a whole request.
    fn send(&mut self, request: &str) -> io::Result<()> {
        self.write_all(request.as_bytes())?;
        self.flush()
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(c) => c.read(buf),
            Conn::Tls(c) => c.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(c) => c.write(buf),
            Conn::Tls(c) => c.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(c) => c.flush(),
            Conn::Tls(c) => c.flush(),
        }
    }
}

/// What to do about a refusal.
fn hint(status: u16, has_token: bool) -> &'static str {
    match (status, has_token) {
        (401, false) => " (give a token: --token-file FILE or $PXE_AGENT_TOKEN_FILE)",
        _ => "",
    }
}

fn status_of(head: &str) -> anyhow::Result<u16> {
    anyhow::ensure!(head.starts_with("HTTP/1."), "malformed HTTP response");
    head.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("malformed HTTP status line")
}

fn connect(authority: &str, read_timeout: Option<Duration>) -> anyhow::Result<TcpStream> {
    let down = || format!("no agent answering on {authority} (is `pxe-agent run` up?)");
    let addrs: Vec<SocketAddr> = authority
        .to_socket_addrs()
        .with_context(|| format!("failed to resolve {authority}"))?
        .collect();
    let mut last = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(conn) => {
                conn.set_read_timeout(read_timeout)?;
                return Ok(conn);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => anyhow::Error::new(e).context(down()),
        None => anyhow::anyhow!(down()),
    })
}

/// The body of `GET /metrics` from the metrics listener at `addr`.
pub fn metrics(addr: SocketAddr) -> anyhow::Result<String> {
    let mut conn = connect(&addr.to_string(), Some(Duration::from_secs(5)))?;
    write!(conn, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)
        .context("failed to read /metrics")?;
    let (head, page) = answer
        .split_once("\r\n\r\n")
        .context("malformed HTTP response")?;
    let status = status_of(head)?;
    anyhow::ensure!(status == 200, "agent answered /metrics with {status}");
    Ok(page.to_string())
}

/// The token file from `flag`, else from $PXE_AGENT_TOKEN_FILE.
pub fn token_file(flag: Option<&Path>) -> Option<PathBuf> {
    flag.map(PathBuf::from)
        .or_else(|| std::env::var_os("PXE_AGENT_TOKEN_FILE").map(PathBuf::from))
}

/// The bearer token in `path`: the last field of its first line that is
/// not blank nor a comment, so both a bare token and the agent's
/// `name token` line work.
fn read_token(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read the token file {}", path.display()))?;
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .and_then(|l| l.split_whitespace().last())
        .map(str::to_string)
        .with_context(|| format!("token file {} holds no token", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(url: &str) -> anyhow::Result<Api> {
        Api::new(url, None, Trust::System)
    }

    #[test]
    fn api_urls_are_http_https_or_bare_authorities() {
        assert_eq!(
            api("http://127.0.0.1:9465/").expect("ok").authority(),
            "127.0.0.1:9465"
        );
        assert_eq!(
            api("agent.example:9465").expect("ok").authority(),
            "agent.example:9465"
        );
        assert!(api("agent.example:9465").expect("ok").tls.is_none());
        assert!(api("ftp://127.0.0.1:9465").is_err());
        assert!(api("http://127.0.0.1").is_err());
    }

    #[test]
    fn an_https_api_is_checked_against_its_host_name_or_address() {
        let name = |url: &str| api(url).expect("ok").tls.expect("tls").name;
        assert_eq!(
            name("https://127.0.0.1:9465"),
            ServerName::try_from("127.0.0.1").expect("ip")
        );
        assert_eq!(
            name("https://[::1]:9465/"),
            ServerName::try_from("::1").expect("ip")
        );
        assert_eq!(
            name("https://agent.example:9465"),
            ServerName::try_from("agent.example").expect("dns")
        );
        assert!(api("https://bad_name!:9465").is_err());
        let err = Api::new(
            "https://127.0.0.1:9465",
            None,
            Trust::CaFile("/nonexistent/pxe-ca.pem".into()),
        )
        .expect_err("no CA file");
        assert!(err.to_string().contains("/nonexistent/pxe-ca.pem"), "{err}");
    }
}

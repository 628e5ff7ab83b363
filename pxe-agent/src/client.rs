//! The command line's client of a running agent: where its API and
//! metrics listeners are, the caller's bearer token, and one HTTP/1.0
//! request a connection (the answer runs until the agent closes, so there
//! are no chunks to decode).

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream, ToSocketAddrs},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;

/// Where `pxe-agent run` serves its JSON API unless told otherwise.
pub const DEFAULT_API: &str = "http://127.0.0.1:9465";
/// Where it serves `/metrics` and `/healthz` unless told otherwise.
pub const DEFAULT_METRICS: &str = "127.0.0.1:9464";

/// How long a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The running agent's API, as the caller reaches it.
#[derive(Clone, Debug)]
pub struct Api {
    /// `host:port` of the listener.
    authority: String,
    token: Option<String>,
}

impl Api {
    /// `url` is `http://HOST:PORT` or a bare `HOST:PORT`; `token_file`
    /// holds the bearer token (a bare token, or a `name token` line of the
    /// agent's token file).
    pub fn new(url: &str, token_file: Option<&Path>) -> anyhow::Result<Api> {
        let authority = match url.split_once("://") {
            None => url,
            Some(("http", rest)) => rest,
            Some((scheme, _)) => anyhow::bail!("--api {url:?}: unknown scheme {scheme:?}"),
        };
        let authority = authority.trim_end_matches('/').to_string();
        anyhow::ensure!(
            authority
                .rsplit_once(':')
                .is_some_and(|(_, p)| p.parse::<u16>().is_ok()),
            "--api {url:?} is not HOST:PORT or http://HOST:PORT"
        );
        let token = token_file.map(read_token).transpose()?;
        Ok(Api { authority, token })
    }

    fn connect(&self, read_timeout: Option<Duration>) -> anyhow::Result<TcpStream> {
        connect(&self.authority, read_timeout)
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
        write!(
            conn,
            "{method} {path} HTTP/1.0\r\nHost: {}\r\n{}Content-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            self.authority,
            self.auth_header(),
            body.len()
        )?;
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
        write!(
            conn,
            "GET {path} HTTP/1.0\r\nHost: {}\r\n{}\r\n",
            self.authority,
            self.auth_header()
        )?;
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

    #[test]
    fn api_urls_are_http_or_bare_authorities() {
        assert_eq!(
            Api::new("http://127.0.0.1:9465/", None)
                .expect("ok")
                .authority(),
            "127.0.0.1:9465"
        );
        assert_eq!(
            Api::new("agent.example:9465", None)
                .expect("ok")
                .authority(),
            "agent.example:9465"
        );
        assert!(Api::new("ftp://127.0.0.1:9465", None).is_err());
        assert!(Api::new("http://127.0.0.1", None).is_err());
    }
}

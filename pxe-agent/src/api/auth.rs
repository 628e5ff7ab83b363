//! Bearer tokens for the endpoints that act on hardware: loaded from a file
//! of `name token` lines, compared in constant time, and turned into the
//! caller's name for the audit log. A token never leaves this module: not
//! in errors, logs or answers.

use std::{fmt, path::Path};

use axum::http::{HeaderMap, header::AUTHORIZATION};

use crate::http::token::constant_time_eq;

/// Shortest token accepted: 128 bits of hex or base64.
const MIN_TOKEN_LEN: usize = 22;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("failed to read the token file {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("token file {path}, line {line}: {reason}")]
    Line {
        path: String,
        line: usize,
        reason: String,
    },
    #[error("token file {path} holds no token")]
    Empty { path: String },
}

/// A token, which never prints.
#[derive(Clone)]
struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The tokens callers may present, each with the name the audit log uses.
#[derive(Clone, Debug)]
pub struct Tokens(Vec<(String, Secret)>);

impl Tokens {
    /// Reads `path`: one `name token` pair a line; blank lines and lines
    /// starting with `#` are skipped. Names must be unique, tokens at least
    /// 22 characters.
    pub fn load(path: &Path) -> Result<Tokens, TokenError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| TokenError::Read {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        Tokens::parse(&shown, &text)
    }

    fn parse(path: &str, text: &str) -> Result<Tokens, TokenError> {
        let mut out: Vec<(String, Secret)> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |reason: &str| TokenError::Line {
                path: path.to_string(),
                line: n + 1,
                reason: reason.to_string(),
            };
            let mut parts = line.split_whitespace();
            let (Some(name), Some(token), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad("expected `name token`"));
            };
            if token.len() < MIN_TOKEN_LEN {
                return Err(bad(&format!(
                    "the token of {name:?} is shorter than {MIN_TOKEN_LEN} characters"
                )));
            }
            if out.iter().any(|(seen, _)| seen == name) {
                return Err(bad(&format!("{name:?} is named twice")));
            }
            out.push((name.to_string(), Secret(token.as_bytes().to_vec())));
        }
        if out.is_empty() {
            return Err(TokenError::Empty {
                path: path.to_string(),
            });
        }
        Ok(Tokens(out))
    }

    /// The name of the token in `Authorization: Bearer <token>`, if it is
    /// one of ours. Every token is compared, each in time that depends only
    /// on the lengths, so the answer's timing says nothing of which prefix
    /// matched.
    pub fn caller(&self, headers: &HeaderMap) -> Option<&str> {
        let presented = bearer(headers)?;
        let mut found = None;
        for (name, secret) in &self.0 {
            if constant_time_eq(&secret.0, presented) && found.is_none() {
                found = Some(name.as_str());
            }
        }
        found
    }
}

/// The token of `Authorization: Bearer <token>`, if that is the header.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    // The scheme is case-insensitive (RFC 9110 section 11.1).
    let value = headers.get(AUTHORIZATION)?.as_bytes();
    let (scheme, presented) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then_some(presented)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    const FILE: &str = "# operators\nops 0123456789abcdef0123456789abcdef\n\nci  fedcba9876543210fedcba9876543210\n";

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).expect("header"),
        );
        h
    }

    #[test]
    fn a_known_token_names_its_caller_and_nothing_else_does() {
        let tokens = Tokens::parse("t", FILE).expect("parses");
        assert_eq!(
            tokens.caller(&bearer("0123456789abcdef0123456789abcdef")),
            Some("ops")
        );
        assert_eq!(
            tokens.caller(&bearer("fedcba9876543210fedcba9876543210")),
            Some("ci")
        );
        assert_eq!(
            tokens.caller(&bearer("0123456789abcdef0123456789abcdee")),
            None
        );
        assert_eq!(tokens.caller(&bearer("0123456789abcdef")), None);
        assert_eq!(tokens.caller(&HeaderMap::new()), None);
        let mut basic = HeaderMap::new();
        basic.insert(AUTHORIZATION, HeaderValue::from_static("Basic b3BzOng="));
        assert_eq!(tokens.caller(&basic), None);
    }

    #[test]
    fn bad_files_are_refused_naming_the_line_but_never_the_token() {
        for (text, want) in [
            ("ops\n", "line 1: expected `name token`"),
            ("ops short\n", "line 1: the token of \"ops\" is shorter"),
            (
                "a 0123456789abcdef0123456789abcdef\na 0123456789abcdef0123456789abcdeX\n",
                "line 2: \"a\" is named twice",
            ),
            ("# nothing\n", "holds no token"),
        ] {
            let err = Tokens::parse("tokens", text).expect_err(text).to_string();
            assert!(err.contains(want), "{err}");
            assert!(!err.contains("0123456789abcdef"), "{err}");
        }
        let tokens = Tokens::parse("t", FILE).expect("parses");
        assert!(!format!("{tokens:?}").contains("0123"));
    }
}

//! Phone-home tokens: what a booted system presents to say it is the host
//! the agent booted, so that a phone-home (which recovery takes as
//! "booted") cannot come from anyone who merely holds the host's address.
//!
//! A token is `<epoch>-<tag>`: the epoch (hex) is the unix millisecond at
//! which the agent rendered the host's iPXE script, and the tag is the
//! first 128 bits of HMAC-SHA1 over the MAC and the epoch under a key of
//! this agent. The agent keeps no table of tokens: it recomputes the tag.
//! What it keeps is one number per host, the epoch of the host's current
//! boot (in [`crate::progress`]), so that a token of an earlier boot is
//! refused once a newer one is issued or seen.
//!
//! Owns the key file (created at first start, mode 0600, never logged),
//! issuing and checking tokens; not where tokens go in a script
//! (`http::script`) or who may phone home (`http::boot`).

use std::{
    fmt,
    fs::OpenOptions,
    io::{ErrorKind, Read as _, Write as _},
    os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use hmac::{Hmac, Mac as _};
use sha1::Sha1;

use crate::mac::MacAddr;

/// The key file in the state directory.
pub const KEY_FILE: &str = "phone-home.key";

/// Bytes of key.
const KEY_LEN: usize = 32;

/// Bytes of the HMAC-SHA1 output kept in a token: 128 bits, which an
/// online guesser (one HTTP request a guess) never exhausts.
const TAG_LEN: usize = 16;

/// Separates tokens from any other HMAC this key could ever sign.
const DOMAIN: &[u8] = b"pxe-agent phone-home v1\0";

/// The kernel command-line parameter the rendered script sets.
pub const CMDLINE_PARAM: &str = "pxe_agent.token";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("failed to read the phone-home key {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to create the phone-home key {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the phone-home key {path} holds {len} bytes, not {KEY_LEN}")]
    Length { path: PathBuf, len: usize },
    #[error(
        "the phone-home key {path} is readable by group or others (mode {mode:o}); chmod 600 it"
    )]
    Mode { path: PathBuf, mode: u32 },
    #[error("failed to read random bytes for the phone-home key: {0}")]
    Random(std::io::Error),
}

/// Why a presented token was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No token at all.
    Missing,
    /// Not a token of this agent for this MAC (malformed, wrong tag).
    Mismatch,
    /// A genuine token of an earlier boot of the host.
    Stale,
}

/// The agent's token key, which never prints.
pub struct TokenKey([u8; KEY_LEN]);

impl fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenKey(<redacted>)")
    }
}

impl TokenKey {
    /// A key of fresh random bytes, kept nowhere (tests, or an agent
    /// without a state directory).
    pub fn random() -> Result<TokenKey, KeyError> {
        let mut key = [0u8; KEY_LEN];
        fill_random(&mut key).map_err(KeyError::Random)?;
        Ok(TokenKey(key))
    }

    /// The key in `dir`/[`KEY_FILE`], created (random, mode 0600) when it
    /// does not exist, so a restarted agent accepts the tokens it issued
    /// before. A key that group or others can read is refused.
    pub fn load_or_create(dir: &Path) -> Result<TokenKey, KeyError> {
        let path = dir.join(KEY_FILE);
        match OpenOptions::new().read(true).open(&path) {
            Ok(mut file) => {
                let mode = file
                    .metadata()
                    .map_err(|source| KeyError::Read {
                        path: path.clone(),
                        source,
                    })?
                    .permissions()
                    .mode();
                if mode & 0o077 != 0 {
                    return Err(KeyError::Mode {
                        path,
                        mode: mode & 0o777,
                    });
                }
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes)
                    .map_err(|source| KeyError::Read {
                        path: path.clone(),
                        source,
                    })?;
                let key: [u8; KEY_LEN] =
                    bytes.try_into().map_err(|b: Vec<u8>| KeyError::Length {
                        path: path.clone(),
                        len: b.len(),
                    })?;
                Ok(TokenKey(key))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let key = TokenKey::random()?;
                let create = |source| KeyError::Create {
                    path: path.clone(),
                    source,
                };
                // create_new: two agents racing on one directory cannot
                // both write a key; the loser fails and is restarted.
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .map_err(create)?;
                file.write_all(&key.0).map_err(create)?;
                file.sync_all().map_err(create)?;
                Ok(key)
            }
            Err(source) => Err(KeyError::Read { path, source }),
        }
    }

    fn tag(&self, mac: MacAddr, epoch: u64) -> [u8; TAG_LEN] {
        let mut hmac = <Hmac<Sha1> as hmac::Mac>::new_from_slice(&self.0)
            .expect("HMAC takes a key of any length");
        hmac.update(DOMAIN);
        hmac.update(&mac.0);
        hmac.update(&epoch.to_be_bytes());
        let full = hmac.finalize().into_bytes();
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        tag
    }

    /// The token of `mac`'s boot `epoch`.
    pub fn issue(&self, mac: MacAddr, epoch: u64) -> String {
        let tag: String = self
            .tag(mac, epoch)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{epoch:x}-{tag}")
    }

    /// The epoch of `token` if this key issued it for `mac`. The tag is
    /// compared in constant time.
    pub fn check(&self, mac: MacAddr, token: &str) -> Result<u64, Refusal> {
        let (epoch, tag) = token.split_once('-').ok_or(Refusal::Mismatch)?;
        if epoch.is_empty() || epoch.len() > 16 || tag.len() != 2 * TAG_LEN {
            return Err(Refusal::Mismatch);
        }
        let epoch = u64::from_str_radix(epoch, 16).map_err(|_| Refusal::Mismatch)?;
        let mut presented = [0u8; TAG_LEN];
        for (i, byte) in presented.iter_mut().enumerate() {
            let hex = tag.get(2 * i..2 * i + 2).ok_or(Refusal::Mismatch)?;
            *byte = u8::from_str_radix(hex, 16).map_err(|_| Refusal::Mismatch)?;
        }
        if constant_time_eq(&self.tag(mac, epoch), &presented) {
            Ok(epoch)
        } else {
            Err(Refusal::Mismatch)
        }
    }
}

/// `getrandom(2)`, looping over short reads.
pub(crate) fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        let rest = &mut buf[at..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        at += usize::try_from(n).unwrap_or(0);
    }
    Ok(())
}

/// The `token` parameter of a query string (`a=b&token=...`), as written:
/// tokens are hex and `-`, which need no percent-decoding.
pub fn from_query(query: Option<&str>) -> Option<&str> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("token="))
        .filter(|t| !t.is_empty())
}

/// Equality of two byte strings in time independent of where they differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56]);

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("pxe-token-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    #[test]
    fn a_token_checks_for_its_mac_and_epoch_only() {
        let key = TokenKey([7; KEY_LEN]);
        let token = key.issue(MAC, 0x18c_0000_0001);
        assert!(token.starts_with("18c00000001-"), "{token}");
        assert_eq!(token.len(), "18c00000001-".len() + 32, "{token}");
        assert_eq!(key.check(MAC, &token), Ok(0x18c_0000_0001));
        // Another MAC, another key, another epoch with the same tag.
        let other = MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x57]);
        assert_eq!(key.check(other, &token), Err(Refusal::Mismatch));
        assert_eq!(
            TokenKey([8; KEY_LEN]).check(MAC, &token),
            Err(Refusal::Mismatch)
        );
        let (_, tag) = token.split_once('-').expect("dash");
        assert_eq!(
            key.check(MAC, &format!("18c00000002-{tag}")),
            Err(Refusal::Mismatch)
        );
    }

    #[test]
    fn each_epoch_gets_another_token_and_tampering_is_refused() {
        let key = TokenKey::random().expect("random key");
        let first = key.issue(MAC, 1000);
        let second = key.issue(MAC, 1001);
        assert_ne!(first, second);
        assert_eq!(key.check(MAC, &second), Ok(1001));
        // The last and the first hex digit of the tag changed: both refused
        // by the same constant-time comparison.
        for flip in [first.len() - 1, first.find('-').expect("dash") + 1] {
            let mut bad = first.clone().into_bytes();
            bad[flip] = if bad[flip] == b'0' { b'1' } else { b'0' };
            let bad = String::from_utf8(bad).expect("ascii");
            assert_eq!(key.check(MAC, &bad), Err(Refusal::Mismatch), "{bad}");
        }
        for bad in ["", "-", "3e8", "3e8-", "zz-00", "3e8-ÿÿ"] {
            assert_eq!(key.check(MAC, bad), Err(Refusal::Mismatch), "{bad:?}");
        }
    }

    #[test]
    fn the_key_file_is_created_0600_and_reused() {
        let d = dir("reuse");
        let key = TokenKey::load_or_create(&d).expect("created");
        let path = d.join(KEY_FILE);
        let mode = std::fs::metadata(&path)
            .expect("key file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read(&path).expect("read").len(), KEY_LEN);
        let token = key.issue(MAC, 42);
        let again = TokenKey::load_or_create(&d).expect("reloaded");
        assert_eq!(again.check(MAC, &token), Ok(42), "a restart keeps tokens");
        assert_eq!(format!("{again:?}"), "TokenKey(<redacted>)");
        // A key others can read is refused, naming the file, not the key.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = TokenKey::load_or_create(&d).expect_err("world-readable");
        assert!(err.to_string().contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::fs::write(&path, b"short").expect("write");
        let err = TokenKey::load_or_create(&d).expect_err("short key");
        assert!(err.to_string().contains("5 bytes"), "{err}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_token_is_read_from_the_query() {
        assert_eq!(from_query(Some("token=ab-cd")), Some("ab-cd"));
        assert_eq!(from_query(Some("x=1&token=ab-cd&y")), Some("ab-cd"));
        assert_eq!(from_query(Some("token=")), None);
        assert_eq!(from_query(Some("x=1")), None);
        assert_eq!(from_query(None), None);
    }
}

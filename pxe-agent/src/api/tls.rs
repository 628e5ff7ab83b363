//! The JSON API's serving certificate: a PEM chain and key read from two
//! files (a Kubernetes Secret mount), checked against each other, held for
//! the handshakes, and replaced when the files change. A bad new pair is
//! refused and logged, naming the file, and the previous one keeps
//! serving. Errors never quote the key file. Accepting connections is
//! [`tls_listener`](super::tls_listener)'s.

use std::{
    fmt,
    hash::{DefaultHasher, Hash as _, Hasher as _},
    io,
    path::{Path, PathBuf},
    sync::{
        Arc, RwLock,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
    time::Duration,
};

use rustls::{
    ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem, pem::PemObject as _},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use tracing::{info, warn};

use crate::{
    shutdown::Shutdown,
    sync::{read, write},
    trust,
};

/// Where the serving certificate and its key are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM: the certificate, then the intermediates of its chain.
    pub cert: PathBuf,
    /// PEM: the private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// How often the files are checked for a change.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(3);

/// Why a certificate and key pair cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("failed to read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} holds no PEM certificate", path.display())]
    NoCertificate { path: PathBuf },
    #[error("bad certificate in {}: {reason}", path.display())]
    BadCertificate { path: PathBuf, reason: String },
    /// The reason is one of ours, never the parser's: it could quote the
    /// key.
    #[error("no usable private key in {}: {reason}", path.display())]
    BadKey { path: PathBuf, reason: &'static str },
    #[error(
        "the key in {} does not match the certificate in {}",
        key.display(),
        cert.display()
    )]
    Mismatch { cert: PathBuf, key: PathBuf },
}

/// A certificate chain and the key that matches it.
pub struct Loaded {
    pub certified: Arc<CertifiedKey>,
    /// When the certificate expires, in unix seconds.
    pub not_after: i64,
}

/// Reads and checks the pair `files` names.
pub fn load(files: &TlsFiles) -> Result<Loaded, LoadError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })
    };
    parse(files, &read(&files.cert)?, &read(&files.key)?)
}

/// The pair from the files' contents.
fn parse(files: &TlsFiles, cert_pem: &[u8], key_pem: &[u8]) -> Result<Loaded, LoadError> {
    let bad_cert = |reason: String| LoadError::BadCertificate {
        path: files.cert.clone(),
        reason,
    };
    let bad_key = |reason| LoadError::BadKey {
        path: files.key.clone(),
        reason,
    };
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_cert(pem_reason(&e).to_owned()))?;
    let Some(end_entity) = chain.first() else {
        return Err(LoadError::NoCertificate {
            path: files.cert.clone(),
        });
    };
    let not_after =
        not_after(end_entity).ok_or_else(|| bad_cert("no readable validity period".to_owned()))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| {
        bad_key(match e {
            pem::Error::NoItemsFound => "no PEM private key (PKCS#8, PKCS#1 or SEC1)",
            e => pem_reason(&e),
        })
    })?;
    let signing = trust::provider()
        .key_provider
        .load_private_key(key)
        .map_err(|_| bad_key("not an RSA, ECDSA or Ed25519 key"))?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        // A key that cannot tell its public half is taken on trust, as
        // rustls's own `CertifiedKey::from_der` does.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(rustls::Error::InconsistentKeys(_)) => {
            return Err(LoadError::Mismatch {
                cert: files.cert.clone(),
                key: files.key.clone(),
            });
        }
        Err(e) => return Err(bad_cert(e.to_string())),
    }
    Ok(Loaded {
        certified: Arc::new(certified),
        not_after,
    })
}

/// What is wrong with a PEM file, in words of ours: the parser's own
/// messages can quote the file.
fn pem_reason(e: &pem::Error) -> &'static str {
    match e {
        pem::Error::MissingSectionEnd { .. } => "a PEM section has no END line",
        pem::Error::IllegalSectionStart { .. } => "a malformed PEM BEGIN line",
        pem::Error::Base64Decode(_) => "bad base64 in a PEM section",
        pem::Error::SectionTooLarge => "a PEM section is too large",
        _ => "malformed PEM",
    }
}

/// The notAfter of the DER certificate `cert`, in unix seconds
/// (RFC 5280 §4.1: Certificate, TBSCertificate, Validity).
fn not_after(cert: &[u8]) -> Option<i64> {
    const SEQUENCE: u8 = 0x30;
    let (SEQUENCE, cert, _) = der_next(cert)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = der_next(cert)? else {
        return None;
    };
    let (tag, _, mut rest) = der_next(tbs)?;
    // The version is explicit ([0]) and optional; the serial follows.
    if tag == 0xa0 {
        rest = der_next(rest)?.2;
    }
    // The signature algorithm, then the issuer.
    for _ in 0..2 {
        rest = der_next(rest)?.2;
    }
    let (SEQUENCE, validity, _) = der_next(rest)? else {
        return None;
    };
    let (_, _, rest) = der_next(validity)?;
    let (tag, text, _) = der_next(rest)?;
    der_time(tag, text)
}

/// The first DER element of `input`: its tag, content and what follows.
fn der_next(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |len, b| len << 8 | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// A UTCTime (tag 0x17) or GeneralizedTime (0x18) in UTC, as RFC 5280
/// §4.1.2.5 allows them, in unix seconds.
fn der_time(tag: u8, text: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(text).ok()?.strip_suffix('Z')?;
    let (year, rest) = match tag {
        // Two-digit years: 50 to 99 are 19xx (§4.1.2.5.1).
        0x17 => {
            let yy: i64 = text.get(..2)?.parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, text.get(2..)?)
        }
        0x18 => (text.get(..4)?.parse().ok()?, text.get(4..)?),
        _ => return None,
    };
    if rest.len() != 10 || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let two = |i: usize| rest[i..i + 2].parse::<i64>().ok();
    let (month, day) = (two(0)?, two(2)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + two(4)? * 3600 + two(6)? * 60 + two(8)?)
}

/// Days from 1970-01-01 to the proleptic Gregorian `year-month-day`
/// (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The certificate the handshakes get: the last good pair.
pub struct ServingCert(RwLock<Arc<CertifiedKey>>);

impl ServingCert {
    pub fn new(certified: Arc<CertifiedKey>) -> ServingCert {
        ServingCert(RwLock::new(certified))
    }

    fn replace(&self, certified: Arc<CertifiedKey>) {
        *write(&self.0) = certified;
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(read(&self.0).clone())
    }
}

// Nothing of the key, not even its type.
impl fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServingCert").finish_non_exhaustive()
    }
}

/// The API's TLS server configuration: TLS 1.3 and 1.2 only, HTTP/1.1,
/// the certificate `serving` holds at each handshake.
pub fn server_config(serving: Arc<ServingCert>) -> Arc<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(trust::provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("ring supports TLS 1.2 and 1.3")
        .with_no_client_auth()
        .with_cert_resolver(serving);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// The TLS counters and the serving certificate's expiry, for `/metrics`.
#[derive(Debug, Default)]
pub struct TlsStats {
    pub reloads_ok: AtomicU64,
    pub reloads_refused: AtomicU64,
    /// Handshakes that failed (a client that does not trust us, speaks
    /// plain HTTP or TLS 1.1, or hangs up).
    pub handshake_errors: AtomicU64,
    /// Handshakes that did not finish in time.
    pub handshake_timeouts: AtomicU64,
    /// notAfter of the certificate served, in unix seconds.
    pub not_after: AtomicI64,
}

impl TlsStats {
    /// The `/metrics` lines.
    pub fn render(&self) -> String {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        crate::api::metrics::render_api_tls(
            [
                ("ok", load(&self.reloads_ok)),
                ("error", load(&self.reloads_refused)),
            ],
            [
                ("error", load(&self.handshake_errors)),
                ("timeout", load(&self.handshake_timeouts)),
            ],
            self.not_after.load(Ordering::Relaxed),
        )
    }
}

/// Watches the two files and decides, at each check, whether the serving
/// certificate changes. Files are compared by content, since a Secret
/// mount changes them by swapping a symlink (`..data`), not by writing
/// them.
pub struct Reloader {
    files: TlsFiles,
    /// The contents last checked, whether they loaded or not: a bad pair is
    /// refused once, not at every check.
    seen: u64,
}

/// What one check found.
pub enum Check {
    Unchanged,
    /// The files changed and hold a good pair.
    Loaded(Loaded),
    /// The files changed and cannot serve: the previous pair stays.
    Refused(LoadError),
}

impl Reloader {
    /// The reloader of `files` and their pair now: at start, where an error
    /// is fatal.
    pub fn start(files: TlsFiles) -> Result<(Reloader, Loaded), LoadError> {
        let (seen, cert, key) = read_both(&files);
        let loaded = parse(&files, &cert?, &key?)?;
        Ok((Reloader { files, seen }, loaded))
    }

    pub fn check(&mut self) -> Check {
        let (seen, cert, key) = read_both(&self.files);
        if seen == self.seen {
            return Check::Unchanged;
        }
        self.seen = seen;
        match cert.and_then(|cert| Ok((cert, key?))) {
            Ok((cert, key)) => match parse(&self.files, &cert, &key) {
                Ok(loaded) => Check::Loaded(loaded),
                Err(e) => Check::Refused(e),
            },
            Err(e) => Check::Refused(e),
        }
    }
}

type Contents = Result<Vec<u8>, LoadError>;

/// Both files' contents (or why not), and a fingerprint of the two.
fn read_both(files: &TlsFiles) -> (u64, Contents, Contents) {
    let mut hasher = DefaultHasher::new();
    let mut read = |path: &Path| {
        let read = std::fs::read(path);
        match &read {
            Ok(bytes) => (0u8, bytes).hash(&mut hasher),
            Err(e) => (1u8, e.kind()).hash(&mut hasher),
        }
        read.map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let cert = read(&files.cert);
    let key = read(&files.key);
    (hasher.finish(), cert, key)
}

/// Checks the files every `interval` until shutdown and puts a good new
/// pair in force; counts and logs both outcomes.
pub async fn reload(
    mut reloader: Reloader,
    serving: Arc<ServingCert>,
    stats: Arc<TlsStats>,
    interval: Duration,
    mut shutdown: Shutdown,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.stopped() => return,
            _ = tick.tick() => {}
        }
        match reloader.check() {
            Check::Unchanged => {}
            Check::Loaded(loaded) => {
                serving.replace(loaded.certified);
                stats.not_after.store(loaded.not_after, Ordering::Relaxed);
                stats.reloads_ok.fetch_add(1, Ordering::Relaxed);
                info!(
                    cert = %reloader.files.cert.display(),
                    not_after = loaded.not_after,
                    "serving the API's new TLS certificate"
                );
            }
            Check::Refused(e) => {
                stats.reloads_refused.fetch_add(1, Ordering::Relaxed);
                warn!(
                    error = %e,
                    "refused the API's new TLS certificate; the previous one keeps serving"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    /// A scratch directory for certificates, removed on drop.
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Dir {
            let dir = std::env::temp_dir().join(format!("pxe-tls-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("scratch dir");
            Dir(dir)
        }

        fn path(&self, name: &str) -> PathBuf {
            self.0.join(name)
        }

        /// A self-signed certificate and its key, `<name>.pem` and
        /// `<name>.key`, made by the openssl CLI (`cargo xtask setup`
        /// installs it).
        fn make(&self, name: &str) -> TlsFiles {
            let files = TlsFiles {
                cert: self.path(&format!("{name}.pem")),
                key: self.path(&format!("{name}.key")),
            };
            let out = Command::new("openssl")
                .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
                .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
                .args(["-subj", "/CN=pxe-agent unit test", "-keyout"])
                .arg(&files.key)
                .arg("-out")
                .arg(&files.cert)
                .output()
                .expect("run openssl (is it installed? `cargo xtask setup`)");
            assert!(
                out.status.success(),
                "openssl: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            files
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn now() -> i64 {
        i64::try_from(crate::clock::now_secs()).expect("a unix time in range")
    }

    #[test]
    fn a_good_pair_loads_with_its_expiry() {
        let dir = Dir::new("good");
        let loaded = load(&dir.make("a")).expect("loads");
        let left = loaded.not_after - now();
        assert!(
            (2 * 86_400 - 120..=2 * 86_400 + 120).contains(&left),
            "notAfter {left} s from now, not two days"
        );
    }

    #[test]
    fn bad_files_are_named_and_the_key_never_quoted() {
        let dir = Dir::new("bad");
        let a = dir.make("a");
        let b = dir.make("b");
        let key_text = std::fs::read_to_string(&a.key).expect("key");
        let key_body: Vec<&str> = key_text
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let check = |files: &TlsFiles, names: &str| {
            let err = load(files).map(|_| ()).expect_err("refused");
            let text = format!("{err} {err:?}");
            assert!(text.contains(names), "{text:?} does not name {names}");
            for line in &key_body {
                assert!(!text.contains(line), "{text:?} quotes the key");
            }
            err
        };
        let missing = TlsFiles {
            cert: dir.path("missing.pem"),
            key: a.key.clone(),
        };
        assert!(matches!(
            check(&missing, "missing.pem"),
            LoadError::Read { .. }
        ));
        let garbage = dir.path("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").expect("write");
        let files = TlsFiles {
            cert: garbage.clone(),
            key: a.key.clone(),
        };
        assert!(matches!(
            check(&files, "garbage.pem"),
            LoadError::NoCertificate { .. }
        ));
        // A key whose base64 is broken: the parser's message would quote it.
        let broken = dir.path("broken.key");
        std::fs::write(
            &broken,
            key_text.replacen('A', "!", 3).replacen('M', "*", 3),
        )
        .expect("write");
        let files = TlsFiles {
            cert: a.cert.clone(),
            key: broken,
        };
        assert!(matches!(
            check(&files, "broken.key"),
            LoadError::BadKey { .. }
        ));
        // The certificate given as the key.
        let files = TlsFiles {
            cert: a.cert.clone(),
            key: a.cert.clone(),
        };
        assert!(matches!(check(&files, "a.pem"), LoadError::BadKey { .. }));
        let crossed = TlsFiles {
            cert: a.cert.clone(),
            key: b.key.clone(),
        };
        let err = check(&crossed, "b.key");
        assert!(matches!(err, LoadError::Mismatch { .. }), "{err}");
        assert!(err.to_string().contains("a.pem"), "{err}");
    }

    #[test]
    fn a_change_reloads_once_and_a_bad_one_is_refused_once() {
        let dir = Dir::new("reload");
        let serving = TlsFiles {
            cert: dir.path("tls.crt"),
            key: dir.path("tls.key"),
        };
        let install = |from: &TlsFiles| {
            std::fs::copy(&from.cert, &serving.cert).expect("copy");
            std::fs::copy(&from.key, &serving.key).expect("copy");
        };
        let a = dir.make("a");
        let b = dir.make("b");
        install(&a);
        let (mut reloader, first) = Reloader::start(serving.clone()).expect("starts");
        let der = |l: &Loaded| l.certified.cert[0].to_vec();
        assert!(matches!(reloader.check(), Check::Unchanged));
        install(&b);
        match reloader.check() {
            Check::Loaded(l) => assert_ne!(der(&l), der(&first), "the new certificate"),
            _ => panic!("a good new pair loads"),
        }
        assert!(matches!(reloader.check(), Check::Unchanged));
        // Half a change (the certificate alone) is refused, then its other
        // half loads.
        std::fs::copy(&a.cert, &serving.cert).expect("copy");
        assert!(matches!(
            reloader.check(),
            Check::Refused(LoadError::Mismatch { .. })
        ));
        assert!(matches!(reloader.check(), Check::Unchanged), "refused once");
        std::fs::copy(&a.key, &serving.key).expect("copy");
        assert!(matches!(reloader.check(), Check::Loaded(_)));
        std::fs::write(&serving.cert, "garbage").expect("write");
        assert!(matches!(reloader.check(), Check::Refused(_)));
        std::fs::remove_file(&serving.key).expect("remove");
        match reloader.check() {
            Check::Refused(LoadError::Read { path, .. }) => assert_eq!(path, serving.key),
            _ => panic!("an unreadable pair is refused"),
        }
        assert!(matches!(reloader.check(), Check::Unchanged));
    }

    #[test]
    fn a_bad_pair_does_not_start() {
        let dir = Dir::new("start");
        let a = dir.make("a");
        let files = TlsFiles {
            cert: a.cert.clone(),
            key: dir.path("none.key"),
        };
        let err = Reloader::start(files).map(|_| ()).expect_err("refused");
        assert!(err.to_string().contains("none.key"), "{err}");
    }

    #[test]
    fn der_times_are_unix_seconds() {
        assert_eq!(der_time(0x17, b"700101000000Z"), Some(0));
        assert_eq!(der_time(0x17, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(der_time(0x18, b"20380119031408Z"), Some(2_147_483_648));
        assert_eq!(der_time(0x18, b"20240229120000Z"), Some(1_709_208_000));
        assert_eq!(der_time(0x17, b"700101000000+0100"), None);
        assert_eq!(der_time(0x17, b"701301000000Z"), None);
        assert_eq!(der_time(0x02, b"700101000000Z"), None);
    }
}

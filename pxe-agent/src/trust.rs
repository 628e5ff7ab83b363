//! What a TLS client trusts: the CA certificates of a PEM file, the
//! system's CA bundle, or (insecure) any certificate; and the rustls client
//! configuration built on it, TLS 1.2 and 1.3 with ring. The BMC driver and
//! the command line's client both build theirs here. The agent's own
//! serving certificate is [`api::tls`](crate::api::tls)'s.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use rustls::{
    ClientConfig, RootCertStore,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
    pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject as _},
};

/// Which server certificates a client accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trust {
    /// Those signed by a CA of this PEM file.
    CaFile(PathBuf),
    /// Those signed by a CA of the system's bundle.
    System,
    /// Any: the certificate is not verified (handshake signatures still
    /// are).
    Insecure,
}

/// Why a client configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("failed to read CA file {}: {reason}", path.display())]
    Read { path: PathBuf, reason: String },
    #[error("bad certificate in CA file {}: {reason}", path.display())]
    BadCertificate { path: PathBuf, reason: String },
    #[error("CA file {} holds no PEM certificate", path.display())]
    Empty { path: PathBuf },
    #[error("no system CA certificates found")]
    NoSystemRoots,
}

/// The rustls provider every TLS peer of the agent uses: ring, since
/// aws-lc-rs would need cmake and a C toolchain for its own build.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client configuration accepting what `trust` says, TLS 1.2 and 1.3.
pub fn client_config(trust: &Trust) -> Result<ClientConfig, TrustError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions");
    Ok(match trust {
        Trust::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
            .with_no_client_auth(),
        Trust::CaFile(path) => builder
            .with_root_certificates(ca_file(path)?)
            .with_no_client_auth(),
        Trust::System => {
            let found = system_roots();
            if found.is_empty() {
                return Err(TrustError::NoSystemRoots);
            }
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(found);
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    })
}

/// The CA certificates of the PEM file at `path` (at least one).
fn ca_file(path: &Path) -> Result<RootCertStore, TrustError> {
    let read = |e: rustls::pki_types::pem::Error| TrustError::Read {
        path: path.to_owned(),
        reason: e.to_string(),
    };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(read)? {
        roots
            .add(cert.map_err(read)?)
            .map_err(|e| TrustError::BadCertificate {
                path: path.to_owned(),
                reason: e.to_string(),
            })?;
    }
    if roots.is_empty() {
        return Err(TrustError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(roots)
}

/// The system's CA certificates, from the usual PEM bundles.
fn system_roots() -> Vec<CertificateDer<'static>> {
    const BUNDLES: &[&str] = &[
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/cert.pem",
    ];
    BUNDLES
        .iter()
        .filter_map(|p| CertificateDer::pem_file_iter(p).ok())
        .next()
        .map(|certs| certs.filter_map(Result::ok).collect())
        .unwrap_or_default()
}

/// Accepts any server certificate ([`Trust::Insecure`]); signatures are
/// still checked so that the handshake itself is sound.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_without_certificates_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("pxe-trust-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").expect("write");
        let err = client_config(&Trust::CaFile(empty)).expect_err("refused");
        assert!(err.to_string().contains("empty.pem"), "{err}");
        let missing = dir.join("missing.pem");
        let err = client_config(&Trust::CaFile(missing)).expect_err("refused");
        assert!(err.to_string().contains("missing.pem"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(client_config(&Trust::Insecure).is_ok());
    }
}

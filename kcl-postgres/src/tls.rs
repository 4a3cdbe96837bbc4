//! TLS as libpq's `sslmode` means it, with rustls.
//!
//! tokio-postgres itself knows `disable`, `prefer` and `require`, and leaves what a
//! certificate must prove to the TLS connector. libpq's modes say it: `prefer` and `require`
//! encrypt without checking who the server is (a server with a self-signed certificate works,
//! as it does with `psql`), `verify-ca` checks the chain up to a trusted root, `verify-full`
//! the chain and the host name. Each is a rustls verifier here, so a URL written for `psql`
//! means the same to a worker. The roots are the system's (`rustls-native-certs`), or those
//! of `sslrootcert` / [`root_certificates_pem`](crate::PostgresLeaseStoreBuilder::root_certificates_pem)
//! alone when given. The crypto provider is aws-lc-rs, which the AWS SDK builds already.

use std::str::FromStr;
use std::sync::Arc;

use kcl_core::ParseModeError;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::ConfigError;

/// How a connection is encrypted and what the server's certificate must prove: libpq's
/// `sslmode`, read from the URL's `sslmode` or set with
/// [`tls`](crate::PostgresLeaseStoreBuilder::tls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TlsMode {
    /// No TLS.
    Disable,
    /// TLS if the server offers it, the certificate unchecked (libpq's default).
    #[default]
    Prefer,
    /// TLS always, the certificate unchecked: encrypted, but not proof of whom to.
    Require,
    /// TLS always, the certificate signed by a trusted root; any host name.
    VerifyCa,
    /// TLS always, the certificate signed by a trusted root and naming the host.
    VerifyFull,
}

impl TlsMode {
    /// tokio-postgres's mode: whether TLS is asked for and required.
    pub(crate) fn wire(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode;
        match self {
            Self::Disable => SslMode::Disable,
            Self::Prefer => SslMode::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => SslMode::Require,
        }
    }

    fn verifies(self) -> bool {
        matches!(self, Self::VerifyCa | Self::VerifyFull)
    }
}

impl FromStr for TlsMode {
    type Err = ParseModeError;

    /// libpq's spellings: `disable`, `prefer`, `require`, `verify-ca`, `verify-full` (`allow`
    /// is read as `prefer`: both take TLS when the server offers it).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "disable" => Ok(Self::Disable),
            "allow" | "prefer" => Ok(Self::Prefer),
            "require" => Ok(Self::Require),
            "verify-ca" => Ok(Self::VerifyCa),
            "verify-full" => Ok(Self::VerifyFull),
            _ => Err(ParseModeError {
                given: s.to_owned(),
                expected: "disable, prefer, require, verify-ca or verify-full",
            }),
        }
    }
}

/// The connector for `mode`, trusting `roots` (PEM) or, when none are given, the system's.
pub(crate) fn connector(
    mode: TlsMode,
    roots: Option<&[u8]>,
) -> Result<MakeRustlsConnect, ConfigError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(ConfigError::Tls)?;
    let verifier: Arc<dyn ServerCertVerifier> = if mode.verifies() {
        let store = Arc::new(root_store(roots)?);
        let webpki = WebPkiServerVerifier::builder_with_provider(store, provider)
            .build()
            .map_err(|e| ConfigError::Roots(e.to_string()))?;
        if mode == TlsMode::VerifyFull {
            webpki
        } else {
            Arc::new(ChainOnly(webpki))
        }
    } else {
        Arc::new(EncryptOnly(provider))
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// The roots to trust: those of `pem` alone, or the system's.
fn root_store(pem: Option<&[u8]>) -> Result<RootCertStore, ConfigError> {
    let mut store = RootCertStore::empty();
    match pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| ConfigError::Roots(e.to_string()))?;
                store
                    .add(cert)
                    .map_err(|e| ConfigError::Roots(e.to_string()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for error in &found.errors {
                tracing::debug!(%error, "a system root certificate could not be loaded");
            }
            store.add_parsable_certificates(found.certs);
        }
    }
    if store.is_empty() {
        return Err(ConfigError::Roots(
            "no root certificate to verify the server's with".to_owned(),
        ));
    }
    Ok(store)
}

/// `prefer` and `require`: the handshake's signatures checked, the certificate taken as it
/// is (libpq's meaning: encrypted, not authenticated).
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
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
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain checked up to a trusted root, the host name not (webpki checks the
/// chain first, so a name error comes only for a certificate whose chain is good).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified =
            self.0
                .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now);
        match verified {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn reads_libpq_spellings() {
        assert_eq!(
            "verify-full".parse::<TlsMode>().unwrap(),
            TlsMode::VerifyFull
        );
        assert_eq!("VERIFY_CA".parse::<TlsMode>().unwrap(), TlsMode::VerifyCa);
        assert_eq!("allow".parse::<TlsMode>().unwrap(), TlsMode::Prefer);
        assert!("verify".parse::<TlsMode>().is_err());
    }

    #[test]
    fn a_verifying_mode_without_roots_is_refused_at_build() {
        let pem = b"-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n";
        assert!(connector(TlsMode::VerifyFull, Some(pem)).is_err());
        assert!(connector(TlsMode::Require, Some(pem)).is_ok());
    }
}

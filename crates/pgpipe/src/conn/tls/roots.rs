//! The connector pgpipe makes itself, with the `rustls` feature, from a
//! URL's `sslmode=verify-ca`/`verify-full` (or `require` with a root
//! certificate, which libpq verifies as `verify-ca`) and its `sslrootcert`.
//!
//! The cryptography is the application's: the process-wide default
//! `CryptoProvider` (`rustls::crypto::ring::default_provider()
//! .install_default()`, or aws-lc-rs'), never one this crate picks, so
//! that a service that also links aws-lc-rs (the AWS SDK) and ring does not
//! panic on an ambiguous default.

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
use rustls::{Error, SignatureScheme};

use super::{Tls, Verify};

/// A connector trusting the authorities in the PEM file `root_cert` and
/// checking what `verify` says; an error says what is missing.
pub(crate) fn connector(root_cert: &Path, verify: Verify) -> Result<Tls, String> {
    let provider = CryptoProvider::get_default().cloned().ok_or_else(|| {
        "sslrootcert needs a rustls CryptoProvider installed for the process (e.g. \
         rustls::crypto::ring::default_provider().install_default()), or give the builder a \
         connector of your own with .tls() or .tls_connector()"
            .to_owned()
    })?;
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(root_cert)
        .map_err(|e| format!("sslrootcert {}: {e}", root_cert.display()))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("sslrootcert {}: {e}", root_cert.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("sslrootcert {}: {e}", root_cert.display()))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "sslrootcert {} holds no certificate",
            root_cert.display()
        ));
    }
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("rustls: {e}"))?;
    let config = match verify {
        Verify::Full => builder.with_root_certificates(roots),
        Verify::Ca => {
            let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("rustls: {e}"))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyName(inner)))
        }
    }
    .with_no_client_auth();
    let name = match verify {
        Verify::Ca => "rustls, verify-ca",
        Verify::Full => "rustls, verify-full",
    };
    Ok(Tls::new(
        tokio_postgres_rustls::MakeRustlsConnect::new(config),
        name,
    ))
}

/// `verify-ca`: rustls' own verification of the chain and signatures,
/// with a certificate that names another host accepted, as libpq accepts
/// it.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(Error::InvalidCertificate(
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
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

//! The server's TLS: TLS 1.2 and 1.3 only, with the certificate taken from a swappable resolver.

pub mod files;
pub mod resolver;

use std::sync::Arc;

pub use resolver::CertResolver;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("no certificate found in the PEM data")]
    NoCertificate,
    #[error("no private key found in the PEM data: {0}")]
    NoKey(String),
    #[error("unusable certificate or key: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// The crypto provider every TLS object of this process uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Installs ring as the process-wide default provider. Call once at start; later calls are no-ops.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A rustls server configuration that asks `resolver` for the certificate on every handshake.
pub fn server_config(resolver: Arc<CertResolver>) -> Result<rustls::ServerConfig, TlsError> {
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    Ok(config)
}

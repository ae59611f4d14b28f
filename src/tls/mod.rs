//! The server's TLS: TLS 1.2 and 1.3 only, with the certificate taken from a swappable resolver.

pub mod client_ca;
pub mod files;
pub mod resolver;

use std::sync::Arc;

pub use client_ca::ClientCa;
pub use resolver::CertResolver;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("no certificate found in the PEM data")]
    NoCertificate,
    #[error("no private key found in the PEM data: {0}")]
    NoKey(String),
    #[error("unusable certificate or key: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("unusable client CA (--client-ca-file): {0}")]
    ClientCa(String),
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

/// A rustls server configuration that asks `resolver` for the certificate on every handshake. With
/// `client_ca` (PEM), every client must present a certificate signed by one of its CAs: the API
/// server does when its admission configuration gives it a kubeconfig for the webhook.
pub fn server_config(
    resolver: Arc<CertResolver>,
    client_ca: Option<Arc<ClientCa>>,
) -> Result<rustls::ServerConfig, TlsError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(verifier) => builder.with_client_cert_verifier(verifier),
    };
    Ok(builder.with_cert_resolver(resolver))
}

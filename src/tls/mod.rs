//! The server's TLS: TLS 1.2 and 1.3 only, with the certificate taken from a swappable resolver.

pub mod client_ca;
mod crypto;
mod error;
pub mod files;
mod probe_secret;
pub mod resolver;

use std::sync::Arc;

pub use client_ca::ClientCa;
pub use crypto::{install_default_provider, provider};
pub use error::TlsError;
pub use probe_secret::ProbeSecret;
pub use resolver::CertResolver;

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

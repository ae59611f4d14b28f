//! The one crypto provider (ring) of every TLS object of the process.

use std::sync::Arc;

/// The crypto provider every TLS object of this process uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Installs ring as the process-wide default provider. Call once at start; later calls are no-ops.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

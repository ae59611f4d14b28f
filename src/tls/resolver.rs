//! A certificate resolver whose key pair can be replaced while the server runs.
//!
//! Each handshake takes the pair current at that moment; a swap affects only handshakes that start
//! after it, so no connection is dropped.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::error::TlsError;
use super::probe_secret::ProbeSecret;

#[derive(Default)]
pub struct CertResolver {
    current: ArcSwapOption<LoadedPair>,
}

/// A key pair as served, with its PEM kept for readiness checks.
pub struct LoadedPair {
    pub certified: Arc<CertifiedKey>,
    pub cert_pem: Vec<u8>,
    /// What API-server probes are signed with: every replica loads the same key.
    pub probe_secret: ProbeSecret,
}

impl std::fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertResolver")
            .field("loaded", &self.current.load().is_some())
            .finish()
    }
}

impl CertResolver {
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses a PEM chain and key and makes them the pair new handshakes get. On error the current
    /// pair stays.
    pub fn set_pem(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<(), TlsError> {
        let pair = load_pair(cert_pem, key_pem)?;
        self.current.store(Some(Arc::new(pair)));
        Ok(())
    }

    pub fn current(&self) -> Option<Arc<LoadedPair>> {
        self.current.load_full()
    }

    /// What API-server probes are signed with now, if a pair is loaded.
    pub fn probe_secret(&self) -> Option<ProbeSecret> {
        self.current
            .load()
            .as_ref()
            .map(|pair| pair.probe_secret.clone())
    }

    pub fn is_loaded(&self) -> bool {
        self.current.load().is_some()
    }
}

fn load_pair(cert_pem: &[u8], key_pem: &[u8]) -> Result<LoadedPair, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| TlsError::NoCertificate)?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::NoKey(e.to_string()))?;
    let certified = CertifiedKey::from_der(chain, key, &super::crypto::provider())?;
    Ok(LoadedPair {
        certified: Arc::new(certified),
        cert_pem: cert_pem.to_vec(),
        probe_secret: ProbeSecret::of_serving_key(key_pem),
    })
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .load()
            .as_ref()
            .map(|pair| pair.certified.clone())
    }
}

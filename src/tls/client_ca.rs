//! The CAs whose client certificates the admission port accepts (`--client-ca-file`), swappable
//! while the server runs: the file is re-read like the serving pair, so a rotated CA (a mounted
//! Secret or ConfigMap updated) takes effect without a restart.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::DistinguishedName;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};

use super::crypto::provider;
use super::error::TlsError;

/// A client-certificate verifier whose trusted CAs can be replaced.
#[derive(Debug)]
pub struct ClientCa {
    current: RwLock<(Vec<u8>, Arc<dyn ClientCertVerifier>)>,
}

fn verifier(pem: &[u8]) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| TlsError::ClientCa(e.to_string()))?;
        roots.add(cert)?;
    }
    if roots.is_empty() {
        return Err(TlsError::ClientCa("no certificate in it".to_owned()));
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider())
        .build()
        .map_err(|e| TlsError::ClientCa(e.to_string()))
}

impl ClientCa {
    pub fn from_pem(pem: &[u8]) -> Result<Self, TlsError> {
        Ok(Self {
            current: RwLock::new((pem.to_vec(), verifier(pem)?)),
        })
    }

    /// Trusts the CAs of `pem` from the next handshake on; an unusable bundle changes nothing.
    pub fn set_pem(&self, pem: &[u8]) -> Result<(), TlsError> {
        let next = verifier(pem)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = (pem.to_vec(), next);
        Ok(())
    }

    fn inner(&self) -> Arc<dyn ClientCertVerifier> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    fn pem(&self) -> Vec<u8> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone()
    }

    /// Re-reads `path` every `interval` and trusts its CAs when the contents change; a file caught
    /// half-written or unusable is logged and the CAs in force stay.
    pub async fn watch(self: Arc<Self>, path: PathBuf, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let pem = match std::fs::read(&path) {
                Ok(pem) => pem,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot re-read the client CA; keeping the one in force");
                    continue;
                }
            };
            if pem == self.pem() {
                continue;
            }
            match self.set_pem(&pem) {
                Ok(()) => tracing::info!(path = %path.display(), "client CA reloaded"),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "the client CA file is unusable; keeping the one in force")
                }
            }
        }
    }
}

impl ClientCertVerifier for ClientCa {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints: they would have to outlive a swap. A client with one certificate (the API
    /// server's kubeconfig) sends it whatever the hints say.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner().supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_file_is_reread_and_an_unusable_one_keeps_the_ca_in_force() {
        super::super::crypto::install_default_provider();
        let first = crate::certs::authority::issue_ca(Duration::from_secs(3600)).unwrap();
        let second = crate::certs::authority::issue_ca(Duration::from_secs(3600)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, &first.cert_pem).unwrap();
        let ca = Arc::new(ClientCa::from_pem(first.cert_pem.as_bytes()).unwrap());
        let watching = tokio::spawn(ca.clone().watch(path.clone(), Duration::from_millis(20)));
        let until = |want: Vec<u8>| {
            let ca = ca.clone();
            async move {
                for _ in 0..200 {
                    if ca.pem() == want {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                false
            }
        };
        std::fs::write(&path, &second.cert_pem).unwrap();
        assert!(
            until(second.cert_pem.clone().into_bytes()).await,
            "reloaded"
        );
        std::fs::write(&path, "not a certificate").unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            ca.pem(),
            second.cert_pem.as_bytes(),
            "an unusable file changes nothing"
        );
        watching.abort();
    }
}

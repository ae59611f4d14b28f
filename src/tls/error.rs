//! Why a certificate, key or client CA could not be served.

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

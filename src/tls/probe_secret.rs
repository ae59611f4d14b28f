//! The secret API-server probes are signed with (`admission/elastic_quota/ledger/probe.rs`):
//! derived from the serving key, which every replica loads, so any replica checks a probe any
//! other made.

/// 32 bytes of SHA-256 over a fixed label and the serving key's PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct ProbeSecret(pub [u8; 32]);

impl ProbeSecret {
    pub fn of_serving_key(key_pem: &[u8]) -> Self {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"koord-webhook api-server probe v1\0");
        ctx.update(key_pem);
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        Self(out)
    }
}

impl std::fmt::Debug for ProbeSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProbeSecret(..)")
    }
}

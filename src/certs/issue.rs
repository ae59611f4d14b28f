//! Where every certificate here starts: its error, the PEM pair, the parameters (subject,
//! back-dated validity, random serial, serving SANs), and a self-signed serving pair.

use std::time::{Duration, SystemTime};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use time::OffsetDateTime;

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("no randomness for a serial number")]
    Random,
    #[error("unusable CA certificate: {0}")]
    Ca(String),
}

/// A certificate and its private key, PEM encoded.
#[derive(Clone, PartialEq, Eq)]
pub struct PemPair {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for PemPair {
    // Never print a private key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PemPair")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// Clocks of API servers and nodes disagree; a fresh certificate is valid from an hour ago.
pub(super) const BACKDATE: Duration = Duration::from_secs(3600);

fn random_serial() -> Result<SerialNumber, CertError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| CertError::Random)?;
    // Positive, as DER integers for serials must be.
    bytes[0] &= 0x7f;
    Ok(SerialNumber::from_slice(&bytes))
}

/// Subject, validity window from `now` (back-dated) and a random serial: where every certificate
/// here starts.
pub(super) fn base_params(
    common_name: &str,
    validity: Duration,
    now: SystemTime,
) -> Result<CertificateParams, CertError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    let now = OffsetDateTime::from(now);
    params.not_before = now - BACKDATE;
    params.not_after = now + validity;
    params.serial_number = Some(random_serial()?);
    Ok(params)
}

/// A TLS server certificate for `hosts` (DNS names or IP literals), not a CA.
pub(super) fn serving_params(
    common_name: &str,
    hosts: &[String],
    validity: Duration,
    now: SystemTime,
) -> Result<CertificateParams, CertError> {
    let mut params = base_params(common_name, validity, now)?;
    params.subject_alt_names = CertificateParams::new(hosts.to_vec())?.subject_alt_names;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    Ok(params)
}

/// A self-signed serving certificate for `hosts` (DNS names or IP literals), valid for `validity`.
pub fn self_signed(
    common_name: &str,
    hosts: &[String],
    validity: Duration,
) -> Result<PemPair, CertError> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let cert =
        serving_params(common_name, hosts, validity, SystemTime::now())?.self_signed(&key)?;
    Ok(PemPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_pair_loads_into_the_resolver() {
        let pair = self_signed(
            "koord-webhook",
            &["localhost".into(), "127.0.0.1".into()],
            Duration::from_secs(60),
        )
        .unwrap();
        assert!(pair.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        let resolver = crate::tls::CertResolver::new();
        resolver
            .set_pem(pair.cert_pem.as_bytes(), pair.key_pem.as_bytes())
            .unwrap();
        assert!(resolver.is_loaded());
        // A key that does not belong to the certificate is refused and the old pair stays.
        let other = self_signed("x", &["localhost".into()], Duration::from_secs(60)).unwrap();
        assert!(
            resolver
                .set_pem(pair.cert_pem.as_bytes(), other.key_pem.as_bytes())
                .is_err()
        );
        assert_eq!(
            resolver.current().unwrap().cert_pem,
            pair.cert_pem.as_bytes()
        );
    }
}

//! The operator's own CA and the serving certificates it signs, and what is read back from PEM:
//! validity windows, bundles, and whether a serving certificate verifies against a bundle.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{BasicConstraints, IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};

use super::issue::{BACKDATE, CertError, PemPair, base_params, serving_params};

/// Why a PEM document is not what was expected.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error("no certificate in the PEM data")]
    NoCertificate,
    #[error("malformed certificate: {0}")]
    Malformed(String),
}

/// A new CA (ECDSA P-256) valid for `validity` from now.
pub fn issue_ca(validity: Duration) -> Result<PemPair, CertError> {
    issue_ca_at(validity, SystemTime::now())
}

/// A new CA (ECDSA P-256) valid for `validity` from `now`.
pub fn issue_ca_at(validity: Duration, now: SystemTime) -> Result<PemPair, CertError> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = base_params("koord-webhook-ca", validity, now)?;
    // pathLen 0: the CA signs serving certificates only, never another CA.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key)?;
    Ok(PemPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A serving certificate for `hosts` (DNS names or IP literals) signed by `ca`, valid from now.
pub fn issue_serving(
    ca: &PemPair,
    hosts: &[String],
    validity: Duration,
) -> Result<PemPair, CertError> {
    issue_serving_at(ca, hosts, validity, SystemTime::now())
}

/// A serving certificate for `hosts` signed by `ca`, valid from `now`.
pub fn issue_serving_at(
    ca: &PemPair,
    hosts: &[String],
    validity: Duration,
    now: SystemTime,
) -> Result<PemPair, CertError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key)?;
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    // Never valid beyond the CA that signs it.
    let ca_left = self::validity(ca.cert_pem.as_bytes())
        .map_err(|e| CertError::Ca(e.to_string()))?
        .1
        .duration_since(now)
        .unwrap_or_default();
    let mut params = serving_params("koord-webhook", hosts, validity.min(ca_left), now)?;
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(PemPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Whether `key_pem` is the private key of the (first) certificate in `cert_pem`: a Secret whose key
/// was replaced or corrupted is treated as lost, never served or signed with.
pub fn key_matches(cert_pem: &[u8], key_pem: &str) -> bool {
    let Ok(key) = KeyPair::from_pem(key_pem) else {
        return false;
    };
    first_certificate(cert_pem, |parsed| {
        parsed.public_key().raw == key.subject_public_key_info().as_slice()
    })
    .unwrap_or(false)
}

/// Whether the (first) certificate of `cert_pem` is a CA (basic constraints say so).
pub fn is_ca(cert_pem: &[u8]) -> bool {
    first_certificate(cert_pem, |parsed| {
        parsed
            .basic_constraints()
            .ok()
            .flatten()
            .is_some_and(|c| c.value.ca)
    })
    .unwrap_or(false)
}

/// Whether the first certificate's key usage allows signing certificates (keyCertSign); a
/// certificate without the extension does not say so, and is refused.
pub fn may_sign_certificates(cert_pem: &[u8]) -> bool {
    first_certificate(cert_pem, |parsed| {
        parsed
            .key_usage()
            .ok()
            .flatten()
            .is_some_and(|usage| usage.value.key_cert_sign())
    })
    .unwrap_or(false)
}

/// `read` applied to the first certificate of `cert_pem`; `None` when there is none that parses.
fn first_certificate<T>(
    cert_pem: &[u8],
    read: impl FnOnce(&x509_parser::certificate::X509Certificate<'_>) -> T,
) -> Option<T> {
    let cert = certificates(cert_pem).ok()?.into_iter().next()?;
    let (_, parsed) = x509_parser::parse_x509_certificate(&cert).ok()?;
    Some(read(&parsed))
}

/// The certificates of a PEM document, in order.
pub fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| PemError::Malformed(e.to_string()))?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate);
    }
    Ok(certs)
}

/// The validity window of the first certificate of a PEM document.
pub fn validity(pem: &[u8]) -> Result<(SystemTime, SystemTime), PemError> {
    let der = certificates(pem)?.remove(0);
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| PemError::Malformed(e.to_string()))?;
    let to_system = |t: x509_parser::time::ASN1Time| {
        let secs = t.timestamp();
        if secs >= 0 {
            SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64)
        } else {
            SystemTime::UNIX_EPOCH
        }
    };
    Ok((
        to_system(cert.validity().not_before),
        to_system(cert.validity().not_after),
    ))
}

/// Whether less than `fraction` of the certificate's lifetime remains at `now`. The lifetime counts
/// from issuance (notBefore is backdated for clock skew), so seconds-scale validities work.
pub fn needs_renewal(pem: &[u8], fraction: f64, now: SystemTime) -> bool {
    match validity(pem) {
        Ok((from, until)) => {
            let issued = from + BACKDATE;
            let lifetime = until.duration_since(issued).unwrap_or_default();
            let left = until.duration_since(now).unwrap_or_default();
            left.as_secs_f64() < lifetime.as_secs_f64() * fraction
        }
        Err(_) => true,
    }
}

/// Whether the certificate is past its not-after at `now` (or does not parse).
pub fn expired(pem: &[u8], now: SystemTime) -> bool {
    !validity(pem).is_ok_and(|(_, until)| until > now)
}

/// The PEM text of several certificates, one after the other.
pub fn bundle<'a>(certs: impl IntoIterator<Item = &'a str>) -> String {
    certs
        .into_iter()
        .map(|c| c.trim_end().to_owned() + "\n")
        .collect()
}

/// Checks that `serving_pem` chains to a certificate of `bundle_pem` for `host`, as the API server
/// would when it calls the webhook at that host now.
pub fn verify_serving(serving_pem: &[u8], bundle_pem: &[u8], host: &str) -> Result<(), String> {
    verify_serving_at(serving_pem, bundle_pem, host, SystemTime::now())
}

/// [`verify_serving`] as an API server would check it at `now`.
pub fn verify_serving_at(
    serving_pem: &[u8],
    bundle_pem: &[u8],
    host: &str,
    now: SystemTime,
) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    let ca_certs = certificates(bundle_pem).map_err(|e| format!("caBundle: {e}"))?;
    let (added, _) = roots.add_parsable_certificates(ca_certs);
    if added == 0 {
        return Err("caBundle holds no usable certificate".to_owned());
    }
    let chain = certificates(serving_pem).map_err(|e| format!("serving certificate: {e}"))?;
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        crate::tls::provider(),
    )
    .build()
    .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(host.to_owned()).map_err(|e| format!("host {host}: {e}"))?;
    use rustls::client::danger::ServerCertVerifier;
    verifier
        .verify_server_cert(
            &chain[0],
            &chain[1..],
            &name,
            &[],
            UnixTime::since_unix_epoch(
                now.duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or_default(),
            ),
        )
        .map(|_| ())
        .map_err(|e| {
            format!("the serving certificate does not verify against the caBundle for {host}: {e}")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_must_match_and_serving_never_outlives_its_ca() {
        let ca = issue_ca(Duration::from_secs(3600)).unwrap();
        let other = issue_ca(Duration::from_secs(3600)).unwrap();
        eprintln!(
            "{:?}",
            KeyPair::from_pem(&ca.key_pem).map(|k| k.subject_public_key_info().len())
        );
        assert!(key_matches(ca.cert_pem.as_bytes(), &ca.key_pem));
        assert!(!key_matches(ca.cert_pem.as_bytes(), &other.key_pem));
        assert!(!key_matches(ca.cert_pem.as_bytes(), "garbage"));
        // pathLen 0.
        let der = certificates(ca.cert_pem.as_bytes()).unwrap().remove(0);
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        let constraints = parsed.basic_constraints().unwrap().unwrap().value;
        assert!(constraints.ca);
        assert_eq!(constraints.path_len_constraint, Some(0));
        // A 720 h serving certificate from a CA with an hour left ends with the CA.
        let hosts = vec!["svc".to_owned()];
        let serving = issue_serving(&ca, &hosts, Duration::from_secs(720 * 3600)).unwrap();
        let (_, serving_until) = validity(serving.cert_pem.as_bytes()).unwrap();
        let (_, ca_until) = validity(ca.cert_pem.as_bytes()).unwrap();
        assert!(
            serving_until <= ca_until,
            "{serving_until:?} > {ca_until:?}"
        );
    }

    #[test]
    fn a_serving_pair_verifies_against_its_ca_only() {
        let ca = issue_ca(Duration::from_secs(3600)).unwrap();
        let hosts = vec!["svc.ns.svc".to_owned(), "127.0.0.1".to_owned()];
        let serving = issue_serving(&ca, &hosts, Duration::from_secs(600)).unwrap();
        verify_serving(
            serving.cert_pem.as_bytes(),
            ca.cert_pem.as_bytes(),
            "svc.ns.svc",
        )
        .unwrap();
        verify_serving(
            serving.cert_pem.as_bytes(),
            ca.cert_pem.as_bytes(),
            "127.0.0.1",
        )
        .unwrap();
        assert!(
            verify_serving(
                serving.cert_pem.as_bytes(),
                ca.cert_pem.as_bytes(),
                "other.host"
            )
            .is_err()
        );
        let other = issue_ca(Duration::from_secs(3600)).unwrap();
        assert!(
            verify_serving(
                serving.cert_pem.as_bytes(),
                other.cert_pem.as_bytes(),
                "127.0.0.1"
            )
            .is_err()
        );
        // A bundle of both CAs verifies either.
        let both = bundle([other.cert_pem.as_str(), ca.cert_pem.as_str()]);
        verify_serving(serving.cert_pem.as_bytes(), both.as_bytes(), "127.0.0.1").unwrap();
        assert_eq!(certificates(both.as_bytes()).unwrap().len(), 2);
        // The pair loads into the server's resolver.
        crate::tls::CertResolver::new()
            .set_pem(serving.cert_pem.as_bytes(), serving.key_pem.as_bytes())
            .unwrap();
    }

    #[test]
    fn validity_and_renewal() {
        let ca = issue_ca(Duration::from_secs(3600)).unwrap();
        let serving = issue_serving(&ca, &["a".into()], Duration::from_secs(600)).unwrap();
        let (from, until) = validity(serving.cert_pem.as_bytes()).unwrap();
        // Backdated by an hour for clock skew, which does not count as lifetime.
        assert_eq!(until.duration_since(from).unwrap().as_secs(), 4200);
        let now = SystemTime::now();
        assert!(!needs_renewal(serving.cert_pem.as_bytes(), 1.0 / 3.0, now));
        assert!(needs_renewal(
            serving.cert_pem.as_bytes(),
            1.0 / 3.0,
            now + Duration::from_secs(401)
        ));
        assert!(needs_renewal(b"garbage", 0.3, now));
    }
}

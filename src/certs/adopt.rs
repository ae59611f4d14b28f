//! A CA made by koord-manager's webhook, taken over as ours on migration.
//!
//! koord-manager keeps its CA in the Secret `koordinator-webhook-certs` (`ca-cert.pem`,
//! `ca-key.pem`: RSA 2048, the key in PKCS#1 PEM). When koord-webhook starts with no CA of its own
//! and finds that one, it signs its serving pairs with it: while both webhooks run during a
//! migration, whichever caBundle the configurations carry (koord-manager rewrites its own until it
//! is turned off) trusts both servers, so no call fails on trust. rcgen reads PKCS#8 only: the key
//! is re-wrapped, unchanged, into a PKCS#8 document.

use rcgen::KeyPair;
use rustls::pki_types::{PrivateKeyDer, pem::PemObject};

use super::authority;
use super::issue::{CertError, PemPair};

/// The Secret data keys koord-manager's webhook writes its CA under.
pub const KOORDINATOR_CA_CERT: &str = "ca-cert.pem";
pub const KOORDINATOR_CA_KEY: &str = "ca-key.pem";

/// rsaEncryption (RFC 8017), the algorithm of a PKCS#1 key inside PKCS#8.
const RSA_ENCRYPTION: &[u64] = &[1, 2, 840, 113549, 1, 1, 1];

/// koord-manager's CA as a pair rcgen signs with: a CA certificate that is valid at `now` and whose
/// key is the certificate's; the key converted to PKCS#8 PEM when it is PKCS#1.
pub fn koordinator_ca(
    cert_pem: &str,
    key_pem: &str,
    now: std::time::SystemTime,
) -> Result<PemPair, CertError> {
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| CertError::Ca(format!("the CA key does not read as PEM: {e}")))?;
    let pkcs8 = match key {
        PrivateKeyDer::Pkcs1(pkcs1) => pkcs1_to_pkcs8(pkcs1.secret_pkcs1_der()),
        PrivateKeyDer::Pkcs8(pkcs8) => pkcs8.secret_pkcs8_der().to_vec(),
        _ => {
            return Err(CertError::Ca(
                "the CA key is neither PKCS#1 nor PKCS#8".into(),
            ));
        }
    };
    let key = KeyPair::try_from(pkcs8.as_slice())?;
    // Only the first certificate, re-encoded: whatever else the Secret's file holds would otherwise
    // become a trust anchor in every caBundle we publish, unchecked.
    let first = authority::certificates(cert_pem.as_bytes())
        .ok()
        .and_then(|certs| certs.into_iter().next())
        .ok_or_else(|| CertError::Ca("the CA certificate does not read as PEM".into()))?;
    let pair = PemPair {
        cert_pem: pem_certificate(&first),
        key_pem: key.serialize_pem(),
    };
    let cert_pem = pair.cert_pem.as_str();
    let (from, until) = authority::validity(cert_pem.as_bytes())
        .map_err(|e| CertError::Ca(format!("the CA certificate: {e}")))?;
    if now < from || now >= until {
        return Err(CertError::Ca("the CA certificate is not valid now".into()));
    }
    if !authority::is_ca(cert_pem.as_bytes()) {
        return Err(CertError::Ca("the certificate is not a CA".into()));
    }
    if !authority::may_sign_certificates(cert_pem.as_bytes()) {
        return Err(CertError::Ca(
            "the CA certificate's key usage does not allow keyCertSign".into(),
        ));
    }
    if !authority::key_matches(pair.cert_pem.as_bytes(), &pair.key_pem) {
        return Err(CertError::Ca("the key is not the certificate's".into()));
    }
    Ok(pair)
}

/// A certificate as one PEM block, lines of 64 characters.
fn pem_certificate(der: &[u8]) -> String {
    use base64::Engine;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in text.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

/// PrivateKeyInfo { version 0, rsaEncryption with NULL parameters, the PKCS#1 key } (RFC 5208).
fn pkcs1_to_pkcs8(pkcs1: &[u8]) -> Vec<u8> {
    yasna::construct_der(|writer| {
        writer.write_sequence(|writer| {
            writer.next().write_u8(0);
            writer.next().write_sequence(|writer| {
                writer
                    .next()
                    .write_oid(&yasna::models::ObjectIdentifier::from_slice(RSA_ENCRYPTION));
                writer.next().write_null();
            });
            writer.next().write_bytes(pkcs1);
        })
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn fixture(name: &str) -> String {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/koord-manager-ca"
        );
        std::fs::read_to_string(format!("{dir}/{name}")).unwrap()
    }

    /// The CA koord-manager v1.8.0 wrote on the test node (RSA 2048, PKCS#1 key).
    #[test]
    fn koord_managers_ca_signs_our_serving_pairs() {
        let key = fixture(KOORDINATOR_CA_KEY);
        assert!(key.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
        let ca = koordinator_ca(
            &fixture(KOORDINATOR_CA_CERT),
            &key,
            std::time::SystemTime::now(),
        )
        .unwrap();
        assert!(ca.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let host = "koordinator-webhook-service.koordinator-system.svc";
        let serving =
            authority::issue_serving(&ca, &[host.to_owned()], Duration::from_secs(600)).unwrap();
        authority::verify_serving(serving.cert_pem.as_bytes(), ca.cert_pem.as_bytes(), host)
            .unwrap();
        // Adopting twice gives the same pair (a re-read CA is not a new CA).
        assert_eq!(
            koordinator_ca(&ca.cert_pem, &ca.key_pem, std::time::SystemTime::now()).unwrap(),
            ca
        );
    }

    #[test]
    fn what_is_not_a_usable_ca_is_refused_with_why() {
        let cert = fixture(KOORDINATOR_CA_CERT);
        let other = authority::issue_ca(Duration::from_secs(3600)).unwrap();
        let cases = [
            (cert.as_str(), "garbage", "does not read as PEM"),
            (
                cert.as_str(),
                other.key_pem.as_str(),
                "not the certificate's",
            ),
        ];
        for (cert, key, why) in cases {
            let error = koordinator_ca(cert, key, std::time::SystemTime::now())
                .unwrap_err()
                .to_string();
            assert!(error.contains(why), "{error}");
        }
        // Only the first certificate of the file is kept: a second would become a trust anchor.
        let appended = format!("{cert}{}", other.cert_pem);
        let adopted = koordinator_ca(
            &appended,
            &fixture(KOORDINATOR_CA_KEY),
            std::time::SystemTime::now(),
        )
        .unwrap();
        assert_eq!(
            authority::certificates(adopted.cert_pem.as_bytes())
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            authority::certificates(adopted.cert_pem.as_bytes()).unwrap(),
            authority::certificates(cert.as_bytes()).unwrap()
        );
        // A CA certificate whose key usage leaves out keyCertSign may not sign.
        let no_sign_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        let no_sign = params.self_signed(&no_sign_key).unwrap();
        let error = koordinator_ca(
            &no_sign.pem(),
            &no_sign_key.serialize_pem(),
            std::time::SystemTime::now(),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("keyCertSign"), "{error}");
        // A serving certificate is not a CA.
        let serving =
            authority::issue_serving(&other, &["a".into()], Duration::from_secs(600)).unwrap();
        let error = koordinator_ca(
            &serving.cert_pem,
            &serving.key_pem,
            std::time::SystemTime::now(),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("not a CA"), "{error}");
    }
}

//! What the two Secrets hold, read and written as one typed state.
//!
//! `webhook-ca` holds the CA that signs serving certificates and, during a CA rotation, the previous
//! CA; `webhook-tls` holds the serving pair and the CA bundle the API server is told to trust.

use crate::apis::meta::annotation;
use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ObjectMeta;

use crate::certs::PemPair;
use crate::certs::{adopt, authority};
use crate::names::{MANAGED_BY, SECRET_CA, SECRET_TLS, namespace};

pub const PHASE_ANNOTATION: &str = "koord-webhook/ca-rotation-phase";
pub const PHASE_SINCE_ANNOTATION: &str = "koord-webhook/ca-rotation-phase-since";
pub const CA_NOT_AFTER_ANNOTATION: &str = "koord-webhook/ca-not-after";
pub const SERVING_NOT_AFTER_ANNOTATION: &str = "koord-webhook/serving-not-after";

/// Where a CA rotation stands (docs/certificates.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// One CA, trusted and signing.
    Stable,
    /// Old and new CA published; serving still signed by the old one.
    Publishing,
    /// Serving signed by the new CA; the old one stays trusted for a grace period.
    Draining,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Stable => "Stable",
            Phase::Publishing => "Publishing",
            Phase::Draining => "Draining",
        }
    }

    /// The metric value of the phase.
    pub fn number(self) -> i64 {
        match self {
            Phase::Stable => 0,
            Phase::Publishing => 1,
            Phase::Draining => 2,
        }
    }

    fn parse(text: &str) -> Self {
        match text {
            "Publishing" => Phase::Publishing,
            "Draining" => Phase::Draining,
            _ => Phase::Stable,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct CaState {
    pub ca: PemPair,
    pub previous: Option<PemPair>,
    pub phase: Phase,
    /// When the phase was entered (RFC 3339).
    pub since: Option<jiff::Timestamp>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TlsState {
    pub serving: PemPair,
    pub bundle: String,
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .filter(|s| !s.trim().is_empty())
}

fn pair(secret: &Secret, cert: &str, key: &str) -> Option<PemPair> {
    let pair = PemPair {
        cert_pem: text(secret, cert)?,
        key_pem: text(secret, key)?,
    };
    authority::validity(pair.cert_pem.as_bytes()).ok()?;
    // A key that is not the certificate's makes the pair as good as lost.
    authority::key_matches(pair.cert_pem.as_bytes(), &pair.key_pem).then_some(pair)
}

/// The previous CA of a rotation: with its key after a planned rotation, certificates only (an
/// empty key) after a lost CA.
fn previous_ca(secret: &Secret) -> Option<PemPair> {
    match text(secret, "previous-ca.key") {
        Some(_) => pair(secret, "previous-ca.crt", "previous-ca.key"),
        None => {
            let cert_pem = text(secret, "previous-ca.crt")?;
            authority::validity(cert_pem.as_bytes()).ok()?;
            Some(PemPair {
                cert_pem,
                key_pem: String::new(),
            })
        }
    }
}

/// The CA certificate and key koord-manager's webhook keeps in its Secret (certs::adopt), as text.
pub fn koordinator_ca_pem(secret: &Secret) -> Option<(String, String)> {
    Some((
        text(secret, adopt::KOORDINATOR_CA_CERT)?,
        text(secret, adopt::KOORDINATOR_CA_KEY)?,
    ))
}

/// The CA state of `webhook-ca`; `None` when absent or unusable (then a new CA is made).
pub fn read_ca(secret: &Secret) -> Option<CaState> {
    let ca = pair(secret, "ca.crt", "ca.key")?;
    let previous = previous_ca(secret);
    let mut phase = annotation(secret, PHASE_ANNOTATION).map_or(Phase::Stable, Phase::parse);
    if previous.is_none() {
        phase = Phase::Stable;
    }
    let since = annotation(secret, PHASE_SINCE_ANNOTATION).and_then(|t| t.parse().ok());
    Some(CaState {
        ca,
        previous,
        phase,
        since,
    })
}

/// The serving state of `webhook-tls`; `None` when absent or unusable.
pub fn read_tls(secret: &Secret) -> Option<TlsState> {
    Some(TlsState {
        serving: pair(secret, "tls.crt", "tls.key")?,
        bundle: text(secret, "ca.crt").unwrap_or_default(),
    })
}

fn not_after(pem: &str) -> String {
    authority::validity(pem.as_bytes())
        .ok()
        .and_then(|(_, until)| jiff::Timestamp::try_from(until).ok())
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn secret(
    name: &str,
    type_: &str,
    data: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace().to_owned()),
            labels: Some([(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned())].into()),
            annotations: Some(annotations),
            ..Default::default()
        },
        type_: Some(type_.to_owned()),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Default::default()
    }
}

fn phase_annotations(state: &CaState) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::from([
        (PHASE_ANNOTATION.to_owned(), state.phase.as_str().to_owned()),
        (
            CA_NOT_AFTER_ANNOTATION.to_owned(),
            not_after(&state.ca.cert_pem),
        ),
    ]);
    if let Some(since) = state.since {
        annotations.insert(PHASE_SINCE_ANNOTATION.to_owned(), since.to_string());
    }
    annotations
}

pub fn ca_secret(state: &CaState) -> Secret {
    let mut data = BTreeMap::from([
        ("ca.crt".to_owned(), state.ca.cert_pem.clone()),
        ("ca.key".to_owned(), state.ca.key_pem.clone()),
    ]);
    if let Some(previous) = &state.previous {
        data.insert("previous-ca.crt".to_owned(), previous.cert_pem.clone());
        if !previous.key_pem.is_empty() {
            data.insert("previous-ca.key".to_owned(), previous.key_pem.clone());
        }
    }
    secret(SECRET_CA, "Opaque", data, phase_annotations(state))
}

pub fn tls_secret(tls: &TlsState, ca: &CaState) -> Secret {
    let data = BTreeMap::from([
        ("tls.crt".to_owned(), tls.serving.cert_pem.clone()),
        ("tls.key".to_owned(), tls.serving.key_pem.clone()),
        ("ca.crt".to_owned(), tls.bundle.clone()),
    ]);
    let mut annotations = phase_annotations(ca);
    annotations.insert(
        SERVING_NOT_AFTER_ANNOTATION.to_owned(),
        not_after(&tls.serving.cert_pem),
    );
    secret(SECRET_TLS, "kubernetes.io/tls", data, annotations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn states_round_trip_through_secrets() {
        let ca = authority::issue_ca(Duration::from_secs(3600)).unwrap();
        let old = authority::issue_ca(Duration::from_secs(3600)).unwrap();
        let state = CaState {
            ca: ca.clone(),
            previous: Some(old.clone()),
            phase: Phase::Draining,
            since: Some("2026-11-23T00:00:00Z".parse().unwrap()),
        };
        assert_eq!(read_ca(&ca_secret(&state)), Some(state.clone()));
        let serving =
            authority::issue_serving(&ca, &["a".into()], Duration::from_secs(60)).unwrap();
        let tls = TlsState {
            serving,
            bundle: authority::bundle([old.cert_pem.as_str(), ca.cert_pem.as_str()]),
        };
        let secret = tls_secret(&tls, &state);
        assert_eq!(read_tls(&secret), Some(tls));
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        let annotations = secret.metadata.annotations.unwrap();
        assert!(annotations[SERVING_NOT_AFTER_ANNOTATION].starts_with("20"));
        assert_eq!(annotations[PHASE_ANNOTATION], "Draining");
        // Corrupted data reads as absent; a missing previous CA means no rotation is under way.
        let mut broken = ca_secret(&state);
        broken
            .data
            .as_mut()
            .unwrap()
            .insert("ca.crt".into(), ByteString(b"junk".to_vec()));
        assert_eq!(read_ca(&broken), None);
        let mut no_previous = ca_secret(&state);
        no_previous.data.as_mut().unwrap().remove("previous-ca.crt");
        assert_eq!(read_ca(&no_previous).unwrap().phase, Phase::Stable);
        // A key that is not the certificate's reads as a lost pair (the leader replaces it).
        let mut mismatched = tls_secret(&tls_of(&ca), &state);
        mismatched.data.as_mut().unwrap().insert(
            "tls.key".into(),
            ByteString(old.key_pem.clone().into_bytes()),
        );
        assert_eq!(read_tls(&mismatched), None);
        let mut mismatched = ca_secret(&state);
        mismatched.data.as_mut().unwrap().insert(
            "ca.key".into(),
            ByteString(old.key_pem.clone().into_bytes()),
        );
        assert_eq!(read_ca(&mismatched), None);
        // An unparsable phase start reads as none (the leader restarts the phase's clock).
        let mut bad_since = ca_secret(&state);
        bad_since
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(PHASE_SINCE_ANNOTATION.into(), "yesterday".into());
        assert_eq!(read_ca(&bad_since).unwrap().since, None);
    }

    fn tls_of(ca: &PemPair) -> TlsState {
        TlsState {
            serving: authority::issue_serving(ca, &["a".into()], Duration::from_secs(60)).unwrap(),
            bundle: ca.cert_pem.clone(),
        }
    }
}

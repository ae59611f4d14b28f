//! What the leader's certificate pass does next, decided from what it read (docs/certificates.md).
//!
//! No API calls and no clock of its own: the pass reads both Secrets (and koord-manager's on a first
//! start), calls [`plan`] with the time, writes what the plan says changed, publishes the bundle,
//! then asks [`phase_step`] whether the rotation moves on. Issuing a certificate is the one thing
//! done here that is not a decision (a new key each time); the unit tests check which CA signed.

use std::time::{Duration, SystemTime};

use crate::certs::{CertError, PemPair, authority};
use crate::names::CA_ADOPTION_RECORD;
use crate::operator::secrets::{CaState, Phase, TlsState};

/// How certificates are issued and rotated (the `serve` flags of the same names).
#[derive(Clone, Debug)]
pub struct CertPolicy {
    pub ca_validity: Duration,
    pub cert_validity: Duration,
    pub renew_fraction: f64,
    pub ca_grace: Duration,
    /// How long both CAs are published before serving moves to the new one.
    pub publish_settle: Duration,
    /// Serving certificate SANs; the first is the host the API server calls.
    pub hosts: Vec<String>,
    /// koord-manager's CA Secret, taken over on first start (certs::adopt).
    pub adopt_ca_secret: Option<String>,
}

impl CertPolicy {
    /// The host the API server calls, which the serving certificate must be valid for.
    pub fn verify_host(&self) -> &str {
        self.hosts
            .first()
            .map(String::as_str)
            .unwrap_or("localhost")
    }
}

/// What the pass read, as the planner needs it.
#[derive(Debug, Default)]
pub struct Observed {
    /// `webhook-ca`; `None` when absent or unusable (no parsable certificate, or a key that is not
    /// its certificate's).
    pub ca: Option<CaState>,
    /// `webhook-tls`; `None` when absent or unusable.
    pub tls: Option<TlsState>,
    /// koord-manager's CA, read on a first start only ([`is_first_start`]) and only when it was
    /// not taken over before ([`Self::adopted_before`]).
    pub koordinator_ca: Option<KoordinatorCa>,
    /// On a first start: the record of an earlier takeover of koord-manager's CA by this
    /// installation (what it says), which spends the takeover.
    pub adopted_before: Option<AdoptedBefore>,
}

/// The record of koord-manager's CA taken over (`CA_ADOPTION_RECORD`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdoptedBefore {
    /// koord-manager's Secret, as recorded.
    pub secret: String,
    /// When, as recorded (RFC 3339).
    pub at: String,
}

/// koord-manager's CA as found in its Secret, usable or why not.
#[derive(Debug)]
pub struct KoordinatorCa {
    pub secret: String,
    pub ca: Result<PemPair, CertError>,
}

/// A first start: neither of our Secrets exists (then koord-manager's CA may be taken over).
pub fn is_first_start(ca_secret_exists: bool, tls_secret_exists: bool) -> bool {
    !ca_secret_exists && !tls_secret_exists
}

/// Which certificate a plan issued (the rotations counter's label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Certificate {
    Ca,
    Serving,
}

impl Certificate {
    pub fn label(self) -> &'static str {
        match self {
            Certificate::Ca => "ca",
            Certificate::Serving => "serving",
        }
    }
}

/// An Event the pass records on `webhook-tls` (docs/certificates.md, "What an operator sees").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertEvent {
    /// koord-manager's CA became ours.
    CaAdopted {
        secret: String,
    },
    /// koord-manager's Secret held a CA that cannot be used.
    CaNotAdopted {
        secret: String,
        why: String,
    },
    /// Our Secrets are gone again after koord-manager's CA was taken over once: a new CA, not
    /// that one again (a leaked key must not come back).
    CaAdoptionSpent(AdoptedBefore),
    /// A new CA; `beside_old_trust`: after a loss, next to the trust still in place.
    CaIssued {
        beside_old_trust: bool,
    },
    CaRotationStarted,
    CaRotationServing,
    CaRotationDone,
    CertificateIssued,
}

impl CertEvent {
    pub fn reason(&self) -> &'static str {
        match self {
            CertEvent::CaAdopted { .. } => "CAAdopted",
            CertEvent::CaNotAdopted { .. } => "CANotAdopted",
            CertEvent::CaAdoptionSpent(_) => "CAAdoptionSpent",
            CertEvent::CaIssued { .. } => "CAIssued",
            CertEvent::CaRotationStarted => "CARotationStarted",
            CertEvent::CaRotationServing => "CARotationServing",
            CertEvent::CaRotationDone => "CARotationDone",
            CertEvent::CertificateIssued => "CertificateIssued",
        }
    }

    pub fn is_warning(&self) -> bool {
        matches!(self, CertEvent::CaNotAdopted { .. })
    }

    pub fn note(&self) -> String {
        match self {
            CertEvent::CaAdopted { secret } => format!(
                "took over the CA of Secret {secret} (koord-manager's webhook): both webhooks are trusted while they run side by side"
            ),
            CertEvent::CaNotAdopted { secret, why } => {
                format!("the CA of Secret {secret} is not usable ({why}): issuing a new CA")
            }
            CertEvent::CaAdoptionSpent(AdoptedBefore { secret, at }) => format!(
                "the CA of Secret {secret} was taken over once already by this installation (at {at}, ConfigMap {CA_ADOPTION_RECORD}): issuing a new CA; delete that ConfigMap to take it over again"
            ),
            CertEvent::CaIssued {
                beside_old_trust: true,
            } => "webhook-ca was lost or unusable: issued a new CA, published next to the trust in place".to_owned(),
            CertEvent::CaIssued {
                beside_old_trust: false,
            } => "issued a new CA".to_owned(),
            CertEvent::CaRotationStarted => "new CA published next to the old one".to_owned(),
            CertEvent::CaRotationServing => {
                "both CAs published; serving from the new CA".to_owned()
            }
            CertEvent::CaRotationDone => "old CA removed from the bundle".to_owned(),
            CertEvent::CertificateIssued => "issued a new serving certificate".to_owned(),
        }
    }
}

/// The Secrets as they should be after this pass, and what to record.
#[derive(Debug)]
pub struct Plan {
    pub ca: CaState,
    pub tls: TlsState,
    /// `webhook-ca` differs from what was read.
    pub write_ca: bool,
    /// `webhook-tls` differs from what was read.
    pub write_tls: bool,
    pub events: Vec<CertEvent>,
    pub issued: Vec<Certificate>,
}

/// The CA, then the serving pair, as docs/certificates.md orders them.
pub fn plan(observed: Observed, policy: &CertPolicy, now: SystemTime) -> Result<Plan, CertError> {
    let mut noted = Noted::default();
    let adopted = adoption(observed.koordinator_ca, observed.adopted_before, &mut noted);
    let ca = the_ca(
        observed.ca.as_ref(),
        adopted,
        observed.tls.as_ref(),
        policy,
        now,
        &mut noted,
    )?;
    let tls = the_serving_pair(&ca, observed.tls.as_ref(), policy, now, &mut noted)?;
    Ok(Plan {
        write_ca: Some(&ca) != observed.ca.as_ref(),
        write_tls: Some(&tls) != observed.tls.as_ref(),
        ca,
        tls,
        events: noted.events,
        issued: noted.issued,
    })
}

/// What a plan's steps record: the Events to write and the certificates issued.
#[derive(Default)]
struct Noted {
    events: Vec<CertEvent>,
    issued: Vec<Certificate>,
}

/// koord-manager's CA when it is to be taken over (a first start), and the Event saying so, or
/// why not, or that it was taken over before.
fn adoption(
    koordinator_ca: Option<KoordinatorCa>,
    adopted_before: Option<AdoptedBefore>,
    noted: &mut Noted,
) -> Option<PemPair> {
    match koordinator_ca {
        Some(KoordinatorCa { secret, ca: Ok(ca) }) => {
            noted.events.push(CertEvent::CaAdopted { secret });
            Some(ca)
        }
        Some(KoordinatorCa { secret, ca: Err(e) }) => {
            noted.events.push(CertEvent::CaNotAdopted {
                secret,
                why: e.to_string(),
            });
            None
        }
        None => {
            if let Some(before) = adopted_before {
                noted.events.push(CertEvent::CaAdoptionSpent(before));
            }
            None
        }
    }
}

/// The CA: kept while usable (an expired one is as good as lost); on first start koord-manager's
/// when it has a usable one; else a new one; renewed in stages when due.
fn the_ca(
    stored: Option<&CaState>,
    adopted: Option<PemPair>,
    stored_tls: Option<&TlsState>,
    policy: &CertPolicy,
    now: SystemTime,
    noted: &mut Noted,
) -> Result<CaState, CertError> {
    let usable = stored
        .cloned()
        .filter(|ca| !authority::expired(ca.ca.cert_pem.as_bytes(), now));
    let mut ca = match (usable, adopted) {
        (Some(ca), _) => ca,
        (None, Some(ca)) => CaState {
            ca,
            previous: None,
            phase: Phase::Stable,
            since: Some(timestamp(now)),
        },
        (None, None) => a_new_ca(stored_tls, policy, now, noted)?,
    };
    if ca.phase == Phase::Stable
        && authority::needs_renewal(ca.ca.cert_pem.as_bytes(), policy.renew_fraction, now)
    {
        ca = CaState {
            previous: Some(ca.ca.clone()),
            ca: authority::issue_ca_at(policy.ca_validity, now)?,
            phase: Phase::Publishing,
            since: Some(timestamp(now)),
        };
        noted.issued.push(Certificate::Ca);
        noted.events.push(CertEvent::CaRotationStarted);
    }
    // A phase whose start is missing, unparsable or ahead of this clock (another leader's clock ran
    // ahead) would end late or never: it starts now.
    if ca.phase != Phase::Stable && ca.since.is_none_or(|since| since > timestamp(now)) {
        ca.since = Some(timestamp(now));
    }
    Ok(ca)
}

/// A CA for one lost or unusable. When API servers still trust a serving pair in place, the new CA
/// goes through the stages of a planned rotation: the old trust (certificates only: its key is
/// gone) stays published beside it, and the old pair serves until Draining.
fn a_new_ca(
    stored_tls: Option<&TlsState>,
    policy: &CertPolicy,
    now: SystemTime,
    noted: &mut Noted,
) -> Result<CaState, CertError> {
    let still_trusted = stored_tls.filter(|tls| {
        authority::verify_serving_at(
            tls.serving.cert_pem.as_bytes(),
            tls.bundle.as_bytes(),
            policy.verify_host(),
            now,
        )
        .is_ok()
    });
    noted.issued.push(Certificate::Ca);
    noted.events.push(CertEvent::CaIssued {
        beside_old_trust: still_trusted.is_some(),
    });
    Ok(CaState {
        ca: authority::issue_ca_at(policy.ca_validity, now)?,
        previous: still_trusted.map(|tls| PemPair {
            cert_pem: tls.bundle.clone(),
            key_pem: String::new(),
        }),
        phase: match still_trusted {
            Some(_) => Phase::Publishing,
            None => Phase::Stable,
        },
        since: Some(timestamp(now)),
    })
}

/// The serving pair: kept while it verifies against the CA that signs in this phase and is not
/// due; after a lost CA the old trust cannot sign, so its pair serves, due or not, until Draining
/// (verification refuses it once expired).
fn the_serving_pair(
    ca: &CaState,
    stored: Option<&TlsState>,
    policy: &CertPolicy,
    now: SystemTime,
    noted: &mut Noted,
) -> Result<TlsState, CertError> {
    let (bundle, signer) = bundle_and_signer(ca);
    let keep = stored.filter(|tls| {
        authority::verify_serving_at(
            tls.serving.cert_pem.as_bytes(),
            signer.cert_pem.as_bytes(),
            policy.verify_host(),
            now,
        )
        .is_ok()
            && (signer.key_pem.is_empty()
                || !authority::needs_renewal(
                    tls.serving.cert_pem.as_bytes(),
                    policy.renew_fraction,
                    now,
                ))
    });
    let serving = match keep {
        Some(tls) => tls.serving.clone(),
        None => {
            // A previous CA known by its certificate only cannot sign: the new CA does.
            let signer = if signer.key_pem.is_empty() {
                &ca.ca
            } else {
                signer
            };
            noted.issued.push(Certificate::Serving);
            noted.events.push(CertEvent::CertificateIssued);
            authority::issue_serving_at(signer, &policy.hosts, policy.cert_validity, now)?
        }
    };
    Ok(TlsState { serving, bundle })
}

/// The bundle the API servers are told to trust, and the CA that signs serving in this phase: both
/// CAs while a rotation is under way; serving signed by the old CA until the bundle with the new
/// one is everywhere.
fn bundle_and_signer(ca: &CaState) -> (String, &PemPair) {
    match (&ca.previous, ca.phase) {
        (Some(previous), Phase::Publishing) => (
            authority::bundle([previous.cert_pem.as_str(), ca.ca.cert_pem.as_str()]),
            previous,
        ),
        (Some(previous), Phase::Draining) => (
            authority::bundle([previous.cert_pem.as_str(), ca.ca.cert_pem.as_str()]),
            &ca.ca,
        ),
        _ => (authority::bundle([ca.ca.cert_pem.as_str()]), &ca.ca),
    }
}

/// What the pass leaves to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing until the next event or timer.
    Idle,
    /// A rotation step waits: run again after this long.
    After(Duration),
}

/// Whether the rotation moves to its next phase once the bundle is published.
#[derive(Debug)]
pub struct PhaseStep {
    /// The CA state to write, and its Event, when the phase changes.
    pub advance: Option<(CaState, CertEvent)>,
    pub next: Next,
}

/// Publishing -> Draining once every entry carries the bundle (`bundle_in_place`) and
/// `publish_settle` has passed (API servers cache configurations); Draining -> Stable once
/// `ca_grace` has passed.
pub fn phase_step(
    ca: &CaState,
    bundle_in_place: bool,
    policy: &CertPolicy,
    now: SystemTime,
) -> PhaseStep {
    let waited = ca.since.map_or(Duration::ZERO, |since| {
        let waited = timestamp(now).duration_since(since).as_secs_f64();
        Duration::from_secs_f64(waited.max(0.0))
    });
    let stay = |next| PhaseStep {
        advance: None,
        next,
    };
    let moved = |ca: CaState, event| PhaseStep {
        advance: Some((ca, event)),
        next: Next::After(Duration::ZERO),
    };
    match ca.phase {
        Phase::Stable => stay(Next::Idle),
        Phase::Publishing if bundle_in_place && waited >= policy.publish_settle => moved(
            CaState {
                phase: Phase::Draining,
                since: Some(timestamp(now)),
                ..ca.clone()
            },
            CertEvent::CaRotationServing,
        ),
        Phase::Publishing => stay(Next::After(Duration::from_secs(1))),
        Phase::Draining if waited >= policy.ca_grace => moved(
            CaState {
                previous: None,
                phase: Phase::Stable,
                since: Some(timestamp(now)),
                ..ca.clone()
            },
            CertEvent::CaRotationDone,
        ),
        Phase::Draining => stay(Next::After(policy.ca_grace - waited)),
    }
}

/// `now` as the Secrets record it.
pub(super) fn timestamp(now: SystemTime) -> jiff::Timestamp {
    jiff::Timestamp::try_from(now).unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}

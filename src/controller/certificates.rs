//! The leader's certificate work (docs/certificates.md): issue the CA and the serving pair, renew
//! them before they run out, rotate the CA in stages, recover lost Secrets, and publish the bundle
//! in the webhook configurations. One pass of [`Issuer::reconcile`] does what the current state
//! asks; it runs on start, on every watch event of the Secrets and configurations, and on a timer.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource};

use super::metrics::CertLabels;
use super::secrets::{self, CaState, Phase, TlsState};
use super::webhook_configs::{self, Desired};
use crate::certs::{CertError, PemPair, adopt, authority};
use crate::metrics::{KindLabels, Metrics};
use crate::names::FIELD_MANAGER;
use crate::names::namespace;
use crate::names::{SECRET_CA, SECRET_TLS};

#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Cert(#[from] CertError),
    #[error(transparent)]
    NotLeader(#[from] super::leader::NotLeader),
}

#[derive(Clone, Debug)]
pub struct CertPolicy {
    pub ca_validity: Duration,
    pub cert_validity: Duration,
    pub renew_fraction: f64,
    pub ca_grace: Duration,
    /// How long both CAs are published before serving moves to the new one.
    pub publish_settle: Duration,
    /// Serving certificate SANs.
    pub hosts: Vec<String>,
    /// koord-manager's CA Secret, taken over on first start (certs::adopt).
    pub adopt_ca_secret: Option<String>,
}

pub struct Issuer {
    pub client: Client,
    pub policy: CertPolicy,
    pub desired: Desired,
    pub recorder: Recorder,
    /// Checked right before every write (fencing).
    pub leadership: super::leader::Leadership,
    pub absence: super::webhook_configs::Absence,
    /// Derives the pod entries' reach (calls narrowed only).
    pub pod_reach: Option<super::webhook_configs::PodReachSource>,
}

/// What a pass leaves to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing until the next event or timer.
    Idle,
    /// A rotation step waits: run again after this long.
    After(Duration),
}

impl Issuer {
    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), namespace())
    }

    async fn event(&self, type_: EventType, reason: &str, note: String) {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(SECRET_TLS.to_owned()),
                namespace: Some(namespace().to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        self.event_on(&secret.object_ref(&()), type_, reason, note)
            .await;
    }

    async fn event_on(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: reason.to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, reference).await {
            tracing::warn!(error = %e, reason, "could not record an event");
        }
    }

    /// One Event per configuration and kind of write, regarding the configuration: the caBundle
    /// published (Normal), which requests are sent changed (Normal), other owned fields put back
    /// after a hand edit (Warning, naming each), narrowed entries refused and written wide (Warning).
    async fn record_writes(&self, written: &[webhook_configs::Written]) {
        use webhook_configs::WriteKind;
        for configuration in written {
            if let Some(refusal) = &configuration.narrowing_refused {
                let note = format!(
                    "the API server refused the matchConditions, entries written wide: {refusal}"
                );
                self.event_on(
                    &configuration.reference,
                    EventType::Warning,
                    "NarrowingRefused",
                    note,
                )
                .await;
            }
            for kind in [WriteKind::Endpoint, WriteKind::Calls, WriteKind::Drift] {
                let fields: Vec<_> = configuration
                    .fields
                    .iter()
                    .filter(|(_, field)| field.write_kind() == kind)
                    .collect();
                if fields.is_empty() {
                    continue;
                }
                let entries: Vec<&str> = fields.iter().map(|(e, _)| e.as_str()).collect();
                let (type_, reason, note) = match kind {
                    WriteKind::Endpoint => (
                        EventType::Normal,
                        "CABundlePublished",
                        format!("caBundle published on {}", entries.join(", ")),
                    ),
                    WriteKind::Calls => (
                        EventType::Normal,
                        "MatchConditionsChanged",
                        format!("which requests are sent changed on {}", entries.join(", ")),
                    ),
                    WriteKind::Drift => {
                        let named: Vec<String> = fields
                            .iter()
                            .map(|(e, f)| format!("{e} {}", f.name()))
                            .collect();
                        let note = format!(
                            "put back to the configured value (edit the install's settings instead): {}",
                            named.join(", ")
                        );
                        tracing::warn!(configuration = ?configuration.reference.name, "{note}");
                        (EventType::Warning, "DriftRepaired", note)
                    }
                };
                self.event_on(&configuration.reference, type_, reason, note)
                    .await;
            }
        }
    }

    /// The host the API server calls, which the serving certificate must be valid for.
    fn verify_host(&self) -> &str {
        self.policy
            .hosts
            .first()
            .map(String::as_str)
            .unwrap_or("localhost")
    }

    async fn apply(&self, secret: &Secret, metrics: &Metrics) -> Result<(), IssueError> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        self.leadership.check()?;
        if let Err(e) = self
            .secrets()
            .patch(&name, &params, &Patch::Apply(secret))
            .await
        {
            self.event(
                EventType::Warning,
                "WriteFailed",
                format!("could not write Secret {name}: {e}"),
            )
            .await;
            return Err(e.into());
        }
        metrics
            .operator
            .writes
            .get_or_create(&KindLabels { kind: "secret" })
            .inc();
        Ok(())
    }

    fn issue_serving(&self, signer: &PemPair, metrics: &Metrics) -> Result<PemPair, CertError> {
        let pair = authority::issue_serving(signer, &self.policy.hosts, self.policy.cert_validity)?;
        metrics
            .operator
            .cert_rotations
            .get_or_create(&CertLabels {
                certificate: "serving",
            })
            .inc();
        Ok(pair)
    }

    /// koord-manager's CA when its Secret holds a usable one (certs::adopt); an unusable one is
    /// named in a Warning Event and left alone (a new CA is issued as on any first start).
    async fn koordinator_ca(&self) -> Result<Option<CaState>, IssueError> {
        let Some(name) = &self.policy.adopt_ca_secret else {
            return Ok(None);
        };
        let Some(secret) = self.secrets().get_opt(name).await? else {
            return Ok(None);
        };
        let Some((cert, key)) = secrets::koordinator_ca_pem(&secret) else {
            return Ok(None);
        };
        match adopt::koordinator_ca(&cert, &key) {
            Ok(ca) => {
                self.event(
                    EventType::Normal,
                    "CAAdopted",
                    format!("took over the CA of Secret {name} (koord-manager's webhook): both webhooks are trusted while they run side by side"),
                )
                .await;
                Ok(Some(CaState {
                    ca,
                    previous: None,
                    phase: Phase::Stable,
                    since: Some(jiff::Timestamp::now()),
                }))
            }
            Err(e) => {
                self.event(
                    EventType::Warning,
                    "CANotAdopted",
                    format!("the CA of Secret {name} is not usable ({e}): issuing a new CA"),
                )
                .await;
                Ok(None)
            }
        }
    }

    /// One pass over the Secrets and configurations.
    pub async fn reconcile(&self, metrics: &Metrics) -> Result<Next, IssueError> {
        let now = SystemTime::now();
        let api = self.secrets();
        let ca_secret = api.get_opt(SECRET_CA).await?;
        let stored_ca = ca_secret.as_ref().and_then(secrets::read_ca);
        let stored_tls = api
            .get_opt(SECRET_TLS)
            .await?
            .as_ref()
            .and_then(secrets::read_tls);

        // The CA: keep it while it is usable; on first start take over koord-manager's when there
        // is one; a lost webhook-ca means a new one.
        let first_start = ca_secret.is_none() && stored_tls.is_none();
        let adopted = match first_start {
            true => self.koordinator_ca().await?,
            false => None,
        };
        let mut ca = match (stored_ca.clone(), adopted) {
            (Some(ca), _) => ca,
            (None, Some(ca)) => ca,
            (None, None) => {
                // A lost or unusable webhook-ca. When API servers still trust a serving pair that
                // is in place, the new CA goes through the same stages as a planned rotation: the
                // old trust (certificates only: its key is gone) stays published next to the new
                // CA, and the old pair keeps serving until both are everywhere.
                let still_trusted = stored_tls.as_ref().filter(|tls| {
                    authority::verify_serving(
                        tls.serving.cert_pem.as_bytes(),
                        tls.bundle.as_bytes(),
                        self.verify_host(),
                    )
                    .is_ok()
                });
                let ca = CaState {
                    ca: authority::issue_ca(self.policy.ca_validity)?,
                    previous: still_trusted.map(|tls| PemPair {
                        cert_pem: tls.bundle.clone(),
                        key_pem: String::new(),
                    }),
                    phase: if still_trusted.is_some() {
                        Phase::Publishing
                    } else {
                        Phase::Stable
                    },
                    since: Some(jiff::Timestamp::now()),
                };
                metrics
                    .operator
                    .cert_rotations
                    .get_or_create(&CertLabels { certificate: "ca" })
                    .inc();
                let note = if still_trusted.is_some() {
                    "webhook-ca was lost or unusable: issued a new CA, published next to the trust in place"
                } else {
                    "issued a new CA"
                };
                self.event(EventType::Normal, "CAIssued", note.to_owned())
                    .await;
                ca
            }
        };
        if ca.phase == Phase::Stable
            && authority::needs_renewal(ca.ca.cert_pem.as_bytes(), self.policy.renew_fraction, now)
        {
            ca = CaState {
                previous: Some(ca.ca.clone()),
                ca: authority::issue_ca(self.policy.ca_validity)?,
                phase: Phase::Publishing,
                since: Some(jiff::Timestamp::now()),
            };
            metrics
                .operator
                .cert_rotations
                .get_or_create(&CertLabels { certificate: "ca" })
                .inc();
            self.event(
                EventType::Normal,
                "CARotationStarted",
                "new CA published next to the old one".to_owned(),
            )
            .await;
        }
        // A rotation phase whose start time is missing or unparsable would never end: it starts now.
        if ca.phase != Phase::Stable && ca.since.is_none() {
            ca.since = Some(jiff::Timestamp::now());
        }
        if Some(&ca) != stored_ca.as_ref() {
            self.apply(&secrets::ca_secret(&ca), metrics).await?;
        }

        // The bundle trusts both CAs while a rotation is under way; serving is signed by the old CA
        // until the bundle with the new one is everywhere.
        let (bundle, signer) = match (&ca.previous, ca.phase) {
            (Some(previous), Phase::Publishing) => (
                authority::bundle([previous.cert_pem.as_str(), ca.ca.cert_pem.as_str()]),
                previous,
            ),
            (Some(previous), Phase::Draining) => (
                authority::bundle([previous.cert_pem.as_str(), ca.ca.cert_pem.as_str()]),
                &ca.ca,
            ),
            _ => (authority::bundle([ca.ca.cert_pem.as_str()]), &ca.ca),
        };
        let verify_host = self.verify_host();
        let serving = match &stored_tls {
            Some(tls)
                if authority::verify_serving(
                    tls.serving.cert_pem.as_bytes(),
                    signer.cert_pem.as_bytes(),
                    verify_host,
                )
                .is_ok()
                    // After a lost CA the old trust cannot sign: its pair serves, due for renewal
                    // or not, until Draining (verify_serving refuses it once expired).
                    && (signer.key_pem.is_empty()
                        || !authority::needs_renewal(
                            tls.serving.cert_pem.as_bytes(),
                            self.policy.renew_fraction,
                            now,
                        )) =>
            {
                tls.serving.clone()
            }
            _ => {
                // A previous CA known by its certificate only cannot sign: the new CA does (its
                // pair expired before the new CA was published everywhere).
                let signer = if signer.key_pem.is_empty() {
                    &ca.ca
                } else {
                    signer
                };
                let pair = self.issue_serving(signer, metrics)?;
                self.event(
                    EventType::Normal,
                    "CertificateIssued",
                    "issued a new serving certificate".to_owned(),
                )
                .await;
                pair
            }
        };
        let tls = TlsState { serving, bundle };
        if Some(&tls) != stored_tls.as_ref() {
            self.apply(&secrets::tls_secret(&tls, &ca), metrics).await?;
        }
        record_not_after(metrics, &ca.ca, &tls.serving);
        metrics.operator.ca_rotation_phase.set(ca.phase.number());

        let keeper = webhook_configs::Keeper {
            client: &self.client,
            fence: &self.leadership,
            absence: &self.absence,
            pods: self.pod_reach.as_ref(),
        };
        let written =
            webhook_configs::converge_all(&keeper, &self.desired, tls.bundle.as_bytes()).await?;
        self.record_writes(&written).await;
        if !written.is_empty() {
            metrics
                .operator
                .writes
                .get_or_create(&KindLabels {
                    kind: "webhookconfiguration",
                })
                .inc();
            tracing::info!("webhook configurations updated");
        }

        // Rotation steps that wait on the published bundle or on time.
        match ca.phase {
            Phase::Stable => Ok(Next::Idle),
            Phase::Publishing => {
                let published = webhook_configs::published_bundle(&self.client).await;
                let in_place =
                    matches!(&published, Ok(Ok(b)) if b.as_slice() == tls.bundle.as_bytes());
                // API servers cache webhook configurations: give every one time to load the bundle
                // with both CAs before serving moves to the new CA.
                let settled = ca.since.is_some_and(|since| {
                    let waited = jiff::Timestamp::now().duration_since(since);
                    waited.as_secs_f64() >= self.policy.publish_settle.as_secs_f64()
                });
                if in_place && settled {
                    ca.phase = Phase::Draining;
                    ca.since = Some(jiff::Timestamp::now());
                    self.apply(&secrets::ca_secret(&ca), metrics).await?;
                    self.event(
                        EventType::Normal,
                        "CARotationServing",
                        "both CAs published; serving from the new CA".to_owned(),
                    )
                    .await;
                    Ok(Next::After(Duration::ZERO))
                } else {
                    Ok(Next::After(Duration::from_secs(1)))
                }
            }
            Phase::Draining => {
                let since = ca.since.unwrap_or_else(jiff::Timestamp::now);
                let waited = jiff::Timestamp::now().duration_since(since);
                let waited = Duration::from_secs_f64(waited.as_secs_f64().max(0.0));
                if waited >= self.policy.ca_grace {
                    ca.previous = None;
                    ca.phase = Phase::Stable;
                    ca.since = Some(jiff::Timestamp::now());
                    self.apply(&secrets::ca_secret(&ca), metrics).await?;
                    self.event(
                        EventType::Normal,
                        "CARotationDone",
                        "old CA removed from the bundle".to_owned(),
                    )
                    .await;
                    Ok(Next::After(Duration::ZERO))
                } else {
                    Ok(Next::After(self.policy.ca_grace - waited))
                }
            }
        }
    }

    /// When the next renewal check is due at the latest: a tenth of the shorter lifetime, at most
    /// a minute.
    pub fn tick(&self) -> Duration {
        (self.policy.cert_validity.min(self.policy.ca_validity) / 10)
            .clamp(Duration::from_millis(500), Duration::from_secs(60))
    }
}

pub fn record_not_after(metrics: &Metrics, ca: &PemPair, serving: &PemPair) {
    for (certificate, pair) in [("ca", ca), ("serving", serving)] {
        if let Ok((_, until)) = authority::validity(pair.cert_pem.as_bytes()) {
            let secs = until
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            metrics
                .operator
                .cert_not_after
                .get_or_create(&CertLabels { certificate })
                .set(secs as i64);
        }
    }
}

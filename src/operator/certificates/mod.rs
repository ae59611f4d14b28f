//! The leader's certificate work (docs/certificates.md): issue the CA and the serving pair, renew
//! them before they run out, rotate the CA in stages, recover lost Secrets. [`Issuer::issue`] reads
//! both Secrets, asks the planner (`plan.rs`, no I/O) what comes next and writes what changed
//! behind the fence; the leader's pass (`leader_pass.rs`) then publishes the bundle in the webhook
//! configurations, and [`Issuer::advance_rotation`] moves the rotation's phase on.

mod plan;
#[cfg(test)]
mod tests;

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{EventType, Recorder};
use kube::{Client, Resource};

use super::secrets;
use super::write_error::WriteError;
use crate::certs::{CertError, PemPair, adopt, authority};
use crate::kube_events::{self, Note};
use crate::metrics::Metrics;
use crate::metrics::labels::KindLabels;
use crate::metrics::operator::CertLabels;
use crate::names::FIELD_MANAGER;
use crate::names::namespace;
use crate::names::{CA_ADOPTION_RECORD, SECRET_CA, SECRET_TLS};
use plan::{AdoptedBefore, CertEvent, KoordinatorCa, Observed};

/// The adoption record's keys: koord-manager's Secret, and when (RFC 3339).
const RECORD_SECRET: &str = "secret";
const RECORD_AT: &str = "adoptedAt";
pub use plan::{CertPolicy, Next};

/// Why a certificate pass stopped: which object, which action (reading it, writing it), and why;
/// or issuing.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("{action} {object}: {source}")]
    Api {
        action: Action,
        /// `Secret koordinator-system/webhook-ca`, say.
        object: String,
        source: WriteError,
    },
    #[error(transparent)]
    Cert(#[from] CertError),
}

/// What the certificate step did to an object when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Read,
    Write,
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Action::Read => "read",
            Action::Write => "write",
        })
    }
}

impl PassError {
    fn api(action: Action, kind: &str, name: &str, source: impl Into<WriteError>) -> Self {
        PassError::Api {
            action,
            object: format!("{kind} {}/{name}", namespace()),
            source: source.into(),
        }
    }
}

/// The leader's certificate work: the two Secrets, the adoption record, and their Events.
pub struct Issuer {
    pub client: Client,
    pub policy: CertPolicy,
    pub recorder: Recorder,
    /// Checked right before every write (fencing).
    pub leadership: super::leader::Leadership,
}

/// What the certificate step leaves for the rest of the leader's pass: the CA's state (its
/// rotation phase) and the bundle to publish.
pub struct Issued {
    pub ca: secrets::CaState,
    pub bundle: String,
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
        kube_events::record(&self.recorder, reference, Note::named(type_, reason, note)).await;
    }

    async fn apply(&self, secret: &Secret, metrics: &Metrics) -> Result<(), PassError> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let failed = |e: WriteError| PassError::api(Action::Write, "Secret", &name, e);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        self.leadership
            .check()
            .map_err(|e| failed(WriteError::from(e)))?;
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
            return Err(failed(e.into()));
        }
        metrics
            .operator
            .writes
            .get_or_create(&KindLabels { kind: "secret" })
            .inc();
        Ok(())
    }

    /// The record of an earlier takeover of koord-manager's CA, if any; why it cannot be read.
    async fn adopted_before(&self) -> Result<Option<AdoptedBefore>, String> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace());
        let record = api
            .get_opt(CA_ADOPTION_RECORD)
            .await
            .map_err(|e| format!("cannot read ConfigMap {CA_ADOPTION_RECORD}: {e}"))?;
        Ok(record.map(|r| {
            let field = |k: &str| {
                r.data
                    .as_ref()
                    .and_then(|d| d.get(k))
                    .cloned()
                    .unwrap_or_default()
            };
            AdoptedBefore {
                secret: field(RECORD_SECRET),
                at: field(RECORD_AT),
            }
        }))
    }

    /// Records that koord-manager's CA in `secret` is taken over now.
    async fn record_adoption(&self, secret: &str, metrics: &Metrics) -> Result<(), WriteError> {
        let record = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(CA_ADOPTION_RECORD.to_owned()),
                namespace: Some(namespace().to_owned()),
                labels: Some(
                    [(
                        "app.kubernetes.io/managed-by".to_owned(),
                        FIELD_MANAGER.to_owned(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            data: Some(
                [
                    (RECORD_SECRET.to_owned(), secret.to_owned()),
                    (
                        RECORD_AT.to_owned(),
                        plan::timestamp(SystemTime::now()).to_string(),
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        };
        self.leadership.check()?;
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace());
        let params = PatchParams::apply(FIELD_MANAGER).force();
        api.patch(CA_ADOPTION_RECORD, &params, &Patch::Apply(&record))
            .await?;
        metrics
            .operator
            .writes
            .get_or_create(&KindLabels { kind: "configmap" })
            .inc();
        Ok(())
    }

    /// koord-manager's CA, read on a first start only: `None` when its Secret or its keys are absent.
    async fn koordinator_ca(&self) -> Result<Option<KoordinatorCa>, PassError> {
        let Some(name) = &self.policy.adopt_ca_secret else {
            return Ok(None);
        };
        // A Secret that cannot be read (RBAC denies it, say) is a CA not adopted, said by the
        // plan's Warning Event: our own CA is issued all the same.
        let secret = match self.secrets().get_opt(name).await {
            Ok(Some(secret)) => secret,
            Ok(None) => return Ok(None),
            Err(e) => {
                return Ok(Some(KoordinatorCa {
                    secret: name.clone(),
                    ca: Err(CertError::Ca(format!("cannot read the Secret: {e}"))),
                }));
            }
        };
        Ok(
            secrets::koordinator_ca_pem(&secret).map(|(cert, key)| KoordinatorCa {
                secret: name.clone(),
                ca: adopt::koordinator_ca(&cert, &key, SystemTime::now()),
            }),
        )
    }

    /// The certificate step of the leader's pass: read both Secrets, plan, write what changed
    /// behind the fence, record; the bundle the configurations are to carry.
    pub async fn issue(&self, metrics: &Metrics) -> Result<Issued, PassError> {
        let api = self.secrets();
        let read = |name| move |e| PassError::api(Action::Read, "Secret", name, e);
        let ca_secret = api.get_opt(SECRET_CA).await.map_err(read(SECRET_CA))?;
        let tls_secret = api.get_opt(SECRET_TLS).await.map_err(read(SECRET_TLS))?;
        let first_start = plan::is_first_start(ca_secret.is_some(), tls_secret.is_some());
        let takeover = first_start && self.policy.adopt_ca_secret.is_some();
        let adopted_before = match takeover {
            true => self.adopted_before().await,
            false => Ok(None),
        };
        let koordinator_ca = match (takeover, adopted_before.as_ref()) {
            (true, Ok(None)) => self.koordinator_ca().await?,
            // Without the record it cannot be told whether the CA was taken over before: not now.
            (true, Err(why)) => Some(KoordinatorCa {
                secret: self.policy.adopt_ca_secret.clone().unwrap_or_default(),
                ca: Err(CertError::Ca(why.clone())),
            }),
            _ => None,
        };
        let observed = Observed {
            ca: ca_secret.as_ref().and_then(secrets::read_ca),
            tls: tls_secret.as_ref().and_then(secrets::read_tls),
            koordinator_ca,
            adopted_before: adopted_before.ok().flatten(),
        };
        let plan = plan::plan(observed, &self.policy, SystemTime::now())?;
        self.write(&plan, metrics).await?;
        Ok(Issued {
            ca: plan.ca,
            bundle: plan.tls.bundle,
        })
    }

    /// Writes and records what `plan` changed.
    async fn write(&self, plan: &plan::Plan, metrics: &Metrics) -> Result<(), PassError> {
        // The record before the CA: a pass that stops between the two issues a new CA next time
        // rather than taking koord-manager's over twice.
        for event in &plan.events {
            if let CertEvent::CaAdopted { secret } = event {
                self.record_adoption(secret, metrics).await.map_err(|e| {
                    PassError::api(Action::Write, "ConfigMap", CA_ADOPTION_RECORD, e)
                })?;
            }
        }
        if plan.write_ca {
            self.apply(&secrets::ca_secret(&plan.ca), metrics).await?;
        }
        if plan.write_tls {
            let tls = secrets::tls_secret(&plan.tls, &plan.ca);
            self.apply(&tls, metrics).await?;
        }
        for certificate in &plan.issued {
            metrics
                .operator
                .cert_rotations
                .get_or_create(&CertLabels {
                    certificate: certificate.label(),
                })
                .inc();
        }
        for event in &plan.events {
            self.record(event).await;
        }
        record_not_after(metrics, &plan.ca.ca, &plan.tls.serving);
        metrics
            .operator
            .ca_rotation_phase
            .set(plan.ca.phase.number());
        Ok(())
    }

    /// The rotation step that waits on the published bundle or on time: moves the CA's phase on
    /// when due; when the next pass is due.
    pub async fn advance_rotation(
        &self,
        ca: &secrets::CaState,
        bundle_in_place: bool,
        metrics: &Metrics,
    ) -> Result<Next, PassError> {
        let step = plan::phase_step(ca, bundle_in_place, &self.policy, SystemTime::now());
        if let Some((ca, event)) = &step.advance {
            self.apply(&secrets::ca_secret(ca), metrics).await?;
            metrics.operator.ca_rotation_phase.set(ca.phase.number());
            self.record(event).await;
        }
        Ok(step.next)
    }

    async fn record(&self, event: &CertEvent) {
        let type_ = match event.is_warning() {
            true => EventType::Warning,
            false => EventType::Normal,
        };
        self.event(type_, event.reason(), event.note()).await;
    }

    /// When the next renewal check is due at the latest: a tenth of the shorter lifetime, at most
    /// a minute.
    pub fn tick(&self) -> Duration {
        (self.policy.cert_validity.min(self.policy.ca_validity) / 10)
            .clamp(Duration::from_millis(500), Duration::from_secs(60))
    }
}

/// A first pass's CA and serving pair under `policy`, as its Secrets would hold them: what a later
/// pass reads and leaves alone.
#[cfg(test)]
pub fn issued_for_tests(policy: &CertPolicy) -> (secrets::CaState, secrets::TlsState) {
    let observed = Observed {
        ca: None,
        tls: None,
        koordinator_ca: None,
        adopted_before: None,
    };
    let plan = plan::plan(observed, policy, SystemTime::now()).unwrap();
    (plan.ca, plan.tls)
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

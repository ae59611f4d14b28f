//! The leader's pass, and its loop: on every kick, on its timer, and when this replica becomes
//! leader. A pass is three steps, in order:
//!
//! 1. **certificates** (`certificates/`): the Secrets read, planned, written behind the fence;
//! 2. **webhook configurations** (`webhook_keeper/`): both configurations brought to the desired
//!    state with the bundle of step 1, the pod entries split only while no rollout runs
//!    (`replicas.rs`) and narrowed as the cache allows (`pod_reach.rs`);
//! 3. **CA rotation**: the rotation's phase moved on once the published bundle is in place.
//!
//! A step that fails ends the pass; its error names the step, and the object and action that
//! failed, and is counted by step (`koord_webhook_leader_pass_failures_total`). The next pass
//! starts a second later.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::events::Recorder;
use tokio::sync::{Notify, watch};

use super::certificates::{
    Action as CertificateAction, Issuer, Next, PassError as CertificateError,
};
use super::config::{CertMode, OperatorConfig, reporter};
use super::leader::Leadership;
use super::replicas::Replicas;
use super::webhook_keeper::{self, Absence, ConfigurationError, Desired, Keeper, PodReachSource};
use crate::metrics::Metrics;
use crate::metrics::labels::KindLabels;
use crate::metrics::operator::PassStepLabels;

/// The longest one pass of the leader may take.
const PASS_TIMEOUT: Duration = Duration::from_secs(30);
/// How soon a pass that failed is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// Why a pass stopped, by step.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("certificates: {0}")]
    Certificates(#[source] CertificateError),
    #[error("webhook configurations: {0}")]
    WebhookConfigurations(#[source] ConfigurationError),
    #[error("CA rotation: {0}")]
    CaRotation(#[source] CertificateError),
    #[error("the pass took longer than {0:?}")]
    TimedOut(Duration),
}

impl StepError {
    /// The step's name, as the metric's label and the log's `step` field say it.
    pub fn step(&self) -> &'static str {
        match self {
            StepError::Certificates(_) => "certificates",
            StepError::WebhookConfigurations(_) => "webhook_configurations",
            StepError::CaRotation(_) => "ca_rotation",
            StepError::TimedOut(_) => "timeout",
        }
    }
}

/// What the leader keeps from pass to pass.
pub struct LeaderPass {
    pub issuer: Issuer,
    pub desired: Desired,
    /// Which configurations have gone missing, and since when.
    pub absence: Absence,
    /// Derives the pod entries' reach (calls narrowed only).
    pub pod_reach: Option<PodReachSource>,
    /// Whether a rollout is under way, which holds `--qos-split` back (`replicas.rs`).
    pub replicas: watch::Receiver<Replicas>,
}

impl LeaderPass {
    pub fn new(
        client: kube::Client,
        config: &OperatorConfig,
        leadership: Leadership,
        cache: crate::cache::Cache,
        replicas: watch::Receiver<Replicas>,
    ) -> Self {
        let recorder = Recorder::new(client.clone(), reporter(&config.identity));
        Self {
            issuer: Issuer {
                client,
                policy: config.policy.clone(),
                recorder,
                leadership,
            },
            desired: config.desired.clone(),
            absence: Absence::default(),
            pod_reach: config
                .desired
                .target
                .policy
                .narrows()
                .then(|| PodReachSource::new(cache, config.narrow_hold)),
            replicas,
        }
    }

    /// One pass: the three steps in order; when the next is due.
    pub async fn run_once(&self, metrics: &Metrics) -> Result<Next, StepError> {
        let issued = self
            .issuer
            .issue(metrics)
            .await
            .map_err(StepError::Certificates)?;
        self.publish(&issued.bundle, metrics)
            .await
            .map_err(StepError::WebhookConfigurations)?;
        let bundle_in_place = match issued.ca.phase {
            super::secrets::Phase::Publishing => {
                let mode = self.desired.target.policy.mode;
                // Not read, the rotation cannot tell whether to move on: the step fails, named.
                let published = webhook_keeper::published_bundle(&self.issuer.client, mode)
                    .await
                    .map_err(|e| {
                        StepError::CaRotation(CertificateError::Api {
                            action: CertificateAction::Read,
                            object: "the webhook configurations' caBundle".to_owned(),
                            source: e.into(),
                        })
                    })?;
                matches!(published, Ok(b) if b.as_slice() == issued.bundle.as_bytes())
            }
            _ => false,
        };
        self.issuer
            .advance_rotation(&issued.ca, bundle_in_place, metrics)
            .await
            .map_err(StepError::CaRotation)
    }

    /// The webhook-configurations step: both configurations carry `bundle` and the desired entries.
    async fn publish(&self, bundle: &str, metrics: &Metrics) -> Result<(), ConfigurationError> {
        let keeper = Keeper {
            client: &self.issuer.client,
            fence: &self.issuer.leadership,
            absence: &self.absence,
            pods: self.pod_reach.as_ref(),
        };
        let desired = self.desired_now().await;
        let written = webhook_keeper::converge_all(&keeper, &desired, bundle.as_bytes()).await?;
        webhook_keeper::events::record(&self.issuer.recorder, &written).await;
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
        Ok(())
    }

    /// What the configurations should say now: the pod entries split (`--qos-split`) only while
    /// every replica runs this pod template, so that no release without the split can lead
    /// meanwhile (`replicas.rs`).
    async fn desired_now(&self) -> Cow<'_, Desired> {
        if !self.desired.target.qos_split {
            return Cow::Borrowed(&self.desired);
        }
        // A leader that has just started waits for the first read rather than joining entries
        // that the next pass splits again.
        let mut replicas = self.replicas.clone();
        let first_read = replicas.wait_for(|r| *r != Replicas::Unread);
        let _ = tokio::time::timeout(Duration::from_secs(10), first_read).await;
        if replicas.borrow().allow_split() {
            return Cow::Borrowed(&self.desired);
        }
        let mut desired = self.desired.clone();
        desired.target.qos_split = false;
        Cow::Owned(desired)
    }

    /// When the next pass is due at the latest: the certificates' timer, or sooner a pod entry's
    /// narrowing held back by the hold.
    fn due(&self) -> Duration {
        let tick = self.issuer.tick();
        let narrowing = self.pod_reach.as_ref().and_then(|p| p.next_pass());
        narrowing.map_or(tick, |d| d.min(tick))
    }

    /// A pass within [`PASS_TIMEOUT`] (a hung API call must not keep a pass, and its stale view of
    /// leadership, alive); a failed step logged and counted by its name. When the next is due.
    pub async fn run_logged(&self, metrics: &Metrics) -> Duration {
        let pass = Box::pin(self.run_once(metrics));
        let outcome = match tokio::time::timeout(PASS_TIMEOUT, pass).await {
            Ok(outcome) => outcome,
            Err(_) => Err(StepError::TimedOut(PASS_TIMEOUT)),
        };
        match outcome {
            Ok(Next::Idle) => self.due(),
            Ok(Next::After(d)) => d.min(self.due()),
            Err(e) => {
                metrics
                    .operator
                    .pass_failures
                    .get_or_create(&PassStepLabels { step: e.step() })
                    .inc();
                tracing::warn!(step = e.step(), error = %e, "leader pass failed; retrying");
                RETRY
            }
        }
    }
}

/// The leader's loop: a pass on every kick, on its timer, and when this replica becomes leader.
pub async fn run(
    pass: LeaderPass,
    config: &OperatorConfig,
    mut leadership: Leadership,
    kick: Arc<Notify>,
    metrics: &Metrics,
) {
    let mut wait = Duration::ZERO;
    let mut kicked = Box::pin(kick.notified());
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = &mut kicked => {}
            _ = leadership.changed() => {}
        }
        // Registered before the pass: a Secret changed during it ends the next wait at once (a
        // `Notified` made after the pass would miss it, and the repair would wait for the timer).
        kicked = Box::pin(kick.notified());
        let is_leader = leadership.is_leader();
        metrics.operator.leader.set(i64::from(is_leader));
        wait = if is_leader && config.cert_mode == CertMode::SelfManaged {
            pass.run_logged(metrics).await
        } else {
            pass.issuer.tick()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{SECRET_CA, SECRET_TLS, namespace};
    use crate::operator::certificates::CertPolicy;
    use crate::operator::secrets;
    use crate::scripted_api::{self, Step, status};
    use hyper::http::{Method, StatusCode};

    fn policy() -> CertPolicy {
        CertPolicy {
            ca_validity: Duration::from_secs(3000),
            cert_validity: Duration::from_secs(900),
            renew_fraction: 1.0 / 3.0,
            ca_grace: Duration::from_secs(120),
            publish_settle: Duration::from_secs(10),
            hosts: vec!["koordinator-webhook-service.koordinator-system.svc".to_owned()],
            adopt_ca_secret: None,
        }
    }

    fn pass(client: kube::Client) -> LeaderPass {
        let (replicas_tx, replicas) = watch::channel(Replicas::Unread);
        drop(replicas_tx);
        LeaderPass {
            issuer: Issuer {
                client: client.clone(),
                policy: policy(),
                recorder: Recorder::new(client, reporter("test")),
                leadership: Leadership::always(),
            },
            desired: Desired {
                gates: crate::features::FeatureGates::default(),
                target: crate::install::WebhookTarget::from_flags(
                    None,
                    9443,
                    &crate::install::entry_policy::EntryPolicy::default(),
                ),
            },
            absence: Absence::default(),
            pod_reach: None,
            replicas,
        }
    }

    fn failures(metrics: &Metrics, step: &'static str) -> u64 {
        metrics
            .operator
            .pass_failures
            .get_or_create(&PassStepLabels { step })
            .get()
    }

    /// A failed step is logged and counted under its own name, and names the object and action.
    #[tokio::test]
    async fn a_failed_step_is_counted_under_its_name() {
        let metrics = Metrics::new();
        let secrets_path = format!("/api/v1/namespaces/{}/secrets", namespace());

        // The certificates step: the CA Secret cannot be read.
        let unreadable = || {
            Step::new(
                Method::GET,
                &format!("{secrets_path}/{SECRET_CA}"),
                StatusCode::INTERNAL_SERVER_ERROR,
                status(500, "InternalError"),
            )
        };
        let (client, server) = scripted_api::client(vec![unreadable(), unreadable()]);
        let certificates = pass(client);
        let e = certificates.run_once(&metrics).await.unwrap_err();
        let named = format!("certificates: read Secret {}/{SECRET_CA}: ", namespace());
        assert!(e.to_string().starts_with(&named), "{e}");
        assert_eq!(certificates.run_logged(&metrics).await, RETRY);
        drop(certificates);
        server.await.unwrap();
        assert_eq!(failures(&metrics, "certificates"), 1);
        assert_eq!(failures(&metrics, "webhook_configurations"), 0);

        // Both Secrets as a previous pass left them: nothing to write; then the mutating
        // configuration cannot be read. Twice: once to read the error, once through the loop's
        // logging and counting.
        let (ca, tls) = crate::operator::certificates::issued_for_tests(&policy());
        let mutating = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/\
                        koordinator-mutating-webhook-configuration";
        let one_pass = || {
            vec![
                Step::new(
                    Method::GET,
                    &format!("{secrets_path}/{SECRET_CA}"),
                    StatusCode::OK,
                    serde_json::to_value(secrets::ca_secret(&ca)).unwrap(),
                ),
                Step::new(
                    Method::GET,
                    &format!("{secrets_path}/{SECRET_TLS}"),
                    StatusCode::OK,
                    serde_json::to_value(secrets::tls_secret(&tls, &ca)).unwrap(),
                ),
                Step::new(
                    Method::GET,
                    mutating,
                    StatusCode::SERVICE_UNAVAILABLE,
                    status(503, "ServiceUnavailable"),
                ),
            ]
        };
        let (client, server) =
            scripted_api::client(one_pass().into_iter().chain(one_pass()).collect());
        let pass = pass(client);
        let e = pass.run_once(&metrics).await.unwrap_err();
        assert_eq!(e.step(), "webhook_configurations");
        assert!(
            e.to_string().starts_with(
                "webhook configurations: read MutatingWebhookConfiguration \
                 koordinator-mutating-webhook-configuration: "
            ),
            "{e}"
        );
        assert_eq!(pass.run_logged(&metrics).await, RETRY);
        drop(pass);
        server.await.unwrap();
        assert_eq!(failures(&metrics, "webhook_configurations"), 1);
    }
}

//! The admission framework: from a request body to a response body.
//!
//! `review.rs` knows the wire format, `webhooks.rs` the table of paths, `endpoint.rs` and `chain.rs`
//! how a typed chain of plugins runs. The plugins live in one folder per resource; registering one is a
//! line in that folder's `mod.rs`.

pub mod chain;
pub mod colocation;
pub mod configmap;
pub mod elastic_quota;
pub mod endpoint;
pub mod json_write;
pub mod node;
pub mod offload;
pub mod outcome;
pub mod patch;
pub mod pod;
pub mod reservation;
pub mod review;
pub mod settings;
pub mod skip_fields;
pub mod webhooks;

use crate::telemetry::{Clipped, MAX_LOGGED_MESSAGE, MAX_LOGGED_NAME};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use tracing::Instrument;

use crate::apis::{ElasticQuota, Reservation};
use crate::cache::Cache;
use crate::features::FeatureGates;
use crate::metrics::{DenialLabels, Metrics, WebhookLabels};
pub use endpoint::Services;
use endpoint::{Endpoint, Env, TypedEndpoint};
use review::{MalformedReview, Verdict};
pub use settings::Settings;
use webhooks::{FailurePolicy, WEBHOOKS, WebhookSpec};

/// The API server's own default when a request names no `?timeout=`.
pub const DEFAULT_API_TIMEOUT: Duration = Duration::from_secs(10);

/// Why no AdmissionReview could be answered.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("no admission endpoint at {0} (unknown path, or its feature gate is off)")]
    NotFound(String),
    #[error(transparent)]
    Malformed(#[from] MalformedReview),
}

/// Every enabled endpoint and what they share.
pub struct Admission {
    endpoints: Vec<Box<dyn Endpoint>>,
    env: Env,
}

impl Admission {
    /// The endpoints of the webhook table whose gates are on, with their registered plugins.
    pub fn new(cache: Cache, gates: FeatureGates, metrics: Metrics) -> Self {
        Self::with_services(cache, gates, metrics, Services::default())
    }

    /// As [`Admission::new`], with the outside systems plugins may write to.
    pub fn with_services(
        cache: Cache,
        gates: FeatureGates,
        metrics: Metrics,
        services: Services,
    ) -> Self {
        let endpoints = WEBHOOKS
            .iter()
            .filter(|spec| gates.enabled(spec.gate))
            .map(build_endpoint)
            .collect();
        let mut admission = Self::with_endpoints(endpoints, cache, gates, metrics);
        admission.env.services = services;
        admission
    }

    /// Exactly these endpoints (tests and benchmarks build their own chains).
    pub fn with_endpoints(
        endpoints: Vec<Box<dyn Endpoint>>,
        cache: Cache,
        gates: FeatureGates,
        metrics: Metrics,
    ) -> Self {
        Self {
            endpoints,
            env: Env {
                cache,
                gates,
                metrics,
                services: Services::default(),
                settings: Settings::default(),
            },
        }
    }

    /// The flag-given settings of the rules (defaults otherwise).
    pub fn with_settings(mut self, settings: Settings) -> Self {
        self.env.settings = settings;
        self
    }

    pub fn metrics(&self) -> &Metrics {
        &self.env.metrics
    }

    pub fn cache(&self) -> &Cache {
        &self.env.cache
    }

    pub fn gates(&self) -> &FeatureGates {
        &self.env.gates
    }

    /// The enabled endpoint at `path`.
    pub fn endpoint(&self, path: &str) -> Option<&dyn Endpoint> {
        self.endpoints
            .iter()
            .find(|e| e.spec().path == path)
            .map(|e| &**e)
    }

    /// Answers one AdmissionReview body sent to `path`. `api_timeout` is the `?timeout=` the API server
    /// sent: the answer comes before it runs out.
    pub async fn review(
        &self,
        path: &str,
        body: &[u8],
        api_timeout: Option<Duration>,
    ) -> Result<Vec<u8>, ReviewError> {
        let endpoint = self
            .endpoint(path)
            .ok_or_else(|| ReviewError::NotFound(path.to_owned()))?;
        let (head, run) = endpoint.decode(body, &self.env)?;
        let spec = endpoint.spec();
        let span = tracing::info_span!(
            "admission",
            uid = %Clipped(&head.uid, MAX_LOGGED_NAME),
            webhook = spec.path,
            operation = ?head.operation,
            namespace = %Clipped(head.namespace.as_deref().unwrap_or_default(), MAX_LOGGED_NAME),
            name = %Clipped(&head.name, MAX_LOGGED_NAME),
        );
        let verdict = self.admit(spec, run, api_timeout).instrument(span).await;
        Ok(review::encode(&head.uid, &verdict))
    }

    /// Runs a chain within the API server's deadline, with its panics contained and its outcome
    /// counted.
    async fn admit(
        &self,
        spec: &'static WebhookSpec,
        run: BoxFuture<'_, Verdict>,
        api_timeout: Option<Duration>,
    ) -> Verdict {
        let metrics = &self.env.metrics;
        let start = Instant::now();
        let api_timeout = api_timeout.unwrap_or(DEFAULT_API_TIMEOUT);
        let budget = answer_budget(api_timeout);
        let run = AssertUnwindSafe(run).catch_unwind();
        let verdict = match tokio::time::timeout(budget, run).await {
            Ok(Ok(verdict)) => verdict,
            Ok(Err(_panic)) => {
                metrics.error(spec.path, "panic");
                Verdict::deny(
                    500,
                    format!("internal error in {}: the handler panicked", spec.path),
                )
            }
            Err(_elapsed) => {
                metrics.error(spec.path, "timeout");
                timed_out(spec, budget, api_timeout)
            }
        };
        let labels = WebhookLabels { webhook: spec.path };
        metrics.requests.get_or_create(&labels).inc();
        metrics
            .request_duration
            .get_or_create(&labels)
            .observe(start.elapsed().as_secs_f64());
        if !verdict.allowed {
            metrics
                .denials
                .get_or_create(&DenialLabels {
                    webhook: spec.path,
                    code: verdict.code,
                })
                .inc();
            tracing::info!(
                code = verdict.code,
                message = %Clipped(verdict.message.as_deref().unwrap_or_default(), MAX_LOGGED_MESSAGE),
                "denied"
            );
        } else {
            tracing::debug!(patched = verdict.patch.is_some(), "allowed");
        }
        verdict
    }
}

/// The time a chain may take: the API server's timeout less a margin for the answer to travel back.
pub fn answer_budget(api_timeout: Duration) -> Duration {
    let margin = (api_timeout / 10).max(Duration::from_millis(100));
    api_timeout
        .saturating_sub(margin)
        .max(Duration::from_millis(50))
}

/// A chain that would outlive the API server's wait. Under failurePolicy Ignore the API server would
/// let the request through, so do we (with a warning); under Fail the user gets our reason instead of
/// "context deadline exceeded".
fn timed_out(spec: &WebhookSpec, budget: Duration, api_timeout: Duration) -> Verdict {
    let message = format!(
        "koord-webhook {} did not finish within {budget:?} (the API server waits {api_timeout:?})",
        spec.path
    );
    tracing::warn!("{message}");
    match spec.failure_policy {
        FailurePolicy::Fail => Verdict::deny(504, message),
        FailurePolicy::Ignore => Verdict {
            warnings: vec![message],
            ..Verdict::allow()
        },
    }
}

fn build_endpoint(spec: &'static WebhookSpec) -> Box<dyn Endpoint> {
    use webhooks::*;
    match spec.path {
        MUTATE_POD => Box::new(
            TypedEndpoint::<Pod>::mutating_with_differ(spec, pod::mutators(), patch::pod::diff)
                .skipping(&pod::UNTOUCHED_BY_PLUGINS),
        ),
        VALIDATE_POD => Box::new(
            TypedEndpoint::<Pod>::validating(spec, pod::validators())
                .skipping(&pod::UNTOUCHED_BY_PLUGINS),
        ),
        MUTATE_ELASTIC_QUOTA => Box::new(TypedEndpoint::<ElasticQuota>::mutating(
            spec,
            elastic_quota::mutators(),
        )),
        VALIDATE_ELASTIC_QUOTA => Box::new(TypedEndpoint::<ElasticQuota>::validating(
            spec,
            elastic_quota::validators(),
        )),
        MUTATE_NODE_STATUS => Box::new(TypedEndpoint::<node::Node>::mutating(
            spec,
            node::status_mutators(),
        )),
        VALIDATE_NODE => Box::new(TypedEndpoint::<node::Node>::validating(
            spec,
            node::validators(),
        )),
        MUTATE_RESERVATION => Box::new(TypedEndpoint::<Reservation>::mutating(
            spec,
            reservation::mutators(),
        )),
        VALIDATE_CONFIGMAP => Box::new(TypedEndpoint::<ConfigMap>::validating(
            spec,
            configmap::validators(),
        )),
        other => unreachable!("webhook table entry {other} has no endpoint"),
    }
}

#[cfg(test)]
mod tests;

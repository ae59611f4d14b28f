//! The admission framework: from a request body to a response body.
//!
//! `review.rs` knows the wire format (the table of paths is `crate::entries`), `endpoint.rs` one
//! review from body to answer, `chain.rs` how plugins run, `env.rs` what requests share and `ports/` what
//! plugins reach outside the process through. The plugins live in one folder per resource;
//! registering one is a line in that folder's `mod.rs`.

pub mod actions;
pub(crate) mod caller;
pub(crate) mod chain;
pub(crate) mod colocation;
pub(crate) mod colocation_profile;
pub(crate) mod configmap;
pub(crate) mod deadline;
pub(crate) mod decode;
pub mod elastic_quota;
pub(crate) mod endpoint;
pub(crate) mod env;
pub(crate) mod json_write;
pub(crate) mod message_clip;
pub(crate) mod node;
pub(crate) mod offload;
pub(crate) mod open_object;
pub(crate) mod outcome;
pub(crate) mod patch;
pub(crate) mod pod;
pub(crate) mod pod_reach_guard;
pub(crate) mod ports;
mod registry;
pub(crate) mod reservation;
pub(crate) mod review;
pub mod rule_flags;
#[cfg(test)]
pub(crate) mod rule_harness;
pub mod settings;

use std::time::Duration;

use crate::cache::Cache;
use crate::entries::ENDPOINTS;
use crate::features::FeatureGates;
use crate::memory::BodyShape;
use crate::metrics::Metrics;
pub use deadline::Deadline;
pub use endpoint::Endpoint;
use env::Env;
pub use env::Services;
use registry::build_endpoint;
pub use registry::registered_rules;
use review::NoVerdict;
pub use settings::Settings;

/// Why no AdmissionReview could be answered.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("no admission endpoint at {0} (unknown path, or its feature gate is off)")]
    NotFound(String),
    #[error(transparent)]
    Unanswered(#[from] NoVerdict),
}

/// Every enabled endpoint and what they share.
pub struct Admission {
    endpoints: Vec<Endpoint>,
    env: Env,
}

impl Admission {
    /// The endpoints of the webhook table whose gates are on, with their registered plugins.
    pub fn new(cache: Cache, gates: FeatureGates, metrics: Metrics) -> Self {
        let endpoints = ENDPOINTS
            .iter()
            .filter(|spec| gates.enabled(spec.gate))
            .map(build_endpoint)
            .collect();
        Self::with_endpoints(endpoints, cache, gates, metrics)
    }

    /// The outside systems plugins may write to (none: `review`, `serve --state`, most tests).
    pub fn with_services(mut self, services: Services) -> Self {
        self.env.services = services;
        self
    }

    /// Exactly these endpoints (tests and benchmarks build their own chains).
    pub fn with_endpoints(
        endpoints: Vec<Endpoint>,
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

    /// The enabled endpoint at `path`.
    pub fn endpoint(&self, path: &str) -> Option<&Endpoint> {
        self.endpoints.iter().find(|e| e.spec().path == path)
    }

    /// Answers one AdmissionReview body sent to `path` (the `review` command and tests; the server
    /// routes to [`Admission::review_at`]).
    pub async fn review(
        &self,
        path: &str,
        body: &[u8],
        api_timeout: Option<Duration>,
    ) -> Result<Vec<u8>, ReviewError> {
        let endpoint = self
            .endpoint(path)
            .ok_or_else(|| ReviewError::NotFound(path.to_owned()))?;
        let deadline = Deadline::starting_now(api_timeout);
        let shape = BodyShape::of(body);
        Ok(endpoint
            .review(
                bytes::Bytes::copy_from_slice(body),
                shape,
                &self.env,
                deadline,
            )
            .await?)
    }

    /// Every enabled endpoint's path, with the id the server routes it by.
    pub fn paths(&self) -> impl Iterator<Item = (EndpointId, &'static str)> + '_ {
        self.endpoints
            .iter()
            .enumerate()
            .map(|(i, e)| (EndpointId(i), e.spec().path))
    }

    /// Answers one AdmissionReview body sent to the endpoint `id` by `deadline` (the API server's
    /// `?timeout=` from when the request arrived).
    pub async fn review_at(
        &self,
        id: EndpointId,
        body: bytes::Bytes,
        shape: BodyShape,
        deadline: Deadline,
    ) -> Result<Vec<u8>, NoVerdict> {
        self.endpoints[id.0]
            .review(body, shape, &self.env, deadline)
            .await
    }
}

/// An enabled endpoint of one [`Admission`], as [`Admission::paths`] hands it out.
#[derive(Clone, Copy, Debug)]
pub struct EndpointId(usize);

#[cfg(test)]
mod tests;

//! The leader's recount of each quota's `child-request` from the pods that exist.
//!
//! Quota evaluation adds a pod's requests when it admits the pod, before the pod is stored. A pod
//! that another webhook or the API server's ResourceQuota rejects afterwards, or that ends or is
//! deleted, would stay counted for good. So the leader recounts: the requests of the pods that hold
//! resources, per quota, by the same rules evaluation uses.
//!
//! A pod admitted a moment ago may not be stored yet, and a plain recount would drop it. So a quota
//! is recounted only when evaluation has not written it for `quiet` (longer than any admission takes
//! to be stored or refused), and written with the resourceVersion read after the pods were listed:
//! an admission in between makes the write a conflict, and the quota waits for the next pass.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};

use super::leader::Leadership;
use crate::admission::elastic_quota::evaluation::{CHILD_REQUEST, CHILD_REQUEST_UPDATED, Ledger};
use crate::admission::elastic_quota::pod_evaluation::{charged_requests, evaluated_quota};
use crate::admission::elastic_quota::pod_quota::pod_namespace;
use crate::apis::ElasticQuota;
use crate::apis::meta::annotation;
use crate::cache::Cache;
use crate::features::FeatureGates;
use crate::resources::Resources;

/// Pods per page when listing them all.
const PAGE: u32 = 500;

pub struct Recount {
    pub client: Client,
    pub cache: Cache,
    pub gates: FeatureGates,
    pub leadership: Leadership,
    /// How long after evaluation's last write a quota may be recounted.
    pub quiet: Duration,
}

/// What one pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pass {
    pub corrected: Vec<String>,
    pub left_busy: usize,
}

impl Recount {
    pub async fn run(self) {
        let interval = (self.quiet / 2).max(Duration::from_secs(1));
        loop {
            tokio::time::sleep(interval).await;
            if !self.leadership.is_leader() {
                continue;
            }
            match tokio::time::timeout(Duration::from_secs(60), self.pass()).await {
                Ok(Ok(pass)) if !pass.corrected.is_empty() => {
                    tracing::info!(quotas = ?pass.corrected, "child-request recounted from the pods")
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "child-request recount failed"),
                Err(_) => tracing::warn!("child-request recount timed out"),
            }
        }
    }

    /// One recount of every quota that limits pods.
    pub async fn pass(&self) -> kube::Result<Pass> {
        let quotas: Vec<_> = self
            .cache
            .elastic_quotas
            .state()
            .into_iter()
            .filter(|q| Ledger::read(q).is_ok_and(|l| l.limits_pods()))
            .collect();
        let mut pass = Pass::default();
        if quotas.is_empty() {
            return Ok(pass);
        }
        let counted = self.requests_by_quota().await?;
        let api_of = |q: &ElasticQuota| -> Api<ElasticQuota> {
            Api::namespaced(
                self.client.clone(),
                q.metadata.namespace.as_deref().unwrap_or_default(),
            )
        };
        for cached in quotas {
            let name = cached.metadata.name.clone().unwrap_or_default();
            let api = api_of(&cached);
            // Read after the pods were listed: a write by evaluation since then is a conflict below.
            let Some(mut quota) = api.get_opt(&name).await? else {
                continue;
            };
            let Ok(ledger) = Ledger::read(&quota) else {
                continue;
            };
            let usage = counted
                .get(&name)
                .map(|r| ledger.usage_of(r))
                .unwrap_or_default();
            let mut recorded = annotation(&quota, CHILD_REQUEST)
                .and_then(|j| Resources::parse_json(j).ok())
                .unwrap_or_default();
            recorded.0.retain(|_, q| !q.is_zero());
            if recorded == usage {
                continue;
            }
            let quiet_since = annotation(&quota, CHILD_REQUEST_UPDATED)
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .map(|t| jiff::Timestamp::now().duration_since(t).as_secs_f64());
            if quiet_since.is_some_and(|s| s < self.quiet.as_secs_f64()) {
                pass.left_busy += 1;
                continue;
            }
            quota
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(
                    CHILD_REQUEST.to_owned(),
                    serde_json::to_string(&usage.to_quantities()).unwrap_or_default(),
                );
            if self.leadership.check().is_err() {
                return Ok(pass);
            }
            match api.replace(&name, &PostParams::default(), &quota).await {
                Ok(_) => pass.corrected.push(name),
                Err(kube::Error::Api(e)) if e.code == 409 => pass.left_busy += 1,
                Err(e) => return Err(e),
            }
        }
        Ok(pass)
    }

    /// The summed requests of the pods that hold resources, by the quota evaluation charges them to.
    async fn requests_by_quota(&self) -> kube::Result<HashMap<String, Resources>> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let mut by_quota: HashMap<String, Resources> = HashMap::new();
        let mut params = ListParams::default().limit(PAGE);
        loop {
            let page = pods.list(&params).await?;
            for pod in &page.items {
                let namespace = pod_namespace(pod, None);
                let Some(quota) = evaluated_quota(pod, namespace, &self.cache, &self.gates) else {
                    continue;
                };
                if let Ok(Some(requests)) = charged_requests(pod, &self.gates) {
                    by_quota.entry(quota).or_default().add(&requests);
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(by_quota),
            }
        }
    }
}

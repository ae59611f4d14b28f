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
//!
//! Listing every pod of a large cluster every few seconds would load the API server for nothing: a
//! recount can only change something after evaluation wrote a quota or a pod went away. So after a
//! pass that found everything right, the next one lists pods only once the cache shows either (a
//! quota's evaluation annotations changed, a pod deleted), or after `FULL_EVERY` regardless (pods
//! that ended but are not deleted yet, a resize).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, ListParams};

use super::leader::Leadership;
use crate::admission::pod::object::Pod;
use crate::admission::pod::quota::evaluation::{charged_requests, evaluated_quota};
use crate::admission::pod::quota::evaluator::{
    CHILD_REQUEST, CHILD_REQUEST_UPDATED, ChildRequests,
};
use crate::admission::pod::quota::pod_namespace;
use crate::apis::ElasticQuota;
use crate::apis::meta::annotation;
use crate::cache::Cache;
use crate::features::FeatureGates;
use crate::resources::Resources;

/// Pods per page when listing them all.
const PAGE: u32 = 500;

/// The longest a recount waits without a sign of change.
const FULL_EVERY: Duration = Duration::from_secs(600);

/// What the cache shows of the things a recount follows: pod departures, and each pod-limiting
/// quota's evaluation annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    departures: u64,
    quotas: Vec<(String, Option<String>, Option<String>)>,
}

/// When the last pass that found every quota right ran, and what the cache showed before it.
struct Clean {
    marker: Marker,
    at: Instant,
}

/// Whether a pass must list the pods: never a clean one, or something changed since, or it is old.
fn due(last: Option<&Clean>, now: &Marker, at: Instant) -> bool {
    last.is_none_or(|c| c.marker != *now || at.duration_since(c.at) >= FULL_EVERY)
}

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
        let mut last_clean: Option<Clean> = None;
        loop {
            tokio::time::sleep(interval).await;
            if !self.leadership.is_leader() {
                last_clean = None;
                continue;
            }
            let marker = self.marker();
            let now = Instant::now();
            if !due(last_clean.as_ref(), &marker, now) {
                continue;
            }
            match tokio::time::timeout(Duration::from_secs(60), self.pass()).await {
                Ok(Ok(pass)) if !pass.corrected.is_empty() => {
                    tracing::info!(quotas = ?pass.corrected, "child-request recounted from the pods")
                }
                Ok(Ok(pass)) if pass.left_busy == 0 => {
                    last_clean = Some(Clean { marker, at: now });
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "child-request recount failed"),
                Err(_) => tracing::warn!("child-request recount timed out"),
            }
        }
    }

    /// The cached quotas that limit pods: the only ones evaluation writes and a recount corrects.
    fn limiting_quotas(&self) -> Vec<std::sync::Arc<ElasticQuota>> {
        let mut quotas = self.cache.elastic_quotas.state();
        quotas.retain(|q| ChildRequests::read(q).is_ok_and(|l| l.limits_pods()));
        quotas
    }

    /// What the cache shows now of the things a recount follows.
    pub fn marker(&self) -> Marker {
        let mut quotas: Vec<_> = self
            .limiting_quotas()
            .iter()
            .map(|q| {
                let key = format!(
                    "{}/{}",
                    q.metadata.namespace.as_deref().unwrap_or_default(),
                    q.metadata.name.as_deref().unwrap_or_default()
                );
                let text = |k| annotation(&**q, k).map(str::to_owned);
                (key, text(CHILD_REQUEST_UPDATED), text(CHILD_REQUEST))
            })
            .collect();
        quotas.sort();
        Marker {
            departures: self.cache.pods.departures(),
            quotas,
        }
    }

    /// One recount of every quota that limits pods.
    pub async fn pass(&self) -> kube::Result<Pass> {
        let quotas = self.limiting_quotas();
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
            let Ok(account) = ChildRequests::read(&quota) else {
                continue;
            };
            let usage = counted
                .get(&name)
                .map(|r| account.usage_of(r))
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
            match api
                .replace(&name, &crate::names::post_params(), &quota)
                .await
            {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn marker(departures: u64, updated: &str) -> Marker {
        Marker {
            departures,
            quotas: vec![("ns/q".into(), Some(updated.into()), Some("{}".into()))],
        }
    }

    #[test]
    fn lists_pods_again_only_after_a_change_or_a_long_quiet() {
        let t0 = Instant::now();
        assert!(due(None, &marker(0, "a"), t0), "no clean pass yet");
        let clean = Clean {
            marker: marker(0, "a"),
            at: t0,
        };
        let soon = t0 + Duration::from_secs(30);
        assert!(!due(Some(&clean), &marker(0, "a"), soon));
        assert!(due(Some(&clean), &marker(1, "a"), soon), "a pod deleted");
        assert!(due(Some(&clean), &marker(0, "b"), soon), "evaluation wrote");
        assert!(due(Some(&clean), &marker(0, "a"), t0 + FULL_EVERY));
    }
}

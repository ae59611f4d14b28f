//! The leader's recount of each quota's `child-request` from the pods that exist.
//!
//! Quota evaluation adds a pod's requests when it admits the pod, before the pod is stored. A pod
//! that another webhook or the API server's ResourceQuota rejects afterwards, that ends or is
//! deleted, or a review forged by a caller that is not the API server, would stay counted for
//! good. So the leader recounts: `child-request` becomes what the pods in the cache charge (the
//! pod index keeps each pod's charge, by the rules evaluation uses) plus the admissions of the
//! recent-admissions record whose pod is not in the cache yet and that are younger than the window
//! (`admission/pod/quota/recent.rs`). An admission that never becomes a pod stops counting when its
//! window ends, whatever is admitted after it.
//!
//! The recount reads nothing from the API server: pods and quotas come from the cache, and the
//! write (a merge patch of the two annotations: the cache keeps a slim quota, never written back
//! whole) names the cached quota's resourceVersion, so a quota evaluation wrote since the cache saw
//! it is a conflict, left for the next pass. Quota names are unique for evaluation (it refuses a
//! pod whose quota name two quotas share), so such quotas are left alone here too.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

use super::leader::Leadership;
use crate::admission::pod::quota::evaluation::evaluated_quota;
use crate::admission::pod::quota::evaluator::{CHILD_REQUEST, ChildRequests};
use crate::admission::pod::quota::recent::{self, RECENT};
use crate::apis::ElasticQuota;
use crate::apis::meta::annotation;
use crate::cache::Cache;
use crate::features::FeatureGates;
use crate::resources::Resources;

pub struct Recount {
    pub client: Client,
    pub cache: Cache,
    pub gates: FeatureGates,
    pub leadership: Leadership,
    /// How long an admitted pod may take to reach the cache (`--child-request-recount-quiet`).
    pub quiet: Duration,
}

/// What one pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pass {
    pub corrected: Vec<String>,
    pub left_busy: usize,
}

/// What a quota's `child-request` and recent-admissions record should say.
#[derive(Debug, PartialEq)]
pub struct Recounted {
    pub used: Resources,
    pub recent: Vec<recent::Admitted>,
}

/// The recount of one quota: the charge of its pods in the cache (`stored`, with their
/// `namespace/name`), plus its recent admissions still on their way at `now`.
pub fn recount(
    account: &ChildRequests,
    quota: &ElasticQuota,
    stored: Option<&(Resources, std::collections::HashSet<String>)>,
    now: i64,
    window: Duration,
) -> Recounted {
    let (charged, pods) = match stored {
        Some((charged, pods)) => (account.usage_of(charged), Some(pods)),
        None => (Resources::default(), None),
    };
    let (recent, in_flight) =
        recent::in_flight(&recent::read(quota), now, window.as_secs() as i64, |pod| {
            pods.is_some_and(|p| p.contains(pod))
        });
    let mut used = charged;
    used.add(&account.usage_of(&in_flight));
    Recounted {
        used: used.without_zeros(),
        recent,
    }
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
                    let shown = &pass.corrected[..pass.corrected.len().min(LOGGED_NAMES)];
                    tracing::info!(
                        corrected = pass.corrected.len(),
                        quotas = ?shown,
                        left_busy = pass.left_busy,
                        "child-request recounted from the pods"
                    )
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "child-request recount failed"),
                Err(_) => tracing::warn!("child-request recount timed out"),
            }
        }
    }

    /// One recount of every quota that limits pods.
    pub async fn pass(&self) -> kube::Result<Pass> {
        let mut pass = Pass::default();
        let quotas = self.cache.elastic_quotas.state();
        let mut named: HashMap<&str, usize> = HashMap::new();
        for q in &quotas {
            *named
                .entry(q.metadata.name.as_deref().unwrap_or_default())
                .or_default() += 1;
        }
        // One quota read at a time: what a pass parses of every quota (10,000 at the size
        // Koordinator's clusters run) is never held at once.
        let unique = |q: &&Arc<ElasticQuota>| {
            named.get(q.metadata.name.as_deref().unwrap_or_default()) == Some(&1)
        };
        let limiting = |q: &ElasticQuota| ChildRequests::read(q).ok().filter(|a| a.limits_pods());
        if !quotas.iter().filter(unique).any(|q| limiting(q).is_some()) {
            return Ok(pass);
        }
        let counted = self.cache.pods.charged_by_quota(|namespace, label| {
            evaluated_quota(label, namespace, &self.cache, &self.gates)
        });
        let now = jiff::Timestamp::now().as_second();
        // What to write, then the writes several at a time: at L1 a first pass can correct 9,900
        // quotas, which one after the other took 51 s of the pass's 60.
        let mut writes = Vec::new();
        for cached in quotas.iter().filter(unique) {
            let Some(account) = limiting(cached) else {
                continue;
            };
            let name = cached.metadata.name.clone().unwrap_or_default();
            let target = recount(&account, cached, counted.get(&name), now, self.quiet);
            let mut recorded = annotation(&**cached, CHILD_REQUEST)
                .and_then(|j| Resources::parse_json(j).ok())
                .unwrap_or_default();
            recorded.0.retain(|_, q| !q.is_zero());
            if recorded == target.used && recent::read(cached) == target.recent {
                continue;
            }
            let patch = serde_json::json!({"metadata": {
                "resourceVersion": cached.metadata.resource_version,
                "annotations": {
                    CHILD_REQUEST: serde_json::to_string(&target.used.to_quantities()).unwrap_or_default(),
                    RECENT: recent::to_json(&target.recent),
                },
            }});
            let namespace = cached.metadata.namespace.clone().unwrap_or_default();
            writes.push((namespace, name, patch, recorded != target.used));
        }
        drop(counted);
        let written: Vec<_> = futures::stream::iter(writes)
            .map(|(namespace, name, patch, corrects)| async move {
                if self.leadership.check().is_err() {
                    return (name, corrects, Ok(false));
                }
                let api: Api<ElasticQuota> = Api::namespaced(self.client.clone(), &namespace);
                // The cached resourceVersion: a write by evaluation since the cache saw it conflicts.
                let params = PatchParams {
                    field_manager: Some(crate::names::FIELD_MANAGER.to_owned()),
                    ..Default::default()
                };
                let result = api.patch(&name, &params, &Patch::Merge(&patch)).await;
                (name, corrects, result.map(|_| true))
            })
            .buffer_unordered(WRITES_IN_FLIGHT)
            .collect()
            .await;
        let mut failed = None;
        for (name, corrects, result) in written {
            match result {
                Ok(true) if corrects => pass.corrected.push(name),
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => pass.left_busy += 1,
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(pass),
        }
    }
}

/// Recount writes in flight at once.
const WRITES_IN_FLIGHT: usize = 8;

/// Quota names a log line lists at most (a first pass at L1 corrects thousands).
const LOGGED_NAMES: usize = 10;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn quota(recent: &str) -> ElasticQuota {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": "q", "namespace": "ns",
                         "annotations": {CHILD_REQUEST: r#"{"cpu":"9"}"#, RECENT: recent}},
            "spec": {"max": {"cpu": "10"}}
        }))
        .unwrap()
    }

    #[test]
    fn a_forged_admission_stops_counting_when_its_window_ends() {
        // Two pods stored (2 cpu), one admitted 10 s ago on its way (1 cpu), and a forged
        // admission of 4 cpu 70 s ago that never became a pod.
        let q = quota(
            r#"[{"pod":"ns/forged","at":30,"requests":{"cpu":"4"}},
                {"pod":"ns/coming","at":90,"requests":{"cpu":"1"}},
                {"pod":"ns/a","at":95,"requests":{"cpu":"1"}}]"#,
        );
        let account = ChildRequests::read(&q).unwrap();
        let stored = (
            Resources::parse_json(r#"{"cpu":"2"}"#).unwrap(),
            HashSet::from(["ns/a".to_owned(), "ns/b".to_owned()]),
        );
        let r = recount(&account, &q, Some(&stored), 100, Duration::from_secs(60));
        assert_eq!(r.used.describe(), "cpu=3");
        assert_eq!(r.recent.len(), 1);
        assert_eq!(r.recent[0].pod, "ns/coming");
        // Without pods and past every window: nothing.
        let r = recount(&account, &q, None, 1_000, Duration::from_secs(60));
        assert!(r.used.is_empty() && r.recent.is_empty());
    }
}

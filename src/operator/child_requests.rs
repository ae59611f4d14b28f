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
use std::sync::atomic::{AtomicU64, Ordering};
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
use crate::cache::pod_index::ChargeGroup;
use crate::features::FeatureGates;
use crate::metrics::operator::{OperatorMetrics, RecountPartLabels};
use crate::resources::Resources;

pub struct Recount {
    pub client: Client,
    pub cache: Cache,
    pub gates: FeatureGates,
    pub leadership: Leadership,
    /// How long an admitted pod may take to reach the cache (`--child-request-recount-quiet`).
    pub quiet: Duration,
    pub metrics: OperatorMetrics,
}

/// What one pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pass {
    pub corrected: Vec<String>,
    pub left_busy: usize,
    /// How long it held the pod index.
    pub index_held: Duration,
    /// Its own work: grouping, summing and each quota's recount, without waiting for writes.
    pub compute: Duration,
}

/// What a quota's `child-request` and recent-admissions record should say.
#[derive(Debug, PartialEq)]
pub struct Recounted {
    pub used: Resources,
    pub recent: Vec<recent::Admitted>,
}

/// The recount of one quota: the charge of its pods in the cache (`charged`), plus its recent
/// admissions still on their way at `now` (`stored`: whether the cache has that `namespace/name`
/// charged to this quota).
pub fn recount(
    account: &ChildRequests,
    quota: &ElasticQuota,
    charged: Option<&Resources>,
    stored: impl Fn(&str) -> bool,
    now: i64,
    window: Duration,
) -> Recounted {
    let charged = charged.map(|c| account.usage_of(c)).unwrap_or_default();
    let (recent, in_flight) =
        recent::in_flight(&recent::read(quota), now, window.as_secs() as i64, stored);
    let mut used = charged;
    used.add(&account.usage_of(&in_flight));
    Recounted {
        used: used.without_zeros(),
        recent,
    }
}

/// The summed charges of the pods by the quota `quota_of(namespace, label)` names (`None`: a quota
/// evaluation skips).
pub fn charged_by_quota(
    groups: &[ChargeGroup],
    quota_of: impl Fn(&str, Option<&str>) -> Option<String>,
) -> HashMap<String, Resources> {
    let mut by_quota: HashMap<String, Resources> = HashMap::new();
    for group in groups {
        let Some(quota) = quota_of(&group.namespace, group.label.as_deref()) else {
            continue;
        };
        let sum = by_quota.entry(quota).or_default();
        for _ in 0..group.pods {
            sum.add(&group.charge);
        }
    }
    by_quota
}

impl Recount {
    pub async fn run(self) {
        let interval = (self.quiet / 2).max(Duration::from_secs(1));
        loop {
            tokio::time::sleep(interval).await;
            if !self.leadership.is_leader() {
                continue;
            }
            let started = std::time::Instant::now();
            let result = tokio::time::timeout(Duration::from_secs(60), self.pass()).await;
            self.metrics.recount_passes.inc();
            self.record("pass", started.elapsed());
            if let Ok(Ok(pass)) = &result {
                self.record("compute", pass.compute);
                self.record("pod_index_lock", pass.index_held);
            }
            match result {
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

    fn record(&self, part: &'static str, took: Duration) {
        let labels = RecountPartLabels { part };
        self.metrics
            .recount_last
            .get_or_create(&labels)
            .set(took.as_secs_f64());
    }

    /// The write that sets this quota to its recount, if it says anything else.
    fn target_of(
        &self,
        cached: &ElasticQuota,
        counted: &HashMap<String, Resources>,
        quota_of: &impl Fn(&str, Option<&str>) -> Option<String>,
        now: i64,
    ) -> Option<Write> {
        let account = limiting(cached)?;
        let name = cached.metadata.name.clone().unwrap_or_default();
        let stored = |pod: &str| {
            let (namespace, pod_name) = pod.split_once('/').unwrap_or(("", pod));
            self.cache
                .pods
                .charging_label(namespace, pod_name)
                .is_some_and(|label| quota_of(namespace, label.as_deref()) == Some(name.clone()))
        };
        let target = recount(
            &account,
            cached,
            counted.get(&name),
            stored,
            now,
            self.quiet,
        );
        let recorded = annotation(cached, CHILD_REQUEST)
            .and_then(|j| Resources::parse_json(j).ok())
            .unwrap_or_default()
            .without_zeros();
        if recorded == target.used && recent::read(cached) == target.recent {
            return None;
        }
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": cached.metadata.resource_version,
            "annotations": {
                CHILD_REQUEST: serde_json::to_string(&target.used.to_quantities()).unwrap_or_default(),
                RECENT: recent::to_json(&target.recent),
            },
        }});
        let namespace = cached.metadata.namespace.clone().unwrap_or_default();
        Some((namespace, name, patch, recorded != target.used))
    }

    /// One recount of every quota that limits pods.
    pub async fn pass(&self) -> kube::Result<Pass> {
        let mut pass = Pass::default();
        let started = std::time::Instant::now();
        // The keys of the quotas to recount, not the quotas: each is read from the cache when its
        // turn comes. A snapshot of every quota held through the pass's writes kept each quota's
        // old copy alive beside the new one its write's watch event brings: at L1 a first pass
        // doubled the quotas' memory for its 20 s, and the allocator kept that peak (heaptrack).
        let keys: Vec<(String, String)> = {
            let quotas = self.cache.elastic_quotas.state();
            let mut named: HashMap<&str, usize> = HashMap::new();
            for q in &quotas {
                *named
                    .entry(q.metadata.name.as_deref().unwrap_or_default())
                    .or_default() += 1;
            }
            quotas
                .iter()
                .filter(|q| named.get(q.metadata.name.as_deref().unwrap_or_default()) == Some(&1))
                .filter(|q| limiting(q).is_some())
                .map(|q| {
                    let namespace = q.metadata.namespace.clone().unwrap_or_default();
                    (namespace, q.metadata.name.clone().unwrap_or_default())
                })
                .collect()
        };
        if keys.is_empty() {
            return Ok(pass);
        }
        let locked = std::time::Instant::now();
        let groups = self.cache.pods.charge_groups();
        pass.index_held = locked.elapsed();
        let quota_of = |namespace: &str, label: Option<&str>| {
            evaluated_quota(label, namespace, &self.cache, &self.gates)
        };
        let counted = charged_by_quota(&groups, quota_of);
        drop(groups);
        let now = jiff::Timestamp::now().as_second();
        // Each quota's write is computed as the writes go, several at a time: at L1 a first pass can
        // correct 9,900 quotas (one after the other that took 51 s of the pass's 60), and a list of
        // every patch built first would be held for all of them.
        // Nanoseconds of the pass's own work (a `Cell` would make the pass's future not `Send`).
        let computing = AtomicU64::new(started.elapsed().as_nanos() as u64);
        let computing = &computing;
        let counted = &counted;
        let quota_of = &quota_of;
        let targets = keys.into_iter().filter_map(|(namespace, name)| {
            let began = std::time::Instant::now();
            let target = self
                .cache
                .elastic_quotas
                .get(Some(&namespace), &name)
                .and_then(|cached| self.target_of(&cached, counted, quota_of, now));
            computing.fetch_add(began.elapsed().as_nanos() as u64, Ordering::Relaxed);
            target
        });
        // Boxed: the iterator's closures borrow, and an unboxed stream of them held across `.await`
        // trips rustc's `Send` inference for higher-ranked lifetimes.
        let written: Vec<_> = futures::stream::iter(targets)
            .boxed()
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
                // Only the metadata comes back: the answer is not read beyond its status.
                let result = api
                    .patch_metadata(&name, &params, &Patch::Merge(&patch))
                    .await;
                (name, corrects, result.map(|_| true))
            })
            .buffer_unordered(WRITES_IN_FLIGHT)
            .collect()
            .await;
        pass.compute = Duration::from_nanos(computing.load(Ordering::Relaxed));
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

/// A quota's account, if it limits pods.
fn limiting(quota: &ElasticQuota) -> Option<ChildRequests> {
    ChildRequests::read(quota).ok().filter(|a| a.limits_pods())
}

/// One quota's correction: its namespace and name, the merge patch, and whether it changes
/// `child-request` (or only the recent-admissions record).
type Write = (String, String, serde_json::Value, bool);

/// Recount writes in flight at once.
const WRITES_IN_FLIGHT: usize = 8;

/// Quota names a log line lists at most (a first pass at L1 corrects thousands).
const LOGGED_NAMES: usize = 10;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

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
        let charged = Resources::parse_json(r#"{"cpu":"2"}"#).unwrap();
        let stored = HashSet::from(["ns/a".to_owned(), "ns/b".to_owned()]);
        let r = recount(
            &account,
            &q,
            Some(&charged),
            |pod| stored.contains(pod),
            100,
            Duration::from_secs(60),
        );
        assert_eq!(r.used.describe(), "cpu=3");
        assert_eq!(r.recent.len(), 1);
        assert_eq!(r.recent[0].pod, "ns/coming");
        // Without pods and past every window: nothing.
        let r = recount(
            &account,
            &q,
            None,
            |_| false,
            1_000,
            Duration::from_secs(60),
        );
        assert!(r.used.is_empty() && r.recent.is_empty());
    }

    #[test]
    fn charges_are_summed_by_the_quota_each_group_resolves_to() {
        let group = |namespace: &str, label: Option<&str>, cpu: &str, pods| ChargeGroup {
            namespace: namespace.to_owned(),
            label: label.map(Into::into),
            charge: Arc::new(Resources::parse_json(&format!(r#"{{"cpu":"{cpu}"}}"#)).unwrap()),
            pods,
        };
        let groups = [
            group("a", Some("q"), "1", 3),
            group("b", Some("q"), "500m", 2),
            group("b", None, "2", 1),
            group("skipped", None, "7", 4),
        ];
        let by_quota = charged_by_quota(&groups, |namespace, label| {
            (namespace != "skipped").then(|| label.unwrap_or(namespace).to_owned())
        });
        assert_eq!(by_quota["q"].describe(), "cpu=4", "3 x 1 + 2 x 0.5");
        assert_eq!(
            by_quota["b"].describe(),
            "cpu=2",
            "unlabelled: its namespace's"
        );
        assert_eq!(by_quota.len(), 2, "a group evaluation skips counts nowhere");
    }
}

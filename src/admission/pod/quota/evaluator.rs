//! Quota evaluation. A pod is admitted only if the quota's recorded child requests plus the
//! pod's stay within its limit; admitted pods are recorded in the `child-request` annotation.
//!
//! Concurrent pods for one quota are coalesced: they queue per quota, and one task evaluates the whole
//! queue against one read of the quota and records it with one write (retried on conflict), so a
//! burst costs a few writes and can never admit more than the limit allows.

use crate::admission::outcome::Rejection;
use crate::apis::meta::annotation;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::recent;
use crate::admission::ports::{QuotaStore, StoreError};
use crate::apis::ElasticQuota;
use crate::resources::Resources;

pub use crate::apis::keys::{ADMISSION_LIMIT, CHILD_REQUEST};
/// Audit annotation carrying the child-request value evaluation wrote (or would write). The API
/// server prefixes it with the webhook's name (`vpod.koordinator.sh/child-request`) and drops a key
/// that is not a plain name (it was `koord-webhook/child-request`: dropped, with a warning logged by
/// the API server on every call).
pub const AUDIT_CHILD_REQUEST: &str = "child-request";

/// Attempts at writing one batch before its pods are rejected. Each replica batches the pods of
/// one quota into one write, so conflicts come from the other replicas writing the same quota: under
/// a burst through two replicas three attempts back to back lost often enough to deny whole
/// batches. Koordinator retries a conflict 5 times 10 ms apart; a batch here carries many pods, so
/// it retries longer, apart by a jittered, growing pause (at most about 2 s in all: with 10
/// attempts, 24 of a 1,000-pod burst at 200/s into one quota were still refused on 2 cores).
pub const MAX_WRITE_ATTEMPTS: usize = 16;

/// The pause after the `attempt`-th conflict: 10 ms x attempt, +-50 %, so two replicas that
/// conflicted do not read and write again in step.
fn conflict_backoff(attempt: usize) -> std::time::Duration {
    let jitter = u64::from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos()
            % 1000,
    );
    let base = 10 * attempt as u64;
    std::time::Duration::from_micros(base * (500 + jitter))
}
/// Pods waiting for one quota's evaluation at most; beyond, a fast retryable denial (a hung or slow
/// API server must not grow the queue without bound).
pub const MAX_QUEUED_PER_QUOTA: usize = 1024;
/// Each read or write of a quota gives up after this long, so a hung call never leaves a quota's
/// evaluation running forever.
pub const STORE_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// A store call bounded by [`STORE_CALL_TIMEOUT`].
async fn bounded<T>(call: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
    tokio::time::timeout(STORE_CALL_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::Other(format!(
                "the API server did not answer within {STORE_CALL_TIMEOUT:?}"
            )))
        })
}

/// Resource names a pod can consume from a quota.
const POD_RESOURCES: &[&str] = &[
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
    "kubernetes.io/batch-cpu",
    "kubernetes.io/batch-memory",
    "kubernetes.io/mid-cpu",
    "kubernetes.io/mid-memory",
    "koordinator.sh/gpu",
    "nvidia.com/gpu",
    "koordinator.sh/gpu.shared",
    "koordinator.sh/gpu-memory-ratio",
];

/// A quota's admission limit and what it has admitted so far (its `child-request` annotation).
#[derive(Debug, Clone)]
pub struct ChildRequests {
    namespace: String,
    name: String,
    used: Resources,
    limit: Resources,
    /// Its max: the resources it counts.
    max: Resources,
}

impl ChildRequests {
    pub fn read(quota: &ElasticQuota) -> Result<Self, String> {
        let used = match annotation(quota, CHILD_REQUEST) {
            Some(json) => Resources::parse_json(json)?,
            None => Resources::default(),
        };
        let max = Resources::parse(quota.spec.max.as_ref()).map_err(|e| e.to_string())?;
        let limit = match annotation(quota, ADMISSION_LIMIT) {
            Some(json) => Some(Resources::parse_json(json)?)
                .filter(|l| !l.is_empty())
                .unwrap_or_else(|| max.clone()),
            None => max.clone(),
        };
        Ok(Self {
            namespace: quota.metadata.namespace.clone().unwrap_or_default(),
            name: quota.metadata.name.clone().unwrap_or_default(),
            used,
            limit,
            max,
        })
    }

    /// Whether the quota limits anything a pod consumes.
    pub fn limits_pods(&self) -> bool {
        Self::limits_pods_of(&self.max)
    }

    /// Whether a quota whose max is `max` limits anything a pod consumes.
    pub fn limits_pods_of(max: &Resources) -> bool {
        max.keys().any(|n| POD_RESOURCES.contains(&n.as_str()))
    }

    /// The part of a pod's requests this quota counts: its max keys, non-zero values.
    pub fn usage_of(&self, requests: &Resources) -> Resources {
        Self::usage_within(&self.max, requests)
    }

    /// [`Self::usage_of`] for a quota whose max is `max`.
    pub fn usage_within(max: &Resources, requests: &Resources) -> Resources {
        requests
            .iter()
            .filter(|(k, q)| max.contains(k) && !q.is_zero())
            .map(|(k, q)| (k.clone(), *q))
            .collect()
    }

    /// Checks `usage` against the limit and, if it fits, records it.
    pub fn admit(&mut self, usage: &Resources) -> Result<(), String> {
        let mut new_used = self.used.clone();
        new_used.add(usage);
        let exceeded: Vec<&String> = self
            .limit
            .iter()
            .filter(|(k, limit)| usage.contains(k) && new_used.get(k) > **limit)
            .map(|(k, _)| k)
            .collect();
        if !exceeded.is_empty() {
            let only = |r: &Resources| -> Resources {
                exceeded
                    .iter()
                    .filter_map(|k| r.value(k).map(|q| ((*k).clone(), q)))
                    .collect()
            };
            return Err(format!(
                "exceeded quota: {}/{}, requested: {}, used: {}, limited: {}",
                self.namespace,
                self.name,
                only(usage).describe(),
                only(&self.used).describe(),
                only(&self.limit).describe()
            ));
        }
        self.used = new_used;
        Ok(())
    }

    pub fn used_json(&self) -> String {
        serde_json::to_string(&self.used.to_quantities()).unwrap_or_default()
    }
}

/// One pod to evaluate: what it uses of the quota, who it is, and how long its admission stays in
/// the recent-admissions record ([`recent`]).
pub struct Admission {
    pub usage: Resources,
    /// `namespace/name`.
    pub pod: String,
    pub window: std::time::Duration,
}

struct Pending {
    usage: Resources,
    /// `namespace/name` of the pod, for the recent-admissions record.
    pod: String,
    reply: oneshot::Sender<Result<String, Rejection>>,
}

#[derive(Default)]
struct Queue {
    pending: Vec<Pending>,
    running: bool,
}

/// Per-quota queues, and (without a store) what has been admitted so far.
#[derive(Default)]
pub struct Evaluator {
    queues: Mutex<HashMap<(String, String), Queue>>,
    /// Without a store: the quota as evaluation last left it, so admissions add up.
    recorded: Mutex<HashMap<(String, String), ElasticQuota>>,
}

impl Evaluator {
    /// Evaluates one pod's usage against `quota` (as the cache has it). Returns the child-request JSON
    /// written, or the rejection: 400 for a quota the pod does not fit, 500 when the API server could
    /// not be read or written, 429 when too many pods wait. A dry run is checked but neither queued
    /// nor written; when the API server cannot be read it is checked against the cache's quota (it
    /// charges nothing, and the API server restarting is no reason to refuse it).
    pub async fn evaluate(
        self: &Arc<Self>,
        quota: &ElasticQuota,
        admission: Admission,
        store: Option<Arc<dyn QuotaStore>>,
        dry_run: bool,
    ) -> Result<String, Rejection> {
        let Admission { usage, pod, window } = admission;
        let key = (
            quota.metadata.namespace.clone().unwrap_or_default(),
            quota.metadata.name.clone().unwrap_or_default(),
        );
        if dry_run {
            let current = self
                .latest(&key, quota, store.as_deref())
                .await
                .unwrap_or_else(|_| quota.clone());
            let mut account = ChildRequests::read(&current).map_err(Rejection::invalid)?;
            account.admit(&usage).map_err(Rejection::invalid)?;
            return Ok(account.used_json());
        }
        let (reply, answer) = oneshot::channel();
        let start_worker = {
            let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
            let queue = queues.entry(key.clone()).or_default();
            if queue.pending.len() >= MAX_QUEUED_PER_QUOTA {
                return Err(Rejection {
                    code: 429,
                    message: format!(
                        "too many pods are waiting for elastic quota {}/{} to be evaluated; retry",
                        key.0, key.1
                    ),
                });
            }
            queue.pending.push(Pending { usage, pod, reply });
            !std::mem::replace(&mut queue.running, true)
        };
        if start_worker {
            let (evaluator, initial) = (self.clone(), quota.clone());
            tokio::spawn(async move { evaluator.drain(key, initial, store, window).await });
        }
        answer.await.unwrap_or_else(|_| {
            Err(Rejection::internal(
                "elastic quota evaluation was interrupted",
            ))
        })
    }

    async fn latest(
        &self,
        key: &(String, String),
        cached: &ElasticQuota,
        store: Option<&dyn QuotaStore>,
    ) -> Result<ElasticQuota, String> {
        match store {
            Some(store) => bounded(store.get(&key.0, &key.1))
                .await
                .map_err(|e| e.to_string()),
            None => Ok(self
                .recorded
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(key)
                .cloned()
                .unwrap_or_else(|| cached.clone())),
        }
    }

    /// Works through the queue of one quota until it is empty.
    async fn drain(
        self: Arc<Self>,
        key: (String, String),
        cached: ElasticQuota,
        store: Option<Arc<dyn QuotaStore>>,
        window: std::time::Duration,
    ) {
        loop {
            let batch: Vec<Pending> = {
                let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
                let queue = queues.entry(key.clone()).or_default();
                if queue.pending.is_empty() {
                    queue.running = false;
                    queues.remove(&key);
                    return;
                }
                std::mem::take(&mut queue.pending)
            };
            // A request the API server already gave up on must not consume quota.
            let batch: Vec<Pending> = batch.into_iter().filter(|p| !p.reply.is_closed()).collect();
            let results = self
                .run_batch(&key, &cached, store.as_deref(), &batch, window)
                .await;
            for (pending, result) in batch.into_iter().zip(results) {
                let _ = pending.reply.send(result);
            }
        }
    }

    async fn run_batch(
        &self,
        key: &(String, String),
        cached: &ElasticQuota,
        store: Option<&dyn QuotaStore>,
        batch: &[Pending],
        window: std::time::Duration,
    ) -> Vec<Result<String, Rejection>> {
        let all = |rejection: Rejection| batch.iter().map(|_| Err(rejection.clone())).collect();
        for attempt in 1..=MAX_WRITE_ATTEMPTS {
            let quota = match self.latest(key, cached, store).await {
                Ok(quota) => quota,
                Err(e) => return all(Rejection::internal(e)),
            };
            let mut account = match ChildRequests::read(&quota) {
                Ok(account) => account,
                Err(e) => return all(Rejection::invalid(e)),
            };
            let verdicts: Vec<Result<(), Rejection>> = batch
                .iter()
                .map(|p| account.admit(&p.usage).map_err(Rejection::invalid))
                .collect();
            if verdicts.iter().all(Result::is_err) {
                return verdicts
                    .into_iter()
                    .map(|v| v.map(|_| String::new()))
                    .collect();
            }
            let used = account.used_json();
            let now = jiff::Timestamp::now().as_second();
            let mut admitted = recent::read(&quota);
            let this_batch = batch.iter().zip(&verdicts).filter(|(_, v)| v.is_ok());
            recent::record(
                &mut admitted,
                this_batch.map(|(p, _)| recent::Admitted {
                    pod: p.pod.clone(),
                    at: now,
                    requests: p.usage.to_quantities(),
                }),
                now,
                window.as_secs() as i64,
            );
            let mut updated = quota.clone();
            updated
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .extend([
                    (CHILD_REQUEST.to_owned(), used.clone()),
                    (recent::RECENT.to_owned(), recent::to_json(&admitted)),
                ]);
            let written = match store {
                None => {
                    self.recorded
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(key.clone(), updated);
                    Ok(())
                }
                Some(store) => bounded(store.replace(&updated)).await.map(|_| ()),
            };
            match written {
                Ok(()) => {
                    return verdicts
                        .into_iter()
                        .map(|v| v.map(|_| used.clone()))
                        .collect();
                }
                Err(StoreError::Conflict) if attempt < MAX_WRITE_ATTEMPTS => {
                    tokio::time::sleep(conflict_backoff(attempt)).await;
                    continue;
                }
                Err(e) => {
                    let failed = Rejection::internal(format!(
                        "failed to update elastic quota {}/{}: {e}",
                        key.0, key.1
                    ));
                    return verdicts
                        .into_iter()
                        .map(|v| v.and(Err(failed.clone())))
                        .collect();
                }
            }
        }
        all(Rejection::internal("elastic quota evaluation gave up"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::ports::memory::MemoryQuotaStore;
    use serde_json::json;
    use std::sync::atomic::Ordering;

    #[test]
    fn the_audit_key_is_one_the_api_server_keeps() {
        // A name part of a qualified name: the API server adds `<webhook>/` itself.
        let key = AUDIT_CHILD_REQUEST;
        assert!(key.len() <= 63 && !key.contains('/'));
        assert!(
            key.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        );
    }

    #[test]
    fn conflicts_back_off_a_little_longer_each_time() {
        use std::time::Duration;
        for attempt in 1..MAX_WRITE_ATTEMPTS {
            let pause = conflict_backoff(attempt);
            let base = Duration::from_millis(10 * attempt as u64);
            assert!(
                pause >= base / 2 && pause < base * 3 / 2,
                "{attempt}: {pause:?}"
            );
        }
        let all: Duration = (1..MAX_WRITE_ATTEMPTS).map(conflict_backoff).sum();
        assert!(all < Duration::from_millis(1800), "{all:?}");
    }

    fn quota(annotations: serde_json::Value) -> ElasticQuota {
        serde_json::from_value(json!({
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": "q", "namespace": "team", "annotations": annotations},
            "spec": {"max": {"cpu": "10", "memory": "10Gi"}}
        }))
        .unwrap()
    }

    fn cpu(v: &str) -> Resources {
        Resources::parse_json(&format!(r#"{{"cpu":"{v}"}}"#)).unwrap()
    }

    fn admission(usage: Resources) -> Admission {
        Admission {
            usage,
            pod: "team/p".to_owned(),
            window: std::time::Duration::from_secs(60),
        }
    }

    #[test]
    fn ledger_admits_within_the_limit_and_explains_excess() {
        let mut account =
            ChildRequests::read(&quota(json!({CHILD_REQUEST: r#"{"cpu":"8"}"#}))).unwrap();
        assert!(account.limits_pods());
        account.admit(&cpu("2")).unwrap();
        assert_eq!(account.used_json(), r#"{"cpu":"10"}"#);
        assert_eq!(
            account.admit(&cpu("500m")).unwrap_err(),
            "exceeded quota: team/q, requested: cpu=500m, used: cpu=10, limited: cpu=10"
        );
        let fresh = ChildRequests::read(&quota(json!({}))).unwrap();
        let requests = Resources::parse_json(r#"{"cpu":"1","memory":"0","gpu":"1"}"#).unwrap();
        assert_eq!(
            fresh.usage_of(&requests).describe(),
            "cpu=1",
            "only max keys, only non-zero"
        );
        // The admission annotation replaces max as the limit when it lists something.
        let mut limited =
            ChildRequests::read(&quota(json!({ADMISSION_LIMIT: r#"{"cpu":"1"}"#}))).unwrap();
        assert!(
            limited
                .admit(&cpu("2"))
                .unwrap_err()
                .contains("limited: cpu=1")
        );
        let mut unlimited_memory =
            ChildRequests::read(&quota(json!({ADMISSION_LIMIT: r#"{"cpu":"1"}"#}))).unwrap();
        unlimited_memory
            .admit(&Resources::parse_json(r#"{"memory":"100Gi"}"#).unwrap())
            .unwrap();
        assert!(ChildRequests::read(&quota(json!({CHILD_REQUEST: "{bad"}))).is_err());
        let used_missing = ChildRequests::read(&quota(json!({})))
            .unwrap()
            .admit(&cpu("11"))
            .unwrap_err();
        assert_eq!(
            used_missing,
            "exceeded quota: team/q, requested: cpu=11, used: , limited: cpu=10"
        );
    }

    /// A store whose calls never return, as a hung API server.
    struct Hung;
    impl QuotaStore for Hung {
        fn get<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<ElasticQuota, StoreError>> {
            Box::pin(std::future::pending())
        }
        fn replace<'a>(
            &'a self,
            _: &'a ElasticQuota,
        ) -> futures::future::BoxFuture<'a, Result<ElasticQuota, StoreError>> {
            Box::pin(std::future::pending())
        }
    }

    /// A dry run through a replica whose API server is away (restarting) is checked against the
    /// cache's quota: it charges nothing, and was once refused with the connection error (code 400).
    #[tokio::test(start_paused = true)]
    async fn a_dry_run_is_checked_against_the_cache_when_the_api_server_is_away() {
        let evaluator = Arc::new(Evaluator::default());
        let cached = quota(json!({CHILD_REQUEST: r#"{"cpu":"6"}"#}));
        let store: Arc<dyn QuotaStore> = Arc::new(Hung);
        let fits = evaluator
            .evaluate(&cached, admission(cpu("3")), Some(store.clone()), true)
            .await;
        assert_eq!(fits, Ok(r#"{"cpu":"9"}"#.to_owned()));
        let over = evaluator
            .evaluate(&cached, admission(cpu("5")), Some(store), true)
            .await
            .unwrap_err();
        assert_eq!(over.code, 400, "{over:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_api_server_times_out_and_the_queue_is_bounded() {
        let evaluator = Arc::new(Evaluator::default());
        let cached = quota(json!({}));
        let store: Arc<dyn QuotaStore> = Arc::new(Hung);
        let waiting: Vec<_> = (0..MAX_QUEUED_PER_QUOTA + 10)
            .map(|_| {
                let (evaluator, cached, store) = (evaluator.clone(), cached.clone(), store.clone());
                tokio::spawn(async move {
                    evaluator
                        .evaluate(&cached, admission(cpu("100m")), Some(store), false)
                        .await
                })
            })
            .collect();
        let (mut refused, mut timed_out) = (0, 0);
        for task in waiting {
            // Every pod gets an answer: the queue's maximum refuses at once, the rest time out.
            let error = task.await.unwrap().unwrap_err();
            if error.message.contains("too many pods are waiting") {
                assert_eq!(error.code, 429);
                refused += 1;
            } else {
                assert!(error.message.contains("did not answer within"), "{error:?}");
                assert_eq!(
                    error.code, 500,
                    "the API server's failure is no broken rule"
                );
                timed_out += 1;
            }
        }
        assert!(
            refused >= 9,
            "beyond the queue's maximum: refused {refused}"
        );
        assert!(timed_out >= MAX_QUEUED_PER_QUOTA, "{timed_out}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_at_the_limit_admits_none_too_many_with_few_writes() {
        let store = Arc::new(MemoryQuotaStore::default());
        store.insert(quota(json!({CHILD_REQUEST: r#"{"cpu":"9"}"#})));
        let cached = store.current("team", "q").unwrap();
        let evaluator = Arc::new(Evaluator::default());
        let dyn_store: Arc<dyn QuotaStore> = store.clone();
        let tasks: Vec<_> = (0..500)
            .map(|_| {
                let (evaluator, cached, store) =
                    (evaluator.clone(), cached.clone(), dyn_store.clone());
                tokio::spawn(async move {
                    evaluator
                        .evaluate(&cached, admission(cpu("100m")), Some(store), false)
                        .await
                })
            })
            .collect();
        let mut admitted = 0;
        for task in tasks {
            admitted += usize::from(task.await.unwrap().is_ok());
        }
        assert_eq!(admitted, 10, "room for exactly 10 pods of 100m");
        let recorded = store.current("team", "q").unwrap();
        assert_eq!(
            recorded.metadata.annotations.unwrap()[CHILD_REQUEST],
            r#"{"cpu":"10"}"#
        );
        assert!(store.writes() <= 10, "coalesced: {} writes", store.writes());
    }

    #[tokio::test]
    async fn conflicts_are_retried_and_dry_runs_write_nothing() {
        let store = Arc::new(MemoryQuotaStore::default());
        store.insert(quota(json!({})));
        let cached = store.current("team", "q").unwrap();
        let evaluator = Arc::new(Evaluator::default());
        let dyn_store: Arc<dyn QuotaStore> = store.clone();

        let dry = evaluator
            .evaluate(&cached, admission(cpu("4")), Some(dyn_store.clone()), true)
            .await
            .unwrap();
        assert_eq!(dry, r#"{"cpu":"4"}"#);
        assert_eq!(store.writes(), 0);
        assert!(
            evaluator
                .evaluate(&cached, admission(cpu("40")), Some(dyn_store.clone()), true)
                .await
                .is_err()
        );

        store.inject_conflicts.store(2, Ordering::SeqCst);
        evaluator
            .evaluate(&cached, admission(cpu("4")), Some(dyn_store.clone()), false)
            .await
            .unwrap();
        assert_eq!(store.writes(), 1);
        store
            .inject_conflicts
            .store(MAX_WRITE_ATTEMPTS, Ordering::SeqCst);
        let err = evaluator
            .evaluate(&cached, admission(cpu("1")), Some(dyn_store.clone()), false)
            .await
            .unwrap_err();
        assert!(
            err.message
                .starts_with("failed to update elastic quota team/q"),
            "{err:?}"
        );
        assert_eq!(err.code, 500);
        assert_eq!(
            store
                .current("team", "q")
                .unwrap()
                .metadata
                .annotations
                .unwrap()[CHILD_REQUEST],
            r#"{"cpu":"4"}"#,
            "a failed write admits nothing"
        );
    }

    #[tokio::test]
    async fn without_a_store_admissions_still_add_up() {
        let cached = quota(json!({CHILD_REQUEST: r#"{"cpu":"6"}"#}));
        let evaluator = Arc::new(Evaluator::default());
        assert_eq!(
            evaluator
                .evaluate(&cached, admission(cpu("3")), None, false)
                .await
                .unwrap(),
            r#"{"cpu":"9"}"#
        );
        assert!(
            evaluator
                .evaluate(&cached, admission(cpu("3")), None, false)
                .await
                .is_err()
        );
        assert_eq!(
            evaluator
                .evaluate(&cached, admission(cpu("1")), None, false)
                .await
                .unwrap(),
            r#"{"cpu":"10"}"#
        );
    }
}

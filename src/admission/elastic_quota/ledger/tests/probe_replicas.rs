//! What the probe's attack tests share: replicas' whole admission paths over one record, each
//! loading the same serving key, and a probe's review as the API server sends it.

use std::net::IpAddr;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::admission::Admission;
use crate::admission::caller::answering_for;
use crate::admission::elastic_quota::ledger::probe::{PROBE_ANNOTATION, PROBE_NAME};
use crate::admission::env::Services;
use crate::admission::ports::{LedgerStore, ProbeSecret, ProbeSecrets};
use crate::cache::Cache;
use crate::entries::VALIDATE_ELASTIC_QUOTA;
use crate::metrics::Metrics;

/// What every replica's serving key gives.
pub(super) const SECRET: ProbeSecret = ProbeSecret([9; 32]);

struct Fixed(ProbeSecret);

impl ProbeSecrets for Fixed {
    fn current(&self) -> Option<ProbeSecret> {
        Some(self.0.clone())
    }
}

/// One replica's whole admission path (its own `QuotaTreeRules`) over the shared record `store`,
/// its serving key giving [`SECRET`].
pub(super) fn replica(cache: Cache, store: Arc<dyn LedgerStore>) -> Admission {
    let services = Services {
        quota_ledger: Some(store),
        probe_secrets: Some(Arc::new(Fixed(SECRET))),
        ..Default::default()
    };
    Admission::new(
        cache,
        crate::features::FeatureGates::default(),
        Metrics::new(),
    )
    .with_services(services)
}

/// The probe's object as the API server has it, carrying `token`.
pub(super) fn probe_object(token: &str) -> Value {
    json!({
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
        "metadata": {"name": PROBE_NAME, "namespace": crate::names::namespace(),
                     "uid": "obj-uid", "annotations": {PROBE_ANNOTATION: token}},
        "spec": {}
    })
}

/// A probe's review as the API server sends it (dry-run CREATE of the probe quota) with `token`.
pub(super) fn probe_review(token: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "probe-uid", "operation": "CREATE",
            "userInfo": {"username": crate::names::service_account_user()},
            "namespace": crate::names::namespace(), "name": PROBE_NAME, "dryRun": true,
            "kind": {"group": "scheduling.sigs.k8s.io", "version": "v1alpha1", "kind": "ElasticQuota"},
            "resource": {"group": "scheduling.sigs.k8s.io", "version": "v1alpha1", "resource": "elasticquotas"},
            "object": probe_object(token)
        }
    })
}

/// `replica`'s answer to `review` from `caller`: the AdmissionReview's `response`.
pub(super) async fn response(replica: &Admission, review: &Value, caller: &str) -> Value {
    let body = serde_json::to_vec(review).unwrap();
    let caller: IpAddr = caller.parse().unwrap();
    let answer = answering_for(
        Some(caller),
        replica.review(VALIDATE_ELASTIC_QUOTA, &body, None),
    )
    .await
    .unwrap();
    let mut answer: Value = serde_json::from_slice(&answer).unwrap();
    answer["response"].take()
}

/// The warnings of `replica`'s answer to `review` from `caller`.
pub(super) async fn warnings_of(replica: &Admission, review: &Value, caller: &str) -> Vec<String> {
    response(replica, review, caller).await["warnings"]
        .as_array()
        .map(|w| {
            w.iter()
                .filter_map(|w| w.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

//! The API-server probe through `/validate-…-elasticquota` (`ledger/probe.rs`): a probe's review
//! proves its caller into the ledger's record; a review changed in any one respect a forger
//! controls proves nothing.

use std::net::IpAddr;
use std::sync::Arc;

use serde_json::{Value, json};

use super::ledger::probe::{PROBE_ANNOTATION, PROBE_NAME, fresh_token, token};
use crate::admission::Admission;
use crate::admission::caller::answering_for;
use crate::admission::env::Services;
use crate::admission::ports::memory::MemoryLedgerStore;
use crate::admission::ports::{LedgerStore, ProbeSecret, ProbeSecrets};
use crate::cache::CacheWriter;
use crate::entries::VALIDATE_ELASTIC_QUOTA;
use crate::metrics::Metrics;

struct Fixed(Option<ProbeSecret>);

impl ProbeSecrets for Fixed {
    fn current(&self) -> Option<ProbeSecret> {
        self.0.clone()
    }
}

const SECRET: ProbeSecret = ProbeSecret([3; 32]);

/// A probe's review as the API server sends it, with `token`.
fn probe(token: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "probe-uid", "operation": "CREATE", "userInfo": {"username": "system:serviceaccount:koordinator-system:koord-webhook"},
            "namespace": crate::names::namespace(), "name": PROBE_NAME, "dryRun": true,
            "kind": {"group": "scheduling.sigs.k8s.io", "version": "v1alpha1", "kind": "ElasticQuota"},
            "resource": {"group": "scheduling.sigs.k8s.io", "version": "v1alpha1", "resource": "elasticquotas"},
            "object": {
                "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                "metadata": {"name": PROBE_NAME, "namespace": crate::names::namespace(),
                             "uid": "obj-uid", "annotations": {PROBE_ANNOTATION: token}},
                "spec": {}
            }
        }
    })
}

/// Sends `reviews` from `callers` in turn through one replica whose serving key gives `secret`:
/// the record's proven callers after, and whether every review was allowed.
fn proven_after(secret: Option<ProbeSecret>, reviews: &[(Value, &str)]) -> (Vec<String>, bool) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let writer = CacheWriter::default();
    writer.mark_ready();
    let store = Arc::new(MemoryLedgerStore::default());
    let services = Services {
        quota_ledger: Some(store.clone()),
        probe_secrets: Some(Arc::new(Fixed(secret))),
        ..Default::default()
    };
    let gates = crate::features::FeatureGates::default();
    let admission = Admission::new(writer.reader(), gates, Metrics::new()).with_services(services);
    runtime.block_on(async {
        let mut all_allowed = true;
        for (review, caller) in reviews {
            let body = serde_json::to_vec(review).unwrap();
            let caller: IpAddr = caller.parse().unwrap();
            let answer = answering_for(
                Some(caller),
                admission.review(VALIDATE_ELASTIC_QUOTA, &body, None),
            )
            .await
            .unwrap();
            let answer: Value = serde_json::from_slice(&answer).unwrap();
            all_allowed &= answer["response"]["allowed"] == true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        (store.read().await.unwrap().proven, all_allowed)
    })
}

#[test]
fn a_probe_proves_its_caller_and_is_allowed() {
    let token = fresh_token(&SECRET);
    let (proven, allowed) = proven_after(Some(SECRET), &[(probe(&token), "10.0.0.1")]);
    assert_eq!(proven, ["10.0.0.1"]);
    assert!(allowed);
}

#[test]
fn a_probe_taken_once_proves_no_second_caller() {
    let review = probe(&fresh_token(&SECRET));
    let (proven, _) = proven_after(
        Some(SECRET),
        &[(review.clone(), "10.0.0.1"), (review, "10.66.0.1")],
    );
    assert_eq!(proven, ["10.0.0.1"]);
}

/// Each way a forger can send what looks like a probe, one respect changed: none proves.
#[test]
fn a_review_unlike_a_probe_in_any_respect_proves_nothing() {
    let good = fresh_token(&SECRET);
    let now = jiff::Timestamp::now().as_second();
    let changed: Vec<(&str, Value)> = vec![
        (
            "another key's token",
            probe(&fresh_token(&ProbeSecret([4; 32]))),
        ),
        ("an old token", probe(&token(&SECRET, now - 3600, [1; 16]))),
        ("a token cut short", probe(&good[..good.len() - 2])),
        ("no token", {
            let mut r = probe(&good);
            r["request"]["object"]["metadata"]["annotations"] = json!({});
            r
        }),
        ("not a dry run", {
            let mut r = probe(&good);
            r["request"]["dryRun"] = json!(false);
            r
        }),
        ("another name", {
            let mut r = probe(&good);
            r["request"]["object"]["metadata"]["name"] = json!("other");
            r["request"]["name"] = json!("other");
            r
        }),
        ("another namespace", {
            let mut r = probe(&good);
            r["request"]["namespace"] = json!("tenant");
            r["request"]["object"]["metadata"]["namespace"] = json!("tenant");
            r
        }),
        ("an UPDATE", {
            let mut r = probe(&good);
            r["request"]["operation"] = json!("UPDATE");
            r["request"]["oldObject"] = r["request"]["object"].clone();
            r
        }),
    ];
    for (what, review) in changed {
        let (proven, _) = proven_after(Some(SECRET), &[(review, "10.66.0.1")]);
        assert!(proven.is_empty(), "{what} proved its caller: {proven:?}");
    }
    // A replica with no serving key loaded checks nothing.
    let (proven, _) = proven_after(None, &[(probe(&good), "10.0.0.1")]);
    assert!(proven.is_empty(), "{proven:?}");
}

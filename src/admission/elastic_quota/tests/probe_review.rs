//! The API-server probe through `/validate-…-elasticquota` (`ledger/probe.rs`): a probe's review is
//! allowed with a warning naming its caller, which the replica that made the probe reads; a review
//! changed in any one respect a forger controls gets none; and the answer goes to whoever sent the
//! review, so a token replayed gets the replayer only its own address.

use std::net::IpAddr;
use std::sync::Arc;

use serde_json::{Value, json};

use super::super::ledger::probe::{PROBE_ANNOTATION, PROBE_NAME, fresh_token, read_answer, token};
use crate::admission::Admission;
use crate::admission::caller::answering_for;
use crate::admission::env::Services;
use crate::admission::ports::memory::MemoryLedgerStore;
use crate::admission::ports::{ProbeSecret, ProbeSecrets};
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

/// Sends `review` from `caller` to a replica whose serving key gives `secret`: the address the
/// answer names to whoever holds the token `token` and the key `SECRET`, and whether the review
/// was allowed.
fn answered(
    secret: Option<ProbeSecret>,
    review: &Value,
    caller: &str,
    token: &str,
) -> (Option<IpAddr>, bool) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let writer = CacheWriter::default();
    writer.mark_ready();
    let services = Services {
        quota_ledger: Some(Arc::new(MemoryLedgerStore::default())),
        probe_secrets: Some(Arc::new(Fixed(secret))),
        ..Default::default()
    };
    let gates = crate::features::FeatureGates::default();
    let admission = Admission::new(writer.reader(), gates, Metrics::new()).with_services(services);
    let body = serde_json::to_vec(review).unwrap();
    let caller: IpAddr = caller.parse().unwrap();
    let answer = runtime
        .block_on(answering_for(
            Some(caller),
            admission.review(VALIDATE_ELASTIC_QUOTA, &body, None),
        ))
        .unwrap();
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    let warnings = answer["response"]["warnings"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let named = warnings
        .iter()
        .filter_map(Value::as_str)
        .find_map(|w| read_answer(&SECRET, token, w));
    (named, answer["response"]["allowed"] == true)
}

#[test]
fn a_probe_is_allowed_and_answered_with_its_callers_address() {
    let token = fresh_token(&SECRET);
    let (named, allowed) = answered(Some(SECRET), &probe(&token), "10.0.0.1", &token);
    assert_eq!(named, Some("10.0.0.1".parse().unwrap()));
    assert!(allowed);
}

#[test]
fn a_probe_replayed_names_the_replayer_to_nobody_but_itself() {
    // The replayer's answer names the replayer: the replica that made the probe never sees it
    // (the API server hands it only the answer to its own call, which names the API server).
    let token = fresh_token(&SECRET);
    let (named, _) = answered(Some(SECRET), &probe(&token), "10.66.0.1", &token);
    assert_eq!(named, Some("10.66.0.1".parse().unwrap()));
}

/// Each way a forger can send what looks like a probe, one respect changed: no answer.
#[test]
fn a_review_unlike_a_probe_in_any_respect_is_not_answered() {
    let good = fresh_token(&SECRET);
    let now = jiff::Timestamp::now().as_second();
    let changed: Vec<(&str, String, Value)> = vec![
        (
            "another key's token",
            good.clone(),
            probe(&fresh_token(&ProbeSecret([4; 32]))),
        ),
        (
            "an old token",
            good.clone(),
            probe(&token(&SECRET, now - 3600, [1; 16])),
        ),
        (
            "a token cut short",
            good.clone(),
            probe(&good[..good.len() - 2]),
        ),
        ("no token", good.clone(), {
            let mut r = probe(&good);
            r["request"]["object"]["metadata"]["annotations"] = json!({});
            r
        }),
        ("not a dry run", good.clone(), {
            let mut r = probe(&good);
            r["request"]["dryRun"] = json!(false);
            r
        }),
        ("another name", good.clone(), {
            let mut r = probe(&good);
            r["request"]["object"]["metadata"]["name"] = json!("other");
            r["request"]["name"] = json!("other");
            r
        }),
        ("another namespace", good.clone(), {
            let mut r = probe(&good);
            r["request"]["namespace"] = json!("tenant");
            r["request"]["object"]["metadata"]["namespace"] = json!("tenant");
            r
        }),
        ("a DELETE", good.clone(), {
            let mut r = probe(&good);
            r["request"]["operation"] = json!("DELETE");
            r["request"]["oldObject"] = r["request"]["object"].take();
            r
        }),
    ];
    for (what, token, review) in changed {
        let (named, _) = answered(Some(SECRET), &review, "10.66.0.1", &token);
        assert_eq!(named, None, "{what} was answered");
    }
    // A replica with no serving key loaded answers nothing.
    let (named, _) = answered(None, &probe(&good), "10.0.0.1", &good);
    assert_eq!(named, None);
}

/// An UPDATE (the probe's object exists, which a dry run never makes) is answered like a CREATE.
#[test]
fn a_probe_of_an_existing_object_is_answered_too() {
    let token = fresh_token(&SECRET);
    let mut review = probe(&token);
    review["request"]["operation"] = json!("UPDATE");
    review["request"]["oldObject"] = review["request"]["object"].clone();
    let (named, _) = answered(Some(SECRET), &review, "10.0.0.1", &token);
    assert_eq!(named, Some("10.0.0.1".parse().unwrap()));
}

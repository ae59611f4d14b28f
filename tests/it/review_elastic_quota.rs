//! `koord-webhook review` on the ElasticQuota endpoints and /validate-pod's quota checks, against the
//! fixture tree: parent-a (is-parent, min cpu 8) > child-a1 (min cpu 2, max cpu 4, 3 CPUs admitted),
//! and pod web-0 bound to child-a1.

use crate::support;

use serde_json::{Value, json};
use support::fixture;
use support::review::{ELASTIC_QUOTA, POD, denial};

const VALIDATE_EQ: &str = "/validate-scheduling-sigs-k8s-io-v1alpha1-elasticquota";

fn review(path: &str, gates: &str, request: Value) -> Value {
    support::review::review(
        &fixture("state"),
        path,
        &["--feature-gates", gates],
        &request,
    )
}

fn admission_review(resource: &str, operation: &str, object: Value, old: Value) -> Value {
    let kind = if resource == "pods" {
        &POD
    } else {
        &ELASTIC_QUOTA
    };
    support::review::admission_review(kind, operation, "team-a", object, old)
}

fn quota(name: &str, labels: Value, spec: Value) -> Value {
    json!({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
           "metadata": {"name": name, "namespace": "team-a", "labels": labels}, "spec": spec})
}

fn pod(labels: Value, cpu: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a", "labels": labels},
           "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu}}}]}})
}

#[test]
fn quota_creates_are_checked_against_the_tree() {
    let labels = json!({"quota.scheduling.koordinator.sh/parent": "parent-a", "quota.scheduling.koordinator.sh/tree-id": "tree-1"});
    let too_big = quota(
        "child-a2",
        labels.clone(),
        json!({"min": {"cpu": "7"}, "max": {"cpu": "8", "memory": "1Gi"}}),
    );
    let response = review(
        VALIDATE_EQ,
        "",
        admission_review("elasticquotas", "CREATE", too_big, Value::Null),
    );
    assert_eq!(
        denial(&response),
        "checkMinQuotaSum all brothers' MinQuota > parent MinQuota, parent: parent-a"
    );

    let fits = quota(
        "child-a2",
        labels,
        json!({"min": {"cpu": "6"}, "max": {"cpu": "8", "memory": "1Gi"}}),
    );
    let response = review(
        VALIDATE_EQ,
        "",
        admission_review("elasticquotas", "CREATE", fits, Value::Null),
    );
    assert_eq!(response["allowed"], true, "{response}");
}

#[test]
fn quota_updates_and_deletes() {
    let child = quota(
        "child-a1",
        json!({"quota.scheduling.koordinator.sh/parent": "parent-a", "quota.scheduling.koordinator.sh/tree-id": "tree-1"}),
        json!({"min": {"cpu": "2", "memory": "4Gi"}, "max": {"cpu": "4", "memory": "8Gi"}}),
    );
    let mut moved = child.clone();
    moved["metadata"]["labels"]["quota.scheduling.koordinator.sh/tree-id"] = json!("tree-2");
    let response = review(
        VALIDATE_EQ,
        "",
        admission_review("elasticquotas", "UPDATE", moved, child.clone()),
    );
    assert_eq!(
        denial(&response),
        "child-a1 tree id changed [tree-1] vs [tree-2]"
    );

    let response = review(
        VALIDATE_EQ,
        "",
        admission_review("elasticquotas", "DELETE", Value::Null, child),
    );
    assert_eq!(
        denial(&response),
        "delete quota failed, quota child-a1 has 1 child pods: web-0"
    );

    let parent = quota("parent-a", json!({}), json!({}));
    let response = review(
        VALIDATE_EQ,
        "",
        admission_review("elasticquotas", "DELETE", Value::Null, parent),
    );
    assert_eq!(
        denial(&response),
        "delete quota failed, quota parent-a has 1 child quotas"
    );
}

#[test]
fn pods_may_not_join_a_parent_quota() {
    let bound = pod(
        json!({"quota.scheduling.koordinator.sh/name": "parent-a"}),
        "1",
    );
    let response = review(
        "/validate-pod",
        "",
        admission_review("pods", "CREATE", bound, Value::Null),
    );
    assert_eq!(
        denial(&response),
        "pod can not be linked to a parentQuotaGroup,quota:parent-a, pod:p"
    );
    let allowed = review(
        "/validate-pod",
        "SupportParentQuotaSubmitPod=true",
        admission_review(
            "pods",
            "CREATE",
            pod(
                json!({"quota.scheduling.koordinator.sh/name": "parent-a"}),
                "1",
            ),
            Value::Null,
        ),
    );
    assert_eq!(allowed["allowed"], true);
}

#[test]
fn quota_evaluation_admits_within_the_limit_and_reports_the_write() {
    let gates = "EnableQuotaAdmission=true";
    let labels = json!({"quota.scheduling.koordinator.sh/name": "child-a1"});
    let response = review(
        "/validate-pod",
        gates,
        admission_review("pods", "CREATE", pod(labels.clone(), "2"), Value::Null),
    );
    assert_eq!(
        denial(&response),
        "exceeded quota: team-a/child-a1, requested: cpu=2, used: cpu=3, limited: cpu=4"
    );

    let response = review(
        "/validate-pod",
        gates,
        admission_review("pods", "CREATE", pod(labels.clone(), "1"), Value::Null),
    );
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(
        response["auditAnnotations"]["child-request"],
        r#"{"cpu":"4"}"#
    );

    // A forged review (the API server refuses negative requests before admission) is denied and
    // reports no write: before, it was admitted and lowered child-request, making room for others.
    let response = review(
        "/validate-pod",
        gates,
        admission_review("pods", "CREATE", pod(labels.clone(), "-1000"), Value::Null),
    );
    assert_eq!(
        denial(&response),
        r#"spec.containers[0].resources.requests[cpu]: Invalid value: "-1000": must be greater than or equal to 0"#
    );
    assert!(
        response.get("auditAnnotations").is_none_or(|a| a.is_null()),
        "{response}"
    );

    // Gate off: no evaluation at all.
    let response = review(
        "/validate-pod",
        "",
        admission_review("pods", "CREATE", pod(labels, "2"), Value::Null),
    );
    assert_eq!(response["allowed"], true);
    assert!(response.get("auditAnnotations").is_none());

    let missing = pod(json!({"quota.scheduling.koordinator.sh/name": "nope"}), "1");
    let response = review(
        "/validate-pod",
        gates,
        admission_review("pods", "CREATE", missing, Value::Null),
    );
    assert_eq!(denial(&response), "elastic quota nope not found");
}

/// A shared weight of JSON `null` (what the mutating rule writes for a quota without max) reads as
/// no list, as Go reads it: a second pass changes nothing. With a max to fill it from, Koordinator
/// panics on it (a nil map); ours refuses with the reason.
#[test]
fn a_null_shared_weight_is_left_alone_without_max_and_refused_with_one() {
    let annotated = |spec: Value| {
        let mut object = quota("new-q", json!({}), spec);
        object["metadata"]["annotations"] =
            json!({"quota.scheduling.koordinator.sh/shared-weight": "null"});
        admission_review("elasticquotas", "CREATE", object, Value::Null)
    };
    let mutate = "/mutate-scheduling-sigs-k8s-io-v1alpha1-elasticquota";
    let without_max = review(mutate, "", annotated(json!({"min": {"cpu": "1"}})));
    let patch = support::review::patch(&without_max);
    assert!(
        !json!(patch).to_string().contains("shared-weight"),
        "shared weight changed: {patch:?}"
    );

    let with_max = review(mutate, "", annotated(json!({"max": {"cpu": "4"}})));
    assert_eq!(
        denial(&with_max),
        "quota.scheduling.koordinator.sh/shared-weight is null while spec.max is set: remove it to have it filled from max, or give a resource list"
    );
}

/// koord-webhook's recent-admissions record on a quota is set and changed by its ServiceAccount
/// only; anyone may remove it, and an edit that leaves it as it was is not refused for it.
#[test]
fn the_recent_admissions_record_is_koord_webhooks_own() {
    const RECENT: &str = "koord-webhook/child-request-recent";
    const OURS: &str = "system:serviceaccount:koordinator-system:koord-webhook";
    let child = |recent: Option<&str>| {
        let mut annotations =
            json!({"quota.scheduling.koordinator.sh/child-request": "{\"cpu\":\"3\"}"});
        if let Some(recent) = recent {
            annotations[RECENT] = json!(recent);
        }
        json!({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
               "metadata": {"name": "child-a1", "namespace": "team-a", "annotations": annotations,
                            "labels": {"quota.scheduling.koordinator.sh/parent": "parent-a",
                                       "quota.scheduling.koordinator.sh/tree-id": "tree-1"}},
               "spec": {"min": {"cpu": "2", "memory": "4Gi"}, "max": {"cpu": "4", "memory": "8Gi"}}})
    };
    let forged = r#"[{"pod":"team-a/x","at":1,"request":{"cpu":"100"}}]"#;
    let answer = |user: &str, operation: &str, new: Value, old: Value| {
        let mut request = admission_review("elasticquotas", operation, new, old);
        request["request"]["userInfo"]["username"] = json!(user);
        review(VALIDATE_EQ, "", request)
    };
    let refused = answer("alice", "UPDATE", child(Some(forged)), child(None));
    assert_eq!(refused["allowed"], false, "{refused}");
    assert_eq!(refused["status"]["code"], 403, "{refused}");
    assert_eq!(
        refused["status"]["message"],
        format!(
            "annotation {RECENT} is koord-webhook's own record: only {OURS} may set or change it (removing it is allowed)"
        )
    );
    let changed = answer("alice", "UPDATE", child(Some(forged)), child(Some("[]")));
    assert_eq!(changed["allowed"], false, "{changed}");
    let created = answer("alice", "CREATE", child(Some(forged)), Value::Null);
    assert_eq!(created["allowed"], false, "{created}");
    for (user, new, old) in [
        (OURS, child(Some(forged)), child(None)),
        ("alice", child(None), child(Some(forged))),
        ("alice", child(Some(forged)), child(Some(forged))),
    ] {
        let allowed = answer(user, "UPDATE", new, old);
        assert_eq!(allowed["allowed"], true, "{user}: {allowed}");
    }
}

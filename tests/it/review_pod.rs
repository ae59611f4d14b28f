//! `koord-webhook review` on /mutate-pod, /validate-pod and /mutate-reservation against a state with
//! the colocation profile `colocation-spark` (spark pods in colocation namespaces become BE batch
//! pods), a quota tree with a profile, an enhanced-validator config and a Reservation.

use crate::support;

use serde_json::{Value, json};
use support::fixture;
use support::review::{Kind, POD, admission_review, denial, patch};

const RESERVATION: Kind = Kind {
    group: "scheduling.koordinator.sh",
    version: "v1alpha1",
    kind: "Reservation",
    resource: "reservations",
    sub_resource: None,
};

fn review(
    path: &str,
    gates: &str,
    kind: &Kind,
    namespace: &str,
    object: Value,
    old: Value,
) -> Value {
    let request = admission_review(
        kind,
        if old.is_null() { "CREATE" } else { "UPDATE" },
        namespace,
        object,
        old,
    );
    support::review::review(
        &fixture("state-pods"),
        path,
        &["--feature-gates", gates],
        &request,
    )
}

/// The object after the response's patch.
fn patched(object: &Value, response: &Value) -> Value {
    let ops: json_patch::Patch = serde_json::from_value(Value::Array(patch(response))).unwrap();
    let mut out = object.clone();
    json_patch::patch(&mut out, &ops).unwrap();
    out
}

fn pod(namespace: &str, labels: Value, resources: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": namespace, "labels": labels},
           "spec": {"containers": [{"name": "main", "image": "spark", "resources": resources}]}})
}

#[test]
fn a_matching_pod_becomes_a_batch_pod() {
    let original = pod(
        "spark",
        json!({"app": "spark"}),
        json!({"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}),
    );
    let response = review(
        "/mutate-pod",
        "",
        &POD,
        "spark",
        original.clone(),
        Value::Null,
    );
    let out = patched(&original, &response);
    let labels = &out["metadata"]["labels"];
    assert_eq!(labels["koordinator.sh/qosClass"], "BE");
    assert_eq!(labels["koordinator.sh/priority"], "1111");
    assert_eq!(labels["koordinator.sh/mutated"], "true");
    let spec = &out["spec"];
    assert_eq!(spec["schedulerName"], "koord-scheduler");
    assert_eq!(spec["priorityClassName"], "koord-batch");
    assert_eq!(spec["priority"], 5500);
    assert_eq!(spec["preemptionPolicy"], "PreemptLowerPriority");
    let main = &spec["containers"][0];
    assert_eq!(main["env"], json!([{"name": "COLOCATED", "value": "true"}]));
    assert_eq!(
        main["image"], "spark",
        "the patch merges the container by name"
    );
    assert_eq!(
        main["resources"],
        json!({
        "requests": {"kubernetes.io/batch-cpu": "1k", "kubernetes.io/batch-memory": "2Gi"},
        "limits": {"kubernetes.io/batch-cpu": "2k", "kubernetes.io/batch-memory": "2Gi"}})
    );
    assert_eq!(
        out["metadata"]["annotations"]["node.koordinator.sh/extended-resource-spec"],
        r#"{"containers":{"main":{"limits":{"kubernetes.io/batch-cpu":"2k","kubernetes.io/batch-memory":"2Gi"},"requests":{"kubernetes.io/batch-cpu":"1k","kubernetes.io/batch-memory":"2Gi"}}}}"#
    );

    // The mutated pod passes /validate-pod; without the profile's QoS label it would not.
    let response = review("/validate-pod", "", &POD, "spark", out.clone(), Value::Null);
    assert_eq!(response["allowed"], true, "{response}");
    let mut unlabelled = out;
    unlabelled["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove("koordinator.sh/qosClass");
    let response = review("/validate-pod", "", &POD, "spark", unlabelled, Value::Null);
    assert_eq!(
        denial(&response),
        "labels.koordinator.sh/qosClass: Required value: must specify koordinator QoS BE with koordinator colocation resources"
    );
}

#[test]
fn pods_the_profile_does_not_select_are_left_alone() {
    for (namespace, labels) in [
        ("plain", json!({"app": "spark"})),
        ("spark", json!({"app": "web"})),
        ("missing", json!({"app": "spark"})),
    ] {
        let original = pod(namespace, labels, json!({"requests": {"cpu": "1"}}));
        let response = review("/mutate-pod", "", &POD, namespace, original, Value::Null);
        assert!(patch(&response).is_empty(), "{namespace}: {response}");
    }
    // Updates are never mutated.
    let original = pod("spark", json!({"app": "spark"}), json!({}));
    let response = review("/mutate-pod", "", &POD, "spark", original.clone(), original);
    assert!(patch(&response).is_empty());
}

#[test]
fn quota_trees_and_devices() {
    let original = pod(
        "plain",
        json!({"quota.scheduling.koordinator.sh/name": "tree-quota"}),
        json!({}),
    );
    let response = review(
        "/mutate-pod",
        "MultiQuotaTree=true",
        &POD,
        "plain",
        original.clone(),
        Value::Null,
    );
    let out = patched(&original, &response);
    assert_eq!(
        out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
        json!([{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["t1"]}]}])
    );
    let response = review("/mutate-pod", "", &POD, "plain", original, Value::Null);
    assert!(patch(&response).is_empty(), "gate off");

    let gpu = pod(
        "plain",
        json!({}),
        json!({"requests": {"koordinator.sh/gpu": "100"}, "limits": {"koordinator.sh/gpu": "100"}}),
    );
    let out = patched(
        &gpu,
        &review("/mutate-pod", "", &POD, "plain", gpu.clone(), Value::Null),
    );
    let expected = json!({"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100", "koordinator.sh/gpu.shared": "1"});
    assert_eq!(
        out["spec"]["containers"][0]["resources"],
        json!({"requests": expected, "limits": expected})
    );
    let response = review(
        "/mutate-pod",
        "DisableDeviceResourceSpec=true",
        &POD,
        "plain",
        gpu,
        Value::Null,
    );
    assert!(patch(&response).is_empty());
}

/// A denial quotes at most 1 KiB of the value it refuses: a forged UPDATE whose new priority label
/// is 4 MiB was answered with all of it (held for a client that never reads).
#[test]
fn a_denial_quotes_a_clipped_value() {
    let old = pod("plain", json!({"koordinator.sh/priority": "1"}), json!({}));
    let new = pod(
        "plain",
        json!({"koordinator.sh/priority": "9".repeat(4 << 20)}),
        json!({}),
    );
    let response = review("/validate-pod", "", &POD, "plain", new, old);
    let message = denial(&response);
    assert!(message.len() < 2048, "{} bytes", message.len());
    assert!(
        message.starts_with("labels.koordinator.sh/priority: Invalid value: \"999"),
        "{message}"
    );
    assert!(
        message.contains(&format!("…(+{} bytes)", (4 << 20) - 1024)),
        "{message}"
    );
}

#[test]
fn qos_priority_rules() {
    let be_prod = pod(
        "plain",
        json!({"koordinator.sh/qosClass": "BE", "koordinator.sh/priority-class": "koord-prod"}),
        json!({}),
    );
    let response = review(
        "/validate-pod",
        "",
        &POD,
        "plain",
        be_prod.clone(),
        Value::Null,
    );
    assert_eq!(
        denial(&response),
        "Pod: Forbidden: koordinator.sh/qosClass=BE and priorityClass=koord-prod cannot be used in combination"
    );
    let lsr = pod(
        "plain",
        json!({"koordinator.sh/qosClass": "LSR", "koordinator.sh/priority-class": "koord-prod"}),
        json!({"requests": {"cpu": "500m"}}),
    );
    let response = review("/validate-pod", "", &POD, "plain", lsr, Value::Null);
    assert_eq!(
        denial(&response),
        "pod.spec.containers[*].resources.requests: Invalid value: \"500m\": the requested CPUs of LSR Pod must be integer"
    );
    let mut changed = be_prod.clone();
    changed["metadata"]["labels"]["koordinator.sh/qosClass"] = json!("LS");
    let response = review("/validate-pod", "", &POD, "plain", changed, be_prod);
    assert_eq!(
        denial(&response),
        "labels.koordinator.sh/qosClass: Invalid value: \"LS\": field is immutable"
    );
}

#[test]
fn gated_pod_rules() {
    let shared_and_whole = pod(
        "plain",
        json!({}),
        json!({"requests": {"koordinator.sh/gpu": "1", "koordinator.sh/gpu.shared": "1"}}),
    );
    let response = review(
        "/validate-pod",
        "ValidatePodDeviceResource=true",
        &POD,
        "plain",
        shared_and_whole.clone(),
        Value::Null,
    );
    assert_eq!(
        denial(&response),
        "pod.spec.containers[*].resources.requests: Forbidden: Forbidden declare GPU and GPU share at same time"
    );
    assert_eq!(
        review(
            "/validate-pod",
            "",
            &POD,
            "plain",
            shared_and_whole,
            Value::Null
        )["allowed"],
        true
    );

    let unlabelled = pod("plain", json!({}), json!({}));
    let gate = "EnablePodEnhancedValidator=true";
    assert_eq!(
        denial(&review(
            "/validate-pod",
            gate,
            &POD,
            "plain",
            unlabelled.clone(),
            Value::Null
        )),
        "required label 'team' is missing"
    );
    assert_eq!(
        review(
            "/validate-pod",
            gate,
            &POD,
            "spark",
            pod("spark", json!({}), json!({})),
            Value::Null
        )["allowed"],
        true,
        "whitelisted"
    );
    let skipping = pod(
        "plain",
        json!({"pod.koordinator.sh/skip-enhanced-validation": "true"}),
        json!({}),
    );
    assert_eq!(
        review("/validate-pod", gate, &POD, "plain", skipping, Value::Null)["allowed"],
        true
    );

    let mut reserved = pod("plain", json!({}), json!({"requests": {"cpu": "2"}}));
    reserved["metadata"]["annotations"] =
        json!({"scheduling.koordinator.sh/reservation-affinity": r#"{"name": "r-small"}"#});
    let gate = "ReservationAffinityValidation=true";
    assert_eq!(
        denial(&review(
            "/validate-pod",
            gate,
            &POD,
            "plain",
            reserved.clone(),
            Value::Null
        )),
        "pod requests exceed the free resources of reservation r-small: cpu=2 > 1"
    );
    reserved["metadata"]["annotations"] =
        json!({"scheduling.koordinator.sh/reservation-affinity": r#"{"name": "gone"}"#});
    assert_eq!(
        denial(&review(
            "/validate-pod",
            gate,
            &POD,
            "plain",
            reserved,
            Value::Null
        )),
        "reservation gone not found"
    );
}

#[test]
fn reservations_take_the_profile_on_their_template() {
    let original = json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
        "metadata": {"name": "r", "labels": {"app": "spark"}},
        "spec": {"owners": [{"object": {"name": "x"}}], "template": {"spec": {"containers": [{"name": "main", "image": "spark"}]}}}});
    let response = review(
        "/mutate-reservation",
        "",
        &RESERVATION,
        "",
        original.clone(),
        Value::Null,
    );
    let out = patched(&original, &response);
    assert_eq!(out["metadata"]["labels"]["koordinator.sh/qosClass"], "BE");
    let template = &out["spec"]["template"]["spec"];
    assert_eq!(template["schedulerName"], "koord-scheduler");
    assert_eq!(template["priority"], 5500);
    // The profile's patch is written for pods (spec.containers): a Reservation has no such field, so
    // it changes nothing there and the template keeps its container.
    assert!(out["spec"].get("containers").is_none(), "{out}");
    assert_eq!(
        template["containers"],
        json!([{"name": "main", "image": "spark"}])
    );
}

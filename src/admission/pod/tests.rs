//! /validate-pod leaves fields out of the pods it decodes: the verdicts must not change.

use serde_json::{Value, json};

use super::UNREAD_BY_VALIDATORS;
use crate::admission::Admission;
use crate::admission::endpoint::{Endpoint, TypedEndpoint};
use crate::admission::webhooks::{VALIDATE_POD, find};
use crate::cache::Cache;
use crate::features::{FeatureGates, Gate};
use crate::metrics::Metrics;

/// What every left-out field looks like in a busy pod.
fn busy_container(name: &str, resources: Value) -> Value {
    let probe = json!({"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 5});
    json!({"name": name, "image": "registry.example.com/app:1", "command": ["/bin/app"],
        "args": ["--cores", "2"], "workingDir": "/srv", "ports": [{"containerPort": 8080}],
        "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "envFrom": [{"configMapRef": {"name": "cfg"}}], "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "volumeDevices": [{"name": "blk", "devicePath": "/dev/xvda"}], "livenessProbe": probe,
        "readinessProbe": probe, "startupProbe": probe, "lifecycle": {"preStop": {"exec": {"command": ["sleep", "1"]}}},
        "resources": resources})
}

fn pod(labels: Value, annotations: Value, spec: Value, resources: Value) -> Value {
    let mut spec = spec;
    spec["containers"] = json!([
        busy_container("main", resources.clone()),
        busy_container("side", json!({}))
    ]);
    spec["initContainers"] = json!([busy_container("init", resources)]);
    spec["volumes"] = json!([{"name": "data", "emptyDir": {}}]);
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "labels": labels, "annotations": annotations,
            "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {}}}]},
        "spec": spec})
}

/// Pods each of which some validator answers in its own way.
fn cases() -> Vec<(&'static str, Value)> {
    let batch = json!({"requests": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "1Gi"}});
    let cpu = json!({"requests": {"cpu": "1500m"}, "limits": {"cpu": "1500m"}});
    vec![
        ("plain", pod(json!({}), json!({}), json!({}), cpu.clone())),
        (
            "batch without BE",
            pod(json!({}), json!({}), json!({}), batch.clone()),
        ),
        (
            "BE with batch priority",
            pod(
                json!({"koordinator.sh/qosClass": "BE"}),
                json!({}),
                json!({"priorityClassName": "koord-batch", "priority": 5500}),
                batch,
            ),
        ),
        (
            "LSR with fractional cpu",
            pod(
                json!({"koordinator.sh/qosClass": "LSR"}),
                json!({}),
                json!({"priorityClassName": "koord-prod", "priority": 9500}),
                cpu.clone(),
            ),
        ),
        (
            "reserve pod",
            pod(
                json!({}),
                json!({"scheduling.koordinator.sh/reserve-pod": "true"}),
                json!({}),
                cpu,
            ),
        ),
        (
            "device resources",
            pod(
                json!({}),
                json!({}),
                json!({}),
                json!({"requests": {"koordinator.sh/gpu": "150"}}),
            ),
        ),
    ]
}

fn review(object: &Value) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "default",
            "name": "p", "operation": "CREATE", "userInfo": {"username": "tester"},
            "object": object, "oldObject": null}}),
    )
    .unwrap()
}

#[tokio::test]
async fn verdicts_are_the_same_with_and_without_the_left_out_fields() {
    let spec = find(VALIDATE_POD).unwrap();
    let endpoints = |skip: bool| -> Vec<Box<dyn Endpoint>> {
        let skip = skip.then_some(&UNREAD_BY_VALIDATORS);
        vec![Box::new(TypedEndpoint::validating_skipping(
            spec,
            super::validators(),
            skip,
        ))]
    };
    let admission = |skip| {
        let mut gates = FeatureGates::default();
        gates.set(Gate::ValidatePodDeviceResource, true);
        Admission::with_endpoints(endpoints(skip), Cache::empty(), gates, Metrics::new())
    };
    let (full, slim) = (admission(false), admission(true));
    let mut denied = 0;
    for (name, object) in cases() {
        let body = review(&object);
        let a: Value =
            serde_json::from_slice(&full.review(VALIDATE_POD, &body, None).await.unwrap()).unwrap();
        let b: Value =
            serde_json::from_slice(&slim.review(VALIDATE_POD, &body, None).await.unwrap()).unwrap();
        assert_eq!(a, b, "{name}");
        denied += usize::from(a["response"]["allowed"] == false);
    }
    // The cases reach the validators' rejections as well as the allow path.
    assert!(
        denied >= 4 && denied < cases().len(),
        "only {denied} cases were denied"
    );
}

/// The Rust spelling of a JSON field name: `volumeMounts` -> `volume_mounts`.
fn snake(name: &str) -> String {
    name.chars()
        .flat_map(|c| {
            let lower = c.to_ascii_lowercase();
            (c.is_ascii_uppercase().then_some('_').into_iter()).chain([lower])
        })
        .collect()
}

#[test]
fn no_validator_reads_a_left_out_field() {
    // The validators of /validate-pod and the helpers they share.
    let sources = [
        include_str!("forbidden_reserve_pod.rs"),
        include_str!("colocation_rules.rs"),
        include_str!("device_validation.rs"),
        include_str!("enhanced_validator.rs"),
        include_str!("reservation_affinity.rs"),
        include_str!("../elastic_quota/pod_topology_check.rs"),
        include_str!("../elastic_quota/pod_evaluation.rs"),
        include_str!("../elastic_quota/evaluation.rs"),
        include_str!("../elastic_quota/pod_quota.rs"),
        include_str!("../../resources/pod_requests.rs"),
        include_str!("../../resources/priority.rs"),
        include_str!("../../resources/list.rs"),
    ];
    for (_, fields) in UNREAD_BY_VALIDATORS.0 {
        for field in *fields {
            let access = format!(".{}", snake(field));
            for source in sources {
                let hit = source.match_indices(&access).any(|(i, _)| {
                    !source[i + access.len()..]
                        .starts_with(|c: char| c == '_' || c.is_alphanumeric())
                });
                assert!(
                    !hit,
                    "a validator reads `{access}`: take {field:?} off UNREAD_BY_VALIDATORS"
                );
            }
        }
    }
    assert_eq!(snake("volumeMounts"), "volume_mounts");
}

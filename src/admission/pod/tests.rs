//! /validate-pod and /mutate-pod leave fields out of the pods they decode: verdicts and patched
//! pods must not change.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::UNTOUCHED_BY_PLUGINS;
use crate::admission::Admission;
use crate::admission::endpoint::{Endpoint, TypedEndpoint};
use crate::admission::webhooks::{MUTATE_POD, VALIDATE_POD, find};
use crate::cache::{Cache, CacheWriter, CachedObject};
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

/// The endpoint as the server builds it (`skip`), or decoding pods whole.
fn skipping_if(skip: bool, endpoint: TypedEndpoint<Pod>) -> Endpoint {
    match skip {
        true => Endpoint::from(endpoint.skipping(&UNTOUCHED_BY_PLUGINS)),
        false => Endpoint::from(endpoint),
    }
}

#[tokio::test]
async fn verdicts_are_the_same_with_and_without_the_left_out_fields() {
    let spec = find(VALIDATE_POD).unwrap();
    let endpoints = |skip: bool| -> Vec<Endpoint> {
        vec![skipping_if(
            skip,
            TypedEndpoint::validating(spec, super::validators()),
        )]
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

/// A cache whose profiles touch every mutator: metadata, scheduler, batch priority (so resources
/// become batch resources and the extended-resource-spec annotation is written), and, if
/// `with_patch`, a strategic merge patch that adds env and a volume (fields the decode leaves out).
fn profile_cache(with_patch: bool) -> Cache {
    let mut writer = CacheWriter::default();
    let mut spec = json!({"selector": {"matchLabels": {"app": "spark"}},
        "labels": {"koordinator.sh/qosClass": "BE"}, "annotations": {"colocated": "yes"},
        "schedulerName": "koord-scheduler", "priorityClassName": "koord-batch"});
    if with_patch {
        spec["patch"] = json!({"spec": {
            "containers": [{"name": "main", "env": [{"name": "FROM_PROFILE", "value": "1"}]}],
            "volumes": [{"name": "scratch", "emptyDir": {}}]}});
    }
    writer.apply(CachedObject::ColocationProfile(
        serde_json::from_value(json!({
        "apiVersion": "config.koordinator.sh/v1alpha1", "kind": "ClusterColocationProfile",
        "metadata": {"name": "spark"}, "spec": spec}))
        .unwrap(),
    ));
    writer.apply(CachedObject::PriorityClass(
        serde_json::from_value(json!({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": "koord-batch"}, "value": 5500}))
        .unwrap(),
    ));
    writer.reader()
}

/// The pod a /mutate-pod answer makes of `object`.
fn patched(object: &Value, response: &[u8]) -> Value {
    use base64::Engine;
    let response: Value = serde_json::from_slice(response).unwrap();
    assert_eq!(response["response"]["allowed"], true, "{response}");
    let Some(patch) = response["response"]["patch"].as_str() else {
        return object.clone();
    };
    let patch = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .unwrap();
    crate::admission::patch::tests::apply(object, &patch)
}

#[tokio::test]
async fn patched_pods_are_the_same_with_and_without_the_left_out_fields() {
    let spec = find(MUTATE_POD).unwrap();
    let admission = |skip: bool, cache: Cache| {
        let endpoint = TypedEndpoint::mutating_with_differ(
            spec,
            super::mutators(),
            crate::admission::patch::pod::diff,
        );
        Admission::with_endpoints(
            vec![skipping_if(skip, endpoint)],
            cache,
            FeatureGates::default(),
            Metrics::new(),
        )
    };
    let spark = json!({"app": "spark"});
    let cpu =
        json!({"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}});
    let pods = [
        pod(spark.clone(), json!({}), json!({}), cpu.clone()),
        pod(
            spark,
            json!({"owner": "x"}),
            json!({"priority": 1}),
            json!({}),
        ),
        pod(json!({"app": "web"}), json!({}), json!({}), cpu),
    ];
    for with_patch in [false, true] {
        let (full, slim) = (
            admission(false, profile_cache(with_patch)),
            admission(true, profile_cache(with_patch)),
        );
        for (i, object) in pods.iter().enumerate() {
            let body = review(object);
            let a = patched(object, &full.review(MUTATE_POD, &body, None).await.unwrap());
            let b = patched(object, &slim.review(MUTATE_POD, &body, None).await.unwrap());
            assert_eq!(a, b, "pod {i}, profile patch {with_patch}");
            // The left-out fields are kept, the mutation happened, and the profile's patch is in.
            let main = &a["spec"]["containers"][0];
            let env = main["env"].as_array().unwrap();
            for kept in object["spec"]["containers"][0]["env"].as_array().unwrap() {
                assert!(env.contains(kept), "pod {i}: {kept} lost");
            }
            assert!(
                a["spec"]["volumes"]
                    .as_array()
                    .unwrap()
                    .contains(&object["spec"]["volumes"][0])
            );
            if i < 2 {
                assert_eq!(a["spec"]["schedulerName"], "koord-scheduler", "pod {i}");
                assert_eq!(
                    env.iter().any(|e| e["name"] == "FROM_PROFILE"),
                    with_patch,
                    "pod {i}"
                );
            } else {
                assert_eq!(&a, object, "pod {i} matches no profile");
            }
        }
    }
    // With a profile carrying a patch the endpoint decodes pods whole, without it it does not.
    assert!(!super::mutators()[0].edits_any_field(&profile_cache(false)));
    assert!(super::mutators()[0].edits_any_field(&profile_cache(true)));
}

#[test]
fn no_plugin_touches_a_left_out_field() {
    // The plugins of /validate-pod and /mutate-pod and the helpers they share.
    let sources = [
        include_str!("forbidden_reserve_pod.rs"),
        include_str!("colocation_rules.rs"),
        include_str!("device_validation.rs"),
        include_str!("enhanced_validator.rs"),
        include_str!("reservation_affinity.rs"),
        include_str!("colocation_profile.rs"),
        include_str!("extended_resource_spec.rs"),
        include_str!("multi_quota_tree.rs"),
        include_str!("device_resources.rs"),
        include_str!("batch_resources.rs"),
        include_str!("../colocation/mod.rs"),
        include_str!("quota/topology_check.rs"),
        include_str!("quota/evaluation.rs"),
        include_str!("quota/evaluator.rs"),
        include_str!("quota/replace_resources.rs"),
        include_str!("quota/mod.rs"),
        include_str!("../../resources/pod_requests.rs"),
        include_str!("../../resources/priority.rs"),
        include_str!("../../resources/list.rs"),
    ];
    for (_, fields) in UNTOUCHED_BY_PLUGINS.0 {
        for field in *fields {
            let access = format!(".{}", snake(field));
            for source in sources {
                let hit = source.match_indices(&access).any(|(i, _)| {
                    !source[i + access.len()..]
                        .starts_with(|c: char| c == '_' || c.is_alphanumeric())
                });
                assert!(
                    !hit,
                    "a plugin touches `{access}`: take {field:?} off UNTOUCHED_BY_PLUGINS"
                );
            }
        }
    }
    assert_eq!(snake("volumeMounts"), "volume_mounts");
}

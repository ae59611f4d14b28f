//! /validate-pod and /mutate-pod keep the fields no plugin reads undecoded (`object.rs`): verdicts
//! must not depend on them, and patches must keep them (or edit them only by a profile's patch).

use serde_json::{Value, json};

use crate::admission::Admission;
use crate::admission::endpoint::{Endpoint, TypedEndpoint};
use crate::cache::{Cache, CacheWriter, CachedObject};
use crate::entries::{MUTATE_POD, VALIDATE_POD, find};
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
async fn verdicts_do_not_depend_on_the_undecoded_fields() {
    let spec = find(VALIDATE_POD).unwrap();
    let mut gates = FeatureGates::default();
    gates.set(Gate::ValidatePodDeviceResource, true);
    let admission = Admission::with_endpoints(
        vec![Endpoint::from(TypedEndpoint::validating(
            spec,
            super::validators(),
        ))],
        Cache::empty(),
        gates,
        Metrics::new(),
    );
    let mut denied = 0;
    for (name, object) in cases() {
        let bare = bare(&object);
        let verdict = |object: &Value| {
            let body = review(object);
            let admission = &admission;
            async move {
                let out = admission.review(VALIDATE_POD, &body, None).await.unwrap();
                serde_json::from_slice::<Value>(&out).unwrap()
            }
        };
        let (a, b) = (verdict(&object).await, verdict(&bare).await);
        assert_eq!(a, b, "{name}");
        denied += usize::from(a["response"]["allowed"] == false);
    }
    // The cases reach the validators' rejections as well as the allow path.
    assert!(
        denied >= 4 && denied < cases().len(),
        "only {denied} cases were denied"
    );
}

/// `object` without any field of a pod, its spec, containers or status that `object.rs` leaves
/// undecoded.
fn bare(object: &Value) -> Value {
    fn keep(value: &mut Value, fields: &[&str]) {
        if let Some(map) = value.as_object_mut() {
            map.retain(|k, _| fields.contains(&k.as_str()));
        }
    }
    let mut pod = object.clone();
    keep(&mut pod, &["metadata", "spec", "status"]);
    let spec = &mut pod["spec"];
    keep(
        spec,
        &[
            "affinity",
            "containers",
            "initContainers",
            "nodeSelector",
            "overhead",
            "preemptionPolicy",
            "priority",
            "priorityClassName",
            "schedulerName",
        ],
    );
    for list in ["containers", "initContainers"] {
        for container in spec[list].as_array_mut().into_iter().flatten() {
            keep(container, &["name", "resources", "restartPolicy"]);
        }
    }
    pod
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

/// The paths of a /mutate-pod answer's operations that reach a field `object.rs` leaves undecoded.
fn undecoded_paths(response: &[u8]) -> Vec<String> {
    use base64::Engine;
    const UNDECODED: [&str; 14] = [
        "args",
        "command",
        "env",
        "envFrom",
        "lifecycle",
        "livenessProbe",
        "ports",
        "readinessProbe",
        "startupProbe",
        "volumeDevices",
        "volumeMounts",
        "workingDir",
        "volumes",
        "managedFields",
    ];
    let response: Value = serde_json::from_slice(response).unwrap();
    let Some(patch) = response["response"]["patch"].as_str() else {
        return Vec::new();
    };
    let patch = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .unwrap();
    let ops: Vec<Value> = serde_json::from_slice(&patch).unwrap();
    ops.iter()
        .filter_map(|op| op["path"].as_str())
        .filter(|path| path.split('/').any(|segment| UNDECODED.contains(&segment)))
        .map(str::to_owned)
        .collect()
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
async fn patches_keep_the_undecoded_fields() {
    let spec = find(MUTATE_POD).unwrap();
    let admission = |cache: Cache| {
        let endpoint = TypedEndpoint::mutating_with_differ(
            spec,
            super::mutators(),
            crate::admission::patch::pod::diff,
        );
        Admission::with_endpoints(
            vec![Endpoint::from(endpoint)],
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
        let admission = admission(profile_cache(with_patch));
        for (i, object) in pods.iter().enumerate() {
            let body = review(object);
            let answer = admission.review(MUTATE_POD, &body, None).await.unwrap();
            // Without a profile's patch no operation reaches an undecoded field.
            let touched = undecoded_paths(&answer);
            assert_eq!(
                touched.is_empty(),
                !with_patch || i >= 2,
                "pod {i}: {touched:?}"
            );
            let a = patched(object, &answer);
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
}

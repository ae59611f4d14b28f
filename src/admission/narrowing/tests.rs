//! Narrowing never changes an answer: for random (request, cache state, gates), whenever the
//! conditions written for an entry say "skip", the endpoint answers allowed with no patch. The
//! conditions are evaluated as CEL by the `cel` crate, the very text the API server gets; an
//! expression that errors fails the test (under `failurePolicy: Fail` it would reject the request).

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};

use super::pod::{PodReach, create_reach, validate_reach};
use super::{Calls, Narrowing};
use crate::admission::Admission;
use crate::admission::webhooks::{EntrySpec, WEBHOOKS, WebhookSpec};
use crate::apis::keys::*;
use crate::cache::{CacheWriter, CachedObject};
use crate::features::{FeatureGates, Gate};
use crate::metrics::Metrics;

/// Random cases per narrowed entry; four entries make 10,000 in all.
const CASES: u32 = 2_500;

fn entry(narrowing: Narrowing) -> (&'static WebhookSpec, &'static EntrySpec) {
    WEBHOOKS
        .iter()
        .flat_map(|w| w.entries.iter().map(move |e| (w, e)))
        .find(|(_, e)| e.narrowing == narrowing)
        .expect("an entry with this narrowing")
}

/// An entry's conditions, compiled once.
enum Compiled {
    All,
    Never,
    When(Vec<(&'static str, ::cel::Program)>),
}

impl Compiled {
    fn new(calls: &Calls) -> Self {
        match calls {
            Calls::All => Compiled::All,
            Calls::Never => Compiled::Never,
            Calls::When(conditions) => Compiled::When(
                conditions
                    .iter()
                    .map(|c| {
                        let program = ::cel::Program::compile(&c.expression)
                            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
                        (c.name, program)
                    })
                    .collect(),
            ),
        }
    }

    /// Whether the API server would send the request: every condition true. An error is a
    /// failure.
    fn sends(&self, request: &Value) -> Result<bool, String> {
        let programs = match self {
            Compiled::All => return Ok(true),
            Compiled::Never => return Ok(false),
            Compiled::When(programs) => programs,
        };
        let mut context = ::cel::Context::default();
        let mut bare = request.clone();
        let mut take = |key: &str| {
            bare.as_object_mut()
                .and_then(|r| r.remove(key))
                .unwrap_or(Value::Null)
        };
        let (object, old) = (take("object"), take("oldObject"));
        for (name, value) in [("object", object), ("oldObject", old), ("request", bare)] {
            context
                .add_variable(name, value)
                .map_err(|e| e.to_string())?;
        }
        for (name, program) in programs {
            match program.execute(&context) {
                Ok(::cel::Value::Bool(true)) => {}
                Ok(::cel::Value::Bool(false)) => return Ok(false),
                Ok(other) => return Err(format!("{name}: not a bool: {other:?}")),
                Err(e) => return Err(format!("{name}: {e}")),
            }
        }
        Ok(true)
    }
}

fn sent(calls: &Calls, request: &Value) -> Result<bool, String> {
    Compiled::new(calls).sends(request)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The endpoint's answer: (allowed, has a patch).
fn answer(
    runtime: &tokio::runtime::Runtime,
    spec: &WebhookSpec,
    gates: FeatureGates,
    cache: Vec<CachedObject>,
    request: &Value,
) -> (bool, bool, Value) {
    let mut writer = CacheWriter::default();
    for object in cache {
        writer.apply(object);
    }
    let admission = Admission::new(writer.reader(), gates, Metrics::new());
    let body = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request
    }))
    .unwrap();
    let out = runtime
        .block_on(admission.review(spec.path, &body, None))
        .expect("an answer");
    let response: Value = serde_json::from_slice(&out).unwrap();
    let response = response["response"].clone();
    (
        response["allowed"] == json!(true),
        response.get("patch").is_some_and(|p| !p.is_null()),
        response,
    )
}

/// A map of 0-3 entries drawn from `pool`, or absent (the API server never sends an empty one).
fn string_map(
    pool: &'static [(&'static str, &'static [&'static str])],
) -> BoxedStrategy<Option<BTreeMap<String, String>>> {
    prop::collection::vec(
        (0..pool.len()).prop_flat_map(move |i| {
            let (key, values) = pool[i];
            prop::sample::select(values).prop_map(move |v| (key.to_owned(), v.to_owned()))
        }),
        0..4,
    )
    .prop_map(|pairs| {
        let map: BTreeMap<String, String> = pairs.into_iter().collect();
        (!map.is_empty()).then_some(map)
    })
    .boxed()
}

fn gates() -> impl Strategy<Value = FeatureGates> {
    prop::collection::vec(any::<bool>(), Gate::all().count()).prop_map(|bits| {
        let mut gates = FeatureGates::default();
        for (gate, on) in Gate::all().zip(bits) {
            // The endpoint under test stays served; every rule gate is random.
            let endpoint = gate.name().ends_with("Webhook");
            gates.set(gate, on || endpoint);
        }
        gates
    })
}

/// An UPDATE's old object: the new one with some of its parts replaced by other draws.
fn old_from(new: &Value, other: &Value, pick: [bool; 3]) -> Value {
    let mut old = new.clone();
    for (part, take) in [("labels", pick[0]), ("annotations", pick[1])] {
        if take {
            match other["metadata"].get(part) {
                Some(v) => old["metadata"][part] = v.clone(),
                None => {
                    if let Some(m) = old["metadata"].as_object_mut() {
                        m.remove(part);
                    }
                }
            }
        }
    }
    if pick[2] {
        for part in ["spec", "status"] {
            match other.get(part) {
                Some(v) => old[part] = v.clone(),
                None => {
                    if let Some(m) = old.as_object_mut() {
                        m.remove(part);
                    }
                }
            }
        }
    }
    old
}

fn request(
    resource: (&str, &str, &str, &str),
    operation: &str,
    object: Option<Value>,
    old: Option<Value>,
    namespace: Option<&str>,
) -> Value {
    let (group, kind, plural, sub) = resource;
    let mut r = json!({
        "uid": "u", "operation": operation, "userInfo": {"username": "someone"},
        "kind": {"group": group, "version": if group.is_empty() { "v1" } else { "v1alpha1" }, "kind": kind},
        "resource": {"group": group, "version": if group.is_empty() { "v1" } else { "v1alpha1" }, "resource": plural},
        "name": object.as_ref().or(old.as_ref()).and_then(|o| o["metadata"]["name"].as_str()).unwrap_or("x"),
        "dryRun": false
    });
    if !sub.is_empty() {
        r["subResource"] = json!(sub);
    }
    if let Some(ns) = namespace {
        r["namespace"] = json!(ns);
    }
    if let Some(o) = object {
        r["object"] = o;
    }
    if let Some(o) = old {
        r["oldObject"] = o;
    }
    r
}

/// The calls of an entry whose conditions depend on nothing but the entry.
fn static_calls(narrowing: Narrowing) -> Calls {
    narrowing.calls(&FeatureGates::default(), &PodReach::default())
}

/// Runs `cases` draws of `strategy`; every skipped request must be allowed unchanged. Returns how
/// many were skipped, so a generator that never exercises a skip fails too.
fn check<S>(narrowing: Narrowing, strategy: S)
where
    S: Strategy<Value = (Value, FeatureGates, Vec<CachedObject>)>,
{
    let calls = static_calls(narrowing);
    check_with(narrowing, strategy, |_, _| calls.clone());
}

/// [`check`] with conditions that depend on the gates and the cache of each draw, as the leader
/// derives them.
fn check_with<S>(
    narrowing: Narrowing,
    strategy: S,
    calls_for: impl Fn(&FeatureGates, &[CachedObject]) -> Calls,
) where
    S: Strategy<Value = (Value, FeatureGates, Vec<CachedObject>)>,
{
    let (spec, entry) = entry(narrowing);
    let mut compiled: std::collections::HashMap<Calls, Compiled> = Default::default();
    let mut never = true;
    let runtime = runtime();
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: CASES,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let (mut skipped, mut sent_count) = (0u32, 0u32);
    for _ in 0..CASES {
        let tree = strategy.new_tree(&mut runner).unwrap();
        let (request, gates, cache) = tree.current();
        let calls = calls_for(&gates, &cache);
        never &= calls == Calls::Never;
        let send = compiled
            .entry(calls)
            .or_insert_with_key(Compiled::new)
            .sends(&request)
            .unwrap_or_else(|e| panic!("{}: a condition errors: {e}\n{request:#}", entry.name));
        if send {
            sent_count += 1;
            continue;
        }
        skipped += 1;
        let (allowed, patched, response) = answer(&runtime, spec, gates, cache, &request);
        assert!(
            allowed && !patched,
            "{}: skipped by the conditions, but the endpoint answers {response:#}\nfor {request:#}",
            entry.name
        );
    }
    assert!(
        skipped > CASES / 20 && (sent_count > CASES / 20 || never),
        "{}: the draws must exercise both sides (skipped {skipped}, sent {sent_count})",
        entry.name
    );
}

const NODE_LABELS: &[(&str, &[&str])] = &[
    ("pool", &["a", "b"]),
    ("zone", &["z1"]),
    ("kubernetes.io/hostname", &["n1"]),
];
const NODE_ANNOTATIONS: &[(&str, &[&str])] = &[
    (
        AMPLIFICATION_RATIO,
        &[
            r#"{"cpu":1.5}"#,
            r#"{"cpu":2,"memory":1.2}"#,
            "",
            "null",
            r#"{"cpu":9}"#,
            "garbage",
        ],
    ),
    (
        RAW_ALLOCATABLE,
        &[r#"{"cpu":"4","memory":"8Gi"}"#, "", "garbage", "null"],
    ),
    (RAW_CAPACITY, &[r#"{"cpu":"4"}"#, "garbage"]),
    ("node.alpha.kubernetes.io/ttl", &["0"]),
    ("other", &["x"]),
];

fn node() -> impl Strategy<Value = Value> {
    let quantity = prop::sample::select(&["4", "3500m", "8Gi", "7Gi", "garbage"][..]);
    (
        string_map(NODE_LABELS),
        string_map(NODE_ANNOTATIONS),
        prop::option::of((quantity.clone(), quantity.clone(), quantity)),
    )
        .prop_map(|(labels, annotations, status)| {
            let mut node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}});
            if let Some(l) = labels {
                node["metadata"]["labels"] = json!(l);
            }
            if let Some(a) = annotations {
                node["metadata"]["annotations"] = json!(a);
            }
            if let Some((cpu, memory, cap)) = status {
                node["status"] = json!({"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                    "capacity": {"cpu": cap, "memory": memory}});
            }
            node
        })
}

/// An SLO ConfigMap whose two strategies both match a node of pool a, so a label change to it is
/// denied; or none.
fn slo_cache() -> impl Strategy<Value = Vec<CachedObject>> {
    any::<bool>().prop_map(|with| {
        if !with {
            return Vec::new();
        }
        let config: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "slo-controller-config", "namespace": "koordinator-system"},
            "data": {"resource-threshold-config": json!({"nodeStrategies": [
                {"name": "first", "nodeSelector": {"matchLabels": {"pool": "a"}}},
                {"name": "second", "nodeSelector": {"matchLabels": {"pool": "a"}}}]}).to_string()}
        }))
        .unwrap();
        vec![CachedObject::ConfigMap(config)]
    })
}

fn node_requests(
    sub: &'static str,
) -> impl Strategy<Value = (Value, FeatureGates, Vec<CachedObject>)> {
    (
        node(),
        node(),
        any::<[bool; 3]>(),
        prop::sample::select(&["CREATE", "UPDATE"][..]),
        gates(),
        slo_cache(),
    )
        .prop_map(move |(new, other, pick, operation, gates, cache)| {
            let old = (operation == "UPDATE").then(|| old_from(&new, &other, pick));
            let r = request(("", "Node", "nodes", sub), operation, Some(new), old, None);
            (r, gates, cache)
        })
}

#[test]
fn skipped_node_status_updates_are_allowed_unchanged() {
    check(Narrowing::NodeStatus, node_requests("status"));
}

#[test]
fn skipped_node_changes_are_allowed() {
    check(Narrowing::NodeValidation, node_requests(""));
}

const QUOTA_LABELS: &[(&str, &[&str])] = &[
    (
        QUOTA_PARENT,
        &["parent", "koordinator-root-quota", "missing", ""],
    ),
    (QUOTA_IS_PARENT, &["true", "false"]),
    (QUOTA_TREE_ID, &["t1", ""]),
    ("team", &["a"]),
];
const QUOTA_ANNOTATIONS: &[(&str, &[&str])] = &[
    (QUOTA_NAMESPACES, &[r#"["ns1"]"#, r#"["ns2"]"#, "garbage"]),
    (
        "quota.scheduling.koordinator.sh/child-request",
        &[r#"{"cpu":"1"}"#, r#"{"cpu":"-1k"}"#],
    ),
    (
        "quota.scheduling.koordinator.sh/shared-weight",
        &[r#"{"cpu":"4"}"#, "garbage"],
    ),
    ("other", &["x"]),
];

fn quota(names: &'static [&'static str]) -> impl Strategy<Value = Value> {
    let quantity = prop::sample::select(&["1", "4", "8", "-1", "500m"][..]);
    (
        prop::sample::select(names),
        string_map(QUOTA_LABELS),
        string_map(QUOTA_ANNOTATIONS),
        prop::option::of((quantity.clone(), quantity)),
    )
        .prop_map(|(name, labels, annotations, spec)| {
            let mut q = json!({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                "metadata": {"name": name, "namespace": "ns1"}});
            if let Some(l) = labels {
                q["metadata"]["labels"] = json!(l);
            }
            if let Some(a) = annotations {
                q["metadata"]["annotations"] = json!(a);
            }
            // The CRD requires a spec; its fields are optional.
            q["spec"] = match spec {
                Some((min, max)) => json!({"min": {"cpu": min}, "max": {"cpu": max, "memory": "8Gi"}}),
                None => json!({}),
            };
            q
        })
}

#[test]
fn skipped_elastic_quota_changes_are_allowed() {
    const NAMES: &[&str] = &[
        "parent",
        "child",
        "koordinator-root-quota",
        "koordinator-default-quota",
        "new",
    ];
    let cache = prop::collection::vec(quota(&NAMES[..4]), 0..4).prop_map(|quotas| {
        quotas
            .into_iter()
            .map(|q| CachedObject::ElasticQuota(serde_json::from_value(q).unwrap()))
            .collect::<Vec<_>>()
    });
    let strategy = (
        quota(NAMES),
        quota(NAMES),
        any::<[bool; 3]>(),
        prop::sample::select(&["CREATE", "UPDATE", "DELETE"][..]),
        gates(),
        cache,
    )
        .prop_map(|(new, other, pick, operation, gates, cache)| {
            let resource = (
                "scheduling.sigs.k8s.io",
                "ElasticQuota",
                "elasticquotas",
                "",
            );
            let r = match operation {
                "UPDATE" => {
                    let mut old = old_from(&new, &other, pick);
                    old["metadata"]["name"] = new["metadata"]["name"].clone();
                    request(resource, operation, Some(new), Some(old), Some("ns1"))
                }
                "DELETE" => request(resource, operation, None, Some(new), Some("ns1")),
                _ => request(resource, operation, Some(new), None, Some("ns1")),
            };
            (r, gates, cache)
        });
    check(Narrowing::ElasticQuotaChange, strategy);
}

const POD_LABELS: &[(&str, &[&str])] = &[
    (QOS_CLASS_LABEL, &["BE", "LS", "LSR"]),
    (PRIORITY_LABEL, &["1000"]),
    (QUOTA_NAME, &["q"]),
    ("app", &["web", "batch"]),
];
const POD_ANNOTATIONS: &[(&str, &[&str])] = &[
    ("scheduling.koordinator.sh/reserve-pod", &["true"]),
    (EXTENDED_RESOURCE_SPEC, &["{}"]),
    ("other", &["x"]),
];

fn pod() -> impl Strategy<Value = Value> {
    let resource = prop::sample::select(
        &[
            "cpu",
            "memory",
            BATCH_CPU,
            BATCH_MEMORY,
            GPU,
            "nvidia.com/gpu",
        ][..],
    );
    (
        string_map(POD_LABELS),
        string_map(POD_ANNOTATIONS),
        prop::option::of(prop::sample::select(&[0, 3500, 5500, 7500, 9500][..])),
        prop::collection::vec(resource, 0..3),
    )
        .prop_map(|(labels, annotations, priority, resources)| {
            let requests: BTreeMap<&str, &str> = resources.into_iter().map(|r| (r, "1")).collect();
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "ns1"},
                "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": requests, "limits": requests}}]}});
            if let Some(l) = labels {
                pod["metadata"]["labels"] = json!(l);
            }
            if let Some(a) = annotations {
                pod["metadata"]["annotations"] = json!(a);
            }
            if let Some(p) = priority {
                pod["spec"]["priority"] = json!(p);
            }
            pod
        })
}

#[test]
fn pod_updates_are_never_changed_by_the_mutating_endpoint() {
    // A profile that selects every pod, so a mutation on UPDATE would show.
    let profile: crate::apis::ClusterColocationProfile = serde_json::from_value(json!({
        "apiVersion": "config.koordinator.sh/v1alpha1", "kind": "ClusterColocationProfile",
        "metadata": {"name": "all"},
        "spec": {"selector": {}, "namespaceSelector": {}, "qosClass": "BE", "priorityClassName": "koord-batch",
                 "labels": {"added": "yes"}, "schedulerName": "koord-scheduler"}
    }))
    .unwrap();
    let strategy = (pod(), pod(), gates()).prop_map(move |(new, old, gates)| {
        let r = request(
            ("", "Pod", "pods", ""),
            "UPDATE",
            Some(new),
            Some(old),
            Some("ns1"),
        );
        (
            r,
            gates,
            vec![CachedObject::ColocationProfile(profile.clone())],
        )
    });
    check(Narrowing::Never, strategy);
}

#[test]
fn the_profile_of_the_never_test_does_mutate_creates() {
    // Guards the test above: the same profile changes a created pod, so UPDATE's silence is the
    // endpoint's, not the profile's.
    let profile: crate::apis::ClusterColocationProfile = serde_json::from_value(json!({
        "metadata": {"name": "all"},
        "spec": {"selector": {}, "namespaceSelector": {}, "labels": {"added": "yes"}}
    }))
    .unwrap();
    let (spec, _) = entry(Narrowing::Never);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns1"},
        "spec": {"containers": [{"name": "c", "image": "i"}]}});
    let r = request(
        ("", "Pod", "pods", ""),
        "CREATE",
        Some(pod),
        None,
        Some("ns1"),
    );
    let (allowed, patched, response) = answer(
        &runtime(),
        spec,
        FeatureGates::default(),
        vec![CachedObject::ColocationProfile(profile)],
        &r,
    );
    assert!(allowed && patched, "{response:#}");
}

#[test]
fn conditions_are_sent_where_the_rules_act() {
    // Hand-picked cases on the "sent" side: the property tests above prove only the skips.
    let (_, status) = entry(Narrowing::NodeStatus);
    let mut annotated =
        json!({"metadata": {"name": "n", "annotations": {AMPLIFICATION_RATIO: "{\"cpu\":2}"}}});
    let update = |o: &Value, old: &Value| {
        request(
            ("", "Node", "nodes", "status"),
            "UPDATE",
            Some(o.clone()),
            Some(old.clone()),
            None,
        )
    };
    assert_eq!(
        sent(
            &static_calls(status.narrowing),
            &update(&annotated, &annotated)
        ),
        Ok(true)
    );
    annotated["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    assert_eq!(
        sent(
            &static_calls(status.narrowing),
            &update(&annotated, &annotated)
        ),
        Ok(false)
    );

    let (_, quota) = entry(Narrowing::ElasticQuotaChange);
    let q = json!({"metadata": {"name": "q", "annotations": {"quota.scheduling.koordinator.sh/child-request": "{}"}}, "spec": {"max": {"cpu": "1"}}});
    let mut bigger = q.clone();
    bigger["spec"]["max"]["cpu"] = json!("2");
    let mut counted = q.clone();
    counted["metadata"]["annotations"]["quota.scheduling.koordinator.sh/child-request"] =
        json!("{\"cpu\":\"1\"}");
    let resource = (
        "scheduling.sigs.k8s.io",
        "ElasticQuota",
        "elasticquotas",
        "",
    );
    let calls = static_calls(quota.narrowing);
    let update = |new: Value| request(resource, "UPDATE", Some(new), Some(q.clone()), Some("ns"));
    assert_eq!(sent(&calls, &update(bigger)), Ok(true));
    assert_eq!(sent(&calls, &update(counted)), Ok(false));
    assert_eq!(
        sent(
            &calls,
            &request(resource, "DELETE", None, Some(q), Some("ns"))
        ),
        Ok(true)
    );
}

// Pods: the conditions depend on the profiles and quotas of the cache, derived as the leader does.

const MARKED_POD_LABELS: &[(&str, &[&str])] = &[
    (QOS_CLASS_LABEL, &["BE", "LS", "LSR", "LSE"]),
    (PRIORITY_LABEL, &["1000"]),
    (PRIORITY_CLASS_LABEL, &["koord-batch", "koord-prod"]),
    (QUOTA_NAME, &["parent", "child"]),
    (
        "quota.scheduling.koordinator.sh/preemptible",
        &["true", "false"],
    ),
    ("app", &["web", "batch", "db"]),
    ("tier", &["front", "back"]),
    ("team", &["a"]),
];
const MARKED_POD_ANNOTATIONS: &[(&str, &[&str])] = &[
    ("scheduling.koordinator.sh/reserve-pod", &["true"]),
    (EXTENDED_RESOURCE_SPEC, &["{}", "garbage"]),
    (RESERVATION_AFFINITY, &[r#"{"name":"r1"}"#]),
    (SKIP_ENHANCED_VALIDATION, &["true"]),
    ("ColocationProfileSkipValidatingPriority", &["true"]),
    ("other", &["x"]),
];
const POD_NAMESPACES: &[&str] = &["ns1", "ns2", "team-a"];

fn rich_pod() -> impl Strategy<Value = Value> {
    const PLAIN: &[&str] = &["cpu", "memory", "ephemeral-storage", "hugepages-2Mi"];
    const ANY: &[&str] = &[
        "cpu",
        "memory",
        "ephemeral-storage",
        BATCH_CPU,
        BATCH_MEMORY,
        MID_CPU,
        GPU,
        GPU_CORE,
        GPU_SHARED,
        "nvidia.com/gpu",
        NPU_CORE,
    ];
    let quantity = || prop::sample::select(&["1", "500m", "2"][..]);
    let requests = |names: &'static [&'static str]| {
        prop::collection::vec((prop::sample::select(names), quantity()), 0..3)
    };
    let plain = (
        string_map(&MARKED_POD_LABELS[5..]),
        Just(None),
        prop::collection::vec((requests(PLAIN), any::<bool>()), 1..3),
        Just(None),
    );
    let marked = (
        string_map(MARKED_POD_LABELS),
        prop::option::of(string_map(MARKED_POD_ANNOTATIONS)),
        prop::collection::vec((requests(ANY), any::<bool>()), 1..3),
        prop::option::of(prop::collection::vec((requests(ANY), any::<bool>()), 1..2)),
    );
    (
        // Plain pods most of the time, as in a real cluster.
        prop_oneof![3 => plain.boxed(), 2 => marked.boxed()],
        prop::option::of(prop::sample::select(&[0, 3500, 5500, 7500, 9500][..])),
        prop::option::of(prop::sample::select(POD_NAMESPACES)),
    )
        .prop_map(|((labels, annotations, containers, init), priority, namespace)| {
            let container = |i: usize, requests: Vec<(&str, &str)>, limits: bool| {
                let map: BTreeMap<&str, &str> = requests.into_iter().collect();
                let mut c = json!({"name": format!("c{i}"), "image": "i", "resources": {"requests": map}});
                if limits {
                    c["resources"]["limits"] = json!(map);
                }
                c
            };
            let list = |containers: Vec<(Vec<(&str, &str)>, bool)>, first: usize| {
                containers
                    .into_iter()
                    .enumerate()
                    .map(|(i, (r, l))| container(first + i, r, l))
                    .collect::<Vec<Value>>()
            };
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p"}, "spec": {"containers": list(containers, 0)}});
            if let Some(init) = init {
                pod["spec"]["initContainers"] = json!(list(init, 10));
            }
            if let Some(ns) = namespace {
                pod["metadata"]["namespace"] = json!(ns);
            }
            if let Some(l) = labels {
                pod["metadata"]["labels"] = json!(l);
            }
            if let Some(a) = annotations.flatten() {
                pod["metadata"]["annotations"] = json!(a);
            }
            if let Some(p) = priority {
                pod["spec"]["priority"] = json!(p);
            }
            pod
        })
}

/// Selectors of every kind `selectors::matches` reads, an empty and a missing one, and a malformed
/// one.
fn profile_selector() -> impl Strategy<Value = Option<Value>> {
    prop::sample::select(
        &[
            None,
            Some(r#"{}"#),
            Some(r#"{"matchLabels": {"app": "web"}}"#),
            Some(r#"{"matchLabels": {"app": "batch", "tier": "back"}}"#),
            Some(r#"{"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front", "x"]}]}"#),
            Some(r#"{"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["back"]}]}"#),
            Some(r#"{"matchExpressions": [{"key": "team", "operator": "Exists"}]}"#),
            Some(r#"{"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}"#),
            Some(r#"{"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}"#),
            Some(r#"{"matchLabels": {"app": "we b"}}"#),
        ][..],
    )
    .prop_map(|s| s.map(|text| serde_json::from_str(text).unwrap()))
}

fn profile() -> impl Strategy<Value = CachedObject> {
    (
        prop::sample::select(&["p0", "p1", "p2"][..]),
        profile_selector(),
        any::<bool>(),
        prop::sample::select(&["BE", "LS", ""][..]),
        any::<bool>(),
    )
        .prop_map(|(name, selector, by_namespace, qos, priority)| {
            let mut spec = json!({"labels": {"added": "yes"}, "schedulerName": "koord-scheduler"});
            if let Some(s) = selector {
                spec["selector"] = s;
            }
            if by_namespace {
                spec["namespaceSelector"] = json!({"matchLabels": {"team": "a"}});
            }
            if !qos.is_empty() {
                spec["qosClass"] = json!(qos);
            }
            if priority {
                spec["priorityClassName"] = json!("koord-batch");
            }
            CachedObject::ColocationProfile(
                serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap(),
            )
        })
}

fn pod_quota() -> impl Strategy<Value = CachedObject> {
    (
        prop::sample::select(&["ns1", "ns2", "parent", "child", DEFAULT_QUOTA][..]),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(prop::sample::select(
            &[r#"["team-a"]"#, r#"["ns2"]"#, "garbage"][..],
        )),
    )
        .prop_map(|(name, own_namespace, parent, namespaces)| {
            let mut q = json!({"metadata": {"name": name,
                "namespace": if own_namespace { name } else { "ns1" },
                "labels": {QUOTA_IS_PARENT: if parent { "true" } else { "false" }}},
                "spec": {"max": {"cpu": "100"}, "min": {"cpu": "1"}}});
            if let Some(n) = namespaces {
                q["metadata"]["annotations"] = json!({QUOTA_NAMESPACES: n});
            }
            CachedObject::ElasticQuota(serde_json::from_value(q).unwrap())
        })
}

/// What every pod draw shares: its namespaces (one labelled for the profiles' namespaceSelector)
/// and the priority class profiles name.
fn pod_world() -> Vec<CachedObject> {
    let namespace = |name: &str, labels: Value| {
        CachedObject::Namespace(
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap(),
        )
    };
    vec![
        namespace("ns1", json!({"team": "a"})),
        namespace("ns2", json!({})),
        namespace("team-a", json!({"team": "a"})),
        CachedObject::PriorityClass(
            serde_json::from_value(json!({"metadata": {"name": "koord-batch"}, "value": 5500}))
                .unwrap(),
        ),
    ]
}

/// Gates as [`gates`], with the gates that make every pod relevant on only now and then (the
/// narrowed side is what needs the draws).
fn pod_gates() -> impl Strategy<Value = FeatureGates> {
    (
        gates(),
        prop::collection::vec(prop::bool::weighted(0.15), 3),
    )
        .prop_map(|(mut g, on)| {
            for (gate, on) in [
                Gate::EnableQuotaAdmission,
                Gate::EnablePodEnhancedValidator,
                Gate::MultiQuotaTree,
            ]
            .into_iter()
            .zip(on)
            {
                g.set(gate, on);
            }
            g
        })
}

fn pod_cache() -> impl Strategy<Value = Vec<CachedObject>> {
    (
        prop::collection::vec(profile(), 0..3),
        prop::collection::vec(pod_quota(), 0..4),
    )
        .prop_map(|(profiles, quotas)| {
            let mut cache = pod_world();
            cache.extend(profiles);
            cache.extend(quotas);
            cache
        })
}

/// The calls the leader would write for this cache: its reach, from every profile and quota.
fn pod_calls(narrowing: Narrowing, gates: &FeatureGates, cache: &[CachedObject]) -> Calls {
    let profiles = cache.iter().filter_map(|o| match o {
        CachedObject::ColocationProfile(p) => Some(p),
        _ => None,
    });
    let quotas = cache.iter().filter_map(|o| match o {
        CachedObject::ElasticQuota(q) => Some(q),
        _ => None,
    });
    let reach = PodReach {
        create: create_reach(profiles),
        validate: validate_reach(quotas),
    };
    narrowing.calls(gates, &reach)
}

fn pod_request(operation: &str, new: Value, old: Option<Value>, namespace: &str) -> Value {
    request(
        ("", "Pod", "pods", ""),
        operation,
        Some(new),
        old,
        Some(namespace),
    )
}

#[test]
fn skipped_pod_creates_are_not_mutated() {
    let strategy = (
        rich_pod(),
        prop::sample::select(POD_NAMESPACES),
        pod_gates(),
        pod_cache(),
    )
        .prop_map(|(pod, namespace, gates, cache)| {
            (pod_request("CREATE", pod, None, namespace), gates, cache)
        });
    check_with(Narrowing::PodCreate, strategy, |gates, cache| {
        pod_calls(Narrowing::PodCreate, gates, cache)
    });
}

#[test]
fn skipped_pod_changes_are_allowed() {
    let strategy = (
        rich_pod(),
        rich_pod(),
        any::<[bool; 3]>(),
        prop::sample::select(&["CREATE", "UPDATE"][..]),
        prop::sample::select(POD_NAMESPACES),
        pod_gates(),
        pod_cache(),
    )
        .prop_map(|(new, other, pick, operation, namespace, gates, cache)| {
            let old = (operation == "UPDATE").then(|| old_from(&new, &other, pick));
            (pod_request(operation, new, old, namespace), gates, cache)
        });
    check_with(Narrowing::PodValidation, strategy, |gates, cache| {
        pod_calls(Narrowing::PodValidation, gates, cache)
    });
}

#[test]
fn pod_conditions_send_what_the_cluster_makes_relevant() {
    let plain = json!({"metadata": {"name": "p", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}]}});
    let gates = FeatureGates::default();
    let web: crate::apis::ClusterColocationProfile = serde_json::from_value(
        json!({"metadata": {"name": "web"}, "spec": {"selector": {"matchLabels": {"app": "web"}}}}),
    )
    .unwrap();
    let db: crate::apis::ClusterColocationProfile = serde_json::from_value(
        json!({"metadata": {"name": "db"}, "spec": {"selector": {"matchLabels": {"app": "db"}}}}),
    )
    .unwrap();
    let create = |reach: PodReach| Narrowing::PodCreate.calls(&gates, &reach);
    let r = pod_request("CREATE", plain.clone(), None, "ns1");
    let only = |profiles: &[&crate::apis::ClusterColocationProfile]| PodReach {
        create: create_reach(profiles.iter().copied()),
        ..PodReach::default()
    };
    assert_eq!(sent(&create(only(&[])), &r), Ok(false));
    assert_eq!(sent(&create(only(&[&db])), &r), Ok(false));
    assert_eq!(sent(&create(only(&[&db, &web])), &r), Ok(true));

    let parent: crate::apis::ElasticQuota =
        serde_json::from_value(json!({"metadata": {"name": "ns1",
        "namespace": "ns1", "labels": {QUOTA_IS_PARENT: "true"}}, "spec": {}}))
        .unwrap();
    let validate = |quotas: &[&crate::apis::ElasticQuota]| {
        Narrowing::PodValidation.calls(
            &gates,
            &PodReach {
                validate: validate_reach(quotas.iter().copied()),
                ..PodReach::default()
            },
        )
    };
    assert_eq!(sent(&validate(&[]), &r), Ok(false));
    assert_eq!(sent(&validate(&[&parent]), &r), Ok(true));
    assert_eq!(
        sent(
            &validate(&[&parent]),
            &pod_request("CREATE", plain, None, "ns2")
        ),
        Ok(false)
    );
}

//! Narrowing never changes an answer: for random (request, cache state, gates), whenever the
//! conditions written for an entry say "skip", the endpoint answers allowed with no patch. The
//! conditions are evaluated as CEL by the `cel` crate, the very text the API server gets; an
//! expression that errors fails the test (under `failurePolicy: Fail` it would reject the request).

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};

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

/// Runs `cases` draws of `strategy`; every skipped request must be allowed unchanged. Returns how
/// many were skipped, so a generator that never exercises a skip fails too.
fn check<S>(narrowing: Narrowing, strategy: S)
where
    S: Strategy<Value = (Value, FeatureGates, Vec<CachedObject>)>,
{
    let (spec, entry) = entry(narrowing);
    let calls = entry.narrowing.calls();
    let compiled = Compiled::new(&calls);
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
        let send = compiled
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
        skipped > CASES / 20 && (sent_count > CASES / 20 || calls == Calls::Never),
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
        sent(&status.narrowing.calls(), &update(&annotated, &annotated)),
        Ok(true)
    );
    annotated["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    assert_eq!(
        sent(&status.narrowing.calls(), &update(&annotated, &annotated)),
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
    let calls = quota.narrowing.calls();
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

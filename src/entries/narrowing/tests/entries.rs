//! Entries whose conditions depend on the entry alone: node status, node validation, quota tree
//! changes, and mpod-update (left out).

use super::*;

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
    (
        QUOTA_RECENT_ADMISSIONS,
        &["[]", r#"[{"pod":"ns1/p","at":1,"request":{"cpu":"9"}}]"#],
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
        any::<bool>(),
    )
        .prop_map(|(new, other, pick, operation, gates, cache, ours)| {
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
            // koord-webhook's own writes, or anyone else's.
            let mut r = r;
            if ours {
                r["userInfo"]["username"] = json!(crate::names::service_account_user());
            }
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

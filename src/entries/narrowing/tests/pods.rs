//! The pod entries: their conditions depend on the profiles and quotas of the cache.

use super::*;

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

/// With `--qos-split`, a pod carrying an entry's split label (on UPDATE: either pod, as the API
/// server matches an objectSelector) goes to the labelled part, which has no conditions. That
/// sends nothing the entry alone would skip: for every such request, whatever the gates and the
/// cache, the entry's conditions are true.
#[test]
fn labelled_parts_take_only_requests_the_conditions_send() {
    for narrowing in [Narrowing::PodCreate, Narrowing::PodValidation] {
        let (_, entry) = entry(narrowing);
        let part = entry
            .labelled_part
            .unwrap_or_else(|| panic!("{} has no labelled part", entry.name));
        let strategy = (
            rich_pod(),
            rich_pod(),
            any::<[bool; 3]>(),
            prop::sample::select(&["CREATE", "UPDATE"][..]),
            any::<bool>(),
            prop::sample::select(POD_NAMESPACES),
            pod_gates(),
            pod_cache(),
        );
        let mut runner = runner();
        for _ in 0..CASES / 5 {
            let (mut new, other, pick, operation, label_old, namespace, gates, cache) =
                strategy.new_tree(&mut runner).unwrap().current();
            let operation = if narrowing == Narrowing::PodCreate {
                "CREATE"
            } else {
                operation
            };
            let mut old = (operation == "UPDATE").then(|| old_from(&new, &other, pick));
            // The label on the new pod, or (UPDATE) on the old one only.
            let carrier = match old.as_mut() {
                Some(old) if label_old => old,
                _ => &mut new,
            };
            carrier["metadata"]["labels"][part.label] = json!("BE");
            let request = pod_request(operation, new, old, namespace);
            let calls = pod_calls(narrowing, &gates, &cache);
            assert_eq!(
                sent(&calls, &request),
                Ok(true),
                "{}: a request for {} the conditions skip\n{request:#}",
                entry.name,
                part.name
            );
        }
    }
}

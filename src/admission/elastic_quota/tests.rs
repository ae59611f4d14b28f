//! Tree rules: each rule and its message, racing siblings, and random operation sequences.

mod probe_review;

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::tree_checks::{BoundPods, check_create, check_delete, check_update};
use crate::apis::ElasticQuota;
use crate::apis::keys::ROOT_QUOTA;
use crate::cache::quota_topology::{QuotaInfo, QuotaTopology};
use crate::features::FeatureGates;

#[derive(Default)]
struct Pods {
    labelled: BTreeMap<String, Vec<String>>,
    namespaces: Vec<String>,
}

impl BoundPods for Pods {
    fn labelled(&self, quota: &str) -> Vec<String> {
        self.labelled.get(quota).cloned().unwrap_or_default()
    }
    fn any_in_namespaces(&self, namespaces: &[&str]) -> bool {
        self.namespaces
            .iter()
            .any(|n| namespaces.contains(&n.as_str()))
    }
}

/// A quota from labels (`parent`, `is-parent`, `tree-id`, ...) and a spec.
fn eq(name: &str, labels: Value, spec: Value) -> ElasticQuota {
    let labels: BTreeMap<String, String> = labels
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            (
                format!("quota.scheduling.koordinator.sh/{k}"),
                v.as_str().unwrap().to_owned(),
            )
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": "ns", "labels": labels}, "spec": spec
    }))
    .unwrap()
}

fn spec(min_cpu: &str, max_cpu: &str) -> Value {
    json!({"min": {"cpu": min_cpu}, "max": {"cpu": max_cpu, "memory": "10Gi"}})
}

/// parent (min 8) with child-1 (min 2) under it, both in tree t.
fn tree() -> (QuotaTopology, Vec<ElasticQuota>) {
    let quotas = vec![
        eq(
            "parent",
            json!({"is-parent": "true", "tree-id": "t"}),
            spec("8", "16"),
        ),
        eq(
            "child-1",
            json!({"parent": "parent", "tree-id": "t"}),
            spec("2", "4"),
        ),
    ];
    (QuotaTopology::from_quotas(&quotas), quotas)
}

fn gates() -> FeatureGates {
    FeatureGates::default()
}

fn create_err(topology: &QuotaTopology, quota: &ElasticQuota) -> String {
    check_create(topology, quota, &gates(), &Pods::default()).unwrap_err()
}

#[test]
fn create_rules_and_messages() {
    let (topology, quotas) = tree();
    assert_eq!(
        create_err(&topology, &quotas[1]),
        "AddQuota quota already exist:child-1"
    );
    assert_eq!(
        create_err(
            &topology,
            &eq(
                "child-2",
                json!({"parent": "parent", "tree-id": "t"}),
                spec("7", "8")
            )
        ),
        "checkMinQuotaSum all brothers' MinQuota > parent MinQuota, parent: parent"
    );
    assert!(
        check_create(
            &topology,
            &eq(
                "child-2",
                json!({"parent": "parent", "tree-id": "t"}),
                spec("6", "8")
            ),
            &gates(),
            &Pods::default()
        )
        .is_ok()
    );
    assert_eq!(
        create_err(
            &topology,
            &eq(
                "x",
                json!({"parent": "parent", "tree-id": "other"}),
                spec("1", "2")
            )
        ),
        "x tree id is different from parent parent, [other] vs [t]"
    );
    assert_eq!(
        create_err(
            &topology,
            &eq("x", json!({"parent": "nowhere"}), spec("1", "2"))
        ),
        "x has parentName nowhere but not find parentInfo in quotaInfoMap"
    );
    assert_eq!(
        create_err(
            &topology,
            &eq(
                "x",
                json!({"parent": "child-1", "tree-id": "t"}),
                spec("1", "2")
            )
        ),
        "x has parentName child-1 but the parentQuotaInfo's IsParent is false"
    );
    let cpu_only = eq(
        "x",
        json!({"parent": "parent", "tree-id": "t"}),
        json!({"min": {"cpu": "1"}, "max": {"cpu": "2"}}),
    );
    assert_eq!(
        create_err(&topology, &cpu_only),
        "failed to check sub and parent group quotaKey, err: checkSubAndParentGroupQuotaKey failed: parent's max keys are not the same with x's"
    );
    let relaxed: FeatureGates = "ElasticQuotaEnableUpdateResourceKey=true".parse().unwrap();
    assert!(check_create(&topology, &cpu_only, &relaxed, &Pods::default()).is_ok());
    let extra = eq(
        "x",
        json!({"parent": "parent", "tree-id": "t"}),
        json!({"max": {"cpu": "2", "gpu": "1"}}),
    );
    assert_eq!(
        check_create(&topology, &extra, &relaxed, &Pods::default()).unwrap_err(),
        "failed to check sub and parent group quotaKey, err: checkSubAndParentGroupQuotaKey failed: x's max keys are not all included in parent's"
    );
    let min_keys = eq(
        "x",
        json!({"parent": "parent", "tree-id": "t"}),
        json!({"min": {"memory": "1Gi"}, "max": {"cpu": "2", "memory": "10Gi"}}),
    );
    assert_eq!(
        create_err(&topology, &min_keys),
        "failed to check sub and parent group quotaKey, err: checkSubAndParentGroupQuotaKey failed: x's min keys are not all included in parent's"
    );
    // Not in Koordinator: a quota may not be its own ancestor.
    let mut looped = QuotaTopology::from_quotas(&tree().1);
    looped.upsert(QuotaInfo::from_quota(&eq(
        "mid",
        json!({"parent": "parent", "tree-id": "t", "is-parent": "true"}),
        spec("1", "2"),
    )));
    let old_parent = tree().1[0].clone();
    let new_parent = eq(
        "parent",
        json!({"parent": "mid", "is-parent": "true", "tree-id": "t"}),
        spec("8", "16"),
    );
    assert_eq!(
        check_update(
            &looped,
            &old_parent,
            &new_parent,
            &gates(),
            &Pods::default()
        )
        .unwrap_err(),
        "checkMinQuotaSum all brothers' MinQuota > parent MinQuota, parent: mid",
        "a loop Koordinator refuses gets Koordinator's message"
    );
    // One Koordinator lets through (a quota without children made its own parent) is refused here.
    let solo = eq("solo", json!({"is-parent": "true"}), spec("1", "2"));
    let alone = QuotaTopology::from_quotas([&solo]);
    let own_parent = eq(
        "solo",
        json!({"parent": "solo", "is-parent": "true"}),
        spec("1", "2"),
    );
    assert_eq!(
        check_update(&alone, &solo, &own_parent, &gates(), &Pods::default()).unwrap_err(),
        "solo has parentName solo which would make the quota tree a cycle"
    );
    // Self checks run too.
    assert_eq!(
        create_err(
            &topology,
            &eq("x", json!({}), json!({"max": {"cpu": "-1"}}))
        ),
        "x quota.Spec.Max's value < 0, in dimensions :[cpu]"
    );
    // A plain quota under the root has nothing more to agree with.
    assert!(
        check_create(
            &topology,
            &eq("solo", json!({}), spec("100", "200")),
            &gates(),
            &Pods::default()
        )
        .is_ok()
    );
}

#[test]
fn namespace_bindings_are_exclusive() {
    let mut a = eq("a", json!({}), spec("1", "2"));
    a.metadata.annotations = Some(
        [(
            "quota.scheduling.koordinator.sh/namespaces".to_owned(),
            r#"["team"]"#.to_owned(),
        )]
        .into(),
    );
    let topology = QuotaTopology::from_quotas([&a]);
    let mut b = eq("b", json!({}), spec("1", "2"));
    b.metadata.annotations = a.metadata.annotations.clone();
    assert_eq!(
        create_err(&topology, &b),
        "AddQuota quota b's annotation namespace team is already bound to quota a"
    );
    let mut a2 = a.clone();
    a2.spec = serde_json::from_value(spec("1", "3")).unwrap();
    assert!(
        check_update(&topology, &a, &a2, &gates(), &Pods::default()).is_ok(),
        "its own binding is fine"
    );
    let old_b = eq("b", json!({}), spec("1", "2"));
    let topology = QuotaTopology::from_quotas([&a, &old_b]);
    assert_eq!(
        check_update(&topology, &old_b, &b, &gates(), &Pods::default()).unwrap_err(),
        "UpdadteQuota, quota b update namespaces, but namespace team is already bound to quota a"
    );
}

#[test]
fn update_rules_and_messages() {
    let (topology, quotas) = tree();
    let (parent, child) = (&quotas[0], &quotas[1]);
    let pods = Pods::default();
    let update = |old: &ElasticQuota, new: &ElasticQuota, pods: &Pods| {
        check_update(&topology, old, new, &gates(), pods)
    };

    assert_eq!(
        update(child, child, &pods),
        Ok(None),
        "nothing relevant changed"
    );
    let mut root = eq(ROOT_QUOTA, json!({}), spec("1", "2"));
    let root_old = root.clone();
    root.spec = serde_json::from_value(spec("1", "3")).unwrap();
    assert_eq!(
        update(&root_old, &root, &pods).unwrap_err(),
        "invalid quota koordinator-root-quota"
    );
    let ghost = eq("ghost", json!({}), spec("1", "2"));
    let ghost2 = eq("ghost", json!({}), spec("1", "3"));
    assert_eq!(
        update(&ghost, &ghost2, &pods).unwrap_err(),
        "UpdateQuota quota not exist in quotaInfoMap:ghost"
    );

    let no_longer_parent = eq("parent", json!({"tree-id": "t"}), spec("8", "16"));
    assert_eq!(
        update(parent, &no_longer_parent, &pods).unwrap_err(),
        "quota has children, isParent is forbidden to modify as false, quotaName:parent"
    );
    let becomes_parent = eq(
        "child-1",
        json!({"parent": "parent", "tree-id": "t", "is-parent": "true"}),
        spec("2", "4"),
    );
    let labelled = Pods {
        labelled: [("child-1".to_owned(), vec!["p".to_owned()])].into(),
        ..Default::default()
    };
    assert_eq!(
        update(child, &becomes_parent, &labelled).unwrap_err(),
        "quota has bound pods, isParent is forbidden to modify as true, quotaName: child-1"
    );
    let in_namespace = Pods {
        namespaces: vec!["child-1".to_owned()],
        ..Default::default()
    };
    assert!(
        update(child, &becomes_parent, &in_namespace).is_err(),
        "pods in the quota's namespace count"
    );
    assert!(update(child, &becomes_parent, &pods).is_ok());

    let new_tree = eq(
        "child-1",
        json!({"parent": "parent", "tree-id": "u"}),
        spec("2", "4"),
    );
    assert_eq!(
        update(child, &new_tree, &pods).unwrap_err(),
        "child-1 tree id changed [t] vs [u]"
    );

    let shrunk = eq(
        "parent",
        json!({"is-parent": "true", "tree-id": "t"}),
        spec("1", "16"),
    );
    assert_eq!(
        update(parent, &shrunk, &pods).unwrap_err(),
        "checkMinQuotaSum all children's MinQuota > current MinQuota, current: parent"
    );
    let forced = eq(
        "parent",
        json!({"is-parent": "true", "tree-id": "t", "allow-force-update": "true"}),
        spec("1", "16"),
    );
    assert!(update(parent, &forced, &pods).is_ok());

    let parent_keys = eq(
        "parent",
        json!({"is-parent": "true", "tree-id": "t"}),
        json!({"min": {"cpu": "8"}, "max": {"cpu": "16"}}),
    );
    assert_eq!(
        update(parent, &parent_keys, &pods).unwrap_err(),
        "failed to check sub and parent group quotaKey, err: checkSubAndParentGroupQuotaKey failed: child-1's max keys are not the same with parent's"
    );
    let retree = eq(
        "parent",
        json!({"is-parent": "true", "tree-id": "t"}),
        spec("8", "16"),
    );
    let mut topology_child_tree = QuotaTopology::from_quotas([
        parent,
        &eq(
            "child-1",
            json!({"parent": "parent", "tree-id": "z"}),
            spec("2", "4"),
        ),
    ]);
    let _ = &mut topology_child_tree;
    let mut parent_bigger = retree.clone();
    parent_bigger.spec = serde_json::from_value(spec("9", "16")).unwrap();
    assert_eq!(
        check_update(
            &topology_child_tree,
            parent,
            &parent_bigger,
            &gates(),
            &pods
        )
        .unwrap_err(),
        "parent tree id is different from child child-1, [t] vs [z]"
    );
}

#[test]
fn delete_rules_and_messages() {
    let (topology, _) = tree();
    let pods = Pods {
        labelled: [(
            "child-1".to_owned(),
            vec!["a".into(), "b".into(), "c".into()],
        )]
        .into(),
        ..Default::default()
    };
    for protected in [
        "koordinator-system-quota",
        ROOT_QUOTA,
        "koordinator-default-quota",
    ] {
        assert_eq!(
            check_delete(&topology, protected, &pods).unwrap_err(),
            format!("can not delete quotaGroup :{protected}")
        );
    }
    assert_eq!(
        check_delete(&topology, "nope", &pods).unwrap_err(),
        "not found quota:nope"
    );
    assert_eq!(
        check_delete(&topology, "parent", &pods).unwrap_err(),
        "delete quota failed, quota parent has 1 child quotas"
    );
    assert_eq!(
        check_delete(&topology, "child-1", &pods).unwrap_err(),
        "delete quota failed, quota child-1 has 3 child pods: a, b, ..."
    );
    let two = Pods {
        labelled: [("child-1".to_owned(), vec!["a".into(), "b".into()])].into(),
        ..Default::default()
    };
    assert_eq!(
        check_delete(&topology, "child-1", &two).unwrap_err(),
        "delete quota failed, quota child-1 has 2 child pods: a, b"
    );
    assert!(
        check_delete(
            &topology,
            "child-1",
            &Pods {
                namespaces: vec!["child-1".into()],
                ..Default::default()
            }
        )
        .is_ok()
    );
}

#[test]
fn guarantee_usage_walks_up_the_tree() {
    let gates: FeatureGates = "ElasticQuotaGuaranteeUsage=true".parse().unwrap();
    let mut parent = eq(
        "parent",
        json!({"is-parent": "true", "tree-id": "t"}),
        spec("8", "16"),
    );
    parent.metadata.annotations = Some(
        [(
            "quota.scheduling.koordinator.sh/guaranteed".to_owned(),
            r#"{"cpu":"3"}"#.to_owned(),
        )]
        .into(),
    );
    let topology = QuotaTopology::from_quotas([&parent]);
    let child = eq(
        "c",
        json!({"parent": "parent", "tree-id": "t"}),
        spec("4", "8"),
    );
    assert_eq!(
        check_create(&topology, &child, &gates, &Pods::default()).unwrap_err(),
        "tree root quota parent can't guarantee for min c"
    );
    let small = eq(
        "c",
        json!({"parent": "parent", "tree-id": "t"}),
        spec("0", "8"),
    );
    assert!(check_create(&topology, &small, &gates, &Pods::default()).is_ok());
    // A parent quota of a tree with no parent of its own (the root quota's child) and a min it has
    // not been guaranteed: nothing above it can guarantee it (found by the conformance harness).
    let top = eq(
        "top",
        json!({"is-parent": "true", "tree-id": "t1"}),
        spec("1", "8"),
    );
    assert_eq!(
        check_create(&QuotaTopology::default(), &top, &gates, &Pods::default()).unwrap_err(),
        "tree root quota top can't guarantee for min top"
    );
    let marked_root = eq(
        "top",
        json!({"is-parent": "true", "is-root": "true", "tree-id": "t1"}),
        spec("1", "8"),
    );
    assert!(
        check_create(
            &QuotaTopology::default(),
            &marked_root,
            &gates,
            &Pods::default()
        )
        .is_ok()
    );
}

#[test]
fn racing_siblings_cannot_both_squeeze_into_the_parent() {
    use crate::admission::Admission;
    use crate::cache::{CacheWriter, CachedObject};
    use crate::entries::VALIDATE_ELASTIC_QUOTA;
    use crate::metrics::Metrics;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for round in 0..30 {
        let mut writer = CacheWriter::default();
        writer.apply(CachedObject::ElasticQuota(eq(
            "parent",
            json!({"is-parent": "true"}),
            spec("8", "16"),
        )));
        let admission =
            std::sync::Arc::new(Admission::new(writer.reader(), gates(), Metrics::new()));
        let review = |name: &str| {
            serde_json::to_vec(&json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {
                    "uid": name, "operation": "CREATE", "userInfo": {}, "namespace": "ns",
                    "kind": {"group": "scheduling.sigs.k8s.io", "version": "v1alpha1", "kind": "ElasticQuota"},
                    "resource": {"group": "scheduling.sigs.k8s.io", "version": "v1alpha1", "resource": "elasticquotas"},
                    "object": eq(name, json!({"parent": "parent"}), spec("5", "8"))
                }
            }))
            .unwrap()
        };
        let allowed = runtime.block_on(async {
            let tasks: Vec<_> = ["left", "right"]
                .into_iter()
                .map(|name| {
                    let (admission, body) = (admission.clone(), review(name));
                    tokio::spawn(async move {
                        let out = admission
                            .review(VALIDATE_ELASTIC_QUOTA, &body, None)
                            .await
                            .unwrap();
                        serde_json::from_slice::<Value>(&out).unwrap()["response"]["allowed"]
                            == true
                    })
                })
                .collect();
            let mut allowed = 0;
            for task in tasks {
                allowed += usize::from(task.await.unwrap());
            }
            allowed
        });
        assert_eq!(
            allowed, 1,
            "round {round}: 5 + 5 > 8, exactly one sibling fits"
        );
    }
}

#[derive(Debug, Clone)]
enum Op {
    Upsert {
        name: usize,
        parent: usize,
        is_parent: bool,
        min: u8,
        max: u8,
    },
    Delete {
        name: usize,
    },
}

const NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..NAMES.len(), 0..=NAMES.len(), any::<bool>(), 0u8..10, 10u8..20)
            .prop_map(|(name, parent, is_parent, min, max)| Op::Upsert { name, parent, is_parent, min, max }),
        1 => (0..NAMES.len()).prop_map(|name| Op::Delete { name }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// After any sequence of accepted creates, updates, moves and deletes, parents cover their
    /// children's min, and the live topology equals one rebuilt from the surviving objects.
    #[test]
    fn accepted_operations_keep_the_tree_consistent(ops in prop::collection::vec(op(), 1..60)) {
        let mut live = QuotaTopology::default();
        let mut objects: BTreeMap<String, ElasticQuota> = BTreeMap::new();
        let pods = Pods::default();
        for op in ops {
            match op {
                Op::Upsert { name, parent, is_parent, min, max } => {
                    let name = NAMES[name];
                    let mut labels = serde_json::Map::new();
                    if parent < NAMES.len() {
                        labels.insert("parent".into(), json!(NAMES[parent]));
                    }
                    if is_parent {
                        labels.insert("is-parent".into(), json!("true"));
                    }
                    let quota = eq(name, Value::Object(labels), spec(&min.to_string(), &max.to_string()));
                    let accepted = match objects.get(name) {
                        None => check_create(&live, &quota, &gates(), &pods).ok(),
                        Some(old) => check_update(&live, old, &quota, &gates(), &pods)
                            .ok()
                            .map(|changed| changed.unwrap_or_else(|| QuotaInfo::from_quota(&quota))),
                    };
                    if let Some(info) = accepted {
                        live.upsert(info);
                        objects.insert(name.to_owned(), quota);
                    }
                }
                Op::Delete { name } => {
                    let name = NAMES[name];
                    if check_delete(&live, name, &pods).is_ok() {
                        live.remove(name);
                        objects.remove(name);
                    }
                }
            }
        }
        for info in live.infos() {
            let mut sum = crate::resources::Resources::default();
            for child in live.children(&info.name).into_iter().flatten().filter_map(|c| live.get(c)) {
                sum.add(&child.min);
            }
            prop_assert!(sum.le_completely(&info.min), "{} min {:?} < children {:?}", info.name, info.min, sum);
        }
        prop_assert_eq!(&live, &QuotaTopology::from_quotas(objects.values()));
    }
}

/// A tree applied in one go: the child's create reaches /mutate before the watch has delivered its
/// parent. In cluster mode (a watched cache, where the ledger is) the mutator waits for the parent
/// and takes its tree id; without the parent at all it still answers "parent not exist".
#[test]
fn a_child_created_just_after_its_parent_waits_for_the_parent() {
    use crate::admission::Admission;
    use crate::admission::env::Services;
    use crate::admission::ports::memory::MemoryLedgerStore;
    use crate::cache::{CacheWriter, CachedObject};
    use crate::entries::MUTATE_ELASTIC_QUOTA;
    use crate::metrics::Metrics;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut writer = CacheWriter::default();
    let services = Services {
        quota_ledger: Some(std::sync::Arc::new(MemoryLedgerStore::default())),
        ..Default::default()
    };
    let admission =
        Admission::new(writer.reader(), gates(), Metrics::new()).with_services(services);
    let review = |parent: &str| {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "operation": "CREATE", "userInfo": {}, "namespace": "ns",
                "kind": {"group": "scheduling.sigs.k8s.io", "version": "v1alpha1", "kind": "ElasticQuota"},
                "resource": {"group": "scheduling.sigs.k8s.io", "version": "v1alpha1", "resource": "elasticquotas"},
                "object": eq("child", json!({"parent": parent}), spec("1", "2"))
            }
        }))
        .unwrap()
    };
    let response = runtime.block_on(async {
        let (body, admission) = (review("parent"), &admission);
        let answer = async move {
            admission
                .review(MUTATE_ELASTIC_QUOTA, &body, None)
                .await
                .unwrap()
        };
        let arrives = async {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            writer.apply(CachedObject::ElasticQuota(eq(
                "parent",
                json!({"is-parent": "true", "tree-id": "t"}),
                spec("8", "16"),
            )));
        };
        tokio::join!(answer, arrives).0
    });
    let response: Value = serde_json::from_slice(&response).unwrap();
    assert_eq!(response["response"]["allowed"], true, "{response}");
    let patch = response["response"]["patch"].as_str().unwrap();
    use base64::Engine;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .unwrap();
    let patch = String::from_utf8(patch).unwrap();
    assert!(
        patch.contains("tree-id") && patch.contains("\"t\""),
        "{patch}"
    );

    let out = runtime.block_on(admission.review(MUTATE_ELASTIC_QUOTA, &review("nowhere"), None));
    let denied: Value = serde_json::from_slice(&out.unwrap()).unwrap();
    let message = denied["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("parent not exist"), "{denied}");
}

/// A quota that does not decode is set aside by the cache; the tree rules refuse the changes that
/// would have to count it (a sibling's create, its parent's delete) instead of counting it as
/// absent, and let through the rest.
#[test]
fn a_quota_that_does_not_decode_blocks_the_changes_that_would_count_it() {
    use crate::admission::Admission;
    use crate::cache::quota_topology::UnreadableQuota;
    use crate::cache::quota_topology::write_topology;
    use crate::cache::{CacheWriter, CachedObject};
    use crate::entries::VALIDATE_ELASTIC_QUOTA;
    use crate::metrics::Metrics;

    let mut writer = CacheWriter::default();
    for quota in tree().1 {
        writer.apply(CachedObject::ElasticQuota(quota));
    }
    writer.apply(CachedObject::ElasticQuota(eq(
        "other",
        json!({"is-parent": "true"}),
        spec("8", "16"),
    )));
    write_topology(&writer.quotas.tree()).set_unreadable(
        "broken",
        Some(UnreadableQuota {
            namespace: "ns".into(),
            parent: "parent".into(),
            error: "spec.min.cpu: quantities must match the regular expression".into(),
        }),
    );
    let admission = Admission::new(writer.reader(), gates(), Metrics::new());
    let review = |operation: &str, quota: ElasticQuota| {
        let (object, old) = match operation {
            "DELETE" => (Value::Null, serde_json::to_value(&quota).unwrap()),
            _ => (serde_json::to_value(&quota).unwrap(), Value::Null),
        };
        let body = serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "operation": operation, "userInfo": {}, "namespace": "ns",
                "name": quota.metadata.name,
                "kind": {"group": "scheduling.sigs.k8s.io", "version": "v1alpha1", "kind": "ElasticQuota"},
                "resource": {"group": "scheduling.sigs.k8s.io", "version": "v1alpha1", "resource": "elasticquotas"},
                "object": object, "oldObject": old
            }
        }))
        .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let out = runtime
            .block_on(admission.review(VALIDATE_ELASTIC_QUOTA, &body, None))
            .unwrap();
        serde_json::from_slice::<Value>(&out).unwrap()["response"].clone()
    };
    let sibling = eq(
        "child-2",
        json!({"parent": "parent", "tree-id": "t"}),
        spec("1", "2"),
    );
    let refused = review("CREATE", sibling);
    assert_eq!(refused["allowed"], false, "{refused}");
    assert_eq!(refused["status"]["code"], 503);
    let message = refused["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("ns/broken") && message.contains("does not decode"),
        "{message}"
    );
    // Elsewhere in the cluster nothing changes.
    let elsewhere = eq("child-3", json!({"parent": "other"}), spec("1", "2"));
    let answer = review("CREATE", elsewhere);
    assert_eq!(answer["allowed"], true, "{answer}");
    // Once it decodes again (or is gone), the sibling is checked as before.
    write_topology(&writer.quotas.tree()).set_unreadable("broken", None);
    let sibling = eq(
        "child-2",
        json!({"parent": "parent", "tree-id": "t"}),
        spec("1", "2"),
    );
    let answer = review("CREATE", sibling);
    assert_eq!(answer["allowed"], true, "{answer}");
}

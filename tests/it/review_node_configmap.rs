//! `koord-webhook review` on /mutate-node-status, /validate-node and /validate-configmap against a
//! state with an slo-controller ConfigMap (cpu-burst strategies `pool-a` and `zone-z`) and three
//! nodes: node-1 (pool=a), node-2 (zone=z), node-both (both labels).

use crate::support;

use serde_json::{Value, json};
use support::fixture;
use support::review::{CONFIG_MAP, NODE, NODE_STATUS, admission_review, denial, patch};

fn review(path: &str, args: &[&str], request: Value) -> Value {
    support::review::review(&fixture("state-slo"), path, args, &request)
}

fn node(labels: Value, annotations: Value, allocatable: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": "node-1", "labels": labels, "annotations": annotations},
           "status": {"capacity": {"cpu": "5", "memory": "10Gi", "pods": "110"}, "allocatable": allocatable}})
}

fn slo_config(data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "slo-controller-config", "namespace": "koordinator-system"}, "data": data})
}

/// A review of the slo-controller ConfigMap (or another) in koordinator-system.
fn config_map_review(args: &[&str], operation: &str, object: Value, old: Value) -> Value {
    review(
        "/validate-configmap",
        args,
        admission_review(&CONFIG_MAP, operation, "koordinator-system", object, old),
    )
}

fn node_review(path: &str, args: &[&str], operation: &str, object: Value, old: Value) -> Value {
    let kind = if path == "/mutate-node-status" {
        &NODE_STATUS
    } else {
        &NODE
    };
    review(
        path,
        args,
        admission_review(kind, operation, "", object, old),
    )
}

const RATIO: &str = "node.koordinator.sh/resource-amplification-ratio";

#[test]
fn node_status_is_amplified_and_the_raw_values_recorded() {
    let kubelet = json!({"cpu": "4", "memory": "8Gi", "pods": "110"});
    let old = node(json!({"pool": "a"}), json!({}), kubelet.clone());
    let new = node(
        json!({"pool": "a"}),
        json!({RATIO: r#"{"cpu": 2}"#}),
        kubelet,
    );
    let response = node_review(
        "/mutate-node-status",
        &[],
        "UPDATE",
        new.clone(),
        old.clone(),
    );
    let ops = patch(&response);
    let find = |path: &str| ops.iter().find(|op| op["path"] == path).cloned();
    assert_eq!(
        find("/status/allocatable/cpu").unwrap()["value"],
        "8",
        "{ops:?}"
    );
    assert_eq!(
        find("/status/capacity/cpu").unwrap()["value"],
        "9",
        "{ops:?}"
    );
    assert_eq!(
        find("/metadata/annotations/node.koordinator.sh~1raw-allocatable").unwrap()["value"],
        r#"{"cpu":"4","memory":"8Gi"}"#
    );
    assert!(
        find("/status/allocatable/memory").is_none(),
        "no ratio, no change: {ops:?}"
    );

    // With AmplifyNodeCapacity off, capacity stays as reported.
    let response = node_review(
        "/mutate-node-status",
        &["--feature-gates", "AmplifyNodeCapacity=false"],
        "UPDATE",
        new.clone(),
        old,
    );
    assert!(
        patch(&response)
            .iter()
            .all(|op| !op["path"].as_str().unwrap().starts_with("/status/capacity"))
    );

    // Not the status subresource, or a CREATE: nothing to do.
    let not_status = admission_review(&NODE, "UPDATE", "", new.clone(), new.clone());
    let response = review("/mutate-node-status", &[], not_status);
    assert!(patch(&response).is_empty());
    let response = node_review("/mutate-node-status", &[], "CREATE", new, Value::Null);
    assert!(patch(&response).is_empty());
}

#[test]
fn a_bad_raw_annotation_is_an_internal_error() {
    let ann = json!({RATIO: r#"{"cpu": 2}"#, "node.koordinator.sh/raw-allocatable": "garbage"});
    let n = node(json!({}), ann, json!({"cpu": "4"}));
    let response = node_review("/mutate-node-status", &[], "UPDATE", n.clone(), n);
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 500);
}

#[test]
fn node_labels_may_not_make_two_strategies_match() {
    let before = node(json!({"pool": "a"}), json!({}), json!({}));
    let after = node(json!({"pool": "a", "zone": "z"}), json!({}), json!({}));
    let response = node_review(
        "/validate-node",
        &[],
        "UPDATE",
        after.clone(),
        before.clone(),
    );
    assert_eq!(
        denial(&response),
        r#"___{"reason":"ExistNodeConfict","message":{"config":"cpu-burst-config","strategies":["pool-a","zone-z"],"exampleNodes":["node-1"]}}___"#
    );
    // Labels unchanged (an old conflict is not this update's doing), and CREATE: allowed.
    let response = node_review(
        "/validate-node",
        &[],
        "UPDATE",
        after.clone(),
        after.clone(),
    );
    assert_eq!(response["allowed"], true);
    let response = node_review("/validate-node", &[], "CREATE", after, Value::Null);
    assert_eq!(response["allowed"], true);
    // Another ConfigMap name: no strategies to conflict with.
    let response = review(
        "/validate-node",
        &["--slo-config-name", "elsewhere"],
        admission_review(
            &NODE,
            "UPDATE",
            "",
            node(json!({"pool": "a", "zone": "z"}), json!({}), json!({})),
            before,
        ),
    );
    assert_eq!(response["allowed"], true);
}

#[test]
fn amplification_ratios_stay_within_bounds() {
    let n = node(json!({}), json!({RATIO: r#"{"cpu": 8}"#}), json!({}));
    let response = node_review("/validate-node", &[], "CREATE", n.clone(), Value::Null);
    assert_eq!(
        denial(&response),
        r#"node.koordinator.sh/resource-amplification-ratio: Invalid value: "cpu=8": must be between 1 and 5"#
    );
    let response = node_review(
        "/validate-node",
        &["--max-amplification-ratio", "10"],
        "CREATE",
        n.clone(),
        Value::Null,
    );
    assert_eq!(response["allowed"], true);
    // Unchanged on UPDATE: not checked again.
    let response = node_review("/validate-node", &[], "UPDATE", n.clone(), n);
    assert_eq!(response["allowed"], true);
}

#[test]
fn the_slo_config_is_validated_on_change() {
    let bad = slo_config(json!({"colocation-config": r#"{"metricAggregateDurationSeconds": 0}"#}));
    let response = config_map_review(&[], "CREATE", bad.clone(), Value::Null);
    assert_eq!(
        denial(&response),
        r#"___{"reason":"ConfigParamInvalid","message":{"ColocationCfg.ColocationStrategy.MetricAggregateDurationSeconds":"MetricAggregateDurationSeconds must be 1 or greater"}}___"#
    );
    // An unchanged invalid key does not block an edit of another key.
    let mut edited = bad.clone();
    edited["data"]["system-config"] = json!(r#"{"clusterStrategy": {"minFreeKbytesFactor": 100}}"#);
    let response = config_map_review(&[], "UPDATE", edited, bad.clone());
    assert_eq!(response["allowed"], true, "{response}");
    // Other ConfigMaps and deletes pass.
    let mut other = bad.clone();
    other["metadata"]["name"] = json!("something-else");
    let response = config_map_review(&[], "CREATE", other.clone(), Value::Null);
    assert_eq!(response["allowed"], true);
    let response = config_map_review(
        &["--slo-config-name", "something-else"],
        "CREATE",
        other,
        Value::Null,
    );
    assert_eq!(response["allowed"], false);
    let response = config_map_review(&[], "DELETE", Value::Null, bad);
    assert_eq!(response["allowed"], true);

    let unparsable = slo_config(json!({"cpu-burst-config": "{"}));
    let response = config_map_review(&[], "CREATE", unparsable, Value::Null);
    assert!(denial(&response).starts_with(r#"___{"reason":"ParseConfigFail","message":"Failed to parse CpuBurst config in configmap koordinator-system/slo-controller-config, err: "#));
}

/// A ConfigMap larger than the API server stores is refused before its JSON is read (a forged
/// 7.9 MB `[[0],...]` took 326 MiB to read as trees); one at the limit is read.
#[test]
fn a_slo_config_over_the_api_servers_limit_is_refused_unread() {
    let zeros = |n: usize| format!("[{}[0]]", "[0],".repeat(n));
    let over = slo_config(json!({"colocation-config": zeros(300_000)}));
    let response = config_map_review(&[], "CREATE", over, Value::Null);
    assert_eq!(
        denial(&response),
        "data: Too long: must have at most 1048576 bytes (the API server's limit on a ConfigMap)"
    );
    let at = slo_config(json!({"colocation-config": zeros(200_000)}));
    let response = config_map_review(&[], "CREATE", at, Value::Null);
    assert!(
        denial(&response).contains("ParseConfigFail"),
        "read, and refused for what it says: {response}"
    );
}

#[test]
fn new_strategies_may_not_overlap_or_share_a_cluster_node() {
    let strategies = |a: Value, b: Value| {
        slo_config(
            json!({"resource-threshold-config": json!({"nodeStrategies": [
            {"name": "first", "nodeSelector": {"matchLabels": a}},
            {"name": "second", "nodeSelector": {"matchLabels": b}}]}).to_string()}),
        )
    };
    let overlapping = strategies(json!({"pool": "a"}), json!({"pool": "a", "zone": "z"}));
    let response = config_map_review(&[], "CREATE", overlapping, Value::Null);
    assert_eq!(
        denial(&response),
        r#"___{"reason":"NodeStrategiesOverlap","message":{"config":"resource-threshold-config","strategies":["first","second"]}}___"#
    );
    let sharing_a_node = strategies(json!({"pool": "a"}), json!({"zone": "z"}));
    let response = config_map_review(&[], "CREATE", sharing_a_node, Value::Null);
    assert_eq!(
        denial(&response),
        r#"___{"reason":"ExistNodeConfict","message":{"config":"resource-threshold-config","strategies":["first","second"],"exampleNodes":["node-both"]}}___"#
    );
    let disjoint = strategies(json!({"pool": "b"}), json!({"zone": "y"}));
    let response = config_map_review(&[], "CREATE", disjoint, Value::Null);
    assert_eq!(response["allowed"], true, "{response}");
}

/// Selectors with many expressions (once 7.9 s and 3.7 GB for 20 x 2, an abort for 40 x 2) are
/// answered at once: repeated value combinations are not generated again, and a check that would
/// still cost too much is refused with a message saying so.
#[test]
fn hostile_selectors_are_answered_quickly() {
    let selector = |lengths: &[usize]| {
        let exprs: Vec<Value> = lengths
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let values: Vec<String> = (0..*n).map(|v| format!("v{v}")).collect();
                json!({"key": format!("k{i}"), "operator": "In", "values": values})
            })
            .collect();
        json!({"matchExpressions": exprs})
    };
    let config = |first: Value| {
        slo_config(
            json!({"resource-threshold-config": json!({"nodeStrategies": [
            {"name": "first", "nodeSelector": first},
            {"name": "second", "nodeSelector": {"matchLabels": {"k0": "v1", "k39": "v1"}}}]}).to_string()}),
        )
    };
    let started = std::time::Instant::now();
    // 40 expressions of 2 values: the second distinct combination (every key v1) matches "second".
    let response = config_map_review(&[], "CREATE", config(selector(&[2; 40])), Value::Null);
    assert_eq!(
        denial(&response),
        r#"___{"reason":"NodeStrategiesOverlap","message":{"config":"resource-threshold-config","strategies":["first","second"]}}___"#
    );
    // 64 x 2 once overflowed the count and skipped the check: now the same overlap is found.
    let response = config_map_review(&[], "CREATE", config(selector(&[2; 64])), Value::Null);
    assert_eq!(response["allowed"], false, "{response}");
    // Coprime list lengths: 2*3*5*...*47 distinct combinations; refused, not enumerated.
    let primes = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47];
    let response = config_map_review(&[], "CREATE", config(selector(&primes)), Value::Null);
    assert!(
        denial(&response).contains("needs more than 4000000 label comparisons"),
        "{response}"
    );
    eprintln!(
        "three hostile ConfigMaps reviewed in {:?}",
        started.elapsed()
    );
}

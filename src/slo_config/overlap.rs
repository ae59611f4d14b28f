//! Which node strategies a node matches: the heuristic that finds overlapping selectors
//! at configuration time ("virtual nodes"), and the check of a real node's labels.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::types::NodeCfgProfile;
use crate::selectors::{self, Labels};

/// At most this many label comparisons in one check of a key's strategies: label sets (virtual or
/// real nodes) times the summed size of the strategies' selectors ([`strategies_weight`]). Beyond
/// it the ConfigMap is refused with a message saying so, rather than checked for seconds (a hostile
/// selector could ask for 2^64 combinations). 3.9 million took 0.24 s of one core in a release build
/// (on the blocking pool, not an HTTP worker: see `admission/offload.rs`).
pub const MAX_SELECTOR_STEPS: usize = 4_000_000;

/// Label sets a selector is meant for: its matchLabels, plus for virtual node i the value
/// `values[i mod len]` of every expression that lists values (NotIn included).
///
/// Koordinator generates as many as the product of those lists' lengths, but node i only depends on
/// `i mod len` of each list, so the sequence repeats after the least common multiple of the lengths:
/// the distinct virtual nodes, in the same order, are the first `lcm` ones. (20 expressions of 2
/// values: 2 nodes, not 2^20.)
pub fn virtual_nodes(selector: &LabelSelector) -> impl Iterator<Item = Labels> + '_ {
    let base: Labels = selector.match_labels.clone().unwrap_or_default();
    let lists: Vec<(&String, &[String])> = value_lists(selector).collect();
    (0..virtual_node_count(selector).unwrap_or(usize::MAX)).map(move |i| {
        let mut labels = base.clone();
        for (key, values) in &lists {
            labels.insert((*key).clone(), values[i % values.len()].clone());
        }
        labels
    })
}

/// Each expression's key and values, for the expressions that list values.
fn value_lists(selector: &LabelSelector) -> impl Iterator<Item = (&String, &[String])> {
    selector
        .match_expressions
        .iter()
        .flatten()
        .filter_map(|e| Some((&e.key, e.values.as_deref().filter(|v| !v.is_empty())?)))
}

/// How many distinct virtual nodes `selector` has (the lcm of its value lists' lengths); `None` when
/// that does not fit a usize.
pub fn virtual_node_count(selector: &LabelSelector) -> Option<usize> {
    value_lists(selector).try_fold(1usize, |acc, (_, values)| {
        let len = values.len();
        let (mut a, mut b) = (acc, len);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        (acc / a).checked_mul(len)
    })
}

/// Label comparisons, at most, to match one label set against `selector`: one per matchLabels entry,
/// and per expression one lookup plus one per listed value.
pub fn selector_weight(selector: &LabelSelector) -> usize {
    let labels = selector.match_labels.as_ref().map_or(0, |m| m.len());
    selector
        .match_expressions
        .iter()
        .flatten()
        .map(|e| 1 + e.values.as_ref().map_or(0, Vec::len))
        .fold(labels, usize::saturating_add)
}

/// Label comparisons, at most, to tell which of `profiles` one label set matches.
pub fn strategies_weight(profiles: &[&NodeCfgProfile]) -> usize {
    profiles
        .iter()
        .filter_map(|p| p.node_selector.as_ref())
        .map(selector_weight)
        .fold(0, usize::saturating_add)
}

/// Why a check was not run: matching `label_sets` label sets against `strategies` strategies would
/// cost more than [`MAX_SELECTOR_STEPS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooCostly {
    pub strategies: usize,
    /// `None`: more than fit a usize.
    pub label_sets: Option<usize>,
}

/// Refuses matching `label_sets` label sets against `profiles` when it would cost more than the limit.
pub fn within_budget(
    profiles: &[&NodeCfgProfile],
    label_sets: Option<usize>,
) -> Result<(), TooCostly> {
    match label_sets.and_then(|n| n.checked_mul(strategies_weight(profiles))) {
        Some(cost) if cost <= MAX_SELECTOR_STEPS => Ok(()),
        _ => Err(TooCostly {
            strategies: profiles.len(),
            label_sets,
        }),
    }
}

/// The distinct virtual nodes of all `profiles`; `None` when that does not fit a usize.
fn virtual_nodes_of(profiles: &[&NodeCfgProfile]) -> Option<usize> {
    profiles
        .iter()
        .filter_map(|p| p.node_selector.as_ref())
        .try_fold(0usize, |sum, s| sum.checked_add(virtual_node_count(s)?))
}

/// Names of the strategies whose selector matches `labels`, in config order.
pub fn matching(profiles: &[&NodeCfgProfile], labels: &Labels) -> Vec<String> {
    profiles
        .iter()
        .filter(|p| {
            p.node_selector
                .as_ref()
                .is_some_and(|s| selectors::matches(s, labels))
        })
        .map(|p| p.name.clone())
        .collect()
}

/// The strategies matching the first virtual node (strategy order, then generation order) that
/// several strategies match; an error when that check would cost more than the limit.
pub fn first_overlap(profiles: &[&NodeCfgProfile]) -> Result<Option<Vec<String>>, TooCostly> {
    within_budget(profiles, virtual_nodes_of(profiles))?;
    Ok(profiles
        .iter()
        .filter_map(|p| p.node_selector.as_ref())
        .flat_map(virtual_nodes)
        .map(|node| matching(profiles, &node))
        .find(|names| names.len() > 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn profile(name: &str, selector: serde_json::Value) -> NodeCfgProfile {
        NodeCfgProfile {
            name: name.into(),
            node_selector: Some(serde_json::from_value(selector).unwrap()),
        }
    }

    fn overlaps(a: serde_json::Value, b: serde_json::Value) -> bool {
        let (a, b) = (profile("a", a), profile("b", b));
        first_overlap(&[&a, &b]).unwrap().is_some()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> serde_json::Value {
        json!({"matchExpressions": [{"key": key, "operator": op, "values": values}]})
    }

    #[test]
    fn the_examples_of_the_spec() {
        let xxx = json!({"matchLabels": {"xxx": "xxx"}});
        assert!(!overlaps(
            xxx.clone(),
            json!({"matchLabels": {"yyy": "yyy"}})
        ));
        assert!(overlaps(
            xxx.clone(),
            json!({"matchLabels": {"xxx": "xxx", "yyy": "yyy"}})
        ));
        assert!(overlaps(xxx.clone(), expr("xxx", "In", &["xxx", "yyy"])));
        assert!(overlaps(xxx.clone(), expr("xxx", "NotIn", &["yyy"])));
        assert!(overlaps(xxx.clone(), expr("xxx", "Exists", &[])));
        assert!(!overlaps(xxx.clone(), expr("xxx", "DoesNotExist", &[])));
        assert!(overlaps(xxx, expr("yyy", "DoesNotExist", &[])));
    }

    #[test]
    fn virtual_nodes_cycle_through_each_list() {
        let s: LabelSelector =
            serde_json::from_value(json!({"matchLabels": {"l": "1"}, "matchExpressions": [
            {"key": "a", "operator": "In", "values": ["x", "y"]},
            {"key": "b", "operator": "NotIn", "values": ["p", "q", "r"]},
            {"key": "c", "operator": "Exists"}]}))
            .unwrap();
        let nodes: Vec<_> = virtual_nodes(&s).collect();
        assert_eq!(nodes.len(), 6);
        assert_eq!(nodes[5]["a"], "y");
        assert_eq!(nodes[5]["b"], "r");
        assert!(nodes.iter().all(|n| n["l"] == "1" && !n.contains_key("c")));
    }

    #[test]
    fn three_strategies_report_every_match_of_the_first_shared_node() {
        let (a, b, c) = (
            profile("a", json!({"matchLabels": {"pool": "x"}})),
            profile("b", json!({"matchLabels": {"zone": "z"}})),
            profile("c", expr("pool", "Exists", &[])),
        );
        assert_eq!(
            first_overlap(&[&a, &b, &c]).unwrap(),
            Some(vec!["a".into(), "c".into()])
        );
    }

    fn many_expressions(count: usize, values: &[&str]) -> serde_json::Value {
        let exprs: Vec<_> = (0..count)
            .map(|i| json!({"key": format!("k{i}"), "operator": "In", "values": values}))
            .collect();
        json!({"matchExpressions": exprs})
    }

    #[test]
    fn repeated_combinations_are_not_generated_again() {
        // 64 expressions of 2 values: Koordinator's product would be 2^64 nodes; 2 are distinct.
        let s: LabelSelector = serde_json::from_value(many_expressions(64, &["x", "y"])).unwrap();
        assert_eq!(virtual_node_count(&s), Some(2));
        assert_eq!(virtual_nodes(&s).count(), 2);
        // Lists of 2, 3 and 4 values repeat after 12.
        let s: LabelSelector = serde_json::from_value(json!({"matchExpressions": [
            {"key": "a", "operator": "In", "values": ["1", "2"]},
            {"key": "b", "operator": "In", "values": ["1", "2", "3"]},
            {"key": "c", "operator": "NotIn", "values": ["1", "2", "3", "4"]}]}))
        .unwrap();
        assert_eq!(virtual_node_count(&s), Some(12));
        let a = profile("a", many_expressions(40, &["x", "y"]));
        let b = profile("b", json!({"matchLabels": {"k0": "y", "k1": "y"}}));
        // a's second node (every key y) is generated, and b matches it.
        assert_eq!(
            first_overlap(&[&a, &b]).unwrap(),
            Some(vec!["a".into(), "b".into()])
        );
    }

    #[test]
    fn a_check_above_the_limit_is_refused_not_run() {
        // Value lists of coprime lengths: the lcm grows as their product.
        let primes = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47];
        let exprs: Vec<_> = primes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let values: Vec<String> = (0..*n).map(|v| v.to_string()).collect();
                json!({"key": format!("k{i}"), "operator": "In", "values": values})
            })
            .collect();
        let a = profile("a", json!({"matchExpressions": exprs}));
        let b = profile("b", json!({"matchLabels": {"z": "z"}}));
        assert_eq!(
            first_overlap(&[&a, &b]),
            Err(TooCostly {
                strategies: 2,
                label_sets: virtual_node_count(a.node_selector.as_ref().unwrap())
                    .and_then(|n| n.checked_add(1)),
            })
        );
    }

    #[test]
    fn the_cost_counts_every_label_comparison() {
        let a = profile(
            "a",
            json!({"matchLabels": {"x": "1", "y": "2"},
                   "matchExpressions": [{"key": "k", "operator": "In", "values": ["1", "2", "3"]},
                                        {"key": "e", "operator": "Exists"}]}),
        );
        let b = profile("b", expr("k", "NotIn", &["4"]));
        // 2 labels + (1 + 3) + (1 + 0), and 1 + 1.
        assert_eq!(strategies_weight(&[&a, &b]), 7 + 2);
        let most = MAX_SELECTOR_STEPS / 9;
        assert!(within_budget(&[&a, &b], Some(most)).is_ok());
        assert!(within_budget(&[&a, &b], Some(most + 1)).is_err());
        assert!(within_budget(&[&a, &b], None).is_err());
    }
}

//! Which node strategies a node matches: the heuristic of spec 9.3 that finds overlapping selectors
//! at configuration time ("virtual nodes"), and the check of a real node's labels (spec 5 and 9.1).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::types::NodeCfgProfile;
use crate::selectors::{self, Labels};

/// At most this many selector evaluations when looking for overlapping strategies (virtual nodes of
/// all strategies times the number of strategies). Beyond it the ConfigMap is refused with a message
/// saying so, rather than checked for seconds (a hostile selector could ask for 2^64 combinations).
pub const MAX_OVERLAP_EVALUATIONS: usize = 100_000;

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

/// Why an overlap check was not run: it would cost more than [`MAX_OVERLAP_EVALUATIONS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooCostly {
    pub strategies: usize,
}

/// The cost of [`first_overlap`] in selector evaluations, refused above the limit.
fn check_cost(profiles: &[&NodeCfgProfile]) -> Result<(), TooCostly> {
    let too_costly = TooCostly {
        strategies: profiles.len(),
    };
    let nodes = profiles
        .iter()
        .filter_map(|p| p.node_selector.as_ref())
        .try_fold(0usize, |sum, s| sum.checked_add(virtual_node_count(s)?))
        .ok_or_else(|| too_costly.clone())?;
    match nodes.checked_mul(profiles.len()) {
        Some(cost) if cost <= MAX_OVERLAP_EVALUATIONS => Ok(()),
        _ => Err(too_costly),
    }
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
    check_cost(profiles)?;
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
        assert_eq!(first_overlap(&[&a, &b]), Err(TooCostly { strategies: 2 }));
    }
}

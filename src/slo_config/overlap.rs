//! Which node strategies a node matches: the heuristic of spec 9.3 that finds overlapping selectors
//! at configuration time ("virtual nodes"), and the check of a real node's labels (spec 5 and 9.1).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::types::NodeCfgProfile;
use crate::selectors::{self, Labels};

/// Label sets a selector is meant for: its matchLabels, plus for virtual node i the value
/// `values[i mod len]` of every expression that lists values (NotIn included); as many virtual nodes
/// as the product of those lists' lengths.
pub fn virtual_nodes(selector: &LabelSelector) -> Vec<Labels> {
    let base: Labels = selector.match_labels.clone().unwrap_or_default();
    let with_values: Vec<_> = selector
        .match_expressions
        .iter()
        .flatten()
        .filter(|e| e.values.as_ref().is_some_and(|v| !v.is_empty()))
        .collect();
    let count = with_values
        .iter()
        .map(|e| e.values.as_ref().map_or(1, Vec::len))
        .product::<usize>()
        .max(1);
    (0..count)
        .map(|i| {
            let mut labels = base.clone();
            for e in &with_values {
                let values = e.values.as_deref().unwrap_or_default();
                labels.insert(e.key.clone(), values[i % values.len()].clone());
            }
            labels
        })
        .collect()
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
/// several strategies match.
pub fn first_overlap(profiles: &[&NodeCfgProfile]) -> Option<Vec<String>> {
    profiles
        .iter()
        .filter_map(|p| p.node_selector.as_ref())
        .flat_map(virtual_nodes)
        .map(|node| matching(profiles, &node))
        .find(|names| names.len() > 1)
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
        first_overlap(&[&a, &b]).is_some()
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
        let nodes = virtual_nodes(&s);
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
            first_overlap(&[&a, &b, &c]),
            Some(vec!["a".into(), "c".into()])
        );
    }
}

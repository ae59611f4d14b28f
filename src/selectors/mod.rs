//! Kubernetes label selectors (`matchLabels` + `matchExpressions`): checking one is well formed and
//! matching a label set against it, as `metav1.LabelSelectorAsSelector` and `Matches` do.

pub mod kubernetes;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

pub type Labels = BTreeMap<String, String>;

/// Why a selector cannot become a selector.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSelector(String);

/// Whether the selector has no requirement at all (which would match everything).
pub fn is_empty(selector: &LabelSelector) -> bool {
    selector.match_labels.as_ref().is_none_or(|l| l.is_empty())
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(|e| e.is_empty())
}

/// Checks what `LabelSelectorAsSelector` checks of the operators and their values.
pub fn validate(selector: &LabelSelector) -> Result<(), InvalidSelector> {
    for req in selector.match_expressions.iter().flatten() {
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(InvalidSelector(format!(
                    "values: Invalid value: []string{{}}: for 'in', 'notin' operators, values set can't be empty (key {})",
                    req.key
                )));
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(InvalidSelector(format!(
                    "values: Invalid value: {values:?}: values set must be empty for exists and does not exist (key {})",
                    req.key
                )));
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => {
                return Err(InvalidSelector(format!(
                    "{other:?} is not a valid label selector operator"
                )));
            }
        }
        if req.key.is_empty() {
            return Err(InvalidSelector(
                "key: Invalid value: \"\": name part must be non-empty".into(),
            ));
        }
    }
    Ok(())
}

fn requirement_matches(req: &LabelSelectorRequirement, labels: &Labels) -> bool {
    let values = req.values.as_deref().unwrap_or_default();
    let value = labels.get(&req.key);
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

/// Whether `labels` satisfy every requirement of the selector (an invalid operator matches nothing).
pub fn matches(selector: &LabelSelector, labels: &Labels) -> bool {
    selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
        && selector
            .match_expressions
            .iter()
            .flatten()
            .all(|req| requirement_matches(req, labels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn selector(v: serde_json::Value) -> LabelSelector {
        serde_json::from_value(v).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn operators_match_as_kubernetes_does() {
        let s = selector(json!({"matchLabels": {"a": "1"}, "matchExpressions": [
            {"key": "b", "operator": "In", "values": ["x", "y"]},
            {"key": "c", "operator": "NotIn", "values": ["z"]},
            {"key": "d", "operator": "Exists"},
            {"key": "e", "operator": "DoesNotExist"}]}));
        assert!(matches(&s, &labels(&[("a", "1"), ("b", "y"), ("d", "")])));
        assert!(!matches(&s, &labels(&[("a", "2"), ("b", "y"), ("d", "")])));
        assert!(!matches(&s, &labels(&[("a", "1"), ("b", "q"), ("d", "")])));
        assert!(!matches(
            &s,
            &labels(&[("a", "1"), ("b", "x"), ("c", "z"), ("d", "")])
        ));
        assert!(!matches(&s, &labels(&[("a", "1"), ("b", "x")])));
        assert!(!matches(
            &s,
            &labels(&[("a", "1"), ("b", "x"), ("d", ""), ("e", "")])
        ));
    }

    #[test]
    fn malformed_selectors_are_reported() {
        assert!(
            validate(&selector(
                json!({"matchExpressions": [{"key": "a", "operator": "In"}]})
            ))
            .is_err()
        );
        assert!(
            validate(&selector(
                json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]})
            ))
            .is_err()
        );
        let err = validate(&selector(
            json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
        ))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#""Gt" is not a valid label selector operator"#
        );
        assert!(validate(&selector(json!({"matchLabels": {"a": "b"}}))).is_ok());
        assert!(is_empty(&selector(json!({}))));
        assert!(!is_empty(&selector(
            json!({"matchExpressions": [{"key": "a", "operator": "Exists"}]})
        )));
    }
}

//! What Kubernetes' `metav1.LabelSelectorAsSelector` refuses, in its own words: label keys and
//! values (`content.IsLabelKey`, `IsLabelValue`), operators and the number of values. Used where
//! Koordinator reports that error to the user (the SLO ConfigMap's node selectors).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::kubernetes_errors::aggregate;

const LABEL_KEY_MESSAGE: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_KEY_PATTERN: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_VALUE_MESSAGE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_PATTERN: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const SUBDOMAIN_MESSAGE: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const SUBDOMAIN_PATTERN: &str = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const LABEL_MAX: usize = 63;
const SUBDOMAIN_MAX: usize = 253;

/// Kubernetes' explanation of a pattern failure, with its examples.
fn pattern_error(message: &str, pattern: &str, examples: &[&str]) -> String {
    let examples: Vec<String> = examples.iter().map(|e| format!("'{e}', ")).collect();
    format!(
        "{message} (e.g. {}regex used for validation is '{pattern}')",
        examples.join(" or ")
    )
}

/// Non-empty, alphanumeric at both ends, `inner` bytes between.
fn shaped(text: &str, end: impl Fn(u8) -> bool, inner: impl Fn(u8) -> bool) -> bool {
    let bytes = text.as_bytes();
    match bytes {
        [] => false,
        [only] => end(*only),
        [first, middle @ .., last] => end(*first) && end(*last) && middle.iter().all(|b| inner(*b)),
    }
}

fn label_name_shaped(text: &str) -> bool {
    shaped(
        text,
        |b| b.is_ascii_alphanumeric(),
        |b| b.is_ascii_alphanumeric() || b"-_.".contains(&b),
    )
}

fn subdomain_errors(text: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if text.len() > SUBDOMAIN_MAX {
        errors.push(format!("must be no more than {SUBDOMAIN_MAX} bytes"));
    }
    let lower_alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !text
        .split('.')
        .all(|part| shaped(part, lower_alnum, |b| lower_alnum(b) || b == b'-'))
    {
        errors.push(pattern_error(
            SUBDOMAIN_MESSAGE,
            SUBDOMAIN_PATTERN,
            &["example.com"],
        ));
    }
    errors
}

/// `content.IsLabelKey`.
pub fn label_key_errors(key: &str) -> Vec<String> {
    let parts: Vec<&str> = key.split('/').collect();
    let mut errors = Vec::new();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_owned());
            } else {
                errors.extend(
                    subdomain_errors(prefix)
                        .into_iter()
                        .map(|e| format!("prefix part {e}")),
                );
            }
            *name
        }
        _ => {
            return vec![format!(
                "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                pattern_error(
                    LABEL_KEY_MESSAGE,
                    LABEL_KEY_PATTERN,
                    &["MyName", "my.name", "123-abc"]
                )
            )];
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else if name.len() > LABEL_MAX {
        errors.push(format!("name part must be no more than {LABEL_MAX} bytes"));
    }
    if !label_name_shaped(name) {
        errors.push(format!(
            "name part {}",
            pattern_error(
                LABEL_KEY_MESSAGE,
                LABEL_KEY_PATTERN,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errors
}

/// `content.IsLabelValue`.
pub fn label_value_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > LABEL_MAX {
        errors.push(format!("must be no more than {LABEL_MAX} bytes"));
    }
    if !value.is_empty() && !label_name_shaped(value) {
        errors.push(pattern_error(
            LABEL_VALUE_MESSAGE,
            LABEL_VALUE_PATTERN,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errors
}

/// The operator a requirement is checked under (`selection.Operator`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Operator {
    Equals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// `labels.NewRequirement`'s errors, aggregated as Kubernetes prints them.
fn requirement_error(key: &str, operator: Operator, values: &[String]) -> Option<String> {
    let mut errors = Vec::new();
    let key_errors = label_key_errors(key);
    if !key_errors.is_empty() {
        errors.push(format!(
            "key: Invalid value: {key:?}: {}",
            key_errors.join("; ")
        ));
    }
    // The values as Kubernetes' field errors print them: JSON, `null` for none.
    let listed = || {
        if values.is_empty() {
            "null".to_owned()
        } else {
            serde_json::to_string(values).unwrap_or_default()
        }
    };
    match operator {
        Operator::In | Operator::NotIn if values.is_empty() => errors.push(format!(
            "values: Invalid value: {}: for 'in', 'notin' operators, values set can't be empty",
            listed()
        )),
        Operator::Exists | Operator::DoesNotExist if !values.is_empty() => errors.push(format!(
            "values: Invalid value: {}: values set must be empty for exists and does not exist",
            listed()
        )),
        Operator::Equals if values.len() != 1 => errors.push(format!(
            "values: Invalid value: {}: exact-match compatibility requires one single value",
            listed()
        )),
        _ => {}
    }
    for (i, value) in values.iter().enumerate() {
        let value_errors = label_value_errors(value);
        if !value_errors.is_empty() {
            errors.push(format!(
                "values[{i}][{key}]: Invalid value: {value:?}: {}",
                value_errors.join("; ")
            ));
        }
    }
    aggregate(errors)
}

/// `metav1.LabelSelectorAsSelector`'s error for this selector, if it has one. `matchLabels` are
/// checked in key order (Go's map order is random: with several bad labels Koordinator names any).
pub fn as_selector_error(selector: &LabelSelector) -> Option<String> {
    for (key, value) in selector.match_labels.iter().flatten() {
        if let Some(e) = requirement_error(key, Operator::Equals, std::slice::from_ref(value)) {
            return Some(e);
        }
    }
    for req in selector.match_expressions.iter().flatten() {
        let operator = match req.operator.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => return Some(format!("{other:?} is not a valid label selector operator")),
        };
        let values = req.values.as_deref().unwrap_or_default();
        if let Some(e) = requirement_error(&req.key, operator, values) {
            return Some(e);
        }
    }
    None
}

/// The selector as Go's generated `String()` prints a `*LabelSelector` (`%v`), which Koordinator
/// puts in its message.
pub fn go_string(selector: &LabelSelector) -> String {
    let labels: String = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}: {v},"))
        .collect();
    let expressions: String = selector
        .match_expressions
        .iter()
        .flatten()
        .map(|r| {
            format!(
                "LabelSelectorRequirement{{Key:{},Operator:{},Values:[{}],}},",
                r.key,
                r.operator,
                r.values.as_deref().unwrap_or_default().join(" ")
            )
        })
        .collect();
    format!(
        "&LabelSelector{{MatchLabels:map[string]string{{{labels}}},MatchExpressions:[]LabelSelectorRequirement{{{expressions}}},}}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn selector(value: serde_json::Value) -> LabelSelector {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn errors_in_kubernetes_words() {
        let bad_key = selector(json!({"matchLabels": {"bad key!": "x"}}));
        assert_eq!(
            as_selector_error(&bad_key).unwrap(),
            "key: Invalid value: \"bad key!\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
        );
        assert_eq!(
            go_string(&bad_key),
            "&LabelSelector{MatchLabels:map[string]string{bad key!: x,},MatchExpressions:[]LabelSelectorRequirement{},}"
        );
        let empty_in = selector(json!({"matchExpressions": [{"key": "pool", "operator": "In"}]}));
        assert_eq!(
            as_selector_error(&empty_in).unwrap(),
            "values: Invalid value: null: for 'in', 'notin' operators, values set can't be empty"
        );
        let bogus = selector(json!({"matchExpressions": [{"key": "pool", "operator": "Bogus"}]}));
        assert_eq!(
            as_selector_error(&bogus).unwrap(),
            "\"Bogus\" is not a valid label selector operator"
        );
        let two = selector(
            json!({"matchExpressions": [{"key": "/x", "operator": "Exists", "values": ["a"]}]}),
        );
        assert_eq!(
            as_selector_error(&two).unwrap(),
            "[key: Invalid value: \"/x\": prefix part must be non-empty, values: Invalid value: [\"a\"]: values set must be empty for exists and does not exist]"
        );
        assert_eq!(
            as_selector_error(&selector(
                json!({"matchLabels": {"example.com/a": "b-c", "k": ""}})
            )),
            None
        );
        assert!(as_selector_error(&selector(json!({"matchLabels": {"A.B/c": "x"}}))).is_some());
        assert!(as_selector_error(&selector(json!({"matchLabels": {"k": "-x"}}))).is_some());
    }
}

//! The rejection format of slo-controller-config checks: `___{"reason":R,"message":M}___`,
//! keys in the order Go serialises its structs.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

#[derive(Debug, Clone, PartialEq)]
pub enum ConfigError {
    ParseConfigFail(String),
    ConfigParamInvalid(String),
    /// Validator failures: field path -> message.
    FieldsInvalid(BTreeMap<String, String>),
    NodeStrategiesOverlap {
        config: String,
        strategies: Vec<String>,
    },
    ExistNodeConfict {
        config: String,
        strategies: Vec<String>,
        example_nodes: Vec<String>,
    },
    /// Network QoS errors are plain text.
    Plain(String),
}

#[derive(Serialize)]
struct Wrapped<'a, M: Serialize> {
    reason: &'a str,
    message: M,
}

#[derive(Serialize)]
struct Overlap<'a> {
    config: &'a str,
    strategies: &'a [String],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Conflict<'a> {
    config: &'a str,
    strategies: &'a [String],
    example_nodes: &'a [String],
}

fn wrapped<M: Serialize>(reason: &str, message: M) -> String {
    let json = serde_json::to_string(&Wrapped { reason, message })
        .unwrap_or_else(|e| format!("{{\"reason\":\"{reason}\",\"message\":\"{e}\"}}"));
    format!("___{}___", go_escaped(&json))
}

/// JSON as Go's `json.Marshal` writes it: `<`, `>`, `&`, U+2028 and U+2029 escaped (they only
/// occur inside strings, so replacing them everywhere is exact).
fn go_escaped(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            ConfigError::ParseConfigFail(m) => wrapped("ParseConfigFail", m),
            ConfigError::ConfigParamInvalid(m) => wrapped("ConfigParamInvalid", m),
            ConfigError::FieldsInvalid(m) => wrapped("ConfigParamInvalid", m),
            ConfigError::NodeStrategiesOverlap { config, strategies } => {
                wrapped("NodeStrategiesOverlap", Overlap { config, strategies })
            }
            ConfigError::ExistNodeConfict {
                config,
                strategies,
                example_nodes,
            } => wrapped(
                "ExistNodeConfict",
                Conflict {
                    config,
                    strategies,
                    example_nodes,
                },
            ),
            ConfigError::Plain(m) => m.clone(),
        };
        f.write_str(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_in_the_wire_format() {
        assert_eq!(
            ConfigError::ParseConfigFail("bad".into()).to_string(),
            r#"___{"reason":"ParseConfigFail","message":"bad"}___"#
        );
        let fields = BTreeMap::from([
            ("B.X".to_owned(), "X must be 1 or greater".to_owned()),
            ("A.Y".to_owned(), "Y".to_owned()),
        ]);
        assert_eq!(
            ConfigError::FieldsInvalid(fields).to_string(),
            r#"___{"reason":"ConfigParamInvalid","message":{"A.Y":"Y","B.X":"X must be 1 or greater"}}___"#
        );
        assert_eq!(
            ConfigError::NodeStrategiesOverlap {
                config: "cpu-burst-config".into(),
                strategies: vec!["b".into(), "a".into()]
            }
            .to_string(),
            r#"___{"reason":"NodeStrategiesOverlap","message":{"config":"cpu-burst-config","strategies":["b","a"]}}___"#
        );
        assert_eq!(
            ConfigError::ExistNodeConfict {
                config: "k".into(),
                strategies: vec!["a".into(), "b".into()],
                example_nodes: vec!["n1".into()]
            }
            .to_string(),
            r#"___{"reason":"ExistNodeConfict","message":{"config":"k","strategies":["a","b"],"exampleNodes":["n1"]}}___"#
        );
        assert_eq!(ConfigError::Plain("as is".into()).to_string(), "as is");
        assert_eq!(
            ConfigError::ConfigParamInvalid("&LabelSelector<a>".into()).to_string(),
            r#"___{"reason":"ConfigParamInvalid","message":"\u0026LabelSelector\u003ca\u003e"}___"#
        );
    }
}

//! What `audit` found: per rule, how many stored objects it would refuse and a few of them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

#[derive(Serialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Objects run through their validating rules, by kind.
    pub checked: BTreeMap<&'static str, usize>,
    /// Objects at least one rule would refuse.
    pub objects_found: usize,
    /// By rule: how many objects it would refuse, and the first few.
    pub rules: BTreeMap<String, RuleFindings>,
    /// Kinds or rules not checked, and why.
    pub skipped: Vec<String>,
    #[serde(skip)]
    examples: usize,
}

#[derive(Serialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct RuleFindings {
    pub count: usize,
    pub examples: Vec<Example>,
}

#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Example {
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    pub message: String,
}

impl Report {
    /// A report keeping up to `examples` objects per rule.
    pub fn new(examples: usize) -> Self {
        Self {
            examples,
            ..Self::default()
        }
    }

    pub fn checked(&mut self, kind: &'static str) {
        *self.checked.entry(kind).or_default() += 1;
    }

    pub fn skip(&mut self, why: String) {
        self.skipped.push(why);
    }

    /// One object's refusals, as `(rule, message)`.
    pub fn found(&mut self, object: Example, refusals: Vec<(String, String)>) {
        if refusals.is_empty() {
            return;
        }
        self.objects_found += 1;
        for (rule, message) in refusals {
            let found = self.rules.entry(rule).or_default();
            found.count += 1;
            if found.examples.len() < self.examples {
                found.examples.push(Example {
                    message,
                    ..object.clone()
                });
            }
        }
    }

    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let checked: Vec<String> = self
            .checked
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect();
        let checked = if checked.is_empty() {
            "nothing".to_owned()
        } else {
            checked.join(", ")
        };
        let _ = writeln!(
            out,
            "checked {checked}: {} would be refused",
            self.objects_found
        );
        for (rule, found) in &self.rules {
            let _ = writeln!(out, "{rule}: {}", found.count);
            for e in &found.examples {
                let name = match &e.namespace {
                    Some(ns) => format!("{ns}/{}", e.name),
                    None => e.name.clone(),
                };
                let _ = writeln!(out, "  {} {name}: {}", e.kind, e.message);
            }
        }
        for why in &self.skipped {
            let _ = writeln!(out, "not checked: {why}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str) -> Example {
        Example {
            kind: "Pod",
            namespace: Some("team".into()),
            name: name.into(),
            message: String::new(),
        }
    }

    #[test]
    fn counts_every_refusal_and_keeps_a_few_examples_per_rule() {
        let mut report = Report::new(2);
        for name in ["a", "b", "c"] {
            report.checked("Pod");
            report.found(object(name), vec![("R".into(), format!("{name} is bad"))]);
        }
        report.checked("Pod");
        report.found(object("d"), vec![]);
        assert_eq!(report.objects_found, 3);
        assert_eq!(report.rules["R"].count, 3);
        let names: Vec<&str> = report.rules["R"]
            .examples
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(names, ["a", "b"]);
        let text = report.render_text();
        assert!(text.starts_with("checked 4 Pod: 3 would be refused\nR: 3\n"));
        assert!(text.contains("  Pod team/a: a is bad\n"), "{text}");
    }
}

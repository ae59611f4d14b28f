//! (gate EnablePodEnhancedValidator) Pods must carry the labels the rules of the
//! enhanced-validator ConfigMap require, unless their namespace is whitelisted or they opt out.
//! The ConfigMap is read from the cache, so edits apply as soon as the watch delivers them; rules
//! that stop parsing leave the last good ones in force.

use crate::memory::metered::read_within;
use std::sync::{Arc, Mutex};

use crate::admission::pod::object::Pod;
use kube::core::admission::Operation;
use serde::Deserialize;

use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::outcome::Rejection;
use crate::apis::keys::SKIP_ENHANCED_VALIDATION;
use crate::features::{FeatureGates, Gate};

#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub required_labels: Vec<String>,
    #[serde(default)]
    pub namespace_whitelist: Vec<String>,
}

#[derive(Default)]
pub struct EnhancedValidator {
    /// The last `rules` value that parsed, and what it parsed to (shared, not copied, per review).
    last_good: Mutex<Option<(String, Arc<[Rule]>)>>,
}

impl Validator<Pod> for EnhancedValidator {
    fn name(&self) -> &'static str {
        "PodEnhancedValidator"
    }

    fn enabled(&self, gates: &FeatureGates) -> bool {
        gates.enabled(Gate::EnablePodEnhancedValidator)
    }

    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, Pod>) -> Step<'a> {
        let Some(pod) = ctx.object() else {
            return Ok(()).into();
        };
        if !matches!(ctx.operation(), Operation::Create | Operation::Update) {
            return Ok(()).into();
        }
        let Some(rules) = self.rules(ctx) else {
            return Ok(()).into();
        };
        let empty = std::collections::BTreeMap::new();
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        if labels.get(SKIP_ENHANCED_VALIDATION).map(String::as_str) == Some("true") {
            return Ok(()).into();
        }
        let namespace = super::object::pod_namespace(pod, ctx.request.namespace.as_deref());
        check(&rules, namespace, labels)
            .map_err(Rejection::invalid)
            .into()
    }
}

impl EnhancedValidator {
    /// The rules in force, `None` when disabled or absent.
    fn rules(&self, ctx: &Ctx<'_, Pod>) -> Option<Arc<[Rule]>> {
        let (namespace, name) = &ctx.settings.enhanced_validator_config;
        let config_map = ctx.cache.config_map(namespace, name)?;
        let data = config_map.data.as_ref()?;
        let enabled = data
            .get("enable")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        if !enabled {
            return None;
        }
        let text = data.get("rules").map_or("", String::as_str);
        let mut last_good = self.last_good.lock().unwrap_or_else(|p| p.into_inner());
        if last_good.as_ref().is_some_and(|(t, _)| t == text) {
            return last_good.as_ref().map(|(_, r)| r.clone());
        }
        match read_within::<Vec<Rule>>(text.as_bytes()) {
            Ok(rules) => {
                let rules: Arc<[Rule]> = rules.into();
                *last_good = Some((text.to_owned(), rules.clone()));
                Some(rules)
            }
            Err(e) => {
                tracing::warn!(error = %e, "enhanced-validator rules do not parse; keeping the previous ones");
                last_good.as_ref().map(|(_, r)| r.clone())
            }
        }
    }
}

pub fn check(
    rules: &[Rule],
    namespace: &str,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<(), String> {
    for rule in rules {
        if rule.namespace_whitelist.iter().any(|n| n == namespace) {
            continue;
        }
        let missing: Vec<&str> = rule
            .required_labels
            .iter()
            .filter(|l| !labels.contains_key(*l))
            .map(String::as_str)
            .collect();
        match missing.as_slice() {
            [] => {}
            [one] => return Err(format!("required label '{one}' is missing")),
            several => {
                return Err(format!(
                    "required labels are missing: [{}]",
                    several.join(" ")
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_labels_and_whitelists() {
        let rules: Vec<Rule> = serde_json::from_str(
            r#"[{"name": "team", "requiredLabels": ["team"], "namespaceWhitelist": ["kube-system"]},
                {"name": "cost", "requiredLabels": ["cost-center", "owner"]}]"#,
        )
        .unwrap();
        let labels = |pairs: &[&str]| {
            pairs
                .iter()
                .map(|k| (k.to_string(), "x".to_string()))
                .collect()
        };
        assert_eq!(
            check(&rules, "apps", &labels(&[])),
            Err("required label 'team' is missing".into())
        );
        assert_eq!(
            check(&rules, "kube-system", &labels(&[])),
            Err("required labels are missing: [cost-center owner]".into())
        );
        assert_eq!(
            check(&rules, "apps", &labels(&["team", "owner"])),
            Err("required label 'cost-center' is missing".into())
        );
        assert_eq!(
            check(&rules, "apps", &labels(&["team", "owner", "cost-center"])),
            Ok(())
        );
    }
}

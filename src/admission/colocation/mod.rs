//! ClusterColocationProfile application, shared by /mutate-pod and /mutate-reservation:
//! which profiles match, the probability draw, and the metadata edits.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Serialize, de::DeserializeOwned};

pub use crate::admission::ports::Dice;
use crate::apis::colocation_profile::QosClassOrEmpty;
use crate::apis::keys::{PRIORITY_LABEL, QOS_CLASS_LABEL};
use crate::apis::{ClusterColocationProfile, ClusterColocationProfileSpec};
use crate::cache::Cache;
use crate::memory::metered::to_value_within;
use crate::resources::strategic_merge::{self, MergeKeys};
use crate::selectors::{self, Labels};
use crate::telemetry::Clipped;

/// Whether a selector admits these labels; a malformed one admits nothing (a decision against
/// Koordinator, which applies the profile).
fn selector_admits(selector: Option<&LabelSelector>, labels: &Labels, profile: &str) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    if let Err(e) = selectors::validate(selector) {
        tracing::warn!(profile, error = %e, "profile selector cannot be parsed; profile skipped");
        return false;
    }
    selectors::matches(selector, labels)
}

/// Profiles matching an object, sorted by name. `namespace` is `None` for cluster-scoped objects,
/// whose profiles' namespaceSelector is ignored.
pub fn matching_profiles(
    cache: &Cache,
    labels: &Labels,
    namespace: Option<&str>,
) -> Vec<Arc<ClusterColocationProfile>> {
    let mut matched: Vec<_> = cache
        .colocation_profiles
        .state()
        .into_iter()
        .filter(|p| {
            let name = p.metadata.name.as_deref().unwrap_or_default();
            let namespace_ok = match (namespace, p.spec.namespace_selector.as_ref()) {
                (None, _) | (_, None) => true,
                (Some(_), Some(s)) if selectors::is_empty(s) => true,
                (Some(ns), Some(s)) => match cache.namespaces.get(None, ns) {
                    Some(object) => {
                        let ns_labels = object.metadata.labels.clone().unwrap_or_default();
                        selector_admits(Some(s), &ns_labels, name)
                    }
                    None => {
                        tracing::warn!(
                            profile = %Clipped::name(name),
                            // The object's namespace: a forged review's may be anything.
                            namespace = %Clipped::name(ns),
                            "namespace not in the cache; profile skipped"
                        );
                        false
                    }
                },
            };
            namespace_ok && selector_admits(p.spec.selector.as_ref(), labels, name)
        })
        .collect();
    matched.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    matched
}

/// The profile's probability in percent: absent 100, an integer as is, a string `"NN%"`.
fn percent(probability: Option<&IntOrString>) -> Result<i64, String> {
    match probability {
        None => Ok(100),
        Some(IntOrString::Int(p)) => Ok(i64::from(*p)),
        Some(IntOrString::String(s)) => s
            .strip_suffix('%')
            .and_then(|n| n.trim().parse::<f64>().ok())
            .map(|v| v.floor() as i64)
            .ok_or_else(|| format!("invalid type: string is not a percentage: {s:?}")),
    }
}

/// Whether the profile applies this time: 0 never, 100 or more always, else when a roll in
/// [0, 99] is at most the percentage.
pub fn draw(spec: &ClusterColocationProfileSpec, dice: &dyn Dice) -> Result<bool, String> {
    let p = percent(spec.probability.as_ref())?;
    Ok(match p {
        ..=0 => false,
        100.. => true,
        _ => i64::from(dice.roll_percent()) <= p,
    })
}

fn copy_keys(map: &mut BTreeMap<String, String>, mapping: Option<&BTreeMap<String, String>>) {
    // BTreeMap: applied in sorted key order.
    for (from, to) in mapping.into_iter().flatten() {
        let value = map.get(from).cloned().unwrap_or_default();
        map.insert(to.clone(), value);
    }
}

/// labels, annotations, key mappings, suffixes, QoS and priority labels.
pub fn apply_metadata(meta: &mut ObjectMeta, spec: &ClusterColocationProfileSpec) {
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.extend(spec.labels.clone().unwrap_or_default());
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    annotations.extend(spec.annotations.clone().unwrap_or_default());
    copy_keys(labels, spec.label_keys_mapping.as_ref());
    copy_keys(annotations, spec.annotation_keys_mapping.as_ref());
    for (key, suffix) in spec.label_suffixes.iter().flatten() {
        if let Some(value) = labels.get_mut(key) {
            value.push_str(suffix);
        }
    }
    if spec.qos_class != QosClassOrEmpty::None {
        let qos = serde_json::to_value(spec.qos_class)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        labels.insert(QOS_CLASS_LABEL.to_owned(), qos);
    }
    if let Some(priority) = spec.koordinator_priority {
        labels.insert(PRIORITY_LABEL.to_owned(), priority.to_string());
    }
    if meta.annotations.as_ref().is_some_and(BTreeMap::is_empty) {
        meta.annotations = None;
    }
    if meta.labels.as_ref().is_some_and(BTreeMap::is_empty) {
        meta.labels = None;
    }
}

/// A PriorityClass's value and preemption policy, from the cache.
pub fn priority_class(cache: &Cache, name: &str) -> Result<(i32, Option<String>), String> {
    cache
        .priority_classes
        .get(None, name)
        .map(|pc| (pc.value, pc.preemption_policy.clone()))
        .ok_or_else(|| format!("priorityclasses.scheduling.k8s.io \"{name}\" not found"))
}

/// Applies the profile's strategic merge patch to a whole object.
pub fn apply_patch<T: Serialize + DeserializeOwned>(
    object: &mut T,
    patch: &serde_json::Value,
    keys: &dyn MergeKeys,
) -> Result<(), String> {
    let original = to_value_within(&*object).map_err(|e| format!("the object: {e}"))?;
    let merged = strategic_merge::apply(&original, patch, keys).map_err(|e| e.to_string())?;
    *object = serde_json::from_value(merged)
        .map_err(|e| format!("the patched object does not decode: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests;

//! Spec 1.3: the batch resources of each regular container, recorded in the pod's
//! `node.koordinator.sh/extended-resource-spec` annotation for the koordlet.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::core::admission::Operation;
use serde::{Deserialize, Serialize};

use crate::admission::chain::{Ctx, Mutator, Step};
use crate::admission::outcome::Rejection;
use crate::apis::keys::{BATCH_CPU, BATCH_MEMORY, EXTENDED_RESOURCE_SPEC};
use crate::features::{FeatureGates, Gate};
use crate::resources::Qty;

type ResourceList = BTreeMap<String, Quantity>;

#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
struct ExtendedResourceSpec {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    containers: BTreeMap<String, ContainerSpec>,
}

#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
struct ContainerSpec {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    limits: ResourceList,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    requests: ResourceList,
}

pub struct ExtendedResourceSpecAnnotation;

impl Mutator<Pod> for ExtendedResourceSpecAnnotation {
    fn name(&self) -> &'static str {
        "ExtendedResourceSpec"
    }

    fn enabled(&self, gates: &FeatureGates) -> bool {
        !gates.enabled(Gate::DisableExtendedResourceSpec)
    }

    fn mutate<'a>(&'a self, ctx: &'a Ctx<'a, Pod>, pod: &'a mut Pod) -> Step<'a> {
        if !matches!(ctx.operation(), Operation::Create) {
            return Ok(()).into();
        }
        annotate(pod).map_err(Rejection::internal).into()
    }
}

/// Only batch resources, in canonical form (values compare by quantity, not by spelling).
fn batch_only(list: Option<&ResourceList>) -> ResourceList {
    list.into_iter()
        .flatten()
        .filter(|(k, _)| *k == BATCH_CPU || *k == BATCH_MEMORY)
        .map(|(k, q)| (k.clone(), canonical(q)))
        .collect()
}

fn canonical_list(list: &ResourceList) -> ResourceList {
    list.iter()
        .map(|(k, q)| (k.clone(), canonical(q)))
        .collect()
}

fn canonical(q: &Quantity) -> Quantity {
    Qty::try_from(q)
        .map(Qty::to_quantity)
        .unwrap_or_else(|_| q.clone())
}

fn annotate(pod: &mut Pod) -> Result<(), String> {
    let mut wanted = ExtendedResourceSpec::default();
    for c in pod.spec.iter().flat_map(|s| &s.containers) {
        let res = c.resources.as_ref();
        let spec = ContainerSpec {
            requests: batch_only(res.and_then(|r| r.requests.as_ref())),
            limits: batch_only(res.and_then(|r| r.limits.as_ref())),
        };
        if !spec.requests.is_empty() || !spec.limits.is_empty() {
            wanted.containers.insert(c.name.clone(), spec);
        }
    }
    let had_annotations = pod.metadata.annotations.is_some();
    let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let current = match annotations.get(EXTENDED_RESOURCE_SPEC) {
        None => ExtendedResourceSpec::default(),
        Some(text) => {
            let mut current: ExtendedResourceSpec = serde_json::from_str(text)
                .map_err(|e| format!("failed to get current extended resource spec, err: {e}"))?;
            for c in current.containers.values_mut() {
                c.requests = canonical_list(&c.requests);
                c.limits = canonical_list(&c.limits);
            }
            current
        }
    };
    if current != wanted {
        let text = serde_json::to_string(&wanted).map_err(|e| e.to_string())?;
        annotations.insert(EXTENDED_RESOURCE_SPEC.to_owned(), text);
    } else if !had_annotations {
        pod.metadata.annotations = None;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(annotations: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"annotations": annotations}, "spec": {"containers": [
            {"name": "test-container-a", "resources": {
                "requests": {"kubernetes.io/batch-cpu": "1k", "kubernetes.io/batch-memory": "4Gi", "kubernetes.io/mid-cpu": "1"},
                "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "4Gi"}}},
            {"name": "plain", "resources": {"requests": {"cpu": "1"}}}]}}))
        .unwrap()
    }

    const EXPECTED: &str = r#"{"containers":{"test-container-a":{"limits":{"kubernetes.io/batch-cpu":"1k","kubernetes.io/batch-memory":"4Gi"},"requests":{"kubernetes.io/batch-cpu":"1k","kubernetes.io/batch-memory":"4Gi"}}}}"#;

    #[test]
    fn written_as_koordinator_writes_it() {
        let mut p = pod(json!(null));
        annotate(&mut p).unwrap();
        assert_eq!(
            p.metadata.annotations.as_ref().unwrap()[EXTENDED_RESOURCE_SPEC],
            EXPECTED
        );
        // Already right: untouched.
        let mut q = pod(json!({EXTENDED_RESOURCE_SPEC: EXPECTED}));
        let before = q.clone();
        annotate(&mut q).unwrap();
        assert_eq!(q, before);
    }

    #[test]
    fn stale_and_broken_annotations() {
        let mut p: Pod = serde_json::from_value(
            json!({"metadata": {"annotations": {EXTENDED_RESOURCE_SPEC: EXPECTED}},
            "spec": {"containers": [{"name": "c"}]}}),
        )
        .unwrap();
        annotate(&mut p).unwrap();
        assert_eq!(
            p.metadata.annotations.as_ref().unwrap()[EXTENDED_RESOURCE_SPEC],
            "{}"
        );
        let mut p = pod(json!({EXTENDED_RESOURCE_SPEC: "{"}));
        assert!(
            annotate(&mut p)
                .unwrap_err()
                .starts_with("failed to get current extended resource spec, err: ")
        );
    }
}

//! The batch resources of each regular container, recorded in the pod's
//! `node.koordinator.sh/extended-resource-spec` annotation for the koordlet.

use crate::memory::metered::read_within;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;

use crate::admission::pod::object::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::core::admission::Operation;
use serde::{Deserialize, Serialize};

use crate::admission::chain::{Ctx, Mutator, Step};
use crate::admission::json_write;
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

fn batch(list: Option<&ResourceList>) -> impl Iterator<Item = (&String, &Quantity)> {
    list.into_iter()
        .flatten()
        .filter(|(name, _)| *name == BATCH_CPU || *name == BATCH_MEMORY)
}

fn canonical_list(list: &ResourceList) -> ResourceList {
    list.iter()
        .map(|(k, q)| (k.clone(), canonical(q)))
        .collect()
}

/// Values compare by quantity, not by spelling; one that does not parse is kept as written.
fn canonical(q: &Quantity) -> Quantity {
    Qty::try_from(q)
        .map(Qty::to_quantity)
        .unwrap_or_else(|_| q.clone())
}

/// The annotation the pod's containers call for, as the JSON serde would write for
/// [`ExtendedResourceSpec`] (maps in key order, empty ones left out), written directly: this runs
/// for every pod created.
fn wanted(pod: &Pod) -> Result<String, String> {
    // By name, as the map it is; a repeated name keeps the last container (as a map insert would).
    let containers: BTreeMap<&str, &ResourceRequirements> = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .filter_map(|c| Some((c.name.as_str(), c.resources.as_ref()?)))
        .filter(|(_, r)| {
            batch(r.limits.as_ref()).next().is_some() || batch(r.requests.as_ref()).next().is_some()
        })
        .collect();
    let mut out = Vec::with_capacity(16 + 160 * containers.len());
    out.push(b'{');
    if !containers.is_empty() {
        out.extend_from_slice(br#""containers":{"#);
        for (i, (name, resources)) in containers.into_iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json_write::string(&mut out, name);
            out.extend_from_slice(b":{");
            let lists = [
                (&br#""limits":{"#[..], &resources.limits),
                (&br#""requests":{"#[..], &resources.requests),
            ];
            let mut first = true;
            for (field, list) in lists {
                let mut entries = batch(list.as_ref()).peekable();
                if entries.peek().is_none() {
                    continue;
                }
                if !std::mem::take(&mut first) {
                    out.push(b',');
                }
                // Field and resource names are ours, plain ASCII: no escaping to look for.
                out.extend_from_slice(field);
                for (j, (resource, value)) in entries.enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    out.push(b'"');
                    out.extend_from_slice(resource.as_bytes());
                    out.extend_from_slice(b"\":");
                    match Qty::try_from(value) {
                        Ok(value) => {
                            out.push(b'"');
                            value.write_to(&mut out);
                            out.push(b'"');
                        }
                        Err(_) => json_write::string(&mut out, &value.0),
                    }
                }
                out.push(b'}');
            }
            out.push(b'}');
        }
        out.push(b'}');
    }
    out.push(b'}');
    String::from_utf8(out).map_err(|e| e.to_string())
}

/// Whether the annotation `current` already says what `wanted` says.
fn same_spec(current: &str, wanted: &str) -> Result<bool, String> {
    if current == wanted {
        return Ok(true);
    }
    let mut current: ExtendedResourceSpec = read_within(current.as_bytes())
        .map_err(|e| format!("failed to get current extended resource spec, err: {e}"))?;
    for c in current.containers.values_mut() {
        c.requests = canonical_list(&c.requests);
        c.limits = canonical_list(&c.limits);
    }
    let wanted: ExtendedResourceSpec = read_within(wanted.as_bytes()).map_err(|e| e.to_string())?;
    Ok(current == wanted)
}

fn annotate(pod: &mut Pod) -> Result<(), String> {
    let wanted = wanted(pod)?;
    let annotations = &mut pod.metadata.annotations;
    let current = annotations
        .as_ref()
        .and_then(|a| a.get(EXTENDED_RESOURCE_SPEC));
    let unchanged = match current {
        Some(current) => same_spec(current, &wanted)?,
        // Nothing to record, and nothing recorded.
        None => wanted == "{}",
    };
    if !unchanged {
        annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(EXTENDED_RESOURCE_SPEC.to_owned(), wanted);
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

    #[test]
    fn written_json_is_what_serde_writes() {
        let p: Pod = serde_json::from_value(json!({"spec": {"containers": [
            {"name": "z", "resources": {"limits": {"kubernetes.io/batch-memory": "1.5Gi"}}},
            {"name": "a\"q", "resources": {"requests": {"kubernetes.io/batch-cpu": "bad\\\"", "cpu": "1"}}},
            {"name": "none", "resources": {"requests": {"cpu": "1"}}},
            {"name": "bare"},
            {"name": "m", "resources": {"requests": {"kubernetes.io/batch-cpu": "2000"},
                                         "limits": {"kubernetes.io/batch-cpu": "2k", "kubernetes.io/batch-memory": "0"}}},
            {"name": "m", "resources": {"requests": {"cpu": "1"}}}]}}))
        .unwrap();
        let list = |entries: &[(&str, &str)]| -> ResourceList {
            entries
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect()
        };
        let spec = |limits, requests| ContainerSpec { limits, requests };
        let expected = ExtendedResourceSpec {
            containers: BTreeMap::from([
                (
                    "z".to_string(),
                    spec(list(&[(BATCH_MEMORY, "1536Mi")]), list(&[])),
                ),
                (
                    "a\"q".to_string(),
                    spec(list(&[]), list(&[(BATCH_CPU, "bad\\\"")])),
                ),
                (
                    "m".to_string(),
                    spec(
                        list(&[(BATCH_CPU, "2k"), (BATCH_MEMORY, "0")]),
                        list(&[(BATCH_CPU, "2k")]),
                    ),
                ),
            ]),
        };
        assert_eq!(
            wanted(&p).unwrap(),
            serde_json::to_string(&expected).unwrap()
        );
        let empty: Pod =
            serde_json::from_value(json!({"spec": {"containers": [{"name": "c"}]}})).unwrap();
        assert_eq!(wanted(&empty).unwrap(), "{}");
        // Spelled differently, same quantities: left as it is.
        let spelled = r#"{"containers":{"m":{"requests":{"kubernetes.io/batch-cpu":"2000"}}}}"#;
        assert!(
            same_spec(
                spelled,
                r#"{"containers":{"m":{"requests":{"kubernetes.io/batch-cpu":"2k"}}}}"#
            )
            .unwrap()
        );
        assert!(!same_spec(spelled, "{}").unwrap());
    }
}

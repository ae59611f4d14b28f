//! A pod's patch, diffed by parts: mutators touch labels, annotations, a few spec fields and the
//! containers' resources, so the rest (env, volumes, probes: most of a pod's bytes) is compared as
//! typed values and never serialised.

use std::fmt::Write;

use k8s_openapi::api::core::v1::ResourceRequirements;

use crate::admission::pod::object::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::builder::Builder;

/// The patch from `before` to `after`, equal to what the whole-object diff gives when applied.
pub fn diff(mut before: Pod, mut after: Pod) -> Result<Option<Vec<u8>>, serde_json::Error> {
    let mut builder = Builder::default();
    metadata(&mut builder, &mut before.metadata, &mut after.metadata)?;
    match (before.spec.as_mut(), after.spec.as_mut()) {
        (Some(b), Some(a)) => spec(&mut builder, b, a)?,
        _ => builder.field("/spec", &before.spec, &after.spec)?,
    }
    let status = (before.status.take(), after.status.take());
    builder.field("/status", &status.0, &status.1)?;
    // What is left: the pod's own undecoded fields (apiVersion, kind), equal unless a colocation
    // profile's patch edited them. The parts diffed above are taken out of both sides.
    (before.metadata, after.metadata) = Default::default();
    (before.spec, after.spec) = (None, None);
    builder.field("", &before, &after)?;
    Ok(builder.finish())
}

// The parts are taken out of both sides so the remainder compares without them.
fn metadata(
    builder: &mut Builder,
    before: &mut ObjectMeta,
    after: &mut ObjectMeta,
) -> Result<(), serde_json::Error> {
    let labels = (before.labels.take(), after.labels.take());
    let annotations = (before.annotations.take(), after.annotations.take());
    builder.field("/metadata", before, after)?;
    builder.string_map("/metadata/labels", labels.0.as_ref(), labels.1.as_ref())?;
    builder.string_map(
        "/metadata/annotations",
        annotations.0.as_ref(),
        annotations.1.as_ref(),
    )
}

fn spec(
    builder: &mut Builder,
    before: &mut PodSpec,
    after: &mut PodSpec,
) -> Result<(), serde_json::Error> {
    let containers = (
        std::mem::take(&mut before.containers),
        std::mem::take(&mut after.containers),
    );
    let init = (before.init_containers.take(), after.init_containers.take());
    // What a colocation profile sets, diffed alone so the rest of the spec is usually equal and
    // never serialised.
    macro_rules! alone {
        ($($path:literal: $field:ident),*) => {$(
            builder.field($path, &before.$field.take(), &after.$field.take())?;
        )*};
    }
    alone!(
        "/spec/schedulerName": scheduler_name,
        "/spec/priorityClassName": priority_class_name,
        "/spec/priority": priority,
        "/spec/preemptionPolicy": preemption_policy
    );
    builder.field("/spec", before, after)?;
    containers_diff(builder, "/spec/containers", containers.0, containers.1)?;
    match init {
        (Some(b), Some(a)) => containers_diff(builder, "/spec/initContainers", b, a),
        (b, a) => builder.field("/spec/initContainers", &b, &a),
    }
}

fn containers_diff(
    builder: &mut Builder,
    path: &str,
    mut before: Vec<Container>,
    mut after: Vec<Container>,
) -> Result<(), serde_json::Error> {
    if before.len() != after.len() {
        return builder.field(path, &before, &after);
    }
    // One buffer for every container's paths (a batch pod has several lists to rewrite in each).
    let mut at = String::with_capacity(path.len() + 32);
    for (i, (b, a)) in before.iter_mut().zip(after.iter_mut()).enumerate() {
        if b == a {
            continue;
        }
        at.clear();
        at.push_str(path);
        // Writing into a String cannot fail.
        let _ = write!(at, "/{i}");
        let resources = (b.resources.take(), a.resources.take());
        if b == a {
            at.push_str("/resources");
            resources_diff(builder, &mut at, resources)?;
        } else {
            (b.resources, a.resources) = resources;
            builder.field(&at, &*b, &*a)?;
        }
    }
    Ok(())
}

/// `path` is the resources' path; the lists' paths are written after it and taken off again.
fn resources_diff(
    builder: &mut Builder,
    path: &mut String,
    resources: (Option<ResourceRequirements>, Option<ResourceRequirements>),
) -> Result<(), serde_json::Error> {
    match resources {
        (Some(b), Some(a)) if b.claims == a.claims => {
            let len = path.len();
            for (name, b, a) in [
                ("/limits", &b.limits, &a.limits),
                ("/requests", &b.requests, &a.requests),
            ] {
                path.truncate(len);
                path.push_str(name);
                builder.string_map(path, b.as_ref(), a.as_ref())?;
            }
            path.truncate(len);
            Ok(())
        }
        (b, a) => builder.field(path, &b, &a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::patch::tests::apply;
    use serde_json::{Value, json};

    fn base() -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "spark"}},
            "spec": {"containers": [
                {"name": "a", "image": "i", "env": [{"name": "X", "value": "1"}],
                 "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}},
                {"name": "b", "image": "i"}],
                "initContainers": [{"name": "init", "image": "i"}],
                "schedulerName": "default-scheduler", "preemptionPolicy": "PreemptLowerPriority"}})
    }

    /// Each edit of `base` as a mutator might make it; the piecewise patch must turn `base` into it.
    fn edits() -> Vec<(&'static str, Value)> {
        let mut cases = Vec::new();
        let mut case = |name, edit: &dyn Fn(&mut Value)| {
            let mut v = base();
            edit(&mut v);
            cases.push((name, v));
        };
        case("nothing", &|_| {});
        case("label added", &|v| {
            v["metadata"]["labels"]["q"] = json!("BE")
        });
        case("labels removed", &|v| {
            v["metadata"].as_object_mut().unwrap().remove("labels");
        });
        case("label changed and one removed", &|v| {
            v["metadata"]["labels"] = json!({"app": "flink", "k/x~y": "1"})
        });
        case("annotations added", &|v| {
            v["metadata"]["annotations"] = json!({"k/x": "{\"a\":1}"})
        });
        case("other metadata", &|v| {
            v["metadata"]["generateName"] = json!("p-")
        });
        case(
            "resources changed",
            &|v| {
                v["spec"]["containers"][0]["resources"] =
                    json!({"requests": {"kubernetes.io/batch-cpu": "2k"}, "limits": {"cpu": "1"}})
            },
        );
        case("one quantity changed", &|v| {
            v["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!("3")
        });
        case("resources added", &|v| {
            v["spec"]["containers"][1]["resources"] = json!({"limits": {"cpu": "1"}})
        });
        case("resources removed", &|v| {
            v["spec"]["containers"][0]
                .as_object_mut()
                .unwrap()
                .remove("resources");
        });
        case("container and resources changed", &|v| {
            v["spec"]["containers"][0]["image"] = json!("j");
            v["spec"]["containers"][0]["resources"] = json!({});
        });
        case("container added", &|v| {
            v["spec"]["containers"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "c"}))
        });
        case("init container changed", &|v| {
            v["spec"]["initContainers"][0]["resources"] = json!({"requests": {"cpu": "1"}})
        });
        case("init containers removed", &|v| {
            v["spec"].as_object_mut().unwrap().remove("initContainers");
        });
        case("spec fields", &|v| {
            v["spec"]["schedulerName"] = json!("koord-scheduler");
            v["spec"]["priority"] = json!(5500);
            v["spec"]["affinity"] = json!({"nodeAffinity": {}});
        });
        case("scheduling fields removed and added", &|v| {
            let spec = v["spec"].as_object_mut().unwrap();
            spec.remove("schedulerName");
            spec.remove("preemptionPolicy");
            spec.insert("priorityClassName".into(), json!("koord-batch"));
            spec.insert("nodeName".into(), json!("n1"));
        });
        case("status added", &|v| {
            v["status"] = json!({"phase": "Pending"})
        });
        cases
    }

    #[test]
    fn piecewise_patch_turns_before_into_after() {
        let before: Pod = serde_json::from_value(base()).unwrap();
        let before_json = serde_json::to_value(&before).unwrap();
        for (name, edited) in edits() {
            let after: Pod = serde_json::from_value(edited).unwrap();
            let after_json = serde_json::to_value(&after).unwrap();
            let patch = diff(before.clone(), after).unwrap();
            match patch {
                None => assert_eq!(before_json, after_json, "{name}: no patch for a change"),
                Some(bytes) => {
                    assert_eq!(apply(&before_json, &bytes), after_json, "{name}");
                    // Never larger than what the whole-object diff says.
                    let whole = crate::admission::patch::diff(&before_json, &after_json)
                        .unwrap()
                        .unwrap();
                    let ops = |b: &[u8]| serde_json::from_slice::<Vec<Value>>(b).unwrap().len();
                    assert!(ops(&bytes) <= ops(&whole), "{name}");
                }
            }
        }
    }

    #[test]
    fn a_pod_without_spec_gets_one_whole() {
        let before: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap();
        let after: Pod = serde_json::from_value(base()).unwrap();
        let bytes = diff(before.clone(), after.clone()).unwrap().unwrap();
        assert_eq!(
            apply(&serde_json::to_value(&before).unwrap(), &bytes),
            serde_json::to_value(&after).unwrap()
        );
    }
}

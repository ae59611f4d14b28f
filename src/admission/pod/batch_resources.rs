//! A batch or mid pod asks for `kubernetes.io/batch-*` (`mid-*`) resources instead of
//! cpu and memory; cpu becomes an integer of milli-cores, memory keeps its quantity.

use std::collections::BTreeMap;

use crate::admission::pod::object::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::admission::pod::priority::{PriorityClass, priority_class_with_default};
use crate::apis::keys::{BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY};
use crate::resources::{Format, Qty};

type ResourceList = BTreeMap<String, Quantity>;

/// Moves cpu and memory of `list` to the target names. Returns whether anything changed.
fn convert_list(list: &mut ResourceList, (cpu, memory): (&str, &str)) -> Result<bool, String> {
    let mut changed = false;
    if let Some(q) = list.remove("cpu") {
        let milli = Qty::try_from(&q).map_err(|e| e.to_string())?.milli();
        // The milli-cores become whole units of the batch resource.
        let units = milli.checked_mul(1000).ok_or_else(|| {
            format!(
                "cpu {:?} is too large to be expressed as {cpu} (milli-cores)",
                q.0
            )
        })?;
        let value = Qty::from_milli(units, Format::DecimalSI);
        list.insert(cpu.to_owned(), value.to_quantity());
        changed = true;
    }
    if let Some(q) = list.remove("memory") {
        let value = Qty::try_from(&q).map_err(|e| e.to_string())?;
        list.insert(memory.to_owned(), value.to_quantity());
        changed = true;
    }
    Ok(changed)
}

fn convert_container(c: &mut Container, targets: (&str, &str)) -> Result<bool, String> {
    let resources = c.resources.get_or_insert_with(Default::default);
    let mut changed = false;
    for list in [&mut resources.requests, &mut resources.limits]
        .into_iter()
        .flatten()
    {
        changed |= convert_list(list, targets)?;
    }
    // A limit without a request: the request is the limit (never the other way round).
    for name in [targets.0, targets.1] {
        let limit = resources.limits.as_ref().and_then(|l| l.get(name)).cloned();
        let requests = resources.requests.get_or_insert_with(BTreeMap::new);
        if let Some(limit) = limit.filter(|_| !requests.contains_key(name)) {
            requests.insert(name.to_owned(), limit);
            changed = true;
        }
        if requests.is_empty() {
            resources.requests = None;
        }
    }
    if resources == &Default::default() {
        c.resources = None;
    }
    Ok(changed)
}

/// Converts the pod's resources for its priority class; `Ok(false)` when there is nothing to do.
pub fn convert(pod: &mut Pod) -> Result<bool, String> {
    let targets = match priority_class_with_default(pod) {
        PriorityClass::Batch => (BATCH_CPU, BATCH_MEMORY),
        PriorityClass::Mid => (MID_CPU, MID_MEMORY),
        _ => return Ok(false),
    };
    let Some(spec) = pod.spec.as_mut() else {
        return Ok(false);
    };
    let mut changed = false;
    for c in spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
    {
        changed |= convert_container(c, targets)?;
    }
    if let Some(overhead) = spec.overhead.as_mut() {
        changed |= convert_list(overhead, targets)?;
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: serde_json::Value, resources: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"labels": labels},
            "spec": {"containers": [{"name": "c", "resources": resources}],
                     "initContainers": [{"name": "i", "resources": {"limits": {"cpu": "500m"}}}],
                     "overhead": {"cpu": "100m", "memory": "64Mi"}}}))
        .unwrap()
    }

    #[test]
    fn batch_pods_get_batch_resources() {
        let mut p = pod(
            json!({"koordinator.sh/priority-class": "koord-batch"}),
            json!({"requests": {"cpu": "1", "memory": "4096Mi"}, "limits": {"cpu": "2", "memory": "4Gi"}}),
        );
        assert_eq!(convert(&mut p), Ok(true));
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(
            v["spec"]["containers"][0]["resources"],
            json!({
            "requests": {"kubernetes.io/batch-cpu": "1k", "kubernetes.io/batch-memory": "4Gi"},
            "limits": {"kubernetes.io/batch-cpu": "2k", "kubernetes.io/batch-memory": "4Gi"}})
        );
        // Limit only: the request follows it.
        assert_eq!(
            v["spec"]["initContainers"][0]["resources"],
            json!({
            "requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "500"}})
        );
        assert_eq!(
            v["spec"]["overhead"],
            json!({"kubernetes.io/batch-cpu": "100", "kubernetes.io/batch-memory": "64Mi"})
        );
    }

    #[test]
    fn cpu_too_large_to_convert_is_an_error_not_a_wrapped_value() {
        // 1e34 cores fit a quantity, but not once expressed in milli-cores of batch-cpu.
        let mut p = pod(
            json!({"koordinator.sh/priority-class": "koord-batch"}),
            json!({"requests": {"cpu": "1e34"}}),
        );
        let err = convert(&mut p).unwrap_err();
        assert!(
            err.contains("\"1e34\" is too large to be expressed as kubernetes.io/batch-cpu"),
            "{err}"
        );
    }

    #[test]
    fn mid_prod_and_free() {
        let mut p = pod(
            json!({"koordinator.sh/priority-class": "koord-mid"}),
            json!({"requests": {"cpu": "250m"}}),
        );
        assert_eq!(convert(&mut p), Ok(true));
        assert_eq!(
            serde_json::to_value(&p).unwrap()["spec"]["containers"][0]["resources"]["requests"],
            json!({"kubernetes.io/mid-cpu": "250"})
        );
        for class in ["koord-prod", "koord-free"] {
            let mut p = pod(
                json!({"koordinator.sh/priority-class": class}),
                json!({"requests": {"cpu": "1"}}),
            );
            let before = p.clone();
            assert_eq!(convert(&mut p), Ok(false));
            assert_eq!(p, before);
        }
        // No class and no QoS label: a BestEffort-looking pod converts as batch.
        let mut p: Pod =
            serde_json::from_value(json!({"spec": {"containers": [{"name": "c"}]}})).unwrap();
        assert_eq!(convert(&mut p), Ok(false), "nothing to move");
    }
}

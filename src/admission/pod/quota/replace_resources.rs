//! The replace-resources transformer (annotation `pod.koordinator.sh/replace-resources`, format
//! `from:to,from2:to2,erase:`), applied before quota evaluation when its gates are on.

use std::collections::BTreeMap;

use crate::admission::pod::object::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::resources::Qty;

pub const REPLACE_RESOURCES: &str = "pod.koordinator.sh/replace-resources";

/// Parsed `from:to` pairs; an empty `to` erases `from`.
fn rules(annotation: &str) -> Vec<(&str, &str)> {
    annotation
        .split(',')
        .filter_map(|pair| pair.split_once(':'))
        .map(|(from, to)| (from.trim(), to.trim()))
        .filter(|(from, _)| !from.is_empty())
        .collect()
}

fn transform(list: &mut BTreeMap<String, Quantity>, rules: &[(&str, &str)]) {
    for (from, to) in rules {
        let Some(value) = list.get(*from).cloned() else {
            continue;
        };
        if to.is_empty() {
            list.remove(*from);
        } else if !list.contains_key(*to) {
            list.remove(*from);
            // A renamed cpu becomes an integer count of milli-cores (2 -> 2000, written 2k).
            let value = match (*from, value.0.parse::<Qty>()) {
                ("cpu", Ok(q)) => {
                    Qty::from_milli(q.milli() * 1000, crate::resources::Format::DecimalSI)
                        .to_quantity()
                }
                _ => value,
            };
            list.insert((*to).to_owned(), value);
        }
    }
}

fn transform_container(container: &mut Container, rules: &[(&str, &str)]) {
    if let Some(resources) = container.resources.as_mut() {
        for list in [resources.requests.as_mut(), resources.limits.as_mut()]
            .into_iter()
            .flatten()
        {
            transform(list, rules);
        }
    }
}

/// The pod as the transformer leaves it; unchanged without the annotation.
pub fn apply(pod: &Pod) -> Pod {
    let Some(annotation) = crate::apis::meta::annotation(pod, REPLACE_RESOURCES) else {
        return pod.clone();
    };
    let rules = rules(annotation);
    let mut pod = pod.clone();
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers
            .iter_mut()
            .for_each(|c| transform_container(c, &rules));
        spec.init_containers
            .iter_mut()
            .flatten()
            .for_each(|c| transform_container(c, &rules));
        if let Some(overhead) = spec.overhead.as_mut() {
            transform(overhead, &rules);
        }
    }
    pod
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renames_erases_and_converts_cpu() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"annotations": {REPLACE_RESOURCES: "cpu:kubernetes.io/batch-cpu,memory:,gpu:nvidia.com/gpu"}},
            "spec": {"containers": [
                {"name": "a", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "4"}}},
                {"name": "b", "resources": {"requests": {"gpu": "1", "nvidia.com/gpu": "2"}}}
            ]}
        }))
        .unwrap();
        let out = apply(&pod);
        let spec = out.spec.unwrap();
        let a = spec.containers[0].resources.clone().unwrap();
        assert_eq!(
            a.requests.unwrap(),
            BTreeMap::from([("kubernetes.io/batch-cpu".to_owned(), Quantity("2k".into()))])
        );
        assert_eq!(
            a.limits.unwrap()["kubernetes.io/batch-cpu"],
            Quantity("4k".into())
        );
        let b = spec.containers[1]
            .resources
            .clone()
            .unwrap()
            .requests
            .unwrap();
        assert_eq!(
            b["gpu"],
            Quantity("1".into()),
            "not renamed onto an existing name"
        );
    }
}

//! The pod as /mutate-pod and /validate-pod decode it: the fields the pod plugins read and write are
//! typed, every other field of a pod, its spec, its containers and its status is kept as its JSON
//! text and never parsed (`admission/open_object.rs`). A large pod's env, args, probes, mounts and
//! volumes are most of its bytes and, decoded, most of a review's time (`just bench`: decoding them
//! whole took the 4 KiB pod review from 24 to 38 us, the 15 KiB one from 68 to 138 us).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

pub use crate::admission::open_object::Meta as PodMeta;
use crate::admission::open_object::{open_object, slim_resource};

open_object! {
    pub struct Pod {
        #[doc = "Decoded without `managedFields`."]
        metadata: PodMeta = "metadata",
        spec: Option<PodSpec> = "spec",
        status: Option<PodStatus> = "status",
    }
}

open_object! {
    pub struct PodSpec {
        affinity: Option<Affinity> = "affinity",
        containers: Vec<Container> = "containers",
        init_containers: Option<Vec<Container>> = "initContainers",
        node_selector: Option<BTreeMap<String, String>> = "nodeSelector",
        overhead: Option<BTreeMap<String, Quantity>> = "overhead",
        preemption_policy: Option<String> = "preemptionPolicy",
        priority: Option<i32> = "priority",
        priority_class_name: Option<String> = "priorityClassName",
        scheduler_name: Option<String> = "schedulerName",
    }
}

open_object! {
    pub struct Container {
        name: String = "name",
        resources: Option<ResourceRequirements> = "resources",
        restart_policy: Option<String> = "restartPolicy",
    }
}

open_object! {
    pub struct PodStatus {
        phase: Option<String> = "phase",
        qos_class: Option<String> = "qosClass",
    }
}

slim_resource!(Pod, NamespaceResourceScope, group "", version "v1", kind "Pod", plural "pods");

/// The pod's namespace, or the request's when the object has none (a pod created through a
/// controller often leaves it empty: the API server fills it in after admission).
pub fn pod_namespace<'a>(pod: &'a Pod, request_namespace: Option<&'a str>) -> &'a str {
    pod.metadata
        .namespace
        .as_deref()
        .filter(|ns| !ns.is_empty())
        .or(request_namespace)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod() -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"app": "a"},
                "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
            "spec": {"containers": [{"name": "c", "image": "i",
                    "env": [{"name": "X", "value": "\"quoted\" \u{e9}"}],
                    "resources": {"requests": {"cpu": "1"}}}],
                "volumes": [{"name": "v", "emptyDir": {}}], "priority": 5, "schedulerName": null},
            "status": {"phase": "Pending", "conditions": []}})
    }

    #[test]
    fn keeps_every_field_but_managed_fields_as_it_came() {
        let text = pod().to_string();
        let decoded: Pod = serde_json::from_str(&text).unwrap();
        let spec = decoded.spec.as_ref().unwrap();
        assert_eq!(spec.priority, Some(5));
        assert_eq!(spec.containers[0].name, "c");
        assert_eq!(decoded.metadata.name.as_deref(), Some("p"));
        let mut expected = pod();
        expected["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        expected["spec"]
            .as_object_mut()
            .unwrap()
            .remove("schedulerName");
        assert_eq!(serde_json::to_value(&decoded).unwrap(), expected);
        // From a Value too (a colocation profile's patch goes through one).
        let again: Pod = serde_json::from_value(serde_json::to_value(&decoded).unwrap()).unwrap();
        assert_eq!(again, decoded);
    }

    #[test]
    fn undecoded_fields_compare_by_their_text() {
        let a: Pod = serde_json::from_value(pod()).unwrap();
        let mut other = pod();
        other["spec"]["containers"][0]["env"][0]["value"] = json!("Y");
        let b: Pod = serde_json::from_value(other).unwrap();
        assert_ne!(a, b);
        assert_eq!(a, a.clone());
    }

    #[test]
    fn a_typed_field_of_the_wrong_type_is_an_error() {
        let mut bad = pod();
        bad["spec"]["containers"] = json!("not a list");
        let err = serde_json::from_value::<Pod>(bad).unwrap_err().to_string();
        assert!(err.contains("invalid type"), "{err}");
    }
}

//! The part of a Node the node plugins read and write: metadata, and the capacity and allocatable
//! of its status. Decoding skips everything else, so a node's image list (often tens of KiB, sent
//! twice per status update) is never built, and the patch can only touch these fields.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::admission::open_object::slim_resource;

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct Node {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<NodeStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct NodeStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocatable: Option<BTreeMap<String, Quantity>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<BTreeMap<String, Quantity>>,
}

slim_resource!(Node, ClusterResourceScope, group "", version "v1", kind "Node", plural "nodes");

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keeps_what_the_plugins_read_and_drops_the_rest() {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n", "labels": {"a": "b"}},
            "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "7"},
                       "images": [{"names": ["x"], "sizeBytes": 1}]}
        }))
        .unwrap();
        assert_eq!(
            serde_json::to_value(&node).unwrap(),
            json!({"metadata": {"name": "n", "labels": {"a": "b"}},
                   "status": {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "7"}}})
        );
    }
}

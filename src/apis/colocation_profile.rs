//! ClusterColocationProfile (`config.koordinator.sh/v1alpha1`): what /mutate-pod applies to matching pods.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "config.koordinator.sh",
    version = "v1alpha1",
    kind = "ClusterColocationProfile",
    plural = "clustercolocationprofiles",
    status = "ClusterColocationProfileStatus",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterColocationProfileSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Percentage (int or "N%") of matching pods the profile applies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probability: Option<IntOrString>,
    /// Koordinator writes these two even when empty; so do we.
    #[serde(default)]
    pub qos_class: QosClassOrEmpty,
    #[serde(default)]
    pub priority_class_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub koordinator_priority: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_keys_mapping: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotation_keys_mapping: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_suffixes: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// A strategic merge patch applied to matching pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::optional_preserve_unknown_object")]
    pub patch: Option<serde_json::Value>,
}

/// Koordinator QoS class, or empty for "not set".
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum QosClassOrEmpty {
    #[serde(rename = "LSE")]
    Lse,
    #[serde(rename = "LSR")]
    Lsr,
    #[serde(rename = "LS")]
    Ls,
    #[serde(rename = "BE")]
    Be,
    #[serde(rename = "SYSTEM")]
    System,
    #[default]
    #[serde(rename = "")]
    None,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ClusterColocationProfileStatus {}

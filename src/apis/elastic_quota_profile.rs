//! ElasticQuotaProfile (`quota.koordinator.sh/v1alpha1`): binds a quota tree to a set of nodes.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "quota.koordinator.sh",
    version = "v1alpha1",
    kind = "ElasticQuotaProfile",
    plural = "elasticquotaprofiles",
    shortname = "eqp",
    namespaced,
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct ElasticQuotaProfileSpec {
    pub quota_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_ratio: Option<String>,
    pub node_selector: LabelSelector,
}

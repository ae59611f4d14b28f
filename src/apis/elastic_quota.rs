//! ElasticQuota (`scheduling.sigs.k8s.io/v1alpha1`): a node of the quota tree.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A resource name to quantity map, as Kubernetes' `ResourceList`.
pub type ResourceList = BTreeMap<String, Quantity>;

#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "scheduling.sigs.k8s.io",
    version = "v1alpha1",
    kind = "ElasticQuota",
    plural = "elasticquotas",
    shortname = "eq",
    namespaced,
    // scheduling.sigs.k8s.io is a protected group; this is the approval the upstream CRD carries.
    annotation(
        "api-approved.kubernetes.io",
        "https://github.com/kubernetes-sigs/scheduler-plugins/pull/52"
    ),
    status = "ElasticQuotaStatus",
    derive = "PartialEq",
    derive = "Default"
)]
pub struct ElasticQuotaSpec {
    /// Guaranteed resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<ResourceList>,
    /// Upper limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<ResourceList>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ElasticQuotaStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<ResourceList>,
}

//! Reservation (`scheduling.koordinator.sh/v1alpha1`): resources held on a node for future owners.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectReference, PodTemplateSpec, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::open_enum::open_enum;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "scheduling.koordinator.sh",
    version = "v1alpha1",
    kind = "Reservation",
    plural = "reservations",
    status = "ReservationStatus",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.nodeName"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ReservationSpec {
    /// The pod the reservation stands for; stored as given.
    #[schemars(schema_with = "super::schema::preserve_unknown_object")]
    pub template: Option<PodTemplateSpec>,
    #[schemars(length(min = 1))]
    pub owners: Vec<ReservationOwner>,
    #[serde(default = "default_ttl", skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_allocation: Option<bool>,
    #[serde(default = "default_true", skip_serializing_if = "Option::is_none")]
    pub allocate_once: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocate_policy: Option<AllocatePolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unschedulable: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taints: Option<Vec<Taint>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_allocation_policy: Option<PreAllocationPolicy>,
}

fn default_ttl() -> Option<String> {
    Some("24h".to_owned())
}

fn default_true() -> Option<bool> {
    Some(true)
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct ReservationOwner {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<ObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<ReservationControllerReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReservationControllerReference {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_owner_deletion: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AllocatePolicy {
    #[serde(rename = "")]
    Default,
    Aligned,
    Restricted,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreAllocationPolicy {
    #[serde(default = "default_mode")]
    pub mode: PreAllocationMode,
    #[serde(default)]
    pub enable_multiple: bool,
}

fn default_mode() -> PreAllocationMode {
    PreAllocationMode::Default
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PreAllocationMode {
    #[default]
    Default,
    Cluster,
}

open_enum! {
    /// Written by koord-scheduler: open, a newer one may add phases.
    pub enum ReservationPhase {
        Pending = "Pending",
        Available = "Available",
        Succeeded = "Succeeded",
        Waiting = "Waiting",
        Failed = "Failed",
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReservationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ReservationPhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<ReservationCondition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_owners: Option<Vec<ObjectReference>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocatable: Option<BTreeMap<String, Quantity>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<BTreeMap<String, Quantity>>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReservationCondition {
    #[serde(rename = "type")]
    pub type_: ConditionType,
    pub status: ConditionStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

open_enum! {
    #[derive(Default)]
    pub enum ConditionType {
        #[default]
        Scheduled = "Scheduled",
        Ready = "Ready",
    }
}

open_enum! {
    #[derive(Default)]
    pub enum ConditionStatus {
        True = "True",
        False = "False",
        #[default]
        Unknown = "Unknown",
    }
}

//! `GET /debug/elastic-quota`: the quota tree as the webhooks see it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::apis::elastic_quota::ResourceList;
use crate::cache::QuotaTopology;

#[derive(Serialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QuotaInfoView {
    pub name: String,
    pub parent_name: String,
    pub is_parent: bool,
    pub allow_lent_resource: bool,
    pub max: ResourceList,
    pub min: ResourceList,
}

#[derive(Serialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QuotaTreeView {
    pub quota_info_map: BTreeMap<String, QuotaInfoView>,
    pub quota_hierarchy_info: BTreeMap<String, Vec<String>>,
}

pub fn quota_tree(topology: &QuotaTopology) -> QuotaTreeView {
    QuotaTreeView {
        quota_info_map: topology
            .infos()
            .map(|info| {
                let view = QuotaInfoView {
                    name: info.name.clone(),
                    parent_name: info.parent.clone(),
                    is_parent: info.is_parent,
                    allow_lent_resource: info.allow_lent_resource,
                    max: info.max.to_quantities(),
                    min: info.min.to_quantities(),
                };
                (info.name.clone(), view)
            })
            .collect(),
        quota_hierarchy_info: topology
            .hierarchy()
            .iter()
            .map(|(parent, children)| (parent.clone(), children.iter().cloned().collect()))
            .collect(),
    }
}

//! `GET /debug/elastic-quota`: the quota tree as the webhooks see it (spec 0.1).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::apis::elastic_quota::ResourceList;
use crate::apis::keys::{QUOTA_ALLOW_LENT_RESOURCE, QUOTA_IS_PARENT, QUOTA_PARENT, ROOT_QUOTA};
use crate::cache::Cache;

#[derive(Serialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QuotaInfo {
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
    pub quota_info_map: BTreeMap<String, QuotaInfo>,
    pub quota_hierarchy_info: BTreeMap<String, Vec<String>>,
}

/// Builds the view from the cached quotas: every quota has a (possibly empty) child list, children
/// sorted by name.
pub fn quota_tree(cache: &Cache) -> QuotaTreeView {
    let mut info = BTreeMap::new();
    let mut hierarchy: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for quota in cache.elastic_quotas.state() {
        let Some(name) = quota.metadata.name.clone() else {
            continue;
        };
        let label = |k: &str| {
            quota
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(k))
                .cloned()
        };
        let parent = label(QUOTA_PARENT)
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| ROOT_QUOTA.to_owned());
        hierarchy.entry(name.clone()).or_default();
        if parent != name {
            hierarchy
                .entry(parent.clone())
                .or_default()
                .push(name.clone());
        }
        info.insert(
            name.clone(),
            QuotaInfo {
                name,
                parent_name: parent,
                is_parent: label(QUOTA_IS_PARENT).as_deref() == Some("true"),
                allow_lent_resource: label(QUOTA_ALLOW_LENT_RESOURCE).as_deref() != Some("false"),
                max: quota.spec.max.clone().unwrap_or_default(),
                min: quota.spec.min.clone().unwrap_or_default(),
            },
        );
    }
    for children in hierarchy.values_mut() {
        children.sort();
    }
    QuotaTreeView {
        quota_info_map: info,
        quota_hierarchy_info: hierarchy,
    }
}

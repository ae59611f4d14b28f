//! A pod and its ElasticQuota: which quota a pod belongs to, the topology check of /validate-pod
//! (`topology_check.rs`), and quota evaluation (`evaluation.rs` the plugin, `evaluator.rs` the
//! coalescing per-quota queue and the `child-request` record; it reads and writes quotas through
//! `admission::ports::QuotaStore`).

pub mod evaluation;
pub mod evaluator;
pub mod recent;
mod replace_resources;
pub mod topology_check;

use crate::admission::pod::object::Pod;

use crate::apis::keys::{DEFAULT_QUOTA, QUOTA_NAME};
use crate::cache::Cache;
use crate::features::{FeatureGates, Gate};

pub use super::object::pod_namespace;

pub fn resolve_quota_name(
    pod: &Pod,
    namespace: &str,
    cache: &Cache,
    gates: &FeatureGates,
) -> String {
    resolve_quota_name_of(
        crate::apis::meta::label(pod, QUOTA_NAME),
        namespace,
        cache,
        gates,
    )
}

/// [`resolve_quota_name`] from the pod's quota label alone (what the pod index keeps).
pub fn resolve_quota_name_of(
    label: Option<&str>,
    namespace: &str,
    cache: &Cache,
    gates: &FeatureGates,
) -> String {
    let label = label.unwrap_or_default().to_owned();
    if gates.enabled(Gate::DisableDefaultQuota) || !label.is_empty() {
        return label;
    }
    if cache
        .elastic_quotas
        .get(Some(namespace), namespace)
        .is_some()
    {
        return namespace.to_owned();
    }
    if let Some(bound) = cache.topology().quota_for_namespace(namespace) {
        return bound.to_owned();
    }
    DEFAULT_QUOTA.to_owned()
}

//! Which quota a pod belongs to: its quota label, else its namespace's own quota, else the quota
//! binding its namespace, else the default quota (with `DisableDefaultQuota`: its label alone).

use crate::admission::pod::object::Pod;

use crate::apis::keys::{DEFAULT_QUOTA, QUOTA_NAME};
use crate::cache::Cache;
use crate::features::{FeatureGates, Gate};

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

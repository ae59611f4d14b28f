//! Spec 7.4: which quota a pod belongs to.

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;

use crate::apis::ElasticQuota;
use crate::apis::keys::{DEFAULT_QUOTA, QUOTA_NAME};
use crate::cache::Cache;
use crate::features::{FeatureGates, Gate};

/// The pod's namespace, or the request's when the object has none (spec 0.1).
pub fn pod_namespace<'a>(pod: &'a Pod, request_namespace: Option<&'a str>) -> &'a str {
    pod.metadata
        .namespace
        .as_deref()
        .filter(|ns| !ns.is_empty())
        .or(request_namespace)
        .unwrap_or_default()
}

pub fn resolve_quota_name(
    pod: &Pod,
    namespace: &str,
    cache: &Cache,
    gates: &FeatureGates,
) -> String {
    let label = crate::apis::meta::label(pod, QUOTA_NAME)
        .unwrap_or_default()
        .to_owned();
    if gates.enabled(Gate::DisableDefaultQuota) || !label.is_empty() {
        return label;
    }
    if cache
        .elastic_quotas
        .get(&ObjectRef::<ElasticQuota>::new(namespace).within(namespace))
        .is_some()
    {
        return namespace.to_owned();
    }
    if let Some(bound) = cache.topology().quota_for_namespace(namespace) {
        return bound.to_owned();
    }
    DEFAULT_QUOTA.to_owned()
}

//! /mutate-pod and /validate-pod plugins, in chain order.

mod batch_resources;
mod colocation_profile;
mod colocation_rules;
mod device_resources;
mod device_validation;
mod enhanced_validator;
mod extended_resource_spec;
mod forbidden_reserve_pod;
mod multi_quota_tree;
mod reservation_affinity;

use k8s_openapi::api::core::v1::Pod;

use super::chain::{Ctx, Mutator, Validator};
use super::elastic_quota::pod_evaluation::QuotaEvaluation;
use super::elastic_quota::pod_topology_check::PodQuotaTopologyCheck;
use super::skip_fields::SkipFields;

pub fn mutators() -> Vec<Box<dyn Mutator<Pod>>> {
    vec![
        Box::new(colocation_profile::ApplyColocationProfiles),
        Box::new(extended_resource_spec::ExtendedResourceSpecAnnotation),
        Box::new(multi_quota_tree::MultiQuotaTreeAffinity),
        Box::new(device_resources::NormaliseDeviceResources),
    ]
}

pub fn validators() -> Vec<Box<dyn Validator<Pod>>> {
    vec![
        Box::new(forbidden_reserve_pod::ForbiddenReservePod),
        Box::new(colocation_rules::ColocationRules),
        Box::new(PodQuotaTopologyCheck),
        Box::new(device_validation::DeviceResourceRules),
        Box::new(enhanced_validator::EnhancedValidator::default()),
        Box::new(reservation_affinity::ReservationAffinity),
        // Last: it records the pod's requests on the quota, so a pod another rule denies must
        // never reach it.
        Box::new(QuotaEvaluation::default()),
    ]
}

/// Fields no plugin above reads or writes, left out when /validate-pod and /mutate-pod decode a pod:
/// a large pod's env, args, probes and mounts are most of its decoding time. A plugin that comes to
/// read or write one of them takes it off this list (the tests decode pods with and without it).
/// A colocation profile's patch may edit any field: while one exists, /mutate-pod decodes pods whole.
pub static UNTOUCHED_BY_PLUGINS: SkipFields = SkipFields(&[
    (
        "Container",
        &[
            "args",
            "command",
            "env",
            "envFrom",
            "lifecycle",
            "livenessProbe",
            "ports",
            "readinessProbe",
            "startupProbe",
            "volumeDevices",
            "volumeMounts",
            "workingDir",
        ],
    ),
    ("PodSpec", &["volumes"]),
    ("ObjectMeta", &["managedFields"]),
]);

/// The pod's namespace, or the request's when the object has none (spec 1.1 and 0.1).
pub fn namespace_of<T: kube::Resource>(ctx: &Ctx<'_, T>, pod: &Pod) -> String {
    pod.metadata
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| ctx.request.namespace.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;

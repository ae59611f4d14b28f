//! /mutate-pod and /validate-pod plugins, in chain order. What each rule does and the message a
//! user reads: docs/admission.md.

mod batch_resources;
mod colocation_profile;
mod colocation_rules;
mod device_resources;
mod device_validation;
mod enhanced_validator;
mod extended_resource_spec;
mod forbidden_reserve_pod;
mod multi_quota_tree;
pub mod object;
mod priority;
pub mod quota;
mod requests;
mod reservation_affinity;

use super::chain::{Mutator, Validator};
use object::Pod;
use quota::evaluation::QuotaEvaluation;
use quota::topology_check::PodQuotaTopologyCheck;

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

#[cfg(test)]
mod tests;

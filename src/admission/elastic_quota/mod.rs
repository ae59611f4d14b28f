//! ElasticQuota: the defaults of the mutating webhook, the tree rules of the validating one, and the
//! `/debug/elastic-quota` view. Rules and messages: docs/admission.md.

pub mod debug;
mod defaults;
pub mod ledger;
mod overlay;
mod own_annotations;
mod self_checks;
pub mod tree_checks;
mod validate;

#[cfg(test)]
mod tests;

use super::chain::{Mutator, Validator};
use crate::apis::ElasticQuota;

pub fn mutators() -> Vec<Box<dyn Mutator<ElasticQuota>>> {
    vec![Box::new(defaults::FillQuotaDefaults)]
}

pub fn validators() -> Vec<Box<dyn Validator<ElasticQuota>>> {
    vec![
        Box::new(own_annotations::OwnAnnotations),
        Box::new(validate::QuotaTreeRules::default()),
        // Last: only an allowed change widens the pod entries.
        Box::new(crate::admission::pod_reach_guard::GuardPodReach),
    ]
}

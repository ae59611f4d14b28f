//! Which requests an entry needs: the `matchConditions` the operator writes so that the API server
//! calls koord-webhook only when the answer can differ from "allowed, unchanged" (docs/narrowing.md).
//!
//! Each entry of the webhook table (`webhooks.rs`) names its `Narrowing`; `Narrowing::calls` here
//! turns it into the conditions, written from the rules of that entry's endpoint (docs/admission.md).
//! A condition may be wider than its rules (an extra call costs a little), never narrower (a missed
//! call changes an answer): the property test in `tests.rs` evaluates these very expressions against random
//! requests and checks that every skipped one would have been allowed unchanged.

pub mod cel;
mod elastic_quota;
mod node;
pub mod pod;
pub mod record;
#[cfg(test)]
mod tests;

use k8s_openapi::api::admissionregistration::v1::MatchCondition;

use crate::admission::webhooks::Narrowing;
use crate::features::FeatureGates;
use pod::{PodEntry, PodReach};

/// What an entry is called for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Calls {
    /// Every request its rules and selectors match.
    All,
    /// Only requests meeting every condition (the API server ANDs them).
    When(Vec<Condition>),
    /// None: the entry is left out.
    Never,
}

/// One named CEL expression; a request is sent when it is true.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Condition {
    pub name: &'static str,
    pub expression: String,
}

impl Condition {
    pub fn to_match_condition(&self) -> MatchCondition {
        MatchCondition {
            name: self.name.to_owned(),
            expression: self.expression.clone(),
        }
    }
}

impl Narrowing {
    /// The calls of an entry when narrowed, under these gates and with this cluster's pod reach
    /// (the manifests know no cluster: [`PodReach::default`], every pod).
    pub fn calls(self, gates: &FeatureGates, pods: &PodReach) -> Calls {
        match self {
            Narrowing::PodCreate => pod::calls(PodEntry::Create, gates, &pods.create),
            Narrowing::PodValidation => pod::calls(PodEntry::Validate, gates, &pods.validate),
            Narrowing::PodReachGuard => Calls::All,
            Narrowing::Wide => Calls::All,
            Narrowing::Never => Calls::Never,
            Narrowing::NodeStatus => Calls::When(vec![node::status_condition()]),
            Narrowing::NodeValidation => Calls::When(vec![node::validation_condition()]),
            Narrowing::ElasticQuotaChange => {
                Calls::When(vec![elastic_quota::validation_condition()])
            }
        }
    }
}

impl Narrowing {
    /// The calls of an entry when calls are not narrowed (`--narrow-calls=off`).
    pub fn calls_wide(self) -> Calls {
        match self {
            Narrowing::PodReachGuard => Calls::Never,
            _ => Calls::All,
        }
    }
}

impl Calls {
    /// The entry's `matchConditions` (`None` when it is sent every request).
    pub fn match_conditions(&self) -> Option<Vec<MatchCondition>> {
        match self {
            Calls::When(conditions) => Some(
                conditions
                    .iter()
                    .map(Condition::to_match_condition)
                    .collect(),
            ),
            Calls::All | Calls::Never => None,
        }
    }
}

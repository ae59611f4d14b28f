//! Which requests an entry needs: the `matchConditions` the operator writes so that the API server
//! calls koord-webhook only when the answer can differ from "allowed, unchanged" (docs/narrowing.md).
//!
//! Each entry of the endpoint table (`entries/mod.rs`, `ENDPOINTS`) names its `Narrowing`; `Narrowing::calls` here
//! turns it into the conditions, written from the rules of that entry's endpoint (docs/admission.md).
//! A condition may be wider than its rules (an extra call costs a little), never narrower (a missed
//! call changes an answer): the property test in `tests.rs` evaluates these very expressions against random
//! requests and checks that every skipped one would have been allowed unchanged.

mod calls;
pub mod cel;
mod elastic_quota;
mod node;
pub mod pod;
pub mod record;
#[cfg(test)]
mod tests;

use crate::entries::Narrowing;
use crate::features::FeatureGates;
pub use calls::{Calls, Condition};
use pod::{PodEntry, PodReach};

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

//! /mutate-node-status (resource amplification) and /validate-node plugins, in chain order. Rules
//! and messages: docs/admission.md.

mod amplification;
mod amplification_bounds;
pub mod object;
mod slo_conflict;

pub use object::Node;

use super::chain::{Mutator, Validator};

pub fn status_mutators() -> Vec<Box<dyn Mutator<Node>>> {
    vec![Box::new(amplification::AmplifyNodeResources)]
}

pub fn validators() -> Vec<Box<dyn Validator<Node>>> {
    vec![
        Box::new(slo_conflict::SloConfigConflict),
        Box::new(amplification_bounds::AmplificationBounds),
    ]
}

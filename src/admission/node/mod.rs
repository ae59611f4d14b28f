//! /mutate-node-status (resource amplification) and /validate-node plugins.

use k8s_openapi::api::core::v1::Node;

use super::chain::{Mutator, Validator};

pub fn status_mutators() -> Vec<Box<dyn Mutator<Node>>> {
    vec![]
}

pub fn validators() -> Vec<Box<dyn Validator<Node>>> {
    vec![]
}

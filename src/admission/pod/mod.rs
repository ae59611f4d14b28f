//! /mutate-pod and /validate-pod plugins, in chain order.

mod forbidden_reserve_pod;

use k8s_openapi::api::core::v1::Pod;

use super::chain::{Mutator, Validator};

pub fn mutators() -> Vec<Box<dyn Mutator<Pod>>> {
    vec![]
}

pub fn validators() -> Vec<Box<dyn Validator<Pod>>> {
    vec![Box::new(forbidden_reserve_pod::ForbiddenReservePod)]
}

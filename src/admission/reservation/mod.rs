//! /mutate-reservation plugins.

mod colocation_profile;
pub(crate) mod object;
mod ttl_limit;

use super::chain::Mutator;
use object::Reservation;

pub fn mutators() -> Vec<Box<dyn Mutator<Reservation>>> {
    vec![
        Box::new(colocation_profile::ApplyColocationProfiles),
        Box::new(ttl_limit::TtlLimit),
    ]
}

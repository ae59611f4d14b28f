//! /mutate-reservation plugins.

mod colocation_profile;

use super::chain::Mutator;
use crate::apis::Reservation;

pub fn mutators() -> Vec<Box<dyn Mutator<Reservation>>> {
    vec![Box::new(colocation_profile::ApplyColocationProfiles)]
}

//! /mutate-reservation plugins.

use super::chain::Mutator;
use crate::apis::Reservation;

pub fn mutators() -> Vec<Box<dyn Mutator<Reservation>>> {
    vec![]
}

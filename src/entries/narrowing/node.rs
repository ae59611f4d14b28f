//! Node entries. `/mutate-node-status` (`node/amplification.rs`) changes a status update only when
//! the node carries the ratios or a recorded raw value; `/validate-node` can deny a create only
//! through the ratios (`node/amplification_bounds.rs`; the SLO conflict is only logged on CREATE),
//! and an update only when the labels change (`node/slo_conflict.rs`) or the ratios are set to a
//! new value.

use super::calls::Condition;
use super::cel::{Meta, Var, any, has_any_key, has_key, key_changed, map_changed};
use crate::apis::keys::{AMPLIFICATION_RATIO, RAW_ALLOCATABLE, RAW_CAPACITY};

pub fn status_condition() -> Condition {
    // With the ratios gone the recorded raw values are removed, so their presence counts too.
    // raw-capacity is read only with AmplifyNodeCapacity; counted always (wider, never narrower).
    let marked = has_any_key(
        Var::Object,
        Meta::Annotations,
        &[AMPLIFICATION_RATIO, RAW_ALLOCATABLE, RAW_CAPACITY],
    );
    Condition {
        name: "koord-amplified-node",
        expression: format!("request.operation == 'UPDATE' && {marked}"),
    }
}

pub fn validation_condition() -> Condition {
    let ratios = has_key(Var::Object, Meta::Annotations, AMPLIFICATION_RATIO);
    let update = any(&[
        map_changed(Meta::Labels),
        format!(
            "({ratios} && {})",
            key_changed(Meta::Annotations, AMPLIFICATION_RATIO)
        ),
    ]);
    Condition {
        name: "koord-node-rules",
        expression: format!("request.operation == 'UPDATE' ? {update} : {ratios}"),
    }
}

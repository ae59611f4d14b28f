//! Matching ClusterColocationProfiles applied to a new Reservation: its own labels select the
//! profiles (namespace selectors do not apply to a cluster-scoped object), metadata edits land on the
//! Reservation, scheduler and priority on its pod template, and the patch on the whole object.
//! No resource conversion.

use kube::core::admission::Operation;

use super::object::Reservation;
use crate::admission::chain::{Ctx, Mutator, Step};
use crate::admission::colocation::{self, apply_metadata, draw, priority_class};
use crate::admission::outcome::{PluginResult, Rejection};
use crate::memory::metered::{read_within, to_value_within};
use crate::resources::strategic_merge;
use crate::resources::strategic_merge::RESERVATION_KEYS;

pub struct ApplyColocationProfiles;

impl Mutator<Reservation> for ApplyColocationProfiles {
    fn name(&self) -> &'static str {
        "ClusterColocationProfile"
    }

    fn mutate<'a>(&'a self, ctx: &'a Ctx<'a, Reservation>, r: &'a mut Reservation) -> Step<'a> {
        if !matches!(ctx.operation(), Operation::Create) {
            return Ok(()).into();
        }
        apply(ctx, r).into()
    }
}

fn apply(ctx: &Ctx<'_, Reservation>, reservation: &mut Reservation) -> PluginResult {
    let labels = reservation.metadata.labels.clone().unwrap_or_default();
    for profile in colocation::matching_profiles(ctx.cache, &labels, None) {
        let spec = &profile.spec;
        if !draw(spec, ctx.services.dice()).map_err(Rejection::internal)? {
            continue;
        }
        apply_metadata(&mut reservation.metadata, spec);
        if let Some(template) = reservation.spec.as_mut().and_then(|s| s.template.as_mut()) {
            let pod_spec = template.spec.get_or_insert_with(Default::default);
            if let Some(scheduler) = spec.scheduler_name.as_ref().filter(|s| !s.is_empty()) {
                pod_spec.scheduler_name = Some(scheduler.clone());
            }
            if !spec.priority_class_name.is_empty() {
                let (value, preemption) = priority_class(ctx.cache, &spec.priority_class_name)
                    .map_err(Rejection::internal)?;
                pod_spec.priority_class_name = Some(spec.priority_class_name.clone());
                pod_spec.priority = Some(value);
                pod_spec.preemption_policy = preemption;
            }
        }
        if let Some(patch) = &spec.patch {
            apply_profile_patch(reservation, patch).map_err(Rejection::internal)?;
        }
    }
    Ok(())
}

/// The profile's patch on the Reservation as Koordinator applies it: merged, then read back into
/// the Reservation type, which keeps only the fields that type has (a profile written for pods puts
/// `spec.containers` on it: dropped). The fields the full type knows are found by reading the merged
/// object through it (metered, as a review's decode is: the template is read whole here), and the
/// merged object keeps those and no others, as it came (the full type's defaults are not added).
fn apply_profile_patch(
    reservation: &mut Reservation,
    patch: &serde_json::Value,
) -> Result<(), String> {
    let original = to_value_within(&*reservation).map_err(|e| format!("the object: {e}"))?;
    let mut merged =
        strategic_merge::apply(&original, patch, &RESERVATION_KEYS).map_err(|e| e.to_string())?;
    let text = serde_json::to_vec(&merged).map_err(|e| e.to_string())?;
    let known: crate::apis::Reservation =
        read_within(&text).map_err(|e| format!("the patched Reservation: {e}"))?;
    let known = serde_json::to_value(known).map_err(|e| e.to_string())?;
    keep_known(&mut merged, &known);
    *reservation = serde_json::from_value(merged)
        .map_err(|e| format!("the patched object does not decode: {e}"))?;
    Ok(())
}

/// Drops from `value` every object member `known` does not have, at every depth.
fn keep_known(value: &mut serde_json::Value, known: &serde_json::Value) {
    use serde_json::Value;
    match (value, known) {
        (Value::Object(members), Value::Object(known)) => {
            members.retain(|key, _| known.contains_key(key));
            for (key, member) in members.iter_mut() {
                keep_known(member, &known[key]);
            }
        }
        (Value::Array(items), Value::Array(known)) => {
            for (item, known) in items.iter_mut().zip(known) {
                keep_known(item, known);
            }
        }
        _ => {}
    }
}

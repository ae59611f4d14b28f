//! Matching ClusterColocationProfiles applied to a new Reservation: its own labels select the
//! profiles (namespace selectors do not apply to a cluster-scoped object), metadata edits land on the
//! Reservation, scheduler and priority on its pod template, and the patch on the whole object.
//! No resource conversion.

use kube::core::admission::Operation;

use super::object::Reservation;
use crate::admission::chain::{Ctx, Mutator, Step};
use crate::admission::colocation::{self, apply_metadata, draw, priority_class};
use crate::admission::outcome::{PluginResult, Rejection};
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
            colocation::apply_patch(reservation, patch, &RESERVATION_KEYS)
                .map_err(Rejection::internal)?;
        }
    }
    Ok(())
}

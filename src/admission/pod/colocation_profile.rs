//! Matching ClusterColocationProfiles are applied to a new pod in name order, then its
//! cpu and memory become batch/mid resources when its priority class asks for them.

use crate::admission::pod::object::Pod;
use kube::core::admission::Operation;

use super::batch_resources;
use crate::admission::chain::{Ctx, Mutator, Step};
use crate::admission::colocation::{self, apply_metadata, draw, priority_class};
use crate::admission::outcome::{PluginResult, Rejection};
use crate::apis::keys::SKIP_UPDATE_RESOURCES;
use crate::features::Gate;
use crate::resources::strategic_merge::POD_KEYS;

pub struct ApplyColocationProfiles;

impl Mutator<Pod> for ApplyColocationProfiles {
    fn name(&self) -> &'static str {
        "ClusterColocationProfile"
    }

    fn mutate<'a>(&'a self, ctx: &'a Ctx<'a, Pod>, pod: &'a mut Pod) -> Step<'a> {
        if !matches!(ctx.operation(), Operation::Create) {
            return Ok(()).into();
        }
        apply(ctx, pod).into()
    }
}

fn apply(ctx: &Ctx<'_, Pod>, pod: &mut Pod) -> PluginResult {
    let namespace = super::object::pod_namespace(pod, ctx.request.namespace.as_deref());
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let profiles = colocation::matching_profiles(ctx.cache, &labels, Some(namespace));
    if profiles.is_empty() {
        return Ok(());
    }
    let mut skip_resources = ctx
        .gates
        .enabled(Gate::ColocationProfileSkipMutatingResources);
    for profile in &profiles {
        let spec = &profile.spec;
        let name = profile.metadata.name.as_deref().unwrap_or_default();
        // Recorded even when the draw then skips the profile.
        if profile
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(SKIP_UPDATE_RESOURCES))
        {
            skip_resources = true;
        }
        if !draw(spec, ctx.services.dice()).map_err(Rejection::internal)? {
            tracing::debug!(profile = name, "profile skipped by probability");
            continue;
        }
        apply_metadata(&mut pod.metadata, spec);
        let pod_spec = pod.spec.get_or_insert_with(Default::default);
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
        if let Some(patch) = &spec.patch {
            colocation::apply_patch(pod, patch, &POD_KEYS).map_err(|e| {
                Rejection::internal(format!("failed to apply the patch of profile {name}: {e}"))
            })?;
        }
    }
    if !skip_resources {
        batch_resources::convert(pod).map_err(Rejection::internal)?;
    }
    Ok(())
}

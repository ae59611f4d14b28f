//! A pod may not be bound to a parent quota, nor change its preemptible label.

use crate::admission::pod::object::Pod;
use kube::core::admission::Operation;

use super::resolve::resolve_quota_name;
use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::outcome::{PluginResult, Rejection};
use crate::admission::pod::object::pod_namespace;
use crate::apis::keys::DEFAULT_QUOTA;
use crate::features::Gate;

pub const QUOTA_PREEMPTIBLE: &str = "quota.scheduling.koordinator.sh/preemptible";

pub struct PodQuotaTopologyCheck;

impl Validator<Pod> for PodQuotaTopologyCheck {
    fn name(&self) -> &'static str {
        "ElasticQuotaPodTopology"
    }

    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, Pod>) -> Step<'a> {
        check(ctx).into()
    }
}

fn label<'a>(pod: &'a Pod, key: &str) -> &'a str {
    crate::apis::meta::label(pod, key).unwrap_or_default()
}

fn check(ctx: &Ctx<'_, Pod>) -> PluginResult {
    let Some(pod) = ctx.object() else {
        return Ok(());
    };
    match ctx.operation() {
        Operation::Create => {}
        Operation::Update => {
            let old = ctx
                .old_object()
                .map_or("", |old| label(old, QUOTA_PREEMPTIBLE));
            if old != label(pod, QUOTA_PREEMPTIBLE) {
                return Err(Rejection::invalid(
                    "Preemptible label is forbidden modify now.",
                ));
            }
        }
        _ => return Ok(()),
    }
    if ctx.gates.enabled(Gate::SupportParentQuotaSubmitPod) {
        return Ok(());
    }
    let namespace = pod_namespace(pod, ctx.request.namespace.as_deref());
    let quota = resolve_quota_name(pod, namespace, ctx.cache, ctx.gates);
    if quota.is_empty() || quota == DEFAULT_QUOTA {
        return Ok(());
    }
    if ctx
        .cache
        .topology()
        .get(&quota)
        .is_some_and(|q| q.is_parent)
    {
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        return Err(Rejection::invalid(format!(
            "pod can not be linked to a parentQuotaGroup,quota:{quota}, pod:{pod_name}"
        )));
    }
    Ok(())
}

//! A node whose labels change may not come to match two node strategies of one key of the
//! slo-controller ConfigMap. On CREATE the conflict is only logged, as Koordinator does.

use super::object::Node;
use crate::telemetry::{Clipped, MAX_LOGGED_MESSAGE, MAX_LOGGED_NAME};
use kube::core::admission::Operation;

use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::outcome::{PluginResult, Rejection};
use crate::slo_config;

pub struct SloConfigConflict;

impl Validator<Node> for SloConfigConflict {
    fn name(&self) -> &'static str {
        "NodeSLOConfigConflict"
    }

    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, Node>) -> Step<'a> {
        check(ctx).into()
    }
}

fn check(ctx: &Ctx<'_, Node>) -> PluginResult {
    let Some(node) = ctx.object() else {
        return Ok(());
    };
    let rejects = match ctx.operation() {
        Operation::Create => false,
        Operation::Update => {
            ctx.old_object().map(|o| &o.metadata.labels) != Some(&node.metadata.labels)
        }
        _ => return Ok(()),
    };
    if !rejects && !matches!(ctx.operation(), Operation::Create) {
        return Ok(());
    }
    let settings = ctx.settings;
    let Some(config_map) = ctx
        .cache
        .config_map(&settings.config_namespace, &settings.slo_config_name)
    else {
        return Ok(());
    };
    let Some(data) = config_map.data.as_ref() else {
        return Ok(());
    };
    let name = node.metadata.name.as_deref().unwrap_or(&ctx.request.name);
    let labels = node.metadata.labels.clone().unwrap_or_default();
    for (key, parsed) in slo_config::parse_leniently(data) {
        if let Some(conflict) = slo_config::node_conflict(key, &parsed, name, &labels) {
            if !rejects {
                tracing::warn!(
                    node = %Clipped(name, MAX_LOGGED_NAME),
                    conflict = %Clipped(&conflict.to_string(), MAX_LOGGED_MESSAGE),
                    "new node matches several node strategies"
                );
                return Ok(());
            }
            return Err(Rejection::invalid(conflict.to_string()));
        }
    }
    Ok(())
}

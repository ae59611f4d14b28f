//! The ElasticQuota validating plugin: runs the tree rules under the topology's write lock and, when
//! they pass, applies the change to the topology at once, so two racing admissions cannot both
//! squeeze into the same parent. Dry runs change nothing.

use crate::cache::quota_topology::PROVISIONAL_TTL;
use kube::core::admission::Operation;

use super::tree_checks::{check_create, check_delete, check_update};
use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::outcome::{PluginResult, Rejection};
use crate::apis::ElasticQuota;

pub struct QuotaTreeRules;

impl Validator<ElasticQuota> for QuotaTreeRules {
    fn name(&self) -> &'static str {
        "ElasticQuotaTreeRules"
    }

    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, ElasticQuota>) -> Step<'a> {
        validate(ctx).into()
    }
}

fn validate(ctx: &Ctx<'_, ElasticQuota>) -> PluginResult {
    let dry_run = ctx.request.dry_run;
    let cache = ctx.cache;
    let mut topology = cache.topology_mut();
    for name in topology.expire_provisional(PROVISIONAL_TTL) {
        tracing::warn!(
            quota = %name,
            "an admitted ElasticQuota change was never seen in the cluster; undone"
        );
    }
    match ctx.operation() {
        Operation::Create => {
            let quota = ctx
                .object()
                .ok_or_else(|| Rejection::invalid("there is no content to decode"))?;
            let info =
                check_create(&topology, quota, ctx.gates, cache).map_err(Rejection::invalid)?;
            if !dry_run {
                topology.upsert_provisional(info);
            }
        }
        Operation::Update => {
            let new = ctx
                .object()
                .ok_or_else(|| Rejection::invalid("there is no content to decode"))?;
            let old = ctx.old_object().ok_or_else(|| {
                Rejection::invalid("failed to get quota from old object, err: no old object")
            })?;
            let changed =
                check_update(&topology, old, new, ctx.gates, cache).map_err(Rejection::invalid)?;
            if let Some(info) = changed.filter(|_| !dry_run) {
                topology.upsert_provisional(info);
            }
        }
        Operation::Delete => {
            let name = ctx
                .old_object()
                .and_then(|q| q.metadata.name.clone())
                .unwrap_or_default();
            check_delete(&topology, &name, cache).map_err(Rejection::invalid)?;
            if !dry_run {
                topology.remove_provisional(&name);
            }
        }
        Operation::Connect => {}
    }
    Ok(())
}

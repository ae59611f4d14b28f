//! The ElasticQuota validating plugin: the tree rules, run so that no two admissions can both squeeze
//! into the same parent.
//!
//! In cluster mode the [`Ledger`](super::ledger) serialises changes across replicas: each is checked
//! against a cache that holds every change admitted before it. Without one (`serve --state`,
//! `review`), the rules run under the topology's write lock and an accepted change is applied to the
//! topology at once, provisionally until the cache confirms it. Dry runs change nothing.

use kube::core::admission::Operation;

use std::sync::OnceLock;

use super::ledger::{Ledger, change_of};
use super::tree_checks::{check_create, check_delete, check_update, relevant_unchanged};
use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::outcome::Rejection;
use crate::admission::ports::PendingChange;
use crate::apis::ElasticQuota;
use crate::cache::quota_topology::{PROVISIONAL_TTL, QuotaInfo, QuotaTopology};

#[derive(Default)]
pub struct QuotaTreeRules {
    /// This server's side of the ledger (its own one-at-a-time lock), made on first use from the
    /// store in [`Services`](crate::admission::Services).
    ledger: OnceLock<Ledger>,
}

impl Validator<ElasticQuota> for QuotaTreeRules {
    fn name(&self) -> &'static str {
        "ElasticQuotaTreeRules"
    }

    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, ElasticQuota>) -> Step<'a> {
        let dry_run = ctx.request.dry_run;
        let store = ctx.services.quota_ledger.as_ref().filter(|_| !dry_run);
        match store.map(|store| self.ledger.get_or_init(|| Ledger::new(store.clone()))) {
            Some(ledger) => match ledger_change(ctx) {
                Some(change) => Step::Pending(Box::pin(async move {
                    // The cache shows the change once the watch delivers it; nothing to apply here.
                    ledger.admit(change, ctx.cache, || check(ctx)).await?;
                    Ok(())
                })),
                None => check(ctx).map(|_| ()).into(),
            },
            _ => {
                // Checked and applied under one write lock: racing admissions see each other.
                let mut topology = ctx.cache.topology_mut();
                check_in(ctx, &mut topology)
                    .map(|accepted| {
                        if !dry_run {
                            apply_provisionally(&mut topology, accepted);
                        }
                    })
                    .into()
            }
        }
    }
}

/// The change the ledger records for this request; `None` for one that changes nothing the tree
/// rules read (an update of status, or of the child-request annotation quota evaluation writes on
/// every admitted pod), which need not wait its turn.
fn ledger_change(ctx: &Ctx<'_, ElasticQuota>) -> Option<PendingChange> {
    if let (Operation::Update, Some(old), Some(new)) =
        (ctx.operation(), ctx.old_object(), ctx.object())
        && relevant_unchanged(old, new)
    {
        return None;
    }
    change_of(
        &ctx.request.uid,
        ctx.operation(),
        ctx.object(),
        ctx.old_object(),
    )
}

/// What an accepted change does to the tree.
enum Accepted {
    Upsert(QuotaInfo),
    Remove(String),
    Nothing,
}

fn check(ctx: &Ctx<'_, ElasticQuota>) -> Result<Accepted, Rejection> {
    check_in(ctx, &mut ctx.cache.topology_mut())
}

fn check_in(
    ctx: &Ctx<'_, ElasticQuota>,
    topology: &mut QuotaTopology,
) -> Result<Accepted, Rejection> {
    let cache = ctx.cache;
    for name in topology.expire_provisional(PROVISIONAL_TTL) {
        tracing::warn!(
            quota = %name,
            "an admitted ElasticQuota change was never seen in the cluster; undone"
        );
    }
    Ok(match ctx.operation() {
        Operation::Create => {
            let quota = ctx
                .object()
                .ok_or_else(|| Rejection::invalid("there is no content to decode"))?;
            Accepted::Upsert(
                check_create(topology, quota, ctx.gates, cache).map_err(Rejection::invalid)?,
            )
        }
        Operation::Update => {
            let new = ctx
                .object()
                .ok_or_else(|| Rejection::invalid("there is no content to decode"))?;
            let old = ctx.old_object().ok_or_else(|| {
                Rejection::invalid("failed to get quota from old object, err: no old object")
            })?;
            match check_update(topology, old, new, ctx.gates, cache).map_err(Rejection::invalid)? {
                Some(info) => Accepted::Upsert(info),
                None => Accepted::Nothing,
            }
        }
        Operation::Delete => {
            let name = ctx
                .old_object()
                .and_then(|q| q.metadata.name.clone())
                .unwrap_or_default();
            check_delete(topology, &name, cache).map_err(Rejection::invalid)?;
            Accepted::Remove(name)
        }
        Operation::Connect => Accepted::Nothing,
    })
}

/// Without a ledger: the change enters the topology at once, so a racing admission on this replica
/// sees it, and leaves it if the cache never confirms it.
fn apply_provisionally(topology: &mut QuotaTopology, accepted: Accepted) {
    match accepted {
        Accepted::Upsert(info) => topology.upsert_provisional(info),
        Accepted::Remove(name) => topology.remove_provisional(&name),
        Accepted::Nothing => {}
    }
}

//! The ElasticQuota validating plugin: the tree rules, run so that no two admissions can both squeeze
//! into the same parent.
//!
//! In cluster mode the [`Ledger`](super::ledger) serialises changes across replicas: each is checked
//! against a cache that holds every change admitted before it. Without one (`serve --state`,
//! `review`), the rules run under the plugin's own [`Overlay`] lock, against the cache's topology
//! with the changes admitted here and not yet in the cache laid over it. Dry runs change nothing.

use kube::core::admission::Operation;

use std::sync::{Mutex, OnceLock};

use super::ledger::probe::{self, PROBE_ANNOTATION, PROBE_NAME, ProbeError};
use super::ledger::{Ledger, change_of, keys_of};
use super::overlay::{Overlay, PENDING_TTL};
use super::tree_checks::{check_create, check_delete, check_update, relevant_unchanged};
use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::outcome::Rejection;
use crate::admission::ports::PendingChange;
use crate::apis::ElasticQuota;
use crate::cache::quota_topology::{QuotaInfo, QuotaTopology};
use crate::telemetry::Clipped;

#[derive(Default)]
pub struct QuotaTreeRules {
    /// This server's side of the ledger (its own one-at-a-time lock), made on first use from the
    /// store in [`Services`](crate::admission::Services).
    ledger: OnceLock<Ledger>,
    /// Without a ledger: what this process admitted that the cache does not show yet.
    overlay: Mutex<Overlay>,
}

impl Validator<ElasticQuota> for QuotaTreeRules {
    fn name(&self) -> &'static str {
        "ElasticQuotaTreeRules"
    }

    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, ElasticQuota>) -> Step<'a> {
        if let Some(answer) = probe_answer(ctx) {
            // A dry run: nothing to check or record; the answer names who sent it.
            ctx.warn(answer);
            return Ok(()).into();
        }
        let dry_run = ctx.dry_run();
        let store = ctx.services.quota_ledger.as_ref().filter(|_| !dry_run);
        let ledger = store.map(|store| {
            self.ledger.get_or_init(|| {
                Ledger::new(store.clone()).nudging(ctx.services.probe_nudge.clone())
            })
        });
        match ledger {
            Some(ledger) => match ledger_change(ctx) {
                Some(change) => Step::Pending(Box::pin(async move {
                    // The cache shows the change once the watch delivers it; nothing to apply here.
                    let keys = || keys_of(&ctx.cache.topology(), ctx.object(), ctx.old_object());
                    ledger.admit(change, keys, ctx.cache, || check(ctx)).await?;
                    Ok(())
                })),
                None => check(ctx).map(|_| ()).into(),
            },
            _ => self.check_with_overlay(ctx, dry_run).into(),
        }
    }
}

/// The answer to a probe one of the replicas made through the API server (`ledger/probe.rs`): a
/// dry-run CREATE (or UPDATE, should the object exist) of [`PROBE_NAME`] in the operator's
/// namespace whose token this replica checks.
fn probe_answer(ctx: &Ctx<'_, ElasticQuota>) -> Option<String> {
    let request = ctx.request;
    let quota = ctx.object()?;
    if !request.dry_run
        || !matches!(ctx.operation(), Operation::Create | Operation::Update)
        || quota.metadata.name.as_deref() != Some(PROBE_NAME)
        || request.namespace.as_deref() != Some(crate::names::namespace())
    {
        return None;
    }
    let token = crate::apis::meta::annotation(quota, PROBE_ANNOTATION)?;
    let caller = crate::admission::caller::current()?;
    let secret = ctx
        .services
        .probe_secrets
        .as_ref()
        .and_then(|s| s.current());
    let checked = secret
        .as_ref()
        .ok_or(ProbeError::NoSecret)
        .and_then(|secret| probe::check(secret, token, probe::now()));
    match (checked, secret) {
        (Ok(nonce), Some(secret)) => {
            tracing::debug!(%caller, "an API-server probe answered");
            Some(probe::answer(&secret, &nonce, caller))
        }
        (Err(e), _) => {
            tracing::debug!(%caller, error = %e, "a probe not answered");
            None
        }
        (Ok(_), None) => None,
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

impl QuotaTreeRules {
    /// Checked and recorded under one lock: racing admissions on this replica see each other.
    fn check_with_overlay(
        &self,
        ctx: &Ctx<'_, ElasticQuota>,
        dry_run: bool,
    ) -> Result<(), Rejection> {
        let mut overlay = self.overlay.lock().unwrap_or_else(|p| p.into_inner());
        let topology = ctx.cache.topology();
        for name in overlay.settle(&topology, PENDING_TTL) {
            tracing::warn!(
                quota = %Clipped::name(&name),
                "an admitted ElasticQuota change was never seen in the cluster; undone"
            );
        }
        // A CREATE of a name a pending change holds: the API server stores one object per name,
        // so that change was never stored (a forged review's) or this one will not be: checked
        // without it, a forged CREATE cannot make the real one "already exist".
        if *ctx.operation() == Operation::Create
            && let Some(name) = ctx.object().and_then(|q| q.metadata.name.as_deref())
        {
            overlay.forget(&topology, name);
        }
        let accepted = check_in(ctx, overlay.view(&topology))?;
        if !dry_run {
            match accepted {
                Accepted::Upsert(info) => overlay.record(&topology, info.name.clone(), Some(info)),
                Accepted::Remove(name) => overlay.record(&topology, name, None),
                Accepted::Nothing => {}
            }
        }
        Ok(())
    }
}

fn check(ctx: &Ctx<'_, ElasticQuota>) -> Result<Accepted, Rejection> {
    check_in(ctx, &ctx.cache.topology())
}

fn check_in(ctx: &Ctx<'_, ElasticQuota>, topology: &QuotaTopology) -> Result<Accepted, Rejection> {
    let cache = ctx.cache;
    refuse_near_unreadable(ctx, topology)?;
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

/// A quota in the cluster that does not decode is set aside by the cache; a change whose rules
/// would count it (its parent, sibling or child) is refused until it is fixed or deleted, rather than
/// checked as if it were absent.
fn refuse_near_unreadable(
    ctx: &Ctx<'_, ElasticQuota>,
    topology: &QuotaTopology,
) -> Result<(), Rejection> {
    let infos: Vec<QuotaInfo> = [ctx.object(), ctx.old_object()]
        .into_iter()
        .flatten()
        .map(QuotaInfo::from_quota)
        .collect();
    let Some(name) = infos.first().map(|i| i.name.as_str()) else {
        return Ok(());
    };
    let parents: Vec<&str> = infos.iter().map(|i| i.parent.as_str()).collect();
    match topology.unreadable_near(name, &parents) {
        None => Ok(()),
        Some((other, u)) => Err(Rejection {
            code: 503,
            message: format!(
                "ElasticQuota {}/{other}, which the tree rules must count for this change, does not \
                 decode ({}); fix or delete it first",
                u.namespace, u.error
            ),
        }),
    }
}

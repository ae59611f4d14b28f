//! Defaults filled in on ElasticQuota CREATE: parent, tree id and shared weight.

use crate::memory::metered::read_within;
use std::collections::BTreeMap;
use std::time::Duration;

use kube::core::admission::Operation;

use crate::admission::chain::{Ctx, Mutator, Step};
use crate::admission::elastic_quota::ledger::POLL;
use crate::admission::outcome::{PluginResult, Rejection};
use crate::apis::ElasticQuota;
use crate::apis::elastic_quota::ResourceList;
use crate::apis::keys::{QUOTA_PARENT, QUOTA_TREE_ID, ROOT_QUOTA};
use crate::resources::Qty;

pub const SHARED_WEIGHT: &str = "quota.scheduling.koordinator.sh/shared-weight";

/// How long a create waits for its parent to reach a watched cache. A tree applied in one go
/// (`kubectl apply -f tree.yaml`) creates the parent a moment before the child, and the mutating
/// webhook runs before the watch has always delivered the parent; Koordinator's webhook sees it at
/// once because its validator writes its tree. Bounded, and spent only when the parent is missing.
const PARENT_WAIT: Duration = Duration::from_secs(2);

pub struct FillQuotaDefaults;

impl Mutator<ElasticQuota> for FillQuotaDefaults {
    fn name(&self) -> &'static str {
        "FillQuotaDefaults"
    }

    fn mutate<'a>(
        &'a self,
        ctx: &'a Ctx<'a, ElasticQuota>,
        quota: &'a mut ElasticQuota,
    ) -> Step<'a> {
        if *ctx.operation() != Operation::Create
            || quota.metadata.name.as_deref() == Some(ROOT_QUOTA)
        {
            return Ok(()).into();
        }
        // Only a cache fed by a watch (cluster mode, where the ledger is) can still receive it.
        let watched = ctx.services.quota_ledger.is_some();
        match missing_parent(ctx, quota) {
            Some(parent) if watched => Step::Pending(Box::pin(async move {
                let started = tokio::time::Instant::now();
                while ctx.cache.topology().get(&parent).is_none() && started.elapsed() < PARENT_WAIT
                {
                    tokio::time::sleep(POLL).await;
                }
                fill(ctx, quota)
            })),
            _ => fill(ctx, quota).into(),
        }
    }
}

/// The parent the create names (not the root) when the tree id must come from it and the cache
/// does not hold it.
fn missing_parent(ctx: &Ctx<'_, ElasticQuota>, quota: &ElasticQuota) -> Option<String> {
    let labels = quota.metadata.labels.as_ref()?;
    let parent = labels
        .get(QUOTA_PARENT)
        .filter(|p| !p.is_empty() && *p != ROOT_QUOTA)?;
    let has_tree_id = labels.get(QUOTA_TREE_ID).is_some_and(|t| !t.is_empty());
    (!has_tree_id && ctx.cache.topology().get(parent).is_none()).then(|| parent.clone())
}

fn fill(ctx: &Ctx<'_, ElasticQuota>, quota: &mut ElasticQuota) -> PluginResult {
    let name = quota.metadata.name.clone().unwrap_or_default();
    let labels = quota.metadata.labels.get_or_insert_with(BTreeMap::new);
    let parent = match labels.get(QUOTA_PARENT).filter(|p| !p.is_empty()) {
        Some(parent) => parent.clone(),
        None => {
            labels.insert(QUOTA_PARENT.to_owned(), ROOT_QUOTA.to_owned());
            ROOT_QUOTA.to_owned()
        }
    };
    let has_tree_id = labels.get(QUOTA_TREE_ID).is_some_and(|t| !t.is_empty());
    if !has_tree_id && parent != ROOT_QUOTA {
        let topology = ctx.cache.topology();
        let parent_quota = topology.get(&parent).ok_or_else(|| {
            Rejection::invalid(format!("fill quota {name} failed, parent not exist"))
        })?;
        if !parent_quota.tree_id.is_empty() {
            labels.insert(QUOTA_TREE_ID.to_owned(), parent_quota.tree_id.clone());
        }
    }

    let max = quota.spec.max.clone().map(canonical);
    let annotations = quota.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let current = annotations.get(SHARED_WEIGHT).filter(|w| !w.is_empty());
    let weight = match current {
        None => serde_json::to_string(&max),
        Some(raw) => {
            let weight: Option<ResourceList> = read_within(raw.as_bytes()).map_err(|e| {
                Rejection::invalid(format!(
                    "fillDefaultQuotaInfo unmarshal sharedWeight failed:{e}"
                ))
            })?;
            let max = max.unwrap_or_default();
            // JSON `null` (what this rule writes for a quota without max) reads as no list, as
            // Go reads it; filled from a max, Koordinator panics (a nil map): refused here.
            let Some(mut weight) = weight else {
                if max.is_empty() {
                    return Ok(());
                }
                return Err(Rejection::invalid(format!(
                    "{SHARED_WEIGHT} is null while spec.max is set: remove it to have it filled from max, or give a resource list"
                )));
            };
            let before = weight.clone();
            weight.retain(|k, _| max.contains_key(k));
            for (k, v) in &max {
                weight.entry(k.clone()).or_insert_with(|| v.clone());
            }
            if weight == before {
                return Ok(());
            }
            serde_json::to_string(&canonical(weight))
        }
    }
    .map_err(|e| Rejection::internal(e.to_string()))?;
    annotations.insert(SHARED_WEIGHT.to_owned(), weight);
    Ok(())
}

/// Every quantity in its canonical form (`33000m` is `33`, `30720Mi` is `30Gi`), as Kubernetes
/// writes a ResourceList it encodes; one that does not parse stays as written.
fn canonical(list: ResourceList) -> ResourceList {
    list.into_iter()
        .map(|(name, value)| {
            let value = Qty::try_from(&value).map_or(value, Qty::to_quantity);
            (name, value)
        })
        .collect()
}

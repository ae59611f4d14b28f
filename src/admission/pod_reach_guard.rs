//! The plugin that keeps narrowed pod entries wide enough: before a ClusterColocationProfile or a
//! parent ElasticQuota is stored, the pod entry it concerns is made to cover it (the leader widens
//! nothing by itself in time: its cache sees the change only after it is stored, and a pod created
//! in between would be skipped). It runs last in its chain, once the change is allowed; a change
//! later refused only leaves an entry wider than needed until the leader narrows it again.

use kube::core::admission::Operation;

use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::outcome::Rejection;
use crate::apis::{ClusterColocationProfile, ElasticQuota};
use crate::entries::narrowing::pod::{PodEntry, Reach, profile_reach, quota_reach};

/// An object that can widen a pod entry.
pub trait WidensPodEntry: kube::Resource + Send + Sync {
    const ENTRY: PodEntry;
    fn reach(&self) -> Reach;
}

impl WidensPodEntry for ClusterColocationProfile {
    const ENTRY: PodEntry = PodEntry::Create;
    fn reach(&self) -> Reach {
        profile_reach(self)
    }
}

impl WidensPodEntry for ElasticQuota {
    const ENTRY: PodEntry = PodEntry::Validate;
    fn reach(&self) -> Reach {
        quota_reach(self)
    }
}

pub struct GuardPodReach;

impl<T: WidensPodEntry> Validator<T> for GuardPodReach {
    fn name(&self) -> &'static str {
        "PodReachGuard"
    }

    /// Shadowed, a change could reach pods the narrowed entries do not send yet.
    fn shadowable(&self) -> bool {
        false
    }

    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, T>) -> Step<'a> {
        // Without a guard (`review`, `serve --state`, calls not narrowed) there is nothing to keep.
        let Some(guard) = ctx.services.pod_reach.as_ref().filter(|_| !ctx.dry_run()) else {
            return Ok(()).into();
        };
        let Some(object) = ctx.object() else {
            return Ok(()).into();
        };
        let needed = object.reach();
        let already = match ctx.operation() {
            Operation::Create => Reach::nothing(),
            // What the stored version needs is already covered.
            Operation::Update => ctx.old_object().map_or_else(Reach::nothing, T::reach),
            _ => return Ok(()).into(),
        };
        if already.covers(&needed) {
            return Ok(()).into();
        }
        Step::Pending(Box::pin(async move {
            guard.cover(T::ENTRY, &needed).await.map_err(|e| {
                Rejection::internal(format!(
                    "cannot widen webhook entry {} before this change: {e}",
                    T::ENTRY.entry_name()
                ))
            })
        }))
    }
}

//! What the leader writes on the pod entries: the reach its cache derives (profiles for
//! `mpod-create`, parent quotas for `vpod`), narrowed only once the hold has passed since the last
//! admitted change that needed the entry and since its cache synced; until then never narrower than
//! what is written (docs/narrowing.md, "Pods").

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cache::Cache;
use crate::entries::ENDPOINTS;
use crate::entries::narrowing::Calls;
use crate::entries::narrowing::pod::{PodEntry, Reach, create_reach, validate_reach};
use crate::entries::narrowing::record::{EntryState, ReachRecord, leader_reach, now_ms};
use crate::features::FeatureGates;
use crate::install::WebhookTarget;

/// How soon the leader passes again when its cache has not listed profiles and quotas yet.
const UNLISTED_RETRY: Duration = Duration::from_secs(1);

/// The leader's view of what the pod entries need.
pub struct PodReachSource {
    cache: Cache,
    hold: Duration,
    /// When this process first saw the profiles and quotas listed.
    synced_at: Mutex<Option<Instant>>,
    /// When a narrowing held back by the hold may be written: the leader passes again then.
    due: Mutex<Option<Instant>>,
}

/// One pass's decision for one configuration's pod entry.
pub struct ReachPlan {
    pub state: EntryState,
    /// The record to write with the entry's new conditions (`None`: unchanged).
    pub record: Option<ReachRecord>,
}

impl PodReachSource {
    pub fn new(cache: Cache, hold: Duration) -> Self {
        Self {
            cache,
            hold,
            synced_at: Mutex::new(None),
            due: Mutex::new(None),
        }
    }

    /// How long until a held-back narrowing may be written (taken: one pass per hold).
    pub fn next_pass(&self) -> Option<Duration> {
        let due = self.due.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        // A little after: the hold is measured against another clock reading.
        Some(due.saturating_duration_since(Instant::now()) + Duration::from_millis(100))
    }

    /// Asks for a pass no later than `at` (the earliest asked for is kept).
    fn pass_by(&self, at: Instant) {
        let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        *due = Some(due.map_or(at, |d| d.min(at)));
    }

    /// When the hold since `touched_ms` and since the sync has passed.
    fn hold_ends(&self, touched_ms: u64) -> Option<Instant> {
        let synced = (*self.synced_at.lock().unwrap_or_else(|e| e.into_inner()))?;
        let since_touch = Duration::from_millis(now_ms().saturating_sub(touched_ms));
        let now = Instant::now();
        Some((synced + self.hold).max(now + self.hold.saturating_sub(since_touch)))
    }

    /// The reach the cache derives; `None` until it has listed profiles and quotas.
    fn derived(&self, entry: PodEntry) -> Option<Reach> {
        let listed =
            self.cache.colocation_profiles.is_ready() && self.cache.elastic_quotas.is_ready();
        if !listed {
            return None;
        }
        let mut synced = self.synced_at.lock().unwrap_or_else(|e| e.into_inner());
        synced.get_or_insert_with(Instant::now);
        Some(match entry {
            PodEntry::Create => {
                create_reach(self.cache.colocation_profiles.state().iter().map(|p| &**p))
            }
            PodEntry::Validate => {
                validate_reach(self.cache.elastic_quotas.state().iter().map(|q| &**q))
            }
        })
    }

    fn hold_passed(&self, touched_ms: u64) -> bool {
        let synced = *self.synced_at.lock().unwrap_or_else(|e| e.into_inner());
        synced.is_some_and(|at| at.elapsed() >= self.hold)
            && now_ms().saturating_sub(touched_ms) >= self.hold.as_millis() as u64
    }

    /// Sets `target`'s reach for `entry` from `configuration` (as read) and the cache, and says
    /// what record goes with it.
    pub fn plan(
        &self,
        configuration: &Value,
        entry: PodEntry,
        gates: &FeatureGates,
        target: &mut WebhookTarget,
    ) -> ReachPlan {
        let state = EntryState::read(configuration, entry);
        let written = state.written();
        let touched = state.record.as_ref().map_or(0, |r| r.touched_ms);
        let mut reach = match self.derived(entry) {
            Some(derived) => {
                let passed = self.hold_passed(touched);
                if !passed
                    && Some(&derived) != written.as_ref()
                    && let Some(at) = self.hold_ends(touched)
                {
                    self.pass_by(at);
                }
                leader_reach(written.clone(), derived, passed)
            }
            None => {
                // Not listed yet: pass again soon rather than at the next tick (a minute), or a
                // leader that passed before its watches listed would narrow a minute late.
                self.pass_by(Instant::now() + UNLISTED_RETRY);
                written.clone().unwrap_or(Reach::Every)
            }
        };
        set(target, entry, reach.clone());
        // Sent every pod whatever the reach (a gate, an unguarded entry): recorded as such, so the
        // record never disagrees with the conditions.
        if state.index.is_none() || sends_every_pod(target, entry, gates) {
            reach = Reach::Every;
            set(target, entry, Reach::Every);
        }
        let record =
            (state.index.is_some() && Some(&reach) != written.as_ref()).then(|| ReachRecord {
                reach,
                changed_ms: now_ms(),
                touched_ms: touched,
            });
        ReachPlan { state, record }
    }
}

fn set(target: &mut WebhookTarget, entry: PodEntry, reach: Reach) {
    match entry {
        PodEntry::Create => target.pod_reach.create = reach,
        PodEntry::Validate => target.pod_reach.validate = reach,
    }
}

fn sends_every_pod(target: &WebhookTarget, entry: PodEntry, gates: &FeatureGates) -> bool {
    ENDPOINTS
        .iter()
        .flat_map(|w| w.entries)
        .find(|e| e.name == entry.entry_name())
        .is_none_or(|spec| target.calls(spec, gates) == Calls::All)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CacheWriter;

    fn plan_once(source: &PodReachSource) {
        let configuration = serde_json::json!({"webhooks": []});
        let mut target = WebhookTarget::from_flags(
            None,
            9443,
            &crate::install::entry_policy::EntryPolicy::default(),
        );
        source.plan(
            &configuration,
            PodEntry::Create,
            &FeatureGates::default(),
            &mut target,
        );
    }

    #[test]
    fn a_leader_whose_cache_has_not_listed_passes_again_within_a_second() {
        let writer = CacheWriter::default();
        let source = PodReachSource::new(writer.reader(), Duration::from_secs(120));
        assert!(source.next_pass().is_none());
        plan_once(&source);
        let soon = source.next_pass().expect("a pass is due");
        assert!(
            soon <= UNLISTED_RETRY + Duration::from_millis(100),
            "{soon:?}"
        );
        // Listed: the next pass is when the hold since the sync ends, not soon.
        writer.mark_ready();
        plan_once(&source);
        let at_hold = source.next_pass().expect("the narrowing is held back");
        assert!(at_hold > Duration::from_secs(100), "{at_hold:?}");
    }
}

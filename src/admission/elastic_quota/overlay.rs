//! Without a ledger (`serve --state`, `review`): the ElasticQuota changes this process admitted that
//! the cache does not show yet. The tree rules check a request against the cache's topology with
//! these laid over it, so two admissions racing on this replica see each other; the cache itself is
//! written only by what feeds it (files or watches).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::cache::quota_topology::{QuotaInfo, QuotaTopology};

/// How long an admitted change waits for the cache to show it. The API server stores an admitted
/// object within milliseconds and the watch sees it within about a second; a change nothing shows (a
/// forged review, or a request another admission step rejected) is dropped after this.
pub const PENDING_TTL: Duration = Duration::from_secs(30);

/// Changes kept pending at most: the oldest is dropped first (as if expired) when a new one would
/// pass this. The overlay is for admissions racing on this replica within a second or two; forged
/// reviews (answered, never stored) must not grow it without end.
pub const MAX_PENDING: usize = 1024;
/// Namespaces the pending changes bind, at most, over all of them (each costs an entry in the
/// view's namespace index too): a change binding more than this alone is not kept.
pub const MAX_PENDING_NAMESPACES: usize = 65_536;

/// An admitted change: a quota as it now is, or its removal (`None`).
pub type Change = Option<QuotaInfo>;

#[derive(Debug, Default)]
pub struct Overlay {
    /// Per quota: when it was admitted, the cache's view of it then, and the change.
    pending: BTreeMap<String, Pending>,
    /// While anything is pending: the cache's topology (at the generation noted) with the pending
    /// changes applied. Kept up to date change by change, so a request costs the depth of the tree,
    /// not a copy of it; copied again only when the cache itself changed.
    view: Option<(u64, QuotaTopology)>,
}

#[derive(Debug)]
struct Pending {
    since: Instant,
    seen_before: Option<QuotaInfo>,
    change: Change,
}

fn apply(view: &mut QuotaTopology, name: &str, change: Option<QuotaInfo>) {
    match change {
        Some(info) => view.upsert(info),
        None => {
            view.remove(name);
        }
    }
}

impl Overlay {
    /// Drops the changes the cache now shows (or has moved past: it holds something else than what it
    /// held at admission) and those older than `ttl`; returns the names of the latter.
    pub fn settle(&mut self, topology: &QuotaTopology, ttl: Duration) -> Vec<String> {
        let now = Instant::now();
        let mut expired = Vec::new();
        let cache_changed = self
            .view
            .as_ref()
            .is_some_and(|(generation, _)| *generation != topology.generation());
        self.pending.retain(|name, p| {
            let now_seen = topology.get(name);
            if now_seen == p.change.as_ref() || now_seen != p.seen_before.as_ref() {
                return false;
            }
            let keep = now.duration_since(p.since) < ttl;
            if !keep {
                expired.push(name.clone());
            }
            keep
        });
        if self.pending.is_empty() {
            self.view = None;
        } else if cache_changed {
            let mut view = topology.clone();
            for (name, p) in &self.pending {
                apply(&mut view, name, p.change.clone());
            }
            self.view = Some((topology.generation(), view));
        } else if let Some((_, view)) = &mut self.view {
            // The cache is as it was: undo each expired change by putting back what it holds.
            for name in &expired {
                apply(view, name, topology.get(name).cloned());
            }
        }
        expired
    }

    /// The topology the rules check against: the cache's, with the pending changes laid over it.
    /// Call [`Self::settle`] first with the same `topology`.
    pub fn view<'t>(&'t self, topology: &'t QuotaTopology) -> &'t QuotaTopology {
        match &self.view {
            Some((_, view)) => view,
            None => topology,
        }
    }

    /// Namespaces the pending changes bind.
    fn pending_namespaces(&self) -> usize {
        self.pending
            .values()
            .filter_map(|p| p.change.as_ref())
            .map(|info| info.namespaces.len())
            .sum()
    }

    /// Drops pending changes, oldest first, until one more binding `namespaces` fits within
    /// [`MAX_PENDING`] and [`MAX_PENDING_NAMESPACES`]; each dropped one is undone in the view.
    fn make_room(&mut self, topology: &QuotaTopology, namespaces: usize) {
        while !self.pending.is_empty()
            && (self.pending.len() >= MAX_PENDING
                || self.pending_namespaces() + namespaces > MAX_PENDING_NAMESPACES)
        {
            let Some(oldest) = self
                .pending
                .iter()
                .min_by_key(|(_, p)| p.since)
                .map(|(name, _)| name.clone())
            else {
                break;
            };
            self.pending.remove(&oldest);
            if let Some((_, view)) = &mut self.view {
                apply(view, &oldest, topology.get(&oldest).cloned());
            }
        }
        if self.pending.is_empty() {
            self.view = None;
        }
    }

    /// Drops the pending change to `name`, if any, undoing it in the view.
    pub fn forget(&mut self, topology: &QuotaTopology, name: &str) {
        if self.pending.remove(name).is_some() {
            if let Some((_, view)) = &mut self.view {
                apply(view, name, topology.get(name).cloned());
            }
            if self.pending.is_empty() {
                self.view = None;
            }
        }
    }

    /// Records an admitted change to `name`, as the cache shows it now in `topology`. A change
    /// binding more namespaces than the overlay may hold is not kept (nor an earlier one of `name`).
    pub fn record(&mut self, topology: &QuotaTopology, name: String, change: Change) {
        let namespaces = change.as_ref().map_or(0, |info| info.namespaces.len());
        // A second change before the cache showed the first: the cache still holds what it held
        // at the first. The first's place is freed before making room.
        if namespaces > MAX_PENDING_NAMESPACES {
            self.forget(topology, &name);
            return;
        }
        let earlier = self.pending.remove(&name);
        self.make_room(topology, namespaces);
        let seen_before = match earlier {
            Some(p) => p.seen_before,
            None => topology.get(&name).cloned(),
        };
        let (_, view) = self
            .view
            .get_or_insert_with(|| (topology.generation(), topology.clone()));
        apply(view, &name, change.clone());
        self.pending.insert(
            name,
            Pending {
                since: Instant::now(),
                seen_before,
                change,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::keys::ROOT_QUOTA;

    fn quota(name: &str, parent: Option<&str>) -> QuotaInfo {
        QuotaInfo::from_quota(&crate::cache::quota_topology::tests::quota(name, parent))
    }

    fn topology(infos: &[QuotaInfo]) -> QuotaTopology {
        let mut t = QuotaTopology::default();
        for info in infos {
            t.upsert(info.clone());
        }
        t
    }

    fn binding(name: &str, namespaces: usize) -> QuotaInfo {
        let mut info = quota(name, None);
        info.namespaces = (0..namespaces).map(|i| format!("{name}-{i}")).collect();
        info
    }

    /// Forged changes the cache never shows cannot grow the overlay past its caps: the oldest go
    /// first, and the view stays the cache with exactly the kept changes laid over it.
    #[test]
    fn the_overlay_keeps_at_most_its_caps_dropping_the_oldest() {
        let cache = topology(&[quota("a", None)]);
        let mut overlay = Overlay::default();
        for i in 0..MAX_PENDING + 10 {
            overlay.record(
                &cache,
                format!("q{i}"),
                Some(quota(&format!("q{i}"), Some("a"))),
            );
            overlay
                .pending
                .values_mut()
                .for_each(|p| p.since -= Duration::from_millis(1));
        }
        assert_eq!(overlay.pending.len(), MAX_PENDING);
        let view = overlay.view(&cache);
        assert!(
            !view.contains("q0") && !view.contains("q9"),
            "the oldest were dropped"
        );
        assert!(view.contains("q10") && view.contains(&format!("q{}", MAX_PENDING + 9)));

        // Namespaces: a change binding more than the cap alone is not kept, and takes an earlier
        // change of the same quota with it; changes binding many push the oldest out.
        let mut overlay = Overlay::default();
        overlay.record(&cache, "big".into(), Some(binding("big", 10)));
        overlay.record(
            &cache,
            "big".into(),
            Some(binding("big", MAX_PENDING_NAMESPACES + 1)),
        );
        assert!(overlay.pending.is_empty());
        assert!(std::ptr::eq(overlay.view(&cache), &cache));
        let half = MAX_PENDING_NAMESPACES / 2;
        for name in ["x", "y", "z"] {
            overlay.record(&cache, name.into(), Some(binding(name, half)));
            overlay
                .pending
                .values_mut()
                .for_each(|p| p.since -= Duration::from_millis(1));
        }
        let kept: Vec<_> = overlay.pending.keys().cloned().collect();
        assert_eq!(kept, ["y", "z"]);
        let view = overlay.view(&cache);
        assert_eq!(view.quota_for_namespace("x-0"), None);
        assert_eq!(view.quota_for_namespace("z-0"), Some("z"));

        // Forgotten: undone in the view; the last one gone, the view is the cache's again.
        overlay.forget(&cache, "y");
        assert_eq!(overlay.view(&cache).quota_for_namespace("y-0"), None);
        overlay.forget(&cache, "z");
        assert!(std::ptr::eq(overlay.view(&cache), &cache));
    }

    #[test]
    fn changes_the_cache_never_shows_are_dropped_and_shown_ones_settle() {
        let cache = topology(&[quota("a", None)]);
        let mut overlay = Overlay::default();
        // A phantom create, and a re-parenting of "a" under it, that the cache never shows.
        overlay.record(&cache, "phantom".into(), Some(quota("phantom", Some("a"))));
        overlay.record(&cache, "a".into(), Some(quota("a", Some("phantom"))));
        let view = overlay.view(&cache);
        assert!(view.contains("phantom"));
        assert_eq!(view.get("a").unwrap().parent, "phantom");
        assert!(overlay.settle(&cache, PENDING_TTL).is_empty(), "too early");
        let mut expired = overlay.settle(&cache, Duration::ZERO);
        expired.sort();
        assert_eq!(expired, ["a", "phantom"]);
        assert!(std::ptr::eq(overlay.view(&cache), &cache));

        // Expired one at a time, the kept view is undone change by change.
        overlay.record(&cache, "phantom".into(), Some(quota("phantom", Some("a"))));
        overlay.record(&cache, "a".into(), None);
        overlay.pending.get_mut("phantom").unwrap().since -= PENDING_TTL;
        assert_eq!(overlay.settle(&cache, PENDING_TTL), ["phantom"]);
        let view = overlay.view(&cache);
        assert!(!view.contains("phantom") && !view.contains("a"));
        assert_eq!(overlay.settle(&cache, Duration::ZERO), ["a"]);
        assert!(std::ptr::eq(overlay.view(&cache), &cache));

        // A removal, then the cache shows it: settled, not expired.
        overlay.record(&cache, "a".into(), None);
        assert!(!overlay.view(&cache).contains("a"));
        assert!(overlay.settle(&topology(&[]), Duration::ZERO).is_empty());
        assert!(overlay.pending.is_empty());

        // The cache moved on to something else than admitted: its word wins, and the view is
        // rebuilt from the changed cache with what is still pending.
        overlay.record(&cache, "b".into(), Some(quota("b", Some("a"))));
        overlay.record(&cache, "c".into(), Some(quota("c", Some("a"))));
        let mut moved = cache.clone();
        moved.upsert(quota("b", None));
        assert!(overlay.settle(&moved, PENDING_TTL).is_empty());
        let view = overlay.view(&moved);
        assert_eq!(view.get("b").unwrap().parent, ROOT_QUOTA);
        assert_eq!(view.get("c").unwrap().parent, "a");
    }
}

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

    /// Records an admitted change to `name`, as the cache shows it now in `topology`.
    pub fn record(&mut self, topology: &QuotaTopology, name: String, change: Change) {
        let (_, view) = self
            .view
            .get_or_insert_with(|| (topology.generation(), topology.clone()));
        apply(view, &name, change.clone());
        let since = Instant::now();
        match self.pending.get_mut(&name) {
            // A second change before the cache showed the first: the cache still holds what it
            // held at the first.
            Some(p) => {
                p.change = change;
                p.since = since;
            }
            None => {
                let seen_before = topology.get(&name).cloned();
                self.pending.insert(
                    name,
                    Pending {
                        since,
                        seen_before,
                        change,
                    },
                );
            }
        }
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

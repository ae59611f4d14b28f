//! Without a ledger (`serve --state`, `review`): the ElasticQuota changes this process admitted that
//! the cache does not show yet. The tree rules check a request against the cache's topology with
//! these laid over it, so two admissions racing on this replica see each other; the cache itself is
//! written only by what feeds it (files or watches).

use std::borrow::Cow;
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
}

#[derive(Debug)]
struct Pending {
    since: Instant,
    seen_before: Option<QuotaInfo>,
    change: Change,
}

impl Overlay {
    /// Drops the changes the cache now shows (or has moved past: it holds something else than what it
    /// held at admission) and those older than `ttl`; returns the names of the latter.
    pub fn settle(&mut self, topology: &QuotaTopology, ttl: Duration) -> Vec<String> {
        let now = Instant::now();
        let mut expired = Vec::new();
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
        expired
    }

    /// The topology the rules check against: the cache's, with the pending changes laid over it.
    pub fn view<'t>(&self, topology: &'t QuotaTopology) -> Cow<'t, QuotaTopology> {
        if self.pending.is_empty() {
            return Cow::Borrowed(topology);
        }
        let mut view = topology.clone();
        for (name, p) in &self.pending {
            match &p.change {
                Some(info) => view.upsert(info.clone()),
                None => {
                    view.remove(name);
                }
            }
        }
        Cow::Owned(view)
    }

    /// Records an admitted change to `name`, as the cache shows it now in `topology`.
    pub fn record(&mut self, topology: &QuotaTopology, name: String, change: Change) {
        let seen_before = topology.get(&name).cloned();
        let since = Instant::now();
        match self.pending.get_mut(&name) {
            // A second change before the cache showed the first: the cache still holds what it
            // held at the first.
            Some(p) => {
                p.change = change;
                p.since = since;
            }
            None => {
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
        assert!(matches!(overlay.view(&cache), Cow::Borrowed(_)));

        // A removal, then the cache shows it: settled, not expired.
        overlay.record(&cache, "a".into(), None);
        assert!(!overlay.view(&cache).contains("a"));
        assert!(overlay.settle(&topology(&[]), Duration::ZERO).is_empty());
        assert!(overlay.pending.is_empty());

        // The cache moved on to something else than admitted: its word wins.
        overlay.record(&cache, "b".into(), Some(quota("b", Some("a"))));
        let moved = topology(&[quota("a", None), quota("b", None)]);
        assert!(overlay.settle(&moved, PENDING_TTL).is_empty());
        assert_eq!(overlay.view(&moved).get("b").unwrap().parent, ROOT_QUOTA);
    }
}

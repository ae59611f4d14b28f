//! What a replica has seen of the record, for its callers' trust (`callers.rs`): when it first
//! saw each change (what waits count from), whether it has looked at it pending, and whether it
//! showed. Bounded ([`MAX_SEEN`]); read by `mod.rs`'s waits and `still_valid`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::bounds::{MAX_WAIT, PENDING_TIMEOUT};
use super::callers::{Callers, Sighting};
use super::keys::shown;
use crate::admission::ports::{LedgerRecord, PendingChange};
use crate::cache::Cache;

/// How often a replica looks at the changes it has seen, for their callers' trust.
const JUDGE_EVERY: Duration = Duration::from_millis(50);
/// How often a replica reads the record while requests wait, to see what is recorded meanwhile.
const OBSERVE_EVERY: Duration = Duration::from_millis(250);
/// When this replica first saw a change, and whether it was judged for its caller.
pub(super) struct Seen {
    at: Instant,
    judged: bool,
    /// Looked at and not in the cache at least once.
    pending: bool,
    /// Kept until judged: what tells whether it showed.
    change: Option<PendingChange>,
}

/// Changes whose first sight a replica remembers at most (each under 1 KiB: `MAX_ID_BYTES` and the
/// other limits bound an entry).
pub(in crate::admission::elastic_quota::ledger) const MAX_SEEN: usize = 8192;

/// Forgets, of a full `seen`, those no one waits for any more, then the judged, then the older
/// half: a change forgotten and met again is waited for again, at most [`MAX_WAIT`].
fn make_room(seen: &mut HashMap<String, Seen>, now: Instant) {
    seen.retain(|_, s| now.duration_since(s.at) < PENDING_TIMEOUT * 2);
    if seen.len() >= MAX_SEEN {
        seen.retain(|_, s| !s.judged);
    }
    if seen.len() >= MAX_SEEN {
        let mut ages: Vec<Instant> = seen.values().map(|s| s.at).collect();
        let (_, middle, _) = ages.select_nth_unstable(MAX_SEEN / 2);
        let middle = *middle;
        seen.retain(|_, s| s.at > middle);
    }
}

/// What this replica has seen of the record and of its callers: owned by the ledger's `Inner`.
#[derive(Default)]
pub(super) struct Sightings {
    /// Change id -> when this replica first saw it as someone's last change, and whether it has
    /// been judged (shown or not) for its caller.
    seen: Mutex<HashMap<String, Seen>>,
    /// Whose changes show up.
    pub(super) callers: Callers,
    /// When this replica last looked (`judge_pending`) and last read the record while waiting.
    judged_at: Mutex<Option<Instant>>,
    observed_at: Mutex<Option<Instant>>,
}

impl Sightings {
    /// When this replica first saw the change `id`; forgets what no one can wait for any more.
    pub(super) fn first_seen(&self, change: &PendingChange) -> Instant {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if seen.len() >= MAX_SEEN && !seen.contains_key(&change.id) {
            make_room(&mut seen, now);
        }
        seen.entry(change.id.clone())
            .or_insert_with(|| Seen {
                at: now,
                // Only a caller's changes are judged; the rest count as judged.
                judged: change.caller.is_none(),
                pending: false,
                change: change.caller.is_some().then(|| change.clone()),
            })
            .at
    }

    /// While a request waits, the record is read now and then (at most every [`OBSERVE_EVERY`] per
    /// replica) only to see the changes recorded meanwhile: each is judged [`MAX_WAIT`] after
    /// that, so a stream of forged changes is known within seconds even when no write of this
    /// replica's meets it. Whether it is time for such a read.
    pub(super) fn time_to_observe(&self) -> bool {
        let mut last = self.observed_at.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|at| at.elapsed() < OBSERVE_EVERY) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }

    /// Every change of a record read from the store is seen now, whoever waits for it later.
    pub(super) fn saw_record(&self, record: &LedgerRecord) {
        for change in record.last.values() {
            self.first_seen(change);
        }
    }

    #[cfg(test)]
    pub(super) fn seen_len(&self) -> usize {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// A change this replica admits itself: pending (the API server stores it only after the
    /// answer) unless the cache already shows it, which a real change cannot (an UPDATE of a
    /// version the cache has since replaced, a CREATE of a name that exists: forged), so that
    /// one earns its caller nothing.
    pub(super) fn seen_own(&self, change: &PendingChange, cache: &Cache) {
        self.first_seen(change);
        // Before the cache has listed quotas, a change missing from it is not pending.
        if shown(change, cache) != Some(false) {
            return;
        }
        if let Some(s) = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&change.id)
        {
            s.pending = true;
        }
    }

    /// Looks at every change this replica has seen recorded (still there or already replaced by
    /// a later one) and not judged yet, whether or not anyone waits for it (`sight`): so a forger
    /// racing real changes with fresh entries is known after its first few, not after a few real
    /// changes have each waited for one. At most every [`JUDGE_EVERY`].
    pub(super) fn judge_pending(&self, cache: &Cache) {
        {
            let mut last = self.judged_at.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|at| at.elapsed() < JUDGE_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        // One pass under the lock, no copies: the cache's lookups never wait.
        let judged: Vec<(Option<String>, Sighting)> = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            seen.values_mut()
                .filter_map(|s| {
                    let change = s.change.as_ref()?;
                    let caller = change.caller.clone();
                    let now = shown(change, cache)?;
                    Some((caller, look(s, now)??))
                })
                .collect()
        };
        for (caller, sighting) in judged {
            self.callers.judge(caller.as_deref(), sighting);
        }
    }

    /// One look at a recorded change with the cache at hand, for its caller's trust: not in the
    /// cache, it has been pending; past [`MAX_WAIT`] still not there, it never showed (a strike);
    /// there after having been pending, it showed (a credit). One in the cache from the start
    /// (a DELETE of nothing, a CREATE of a name that exists: what the API server cannot store as
    /// sent) earns nothing, so a forger cannot buy trust with such changes.
    pub(super) fn sight(&self, change: &PendingChange, cache: &Cache) {
        // Nothing is judged against a cache that has not listed quotas yet.
        let Some(now) = shown(change, cache) else {
            return;
        };
        let verdict = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            let Some(s) = seen.get_mut(&change.id) else {
                return;
            };
            look(s, now)
        };
        if let Some(Some(sighting)) = verdict {
            self.callers.judge(change.caller.as_deref(), sighting);
        }
    }
}

/// One look at `s`, shown now or not: `None` while nothing is decided, `Some(None)` once decided
/// with nothing to count (in the cache from the start), `Some(Some(sighting))` a credit or a
/// strike. Decided, it is judged and its change dropped.
fn look(s: &mut Seen, shown_now: bool) -> Option<Option<Sighting>> {
    if s.judged {
        return None;
    }
    let old = s.at.elapsed() >= MAX_WAIT;
    let verdict = match (shown_now, s.pending) {
        (false, _) => {
            s.pending = true;
            old.then_some(Some(Sighting::NeverShown))
        }
        (true, true) => Some(Some(Sighting::Shown)),
        (true, false) => old.then_some(None),
    };
    if verdict.is_some() {
        s.judged = true;
        s.change = None;
    }
    verdict
}

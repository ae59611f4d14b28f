//! ElasticQuota changes that can meet admitted one at a time, across every replica.
//!
//! Each replica checks the tree rules against its own cache, so two sibling creates that land on two
//! replicas would both pass the min-sum check. The ledger serialises them through the API server, the
//! way the API server's own ResourceQuota admission serialises on the quota object's
//! resourceVersion: one shared record (a ConfigMap in cluster mode) names, per key, the last admitted
//! change, and a replica may admit the next one only
//! 1. once the last change of each of its keys is visible in its own cache (the watch has delivered
//!    it, and with it every change before it), or this replica has seen it pending for
//!    [`MAX_WAIT`] (a real change shows within milliseconds; one still missing was denied by a
//!    later admission step, its request timed out, or it is a review forged by a caller that is not
//!    the API server);
//! 2. after checking the rules against that cache; and
//! 3. by writing itself as the last change of its keys, conditional on the record's version it
//!    read. Two replicas that both passed step 2 cannot both win step 3: the loser reads again and,
//!    if they share a key, checks against a cache that now holds the winner's change.
//!
//! Step 3 is batched per replica ([`Ledger`]: one write for every queued change with keys of its
//! own, from the record this replica last wrote), and after a lost write a change checks again only
//! if one of its keys moved (`still_valid`).
//!
//! The keys ([`keys_of`]) are what a change can meet: the tree of each quota it touches (old and new
//! parent: the top-most ancestor under the root quota, by the cache) and each namespace it binds.
//! Changes in different trees never wait for each other, and a change the API server never stores
//! (a forged review) delays those under its keys by [`MAX_WAIT`] at most and refuses none: they are
//! then checked against the cache without it. Before, it held them for [`PENDING_TIMEOUT`] and
//! refused them (429) after 5 s, renewable by forging again; and before keys, one record held every
//! quota change in the cluster behind it.
//!
//! The record is bounded ([`HARD_MAX_ENTRIES`]) but never full: a write that would go beyond the
//! bound drops entries instead of being refused, those past [`PENDING_TIMEOUT`] first (every
//! replica has stopped waiting for them), then those under keys no cached quota has (a fresh tree
//! or namespace: what forged reviews can name without end), then, level by level, the trees holding
//! the most. Before, young unseen entries were never dropped: 30 forged reviews naming 7 × 128
//! fresh namespaces filled the record, and every ElasticQuota change in the cluster was refused
//! (429) for ~29 s, renewable. Dropping an entry no replica has seen costs only the wait for it,
//! and only changes under its keys: at worst two of those are checked against caches that miss
//! each other, as a replica checking against its own cache alone would check them; and a real
//! change loses its entry that way only to a flood of entries that outnumber it in every tree.
//!
//! A request waits [`MAX_WAIT`] in all; past it, it still waits [`WINNER_WAIT`] for a change that
//! beat it to a write, so forged changes that used up its wait cannot let two racing real changes
//! both pass. Queued changes are written caller by caller in turn (`in_turn`, the server says who
//! called: `admission/caller.rs`), so one caller's backlog cannot starve another's change. A request
//! gets a retryable denial (429), never a wrong admission, only when changes under its keys kept
//! being recorded ahead of it for [`GIVE_UP`]; a caller none of whose changes ever shows is, after
//! a few, not waited for at all; and once a replica's probe through the API server has been
//! answered (`probe.rs`), the API server's address is in the record and no replica records a
//! change of any caller not proven (`callers.rs`).
//! Dry runs change nothing and skip the ledger.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::admission::outcome::Rejection;
use crate::admission::ports::{LedgerRecord, LedgerStore, PendingChange, StoreError};
use crate::cache::Cache;

mod bounds;
mod callers;
mod sightings;
use callers::Trust;
use sightings::Sightings;
mod keys;
pub mod probe;
mod record;
#[cfg(test)]
mod tests;

use bounds::within_the_api_servers_limits;
pub use bounds::{
    BATCH_KEYS, GIVE_UP, HARD_MAX_ENTRIES, MAX_ENTRIES, MAX_WAIT, PENDING_TIMEOUT, POLL,
    WHOLE_RECORD, WINNER_WAIT,
};
use keys::Stored;
pub use keys::{change_of, keys_of, visible};
use record::{next_record, seen_of, waited_for};

/// Writes whose keys a replica remembers (see [`Known::recent`]).
const RECENT_WRITES: usize = 64;
/// Callers whose last write a replica remembers (past it, it forgets them all).
const MAX_CALLERS: usize = 4096;
/// Conflicting writes one flush tries before it lets its changes check again.
const FLUSH_ATTEMPTS: usize = 4;

/// The ledger as admission uses it: the store, the record as this replica last read or wrote it,
/// the changes waiting for the next write, and when this replica first saw each change.
///
/// Checked changes are written in batches (group commit): a request that has checked its change
/// queues it and starts a flush; a flush takes the writer lock and writes every queued change
/// whose keys no other change of the batch has, in one conditional write. So the record's one
/// ConfigMap takes one write per batch, not one read and one write per change, and a replica's
/// concurrent admissions in different trees never conflict with each other.
pub struct Ledger {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn LedgerStore>,
    /// What this replica has seen of the record, and whose changes show up.
    sightings: Sightings,
    /// Timeout of each call to the store.
    call_timeout: Duration,
    /// Checked changes waiting for the next flush.
    queue: Mutex<Vec<Queued>>,
    /// The record as this replica knows it; held by the flush that writes.
    known: tokio::sync::Mutex<Known>,
    /// When each caller last had a change written: of callers in the same turn, the one written
    /// longest ago goes first.
    won: Mutex<HashMap<Option<std::net::IpAddr>, Instant>>,
    /// The replica's prober, woken by a change of a caller no proof names (`Ledger::nudging`).
    nudge: Option<Arc<tokio::sync::Notify>>,
}

/// The record as this replica last read or wrote it.
#[derive(Default)]
struct Known {
    record: Option<Arc<LedgerRecord>>,
    /// Counts reads from the store: within one epoch every change to the record was this replica's.
    epoch: u64,
    /// This replica's writes in this epoch.
    writes: u64,
    /// The keys of the last [`RECENT_WRITES`] writes of this epoch, by write count: what tells a
    /// change that saw a key empty whether a write since filled it (and then dropped it again).
    recent: VecDeque<(u64, BTreeSet<String>)>,
}

/// What a change was checked against.
#[derive(Clone)]
struct Snapshot {
    record: Arc<LedgerRecord>,
    epoch: u64,
    writes: u64,
}

/// A checked change waiting to be written.
struct Queued {
    change: PendingChange,
    keys: BTreeSet<String>,
    /// The last change of each key (and an older replica's, if any) when it was checked.
    seen: BTreeMap<String, Option<String>>,
    version: String,
    epoch: u64,
    writes: u64,
    /// What tells the flush which entries this replica has seen.
    cache: Cache,
    /// When its request started trying, and who sent it: each caller's queued changes are written
    /// oldest first, the callers in turn, so neither changes that keep arriving nor one caller's
    /// many can keep another's change from being recorded.
    since: Instant,
    caller: Option<std::net::IpAddr>,
    reply: oneshot::Sender<Verdict>,
}

/// What became of a queued change.
#[derive(Debug)]
enum Verdict {
    Recorded,
    /// Its caller is not the API server's, which the record now names: checked, not recorded.
    Unrecorded,
    /// A change under one of its keys was recorded since it was checked: wait for it, check again.
    Stale,
    Failed(String),
}

impl Ledger {
    pub fn new(store: Arc<dyn LedgerStore>) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                sightings: Sightings::default(),
                call_timeout: Duration::from_secs(2),
                queue: Mutex::default(),
                known: tokio::sync::Mutex::default(),
                won: Mutex::default(),
                nudge: None,
            }),
        }
    }

    /// Wakes `nudge` (the replica's prober) when a change comes from a caller no proof names while
    /// another is proven: if it is the API server calling from a new address, a probe proves it.
    pub fn nudging(mut self, nudge: Option<Arc<tokio::sync::Notify>>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.nudge = nudge;
        }
        self
    }

    /// Admits one change: waits for the last change of each of its keys (`keys`, read again after
    /// each wait: a tree can move), runs `check` against the cache, records the change. `check`
    /// returns what to apply locally once the change is recorded.
    pub async fn admit<A>(
        &self,
        change: PendingChange,
        keys: impl Fn() -> BTreeSet<String>,
        cache: &Cache,
        mut check: impl FnMut() -> Result<A, Rejection>,
    ) -> Result<A, Rejection> {
        within_the_api_servers_limits(&change)?;
        if keys::superseded(&change, cache) {
            // An UPDATE of a version the cache has replaced cannot be stored as reviewed (the API
            // server reviews it again on the newer version): checked, neither waited for nor
            // recorded, so a flood of them writes nothing and earns its sender nothing.
            return check();
        }
        let caller = crate::admission::caller::current().map(|ip| ip.to_string());
        if self.inner.sightings.callers.unrecorded(caller.as_deref()) {
            // None of this caller's changes ever showed, or the API server is known and this is
            // not it: checked against the cache, neither waiting nor recorded (so a forger's stream
            // never writes the record), and watched like a recorded one: if it shows, its caller
            // is no longer distrusted.
            self.inner.sightings.judge_pending(cache);
            if let Some(nudge) = &self.inner.nudge
                && !self.inner.sightings.callers.distrusted(caller.as_deref())
            {
                nudge.notify_one();
            }
            let applied = check()?;
            self.inner
                .sightings
                .seen_own(&PendingChange { caller, ..change }, cache);
            return Ok(applied);
        }
        let started = Instant::now();
        // Whether a change was recorded under its keys after it checked (it lost a write).
        let mut lost = false;
        loop {
            let snapshot = self.inner.snapshot().await.map_err(|e| unavailable(&e))?;
            let record = &snapshot.record;
            self.inner.sightings.judge_pending(cache);
            let wanted = keys();
            for last in waited_for(&record.last, &wanted, &change.id) {
                let first_seen = self.inner.sightings.first_seen(last);
                let trust = self.inner.sightings.callers.trust(last.caller.as_deref());
                if trust == Trust::Distrusted {
                    // Not waited for (looked at: shown after pending, it wins its caller back).
                    self.inner.sightings.sight(last, cache);
                    continue;
                }
                // Within its own MAX_WAIT a request waits for each change up to MAX_WAIT from when
                // this replica first saw it; past it (forged changes before it may have used it
                // up), only for a change that beat it to a write: that one was admitted after it
                // checked, so it is checked again against a cache that holds it. For as long
                // again if its caller's changes have shown before (the API server's), WINNER_WAIT
                // if nothing is known of its caller yet.
                let failing = || {
                    self.inner
                        .sightings
                        .callers
                        .failing_lately(last.caller.as_deref())
                };
                let winner_wait = match trust {
                    Trust::Trusted if !failing() => MAX_WAIT,
                    _ => WINNER_WAIT,
                };
                let waits = |first_seen: Instant| {
                    (started.elapsed() < MAX_WAIT && first_seen.elapsed() < MAX_WAIT)
                        || (lost && first_seen.elapsed() < winner_wait)
                };
                while !visible(last, cache) && waits(first_seen) {
                    if started.elapsed() >= GIVE_UP {
                        return Err(busy(last));
                    }
                    self.inner.sightings.sight(last, cache);
                    self.inner.observe().await;
                    tokio::time::sleep(POLL).await;
                }
                self.inner.sightings.sight(last, cache);
            }
            if keys() != wanted {
                // The cache moved a quota between trees while we waited: wait for the new ones.
                continue;
            }
            if wanted.len() > BATCH_KEYS {
                return Err(Rejection::invalid(format!(
                    "this ElasticQuota change touches {} quota trees and bound namespaces; at most {BATCH_KEYS} \
                     can be admitted in one change",
                    wanted.len()
                )));
            }
            let applied = check()?;
            let (reply, verdict) = oneshot::channel();
            let queued = Queued {
                seen: seen_of(&record.last, &wanted, &change.id),
                change: change.clone(),
                keys: wanted,
                version: record.version.clone(),
                epoch: snapshot.epoch,
                writes: snapshot.writes,
                cache: cache.clone(),
                since: started,
                caller: crate::admission::caller::current(),
                reply,
            };
            self.inner.enqueue(queued);
            tokio::spawn(self.inner.clone().flush());
            match verdict.await {
                Ok(Verdict::Recorded | Verdict::Unrecorded) => {
                    // Seen as recorded, with its caller: judged like any other.
                    self.inner
                        .sightings
                        .seen_own(&PendingChange { caller, ..change }, cache);
                    return Ok(applied);
                }
                // Another change under its keys was recorded first: wait for it and check again.
                Ok(Verdict::Stale) => {
                    lost = true;
                    if started.elapsed() >= GIVE_UP {
                        let last = record.last.get(WHOLE_RECORD).unwrap_or(&change);
                        return Err(busy(last));
                    }
                }
                Ok(Verdict::Failed(why)) => return Err(unavailable(&why)),
                Err(_) => return Err(unavailable("the write was abandoned")),
            }
        }
    }
}

impl Inner {
    /// While a request waits, reads the record now and then only to see what is recorded
    /// meanwhile (`Sightings::time_to_observe`).
    async fn observe(&self) {
        if !self.sightings.time_to_observe() {
            return;
        }
        if let Ok(record) = self.call(self.store.read()).await {
            self.sightings.saw_record(&record);
            self.sightings.callers.adopt(&record.proven);
        }
    }

    /// The record as this replica knows it, read from the store when it does not.
    async fn snapshot(&self) -> Result<Snapshot, String> {
        let mut known = self.known.lock().await;
        let record = match &known.record {
            Some(record) => record.clone(),
            None => self.reread(&mut known).await?,
        };
        Ok(Snapshot {
            record,
            epoch: known.epoch,
            writes: known.writes,
        })
    }

    /// Reads the record from the store: a new epoch.
    async fn reread(&self, known: &mut Known) -> Result<Arc<LedgerRecord>, String> {
        known.record = None;
        let record = Arc::new(
            self.call(self.store.read())
                .await
                .map_err(|e| e.to_string())?,
        );
        // Seen now, whoever waits for them later: a change's wait counts from here.
        self.sightings.saw_record(&record);
        self.sightings.callers.adopt(&record.proven);
        *known = Known {
            record: Some(record.clone()),
            epoch: known.epoch + 1,
            writes: 0,
            recent: VecDeque::new(),
        };
        Ok(record)
    }

    fn enqueue(&self, queued: Queued) {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(queued);
    }

    /// Writes what is queued (nothing if an earlier flush took it): the changes still valid
    /// against the record, one per key, in one conditional write; after a conflict, against the
    /// record read again. Every queued change gets its verdict.
    fn flush(self: Arc<Self>) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(async move {
            let mut deferred = Vec::new();
            self.write_queued(&mut deferred).await;
            if !deferred.is_empty() {
                // What did not fit this write: the flush that would have written it has run.
                for q in deferred {
                    self.enqueue(q);
                }
                tokio::spawn(self.clone().flush());
            }
        })
    }

    async fn write_queued(&self, deferred: &mut Vec<Queued>) {
        let mut known = self.known.lock().await;
        let mut queued = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|p| p.into_inner()));
        queued = in_turn(queued, &self.won.lock().unwrap_or_else(|p| p.into_inner()));
        for _ in 0..FLUSH_ATTEMPTS {
            if queued.is_empty() {
                return;
            }
            let record = match &known.record {
                Some(record) => record.clone(),
                None => match self.reread(&mut known).await {
                    Ok(record) => record,
                    Err(why) => return reply_all(queued, || Verdict::Failed(why.clone())),
                },
            };
            let mut batch: Vec<Queued> = Vec::new();
            let mut taken = BTreeSet::new();
            // The record read may name the API server since the change was checked.
            let (unrecorded, recorded): (Vec<Queued>, Vec<Queued>) =
                std::mem::take(&mut queued).into_iter().partition(|q| {
                    let caller = q.caller.map(|ip| ip.to_string());
                    self.sightings.callers.unrecorded(caller.as_deref())
                });
            reply_all(unrecorded, || Verdict::Unrecorded);
            for q in recorded {
                let fits = taken.len() + q.keys.len() <= BATCH_KEYS || batch.is_empty();
                // Only a distrusted caller's entry leaves a checked change valid: one written over
                // any other may have displaced a real change this one never saw (an outside
                // review's search found two siblings both admitted when a trusted caller's change
                // was written over unknown callers' entries past its wait).
                let not_waited_for =
                    |c: &PendingChange| self.sightings.callers.distrusted(c.caller.as_deref());
                if !still_valid(&q, &record, &known, not_waited_for)
                    || q.keys.iter().any(|k| taken.contains(k))
                {
                    let _ = q.reply.send(Verdict::Stale);
                } else if !fits {
                    deferred.push(q);
                } else {
                    taken.extend(q.keys.iter().cloned());
                    batch.push(q);
                }
            }
            if batch.is_empty() {
                return;
            }
            let now = jiff::Timestamp::now().as_second();
            let recorded: Vec<(&BTreeSet<String>, PendingChange)> = batch
                .iter()
                .map(|q| {
                    let change = PendingChange {
                        at: now,
                        caller: q.caller.map(|ip| ip.to_string()),
                        ..q.change.clone()
                    };
                    (&q.keys, change)
                })
                .collect();
            let cache = &batch[0].cache;
            let next = {
                let topology = cache.topology();
                let stored = Stored::new(&topology);
                next_record(
                    &record.last,
                    &recorded,
                    now,
                    |c| visible(c, cache),
                    |k| stored.holds(k),
                )
            };
            let proven = record.proven.clone();
            match self
                .call(self.store.write(&record.version, &next, &proven))
                .await
            {
                Ok(version) => {
                    known.writes += 1;
                    let writes = known.writes;
                    known.recent.push_back((writes, taken));
                    if known.recent.len() > RECENT_WRITES {
                        known.recent.pop_front();
                    }
                    known.record = Some(Arc::new(LedgerRecord {
                        version,
                        last: next,
                        proven,
                    }));
                    self.note_won(&batch);
                    return reply_all(batch, || Verdict::Recorded);
                }
                // Another replica wrote since this one read: read again, keep what still holds.
                Err(StoreError::Conflict) => {
                    if let Err(why) = self.reread(&mut known).await {
                        return reply_all(batch, || Verdict::Failed(why.clone()));
                    }
                    queued = batch;
                }
                Err(e) => {
                    // Whether it was written is unknown: read before the next write.
                    known.record = None;
                    return reply_all(batch, || Verdict::Failed(e.to_string()));
                }
            }
        }
        reply_all(queued, || Verdict::Stale);
    }

    fn note_won(&self, batch: &[Queued]) {
        let mut won = self.won.lock().unwrap_or_else(|p| p.into_inner());
        if won.len() > MAX_CALLERS {
            won.clear();
        }
        let now = Instant::now();
        for q in batch {
            won.insert(q.caller, now);
        }
    }

    /// A store call bounded by the call timeout.
    async fn call<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.call_timeout, call)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Other(
                    "the API server did not answer in time".to_owned(),
                ))
            })
    }
}

fn reply_all(queued: Vec<Queued>, verdict: impl Fn() -> Verdict) {
    for q in queued {
        // A request that gave up no longer listens.
        let _ = q.reply.send(verdict());
    }
}

/// Whether a queued change's check still holds against `record`: no change was recorded under
/// its keys since. Where it saw a change, the same change must still be the last; where it saw
/// none, none may be there now, and no write since may have put one there and dropped it again
/// (known only for this replica's own writes since, so after another replica's write it checks
/// again).
fn still_valid(
    q: &Queued,
    record: &LedgerRecord,
    known: &Known,
    not_waited_for: impl Fn(&PendingChange) -> bool,
) -> bool {
    let now = seen_of(&record.last, &q.keys, &q.change.id);
    // A key moved to a change this one would not wait for (a distrusted caller's; past its budget,
    // an unknown caller's too) leaves the check against the cache as it was: a forger's stream of
    // entries cannot keep a checked change from being written.
    let moved_to_trusted = now.iter().any(|(key, id)| {
        q.seen.get(key) != Some(id)
            && !record
                .last
                .get(key)
                .is_some_and(|c| Some(&c.id) == id.as_ref() && not_waited_for(c))
    });
    if moved_to_trusted || q.seen.keys().any(|k| !now.contains_key(k)) {
        return false;
    }
    if record.version == q.version {
        return true;
    }
    let mut empty = q
        .seen
        .iter()
        .filter(|(_, id)| id.is_none())
        .map(|(k, _)| k)
        .peekable();
    if empty.peek().is_none() {
        return true;
    }
    let all_writes_remembered = known.writes == q.writes
        || known
            .recent
            .front()
            .is_some_and(|(w, _)| *w <= q.writes + 1);
    q.epoch == known.epoch
        && all_writes_remembered
        && empty.all(|k| {
            !known
                .recent
                .iter()
                .any(|(w, keys)| *w > q.writes && keys.contains(k))
        })
}

/// Orders queued changes by caller in turn: every caller's oldest, then every caller's second
/// oldest, and so on; within a turn, the caller written longest ago first (`won`), then by age.
fn in_turn(queued: Vec<Queued>, won: &HashMap<Option<std::net::IpAddr>, Instant>) -> Vec<Queued> {
    let mut queued = queued;
    queued.sort_by_key(|q| q.since);
    let mut taken: HashMap<Option<std::net::IpAddr>, usize> = HashMap::new();
    let mut turns: Vec<(usize, Queued)> = queued
        .into_iter()
        .map(|q| {
            let turn = taken.entry(q.caller).or_default();
            *turn += 1;
            (*turn, q)
        })
        .collect();
    // Stable: within a turn and a caller's last write, the order by age stays.
    turns.sort_by_key(|(turn, q)| (*turn, won.get(&q.caller).copied()));
    turns.into_iter().map(|(_, q)| q).collect()
}

fn busy(last: &PendingChange) -> Rejection {
    Rejection {
        code: 429,
        message: format!(
            "another ElasticQuota change ({}/{}) is still being admitted; retry in a few seconds",
            last.namespace, last.name
        ),
    }
}

fn unavailable(why: &str) -> Rejection {
    Rejection {
        code: 503,
        message: format!(
            "cannot serialise ElasticQuota changes through the API server ({why}); retry"
        ),
    }
}

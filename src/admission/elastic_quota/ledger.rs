//! ElasticQuota changes that can meet admitted one at a time, across every replica.
//!
//! Each replica checks the tree rules against its own cache, so two sibling creates that land on two
//! replicas would both pass the min-sum check. The ledger serialises them through the API server, the
//! way the API server's own ResourceQuota admission serialises on the quota object's
//! resourceVersion: one shared record (a ConfigMap in cluster mode) names, per key, the last admitted
//! change, and a replica may admit the next one only
//! 1. once the last change of each of its keys is visible in its own cache (the watch has delivered
//!    it, and with it every change before it), or has been pending so long ([`PENDING_TIMEOUT`], on
//!    this replica's clock) that it will not happen (denied by a later admission step, its request
//!    timed out, or a review forged by a caller that is not the API server);
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
//! Changes in different trees never wait for each other, so a change the API server never stores
//! (a forged review) holds up only the trees it names, for [`PENDING_TIMEOUT`]. Before, one record
//! held every quota change in the cluster behind it: one forged review every ~10 s kept every quota
//! change answering 429.
//!
//! A request that waits longer than [`MAX_WAIT`] gets a retryable denial (429), never a wrong
//! admission. Dry runs change nothing and skip the ledger.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::core::admission::Operation;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::admission::outcome::Rejection;
use crate::admission::ports::{ChangeKind, LedgerRecord, LedgerStore, PendingChange, StoreError};
use crate::apis::ElasticQuota;
use crate::apis::keys::ROOT_QUOTA;
use crate::cache::Cache;
use crate::cache::quota_topology::{QuotaInfo, QuotaTopology};

/// After this long (on the local clock, from when this replica first saw it) a change still not in
/// the cache is taken as not happening. Longer than the API server's webhook timeout (10 s).
pub const PENDING_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest a request waits for the changes before it; then a retryable denial.
pub const MAX_WAIT: Duration = Duration::from_secs(5);
/// How often a waiting request looks at its cache again.
pub const POLL: Duration = Duration::from_millis(10);
/// The record's key replicas read before keyed ledgers: still written (the newest change), and
/// waited for when a replica of such a version wrote it (its change is under no other key).
pub const WHOLE_RECORD: &str = "last-change";
/// Entries the record keeps at most (the oldest go first); entries older than twice
/// [`PENDING_TIMEOUT`] go in any case: nobody waits for them any more.
pub const MAX_ENTRIES: usize = 256;
/// Keys one write records at most, and one change may have: a batch leaves room in the record
/// for what others wait for.
pub const BATCH_KEYS: usize = MAX_ENTRIES / 2;
/// Entries the record may grow to when more than [`MAX_ENTRIES`] are still young and not yet seen
/// here: none of those is dropped (another replica may still have to wait for it); beyond this
/// changes are refused (429) until they have been seen (~200 KiB, within a ConfigMap's 1 MiB).
pub const HARD_MAX_ENTRIES: usize = MAX_ENTRIES * 4;
/// An entry this replica's cache shows may leave a full record once it is this old (seconds): the
/// other replicas' watches have had the time to deliver it too.
const SEEN_GRACE_SECONDS: i64 = 2;
/// Writes whose keys a replica remembers (see [`Known::recent`]).
const RECENT_WRITES: usize = 64;
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
    /// Change id -> when this replica first saw it as someone's last change.
    seen: Mutex<HashMap<String, Instant>>,
    /// Timeout of each call to the store.
    call_timeout: Duration,
    /// Checked changes waiting for the next flush.
    queue: Mutex<Vec<Queued>>,
    /// The record as this replica knows it; held by the flush that writes.
    known: tokio::sync::Mutex<Known>,
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
    reply: oneshot::Sender<Verdict>,
}

/// What became of a queued change.
#[derive(Debug)]
enum Verdict {
    Recorded,
    /// A change under one of its keys was recorded since it was checked: wait for it, check again.
    Stale,
    /// The record holds [`HARD_MAX_ENTRIES`] changes not yet seen.
    Full,
    Failed(String),
}

impl Ledger {
    pub fn new(store: Arc<dyn LedgerStore>) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                seen: Mutex::default(),
                call_timeout: Duration::from_secs(2),
                queue: Mutex::default(),
                known: tokio::sync::Mutex::default(),
            }),
        }
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
        let started = Instant::now();
        loop {
            let snapshot = self.inner.snapshot().await.map_err(|e| unavailable(&e))?;
            let record = &snapshot.record;
            let wanted = keys();
            for last in waited_for(&record.last, &wanted, &change.id) {
                let first_seen = self.inner.first_seen(&last.id);
                while !visible(last, cache) && first_seen.elapsed() < PENDING_TIMEOUT {
                    if started.elapsed() >= MAX_WAIT {
                        return Err(busy(last));
                    }
                    tokio::time::sleep(POLL).await;
                }
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
                reply,
            };
            self.inner.enqueue(queued);
            tokio::spawn(self.inner.clone().flush());
            match verdict.await {
                Ok(Verdict::Recorded) => {
                    self.inner.first_seen(&change.id);
                    return Ok(applied);
                }
                // Another change under its keys was recorded first: wait for it and check again.
                Ok(Verdict::Stale) => {
                    if started.elapsed() >= MAX_WAIT {
                        let last = record.last.get(WHOLE_RECORD).unwrap_or(&change);
                        return Err(busy(last));
                    }
                }
                Ok(Verdict::Full) => return Err(full()),
                Ok(Verdict::Failed(why)) => return Err(unavailable(&why)),
                Err(_) => return Err(unavailable("the write was abandoned")),
            }
        }
    }
}

impl Inner {
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
            for q in queued {
                let fits = taken.len() + q.keys.len() <= BATCH_KEYS || batch.is_empty();
                if !still_valid(&q, &record, &known) || q.keys.iter().any(|k| taken.contains(k)) {
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
                        ..q.change.clone()
                    };
                    (&q.keys, change)
                })
                .collect();
            let cache = &batch[0].cache;
            let Some(next) = next_record(&record.last, &recorded, now, |c| visible(c, cache))
            else {
                return reply_all(batch, || Verdict::Full);
            };
            match self.call(self.store.write(&record.version, &next)).await {
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
                    }));
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

    /// When this replica first saw the change `id`; forgets what no one can wait for any more.
    fn first_seen(&self, id: &str) -> Instant {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if seen.len() > MAX_ENTRIES * 4 {
            seen.retain(|_, at| now.duration_since(*at) < PENDING_TIMEOUT * 2);
        }
        *seen.entry(id.to_owned()).or_insert(now)
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

/// The last change of each of `keys` other than `id` itself, and an older replica's change under
/// the whole record's key only (see [`waited_for`]): what a check was made after.
fn seen_of(
    last: &BTreeMap<String, PendingChange>,
    keys: &BTreeSet<String>,
    id: &str,
) -> BTreeMap<String, Option<String>> {
    let mut seen: BTreeMap<String, Option<String>> = keys
        .iter()
        .map(|k| (k.clone(), last.get(k).map(|c| c.id.clone())))
        .collect();
    if let Some(whole) = orphan_whole(last)
        && whole.id != id
    {
        seen.insert(WHOLE_RECORD.to_owned(), Some(whole.id.clone()));
    }
    seen
}

/// Whether a queued change's check still holds against `record`: no change was recorded under
/// its keys since. Where it saw a change, the same change must still be the last; where it saw
/// none, none may be there now, and no write since may have put one there and dropped it again
/// (known only for this replica's own writes since, so after another replica's write it checks
/// again).
fn still_valid(q: &Queued, record: &LedgerRecord, known: &Known) -> bool {
    if seen_of(&record.last, &q.keys, &q.change.id) != q.seen {
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

/// The whole record's change when no other key names it: an older replica wrote it.
fn orphan_whole(last: &BTreeMap<String, PendingChange>) -> Option<&PendingChange> {
    let whole = last.get(WHOLE_RECORD)?;
    let named = last
        .iter()
        .any(|(k, c)| k != WHOLE_RECORD && c.id == whole.id);
    (!named).then_some(whole)
}

/// The last changes a change with `keys` waits for: its keys' (other than itself), and the whole
/// record's when an older replica wrote it (it is then under no other key).
fn waited_for<'a>(
    last: &'a BTreeMap<String, PendingChange>,
    keys: &BTreeSet<String>,
    id: &str,
) -> Vec<&'a PendingChange> {
    let mut waited: Vec<&PendingChange> = keys.iter().filter_map(|k| last.get(k)).collect();
    waited.extend(orphan_whole(last));
    waited.retain(|c| c.id != id);
    waited.sort_by(|a, b| a.id.cmp(&b.id));
    waited.dedup_by(|a, b| a.id == b.id);
    waited
}

/// The record after `changes` (disjoint keys each) are admitted at `now`, each the last of its keys
/// and the last of them the last of the whole. Entries older than twice [`PENDING_TIMEOUT`] leave;
/// beyond [`MAX_ENTRIES`], the oldest of those `seen` here for [`SEEN_GRACE_SECONDS`] leave too, and
/// no other: a young change no replica may have seen stays, up to [`HARD_MAX_ENTRIES`] (`None`
/// beyond: the changes wait).
fn next_record(
    last: &BTreeMap<String, PendingChange>,
    changes: &[(&BTreeSet<String>, PendingChange)],
    now: i64,
    seen: impl Fn(&PendingChange) -> bool,
) -> Option<BTreeMap<String, PendingChange>> {
    let horizon = (PENDING_TIMEOUT * 2).as_secs() as i64;
    let written = |k: &String| changes.iter().any(|(keys, _)| keys.contains(k));
    let mut kept: Vec<(&String, &PendingChange)> = last
        .iter()
        .filter(|(k, c)| *k != WHOLE_RECORD && !written(k) && now - c.at < horizon)
        .collect();
    let new_keys: usize = changes.iter().map(|(keys, _)| keys.len()).sum();
    let mut over = (kept.len() + new_keys + 1).saturating_sub(MAX_ENTRIES);
    if over > 0 {
        // Oldest first; among those of one second, in key order (the record's own).
        kept.sort_by_key(|(_, c)| c.at);
        kept.retain(|(_, c)| {
            let leaves = over > 0 && now - c.at >= SEEN_GRACE_SECONDS && seen(c);
            over -= usize::from(leaves);
            !leaves
        });
    }
    if kept.len() + new_keys + 1 > HARD_MAX_ENTRIES {
        return None;
    }
    let mut next: BTreeMap<String, PendingChange> = kept
        .into_iter()
        .map(|(k, c)| (k.clone(), c.clone()))
        .collect();
    for (keys, change) in changes {
        for key in keys.iter() {
            next.insert(key.clone(), change.clone());
        }
    }
    if let Some((_, newest)) = changes.last() {
        next.insert(WHOLE_RECORD.to_owned(), newest.clone());
    }
    Some(next)
}

/// What a change can meet, as ledger keys: the tree of each quota it touches, before and after
/// (`t.<top-most ancestor under the root>`, by the cache's topology), and each namespace it binds
/// before and after (`n.<namespace>`). A name a ConfigMap key cannot hold (too long, or with other
/// characters than `-._a-zA-Z0-9`: only a forged or hand-written annotation has one) is keyed by
/// its digest instead (`t-`, `n-`), so every change can be recorded.
pub fn keys_of(
    topology: &QuotaTopology,
    object: Option<&ElasticQuota>,
    old: Option<&ElasticQuota>,
) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let infos = [object, old]
        .into_iter()
        .flatten()
        .map(QuotaInfo::from_quota)
        .collect::<Vec<_>>();
    let stored = infos.first().and_then(|i| topology.get(&i.name)).cloned();
    for info in infos.iter().chain(stored.as_ref()) {
        keys.insert(key("t", tree_of(topology, &info.name, &info.parent)));
        for namespace in &info.namespaces {
            keys.insert(key("n", namespace));
        }
    }
    keys
}

/// The ledger key of `name` under `prefix` (`t` or `n`).
fn key(prefix: &str, name: &str) -> String {
    let fits = !name.is_empty()
        && name.len() <= 250
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if fits {
        format!("{prefix}.{name}")
    } else {
        let digest = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
        let hex: String = digest.as_ref()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{prefix}-{hex}")
    }
}

/// The top-most quota under the root above `name` whose parent is `parent` (itself for a quota
/// directly under the root; an unknown ancestor ends the walk).
fn tree_of<'a>(topology: &'a QuotaTopology, name: &'a str, parent: &'a str) -> &'a str {
    let (mut top, mut next) = (name, parent);
    // At most one step per quota: a cycle in a stale cache ends the walk too.
    for _ in 0..=topology.len() {
        if next.is_empty() || next == ROOT_QUOTA {
            break;
        }
        top = next;
        next = topology.get(next).map_or("", |i| i.parent.as_str());
    }
    top
}

/// The change a request makes, as the ledger records it; `None` for what changes nothing.
pub fn change_of(
    uid: &str,
    operation: &Operation,
    object: Option<&ElasticQuota>,
    old: Option<&ElasticQuota>,
) -> Option<PendingChange> {
    let (kind, quota) = match operation {
        Operation::Create => (ChangeKind::Create, object?),
        Operation::Update => (ChangeKind::Update, old.or(object)?),
        Operation::Delete => (ChangeKind::Delete, old?),
        Operation::Connect => return None,
    };
    Some(PendingChange {
        id: uid.to_owned(),
        namespace: quota.metadata.namespace.clone().unwrap_or_default(),
        name: quota.metadata.name.clone().unwrap_or_default(),
        operation: kind,
        resource_version: match kind {
            ChangeKind::Update => quota.metadata.resource_version.clone(),
            _ => None,
        },
        at: 0,
    })
}

/// Whether `change` has reached the cache: created, updated past the version it changed, or gone.
pub fn visible(change: &PendingChange, cache: &Cache) -> bool {
    let current = cache
        .elastic_quotas
        .get(Some(&change.namespace), &change.name);
    match change.operation {
        ChangeKind::Create => current.is_some(),
        ChangeKind::Update => {
            current.is_none_or(|q| q.metadata.resource_version != change.resource_version)
        }
        ChangeKind::Delete => current.is_none_or(|q| q.metadata.deletion_timestamp.is_some()),
    }
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

fn full() -> Rejection {
    Rejection {
        code: 429,
        message: format!(
            "{HARD_MAX_ENTRIES} ElasticQuota changes are still being admitted across replicas; retry in a \
             few seconds"
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::ports::LedgerRecord;
    use crate::admission::ports::memory::MemoryLedgerStore;
    use crate::cache::{CacheWriter, CachedObject};
    use futures::future::BoxFuture;

    fn quota(name: &str, version: &str) -> ElasticQuota {
        let mut q: ElasticQuota = serde_json::from_value(serde_json::json!({
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": version},
            "spec": {"max": {"cpu": "1"}}}))
        .unwrap();
        q.metadata.uid = Some(format!("uid-{name}"));
        q
    }

    /// Every change of these tests in one tree, unless a test says otherwise.
    fn tree(name: &str) -> impl Fn() -> BTreeSet<String> + use<> {
        let key = format!("t.{name}");
        move || BTreeSet::from([key.clone()])
    }

    fn create(id: &str, name: &str) -> PendingChange {
        change_of(id, &Operation::Create, Some(&quota(name, "1")), None).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_change_waits_until_the_last_one_is_in_the_cache() {
        let mut writer = CacheWriter::default();
        let cache = writer.reader();
        let store = Arc::new(MemoryLedgerStore::default());
        let a = Ledger::new(store.clone());
        let b = Ledger::new(store.clone());
        // Replica a admits "first"; replica b's next change must wait for it.
        let checks = std::sync::atomic::AtomicUsize::new(0);
        a.admit(create("1", "first"), tree("t"), &cache, || Ok(()))
            .await
            .unwrap();
        let waiting = b.admit(create("2", "second"), tree("t"), &cache, || {
            checks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        let mut waiting = std::pin::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), &mut waiting)
                .await
                .is_err(),
            "b must not check before the first change is visible"
        );
        assert_eq!(checks.load(std::sync::atomic::Ordering::SeqCst), 0);
        writer.apply(CachedObject::ElasticQuota(quota("first", "7")));
        waiting.await.unwrap();
        assert_eq!(checks.load(std::sync::atomic::Ordering::SeqCst), 1);
        let record = store.read().await.unwrap().last;
        assert_eq!(record["t.t"].name, "second");
        assert_eq!(record[WHOLE_RECORD].name, "second");
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_that_never_arrives_blocks_for_a_bounded_time() {
        let cache = CacheWriter::default().reader();
        let store = Arc::new(MemoryLedgerStore::default());
        let a = Ledger::new(store.clone());
        let b = Ledger::new(store);
        a.admit(create("1", "lost"), tree("t"), &cache, || Ok(()))
            .await
            .unwrap();
        // Within MAX_WAIT: a retryable denial naming the change waited for.
        let denied = b
            .admit(create("2", "next"), tree("t"), &cache, || Ok(()))
            .await
            .unwrap_err();
        assert_eq!(denied.code, 429);
        assert!(denied.message.contains("ns/lost"), "{}", denied.message);
        // After PENDING_TIMEOUT on b's clock the lost change no longer blocks.
        tokio::time::advance(PENDING_TIMEOUT).await;
        b.admit(create("3", "next"), tree("t"), &cache, || Ok(()))
            .await
            .unwrap();
    }

    /// A store where, just before this replica's first write, another replica records `other`
    /// under `key`.
    struct OtherWritesFirst {
        inner: MemoryLedgerStore,
        other: Mutex<Option<(String, PendingChange)>>,
    }

    impl LedgerStore for OtherWritesFirst {
        fn read(&self) -> BoxFuture<'_, Result<LedgerRecord, StoreError>> {
            self.inner.read()
        }
        fn write<'a>(
            &'a self,
            version: &'a str,
            last: &'a BTreeMap<String, PendingChange>,
        ) -> BoxFuture<'a, Result<String, StoreError>> {
            if let Some((key, change)) = self.other.lock().unwrap().take() {
                use futures::FutureExt;
                // The memory store answers at once.
                let mut record = self.inner.read().now_or_never().unwrap().unwrap();
                let at = jiff::Timestamp::now().as_second();
                record.last.insert(key, PendingChange { at, ..change });
                let write = self.inner.write(&record.version, &record.last);
                write.now_or_never().unwrap().unwrap();
            }
            self.inner.write(version, last)
        }
    }

    fn other_writes_first(key: &str, change: PendingChange) -> Arc<OtherWritesFirst> {
        Arc::new(OtherWritesFirst {
            inner: MemoryLedgerStore::default(),
            other: Mutex::new(Some((key.to_owned(), change))),
        })
    }

    #[tokio::test]
    async fn a_writer_that_lost_to_a_change_in_its_tree_checks_again() {
        let mut writer = CacheWriter::default();
        let cache = writer.reader();
        // The other replica's change is in the cache already: nothing to wait for but a new check.
        writer.apply(CachedObject::ElasticQuota(quota("other", "3")));
        let store = other_writes_first("t.t", create("0", "other"));
        let ledger = Ledger::new(store.clone());
        let mut checks = 0;
        ledger
            .admit(create("1", "q"), tree("t"), &cache, || {
                checks += 1;
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(checks, 2, "checked again after the other change");
        assert_eq!(store.read().await.unwrap().last["t.t"].name, "q");
        // A rule that fails is the answer, and nothing is recorded.
        let store = Arc::new(MemoryLedgerStore::default());
        let ledger = Ledger::new(store.clone());
        let denied = ledger
            .admit(create("2", "r"), tree("t"), &cache, || -> Result<(), _> {
                Err(Rejection::invalid("min sum exceeds the parent"))
            })
            .await
            .unwrap_err();
        assert_eq!(denied.code, 400);
        assert!(store.read().await.unwrap().last.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_writer_that_lost_to_a_change_in_another_tree_writes_again_unchecked() {
        let mut writer = CacheWriter::default();
        let cache = writer.reader();
        for name in ["other", "q0"] {
            writer.apply(CachedObject::ElasticQuota(quota(name, "2")));
        }
        let store = other_writes_first("t.u", create("o1", "other"));
        let ledger = Ledger::new(store.clone());
        let checks = std::sync::atomic::AtomicUsize::new(0);
        let check = || {
            checks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        };
        // Tree t was empty when checked; after another replica's write nothing tells whether
        // that write put a change there and dropped it, so the change is checked again.
        ledger
            .admit(create("c0", "q0"), tree("t"), &cache, check)
            .await
            .unwrap();
        assert_eq!(checks.swap(0, std::sync::atomic::Ordering::SeqCst), 2);
        // Tree t's last change is c0: a write lost to a change in tree u still holds.
        store
            .other
            .lock()
            .unwrap()
            .replace(("t.u".into(), create("o2", "other")));
        ledger
            .admit(create("c1", "q1"), tree("t"), &cache, check)
            .await
            .unwrap();
        assert_eq!(checks.load(std::sync::atomic::Ordering::SeqCst), 1);
        let last = store.read().await.unwrap().last;
        assert_eq!(
            (last["t.t"].id.as_str(), last["t.u"].id.as_str()),
            ("c1", "o2")
        );
    }

    #[tokio::test]
    async fn concurrent_changes_in_different_trees_share_writes() {
        struct Counting(MemoryLedgerStore, std::sync::atomic::AtomicUsize);
        impl LedgerStore for Counting {
            fn read(&self) -> BoxFuture<'_, Result<LedgerRecord, StoreError>> {
                self.0.read()
            }
            fn write<'a>(
                &'a self,
                version: &'a str,
                last: &'a BTreeMap<String, PendingChange>,
            ) -> BoxFuture<'a, Result<String, StoreError>> {
                self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Box::pin(async move {
                    // A write takes a while, as a round trip to the API server does.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    self.0.write(version, last).await
                })
            }
        }
        let cache = CacheWriter::default().reader();
        let store = Arc::new(Counting(MemoryLedgerStore::default(), 0.into()));
        let ledger = Ledger::new(store.clone());
        let admits = (0..64).map(|i| {
            ledger.admit(
                create(&format!("c{i}"), &format!("q{i}")),
                tree(&format!("tree-{i}")),
                &cache,
                || Ok(()),
            )
        });
        for answer in futures::future::join_all(admits).await {
            answer.unwrap();
        }
        let writes = store.1.load(std::sync::atomic::Ordering::SeqCst);
        assert!(writes < 64 / 4, "64 changes took {writes} writes");
        let last = store.read().await.unwrap().last;
        assert!((0..64).all(|i| last[&format!("t.tree-{i}")].name == format!("q{i}")));
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_changes_in_one_tree_are_written_one_by_one() {
        let mut writer = CacheWriter::default();
        let cache = writer.reader();
        let ledger = Ledger::new(Arc::new(MemoryLedgerStore::default()));
        let checked = Mutex::new(Vec::new());
        let admit = |i: usize| {
            let checked = &checked;
            let cache = &cache;
            let ledger = &ledger;
            async move {
                ledger
                    .admit(
                        create(&format!("c{i}"), &format!("q{i}")),
                        tree("t"),
                        cache,
                        || {
                            checked.lock().unwrap().push(i);
                            Ok(())
                        },
                    )
                    .await
            }
        };
        let mut both = std::pin::pin!(futures::future::join(admit(1), admit(2)));
        // One is recorded; the other waits for it to reach the cache.
        assert!(
            tokio::time::timeout(Duration::from_secs(1), &mut both)
                .await
                .is_err()
        );
        let first = checked.lock().unwrap()[0];
        writer.apply(CachedObject::ElasticQuota(quota(&format!("q{first}"), "5")));
        let (a, b) = both.await;
        a.unwrap();
        b.unwrap();
        let checked = checked.lock().unwrap();
        assert_eq!(checked.last(), Some(&(3 - first)), "{checked:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_that_never_arrives_holds_up_only_its_own_tree() {
        let cache = CacheWriter::default().reader();
        let store = Arc::new(MemoryLedgerStore::default());
        let (forger, other) = (Ledger::new(store.clone()), Ledger::new(store.clone()));
        // A forged create under tree a: never stored.
        forger
            .admit(create("1", "forged"), tree("a"), &cache, || Ok(()))
            .await
            .unwrap();
        // A change in tree b does not wait for it; one in tree a does, then gives up (429).
        other
            .admit(create("2", "real"), tree("b"), &cache, || Ok(()))
            .await
            .unwrap();
        let both = || BTreeSet::from(["t.a".to_owned(), "t.c".to_owned()]);
        let denied = other
            .admit(create("3", "moved"), both, &cache, || Ok(()))
            .await
            .unwrap_err();
        assert_eq!(denied.code, 429);
        assert!(denied.message.contains("ns/forged"), "{}", denied.message);
        let record = store.read().await.unwrap().last;
        assert_eq!(record["t.a"].name, "forged");
        assert_eq!(record["t.b"].name, "real");
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_an_older_replica_recorded_is_waited_for_by_every_key() {
        let cache = CacheWriter::default().reader();
        let store = Arc::new(MemoryLedgerStore::default());
        // An older replica writes the whole-record key only.
        let old = BTreeMap::from([(WHOLE_RECORD.to_owned(), create("1", "old"))]);
        store.write("0", &old).await.unwrap();
        let denied = Ledger::new(store.clone())
            .admit(create("2", "new"), tree("x"), &cache, || Ok(()))
            .await
            .unwrap_err();
        assert!(denied.message.contains("ns/old"), "{}", denied.message);
    }

    #[test]
    fn the_record_drops_old_and_seen_entries_and_keeps_its_size() {
        let at = |id: &str, at: i64| PendingChange {
            at,
            ..create(id, id)
        };
        // Entries of ages 0 to 26 s, more than fit, and one past the horizon.
        let mut last: BTreeMap<String, PendingChange> = (0..MAX_ENTRIES as i64 + 10)
            .map(|i| (format!("t.q{i}"), at(&format!("c{i}"), 1_000 - i / 10)))
            .collect();
        last.insert("t.stale".into(), at("stale", 1_000 - 31));
        let keys = BTreeSet::from(["t.new".to_owned()]);
        let new = [(&keys, at("new", 1_000))];
        // Seen here: the oldest leave first.
        let next = next_record(&last, &new, 1_000, |_| true).unwrap();
        assert_eq!(next.len(), MAX_ENTRIES);
        assert!(
            !next.contains_key("t.stale"),
            "past twice the pending timeout"
        );
        let oldest_kept = next.values().map(|c| c.at).min().unwrap();
        let mut dropped = last.keys().filter(|k| !next.contains_key(*k));
        assert!(
            dropped.all(|k| last[k].at <= oldest_kept),
            "the oldest went first"
        );
        assert_eq!(next["t.new"].id, "new");
        assert_eq!(next[WHOLE_RECORD].id, "new");
        // Not seen here: nothing young leaves, the record grows.
        let next = next_record(&last, &new, 1_000, |_| false).unwrap();
        assert_eq!(next.len(), MAX_ENTRIES + 10 + 2);
        // Seen, but within the grace: stays too.
        let next = next_record(&last, &new, 1_000, |_| true).unwrap();
        assert!(
            last.iter()
                .filter(|(_, c)| c.at > 1_000 - SEEN_GRACE_SECONDS)
                .all(|(k, _)| next.contains_key(k)),
            "younger than the grace"
        );
        // Beyond the hard cap of young unseen changes: refused.
        let young: BTreeMap<String, PendingChange> = (0..HARD_MAX_ENTRIES)
            .map(|i| (format!("n.ns{i}"), at(&format!("y{i}"), 1_000)))
            .collect();
        assert!(next_record(&young, &new, 1_000, |_| false).is_none());
    }

    #[test]
    fn names_a_configmap_key_cannot_hold_are_keyed_by_digest() {
        assert_eq!(key("n", "team-a"), "n.team-a");
        let odd = key("n", "team a");
        assert!(odd.starts_with("n-") && odd.len() == 2 + 32, "{odd}");
        assert_ne!(odd, key("n", "team b"));
        assert!(key("t", &"q".repeat(300)).starts_with("t-"));
        assert!([odd, key("t", "")].iter().all(|k| {
            k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        }));
    }

    #[tokio::test]
    async fn a_change_with_more_keys_than_a_write_holds_is_refused() {
        let cache = CacheWriter::default().reader();
        let ledger = Ledger::new(Arc::new(MemoryLedgerStore::default()));
        let many = || (0..=BATCH_KEYS).map(|i| format!("n.ns{i}")).collect();
        let denied = ledger
            .admit(create("1", "q"), many, &cache, || Ok(()))
            .await
            .unwrap_err();
        assert_eq!(denied.code, 400);
        assert!(denied.message.contains("at most 128"), "{}", denied.message);
    }

    #[test]
    fn keys_name_the_trees_and_namespaces_a_change_touches() {
        let q = |name: &str, parent: Option<&str>, namespaces: &[&str]| -> ElasticQuota {
            let mut labels = serde_json::Map::new();
            if let Some(p) = parent {
                labels.insert(crate::apis::keys::QUOTA_PARENT.into(), p.into());
            }
            let namespaces = serde_json::to_string(namespaces).unwrap();
            serde_json::from_value(serde_json::json!({
                "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                "metadata": {"name": name, "namespace": "ns", "labels": labels,
                             "annotations": {crate::apis::keys::QUOTA_NAMESPACES: namespaces}},
                "spec": {}}))
            .unwrap()
        };
        let (top, mid, other) = (
            q("top", None, &[]),
            q("mid", Some("top"), &[]),
            q("other", None, &[]),
        );
        let topology = QuotaTopology::from_quotas([&top, &mid, &other]);
        let set = |keys: &[&str]| keys.iter().map(|k| k.to_string()).collect::<BTreeSet<_>>();
        // A new leaf under mid: the tree of top; binding a namespace adds it.
        let leaf = q("leaf", Some("mid"), &["team-a"]);
        assert_eq!(
            keys_of(&topology, Some(&leaf), None),
            set(&["n.team-a", "t.top"])
        );
        // mid moved under other: both trees.
        let moved = q("mid", Some("other"), &[]);
        assert_eq!(
            keys_of(&topology, Some(&moved), Some(&mid)),
            set(&["t.other", "t.top"])
        );
        // A top-level quota is its own tree; a parent nobody knows names one.
        assert_eq!(keys_of(&topology, None, Some(&other)), set(&["t.other"]));
        let orphan = q("o", Some("nowhere"), &[]);
        assert_eq!(keys_of(&topology, Some(&orphan), None), set(&["t.nowhere"]));
    }

    #[test]
    fn changes_become_visible_by_kind() {
        let mut writer = CacheWriter::default();
        let cache = writer.reader();
        let update = change_of(
            "u",
            &Operation::Update,
            Some(&quota("q", "5")),
            Some(&quota("q", "5")),
        )
        .unwrap();
        let delete = change_of("d", &Operation::Delete, None, Some(&quota("q", "6"))).unwrap();
        assert!(!visible(&create("c", "q"), &cache));
        assert!(visible(&delete, &cache));
        writer.apply(CachedObject::ElasticQuota(quota("q", "5")));
        assert!(visible(&create("c", "q"), &cache));
        assert!(!visible(&update, &cache), "still at the version it changed");
        assert!(!visible(&delete, &cache));
        writer.apply(CachedObject::ElasticQuota(quota("q", "6")));
        assert!(visible(&update, &cache));
    }
}

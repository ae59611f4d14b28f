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
//! The keys ([`keys_of`]) are what a change can meet: the tree of each quota it touches (old and new
//! parent: the top-most ancestor under the root quota, by the cache) and each namespace it binds.
//! Changes in different trees never wait for each other, so a change the API server never stores
//! (a forged review) holds up only the trees it names, for [`PENDING_TIMEOUT`]. Before, one record
//! held every quota change in the cluster behind it: one forged review every ~10 s kept every quota
//! change answering 429.
//!
//! A request that waits longer than [`MAX_WAIT`] gets a retryable denial (429), never a wrong
//! admission. Dry runs change nothing and skip the ledger.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::core::admission::Operation;
use tokio::time::Instant;

use crate::admission::outcome::Rejection;
use crate::admission::ports::{ChangeKind, LedgerStore, PendingChange, StoreError};
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

/// The ledger as admission uses it: the store, and when this replica first saw each change.
pub struct Ledger {
    store: Arc<dyn LedgerStore>,
    /// Change id -> when this replica first saw it as someone's last change.
    seen: Mutex<HashMap<String, Instant>>,
    /// Timeout of each call to the store.
    call_timeout: Duration,
}

impl Ledger {
    pub fn new(store: Arc<dyn LedgerStore>) -> Self {
        Self {
            store,
            seen: Mutex::default(),
            call_timeout: Duration::from_secs(2),
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
            let record = self
                .call(self.store.read())
                .await
                .map_err(|e| unavailable(&e.to_string()))?;
            let wanted = keys();
            for last in waited_for(&record.last, &wanted, &change.id) {
                let first_seen = self.first_seen(&last.id);
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
            let applied = check()?;
            let now = jiff::Timestamp::now().as_second();
            let recorded = PendingChange {
                at: now,
                ..change.clone()
            };
            let next = next_record(&record.last, &wanted, &recorded, now);
            match self.call(self.store.write(&record.version, &next)).await {
                Ok(()) => {
                    self.first_seen(&change.id);
                    return Ok(applied);
                }
                // Another replica recorded a change since we read: wait for it and check again.
                Err(StoreError::Conflict) => {
                    if started.elapsed() >= MAX_WAIT {
                        let last = record.last.get(WHOLE_RECORD).unwrap_or(&change);
                        return Err(busy(last));
                    }
                }
                Err(e) => return Err(unavailable(&e.to_string())),
            }
        }
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

/// The last changes a change with `keys` waits for: its keys' (other than itself), and the whole
/// record's when an older replica wrote it (it is then under no other key).
fn waited_for<'a>(
    last: &'a BTreeMap<String, PendingChange>,
    keys: &BTreeSet<String>,
    id: &str,
) -> Vec<&'a PendingChange> {
    let mut waited: Vec<&PendingChange> = keys.iter().filter_map(|k| last.get(k)).collect();
    if let Some(whole) = last.get(WHOLE_RECORD)
        && !last
            .iter()
            .any(|(k, c)| k != WHOLE_RECORD && c.id == whole.id)
    {
        waited.push(whole);
    }
    waited.retain(|c| c.id != id);
    waited.sort_by(|a, b| a.id.cmp(&b.id));
    waited.dedup_by(|a, b| a.id == b.id);
    waited
}

/// The record after `change` is admitted under `keys` at `now`: old entries dropped, at most
/// [`MAX_ENTRIES`] kept (the oldest go first), `change` the last of its keys and of the whole.
fn next_record(
    last: &BTreeMap<String, PendingChange>,
    keys: &BTreeSet<String>,
    change: &PendingChange,
    now: i64,
) -> BTreeMap<String, PendingChange> {
    let horizon = (PENDING_TIMEOUT * 2).as_secs() as i64;
    let mut kept: Vec<(&String, &PendingChange)> = last
        .iter()
        .filter(|(k, c)| *k != WHOLE_RECORD && !keys.contains(*k) && now - c.at < horizon)
        .collect();
    kept.sort_by_key(|(_, c)| std::cmp::Reverse(c.at));
    kept.truncate(MAX_ENTRIES.saturating_sub(keys.len() + 1));
    let mut next: BTreeMap<String, PendingChange> = kept
        .into_iter()
        .map(|(k, c)| (k.clone(), c.clone()))
        .collect();
    for key in keys.iter().chain([&WHOLE_RECORD.to_owned()]) {
        next.insert(key.clone(), change.clone());
    }
    next
}

/// What a change can meet, as ledger keys: the tree of each quota it touches, before and after
/// (`t.<top-most ancestor under the root>`, by the cache's topology), and each namespace it binds
/// before and after (`n.<namespace>`). Keys longer than a ConfigMap key may be are cut: two
/// changes that then share a key only wait for each other.
pub fn keys_of(
    topology: &QuotaTopology,
    object: Option<&ElasticQuota>,
    old: Option<&ElasticQuota>,
) -> BTreeSet<String> {
    let key = |prefix: &str, name: &str| {
        let name: String = name.chars().take(250).collect();
        format!("{prefix}.{name}")
    };
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

    #[tokio::test]
    async fn a_losing_writer_checks_again() {
        // The store conflicts once, as when another replica wrote between our read and write.
        struct ConflictOnce(MemoryLedgerStore, std::sync::atomic::AtomicBool);
        impl LedgerStore for ConflictOnce {
            fn read(&self) -> BoxFuture<'_, Result<LedgerRecord, StoreError>> {
                self.0.read()
            }
            fn write<'a>(
                &'a self,
                version: &'a str,
                last: &'a BTreeMap<String, PendingChange>,
            ) -> BoxFuture<'a, Result<(), StoreError>> {
                if self.1.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    return Box::pin(std::future::ready(Err(StoreError::Conflict)));
                }
                self.0.write(version, last)
            }
        }
        let cache = CacheWriter::default().reader();
        let ledger = Ledger::new(Arc::new(ConflictOnce(
            MemoryLedgerStore::default(),
            true.into(),
        )));
        let mut checks = 0;
        ledger
            .admit(create("1", "q"), tree("t"), &cache, || {
                checks += 1;
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(checks, 2);
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
    fn the_record_drops_old_entries_and_keeps_its_size() {
        let at = |id: &str, at: i64| PendingChange {
            at,
            ..create(id, id)
        };
        // Young entries of ages 0 to 26 s, more than fit, and one past the horizon.
        let mut last: BTreeMap<String, PendingChange> = (0..MAX_ENTRIES as i64 + 10)
            .map(|i| (format!("t.q{i}"), at(&format!("c{i}"), 1_000 - i / 10)))
            .collect();
        last.insert("t.stale".into(), at("stale", 1_000 - 31));
        let keys = BTreeSet::from(["t.new".to_owned()]);
        let next = next_record(&last, &keys, &at("new", 1_000), 1_000);
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

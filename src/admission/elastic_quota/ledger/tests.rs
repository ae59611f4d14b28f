//! The ledger against a store in memory: waits, conflicts, batches, the record's size and keys.

use super::keys::key;
use super::*;
use crate::admission::ports::LedgerRecord;
use crate::admission::ports::memory::MemoryLedgerStore;
use crate::apis::ElasticQuota;
use crate::cache::quota_topology::QuotaTopology;
use crate::cache::{CacheWriter, CachedObject};
use futures::future::BoxFuture;
use kube::core::admission::Operation;

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

/// `next_record` with every key stored unless `stored` says otherwise.
fn next(
    last: &BTreeMap<String, PendingChange>,
    new: &[(&BTreeSet<String>, PendingChange)],
    now: i64,
    seen: impl Fn(&PendingChange) -> bool,
    stored: impl Fn(&str) -> bool,
) -> Option<BTreeMap<String, PendingChange>> {
    Some(next_record(last, new, now, seen, stored))
}

fn at(id: &str, at: i64) -> PendingChange {
    PendingChange {
        at,
        ..create(id, id)
    }
}

#[test]
fn the_record_drops_old_and_seen_entries_and_keeps_its_size() {
    // Entries of ages 0 to 26 s, more than fit, and one past the horizon.
    let mut last: BTreeMap<String, PendingChange> = (0..MAX_ENTRIES as i64 + 10)
        .map(|i| (format!("t.q{i}"), at(&format!("c{i}"), 1_000 - i / 10)))
        .collect();
    last.insert("t.stale".into(), at("stale", 1_000 - 31));
    let keys = BTreeSet::from(["t.new".to_owned()]);
    let new = [(&keys, at("new", 1_000))];
    // Seen here: the oldest leave first.
    let next_seen = next(&last, &new, 1_000, |_| true, |_| true).unwrap();
    assert_eq!(next_seen.len(), MAX_ENTRIES);
    assert!(
        !next_seen.contains_key("t.stale"),
        "past twice the pending timeout"
    );
    let oldest_kept = next_seen.values().map(|c| c.at).min().unwrap();
    let mut dropped = last.keys().filter(|k| !next_seen.contains_key(*k));
    assert!(
        dropped.all(|k| last[k].at <= oldest_kept),
        "the oldest went first"
    );
    assert_eq!(next_seen["t.new"].id, "new");
    assert_eq!(next_seen[WHOLE_RECORD].id, "new");
    assert!(
        last.iter()
            .filter(|(_, c)| c.at > 1_000 - SEEN_GRACE_SECONDS)
            .all(|(k, _)| next_seen.contains_key(k)),
        "younger than the grace"
    );
    // Not seen here: those past the pending timeout leave (oldest first), no younger one.
    let next_unseen = next(&last, &new, 1_000, |_| false, |_| true).unwrap();
    assert_eq!(next_unseen.len(), MAX_ENTRIES);
    let pending = PENDING_TIMEOUT.as_secs() as i64;
    assert!(
        last.iter()
            .filter(|(k, _)| !next_unseen.contains_key(*k))
            .all(|(_, c)| 1_000 - c.at >= pending),
        "only entries past the pending timeout left"
    );
    // All young and unseen: nothing leaves, the record grows.
    let young: BTreeMap<String, PendingChange> = (0..MAX_ENTRIES + 10)
        .map(|i| {
            (
                format!("t.q{i}"),
                at(&format!("c{i}"), 1_000 - (i % 14) as i64),
            )
        })
        .collect();
    let grown = next(&young, &new, 1_000, |_| false, |_| true).unwrap();
    assert_eq!(grown.len(), MAX_ENTRIES + 10 + 2);
}

/// The forger's shape from issue 60: the record at its bound with young entries that are never
/// seen (forged creates), under keys the cluster does not have.
#[test]
fn a_record_full_of_unseen_fresh_keys_makes_room_for_a_real_change() {
    let last: BTreeMap<String, PendingChange> = (0..HARD_MAX_ENTRIES - 1)
        .map(|i| (format!("n.f{i}"), at(&format!("forged{}", i / 128), 1_000)))
        .collect();
    let stored = |k: &str| !k.starts_with("n.f");
    let keys = BTreeSet::from(["t.real".to_owned(), "n.team-a".to_owned()]);
    let new = [(&keys, at("real", 1_000))];
    let next = next(&last, &new, 1_000, |_| false, stored).expect("not refused");
    assert_eq!(next.len(), HARD_MAX_ENTRIES);
    assert_eq!(
        (next["t.real"].id.as_str(), next["n.team-a"].id.as_str()),
        ("real", "real")
    );
}

#[test]
fn a_record_full_of_expired_unseen_entries_accepts_a_new_one() {
    // Every entry past the pending timeout (within the horizon), under keys the cache stores.
    let pending = PENDING_TIMEOUT.as_secs() as i64;
    let last: BTreeMap<String, PendingChange> = (0..HARD_MAX_ENTRIES - 1)
        .map(|i| {
            (
                format!("t.q{i}"),
                at(&format!("c{i}"), 1_000 - pending - (i % 5) as i64),
            )
        })
        .collect();
    let keys = BTreeSet::from(["t.new".to_owned()]);
    let new = [(&keys, at("new", 1_000))];
    let next = next(&last, &new, 1_000, |_| false, |_| true).expect("not refused");
    assert_eq!(
        next.len(),
        MAX_ENTRIES,
        "expired entries go down to the soft bound"
    );
    assert_eq!(next["t.new"].id, "new");
    let oldest_kept = next.values().map(|c| c.at).min().unwrap();
    assert!(
        last.iter()
            .filter(|(k, _)| !next.contains_key(*k))
            .all(|(_, c)| c.at <= oldest_kept),
        "the oldest went first"
    );
}

#[test]
fn a_record_full_of_stored_keys_drops_from_the_fullest_tree() {
    // Young, unseen, every key stored: a flood naming many of the cluster's namespaces in trees
    // a..g (128 each) beside one real change of two keys in tree r.
    let mut last = BTreeMap::new();
    for (t, tree) in ["a", "b", "c", "d", "e", "f", "g"].iter().enumerate() {
        let id = format!("forged-{tree}");
        last.insert(format!("t.{tree}"), at(&id, 1_000));
        for j in 0..127 {
            last.insert(format!("n.ns{t}-{j}"), at(&id, 1_000 - 1));
        }
    }
    last.insert("t.r".into(), at("real", 1_000 - 3));
    last.insert("n.team-r".into(), at("real", 1_000 - 3));
    for i in 0..(HARD_MAX_ENTRIES - 1 - last.len()) {
        last.insert(format!("t.small{i}"), at(&format!("small{i}"), 1_000 - 2));
    }
    assert_eq!(last.len(), HARD_MAX_ENTRIES - 1);
    let keys: BTreeSet<String> = (0..100)
        .map(|i| format!("n.other{i}"))
        .chain(["t.h".to_owned()])
        .collect();
    let new = [(&keys, at("new", 1_000))];
    let next = next(&last, &new, 1_000, |_| false, |_| true).expect("not refused");
    assert_eq!(next.len(), HARD_MAX_ENTRIES);
    assert!(
        next.contains_key("t.r") && next.contains_key("n.team-r"),
        "the real change stays"
    );
    assert!(
        (0..(HARD_MAX_ENTRIES - 1 - 7 * 128 - 2))
            .all(|i| next.contains_key(&format!("t.small{i}")))
    );
    // The seven big trees were levelled: each lost about as much.
    let left: Vec<usize> = (0..7)
        .map(|t| {
            (0..127)
                .filter(|j| next.contains_key(&format!("n.ns{t}-{j}")))
                .count()
        })
        .collect();
    assert!(
        left.iter().max().unwrap() - left.iter().min().unwrap() <= 1,
        "{left:?}"
    );
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

/// A quota `name` in namespace `ns` under `parent` (the root when `None`), binding `namespaces`.
fn bound(name: &str, parent: Option<&str>, namespaces: &[String]) -> ElasticQuota {
    let mut labels = serde_json::Map::new();
    if let Some(p) = parent {
        labels.insert(crate::apis::keys::QUOTA_PARENT.into(), p.into());
    }
    let namespaces = serde_json::to_string(namespaces).unwrap();
    let mut q: ElasticQuota = serde_json::from_value(serde_json::json!({
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1", "labels": labels,
                     "annotations": {crate::apis::keys::QUOTA_NAMESPACES: namespaces}},
        "spec": {"max": {"cpu": "1"}}}))
    .unwrap();
    q.metadata.uid = Some(format!("uid-{name}"));
    q
}

/// Admits the create of `quota` through `ledger`, keyed as admission keys it (by `cache`).
async fn admit_create(
    ledger: &Ledger,
    cache: &Cache,
    id: &str,
    quota: &ElasticQuota,
) -> Result<BTreeSet<String>, Rejection> {
    let change = change_of(id, &Operation::Create, Some(quota), None).unwrap();
    let keys = || keys_of(&cache.topology(), Some(quota), None);
    let wanted = keys();
    ledger.admit(change, keys, cache, || Ok(())).await?;
    Ok(wanted)
}

/// Issue 60's shape: forged creates, never stored, naming 7 × 128 and then 127 fresh keys fill the
/// record to its bound; real creates in other trees, through another replica, are still admitted,
/// and a later flood pushes out none of their entries.
#[tokio::test(start_paused = true)]
async fn forged_creates_of_fresh_keys_do_not_refuse_changes_in_other_trees() {
    let mut writer = CacheWriter::default();
    let cache = writer.reader();
    writer.apply(CachedObject::ElasticQuota(bound("real", None, &[])));
    let store = Arc::new(MemoryLedgerStore::default());
    let (forger, replica) = (Ledger::new(store.clone()), Ledger::new(store.clone()));
    let forge = |round: usize, i: usize, n: usize| {
        let namespaces: Vec<String> = (0..n).map(|j| format!("f{round}-{i}-{j}")).collect();
        bound(&format!("forged{round}-{i}"), None, &namespaces)
    };
    for i in 0..8 {
        let quota = forge(0, i, if i < 7 { 127 } else { 126 });
        admit_create(&forger, &cache, &format!("forged0-{i}"), &quota)
            .await
            .unwrap();
    }
    assert_eq!(store.read().await.unwrap().last.len(), HARD_MAX_ENTRIES);
    // A leaf in a tree the cache has; a new tree binding a new namespace.
    let leaf = bound("leaf", Some("real"), &[]);
    let fresh = bound("fresh", None, &["team-a".to_owned()]);
    for (id, quota) in [("leaf", &leaf), ("fresh", &fresh)] {
        admit_create(&replica, &cache, id, quota)
            .await
            .unwrap_or_else(|e| panic!("{id}: {}", e.message));
    }
    // Another flood while neither is in the cache yet: their entries stay.
    for i in 0..9 {
        let _ = admit_create(&forger, &cache, &format!("forged1-{i}"), &forge(1, i, 127)).await;
    }
    let last = store.read().await.unwrap().last;
    assert!(last.len() <= HARD_MAX_ENTRIES);
    for (key, id) in [
        ("t.real", "leaf"),
        ("t.fresh", "fresh"),
        ("n.team-a", "fresh"),
    ] {
        assert_eq!(last.get(key).map(|c| c.id.as_str()), Some(id), "{key}");
    }
}

/// What the proptest below does in one step.
#[derive(Debug, Clone)]
enum Step {
    /// A forged create (never stored) through one of the replicas: a new top-level quota, or a
    /// quota under one of the stored trees, binding `namespaces` fresh namespaces.
    Forged {
        replica: bool,
        tree: Option<usize>,
        namespaces: usize,
    },
    /// A real create, stored once admitted: a leaf under a stored tree or a new tree, binding
    /// `namespaces` fresh namespaces.
    Real {
        replica: bool,
        tree: Option<usize>,
        namespaces: usize,
    },
}

const STORED_TREES: usize = 4;

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    // Mostly floods of fresh keys, sometimes a few: what fills the record, then its gaps.
    let forged_size = prop_oneof![1 => 0..8usize, 3 => 100..=(BATCH_KEYS - 1)];
    let tree = prop_oneof![3 => Just(None), 1 => (0..STORED_TREES).prop_map(Some)];
    prop_oneof![
        3 => (any::<bool>(), tree.clone(), forged_size)
            .prop_map(|(replica, tree, namespaces)| Step::Forged { replica, tree, namespaces }),
        1 => (any::<bool>(), tree, 0..4usize)
            .prop_map(|(replica, tree, namespaces)| Step::Real { replica, tree, namespaces }),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// Random sequences of forged and real creates through two replicas: a real change whose keys
    /// no forged change shares is never refused, the record stays within its bound, and every
    /// stored tree's key still names the last change admitted in it (a flood of fresh keys never
    /// pushes out an entry under a key the cluster has).
    #[test]
    fn forged_changes_never_refuse_real_changes_they_share_no_key_with(
        steps in proptest::collection::vec(step(), 1..60)
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async move {
            let mut writer = CacheWriter::default();
            let cache = writer.reader();
            for t in 0..STORED_TREES {
                let namespaces = [format!("bound-{t}")];
                writer.apply(CachedObject::ElasticQuota(bound(&format!("s{t}"), None, &namespaces)));
            }
            let store = Arc::new(MemoryLedgerStore::default());
            let replicas = [Ledger::new(store.clone()), Ledger::new(store.clone())];
            let mut forged_keys = BTreeSet::new();
            // Per stored tree's key, the last change admitted in it and whether it was real.
            let mut last_in: BTreeMap<String, (String, bool)> = BTreeMap::new();
            for (n, step) in steps.into_iter().enumerate() {
                let (replica, tree, namespaces, real) = match step {
                    Step::Forged { replica, tree, namespaces } => (replica, tree, namespaces, false),
                    Step::Real { replica, tree, namespaces } => (replica, tree, namespaces, true),
                };
                let kind = if real { "real" } else { "forged" };
                let name = format!("{kind}{n}");
                let namespaces: Vec<String> =
                    (0..namespaces).map(|j| format!("{kind}{n}-{j}")).collect();
                let parent = tree.map(|t| format!("s{t}"));
                let quota = bound(&name, parent.as_deref(), &namespaces);
                let keys = keys_of(&cache.topology(), Some(&quota), None);
                let answer = admit_create(&replicas[usize::from(replica)], &cache, &name, &quota).await;
                if answer.is_ok() {
                    for key in keys.iter().filter(|k| k.starts_with("t.s")) {
                        last_in.insert(key.clone(), (name.clone(), real));
                    }
                }
                if real {
                    let shared = keys.iter().any(|k| forged_keys.contains(k));
                    proptest::prop_assert!(
                        shared || answer.is_ok(),
                        "{name} {keys:?}: {:?}",
                        answer.as_ref().err().map(|e| &e.message)
                    );
                    if answer.is_ok() {
                        // The API server stores it; the watch delivers it.
                        writer.apply(CachedObject::ElasticQuota(quota));
                    }
                } else {
                    forged_keys.extend(keys);
                }
                let record = store.read().await.unwrap().last;
                proptest::prop_assert!(record.len() <= HARD_MAX_ENTRIES, "{} entries", record.len());
                // A forged entry under a stored key is never seen: only a later change under the
                // key may replace it. A real one may also leave once seen (after the grace).
                for (key, (name, real)) in &last_in {
                    let there = record.get(key).map(|c| c.id.as_str());
                    proptest::prop_assert!(there == Some(name.as_str()) || (*real && there.is_none()), "{key}: {there:?}");
                }
            }
            Ok::<(), proptest::test_runner::TestCaseError>(())
        })?;
    }
}

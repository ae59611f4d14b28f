//! The ledger against a store in memory: waits, conflicts, batches and keys; the record's size and
//! what forged changes can do to it in `record.rs`, to real changes in `forged.rs`.

use super::keys::key;
use super::*;
use crate::admission::ports::memory::MemoryLedgerStore;
use crate::admission::ports::{LedgerRecord, ProvenCallers};
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

/// A cache writer whose stores have had their first list, as a replica's have once it is ready:
/// a cache that has not listed quotas judges nothing (`keys::shown`).
fn listed() -> CacheWriter {
    let writer = CacheWriter::default();
    writer.mark_ready();
    writer
}

/// `connections` forgers from `address`, each sending `forged(id)` of tree t through `ledger` as
/// soon as its last is answered (1 ms later: an answer is never instant), until `until`.
async fn flood(
    ledger: &Ledger,
    cache: &Cache,
    address: Option<std::net::IpAddr>,
    connections: usize,
    until: Instant,
    forged: impl Fn(&str) -> PendingChange,
) {
    let forged = &forged;
    let forgers = (0..connections).map(|c| {
        crate::admission::caller::answering_for(address, async move {
            let mut n = 0;
            while Instant::now() < until {
                n += 1;
                let change = forged(&format!("f{c}-{n}"));
                let _ = ledger.admit(change, tree("t"), cache, || Ok(())).await;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    });
    futures::future::join_all(forgers).await;
}

/// Proves the API server (10.0.0.1) as a replica whose probe was answered does: into the record
/// `ledger` writes to; `ledger` reads it at once (another replica reads it at its next read).
async fn prove_api_server(ledger: &Ledger) {
    let now = super::probe::now();
    super::probe::publish(ledger.inner.store.as_ref(), "10.0.0.1", now)
        .await
        .unwrap();
    let mut known = ledger.inner.known.lock().await;
    ledger.inner.reread(&mut known).await.unwrap();
}

/// The addresses a record names as proven.
fn names(proven: &ProvenCallers) -> Vec<&str> {
    proven.keys().map(String::as_str).collect()
}

/// One of two real sibling CREATEs racing from the API server (10.0.0.1): `me` through `ledger`
/// after `delay` ms, refused by the rule (400) once the cache shows `other`, stored `stored_after`
/// ms after it is admitted.
async fn racing_sibling(
    ledger: &Ledger,
    writer: &Mutex<CacheWriter>,
    cache: &Cache,
    (me, other): (&str, &str),
    delay: u64,
    stored_after: u64,
) -> Result<(), u16> {
    let api_server = Some(std::net::IpAddr::from([10, 0, 0, 1]));
    crate::admission::caller::answering_for(api_server, async move {
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let outcome = ledger
            .admit(create(me, me), tree("t"), cache, || {
                if visible(&create(other, other), cache) {
                    Err(Rejection::invalid("min sum exceeds the parent"))
                } else {
                    Ok(())
                }
            })
            .await;
        if outcome.is_ok() {
            // The API server stores it; the watch delivers it a little later.
            tokio::time::sleep(Duration::from_millis(stored_after)).await;
            let stored = CachedObject::ElasticQuota(quota(me, "9"));
            writer.lock().unwrap().apply(stored);
        }
        outcome.map_err(|e| e.code)
    })
    .await
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
    let mut writer = listed();
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
async fn a_change_that_never_arrives_delays_the_next_one_and_refuses_none() {
    let cache = listed().reader();
    let store = Arc::new(MemoryLedgerStore::default());
    let a = Ledger::new(store.clone());
    let b = Ledger::new(store.clone());
    a.admit(create("1", "lost"), tree("t"), &cache, || Ok(()))
        .await
        .unwrap();
    // b waits MAX_WAIT for it, then checks without it and is recorded.
    let started = Instant::now();
    b.admit(create("2", "next"), tree("t"), &cache, || Ok(()))
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= MAX_WAIT && waited < MAX_WAIT + Duration::from_secs(1),
        "{waited:?}"
    );
    assert_eq!(store.read().await.unwrap().last["t.t"].name, "next");
    // A change b has already waited MAX_WAIT for is not waited for again.
    b.admit(create("3", "again"), tree("t"), &cache, || Ok(()))
        .await
        .unwrap();
    let started = Instant::now();
    a.admit(create("4", "after"), tree("u"), &cache, || Ok(()))
        .await
        .unwrap();
    assert!(started.elapsed() < POLL * 2, "another tree never waits");
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
        proven: &'a ProvenCallers,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        if let Some((key, change)) = self.other.lock().unwrap().take() {
            use futures::FutureExt;
            // The memory store answers at once.
            let mut record = self.inner.read().now_or_never().unwrap().unwrap();
            let at = jiff::Timestamp::now().as_second();
            record.last.insert(key, PendingChange { at, ..change });
            let write = self
                .inner
                .write(&record.version, &record.last, &record.proven);
            write.now_or_never().unwrap().unwrap();
        }
        self.inner.write(version, last, proven)
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
    let mut writer = listed();
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
    let mut writer = listed();
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
            proven: &'a ProvenCallers,
        ) -> BoxFuture<'a, Result<String, StoreError>> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                // A write takes a while, as a round trip to the API server does.
                tokio::time::sleep(Duration::from_millis(5)).await;
                self.0.write(version, last, proven).await
            })
        }
    }
    let cache = listed().reader();
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
    let mut writer = listed();
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
    let cache = listed().reader();
    let store = Arc::new(MemoryLedgerStore::default());
    let (forger, other) = (Ledger::new(store.clone()), Ledger::new(store.clone()));
    // A forged create under tree a: never stored.
    forger
        .admit(create("1", "forged"), tree("a"), &cache, || Ok(()))
        .await
        .unwrap();
    // A change in tree b does not wait for it; one in tree a does, then is admitted without it.
    let started = Instant::now();
    other
        .admit(create("2", "real"), tree("b"), &cache, || Ok(()))
        .await
        .unwrap();
    assert!(started.elapsed() < POLL * 2);
    let both = || BTreeSet::from(["t.a".to_owned(), "t.c".to_owned()]);
    other
        .admit(create("3", "moved"), both, &cache, || Ok(()))
        .await
        .unwrap();
    assert!(started.elapsed() >= MAX_WAIT);
    let record = store.read().await.unwrap().last;
    assert_eq!(record["t.a"].name, "moved");
    assert_eq!(record["t.b"].name, "real");
}

#[tokio::test(start_paused = true)]
async fn a_change_an_older_replica_recorded_is_waited_for_by_every_key() {
    let cache = listed().reader();
    let store = Arc::new(MemoryLedgerStore::default());
    // An older replica writes the whole-record key only.
    let old = BTreeMap::from([(WHOLE_RECORD.to_owned(), create("1", "old"))]);
    store.write("0", &old, &Default::default()).await.unwrap();
    let started = Instant::now();
    Ledger::new(store.clone())
        .admit(create("2", "new"), tree("x"), &cache, || Ok(()))
        .await
        .unwrap();
    assert!(started.elapsed() >= MAX_WAIT, "waited for the old one");
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
    let cache = listed().reader();
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
    let mut writer = listed();
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

mod attack;
mod failing;
mod forged;
mod probe_attack;
mod probe_attack2;
mod probe_replicas;
mod proof;
mod record;

//! The record's size: what leaves it and when, and what forged changes naming fresh or real keys
//! can do to real changes.

use super::*;
use crate::admission::elastic_quota::ledger::bounds::SEEN_GRACE_SECONDS;

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
    let mut writer = listed();
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
            let mut writer = listed();
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

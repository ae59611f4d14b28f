//! Attacks on the proof that names the API server (`LedgerRecord::proven`, `Callers::unrecorded`),
//! from a fourth outside review: each `attack_` test failed before its fix.
//!
//! Threat model: any pod can send reviews; it may know (namespace, name, uid) of existing
//! ElasticQuotas (tenants commonly read them). A replica's cache is empty until its first list of
//! ElasticQuotas arrives, and a pod calling the replica's address directly is answered before that
//! (readiness keeps only the Service from routing there). Fixed then: nothing is judged against a
//! cache that has not listed quotas (`keys::shown`, `Sightings::seen_own`), a proof never left the
//! record, and a trusted caller whose last changes never showed is waited for like an unknown one
//! past a request's wait (`Callers::failing_lately`). The proof was then a CREATE that showed with
//! its review's uid; only a probe proves now (`probe.rs`), and these attacks run against that.

use super::forged::{real_changes, shared};
use super::*;
use crate::admission::caller::answering_for;
use crate::admission::elastic_quota::ledger::callers::Trust;
use crate::admission::elastic_quota::ledger::probe::MAX_PROVEN;
use std::net::IpAddr;

const API_SERVER: &str = "10.0.0.1";

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}

/// The forger's way to a proof: replica `starting` has not listed ElasticQuotas yet (`its_cache`
/// is empty) while `victim` exists in the cluster with uid `uid-victim` (which the forger read).
/// Each of `forgers` sends a forged CREATE of that very object (its real uid) to the starting
/// replica: not in its cache, so pending. The list arrives; the forger sends one more review (any)
/// to make the replica look: the CREATE "showed with the uid its review carried", so each forger
/// address is proven, and published into the record.
async fn forge_proofs(starting: &Ledger, its_writer: &Mutex<CacheWriter>, forgers: &[String]) {
    let its_cache = its_writer.lock().unwrap().reader();
    for (i, f) in forgers.iter().enumerate() {
        let forged = create(&format!("forged-proof-{i}"), "victim");
        let _ = answering_for(
            ip(f),
            starting.admit(forged, tree("victim-tree"), &its_cache, || Ok(())),
        )
        .await;
    }
    // The replica's initial list arrives (some hundreds of ms after it started serving).
    tokio::time::sleep(Duration::from_millis(300)).await;
    its_writer
        .lock()
        .unwrap()
        .apply(CachedObject::ElasticQuota(quota("victim", "3")));
    its_writer.lock().unwrap().mark_ready();
    tokio::time::sleep(Duration::from_millis(60)).await;
    // Any review makes it look (judge_pending) and publish what it proved.
    for (i, f) in forgers.iter().enumerate() {
        let poke = create(&format!("poke-{i}"), &format!("poke-{i}"));
        let _ = answering_for(
            ip(f),
            starting.admit(poke, tree(&format!("poke-{i}")), &its_cache, || Ok(())),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// A listed cache holding the quota whose uid the forger replays.
fn cluster_with_victim() -> (Mutex<CacheWriter>, Cache) {
    let writer = Mutex::new(listed());
    let cache = writer.lock().unwrap().reader();
    let victim = CachedObject::ElasticQuota(quota("victim", "3"));
    writer.lock().unwrap().apply(victim);
    (writer, cache)
}

/// Two real sibling CREATEs from the API server, through `x` and `y`, `y`'s 1 ms after `x`'s,
/// each stored 50 ms after it is admitted; each refused by the rule when it sees the other.
pub(super) async fn siblings(
    x: &Ledger,
    y: &Ledger,
    writer: &Mutex<CacheWriter>,
    cache: &Cache,
) -> (Result<(), u16>, Result<(), u16>) {
    futures::join!(
        racing_sibling(x, writer, cache, ("r1", "r2"), 0, 50),
        racing_sibling(y, writer, cache, ("r2", "r1"), 1, 50)
    )
}

/// Control: without any forger, two fresh replicas and a fresh record, the race is serialised.
#[tokio::test(start_paused = true)]
async fn control_siblings_on_fresh_replicas_exactly_one_in() {
    let writer = Mutex::new(listed());
    let cache = writer.lock().unwrap().reader();
    let store = Arc::new(MemoryLedgerStore::default());
    let (a, b) = (Ledger::new(store.clone()), Ledger::new(store.clone()));
    let (r1, r2) = siblings(&a, &b, &writer, &cache).await;
    eprintln!("control: {r1:?} {r2:?}");
    assert!(
        matches!((r1, r2), (Ok(()), Err(400)) | (Err(400), Ok(()))),
        "{r1:?} {r2:?}"
    );
}

/// Attack 1: a forger proves its own address through a replica's start-up window (empty cache)
/// with the real uid of an existing quota, and the record publishes it to every replica.
#[tokio::test(start_paused = true)]
async fn attack_a_forger_cannot_prove_itself_in_a_starting_replicas_window() {
    let store = Arc::new(MemoryLedgerStore::default());
    let starting = Ledger::new(store.clone());
    let its_writer = Mutex::new(CacheWriter::default());
    forge_proofs(&starting, &its_writer, &["10.66.0.1".to_owned()]).await;
    let record = store.read().await.unwrap();
    eprintln!("record.proven after the forgery: {:?}", record.proven);
    let trust = starting.inner.sightings.callers.trust(Some("10.66.0.1"));
    eprintln!("forger's trust on the starting replica: {trust:?}");
    assert!(
        !record.proven.contains_key("10.66.0.1"),
        "forger proven and published: {:?}",
        record.proven
    );
}

/// Attack 1b: with the forger's address in the record and the API server not (yet) proven (no
/// quota CREATE of the API server's has shown since the record exists: a fresh install or an
/// upgrade, clusters whose quotas are only updated), every replica treats the API server as a
/// caller "nothing is known of" and records none of its changes: two racing siblings both in.
#[tokio::test(start_paused = true)]
async fn attack_a_forged_proof_does_not_unrecord_the_api_server() {
    let (writer, cache) = cluster_with_victim();
    let store = Arc::new(MemoryLedgerStore::default());
    let starting = Ledger::new(store.clone());
    let its_writer = Mutex::new(CacheWriter::default());
    forge_proofs(&starting, &its_writer, &["10.66.0.1".to_owned()]).await;
    eprintln!("proven: {:?}", store.read().await.unwrap().proven);
    let (a, b) = (Ledger::new(store.clone()), Ledger::new(store.clone()));
    let (r1, r2) = siblings(&a, &b, &writer, &cache).await;
    eprintln!("siblings after a forged proof: {r1:?} {r2:?}");
    let record = store.read().await.unwrap();
    eprintln!(
        "record keys after: {:?}",
        record.last.keys().collect::<Vec<_>>()
    );
    assert!(!(r1.is_ok() && r2.is_ok()), "both admitted: {r1:?} {r2:?}");
}

/// Attack 2: MAX_PROVEN forger addresses proven in one start-up window push the API server's
/// (the oldest proof) out of the record; replicas (re)started before any replica that remembers
/// it writes again know only the forgers, and record none of the API server's changes.
#[tokio::test(start_paused = true)]
async fn attack_forged_proofs_cannot_evict_the_api_server_from_the_record() {
    let (writer, cache) = cluster_with_victim();
    let store = Arc::new(MemoryLedgerStore::default());
    // The API server is proven and published, through replica a.
    let a = Ledger::new(store.clone());
    prove_api_server(&a).await;
    assert_eq!(names(&store.read().await.unwrap().proven), [API_SERVER]);
    // A replica starts (rollout, eviction, scale-up): 16 forger Pods prove themselves through it.
    let starting = Ledger::new(store.clone());
    let its_writer = Mutex::new(CacheWriter::default());
    let forgers: Vec<String> = (0..MAX_PROVEN).map(|i| format!("10.66.0.{i}")).collect();
    forge_proofs(&starting, &its_writer, &forgers).await;
    let mut proven = store.read().await.unwrap().proven;
    eprintln!("proven after {MAX_PROVEN} forged proofs: {proven:?}");
    // 17 proven addresses in the starting replica's memory, 16 in the record: each of its writes
    // adds the one missing and drops the oldest. The (now trusted) forger drives writes until the
    // API server's is the one missing (it can count: the order is the record's, sorted strings),
    // then stops; quota changes are rare, so the record can stay so for long.
    let its_cache = its_writer.lock().unwrap().reader();
    let mut writes = 0;
    while proven.contains_key(API_SERVER) && writes < 40 {
        writes += 1;
        let id = format!("rotate-{writes}");
        let _ = answering_for(
            ip("10.66.0.0"),
            starting.admit(create(&id, &id), tree(&id), &its_cache, || Ok(())),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        proven = store.read().await.unwrap().proven;
    }
    eprintln!("after {writes} forged writes: {proven:?}");
    // The rollout goes on: two replicas restart and read the record before any old one writes.
    let (d, e) = (Ledger::new(store.clone()), Ledger::new(store.clone()));
    let (r1, r2) = siblings(&d, &e, &writer, &cache).await;
    eprintln!("siblings on restarted replicas: {r1:?} {r2:?}");
    eprintln!(
        "API server's trust on d: {:?}",
        d.inner.sightings.callers.trust(Some(API_SERVER))
    );
    let evicted = !proven.contains_key(API_SERVER);
    assert!(
        !(r1.is_ok() && r2.is_ok()),
        "both admitted (API server evicted from the record: {evicted})"
    );
    assert!(!evicted, "API server evicted: {proven:?}");
}

/// Attack 3: a proven forger's reviews are recorded and waited for like the API server's (trust
/// is never lost): a stream of them through one replica gets the API server's changes through
/// another refused (429), the first property.
#[tokio::test(start_paused = true)]
async fn attack_a_forged_proof_does_not_get_real_changes_refused() {
    let (writer, cache) = cluster_with_victim();
    let mem: Arc<MemoryLedgerStore> = Arc::default();
    let store = shared(&mem, (5, 5), 0);
    let (a, b) = (Ledger::new(store.clone()), Ledger::new(store.clone()));
    // The forger proves its address through a replica that is starting.
    let starting = Ledger::new(store.clone());
    let its_writer = Mutex::new(CacheWriter::default());
    let forger = "10.66.0.1";
    forge_proofs(&starting, &its_writer, &[forger.to_owned()]).await;
    eprintln!("proven: {:?}", mem.read().await.unwrap().proven);
    let until = Instant::now() + Duration::from_secs(22);
    let forgers = flood(&a, &cache, ip(forger), 8, until, |id| create(id, "forged"));
    let reals = real_changes(&b, &writer, &cache, 6);
    let (took, _) = futures::join!(reals, forgers);
    eprintln!("real changes vs a proven forger: {took:?}");
    eprintln!(
        "forger's trust on b: {:?}",
        b.inner.sightings.callers.trust(Some(forger))
    );
    assert!(took.iter().all(|(o, _)| o.is_ok()), "{took:?}");
}

/// Control for attack 3: the same stream from an address nothing is known of, the API server
/// proven: nothing is refused (the commit's claim).
#[tokio::test(start_paused = true)]
async fn control_an_unproven_forger_costs_nothing_once_the_api_server_is_proven() {
    let writer = Mutex::new(listed());
    let cache = writer.lock().unwrap().reader();
    let mem: Arc<MemoryLedgerStore> = Arc::default();
    let store = shared(&mem, (5, 5), 0);
    let (a, b) = (Ledger::new(store.clone()), Ledger::new(store.clone()));
    // Prove the API server through b.
    prove_api_server(&b).await;
    assert_eq!(names(&mem.read().await.unwrap().proven), [API_SERVER]);
    let until = Instant::now() + Duration::from_secs(22);
    let forgers = flood(&a, &cache, ip("10.66.0.1"), 8, until, |id| {
        create(id, "forged")
    });
    let reals = real_changes(&b, &writer, &cache, 6);
    let (took, _) = futures::join!(reals, forgers);
    eprintln!("control, unproven forger: {took:?}");
    assert!(took.iter().all(|(o, _)| o.is_ok()), "{took:?}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

    /// Attack 4 (window before the proof is adopted): the API server is proven on replica a and
    /// the proof is in the record, but replica b last read the record before it (b's own earlier
    /// change of the API server's never showed: b knows nothing of it). Forgers (one address or one
    /// each) race two real siblings through either replica; never both in.
    #[test]
    fn attack_a_replica_behind_the_proof_never_lets_two_siblings_both_in(
        racing in proptest::collection::vec((0u64..3_000, proptest::bool::ANY), 0..8),
        start in 0u64..3_000,
        apart in 0u64..40,
        stored_after in 1u64..300,
        addresses in proptest::bool::ANY,
        b_first in proptest::bool::ANY,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let (r1, r2, proven) = runtime.block_on(async {
            let writer = Mutex::new(listed());
            let cache = writer.lock().unwrap().reader();
            let mem: Arc<MemoryLedgerStore> = Arc::default();
            let store = shared(&mem, (1, 6), start);
            let (one, two) = (Ledger::new(store.clone()), Ledger::new(store.clone()));
            let api_server = ip(API_SERVER);
            // b: a change of the API server's that a later webhook denies (never stored).
            answering_for(api_server, two.admit(create("denied", "denied"), tree("k1"), &cache, || Ok(()))).await.unwrap();
            // a: a probe answered; a publishes.
            prove_api_server(&one).await;
            let proven = names(&mem.read().await.unwrap().proven).iter().map(|s| s.to_string()).collect::<Vec<_>>();
            assert_eq!(two.inner.sightings.callers.trust(Some(API_SERVER)), Trust::Unknown);
            let forgers = racing.iter().copied().enumerate().map(|(i, (at, side))| {
                let ledger = if side { &one } else { &two };
                let cache = cache.clone();
                let forger = ip(&format!("10.0.1.{}", if addresses { i } else { 66 }));
                answering_for(forger, async move {
                    tokio::time::sleep(Duration::from_millis(at)).await;
                    let _ = ledger.admit(create(&format!("f{i}"), &format!("forged{i}")), tree("t"), &cache, || Ok(())).await;
                })
            });
            let real = |on_one: bool, delay: u64| {
                let ledger = if on_one { &one } else { &two };
                let names = if on_one { ("r1", "r2") } else { ("r2", "r1") };
                racing_sibling(ledger, &writer, &cache, names, delay, stored_after)
            };
            let (d1, d2) = if b_first { (start + apart + 1, start) } else { (start, start + apart + 1) };
            let (r1, r2, _) = futures::join!(
                real(true, d1),
                real(false, d2),
                futures::future::join_all(forgers)
            );
            (r1, r2, proven)
        });
        proptest::prop_assert_eq!(proven, vec![API_SERVER.to_owned()]);
        proptest::prop_assert!(!(r1.is_ok() && r2.is_ok()), "both admitted");
        if racing.is_empty() {
            proptest::prop_assert!(
                matches!((r1, r2), (Ok(()), Err(400)) | (Err(400), Ok(()))),
                "{:?} {:?}", r1, r2
            );
        }
    }
}

/// What was the residual of the start-up fix: a caller allowed to create ElasticQuotas creates one
/// and replays its uid in a forged CREATE before a replica's watch delivers it. When that proved
/// it, its stream of forged changes through replica a kept winning writes of its tree against the
/// API server's changes through b: 2 of 12 were refused (429) while it flooded. Only a probe proves
/// now: the race leaves it a caller nothing is known of, its flood is not recorded, and every real
/// change is admitted.
#[tokio::test(start_paused = true)]
async fn a_caller_racing_the_watch_is_not_proven_and_costs_real_changes_nothing() {
    let writer = Mutex::new(listed());
    let cache = writer.lock().unwrap().reader();
    let mem: Arc<MemoryLedgerStore> = Arc::default();
    let store = shared(&mem, (5, 5), 0);
    let (a, b) = (Ledger::new(store.clone()), Ledger::new(store.clone()));
    prove_api_server(&a).await;
    prove_api_server(&b).await;
    super::failing::forger_races_the_watch(&[&a, &b], &writer, &cache, "mine").await;
    let forger = "10.66.0.1";
    let until = Instant::now() + Duration::from_secs(40);
    let forgers = flood(&a, &cache, ip(forger), 8, until, |id| create(id, "forged"));
    let reals = real_changes(&b, &writer, &cache, 12);
    let (took, _) = futures::join!(reals, forgers);
    eprintln!("real changes against a forger racing the watch: {took:?}");
    assert!(took.iter().all(|(o, _)| o.is_ok()), "{took:?}");
    assert_eq!(names(&mem.read().await.unwrap().proven), [API_SERVER]);
}

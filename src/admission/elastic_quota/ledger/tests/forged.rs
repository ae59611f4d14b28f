//! What forged changes (reviews the API server never sends, so never stored) can do to real ones:
//! property searches over forged sequences, one caller's backlog, a forger racing through the
//! other replica, changes the API server could not send, and the callers' trust.

use super::*;
use crate::admission::elastic_quota::ledger::sightings::MAX_SEEN;

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Forged changes (never stored) under any of the keys a real change has or not, on either
    /// replica, answered before it arrives: the real change is recorded, never refused, within
    /// MAX_WAIT of its start (and WINNER_WAIT more when its replica learns of one only by losing a
    /// write to it).
    #[test]
    fn forged_changes_answered_before_a_real_one_delay_it_and_never_refuse_it(
        forged in proptest::collection::vec((0usize..6, 0u64..3_000, proptest::bool::ANY), 0..24),
        real_after in 0u64..8_000,
        real_keys in proptest::collection::btree_set(0usize..6, 1..4),
    ) {
        let keys = ["t.a", "t.b", "n.x", "n.y", "n.fresh0", "n.fresh1"];
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let (outcome, took) = runtime.block_on(async {
            let cache = listed().reader();
            let store = Arc::new(MemoryLedgerStore::default());
            let (one, two) = (Ledger::new(store.clone()), Ledger::new(store.clone()));
            for (i, (key, after, side)) in forged.iter().enumerate() {
                tokio::time::sleep(Duration::from_millis(*after)).await;
                let ledger = if *side { &one } else { &two };
                let key = keys[*key].to_owned();
                let forged = ledger.admit(create(&format!("f{i}"), "forged"), move || BTreeSet::from([key.clone()]), &cache, || Ok(()));
                let _ = forged.await;
            }
            tokio::time::sleep(Duration::from_millis(real_after)).await;
            let wanted: BTreeSet<String> = real_keys.iter().map(|k| keys[*k].to_owned()).collect();
            let started = Instant::now();
            let outcome = two.admit(create("real", "real"), || wanted.clone(), &cache, || Ok(())).await;
            (outcome, started.elapsed())
        });
        proptest::prop_assert!(outcome.is_ok(), "refused: {:?}", outcome.err());
        proptest::prop_assert!(took <= MAX_WAIT + WINNER_WAIT + POLL, "took {took:?}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Two real sibling changes that exclude each other (each fits only without the other), on
    /// two replicas, stored some milliseconds after they are admitted, with forged changes under
    /// their tree before them and racing them: never both admitted (each is checked against a
    /// cache that holds the other, though forged changes used up its wait). Without forged changes
    /// racing them: exactly one admitted, the other refused by the rule, never a 429. With the
    /// API server already known to both replicas (`known`: from then on the forgers' changes are
    /// not recorded) and forgers from one address or one each (`addresses`).
    #[test]
    fn forged_changes_never_let_two_racing_siblings_both_in(
        before in proptest::collection::vec(0u64..6_000, 0..6),
        racing in proptest::collection::vec((0u64..8_000, proptest::bool::ANY), 0..8),
        start in 0u64..7_000,
        apart in 0u64..40,
        stored_after in 1u64..300,
        known in proptest::bool::ANY,
        addresses in proptest::bool::ANY,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let outcomes = runtime.block_on(async {
            let writer = Mutex::new(listed());
            let cache = writer.lock().unwrap().reader();
            let store = Arc::new(MemoryLedgerStore::default());
            let (one, two) = (Ledger::new(store.clone()), Ledger::new(store.clone()));
            if known {
                // The API server proven on both (their answers to probes).
                for ledger in [&one, &two] {
                    prove_api_server(ledger).await;
                    let trust = ledger.inner.sightings.callers.trust(Some("10.0.0.1"));
                    assert_eq!(trust, super::super::callers::Trust::Trusted);
                }
            }
            let began = Instant::now();
            let forgers = before.iter().map(|at| (*at, true)).chain(racing.iter().copied()).enumerate().map(|(i, (at, side))| {
                let ledger = if side { &one } else { &two };
                let cache = cache.clone();
                let forger = Some(std::net::IpAddr::from([10, 0, 1, if addresses { i as u8 } else { 66 }]));
                crate::admission::caller::answering_for(forger, async move {
                    tokio::time::sleep(Duration::from_millis(at)).await;
                    let _ = ledger.admit(create(&format!("f{i}"), &format!("forged{i}")), tree("t"), &cache, || Ok(())).await;
                })
            });
            let real = |ledger: &'static str, delay: u64| {
                let ledger = if ledger == "one" { &one } else { &two };
                let names = if delay == start { ("r1", "r2") } else { ("r2", "r1") };
                racing_sibling(ledger, &writer, &cache, names, delay, stored_after)
            };
            let (r1, r2, _) = futures::join!(
                real("one", start),
                real("two", start + apart + 1),
                futures::future::join_all(forgers)
            );
            let _ = began;
            (r1, r2)
        });
        let (r1, r2) = outcomes;
        proptest::prop_assert!(!(r1.is_ok() && r2.is_ok()), "both admitted");
        if racing.is_empty() {
            proptest::prop_assert!(
                matches!((r1, r2), (Ok(()), Err(400)) | (Err(400), Ok(()))),
                "{r1:?} {r2:?}"
            );
        }
    }
}

/// A store whose every call takes some milliseconds, as the API server's do: shared by replicas of different latencies (as replicas on different nodes):
/// each call takes from `.1` to `.2` (inclusive, in ms), drawn from a fixed-seed generator.
pub(super) struct Shared(
    Arc<MemoryLedgerStore>,
    u64,
    u64,
    std::sync::atomic::AtomicU64,
);

pub(super) fn shared(
    store: &Arc<MemoryLedgerStore>,
    (lo, hi): (u64, u64),
    seed: u64,
) -> Arc<Shared> {
    Arc::new(Shared(store.clone(), lo, hi, seed.into()))
}

impl Shared {
    fn latency(&self) -> Duration {
        use std::sync::atomic::Ordering::Relaxed;
        let x = self
            .3
            .load(Relaxed)
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.3.store(x, Relaxed);
        Duration::from_millis(self.1 + (x >> 33) % (self.2 - self.1 + 1))
    }
}

impl LedgerStore for Shared {
    fn read(&self) -> BoxFuture<'_, Result<LedgerRecord, StoreError>> {
        Box::pin(async move {
            tokio::time::sleep(self.latency()).await;
            self.0.read().await
        })
    }
    fn write<'a>(
        &'a self,
        version: &'a str,
        last: &'a BTreeMap<String, PendingChange>,
        proven: &'a ProvenCallers,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        Box::pin(async move {
            tokio::time::sleep(self.latency()).await;
            self.0.write(version, last, proven).await
        })
    }
    fn write_proven<'a>(
        &'a self,
        proven: &'a ProvenCallers,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            tokio::time::sleep(self.latency()).await;
            self.0.write_proven(proven).await
        })
    }
}

#[tokio::test(start_paused = true)]
async fn one_callers_backlog_does_not_keep_anothers_change_from_being_recorded() {
    use crate::admission::caller::answering_for;
    let cache = listed().reader();
    let store = shared(&Arc::default(), (20, 20), 0);
    let ledger = Ledger::new(store.clone());
    let forger = Some("10.0.0.66".parse().unwrap());
    let api_server = Some("10.0.0.1".parse().unwrap());
    // 200 forged changes of one tree from one caller, all sent first, kept coming as answered.
    let forged = (0..200).map(|i| {
        let (ledger, cache) = (&ledger, &cache);
        answering_for(forger, async move {
            let _ = ledger
                .admit(create(&format!("f{i}"), "forged"), tree("t"), cache, || {
                    Ok(())
                })
                .await;
        })
    });
    let real = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let started = Instant::now();
        let outcome = answering_for(
            api_server,
            ledger.admit(create("real", "real"), tree("t"), &cache, || Ok(())),
        )
        .await;
        (outcome, started.elapsed())
    };
    let ((outcome, took), _) = futures::join!(real, futures::future::join_all(forged));
    eprintln!("recorded after {took:?}");
    outcome.unwrap();
    assert!(took < GIVE_UP, "{took:?}");
}

#[tokio::test(start_paused = true)]
async fn a_forger_racing_through_the_other_replica_stops_costing_real_changes_anything() {
    use crate::admission::caller::answering_for;
    let writer = Mutex::new(listed());
    let cache = writer.lock().unwrap().reader();
    let store = shared(&Arc::default(), (5, 5), 0);
    let (a, b) = (Ledger::new(store.clone()), Ledger::new(store.clone()));
    let forger = Some("10.0.0.66".parse().unwrap());
    let until = Instant::now() + Duration::from_secs(60);
    // 64 connections to replica a, each sending a fresh forged change of tree t as soon as the
    // last is answered, for a minute.
    let forgers = flood(&a, &cache, forger, 64, until, |id| create(id, "forged"));
    // And, from the same address, a DELETE of a quota that does not exist every 2 s: "shown" at
    // once, such changes must not buy the forger trust.
    let deletes = answering_for(forger, async {
        let mut n = 0;
        while Instant::now() < until {
            n += 1;
            let id = format!("d{n}");
            let nothing =
                change_of(&id, &Operation::Delete, None, Some(&quota("nothing", "1"))).unwrap();
            let _ = a
                .admit(nothing, tree(&format!("d{n}")), &cache, || Ok(()))
                .await;
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    });
    // A real change of tree t through replica b every 3 s, stored 20 ms after it is admitted.
    let reals = real_changes(&b, &writer, &cache, 18);
    let (took, _, _) = futures::join!(reals, forgers, deletes);
    eprintln!("{took:?}");
    assert!(took.iter().all(|(o, _)| o.is_ok()), "{took:?}");
    // Once replica b has waited in vain for a few of the forger's changes, it stops waiting.
    let late = &took[took.len() / 2..];
    assert!(
        late.iter().all(|(_, t)| *t < Duration::from_millis(500)),
        "{late:?}"
    );
}

/// A forger with many addresses (a Pod per address, a new one every 4 s: each gone before five of
/// its changes can fail to show and get it distrusted), racing through replica a: a probe answered
/// by replica b proves the API server, replica a reads it from the record, and the forger's
/// changes, from addresses nothing is known of, are not recorded: no real change waits for a
/// forged one or is refused (all 12 in 5 ms). When the proof was the API server's first CREATE
/// shown, the first real change waited ~5 s for the forged entries before it; before any proof,
/// every real change lost write after write to the forger's fresh entries: 3 of 12 were refused
/// (429) and the rest waited 5 to 6 s.
#[tokio::test(start_paused = true)]
async fn a_forger_with_fresh_addresses_costs_real_changes_nothing_once_the_api_server_is_known() {
    use crate::admission::caller::answering_for;
    let writer = Mutex::new(listed());
    let cache = writer.lock().unwrap().reader();
    let store = shared(&Arc::default(), (5, 5), 0);
    let (a, b) = (Ledger::new(store.clone()), Ledger::new(store.clone()));
    // A probe answered by replica b; a learns it from the record.
    prove_api_server(&b).await;
    let started = Instant::now();
    let until = started + Duration::from_secs(40);
    let forgers = (0..32u8).map(|c| {
        let (a, cache) = (&a, &cache);
        async move {
            let mut n = 0;
            while Instant::now() < until {
                n += 1;
                let epoch = (started.elapsed().as_secs() / 4) as u8;
                let address = Some(std::net::IpAddr::from([10, 1, epoch, c]));
                let id = format!("f{c}-{n}");
                let change = a.admit(create(&id, "forged"), tree("t"), cache, || Ok(()));
                let _ = answering_for(address, change).await;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
    let reals = real_changes(&b, &writer, &cache, 12);
    let (took, _) = futures::join!(reals, futures::future::join_all(forgers));
    eprintln!("{took:?}");
    assert!(took.iter().all(|(o, _)| o.is_ok()), "{took:?}");
    // The API server was proven before the forging began: none waits for a forged entry.
    assert!(
        took.iter().all(|(_, t)| *t < Duration::from_millis(100)),
        "{took:?}"
    );
}

/// The proof travels in the record: a replica started after another proved the API server's
/// address knows it at its first read, so a forger's first change through it is not recorded and
/// a real change through the other replica right after does not wait for it.
#[tokio::test(start_paused = true)]
async fn a_replica_started_after_the_proof_knows_the_api_server_from_the_record() {
    use crate::admission::caller::answering_for;
    let writer = Mutex::new(listed());
    let cache = writer.lock().unwrap().reader();
    let store = Arc::new(MemoryLedgerStore::default());
    let a = Ledger::new(store.clone());
    let api_server = Some(std::net::IpAddr::from([10, 0, 0, 1]));
    // A probe answered by replica a.
    prove_api_server(&a).await;
    assert_eq!(names(&store.read().await.unwrap().proven), ["10.0.0.1"]);
    // Replica b starts now: a forger's change through it is admitted, and not recorded.
    let b = Ledger::new(store.clone());
    let forger = Some(std::net::IpAddr::from([10, 7, 0, 1]));
    answering_for(
        forger,
        b.admit(create("f", "forged"), tree("t"), &cache, || Ok(())),
    )
    .await
    .unwrap();
    let record = store.read().await.unwrap();
    assert!(record.last.values().all(|c| c.id != "f"), "{record:?}");
    // A real change of the same tree through replica a is not held by it.
    let at = Instant::now();
    answering_for(
        api_server,
        a.admit(create("3", "third"), tree("t"), &cache, || Ok(())),
    )
    .await
    .unwrap();
    assert!(
        at.elapsed() < Duration::from_millis(100),
        "{:?}",
        at.elapsed()
    );
}

#[tokio::test]
async fn a_change_the_api_server_could_not_send_is_refused_before_the_record() {
    let cache = listed().reader();
    let store = Arc::new(MemoryLedgerStore::default());
    let ledger = Ledger::new(store.clone());
    let long = create("1", &"q".repeat(254));
    let denied = ledger
        .admit(long, tree("t"), &cache, || Ok(()))
        .await
        .unwrap_err();
    assert_eq!(denied.code, 400);
    assert!(
        denied.message.contains("name is 254 bytes"),
        "{}",
        denied.message
    );
    let long_uid = create(&"u".repeat(129), "q");
    assert!(
        ledger
            .admit(long_uid, tree("t"), &cache, || Ok(()))
            .await
            .is_err()
    );
    assert!(store.read().await.unwrap().last.is_empty());
}

#[test]
fn the_changes_a_replica_has_seen_are_bounded() {
    let inner = Ledger::new(Arc::new(MemoryLedgerStore::default())).inner;
    for i in 0..MAX_SEEN * 3 {
        let mut change = create(&format!("{i:0>100}"), "q");
        change.caller = Some("10.0.0.66".into());
        inner.sightings.first_seen(&change);
    }
    assert!(inner.sightings.seen_len() <= MAX_SEEN);
}

#[tokio::test(start_paused = true)]
async fn the_api_servers_changes_that_show_keep_it_trusted_through_denials_downstream() {
    use crate::admission::caller::answering_for;
    let writer = Mutex::new(listed());
    let cache = writer.lock().unwrap().reader();
    let ledger = Ledger::new(Arc::new(MemoryLedgerStore::default()));
    let api_server: Option<std::net::IpAddr> = Some("10.0.0.1".parse().unwrap());
    prove_api_server(&ledger).await;
    // One change that shows, then many a later webhook denies (never stored): still trusted.
    answering_for(
        api_server,
        ledger.admit(create("s", "shown"), tree("s"), &cache, || Ok(())),
    )
    .await
    .unwrap();
    writer
        .lock()
        .unwrap()
        .apply(CachedObject::ElasticQuota(quota("shown", "2")));
    for i in 0..20 {
        let id = format!("denied{i}");
        answering_for(
            api_server,
            ledger.admit(create(&id, &id), tree(&id), &cache, || Ok(())),
        )
        .await
        .unwrap();
        tokio::time::sleep(MAX_WAIT).await;
        ledger.inner.sightings.judge_pending(&cache);
    }
    assert_eq!(
        ledger.inner.sightings.callers.trust(Some("10.0.0.1")),
        callers::Trust::Trusted
    );
}

/// `count` real changes of tree t through `ledger`, from the API server's address, one every 3 s,
/// each stored 20 ms after it is admitted: each one's outcome (its code if refused) and time.
pub(super) async fn real_changes(
    ledger: &Ledger,
    writer: &Mutex<CacheWriter>,
    cache: &Cache,
    count: usize,
) -> Vec<(Result<(), u16>, Duration)> {
    let api_server = Some("10.0.0.1".parse().unwrap());
    let mut took = Vec::new();
    for i in 0..count {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let at = Instant::now();
        let name = format!("real{i}");
        let change = ledger.admit(create(&name, &name), tree("t"), cache, || Ok(()));
        let outcome = crate::admission::caller::answering_for(api_server, change).await;
        took.push((outcome.map_err(|e| e.code), at.elapsed()));
        tokio::time::sleep(Duration::from_millis(20)).await;
        let stored = CachedObject::ElasticQuota(quota(&name, "9"));
        writer.lock().unwrap().apply(stored);
    }
    took
}

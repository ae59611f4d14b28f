//! From a fifth outside review: a tenant allowed to create ElasticQuotas replayed its new quota's
//! uid in a forged CREATE before a replica's watch delivered it, and so was proven when a CREATE
//! that showed with its review's uid was the proof. Proven, it made the API server's changes
//! unrecorded (two racing siblings were both admitted when a proven caller failing lately was not
//! recorded beside a good one: any tenant can make the API server fail lately with no-op
//! UPDATEs), and a change that merely showed reset a caller's run of changes that never showed (a
//! forged UPDATE of a quota someone else keeps changing kept the forger "good"). Fixed then: a
//! proven caller is always recorded, only a proof ends a run. Now only a probe proves
//! (`probe.rs`): the race proves nothing (`forger_races_the_watch` checks it every time), and the
//! attacks are kept as they were sent.

use super::forged::shared;
use super::*;
use crate::admission::caller::answering_for;
use crate::admission::elastic_quota::ledger::callers::Trust;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};

const API_SERVER: &str = "10.0.0.1";
const FORGER: &str = "10.66.0.1";

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}

fn update(id: &str, name: &str, rv: &str) -> PendingChange {
    let q = quota(name, rv);
    change_of(id, &Operation::Update, Some(&q), Some(&q)).unwrap()
}

/// The race that used to prove the forger: the tenant creates `name` through the API server, reads
/// its uid, and replays it in a forged CREATE to each replica before their watch delivers it. It
/// proves nothing now.
pub(super) async fn forger_races_the_watch(
    ledgers: &[&Ledger],
    writer: &Mutex<CacheWriter>,
    cache: &Cache,
    name: &str,
) {
    let real = create(&format!("{name}-real"), name);
    answering_for(
        ip(API_SERVER),
        ledgers[0].admit(real, tree(name), cache, || Ok(())),
    )
    .await
    .unwrap();
    for (i, l) in ledgers.iter().enumerate() {
        let forged = create(&format!("{name}-forged-{i}"), name);
        let _ = answering_for(ip(FORGER), l.admit(forged, tree(name), cache, || Ok(()))).await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    writer
        .lock()
        .unwrap()
        .apply(CachedObject::ElasticQuota(quota(name, "2")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    for (i, l) in ledgers.iter().enumerate() {
        let poke = format!("{name}-poke-{i}");
        let _ = answering_for(
            ip(FORGER),
            l.admit(create(&poke, &poke), tree(&poke), cache, || Ok(())),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for l in ledgers {
        let trust = l
            .inner
            .sightings
            .callers
            .trust(ip(FORGER).map(|a| a.to_string()).as_deref());
        assert_ne!(trust, Trust::Trusted, "the race proved the forger");
    }
}

/// Something (a controller's status writes, the tenant's own updates) bumps quota `qs` every
/// 300 ms; the forger sends, to each replica every 100 ms, a forged UPDATE of `qs` at its current
/// version: pending, then shown, so each replica credits the forger ("Shown").
async fn keep_forger_good(
    ledgers: &[&Ledger],
    writer: &Mutex<CacheWriter>,
    cache: &Cache,
    until: Instant,
) {
    let rv = AtomicU64::new(3);
    writer
        .lock()
        .unwrap()
        .apply(CachedObject::ElasticQuota(quota("qs", "3")));
    let bumps = async {
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let v = rv.fetch_add(1, Ordering::SeqCst) + 1;
            writer
                .lock()
                .unwrap()
                .apply(CachedObject::ElasticQuota(quota("qs", &v.to_string())));
        }
    };
    let showers = answering_for(ip(FORGER), async {
        let mut n = 0;
        while Instant::now() < until {
            n += 1;
            let v = rv.load(Ordering::SeqCst).to_string();
            for (i, l) in ledgers.iter().enumerate() {
                let ch = update(&format!("show-{i}-{n}"), "qs", &v);
                let _ = l.admit(ch, tree("qs"), cache, || Ok(())).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    futures::join!(bumps, showers);
}

/// Replicas a and b (a store with latency), the API server proven on both, then the forger racing
/// the watch (which proves it nothing); ten quotas at version 5 for the no-op UPDATEs.
async fn api_server_and_forger_proven() -> (Mutex<CacheWriter>, Cache, Ledger, Ledger) {
    let writer = Mutex::new(listed());
    let cache = writer.lock().unwrap().reader();
    for i in 0..5 {
        for p in ["qa", "qb"] {
            let q = quota(&format!("{p}{i}"), "5");
            writer.lock().unwrap().apply(CachedObject::ElasticQuota(q));
        }
    }
    let mem: Arc<MemoryLedgerStore> = Arc::default();
    let store = shared(&mem, (5, 5), 0);
    let (a, b) = (Ledger::new(store.clone()), Ledger::new(store.clone()));
    prove_api_server(&a).await;
    prove_api_server(&b).await;
    forger_races_the_watch(&[&a, &b], &writer, &cache, "mine").await;
    (writer, cache, a, b)
}

/// Five no-op UPDATEs of the API server's through each replica (a tenant's: reviewed, never
/// stored; one tree each, so no waits): the API server is then failing lately on both.
async fn api_server_noop_updates(a: &Ledger, b: &Ledger, cache: &Cache) {
    let noops = [(a, "qa"), (b, "qb")].into_iter().flat_map(|(l, p)| {
        (0..5).map(move |i| {
            let name = format!("{p}{i}");
            let ch = update(&format!("noop-{name}"), &name, "5");
            answering_for(ip(API_SERVER), async move {
                l.admit(ch, tree(&name), cache, || Ok(())).await
            })
        })
    });
    for r in futures::future::join_all(noops).await {
        r.unwrap();
    }
}

fn state(name: &str, l: &Ledger) {
    let c = &l.inner.sightings.callers;
    eprintln!(
        "{name}: forger trust {:?} failing {} unrecorded {} | api trust {:?} failing {} unrecorded {}",
        c.trust(Some(FORGER)),
        c.failing_lately(Some(FORGER)),
        c.unrecorded(Some(FORGER)),
        c.trust(Some(API_SERVER)),
        c.failing_lately(Some(API_SERVER)),
        c.unrecorded(Some(API_SERVER)),
    );
}

/// The forger, kept "good" by forged UPDATEs that show, and five of the API server's changes that
/// never show (no-op UPDATEs by a tenant; or changes a later webhook denies): the API server is
/// failing lately beside a good proven caller, and still recorded, so of two racing real siblings
/// exactly one is admitted. Before, it was not recorded: both were.
#[tokio::test(start_paused = true)]
async fn attack_a_proven_forger_kept_good_cannot_unrecord_a_failing_api_server() {
    let (writer, cache, a, b) = api_server_and_forger_proven().await;
    let until = Instant::now() + Duration::from_secs(12);
    let both = [&a, &b];
    let good = keep_forger_good(&both, &writer, &cache, until);
    let attack = async {
        api_server_noop_updates(&a, &b, &cache).await;
        tokio::time::sleep(MAX_WAIT + Duration::from_millis(500)).await;
        state("a before siblings", &a);
        state("b before siblings", &b);
        futures::join!(
            racing_sibling(&a, &writer, &cache, ("r1", "r2"), 0, 50),
            racing_sibling(&b, &writer, &cache, ("r2", "r1"), 1, 50)
        )
    };
    let ((r1, r2), _) = futures::join!(attack, good);
    eprintln!("siblings: {r1:?} {r2:?}");
    let one = matches!((&r1, &r2), (Ok(()), Err(400)) | (Err(400), Ok(())));
    assert!(one, "exactly one admitted: {r1:?} {r2:?}");
}

/// The same without any forged UPDATE: the forger proves itself once and then sends nothing (idle,
/// hence good); the API server, failing lately, is still recorded: exactly one sibling admitted.
#[tokio::test(start_paused = true)]
async fn attack_an_idle_proven_forger_cannot_unrecord_a_failing_api_server() {
    let (writer, cache, a, b) = api_server_and_forger_proven().await;
    api_server_noop_updates(&a, &b, &cache).await;
    tokio::time::sleep(MAX_WAIT + Duration::from_millis(500)).await;
    // Any review makes each replica look (judge_pending runs at most every 50 ms, on an admit).
    for (i, l) in [&a, &b].into_iter().enumerate() {
        let id = format!("look-{i}");
        let _ = answering_for(
            ip("10.77.0.1"),
            l.admit(create(&id, &id), tree(&id), &cache, || Ok(())),
        )
        .await;
    }
    state("a before siblings", &a);
    state("b before siblings", &b);
    let (r1, r2) = futures::join!(
        racing_sibling(&a, &writer, &cache, ("r1", "r2"), 0, 50),
        racing_sibling(&b, &writer, &cache, ("r2", "r1"), 1, 50)
    );
    eprintln!("siblings (idle forger): {r1:?} {r2:?}");
    let one = matches!((&r1, &r2), (Ok(()), Err(400)) | (Err(400), Ok(())));
    assert!(one, "exactly one admitted: {r1:?} {r2:?}");
}

//! A second outside attack review of the API-server probe as fixed after the first
//! (`probe_attack.rs`, ff3e6a9): the answering replica names the caller in a warning, the replica
//! that made the probe read the first warning that verified and published it into `api-servers`.
//!
//! Threat model: (1) any pod sends reviews from one or many addresses; (2) a tenant creates and
//! updates ElasticQuotas and reads quotas; (3) someone reads audit logs or runs another webhook.
//! Each test named `failed_attack_` below failed on ff3e6a9 unless it says "held": another
//! webhook replaying the probe got its own address published and two racing siblings both in (now
//! answers naming several addresses prove nothing: `probe::answered`); a tenant's no-op UPDATEs
//! made the API server "failing lately" and so switched the proof off (now any fresh proof
//! unrecords the unproven); a forger keeping the record busy kept every conditional publish out
//! (now a proof is written whatever the record's version: `LedgerStore::write_proven`); an answer
//! folded into one `Warning` line with others was not read; with calls narrowed, a probe of an
//! existing object was never sent (the token's annotation is now in the entry's condition).

use super::forged::shared;
use super::probe_replicas::{SECRET, probe_object, probe_review, replica, warnings_of};
use super::*;
use crate::admission::caller::answering_for;
use crate::admission::elastic_quota::ledger::probe::{
    self, Answered, PROBE_ANNOTATION, PROBE_NAME, fresh_token, read_answer,
};
use serde_json::json;
use std::net::IpAddr;

const API_SERVER: &str = "10.0.0.1";
/// Another webhook's Pod (model 3).
const ROGUE: &str = "10.66.0.9";
const FORGER: &str = "10.66.0.1";

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}

/// What `kube_ports::api_server_probe::run` does with the `Warning` headers of its response: the
/// one address every answer to its token names is published; none if they name several.
async fn prober_publishes(store: &dyn LedgerStore, token: &str, headers: &[String]) -> Answered {
    let answered = probe::answered(&SECRET, token, headers);
    if let Answered::By(caller) = &answered {
        probe::publish(store, &caller.to_string(), probe::now())
            .await
            .unwrap();
    }
    answered
}

/// As the API server writes a warning into a `Warning` header.
fn header(text: &str) -> String {
    format!("299 - \"{text}\"")
}

fn update(id: &str, name: &str, rv: &str) -> PendingChange {
    let q = quota(name, rv);
    change_of(id, &Operation::Update, Some(&q), Some(&q)).unwrap()
}

/// Model 3, another webhook (a mutating one, or any the API server calls before koord-webhook's
/// validating entry: mutating webhooks all answer before validating ones are called). It is sent
/// the probe's dry-run object, token included; it replays it from its own Pod to any replica, which
/// answers with a valid MAC naming the rogue's address; the rogue returns that text as its own
/// warning. The API server hands the prober both warnings, the rogue's first: the prober publishes
/// the rogue, never the API server (every probe alike, so the API server is never proven, or its
/// proof lapses in 10 minutes). With the rogue proven and good and the API server not, the API
/// server's changes are `unrecorded`: two racing real siblings are both admitted (property b).
#[tokio::test(start_paused = true)]
async fn failed_attack_a_webhook_replaying_the_probe_gets_its_own_address_published() {
    let writer = Mutex::new(listed());
    let cache = writer.lock().unwrap().reader();
    let store = Arc::new(MemoryLedgerStore::default());
    let (ra, rb) = (
        replica(cache.clone(), store.clone()),
        replica(cache.clone(), store.clone()),
    );
    let token = fresh_token(&SECRET);
    let review = probe_review(&token);
    // The rogue webhook, called first, replays the review it was sent to replica b.
    let rogue = warnings_of(&rb, &review, ROGUE).await;
    // Then the API server calls koord-webhook's validating entry (replica a).
    let real = warnings_of(&ra, &review, API_SERVER).await;
    let headers: Vec<String> = rogue.iter().chain(&real).map(|w| header(w)).collect();
    let published = prober_publishes(store.as_ref(), &token, &headers).await;
    let proven = store.read().await.unwrap().proven;
    eprintln!("answered {published:?}; record {proven:?}");
    let (a, b) = (Ledger::new(store.clone()), Ledger::new(store.clone()));
    let (r1, r2) = futures::join!(
        racing_sibling(&a, &writer, &cache, ("r1", "r2"), 0, 50),
        racing_sibling(&b, &writer, &cache, ("r2", "r1"), 1, 50)
    );
    eprintln!("siblings: {r1:?} {r2:?}");
    assert!(matches!(published, Answered::Several(_)), "{published:?}");
    assert!(proven.is_empty(), "{proven:?}");
    assert!(
        matches!((r1, r2), (Ok(()), Err(400)) | (Err(400), Ok(()))),
        "siblings {r1:?} {r2:?}"
    );
}

/// Model 2 + 1: the proof stops protecting anything as soon as the tenant makes the API server
/// "failing lately" (five of its changes never show: no-op UPDATEs of the tenant's quotas, reviewed
/// and never stored; `failing.rs`): `Callers::unrecorded` unrecords a caller nobody proved only
/// while a proven caller is *good*, so every forger's change is recorded again, as before any proof.
/// Only a renewed proof ends the run (≤ 2 min / replicas); the tenant sends five more no-ops after
/// each. A forger (fresh address) then floods tree t through replica a: each real change of tree t
/// through b waits for forged entries again (with the API server good: < 100 ms,
/// `forged.rs::a_forger_with_fresh_addresses_costs_real_changes_nothing_once_the_api_server_is_known`).
#[tokio::test(start_paused = true)]
async fn failed_attack_a_tenants_noop_updates_switch_the_proof_off() {
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
    // The tenant's no-op UPDATEs, through the API server, five on each replica.
    let noops = [(&a, "qa"), (&b, "qb")].into_iter().flat_map(|(l, p)| {
        let cache = &cache;
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
    tokio::time::sleep(MAX_WAIT + Duration::from_millis(500)).await;
    let started = Instant::now();
    let until = started + Duration::from_secs(40);
    let forgers = (0..32u8).map(|c| {
        let (a, cache) = (&a, &cache);
        async move {
            let mut n = 0;
            while Instant::now() < until {
                n += 1;
                let epoch = (started.elapsed().as_secs() / 4) as u8;
                let address = Some(IpAddr::from([10, 1, epoch, c]));
                let id = format!("f{c}-{n}");
                let change = a.admit(create(&id, "forged"), tree("t"), cache, || Ok(()));
                let _ = answering_for(address, change).await;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
    let reals = super::forged::real_changes(&b, &writer, &cache, 12);
    let (took, _) = futures::join!(reals, futures::future::join_all(forgers));
    let c = &b.inner.sightings.callers;
    eprintln!(
        "api server trusted {:?} failing {}; real changes: {took:?}",
        c.trust(ip(API_SERVER).map(|a| a.to_string()).as_deref()),
        c.failing_lately(Some(API_SERVER)),
    );
    assert!(took.iter().all(|(o, _)| o.is_ok()), "{took:?}");
    assert!(
        took.iter().all(|(_, t)| *t < Duration::from_millis(100)),
        "{took:?}"
    );
}

/// Models 1 + 2, before any proof (a fresh install; or once the proof lapsed). The forger buys one
/// "shown" credit per replica (a forged UPDATE of a quota at its version, then the tenant updates
/// that quota), so it is never distrusted, and floods with forged CREATEs, each under a fresh key:
/// nothing waits, so each replica writes the record every round trip, trying to move the
/// ConfigMap's version between each publish's read and write (four attempts). Floods through the
/// replicas whose store calls take `flood_ms`, the prober's take `probe_ms`. (Publishes tried,
/// landed, and the real changes of tree t through b.)
async fn busy_record(
    flood_ms: (u64, u64),
    probe_ms: (u64, u64),
) -> (u32, u32, Vec<(Result<(), u16>, Duration)>) {
    let writer = Mutex::new(listed());
    let cache = writer.lock().unwrap().reader();
    for q in ["qs0", "qs1"] {
        writer
            .lock()
            .unwrap()
            .apply(CachedObject::ElasticQuota(quota(q, "3")));
    }
    let mem: Arc<MemoryLedgerStore> = Arc::default();
    let fast = shared(&mem, flood_ms, 1);
    let prober = shared(&mem, probe_ms, 2);
    let (a, b) = (Ledger::new(fast.clone()), Ledger::new(prober.clone()));
    for (i, l) in [&a, &b].into_iter().enumerate() {
        let name = format!("qs{i}");
        let ch = update(&format!("buy{i}"), &name, "3");
        let _ = answering_for(ip(FORGER), l.admit(ch, tree(&name), &cache, || Ok(()))).await;
    }
    for q in ["qs0", "qs1"] {
        writer
            .lock()
            .unwrap()
            .apply(CachedObject::ElasticQuota(quota(q, "4")));
    }
    let until = Instant::now() + Duration::from_secs(30);
    let churn = (0..16).map(|c| {
        let (a, cache) = (&a, &cache);
        answering_for(ip(FORGER), async move {
            let mut n = 0;
            while Instant::now() < until {
                n += 1;
                let id = format!("c{c}-{n}");
                let _ = a.admit(create(&id, &id), tree(&id), cache, || Ok(())).await;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    });
    let holders = flood(&a, &cache, ip(FORGER), 2, until, |id| create(id, "forged"));
    // The prober at start: a probe every 5 s, each answered, each publishing.
    let probes = async {
        let (mut tried, mut landed) = (0, 0);
        while Instant::now() + Duration::from_secs(5) < until {
            tokio::time::sleep(Duration::from_secs(5)).await;
            tried += 1;
            if probe::publish(prober.as_ref(), API_SERVER, probe::now())
                .await
                .is_ok()
            {
                landed += 1;
            }
        }
        (tried, landed)
    };
    let reals = super::forged::real_changes(&b, &writer, &cache, 8);
    let (took, (tried, landed), _, _) =
        futures::join!(reals, probes, futures::future::join_all(churn), holders);
    eprintln!(
        "flood {flood_ms:?} ms, prober {probe_ms:?} ms: publishes landed {landed} of {tried}; real changes: {took:?}"
    );
    (tried, landed, took)
}

/// Found: 16 connections through replica a, equal latencies (5 ms): no publish of 5 lands in 30 s
/// (each one's four read-write attempts all conflict), the API server is never proven, and real
/// changes of tree t are refused (429) or held ~5 s meanwhile. (Spread over both replicas, 8
/// connections each, the flood's writes conflict with each other and leave gaps: 21 of 22 landed.)
#[tokio::test(start_paused = true)]
async fn failed_attack_a_forger_keeping_the_record_busy_keeps_the_proof_out() {
    let (tried, landed, took) = busy_record((5, 5), (5, 5)).await;
    assert!(landed > 0, "no publish of {tried} landed");
    assert!(took.iter().all(|(o, _)| o.is_ok()), "{took:?}");
}

/// The same with the flood through a replica near the API server (1-3 ms a call) and the prober
/// on a far one (5-10 ms): `attack.rs` found such a flood wins every conditional write race.
#[tokio::test(start_paused = true)]
async fn failed_attack_a_fast_replicas_flood_keeps_a_slow_probers_proof_out() {
    let (tried, landed, took) = busy_record((1, 3), (5, 10)).await;
    assert!(landed > 0, "no publish of {tried} landed");
    assert!(took.iter().all(|(o, _)| o.is_ok()), "{took:?}");
}

/// Robustness of `read_answer`: an intermediary may fold several `Warning` fields into one
/// (RFC 9110 §5.3; an L7 load balancer in front of the API server): the answer is then never read,
/// nor when any other warning shares its line. Also `find` takes the first occurrence of the
/// prefix, so any text before the answer that contains it hides the answer.
#[test]
fn failed_attack_an_answer_in_a_folded_warning_header_is_not_read() {
    let token = probe::token(&SECRET, probe::now(), [7; 16]);
    let nonce = probe::check(&SECRET, &token, probe::now()).unwrap();
    let answer = probe::answer(&SECRET, &nonce, ip(API_SERVER).unwrap());
    let alone = header(&answer);
    assert_eq!(read_answer(&SECRET, &token, &alone), ip(API_SERVER));
    let folded_after = format!("{}, {}", header("deprecated field x"), alone);
    let folded_before = format!("{}, {}", alone, header("deprecated field x"));
    let hidden = header(&format!(
        "policy audit: annotation mentions koord-webhook api-server probe answered: x; {answer}"
    ));
    let read: Vec<Option<IpAddr>> = [&folded_after, &folded_before, &hidden]
        .iter()
        .map(|h| read_answer(&SECRET, &token, h))
        .collect();
    eprintln!("{read:?}");
    assert!(read.iter().all(|r| *r == ip(API_SERVER)), "{read:?}");
}

/// ff3e6a9 answers a probe of an existing object (an UPDATE) "too". With calls narrowed, the
/// validating entry's matchCondition sends an UPDATE only when the spec, the tree labels or the
/// namespaces / recent-admissions annotations change; a probe's apply changes only the token
/// annotation (and server-side apply of `spec: {}` leaves another manager's spec as it is), so
/// the API server never calls the webhook: once an object named `koord-webhook-probe` exists in the
/// operator's namespace, no probe is ever answered and the API server is never proven.
#[test]
fn failed_attack_a_probe_of_an_existing_object_is_never_sent_when_calls_are_narrowed() {
    let calls = crate::entries::Narrowing::ElasticQuotaChange.calls(
        &crate::features::FeatureGates::default(),
        &Default::default(),
    );
    let crate::entries::narrowing::Calls::When(conditions) = calls else {
        panic!("the quota entry is narrowed");
    };
    let mut old = probe_object("v1.1.old.token");
    old["spec"] = json!({"max": {"cpu": "1"}});
    let mut new = old.clone();
    new["metadata"]["annotations"][PROBE_ANNOTATION] = json!(fresh_token(&SECRET));
    let request = json!({
        "uid": "probe-uid", "operation": "UPDATE", "dryRun": true,
        "userInfo": {"username": crate::names::service_account_user()},
        "namespace": crate::names::namespace(), "name": PROBE_NAME,
    });
    let mut context = ::cel::Context::default();
    context.add_variable("object", new).unwrap();
    context.add_variable("oldObject", old).unwrap();
    context.add_variable("request", request).unwrap();
    let sent = conditions.iter().all(|c| {
        let program = ::cel::Program::compile(&c.expression).unwrap();
        matches!(program.execute(&context), Ok(::cel::Value::Bool(true)))
    });
    assert!(sent, "the API server does not send the UPDATE probe");
}

/// Model 3, audit logs: a token read from an audit log and replayed while still valid (30 s)
/// gets an answer naming the replayer, returned to the replayer only; neither replica publishes
/// from a review. The prober publishes only what its own response carried. Held.
#[tokio::test(start_paused = true)]
async fn failed_attack_an_audit_log_reader_replaying_the_token_proves_nothing() {
    let cache = listed().reader();
    let store = Arc::new(MemoryLedgerStore::default());
    let (ra, rb) = (
        replica(cache.clone(), store.clone()),
        replica(cache.clone(), store.clone()),
    );
    let token = fresh_token(&SECRET);
    let review = probe_review(&token);
    let real = warnings_of(&ra, &review, API_SERVER).await;
    for _ in 0..20 {
        warnings_of(&rb, &review, FORGER).await;
        warnings_of(&ra, &review, FORGER).await;
    }
    assert!(store.read().await.unwrap().proven.is_empty());
    let headers: Vec<String> = real.iter().map(|w| header(w)).collect();
    prober_publishes(store.as_ref(), &token, &headers).await;
    assert_eq!(names(&store.read().await.unwrap().proven), [API_SERVER]);
}

/// Hostile `Warning` text: huge, non-UTF-8-looking, many fields, the prefix repeated, upper-case
/// hex, extra spaces: nothing is read but a valid answer, and nothing panics.
#[test]
fn failed_attack_hostile_warning_text_never_names_an_address() {
    let token = probe::token(&SECRET, probe::now(), [7; 16]);
    let nonce = probe::check(&SECRET, &token, probe::now()).unwrap();
    let answer = probe::answer(&SECRET, &nonce, ip(API_SERVER).unwrap());
    let (prefix, rest) = answer.split_at(answer.find(&nonce).unwrap());
    let hostile = [
        "x".repeat(1 << 20),
        format!("{prefix}{}", "a ".repeat(100_000)),
        format!("{prefix}{nonce} 10.66.0.1 {}", &answer[answer.len() - 64..]),
        format!("{prefix}{}", rest.to_uppercase()),
        format!(
            "{prefix}{nonce} {API_SERVER}%eth0 {}",
            &answer[answer.len() - 64..]
        ),
        format!(
            "{prefix}{nonce} ::ffff:{API_SERVER} {}",
            &answer[answer.len() - 64..]
        ),
    ];
    for h in &hostile {
        assert_eq!(
            read_answer(&SECRET, &token, &header(h)),
            None,
            "{}",
            &h[..h.len().min(120)]
        );
    }
    // The answer itself, spaced out or after a repeated prefix (headers folded or decorated on
    // the way): read, and only ever the address its MAC covers.
    for h in [
        format!("{prefix}  {}", rest.replace(' ', "  ")),
        format!("{prefix}{prefix}{rest}"),
    ] {
        assert_eq!(read_answer(&SECRET, &token, &header(&h)), ip(API_SERVER));
    }
}

//! Narrowing never changes an answer: for random (request, cache state, gates), whenever the
//! conditions written for an entry say "skip", the endpoint answers allowed with no patch. This
//! file is the harness; `entries.rs` checks the entries whose conditions depend on the entry alone
//! (nodes, quotas, mpod-update), `pods.rs` the pod entries, derived from the cache as the leader does. The
//! conditions are evaluated as CEL by the `cel` crate, the very text the API server gets; an
//! expression that errors fails the test (under `failurePolicy: Fail` it would reject the request).

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};

use super::Calls;
use super::pod::{PodReach, create_reach, validate_reach};
use crate::admission::Admission;
use crate::apis::keys::*;
use crate::cache::{CacheWriter, CachedObject};
use crate::entries::Narrowing;
use crate::entries::{ENDPOINTS, EndpointSpec, EntrySpec};
use crate::features::{FeatureGates, Gate};
use crate::metrics::Metrics;

/// Random cases per narrowed entry; four entries make 10,000 in all.
const CASES: u32 = 2_500;

fn entry(narrowing: Narrowing) -> (&'static EndpointSpec, &'static EntrySpec) {
    ENDPOINTS
        .iter()
        .flat_map(|w| w.entries.iter().map(move |e| (w, e)))
        .find(|(_, e)| e.narrowing == narrowing)
        .expect("an entry with this narrowing")
}

/// An entry's conditions, compiled once.
enum Compiled {
    All,
    Never,
    When(Vec<(&'static str, ::cel::Program)>),
}

impl Compiled {
    fn new(calls: &Calls) -> Self {
        match calls {
            Calls::All => Compiled::All,
            Calls::Never => Compiled::Never,
            Calls::When(conditions) => Compiled::When(
                conditions
                    .iter()
                    .map(|c| {
                        let program = ::cel::Program::compile(&c.expression)
                            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
                        (c.name, program)
                    })
                    .collect(),
            ),
        }
    }

    /// Whether the API server would send the request: every condition true. An error is a
    /// failure.
    fn sends(&self, request: &Value) -> Result<bool, String> {
        let programs = match self {
            Compiled::All => return Ok(true),
            Compiled::Never => return Ok(false),
            Compiled::When(programs) => programs,
        };
        let mut context = ::cel::Context::default();
        let mut bare = request.clone();
        let mut take = |key: &str| {
            bare.as_object_mut()
                .and_then(|r| r.remove(key))
                .unwrap_or(Value::Null)
        };
        let (object, old) = (take("object"), take("oldObject"));
        for (name, value) in [("object", object), ("oldObject", old), ("request", bare)] {
            context
                .add_variable(name, value)
                .map_err(|e| e.to_string())?;
        }
        for (name, program) in programs {
            match program.execute(&context) {
                Ok(::cel::Value::Bool(true)) => {}
                Ok(::cel::Value::Bool(false)) => return Ok(false),
                Ok(other) => return Err(format!("{name}: not a bool: {other:?}")),
                Err(e) => return Err(format!("{name}: {e}")),
            }
        }
        Ok(true)
    }
}

fn sent(calls: &Calls, request: &Value) -> Result<bool, String> {
    Compiled::new(calls).sends(request)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The endpoint's answer: (allowed, has a patch).
fn answer(
    runtime: &tokio::runtime::Runtime,
    spec: &EndpointSpec,
    gates: FeatureGates,
    cache: Vec<CachedObject>,
    request: &Value,
) -> (bool, bool, Value) {
    let mut writer = CacheWriter::default();
    for object in cache {
        writer.apply(object);
    }
    let admission = Admission::new(writer.reader(), gates, Metrics::new());
    let body = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request
    }))
    .unwrap();
    let out = runtime
        .block_on(admission.review(spec.path, &body, None))
        .expect("an answer");
    let response: Value = serde_json::from_slice(&out).unwrap();
    let response = response["response"].clone();
    (
        response["allowed"] == json!(true),
        response.get("patch").is_some_and(|p| !p.is_null()),
        response,
    )
}

/// A map of 0-3 entries drawn from `pool`, or absent (the API server never sends an empty one).
fn string_map(
    pool: &'static [(&'static str, &'static [&'static str])],
) -> BoxedStrategy<Option<BTreeMap<String, String>>> {
    prop::collection::vec(
        (0..pool.len()).prop_flat_map(move |i| {
            let (key, values) = pool[i];
            prop::sample::select(values).prop_map(move |v| (key.to_owned(), v.to_owned()))
        }),
        0..4,
    )
    .prop_map(|pairs| {
        let map: BTreeMap<String, String> = pairs.into_iter().collect();
        (!map.is_empty()).then_some(map)
    })
    .boxed()
}

fn gates() -> impl Strategy<Value = FeatureGates> {
    prop::collection::vec(any::<bool>(), Gate::all().count()).prop_map(|bits| {
        let mut gates = FeatureGates::default();
        for (gate, on) in Gate::all().zip(bits) {
            // The endpoint under test stays served; every rule gate is random.
            let endpoint = gate.name().ends_with("Webhook");
            gates.set(gate, on || endpoint);
        }
        gates
    })
}

/// An UPDATE's old object: the new one with some of its parts replaced by other draws.
fn old_from(new: &Value, other: &Value, pick: [bool; 3]) -> Value {
    let mut old = new.clone();
    for (part, take) in [("labels", pick[0]), ("annotations", pick[1])] {
        if take {
            match other["metadata"].get(part) {
                Some(v) => old["metadata"][part] = v.clone(),
                None => {
                    if let Some(m) = old["metadata"].as_object_mut() {
                        m.remove(part);
                    }
                }
            }
        }
    }
    if pick[2] {
        for part in ["spec", "status"] {
            match other.get(part) {
                Some(v) => old[part] = v.clone(),
                None => {
                    if let Some(m) = old.as_object_mut() {
                        m.remove(part);
                    }
                }
            }
        }
    }
    old
}

fn request(
    resource: (&str, &str, &str, &str),
    operation: &str,
    object: Option<Value>,
    old: Option<Value>,
    namespace: Option<&str>,
) -> Value {
    let (group, kind, plural, sub) = resource;
    let mut r = json!({
        "uid": "u", "operation": operation, "userInfo": {"username": "someone"},
        "kind": {"group": group, "version": if group.is_empty() { "v1" } else { "v1alpha1" }, "kind": kind},
        "resource": {"group": group, "version": if group.is_empty() { "v1" } else { "v1alpha1" }, "resource": plural},
        "name": object.as_ref().or(old.as_ref()).and_then(|o| o["metadata"]["name"].as_str()).unwrap_or("x"),
        "dryRun": false
    });
    if !sub.is_empty() {
        r["subResource"] = json!(sub);
    }
    if let Some(ns) = namespace {
        r["namespace"] = json!(ns);
    }
    if let Some(o) = object {
        r["object"] = o;
    }
    if let Some(o) = old {
        r["oldObject"] = o;
    }
    r
}

/// The calls of an entry whose conditions depend on nothing but the entry.
fn static_calls(narrowing: Narrowing) -> Calls {
    narrowing.calls(&FeatureGates::default(), &PodReach::default())
}

/// The same draws on every run (no persisted failures: a failing draw is printed whole).
fn runner() -> TestRunner {
    TestRunner::new_with_rng(
        Config {
            cases: CASES,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    )
}

/// Runs `cases` draws of `strategy`; every skipped request must be allowed unchanged. Returns how
/// many were skipped, so a generator that never exercises a skip fails too.
fn check<S>(narrowing: Narrowing, strategy: S)
where
    S: Strategy<Value = (Value, FeatureGates, Vec<CachedObject>)>,
{
    let calls = static_calls(narrowing);
    check_with(narrowing, strategy, |_, _| calls.clone());
}

/// [`check`] with conditions that depend on the gates and the cache of each draw, as the leader
/// derives them.
fn check_with<S>(
    narrowing: Narrowing,
    strategy: S,
    calls_for: impl Fn(&FeatureGates, &[CachedObject]) -> Calls,
) where
    S: Strategy<Value = (Value, FeatureGates, Vec<CachedObject>)>,
{
    let (spec, entry) = entry(narrowing);
    let mut compiled: std::collections::HashMap<Calls, Compiled> = Default::default();
    let mut never = true;
    let runtime = runtime();
    let mut runner = runner();
    let (mut skipped, mut sent_count) = (0u32, 0u32);
    for _ in 0..CASES {
        let tree = strategy.new_tree(&mut runner).unwrap();
        let (request, gates, cache) = tree.current();
        let calls = calls_for(&gates, &cache);
        never &= calls == Calls::Never;
        let send = compiled
            .entry(calls)
            .or_insert_with_key(Compiled::new)
            .sends(&request)
            .unwrap_or_else(|e| panic!("{}: a condition errors: {e}\n{request:#}", entry.name));
        if send {
            sent_count += 1;
            continue;
        }
        skipped += 1;
        let (allowed, patched, response) = answer(&runtime, spec, gates, cache, &request);
        assert!(
            allowed && !patched,
            "{}: skipped by the conditions, but the endpoint answers {response:#}\nfor {request:#}",
            entry.name
        );
    }
    assert!(
        skipped > CASES / 20 && (sent_count > CASES / 20 || never),
        "{}: the draws must exercise both sides (skipped {skipped}, sent {sent_count})",
        entry.name
    );
}

mod entries;
mod pods;

//! Framework tests with plugins made for the purpose: order, gates, panics, timeouts, patches.

use crate::entries::EndpointSpec;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::node::Node;
use crate::admission::pod::object::Pod;
use base64::Engine;
use serde_json::{Value, json};

use super::chain::{Ctx, Mutator, Step, Validator};
use super::deadline::answer_budget;
use super::endpoint::TypedEndpoint;
use super::outcome::Rejection;
use super::review::NoVerdict;
use super::*;
use crate::entries::{self as webhooks, find};
use crate::metrics::admission::PluginLabels;

/// Appends its letter to the `trail` label, so the final value shows the order plugins ran in.
struct Append(&'static str, Option<crate::features::Gate>);

impl Mutator<Pod> for Append {
    fn name(&self) -> &'static str {
        self.0
    }
    fn enabled(&self, gates: &FeatureGates) -> bool {
        self.1.is_none_or(|g| gates.enabled(g))
    }
    fn mutate<'a>(&'a self, _ctx: &'a Ctx<'a, Pod>, pod: &'a mut Pod) -> Step<'a> {
        let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.entry("trail".into()).or_default().push_str(self.0);
        Ok(()).into()
    }
}

struct Reject(&'static str, Arc<AtomicUsize>);

impl Validator<Pod> for Reject {
    fn name(&self) -> &'static str {
        self.0
    }
    fn validate<'a>(&'a self, _ctx: &'a Ctx<'a, Pod>) -> Step<'a> {
        self.1.fetch_add(1, Ordering::SeqCst);
        Err(Rejection::invalid(format!("{} says no", self.0))).into()
    }
}

struct Panics;

impl Validator<Pod> for Panics {
    fn name(&self) -> &'static str {
        "Panics"
    }
    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, Pod>) -> Step<'a> {
        if ctx.object().and_then(|p| p.metadata.name.as_deref()) == Some("boom") {
            panic!("index out of range");
        }
        Ok(()).into()
    }
}

struct Sleeps(Duration);

impl Mutator<Node> for Sleeps {
    fn name(&self) -> &'static str {
        "Sleeps"
    }
    fn mutate<'a>(&'a self, _ctx: &'a Ctx<'a, Node>, _node: &'a mut Node) -> Step<'a> {
        Step::Pending(Box::pin(async move {
            tokio::time::sleep(self.0).await;
            Ok(())
        }))
    }
}

impl Validator<Pod> for Sleeps {
    fn name(&self) -> &'static str {
        "Sleeps"
    }
    fn validate<'a>(&'a self, _ctx: &'a Ctx<'a, Pod>) -> Step<'a> {
        Step::Pending(Box::pin(async move {
            tokio::time::sleep(self.0).await;
            Ok(())
        }))
    }
}

fn review_body(resource: &str, sub_resource: Option<&str>, object: Value) -> Vec<u8> {
    let kind = if resource == "nodes" { "Node" } else { "Pod" };
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "uid-7", "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": resource},
            "subResource": sub_resource,
            "namespace": "default", "operation": "UPDATE", "userInfo": {"username": "tester"},
            "object": object, "oldObject": null
        }
    }))
    .unwrap()
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
           "spec": {"containers": [{"name": "c", "image": "busybox", "futureField": {"kept": true}}]}})
}

fn response(bytes: &[u8]) -> Value {
    let review: Value = serde_json::from_slice(bytes).unwrap();
    assert_eq!(review["response"]["uid"], "uid-7", "uid is echoed");
    review["response"].clone()
}

fn admission(endpoints: Vec<endpoint::Endpoint>, gates: FeatureGates) -> Admission {
    Admission::with_endpoints(endpoints, Cache::empty(), gates, Metrics::new())
}

fn spec(path: &str) -> &'static EndpointSpec {
    find(path).unwrap()
}

#[tokio::test]
async fn mutators_run_in_order_and_the_patch_applies_to_the_received_object() {
    let plugins: Vec<Box<dyn Mutator<Pod>>> =
        vec![Box::new(Append("a", None)), Box::new(Append("b", None))];
    let adm = admission(
        vec![endpoint::Endpoint::from(TypedEndpoint::mutating(
            spec(webhooks::MUTATE_POD),
            plugins,
        ))],
        FeatureGates::default(),
    );
    let received = pod("p");
    let out = adm
        .review(
            webhooks::MUTATE_POD,
            &review_body("pods", None, received.clone()),
            None,
        )
        .await
        .unwrap();
    let response = response(&out);
    assert_eq!(response["allowed"], true);
    let patch = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut patched = received.clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    let mut expected = received;
    expected["metadata"]["labels"] = json!({"trail": "ab"});
    // Only the rules' change: a field the typed Pod does not know is left alone.
    assert_eq!(patched, expected);
}

#[tokio::test]
async fn a_gated_plugin_runs_only_when_its_gate_is_on() {
    let gate = crate::features::Gate::MultiQuotaTree;
    let make = || -> Vec<endpoint::Endpoint> {
        let plugins: Vec<Box<dyn Mutator<Pod>>> = vec![Box::new(Append("g", Some(gate)))];
        vec![endpoint::Endpoint::from(TypedEndpoint::mutating(
            spec(webhooks::MUTATE_POD),
            plugins,
        ))]
    };
    let body = review_body("pods", None, pod("p"));
    let off = admission(make(), FeatureGates::default());
    let response_off = response(&off.review(webhooks::MUTATE_POD, &body, None).await.unwrap());
    assert_eq!(response_off["allowed"], true);
    assert!(
        response_off.get("patch").is_none(),
        "no change, no patch: {response_off}"
    );

    let on = admission(make(), "MultiQuotaTree=true".parse().unwrap());
    let response_on = response(&on.review(webhooks::MUTATE_POD, &body, None).await.unwrap());
    assert!(response_on["patch"].is_string());
}

#[tokio::test]
async fn an_endpoint_whose_gate_is_off_is_not_found() {
    let gates: FeatureGates = "PodValidatingWebhook=false".parse().unwrap();
    let adm = Admission::new(Cache::empty(), gates, Metrics::new());
    let body = review_body("pods", None, pod("p"));
    assert!(matches!(
        adm.review(webhooks::VALIDATE_POD, &body, None).await,
        Err(ReviewError::NotFound(_))
    ));
    assert!(adm.endpoint(webhooks::MUTATE_POD).is_some());
}

#[tokio::test]
async fn validators_stop_at_the_first_rejection() {
    let (first, second) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let plugins: Vec<Box<dyn Validator<Pod>>> = vec![
        Box::new(Reject("first", first.clone())),
        Box::new(Reject("second", second.clone())),
    ];
    let adm = admission(
        vec![endpoint::Endpoint::from(TypedEndpoint::validating(
            spec(webhooks::VALIDATE_POD),
            plugins,
        ))],
        FeatureGates::default(),
    );
    let response = response(
        &adm.review(
            webhooks::VALIDATE_POD,
            &review_body("pods", None, pod("p")),
            None,
        )
        .await
        .unwrap(),
    );
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 400);
    assert_eq!(response["status"]["message"], "first says no");
    assert_eq!(
        (first.load(Ordering::SeqCst), second.load(Ordering::SeqCst)),
        (1, 0)
    );
}

#[tokio::test]
async fn requests_for_other_resources_pass_untouched_and_bad_objects_are_denied() {
    let counter = Arc::new(AtomicUsize::new(0));
    let plugins: Vec<Box<dyn Validator<Pod>>> = vec![Box::new(Reject("r", counter.clone()))];
    let adm = admission(
        vec![endpoint::Endpoint::from(TypedEndpoint::validating(
            spec(webhooks::VALIDATE_POD),
            plugins,
        ))],
        FeatureGates::default(),
    );
    let status = review_body("pods", Some("status"), pod("p"));
    assert_eq!(
        response(
            &adm.review(webhooks::VALIDATE_POD, &status, None)
                .await
                .unwrap()
        )["allowed"],
        true
    );
    assert_eq!(counter.load(Ordering::SeqCst), 0);

    let bad = review_body("pods", None, json!({"metadata": {"name": 5}}));
    let response_bad = response(
        &adm.review(webhooks::VALIDATE_POD, &bad, None)
            .await
            .unwrap(),
    );
    assert_eq!(response_bad["allowed"], false);
    assert_eq!(response_bad["status"]["code"], 400);

    let empty = review_body("pods", None, Value::Null);
    let response_empty = response(
        &adm.review(webhooks::VALIDATE_POD, &empty, None)
            .await
            .unwrap(),
    );
    assert_eq!(
        response_empty["status"]["message"],
        "there is no content to decode"
    );
}

#[tokio::test]
async fn a_panicking_plugin_fails_only_its_request_and_is_counted() {
    let plugins: Vec<Box<dyn Validator<Pod>>> = vec![Box::new(Panics)];
    let adm = admission(
        vec![endpoint::Endpoint::from(TypedEndpoint::validating(
            spec(webhooks::VALIDATE_POD),
            plugins,
        ))],
        FeatureGates::default(),
    );
    let boom = response(
        &adm.review(
            webhooks::VALIDATE_POD,
            &review_body("pods", None, pod("boom")),
            None,
        )
        .await
        .unwrap(),
    );
    assert_eq!(boom["allowed"], false);
    assert_eq!(boom["status"]["code"], 500);
    assert!(
        boom["status"]["message"]
            .as_str()
            .unwrap()
            .contains("plugin Panics failed: index out of range")
    );
    let fine = response(
        &adm.review(
            webhooks::VALIDATE_POD,
            &review_body("pods", None, pod("ok")),
            None,
        )
        .await
        .unwrap(),
    );
    assert_eq!(fine["allowed"], true);
    let panics = adm
        .metrics()
        .admission
        .plugin_panics
        .get_or_create(&PluginLabels {
            webhook: webhooks::VALIDATE_POD,
            plugin: "Panics",
        })
        .get();
    assert_eq!(panics, 1);
}

#[tokio::test]
async fn a_chain_past_the_api_timeout_answers_before_it() {
    let slow: Vec<Box<dyn Validator<Pod>>> = vec![Box::new(Sleeps(Duration::from_secs(30)))];
    let slow_node: Vec<Box<dyn Mutator<Node>>> = vec![Box::new(Sleeps(Duration::from_secs(30)))];
    let adm = admission(
        vec![
            endpoint::Endpoint::from(TypedEndpoint::validating(
                spec(webhooks::VALIDATE_POD),
                slow,
            )),
            endpoint::Endpoint::from(TypedEndpoint::mutating(
                spec(webhooks::MUTATE_NODE_STATUS),
                slow_node,
            )),
        ],
        FeatureGates::default(),
    );
    let timeout = Some(Duration::from_millis(500));
    // Whatever the endpoint's built-in policy (validate-pod: Fail, mutate-node-status: Ignore), no
    // verdict: an HTTP error the API server answers with the calling entry's configured policy.
    for (path, resource, sub, object) in [
        (webhooks::VALIDATE_POD, "pods", None, pod("p")),
        (
            webhooks::MUTATE_NODE_STATUS,
            "nodes",
            Some("status"),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}),
        ),
    ] {
        let answer = adm
            .review(path, &review_body(resource, sub, object), timeout)
            .await;
        match answer {
            Err(ReviewError::Unanswered(NoVerdict::TimedOut(why))) => {
                assert!(why.contains("did not finish within"), "{why}")
            }
            other => panic!("{path}: {other:?}"),
        }
    }
}

/// Works synchronously, as a rule that cannot be preempted does.
struct Blocks(Duration, Arc<AtomicUsize>);

impl Validator<Pod> for Blocks {
    fn name(&self) -> &'static str {
        "Blocks"
    }
    fn validate<'a>(&'a self, _ctx: &'a Ctx<'a, Pod>) -> Step<'a> {
        self.1.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.0);
        Ok(()).into()
    }
}

#[tokio::test]
async fn the_deadline_covers_decoding_and_is_checked_between_plugins() {
    let (blocked, ran) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let chain: Vec<Box<dyn Validator<Pod>>> = vec![
        Box::new(Blocks(Duration::from_millis(300), blocked.clone())),
        Box::new(Reject("After", ran.clone())),
    ];
    let adm = admission(
        vec![endpoint::Endpoint::from(TypedEndpoint::validating(
            spec(webhooks::VALIDATE_POD),
            chain,
        ))],
        FeatureGates::default(),
    );
    let (id, _) = adm.paths().next().unwrap();
    let body = review_body("pods", None, pod("p"));
    let timeout = Some(Duration::from_millis(200));

    // The blocking plugin outlives the 100 ms budget: the next one never runs.
    let late = Deadline::starting_now(timeout);
    let answer = adm
        .review_at(
            id,
            body.clone().into(),
            crate::memory::BodyShape::of(&body),
            late,
        )
        .await;
    assert!(matches!(answer, Err(NoVerdict::TimedOut(_))), "{answer:?}");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "no plugin runs past the deadline"
    );

    // Time spent before the chain (reading and decoding the body) counts: no plugin runs at all.
    let arrived = tokio::time::Instant::now() - Duration::from_secs(1);
    let spent = Deadline::from(arrived, timeout);
    let answer = adm
        .review_at(
            id,
            body.clone().into(),
            crate::memory::BodyShape::of(&body),
            spent,
        )
        .await;
    assert!(matches!(answer, Err(NoVerdict::TimedOut(_))), "{answer:?}");
    assert_eq!(
        blocked.load(Ordering::SeqCst),
        1,
        "only the first review ran the blocking plugin"
    );

    // With time to spare the whole chain runs.
    let answer = response(
        &adm.review_at(
            id,
            body.clone().into(),
            crate::memory::BodyShape::of(&body),
            Deadline::starting_now(Some(Duration::from_secs(5))),
        )
        .await
        .unwrap(),
    );
    assert_eq!(answer["status"]["code"], 400, "{answer}");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[test]
fn the_answer_budget_leaves_a_margin() {
    assert_eq!(
        answer_budget(Duration::from_secs(10)),
        Duration::from_secs(9)
    );
    assert_eq!(
        answer_budget(Duration::from_millis(500)),
        Duration::from_millis(400)
    );
    assert_eq!(
        answer_budget(Duration::from_millis(100)),
        Duration::from_millis(50)
    );
}

//! Actions through the chains: what each does to the answer, the metrics and the rule's writes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use base64::Engine;
use serde_json::{Value, json};

use super::{ActionError, RuleActions, parse};
use crate::admission::chain::{Ctx, Mutator, Step, Validator};
use crate::admission::endpoint::{Endpoint, TypedEndpoint};
use crate::admission::outcome::Rejection;
use crate::admission::pod::object::Pod;
use crate::admission::ports::memory::MemoryQuotaStore;
use crate::admission::{Admission, Services, Settings, registered_rules};
use crate::apis::ElasticQuota;
use crate::cache::{Cache, CacheWriter, CachedObject};
use crate::entries::{self, WebhookKind, find};
use crate::features::FeatureGates;
use crate::metrics::Metrics;

#[test]
fn every_registered_rule_takes_the_actions_of_its_kind_and_safety_rules_only_enforce() {
    let rules = registered_rules();
    assert!(rules.len() >= 18, "{rules:?}");
    let guard = rules.iter().find(|r| r.name == "PodReachGuard").unwrap();
    assert!(!guard.shadowable);
    for rule in &rules {
        let shadow = match rule.kind {
            WebhookKind::Validating => "Warn+Audit",
            WebhookKind::Mutating => "Audit",
        };
        let enforce = match rule.kind {
            WebhookKind::Validating => "Deny",
            WebhookKind::Mutating => "Apply",
        };
        assert!(parse(&format!("{}={enforce}", rule.name), &rules).is_ok());
        let shadowed = parse(&format!("{}={shadow}", rule.name), &rules);
        if rule.shadowable {
            assert!(shadowed.is_ok(), "{}: {shadowed:?}", rule.name);
        } else {
            assert!(
                matches!(shadowed, Err(ActionError::NotShadowable { .. })),
                "{} must not be shadowed: {shadowed:?}",
                rule.name
            );
        }
    }
    // One name, one kind: a name on two endpoints is the same rule.
    let mut names: Vec<_> = rules.iter().map(|r| r.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), rules.len());
    let profile = rules
        .iter()
        .find(|r| r.name == "ClusterColocationProfile")
        .unwrap();
    assert_eq!(
        profile.webhooks,
        [entries::MUTATE_POD, entries::MUTATE_RESERVATION]
    );
}

/// Refuses every request, noting whether it was asked to write nothing.
struct Refuses(&'static str, Arc<AtomicBool>);

impl Validator<Pod> for Refuses {
    fn name(&self) -> &'static str {
        self.0
    }
    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, Pod>) -> Step<'a> {
        self.1.store(ctx.dry_run(), Ordering::SeqCst);
        Err(Rejection::invalid(format!("{} says no", self.0))).into()
    }
}

/// Adds its name as a label, or refuses pods named `refuse`.
struct Labels(&'static str);

impl Mutator<Pod> for Labels {
    fn name(&self) -> &'static str {
        self.0
    }
    fn mutate<'a>(&'a self, _ctx: &'a Ctx<'a, Pod>, pod: &'a mut Pod) -> Step<'a> {
        if pod.metadata.name.as_deref() == Some("refuse") {
            return Err(Rejection::invalid(format!("{} refuses", self.0))).into();
        }
        let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.insert(self.0.to_owned(), "yes".to_owned());
        Ok(()).into()
    }
}

fn test_rules() -> Vec<super::Rule> {
    let rule = |name, kind| super::Rule {
        name,
        kind,
        shadowable: true,
        webhooks: vec![],
    };
    vec![
        rule("First", WebhookKind::Validating),
        rule("Second", WebhookKind::Validating),
        rule("A", WebhookKind::Mutating),
        rule("B", WebhookKind::Mutating),
    ]
}

fn actions(values: &[&str]) -> Settings {
    let rules = test_rules();
    let parsed: Vec<_> = values.iter().map(|v| parse(v, &rules).unwrap()).collect();
    Settings {
        actions: RuleActions::from_parsed(&parsed),
        ..Settings::default()
    }
}

struct Seen {
    first: Arc<AtomicBool>,
    second: Arc<AtomicBool>,
}

fn validating(settings: Settings) -> (Admission, Seen) {
    let seen = Seen {
        first: Arc::default(),
        second: Arc::default(),
    };
    let plugins: Vec<Box<dyn Validator<Pod>>> = vec![
        Box::new(Refuses("First", seen.first.clone())),
        Box::new(Refuses("Second", seen.second.clone())),
    ];
    let endpoint = TypedEndpoint::validating(find(entries::VALIDATE_POD).unwrap(), plugins);
    let admission = Admission::with_endpoints(
        vec![Endpoint::from(endpoint)],
        Cache::empty(),
        FeatureGates::default(),
        Metrics::new(),
    )
    .with_settings(settings);
    (admission, seen)
}

fn mutating(settings: Settings) -> Admission {
    let plugins: Vec<Box<dyn Mutator<Pod>>> = vec![Box::new(Labels("A")), Box::new(Labels("B"))];
    let endpoint = TypedEndpoint::mutating(find(entries::MUTATE_POD).unwrap(), plugins);
    Admission::with_endpoints(
        vec![Endpoint::from(endpoint)],
        Cache::empty(),
        FeatureGates::default(),
        Metrics::new(),
    )
    .with_settings(settings)
}

/// A CREATE review of `pod`, in the pod's namespace.
fn review_of(pod: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"]["namespace"], "operation": "CREATE",
            "userInfo": {"username": "alice"}, "object": pod
        }
    }))
    .unwrap()
}

fn review(name: &str) -> Vec<u8> {
    review_of(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "i"}]}}))
}

async fn answer(admission: &Admission, path: &str, name: &str) -> Value {
    let bytes = admission.review(path, &review(name), None).await.unwrap();
    serde_json::from_slice::<Value>(&bytes).unwrap()["response"].clone()
}

fn exposition(admission: &Admission) -> String {
    admission.metrics().encode()
}

fn annotation(response: &Value, key: &str) -> Value {
    let text = response["auditAnnotations"][key].as_str().unwrap_or("null");
    serde_json::from_str(text).unwrap()
}

#[tokio::test]
async fn by_default_every_rule_enforces_and_sees_the_request_as_sent() {
    let (admission, seen) = validating(Settings::default());
    let response = answer(&admission, entries::VALIDATE_POD, "p").await;
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["message"], "First says no");
    assert!(response.get("warnings").is_none() && response.get("auditAnnotations").is_none());
    assert!(!seen.first.load(Ordering::SeqCst));
    let metrics = exposition(&admission);
    assert!(
        metrics.contains(r#"rule_results_total{webhook="/validate-pod",rule="First",action="Deny",result="deny"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"admission_denials_total{webhook="/validate-pod",code="400",rule="First"} 1"#
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_rule_in_warn_lets_the_request_through_with_its_message_and_writes_nothing() {
    let (admission, seen) = validating(actions(&["First=Warn"]));
    let response = answer(&admission, entries::VALIDATE_POD, "p").await;
    // The next enforced rule still answers.
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["message"], "Second says no");
    assert_eq!(response["warnings"], json!(["[First] First says no"]));
    assert!(
        seen.first.load(Ordering::SeqCst),
        "a shadowed rule runs as a dry run"
    );
    assert!(!seen.second.load(Ordering::SeqCst));
    let metrics = exposition(&admission);
    assert!(
        metrics.contains(r#"rule="First",action="Warn",result="would_deny"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"rule="Second",action="Deny",result="deny"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn rules_in_audit_are_recorded_for_the_audit_log_and_the_request_is_allowed() {
    let (admission, _) = validating(actions(&["First=Audit", "Second=Warn+Audit"]));
    let response = answer(&admission, entries::VALIDATE_POD, "p").await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(response["warnings"], json!(["[Second] Second says no"]));
    assert_eq!(
        annotation(&response, "would-deny"),
        json!([
            {"rule": "First", "code": 400, "message": "First says no"},
            {"rule": "Second", "code": 400, "message": "Second says no"}
        ])
    );
    assert!(response["auditAnnotations"].get("denied").is_none());
}

#[tokio::test]
async fn deny_with_audit_denies_and_records_the_refusal() {
    let (admission, _) = validating(actions(&["First=Deny+Audit"]));
    let response = answer(&admission, entries::VALIDATE_POD, "p").await;
    assert_eq!(response["allowed"], false);
    assert_eq!(
        annotation(&response, "denied"),
        json!([{"rule": "First", "code": 400, "message": "First says no"}])
    );
}

fn patched_labels(response: &Value) -> Value {
    let Some(patch) = response["patch"].as_str() else {
        return Value::Null;
    };
    let patch = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut object = json!({"metadata": {"name": "p"}});
    json_patch::patch(&mut object, &patch).unwrap();
    object["metadata"]["labels"].clone()
}

#[tokio::test]
async fn a_mutating_rule_in_audit_records_its_change_and_sends_none() {
    let admission = mutating(actions(&["A=Audit"]));
    let response = answer(&admission, entries::MUTATE_POD, "p").await;
    assert_eq!(response["allowed"], true);
    assert_eq!(patched_labels(&response), json!({"B": "yes"}));
    assert_eq!(annotation(&response, "would-change"), json!(["A"]));
    let metrics = exposition(&admission);
    assert!(
        metrics.contains(r#"rule="A",action="Audit",result="would_change"} 1"#),
        "{metrics}"
    );

    // Its refusal is recorded too; B, enforced, still refuses.
    let response = answer(&admission, entries::MUTATE_POD, "refuse").await;
    assert_eq!(response["status"]["message"], "B refuses");
    assert_eq!(
        annotation(&response, "would-deny"),
        json!([{"rule": "A", "code": 400, "message": "A refuses"}])
    );

    let both = mutating(actions(&["A=Audit", "B=Audit"]));
    let response = answer(&both, entries::MUTATE_POD, "p").await;
    assert!(response.get("patch").is_none(), "{response}");
    assert_eq!(annotation(&response, "would-change"), json!(["A", "B"]));
}

/// A quota rule in Audit checks against what is cached and writes nothing: no `child-request` is
/// recorded on the quota whether the pod fits or not.
#[tokio::test]
async fn quota_evaluation_in_audit_writes_nothing() {
    let quota: ElasticQuota = serde_json::from_value(json!({
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
        "metadata": {"name": "q", "namespace": "team", "resourceVersion": "1",
            "labels": {"quota.scheduling.koordinator.sh/is-parent": "false"}},
        "spec": {"max": {"cpu": "4"}, "min": {"cpu": "1"}}
    }))
    .unwrap();
    let mut writer = CacheWriter::default();
    writer.apply(CachedObject::ElasticQuota(quota.clone()));
    writer.mark_ready();
    let gates: FeatureGates = "EnableQuotaAdmission=true".parse().unwrap();
    let admission_with = |values: &[&str]| {
        let store = Arc::new(MemoryQuotaStore::default());
        store.insert(quota.clone());
        let rules = registered_rules();
        let parsed: Vec<_> = values.iter().map(|v| parse(v, &rules).unwrap()).collect();
        let admission = Admission::new(writer.reader(), gates, Metrics::new())
            .with_settings(Settings {
                actions: RuleActions::from_parsed(&parsed),
                ..Settings::default()
            })
            .with_services(Services {
                quota_store: Some(store.clone()),
                ..Services::default()
            });
        (admission, store)
    };
    let pod = |cpu: &str| {
        review_of(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "team",
                "labels": {"quota.scheduling.koordinator.sh/name": "q"}},
            "spec": {"containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": cpu}}}]}}))
    };
    async fn ask(admission: &Admission, body: Vec<u8>) -> Value {
        let bytes = admission
            .review(entries::VALIDATE_POD, &body, None)
            .await
            .unwrap();
        serde_json::from_slice::<Value>(&bytes).unwrap()["response"].clone()
    }

    // Enforced: the admission is recorded, the excess refused.
    let (enforced, store) = admission_with(&[]);
    let refused = ask(&enforced, pod("20")).await;
    assert_eq!(refused["allowed"], false, "{refused}");
    assert_eq!(ask(&enforced, pod("2")).await["allowed"], true);
    assert_eq!(store.writes(), 1);

    // Shadowed: the same answers as would-be, and no write.
    let (shadowed, store) = admission_with(&["ElasticQuotaEvaluation=Warn+Audit"]);
    assert_eq!(ask(&shadowed, pod("2")).await["allowed"], true);
    let over = ask(&shadowed, pod("20")).await;
    assert_eq!(over["allowed"], true, "{over}");
    let message = refused["status"]["message"].as_str().unwrap();
    assert_eq!(
        over["warnings"],
        json!([format!("[ElasticQuotaEvaluation] {message}")])
    );
    assert_eq!(annotation(&over, "would-deny")[0]["message"], message);
    assert_eq!(store.writes(), 0, "a shadowed quota rule writes nothing");
    assert!(
        store
            .current("team", "q")
            .unwrap()
            .metadata
            .annotations
            .is_none()
    );
}

#[test]
fn the_rule_table_in_the_docs_is_the_registered_one() {
    let docs = include_str!("../../../docs/admission.md");
    let table = docs
        .split_once("<!-- rules -->")
        .and_then(|(_, rest)| rest.split_once("<!-- /rules -->"))
        .map(|(table, _)| table)
        .expect("docs/admission.md has a <!-- rules --> table");
    let documented: Vec<(String, String, String, bool)> = table
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let unquote = |cell: &str| cell.replace('`', "");
            (
                unquote(cells[1]),
                unquote(cells[2]),
                cells[3].to_owned(),
                cells[4].starts_with("yes"),
            )
        })
        .collect();
    let registered: Vec<(String, String, String, bool)> = registered_rules()
        .into_iter()
        .map(|rule| {
            let kind = match rule.kind {
                WebhookKind::Mutating => "mutating",
                WebhookKind::Validating => "validating",
            };
            (
                rule.name.to_owned(),
                rule.webhooks.join(", "),
                kind.to_owned(),
                rule.shadowable,
            )
        })
        .collect();
    assert_eq!(documented, registered);
}

/// A forged review whose `kind` and user name carry a newline, a forged log line and ANSI
/// sequences: the "would deny" line of a shadowed rule writes them escaped, on its own line, with
/// tracing-subscriber's default text format as with ours. Before, `request.kind.kind` was written
/// as sent: the forged line stood on a line of its own and the ESCs reached the log.
#[tokio::test]
async fn the_would_deny_line_escapes_what_a_forged_review_sent() {
    use crate::telemetry::{LogBuffer, needs_escape, text_subscriber};
    let kind = "Pod\n2026-01-01T00:00:00.000000Z  INFO admitted\u{1b}[2K\u{1b}[31m";
    let user = "eve\r\n\u{1b}]0;owned\u{7}";
    let body = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u", "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default", "operation": "CREATE",
            "userInfo": {"username": user},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "default"},
                "spec": {"containers": [{"name": "c", "image": "i"}]}}
        }
    }))
    .unwrap();
    let (admission, _) = validating(actions(&["First=Warn"]));
    for ours in [false, true] {
        let buffer = LogBuffer::default();
        let filter = tracing_subscriber::EnvFilter::new("info");
        let subscriber: Box<dyn tracing::Subscriber + Send + Sync> = if ours {
            Box::new(text_subscriber(filter, buffer.clone(), false))
        } else {
            Box::new(
                tracing_subscriber::fmt()
                    .with_env_filter(filter)
                    .with_writer(buffer.clone())
                    .with_ansi(false)
                    .finish(),
            )
        };
        let guard = tracing::subscriber::set_default(subscriber);
        let response = answer_to(&admission, &body).await;
        drop(guard);
        assert_eq!(response["warnings"][0], "[First] First says no");
        let log = buffer.text();
        let line = log
            .lines()
            .find(|l| l.contains("would deny"))
            .unwrap_or_else(|| panic!("no would-deny line in {log:?}"));
        assert!(
            line.contains(
                r"kind=Pod\n2026-01-01T00:00:00.000000Z  INFO admitted\u{1b}[2K\u{1b}[31m"
            ),
            "{line:?}"
        );
        assert!(
            line.contains(r"user=eve\r\n\u{1b}]0;owned\u{7}"),
            "{line:?}"
        );
        assert!(
            !log.lines().any(|l| l.starts_with("2026-01-01")),
            "a forged line: {log:?}"
        );
        assert!(
            !log.lines().any(|l| l.chars().any(needs_escape)),
            "a control character in the log: {log:?}"
        );
    }
}

async fn answer_to(admission: &Admission, body: &[u8]) -> Value {
    let bytes = admission
        .review(entries::VALIDATE_POD, body, None)
        .await
        .unwrap();
    serde_json::from_slice::<Value>(&bytes).unwrap()["response"].clone()
}

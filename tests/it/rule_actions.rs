//! `--rule-action` through the real binary: `review` answers as a served replica would, and
//! `serve --state` shows a shadowed refusal to the client and counts it on the operations port.

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::review::{POD, admission_review, review};
use crate::support::tls_client::{Conn, Proto, connect, connect_plain};
use crate::support::{KillOnDrop, fixture, free_port};

/// A BE pod at koord-prod priority: ColocationQoSPriority refuses it.
fn be_pod_at_prod_priority() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "spark-1", "namespace": "team-a",
            "labels": {"koordinator.sh/qosClass": "BE"}},
        "spec": {"priorityClassName": "koord-prod", "priority": 9500,
            "containers": [{"name": "c", "image": "spark"}]}})
}

const MESSAGE: &str = "koordinator.sh/qosClass=BE";

fn request() -> Value {
    admission_review(
        &POD,
        "CREATE",
        "team-a",
        be_pod_at_prod_priority(),
        Value::Null,
    )
}

fn response(extra: &[&str]) -> Value {
    review(&fixture("state"), "/validate-pod", extra, &request())
}

/// `review` with flags it refuses: its output.
fn refused(extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
        .args(["review", "--path", "/validate-pod", "--request", "-"])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn review_shadows_a_rule_as_a_served_replica_would() {
    let denied = response(&[]);
    assert_eq!(denied["allowed"], false);
    let message = denied["status"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains(MESSAGE), "{message}");

    let warned = response(&["--rule-action", "ColocationQoSPriority=Warn"]);
    assert_eq!(warned["allowed"], true, "{warned}");
    assert_eq!(
        warned["warnings"],
        json!([format!("[ColocationQoSPriority] {message}")])
    );

    let audited = response(&["--rule-action", "ColocationQoSPriority=Audit"]);
    assert_eq!(audited["allowed"], true, "{audited}");
    assert!(audited.get("warnings").is_none(), "{audited}");
    let found: Value =
        serde_json::from_str(audited["auditAnnotations"]["would-deny"].as_str().unwrap()).unwrap();
    assert_eq!(
        found,
        json!([{"rule": "ColocationQoSPriority", "code": 400, "message": message}])
    );

    // Names and actions are checked before anything runs: exit 2, one line saying why.
    for (value, expected) in [
        ("PodReachGuard=Audit", "cannot be shadowed"),
        ("NoSuchRule=Warn", "no rule is named \"NoSuchRule\""),
        ("ClusterColocationProfile=Warn", "Apply or Audit"),
        ("ColocationQoSPriority=Deny+Warn", "Deny, Warn or Audit"),
    ] {
        let out = refused(&["--rule-action", value]);
        assert_eq!(out.status.code(), Some(2), "{value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{value}: {stderr}");
    }
}

/// `serve --state` of the fixtures with `extra` flags, a connection to it, and its operations port.
async fn serve(extra: &[&str]) -> (KillOnDrop, Conn, std::net::SocketAddr) {
    let (port, ops) = (free_port(), free_port());
    let server = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
            .args(["serve", "--bind-address", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .arg("--metrics-bind-address")
            .arg(format!("127.0.0.1:{ops}"))
            .args(["--health-bind-address", "0", "--state"])
            .arg(fixture("state"))
            .args(extra)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let addr = ([127, 0, 0, 1], port).into();
    for _ in 0..200 {
        if let Ok(conn) = connect(addr, Proto::Http1).await {
            return (server, conn, ([127, 0, 0, 1], ops).into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("serve --state {extra:?} never listened");
}

/// The BE pod at prod priority through `/validate-pod`: the response.
async fn validate(conn: &mut Conn) -> Value {
    let (status, body) = conn
        .send("POST", "/validate-pod", request().to_string().into_bytes())
        .await
        .unwrap();
    assert_eq!(status, 200);
    serde_json::from_slice::<Value>(&body).unwrap()["response"].clone()
}

#[tokio::test]
async fn serve_counts_a_shadowed_refusal_on_the_operations_port() {
    let (_server, mut conn, ops) = serve(&["--rule-action", "ColocationQoSPriority=Warn"]).await;
    let answer = validate(&mut conn).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    let warning = answer["warnings"][0].as_str().unwrap();
    assert!(
        warning.starts_with("[ColocationQoSPriority] ") && warning.contains(MESSAGE),
        "{warning}"
    );

    let mut ops = connect_plain(ops).await.unwrap();
    let (status, metrics) = ops.send("GET", "/metrics", Vec::new()).await.unwrap();
    assert_eq!(status, 200);
    let metrics = String::from_utf8(metrics).unwrap();
    let counted = r#"koord_webhook_admission_rule_results_total{webhook="/validate-pod",rule="ColocationQoSPriority",action="Warn",result="would_deny"} 1"#;
    assert!(metrics.contains(counted), "{metrics}");
    assert!(
        !metrics.contains("koord_webhook_admission_denials_total{webhook=\"/validate-pod\""),
        "{metrics}"
    );
}

/// `--entry-action` puts every rule of the entry's endpoint in Audit; `--rule-action` still wins.
#[tokio::test]
async fn an_entry_in_audit_records_what_its_rules_would_refuse() {
    let (_server, mut conn, _) = serve(&["--entry-action", "vpod.koordinator.sh=Audit"]).await;
    let answer = validate(&mut conn).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    let found: Value =
        serde_json::from_str(answer["auditAnnotations"]["would-deny"].as_str().unwrap()).unwrap();
    assert_eq!(found[0]["rule"], "ColocationQoSPriority", "{found}");

    let (_server, mut conn, _) = serve(&[
        "--entry-action",
        "vpod.koordinator.sh=Audit",
        "--rule-action",
        "ColocationQoSPriority=Deny",
    ])
    .await;
    assert_eq!(validate(&mut conn).await["allowed"], false);
}

/// `status` shows the rule actions the installed Deployment runs with (entry actions expanded to
/// their rules).
#[test]
fn status_shows_the_rule_actions_of_the_deployment() {
    let cp = crate::support::control_plane::ControlPlane::start();
    crate::support::operator::install(&cp);
    let patch = json!([
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-",
         "value": "--rule-action=ColocationQoSPriority=Warn+Audit"},
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-",
         "value": "--entry-action=vnode.koordinator.sh=Audit"}
    ]);
    cp.kubectl_ok(
        &[
            "patch",
            "deployment",
            "-n",
            "koordinator-system",
            "koord-webhook",
            "--type=json",
            "-p",
            &patch.to_string(),
        ],
        None,
    );
    let out = Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
        .args(["status", "-o", "json", "--kubeconfig"])
        .arg(&cp.kubeconfig)
        .output()
        .unwrap();
    let status: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let rules: Vec<(String, String, String)> = status["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let text = |key: &str| r[key].as_str().unwrap().to_owned();
            (text("rule"), text("webhook"), text("action"))
        })
        .collect();
    let expected = [
        ("ColocationQoSPriority", "/validate-pod", "Warn+Audit"),
        ("NodeAmplificationBounds", "/validate-node", "Audit"),
        ("NodeSLOConfigConflict", "/validate-node", "Audit"),
    ]
    .map(|(a, b, c)| (a.to_owned(), b.to_owned(), c.to_owned()));
    assert_eq!(rules, expected, "{status:#}");
    assert_eq!(status["ruleNotes"], json!([]), "{status:#}");
}

/// `status --check-admission NS` (what `helm test` runs): healthy only when a dry-run pod create
/// in NS is refused by koord-webhook; in a namespace the pod entries skip, it is admitted: unhealthy,
/// saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_checks_admission_end_to_end() {
    let cluster = crate::support::operator::Cluster::start().await;
    let operator = cluster.operator("replica-a", &[]);
    operator.wait_ready(Duration::from_secs(60)).await;
    let status = |namespace: &str, wait: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
            .args(["status", "-o", "json", "--kubeconfig"])
            .arg(&cluster.cp.kubeconfig)
            .args(["--check-admission", namespace])
            .args(wait)
            .output()
            .unwrap()
    };
    let checked = status("default", &["--wait", "--timeout", "60s"]);
    let report: Value = serde_json::from_slice(&checked.stdout).unwrap_or_default();
    assert_eq!(checked.status.code(), Some(0), "{report:#}");

    // The same as `helm test` runs it: as the chart's test ServiceAccount, with only its RBAC.
    let hooks = crate::generated::helm_show("koordinator-system", "templates/tests/admission.yaml");
    let without_pod: Vec<&str> = hooks
        .split("\n---")
        .filter(|doc| !doc.contains("kind: Pod\n"))
        .collect();
    cluster
        .cp
        .kubectl_ok(&["apply", "-f", "-"], Some(&without_pod.join("\n---")));
    let dir = tempfile::tempdir().unwrap();
    let tester = crate::support::operator::kubeconfig_as(
        &cluster.cp,
        dir.path(),
        "system:serviceaccount:koordinator-system:koord-webhook-test",
        "tester.kubeconfig",
    );
    let as_tester = Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
        .args(["status", "-o", "json", "--kubeconfig"])
        .arg(&tester)
        .args(["--check-admission", "default"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&as_tester.stdout).unwrap_or_default();
    assert_eq!(
        as_tester.status.code(),
        Some(0),
        "{report:#} {}",
        String::from_utf8_lossy(&as_tester.stderr)
    );
    assert_eq!(report["ruleNotes"], json!([]), "{report:#}");

    let exempt = status("kube-system", &[]);
    let report: Value = serde_json::from_slice(&exempt.stdout).unwrap_or_default();
    assert_eq!(exempt.status.code(), Some(1), "{report:#}");
    let problems = report["problems"].to_string();
    assert!(
        problems.contains("koord-webhook was not called"),
        "{problems}"
    );
}

/// Through the API server: a rule in Warn lets the pod through with its warning, and with
/// `--would-deny-events` the refusal becomes a WouldDeny Event on the replica's Pod, once per rule
/// and namespace at first (three refusals, one Event).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadowed_refusal_becomes_a_would_deny_event() {
    use k8s_openapi::api::core::v1::{Event, Pod};
    use kube::api::{Api, ListParams, PostParams};

    let cluster = crate::support::operator::Cluster::start().await;
    let client = cluster.client.clone();
    cluster.cp.kubectl_ok(
        &["apply", "-f", "-"],
        Some("apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: koord-prod}\nvalue: 9500\n"),
    );
    let operator = cluster.operator(
        "replica-a",
        &[
            "--rule-action",
            "ColocationQoSPriority=Warn",
            "--would-deny-events",
        ],
    );
    operator.wait_ready(Duration::from_secs(60)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut pod: Pod = serde_json::from_value(be_pod_at_prod_priority()).unwrap();
    pod.metadata.namespace = Some("default".into());
    pod.spec.as_mut().unwrap().priority = None;
    for _ in 0..3 {
        pods.create(&dry_run, &pod)
            .await
            .expect("allowed under Warn");
    }
    let events: Api<Event> = Api::namespaced(client.clone(), "koordinator-system");
    let would_deny = crate::support::operator::eventually(
        Duration::from_secs(20),
        "a WouldDeny Event",
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            let found: Vec<Event> = list
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("WouldDeny"))
                .collect();
            (!found.is_empty()).then_some(found)
        },
    )
    .await;
    assert_eq!(would_deny.len(), 1, "{would_deny:?}");
    let event = &would_deny[0];
    assert_eq!(event.involved_object.name.as_deref(), Some("replica-a"));
    let note = event.message.clone().unwrap_or_default();
    assert!(
        note.starts_with("ColocationQoSPriority would deny Pod default/spark-1: ")
            && note.contains(MESSAGE),
        "{note}"
    );
}

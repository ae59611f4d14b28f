//! A review past the API server's deadline gets the answer the entry's configured failurePolicy
//! implies, through a real kube-apiserver: the replica answers HTTP 504 before the deadline, and the
//! API server applies the entry's policy to the failed call (Fail: refused; Ignore: let through).
//! The slow review is real: a quota change waiting in the ledger behind a forged change of its tree
//! (which the API server never stores) outlasts a 2 s `--webhook-timeout-seconds`.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::Api;
use serde_json::json;
use support::certs::VALIDATING;
use support::control_plane::ControlPlane;
use support::operator::{Cluster, Operator, eventually};

const ENTRY: &str = "velasticquota.koordinator.sh";

const TREE: &str = "
apiVersion: v1
kind: Namespace
metadata: {name: team-t}
---
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata:
  name: parent-t
  namespace: team-t
  labels: {quota.scheduling.koordinator.sh/is-parent: \"true\"}
spec: {min: {cpu: \"8\", memory: 8Gi}, max: {cpu: \"16\", memory: 16Gi}}
---
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata:
  name: child-t
  namespace: team-t
  labels: {quota.scheduling.koordinator.sh/parent: parent-t}
spec: {min: {cpu: \"1\", memory: 1Gi}, max: {cpu: \"4\", memory: 4Gi}}
";

/// Holds parent-t's tree in the ledger: a CREATE under it sent to the replica directly.
async fn hold_the_tree(operator: &Operator, name: &str) {
    let forged = json!({
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": "team-t",
                     "labels": {"quota.scheduling.koordinator.sh/parent": "parent-t"}},
        "spec": {"min": {"cpu": "0", "memory": "0"}, "max": {"cpu": "1", "memory": "1Gi"}}
    });
    support::review::forge_quota_create(operator.addr, "team-t", forged).await;
}

/// Raises child-t's min through the API server: its review waits behind the held tree.
fn raise_min(cp: &ControlPlane, cpu: &str) -> std::process::Output {
    cp.kubectl(
        &[
            "patch",
            "elasticquota",
            "child-t",
            "-n",
            "team-t",
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"min":{{"cpu":"{cpu}"}}}}}}"#),
        ],
        None,
    )
}

/// Quota reviews the replica answered 504 because the deadline came first.
async fn timeouts(operator: &Operator) -> f64 {
    let metrics = operator.metrics().await;
    metrics
        .lines()
        .find(|l| {
            l.starts_with("koord_webhook_admission_errors_total{")
                && l.contains("elasticquota")
                && l.contains("kind=\"timeout\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

async fn entry_policy(client: &kube::Client) -> Option<String> {
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let configuration = validating.get(VALIDATING).await.ok()?;
    configuration
        .webhooks?
        .into_iter()
        .find(|w| w.name == ENTRY)?
        .failure_policy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_past_the_deadline_gets_the_entrys_configured_policy() {
    let cluster = Cluster::start().await;
    let (cp, client) = (&cluster.cp, cluster.client.clone());

    // Fail (the quota entry's default): the held change is refused as a failed call, not denied.
    let operator = cluster.operator("fail", &["--webhook-timeout-seconds", "2"]);
    operator.wait_ready(Duration::from_secs(60)).await;
    cp.kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(TREE));
    assert_eq!(entry_policy(&client).await.as_deref(), Some("Fail"));
    hold_the_tree(&operator, "forged-1").await;
    let refused = raise_min(cp, "2");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "refused under Fail");
    assert!(
        stderr.contains("failed calling webhook") && stderr.contains(ENTRY),
        "{stderr}"
    );
    assert!(!stderr.contains("denied the request"), "{stderr}");
    assert_eq!(
        timeouts(&operator).await,
        1.0,
        "answered 504 at the deadline"
    );
    drop(operator);

    // Ignore: the same slow review lets the change through.
    let operator = cluster.operator(
        "ignore",
        &[
            "--webhook-timeout-seconds",
            "2",
            "--failure-policy",
            &format!("{ENTRY}=Ignore"),
        ],
    );
    operator.wait_ready(Duration::from_secs(60)).await;
    eventually(
        Duration::from_secs(30),
        "the entry set to Ignore",
        || async { (entry_policy(&client).await.as_deref() == Some("Ignore")).then_some(()) },
    )
    .await;
    hold_the_tree(&operator, "forged-2").await;
    let let_through = raise_min(cp, "3");
    assert!(
        let_through.status.success(),
        "let through under Ignore: {}",
        String::from_utf8_lossy(&let_through.stderr)
    );
    // Let through by the policy after the deadline, not admitted in time.
    assert_eq!(timeouts(&operator).await, 1.0);
    let min = cp.kubectl_ok(
        &[
            "get",
            "elasticquota",
            "child-t",
            "-n",
            "team-t",
            "-o",
            "jsonpath={.spec.min.cpu}",
        ],
        None,
    );
    assert_eq!(min.trim(), "3");
}

//! A shadow install beside koord-manager's webhook, through a real kube-apiserver: rendered by
//! `manifests --mode shadow` and applied, a replica of it (as the shadow's ServiceAccount, with
//! exactly that RBAC) keeps its own validating configuration and nothing of Koordinator's. What its
//! rules would refuse is admitted and counted; a quota rule in Audit writes nothing.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Pod, Secret};
use koord_webhook::apis::ElasticQuota;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::support;
use crate::support::control_plane::ControlPlane;
use crate::support::operator::{Operator, apply_established, eventually, kubeconfig_as};

const SHADOW: &str = "koord-webhook-shadow";
const SHADOW_USER: &str = "system:serviceaccount:koord-webhook-shadow:koord-webhook";

/// What koord-manager's install leaves that the shadow must not touch: its configurations (one
/// harmless entry each, failing open), its webhook Secret with a CA, the SLO ConfigMap the shadow
/// reads, and a namespace with a parent quota.
const KOORDINATOR: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: koordinator-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: slo-controller-config, namespace: koordinator-system}
data: {}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: koordinator-validating-webhook-configuration}
webhooks:
- name: vnothing.koordinator.sh
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Ignore
  clientConfig: {url: "https://127.0.0.1:1/validate-nothing"}
  rules: [{apiGroups: ["nothing.example"], apiVersions: [v1], operations: [CREATE], resources: [things]}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: koordinator-mutating-webhook-configuration}
webhooks:
- name: mnothing.koordinator.sh
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Ignore
  clientConfig: {url: "https://127.0.0.1:1/mutate-nothing"}
  rules: [{apiGroups: ["nothing.example"], apiVersions: [v1], operations: [CREATE], resources: [things]}]
---
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: koord-prod}
value: 9500
---
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata:
  name: parent
  namespace: team-a
  labels: {quota.scheduling.koordinator.sh/is-parent: "true"}
spec: {max: {cpu: "10"}, min: {cpu: "10"}}
"#;

/// Every object of the kinds koord-manager's install holds, with its resourceVersion: a write to
/// any of them changes one.
fn koordinators(cp: &ControlPlane) -> String {
    cp.kubectl_ok(
        &[
            "get",
            "crds,mutatingwebhookconfigurations,validatingwebhookconfigurations,elasticquotas,\
             secrets,configmaps,services,leases",
            "-A",
            "-o",
            "custom-columns=KIND:.kind,NS:.metadata.namespace,NAME:.metadata.name,RV:.metadata.resourceVersion",
        ],
        None,
    )
    .lines()
    .filter(|line| !line.contains(SHADOW) && !line.contains("kube-"))
    // Columns are aligned to the widest value: compare the values alone.
    .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
    .collect::<Vec<_>>()
    .join("\n")
}

/// The shadow's counts of one rule's results (`koord_webhook_admission_rule_results_total`).
fn rule_results(metrics: &str, rule: &str, result: &str) -> u64 {
    support::metric_sum(
        metrics,
        "koord_webhook_admission_rule_results_total",
        &[&format!("rule=\"{rule}\""), &format!("result=\"{result}\"")],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_admits_what_it_would_refuse_counts_it_and_touches_nothing_of_koordinators() {
    let cp = ControlPlane::start();
    let client = cp.client().await;
    let (koordinator_ca, before) = koordinator_and_a_shadow_installed(&cp);
    let dir = tempfile::tempdir().unwrap();
    let replica = a_shadow_replica(&cp, dir.path()).await;
    its_own_configuration_fails_open(&client, &koordinator_ca).await;
    what_it_would_refuse_is_admitted_and_counted(&cp, &client, &replica).await;
    nothing_of_koordinators_is_written(&cp, &client, &before).await;
    every_answer_was_taken(&cp, &replica).await;
    drop(replica);
    uninstall_removes_the_shadow_only(&cp, &client, &before).await;
}

/// Koordinator's objects and koord-manager's webhook Secret, then the shadow install as a user
/// renders it; what Koordinator's objects were before the shadow ran.
fn koordinator_and_a_shadow_installed(
    cp: &ControlPlane,
) -> (koord_webhook::certs::PemPair, String) {
    apply_established(cp, "crds");
    cp.kubectl_ok(&["apply", "-f", "-"], Some(KOORDINATOR));
    // koord-manager's webhook Secret: a shadow does not take its CA over.
    let koordinator_ca = support::new_pair("koordinator-ca");
    cp.kubectl_ok(
        &["apply", "-f", "-"],
        Some(
            &json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "koordinator-webhook-certs", "namespace": SHADOW},
                "stringData": {"ca-cert.pem": koordinator_ca.cert_pem,
                               "ca-key.pem": koordinator_ca.key_pem}})
            .to_string()
            .replace(SHADOW, "koordinator-system"),
        ),
    );

    // The install as a user renders it (with a gate koord-manager has off by default).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
        .args(["manifests", "--mode", "shadow"])
        .args(["--feature-gates", "ValidatePodDeviceResource=true"])
        .output()
        .unwrap();
    let rendered = support::succeeded(&["manifests", "--mode", "shadow"], &out);
    cp.kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&rendered));
    let before = koordinators(cp);

    (koordinator_ca, before)
}

async fn a_shadow_replica(cp: &ControlPlane, dir: &std::path::Path) -> Operator {
    let kubeconfig = kubeconfig_as(cp, dir, SHADOW_USER, "shadow.kubeconfig");
    let replica = Operator::start(
        &kubeconfig,
        dir,
        "shadow-0",
        &[
            "--mode",
            "shadow",
            "--namespace",
            SHADOW,
            "--feature-gates",
            "ValidatePodDeviceResource=true,EnableQuotaAdmission=true",
        ],
    );
    replica.wait_ready(Duration::from_secs(60)).await;

    replica
}

/// Its own configuration, written in URL mode with its own CA, every entry failing open.
async fn its_own_configuration_fails_open(
    client: &kube::Client,
    koordinator_ca: &koord_webhook::certs::PemPair,
) {
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let own = configurations.get(SHADOW).await.unwrap();
    let entries = own.webhooks.unwrap_or_default();
    assert!(
        entries
            .iter()
            .any(|e| e.name == "mpod-create.shadow.koord-webhook.io"),
        "the mutating rules are called through a validating entry"
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SHADOW);
    let own_ca = secrets.get("webhook-ca").await.unwrap();
    let own_ca = support::certs::data(&own_ca, "tls.crt");
    assert_ne!(
        own_ca, koordinator_ca.cert_pem,
        "koord-manager's CA taken over"
    );
    for entry in &entries {
        assert_eq!(
            entry.failure_policy.as_deref(),
            Some("Ignore"),
            "{}",
            entry.name
        );
        assert!(entry.client_config.url.is_some(), "{}", entry.name);
    }
}

/// A BE pod at koord-prod priority (ColocationQoSPriority refuses it), a GPU request only
/// the stricter gate refuses, and a child quota whose min exceeds its max: all admitted, stored.
async fn what_it_would_refuse_is_admitted_and_counted(
    cp: &ControlPlane,
    client: &kube::Client,
    replica: &Operator,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "team-a");
    let be = support::pod(
        "team-a",
        "spark-1",
        json!({"koordinator.sh/qosClass": "BE"}),
        json!({}),
    );
    let mut be: Pod = be;
    be.spec.as_mut().unwrap().priority_class_name = Some("koord-prod".to_owned());
    let (probe_pods, probe, r) = (pods.clone(), be.clone(), replica);
    eventually(
        Duration::from_secs(20),
        "the shadow's entries called",
        move || {
            let (pods, be) = (probe_pods.clone(), probe.clone());
            async move {
                let params = PostParams {
                    dry_run: true,
                    ..Default::default()
                };
                pods.create(&params, &be).await.ok()?;
                let metrics = r.metrics().await;
                (rule_results(&metrics, "ColocationQoSPriority", "would_deny") > 0).then_some(())
            }
        },
    )
    .await;
    pods.create(&PostParams::default(), &be).await.unwrap();
    let gpu = support::pod(
        "team-a",
        "gpu-1",
        json!({}),
        json!({"koordinator.sh/gpu": "150"}),
    );
    pods.create(&PostParams::default(), &gpu).await.unwrap();
    cp.kubectl_ok(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: scheduling.sigs.k8s.io/v1alpha1\nkind: ElasticQuota\nmetadata:\n  \
             name: child-bad\n  namespace: team-a\n  labels: {quota.scheduling.koordinator.sh/parent: parent}\n\
             spec: {max: {cpu: \"4\"}, min: {cpu: \"8\"}}\n",
        ),
    );
    let metrics = replica.metrics().await;
    for rule in [
        "ColocationQoSPriority",
        "DeviceResource",
        "ElasticQuotaTreeRules",
    ] {
        assert!(
            rule_results(&metrics, rule, "would_deny") > 0,
            "{rule} counted no would-be denial:\n{}",
            metrics
                .lines()
                .filter(|l| l.contains("rule_results"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert_eq!(rule_results(&metrics, "ColocationQoSPriority", "deny"), 0);
    // A pod charged to a quota while quota admission is on: the rule in Audit writes nothing.
    let charged = support::pod(
        "team-a",
        "charged-1",
        json!({"quota.scheduling.koordinator.sh/name": "parent"}),
        json!({"cpu": "1"}),
    );
    pods.create(&PostParams::default(), &charged).await.unwrap();
}

/// Nothing of Koordinator's written: every object as it was (the quotas created above are new
/// ones, made by the test), and no quota carries a write by koord-webhook.
async fn nothing_of_koordinators_is_written(
    cp: &ControlPlane,
    client: &kube::Client,
    before: &str,
) {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = koordinators(cp);
    let unchanged: Vec<&str> = before.lines().filter(|l| !after.contains(*l)).collect();
    assert!(
        unchanged.is_empty(),
        "changed by the shadow: {unchanged:?}\nafter:\n{after}"
    );
    let quotas: Api<ElasticQuota> = Api::namespaced(client.clone(), "team-a");
    for quota in quotas.list(&Default::default()).await.unwrap() {
        let managers: Vec<String> = quota
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|m| m.manager.clone())
            .collect();
        assert!(
            !managers.iter().any(|m| m == "koord-webhook"),
            "{:?} written by koord-webhook: {managers:?}",
            quota.metadata.name
        );
        let annotations = quota.metadata.annotations.unwrap_or_default();
        assert!(
            annotations.keys().all(|k| !k.starts_with("koord-webhook/")),
            "{annotations:?}"
        );
    }
}

/// Every answer of the shadow's was taken: its entries were called (the mutating paths through
/// validating entries among them) and none failed open.
async fn every_answer_was_taken(cp: &ControlPlane, replica: &Operator) {
    let api_metrics = cp.apiserver_metrics().await;
    let calls = support::webhook_calls(&api_metrics, ".shadow.koord-webhook.io");
    for entry in ["mpod-create", "vpod", "velasticquota"] {
        let (called, _) = calls[&format!("{entry}.shadow.koord-webhook.io")];
        assert!(called > 0, "{entry} never called: {calls:?}");
    }
    assert!(
        calls.values().all(|(_, failed)| *failed == 0),
        "failed open: {calls:?}"
    );
    let replica_log = replica.log_text();
    assert!(
        replica_log.contains("would deny"),
        "a would-deny log line:\n{replica_log}"
    );
}

/// `uninstall --mode shadow` removes the shadow and only it.
async fn uninstall_removes_the_shadow_only(cp: &ControlPlane, client: &kube::Client, before: &str) {
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
        .args([
            "uninstall",
            "--mode",
            "shadow",
            "--timeout",
            "5s",
            "--kubeconfig",
        ])
        .arg(&cp.kubeconfig)
        .output()
        .unwrap();
    support::succeeded(&["uninstall", "--mode", "shadow"], &out);
    assert!(configurations.get_opt(SHADOW).await.unwrap().is_none());
    let left = koordinators(cp);
    let gone: Vec<&str> = before.lines().filter(|l| !left.contains(*l)).collect();
    assert!(gone.is_empty(), "removed or changed by uninstall: {gone:?}");
}

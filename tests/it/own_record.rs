//! koord-webhook's recent-admissions record on a quota is its own, whoever the replicas run as:
//! a replica that is not the installed ServiceAccount (here the control plane's admin, as in URL
//! mode or `scripts/dev-local`) learns its user from the API server, its own writes of the record
//! pass, and another user's forged record is refused naming the learned user.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::Pod;
use koord_webhook::apis::ElasticQuota;
use kube::api::{Api, PostParams};
use serde_json::json;
use support::operator::{Operator, eventually, kubeconfig_as};

const RECENT: &str = "koord-webhook/child-request-recent";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_is_written_by_the_replicas_whoever_they_run_as_and_by_no_one_else() {
    let cluster = support::operator::Cluster::start().await;
    let (cp, client) = (&cluster.cp, cluster.client.clone());
    let admin = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap()
        .status
        .and_then(|s| s.user_info?.username)
        .unwrap();
    assert!(!admin.starts_with("system:serviceaccount:"), "{admin}");
    let operator = Operator::start(
        &cp.kubeconfig,
        cluster.dir.path(),
        "as-admin",
        &["--feature-gates", "EnableQuotaAdmission=true"],
    );
    operator.wait_ready(Duration::from_secs(60)).await;

    cp.kubectl_ok(&["create", "namespace", "rec"], None);
    cp.kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(
            "apiVersion: scheduling.sigs.k8s.io/v1alpha1\nkind: ElasticQuota\n\
             metadata: {name: q-rec, namespace: rec}\nspec: {max: {cpu: \"10\", memory: 10Gi}}\n",
        ),
    );
    // The replica's own write of the record (as the admin) passes its own rule.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "rec");
    let quotas: Api<ElasticQuota> = Api::namespaced(client.clone(), "rec");
    let labels = json!({"quota.scheduling.koordinator.sh/name": "q-rec"});
    eventually(
        Duration::from_secs(10),
        "a pod admitted into the quota",
        || {
            let (pods, labels) = (pods.clone(), labels.clone());
            async move {
                let p = support::pod("rec", "p-1", labels, json!({"cpu": "1"}));
                match pods.create(&PostParams::default(), &p).await {
                    Ok(_) => Some(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => Some(()),
                    Err(_) => None,
                }
            }
        },
    )
    .await;
    let recorded = quotas.get("q-rec").await.unwrap();
    let record = recorded.metadata.annotations.unwrap_or_default();
    assert!(
        record.get(RECENT).is_some_and(|r| r.contains("rec/p-1")),
        "{record:?}"
    );
    assert!(
        std::fs::read_to_string(&operator.log)
            .unwrap()
            .contains(&format!("user={admin}")),
        "the replica logs the user it learned"
    );

    // Anyone else (even a cluster admin) setting it is refused, naming the replica's user.
    let other = kubeconfig_as(cp, cluster.dir.path(), "alice", "alice.kubeconfig");
    let mut config: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&other).unwrap()).unwrap();
    for entry in config["users"].as_sequence_mut().unwrap() {
        entry["user"]["as-groups"] = serde_yaml::from_str("[system:masters]").unwrap();
    }
    std::fs::write(&other, serde_yaml::to_string(&config).unwrap()).unwrap();
    let patch_record = |record: serde_json::Value| {
        let patch = json!({"metadata": {"annotations": {RECENT: record}}}).to_string();
        std::process::Command::new("kubectl")
            .args([
                "--kubeconfig",
                other.to_str().unwrap(),
                "-n",
                "rec",
                "patch",
            ])
            .args(["elasticquota", "q-rec", "--type=merge", "-p", &patch])
            .output()
            .unwrap()
    };
    let out = patch_record(json!(
        r#"[{"pod":"rec/ghost","at":1,"request":{"cpu":"9"}}]"#
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a forged record was accepted");
    assert!(
        stderr.contains(&format!(
            "is koord-webhook's own record: only {admin} may set or change it"
        )),
        "{stderr}"
    );
    // Removing it stays allowed.
    let out = patch_record(serde_json::Value::Null);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

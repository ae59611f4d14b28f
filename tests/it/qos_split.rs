//! `serve --qos-split` (on by default) against a real kube-apiserver: the leader registers each pod entry as two
//! webhooks split by Koordinator's QoS label (docs/narrowing.md), the API server accepts them, and
//! every pod is sent to each endpoint once: a plain pod to neither, a QoS-labelled pod through the
//! labelled parts, a pod a profile selects through the entry and then, labelled by the profile,
//! not again. Turned off, the parts go and the entries lose their selector in the same write.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Pod;
use koord_webhook::apis::ClusterColocationProfile;
use kube::api::{Api, PostParams};
use serde_json::json;
use support::certs::{MUTATING, VALIDATING};
use support::operator::{Cluster, eventually};

/// Every pod webhook of both configurations: (name, objectSelector operators, has conditions).
async fn pod_webhooks(client: &kube::Client) -> Vec<(String, Vec<String>, bool)> {
    let m = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get(MUTATING)
        .await
        .unwrap();
    let v = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get(VALIDATING)
        .await
        .unwrap();
    let webhooks = [json!(m), json!(v)]
        .into_iter()
        .flat_map(|c| c["webhooks"].as_array().cloned().unwrap_or_default());
    webhooks
        .filter(|w| w["rules"][0]["resources"] == json!(["pods"]))
        .map(|w| {
            let operators = w["objectSelector"]["matchExpressions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    format!(
                        "{} {}",
                        r["key"].as_str().unwrap(),
                        r["operator"].as_str().unwrap()
                    )
                })
                .collect();
            let conditions = w["matchConditions"]
                .as_array()
                .is_some_and(|c| !c.is_empty());
            (
                w["name"].as_str().unwrap().to_owned(),
                operators,
                conditions,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos_split_sends_every_pod_once_and_labelled_pods_without_conditions() {
    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    let operator = cluster.operator("replica-a", &["--narrow-hold=2s", "--qos-split=on"]);
    operator.wait_ready(Duration::from_secs(60)).await;

    let split = |name: &str, conditions: bool| {
        (
            name.to_owned(),
            vec!["koordinator.sh/qosClass DoesNotExist".to_owned()],
            conditions,
        )
    };
    let part = |name: &str| {
        (
            name.to_owned(),
            vec!["koordinator.sh/qosClass Exists".to_owned()],
            false,
        )
    };
    // mpod-update is left out while calls are narrowed; each part comes before its entry.
    let narrowed = vec![
        part("mpod-create-qos.koordinator.sh"),
        split("mpod-create.koordinator.sh", true),
        part("vpod-qos.koordinator.sh"),
        split("vpod.koordinator.sh", true),
    ];
    eventually(
        Duration::from_secs(30),
        "the split, narrowed entries",
        || {
            let (client, narrowed) = (client.clone(), narrowed.clone());
            async move { (pod_webhooks(&client).await == narrowed).then_some(()) }
        },
    )
    .await;

    let count = |path: &'static str| {
        let operator = &operator;
        async move { support::requests_to(&operator.metrics().await, path) }
    };
    let counts = || async { (count("/mutate-pod").await, count("/validate-pod").await) };
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = |name: &str, labels: serde_json::Value| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
        .unwrap()
    };
    let create = |name: &'static str, labels: serde_json::Value| {
        let pods = pods.clone();
        let pod = pod(name, labels);
        async move { pods.create(&PostParams::default(), &pod).await.unwrap() }
    };

    let before = counts().await;
    create("plain", json!({"app": "web"})).await;
    assert_eq!(counts().await, before, "a plain pod: sent to neither");

    let before = counts().await;
    create("labelled", json!({"koordinator.sh/qosClass": "LS"})).await;
    assert_eq!(
        counts().await,
        (before.0 + 1, before.1 + 1),
        "a QoS-labelled pod: sent to each once, through the labelled parts"
    );

    // A profile that labels the pods it selects LS: the first pod is sent through the entry (its
    // conditions), comes out labelled, and is validated through the labelled part.
    let profiles: Api<ClusterColocationProfile> = Api::all(client.clone());
    let profile: ClusterColocationProfile = serde_json::from_value(json!({
        "apiVersion": "config.koordinator.sh/v1alpha1", "kind": "ClusterColocationProfile",
        "metadata": {"name": "split-batch"},
        "spec": {"selector": {"matchLabels": {"app": "batch"}}, "qosClass": "LS"}}))
    .unwrap();
    profiles
        .create(&PostParams::default(), &profile)
        .await
        .unwrap();
    let before = counts().await;
    let created = create("batch-1", json!({"app": "batch"})).await;
    assert_eq!(
        created
            .metadata
            .labels
            .unwrap_or_default()
            .get("koordinator.sh/qosClass")
            .map(String::as_str),
        Some("LS"),
        "mutated by the profile"
    );
    assert_eq!(
        counts().await,
        (before.0 + 1, before.1 + 1),
        "a profiled pod: mutated once, validated once"
    );

    // Off (a new leader told so): the parts go and the entries lose the selector.
    drop(operator);
    let operator = cluster.operator("replica-b", &["--narrow-hold=2s", "--qos-split=off"]);
    operator.wait_ready(Duration::from_secs(60)).await;
    eventually(Duration::from_secs(60), "the entries joined again", || {
        let client = client.clone();
        async move { joined(&pod_webhooks(&client).await).then_some(()) }
    })
    .await;
}

/// The pod entries as one webhook each: no labelled part, no objectSelector.
fn joined(webhooks: &[(String, Vec<String>, bool)]) -> bool {
    webhooks.len() == 2
        && webhooks
            .iter()
            .all(|(name, selector, _)| !name.contains("-qos") && selector.is_empty())
}

/// A pod of Deployment `koord-webhook` running pod template `template`, as the Deployment
/// controller makes them (there is none in the test control plane: the objects alone).
fn replica_pod(name: &str, template: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "koordinator-system",
            "labels": {"app.kubernetes.io/name": "koord-webhook", "pod-template-hash": template},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": format!("koord-webhook-{template}"),
                "uid": "00000000-0000-0000-0000-000000000001", "controller": true}]},
        "spec": {"containers": [{"name": "koord-webhook", "image": "koord-webhook"}]}}))
    .unwrap()
}

/// The split is the default, but a release from before it removes the labelled parts and keeps
/// the entries' selectors: while a replica of another pod template runs (a rollout, either way),
/// the leader keeps the entries whole, and splits them once the rollout is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_split_waits_for_a_rollout_to_end() {
    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "koordinator-system");
    // This replica (its identity is its pod's name), and one of the release it replaces.
    for pod in [
        replica_pod("replica-new", "new"),
        replica_pod("replica-old", "old"),
    ] {
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let operator = cluster.operator("replica-new", &["--narrow-hold=2s"]);
    operator.wait_ready(Duration::from_secs(60)).await;
    // Narrowed (conditions written, 2 s after the cache synced), and still whole.
    eventually(
        Duration::from_secs(30),
        "the entries narrowed, whole",
        || {
            let client = client.clone();
            async move {
                let webhooks = pod_webhooks(&client).await;
                (joined(&webhooks) && webhooks.iter().all(|w| w.2)).then_some(())
            }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        joined(&pod_webhooks(&client).await),
        "not split while the old replica runs"
    );

    // The old replica goes: the rollout is over, the entries are split at once (the pod watch
    // wakes the leader; its timer alone would take up to a minute).
    pods.delete("replica-old", &Default::default())
        .await
        .unwrap();
    let split = |webhooks: &[(String, Vec<String>, bool)]| {
        webhooks.len() == 4
            && webhooks
                .iter()
                .any(|w| w.0 == "mpod-create-qos.koordinator.sh")
    };
    eventually(Duration::from_secs(15), "the entries split", || {
        let client = client.clone();
        async move { split(&pod_webhooks(&client).await).then_some(()) }
    })
    .await;

    // A rollout starts again (a rollback's first replica): whole again, before it could lead.
    pods.create(&PostParams::default(), &replica_pod("replica-back", "old"))
        .await
        .unwrap();
    eventually(Duration::from_secs(15), "the entries whole again", || {
        let client = client.clone();
        async move { joined(&pod_webhooks(&client).await).then_some(()) }
    })
    .await;
    // A replica that ended (evicted) does not hold the split.
    pods.delete("replica-back", &Default::default())
        .await
        .unwrap();
    let evicted = replica_pod("replica-evicted", "old");
    let created = pods.create(&PostParams::default(), &evicted).await.unwrap();
    let mut ended = created.clone();
    ended.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Failed".to_owned()),
        ..Default::default()
    });
    pods.replace_status("replica-evicted", &PostParams::default(), &ended)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(15),
        "split again beside an evicted replica",
        || {
            let client = client.clone();
            async move { split(&pod_webhooks(&client).await).then_some(()) }
        },
    )
    .await;
}

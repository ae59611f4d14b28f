//! koord-webhook installed as users install it, on a real one-node cluster (kubelet + containerd,
//! scripts/cluster): the image built from the Dockerfile, `kubectl apply --server-side -f
//! manifests/install.yaml` unchanged, two replicas called by the API server through the Service.
//! Then the day-2 operations under a steady load of dry-run pod creates counted at the client:
//! re-apply, the leader Pod deleted, a rolling upgrade, and uninstall.
//!
//! One test, one cluster: the steps build on each other, as they would for a user. The scenario
//! reads as named steps; the install's own steps are here, admission's, the faults' and the Helm
//! chart's beside it (`admission.rs`, `faults.rs`, `helm.rs`), what every step measures in `load.rs`.

mod admission;
mod faults;
mod helm;
mod load;

use crate::support;
use admission::*;
use faults::*;
use helm::*;
use load::*;

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use support::certs::{MUTATING, VALIDATING, bundles};
use support::node::{NAMESPACE, Node, SteadyLoad, image, leader, ready, replicas};
use support::operator::{colocation_and_qos_rules_apply, eventually};
use support::pod;

#[tokio::test(flavor = "current_thread")]
async fn installed_from_the_manifests_on_a_real_node() {
    let node = Node::start();
    let client = node.client().await;
    support::the_version_asked_for(&client).await;
    let (client, node) = (&client, &node);

    // The README's command, the file unchanged; then a colocation profile.
    let bundle = installed_and_published(node, client).await;
    // Admission through the API server, the Service and a Pod of the image (both replicas must
    // have the profile in their cache); `status` reads the replicas' metrics through the API
    // server's pod proxy: the refusal just now is counted against its rule.
    colocation_and_qos_rules_apply(client, Duration::from_secs(20)).await;
    rule_refusals_show_in_status(node).await;
    // 60 uploads of 6 MiB at once over 60 connections straight to one replica (a caller inside the
    // cluster network): at most --max-inflight-request-bytes held, the rest refused 503, not
    // OOM-killed (its limit is 384 Mi); it still answers afterwards.
    upload_burst_leaves_the_replica_running(client).await;
    colocation_and_qos_rules_apply(client, Duration::from_secs(20)).await;
    // 200 concurrent sibling ElasticQuota creates whose min would sum to 20 times the parent's,
    // spread by the Service over both replicas, under the steady pod load: the accepted set obeys
    // the min-sum rule, every refusal says why, no pod admission fails.
    // The replicas' probes have named the API server in the ledger's record (RBAC as installed).
    the_api_server_is_proven_by_a_probe(client).await;
    let load = SteadyLoad::start(client.clone(), "default", LOAD_PER_SECOND);
    concurrent_sibling_quotas_obey_the_tree_rules(node, client).await;
    no_failed_admissions(load, "200 concurrent ElasticQuota creates").await;
    // The leader frozen (SIGSTOP) past its Lease, then resumed: another replica leads, and the
    // frozen one writes nothing once it resumes (fencing), as the audit log shows.
    frozen_leader_writes_nothing_after_resuming(node, client).await;
    reapplied_keeping_the_ca_bundle(node, client, &bundle).await;
    leader_pod_deleted_under_load(client).await;
    rolled_to_a_new_image_under_load(node, client, &bundle).await;
    apiserver_restart_fails_no_admission(node, client).await;
    // Last, since it changes the replicas' flags: 20 serving certificate rotations under steady
    // admission load (replicas rolled to a 6 s lifetime renewed at half-life, webhook-tls reissued
    // once with it). Nothing fails; the CA stays.
    serving_rotations_drop_nothing(node, client, &bundle).await;
    // Both replicas gone once the leader has narrowed the pod entries: only Koordinator's pods
    // fail closed; every other pod is created as if no webhook were installed.
    outage_blocks_only_koordinator_pods(node, client).await;
    uninstalled_leaving_pods_created_normally(node, client).await;
    // The Helm chart: installed into a namespace of its own, upgraded, uninstalled.
    helm_install_upgrade_uninstall(node, client).await;
}

/// Installed from manifests/install.yaml with the spark profile: two Ready replicas of the image,
/// one of them the Lease holder, the caBundle published in Service mode (returned), `status`
/// healthy with both replicas behind the Service.
async fn installed_and_published(node: &Node, client: &kube::Client) -> Vec<u8> {
    node.install_with_the_spark_profile().await;
    let pods = eventually(Duration::from_secs(60), "two Ready replicas", || async {
        let pods = replicas(client).await;
        (pods.iter().filter(|p| ready(p)).count() == 2).then_some(pods)
    })
    .await;
    let (image_name, _) = image();
    for p in &pods {
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(
            spec.containers[0].image.as_deref(),
            Some(image_name.as_str())
        );
    }
    let first_leader = eventually(Duration::from_secs(30), "a leader", || leader(client)).await;
    assert!(
        pods.iter()
            .any(|p| p.metadata.name.as_deref() == Some(&first_leader)),
        "the Lease holder {first_leader} is one of the replicas"
    );
    let bundle = eventually(
        Duration::from_secs(60),
        "the caBundle published",
        || async {
            let all = bundles(client).await;
            (!all.is_empty() && all.iter().all(|b| !b.is_empty() && *b == all[0]))
                .then(|| all[0].clone())
        },
    )
    .await;
    // Service mode: the API server calls the replicas through the Service.
    let v: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    for entry in v.get(VALIDATING).await.unwrap().webhooks.unwrap() {
        let service = entry.client_config.service.expect("service mode");
        assert_eq!(service.name, "koordinator-webhook-service");
        assert!(entry.client_config.url.is_none());
    }
    // `status` as a script after an install uses it: healthy, with both replicas behind the Service.
    node.wait_healthy(NAMESPACE).await;
    let text = node.koord_webhook(&["status"]).await;
    eprintln!(
        "`koord-webhook status` on the node:\n{}",
        String::from_utf8_lossy(&text.stdout)
    );
    bundle
}

/// Re-applied after the operator has run: no conflict, the caBundle stays.
async fn reapplied_keeping_the_ca_bundle(node: &Node, client: &kube::Client, bundle: &[u8]) {
    let out = node.install().await;
    assert!(
        out.status.success(),
        "re-applying manifests/install.yaml failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = bundles(client).await;
    assert!(
        after.iter().all(|b| *b == bundle),
        "the caBundle changed or was dropped by the re-apply"
    );
}

/// The leader Pod deleted under the steady load: another replica takes the Lease, the Deployment
/// replaces the Pod, no admission fails.
async fn leader_pod_deleted_under_load(client: &kube::Client) {
    let load = SteadyLoad::start(client.clone(), "default", LOAD_PER_SECOND);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before: Vec<String> = replicas(client)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let old_leader = leader(client).await.expect("a leader");
    Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .delete(&old_leader, &DeleteParams::default())
        .await
        .unwrap();
    let new_leader = eventually(
        Duration::from_secs(60),
        "another replica to take the Lease",
        || async { leader(client).await.filter(|l| *l != old_leader) },
    )
    .await;
    eventually(
        Duration::from_secs(120),
        "the Deployment to replace the deleted Pod",
        || async {
            let pods = replicas(client).await;
            let fresh = pods.iter().any(|p| {
                ready(p)
                    && p.metadata
                        .name
                        .as_ref()
                        .is_some_and(|n| !before.contains(n))
            });
            (fresh && pods.iter().filter(|p| ready(p)).count() == 2).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    eprintln!("leader {old_leader} deleted; {new_leader} took the Lease");
    no_failed_admissions(load, "leader Pod deleted").await;
}

/// A rolling upgrade to a second tag of the image, the way users upgrade (the manifests rendered
/// for the new image and applied), under the steady load: both replicas upgraded, their memory
/// reported by the kubelet, no admission failed, the CA kept.
async fn rolled_to_a_new_image_under_load(node: &Node, client: &kube::Client, bundle: &[u8]) {
    let (image_name, archive) = image();
    let upgraded = format!("{image_name}-upgrade");
    node.load_image(&archive, &upgraded);
    let rendered = std::process::Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
        .args(["manifests", "--image", &upgraded])
        .output()
        .unwrap();
    assert!(rendered.status.success());
    let load = SteadyLoad::start(client.clone(), "default", LOAD_PER_SECOND);
    tokio::time::sleep(Duration::from_secs(3)).await;
    node.kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&String::from_utf8(rendered.stdout).unwrap()),
    )
    .await;
    node.wait_rolled_out(Duration::from_secs(180)).await;
    let pods = eventually(Duration::from_secs(60), "two upgraded replicas", || async {
        let pods = replicas(client).await;
        let upgraded_ready = pods
            .iter()
            .filter(|p| {
                ready(p)
                    && p.spec.as_ref().unwrap().containers[0].image.as_deref()
                        == Some(upgraded.as_str())
            })
            .count();
        (pods.len() == 2 && upgraded_ready == 2).then_some(pods)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // A new container's stats come with the kubelet's next housekeeping (1.30's cAdvisor-backed
    // summary has none for the first ~10 s; later versions' CRI stats sooner).
    let memory = eventually(
        Duration::from_secs(60),
        "the kubelet to report both new replicas' memory",
        || async {
            let memory = replica_memory(node).await;
            pods.iter()
                .all(|p| memory.contains_key(p.metadata.name.as_deref().unwrap_or_default()))
                .then_some(memory)
        },
    )
    .await;
    let sent = no_failed_admissions(load, "rolling upgrade").await;
    eprintln!(
        "replicas' memory (kubelet: working set, RSS bytes) after {sent} creates: {memory:?}"
    );
    for p in &pods {
        let name = p.metadata.name.as_ref().unwrap();
        let (working_set, rss) = memory
            .get(name)
            .unwrap_or_else(|| panic!("the kubelet reported no memory for {name}: {memory:?}"));
        assert!(
            *working_set > 1 << 20 && rss.is_none_or(|rss| rss > 1 << 20),
            "{name}: {working_set} / {rss:?} bytes"
        );
    }
    assert!(
        bundles(client).await.iter().all(|b| *b == bundle),
        "the upgrade kept the CA"
    );
}

/// `koord-webhook uninstall`: the webhook configurations and the replicas gone (and not recreated),
/// `status` unhealthy, pods created normally, Koordinator's CRDs kept.
async fn uninstalled_leaving_pods_created_normally(node: &Node, client: &kube::Client) {
    let out = node.koord_webhook(&["uninstall"]).await;
    assert!(
        out.status.success(),
        "koord-webhook uninstall failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let m: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let v: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    assert!(m.get_opt(MUTATING).await.unwrap().is_none());
    assert!(v.get_opt(VALIDATING).await.unwrap().is_none());
    let status = node.koord_webhook(&["status"]).await;
    let text = String::from_utf8_lossy(&status.stdout);
    eprintln!("`koord-webhook status` after uninstall:\n{text}");
    assert_eq!(
        status.status.code(),
        Some(1),
        "unhealthy after uninstall: {text}"
    );
    assert!(
        text.contains("no leader") && text.contains("does not exist"),
        "{text}"
    );
    assert!(replicas(client).await.is_empty());
    // No replica came back to recreate them.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(m.get_opt(MUTATING).await.unwrap().is_none());
    node.kubectl_ok(&["create", "namespace", "plain"], None)
        .await;
    let plain: Api<Pod> = Api::namespaced(client.clone(), "plain");
    plain
        .create(
            &PostParams::default(),
            &pod("plain", "after-uninstall", json!({}), json!({})),
        )
        .await
        .expect("a pod is created normally after uninstall");
    // Koordinator's CRDs (and so users' objects) are kept.
    node.kubectl_ok(
        &["get", "crd", "elasticquotas.scheduling.sigs.k8s.io"],
        None,
    )
    .await;
}

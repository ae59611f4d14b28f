//! Kubernetes upgraded under a running install, as a cluster operator upgrades a node: koord-webhook
//! installed from the manifests on a real one-node cluster of one version (the default, or
//! `KOORD_KUBERNETES`), both replicas admitting a steady stream of Koordinator and plain pods, then
//! the control plane replaced by `KOORD_KUBERNETES_UPGRADE`'s (1.35 by default: the API server first,
//! then the controller-manager and scheduler), then the kubelet and kube-proxy
//! (`scripts/cluster upgrade`). Run by `scripts/test --upgrade 1.35` (not in CI: it builds a second
//! set of node binaries); docs/compatibility.md has its last result.

use crate::support;

use std::time::{Duration, Instant};

use support::node::{NAMESPACE, Node, SteadyLoad, leader, pod_entries_narrowed, ready, replicas};
use support::operator::{colocation_and_qos_rules_apply, eventually};

const PER_SECOND: u32 = 10;

#[tokio::test(flavor = "current_thread")]
async fn kubernetes_upgraded_under_a_running_install() {
    let target = std::env::var("KOORD_KUBERNETES_UPGRADE").unwrap_or_else(|_| "1.35".to_owned());
    let node = Node::start();
    let client = node.client().await;
    node.install_with_the_spark_profile().await;
    colocation_and_qos_rules_apply(&client, Duration::from_secs(60)).await;
    pod_entries_narrowed(&client).await;
    let from = node_versions(&node).await;

    let plain = SteadyLoad::start(client.clone(), "default", PER_SECOND);
    let colocated = SteadyLoad::start_colocated(client.clone(), PER_SECOND);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = Instant::now();
    let log = node.upgrade_kubernetes(&target).await;
    let upgraded_after = started.elapsed();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let to = node_versions(&node).await;
    eprintln!("Kubernetes upgraded from {from} to {to} in {upgraded_after:?}:\n{log}");
    assert_ne!(from, to, "the versions the cluster reports did not change");

    // Both replicas still Ready (they ran through it: the kubelet's restart keeps the containers),
    // a leader, the entries narrowed again, the rules applied, `status` healthy.
    eventually(
        Duration::from_secs(120),
        "two Ready replicas and a leader",
        || async {
            let ready_replicas = replicas(&client).await.iter().filter(|p| ready(p)).count();
            (ready_replicas == 2 && leader(&client).await.is_some()).then_some(())
        },
    )
    .await;
    pod_entries_narrowed(&client).await;
    colocation_and_qos_rules_apply(&client, Duration::from_secs(30)).await;
    node.wait_healthy(NAMESPACE).await;

    let mut failed_in_admission = Vec::new();
    for (what, load) in [("plain", plain), ("Koordinator (spark)", colocated)] {
        let (sent, failures) = load.stop().await;
        // A create the API server could not take (it was restarting) never reached admission: that
        // is the API server's own restart window, as for any client. Everything else counts.
        let (admission, unavailable): (Vec<_>, Vec<_>) = failures
            .into_iter()
            .partition(|e| e.contains("webhook") || e.contains("admitted without"));
        eprintln!(
            "{what} pods during the upgrade: {sent} dry-run creates sent, {} failed for want of an \
             API server (e.g. {:?}), {} failed in admission",
            unavailable.len(),
            unavailable.first(),
            admission.len()
        );
        assert!(sent > 0, "the {what} load sent nothing");
        failed_in_admission.extend(admission);
    }
    assert!(
        failed_in_admission.is_empty(),
        "{} creates failed in admission across the upgrade, e.g. {:?}",
        failed_in_admission.len(),
        &failed_in_admission[..failed_in_admission.len().min(5)]
    );
}

/// What the cluster reports: the API server's version and the kubelet's.
async fn node_versions(node: &Node) -> String {
    let server = node.kubectl_ok(&["version", "-o", "json"], None).await;
    let server: serde_json::Value = serde_json::from_str(&server).unwrap_or_default();
    let kubelet = node
        .kubectl_ok(
            &[
                "get",
                "node",
                support::node::NODE_NAME,
                "-o",
                "jsonpath={.status.nodeInfo.kubeletVersion}",
            ],
            None,
        )
        .await;
    format!(
        "kube-apiserver {} / kubelet {}",
        server["serverVersion"]["gitVersion"]
            .as_str()
            .unwrap_or("?"),
        kubelet.trim()
    )
}

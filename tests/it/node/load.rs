//! What every step of the real-node scenario measures: the steady load's failures, the replicas'
//! memory as the kubelet reports it, their restarts.

use crate::support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use support::node::{NAMESPACE, NODE_NAME, Node, SteadyLoad};

pub(super) const LOAD_PER_SECOND: u32 = 20;

/// The replicas' memory as the kubelet reports it, by Pod name: (working set, RSS if reported) in bytes.
pub(super) async fn replica_memory(node: &Node) -> BTreeMap<String, (u64, Option<u64>)> {
    let path = format!("/api/v1/nodes/{NODE_NAME}/proxy/stats/summary");
    let summary: Value =
        serde_json::from_str(&node.kubectl_ok(&["get", "--raw", &path], None).await).unwrap();
    summary["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["podRef"]["namespace"] == NAMESPACE)
        .filter_map(|p| {
            let memory = &p["containers"]
                .as_array()?
                .iter()
                .find(|c| c["name"] == "koord-webhook")?["memory"];
            let sizes = (
                memory["workingSetBytes"].as_u64()?,
                // 1.30's kubelet (CRI stats from containerd) reports no RSS per container.
                memory["rssBytes"].as_u64(),
            );
            Some((p["podRef"]["name"].as_str()?.to_owned(), sizes))
        })
        .collect()
}

/// Stops the load and asserts that not one admission failed.
pub(super) async fn no_failed_admissions(load: SteadyLoad, phase: &str) -> usize {
    let (sent, failures) = load.stop().await;
    eprintln!(
        "{phase}: {sent} dry-run pod creates sent, {} failed",
        failures.len()
    );
    assert!(sent > 0, "{phase}: the load sent nothing");
    assert!(
        failures.is_empty(),
        "{phase}: {} of {sent} pod creates failed, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    sent
}

/// The restarts of each replica's container and the reason its last run ended, by Pod name.
pub(super) fn restarts(pods: &[Pod]) -> BTreeMap<String, (i32, Option<String>)> {
    pods.iter()
        .map(|p| {
            let status = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first());
            let ended = status
                .and_then(|c| c.last_state.as_ref())
                .and_then(|s| s.terminated.as_ref())
                .and_then(|t| t.reason.clone());
            (
                p.metadata.name.clone().unwrap_or_default(),
                (status.map_or(0, |c| c.restart_count), ended),
            )
        })
        .collect()
}

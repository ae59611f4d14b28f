//! Admission on the real node: rule refusals counted in `status`, an upload burst against one
//! replica, concurrent sibling ElasticQuota creates through both.

use super::load::*;
use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use support::node::{NAMESPACE, Node, replicas};
use support::pod;
use support::tls_client::{Proto, connect};

pub(super) async fn upload_burst_leaves_the_replica_running(client: &kube::Client) {
    let pods = replicas(client).await;
    let target = &pods[0];
    let ip = target.status.as_ref().unwrap().pod_ip.clone().unwrap();
    let addr: std::net::SocketAddr = format!("{ip}:9443").parse().unwrap();
    let body = {
        let mut object = serde_json::to_value(pod("default", "big", json!({}), json!({}))).unwrap();
        object["metadata"]["annotations"] = json!({"filler": "x".repeat(6 * 1024 * 1024)});
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "burst", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "default", "operation": "CREATE", "userInfo": {"username": "u"},
                "object": object}
        }))
        .unwrap()
    };
    // 60 uploads over 60 HTTP/1.1 connections (the admission port speaks nothing else).
    let mut uploads = tokio::task::JoinSet::new();
    for _ in 0..60 {
        let mut conn = connect(addr, Proto::Http1).await.unwrap();
        let body = body.clone();
        uploads.spawn(async move {
            conn.send("POST", "/validate-pod", body)
                .await
                .map(|(s, _)| s.as_u16())
        });
    }
    let mut statuses = BTreeMap::<u16, usize>::new();
    while let Some(done) = uploads.join_next().await {
        let status = done.unwrap().expect("every upload gets an answer");
        *statuses.entry(status).or_default() += 1;
    }
    eprintln!("60 uploads of 6 MiB to {ip}: answers by HTTP status {statuses:?}");
    assert_eq!(statuses.values().sum::<usize>(), 60);
    assert!(
        statuses.keys().all(|s| [200, 503].contains(s)),
        "answered 200 or a fast 503 only: {statuses:?}"
    );
    let mut health = connect(addr, Proto::Http1).await.unwrap();
    assert_eq!(health.get("/healthz").await.0.as_u16(), 200);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = restarts(&replicas(client).await);
    assert_eq!(
        after.get(target.metadata.name.as_ref().unwrap()),
        Some(&(0, None)),
        "the replica was not restarted (OOM-killed or otherwise): {after:?}"
    );
}

/// The replicas' probes (dry-run applies through the API server, with the installed RBAC) prove the
/// API server's address into the ElasticQuota ledger's record: some address, and no Pod's (the
/// API server's calls reach a replica from the node, not from a Pod).
pub(super) async fn the_api_server_is_proven_by_a_probe(client: &kube::Client) {
    use k8s_openapi::api::core::v1::Pod;
    let proven =
        support::operator::proven_api_servers(client, NAMESPACE, Duration::from_secs(120)).await;
    let pods: Api<Pod> = Api::all(client.clone());
    let pod_ips: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.spec.as_ref().is_none_or(|s| s.host_network != Some(true)))
        .filter_map(|p| p.status?.pod_ip)
        .collect();
    eprintln!("proven API-server addresses {proven:?}; pod addresses {pod_ips:?}");
    assert!(
        proven.iter().all(|a| !pod_ips.contains(a)),
        "a Pod's address proven: {proven:?} among {pod_ips:?}"
    );
}

pub(super) async fn concurrent_sibling_quotas_obey_the_tree_rules(
    node: &Node,
    client: &kube::Client,
) {
    use koord_webhook::apis::ElasticQuota;
    node.kubectl_ok(&["create", "namespace", "quota-race"], None)
        .await;
    let quotas: Api<ElasticQuota> = Api::namespaced(client.clone(), "quota-race");
    let quota = |name: &str, labels: Value, min: &str| -> ElasticQuota {
        serde_json::from_value(json!({
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": name, "namespace": "quota-race", "labels": labels},
            "spec": {"min": {"cpu": min, "memory": format!("{min}Gi")},
                     "max": {"cpu": "20", "memory": "20Gi"}}
        }))
        .unwrap()
    };
    quotas
        .create(
            &PostParams::default(),
            &quota(
                "race-parent",
                json!({"quota.scheduling.koordinator.sh/is-parent": "true"}),
                "10",
            ),
        )
        .await
        .expect("the parent quota is created");
    let creates = (0..200).map(|i| {
        let quotas = quotas.clone();
        let child = quota(
            &format!("race-child-{i}"),
            json!({"quota.scheduling.koordinator.sh/parent": "race-parent"}),
            "1",
        );
        async move { quotas.create(&PostParams::default(), &child).await }
    });
    let started = std::time::Instant::now();
    let results = futures::future::join_all(creates).await;
    let took = started.elapsed();
    let mut refusals = BTreeMap::<String, usize>::new();
    for result in &results {
        if let Err(e) = result {
            let reason = match e {
                kube::Error::Api(s) if s.message.contains("checkMinQuotaSum") => "min sum",
                kube::Error::Api(s) if s.code == 429 || s.message.contains("retry") => "retry",
                _ => "other",
            };
            *refusals.entry(reason.to_owned()).or_default() += 1;
        }
    }
    let children: Vec<ElasticQuota> = quotas
        .list(&ListParams::default().labels("quota.scheduling.koordinator.sh/parent=race-parent"))
        .await
        .unwrap()
        .items;
    eprintln!(
        "200 concurrent sibling ElasticQuota creates in {took:?}: {} accepted, refused {refusals:?}",
        children.len()
    );
    assert_eq!(
        children.len() + refusals.values().sum::<usize>(),
        200,
        "every create is either stored or refused"
    );
    assert!(
        (1..=10).contains(&children.len()),
        "the children's min (1 cpu each) must not exceed the parent's 10 cpu: {} accepted",
        children.len()
    );
    assert_eq!(
        refusals.get("other"),
        None,
        "every refusal is the min-sum rule or a retryable denial: {:?}",
        results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .filter(|e| !matches!(e, kube::Error::Api(s) if s.message.contains("checkMinQuotaSum")))
            .take(3)
            .collect::<Vec<_>>()
    );
}

/// `status -o json` lists ColocationQoSPriority with at least one refusal counted by the replicas.
pub(super) async fn rule_refusals_show_in_status(node: &Node) {
    let out = node
        .koord_webhook(&["status", "--namespace", NAMESPACE, "-o", "json"])
        .await;
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(status["ruleNotes"], serde_json::json!([]), "{status:#}");
    let counted =
        status["rules"].as_array().into_iter().flatten().any(|r| {
            r["rule"] == "ColocationQoSPriority" && r["denied"].as_u64().unwrap_or(0) >= 1
        });
    assert!(counted, "no refusal counted in status: {status:#}");
}

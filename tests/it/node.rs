//! koord-webhook installed as users install it, on a real one-node cluster (kubelet + containerd,
//! scripts/cluster): the image built from the Dockerfile, `kubectl apply --server-side -f
//! manifests/install.yaml` unchanged, two replicas called by the API server through the Service.
//! Then the day-2 operations under a steady load of dry-run pod creates counted at the client:
//! re-apply, the leader Pod deleted, a rolling upgrade, and uninstall.
//!
//! One test, one cluster: the steps build on each other, as they would for a user.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use support::certs::{
    MUTATING, VALIDATING, break_secrets_and_wait_for_repair, bundles, data, staged_to_a_new_ca,
};
use support::node::{
    NAMESPACE, NODE_NAME, Node, SteadyLoad, image, leader, pod_entries_narrowed, ready, replicas,
};
use support::operator::{colocation_and_qos_rules_apply, eventually};
use support::pod;
use support::tls_client::{Proto, connect};

const LOAD_PER_SECOND: u32 = 20;

/// The replicas' memory as the kubelet reports it, by Pod name: (working set, RSS if reported) in bytes.
async fn replica_memory(node: &Node) -> BTreeMap<String, (u64, Option<u64>)> {
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
async fn no_failed_admissions(load: SteadyLoad, phase: &str) -> usize {
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

async fn serving_rotations_drop_nothing(node: &Node, client: &kube::Client, bundle: &[u8]) {
    use k8s_openapi::api::core::v1::Secret;
    let args = [
        "--cert-validity=6s",
        "--renew-fraction=0.5",
        "--ca-rotation-grace=5s",
        "--ca-publish-settle=1s",
        // A CA issued from now on lives 80 s and is rotated, staged, at half-life: the broken
        // Secrets below give a new one, and the planned rotation of that one follows them.
        "--ca-validity=80s",
    ]
    .map(|a| json!({"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": a}));
    let args = serde_json::to_string(&args).unwrap();
    node.kubectl_ok(
        &[
            "-n",
            NAMESPACE,
            "patch",
            "deployment",
            "koord-webhook",
            "--type=json",
            "-p",
            &args,
        ],
        None,
    )
    .await;
    node.wait_rolled_out(Duration::from_secs(180)).await;
    // A replica of the old ReplicaSet keeps the Lease while it drains: it would reissue the deleted
    // pair with the old 720 h lifetime, and nothing would rotate. Wait for a new one to lead.
    eventually(
        Duration::from_secs(90),
        "two Ready replicas with the new flags, one of them the leader",
        || async {
            let pods = replicas(client).await;
            let rolled = |p: &&Pod| {
                p.metadata.deletion_timestamp.is_none()
                    && p.spec.as_ref().is_some_and(|s| {
                        s.containers[0]
                            .args
                            .iter()
                            .flatten()
                            .any(|a| a == "--cert-validity=6s")
                    })
            };
            let new: Vec<&Pod> = pods.iter().filter(rolled).collect();
            let leader = leader(client).await?;
            let leads = new
                .iter()
                .any(|p| p.metadata.name.as_deref() == Some(leader.as_str()));
            (new.iter().filter(|p| ready(p)).count() == 2 && leads).then_some(())
        },
    )
    .await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let served = |s: &Secret| {
        s.data
            .as_ref()
            .and_then(|d| d.get("tls.crt"))
            .map(|b| b.0.clone())
            .unwrap_or_default()
    };
    let load = SteadyLoad::start(client.clone(), "default", LOAD_PER_SECOND);
    // The pair in place has 720 h left: deleting it has the leader issue one with the new lifetime.
    secrets
        .delete("webhook-tls", &DeleteParams::default())
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 21 {
        assert!(
            started.elapsed() < Duration::from_secs(150),
            "only {} serving certificates in {:?}",
            seen.len(),
            started.elapsed()
        );
        if let Some(s) = secrets.get_opt("webhook-tls").await.unwrap() {
            seen.insert(served(&s));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!("20 serving rotations in {took:?}");
    no_failed_admissions(load, "20 serving certificate rotations").await;
    assert!(
        bundles(client).await.iter().all(|b| *b == bundle),
        "serving rotations kept the CA"
    );

    // Broken Secrets under the same load, each repaired in stages: webhook-ca deleted, then replaced
    // by garbage, then webhook-tls given a key that is not its certificate's.
    let load = SteadyLoad::start(client.clone(), "default", LOAD_PER_SECOND);
    let repairs = break_secrets_and_wait_for_repair(client, &secrets).await;
    eprintln!("broken Secrets repaired after: {repairs:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    no_failed_admissions(load, "webhook-ca deleted, garbage, a mismatched tls.key").await;

    // The planned rotation of the CA the last repair issued (80 s lifetime, due at 40 s), under
    // the same load: old and new trusted together, then the new one alone on every entry.
    let load = SteadyLoad::start(client.clone(), "default", LOAD_PER_SECOND);
    let started = std::time::Instant::now();
    let rotated = staged_to_a_new_ca(client, &secrets, &repairs.ca).await;
    eprintln!(
        "planned CA rotation done {:?} after the repairs",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    no_failed_admissions(load, "planned CA rotation").await;
    assert_ne!(rotated.trim(), repairs.ca.trim());
}

/// kube-apiserver stopped and started again under steady load. Creates sent while it is down or
/// starting fail at the client for want of an API server; none may fail in admission (a webhook
/// call error or a denial), and afterwards the operator is back: a leader, every entry's caBundle
/// the CA in `webhook-ca`, two Ready replicas, admission answering.
async fn apiserver_restart_fails_no_admission(node: &Node, client: &kube::Client) {
    use k8s_openapi::api::core::v1::Secret;
    let load = SteadyLoad::start(client.clone(), "default", LOAD_PER_SECOND);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = std::time::Instant::now();
    node.restart_apiserver().await;
    let down_for = started.elapsed();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    eventually(
        Duration::from_secs(90),
        "a leader, two Ready replicas and every caBundle the stored CA",
        || async {
            let ca = data(&secrets.get("webhook-ca").await.ok()?, "ca.crt");
            let in_sync = bundles(client)
                .await
                .iter()
                .all(|b| String::from_utf8_lossy(b).trim() == ca.trim());
            let ready_replicas = replicas(client).await.iter().filter(|p| ready(p)).count();
            (in_sync && ready_replicas == 2 && leader(client).await.is_some()).then_some(())
        },
    )
    .await;
    let recovered = started.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (sent, failures) = load.stop().await;
    let (admission, unavailable): (Vec<_>, Vec<_>) =
        failures.into_iter().partition(|e| e.contains("webhook"));
    eprintln!(
        "kube-apiserver restart: ready again after {down_for:?}, operator whole after \
         {recovered:?}; {sent} creates sent, {} failed for want of an API server, {} in admission",
        unavailable.len(),
        admission.len()
    );
    assert!(sent > 0);
    assert!(
        admission.is_empty(),
        "{} of {sent} creates failed in admission across the restart, e.g. {:?}",
        admission.len(),
        &admission[..admission.len().min(5)]
    );
    colocation_and_qos_rules_apply(client, Duration::from_secs(20)).await;
}

/// The restarts of each replica's container and the reason its last run ended, by Pod name.
fn restarts(pods: &[Pod]) -> BTreeMap<String, (i32, Option<String>)> {
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

async fn upload_burst_leaves_the_replica_running(client: &kube::Client) {
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

async fn concurrent_sibling_quotas_obey_the_tree_rules(node: &Node, client: &kube::Client) {
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

/// The host PID of the koord-webhook process of Pod `pod` (containers share the host's /proc).
fn replica_pid(pod: &str) -> u32 {
    let wanted = format!("POD_NAME={pod}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            comm.trim() == "koord-webhook"
                && environ
                    .split(|b| *b == 0)
                    .any(|var| var == wanted.as_bytes())
        })
        .unwrap_or_else(|| panic!("no koord-webhook process with {wanted}"))
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// Writes the audit log holds to Secrets, Leases and webhook configurations, as (time received,
/// source IP, verb, resource/name).
fn leader_only_writes(node: &Node) -> Vec<(jiff::Timestamp, String, String, String)> {
    let text = std::fs::read_to_string(node.dir().join("logs/audit.log")).unwrap();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|e| {
            let resource = e["objectRef"]["resource"].as_str().unwrap_or_default();
            [
                "secrets",
                "leases",
                "mutatingwebhookconfigurations",
                "validatingwebhookconfigurations",
            ]
            .contains(&resource)
        })
        .filter_map(|e| {
            Some((
                e["requestReceivedTimestamp"].as_str()?.parse().ok()?,
                e["sourceIPs"][0].as_str()?.to_owned(),
                e["verb"].as_str()?.to_owned(),
                format!(
                    "{}/{}",
                    e["objectRef"]["resource"].as_str()?,
                    e["objectRef"]["name"].as_str().unwrap_or_default()
                ),
            ))
        })
        .collect()
}

async fn frozen_leader_writes_nothing_after_resuming(node: &Node, client: &kube::Client) {
    let old_leader = leader(client).await.expect("a leader");
    let pods = replicas(client).await;
    let ip_of = |name: &str| {
        pods.iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .and_then(|p| p.status.as_ref()?.pod_ip.clone())
            .unwrap_or_else(|| panic!("no IP for {name}"))
    };
    let old_ip = ip_of(&old_leader);
    let pid = replica_pid(&old_leader);
    // Under the steady load: the frozen replica's share of calls fails (failurePolicy Fail, 10 s
    // timeout) until its readiness probe takes it out of the Service; counted, not asserted.
    let load = SteadyLoad::start(client.clone(), "default", LOAD_PER_SECOND);
    let stopped_at = jiff::Timestamp::now();
    signal(pid, "-STOP");
    let started = std::time::Instant::now();
    let new_leader = eventually(
        Duration::from_secs(40),
        "another replica to take the Lease from the frozen leader",
        || async { leader(client).await.filter(|l| *l != old_leader) },
    )
    .await;
    let took_over = started.elapsed();
    // Frozen for 20 s in all: longer than the 15 s Lease, shorter than the liveness probe's 30 s.
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(started.elapsed())).await;
    signal(pid, "-CONT");
    // A few retry periods for the resumed replica to run its loops.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (sent, failed) = load.stop().await;
    let timed_out = failed
        .iter()
        .filter(|e| e.contains("deadline") || e.contains("timeout"))
        .count();
    eprintln!(
        "frozen leader under load: {sent} dry-run pod creates sent, {} failed ({timed_out} of \
         them timeouts calling the frozen replica), e.g. {:?}",
        failed.len(),
        failed.first()
    );
    assert!(sent > 0, "the load ran");
    assert_eq!(leader(client).await.as_deref(), Some(new_leader.as_str()));
    let writes = leader_only_writes(node);
    let after: Vec<_> = writes
        .iter()
        .filter(|(at, ip, _, _)| *at > stopped_at && *ip == old_ip)
        .collect();
    let new_ip = ip_of(&new_leader);
    let by_new = writes
        .iter()
        .filter(|(at, ip, _, _)| *at > stopped_at && *ip == new_ip)
        .count();
    eprintln!(
        "leader {old_leader} frozen; {new_leader} took the Lease after {took_over:?}; writes since \
         by the frozen one: {after:?}, by the new leader: {by_new}"
    );
    assert!(
        after.is_empty(),
        "the frozen leader wrote after it lost the Lease: {after:?}"
    );
    assert!(by_new > 0, "the audit log shows the new leader's renewals");
    let restarts = restarts(&replicas(client).await);
    assert_eq!(
        restarts.get(&old_leader).map(|r| r.0),
        Some(0),
        "the frozen replica was resumed, not restarted: {restarts:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn installed_from_the_manifests_on_a_real_node() {
    let node = Node::start();
    let client = node.client().await;
    support::the_version_asked_for(&client).await;

    // --- Install: the README's command, the file unchanged; then a colocation profile.
    node.install_with_the_spark_profile().await;
    let pods = eventually(Duration::from_secs(60), "two Ready replicas", || async {
        let pods = replicas(&client).await;
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
    let first_leader = eventually(Duration::from_secs(30), "a leader", || leader(&client)).await;
    assert!(
        pods.iter()
            .any(|p| p.metadata.name.as_deref() == Some(&first_leader)),
        "the Lease holder {first_leader} is one of the replicas"
    );
    let bundle = eventually(
        Duration::from_secs(60),
        "the caBundle published",
        || async {
            let all = bundles(&client).await;
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

    // --- Admission through the API server, the Service and a Pod of the image.
    // Both replicas must have the profile in their cache: ask until one answers with it.
    colocation_and_qos_rules_apply(&client, Duration::from_secs(20)).await;
    // `status` reads the replicas' metrics through the API server's pod proxy: the BE pod at
    // koord-prod priority refused just now is counted against its rule.
    rule_refusals_show_in_status(&node).await;

    // --- 60 uploads of 6 MiB at once over 60 HTTP/1.1 connections, straight to one replica (a
    // caller inside the cluster network): the replica holds at most --max-inflight-request-bytes,
    // refuses the rest with 503, and is not OOM-killed (its limit is 384 Mi); it still answers
    // afterwards.
    upload_burst_leaves_the_replica_running(&client).await;
    colocation_and_qos_rules_apply(&client, Duration::from_secs(20)).await;

    // --- 200 concurrent sibling ElasticQuota creates whose min would sum to 20 times the parent's,
    // spread by the Service over both replicas, under the steady pod load: the accepted set obeys
    // the min-sum rule, every refusal says why, no pod admission fails.
    let load = SteadyLoad::start(client.clone(), "default", LOAD_PER_SECOND);
    concurrent_sibling_quotas_obey_the_tree_rules(&node, &client).await;
    no_failed_admissions(load, "200 concurrent ElasticQuota creates").await;

    // --- The leader frozen (SIGSTOP) for longer than its Lease, then resumed: another replica
    // leads, and the frozen one writes nothing once it resumes (fencing), as the audit log shows.
    frozen_leader_writes_nothing_after_resuming(&node, &client).await;

    // --- Re-install after the operator has run: no conflict, the caBundle stays.
    let out = node.install().await;
    assert!(
        out.status.success(),
        "re-applying manifests/install.yaml failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = bundles(&client).await;
    assert!(
        after.iter().all(|b| *b == bundle),
        "the caBundle changed or was dropped by the re-apply"
    );

    // --- The leader Pod deleted under steady admission load.
    let load = SteadyLoad::start(client.clone(), "default", LOAD_PER_SECOND);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before: Vec<String> = replicas(&client)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let old_leader = leader(&client).await.expect("a leader");
    Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .delete(&old_leader, &DeleteParams::default())
        .await
        .unwrap();
    let new_leader = eventually(
        Duration::from_secs(60),
        "another replica to take the Lease",
        || async { leader(&client).await.filter(|l| *l != old_leader) },
    )
    .await;
    eventually(
        Duration::from_secs(120),
        "the Deployment to replace the deleted Pod",
        || async {
            let pods = replicas(&client).await;
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

    // --- A rolling upgrade to a second tag of the image, the way users upgrade: re-render the
    // manifests for the new image and apply them.
    let (_, archive) = image();
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
        let pods = replicas(&client).await;
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
            let memory = replica_memory(&node).await;
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
        bundles(&client).await.iter().all(|b| *b == bundle),
        "the upgrade kept the CA"
    );

    // --- kube-apiserver restarted under steady admission load.
    apiserver_restart_fails_no_admission(&node, &client).await;

    // --- Last, since it changes the replicas' flags: 20 serving certificate rotations under steady
    // admission load (replicas rolled to a 6 s lifetime renewed at half-life, webhook-tls reissued
    // once with it). Nothing fails; the CA stays.
    serving_rotations_drop_nothing(&node, &client, &bundle).await;

    // --- Both replicas gone once the leader has narrowed the pod entries: only Koordinator's pods
    // fail closed; every other pod is created as if no webhook were installed.
    outage_blocks_only_koordinator_pods(&node, &client).await;

    // --- Uninstall: afterwards pods are created normally, nothing points at a missing Service.
    let out = node.koord_webhook(&["uninstall"]).await;
    assert!(
        out.status.success(),
        "koord-webhook uninstall failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let m: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
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
    assert!(replicas(&client).await.is_empty());
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

    // --- The Helm chart: installed into a namespace of its own, upgraded, uninstalled.
    helm_install_upgrade_uninstall(&node, &client).await;
}

/// The Deployment scaled to 0 (every replica gone) after the leader narrowed the pod entries: a
/// plain pod is created at once (the API server does not call the webhook), a pod carrying
/// Koordinator's marks and one a ClusterColocationProfile selects fail (failurePolicy Fail). Then
/// the replicas come back and admission works again.
async fn outage_blocks_only_koordinator_pods(node: &Node, client: &kube::Client) {
    let started = std::time::Instant::now();
    pod_entries_narrowed(client).await;
    eprintln!(
        "pod entries narrowed {:?} after the phase began",
        started.elapsed()
    );
    let scale = |replicas: &str| {
        [
            "-n".to_owned(),
            NAMESPACE.to_owned(),
            "scale".to_owned(),
            "deployment".to_owned(),
            "koord-webhook".to_owned(),
            format!("--replicas={replicas}"),
        ]
    };
    let args = scale("0");
    node.kubectl_ok(&args.iter().map(String::as_str).collect::<Vec<_>>(), None)
        .await;
    eventually(Duration::from_secs(120), "every replica gone", || async {
        replicas(client).await.is_empty().then_some(())
    })
    .await;
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let default: Api<Pod> = Api::namespaced(client.clone(), "default");
    let plain = pod(
        "default",
        "outage-plain",
        json!({"app": "web"}),
        json!({"cpu": "100m"}),
    );
    let t = std::time::Instant::now();
    default
        .create(&dry_run, &plain)
        .await
        .expect("a plain pod is created while no replica runs");
    let plain_took = t.elapsed();
    let marked = pod(
        "default",
        "outage-marked",
        json!({"koordinator.sh/qosClass": "LS"}),
        json!({"cpu": "1"}),
    );
    let err = default
        .create(&dry_run, &marked)
        .await
        .expect_err("a Koordinator pod fails closed")
        .to_string();
    assert!(err.contains("failed calling webhook"), "{err}");
    let spark: Api<Pod> = Api::namespaced(client.clone(), "spark");
    let selected = pod(
        "spark",
        "outage-spark",
        json!({"app": "spark"}),
        json!({"cpu": "1"}),
    );
    let err = spark
        .create(&dry_run, &selected)
        .await
        .expect_err("a pod the profile selects fails closed")
        .to_string();
    assert!(err.contains("failed calling webhook"), "{err}");
    eprintln!("outage: a plain pod created in {plain_took:?}; Koordinator pods refused: {err}");
    // Node updates are never held by an outage: both node entries are `Ignore` (as Koordinator's),
    // and a plain node's update is not even sent.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for annotation in [
        "example.com/outage",
        "node.koordinator.sh/resource-amplification-ratio",
    ] {
        let value = if annotation.starts_with("node.") {
            r#"{"cpu":1.5}"#
        } else {
            "yes"
        };
        nodes
            .patch(
                NODE_NAME,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"annotations": {annotation: value}}})),
            )
            .await
            .unwrap_or_else(|e| {
                panic!("the node annotated {annotation} while no replica runs: {e}")
            });
    }
    nodes
        .patch(
            NODE_NAME,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {
                "example.com/outage": null,
                "node.koordinator.sh/resource-amplification-ratio": null}}})),
        )
        .await
        .expect("the annotations removed while no replica runs");
    let args = scale("2");
    node.kubectl_ok(&args.iter().map(String::as_str).collect::<Vec<_>>(), None)
        .await;
    eventually(
        Duration::from_secs(120),
        "two Ready replicas again",
        || async {
            (replicas(client).await.iter().filter(|p| ready(p)).count() == 2).then_some(())
        },
    )
    .await;
    colocation_and_qos_rules_apply(client, Duration::from_secs(30)).await;
    pod_entries_narrowed(client).await;
    widening_misses_no_pod(node, client).await;
}

/// The API server's count of its calls to `mpod-create` (its `apiserver_admission_webhook_request_total`).
async fn mpod_create_calls(node: &Node) -> u64 {
    let metrics = node.kubectl_ok(&["get", "--raw", "/metrics"], None).await;
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_admission_webhook_request_total{"))
        .filter(|l| l.contains("name=\"mpod-create.koordinator.sh\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// With the pod entries narrowed, new ClusterColocationProfiles each followed at once (no wait) by a
/// pod only that profile selects: the API server sends every such pod to `mpod-create` (the replica
/// admitting the profile widens it before the profile is stored). Counted from the API server's
/// metrics and asserted: 0 not sent. A pod sent but answered by a replica whose watch had not yet
/// delivered the profile (read-after-write, as for Koordinator's informer-fed webhook, with or
/// without narrowing) is counted apart, and the same pod is checked to be mutated once it has.
async fn widening_misses_no_pod(node: &Node, client: &kube::Client) {
    use koord_webhook::apis::ClusterColocationProfile;
    const ROUNDS: usize = 5;
    let profiles: Api<ClusterColocationProfile> = Api::all(client.clone());
    let default: Api<Pod> = Api::namespaced(client.clone(), "default");
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut missed = Vec::new();
    let mut before_the_watch = Vec::new();
    let started = std::time::Instant::now();
    for round in 0..ROUNDS {
        let calls_before = mpod_create_calls(node).await;
        let app = format!("widen-{round}");
        let profile: ClusterColocationProfile = serde_json::from_value(json!({
            "apiVersion": "config.koordinator.sh/v1alpha1", "kind": "ClusterColocationProfile",
            "metadata": {"name": app},
            "spec": {"selector": {"matchLabels": {"app": app}}, "labels": {"widened": app}}}))
        .unwrap();
        profiles
            .create(&PostParams::default(), &profile)
            .await
            .unwrap_or_else(|e| panic!("profile {app} refused: {e}"));
        let created = default
            .create(
                &dry_run,
                &pod("default", &app, json!({"app": app}), json!({"cpu": "100m"})),
            )
            .await
            .unwrap_or_else(|e| panic!("pod {app} refused: {e}"));
        let sent = mpod_create_calls(node).await > calls_before;
        let labels = created.metadata.labels.unwrap_or_default();
        if !sent {
            missed.push((app.clone(), labels));
        } else if labels.get("widened") != Some(&app) {
            let pod = pod("default", &app, json!({"app": app}), json!({"cpu": "100m"}));
            eventually(
                Duration::from_secs(5),
                "the profile in the replicas' caches",
                || async {
                    let again = default.create(&dry_run, &pod).await.ok()?;
                    (again.metadata.labels?.get("widened") == Some(&app)).then_some(())
                },
            )
            .await;
            before_the_watch.push(app.clone());
        }
    }
    assert!(
        mpod_create_calls(node).await > 0,
        "the API server counts its calls to mpod-create"
    );
    eprintln!(
        "widening on the real node: {ROUNDS} profiles each followed at once by a pod it selects, \
         {} not sent, {} sent before the answering replica's watch had the profile ({:?}), {:?} in all",
        missed.len(),
        before_the_watch.len(),
        before_the_watch,
        started.elapsed()
    );
    assert!(
        missed.is_empty(),
        "pods created right after their profile were not sent to mpod-create: {missed:?}"
    );
    for round in 0..ROUNDS {
        profiles
            .delete(&format!("widen-{round}"), &DeleteParams::default())
            .await
            .unwrap();
    }
}

/// `koord-webhook status --wait` as a script after an install runs it: exit 0 (healthy), with both
/// replicas behind the Service.
/// `helm install` of charts/koord-webhook (into `koord-helm`, Koordinator's CRDs already there),
/// admission through it, `status` healthy; `helm upgrade` of a setting, which reaches the entries
/// while the caBundle stays; `helm uninstall`, after which nothing is left pointing at the replicas
/// and pods are created normally.
async fn helm_install_upgrade_uninstall(node: &Node, client: &kube::Client) {
    const HELM_NS: &str = "koord-helm";
    let helm = &crate::generated::helm();
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/koord-webhook");
    let run = |args: Vec<String>| async move {
        let mut command = vec![helm.to_str().unwrap().to_owned()];
        command.extend(args);
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        let out = node.exec(&command, None).await;
        assert!(
            out.status.success(),
            "{command:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let args = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let started = std::time::Instant::now();
    run(args(&[
        "install",
        "koord-webhook",
        chart,
        "--namespace",
        HELM_NS,
        "--create-namespace",
        "--set",
        "crds.install=false",
        // A UID of the kind OpenShift's restricted SCC assigns: the chart fixes none.
        "--set",
        "podSecurityContext.runAsUser=1000700000",
        "--wait",
        "--timeout",
        "3m",
    ]))
    .await;
    node.wait_healthy(HELM_NS).await;
    installed_for_every_platform(client, HELM_NS).await;
    // `helm test`: its Pod runs `status --wait --check-admission default` with its own RBAC. (Not
    // `--logs`: Helm then asks for the logs of every test hook by name, Roles included, and fails.)
    let tested = node
        .exec(
            &[
                helm.to_str().unwrap(),
                "test",
                "koord-webhook",
                "--namespace",
                HELM_NS,
                "--timeout",
                "3m",
            ],
            None,
        )
        .await;
    if !tested.status.success() {
        // A Pod that failed stays: its report says why.
        let logs = node
            .kubectl(&["logs", "-n", HELM_NS, "koord-webhook-test"], None)
            .await;
        panic!(
            "helm test: {}{}\nits Pod's log:\n{}",
            String::from_utf8_lossy(&tested.stdout),
            String::from_utf8_lossy(&tested.stderr),
            String::from_utf8_lossy(&logs.stdout)
        );
    }
    eprintln!(
        "helm install to healthy in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let plain: Api<Pod> = Api::namespaced(client.clone(), "plain");
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let reserved: Pod = serde_json::from_value(json!({
        "metadata": {"name": "reserved", "annotations": {"scheduling.koordinator.sh/reserve-pod": "true"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))
    .unwrap();
    let denied = plain
        .create(&dry_run, &reserved)
        .await
        .unwrap_err()
        .to_string();
    assert!(denied.contains("cannot set in annotations"), "{denied}");
    let v: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let entries = v.get(VALIDATING).await.unwrap().webhooks.unwrap();
    let bundle = entries[0].client_config.ca_bundle.clone().unwrap().0;
    assert_eq!(
        entries[0].client_config.service.as_ref().unwrap().namespace,
        HELM_NS
    );

    // Upgrade one setting: it reaches every entry (and the operator's flags, so it is kept), and the
    // caBundle the operator published survives Helm's patch.
    run(args(&[
        "upgrade",
        "koord-webhook",
        chart,
        "--namespace",
        HELM_NS,
        "--reuse-values",
        "--set",
        "webhooks.timeoutSeconds=7",
        "--wait",
        "--timeout",
        "3m",
    ]))
    .await;
    let entries = eventually(
        Duration::from_secs(60),
        "timeoutSeconds 7 on every entry",
        || async {
            let entries = v.get(VALIDATING).await.unwrap().webhooks.unwrap();
            entries
                .iter()
                .all(|e| e.timeout_seconds == Some(7))
                .then_some(entries)
        },
    )
    .await;
    assert!(
        entries
            .iter()
            .all(|e| e.client_config.ca_bundle.as_ref().map(|b| &b.0) == Some(&bundle)),
        "helm upgrade kept the caBundle"
    );
    let status = node
        .koord_webhook(&[
            "status",
            "--namespace",
            HELM_NS,
            "--wait",
            "--timeout",
            "2m",
        ])
        .await;
    assert_eq!(
        status.status.code(),
        Some(0),
        "healthy after helm upgrade: {}{}",
        String::from_utf8_lossy(&status.stdout),
        String::from_utf8_lossy(&status.stderr)
    );

    // Uninstall: Helm deletes the configurations a moment before the Deployment; the leader must
    // not put them back in between (it waits, and is stopped by then).
    run(args(&[
        "uninstall",
        "koord-webhook",
        "--namespace",
        HELM_NS,
        "--wait",
        "--timeout",
        "3m",
    ]))
    .await;
    tokio::time::sleep(
        Duration::from_secs(25), // past the operator's 20 s grace before it re-creates one,
    )
    .await;
    let m: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    assert!(
        m.get_opt(MUTATING).await.unwrap().is_none(),
        "no configuration came back"
    );
    assert!(
        v.get_opt(VALIDATING).await.unwrap().is_none(),
        "no configuration came back"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), HELM_NS);
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    plain
        .create(
            &PostParams::default(),
            &pod("plain", "after-helm-uninstall", json!({}), json!({})),
        )
        .await
        .expect("a pod is created normally after helm uninstall");
}

/// `status -o json` lists ColocationQoSPriority with at least one refusal counted by the replicas.
async fn rule_refusals_show_in_status(node: &Node) {
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

/// The chart's Deployment runs as the UID it was given, spreads its replicas over nodes (preferred:
/// this one node runs both), and a ResourceQuota admits its critical priority class.
async fn installed_for_every_platform(client: &kube::Client, namespace: &str) {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ResourceQuota;
    let deployment = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get("koord-webhook")
        .await
        .unwrap();
    let spec = deployment.spec.unwrap().template.spec.unwrap();
    let security = spec.security_context.unwrap();
    assert_eq!(security.run_as_user, Some(1000700000));
    assert_eq!(security.run_as_group, None);
    let anti = spec.affinity.unwrap().pod_anti_affinity.unwrap();
    let preferred = anti
        .preferred_during_scheduling_ignored_during_execution
        .unwrap();
    assert_eq!(
        preferred[0].pod_affinity_term.topology_key,
        "kubernetes.io/hostname"
    );
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
    let quota = Api::<ResourceQuota>::namespaced(client.clone(), namespace)
        .get("koord-webhook-critical-pods")
        .await
        .unwrap();
    let used = quota.status.and_then(|s| s.used).unwrap_or_default();
    assert!(
        used.get("pods").is_some_and(|q| q.0 != "0"),
        "the replicas are counted against the class's quota: {used:?}"
    );
}

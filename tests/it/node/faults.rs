//! Faults on the real node under a steady load: serving-certificate rotations, an API-server
//! restart, the leader frozen, every replica gone.

use super::load::*;
use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use support::certs::{break_secrets_and_wait_for_repair, bundles, data, staged_to_a_new_ca};
use support::node::{
    NAMESPACE, NODE_NAME, Node, SteadyLoad, leader, pod_entries_narrowed, ready, replicas,
};
use support::operator::{colocation_and_qos_rules_apply, eventually};
use support::pod;

pub(super) async fn serving_rotations_drop_nothing(
    node: &Node,
    client: &kube::Client,
    bundle: &[u8],
) {
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
pub(super) async fn apiserver_restart_fails_no_admission(node: &Node, client: &kube::Client) {
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

/// The host PID of the koord-webhook process of Pod `pod` (containers share the host's /proc).
pub(super) fn replica_pid(pod: &str) -> u32 {
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

pub(super) fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// Writes the audit log holds to Secrets, Leases and webhook configurations, as (time received,
/// source IP, verb, resource/name).
pub(super) fn leader_only_writes(node: &Node) -> Vec<(jiff::Timestamp, String, String, String)> {
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

pub(super) async fn frozen_leader_writes_nothing_after_resuming(
    node: &Node,
    client: &kube::Client,
) {
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

/// The Deployment scaled to 0 (every replica gone) after the leader narrowed the pod entries: a
/// plain pod is created at once (the API server does not call the webhook), a pod carrying
/// Koordinator's marks and one a ClusterColocationProfile selects fail (failurePolicy Fail). Then
/// the replicas come back and admission works again.
pub(super) async fn outage_blocks_only_koordinator_pods(node: &Node, client: &kube::Client) {
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
pub(super) async fn mpod_create_calls(node: &Node) -> u64 {
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
pub(super) async fn widening_misses_no_pod(node: &Node, client: &kube::Client) {
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

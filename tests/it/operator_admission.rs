//! The operator's live cache and admission through a real kube-apiserver: colocation profiles,
//! QoS rules, quota trees, node amplification, the slo-controller ConfigMap, quota evaluation with
//! concurrent pods, an API server restart, and `koord-webhook status`.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use koord_webhook::apis::ElasticQuota;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use support::control_plane::ControlPlane;
use support::operator::{Cluster, Load, colocation_and_qos_rules_apply, eventually};
use support::pod;

fn create_params(dry_run: bool) -> PostParams {
    PostParams {
        dry_run,
        ..Default::default()
    }
}

fn apply(cp: &ControlPlane, yaml: &str) {
    cp.kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(yaml));
}

fn kubectl_err(cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    let out = cp.kubectl(args, stdin);
    assert!(!out.status.success(), "kubectl {args:?} should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// What every step reaches: the control plane, a client, the replica's admission address.
struct Env<'a> {
    cp: &'a ControlPlane,
    client: kube::Client,
    addr: std::net::SocketAddr,
    dir: &'a std::path::Path,
}

/// Runs one step; a failure names it.
async fn step(name: &str, run: impl std::future::Future<Output = ()>) {
    use futures::FutureExt;
    eprintln!("== step: {name}");
    if let Err(panic) = std::panic::AssertUnwindSafe(run).catch_unwind().await {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("(no message)");
        panic!("step {name:?} failed: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_through_the_api_server_with_the_live_cache() {
    let cluster = Cluster::start().await;
    let operator = cluster.operator(
        "live",
        &[
            "--feature-gates",
            "EnableQuotaAdmission=true",
            "--drain-delay",
            "3s",
            "--child-request-recount-quiet",
            "2s",
        ],
    );
    operator.wait_ready(Duration::from_secs(60)).await;
    let env = Env {
        cp: &cluster.cp,
        client: cluster.client.clone(),
        addr: operator.addr,
        dir: cluster.dir.path(),
    };
    step(
        "the API server proven by a probe",
        the_api_server_is_proven_by_a_probe(&env),
    )
    .await;
    let metrics = operator.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("koord_webhook_api_server_probes_total{outcome=\"proven\"}")),
        "the probe is counted: {}",
        metrics
            .lines()
            .filter(|l| l.contains("probes"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    step(
        "a profile applies",
        a_profile_created_while_serving_applies(&env),
    )
    .await;
    step(
        "a quota tree",
        a_quota_tree_is_defaulted_validated_and_protected(&env),
    )
    .await;
    step("node amplification", node_status_is_amplified(&env)).await;
    step("the SLO ConfigMap", an_invalid_slo_config_is_refused(&env)).await;
    step(
        "quota evaluation",
        quota_evaluation_admits_exactly_what_fits(&env),
    )
    .await;
    step("the recount", the_leader_recounts_child_request(&env)).await;
    step("forged reviews", forged_reviews_do_not_hold_a_quota(&env)).await;
    step(
        "a forged quota",
        a_forged_quota_create_delays_only_its_tree_and_refuses_nothing(&env),
    )
    .await;
    step(
        "an API-server restart",
        admission_follows_an_api_server_restart(&env),
    )
    .await;
    step("status", status_reports_for_operators(&env)).await;
    step(
        "SIGTERM",
        sigterm_drains_and_releases_the_lease(&env, operator),
    )
    .await;
}

/// Before any ElasticQuota is created, the replica's own probe (a dry-run apply through the API
/// server, `ledger/probe.rs`) reaches its validating webhook, which writes the API server's address
/// (loopback here) into the ledger's record; no quota is stored by it.
async fn the_api_server_is_proven_by_a_probe(env: &Env<'_>) {
    let proven = support::operator::proven_api_servers(
        &env.client,
        "koordinator-system",
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(proven, ["127.0.0.1"], "{proven:?}");
    let quotas: Api<ElasticQuota> = Api::all(env.client.clone());
    let stored = quotas.list(&Default::default()).await.unwrap();
    assert!(
        stored.items.iter().all(|q| q.metadata.name.as_deref()
            != Some(koord_webhook::admission::elastic_quota::ledger::probe::PROBE_NAME)),
        "a probe was stored"
    );
}

/// The pods and the quota of the evaluation steps (namespace `eval`).
fn eval_pods(client: &kube::Client) -> Api<Pod> {
    Api::namespaced(client.clone(), "eval")
}

/// `q-eval`'s `child-request`, as the leader and evaluation write it.
async fn child_request(client: &kube::Client) -> Option<String> {
    let quotas: Api<ElasticQuota> = Api::namespaced(client.clone(), "eval");
    quotas
        .get("q-eval")
        .await
        .ok()?
        .metadata
        .annotations
        .unwrap_or_default()
        .get("quota.scheduling.koordinator.sh/child-request")
        .cloned()
}

async fn a_profile_created_while_serving_applies(env: &Env<'_>) {
    let (cp, client) = (env.cp, env.client.clone());
    // A profile created while serve runs applies within a second.
    apply(
        cp,
        &std::fs::read_to_string(support::fixture("colocation/spark.yaml")).unwrap(),
    );
    colocation_and_qos_rules_apply(&client, Duration::from_secs(1)).await;
}

async fn a_quota_tree_is_defaulted_validated_and_protected(env: &Env<'_>) {
    let (cp, client) = (env.cp, env.client.clone());
    // An ElasticQuota tree: defaulted, validated, protected from deletion.
    cp.kubectl_ok(&["create", "namespace", "team-a"], None);
    apply(
        cp,
        r#"
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata:
  name: parent-a
  namespace: team-a
  labels: {quota.scheduling.koordinator.sh/is-parent: "true"}
spec: {min: {cpu: "4", memory: 4Gi}, max: {cpu: "8", memory: 8Gi}}
---
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata:
  name: child-a1
  namespace: team-a
  labels: {quota.scheduling.koordinator.sh/parent: parent-a}
spec: {min: {cpu: "3", memory: 1Gi}, max: {cpu: "8", memory: 8Gi}}
"#,
    );
    let quotas: Api<ElasticQuota> = Api::namespaced(client.clone(), "team-a");
    let child = quotas.get("child-a1").await.unwrap();
    assert!(
        child
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("quota.scheduling.koordinator.sh/shared-weight"),
        "defaulted"
    );
    let too_big = r#"
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata:
  name: child-a2
  namespace: team-a
  labels: {quota.scheduling.koordinator.sh/parent: parent-a}
spec: {min: {cpu: "2", memory: 1Gi}, max: {cpu: "8", memory: 8Gi}}
"#;
    let err = kubectl_err(cp, &["create", "-f", "-"], Some(too_big));
    assert!(
        err.contains("checkMinQuotaSum all brothers' MinQuota > parent MinQuota, parent: parent-a"),
        "{err}"
    );
    let err = kubectl_err(
        cp,
        &["delete", "elasticquota", "parent-a", "-n", "team-a"],
        None,
    );
    assert!(
        err.contains("delete quota failed, quota parent-a has 1 child quotas"),
        "{err}"
    );
}

async fn node_status_is_amplified(env: &Env<'_>) {
    let (cp, client) = (env.cp, env.client.clone());
    // Node status amplification on a status patch.
    apply(
        cp,
        r#"
apiVersion: v1
kind: Node
metadata:
  name: node-1
  annotations: {node.koordinator.sh/resource-amplification-ratio: '{"cpu": 2}'}
"#,
    );
    cp.kubectl_ok(&["patch", "node", "node-1", "--subresource=status", "--type=merge", "-p",
        r#"{"status":{"capacity":{"cpu":"5","memory":"8Gi"},"allocatable":{"cpu":"4","memory":"8Gi"}}}"#], None);
    let node = Api::<Node>::all(client.clone())
        .get("node-1")
        .await
        .unwrap();
    let status = node.status.unwrap();
    assert_eq!(status.allocatable.unwrap()["cpu"].0, "8");
    assert_eq!(status.capacity.unwrap()["cpu"].0, "9");
}

async fn an_invalid_slo_config_is_refused(env: &Env<'_>) {
    let client = env.client.clone();
    // An invalid slo-controller-config is rejected.
    let bad = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "slo-controller-config", "namespace": "koordinator-system",
                     "labels": {"koordinator.sh/configmap-type": "slo-controller-config"}},
        "data": {"cpu-burst-config": r#"{"clusterStrategy": {"cpuBurstPercent": 0}}"#}});
    let err = Api::<ConfigMap>::namespaced(client.clone(), "koordinator-system")
        .create(
            &PostParams::default(),
            &serde_json::from_value(bad).unwrap(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("CPUBurstPercent must be 1 or greater"),
        "{err}"
    );
}

async fn quota_evaluation_admits_exactly_what_fits(env: &Env<'_>) {
    let (cp, client) = (env.cp, env.client.clone());
    // Quota evaluation: 100 concurrent pods against room for 10 admit exactly 10; a dry run writes nothing.
    cp.kubectl_ok(&["create", "namespace", "eval"], None);
    apply(
        cp,
        r#"
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: q-eval, namespace: eval}
spec: {max: {cpu: "10", memory: 100Gi}}
"#,
    );
    let eval_pods = eval_pods(&client);
    eventually(Duration::from_secs(2), "the quota in the cache", || async {
        let p = pod(
            "eval",
            "probe",
            json!({"quota.scheduling.koordinator.sh/name": "q-eval"}),
            json!({"cpu": "11"}),
        );
        let err = eval_pods
            .create(&create_params(true), &p)
            .await
            .err()?
            .to_string();
        err.contains("exceeded quota").then_some(())
    })
    .await;
    let creates = (0..100).map(|i| {
        let api = eval_pods.clone();
        async move {
            let p = pod(
                "eval",
                &format!("p-{i}"),
                json!({"quota.scheduling.koordinator.sh/name": "q-eval"}),
                json!({"cpu": "1"}),
            );
            api.create(&PostParams::default(), &p).await.is_ok()
        }
    });
    let admitted = futures::future::join_all(creates)
        .await
        .into_iter()
        .filter(|ok| *ok)
        .count();
    assert_eq!(admitted, 10);
    let before = child_request(&client).await;
    assert!(
        before
            .as_deref()
            .unwrap_or_default()
            .contains("\"cpu\":\"10\""),
        "{before:?}"
    );
    let p = pod(
        "eval",
        "dry",
        json!({"quota.scheduling.koordinator.sh/name": "q-eval"}),
        json!({"cpu": "1"}),
    );
    assert!(
        eval_pods.create(&create_params(true), &p).await.is_err(),
        "full"
    );
    assert_eq!(
        child_request(&client).await,
        before,
        "a dry run writes nothing"
    );
}

async fn the_leader_recounts_child_request(env: &Env<'_>) {
    let (cp, client) = (env.cp, env.client.clone());
    let eval_pods = eval_pods(&client);
    // The leader recounts child-request from the pods that exist: three deleted, and one admitted by
    // us but then refused by the API server's ResourceQuota (which runs after the webhooks), are
    // no longer counted once evaluation has been quiet for 2 s.
    let stored = eval_pods.list(&Default::default()).await.unwrap().items;
    assert_eq!(stored.len(), 10);
    for p in &stored[..3] {
        eval_pods
            .delete(
                p.metadata.name.as_deref().unwrap(),
                &DeleteParams::default(),
            )
            .await
            .unwrap();
    }
    apply(
        cp,
        "apiVersion: v1\nkind: ResourceQuota\nmetadata: {name: seven, namespace: eval}\nspec: {hard: {pods: \"7\"}}\n",
    );
    // No quota controller runs here: give the ResourceQuota the status it would compute.
    cp.kubectl_ok(
        &[
            "patch",
            "resourcequota",
            "seven",
            "-n",
            "eval",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"hard":{"pods":"7"},"used":{"pods":"7"}}}"#,
        ],
        None,
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Every refusal on the way, for the message below.
    let attempts = std::sync::Mutex::new(Vec::new());
    let refused_later = eventually(
        Duration::from_secs(10),
        "a pod refused by the ResourceQuota",
        || async {
            let p = pod(
                "eval",
                "over-count",
                json!({"quota.scheduling.koordinator.sh/name": "q-eval"}),
                json!({"cpu": "1"}),
            );
            let err = match eval_pods.create(&PostParams::default(), &p).await {
                Ok(_) => panic!("the ResourceQuota let an eighth pod in"),
                Err(e) => e.to_string(),
            };
            attempts.lock().unwrap().push(err.clone());
            // Until the recount, evaluation itself refuses it (child-request still says 10).
            err.contains("quota: seven").then_some(err)
        },
    )
    .await;
    eprintln!("refused after our admission: {refused_later}");
    // At least the refused pod stays counted until the recount. An attempt that passed evaluation
    // and was then refused by the API server for another reason counts too, so more than one may
    // (seen in local CI runs: 9 and 10; the message lists every attempt).
    let leaked = child_request(&client).await.unwrap_or_default();
    let leaked_cpu: u32 = serde_json::from_str::<serde_json::Value>(&leaked)
        .ok()
        .and_then(|v| v["cpu"].as_str().and_then(|c| c.parse().ok()))
        .unwrap_or(0);
    assert!(
        (8..=10).contains(&leaked_cpu),
        "evaluation counted the refused pod until the recount: {leaked}; attempts: {:?}",
        attempts.lock().unwrap()
    );
    let recounted = eventually(
        Duration::from_secs(20),
        "child-request recounted to the 7 pods that exist",
        || async {
            let value = child_request(&client).await?;
            value.contains("\"cpu\":\"7\"").then_some(value)
        },
    )
    .await;
    eprintln!("child-request after the recount: {recounted}");
}

async fn forged_reviews_do_not_hold_a_quota(env: &Env<'_>) {
    let (cp, client) = (env.cp, env.client.clone());
    let eval_pods = eval_pods(&client);
    // Forged reviews (no client CA in this test: anyone reaching the port can post one) do not hold
    // a quota for good. One of 2.5 cpu leaves no room for a real pod (7 + 2.5 of 10), and forged
    // reviews of 1m every half second follow (each fits, each is written); every admission counts
    // only for its window (2 s here), so the 2.5 cpu stop counting and a real pod gets in while
    // the forging goes on. Before, every forged write postponed the recount, and the quota stayed
    // full as long as they came.
    cp.kubectl_ok(&["delete", "resourcequota", "seven", "-n", "eval"], None);
    let forged = |i: usize, cpu: &str| {
        let mut p = serde_json::to_value(pod(
            "eval",
            &format!("forged-{i}"),
            json!({"quota.scheduling.koordinator.sh/name": "q-eval"}),
            json!({"cpu": cpu}),
        ))
        .unwrap();
        p["apiVersion"] = json!("v1");
        p["kind"] = json!("Pod");
        serde_json::to_vec(&support::review::admission_review(
            &support::review::POD,
            "CREATE",
            "eval",
            p,
            Value::Null,
        ))
        .unwrap()
    };
    let forge = |body: Vec<u8>| {
        let addr = env.addr;
        async move {
            let mut conn = support::tls_client::connect(addr, support::tls_client::Proto::Http1)
                .await
                .unwrap();
            let (_, answer) = conn.post("/validate-pod", body).await;
            serde_json::from_slice::<Value>(&answer).unwrap()["response"]["allowed"] == true
        }
    };
    assert!(
        forge(forged(0, "2500m")).await,
        "the forged review is admitted"
    );
    let real = |name: &str| {
        pod(
            "eval",
            name,
            json!({"quota.scheduling.koordinator.sh/name": "q-eval"}),
            json!({"cpu": "1"}),
        )
    };
    let refused = eval_pods
        .create(&PostParams::default(), &real("real-0"))
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("exceeded quota"), "{refused}");
    let forging = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let forger = {
        let forging = forging.clone();
        let bodies: Vec<Vec<u8>> = (1..200).map(|i| forged(i, "1m")).collect();
        let addr = env.addr;
        tokio::spawn(async move {
            let mut sent = 0;
            for body in bodies {
                if !forging.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                if let Ok(mut conn) =
                    support::tls_client::connect(addr, support::tls_client::Proto::Http1).await
                {
                    conn.post("/validate-pod", body).await;
                    sent += 1;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            sent
        })
    };
    eventually(
        Duration::from_secs(15),
        "a real pod admitted while forged reviews keep coming",
        || async {
            eval_pods
                .create(&PostParams::default(), &real("real-1"))
                .await
                .ok()
        },
    )
    .await;
    forging.store(false, std::sync::atomic::Ordering::SeqCst);
    let sent = forger.await.unwrap();
    assert!(sent >= 2, "the forger kept going ({sent} sent)");
}

async fn a_forged_quota_create_delays_only_its_tree_and_refuses_nothing(env: &Env<'_>) {
    let cp = env.cp;
    // A forged ElasticQuota CREATE is admitted into the ledger but never stored: changes of its
    // own tree (parent-a's) wait for it a few seconds at most and are then admitted without it;
    // other trees never wait. Before, changes of its tree got 429 for 15 s, renewable; before
    // that, every quota change in the cluster did.
    let forged_quota = json!({
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
        "metadata": {"name": "forged-q", "namespace": "team-a",
                     "labels": {"quota.scheduling.koordinator.sh/parent": "parent-a"}},
        "spec": {"min": {"cpu": "0", "memory": "0"}, "max": {"cpu": "1", "memory": "1Gi"}}
    });
    support::review::forge_quota_create(env.addr, "team-a", forged_quota.clone()).await;
    let started = std::time::Instant::now();
    apply(
        cp,
        "apiVersion: scheduling.sigs.k8s.io/v1alpha1\nkind: ElasticQuota\nmetadata: {name: solo, namespace: eval}\nspec: {min: {cpu: \"1\"}, max: {cpu: \"1\"}}\n",
    );
    eprintln!(
        "a quota in another tree admitted {:?} after the forged one",
        started.elapsed()
    );
    // Forged again just before each real change of its tree: each is admitted.
    for cpu in ["2", "3"] {
        support::review::forge_quota_create(env.addr, "team-a", forged_quota.clone()).await;
        let started = std::time::Instant::now();
        let patch = format!(r#"{{"spec":{{"min":{{"cpu":"{cpu}"}}}}}}"#);
        cp.kubectl_ok(
            &[
                "patch",
                "elasticquota",
                "child-a1",
                "-n",
                "team-a",
                "--type=merge",
                "-p",
                &patch,
            ],
            None,
        );
        eprintln!(
            "a change of the forged quota's tree admitted {:?} after it",
            started.elapsed()
        );
    }
}

async fn admission_follows_an_api_server_restart(env: &Env<'_>) {
    let (cp, client) = (env.cp, env.client.clone());
    let quotas: Api<ElasticQuota> = Api::namespaced(client.clone(), "team-a");
    // The API server restarted: watches resume, admission keeps working without a process restart.
    // Readiness keeps the last bundle it read: the restart makes no replica unready.
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let poller = {
        let (addr, watching) = (env.addr, watching.clone());
        tokio::spawn(async move {
            let mut answers = std::collections::BTreeMap::<u16, usize>::new();
            while watching.load(std::sync::atomic::Ordering::SeqCst) {
                let status =
                    match support::tls_client::connect(addr, support::tls_client::Proto::Http1)
                        .await
                    {
                        Ok(mut conn) => conn.get("/readyz").await.0.as_u16(),
                        Err(_) => 0,
                    };
                *answers.entry(status).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            answers
        })
    };
    cp.restart_apiserver();
    apply(
        cp,
        r#"
apiVersion: config.koordinator.sh/v1alpha1
kind: ClusterColocationProfile
metadata: {name: after-restart}
spec:
  selector: {matchLabels: {app: late}}
  labels: {seen-after-restart: "true"}
"#,
    );
    let late = pod("default", "late", json!({"app": "late"}), json!({}));
    let default_pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    eventually(
        Duration::from_secs(30),
        "admission to see objects made after the restart",
        || async {
            let p = default_pods
                .create(&create_params(true), &late)
                .await
                .ok()?;
            p.metadata
                .labels
                .unwrap_or_default()
                .contains_key("seen-after-restart")
                .then_some(())
        },
    )
    .await;
    watching.store(false, std::sync::atomic::Ordering::SeqCst);
    let answers = poller.await.unwrap();
    eprintln!("/readyz across the API server restart: {answers:?}");
    assert_eq!(
        answers.keys().copied().collect::<Vec<_>>(),
        vec![200],
        "ready throughout the restart: {answers:?}"
    );
    quotas
        .delete("child-a1", &DeleteParams::default())
        .await
        .unwrap();
}

async fn status_reports_for_operators(env: &Env<'_>) {
    let cp = env.cp;
    // `status` for operators, as text and JSON.
    let run_status = |args: &[&str], kubeconfig: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
            .arg("status")
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .output()
            .unwrap()
    };
    let out = run_status(&["--output", "json"], &cp.kubeconfig);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["healthy"], true, "{status}");
    assert_eq!(status["problems"], serde_json::json!([]));
    assert_eq!(status["leader"], "live");
    assert_eq!(
        status["configurations"][0]["entries"][0]["failurePolicy"],
        "Fail"
    );
    let pods = status["objects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == "Pod")
        .unwrap_or_else(|| panic!("no Pod count: {status}"));
    assert!(pods["count"].as_u64().is_some(), "{status}");
    assert_eq!(status["rotationPhase"], "Stable");
    assert!(
        status["configurations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["caBundleInSync"] == true),
        "{status}"
    );
    assert_eq!(
        status["configurations"][0]["entries"]
            .as_array()
            .unwrap()
            .len(),
        support::registered_webhooks(
            koord_webhook::entries::ENDPOINTS
                .iter()
                .filter(|e| matches!(e.kind, koord_webhook::entries::WebhookKind::Mutating))
                .flat_map(|e| e.entries)
        ) - 1,
        "the mutating entries but mpod-update, which narrowing leaves out, and mpod-create's \
         labelled part (--qos-split, the default)"
    );
    assert!(
        status["configurations"][0]["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["matchConditions"] == serde_json::json!(["koord-amplified-node"])),
        "{status}"
    );
    assert!(
        status["recentEvents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().unwrap().contains("CertificateIssued")),
        "{status}"
    );
    let text = run_status(&[], &cp.kubeconfig);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(": healthy")
            && text.contains("caBundle in sync")
            && text.contains("failurePolicy Fail")
            && text.contains("narrowed by koord-amplified-node"),
        "{text}"
    );
    eprintln!("`koord-webhook status`, healthy:\n{text}");
    // Unhealthy (a namespace koord-webhook does not run in): exit 1 and the problems named, also
    // after --wait gives up.
    let out = run_status(&["--namespace", "nowhere", "-o", "json"], &cp.kubeconfig);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["healthy"], false);
    let problems = status["problems"].to_string();
    assert!(
        problems.contains("no leader") && problems.contains("holds no usable certificate"),
        "{problems}"
    );
    let out = run_status(&["--namespace", "nowhere"], &cp.kubeconfig);
    eprintln!(
        "`koord-webhook status --namespace nowhere`, unhealthy:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = run_status(
        &["--namespace", "nowhere", "--wait", "--timeout", "3s"],
        &cp.kubeconfig,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("UNHEALTHY"));
    // A certificate threshold beyond the CA's life makes the same cluster unhealthy.
    let out = run_status(&["--expiry-threshold", "87600h"], &cp.kubeconfig);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("expires within"));
    // Unreachable cluster: one line, non-zero exit.
    let dead = env.dir.join("dead.kubeconfig");
    let cfg = std::fs::read_to_string(&cp.kubeconfig).unwrap();
    let port = cfg
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://127.0.0.1:"))
        .unwrap()
        .to_owned();
    std::fs::write(
        &dead,
        cfg.replace(&format!("127.0.0.1:{port}"), "127.0.0.1:1"),
    )
    .unwrap();
    let out = run_status(&[], &dead);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot reach the cluster"), "{stderr}");
    // --kubeconfig wins over $KUBECONFIG; an unknown --context is one line and exit 2.
    let kubeconfig = cp.kubeconfig.display().to_string();
    let out = run_status(&["--kubeconfig", &kubeconfig], &dead);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run_status(
        &["--kubeconfig", &kubeconfig, "--context", "elsewhere"],
        &dead,
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("elsewhere") && stderr.trim().lines().count() == 1,
        "{stderr}"
    );
}

async fn sigterm_drains_and_releases_the_lease(
    env: &Env<'_>,
    mut operator: support::operator::Operator,
) {
    let client = env.client.clone();
    // SIGTERM with requests in flight: the replica keeps serving through its drain delay, answers
    // what it has, releases the Lease and exits 0. A keep-alive HTTP/1.1 connection (how the API
    // server calls a Service) stays open before it and is closed after its next answer during the
    // drain, so a caller moves to another replica before this one stops.
    let mut held = support::tls_client::connect(operator.addr, support::tls_client::Proto::Http1)
        .await
        .unwrap();
    let (status, headers, _) = held.get_with_headers("/healthz").await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(headers.get("connection"), None, "{headers:?}");
    let load = Load::start(client.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    operator.signal_term();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, headers, _) = held.get_with_headers("/healthz").await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        headers.get("connection").map(|v| v.to_str().unwrap()),
        Some("close"),
        "{headers:?}"
    );
    let reused = held.get_with_headers("/healthz").await;
    assert!(reused.is_err(), "the connection stayed open: {reused:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (ok, failed) = load.stop().await;
    assert!(ok > 5 && failed.is_empty(), "{ok} ok, failed: {failed:?}");
    assert!(operator.wait().success(), "{}", operator.log_text());
    assert!(
        operator.log_text().contains("lease released"),
        "{}",
        operator.log_text()
    );
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        client.clone(),
        "koordinator-system",
    )
    .get("koord-webhook")
    .await
    .unwrap();
    assert_eq!(lease.spec.and_then(|s| s.holder_identity), None);
}

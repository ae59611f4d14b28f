//! The operator's watches through a real kube-apiserver: an object that does not decode is left
//! out (counted, named in an Event) while the rest of its kind syncs; values of Koordinator's
//! string enums this version does not know are read; only the ConfigMaps the rules read are held.

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use koord_webhook::names::{MUTATING_CONFIGURATION, VALIDATING_CONFIGURATION};
use kube::api::{Api, ListParams};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::operator::{Cluster, Operator, eventually};

/// A Reservation whose template's containers are `containers` (YAML); the CRD keeps the template
/// as given, so a value our types cannot read is stored.
fn reservation(name: &str, containers: &str) -> String {
    format!(
        "apiVersion: scheduling.koordinator.sh/v1alpha1\nkind: Reservation\nmetadata: {{name: {name}}}\n\
         spec: {{owners: [{{object: {{name: x}}}}], template: {{spec: {{containers: {containers}}}}}}}\n"
    )
}

const CONFIG_MAPS: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: slo-controller-config, namespace: koordinator-system}
data: {}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: someone-elses, namespace: koordinator-system}
data: {big: "not for us"}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_object_is_left_out_and_the_rest_syncs() {
    let cluster = Cluster::start().await;
    let cp = &cluster.cp;
    // Stored without our webhook in the way (the schema keeps the template as given), as a
    // Koordinator client or an older webhook could have stored it.
    for (kind, name) in [
        ("mutatingwebhookconfiguration", MUTATING_CONFIGURATION),
        ("validatingwebhookconfiguration", VALIDATING_CONFIGURATION),
    ] {
        cp.kubectl_ok(&["delete", kind, name], None);
    }
    for yaml in [
        reservation("unreadable", "'not a list'"),
        reservation("readable", "[{name: c, image: pause}]"),
        CONFIG_MAPS.to_owned(),
    ] {
        cp.kubectl_ok(&["apply", "-f", "-"], Some(&yaml));
    }
    // A phase a newer koord-scheduler might write.
    cp.kubectl_ok(
        &[
            "patch",
            "reservation",
            "readable",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Migrating","conditions":[{"type":"Preempted","status":"Maybe"}]}}"#,
        ],
        None,
    );

    let operator = cluster.operator("watches", &[]);
    operator.wait_ready(Duration::from_secs(60)).await;
    let metrics = operator.metrics().await;
    for line in [
        r#"koord_webhook_cache_unreadable_objects_total{kind="reservation"} 1"#,
        r#"koord_webhook_cache_objects{kind="Reservation"} 1"#,
        r#"koord_webhook_cache_objects{kind="ConfigMap"} 1"#,
    ] {
        assert!(metrics.contains(line), "no {line} in\n{metrics}");
    }

    let note = event_note(&cluster.client, "default", "UnreadableObject", "unreadable").await;
    assert!(note.contains("cannot read this object"), "{note}");

    // An object that becomes unreadable leaves the cache; fixed, it comes back.
    cp.kubectl_ok(
        &[
            "patch",
            "reservation",
            "readable",
            "--type=merge",
            "-p",
            r#"{"spec":{"template":{"spec":{"containers":7}}}}"#,
        ],
        None,
    );
    let gone = r#"koord_webhook_cache_objects{kind="Reservation"} 0"#;
    eventually(Duration::from_secs(20), gone, || async {
        operator.metrics().await.contains(gone).then_some(())
    })
    .await;
}

/// Waits (30 s at most) until the operator's cache holds `n` ElasticQuotas.
async fn cached_quotas(operator: &Operator, n: usize) {
    let want = format!(r#"koord_webhook_cache_objects{{kind="ElasticQuota"}} {n}"#);
    eventually(Duration::from_secs(30), &want, || async {
        operator.metrics().await.contains(&want).then_some(())
    })
    .await;
}

/// A quota as kubectl applies it: the API server adds managedFields, kubectl its last-applied copy.
const QUOTA: &str = r#"
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata:
  name: slim
  namespace: default
  annotations: {other.tool/note: "not read by any rule"}
spec: {max: {cpu: "4"}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_restart_relists_into_the_same_cache() {
    let cluster = Cluster::start().await;
    let cp = &cluster.cp;
    let operator = cluster.operator("relist", &[]);
    operator.wait_ready(Duration::from_secs(60)).await;
    cp.kubectl_ok(&["apply", "-f", "-"], Some(QUOTA));
    cached_quotas(&operator, 1).await;

    // The watches break (and relist when their version is gone); the cache follows the cluster
    // afterwards and the replica stays ready (it answers from the cache it has).
    cp.restart_apiserver();
    cp.kubectl_ok(&["delete", "elasticquota", "slim", "-n", "default"], None);
    cached_quotas(&operator, 0).await;
    assert_eq!(operator.readyz().await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_near_its_memory_limit_turns_unready_and_says_why() {
    let cluster = Cluster::start().await;
    // 8 MiB: any replica is over 85 % of it from its start.
    let operator = cluster.operator("near-limit", &["--memory-limit", "8388608"]);
    let body = eventually(Duration::from_secs(60), "unready for memory", || async {
        let (status, body) = operator.readyz().await;
        (status == 503 && body.contains("memory limit")).then_some(body)
    })
    .await;
    assert!(body.contains("8 MiB"), "{body}");
    let note = event_note(
        &cluster.client,
        "koordinator-system",
        "MemoryNearLimit",
        "near-limit",
    )
    .await;
    assert!(note.contains("raise resources.limits.memory"), "{note}");
}

/// The message of the first Event `reason` about the object `name` in `namespace`, waited for.
async fn event_note(client: &kube::Client, namespace: &str, reason: &str, name: &str) -> String {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    eventually(Duration::from_secs(30), reason, || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.involved_object.name.as_deref() == Some(name)
                })
                .and_then(|e| e.message)
        }
    })
    .await
}

/// A TCP relay to the API server that counts the bytes coming back (TLS passes through: the API
/// server's certificate names 127.0.0.1). Returns its address and the count.
async fn counting_relay(to: String) -> (String, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let received = Arc::new(AtomicU64::new(0));
    let count = received.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&to).await else {
                continue;
            };
            let count = count.clone();
            tokio::spawn(async move {
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let up = tokio::io::copy(&mut client_read, &mut server_write);
                let down = async {
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n) = server_read.read(&mut buf).await {
                        if n == 0 || client_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        count.fetch_add(n as u64, Ordering::Relaxed);
                    }
                };
                let _ = tokio::join!(up, down);
            });
        }
    });
    (addr, received)
}

/// A pod whose spec is `kib` KiB of environment values (metadata a few hundred bytes).
fn big_pod(name: &str, kib: usize) -> String {
    let env: Vec<String> = (0..kib)
        .map(|i| format!("{{name: V{i}, value: {}}}", "x".repeat(1000)))
        .collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\n\
         spec: {{containers: [{{name: c, image: pause, env: [{}]}}]}}\n",
        env.join(", ")
    )
}

/// Without quota admission the operator watches pods as metadata only, so a pod's spec never
/// travels to it: whole-pod JSON watches cost the API server a JSON encoding of every pod event,
/// kept in its watch cache (issue 45). With the gate on, the recount needs each pod's requests and
/// the whole pod comes. Counted as the bytes the operator receives from the API server (through a
/// relay) when 10 pods with a 48 KiB spec each are created, beyond what it receives in as long idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_watched_as_metadata_unless_quota_admission_needs_their_charge() {
    let cluster = Cluster::start().await;
    let kubeconfig = std::fs::read_to_string(&cluster.kubeconfig).unwrap();
    let server = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .expect("a server in the kubeconfig")
        .to_owned();
    let (relay, received) = counting_relay(server.clone()).await;
    let relayed = cluster.dir.path().join("relayed.kubeconfig");
    std::fs::write(&relayed, kubeconfig.replace(&server, &relay)).unwrap();
    for (gates, prefix, whole) in [
        ("", "small-news", false),
        ("EnableQuotaAdmission=true", "big-news", true),
    ] {
        let mut args = vec!["--leader-elect=false"];
        if !gates.is_empty() {
            args.extend(["--feature-gates", gates]);
        }
        let operator = Operator::start(&relayed, cluster.dir.path(), prefix, &args);
        operator.wait_ready(Duration::from_secs(60)).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        // What the operator receives anyway in as long (its own reads and writes).
        let idle_from = received.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let before = received.load(Ordering::Relaxed);
        let idle = before - idle_from;
        // `create`, not `apply`: apply copies the spec into an annotation, which is metadata.
        let pods: Vec<String> = (0..10)
            .map(|i| big_pod(&format!("{prefix}-{i}"), 48))
            .collect();
        cluster
            .cp
            .kubectl_ok(&["create", "-f", "-"], Some(&pods.join("---\n")));
        tokio::time::sleep(Duration::from_secs(5)).await;
        let got = (received.load(Ordering::Relaxed) - before).saturating_sub(idle);
        if whole {
            assert!(
                got > 400_000,
                "with quota admission 10 pods of 48 KiB come whole: {got} bytes (idle {idle})"
            );
        } else {
            assert!(
                got < 150_000,
                "without it only their metadata: {got} bytes (idle {idle})"
            );
        }
        drop(operator);
    }
}

/// Whether the API server serves streaming lists: its `kubernetes_feature_enabled` gauge for the
/// WatchList gate (every version the chart accepts has the gate and the gauge).
fn watch_list_enabled(metrics: &str) -> bool {
    let gauge = metrics
        .lines()
        .find(|l| l.starts_with("kubernetes_feature_enabled{") && l.contains(r#"name="WatchList""#))
        .expect("the API server reports its WatchList gate");
    gauge.ends_with(" 1")
}

/// How the API server served the operator's lists of ElasticQuotas (only the operator lists them
/// here): streamed (watch-list requests) and paged (LIST requests).
async fn quota_lists(cluster: &Cluster) -> (u64, u64) {
    let metrics = cluster.cp.apiserver_metrics().await;
    let quotas = r#"resource="elasticquotas""#;
    let streamed = crate::support::metric_sum(
        &metrics,
        "apiserver_watch_list_duration_seconds_count",
        &[quotas],
    );
    let paged = crate::support::metric_sum(
        &metrics,
        "apiserver_request_total",
        &[quotas, r#"verb="LIST""#],
    );
    (streamed, paged)
}

/// Relists stream where the API server serves streaming lists (no page of objects decoded at once,
/// docs/scale.md), and come in pages where it refuses them: a server with the WatchList gate off
/// answers `sendInitialEvents` with 422, and a watch that kept asking would never sync. Whether the
/// gate is on by default depends on the version (off before 1.32: docs/compatibility.md), so the
/// default case asks the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relists_stream_where_the_api_server_serves_it_and_page_where_it_refuses() {
    for gates in ["", "--feature-gates=WatchList=false"] {
        let cluster = Cluster::start_with(gates).await;
        let cp = &cluster.cp;
        let streams = watch_list_enabled(&cp.apiserver_metrics().await);
        assert!(
            !(gates.contains("WatchList=false") && streams),
            "the server reports WatchList on with the gate turned off"
        );
        let operator = cluster.operator("lists", &[]);
        operator.wait_ready(Duration::from_secs(60)).await;
        cp.kubectl_ok(&["apply", "-f", "-"], Some(QUOTA));
        cached_quotas(&operator, 1).await;
        let (streamed, paged) = quota_lists(&cluster).await;
        if streams {
            assert!(
                streamed >= 1 && paged == 0,
                "{gates:?}: {streamed} streamed, {paged} paged lists of quotas"
            );
        } else {
            assert!(
                streamed == 0 && paged >= 1,
                "{gates:?}: {streamed} streamed, {paged} paged lists of quotas"
            );
        }

        // The watch that followed goes on.
        cp.kubectl_ok(&["delete", "elasticquota", "slim", "-n", "default"], None);
        cached_quotas(&operator, 0).await;
    }
}

/// A watch that resumes after an API-server restart brings no event until its kind changes, and
/// most kinds do not change for hours (profiles, priority classes, the SLO ConfigMap): the resumed
/// watch is the success that ends the failure. Counted from events alone, every replica turned
/// unready `--watch-failure-bound` after the restart and stayed so (the scale benchmark's third
/// restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_is_ready_again_once_its_watches_resume_after_an_api_server_restart() {
    let cluster = Cluster::start().await;
    let operator = cluster.operator("resume", &["--watch-failure-bound", "20s"]);
    operator.wait_ready(Duration::from_secs(60)).await;
    // A graceful stop (a minute of the old server ending its watches), as the scale benchmark's
    // restarts were when they found this: with a kill after 10 s this test passed on the old code.
    cluster.cp.restart_apiserver_gracefully();
    eventually(
        Duration::from_secs(40),
        "ready after the restart",
        || async { (operator.readyz().await.0 == 200).then_some(()) },
    )
    .await;
    // And it stays so with nothing changing (the bound passes again meanwhile).
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (code, body) = operator.readyz().await;
        assert_eq!(code, 200, "{body}");
    }
}

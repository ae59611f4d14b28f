//! The operator against a real kube-apiserver: certificates issued and rotated, caBundles kept,
//! drift and loss repaired, external certificates verified. The API server calls the webhook over
//! TLS in URL mode (127.0.0.1); the operator runs with the RBAC of `manifests/` by impersonating its
//! ServiceAccount.

use crate::support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use koord_webhook::certs::authority;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::certs::{
    MUTATING, VALIDATING, break_secrets_and_wait_for_repair, bundle_certs, bundles, data,
};
use support::operator::{Cluster, Load, Operator, eventually};

const NS: &str = "koordinator-system";

fn pod(name: &str, annotations: serde_json::Value) -> Pod {
    serde_json::from_value(
        json!({"metadata": {"name": name, "annotations": annotations},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .unwrap()
}

/// A dry-run create of a pod with the reserve-pod annotation; `/validate-pod` should deny it.
/// The error text, or `None` if it was admitted.
async fn create_reserved_pod(pods: &Api<Pod>) -> Option<String> {
    let reserved = pod(
        "reserved",
        json!({"scheduling.koordinator.sh/reserve-pod": "true"}),
    );
    pods.create(&dry_run(), &reserved)
        .await
        .err()
        .map(|e| e.to_string())
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_install_rotation_drift_and_loss() {
    let cluster = Cluster::start().await;
    let operator = cluster.operator(
        "replica-a",
        &["--cert-validity", "8s", "--renew-fraction", "0.5"],
    );
    let installed = a_fresh_install_is_ready_and_called(&cluster, &operator).await;
    serving_rotations_fail_nothing(&installed, &operator).await;
    drift_is_repaired_and_named(&cluster, &installed).await;
    lost_secrets_are_recreated(&cluster, &installed, &operator).await;
    drop(operator);
    a_gate_turned_off_removes_only_its_entries(&cluster).await;
}

/// What the steps after a fresh install compare with.
struct Installed {
    secrets: Api<Secret>,
    pods: Api<Pod>,
    ca_pem: String,
    bundle: String,
    first_serving: String,
}

/// 1. Fresh install: both Secrets, the bundle on every entry, ready, and the API server calls us.
async fn a_fresh_install_is_ready_and_called(cluster: &Cluster, operator: &Operator) -> Installed {
    let client = cluster.client.clone();
    operator.wait_ready(Duration::from_secs(60)).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let ca_secret = secrets.get("webhook-ca").await.unwrap();
    let tls_secret = secrets.get("webhook-tls").await.unwrap();
    assert_eq!(tls_secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let ca_pem = data(&ca_secret, "ca.crt");
    let bundle = data(&tls_secret, "ca.crt");
    assert_eq!(bundle.trim(), ca_pem.trim());
    let published = bundles(&client).await;
    // Each entry with a labelled part is registered as two webhooks (--qos-split, the default).
    let entries = support::registered_webhooks(
        koord_webhook::entries::ENDPOINTS
            .iter()
            .flat_map(|endpoint| endpoint.entries),
    );
    assert_eq!(
        published.len(),
        entries - 1,
        "every webhook of the table but mpod-update (narrowed away)"
    );
    assert!(
        published.iter().all(|b| *b == bundle.as_bytes()),
        "caBundle on every entry"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let denied = create_reserved_pod(&pods).await.expect("denied");
    assert!(denied.contains("cannot set in annotations"), "{denied}");
    pods.create(&dry_run(), &pod("plain", json!({})))
        .await
        .unwrap();

    Installed {
        first_serving: data(&tls_secret, "tls.crt"),
        secrets,
        pods,
        ca_pem,
        bundle,
    }
}

/// 2. Serving rotation every few seconds while pods are created: no failure, no restart.
async fn serving_rotations_fail_nothing(installed: &Installed, operator: &Operator) {
    let Installed {
        secrets,
        first_serving,
        ..
    } = installed;
    let load = Load::start(secrets.clone().into_client());
    let mut certs = BTreeSet::from([first_serving.clone()]);
    let started = std::time::Instant::now();
    while certs.len() < 3 && started.elapsed() < Duration::from_secs(40) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        certs.insert(data(&secrets.get("webhook-tls").await.unwrap(), "tls.crt"));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (ok, failures) = load.stop().await;
    assert!(
        certs.len() >= 3,
        "at least two rotations, saw {} certificates",
        certs.len()
    );
    assert!(
        failures.is_empty(),
        "{} failed of {}: {:?}",
        failures.len(),
        ok + failures.len(),
        &failures[..failures.len().min(3)]
    );
    assert!(ok > 10, "the load ran: {ok}");
    let metrics = operator.metrics().await;
    assert!(
        metrics.contains("koord_webhook_certificate_rotations_total{certificate=\"serving\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "koord_webhook_certificate_expiration_timestamp_seconds{certificate=\"serving\"}"
        ),
        "{metrics}"
    );
}

/// 3. Drift: a blanked caBundle comes back; so do a hand-edited failurePolicy and timeout, each
///    named in an Event about the configuration.
async fn drift_is_repaired_and_named(cluster: &Cluster, installed: &Installed) {
    let client = cluster.client.clone();
    let bundle = &installed.bundle;
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let blank = json!([
        {"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": ""},
        {"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"},
        {"op": "replace", "path": "/webhooks/0/timeoutSeconds", "value": 29},
    ]);
    let blank: json_patch::Patch = serde_json::from_value(blank).unwrap();
    mutating
        .patch(MUTATING, &PatchParams::default(), &Patch::<()>::Json(blank))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "the caBundle to be restored",
        || async {
            let b = bundles(&client).await;
            b.iter().all(|b| *b == bundle.as_bytes()).then_some(())
        },
    )
    .await;
    let entry = mutating.get(MUTATING).await.unwrap().webhooks.unwrap()[0].clone();
    assert_eq!(entry.failure_policy.as_deref(), Some("Fail"));
    assert_eq!(entry.timeout_seconds, Some(10));
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let repaired = eventually(
        Duration::from_secs(10),
        "a DriftRepaired Event about the mutating configuration",
        || async {
            events
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("DriftRepaired")
                        && e.involved_object.name.as_deref() == Some(MUTATING)
                })
        },
    )
    .await;
    let note = repaired.message.unwrap_or_default();
    assert_eq!(repaired.type_.as_deref(), Some("Warning"));
    assert!(
        note.contains(&format!("{} failurePolicy", entry.name))
            && note.contains(&format!("{} timeoutSeconds", entry.name)),
        "{note}"
    );
}

/// 4. webhook-tls deleted: recreated with the same CA; both deleted: a new CA, and readiness
///    returns.
async fn lost_secrets_are_recreated(cluster: &Cluster, installed: &Installed, operator: &Operator) {
    let client = cluster.client.clone();
    let Installed {
        secrets,
        pods,
        ca_pem,
        ..
    } = installed;
    secrets
        .delete("webhook-tls", &DeleteParams::default())
        .await
        .unwrap();
    let recreated = eventually(
        Duration::from_secs(15),
        "webhook-tls to be recreated",
        || async { secrets.get_opt("webhook-tls").await.unwrap() },
    )
    .await;
    assert_eq!(
        data(&recreated, "ca.crt").trim(),
        ca_pem.trim(),
        "same CA kept"
    );

    // Both deleted: a new CA, and readiness returns.
    secrets
        .delete("webhook-tls", &DeleteParams::default())
        .await
        .unwrap();
    secrets
        .delete("webhook-ca", &DeleteParams::default())
        .await
        .unwrap();
    let new_ca = eventually(Duration::from_secs(15), "a new CA", || async {
        let s = secrets.get_opt("webhook-ca").await.unwrap()?;
        let pem = data(&s, "ca.crt");
        (pem.trim() != ca_pem.trim()).then_some(pem)
    })
    .await;
    eventually(
        Duration::from_secs(20),
        "the new bundle everywhere and readiness",
        || async {
            let everywhere = bundles(&client)
                .await
                .iter()
                .all(|b| String::from_utf8_lossy(b).trim() == new_ca.trim());
            (everywhere && operator.readyz().await.0 == 200).then_some(())
        },
    )
    .await;
    pods.create(&dry_run(), &pod("after-new-ca", json!({})))
        .await
        .unwrap();
}

/// 5. A gate turned off removes its entries, and only those.
async fn a_gate_turned_off_removes_only_its_entries(cluster: &Cluster) {
    let client = cluster.client.clone();
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let entry_names = || async {
        validating
            .get(VALIDATING)
            .await
            .unwrap()
            .webhooks
            .unwrap_or_default()
            .into_iter()
            .map(|w| w.name)
            .collect::<Vec<String>>()
    };
    let mut expected = entry_names().await;
    assert!(
        expected.contains(&"vnode.koordinator.sh".to_owned()),
        "{expected:?}"
    );
    expected.retain(|name| name != "vnode.koordinator.sh");
    let operator = cluster.operator(
        "replica-b",
        &["--feature-gates", "NodeValidatingWebhook=false"],
    );
    eventually(Duration::from_secs(30), "vnode to be removed", || async {
        (entry_names().await == expected).then_some(())
    })
    .await;
    operator.wait_ready(Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_certificates_are_read_and_checked_never_written() {
    let cluster = Cluster::start().await;
    let (cp, client) = (&cluster.cp, cluster.client.clone());

    // What cert-manager would have made.
    let ca = authority::issue_ca(Duration::from_secs(3600)).unwrap();
    let serving =
        authority::issue_serving(&ca, &["127.0.0.1".into()], Duration::from_secs(3600)).unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "webhook-tls", "namespace": NS}, "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": serving.cert_pem, "tls.key": serving.key_pem, "ca.crt": ca.cert_pem}
    }))
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    let operator = cluster.operator("external", &["--cert-mode", "external"]);
    // The installed configurations carry no caBundle: not ready, and it says why (once the cache
    // has synced and the pair is loaded, which under load takes a moment after start).
    let reason = eventually(
        Duration::from_secs(60),
        "not ready because of the caBundle",
        || async {
            let (status, body) = operator.readyz().await;
            (status == 503 && body.contains("caBundle")).then_some(body)
        },
    )
    .await;
    assert!(reason.contains("certificate:"), "{reason}");

    // A bundle of another CA: still not ready, with the verification failure.
    let other = authority::issue_ca(Duration::from_secs(3600)).unwrap();
    let set_bundle = |pem: String| {
        let cp = &cp;
        move || {
            let b64 = base64_encode(pem.as_bytes());
            for (kind, name, count) in [
                ("mutatingwebhookconfiguration", MUTATING, 4),
                ("validatingwebhookconfiguration", VALIDATING, 5),
            ] {
                let ops: Vec<_> = (0..count).map(|i| json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": b64})).collect();
                cp.kubectl_ok(
                    &[
                        "patch",
                        kind,
                        name,
                        "--type=json",
                        "-p",
                        &serde_json::to_string(&ops).unwrap(),
                    ],
                    None,
                );
            }
        }
    };
    set_bundle(other.cert_pem.clone())();
    eventually(
        Duration::from_secs(20),
        "a verification failure",
        || async {
            let (status, body) = operator.readyz().await;
            (status == 503 && body.contains("does not verify")).then_some(())
        },
    )
    .await;
    set_bundle(ca.cert_pem.clone())();
    operator.wait_ready(Duration::from_secs(20)).await;

    // The Secret is as it was, written by nobody but us.
    let after = secrets.get("webhook-tls").await.unwrap();
    assert_eq!(data(&after, "tls.crt"), serving.cert_pem);
    assert!(secrets.get_opt("webhook-ca").await.unwrap().is_none());
    let managers: Vec<String> = after
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        !managers.iter().any(|m| m == "koord-webhook"),
        "{managers:?}"
    );
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The CA bundle of `webhook-tls` as a list of certificates (PEM blocks).
fn phase(secret: &Secret) -> String {
    secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("koord-webhook/ca-rotation-phase"))
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_ca_rotation_drops_nothing_and_resumes_after_a_restart() {
    let cluster = Cluster::start().await;
    let (cp, client) = (&cluster.cp, cluster.client.clone());
    let args = [
        "--ca-validity",
        "30s",
        "--renew-fraction",
        "0.5",
        "--ca-rotation-grace",
        "3s",
        "--ca-publish-settle",
        "2s",
    ];
    let operator = cluster.operator("rotating", &args);
    operator.wait_ready(Duration::from_secs(60)).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let first = bundle_certs(&secrets.get("webhook-tls").await.unwrap());
    assert_eq!(first.len(), 1);

    // Under load: the bundle goes old, old+new, new; every entry follows; nothing fails.
    let load = Load::start(client.clone());
    let saw_both = Arc::new(AtomicBool::new(false));
    let new_only = eventually(
        Duration::from_secs(60),
        "the old CA to leave the bundle",
        || {
            let secrets = secrets.clone();
            let first = first.clone();
            let saw = saw_both.clone();
            async move {
                let certs = bundle_certs(&secrets.get("webhook-tls").await.unwrap());
                if certs.len() == 2 && certs.contains(&first[0]) {
                    saw.store(true, Ordering::Relaxed);
                }
                let both_seen = saw.load(Ordering::Relaxed);
                (both_seen && certs.len() == 1 && certs[0] != first[0]).then_some(certs)
            }
        },
    )
    .await;
    let (ok, failures) = load.stop().await;
    assert!(
        failures.is_empty(),
        "{} failed of {}: {:?}",
        failures.len(),
        ok + failures.len(),
        &failures[..failures.len().min(3)]
    );
    assert!(ok > 10);
    // The configurations follow the Secret a moment later; on a slow machine the next rotation
    // may already have added a third CA beside the new one, so only ask: old gone, new present.
    eventually(
        Duration::from_secs(30),
        "every entry to trust the new CA and not the old",
        || {
            let client = client.clone();
            let (old, new) = (first[0].clone(), new_only[0].clone());
            async move {
                bundles(&client)
                    .await
                    .iter()
                    .all(|b| {
                        let pem = String::from_utf8_lossy(b);
                        pem.contains(new.trim()) && !pem.contains(old.trim())
                    })
                    .then_some(())
            }
        },
    )
    .await;
    let events = cp.kubectl_ok(
        &[
            "get",
            "events",
            "-n",
            NS,
            "-o",
            "jsonpath={.items[*].reason}",
        ],
        None,
    );
    assert!(
        events.contains("CARotationStarted") && events.contains("CARotationDone"),
        "{events}"
    );

    // The next rotation, interrupted by a restart mid-way, completes from the recorded phase.
    let ca_secrets = secrets.clone();
    eventually(
        Duration::from_secs(40),
        "the next rotation to start",
        || {
            let secrets = ca_secrets.clone();
            async move {
                let s = secrets.get("webhook-ca").await.unwrap();
                (phase(&s) != "Stable" && !phase(&s).is_empty()).then_some(())
            }
        },
    )
    .await;
    let mid = secrets.get("webhook-ca").await.unwrap();
    let mid_ca = data(&mid, "ca.crt");
    let old_ca = data(&mid, "previous-ca.crt");
    assert!(
        !old_ca.is_empty(),
        "a rotation under way keeps the previous CA"
    );
    drop(operator);
    let operator = cluster.operator("rotating-again", &args);
    eventually(
        Duration::from_secs(40),
        "the interrupted rotation to finish",
        || {
            let secrets = secrets.clone();
            let (mid_ca, old_ca) = (mid_ca.clone(), old_ca.clone());
            async move {
                // Finished: the old CA left the bundle and the new one stayed. (On a slow machine
                // the next rotation may already be publishing a third CA beside it.)
                let tls = secrets.get("webhook-tls").await.unwrap();
                let certs = bundle_certs(&tls);
                let ca = secrets.get("webhook-ca").await.unwrap();
                let done = !certs.contains(&old_ca.trim().to_owned())
                    && (certs.contains(&mid_ca.trim().to_owned())
                        || data(&ca, "previous-ca.crt").trim() == mid_ca.trim());
                done.then_some(())
            }
        },
    )
    .await;
    operator.wait_ready(Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_one_writer_and_a_handover() {
    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    let lease = [
        "--lease-duration",
        "4s",
        "--lease-renew-deadline",
        "1s",
        "--lease-retry-period",
        "500ms",
    ];
    let a = cluster.operator("replica-a", &lease);
    a.wait_ready(Duration::from_secs(60)).await;
    let b = cluster.operator("replica-b", &lease);
    b.wait_ready(Duration::from_secs(60)).await;

    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), NS);
    let holder = |l: k8s_openapi::api::coordination::v1::Lease| {
        l.spec.and_then(|s| s.holder_identity).unwrap_or_default()
    };
    assert_eq!(
        holder(leases.get("koord-webhook").await.unwrap()),
        "replica-a"
    );
    let (ma, mb) = (a.metrics().await, b.metrics().await);
    assert!(ma.contains("koord_webhook_leader 1"), "{ma}");
    assert!(mb.contains("koord_webhook_leader 0"), "{mb}");
    assert!(ma.contains("koord_webhook_cluster_writes_total{kind=\"secret\"}"));
    assert!(
        !mb.contains("koord_webhook_cluster_writes_total"),
        "the follower wrote: {mb}"
    );

    // The leader killed: the other takes over once the lease (4 s) has run out.
    drop(a);
    eventually(Duration::from_secs(8), "replica-b to lead", || async {
        (holder(leases.get("koord-webhook").await.unwrap()) == "replica-b").then_some(())
    })
    .await;
    // The new leader points the configurations at itself; the API server reaches it.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    eventually(
        Duration::from_secs(15),
        "admission through replica-b",
        || async {
            let denied = create_reserved_pod(&pods).await?;
            denied.contains("cannot set in annotations").then_some(())
        },
    )
    .await;
    assert!(b.metrics().await.contains("koord_webhook_leader 1"));
    b.wait_ready(Duration::from_secs(10)).await;

    // SIGTERM: the leader drains, releases the Lease and exits 0; a follower takes over at once.
    let c = cluster.operator("replica-c", &lease);
    c.wait_ready(Duration::from_secs(30)).await;
    let mut b = b;
    assert!(b.terminate().success(), "{}", b.log_text());
    assert!(b.log_text().contains("lease released"), "{}", b.log_text());
    eventually(Duration::from_secs(6), "replica-c to lead", || async {
        (holder(leases.get("koord-webhook").await.unwrap()) == "replica-c").then_some(())
    })
    .await;
}

/// A lost `webhook-ca`, one replaced by garbage, and a `webhook-tls` whose key is not its
/// certificate's: each repaired without a failed admission, a lost CA through the same stages as a
/// planned rotation (it once switched CA at once, before the new bundle was published).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_secrets_are_repaired_without_failed_admissions() {
    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    let operator = cluster.operator(
        "repairing",
        &["--ca-rotation-grace", "3s", "--ca-publish-settle", "2s"],
    );
    operator.wait_ready(Duration::from_secs(60)).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let load = Load::start(client.clone());
    let repairs = break_secrets_and_wait_for_repair(&client, &secrets).await;
    eprintln!("broken Secrets repaired: {repairs:?}");
    operator.wait_ready(Duration::from_secs(20)).await;

    let (ok, failures) = load.stop().await;
    eprintln!(
        "broken Secrets repaired: {ok} admissions succeeded, {} failed",
        failures.len()
    );
    assert!(ok > 10, "the load ran: {ok}");
    assert!(
        failures.is_empty(),
        "{} failed of {}: {:?}",
        failures.len(),
        ok + failures.len(),
        &failures[..failures.len().min(3)]
    );
}

/// The narrowed entries through a real kube-apiserver: it accepts the expressions (it compiles and
/// checks them on every write), and calls the webhook for what they select and only that, counted
/// by the webhook's own request counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrowed_entries_are_accepted_and_skip_what_they_say() {
    use k8s_openapi::api::core::v1::Node;
    use koord_webhook::apis::ElasticQuota;

    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    let operator = cluster.operator("replica-a", &[]);
    operator.wait_ready(Duration::from_secs(60)).await;

    // Every write of the operator is koord-webhook's in managedFields (the Lease's creates and
    // replaces named no field manager before).
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), NS)
        .get("koord-webhook")
        .await
        .unwrap();
    let managers: Vec<String> = lease
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|f| f.manager.clone())
        .collect();
    assert_eq!(managers, ["koord-webhook"], "the Lease's writers");

    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let m = mutating.get(MUTATING).await.unwrap();
    let v = validating.get(VALIDATING).await.unwrap();
    let conditions = |name: &str| -> Option<Vec<String>> {
        let m_entries = m
            .webhooks
            .iter()
            .flatten()
            .map(|w| (&w.name, &w.match_conditions));
        let v_entries = v
            .webhooks
            .iter()
            .flatten()
            .map(|w| (&w.name, &w.match_conditions));
        m_entries
            .chain(v_entries)
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, c)| c.iter().flatten().map(|c| c.name.clone()).collect())
    };
    assert_eq!(conditions("mpod-update.koordinator.sh"), None);
    assert_eq!(
        conditions("mnode-status.koordinator.sh"),
        Some(vec!["koord-amplified-node".to_owned()])
    );
    assert_eq!(
        conditions("velasticquota.koordinator.sh"),
        Some(vec!["koord-quota-tree-change".to_owned()])
    );
    let nodes: Api<Node> = Api::all(client.clone());

    // A plain node's status updates are not sent; an amplified node's are, and are amplified.
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "narrow-n1"}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let status = |cpu: &str| {
        json!({"status": {"capacity": {"cpu": cpu, "memory": "8Gi"},
                          "allocatable": {"cpu": cpu, "memory": "8Gi"}}})
    };
    let count = |path: &'static str| {
        let operator = &operator;
        async move { support::requests_to(&operator.metrics().await, path) }
    };
    let before = count("/mutate-node-status").await;
    nodes
        .patch_status(
            "narrow-n1",
            &PatchParams::default(),
            &Patch::Merge(status("4")),
        )
        .await
        .unwrap();
    assert_eq!(
        count("/mutate-node-status").await,
        before,
        "plain node: skipped"
    );
    let validate_before = count("/validate-node").await;
    nodes
        .patch(
            "narrow-n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "node.koordinator.sh/resource-amplification-ratio": "{\"cpu\":2}"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        count("/validate-node").await,
        validate_before + 1,
        "new ratios: validated"
    );
    let amplified = nodes
        .patch_status(
            "narrow-n1",
            &PatchParams::default(),
            &Patch::Merge(status("3")),
        )
        .await
        .unwrap();
    assert_eq!(
        count("/mutate-node-status").await,
        before + 1,
        "amplified node: sent"
    );
    let allocatable = amplified.status.unwrap().allocatable.unwrap();
    assert_eq!(allocatable["cpu"].0, "6", "the ratio applied");

    // A quota's child-request write is not sent to the tree rules; a spec change is.
    let quotas: Api<ElasticQuota> = Api::namespaced(client.clone(), "default");
    let quota: ElasticQuota = serde_json::from_value(json!({
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
        "metadata": {"name": "narrow-q", "namespace": "default"},
        "spec": {"min": {"cpu": "1"}, "max": {"cpu": "4", "memory": "8Gi"}}}))
    .unwrap();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    let path = "/validate-scheduling-sigs-k8s-io-v1alpha1-elasticquota";
    let before = count(path).await;
    let merge = |patch: serde_json::Value| {
        let quotas = quotas.clone();
        async move {
            quotas
                .patch("narrow-q", &PatchParams::default(), &Patch::Merge(patch))
                .await
        }
    };
    merge(json!({"metadata": {"annotations": {
        "quota.scheduling.koordinator.sh/child-request": "{\"cpu\":\"1\"}"}}}))
    .await
    .unwrap();
    assert_eq!(count(path).await, before, "child-request write: skipped");
    merge(json!({"spec": {"max": {"cpu": "5"}}})).await.unwrap();
    assert_eq!(count(path).await, before + 1, "spec change: sent");
    let err = merge(json!({"spec": {"min": {"cpu": "9"}}}))
        .await
        .expect_err("min above max is denied: the rules still run where they act")
        .to_string();
    assert!(err.contains("min 9 > max 5"), "{err}");
}

/// The pod entries follow the cluster: narrowed to Koordinator's pods once the hold has passed, a
/// new ClusterColocationProfile or parent quota widens them before it is stored (so a pod created
/// right after is sent), and the leader narrows them again to include it.
#[tokio::test]
async fn narrowed_pod_entries_widen_before_a_profile_or_parent_quota_is_stored() {
    use k8s_openapi::api::core::v1::Namespace;
    use koord_webhook::apis::{ClusterColocationProfile, ElasticQuota};

    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    let operator = cluster.operator("replica-a", &["--narrow-hold=2s"]);
    operator.wait_ready(Duration::from_secs(60)).await;

    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    // The expression of a pod entry, `None` while it is sent every request.
    let expression = |name: &'static str| {
        let (mutating, validating) = (mutating.clone(), validating.clone());
        async move {
            let m = mutating.get(MUTATING).await.unwrap();
            let v = validating.get(VALIDATING).await.unwrap();
            let conditions = m
                .webhooks
                .into_iter()
                .flatten()
                .map(|w| (w.name, w.match_conditions))
                .chain(
                    v.webhooks
                        .into_iter()
                        .flatten()
                        .map(|w| (w.name, w.match_conditions)),
                )
                .find(|(n, _)| n == name)
                .and_then(|(_, c)| c)
                .unwrap_or_default();
            conditions.first().map(|c| c.expression.clone())
        }
    };
    let narrowed = |name: &'static str, containing: &'static str| {
        let expression = &expression;
        async move { expression(name).await.filter(|e| e.contains(containing)) }
    };
    eventually(Duration::from_secs(30), "mpod-create narrowed", || {
        narrowed("mpod-create.koordinator.sh", "koordinator.sh")
    })
    .await;
    eventually(Duration::from_secs(30), "vpod narrowed", || {
        narrowed("vpod.koordinator.sh", "koordinator.sh")
    })
    .await;

    let count = |path: &'static str| {
        let operator = &operator;
        async move { support::requests_to(&operator.metrics().await, path) }
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = |name: &str, labels: serde_json::Value| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
        .unwrap()
    };
    let (mutate_before, validate_before) =
        (count("/mutate-pod").await, count("/validate-pod").await);
    pods.create(
        &PostParams::default(),
        &pod("plain-1", json!({"app": "web"})),
    )
    .await
    .unwrap();
    assert_eq!(
        count("/mutate-pod").await,
        mutate_before,
        "a plain pod: not mutated"
    );
    assert_eq!(
        count("/validate-pod").await,
        validate_before,
        "a plain pod: not validated"
    );
    // A Koordinator pod is sent both.
    pods.create(
        &PostParams::default(),
        &pod("marked-1", json!({"koordinator.sh/qosClass": "LS"})),
    )
    .await
    .unwrap();
    assert_eq!(count("/mutate-pod").await, mutate_before + 1);
    assert_eq!(count("/validate-pod").await, validate_before + 1);

    // A profile for app=web: the first such pod created after the profile is stored is mutated.
    let profiles: Api<ClusterColocationProfile> = Api::all(client.clone());
    let profile: ClusterColocationProfile = serde_json::from_value(json!({
        "apiVersion": "config.koordinator.sh/v1alpha1", "kind": "ClusterColocationProfile",
        "metadata": {"name": "narrow-web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "labels": {"profiled": "yes"}}}))
    .unwrap();
    profiles
        .create(&PostParams::default(), &profile)
        .await
        .unwrap();
    let created = pods
        .create(&PostParams::default(), &pod("web-1", json!({"app": "web"})))
        .await
        .unwrap();
    let labels = created.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("profiled").map(String::as_str),
        Some("yes"),
        "created right after the profile: mutated ({labels:?})"
    );
    // Narrowed again, to the profile's selector: app=web sent, app=db not.
    eventually(
        Duration::from_secs(30),
        "mpod-create narrowed to the profile",
        || narrowed("mpod-create.koordinator.sh", "'web'"),
    )
    .await;
    let before = count("/mutate-pod").await;
    let web = pods
        .create(&PostParams::default(), &pod("web-2", json!({"app": "web"})))
        .await
        .unwrap();
    assert_eq!(
        web.metadata
            .labels
            .unwrap_or_default()
            .get("profiled")
            .map(String::as_str),
        Some("yes")
    );
    pods.create(&PostParams::default(), &pod("db-1", json!({"app": "db"})))
        .await
        .unwrap();
    assert_eq!(count("/mutate-pod").await, before + 1, "only app=web sent");

    // A parent quota binding a namespace: a plain pod there is sent from the moment it is stored.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "narrow-team"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let quotas: Api<ElasticQuota> = Api::namespaced(client.clone(), "default");
    let parent: ElasticQuota = serde_json::from_value(json!({
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
        "metadata": {"name": "narrow-parent", "namespace": "default",
            "labels": {"quota.scheduling.koordinator.sh/is-parent": "true"},
            "annotations": {"quota.scheduling.koordinator.sh/namespaces": "[\"narrow-team\"]"}},
        "spec": {"min": {"cpu": "1"}, "max": {"cpu": "4", "memory": "8Gi"}}}))
    .unwrap();
    quotas
        .create(&PostParams::default(), &parent)
        .await
        .unwrap();
    let team: Api<Pod> = Api::namespaced(client.clone(), "narrow-team");
    let before = count("/validate-pod").await;
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let _ = team.create(&dry_run, &pod("team-1", json!({}))).await;
    assert_eq!(
        count("/validate-pod").await,
        before + 1,
        "a plain pod of the parent's namespace, right after the quota: sent"
    );
    let err = eventually(Duration::from_secs(30), "the pod denied", || {
        let team = team.clone();
        let pod = pod("team-2", json!({}));
        let dry_run = dry_run.clone();
        async move { team.create(&dry_run, &pod).await.err() }
    })
    .await;
    assert!(err.to_string().contains("parentQuotaGroup"), "{err}");
    eventually(
        Duration::from_secs(30),
        "vpod narrowed to the parent's namespaces",
        || narrowed("vpod.koordinator.sh", "'narrow-team'"),
    )
    .await;
    let before = count("/validate-pod").await;
    pods.create(&dry_run, &pod("plain-2", json!({})))
        .await
        .unwrap();
    assert_eq!(
        count("/validate-pod").await,
        before,
        "other namespaces: skipped"
    );
    let _ = team.create(&dry_run, &pod("team-3", json!({}))).await;
    assert_eq!(
        count("/validate-pod").await,
        before + 1,
        "the parent's namespace: sent"
    );
}

//! The operator's watches through a real kube-apiserver: an object that does not decode is left
//! out (counted, named in an Event) while the rest of its kind syncs; values of Koordinator's
//! string enums this version does not know are read; only the ConfigMaps the rules read are held.

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use koord_webhook::names::{MUTATING_CONFIGURATION, VALIDATING_CONFIGURATION};
use kube::api::{Api, ListParams};

use crate::support::operator::{Cluster, eventually};

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
    let quotas = r#"koord_webhook_cache_objects{kind="ElasticQuota"} 1"#;
    eventually(Duration::from_secs(20), quotas, || async {
        operator.metrics().await.contains(quotas).then_some(())
    })
    .await;

    // The watches break (and relist when their version is gone); the cache follows the cluster
    // afterwards and the replica stays ready (it answers from the cache it has).
    cp.restart_apiserver();
    cp.kubectl_ok(&["delete", "elasticquota", "slim", "-n", "default"], None);
    let gone = r#"koord_webhook_cache_objects{kind="ElasticQuota"} 0"#;
    eventually(Duration::from_secs(30), gone, || async {
        operator.metrics().await.contains(gone).then_some(())
    })
    .await;
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

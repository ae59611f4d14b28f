//! koord-manager's CA taken over through a real kube-apiserver, once per installation: on a first
//! start the operator (with the RBAC of `manifests/`) signs with the CA of koord-manager's Secret
//! and records it; when both of its Secrets are deleted later (what an operator does after a key
//! leak), it issues a new CA instead of taking the same one over again.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use koord_webhook::names::{CA_ADOPTION_RECORD, KOORDINATOR_CA_SECRET};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use support::certs::{bundles, data};
use support::operator::{Cluster, eventually};

const NS: &str = "koordinator-system";

fn fixture(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/koord-manager-ca/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn koord_managers_ca_is_taken_over_once_per_installation() {
    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let theirs = fixture("ca-cert.pem");
    let koordinator: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": KOORDINATOR_CA_SECRET, "namespace": NS},
        "stringData": {"ca-cert.pem": theirs, "ca-key.pem": fixture("ca-key.pem")}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &koordinator)
        .await
        .unwrap();

    // First start: koord-manager's CA becomes ours, recorded before it is written.
    let operator = cluster.operator("replica-a", &[]);
    operator.wait_ready(Duration::from_secs(60)).await;
    let ca = data(&secrets.get("webhook-ca").await.unwrap(), "ca.crt");
    assert_eq!(ca.trim(), theirs.trim(), "koord-manager's CA taken over");
    let records: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let record = records.get(CA_ADOPTION_RECORD).await.unwrap();
    let recorded = record.data.unwrap_or_default();
    assert_eq!(
        recorded.get("secret").map(String::as_str),
        Some(KOORDINATOR_CA_SECRET)
    );
    assert!(recorded.contains_key("adoptedAt"), "{recorded:?}");

    // Both Secrets deleted (a leaked key, say): a new CA, not koord-manager's again, published.
    for name in ["webhook-tls", "webhook-ca"] {
        secrets
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    let new_ca = eventually(Duration::from_secs(20), "a new CA", || async {
        let pem = data(&secrets.get_opt("webhook-ca").await.unwrap()?, "ca.crt");
        (pem.trim() != theirs.trim()).then_some(pem)
    })
    .await;
    // Published in every entry: alone, or (when the operator re-issued the serving pair between
    // the two deletions, so a pair the API servers trust was still in place) beside that trust
    // until the staged rotation drops it, which takes the publish settle and more on a slow machine.
    eventually(Duration::from_secs(20), "the new CA published", || async {
        bundles(&client)
            .await
            .iter()
            .all(|b| String::from_utf8_lossy(b).contains(new_ca.trim()))
            .then_some(())
    })
    .await;
    // The Event says why and how to allow it again. Written in the pass that issued the new CA;
    // on a loaded machine (the full integration run: eight control planes on two cores) its write
    // has taken longer than 10 s once.
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let spent = ListParams::default().fields("reason=CAAdoptionSpent");
    let note = eventually(
        Duration::from_secs(30),
        "a CAAdoptionSpent Event",
        || async {
            let list = events.list(&spent).await.unwrap();
            list.items.into_iter().find_map(|e| e.note)
        },
    )
    .await;
    assert!(note.contains("delete that ConfigMap"), "{note}");
}

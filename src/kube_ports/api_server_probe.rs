//! The replica's side of the API-server probe (`admission/elastic_quota/ledger/probe.rs`): a
//! dry-run server-side apply of the probe ElasticQuota in the operator's namespace, carrying a
//! fresh token, so that the API server sends the validating webhook a review only it can send and
//! whichever replica answers learns the API server's address. Nothing is stored. Each probe goes
//! over a new connection, so that in a cluster of several API servers behind one address each is
//! reached in time. Probes follow each other closely at start (the webhook configuration may not
//! trust the replicas' CA yet), then every [`EVERY`].

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};

use crate::admission::elastic_quota::ledger::probe::{PROBE_ANNOTATION, PROBE_NAME, fresh_token};
use crate::admission::ports::ProbeSecrets;
use crate::apis::ElasticQuota;

/// Between probes once started.
const EVERY: Duration = Duration::from_secs(300);
/// Between probes at start, [`AT_START`] times.
const AT_START_EVERY: Duration = Duration::from_secs(10);
const AT_START: u32 = 12;
/// The field manager the dry runs name.
const MANAGER: &str = "koord-webhook-probe";

/// Probes for as long as the replica runs.
pub async fn run(config: kube::Config, secrets: Arc<dyn ProbeSecrets>) {
    let mut sent = 0u32;
    let mut answered = 0u32;
    loop {
        let pause = if sent < AT_START {
            AT_START_EVERY
        } else {
            EVERY
        };
        tokio::time::sleep(pause).await;
        let Some(secret) = secrets.current() else {
            continue;
        };
        sent += 1;
        match probe(&config, &fresh_token(&secret)).await {
            Ok(()) => {
                answered += 1;
                if answered == 1 {
                    tracing::info!(
                        "API-server probe answered; the replica that received it knows the API server's address"
                    );
                }
            }
            // Expected while the webhook configuration is not in place, or when another webhook
            // refuses the dry run (the review reached this one before, or never did).
            Err(e) if sent == AT_START && answered == 0 => tracing::warn!(
                error = %e,
                "no API-server probe answered yet; ElasticQuota changes from callers nothing is known of are still recorded (docs/admission.md)"
            ),
            Err(e) => tracing::debug!(error = %e, "API-server probe failed"),
        }
    }
}

/// One probe over a new connection.
async fn probe(config: &kube::Config, token: &str) -> Result<(), kube::Error> {
    let client = kube::Client::try_from(config.clone())?;
    let api: Api<ElasticQuota> = Api::namespaced(client, crate::names::namespace());
    let quota = serde_json::json!({
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "ElasticQuota",
        "metadata": {
            "name": PROBE_NAME,
            "namespace": crate::names::namespace(),
            "annotations": {PROBE_ANNOTATION: token},
        },
        "spec": {},
    });
    let params = PatchParams::apply(MANAGER).dry_run();
    api.patch(PROBE_NAME, &params, &Patch::Apply(&quota))
        .await
        .map(|_| ())
}

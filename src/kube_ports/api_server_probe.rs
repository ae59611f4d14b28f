//! The replica's side of the API-server probe (`admission/elastic_quota/ledger/probe.rs`): a
//! dry-run server-side apply of the probe ElasticQuota in the operator's namespace, carrying a
//! fresh token; the replica that answers the API server's review (this one or another) names the
//! address the review came from in a warning, which the API server hands back here; this replica
//! checks it and writes the address into the ledger's record. Nothing is stored. Each probe goes
//! over a new connection, so that in a cluster of several API servers behind one address each is
//! reached in time. Probes follow each other closely at start (the webhook configuration may not
//! trust the replicas' CA yet), then every [`EVERY`], each renewing the proof it gives, and within
//! [`NUDGED_EVERY`] of a quota change from a caller no proof names (the ledger wakes the prober).

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::core::Resource;

use crate::admission::elastic_quota::ledger::probe::{
    self, Answered, PROBE_ANNOTATION, PROBE_NAME, answered, fresh_token,
};
use crate::admission::ports::{LedgerStore, ProbeSecrets};
use crate::apis::ElasticQuota;
use crate::metrics::operator::ProbeLabels;

/// Between probes once started (a proof lasts `probe::PROOF_TTL`).
const EVERY: Duration = Duration::from_secs(120);
/// Before the first probe: the serving pair and the webhook configuration are usually in place.
const FIRST_AFTER: Duration = Duration::from_secs(2);
/// Between probes at start, [`AT_START`] times (two minutes).
const AT_START_EVERY: Duration = Duration::from_secs(5);
const AT_START: u32 = 24;
/// Probes woken by a change of a caller no proof names come at most this often.
const NUDGED_EVERY: Duration = Duration::from_secs(5);
/// How long one probe may take (the API server calls the webhook within its 10 s timeout).
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);
/// The field manager the dry runs name.
const MANAGER: &str = "koord-webhook-probe";

impl ProbeSecrets for crate::tls::CertResolver {
    fn current(&self) -> Option<crate::tls::ProbeSecret> {
        self.probe_secret()
    }
}

/// What one probe came to.
#[derive(Debug, thiserror::Error)]
enum ProbeFailure {
    #[error("the API server did not answer: {0}")]
    Request(#[from] kube::Error),
    #[error("cannot build the request: {0}")]
    Build(String),
    #[error("no replica's answer in the API server's response (HTTP {0})")]
    NoAnswer(u16),
    #[error("the API server did not answer within {PROBE_TIMEOUT:?}")]
    Timeout,
    #[error("cannot write the proof into the ledger's record: {0}")]
    Publish(String),
    #[error(
        "the probe was answered from several addresses {0:?}: something the API server sent it to replayed it; nothing proven"
    )]
    Several(Vec<std::net::IpAddr>),
}

/// Probes for as long as the replica runs.
pub async fn run(
    config: kube::Config,
    secrets: Arc<dyn ProbeSecrets>,
    record: Arc<dyn LedgerStore>,
    nudge: Arc<tokio::sync::Notify>,
    metrics: crate::metrics::Metrics,
) {
    let mut sent = 0u32;
    let mut proven = 0u32;
    loop {
        let pause = match sent {
            0 => FIRST_AFTER,
            n if n < AT_START => AT_START_EVERY,
            _ => EVERY,
        };
        let last = tokio::time::Instant::now();
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            // A change of a caller no proof names: the API server calling from a new address?
            _ = nudge.notified() => tokio::time::sleep_until(last + NUDGED_EVERY).await,
        }
        let Some(secret) = secrets.current() else {
            continue;
        };
        sent += 1;
        let outcome = async {
            let token = fresh_token(&secret);
            let (status, warnings) =
                tokio::time::timeout(PROBE_TIMEOUT, probe_once(&config, &token))
                    .await
                    .map_err(|_| ProbeFailure::Timeout)??;
            let caller = match answered(&secret, &token, &warnings) {
                Answered::By(caller) => caller,
                Answered::Nobody => return Err(ProbeFailure::NoAnswer(status)),
                Answered::Several(by) => return Err(ProbeFailure::Several(by)),
            };
            probe::publish(record.as_ref(), &caller.to_string(), probe::now())
                .await
                .map_err(|e| ProbeFailure::Publish(e.to_string()))?;
            Ok::<_, ProbeFailure>(caller)
        }
        .await;
        let counted = match &outcome {
            Ok(_) => "proven",
            Err(ProbeFailure::Publish(_)) => "unpublished",
            Err(ProbeFailure::Several(_)) => "ambiguous",
            Err(_) => "unanswered",
        };
        metrics
            .operator
            .api_server_probes
            .get_or_create(&ProbeLabels { outcome: counted })
            .inc();
        match outcome {
            Ok(caller) => {
                proven += 1;
                if proven == 1 {
                    tracing::info!(%caller, "the API server calls from this address (its answer to a probe); written into the ElasticQuota ledger's record");
                } else {
                    tracing::debug!(%caller, "API-server probe answered");
                }
            }
            // Expected while the webhook configuration is not in place yet.
            Err(e) if sent == AT_START && proven == 0 => tracing::warn!(
                error = %e,
                "no API-server probe answered in two minutes; ElasticQuota changes from every caller are recorded until one is (docs/admission.md)"
            ),
            Err(e @ ProbeFailure::Several(_)) => tracing::warn!(error = %e, "API-server probe"),
            Err(e) => tracing::debug!(error = %e, "API-server probe failed"),
        }
    }
}

/// One probe over a new connection: the status and warnings of the API server's response.
async fn probe_once(
    config: &kube::Config,
    token: &str,
) -> Result<(u16, Vec<String>), ProbeFailure> {
    let client = kube::Client::try_from(config.clone())?;
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
    let url = ElasticQuota::url_path(&(), Some(crate::names::namespace()));
    let request = kube::core::Request::new(url)
        .patch(PROBE_NAME, &params, &Patch::Apply(&quota))
        .map_err(|e| ProbeFailure::Build(e.to_string()))?;
    let response = client.send(request.map(kube::client::Body::from)).await?;
    // A later webhook may refuse the dry run: the answer is in the warnings all the same.
    let warnings: Vec<String> = response
        .headers()
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect();
    Ok((response.status().as_u16(), warnings))
}

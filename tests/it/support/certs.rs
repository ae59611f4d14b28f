//! Certificates as the cluster holds them: the Secrets' PEM data, every webhook entry's caBundle,
//! and the wait for a staged rotation to a new CA. Shared by the control-plane and real-node tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use super::operator::eventually;

pub const MUTATING: &str = "koordinator-mutating-webhook-configuration";
pub const VALIDATING: &str = "koordinator-validating-webhook-configuration";

/// A Secret's value at `key`, as text.
pub fn data(secret: &Secret, key: &str) -> String {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .unwrap_or_default()
}

/// Every entry's caBundle of both configurations.
pub async fn bundles(client: &kube::Client) -> Vec<Vec<u8>> {
    let m: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let v: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mut out = Vec::new();
    for w in m.get(MUTATING).await.unwrap().webhooks.unwrap_or_default() {
        out.push(w.client_config.ca_bundle.map(|b| b.0).unwrap_or_default());
    }
    for w in v
        .get(VALIDATING)
        .await
        .unwrap()
        .webhooks
        .unwrap_or_default()
    {
        out.push(w.client_config.ca_bundle.map(|b| b.0).unwrap_or_default());
    }
    out
}

/// The certificates of a Secret's `ca.crt`, each trimmed.
pub fn bundle_certs(secret: &Secret) -> Vec<String> {
    data(secret, "ca.crt")
        .split_inclusive("-----END CERTIFICATE-----")
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty())
        .collect()
}

/// Waits until the CA in `webhook-ca` is no longer `old` and a staged rotation to the new one has
/// finished: on the way, the bundle carried the old trust and the new CA together; at the end it
/// holds the new CA only, on every webhook entry.
pub async fn staged_to_a_new_ca(client: &kube::Client, secrets: &Api<Secret>, old: &str) -> String {
    let saw_both = Arc::new(AtomicBool::new(false));
    let new_ca = eventually(
        Duration::from_secs(60),
        "a new CA, staged, then alone in the bundle",
        || {
            let (secrets, old, saw) = (secrets.clone(), old.to_owned(), saw_both.clone());
            async move {
                let ca = data(&secrets.get_opt("webhook-ca").await.ok()??, "ca.crt");
                let certs = bundle_certs(&secrets.get("webhook-tls").await.ok()?);
                if certs.len() == 2 && certs.contains(&old.trim().to_owned()) {
                    saw.store(true, Ordering::Relaxed);
                }
                let done = saw.load(Ordering::Relaxed)
                    && ca.trim() != old.trim()
                    && certs == vec![ca.trim().to_owned()];
                done.then_some(ca)
            }
        },
    )
    .await;
    eventually(
        Duration::from_secs(30),
        "every entry to carry the new CA alone",
        || async {
            bundles(client)
                .await
                .iter()
                .all(|b| String::from_utf8_lossy(b).trim() == new_ca.trim())
                .then_some(())
        },
    )
    .await;
    new_ca
}

/// The time each repair took in [`break_secrets_and_wait_for_repair`].
pub struct Repairs {
    pub ca_deleted: Duration,
    pub ca_garbage: Duration,
    pub foreign_tls_key: Duration,
    pub tls_deleted: Duration,
    /// The CA in place at the end (PEM).
    pub ca: String,
}

impl std::fmt::Debug for Repairs {
    // The durations only: the CA's PEM would drown them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repairs")
            .field("ca_deleted", &self.ca_deleted)
            .field("ca_garbage", &self.ca_garbage)
            .field("foreign_tls_key", &self.foreign_tls_key)
            .field("tls_deleted", &self.tls_deleted)
            .finish_non_exhaustive()
    }
}

/// Breaks the Secrets one after the other and waits for each repair: `webhook-ca` deleted, then
/// replaced by garbage (each time a new CA, staged), then `webhook-tls` given a key that is not its
/// certificate's (a matching pair again, from the same CA), then `webhook-tls` deleted (written again
/// at once: the deletion wakes the leader, whose timer may be a minute away; the soak found it
/// waiting for the timer).
pub async fn break_secrets_and_wait_for_repair(
    client: &kube::Client,
    secrets: &Api<Secret>,
) -> Repairs {
    use kube::api::{DeleteParams, Patch, PatchParams};
    use std::time::Instant;
    let first = data(&secrets.get("webhook-ca").await.unwrap(), "ca.crt");

    let started = Instant::now();
    secrets
        .delete("webhook-ca", &DeleteParams::default())
        .await
        .unwrap();
    let second = staged_to_a_new_ca(client, secrets, &first).await;
    let ca_deleted = started.elapsed();

    let started = Instant::now();
    let garbage = serde_json::json!({"data": {"ca.crt": "anVuaw==", "ca.key": "anVuaw=="}});
    secrets
        .patch(
            "webhook-ca",
            &PatchParams::default(),
            &Patch::Merge(&garbage),
        )
        .await
        .unwrap();
    let third = staged_to_a_new_ca(client, secrets, &second).await;
    let ca_garbage = started.elapsed();

    let started = Instant::now();
    let stranger = koord_webhook::certs::authority::issue_ca(Duration::from_secs(3600)).unwrap();
    let bad_key = serde_json::json!({"stringData": {"tls.key": stranger.key_pem}});
    secrets
        .patch(
            "webhook-tls",
            &PatchParams::default(),
            &Patch::Merge(&bad_key),
        )
        .await
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "webhook-tls to hold a matching pair again, from the same CA",
        || async {
            let tls = secrets.get("webhook-tls").await.ok()?;
            let (cert, key) = (data(&tls, "tls.crt"), data(&tls, "tls.key"));
            (koord_webhook::certs::authority::key_matches(cert.as_bytes(), &key)
                && bundle_certs(&tls) == vec![third.trim().to_owned()])
            .then_some(())
        },
    )
    .await;
    let foreign_tls_key = started.elapsed();

    let started = Instant::now();
    secrets
        .delete("webhook-tls", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "webhook-tls written again after its deletion, from the same CA",
        || async {
            let tls = secrets.get("webhook-tls").await.ok()?;
            (bundle_certs(&tls) == vec![third.trim().to_owned()]).then_some(())
        },
    )
    .await;
    Repairs {
        ca_deleted,
        ca_garbage,
        foreign_tls_key,
        tls_deleted: started.elapsed(),
        ca: third,
    }
}

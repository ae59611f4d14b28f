//! `status --check-admission NAMESPACE`: an end-to-end probe through the API server, as `cmctl
//! check api` does for cert-manager. A dry-run create of a pod carrying the reserve-pod annotation,
//! which `/validate-pod` refuses with Koordinator's message: that refusal proves the API server
//! called a replica, trusted its certificate and read its answer. Nothing is stored.

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, PostParams};

/// The refusal that shows the webhook answered (ForbiddenReservePodAnnotation).
const REFUSAL: &str = "cannot set in annotations";

/// A problem when admission does not answer as it should, `None` when it does.
pub async fn check(client: &Client, namespace: &str) -> Option<String> {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {
            "generateName": "koord-webhook-check-",
            "annotations": {"scheduling.koordinator.sh/reserve-pod": "true"}
        },
        "spec": {"containers": [{"name": "check", "image": "koord-webhook-check"}]}
    }))
    .ok()?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&dry_run, &pod)
        .await
    {
        Err(kube::Error::Api(status)) if status.message.contains(REFUSAL) => None,
        Err(e) => Some(format!(
            "admission check in {namespace}: a dry-run pod with the reserve-pod annotation got {e} instead of koord-webhook's refusal"
        )),
        Ok(_) => Some(format!(
            "admission check in {namespace}: a dry-run pod with the reserve-pod annotation was admitted: koord-webhook was not called (or PodValidatingWebhook is off)"
        )),
    }
}

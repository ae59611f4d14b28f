//! The webhook configurations as the API server has them: what `status` and the rotation steps read.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::Client;
use kube::api::Api;

use super::configuration::Configuration;
use crate::names::Mode;

/// One entry as the API server has it.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishedEntry {
    pub name: String,
    pub failure_policy: String,
    pub ca_bundle: Vec<u8>,
    /// Called through a Service (else a URL).
    pub via_service: bool,
    /// The names of its matchConditions.
    pub match_conditions: Vec<String>,
}

async fn published<C: Configuration>(
    client: &Client,
    name: &str,
) -> kube::Result<Option<Vec<PublishedEntry>>> {
    let api: Api<C> = Api::all(client.clone());
    Ok(api.get_opt(name).await?.map(|config| {
        config
            .entries()
            .iter()
            .map(|e| PublishedEntry {
                name: e.name.to_owned(),
                failure_policy: e.failure_policy.unwrap_or_default().to_owned(),
                ca_bundle: e
                    .client_config
                    .ca_bundle
                    .as_ref()
                    .map(|b| b.0.clone())
                    .unwrap_or_default(),
                via_service: e.client_config.service.is_some(),
                match_conditions: e
                    .match_conditions
                    .into_iter()
                    .flatten()
                    .map(|c| c.name.clone())
                    .collect(),
            })
            .collect()
    }))
}

/// The entries of the install's configurations by configuration name; `None` for a missing one.
pub async fn published_entries(
    client: &Client,
    mode: Mode,
) -> kube::Result<Vec<(&'static str, Option<Vec<PublishedEntry>>)>> {
    let mut all = Vec::new();
    if let Some(name) = mode.mutating_configuration() {
        let entries = published::<MutatingWebhookConfiguration>(client, name).await?;
        all.push((name, entries));
    }
    let name = mode.validating_configuration();
    let entries = published::<ValidatingWebhookConfiguration>(client, name).await?;
    all.push((name, entries));
    Ok(all)
}

/// The bundle the API server uses for every entry of both configurations: `Ok(Err(why))` when they
/// do not all carry the same non-empty one; `Err` when they could not be read.
pub async fn published_bundle(
    client: &Client,
    mode: Mode,
) -> kube::Result<Result<Vec<u8>, String>> {
    let mut all = Vec::new();
    for (name, entries) in published_entries(client, mode).await? {
        match entries {
            None => return Ok(Err(format!("{name} does not exist"))),
            Some(entries) => all.extend(entries.into_iter().map(|e| e.ca_bundle)),
        }
    }
    let first = all.first().cloned().unwrap_or_default();
    if first.is_empty() {
        return Ok(Err(
            "the caBundle of the webhook entries is empty".to_owned()
        ));
    }
    if all.iter().any(|b| *b != first) {
        return Ok(Err(
            "the webhook entries carry different caBundles".to_owned()
        ));
    }
    Ok(Ok(first))
}

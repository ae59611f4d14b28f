//! The webhook configurations as the API server has them: what `status` and the rotation steps read.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::Client;
use kube::api::{Api, GetParams};

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

/// The install's configuration of kind `C` (`None` when an install of `mode` has none) by name,
/// with its entries (`None` when it is missing).
async fn published<C: Configuration>(
    client: &Client,
    mode: Mode,
) -> kube::Result<Option<(&'static str, Option<Vec<PublishedEntry>>)>> {
    let Some(name) = C::name(mode) else {
        return Ok(None);
    };
    let api: Api<C> = Api::all(client.clone());
    let entries = api.get_opt(name).await?.map(|config| {
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
    });
    Ok(Some((name, entries)))
}

/// The entries of the install's configurations by configuration name; `None` for a missing one.
pub async fn published_entries(
    client: &Client,
    mode: Mode,
) -> kube::Result<Vec<(&'static str, Option<Vec<PublishedEntry>>)>> {
    let mutating = published::<MutatingWebhookConfiguration>(client, mode).await?;
    let validating = published::<ValidatingWebhookConfiguration>(client, mode).await?;
    Ok(mutating.into_iter().chain(validating).collect())
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

/// The resourceVersion of each of the install's configurations (`None` for a missing one), read as
/// metadata from the API server's watch cache: what readiness polls, reading the bundles again only
/// when one changed. Every replica polls every 2 s; whole configurations (every entry's caBundle
/// and conditions, read from etcd) made that most of what an idle install cost the API server.
pub async fn published_versions(client: &Client, mode: Mode) -> kube::Result<Vec<Option<String>>> {
    async fn version<C: Configuration>(
        client: &Client,
        mode: Mode,
    ) -> kube::Result<Option<Option<String>>> {
        let Some(name) = C::name(mode) else {
            return Ok(None);
        };
        let api: Api<C> = Api::all(client.clone());
        let meta = api.get_metadata_opt_with(name, &GetParams::any()).await?;
        Ok(Some(meta.and_then(|m| m.metadata.resource_version)))
    }
    let mutating = version::<MutatingWebhookConfiguration>(client, mode).await?;
    let validating = version::<ValidatingWebhookConfiguration>(client, mode).await?;
    Ok(mutating.into_iter().chain(validating).collect())
}

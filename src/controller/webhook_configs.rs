//! Keeping the two webhook configurations as the gates and flags say, with the CA bundle on every
//! entry (spec/operator.md 3). Server-side apply with field manager `koord-webhook`, only when
//! something differs; entries another manager left behind for a gate that is off are removed.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde::{Serialize, de::DeserializeOwned};

use crate::features::FeatureGates;
use crate::install::WebhookTarget;
use crate::install::webhook_configurations::{self, MUTATING_NAME, VALIDATING_NAME};

pub const FIELD_MANAGER: &str = "koord-webhook";

/// The parts of an entry the operator reads and decides.
#[derive(Debug)]
struct EntryView<'a> {
    name: &'a str,
    client_config: &'a WebhookClientConfig,
    failure_policy: Option<&'a str>,
}

/// Convergence compares what the operator sets on a live entry: its name and clientConfig.
impl PartialEq for EntryView<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.client_config == other.client_config
    }
}

trait Configuration:
    kube::Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug
{
    const NAME: &'static str;
    fn entries(&self) -> Vec<EntryView<'_>>;
    fn desired(gates: &FeatureGates, target: &WebhookTarget, bundle: &[u8]) -> Self;
}

/// The two configuration kinds differ only in their entry type.
macro_rules! configuration {
    ($kind:ty, $name:expr, $render:path) => {
        impl Configuration for $kind {
            const NAME: &'static str = $name;
            fn entries(&self) -> Vec<EntryView<'_>> {
                self.webhooks
                    .iter()
                    .flatten()
                    .map(|w| EntryView {
                        name: &w.name,
                        client_config: &w.client_config,
                        failure_policy: w.failure_policy.as_deref(),
                    })
                    .collect()
            }
            fn desired(gates: &FeatureGates, target: &WebhookTarget, bundle: &[u8]) -> Self {
                $render(gates, target, Some(bundle))
            }
        }
    };
}

configuration!(
    MutatingWebhookConfiguration,
    MUTATING_NAME,
    webhook_configurations::mutating
);
configuration!(
    ValidatingWebhookConfiguration,
    VALIDATING_NAME,
    webhook_configurations::validating
);

/// What the operator wants published.
#[derive(Clone, Debug)]
pub struct Desired {
    pub gates: FeatureGates,
    pub target: WebhookTarget,
}

async fn converge<C: Configuration>(
    client: &Client,
    desired: &Desired,
    bundle: &[u8],
) -> kube::Result<bool> {
    let api: Api<C> = Api::all(client.clone());
    let want = C::desired(&desired.gates, &desired.target, bundle);
    let current = api.get_opt(C::NAME).await?;
    if current
        .as_ref()
        .is_some_and(|c| c.entries() == want.entries())
    {
        return Ok(false);
    }
    if let Some(current) = &current {
        // Apply merges with what other managers own (a `kubectl apply` of the manifests): it cannot
        // turn a `service` clientConfig into a `url` one, nor drop entries of gates now off. Put
        // those in place first, each guarded by a test of the entry's name.
        let wanted = want.entries();
        let mut ops = Vec::new();
        let mut removals = Vec::new();
        for (i, entry) in current.entries().iter().enumerate() {
            let test = serde_json::json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": entry.name});
            match wanted.iter().find(|w| w.name == entry.name) {
                Some(w) if w.client_config != entry.client_config => {
                    ops.push(test);
                    ops.push(serde_json::json!({"op": "replace", "path": format!("/webhooks/{i}/clientConfig"), "value": w.client_config}));
                }
                Some(_) => {}
                None => {
                    removals.push(test);
                    removals.push(
                        serde_json::json!({"op": "remove", "path": format!("/webhooks/{i}")}),
                    );
                }
            }
        }
        // Removals last and from the end, so earlier indices stay valid.
        for pair in removals.chunks(2).rev() {
            ops.extend(pair.iter().cloned());
        }
        if !ops.is_empty() {
            let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
                .map_err(kube::Error::SerdeError)?;
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.to_owned()),
                ..Default::default()
            };
            api.patch(C::NAME, &params, &Patch::<()>::Json(patch))
                .await?;
        }
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(C::NAME, &params, &Patch::Apply(&want)).await?;
    Ok(true)
}

/// Brings both configurations to the desired state with `bundle`; `Ok(true)` when something was written.
pub async fn converge_all(client: &Client, desired: &Desired, bundle: &[u8]) -> kube::Result<bool> {
    let mutating = converge::<MutatingWebhookConfiguration>(client, desired, bundle).await?;
    let validating = converge::<ValidatingWebhookConfiguration>(client, desired, bundle).await?;
    Ok(mutating || validating)
}

/// One entry as the API server has it.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishedEntry {
    pub name: String,
    pub failure_policy: String,
    pub ca_bundle: Vec<u8>,
}

async fn published<C: Configuration>(client: &Client) -> kube::Result<Option<Vec<PublishedEntry>>> {
    let api: Api<C> = Api::all(client.clone());
    Ok(api.get_opt(C::NAME).await?.map(|config| {
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
            })
            .collect()
    }))
}

/// The entries of both configurations by configuration name; `None` for a missing configuration.
pub async fn published_entries(
    client: &Client,
) -> kube::Result<[(&'static str, Option<Vec<PublishedEntry>>); 2]> {
    Ok([
        (
            MUTATING_NAME,
            published::<MutatingWebhookConfiguration>(client).await?,
        ),
        (
            VALIDATING_NAME,
            published::<ValidatingWebhookConfiguration>(client).await?,
        ),
    ])
}

/// The bundle the API server uses for every entry of both configurations, if they all agree.
pub async fn published_bundle(client: &Client) -> Result<Vec<u8>, String> {
    let mut all = Vec::new();
    for (name, entries) in published_entries(client).await.map_err(|e| e.to_string())? {
        match entries {
            None => return Err(format!("{name} does not exist")),
            Some(entries) => all.extend(entries.into_iter().map(|e| e.ca_bundle)),
        }
    }
    let first = all.first().cloned().unwrap_or_default();
    if first.is_empty() {
        return Err("the caBundle of the webhook entries is empty".to_owned());
    }
    if all.iter().any(|b| *b != first) {
        return Err("the webhook entries carry different caBundles".to_owned());
    }
    Ok(first)
}

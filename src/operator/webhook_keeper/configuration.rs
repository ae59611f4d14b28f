//! The two configuration kinds as the keeper reads and writes them: their name, the pod entry each
//! holds, their entries' owned fields, and the desired object rendered by `install/`.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

use crate::entries::narrowing::pod::PodEntry;
use crate::features::FeatureGates;
use crate::install::WebhookTarget;
use crate::install::webhook_configurations;
use crate::names::Mode;

/// The parts of an entry the operator reads and decides.
#[derive(Debug, Clone, Copy)]
pub(super) struct EntryView<'a> {
    pub name: &'a str,
    pub client_config: &'a WebhookClientConfig,
    pub failure_policy: Option<&'a str>,
    pub timeout_seconds: Option<i32>,
    pub namespace_selector: Option<&'a LabelSelector>,
    pub object_selector: Option<&'a LabelSelector>,
    pub match_conditions: Option<&'a Vec<MatchCondition>>,
}

pub(super) trait Configuration:
    kube::Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug
{
    /// Its name in an install of `mode`; `None` when such an install has none (a shadow's
    /// mutating configuration).
    fn name(mode: Mode) -> Option<&'static str>;
    /// The kind, as errors name it.
    const KIND: &'static str;
    /// The pod entry this configuration holds.
    const POD_ENTRY: PodEntry;
    fn entries(&self) -> Vec<EntryView<'_>>;
    /// Entry `name` as JSON (to add an entry the configuration lacks).
    fn entry_json(&self, name: &str) -> Option<Value>;
    fn desired(gates: &FeatureGates, target: &WebhookTarget, bundle: &[u8]) -> Self;
}

/// The two configuration kinds differ only in their entry type.
macro_rules! configuration {
    ($kind:ty, $name:expr, $pod_entry:expr, $render:path) => {
        impl Configuration for $kind {
            fn name(mode: Mode) -> Option<&'static str> {
                $name(mode)
            }
            const POD_ENTRY: PodEntry = $pod_entry;
            const KIND: &'static str = stringify!($kind);
            fn entries(&self) -> Vec<EntryView<'_>> {
                self.webhooks
                    .iter()
                    .flatten()
                    .map(|w| EntryView {
                        name: &w.name,
                        client_config: &w.client_config,
                        failure_policy: w.failure_policy.as_deref(),
                        timeout_seconds: w.timeout_seconds,
                        namespace_selector: w.namespace_selector.as_ref(),
                        object_selector: w.object_selector.as_ref(),
                        match_conditions: w.match_conditions.as_ref(),
                    })
                    .collect()
            }
            fn entry_json(&self, name: &str) -> Option<Value> {
                let entry = self.webhooks.iter().flatten().find(|w| w.name == name)?;
                serde_json::to_value(entry).ok()
            }
            fn desired(gates: &FeatureGates, target: &WebhookTarget, bundle: &[u8]) -> Self {
                $render(gates, target, Some(bundle))
            }
        }
    };
}

configuration!(
    MutatingWebhookConfiguration,
    Mode::mutating_configuration,
    PodEntry::Create,
    webhook_configurations::mutating
);
configuration!(
    ValidatingWebhookConfiguration,
    |mode: Mode| Some(mode.validating_configuration()),
    PodEntry::Validate,
    webhook_configurations::validating
);

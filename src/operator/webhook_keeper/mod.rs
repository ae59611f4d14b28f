//! Keeping the two webhook configurations as the gates and flags say, with the CA bundle on every
//! entry (docs/certificates.md).
//!
//! The operator owns the fields it is configured with: each entry's `clientConfig.caBundle`,
//! `failurePolicy`, `timeoutSeconds` and `namespaceSelector` (the entry flags of `serve`, which the
//! manifests and the chart pass on), `matchConditions` and `objectSelector` (which requests are
//! sent: the table's, `--narrow-calls`, `--qos-split`), and the whole `clientConfig` when it is
//! told where the API server calls it (`--webhook-host`, URL mode). A hand edit of one of them is
//! put back and recorded as an Event naming the entry and the field, so what runs is what the
//! install says. The rest of an entry (rules, ...) belongs to whoever installed it, and re-applying the
//! manifests (or `helm upgrade`) after the operator has run neither conflicts nor drops the
//! caBundle. Changes are JSON patches (an update by field manager `koord-webhook`), each guarded by a
//! test of the entry's name; a configuration that does not exist at all is created whole.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

mod configuration;
mod written;

use super::leader::Leadership;
use super::write_error::WriteError;
use crate::features::FeatureGates;
use crate::install::entry_policy::EntryPolicy;
use crate::install::{ClientConfigMode, WebhookTarget};
use crate::names::FIELD_MANAGER;
use configuration::{Configuration, EntryView};
pub use written::{OwnedField, Written};

/// What the operator wants published.
#[derive(Clone, Debug)]
pub struct Desired {
    pub gates: FeatureGates,
    pub target: WebhookTarget,
}

impl Desired {
    /// The operator owns where the API server calls it only when it was told (URL mode); the
    /// Service reference is the manifests'.
    fn owns_endpoint(&self) -> bool {
        matches!(self.target.mode, ClientConfigMode::Url { .. })
    }

    /// The same with every entry sent every request its rules select.
    fn wide(&self) -> Self {
        Self {
            gates: self.gates,
            target: WebhookTarget {
                policy: EntryPolicy {
                    narrow_calls: false,
                    ..self.target.policy.clone()
                },
                ..self.target.clone()
            },
        }
    }
}

/// An absent selector and an empty one select the same (the API server stores `{}` for none).
fn same_selector(a: Option<&LabelSelector>, b: Option<&LabelSelector>) -> bool {
    let empty = LabelSelector::default();
    let norm = |s: Option<&LabelSelector>| {
        let s = s.unwrap_or(&empty);
        (
            s.match_labels.clone().unwrap_or_default(),
            s.match_expressions.clone().unwrap_or_default(),
        )
    };
    norm(a) == norm(b)
}

/// The JSON patch that brings `current` to `want` in the fields the operator owns (empty when
/// nothing differs), and the owned fields of existing entries it puts back. `entry` renders a wanted
/// entry the configuration lacks.
fn plan<'a>(
    current: &[EntryView<'a>],
    want: &[EntryView<'a>],
    owns_endpoint: bool,
    entry: impl Fn(&str) -> Option<Value>,
) -> (Vec<Value>, Vec<(String, OwnedField)>) {
    let mut ops = Vec::new();
    let mut repaired = Vec::new();
    let mut removals = Vec::new();
    for (i, have) in current.iter().enumerate() {
        let test = json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": have.name});
        let Some(wanted) = want.iter().find(|w| w.name == have.name) else {
            // An entry for a gate that is off (left by an older install or another manager).
            removals.push([
                test,
                json!({"op": "remove", "path": format!("/webhooks/{i}")}),
            ]);
            continue;
        };
        let mut entry_ops = Vec::new();
        let mut set = |field: OwnedField, value: Value| {
            // `add` sets the member whether or not it is there.
            let path = format!("/webhooks/{i}/{}", field.path());
            entry_ops.push(json!({"op": "add", "path": path, "value": value}));
            repaired.push((have.name.to_owned(), field));
        };
        if owns_endpoint && wanted.client_config != have.client_config {
            set(OwnedField::ClientConfig, json!(wanted.client_config));
        } else if wanted.client_config.ca_bundle != have.client_config.ca_bundle {
            set(OwnedField::CaBundle, json!(wanted.client_config.ca_bundle));
        }
        if wanted.failure_policy.is_some() && wanted.failure_policy != have.failure_policy {
            set(OwnedField::FailurePolicy, json!(wanted.failure_policy));
        }
        if wanted.timeout_seconds.is_some() && wanted.timeout_seconds != have.timeout_seconds {
            set(OwnedField::TimeoutSeconds, json!(wanted.timeout_seconds));
        }
        if !same_selector(wanted.namespace_selector, have.namespace_selector) {
            let selector = wanted.namespace_selector.cloned().unwrap_or_default();
            set(OwnedField::NamespaceSelector, json!(selector));
        }
        // In the same patch as the entries it adds or removes: a split entry and its labelled
        // part change together (`--qos-split`), so no pod is ever matched by neither or both.
        if !same_selector(wanted.object_selector, have.object_selector) {
            let selector = wanted.object_selector.cloned().unwrap_or_default();
            set(OwnedField::ObjectSelector, json!(selector));
        }
        let conditions = |c: Option<&'a Vec<MatchCondition>>| c.map_or(&[][..], Vec::as_slice);
        if conditions(wanted.match_conditions) != conditions(have.match_conditions) {
            set(
                OwnedField::MatchConditions,
                json!(conditions(wanted.match_conditions)),
            );
        }
        if !entry_ops.is_empty() {
            ops.push(test);
            ops.extend(entry_ops);
        }
    }
    // Removals from the end, so the indices before them stay valid; then the missing entries.
    for pair in removals.into_iter().rev() {
        ops.extend(pair);
    }
    // Each missing entry goes before the next wanted entry that is there, else at the end: order
    // matters to the API server, which runs mutating webhooks in turn, each on the object as the
    // ones before it patched it (a `--qos-split` part must come before its entry).
    let mut names: Vec<&str> = current
        .iter()
        .map(|c| c.name)
        .filter(|name| want.iter().any(|w| w.name == *name))
        .collect();
    for (k, wanted) in want.iter().enumerate() {
        if names.contains(&wanted.name) {
            continue;
        }
        let Some(value) = entry(wanted.name) else {
            continue;
        };
        let before = want[k + 1..]
            .iter()
            .find_map(|next| names.iter().position(|n| *n == next.name));
        match before {
            Some(i) => {
                ops.push(json!({"op": "add", "path": format!("/webhooks/{i}"), "value": value}));
                names.insert(i, wanted.name);
            }
            None => {
                ops.push(json!({"op": "add", "path": "/webhooks/-", "value": value}));
                names.push(wanted.name);
            }
        }
    }
    (ops, repaired)
}

/// How long a configuration must stay deleted before the leader creates it again. `helm uninstall`
/// deletes the webhook configurations a moment before the Deployment; re-creating them at once
/// would leave entries with failurePolicy Fail pointing at a Service that is about to go, and pod
/// creation in the whole cluster would fail. By the time this passes, an uninstall has stopped the
/// replicas; a configuration deleted by mistake comes back.
pub const RECREATE_AFTER: std::time::Duration = std::time::Duration::from_secs(20);

/// Which configurations this process has seen, and since when each has been missing (`None`
/// while present). One missing at the first look (URL-mode development, where nothing installed
/// it) is created at once.
#[derive(Debug, Default)]
pub struct Absence(
    std::sync::Mutex<std::collections::HashMap<&'static str, Option<std::time::Instant>>>,
);

impl Absence {
    fn present(&self, name: &'static str) {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        seen.insert(name, None);
    }

    /// Whether a missing configuration may be created now.
    fn may_create(&self, name: &'static str) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match seen.get_mut(name) {
            None => true,
            Some(since) => {
                since.get_or_insert_with(std::time::Instant::now).elapsed() >= RECREATE_AFTER
            }
        }
    }
}

/// What every write of a pass shares: the client, the fence checked before each write, which
/// configurations have gone missing, and where the pod entries' reach comes from (calls narrowed).
#[derive(Clone, Copy)]
pub struct Keeper<'a> {
    pub client: &'a Client,
    pub fence: &'a Leadership,
    pub absence: &'a Absence,
    pub pods: Option<&'a PodReachSource>,
}

/// What the keeper was doing with a configuration when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Read,
    Create,
    Patch,
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Action::Read => "read",
            Action::Create => "create",
            Action::Patch => "patch",
        })
    }
}

/// A configuration the keeper could not bring to the desired state: which one, doing what, and
/// why (the API's answer, or the fence).
#[derive(Debug, thiserror::Error)]
#[error("{action} {kind} {name}: {source}")]
pub struct ConfigurationError {
    pub action: Action,
    pub kind: &'static str,
    pub name: &'static str,
    #[source]
    pub source: WriteError,
}

impl ConfigurationError {
    fn of<C: Configuration>(name: &'static str, action: Action) -> impl Fn(WriteError) -> Self {
        move |source| Self {
            action,
            kind: C::KIND,
            name,
            source,
        }
    }
}

async fn converge<C: Configuration>(
    keeper: &Keeper<'_>,
    desired: &Desired,
    bundle: &[u8],
) -> Result<Option<Written>, ConfigurationError> {
    let Keeper {
        client,
        fence,
        absence,
        pods,
    } = *keeper;
    let Some(name) = C::name(desired.target.policy.mode) else {
        // This install has no configuration of this kind (a shadow's mutating one).
        return Ok(None);
    };
    let failed = |action| ConfigurationError::of::<C>(name, action);
    let api: Api<C> = Api::all(client.clone());
    let current = api
        .get_opt(name)
        .await
        .map_err(|e| failed(Action::Read)(e.into()))?;
    let mut desired = desired.clone();
    let reach = match (&current, pods) {
        (Some(current), Some(source)) if desired.target.policy.narrows() => {
            let json = serde_json::to_value(current)
                .map_err(|e| failed(Action::Read)(kube::Error::SerdeError(e).into()))?;
            Some(source.plan(&json, C::POD_ENTRY, &desired.gates, &mut desired.target))
        }
        _ => None,
    };
    let want = C::desired(&desired.gates, &desired.target, bundle);
    if current.is_some() {
        absence.present(name);
    } else if !absence.may_create(name) {
        tracing::warn!(
            configuration = name,
            after = ?RECREATE_AFTER,
            "the webhook configuration was deleted; re-created if still missing after a while (an uninstall stops the replicas first)"
        );
        return Ok(None);
    }
    let Some(current) = current else {
        // Not installed (URL-mode development) or deleted and still missing: create it whole.
        // Server-side apply rather than a create: RBAC limits an apply's create by name.
        let create = |e: WriteError| failed(Action::Create)(e);
        fence.check().map_err(|e| create(e.into()))?;
        api.patch(
            name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&want),
        )
        .await
        .map_err(|e| create(e.into()))?;
        return Ok(Some(Written {
            reference: want.object_ref(&()),
            fields: Vec::new(),
            narrowing_refused: None,
        }));
    };
    let (ops, repaired) = plan(
        &current.entries(),
        &want.entries(),
        desired.owns_endpoint(),
        |name| want.entry_json(name),
    );
    let record = reach
        .as_ref()
        .and_then(|plan| plan.record.as_ref().map(|r| plan.state.record_op(r)));
    if ops.is_empty() && record.is_none() {
        return Ok(None);
    }
    // Conditional on the version read: a replica widening a pod entry in between makes this
    // write fail (409) rather than be undone by it; the pass is retried.
    let mut ops: Vec<Value> = current
        .meta()
        .resource_version
        .iter()
        .map(|rv| json!({"op": "add", "path": "/metadata/resourceVersion", "value": rv}))
        .chain(ops)
        .collect();
    ops.extend(record);
    let patch_failed = |e: WriteError| failed(Action::Patch)(e);
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops))
        .map_err(|e| patch_failed(kube::Error::SerdeError(e).into()))?;
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    fence.check().map_err(|e| patch_failed(e.into()))?;
    api.patch(name, &params, &Patch::<()>::Json(patch))
        .await
        .map_err(|e| patch_failed(e.into()))?;
    Ok(Some(Written {
        reference: current.object_ref(&()),
        fields: repaired,
        narrowing_refused: None,
    }))
}

/// [`converge`], falling back to wide entries when the API server refuses the narrowed ones (an
/// expression it does not accept: a write is all or nothing, so nothing of the refused one was
/// stored). Wide entries only cost calls; refused ones would leave the caBundle unpublished.
async fn converge_or_widen<C: Configuration>(
    keeper: &Keeper<'_>,
    desired: &Desired,
    bundle: &[u8],
) -> Result<Option<Written>, ConfigurationError> {
    match converge::<C>(keeper, desired, bundle).await {
        Err(ConfigurationError {
            source: WriteError::Api(kube::Error::Api(refusal)),
            ..
        }) if refusal.code == 422 && desired.target.policy.narrows() => {
            tracing::warn!(
                configuration = C::name(desired.target.policy.mode),
                error = %refusal.message,
                "the API server refused the narrowed webhook entries; writing them wide"
            );
            let wide = desired.wide();
            let wide_keeper = Keeper {
                pods: None,
                ..*keeper
            };
            let written = converge::<C>(&wide_keeper, &wide, bundle).await?;
            let reference = written.as_ref().map_or_else(
                || C::desired(&wide.gates, &wide.target, bundle).object_ref(&()),
                |w| w.reference.clone(),
            );
            Ok(Some(Written {
                reference,
                fields: written.map(|w| w.fields).unwrap_or_default(),
                narrowing_refused: Some(refusal.message),
            }))
        }
        other => other,
    }
}

/// Brings both configurations to the desired state with `bundle`; the ones it wrote.
pub async fn converge_all(
    keeper: &Keeper<'_>,
    desired: &Desired,
    bundle: &[u8],
) -> Result<Vec<Written>, ConfigurationError> {
    let mutating =
        converge_or_widen::<MutatingWebhookConfiguration>(keeper, desired, bundle).await?;
    let validating =
        converge_or_widen::<ValidatingWebhookConfiguration>(keeper, desired, bundle).await?;
    Ok(mutating.into_iter().chain(validating).collect())
}

pub mod events;
pub mod pod_reach;
pub mod published;
pub use pod_reach::PodReachSource;
pub use published::{published_bundle, published_entries, published_versions};

#[cfg(test)]
mod tests;

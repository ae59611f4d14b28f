//! The two webhook configurations, computed from the webhook table and the enabled gates
//! (docs/admission.md). The install manifests and the operator both use this.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
    ServiceReference, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::api::ObjectMeta;

use super::entry_policy::{EntryPolicy, NamespaceLabel};
use crate::entries::narrowing::Calls;
use crate::entries::narrowing::pod::{PodEntry, PodReach, Reach};
use crate::entries::{ENDPOINTS, EndpointSpec, EntrySpec, FailurePolicy, WebhookKind};
use crate::features::FeatureGates;
use crate::names::{DEFAULT_NAMESPACE, MUTATING_CONFIGURATION, Mode, app_labels, namespace};

/// How the API server reaches the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientConfigMode {
    /// Through the in-cluster Service.
    Service,
    /// `https://<host>:<port><path>`: out-of-cluster and local development.
    Url { host: String, port: u16 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookTarget {
    pub mode: ClientConfigMode,
    /// How the API server calls each entry (the entry flags of `serve` and `manifests`).
    pub policy: EntryPolicy,
    /// Which pods the pod entries reach beyond the pods' own marks: every pod in the manifests
    /// and the chart, what the leader derived from its cache in what it writes.
    pub pod_reach: PodReach,
    /// Whether entries with a [`crate::entries::LabelledPart`] are registered split by its label
    /// (`serve --qos-split=on`; written by the leader, never in the manifests and the chart).
    pub qos_split: bool,
}

impl Default for WebhookTarget {
    fn default() -> Self {
        Self {
            mode: ClientConfigMode::Service,
            policy: EntryPolicy::default(),
            pod_reach: PodReach::default(),
            qos_split: false,
        }
    }
}

impl WebhookTarget {
    /// `--webhook-host` given: URL mode; otherwise the Service. The entries' settings from `policy`.
    pub fn from_flags(webhook_host: Option<&str>, port: u16, policy: &EntryPolicy) -> Self {
        Self {
            mode: match webhook_host {
                Some(host) => ClientConfigMode::Url {
                    host: host.to_owned(),
                    port,
                },
                None => ClientConfigMode::Service,
            },
            policy: policy.clone(),
            pod_reach: PodReach::default(),
            qos_split: false,
        }
    }

    /// The entry's failurePolicy: Ignore in Audit (`--entry-action`), else the last
    /// `--failure-policy` naming it (or `all`), else the table's.
    fn failure_policy(&self, webhook: &EndpointSpec, entry: &EntrySpec) -> String {
        if self.policy.audited(entry.name) {
            return FailurePolicy::Ignore.as_str().to_owned();
        }
        self.policy
            .failure_policies
            .iter()
            .rev()
            .find(|(name, _)| name == entry.name || name == "all")
            .map_or(webhook.failure_policy, |(_, policy)| *policy)
            .as_str()
            .to_owned()
    }

    fn namespace_selector(&self, entry: &EntrySpec) -> Option<LabelSelector> {
        // The immutable name label, so nobody can opt a namespace out by relabelling it.
        entry.exclude_system_namespaces.then(|| {
            let mut names = vec![namespace().to_owned(), "kube-system".to_owned()];
            // A shadow also skips the namespace an enforcing install lives in (Koordinator's):
            // it reports what that install would refuse, and that install never sees those pods.
            if self.policy.mode == Mode::Shadow && namespace() != DEFAULT_NAMESPACE {
                names.insert(1, DEFAULT_NAMESPACE.to_owned());
            }
            names.extend(self.policy.excluded_namespaces.iter().cloned());
            let mut requirements = vec![LabelSelectorRequirement {
                key: "kubernetes.io/metadata.name".to_owned(),
                operator: "NotIn".to_owned(),
                values: Some(names),
            }];
            requirements.extend(
                self.policy
                    .excluded_namespace_labels
                    .iter()
                    .map(NamespaceLabel::requirement),
            );
            LabelSelector {
                match_expressions: Some(requirements),
                match_labels: None,
            }
        })
    }

    /// What the entry is called for under these settings and gates.
    pub fn calls(&self, entry: &EntrySpec, gates: &FeatureGates) -> Calls {
        if !self.policy.narrows() {
            return entry.narrowing.calls_wide();
        }
        // A pod entry narrowed by the cluster's state is safe only while every change that could
        // widen it passes its guard entry, which must then be registered and fail closed.
        let guarded = |pod: PodEntry, reach: &Reach| {
            let guard = pod.guard_entry();
            let fails_closed = ENDPOINTS
                .iter()
                .filter(|w| gates.enabled(w.gate))
                .flat_map(|w| w.entries.iter().map(move |e| (w, e)))
                .any(|(w, e)| e.name == guard && self.failure_policy(w, e) == "Fail");
            if fails_closed {
                reach.clone()
            } else {
                Reach::Every
            }
        };
        let pods = PodReach {
            create: guarded(PodEntry::Create, &self.pod_reach.create),
            validate: guarded(PodEntry::Validate, &self.pod_reach.validate),
        };
        entry.narrowing.calls(gates, &pods)
    }

    fn client_config(&self, path: &str, ca_bundle: Option<&[u8]>) -> WebhookClientConfig {
        let ca_bundle = ca_bundle.map(|ca| ByteString(ca.to_vec()));
        match &self.mode {
            ClientConfigMode::Service => WebhookClientConfig {
                ca_bundle,
                service: Some(ServiceReference {
                    name: self.policy.mode.service_name().to_owned(),
                    namespace: namespace().to_owned(),
                    path: Some(path.to_owned()),
                    port: Some(443),
                }),
                url: None,
            },
            ClientConfigMode::Url { host, port } => {
                // An IPv6 literal needs brackets in a URL.
                let host = if host.contains(':') && !host.starts_with('[') {
                    format!("[{host}]")
                } else {
                    host.clone()
                };
                WebhookClientConfig {
                    ca_bundle,
                    service: None,
                    url: Some(format!("https://{host}:{port}{path}")),
                }
            }
        }
    }
}

fn rules(entry: &EntrySpec) -> Vec<RuleWithOperations> {
    vec![RuleWithOperations {
        api_groups: Some(vec![entry.api_group.to_owned()]),
        api_versions: Some(vec![entry.api_version.to_owned()]),
        operations: Some(entry.operations.iter().map(|o| (*o).to_owned()).collect()),
        resources: Some(vec![entry.resource.to_owned()]),
        // Written out although it is the default, so what is applied equals what is stored.
        scope: Some("*".to_owned()),
    }]
}

/// Which half of a split entry a webhook is (`--qos-split`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Half {
    /// The entry itself: objects without the label.
    Unlabelled,
    /// Its [`crate::entries::LabelledPart`]: objects with it.
    Labelled,
}

/// The entry's own objectSelector and, for a half of a split entry, its label: absent for the
/// entry itself (`DoesNotExist`), there for the labelled part (`Exists`).
fn object_selector(entry: &EntrySpec, half: Option<Half>) -> Option<LabelSelector> {
    let mut requirements: Vec<LabelSelectorRequirement> = entry
        .object_selector
        .map(|(key, value)| LabelSelectorRequirement {
            key: key.to_owned(),
            operator: "In".to_owned(),
            values: Some(vec![value.to_owned()]),
        })
        .into_iter()
        .collect();
    if let (Some(part), Some(half)) = (entry.labelled_part, half) {
        let operator = match half {
            Half::Unlabelled => "DoesNotExist",
            Half::Labelled => "Exists",
        };
        requirements.push(LabelSelectorRequirement {
            key: part.label.to_owned(),
            operator: operator.to_owned(),
            values: None,
        });
    }
    (!requirements.is_empty()).then_some(LabelSelector {
        match_expressions: Some(requirements),
        match_labels: None,
    })
}

/// One webhook an entry is registered as: the entry itself, or its [`LabelledPart`].
struct Webhook {
    name: String,
    object_selector: Option<LabelSelector>,
    match_conditions: Option<Vec<MatchCondition>>,
}

/// The webhooks of an entry under `calls`: with `qos_split` its labelled part (no conditions),
/// then the entry.
///
/// The part comes first: the API server runs a configuration's mutating webhooks in order, each on
/// the object as the ones before it patched it, so a part after the entry would be sent again the
/// pod the entry has just labelled. Before it, the part has already been passed by the time the
/// label is there, and when the API server runs the mutating webhooks a second time after a
/// patch, it does not call the part again (reinvocationPolicy Never).
fn webhooks_of(target: &WebhookTarget, entry: &EntrySpec, calls: &Calls) -> Vec<Webhook> {
    let part = entry.labelled_part.filter(|_| target.qos_split);
    let mut out = Vec::new();
    if let Some(part) = part {
        out.push(Webhook {
            name: target.policy.mode.entry_name(part.name),
            object_selector: object_selector(entry, Some(Half::Labelled)),
            match_conditions: None,
        });
    }
    out.push(Webhook {
        name: target.policy.mode.entry_name(entry.name),
        object_selector: object_selector(entry, part.map(|_| Half::Unlabelled)),
        match_conditions: calls.match_conditions(),
    });
    out
}

/// The entries registered in the configuration of `kind`: their endpoint's gate on, and some
/// request needing them. A shadow registers every endpoint's entries as validating ones (a
/// validating entry sees the object after every mutation, koord-manager's included; the mutating
/// rules run there in Audit and send no patch).
fn enabled<'a>(
    gates: &'a FeatureGates,
    target: &'a WebhookTarget,
    kind: WebhookKind,
) -> impl Iterator<Item = (&'static EndpointSpec, &'static EntrySpec, Calls)> + 'a {
    // The kinds of endpoint whose entries go into this configuration, mutating ones first.
    let kinds: &[WebhookKind] = match (target.policy.mode, kind) {
        (Mode::Enforce, WebhookKind::Mutating) => &[WebhookKind::Mutating],
        (Mode::Enforce, WebhookKind::Validating) => &[WebhookKind::Validating],
        (Mode::Shadow, WebhookKind::Mutating) => &[],
        (Mode::Shadow, WebhookKind::Validating) => {
            &[WebhookKind::Mutating, WebhookKind::Validating]
        }
    };
    kinds
        .iter()
        .flat_map(|kind| ENDPOINTS.iter().filter(move |w| w.kind == *kind))
        .filter(move |w| gates.enabled(w.gate))
        .flat_map(|w| w.entries.iter().map(move |e| (w, e)))
        .filter_map(|(w, e)| match target.calls(e, gates) {
            Calls::Never => None,
            calls => Some((w, e, calls)),
        })
}

fn metadata(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(app_labels()),
        ..Default::default()
    }
}

/// The MutatingWebhookConfiguration for these gates; `ca_bundle` None leaves it empty. A shadow
/// has none: its entries are all in [`validating`]'s (this one would be empty and carry
/// Koordinator's name, so callers ask `Mode::mutating_configuration` first).
pub fn mutating(
    gates: &FeatureGates,
    target: &WebhookTarget,
    ca_bundle: Option<&[u8]>,
) -> MutatingWebhookConfiguration {
    let webhooks = enabled(gates, target, WebhookKind::Mutating)
        .flat_map(|(w, e, calls)| {
            webhooks_of(target, e, &calls)
                .into_iter()
                .map(move |hook| MutatingWebhook {
                    name: hook.name,
                    admission_review_versions: vec!["v1".to_owned()],
                    client_config: target.client_config(w.path, ca_bundle),
                    failure_policy: Some(target.failure_policy(w, e)),
                    namespace_selector: target.namespace_selector(e),
                    object_selector: hook.object_selector,
                    rules: Some(rules(e)),
                    side_effects: e.side_effects.to_owned(),
                    timeout_seconds: Some(target.policy.webhook_timeout_seconds),
                    reinvocation_policy: Some("Never".to_owned()),
                    match_policy: Some("Equivalent".to_owned()),
                    match_conditions: hook.match_conditions,
                })
        })
        .collect();
    MutatingWebhookConfiguration {
        metadata: metadata(MUTATING_CONFIGURATION),
        webhooks: Some(webhooks),
    }
}

/// The ValidatingWebhookConfiguration for these gates; `ca_bundle` None leaves it empty.
pub fn validating(
    gates: &FeatureGates,
    target: &WebhookTarget,
    ca_bundle: Option<&[u8]>,
) -> ValidatingWebhookConfiguration {
    let webhooks = enabled(gates, target, WebhookKind::Validating)
        .flat_map(|(w, e, calls)| {
            webhooks_of(target, e, &calls)
                .into_iter()
                .map(move |hook| ValidatingWebhook {
                    name: hook.name,
                    admission_review_versions: vec!["v1".to_owned()],
                    client_config: target.client_config(w.path, ca_bundle),
                    failure_policy: Some(target.failure_policy(w, e)),
                    namespace_selector: target.namespace_selector(e),
                    object_selector: hook.object_selector,
                    rules: Some(rules(e)),
                    side_effects: e.side_effects.to_owned(),
                    timeout_seconds: Some(target.policy.webhook_timeout_seconds),
                    match_policy: Some("Equivalent".to_owned()),
                    match_conditions: hook.match_conditions,
                })
        })
        .collect();
    ValidatingWebhookConfiguration {
        metadata: metadata(target.policy.mode.validating_configuration()),
        webhooks: Some(webhooks),
    }
}

#[cfg(test)]
mod tests;

//! Keeping the two webhook configurations as the gates and flags say, with the CA bundle on every
//! entry (docs/certificates.md).
//!
//! The operator owns the fields it is configured with: each entry's `clientConfig.caBundle`,
//! `failurePolicy`, `timeoutSeconds` and `namespaceSelector` (the entry flags of `serve`, which the
//! manifests and the chart pass on), and the whole `clientConfig` when it is told where the API
//! server calls it (`--webhook-host`, URL mode). A hand edit of one of them is put back and recorded
//! as an Event naming the entry and the field, so what runs is what the install says. The rest of an
//! entry (rules, object selectors, ...) belongs to whoever installed it, and re-applying the
//! manifests (or `helm upgrade`) after the operator has run neither conflicts nor drops the
//! caBundle. Changes are JSON patches (an update by field manager `koord-webhook`), each guarded by a
//! test of the entry's name; a configuration that does not exist at all is created whole.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

use super::certificates::IssueError;
use super::leader::Leadership;
use crate::features::FeatureGates;
use crate::install::webhook_configurations;
use crate::install::{ClientConfigMode, WebhookTarget};
use crate::names::{FIELD_MANAGER, MUTATING_CONFIGURATION, VALIDATING_CONFIGURATION};

/// The parts of an entry the operator reads and decides.
#[derive(Debug)]
struct EntryView<'a> {
    name: &'a str,
    client_config: &'a WebhookClientConfig,
    failure_policy: Option<&'a str>,
    timeout_seconds: Option<i32>,
    namespace_selector: Option<&'a LabelSelector>,
    match_conditions: Option<&'a Vec<MatchCondition>>,
}

/// A field of an entry the operator owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnedField {
    /// The whole `clientConfig` (URL mode).
    ClientConfig,
    CaBundle,
    FailurePolicy,
    TimeoutSeconds,
    NamespaceSelector,
    /// Which requests the entry is sent (`--narrow-calls`).
    MatchConditions,
}

impl OwnedField {
    /// The JSON path within the entry.
    fn path(self) -> &'static str {
        match self {
            OwnedField::ClientConfig => "clientConfig",
            OwnedField::CaBundle => "clientConfig/caBundle",
            OwnedField::FailurePolicy => "failurePolicy",
            OwnedField::TimeoutSeconds => "timeoutSeconds",
            OwnedField::NamespaceSelector => "namespaceSelector",
            OwnedField::MatchConditions => "matchConditions",
        }
    }

    /// The field as people name it (Events, logs).
    pub fn name(self) -> &'static str {
        match self {
            OwnedField::CaBundle => "clientConfig.caBundle",
            other => other.path(),
        }
    }

    /// Where the API server calls and with which CA: written at install and at every rotation, not
    /// drift.
    pub fn is_endpoint(self) -> bool {
        matches!(self, OwnedField::ClientConfig | OwnedField::CaBundle)
    }
}

/// One configuration the pass wrote: created whole (no fields listed) or patched in these fields.
#[derive(Debug, Clone)]
pub struct Written {
    /// The configuration, for the Events about it.
    pub reference: k8s_openapi::api::core::v1::ObjectReference,
    /// (entry name, field) of each owned field of an existing entry that was set.
    pub fields: Vec<(String, OwnedField)>,
    /// The API server refused the narrowed entries (the message); they were written wide.
    pub narrowing_refused: Option<String>,
}

trait Configuration:
    kube::Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug
{
    const NAME: &'static str;
    fn entries(&self) -> Vec<EntryView<'_>>;
    /// Entry `name` as JSON (to add an entry the configuration lacks).
    fn entry_json(&self, name: &str) -> Option<Value>;
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
                        timeout_seconds: w.timeout_seconds,
                        namespace_selector: w.namespace_selector.as_ref(),
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
    MUTATING_CONFIGURATION,
    webhook_configurations::mutating
);
configuration!(
    ValidatingWebhookConfiguration,
    VALIDATING_CONFIGURATION,
    webhook_configurations::validating
);

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
    for wanted in want {
        if !current.iter().any(|c| c.name == wanted.name)
            && let Some(value) = entry(wanted.name)
        {
            ops.push(json!({"op": "add", "path": "/webhooks/-", "value": value}));
        }
    }
    // Removals last and from the end, so the indices before them stay valid.
    for pair in removals.into_iter().rev() {
        ops.extend(pair);
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

async fn converge<C: Configuration>(
    client: &Client,
    desired: &Desired,
    bundle: &[u8],
    fence: &Leadership,
    absence: &Absence,
) -> Result<Option<Written>, IssueError> {
    let api: Api<C> = Api::all(client.clone());
    let want = C::desired(&desired.gates, &desired.target, bundle);
    let current = api.get_opt(C::NAME).await?;
    if current.is_some() {
        absence.present(C::NAME);
    } else if !absence.may_create(C::NAME) {
        tracing::warn!(
            configuration = C::NAME,
            after = ?RECREATE_AFTER,
            "the webhook configuration was deleted; re-created if still missing after a while (an uninstall stops the replicas first)"
        );
        return Ok(None);
    }
    let Some(current) = current else {
        // Not installed (URL-mode development) or deleted and still missing: create it whole.
        // Server-side apply rather than a create: RBAC limits an apply's create by name.
        fence.check()?;
        api.patch(
            C::NAME,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&want),
        )
        .await?;
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
    if ops.is_empty() {
        return Ok(None);
    }
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(ops)).map_err(kube::Error::SerdeError)?;
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    fence.check()?;
    api.patch(C::NAME, &params, &Patch::<()>::Json(patch))
        .await?;
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
    client: &Client,
    desired: &Desired,
    bundle: &[u8],
    fence: &Leadership,
    absence: &Absence,
) -> Result<Option<Written>, IssueError> {
    match converge::<C>(client, desired, bundle, fence, absence).await {
        Err(IssueError::Kube(kube::Error::Api(refusal)))
            if refusal.code == 422 && desired.target.narrow_calls =>
        {
            tracing::warn!(
                configuration = C::NAME,
                error = %refusal.message,
                "the API server refused the narrowed webhook entries; writing them wide"
            );
            let wide = Desired {
                gates: desired.gates,
                target: WebhookTarget {
                    narrow_calls: false,
                    ..desired.target.clone()
                },
            };
            let written = converge::<C>(client, &wide, bundle, fence, absence).await?;
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
    client: &Client,
    desired: &Desired,
    bundle: &[u8],
    fence: &Leadership,
    absence: &Absence,
) -> Result<Vec<Written>, IssueError> {
    let mutating =
        converge_or_widen::<MutatingWebhookConfiguration>(client, desired, bundle, fence, absence)
            .await?;
    let validating = converge_or_widen::<ValidatingWebhookConfiguration>(
        client, desired, bundle, fence, absence,
    )
    .await?;
    Ok(mutating.into_iter().chain(validating).collect())
}

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

/// The entries of both configurations by configuration name; `None` for a missing configuration.
pub async fn published_entries(
    client: &Client,
) -> kube::Result<[(&'static str, Option<Vec<PublishedEntry>>); 2]> {
    Ok([
        (
            MUTATING_CONFIGURATION,
            published::<MutatingWebhookConfiguration>(client).await?,
        ),
        (
            VALIDATING_CONFIGURATION,
            published::<ValidatingWebhookConfiguration>(client).await?,
        ),
    ])
}

/// The bundle the API server uses for every entry of both configurations: `Ok(Err(why))` when they
/// do not all carry the same non-empty one; `Err` when they could not be read.
pub async fn published_bundle(client: &Client) -> kube::Result<Result<Vec<u8>, String>> {
    let mut all = Vec::new();
    for (name, entries) in published_entries(client).await? {
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::admissionregistration::v1::ServiceReference;

    fn service(bundle: &[u8]) -> WebhookClientConfig {
        WebhookClientConfig {
            ca_bundle: Some(ByteString(bundle.to_vec())),
            service: Some(ServiceReference {
                name: "svc".to_owned(),
                namespace: "ns".to_owned(),
                path: Some("/p".to_owned()),
                port: Some(443),
            }),
            url: None,
        }
    }

    fn url(bundle: &[u8]) -> WebhookClientConfig {
        WebhookClientConfig {
            ca_bundle: Some(ByteString(bundle.to_vec())),
            service: None,
            url: Some("https://127.0.0.1:9443/p".to_owned()),
        }
    }

    fn view<'a>(name: &'a str, client_config: &'a WebhookClientConfig) -> EntryView<'a> {
        EntryView {
            name,
            client_config,
            failure_policy: None,
            timeout_seconds: None,
            namespace_selector: None,
            match_conditions: None,
        }
    }

    fn ops_of(ops: &[Value]) -> Vec<(String, String)> {
        ops.iter()
            .map(|o| {
                (
                    o["op"].as_str().unwrap().to_owned(),
                    o["path"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn a_configuration_deleted_while_running_waits_before_it_is_created_again() {
        let absence = Absence::default();
        assert!(
            absence.may_create("never-seen"),
            "first look: create at once"
        );
        absence.present("c");
        assert!(!absence.may_create("c"), "just deleted: wait");
        absence
            .0
            .lock()
            .unwrap()
            .insert("c", Some(std::time::Instant::now() - RECREATE_AFTER));
        assert!(absence.may_create("c"), "still missing after the grace");
        absence.present("c");
        assert!(!absence.may_create("c"), "a new absence waits again");
    }

    #[test]
    fn nothing_to_do_when_the_bundle_matches() {
        let (a, b) = (service(b"CA"), service(b"CA"));
        assert!(
            plan(&[view("e", &a)], &[view("e", &b)], false, |_| None)
                .0
                .is_empty()
        );
    }

    #[test]
    fn match_conditions_are_set_and_cleared_and_none_equals_empty() {
        let c = service(b"CA");
        let narrowed = vec![MatchCondition {
            name: "koord-amplified-node".to_owned(),
            expression: "true".to_owned(),
        }];
        let empty = Vec::new();
        let with = |conditions| EntryView {
            match_conditions: conditions,
            ..view("e", &c)
        };
        let (ops, fields) = plan(&[with(None)], &[with(Some(&narrowed))], false, |_| None);
        assert_eq!(
            ops_of(&ops),
            [
                ("test".to_owned(), "/webhooks/0/name".to_owned()),
                ("add".to_owned(), "/webhooks/0/matchConditions".to_owned())
            ]
        );
        assert_eq!(ops[1]["value"][0]["name"], "koord-amplified-node");
        assert_eq!(fields, [("e".to_owned(), OwnedField::MatchConditions)]);
        // Narrowing turned off: the conditions go.
        let (ops, _) = plan(&[with(Some(&narrowed))], &[with(None)], false, |_| None);
        assert_eq!(ops[1]["value"], json!([]));
        // The API server stores no list for an empty one: nothing to do.
        assert!(
            plan(&[with(None)], &[with(Some(&empty))], false, |_| None)
                .0
                .is_empty()
        );
    }

    #[test]
    fn hand_edits_of_owned_fields_are_put_back_and_named() {
        let c = service(b"CA");
        let configured = LabelSelector {
            match_labels: Some([("team".to_owned(), "a".to_owned())].into()),
            match_expressions: None,
        };
        let edited = LabelSelector::default();
        let want = EntryView {
            failure_policy: Some("Fail"),
            timeout_seconds: Some(10),
            namespace_selector: Some(&configured),
            ..view("e", &c)
        };
        let have = EntryView {
            failure_policy: Some("Ignore"),
            timeout_seconds: Some(30),
            namespace_selector: Some(&edited),
            ..view("e", &c)
        };
        let (ops, repaired) = plan(&[have], &[want], false, |_| None);
        assert_eq!(
            ops_of(&ops),
            [
                ("test".to_owned(), "/webhooks/0/name".to_owned()),
                ("add".to_owned(), "/webhooks/0/failurePolicy".to_owned()),
                ("add".to_owned(), "/webhooks/0/timeoutSeconds".to_owned()),
                ("add".to_owned(), "/webhooks/0/namespaceSelector".to_owned()),
            ]
        );
        assert_eq!(ops[1]["value"], json!("Fail"));
        assert_eq!(ops[2]["value"], json!(10));
        assert_eq!(ops[3]["value"], json!({"matchLabels": {"team": "a"}}));
        let fields: Vec<&str> = repaired.iter().map(|(_, f)| f.name()).collect();
        assert_eq!(
            fields,
            ["failurePolicy", "timeoutSeconds", "namespaceSelector"]
        );
    }

    #[test]
    fn an_absent_selector_is_the_empty_one_the_api_server_stores() {
        let c = service(b"CA");
        let stored = LabelSelector::default();
        let have = EntryView {
            namespace_selector: Some(&stored),
            ..view("e", &c)
        };
        let (ops, repaired) = plan(&[have], &[view("e", &c)], false, |_| None);
        assert!(ops.is_empty() && repaired.is_empty(), "{ops:?}");
    }

    #[test]
    fn service_mode_touches_only_the_bundle() {
        let mut elsewhere = service(b"OLD");
        elsewhere.service.as_mut().unwrap().name = "other".to_owned();
        let want = service(b"NEW");
        let (ops, repaired) = plan(&[view("e", &elsewhere)], &[view("e", &want)], false, |_| {
            None
        });
        assert_eq!(repaired, [("e".to_owned(), OwnedField::CaBundle)]);
        assert_eq!(
            ops_of(&ops),
            [
                ("test".to_owned(), "/webhooks/0/name".to_owned()),
                (
                    "add".to_owned(),
                    "/webhooks/0/clientConfig/caBundle".to_owned()
                ),
            ]
        );
        // The bundle travels base64-encoded, as the API expects.
        assert_eq!(ops[1]["value"], json!("TkVX"));
    }

    #[test]
    fn url_mode_replaces_the_whole_client_config() {
        let (have, want) = (service(b"CA"), url(b"CA"));
        let (ops, _) = plan(&[view("e", &have)], &[view("e", &want)], true, |_| None);
        assert_eq!(
            ops_of(&ops)[1],
            ("add".to_owned(), "/webhooks/0/clientConfig".to_owned())
        );
        assert_eq!(ops[1]["value"]["url"], json!("https://127.0.0.1:9443/p"));
    }

    #[test]
    fn entries_of_gates_off_go_and_missing_ones_come() {
        let c = service(b"CA");
        let current = [
            view("a", &c),
            view("off1", &c),
            view("b", &c),
            view("off2", &c),
        ];
        let want = [view("a", &c), view("b", &c), view("new", &c)];
        let (ops, _) = plan(&current, &want, false, |name| Some(json!({"name": name})));
        assert_eq!(
            ops_of(&ops),
            [
                ("add".to_owned(), "/webhooks/-".to_owned()),
                ("test".to_owned(), "/webhooks/3/name".to_owned()),
                ("remove".to_owned(), "/webhooks/3".to_owned()),
                ("test".to_owned(), "/webhooks/1/name".to_owned()),
                ("remove".to_owned(), "/webhooks/1".to_owned()),
            ]
        );
        assert_eq!(ops[0]["value"], json!({"name": "new"}));
    }

    // The steps against a scripted API server: exactly these calls, in this order.
    mod against_the_api {
        use super::*;
        use crate::controller::scripted_api::{self, Step};
        use base64::Engine;
        use hyper::http::{Method, StatusCode};

        const MUTATING_PATH: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/koordinator-mutating-webhook-configuration";
        const VALIDATING_PATH: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/koordinator-validating-webhook-configuration";

        fn desired() -> Desired {
            Desired {
                gates: FeatureGates::default(),
                target: WebhookTarget::from_flags(None, 9443, &crate::cli::EntryFlags::default()),
            }
        }

        fn stored<C: Configuration>(bundle: &[u8]) -> Value {
            let mut value =
                serde_json::to_value(C::desired(&desired().gates, &desired().target, bundle))
                    .unwrap();
            value["metadata"]["resourceVersion"] = json!("7");
            value
        }

        fn b64(bytes: &[u8]) -> String {
            base64::engine::general_purpose::STANDARD.encode(bytes)
        }

        #[tokio::test]
        async fn missing_configurations_are_created_whole_by_apply() {
            let (client, server) = scripted_api::client(vec![
                Step::not_found(Method::GET, MUTATING_PATH),
                Step::new(
                    Method::PATCH,
                    MUTATING_PATH,
                    StatusCode::CREATED,
                    stored::<MutatingWebhookConfiguration>(b"ca"),
                ),
                Step::not_found(Method::GET, VALIDATING_PATH),
                Step::new(
                    Method::PATCH,
                    VALIDATING_PATH,
                    StatusCode::CREATED,
                    stored::<ValidatingWebhookConfiguration>(b"ca"),
                ),
            ]);
            let wrote = converge_all(
                &client,
                &desired(),
                b"ca",
                &Leadership::always(),
                &Absence::default(),
            )
            .await
            .unwrap();
            drop(client);
            let seen = server.await.unwrap();
            assert!(!wrote.is_empty());
            for write in [&seen[1], &seen[3]] {
                assert_eq!(write.content_type, "application/apply-patch+yaml");
                assert!(
                    write.path_and_query.contains("fieldManager=koord-webhook"),
                    "{}",
                    write.path_and_query
                );
                let entries = write.body["webhooks"].as_array().unwrap();
                assert!(!entries.is_empty());
                for entry in entries {
                    assert_eq!(entry["clientConfig"]["caBundle"], b64(b"ca"));
                }
            }
        }

        #[tokio::test]
        async fn a_stale_bundle_is_patched_entry_by_entry_behind_name_guards() {
            let (client, server) = scripted_api::client(vec![
                Step::new(
                    Method::GET,
                    MUTATING_PATH,
                    StatusCode::OK,
                    stored::<MutatingWebhookConfiguration>(b"old"),
                ),
                Step::new(
                    Method::PATCH,
                    MUTATING_PATH,
                    StatusCode::OK,
                    stored::<MutatingWebhookConfiguration>(b"new"),
                ),
                // Already current: read, not written.
                Step::new(
                    Method::GET,
                    VALIDATING_PATH,
                    StatusCode::OK,
                    stored::<ValidatingWebhookConfiguration>(b"new"),
                ),
            ]);
            let wrote = converge_all(
                &client,
                &desired(),
                b"new",
                &Leadership::always(),
                &Absence::default(),
            )
            .await
            .unwrap();
            drop(client);
            let seen = server.await.unwrap();
            assert!(!wrote.is_empty());
            let patch = &seen[1];
            assert_eq!(patch.content_type, "application/json-patch+json");
            let ops = patch.body.as_array().unwrap();
            let entries = stored::<MutatingWebhookConfiguration>(b"new")["webhooks"]
                .as_array()
                .unwrap()
                .len();
            assert_eq!(
                ops.len(),
                2 * entries,
                "a guard and an add per entry: {ops:?}"
            );
            for (i, pair) in ops.chunks(2).enumerate() {
                assert_eq!(pair[0]["op"], "test");
                assert_eq!(pair[0]["path"], format!("/webhooks/{i}/name"));
                assert_eq!(pair[1]["op"], "add");
                assert_eq!(
                    pair[1]["path"],
                    format!("/webhooks/{i}/clientConfig/caBundle")
                );
                assert_eq!(pair[1]["value"], b64(b"new"));
            }
        }

        #[tokio::test]
        async fn a_replica_without_the_lease_reads_but_writes_nothing() {
            let (follower, _election) = crate::controller::leader::election(Default::default());
            assert!(!follower.is_leader());
            let (client, server) = scripted_api::client(vec![Step::new(
                Method::GET,
                MUTATING_PATH,
                StatusCode::OK,
                stored::<MutatingWebhookConfiguration>(b"old"),
            )]);
            let result =
                converge_all(&client, &desired(), b"new", &follower, &Absence::default()).await;
            drop(client);
            assert!(
                matches!(result, Err(IssueError::NotLeader(_))),
                "{result:?}"
            );
            assert_eq!(server.await.unwrap().len(), 1, "no write after the read");
        }
    }
}

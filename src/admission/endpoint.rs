//! An endpoint: a typed chain behind one admission path, and the whole of one review, top-down:
//! [`Endpoint::review`] picks the typed endpoint, [`TypedEndpoint::review`] decodes the body, runs
//! the chain within the API server's deadline (panics caught here, once), counts the outcome and
//! encodes the answer; [`TypedEndpoint::run`] runs the plugins and turns their edit into a patch.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use bytes::Bytes;
use futures::FutureExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::core::admission::AdmissionRequest;
use serde::{Serialize, de::DeserializeOwned};
use tracing::Instrument;

use super::chain::{
    Ctx, Finding, Halt, Mutator, RunningPlugin, Validator, run_mutators, run_validators,
};
use super::deadline::Deadline;
use super::decode::{self, Request};
use super::env::Env;
use super::node::Node;
use super::outcome::Rejection;
use super::patch;
use super::pod::object::Pod;
use super::reservation::object::Reservation;
use super::review::{self, NoVerdict, Verdict};
use crate::apis::meta::annotations_too_long;
use crate::apis::{ClusterColocationProfile, ElasticQuota};
use crate::entries::EndpointSpec;
use crate::memory::BodyShape;
use crate::metrics::admission::{DenialLabels, PluginLabels, WebhookLabels};
use crate::telemetry::{Clipped, MAX_LOGGED_MESSAGE, MAX_LOGGED_NAME};

/// Every endpoint, by the object type its chain decodes. An enum rather than a trait object: the
/// server holds every path in one table, and a review is a plain `async fn` (no boxed future).
pub enum Endpoint {
    Pod(TypedEndpoint<Pod>),
    ElasticQuota(TypedEndpoint<ElasticQuota>),
    Node(TypedEndpoint<Node>),
    Reservation(TypedEndpoint<Reservation>),
    ConfigMap(TypedEndpoint<ConfigMap>),
    ColocationProfile(TypedEndpoint<ClusterColocationProfile>),
}

impl Endpoint {
    pub fn spec(&self) -> &'static EndpointSpec {
        match self {
            Endpoint::Pod(e) => e.spec,
            Endpoint::ElasticQuota(e) => e.spec,
            Endpoint::Node(e) => e.spec,
            Endpoint::Reservation(e) => e.spec,
            Endpoint::ConfigMap(e) => e.spec,
            Endpoint::ColocationProfile(e) => e.spec,
        }
    }

    /// The rules of its chain, in order, with whether each may be shadowed.
    pub fn rules(&self) -> Vec<(&'static str, bool)> {
        match self {
            Endpoint::Pod(e) => e.chain.rules(),
            Endpoint::ElasticQuota(e) => e.chain.rules(),
            Endpoint::Node(e) => e.chain.rules(),
            Endpoint::Reservation(e) => e.chain.rules(),
            Endpoint::ConfigMap(e) => e.chain.rules(),
            Endpoint::ColocationProfile(e) => e.chain.rules(),
        }
    }

    /// Answers one AdmissionReview body of `shape` (scanned once, by whoever took its decode
    /// budget). A body that is not an AdmissionReview is an error (HTTP 400); anything else, an
    /// object that does not decode included, gets an answer.
    pub async fn review(
        &self,
        body: Bytes,
        shape: BodyShape,
        env: &Env,
        deadline: Deadline,
    ) -> Result<Vec<u8>, NoVerdict> {
        match self {
            Endpoint::Pod(e) => e.review(body, shape, env, deadline).await,
            Endpoint::ElasticQuota(e) => e.review(body, shape, env, deadline).await,
            Endpoint::Node(e) => e.review(body, shape, env, deadline).await,
            Endpoint::Reservation(e) => e.review(body, shape, env, deadline).await,
            Endpoint::ConfigMap(e) => e.review(body, shape, env, deadline).await,
            Endpoint::ColocationProfile(e) => e.review(body, shape, env, deadline).await,
        }
    }
}

macro_rules! endpoint_from {
    ($($variant:ident => $type:ty),*) => {$(
        impl From<TypedEndpoint<$type>> for Endpoint {
            fn from(endpoint: TypedEndpoint<$type>) -> Self {
                Endpoint::$variant(endpoint)
            }
        }
    )*};
}
endpoint_from!(Pod => Pod, ElasticQuota => ElasticQuota, Node => Node, Reservation => Reservation, ConfigMap => ConfigMap, ColocationProfile => ClusterColocationProfile);

/// The decoded-object bound every endpoint type meets.
pub trait Object:
    kube::Resource + Clone + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static
{
}
impl<T> Object for T where
    T: kube::Resource + Clone + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static
{
}

/// The plugins of a chain, and for a mutating one how its edit becomes a patch.
enum Chain<T: Object> {
    Mutating {
        plugins: Vec<Box<dyn Mutator<T>>>,
        differ: patch::Differ<T>,
        /// Denies a request without an object (a DELETE), as Koordinator's pod and quota
        /// mutating handlers do (they decode the object first, whatever the operation).
        requires_object: bool,
    },
    Validating {
        plugins: Vec<Box<dyn Validator<T>>>,
    },
}

impl<T: Object> Chain<T> {
    fn rules(&self) -> Vec<(&'static str, bool)> {
        match self {
            Chain::Mutating { plugins, .. } => {
                plugins.iter().map(|p| (p.name(), p.shadowable())).collect()
            }
            Chain::Validating { plugins } => {
                plugins.iter().map(|p| (p.name(), p.shadowable())).collect()
            }
        }
    }

    /// The name of the plugin at `position`.
    fn plugin_name(&self, position: usize) -> Option<&'static str> {
        match self {
            Chain::Mutating { plugins, .. } => plugins.get(position).map(|p| p.name()),
            Chain::Validating { plugins } => plugins.get(position).map(|p| p.name()),
        }
    }
}

pub struct TypedEndpoint<T: Object> {
    spec: &'static EndpointSpec,
    chain: Chain<T>,
}

impl<T: Object> TypedEndpoint<T> {
    /// A mutating chain whose patch is the whole-object diff.
    pub fn mutating(spec: &'static EndpointSpec, plugins: Vec<Box<dyn Mutator<T>>>) -> Self {
        Self::mutating_with_differ(spec, plugins, patch::diff::<T>)
    }

    /// A mutating chain whose patch `differ` computes.
    pub fn mutating_with_differ(
        spec: &'static EndpointSpec,
        plugins: Vec<Box<dyn Mutator<T>>>,
        differ: patch::Differ<T>,
    ) -> Self {
        let chain = Chain::Mutating {
            plugins,
            differ,
            requires_object: false,
        };
        Self { spec, chain }
    }

    /// A request without an object gets a 400 "there is no content to decode".
    pub fn requiring_object(mut self) -> Self {
        if let Chain::Mutating {
            requires_object, ..
        } = &mut self.chain
        {
            *requires_object = true;
        }
        self
    }

    pub fn validating(spec: &'static EndpointSpec, plugins: Vec<Box<dyn Validator<T>>>) -> Self {
        let chain = Chain::Validating { plugins };
        Self { spec, chain }
    }
}

impl<T: Object> TypedEndpoint<T> {
    /// Decodes the body, admits the request, encodes the answer.
    pub async fn review(
        &self,
        body: Bytes,
        shape: BodyShape,
        env: &Env,
        deadline: Deadline,
    ) -> Result<Vec<u8>, NoVerdict> {
        // A mutating chain keeps a copy of what it decoded: the two share the estimate.
        let copies = match self.chain {
            Chain::Mutating { .. } => 2,
            Chain::Validating { .. } => 1,
        };
        let (head, request) = decode::decode::<T>(self.spec, body, shape, copies, deadline).await?;
        let span = tracing::info_span!(
            "admission",
            uid = %Clipped(&head.uid, MAX_LOGGED_NAME),
            webhook = self.spec.path,
            operation = ?head.operation,
            namespace = %Clipped(head.namespace.as_deref().unwrap_or_default(), MAX_LOGGED_NAME),
            name = %Clipped(&head.name, MAX_LOGGED_NAME),
        );
        let verdict = self.admit(request, env, deadline).instrument(span).await;
        match verdict.late {
            Some(why) => Err(NoVerdict::TimedOut(why)),
            None => Ok(review::encode(&head.uid, &verdict)),
        }
    }

    /// Runs the chain within the API server's deadline, with its panics contained and its outcome
    /// counted.
    async fn admit(&self, request: Request<T>, env: &Env, deadline: Deadline) -> Verdict {
        let (spec, metrics) = (self.spec, &env.metrics);
        let start = Instant::now();
        let running = RunningPlugin::default();
        let run = async {
            match request {
                // Decoding a large object may already have spent the time.
                _ if deadline.passed() => timed_out(spec, env, deadline),
                Some(request) => self.run(request, env, &running, deadline).await,
                None => Verdict::allow(),
            }
        };
        let run = AssertUnwindSafe(run).catch_unwind();
        let verdict = match tokio::time::timeout_at(deadline.instant(), run).await {
            Ok(Ok(verdict)) => verdict,
            Ok(Err(panic)) => {
                let plugin = running.get().and_then(|p| self.chain.plugin_name(p));
                panicked(spec, env, plugin, panic)
            }
            Err(_elapsed) => timed_out(spec, env, deadline),
        };
        let labels = WebhookLabels { webhook: spec.path };
        metrics.admission.requests.get_or_create(&labels).inc();
        metrics
            .admission
            .request_duration
            .get_or_create(&labels)
            .observe(start.elapsed().as_secs_f64());
        if !verdict.allowed {
            metrics
                .admission
                .denials
                .get_or_create(&DenialLabels {
                    webhook: spec.path,
                    code: verdict.code,
                    rule: verdict.rule.unwrap_or_default(),
                })
                .inc();
            tracing::info!(
                code = verdict.code,
                message = %Clipped(verdict.message.as_deref().unwrap_or_default(), MAX_LOGGED_MESSAGE),
                "denied"
            );
        } else {
            tracing::debug!(patched = verdict.patch.is_some(), "allowed");
        }
        verdict
    }

    /// Runs the chain on a decoded request, or denies one whose objects did not decode.
    async fn run(
        &self,
        request: Result<Box<AdmissionRequest<T>>, String>,
        env: &Env,
        running: &RunningPlugin,
        deadline: Deadline,
    ) -> Verdict {
        let mut request = match request {
            Ok(request) => request,
            Err(e) => {
                env.metrics.admission.error(self.spec.path, "decode");
                return Verdict::deny(400, e);
            }
        };
        if request.object.is_none() && request.old_object.is_none() {
            env.metrics.admission.error(self.spec.path, "decode");
            return Verdict::deny(400, "there is no content to decode");
        }
        // Annotations the API server would not store: refused before any rule reads one (several
        // parse an annotation's JSON, which the decode budget counts as one string).
        let objects = [request.object.as_ref(), request.old_object.as_ref()];
        if let Some(refusal) = objects.into_iter().flatten().find_map(annotations_too_long) {
            return Verdict::deny(400, refusal);
        }
        let ctx = Ctx::new(&request, env, running).until(deadline);
        let (mut result, mutated) = match &self.chain {
            Chain::Validating { plugins } => (
                run_validators(plugins, &ctx, &env.metrics, self.spec.path).await,
                None,
            ),
            Chain::Mutating {
                plugins,
                differ,
                requires_object,
            } => match &request.object {
                None if *requires_object => {
                    env.metrics.admission.error(self.spec.path, "decode");
                    return Verdict::deny(400, "there is no content to decode");
                }
                // Nothing to mutate on DELETE.
                None => (Ok(()), None),
                Some(original) => {
                    let mut object = original.clone();
                    let result =
                        run_mutators(plugins, &ctx, &mut object, &env.metrics, self.spec.path)
                            .await;
                    (result, Some((object, differ)))
                }
            },
        };
        let notes = ctx.into_notes();
        let patch = match (mutated, request.object.take()) {
            (Some((after, differ)), Some(before)) if result.is_ok() => differ(before, after)
                .unwrap_or_else(|e| {
                    result = Err(Halt::Rejected(
                        Rejection::internal(format!("cannot encode the mutated object: {e}")),
                        None,
                    ));
                    None
                }),
            _ => None,
        };
        let mut verdict = match result {
            Ok(()) => Verdict {
                patch,
                ..Verdict::allow()
            },
            Err(Halt::OutOfTime) => return timed_out(self.spec, env, deadline),
            Err(Halt::Rejected(rejection, rule)) => {
                if rejection.code >= 500 {
                    env.metrics.admission.error(self.spec.path, "internal");
                }
                Verdict {
                    rule,
                    ..Verdict::deny(rejection.code, rejection.message)
                }
            }
        };
        verdict.warnings = notes.warnings;
        verdict.audit_annotations = notes.audit_annotations;
        verdict
            .audit_annotations
            .extend(findings_annotations(&notes.findings, &notes.would_change));
        verdict
    }
}

/// What rules with Audit found, as audit annotations (the API server prefixes each key with the
/// entry's name): `would-deny` and `denied`, JSON lists of the shadowed and the enforced refusals,
/// and `would-change`, the mutating rules in Audit whose change was not sent.
fn findings_annotations(
    findings: &[Finding],
    would_change: &[&'static str],
) -> impl Iterator<Item = (String, String)> {
    let list = |enforced: bool| {
        let found: Vec<&Finding> = findings.iter().filter(|f| f.enforced == enforced).collect();
        (!found.is_empty()).then(|| serde_json::to_string(&found).unwrap_or_default())
    };
    let changed =
        (!would_change.is_empty()).then(|| serde_json::to_string(would_change).unwrap_or_default());
    [
        (AUDIT_WOULD_DENY, list(false)),
        (AUDIT_DENIED, list(true)),
        (AUDIT_WOULD_CHANGE, changed),
    ]
    .into_iter()
    .filter_map(|(key, value)| Some((key.to_owned(), value?)))
}

pub const AUDIT_WOULD_DENY: &str = "would-deny";
pub const AUDIT_DENIED: &str = "denied";
pub const AUDIT_WOULD_CHANGE: &str = "would-change";

/// A chain that would outlive the API server's wait: answered before the API server gives up, with
/// an HTTP error rather than a verdict, so that the API server applies the failurePolicy of the entry
/// that called (configured per entry with `--failure-policy`; a verdict would be final whatever it
/// is), and its log says why.
fn timed_out(spec: &EndpointSpec, env: &Env, deadline: Deadline) -> Verdict {
    env.metrics.admission.error(spec.path, "timeout");
    let message = format!(
        "koord-webhook {} did not finish within {:?} (the API server waits {:?})",
        spec.path, deadline.budget, deadline.api_timeout
    );
    tracing::warn!("{message}");
    Verdict {
        late: Some(message),
        ..Verdict::deny(504, "")
    }
}

/// A panic fails its request alone: a 500 naming the plugin that was running, if one was.
fn panicked(
    spec: &EndpointSpec,
    env: &Env,
    plugin: Option<&'static str>,
    panic: Box<dyn std::any::Any + Send>,
) -> Verdict {
    let metrics = &env.metrics;
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned());
    match plugin {
        Some(plugin) => {
            let webhook = spec.path;
            metrics
                .admission
                .plugin_panics
                .get_or_create(&PluginLabels { webhook, plugin })
                .inc();
            metrics.admission.error(webhook, "internal");
            tracing::error!(webhook, plugin, panic = %Clipped(&what, MAX_LOGGED_MESSAGE), "plugin panicked");
            Verdict::deny(
                500,
                format!("internal error: plugin {plugin} failed: {what}"),
            )
        }
        None => {
            metrics.admission.error(spec.path, "panic");
            tracing::error!(panic = %Clipped(&what, MAX_LOGGED_MESSAGE), "handler panicked");
            Verdict::deny(
                500,
                format!("internal error in {}: the handler panicked", spec.path),
            )
        }
    }
}

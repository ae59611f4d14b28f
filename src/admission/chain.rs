//! Plugins and the chains that run them.
//!
//! A plugin is one rule: a small type implementing [`Mutator`] or [`Validator`] for the object type of
//! its endpoint. Chains run their plugins in order, time each run into the metrics, and note which
//! plugin is running, so that the endpoint, which catches panics, can name the one that panicked.
//! Mutating chains work on a copy of the object; validating chains stop at the first rejection.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use futures::future::BoxFuture;
use kube::core::admission::{AdmissionRequest, Operation};

use super::actions::Action;
use super::deadline::Deadline;
use super::env::{Env, Services};
use super::outcome::{PluginResult, Rejection};
use super::ports::WouldDeny;
use super::settings::Settings;
use crate::cache::Cache;
use crate::entries::WebhookKind;
use crate::features::FeatureGates;
use crate::metrics::Metrics;
use crate::telemetry::Clipped;

/// The position in its chain of the plugin running, if any: what a caught panic is blamed on. An
/// atomic rather than a lock: it is set twice per plugin on every request.
#[derive(Default)]
pub struct RunningPlugin(AtomicUsize);

impl RunningPlugin {
    fn set(&self, position: Option<usize>) {
        self.0
            .store(position.map_or(0, |p| p + 1), Ordering::Relaxed);
    }

    pub fn get(&self) -> Option<usize> {
        self.0.load(Ordering::Relaxed).checked_sub(1)
    }
}

/// Everything a plugin may read for one request.
pub struct Ctx<'a, T: kube::Resource> {
    pub request: &'a AdmissionRequest<T>,
    pub cache: &'a Cache,
    pub gates: &'a FeatureGates,
    pub services: &'a Services,
    pub settings: &'a Settings,
    notes: Mutex<Notes>,
    running: &'a RunningPlugin,
    deadline: Option<Deadline>,
    /// Set while a shadowed rule runs: it sees the request as a dry run, so it writes nothing.
    shadowed: AtomicBool,
}

/// Audit annotations and warnings plugins add to the response, and what shadowed rules found.
#[derive(Default, Debug)]
pub struct Notes {
    pub audit_annotations: BTreeMap<String, String>,
    pub warnings: Vec<String>,
    /// Refusals recorded for the audit log (rules whose action includes Audit).
    pub findings: Vec<Finding>,
    /// Mutating rules in Audit whose change was not sent.
    pub would_change: Vec<&'static str>,
}

/// A rule's refusal as the audit annotation records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    pub rule: &'static str,
    pub code: u16,
    pub message: String,
    /// The refusal denied the request (Deny+Audit) rather than being shadowed.
    #[serde(skip)]
    pub enforced: bool,
}

impl<'a, T: kube::Resource> Ctx<'a, T> {
    pub fn new(request: &'a AdmissionRequest<T>, env: &'a Env, running: &'a RunningPlugin) -> Self {
        Self {
            request,
            cache: &env.cache,
            gates: &env.gates,
            services: &env.services,
            settings: &env.settings,
            notes: Mutex::default(),
            running,
            deadline: None,
            shadowed: AtomicBool::new(false),
        }
    }

    /// Whether the rule running must write nothing: the request is a dry run, or the rule is
    /// shadowed (its finding is shown or recorded, not enforced).
    pub fn dry_run(&self) -> bool {
        self.request.dry_run || self.shadowed.load(Ordering::Relaxed)
    }

    /// The chain stops before a plugin once `deadline` has passed.
    pub fn until(mut self, deadline: Deadline) -> Self {
        self.deadline = Some(deadline);
        self
    }

    fn out_of_time(&self) -> bool {
        self.deadline.is_some_and(|d| d.passed())
    }

    pub fn operation(&self) -> &Operation {
        &self.request.operation
    }

    pub fn object(&self) -> Option<&T> {
        self.request.object.as_ref()
    }

    pub fn old_object(&self) -> Option<&T> {
        self.request.old_object.as_ref()
    }

    /// Adds an audit annotation; the API server prefixes it with the webhook entry name.
    pub fn annotate(&self, key: impl Into<String>, value: impl Into<String>) {
        self.notes_mut()
            .audit_annotations
            .insert(key.into(), value.into());
    }

    /// Adds a warning shown to the client that made the API request.
    pub fn warn(&self, warning: impl Into<String>) {
        self.notes_mut().warnings.push(warning.into());
    }

    pub fn into_notes(self) -> Notes {
        self.notes
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn notes_mut(&self) -> std::sync::MutexGuard<'_, Notes> {
        // A panicking plugin may have poisoned it; its notes are still worth keeping.
        self.notes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A plugin's answer: at once for pure rules, later for those that wait on something.
pub enum Step<'a> {
    Ready(PluginResult),
    Pending(BoxFuture<'a, PluginResult>),
}

impl From<PluginResult> for Step<'_> {
    fn from(result: PluginResult) -> Self {
        Step::Ready(result)
    }
}

/// A rule that changes the object. It edits `object` in place; the chain computes the patch.
pub trait Mutator<T: kube::Resource>: Send + Sync {
    fn name(&self) -> &'static str;
    /// Whether `--rule-action` may make it Audit (false: a rule that keeps the webhook safe).
    fn shadowable(&self) -> bool {
        true
    }
    /// Whether the feature gates let this plugin run.
    fn enabled(&self, _gates: &FeatureGates) -> bool {
        true
    }
    fn mutate<'a>(&'a self, ctx: &'a Ctx<'a, T>, object: &'a mut T) -> Step<'a>;
}

/// A rule that accepts or rejects the request.
pub trait Validator<T: kube::Resource>: Send + Sync {
    fn name(&self) -> &'static str;
    /// Whether `--rule-action` may make it Warn or Audit (false: a rule that keeps the webhook
    /// safe).
    fn shadowable(&self) -> bool {
        true
    }
    fn enabled(&self, _gates: &FeatureGates) -> bool {
        true
    }
    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, T>) -> Step<'a>;
}

/// Why a chain stopped before its end.
#[derive(Debug)]
pub enum Halt {
    /// A rule (`None`: the framework) refused the request: the answer.
    Rejected(Rejection, Option<&'static str>),
    /// The review's deadline passed between two plugins.
    OutOfTime,
}

/// Runs one plugin step, timed, with the plugin noted as running while it does.
async fn run_step<'a>(
    running: &RunningPlugin,
    position: usize,
    metrics: &Metrics,
    webhook: &'static str,
    plugin: &'static str,
    step: impl FnOnce() -> Step<'a>,
) -> PluginResult {
    let start = Instant::now();
    running.set(Some(position));
    let result = match step() {
        Step::Ready(result) => result,
        Step::Pending(future) => future.await,
    };
    running.set(None);
    metrics
        .admission
        .observe_plugin(webhook, plugin, start.elapsed());
    result
}

/// Runs the mutators in order on `object`; stops at the first rejection of an enforced rule. A
/// rule in Audit runs on a copy: its refusal or its change is recorded, not applied.
pub async fn run_mutators<T: kube::Resource + Clone + PartialEq>(
    plugins: &[Box<dyn Mutator<T>>],
    ctx: &Ctx<'_, T>,
    object: &mut T,
    metrics: &Metrics,
    webhook: &'static str,
) -> Result<(), Halt> {
    for (position, plugin) in plugins.iter().enumerate() {
        if !plugin.enabled(ctx.gates) {
            continue;
        }
        if ctx.out_of_time() {
            return Err(Halt::OutOfTime);
        }
        let rule = RuleRun::new(plugin.name(), ctx, WebhookKind::Mutating, webhook, metrics);
        if rule.action.enforces() {
            let result = run_step(ctx.running, position, metrics, webhook, rule.name, || {
                plugin.mutate(ctx, object)
            })
            .await;
            rule.enforced(result)?;
        } else {
            let mut copy = object.clone();
            ctx.shadowed.store(true, Ordering::Relaxed);
            let result = run_step(ctx.running, position, metrics, webhook, rule.name, || {
                plugin.mutate(ctx, &mut copy)
            })
            .await;
            ctx.shadowed.store(false, Ordering::Relaxed);
            match result {
                Err(rejection) => rule.shadowed(rejection),
                Ok(()) if copy != *object => rule.would_change(),
                Ok(()) => {}
            }
        }
    }
    Ok(())
}

/// Runs the validators in order; the first rejection of an enforced rule is the answer. A
/// shadowed rule runs as on a dry run: its refusal is shown or recorded and the chain goes on.
pub async fn run_validators<T: kube::Resource>(
    plugins: &[Box<dyn Validator<T>>],
    ctx: &Ctx<'_, T>,
    metrics: &Metrics,
    webhook: &'static str,
) -> Result<(), Halt> {
    for (position, plugin) in plugins.iter().enumerate() {
        if !plugin.enabled(ctx.gates) {
            continue;
        }
        if ctx.out_of_time() {
            return Err(Halt::OutOfTime);
        }
        let rule = RuleRun::new(
            plugin.name(),
            ctx,
            WebhookKind::Validating,
            webhook,
            metrics,
        );
        let shadowed = !rule.action.enforces();
        ctx.shadowed.store(shadowed, Ordering::Relaxed);
        let result = run_step(ctx.running, position, metrics, webhook, rule.name, || {
            plugin.validate(ctx)
        })
        .await;
        ctx.shadowed.store(false, Ordering::Relaxed);
        match result {
            Err(rejection) if shadowed => rule.shadowed(rejection),
            result => rule.enforced(result)?,
        }
    }
    Ok(())
}

/// One rule's run in a chain: what its action makes of its result.
struct RuleRun<'c, 'a, T: kube::Resource> {
    name: &'static str,
    action: Action,
    kind: WebhookKind,
    webhook: &'static str,
    ctx: &'c Ctx<'a, T>,
    metrics: &'c Metrics,
}

impl<'c, 'a, T: kube::Resource> RuleRun<'c, 'a, T> {
    fn new(
        name: &'static str,
        ctx: &'c Ctx<'a, T>,
        kind: WebhookKind,
        webhook: &'static str,
        metrics: &'c Metrics,
    ) -> Self {
        let action = ctx.settings.actions.of(webhook, name);
        Self {
            name,
            action,
            kind,
            webhook,
            ctx,
            metrics,
        }
    }

    fn count(&self, result: &'static str) {
        self.metrics.admission.rule_result(
            self.webhook,
            self.name,
            self.action.label(self.kind),
            result,
        );
    }

    /// An enforced rule's refusal is the answer (recorded too with Audit).
    fn enforced(&self, result: PluginResult) -> Result<(), Halt> {
        let Err(rejection) = result else {
            return Ok(());
        };
        self.count("deny");
        if self.action.audits() {
            self.record(&rejection, true);
        }
        Err(Halt::Rejected(rejection, Some(self.name)))
    }

    /// A shadowed rule's refusal: shown as a warning, recorded for the audit log, counted, logged.
    fn shadowed(&self, rejection: Rejection) {
        self.count("would_deny");
        let request = self.ctx.request;
        tracing::info!(
            rule = self.name,
            action = self.action.label(self.kind),
            user = %Clipped::name(request.user_info.username.as_deref().unwrap_or_default()),
            kind = %Clipped::name(&request.kind.kind),
            code = rejection.code,
            message = %Clipped::message(&rejection.message),
            "would deny"
        );
        if let Some(sink) = &self.ctx.services.findings {
            sink.would_deny(WouldDeny {
                rule: self.name,
                namespace: request.namespace.clone().unwrap_or_default(),
                kind: request.kind.kind.clone(),
                name: request.name.clone(),
                message: rejection.message.clone(),
            });
        }
        if self.action.warns() {
            self.ctx.warn(warning(self.name, &rejection.message));
        }
        if self.action.audits() {
            self.record(&rejection, false);
        }
    }

    /// A mutating rule in Audit would have changed the object.
    fn would_change(&self) {
        self.count("would_change");
        tracing::info!(rule = self.name, "would change");
        self.ctx.notes_mut().would_change.push(self.name);
    }

    fn record(&self, rejection: &Rejection, enforced: bool) {
        self.ctx.notes_mut().findings.push(Finding {
            rule: self.name,
            code: rejection.code,
            message: Clipped::message(&rejection.message).to_string(),
            enforced,
        });
    }
}

/// The API server keeps each warning's first 256 characters when a response's warnings are long:
/// the message is clipped below that (with its clipped length), so the rule's name always shows.
const MAX_WARNING_BYTES: usize = 200;

/// A shadowed refusal as the client reads it: `[Rule] message`.
pub fn warning(rule: &str, message: &str) -> String {
    Clipped(&format!("[{rule}] {message}"), MAX_WARNING_BYTES).to_string()
}

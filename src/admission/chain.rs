//! Plugins and the chains that run them.
//!
//! A plugin is one rule: a small type implementing [`Mutator`] or [`Validator`] for the object type of
//! its endpoint. Chains run their plugins in order, time each run into the metrics, and note which
//! plugin is running, so that the endpoint, which catches panics, can name the one that panicked.
//! Mutating chains work on a copy of the object; validating chains stop at the first rejection.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use futures::future::BoxFuture;
use kube::core::admission::{AdmissionRequest, Operation};

use super::deadline::Deadline;
use super::env::{Env, Services};
use super::outcome::{PluginResult, Rejection};
use super::settings::Settings;
use crate::cache::Cache;
use crate::features::FeatureGates;
use crate::metrics::Metrics;

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
}

/// Audit annotations and warnings plugins add to the response.
#[derive(Default, Debug)]
pub struct Notes {
    pub audit_annotations: BTreeMap<String, String>,
    pub warnings: Vec<String>,
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
        }
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
    /// Whether the feature gates let this plugin run.
    fn enabled(&self, _gates: &FeatureGates) -> bool {
        true
    }
    fn mutate<'a>(&'a self, ctx: &'a Ctx<'a, T>, object: &'a mut T) -> Step<'a>;
}

/// A rule that accepts or rejects the request.
pub trait Validator<T: kube::Resource>: Send + Sync {
    fn name(&self) -> &'static str;
    fn enabled(&self, _gates: &FeatureGates) -> bool {
        true
    }
    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, T>) -> Step<'a>;
}

/// Why a chain stopped before its end.
#[derive(Debug)]
pub enum Halt {
    /// A plugin refused the request: the answer.
    Rejected(Rejection),
    /// The review's deadline passed between two plugins.
    OutOfTime,
}

impl From<Rejection> for Halt {
    fn from(rejection: Rejection) -> Self {
        Halt::Rejected(rejection)
    }
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

/// Runs the mutators in order on `object`; stops at the first rejection.
pub async fn run_mutators<T: kube::Resource>(
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
        run_step(
            ctx.running,
            position,
            metrics,
            webhook,
            plugin.name(),
            || plugin.mutate(ctx, object),
        )
        .await?;
    }
    Ok(())
}

/// Runs the validators in order; the first rejection is the answer.
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
        run_step(
            ctx.running,
            position,
            metrics,
            webhook,
            plugin.name(),
            || plugin.validate(ctx),
        )
        .await?;
    }
    Ok(())
}

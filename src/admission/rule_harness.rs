//! One rule run the way its chain runs it, for the tests beside each rule: a request, an
//! environment of gates, settings and cache, and what became of the rule. "Gate off", "flag set"
//! and "shadowed" are one line each:
//!
//! ```ignore
//! let env = RuleEnv::new().with(|s| s.max_reservation_ttl = Some(limit));
//! assert_eq!(env.mutate(&TtlLimit, &request).await, Ran::forbidden("…"));
//! assert_eq!(env.gate(Gate::ReservationTtlLimit, false).mutate(&TtlLimit, &request).await, Ran::Skipped);
//! assert_eq!(env.shadowing("ReservationTtlLimit").mutate(&TtlLimit, &request).await, Ran::shadowed("…"));
//! ```
//!
//! The rule runs through `chain.rs`'s own `run_mutators`/`run_validators` with a chain of one, so
//! its gate, its `--rule-action` and shadowing (a dry run for the rule, its refusal recorded) are
//! those of a served request.

use kube::core::admission::{AdmissionRequest, Operation};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::actions::{Action, RuleActions};
use super::chain::{Ctx, Halt, Mutator, RunningPlugin, Validator, run_mutators, run_validators};
use super::env::{Env, Services};
use super::outcome::Rejection;
use super::settings::Settings;
use crate::cache::{CacheWriter, CachedObject};
use crate::features::{FeatureGates, Gate};
use crate::metrics::Metrics;

/// A CREATE of `object` (its kind's AdmissionRequest, as the API server sends it).
pub fn create<T: kube::Resource + DeserializeOwned>(object: Value) -> AdmissionRequest<T> {
    request(Operation::Create, Some(object), None)
}

/// An UPDATE from `old` to `object`.
pub fn update<T: kube::Resource + DeserializeOwned>(
    object: Value,
    old: Value,
) -> AdmissionRequest<T> {
    request(Operation::Update, Some(object), Some(old))
}

/// A request of any operation.
pub fn request<T: kube::Resource + DeserializeOwned>(
    operation: Operation,
    object: Option<Value>,
    old: Option<Value>,
) -> AdmissionRequest<T> {
    let meta = object.as_ref().or(old.as_ref()).map(|o| &o["metadata"]);
    let text = |key: &str| {
        meta.and_then(|m| m[key].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    serde_json::from_value(json!({
        "uid": "harness", "kind": {"group": "", "version": "v1", "kind": "Object"},
        "resource": {"group": "", "version": "v1", "resource": "objects"},
        "operation": operation, "name": text("name"), "namespace": text("namespace"),
        "userInfo": {"username": "harness"}, "object": object, "oldObject": old, "dryRun": false,
    }))
    .expect("a request the harness builds decodes")
}

/// What became of one rule on one request.
#[derive(Debug, PartialEq)]
pub enum Ran {
    /// Its gate is off: it did not run.
    Skipped,
    /// Neither refused nor changed anything.
    Allowed,
    /// A mutator changed the object to this.
    Changed(Value),
    /// Refused (enforced).
    Refused(Rejection),
    /// Refused while shadowed: recorded (`code`, `message`), not enforced.
    Shadowed(u16, String),
    /// A shadowed mutator would have changed the object.
    WouldChange,
}

impl Ran {
    /// Refused with 403 and `message`.
    pub fn forbidden(message: &str) -> Self {
        Ran::Refused(Rejection::forbidden(message))
    }

    /// Refused with 403 and `message` while shadowed.
    pub fn shadowed(message: &str) -> Self {
        Ran::Shadowed(403, message.to_owned())
    }
}

/// Gates, settings and cache for one rule's run; every gate at its default, the default settings
/// and an empty cache unless set.
pub struct RuleEnv {
    gates: FeatureGates,
    settings: Settings,
    cache: CacheWriter,
    /// The rule `shadowing` named: the rule run must be that one (a misspelt name tests nothing).
    shadowed: Option<&'static str>,
}

impl Default for RuleEnv {
    fn default() -> Self {
        Self::new()
    }
}

impl RuleEnv {
    pub fn new() -> Self {
        Self {
            gates: FeatureGates::default(),
            settings: Settings::default(),
            cache: CacheWriter::default(),
            shadowed: None,
        }
    }

    /// With `gate` on or off.
    pub fn gate(mut self, gate: Gate, on: bool) -> Self {
        self.gates.set(gate, on);
        self
    }

    /// With settings (what the rule flags set) changed by `set`.
    pub fn with(mut self, set: impl FnOnce(&mut Settings)) -> Self {
        set(&mut self.settings);
        self
    }

    /// With `object` in the cache.
    pub fn cached(mut self, object: CachedObject) -> Self {
        self.cache.apply(object);
        self
    }

    /// With the rule named `rule` in Audit (`--rule-action RULE=Audit`).
    pub fn shadowing(mut self, rule: &'static str) -> Self {
        self.settings.actions = RuleActions::from_parsed(&[(rule, Action::AUDIT)]);
        self.shadowed = Some(rule);
        self
    }

    /// Panics when `shadowing` named another rule than the one run.
    fn check_shadowed(&self, name: &'static str) {
        if let Some(shadowed) = self.shadowed {
            assert_eq!(
                shadowed, name,
                "shadowing names a rule other than the one run"
            );
        }
    }

    fn env(&self) -> Env {
        Env {
            cache: self.cache.reader(),
            gates: self.gates,
            metrics: Metrics::new(),
            services: Services::default(),
            settings: self.settings.clone(),
        }
    }

    /// Runs `rule` on `request` as `/mutate-…` would.
    pub async fn mutate<T, M>(&self, rule: &M, request: &AdmissionRequest<T>) -> Ran
    where
        T: kube::Resource + Clone + PartialEq + serde::Serialize,
        M: Mutator<T> + Clone + 'static,
    {
        self.check_shadowed(rule.name());
        if !rule.enabled(&self.gates) {
            return Ran::Skipped;
        }
        let env = self.env();
        let running = RunningPlugin::default();
        let ctx = Ctx::new(request, &env, &running);
        let chain: [Box<dyn Mutator<T>>; 1] = [Box::new(rule.clone())];
        // A request without an object (a DELETE) is not mutated: the endpoint skips it.
        let Some(mut object) = request.object.clone() else {
            return Ran::Allowed;
        };
        let halted = run_mutators(&chain, &ctx, &mut object, &env.metrics, "/harness").await;
        let changed = Some(&object) != request.object.as_ref();
        outcome(
            halted,
            ctx,
            || Ran::Changed(serde_json::to_value(&object).expect("the object encodes")),
            changed,
        )
    }

    /// Runs `rule` on `request` as `/validate-…` would.
    pub async fn validate<T, V>(&self, rule: &V, request: &AdmissionRequest<T>) -> Ran
    where
        T: kube::Resource,
        V: Validator<T> + Clone + 'static,
    {
        self.check_shadowed(rule.name());
        if !rule.enabled(&self.gates) {
            return Ran::Skipped;
        }
        let env = self.env();
        let running = RunningPlugin::default();
        let ctx = Ctx::new(request, &env, &running);
        let chain: [Box<dyn Validator<T>>; 1] = [Box::new(rule.clone())];
        let halted = run_validators(&chain, &ctx, &env.metrics, "/harness").await;
        outcome(halted, ctx, || Ran::Allowed, false)
    }
}

fn outcome<T: kube::Resource>(
    halted: Result<(), Halt>,
    ctx: Ctx<'_, T>,
    changed: impl FnOnce() -> Ran,
    was_changed: bool,
) -> Ran {
    match halted {
        Err(Halt::Rejected(rejection, _)) => return Ran::Refused(rejection),
        Err(Halt::OutOfTime) => unreachable!("the harness sets no deadline"),
        Ok(()) => {}
    }
    let notes = ctx.into_notes();
    if let Some(finding) = notes.findings.into_iter().next() {
        return Ran::Shadowed(finding.code, finding.message);
    }
    if !notes.would_change.is_empty() {
        return Ran::WouldChange;
    }
    if was_changed { changed() } else { Ran::Allowed }
}

//! An endpoint: a typed chain behind one admission path.
//!
//! It filters the request by resource, decodes the objects into its type, runs its chain and turns the
//! result into a [`Verdict`]. The type parameter is erased behind [`Endpoint`] so the server can hold
//! every path in one table.

use futures::future::BoxFuture;
use serde::{Serialize, de::DeserializeOwned};

use super::chain::{Ctx, Mutator, Validator, run_mutators, run_validators};
use super::colocation::dice::{Dice, SystemDice};
use super::outcome::Rejection;
use super::patch;
use super::review::{Verdict, WireRequest};
use super::settings::Settings;
use super::webhooks::WebhookSpec;
use crate::cache::Cache;
use crate::features::FeatureGates;
use crate::metrics::Metrics;

/// What every request of a server shares.
pub struct Env {
    pub cache: Cache,
    pub gates: FeatureGates,
    pub metrics: Metrics,
    pub services: Services,
    pub settings: Settings,
}

/// Outside systems some plugins write to. Absent in `review` and `serve --state`.
#[derive(Clone, Default)]
pub struct Services {
    /// Where quota evaluation records what it admitted (spec 2.6).
    pub quota_store:
        Option<std::sync::Arc<dyn crate::admission::elastic_quota::quota_store::QuotaStore>>,
    /// The random source of colocation profile probabilities (default: the system's).
    pub dice: Option<std::sync::Arc<dyn Dice>>,
}

impl Services {
    pub fn dice(&self) -> &dyn Dice {
        match &self.dice {
            Some(dice) => dice.as_ref(),
            None => &SystemDice,
        }
    }
}

pub trait Endpoint: Send + Sync {
    fn spec(&self) -> &'static WebhookSpec;
    fn admit<'a>(&'a self, request: &'a WireRequest<'a>, env: &'a Env) -> BoxFuture<'a, Verdict>;
}

/// The decoded-object bound every endpoint type meets.
pub trait Object:
    kube::Resource + Clone + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static
{
}
impl<T> Object for T where
    T: kube::Resource + Clone + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static
{
}

enum Chain<T: Object> {
    Mutating(Vec<Box<dyn Mutator<T>>>),
    Validating(Vec<Box<dyn Validator<T>>>),
}

pub struct TypedEndpoint<T: Object> {
    spec: &'static WebhookSpec,
    chain: Chain<T>,
}

impl<T: Object> TypedEndpoint<T> {
    pub fn mutating(spec: &'static WebhookSpec, plugins: Vec<Box<dyn Mutator<T>>>) -> Self {
        Self {
            spec,
            chain: Chain::Mutating(plugins),
        }
    }

    pub fn validating(spec: &'static WebhookSpec, plugins: Vec<Box<dyn Validator<T>>>) -> Self {
        Self {
            spec,
            chain: Chain::Validating(plugins),
        }
    }

    fn accepts(&self, request: &WireRequest<'_>) -> bool {
        request.resource.resource == self.spec.resource
            && request.sub_resource() == self.spec.sub_resource
    }

    async fn run(&self, wire: &WireRequest<'_>, env: &Env) -> Verdict {
        if !self.accepts(wire) {
            return Verdict::allow();
        }
        let request = match wire.decode::<T>() {
            Ok(request) => request,
            Err(e) => {
                env.metrics.error(self.spec.path, "decode");
                return Verdict::deny(400, e);
            }
        };
        if request.object.is_none() && request.old_object.is_none() {
            env.metrics.error(self.spec.path, "decode");
            return Verdict::deny(400, "there is no content to decode");
        }
        let ctx = Ctx::new(&request, env);
        let (result, patch) = match &self.chain {
            Chain::Validating(plugins) => (
                run_validators(plugins, &ctx, &env.metrics, self.spec.path).await,
                None,
            ),
            Chain::Mutating(plugins) => match &request.object {
                // Nothing to mutate on DELETE.
                None => (Ok(()), None),
                Some(original) => {
                    let mut object = original.clone();
                    let result =
                        run_mutators(plugins, &ctx, &mut object, &env.metrics, self.spec.path)
                            .await;
                    let patch = match result {
                        Ok(()) if &object != original => {
                            patch::diff(original, &object).map_err(|e| {
                                Rejection::internal(format!(
                                    "cannot encode the mutated object: {e}"
                                ))
                            })
                        }
                        _ => Ok(None),
                    };
                    match patch {
                        Ok(patch) => (result, patch),
                        Err(e) => (Err(e), None),
                    }
                }
            },
        };
        let notes = ctx.into_notes();
        let mut verdict = match result {
            Ok(()) => Verdict {
                patch,
                ..Verdict::allow()
            },
            Err(rejection) => {
                if rejection.code >= 500 {
                    env.metrics.error(self.spec.path, "internal");
                }
                Verdict::deny(rejection.code, rejection.message)
            }
        };
        verdict.audit_annotations = notes.audit_annotations;
        verdict.warnings = notes.warnings;
        verdict
    }
}

impl<T: Object> Endpoint for TypedEndpoint<T> {
    fn spec(&self) -> &'static WebhookSpec {
        self.spec
    }

    fn admit<'a>(&'a self, request: &'a WireRequest<'a>, env: &'a Env) -> BoxFuture<'a, Verdict> {
        Box::pin(self.run(request, env))
    }
}

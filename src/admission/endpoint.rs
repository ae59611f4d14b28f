//! An endpoint: a typed chain behind one admission path.
//!
//! It filters the request by resource, decodes the objects into its type, runs its chain and turns the
//! result into a [`Verdict`]. The type parameter is erased behind [`Endpoint`] so the server can hold
//! every path in one table.

use futures::future::BoxFuture;
use kube::core::GroupVersionResource;
use kube::core::admission::{AdmissionRequest, Operation};
use serde::{Serialize, de::DeserializeOwned};

use super::chain::{Ctx, Mutator, Validator, run_mutators, run_validators};
use super::colocation::dice::{Dice, SystemDice};
use super::outcome::Rejection;
use super::patch;
use super::review::{self, MalformedReview, Verdict, WireRequest};
use super::settings::Settings;
use super::skip_fields::SkipFields;
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
    pub quota_store: Option<std::sync::Arc<dyn crate::admission::pod::quota::store::QuotaStore>>,
    /// Where ElasticQuota changes are serialised across replicas (cluster mode).
    pub quota_ledger: Option<std::sync::Arc<crate::admission::elastic_quota::ledger::Ledger>>,
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

/// Who a request is about, for its log span and its response.
pub struct Head {
    pub uid: String,
    pub operation: Operation,
    pub namespace: Option<String>,
    pub name: String,
}

pub trait Endpoint: Send + Sync {
    fn spec(&self) -> &'static WebhookSpec;
    /// Decodes `body` for this endpoint and returns the run of its chain. A body that is not an
    /// AdmissionReview is an error (HTTP 400); an object that does not decode is a denial.
    fn decode<'a>(
        &'a self,
        body: &[u8],
        env: &'a Env,
    ) -> Result<(Head, BoxFuture<'a, Verdict>), MalformedReview>;
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

/// The plugins of a chain, and for a mutating one how its edit becomes a patch.
enum Chain<T: Object> {
    Mutating {
        plugins: Vec<Box<dyn Mutator<T>>>,
        differ: patch::Differ<T>,
    },
    Validating {
        plugins: Vec<Box<dyn Validator<T>>>,
    },
}

pub struct TypedEndpoint<T: Object> {
    spec: &'static WebhookSpec,
    chain: Chain<T>,
    /// Fields none of the plugins reads or writes, left out when objects are decoded.
    skip: Option<&'static SkipFields>,
}

impl<T: Object> TypedEndpoint<T> {
    /// A mutating chain whose patch is the whole-object diff.
    pub fn mutating(spec: &'static WebhookSpec, plugins: Vec<Box<dyn Mutator<T>>>) -> Self {
        Self::mutating_with_differ(spec, plugins, patch::diff::<T>)
    }

    /// A mutating chain whose patch `differ` computes. The differ must diff below every field that
    /// both sides hold (never replace an object whole), so that fields left out of both by
    /// [`Self::skipping`] stay out of the patch.
    pub fn mutating_with_differ(
        spec: &'static WebhookSpec,
        plugins: Vec<Box<dyn Mutator<T>>>,
        differ: patch::Differ<T>,
    ) -> Self {
        let chain = Chain::Mutating { plugins, differ };
        Self {
            spec,
            chain,
            skip: None,
        }
    }

    pub fn validating(spec: &'static WebhookSpec, plugins: Vec<Box<dyn Validator<T>>>) -> Self {
        let chain = Chain::Validating { plugins };
        Self {
            spec,
            chain,
            skip: None,
        }
    }

    /// Objects are decoded without the fields `skip` names: none of the plugins reads them, and
    /// none writes them unless it says so ([`Mutator::edits_any_field`]).
    pub fn skipping(mut self, skip: &'static SkipFields) -> Self {
        self.skip = Some(skip);
        self
    }

    /// What to leave out of this request's objects: nothing while a mutator may edit any field.
    fn skip(&self, env: &Env) -> Option<&'static SkipFields> {
        let skip = self.skip?;
        match &self.chain {
            Chain::Mutating { plugins, .. } => (!plugins
                .iter()
                .any(|p| p.enabled(&env.gates) && p.edits_any_field(&env.cache)))
            .then_some(skip),
            Chain::Validating { .. } => Some(skip),
        }
    }

    fn accepts(&self, resource: &GroupVersionResource, sub_resource: Option<&str>) -> bool {
        resource.resource == self.spec.resource
            && sub_resource.unwrap_or_default() == self.spec.sub_resource
    }

    /// Runs the chain on a decoded request, or denies one whose objects did not decode.
    async fn run(&self, request: Result<Box<AdmissionRequest<T>>, String>, env: &Env) -> Verdict {
        let mut request = match request {
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
        let (mut result, mutated) = match &self.chain {
            Chain::Validating { plugins } => (
                run_validators(plugins, &ctx, &env.metrics, self.spec.path).await,
                None,
            ),
            Chain::Mutating { plugins, differ } => match &request.object {
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
                    result = Err(Rejection::internal(format!(
                        "cannot encode the mutated object: {e}"
                    )));
                    None
                }),
            _ => None,
        };
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

    fn decode<'a>(
        &'a self,
        body: &[u8],
        env: &'a Env,
    ) -> Result<(Head, BoxFuture<'a, Verdict>), MalformedReview> {
        let head =
            |uid: &str, operation: &Operation, namespace: &Option<String>, name: &str| Head {
                uid: uid.to_owned(),
                operation: operation.clone(),
                namespace: namespace.clone(),
                name: name.to_owned(),
            };
        // `None`: a request for another resource, answered with an allow.
        let (head, request) = match review::parse_typed::<T>(body, self.skip(env)) {
            Some(r) => (
                head(&r.uid, &r.operation, &r.namespace, &r.name),
                self.accepts(&r.resource, r.sub_resource.as_deref())
                    .then_some(Ok(r)),
            ),
            None => {
                // Something is off: two steps tell a bad envelope from a bad object.
                let w = WireRequest::parse(body)?;
                (
                    head(&w.uid, &w.operation, &w.namespace, &w.name),
                    self.accepts(&w.resource, w.sub_resource.as_deref())
                        .then(|| w.decode::<T>().map(Box::new)),
                )
            }
        };
        let run: BoxFuture<'a, Verdict> = match request {
            Some(request) => Box::pin(self.run(request, env)),
            None => Box::pin(std::future::ready(Verdict::allow())),
        };
        Ok((head, run))
    }
}

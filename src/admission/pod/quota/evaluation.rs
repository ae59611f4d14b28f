//! With `EnableQuotaAdmission`, a pod is admitted only if its quota has room for it.

use std::sync::Arc;

use crate::admission::pod::object::Pod;
use kube::core::admission::Operation;

use super::evaluator::{AUDIT_CHILD_REQUEST, Admission, ChildRequests, Evaluator};
use super::replace_resources;
use super::resolve::{resolve_quota_name, resolve_quota_name_of};
use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::outcome::Rejection;
use crate::admission::pod::object::pod_namespace;
use crate::admission::pod::requests::{negative_request, pod_requests};
use crate::apis::keys::QUOTA_NAME;
use crate::apis::keys::{DEFAULT_QUOTA, ROOT_QUOTA, SYSTEM_QUOTA};
use crate::cache::IndexedPod;
use crate::features::{FeatureGates, Gate};
use crate::resources::Resources;

#[derive(Default)]
pub struct QuotaEvaluation {
    evaluator: Arc<Evaluator>,
}

impl Validator<Pod> for QuotaEvaluation {
    fn name(&self) -> &'static str {
        "ElasticQuotaEvaluation"
    }

    fn enabled(&self, gates: &FeatureGates) -> bool {
        gates.enabled(Gate::EnableQuotaAdmission)
    }

    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, Pod>) -> Step<'a> {
        Step::Pending(Box::pin(self.check(ctx)))
    }
}

/// Pods that are done, or past their deletion grace period, hold no quota.
fn holds_resources(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Failed" | "Succeeded")) {
        return false;
    }
    match &pod.metadata.deletion_timestamp {
        Some(deleted) => {
            let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
            let gone = deleted
                .0
                .checked_add(jiff::SignedDuration::from_secs(grace.max(0)));
            // A grace period past the end of time: the pod holds its resources until then.
            !gone.is_ok_and(|gone| gone <= jiff::Timestamp::now())
        }
        None => true,
    }
}

/// The requests a pod charges to its quota: `None` for a pod that holds nothing (terminal, or
/// deleted past its grace period). The leader's recount of `child-request` uses the same rule.
pub fn charged_requests(pod: &Pod, gates: &FeatureGates) -> Result<Option<Resources>, String> {
    let transformed;
    let pod = if gates.enabled(Gate::ElasticQuotaEvaluationTransformPod)
        && gates.enabled(Gate::ReplaceResourcesTransformer)
    {
        transformed = replace_resources::apply(pod);
        &transformed
    } else {
        pod
    };
    if !holds_resources(pod) {
        return Ok(None);
    }
    pod_requests(pod).map(Some).map_err(|e| e.to_string())
}

/// The quota a pod with this quota label in this namespace is evaluated against, or `None` for
/// the quotas evaluation skips.
pub fn evaluated_quota(
    label: Option<&str>,
    namespace: &str,
    cache: &crate::cache::Cache,
    gates: &FeatureGates,
) -> Option<String> {
    let name = resolve_quota_name_of(label, namespace, cache, gates);
    (![DEFAULT_QUOTA, SYSTEM_QUOTA, ROOT_QUOTA, ""].contains(&name.as_str())).then_some(name)
}

/// What the pod index keeps of a watched pod: its key, quota label and charge.
pub fn indexed_pod(pod: &Pod, gates: &FeatureGates) -> IndexedPod {
    IndexedPod {
        namespace: pod_namespace(pod, None).to_owned(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        quota_label: crate::apis::meta::label(pod, QUOTA_NAME).map(str::to_owned),
        charged: charged_requests(pod, gates).ok().flatten(),
    }
}

impl QuotaEvaluation {
    async fn check(&self, ctx: &Ctx<'_, Pod>) -> Result<(), Rejection> {
        let Some(pod) = ctx.object() else {
            return Ok(());
        };
        let namespace = pod_namespace(pod, ctx.request.namespace.as_deref());
        let name = match ctx.operation() {
            Operation::Create => resolve_quota_name(pod, namespace, ctx.cache, ctx.gates),
            Operation::Update if ctx.gates.enabled(Gate::EnableQuotaAdmissionOnUpdate) => {
                let new = resolve_quota_name(pod, namespace, ctx.cache, ctx.gates);
                let old = ctx.old_object().map(|old| {
                    resolve_quota_name(
                        old,
                        pod_namespace(old, ctx.request.namespace.as_deref()),
                        ctx.cache,
                        ctx.gates,
                    )
                });
                if old.as_deref() == Some(new.as_str()) {
                    return Ok(());
                }
                new
            }
            _ => return Ok(()),
        };
        if ["", DEFAULT_QUOTA, SYSTEM_QUOTA, ROOT_QUOTA].contains(&name.as_str()) {
            return Ok(());
        }
        let mut quotas = ctx.cache.elastic_quotas.named(&name);
        let quota = match quotas.len() {
            0 => {
                return Err(Rejection::invalid(format!(
                    "elastic quota {name} not found"
                )));
            }
            1 => quotas.remove(0),
            _ => {
                return Err(Rejection::invalid(format!(
                    "more than one elastic quota {name} found"
                )));
            }
        };

        // What the pod would use of the quota comes first: a pod that uses none of its resources
        // is admitted whatever the quota's `child-request` says, even text that does not parse
        // (Koordinator reads it only then).
        let max = Resources::parse(quota.spec.max.as_ref())
            .map_err(|e| Rejection::invalid(e.to_string()))?;
        if !ChildRequests::limits_pods_of(&max) {
            return Ok(());
        }
        // The API server refuses such a pod before admission: one that reaches here was not sent by
        // it, and must not move the quota's record (a negative charge frees room for others).
        if let Some(message) = negative_request(pod) {
            return Err(Rejection::invalid(message));
        }
        let Some(requests) = charged_requests(pod, ctx.gates).map_err(Rejection::invalid)? else {
            return Ok(());
        };
        if ChildRequests::usage_within(&max, &requests).is_empty() {
            return Ok(());
        }
        let account = ChildRequests::read(&quota).map_err(Rejection::invalid)?;
        let usage = account.usage_of(&requests);
        let store = ctx.services.quota_store.clone();
        let admission = Admission {
            usage,
            pod: format!(
                "{namespace}/{}",
                pod.metadata.name.as_deref().unwrap_or_default()
            ),
            window: ctx.settings.child_request_window,
        };
        let used = self
            .evaluator
            .evaluate(&quota, admission, store, ctx.dry_run())
            .await?;
        ctx.annotate(AUDIT_CHILD_REQUEST, used);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::holds_resources;
    use crate::admission::pod::object::Pod;
    use serde_json::json;

    fn deleted(at: &str, grace: i64) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p",
            "deletionTimestamp": at, "deletionGracePeriodSeconds": grace}}))
        .unwrap()
    }

    #[test]
    fn a_grace_period_past_the_end_of_time_is_no_panic() {
        // Once a panic (500): the timestamp plus the grace period overflowed.
        assert!(holds_resources(&deleted("2026-01-01T00:00:00Z", i64::MAX)));
        assert!(!holds_resources(&deleted("2020-01-01T00:00:00Z", 30)));
        assert!(holds_resources(&deleted("2999-01-01T00:00:00Z", 0)));
    }
}

//! QoS and priority rules of colocation. QoS class, priority class and the Koordinator
//! priority label are immutable; batch resources need QoS BE; BE and LSR pods need a priority class
//! that fits them; LSR/LSE pods ask for whole CPUs.

use crate::admission::pod::object::Pod;
use crate::apis::meta::label;
use kube::core::admission::Operation;

use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::outcome::Rejection;
use crate::admission::pod::priority::{PriorityClass, QosClass, raw_priority_class, raw_qos_class};
use crate::admission::pod::requests::pod_requests;
use crate::apis::keys::{BATCH_CPU, BATCH_MEMORY, PRIORITY_LABEL};
use crate::features::{FeatureGates, Gate};
use crate::kubernetes_errors::aggregate;

pub struct ColocationRules;

impl Validator<Pod> for ColocationRules {
    fn name(&self) -> &'static str {
        "ColocationQoSPriority"
    }

    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, Pod>) -> Step<'a> {
        let Some(pod) = ctx.object() else {
            return Ok(()).into();
        };
        let old = match ctx.operation() {
            Operation::Update => ctx.old_object(),
            Operation::Create => None,
            _ => return Ok(()).into(),
        };
        match aggregate(check(old, pod, ctx.gates)) {
            Some(message) => Err(Rejection::invalid(message)).into(),
            None => Ok(()).into(),
        }
    }
}

fn priority_label(pod: &Pod) -> &str {
    label(pod, PRIORITY_LABEL).unwrap_or_default()
}

pub fn check(old: Option<&Pod>, pod: &Pod, gates: &FeatureGates) -> Vec<String> {
    let mut errors = Vec::new();
    let (qos, priority) = (raw_qos_class(pod), raw_priority_class(pod));
    if let Some(old) = old {
        if raw_qos_class(old) != qos {
            errors.push(format!(
                "labels.koordinator.sh/qosClass: Invalid value: \"{}\": field is immutable",
                qos.as_str()
            ));
        }
        if raw_priority_class(old) != priority {
            errors.push(format!(
                "spec.priority: Invalid value: \"{}\": field is immutable",
                priority.as_str()
            ));
        }
        if !gates.enabled(Gate::ColocationProfileSkipValidatingPriority)
            && priority_label(old) != priority_label(pod)
        {
            errors.push(format!(
                "labels.koordinator.sh/priority: Invalid value: \"{}\": field is immutable",
                priority_label(pod)
            ));
        }
    }
    let requests = pod_requests(pod).unwrap_or_default();
    let batch = [BATCH_CPU, BATCH_MEMORY]
        .iter()
        .any(|r| !requests.get(r).is_zero());
    if batch && qos != QosClass::Be {
        errors.push("labels.koordinator.sh/qosClass: Required value: must specify koordinator QoS BE with koordinator colocation resources".to_owned());
    }
    let forbidden = match qos {
        QosClass::Be => matches!(priority, PriorityClass::None | PriorityClass::Prod),
        QosClass::Lsr => !matches!(priority, PriorityClass::Prod),
        _ => false,
    };
    if forbidden {
        errors.push(format!(
            "Pod: Forbidden: koordinator.sh/qosClass={} and priorityClass={} cannot be used in combination",
            qos.as_str(),
            priority.as_str()
        ));
    }
    if matches!(qos, QosClass::Lsr | QosClass::Lse) {
        let cpu = requests.get("cpu");
        if cpu.is_zero() {
            errors.push("pod.spec.containers[*].resources.requests: Required value: LSR Pod must declare the requested CPUs".to_owned());
        } else if !cpu.is_integer() {
            errors.push(format!(
                "pod.spec.containers[*].resources.requests: Invalid value: \"{cpu}\": the requested CPUs of LSR Pod must be integer"
            ));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: serde_json::Value, priority: Option<i32>, requests: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "labels": labels},
            "spec": {"priority": priority, "containers": [{"name": "c", "resources": {"requests": requests}}]}}))
        .unwrap()
    }

    fn errors(old: Option<&Pod>, new: &Pod) -> Option<String> {
        aggregate(check(old, new, &FeatureGates::default()))
    }

    #[test]
    fn create_rules_and_messages() {
        let be = json!({"koordinator.sh/qosClass": "BE"});
        assert_eq!(
            errors(
                None,
                &pod(
                    be.clone(),
                    Some(5500),
                    json!({"kubernetes.io/batch-cpu": "1k"})
                )
            ),
            None
        );
        assert_eq!(
            errors(
                None,
                &pod(
                    json!({}),
                    None,
                    json!({"kubernetes.io/batch-memory": "1Gi"})
                )
            )
            .unwrap(),
            "labels.koordinator.sh/qosClass: Required value: must specify koordinator QoS BE with koordinator colocation resources"
        );
        assert_eq!(
            errors(None, &pod(be, Some(9500), json!({}))).unwrap(),
            "Pod: Forbidden: koordinator.sh/qosClass=BE and priorityClass=koord-prod cannot be used in combination"
        );
        let lsr = json!({"koordinator.sh/qosClass": "LSR"});
        assert_eq!(
            errors(None, &pod(lsr.clone(), None, json!({"cpu": "1"}))).unwrap(),
            "Pod: Forbidden: koordinator.sh/qosClass=LSR and priorityClass= cannot be used in combination"
        );
        assert_eq!(
            errors(None, &pod(lsr.clone(), Some(9000), json!({}))).unwrap(),
            "pod.spec.containers[*].resources.requests: Required value: LSR Pod must declare the requested CPUs"
        );
        assert_eq!(
            errors(
                None,
                &pod(
                    json!({"koordinator.sh/qosClass": "LSE"}),
                    Some(9000),
                    json!({"cpu": "1500m"})
                )
            )
            .unwrap(),
            "pod.spec.containers[*].resources.requests: Invalid value: \"1500m\": the requested CPUs of LSR Pod must be integer"
        );
        assert_eq!(
            errors(None, &pod(lsr, Some(9000), json!({"cpu": "2"}))),
            None
        );
    }

    #[test]
    fn update_rules_aggregate() {
        let old = pod(
            json!({"koordinator.sh/qosClass": "LS", "koordinator.sh/priority": "1"}),
            Some(9100),
            json!({}),
        );
        let same_band = pod(
            json!({"koordinator.sh/qosClass": "LS", "koordinator.sh/priority": "1"}),
            Some(9900),
            json!({}),
        );
        assert_eq!(errors(Some(&old), &same_band), None);
        let changed = pod(
            json!({"koordinator.sh/qosClass": "BE", "koordinator.sh/priority": "2"}),
            Some(5500),
            json!({}),
        );
        assert_eq!(
            errors(Some(&old), &changed).unwrap(),
            "[labels.koordinator.sh/qosClass: Invalid value: \"BE\": field is immutable, spec.priority: Invalid value: \"koord-batch\": field is immutable, labels.koordinator.sh/priority: Invalid value: \"2\": field is immutable]"
        );
        let gates: FeatureGates = "ColocationProfileSkipValidatingPriority=true"
            .parse()
            .unwrap();
        let label_only = pod(
            json!({"koordinator.sh/qosClass": "LS", "koordinator.sh/priority": "7"}),
            Some(9100),
            json!({}),
        );
        assert!(check(Some(&old), &label_only, &gates).is_empty());
    }
}

//! Koordinator priority classes and QoS classes of a pod, in one place for the mutating
//! and validating webhooks alike.

use crate::admission::pod::object::Pod;
use crate::apis::meta::label;

use crate::apis::keys::{PRIORITY_CLASS_LABEL, QOS_CLASS_LABEL};
use crate::resources::Resources;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PriorityClass {
    Prod,
    Mid,
    Batch,
    Free,
    None,
}

impl PriorityClass {
    pub fn as_str(self) -> &'static str {
        match self {
            PriorityClass::Prod => "koord-prod",
            PriorityClass::Mid => "koord-mid",
            PriorityClass::Batch => "koord-batch",
            PriorityClass::Free => "koord-free",
            PriorityClass::None => "",
        }
    }

    fn parse(text: &str) -> Self {
        match text {
            "koord-prod" => PriorityClass::Prod,
            "koord-mid" => PriorityClass::Mid,
            "koord-batch" => PriorityClass::Batch,
            "koord-free" => PriorityClass::Free,
            _ => PriorityClass::None,
        }
    }

    /// The band a `spec.priority` value falls in.
    pub fn of_priority(priority: Option<i32>) -> Self {
        match priority {
            Some(9000..=9999) => PriorityClass::Prod,
            Some(7000..=7999) => PriorityClass::Mid,
            Some(5000..=5999) => PriorityClass::Batch,
            Some(3000..=3999) => PriorityClass::Free,
            _ => PriorityClass::None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QosClass {
    Lse,
    Lsr,
    Ls,
    Be,
    System,
    None,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Lse => "LSE",
            QosClass::Lsr => "LSR",
            QosClass::Ls => "LS",
            QosClass::Be => "BE",
            QosClass::System => "SYSTEM",
            QosClass::None => "",
        }
    }

    pub fn parse(text: &str) -> Self {
        match text {
            "LSE" => QosClass::Lse,
            "LSR" => QosClass::Lsr,
            "LS" => QosClass::Ls,
            "BE" => QosClass::Be,
            "SYSTEM" => QosClass::System,
            _ => QosClass::None,
        }
    }
}

/// The priority class from the override label, else from `spec.priority`; no QoS fallback.
pub fn raw_priority_class(pod: &Pod) -> PriorityClass {
    match label(pod, PRIORITY_CLASS_LABEL) {
        Some(value) => PriorityClass::parse(value),
        None => PriorityClass::of_priority(pod.spec.as_ref().and_then(|s| s.priority)),
    }
}

/// The QoS label, normalised to a known class.
pub fn raw_qos_class(pod: &Pod) -> QosClass {
    label(pod, QOS_CLASS_LABEL).map_or(QosClass::None, QosClass::parse)
}

/// Kubernetes' QoS class from cpu and memory requests and limits (or `status.qosClass` when set).
fn kubernetes_qos(pod: &Pod) -> &'static str {
    if let Some(class) = pod.status.as_ref().and_then(|s| s.qos_class.as_deref()) {
        return match class {
            "Guaranteed" => "Guaranteed",
            "Burstable" => "Burstable",
            _ => "BestEffort",
        };
    }
    let Some(spec) = pod.spec.as_ref() else {
        return "BestEffort";
    };
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let (mut any, mut guaranteed) = (false, true);
    for c in containers {
        let res = c.resources.as_ref();
        let list = |l: Option<&std::collections::BTreeMap<String, _>>| {
            Resources::parse(l).unwrap_or_default()
        };
        let requests = list(res.and_then(|r| r.requests.as_ref()));
        let limits = list(res.and_then(|r| r.limits.as_ref()));
        for name in ["cpu", "memory"] {
            let (req, lim) = (requests.value(name), limits.value(name));
            if req.is_some_and(|q| !q.is_zero()) || lim.is_some_and(|q| !q.is_zero()) {
                any = true;
            }
            // Guaranteed: a limit for both, and requests (defaulted to limits) equal to them.
            match (req, lim) {
                (_, None) => guaranteed = false,
                (Some(r), Some(l)) if r.milli() != l.milli() => guaranteed = false,
                _ => {}
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

/// The QoS class: the label, else from Kubernetes' QoS class.
pub fn qos_class_with_default(pod: &Pod) -> QosClass {
    match raw_qos_class(pod) {
        QosClass::None => match kubernetes_qos(pod) {
            "Guaranteed" => QosClass::Lsr,
            "Burstable" => QosClass::Ls,
            _ => QosClass::Be,
        },
        qos => qos,
    }
}

/// The priority class, else derived from the QoS class (SYSTEM/LSE/LSR/LS -> prod, BE -> batch).
pub fn priority_class_with_default(pod: &Pod) -> PriorityClass {
    match raw_priority_class(pod) {
        PriorityClass::None => match qos_class_with_default(pod) {
            QosClass::System | QosClass::Lse | QosClass::Lsr | QosClass::Ls => PriorityClass::Prod,
            QosClass::Be => PriorityClass::Batch,
            QosClass::None => PriorityClass::None,
        },
        class => class,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: serde_json::Value, priority: Option<i32>, resources: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"labels": labels},
            "spec": {"priority": priority, "containers": [{"name": "c", "resources": resources}]}}))
        .unwrap()
    }

    #[test]
    fn raw_classes() {
        let p = pod(
            json!({"koordinator.sh/priority-class": "koord-mid"}),
            Some(9500),
            json!({}),
        );
        assert_eq!(raw_priority_class(&p), PriorityClass::Mid);
        let p = pod(
            json!({"koordinator.sh/priority-class": "bogus"}),
            Some(9500),
            json!({}),
        );
        assert_eq!(
            raw_priority_class(&p),
            PriorityClass::None,
            "no fallback to spec.priority"
        );
        for (priority, class) in [
            (9999, PriorityClass::Prod),
            (7000, PriorityClass::Mid),
            (5500, PriorityClass::Batch),
            (3000, PriorityClass::Free),
            (8500, PriorityClass::None),
        ] {
            assert_eq!(
                raw_priority_class(&pod(json!({}), Some(priority), json!({}))),
                class,
                "{priority}"
            );
        }
        assert_eq!(
            raw_qos_class(&pod(
                json!({"koordinator.sh/qosClass": "LSR"}),
                None,
                json!({})
            )),
            QosClass::Lsr
        );
        assert_eq!(
            raw_qos_class(&pod(
                json!({"koordinator.sh/qosClass": "lsr"}),
                None,
                json!({})
            )),
            QosClass::None
        );
    }

    #[test]
    fn defaults_follow_kubernetes_qos() {
        let guaranteed = json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}});
        let limits_only = json!({"limits": {"cpu": "1", "memory": "1Gi"}});
        let burstable = json!({"requests": {"cpu": "1"}});
        assert_eq!(
            qos_class_with_default(&pod(json!({}), None, guaranteed)),
            QosClass::Lsr
        );
        assert_eq!(
            qos_class_with_default(&pod(json!({}), None, limits_only)),
            QosClass::Lsr
        );
        assert_eq!(
            qos_class_with_default(&pod(json!({}), None, burstable.clone())),
            QosClass::Ls
        );
        assert_eq!(
            qos_class_with_default(&pod(json!({}), None, json!({}))),
            QosClass::Be
        );
        assert_eq!(
            priority_class_with_default(&pod(json!({}), None, json!({}))),
            PriorityClass::Batch
        );
        assert_eq!(
            priority_class_with_default(&pod(json!({}), None, burstable)),
            PriorityClass::Prod
        );
        assert_eq!(
            priority_class_with_default(&pod(
                json!({"koordinator.sh/qosClass": "BE"}),
                Some(7100),
                json!({})
            )),
            PriorityClass::Mid
        );
    }
}

//! Ours, beyond Koordinator (gate ReservationAffinityValidation): a pod that names a Reservation in its
//! reservation-affinity annotation is refused when that Reservation is missing, finished, or has
//! not enough free resources for it.

use crate::admission::pod::object::Pod;
use kube::core::admission::Operation;

use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::outcome::Rejection;
use crate::admission::pod::requests::pod_requests;
use crate::apis::Reservation;
use crate::apis::keys::RESERVATION_AFFINITY;
use crate::apis::reservation::ReservationPhase;
use crate::features::{FeatureGates, Gate};
use crate::resources::Resources;

#[derive(Clone)]
pub struct ReservationAffinity;

impl Validator<Pod> for ReservationAffinity {
    fn name(&self) -> &'static str {
        "ReservationAffinity"
    }

    fn enabled(&self, gates: &FeatureGates) -> bool {
        gates.enabled(Gate::ReservationAffinityValidation)
    }

    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, Pod>) -> Step<'a> {
        let Some(pod) = ctx.object() else {
            return Ok(()).into();
        };
        if !matches!(ctx.operation(), Operation::Create | Operation::Update) {
            return Ok(()).into();
        }
        let Some(name) = reservation_name(pod) else {
            return Ok(()).into();
        };
        let reservation = ctx.cache.reservations.get(None, &name);
        check(pod, &name, reservation.as_deref())
            .map_err(Rejection::invalid)
            .into()
    }
}

fn reservation_name(pod: &Pod) -> Option<String> {
    let text = crate::apis::meta::annotation(pod, RESERVATION_AFFINITY)?;
    // A tree of the annotation, within what its text allows.
    let affinity: serde_json::Value = crate::memory::metered::read_within(text.as_bytes()).ok()?;
    affinity
        .get("name")
        .and_then(|n| n.as_str())
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
}

pub fn check(pod: &Pod, name: &str, reservation: Option<&Reservation>) -> Result<(), String> {
    let reservation = reservation.ok_or_else(|| format!("reservation {name} not found"))?;
    let status = reservation.status.as_ref();
    if let Some(phase) = status
        .and_then(|s| s.phase.as_ref())
        .filter(|p| matches!(p, ReservationPhase::Succeeded | ReservationPhase::Failed))
    {
        return Err(format!("reservation {name} is {phase}"));
    }
    let Some(allocatable) = status.and_then(|s| s.allocatable.as_ref()) else {
        return Ok(());
    };
    let allocatable = Resources::parse(Some(allocatable)).map_err(|e| e.to_string())?;
    let allocated =
        Resources::parse(status.and_then(|s| s.allocated.as_ref())).map_err(|e| e.to_string())?;
    let requests = pod_requests(pod).map_err(|e| e.to_string())?;
    let exceeded: Vec<String> = allocatable
        .keys()
        .filter_map(|k| {
            let free = allocatable.get(k).minus(allocated.get(k));
            let requested = requests.get(k);
            (requested.milli() > free.milli()).then(|| format!("{k}={requested} > {free}"))
        })
        .collect();
    if exceeded.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "pod requests exceed the free resources of reservation {name}: {}",
            exceeded.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reservation(status: serde_json::Value) -> Reservation {
        serde_json::from_value(json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
            "metadata": {"name": "r1"}, "spec": {"owners": [{"object": {"name": "x"}}]}, "status": status}))
        .unwrap()
    }

    fn pod(cpu: &str, memory: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"annotations": {RESERVATION_AFFINITY: r#"{"name": "r1"}"#}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}}))
        .unwrap()
    }

    #[test]
    fn missing_finished_and_full_reservations() {
        let p = pod("2", "1Gi");
        assert_eq!(reservation_name(&p).as_deref(), Some("r1"));
        assert_eq!(
            check(&p, "r1", None),
            Err("reservation r1 not found".into())
        );
        assert_eq!(
            check(&p, "r1", Some(&reservation(json!({"phase": "Succeeded"})))),
            Err("reservation r1 is Succeeded".into())
        );
        assert_eq!(
            check(&p, "r1", Some(&reservation(json!({"phase": "Available"})))),
            Ok(())
        );
        let partly_used = reservation(json!({"phase": "Available",
            "allocatable": {"cpu": "4", "memory": "2Gi"}, "allocated": {"cpu": "3", "memory": "1536Mi"}}));
        assert_eq!(
            check(&p, "r1", Some(&partly_used)),
            Err("pod requests exceed the free resources of reservation r1: cpu=2 > 1, memory=1Gi > 512Mi".into())
        );
        assert_eq!(check(&pod("1", "512Mi"), "r1", Some(&partly_used)), Ok(()));
    }

    /// The rule as its chain runs it (`rule_harness`): its gate, the cache it reads, an UPDATE.
    #[tokio::test]
    async fn through_the_harness() {
        use crate::admission::rule_harness::{Ran, RuleEnv, create, update};
        use crate::cache::CachedObject;
        let pod = json!({"metadata": {"name": "p", "namespace": "ns",
                "annotations": {RESERVATION_AFFINITY: r#"{"name": "r1"}"#}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}});
        let on = || RuleEnv::new().gate(Gate::ReservationAffinityValidation, true);
        let missing = Ran::Refused(Rejection::invalid("reservation r1 not found"));
        assert_eq!(
            RuleEnv::new()
                .validate(&ReservationAffinity, &create::<Pod>(pod.clone()))
                .await,
            Ran::Skipped
        );
        assert_eq!(
            on().validate(&ReservationAffinity, &create::<Pod>(pod.clone()))
                .await,
            missing
        );
        assert_eq!(
            on().validate(
                &ReservationAffinity,
                &update::<Pod>(pod.clone(), pod.clone())
            )
            .await,
            missing
        );
        let available = CachedObject::Reservation(reservation(json!({"phase": "Available"})));
        assert_eq!(
            on().cached(available)
                .validate(&ReservationAffinity, &create::<Pod>(pod))
                .await,
            Ran::Allowed
        );
    }
}

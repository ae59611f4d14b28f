//! The Reservation as its endpoints decode it: its metadata, its `ttl` (`ttl_limit.rs`), and of its
//! pod template only the fields a colocation profile sets (scheduler and priority); the template's containers, volumes and
//! everything else, the owners and the status stay JSON text (`admission/open_object.rs`). The
//! template is a whole pod spec, most of whose optional fields are large once decoded even when
//! empty: decoded whole, a 12-byte volume cost 11 KB.

use crate::admission::open_object::{Meta, open_object, slim_resource};

open_object! {
    pub struct Reservation {
        #[doc = "Decoded without `managedFields`."]
        metadata: Meta = "metadata",
        spec: Option<ReservationSpec> = "spec",
    }
}

open_object! {
    pub struct ReservationSpec {
        template: Option<PodTemplate> = "template",
        #[doc = "How long the Reservation lives (a Go duration; `0`: never expires)."]
        ttl: Option<String> = "ttl",
    }
}

open_object! {
    pub struct PodTemplate {
        spec: Option<TemplateSpec> = "spec",
    }
}

open_object! {
    /// What a colocation profile writes on the pod a Reservation stands for.
    pub struct TemplateSpec {
        preemption_policy: Option<String> = "preemptionPolicy",
        priority: Option<i32> = "priority",
        priority_class_name: Option<String> = "priorityClassName",
        scheduler_name: Option<String> = "schedulerName",
    }
}

slim_resource!(
    Reservation,
    ClusterResourceScope,
    group "scheduling.koordinator.sh",
    version "v1alpha1",
    kind "Reservation",
    plural "reservations"
);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn reservation() -> Value {
        json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
            "metadata": {"name": "r", "labels": {"app": "a"}},
            "spec": {"template": {"metadata": {"labels": {"x": "y"}},
                    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
                        "volumes": [{"name": "v", "emptyDir": {}}], "schedulerName": "s", "priority": 3}},
                "owners": [{"object": {"name": "p"}}], "ttl": "1h"},
            "status": {"phase": "Available"}})
    }

    #[test]
    fn keeps_what_it_does_not_read_as_it_came() {
        let decoded: Reservation = serde_json::from_value(reservation()).unwrap();
        let spec = decoded
            .spec
            .as_ref()
            .and_then(|s| s.template.as_ref()?.spec.as_ref());
        assert_eq!(spec.unwrap().scheduler_name.as_deref(), Some("s"));
        assert_eq!(spec.unwrap().priority, Some(3));
        assert_eq!(serde_json::to_value(&decoded).unwrap(), reservation());
        assert_eq!(
            <Reservation as kube::Resource>::api_version(&()),
            "scheduling.koordinator.sh/v1alpha1"
        );
    }

    #[test]
    fn the_template_unread_costs_its_bytes() {
        // 20,000 empty volumes: with k8s-openapi's PodSpec ~11 KB each once decoded.
        let mut r = reservation();
        r["spec"]["template"]["spec"]["volumes"] = json!(vec![json!({"name": ""}); 20_000]);
        let text = r.to_string();
        let meter = crate::memory::Meter::start(usize::MAX);
        let decoded: Reservation = serde_json::from_str(&text).unwrap();
        assert!(
            meter.peak() < 2 * text.len(),
            "{} for {}",
            meter.peak(),
            text.len()
        );
        drop(decoded);
    }
}

//! What a quota must satisfy on its own (CREATE and UPDATE).

use crate::apis::ElasticQuota;
use crate::apis::meta::annotation;
use crate::resources::Resources;

use super::defaults::SHARED_WEIGHT;

pub const MAX_STRICT_CHECK_KEYS: &str =
    "quota.scheduling.koordinator.sh/max-strict-check-resource-keys";

fn parse(
    name: &str,
    what: &str,
    list: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
) -> Result<Resources, String> {
    Resources::parse(list).map_err(|e| format!("{name} quota.{what}: {e}"))
}

fn dimensions(keys: &[&str]) -> String {
    format!("[{}]", keys.join(" "))
}

pub fn check(quota: &ElasticQuota) -> Result<(), String> {
    let name = quota.metadata.name.as_deref().unwrap_or_default();
    let max = parse(name, "Spec.Max", quota.spec.max.as_ref())?;
    let min = parse(name, "Spec.Min", quota.spec.min.as_ref())?;

    let negative = max.negative_keys();
    if !negative.is_empty() {
        return Err(format!(
            "{name} quota.Spec.Max's value < 0, in dimensions :{}",
            dimensions(&negative)
        ));
    }
    let negative = min.negative_keys();
    if !negative.is_empty() {
        return Err(format!(
            "{name} quota.Spec.Min's value < 0, in dimensions :{}",
            dimensions(&negative)
        ));
    }

    let annotation = |k: &str| annotation(quota, k).filter(|v| !v.is_empty());
    if let Some(weight) = annotation(SHARED_WEIGHT) {
        let weight = Resources::parse_json(weight)?;
        let negative = weight.negative_keys();
        if !negative.is_empty() {
            return Err(format!(
                "{name} quota.Annotation[{SHARED_WEIGHT}]'s value < 0, in dimension :{}",
                dimensions(&negative)
            ));
        }
    }

    for (key, min_value) in min.iter() {
        if !max.contains(key) {
            return Err(format!(
                "resourceKey {key} of quota {name} is included in min, which is not included in max"
            ));
        }
        let max_value = max.get(key);
        if max_value < *min_value {
            return Err(format!(
                "resourceKey {key} of quota {name} min {min_value} > max {max_value}"
            ));
        }
    }

    if let Some(keys) = annotation(MAX_STRICT_CHECK_KEYS) {
        let keys: Vec<String> = serde_json::from_str(keys).map_err(|e| {
            format!("{name} quota.Annotation[{MAX_STRICT_CHECK_KEYS}]'s value is invalid: {e}")
        })?;
        let used = parse(
            name,
            "Status.Used",
            quota.status.as_ref().and_then(|s| s.used.as_ref()),
        )?;
        for key in keys.iter().filter(|k| used.contains(k)) {
            if !max.contains(key) {
                return Err(format!(
                    "resourceKey {key} of quota {name} is included in used, which is not included in max but should check max >= used"
                ));
            }
            let (max_value, used_value) = (max.get(key), used.get(key));
            if max_value < used_value {
                return Err(format!(
                    "resourceKey {key} of quota {name} max {max_value} < used {used_value}"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn quota(
        spec: serde_json::Value,
        annotations: serde_json::Value,
        used: serde_json::Value,
    ) -> ElasticQuota {
        serde_json::from_value(json!({
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": "q", "namespace": "ns", "annotations": annotations},
            "spec": spec, "status": {"used": used}
        }))
        .unwrap()
    }

    fn err(
        spec: serde_json::Value,
        annotations: serde_json::Value,
        used: serde_json::Value,
    ) -> String {
        check(&quota(spec, annotations, used)).err().unwrap()
    }

    #[test]
    fn each_self_check_and_its_message() {
        let none = json!({});
        assert_eq!(
            err(
                json!({"max": {"cpu": "-1", "memory": "-1"}}),
                none.clone(),
                none.clone()
            ),
            "q quota.Spec.Max's value < 0, in dimensions :[cpu memory]"
        );
        assert_eq!(
            err(
                json!({"max": {"cpu": "1"}, "min": {"cpu": "-1"}}),
                none.clone(),
                none.clone()
            ),
            "q quota.Spec.Min's value < 0, in dimensions :[cpu]"
        );
        assert_eq!(
            err(
                json!({"max": {"cpu": "1"}}),
                json!({SHARED_WEIGHT: r#"{"cpu":"-2"}"#}),
                none.clone()
            ),
            "q quota.Annotation[quota.scheduling.koordinator.sh/shared-weight]'s value < 0, in dimension :[cpu]"
        );
        assert!(
            !err(
                json!({"max": {"cpu": "1"}}),
                json!({SHARED_WEIGHT: "{oops"}),
                none.clone()
            )
            .is_empty()
        );
        assert_eq!(
            err(
                json!({"max": {"cpu": "1"}, "min": {"memory": "1"}}),
                none.clone(),
                none.clone()
            ),
            "resourceKey memory of quota q is included in min, which is not included in max"
        );
        assert_eq!(
            err(
                json!({"max": {"cpu": "1"}, "min": {"cpu": "1500m"}}),
                none.clone(),
                none.clone()
            ),
            "resourceKey cpu of quota q min 1500m > max 1"
        );
        assert!(err(json!({"max": {"cpu": "1"}}), json!({MAX_STRICT_CHECK_KEYS: "cpu"}), none.clone())
            .starts_with("q quota.Annotation[quota.scheduling.koordinator.sh/max-strict-check-resource-keys]'s value is invalid: "));
        assert_eq!(
            err(
                json!({"max": {"cpu": "1"}}),
                json!({MAX_STRICT_CHECK_KEYS: r#"["memory"]"#}),
                json!({"memory": "1Gi"})
            ),
            "resourceKey memory of quota q is included in used, which is not included in max but should check max >= used"
        );
        assert_eq!(
            err(
                json!({"max": {"cpu": "1"}}),
                json!({MAX_STRICT_CHECK_KEYS: r#"["cpu"]"#}),
                json!({"cpu": "2"})
            ),
            "resourceKey cpu of quota q max 1 < used 2"
        );
    }

    #[test]
    fn a_consistent_quota_passes() {
        let q = quota(
            json!({"max": {"cpu": "4", "memory": "8Gi"}, "min": {"cpu": "2"}}),
            json!({MAX_STRICT_CHECK_KEYS: r#"["cpu"]"#, SHARED_WEIGHT: r#"{"cpu":"1"}"#}),
            json!({"cpu": "3", "memory": "100Gi"}),
        );
        assert_eq!(check(&q), Ok(()));
    }
}

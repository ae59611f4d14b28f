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
        let used = parse(
            name,
            "Status.Used",
            quota.status.as_ref().and_then(|s| s.used.as_ref()),
        )?;
        let check_key = |key: &str| {
            if !used.contains(key) {
                return Ok(());
            }
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
            Ok(())
        };
        each_string(keys, check_key).map_err(|e| {
            format!("{name} quota.Annotation[{MAX_STRICT_CHECK_KEYS}]'s value is invalid: {e}")
        })??;
    }
    Ok(())
}

/// Calls `check` on each string of the JSON array `text` (`null`: none) until it fails once,
/// keeping none of them: the annotation is part of a review, and a list of a million keys would
/// otherwise be held whole beside it. The text is still read to its end, so a syntax error anywhere
/// wins over a failed key, as Go's unmarshal of the whole list before the checks makes it.
fn each_string<F>(text: &str, check: F) -> Result<Result<(), String>, serde_json::Error>
where
    F: FnMut(&str) -> Result<(), String>,
{
    use serde::de::{DeserializeSeed, Deserializer, SeqAccess, Visitor};

    struct Each<F> {
        check: F,
        failed: Option<String>,
    }
    /// One element: a string, checked unless an earlier one failed.
    struct Element<'a, F>(&'a mut Each<F>);

    impl<'de, F: FnMut(&str) -> Result<(), String>> DeserializeSeed<'de> for Element<'_, F> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_str(self)
        }
    }
    impl<F: FnMut(&str) -> Result<(), String>> Visitor<'_> for Element<'_, F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<(), E> {
            if self.0.failed.is_none() {
                self.0.failed = (self.0.check)(key).err();
            }
            Ok(())
        }
    }
    impl<'de, F: FnMut(&str) -> Result<(), String>> Visitor<'de> for &mut Each<F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of strings")
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_none<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_seq(self)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while seq.next_element_seed(Element(&mut *self))?.is_some() {}
            Ok(())
        }
    }

    let mut each = Each {
        check,
        failed: None,
    };
    let mut reader = serde_json::Deserializer::from_str(text);
    reader.deserialize_option(&mut each)?;
    reader.end()?;
    Ok(each.failed.map_or(Ok(()), Err))
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
    fn strict_keys_are_read_one_at_a_time_and_a_syntax_error_anywhere_wins() {
        let spec = json!({"max": {"cpu": "1"}});
        let used = json!({"cpu": "2"});
        let err = |keys: &str| {
            err(
                spec.clone(),
                json!({MAX_STRICT_CHECK_KEYS: keys}),
                used.clone(),
            )
        };
        // The first failing key names the error; `null` and an empty list check nothing.
        assert_eq!(
            err(r#"["memory","cpu","cpu"]"#),
            "resourceKey cpu of quota q max 1 < used 2"
        );
        for none in ["null", "[]", r#"["memory"]"#] {
            let q = quota(
                spec.clone(),
                json!({MAX_STRICT_CHECK_KEYS: none}),
                used.clone(),
            );
            assert_eq!(check(&q), Ok(()), "{none}");
        }
        // A syntax or type error after a failing key is still the answer.
        for bad in [
            r#"["cpu", 1]"#,
            r#"["cpu"] x"#,
            r#"["cpu""#,
            r#"{"cpu":1}"#,
            r#""cpu""#,
        ] {
            assert!(
                err(bad).contains("'s value is invalid: "),
                "{bad}: {}",
                err(bad)
            );
        }
        // Escapes are read as Go reads them.
        assert_eq!(
            err(r#"["\u0063pu"]"#),
            "resourceKey cpu of quota q max 1 < used 2"
        );
        // A million keys cost nothing kept.
        let many = format!("[{}\"cpu\"]", "\"a\",".repeat(1_000_000));
        let q = quota(
            spec.clone(),
            json!({MAX_STRICT_CHECK_KEYS: many}),
            used.clone(),
        );
        let meter = crate::memory::Meter::start(usize::MAX);
        assert_eq!(
            check(&q).unwrap_err(),
            "resourceKey cpu of quota q max 1 < used 2"
        );
        assert!(meter.peak() < 64 << 10, "{}", meter.peak());
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

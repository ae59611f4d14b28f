//! Profile probability and metadata edits.

use serde_json::json;

use super::*;
use crate::admission::ports::memory::FixedDice;

fn spec(v: serde_json::Value) -> ClusterColocationProfileSpec {
    serde_json::from_value(v).unwrap()
}

#[test]
fn probability_draws() {
    let cases = [
        (json!({}), 99, true),
        (json!({"probability": 0}), 0, false),
        (json!({"probability": -5}), 0, false),
        (json!({"probability": 150}), 99, true),
        (json!({"probability": 50}), 50, true),
        (json!({"probability": 50}), 51, false),
        (json!({"probability": "50%"}), 50, true),
        (json!({"probability": "50.9%"}), 51, false),
    ];
    for (s, roll, applies) in cases {
        assert_eq!(
            draw(&spec(s.clone()), &FixedDice(roll)),
            Ok(applies),
            "{s} roll {roll}"
        );
    }
    assert!(draw(&spec(json!({"probability": "half"})), &FixedDice(0)).is_err());
}

#[test]
fn metadata_edits_in_order() {
    let mut meta: ObjectMeta = serde_json::from_value(
        json!({"labels": {"app": "web", "team": "a"}, "annotations": {"x": "1"}}),
    )
    .unwrap();
    apply_metadata(
        &mut meta,
        &spec(json!({
            "labels": {"colocated": "true"},
            "annotations": {"y": "2"},
            "labelKeysMapping": {"team": "owner", "missing": "blank"},
            "annotationKeysMapping": {"x": "x-copy"},
            "labelSuffixes": {"owner": "-batch", "absent": "-no"},
            "qosClass": "BE",
            "koordinatorPriority": 1111
        })),
    );
    let labels = meta.labels.unwrap();
    assert_eq!(labels["colocated"], "true");
    assert_eq!(labels["owner"], "a-batch");
    assert_eq!(labels["blank"], "");
    assert!(!labels.contains_key("absent"));
    assert_eq!(labels["koordinator.sh/qosClass"], "BE");
    assert_eq!(labels["koordinator.sh/priority"], "1111");
    let annotations = meta.annotations.unwrap();
    assert_eq!(annotations["x-copy"], "1");
    assert_eq!(annotations["y"], "2");
}

#[test]
fn matching_follows_selectors_and_sorts_by_name() {
    use crate::cache::{CacheWriter, CachedObject};
    let mut writer = CacheWriter::default();
    let profile = |name: &str, spec_json: serde_json::Value| {
        CachedObject::ColocationProfile(
            serde_json::from_value(json!({"apiVersion": "config.koordinator.sh/v1alpha1",
                "kind": "ClusterColocationProfile", "metadata": {"name": name}, "spec": spec_json}))
            .unwrap(),
        )
    };
    writer.apply(profile("z-all", json!({})));
    writer.apply(profile(
        "a-empty-ns-selector",
        json!({"namespaceSelector": {}}),
    ));
    writer.apply(profile(
        "m-team",
        json!({"namespaceSelector": {"matchLabels": {"team": "x"}}}),
    ));
    writer.apply(profile(
        "b-bad-selector",
        json!({"selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}),
    ));
    writer.apply(profile(
        "c-app",
        json!({"selector": {"matchLabels": {"app": "web"}}}),
    ));
    writer.apply(CachedObject::Namespace(
        serde_json::from_value(json!({"metadata": {"name": "ns-x", "labels": {"team": "x"}}}))
            .unwrap(),
    ));
    let cache = writer.reader();
    let names = |labels: &[(&str, &str)], ns: Option<&str>| -> Vec<String> {
        let labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        matching_profiles(&cache, &labels, ns)
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect()
    };
    assert_eq!(
        names(&[("app", "web")], Some("ns-x")),
        ["a-empty-ns-selector", "c-app", "m-team", "z-all"]
    );
    // A namespace that is not known does not match a selector that needs its labels.
    assert_eq!(
        names(&[], Some("unknown")),
        ["a-empty-ns-selector", "z-all"]
    );
    // Cluster-scoped objects ignore namespace selectors.
    assert_eq!(names(&[], None), ["a-empty-ns-selector", "m-team", "z-all"]);
}

//! A node's cpu and memory allocatable are multiplied by its
//! amplification ratios. The kubelet's own values are kept in `raw-allocatable` (and `raw-capacity`),
//! re-recorded whenever the kubelet reports a new allocatable, so amplification never compounds.

use crate::apis::meta::annotation;
use crate::memory::metered::read_within;
use std::collections::BTreeMap;

use super::object::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::core::admission::Operation;

use crate::admission::chain::{Ctx, Mutator, Step};
use crate::admission::outcome::Rejection;
use crate::apis::keys::{AMPLIFICATION_RATIO, RAW_ALLOCATABLE, RAW_CAPACITY};
use crate::features::Gate;
use crate::resources::Qty;

/// The only resources ever amplified.
const AMPLIFIED: [&str; 2] = ["cpu", "memory"];

type ResourceList = BTreeMap<String, Quantity>;

pub struct AmplifyNodeResources;

impl Mutator<Node> for AmplifyNodeResources {
    fn name(&self) -> &'static str {
        "NodeResourceAmplification"
    }

    fn mutate<'a>(&'a self, ctx: &'a Ctx<'a, Node>, node: &'a mut Node) -> Step<'a> {
        if !matches!(ctx.operation(), Operation::Update) {
            return Ok(()).into();
        }
        let keep_capacity = ctx.gates.enabled(Gate::AmplifyNodeCapacity);
        amplify(ctx.old_object(), node, keep_capacity)
            .map_err(Rejection::internal)
            .into()
    }
}

/// The cpu and memory entries of a list.
fn cpu_memory(list: Option<&ResourceList>) -> ResourceList {
    list.into_iter()
        .flatten()
        .filter(|(k, _)| AMPLIFIED.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Same keys with the same numeric values (formats may differ).
fn same_values(a: &ResourceList, b: &ResourceList) -> bool {
    let milli = |q: &Quantity| Qty::try_from(q).ok().map(|q| q.milli());
    a.len() == b.len()
        && a.iter()
            .all(|(k, q)| b.get(k).is_some_and(|other| milli(q) == milli(other)))
}

fn encode(list: &ResourceList) -> Result<String, String> {
    let canonical: ResourceList = list
        .iter()
        .map(|(k, q)| {
            let q = Qty::try_from(q)
                .map(Qty::to_quantity)
                .unwrap_or_else(|_| q.clone());
            (k.clone(), q)
        })
        .collect();
    serde_json::to_string(&canonical).map_err(|e| e.to_string())
}

/// A resource list annotation as Go's `json.Unmarshal` reads it into a `corev1.ResourceList`, in
/// Koordinator's words (`what`) with the parser's detail after them: the whole text is checked as
/// JSON first (a syntax error wins over a bad value, as Go's scanner runs before its decoder), `null`
/// is no list (`None`), and every value, duplicates included, is read in order as
/// [`go_quantity`] reads it; the first that does not parse fails the whole list. So a list whose
/// amplified entries parse but another does not is refused, as Koordinator refuses it, not used.
fn decode(what: &str, text: &str) -> Result<Option<RawList>, String> {
    let fail = |e: &dyn std::fmt::Display| format!("failed to unmarshal {what}: {e}");
    serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(|e| fail(&e))?;
    // Read under a meter of the text's own allowance, each value parsed as it comes: a forged
    // annotation of a million `"":0` entries kept every duplicate (129 MiB for 7.8 MiB of text,
    // outside the review's meter: the annotation is one string there).
    match crate::memory::metered::read_within::<Option<Entries>>(text.as_bytes())
        .map_err(|e| fail(&e))?
    {
        None => Ok(None),
        Some(Entries(Ok(list))) => Ok(Some(list)),
        Some(Entries(Err(e))) => Err(fail(&e)),
    }
}

/// A quantity's JSON text as apimachinery's `Quantity.UnmarshalJSON` reads it: `null` is zero; a
/// string has its quotes cut off, escapes left as they are (so an escaped string never parses);
/// any other value (a number, `true`, an object) is parsed as its text; spaces around are trimmed.
fn go_quantity(text: &str) -> Result<Qty, crate::resources::QuantityError> {
    if text == "null" {
        return Ok(Qty::ZERO);
    }
    let unquoted = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    unquoted.parse()
}

/// A resource list as the amplification reads it: each value parsed, or why it does not parse (a
/// value the kubelet reported is refused only where it is amplified, as before).
type RawList = BTreeMap<String, Result<Qty, String>>;

/// A JSON object's entries read in order, each value parsed as it comes ([`go_quantity`]), a later
/// duplicate replacing an earlier one; the first value that does not parse is the answer (the rest
/// are read, unparsed, to the end of the object).
struct Entries(Result<RawList, crate::resources::QuantityError>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Entries, A::Error> {
                let mut list = RawList::new();
                while let Some(name) = map.next_key::<String>()? {
                    let value: Box<serde_json::value::RawValue> = map.next_value()?;
                    match go_quantity(value.get()) {
                        Ok(q) => {
                            list.insert(name, Ok(q));
                        }
                        Err(e) => {
                            while map
                                .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                                .is_some()
                            {}
                            return Ok(Entries(Err(e)));
                        }
                    }
                }
                Ok(Entries(Ok(list)))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// The cpu and memory entries the kubelet reported, parsed.
fn parsed(list: &ResourceList) -> RawList {
    list.iter()
        .map(|(k, q)| (k.clone(), Qty::try_from(q).map_err(|e| e.to_string())))
        .collect()
}

const RAW: &str = "node raw allocatable";

/// Applies the ratios to `node` (the object after the update); `old` is the node before it.
pub fn amplify(old: Option<&Node>, node: &mut Node, keep_capacity: bool) -> Result<(), String> {
    let ratios_text = annotation(node, AMPLIFICATION_RATIO)
        .filter(|r| !r.is_empty())
        .map(str::to_owned);
    let Some(ratios_text) = ratios_text else {
        if let Some(annotations) = node.metadata.annotations.as_mut() {
            annotations.remove(RAW_ALLOCATABLE);
            if keep_capacity {
                annotations.remove(RAW_CAPACITY);
            }
        }
        return Ok(());
    };
    let annotations = node.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let Some(status) = node.status.as_mut() else {
        return Ok(());
    };
    let Some(allocatable) = status.allocatable.as_mut() else {
        return Ok(());
    };

    // The kubelet reported a new allocatable: what it says now is the raw value.
    let reported = cpu_memory(Some(allocatable));
    let changed = old.is_some_and(|old| {
        let before = cpu_memory(old.status.as_ref().and_then(|s| s.allocatable.as_ref()));
        !same_values(&before, &reported)
    });
    let recorded = annotations.get(RAW_ALLOCATABLE).cloned();
    let (raw, raw_capacity) = match recorded {
        Some(text) if !changed => {
            // A recorded `null` reads as no list, and Koordinator then leaves the node as it is.
            let Some(raw) = decode(RAW, &text)? else {
                return Ok(());
            };
            // Only with AmplifyNodeCapacity: with the gate off capacity is left alone (as
            // Koordinator leaves it), whatever `raw-capacity` a time with the gate on left.
            let capacity = match annotations.get(RAW_CAPACITY).filter(|_| keep_capacity) {
                Some(text) => decode("node raw capacity", text)?,
                None => None,
            };
            (raw, capacity)
        }
        _ => {
            if !reported.is_empty() {
                annotations.insert(RAW_ALLOCATABLE.to_owned(), encode(&reported)?);
            }
            (parsed(&reported), None)
        }
    };
    let raw_capacity = match raw_capacity {
        Some(c) => Some(c),
        None if keep_capacity => {
            let capacity = cpu_memory(status.capacity.as_ref());
            if !capacity.is_empty() {
                annotations.insert(RAW_CAPACITY.to_owned(), encode(&capacity)?);
            }
            Some(parsed(&capacity))
        }
        None => None,
    };

    // One resource's ratio of `null` is 0 to Go's decoder (it leaves a float its zero value), so
    // never amplified, where serde would refuse the list.
    let ratios: BTreeMap<String, Option<f64>> =
        read_within::<Option<BTreeMap<String, Option<f64>>>>(ratios_text.as_bytes())
            .map_err(|e| format!("failed to unmarshal node resource amplification ratio: {e}"))?
            .unwrap_or_default();
    for resource in AMPLIFIED {
        let Some(ratio) = ratios.get(resource).copied().flatten().filter(|r| *r > 1.0) else {
            continue;
        };
        let Some(raw_value) = raw.get(resource) else {
            continue;
        };
        let raw_value = raw_value.clone()?;
        // Truncated toward zero on milli-units, as Koordinator computes it. A product beyond the
        // 64-bit range Kubernetes' own arithmetic has is refused rather than saturated.
        let product = raw_value.milli() as f64 * ratio;
        if !product.is_finite() || product.abs() >= i64::MAX as f64 {
            return Err(format!(
                "{AMPLIFICATION_RATIO}: {resource} {} amplified by {ratio} is too large",
                raw_value
            ));
        }
        let amplified_milli = product as i128;
        let amplified = Qty::from_milli(amplified_milli, raw_value.format());
        allocatable.insert(resource.to_owned(), amplified.to_quantity());

        // The reserved part (capacity - allocatable) stays as the kubelet reported it.
        let raw_cap = raw_capacity.as_ref().and_then(|c| c.get(resource));
        if let (Some(raw_cap), Some(capacity)) = (raw_cap, status.capacity.as_mut()) {
            let raw_cap = raw_cap.clone()?;
            let milli = raw_cap
                .milli()
                .checked_sub(raw_value.milli())
                .and_then(|reserved| reserved.checked_add(amplified_milli))
                .ok_or_else(|| {
                    format!("{AMPLIFICATION_RATIO}: {resource} capacity {raw_cap} is too large")
                })?;
            capacity.insert(
                resource.to_owned(),
                Qty::from_milli(milli, raw_cap.format()).to_quantity(),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Duplicates are read and replaced as they come, not kept (a forged annotation of a million
    /// `"":0` entries held every one); the first bad value still fails the list, wherever it is.
    #[test]
    fn a_list_is_read_entry_by_entry() {
        let many = format!("{{{}\"cpu\":\"4\"}}", "\"\":0,".repeat(100_000));
        let list = decode("raw", &many).unwrap().unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list["cpu"], Ok("4".parse().unwrap()));
        let bad = format!(
            "{{\"cpu\":\"x\",{}\"memory\":\"1Gi\"}}",
            "\"\":0,".repeat(1_000)
        );
        let e = decode("node raw allocatable", &bad).unwrap_err();
        assert!(
            e.starts_with("failed to unmarshal node raw allocatable: "),
            "{e}"
        );
        assert_eq!(decode("raw", "null").unwrap(), None);
    }

    fn node(
        annotations: serde_json::Value,
        capacity: serde_json::Value,
        allocatable: serde_json::Value,
    ) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "annotations": annotations},
            "status": {"capacity": capacity, "allocatable": allocatable}
        }))
        .unwrap()
    }

    fn get<'a>(list: &'a Option<ResourceList>, k: &str) -> &'a str {
        &list.as_ref().unwrap()[k].0
    }

    #[test]
    fn products_beyond_64_bits_are_refused() {
        for (ratio, cpu) in [("1e300", "4"), ("4", "1e18")] {
            let kubelet = json!({"cpu": cpu, "memory": "8Gi"});
            let old = node(json!({}), kubelet.clone(), kubelet.clone());
            let mut new = node(
                json!({AMPLIFICATION_RATIO: format!(r#"{{"cpu": {ratio}}}"#)}),
                kubelet.clone(),
                kubelet,
            );
            let err = amplify(Some(&old), &mut new, true).unwrap_err();
            assert!(err.contains("is too large"), "{ratio} x {cpu}: {err}");
        }
    }

    #[test]
    fn with_the_capacity_gate_off_a_recorded_raw_capacity_is_not_applied() {
        // Left by a time the gate was on: capacity must stay what the kubelet reports.
        let kubelet = json!({"cpu": "4", "memory": "8Gi"});
        let annotations = json!({
            AMPLIFICATION_RATIO: r#"{"cpu": 2}"#,
            RAW_ALLOCATABLE: r#"{"cpu":"4","memory":"8Gi"}"#,
            RAW_CAPACITY: r#"{"cpu":"5","memory":"10Gi"}"#,
        });
        let old = node(annotations.clone(), kubelet.clone(), kubelet.clone());
        let mut new = node(annotations, kubelet.clone(), kubelet);
        amplify(Some(&old), &mut new, false).unwrap();
        let status = new.status.as_ref().unwrap();
        assert_eq!(get(&status.allocatable, "cpu"), "8");
        assert_eq!(get(&status.capacity, "cpu"), "4", "capacity untouched");
        assert_eq!(
            annotation(&new, RAW_CAPACITY),
            Some(r#"{"cpu":"5","memory":"10Gi"}"#),
            "the record is left as it is"
        );
    }

    #[test]
    fn amplifies_cpu_and_memory_only_and_records_raw_values() {
        let kubelet = json!({"cpu": "4", "memory": "8Gi", "eni": "10"});
        let old = node(
            json!({}),
            json!({"cpu": "5", "memory": "10Gi", "eni": "10"}),
            kubelet.clone(),
        );
        let mut new = node(
            json!({AMPLIFICATION_RATIO: r#"{"cpu": 1.5, "memory": 1.25, "eni": 3}"#}),
            json!({"cpu": "5", "memory": "10Gi", "eni": "10"}),
            kubelet,
        );
        amplify(Some(&old), &mut new, true).unwrap();
        let status = new.status.as_ref().unwrap();
        assert_eq!(get(&status.allocatable, "cpu"), "6");
        assert_eq!(get(&status.allocatable, "memory"), "10Gi");
        assert_eq!(get(&status.allocatable, "eni"), "10");
        // capacity = amplified allocatable + reserved (1 cpu, 2Gi).
        assert_eq!(get(&status.capacity, "cpu"), "7");
        assert_eq!(get(&status.capacity, "memory"), "12Gi");
        assert_eq!(get(&status.capacity, "eni"), "10");
        assert_eq!(
            annotation(&new, RAW_ALLOCATABLE),
            Some(r#"{"cpu":"4","memory":"8Gi"}"#)
        );
        assert_eq!(
            annotation(&new, RAW_CAPACITY),
            Some(r#"{"cpu":"5","memory":"10Gi"}"#)
        );

        // The next status update carries the amplified values: nothing compounds.
        let before = new.clone();
        let mut again = new.clone();
        amplify(Some(&before), &mut again, true).unwrap();
        assert_eq!(again, before);
    }

    #[test]
    fn a_new_kubelet_report_is_recorded_again() {
        let recorded =
            json!({AMPLIFICATION_RATIO: r#"{"cpu": 2}"#, RAW_ALLOCATABLE: r#"{"cpu":"4"}"#});
        let old = node(recorded.clone(), json!({"cpu": "8"}), json!({"cpu": "8"}));
        let mut new = node(recorded, json!({"cpu": "8"}), json!({"cpu": "3"}));
        amplify(Some(&old), &mut new, false).unwrap();
        assert_eq!(get(&new.status.as_ref().unwrap().allocatable, "cpu"), "6");
        assert_eq!(annotation(&new, RAW_ALLOCATABLE), Some(r#"{"cpu":"3"}"#));
        assert_eq!(
            annotation(&new, RAW_CAPACITY),
            None,
            "never written with the gate off"
        );
        assert_eq!(get(&new.status.as_ref().unwrap().capacity, "cpu"), "8");
    }

    #[test]
    fn truncates_milli_values_and_ignores_small_ratios() {
        let mut new = node(
            json!({AMPLIFICATION_RATIO: r#"{"cpu": 1.333, "memory": 0.5}"#}),
            json!({}),
            json!({"cpu": "1", "memory": "1Gi"}),
        );
        amplify(None, &mut new, false).unwrap();
        let status = new.status.as_ref().unwrap();
        assert_eq!(get(&status.allocatable, "cpu"), "1333m");
        assert_eq!(get(&status.allocatable, "memory"), "1Gi");
    }

    #[test]
    fn removing_the_ratio_drops_the_raw_annotations() {
        let mut new = node(
            json!({RAW_ALLOCATABLE: r#"{"cpu":"4"}"#, RAW_CAPACITY: r#"{"cpu":"5"}"#, "other": "x"}),
            json!({}),
            json!({"cpu": "6"}),
        );
        amplify(None, &mut new, true).unwrap();
        assert_eq!(annotation(&new, RAW_ALLOCATABLE), None);
        assert_eq!(annotation(&new, RAW_CAPACITY), None);
        assert_eq!(annotation(&new, "other"), Some("x"));
    }

    #[test]
    fn unparsable_annotations_are_internal_errors() {
        let mut new = node(
            json!({AMPLIFICATION_RATIO: "{"}),
            json!({}),
            json!({"cpu": "1"}),
        );
        assert!(
            amplify(None, &mut new, false)
                .unwrap_err()
                .starts_with("failed to unmarshal node resource amplification ratio: ")
        );
        let ann = json!({AMPLIFICATION_RATIO: r#"{"cpu": 2}"#, RAW_ALLOCATABLE: "nope"});
        let old = node(ann.clone(), json!({}), json!({"cpu": "1"}));
        let mut new = node(ann, json!({}), json!({"cpu": "1"}));
        assert!(
            amplify(Some(&old), &mut new, false)
                .unwrap_err()
                .starts_with("failed to unmarshal node raw allocatable: ")
        );
    }

    /// A status update that keeps the kubelet's allocatable, with `raw` recorded and `ratio`.
    fn unchanged(ratio: &str, raw: &str) -> Result<Node, String> {
        let ann = json!({AMPLIFICATION_RATIO: ratio, RAW_ALLOCATABLE: raw});
        let kubelet = json!({"cpu": "4", "memory": "8Gi"});
        let old = node(ann.clone(), kubelet.clone(), kubelet.clone());
        let mut new = node(ann, kubelet.clone(), kubelet);
        amplify(Some(&old), &mut new, false).map(|()| new)
    }

    const RAW_PREFIX: &str = "failed to unmarshal node raw allocatable: ";

    #[test]
    fn a_recorded_raw_allocatable_with_any_bad_value_is_refused_whole() {
        // Koordinator reads the whole list (json.Unmarshal into a ResourceList) before the ratios:
        // one value that does not parse is a 500 with every ratio form, even when the value
        // amplified parses, never an allocatable amplified from the rest.
        let ratios = [
            r#"{"cpu":2}"#,
            r#"{"cpu":"1.5"}"#,
            r#"{"cpu":1.5,"memory":2}"#,
            "null",
            "{}",
            "not json",
            r#"{"cpu":0.5}"#,
        ];
        let raws = [
            r#"{"cpu":"4","memory":"lots"}"#,
            r#"{"memory":"8Gi","cpu":"four"}"#,
            r#"{"cpu":"x","cpu":"4"}"#,
            r#"{"cpu":true}"#,
            r#"{"cpu":{}}"#,
            r#"{"cpu":"4\u0030"}"#,
            "bad",
            "[]",
        ];
        for ratio in ratios {
            for raw in raws {
                let err = unchanged(ratio, raw).unwrap_err();
                assert!(err.starts_with(RAW_PREFIX), "{ratio} / {raw}: {err}");
            }
        }
        // A syntax error anywhere wins over a bad value before it (Go scans the text first).
        let err = unchanged(r#"{"cpu":2}"#, r#"{"cpu":"x","#).unwrap_err();
        assert!(err.starts_with(RAW_PREFIX) && err.contains("EOF"), "{err}");
    }

    #[test]
    fn a_bad_raw_value_that_is_amplified_is_reported_with_the_annotations_prefix() {
        // Koordinator's words: the prefix, then the quantity's own error (Go's).
        let quantity = crate::resources::QuantityError::Syntax(String::new());
        for raw in [r#"{"cpu":"x"}"#, r#"{"cpu":"4","memory":"x"}"#] {
            assert_eq!(
                unchanged(r#"{"cpu":1.5,"memory":2}"#, raw).unwrap_err(),
                format!("{RAW_PREFIX}{quantity}"),
                "{raw}"
            );
        }
    }

    #[test]
    fn recorded_raw_values_are_read_as_go_reads_quantities() {
        let cpu = |raw: &str| {
            let node = unchanged(r#"{"cpu":2}"#, raw).unwrap();
            node.status.unwrap().allocatable.unwrap()["cpu"].0.clone()
        };
        // A number is parsed as its text, `null` is zero, spaces inside the quotes are trimmed,
        // and of two entries for one name the last counts.
        assert_eq!(cpu(r#"{"cpu":4}"#), "8");
        // (Go writes it `3e3`; the same value.)
        assert_eq!(
            cpu(r#"{"cpu":1.5e3}"#).parse::<Qty>().unwrap().milli(),
            3_000_000
        );
        assert_eq!(cpu(r#"{"cpu":null}"#), "0");
        assert_eq!(cpu(r#"{"cpu":" 3 "}"#), "6");
        assert_eq!(cpu(r#"{"cpu":"1","cpu":"5"}"#), "10");
        assert_eq!(
            cpu(r#"{"memory":"1Gi"}"#),
            "4",
            "no raw cpu: left as reported"
        );
    }

    #[test]
    fn null_annotations_read_as_absent_lists_as_koordinator_reads_them() {
        // A ratio of `null`: nothing to amplify.
        let ann = json!({AMPLIFICATION_RATIO: "null"});
        let mut new = node(ann.clone(), json!({}), json!({"cpu": "1"}));
        amplify(
            Some(&node(ann, json!({}), json!({"cpu": "1"}))),
            &mut new,
            false,
        )
        .unwrap();
        assert_eq!(new.status.unwrap().allocatable.unwrap()["cpu"].0, "1");
        // A ratio of `null` for one resource: 0 to Go, so never amplified; the others are.
        let ann = json!({AMPLIFICATION_RATIO: r#"{"cpu":null,"memory":2}"#});
        let kubelet = json!({"cpu": "1", "memory": "1Gi"});
        let mut new = node(ann.clone(), json!({}), kubelet.clone());
        amplify(Some(&node(ann, json!({}), kubelet)), &mut new, false).unwrap();
        let allocatable = new.status.unwrap().allocatable.unwrap();
        assert_eq!(
            (
                allocatable["cpu"].0.as_str(),
                allocatable["memory"].0.as_str()
            ),
            ("1", "2Gi")
        );
        // A recorded raw allocatable of `null` with an unchanged allocatable: left as it is.
        let ann = json!({AMPLIFICATION_RATIO: r#"{"cpu": 2}"#, RAW_ALLOCATABLE: "null"});
        let old = node(ann.clone(), json!({}), json!({"cpu": "1"}));
        let mut new = node(ann, json!({}), json!({"cpu": "1"}));
        amplify(Some(&old), &mut new, false).unwrap();
        assert_eq!(new.status.unwrap().allocatable.unwrap()["cpu"].0, "1");
    }
}

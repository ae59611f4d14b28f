//! A config text read the way Koordinator reads it, with Go's `encoding/json` into its structs:
//!
//! - a key names a field whatever its letter case (Go matches the exact name first, then the
//!   name under Unicode simple case folding, where `ſ` is an `s` and the Kelvin sign a `k`);
//! - a key given twice (in any case) keeps the last value, except that an object given again is
//!   merged into the first one (Go decodes into the struct or map it already filled);
//! - keys inside `matchLabels` are label names, taken as written.
//!
//! The text is first read into a JSON value with every key under its field's canonical name, then
//! decoded into the Rust type, whose serde names are those canonical names.

use crate::memory::metered::metered_seed;
use crate::memory::{Meter, decode_allowance};
use serde::de::{DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Every JSON name of the fields the SLO config types read (`types.rs`, and the label selector's),
/// as Go's structs spell them. A unit test checks it against `types.rs`.
const FIELD_NAMES: &[&str] = &[
    // Label selectors.
    "matchLabels",
    "matchExpressions",
    "key",
    "operator",
    "values",
    // Profiles and the shape of every key.
    "name",
    "nodeSelector",
    "nodeConfigs",
    "clusterStrategy",
    "nodeStrategies",
    // colocation-config.
    "enable",
    "metricAggregateDurationSeconds",
    "metricReportIntervalSeconds",
    "cpuReclaimThresholdPercent",
    "memoryReclaimThresholdPercent",
    "degradeTimeMinutes",
    "updateTimeThresholdSeconds",
    "resourceDiffThreshold",
    "midCPUThresholdPercent",
    "midMemoryThresholdPercent",
    "midUnallocatedPercent",
    "midStaticCPUReservedPercent",
    "midStaticMemoryReservedPercent",
    "batchCPUThresholdPercent",
    "batchMemoryThresholdPercent",
    // resource-threshold-config.
    "cpuSuppressThresholdPercent",
    "cpuSuppressMinPercent",
    "cpuEvictBEUsageThresholdPercent",
    "memoryEvictThresholdPercent",
    "memoryEvictLowerPercent",
    "memoryAllocatableEvictThresholdPercent",
    "memoryAllocatableEvictLowerPercent",
    "cpuEvictBESatisfactionUpperPercent",
    "cpuEvictBESatisfactionLowerPercent",
    "cpuEvictThresholdPercent",
    "cpuEvictLowerPercent",
    "cpuAllocatableEvictThresholdPercent",
    "cpuAllocatableEvictLowerPercent",
    "cpuEvictTimeWindowSeconds",
    "allocatableEvictPriorityThreshold",
    // resource-qos-config.
    "lsrClass",
    "lsClass",
    "beClass",
    "systemClass",
    "cgroupRoot",
    "cpuQOS",
    "memoryQOS",
    "resctrlQOS",
    "networkQOS",
    "groupIdentity",
    "schedIdle",
    "minLimitPercent",
    "lowLimitPercent",
    "throttlingPercent",
    "wmarkRatio",
    "wmarkScalePermill",
    "wmarkMinAdj",
    "priorityEnable",
    "priority",
    "oomKillGroup",
    "pageCacheLimitPercent",
    "catRangeStartPercent",
    "catRangeEndPercent",
    "mbaPercent",
    "ingressRequest",
    "ingressLimit",
    "egressRequest",
    "egressLimit",
    // cpu-burst-config.
    "policy",
    "cpuBurstPercent",
    "cfsQuotaBurstPercent",
    "cfsQuotaBurstPeriodSeconds",
    "sharePoolThresholdPercent",
    // system-config.
    "minFreeKbytesFactor",
    "watermarkScaleFactor",
    "memcgReapBackGround",
    "pageCacheLimitEnabled",
    "totalNetworkBandwidth",
];

/// The object whose keys are label names rather than field names.
const LABEL_MAP: &str = "matchLabels";

/// Decodes `text` into `T` as Go's `json.Unmarshal` fills the matching Go struct (see the module).
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, serde_json::Error> {
    T::deserialize(read(text)?)
}

/// `text` as a JSON value with every key under its field's canonical name (syntax errors with
/// their position; serde_json's nesting limit applies).
pub fn read(text: &str) -> Result<Value, serde_json::Error> {
    // Held to what the text allows, as a review's decode is: a data value of `[[0],[0],…]` is one
    // string to the review's estimate and millions of values here.
    let meter = Meter::start(decode_allowance(text.as_bytes()));
    let mut reader = serde_json::Deserializer::from_str(text);
    let value = metered_seed(Folded { label_map: false }, &mut reader);
    meter.check().map_err(serde::de::Error::custom)?;
    let value = value?;
    reader.end()?;
    Ok(value)
}

/// Go's case folding of a name: ASCII letters upper-cased, `ſ` as `S`, the Kelvin sign as `K`
/// (the only non-ASCII runes whose fold set holds an ASCII letter).
fn folded(name: &str) -> impl Iterator<Item = char> + '_ {
    name.chars().map(|c| match c {
        'ſ' => 'S',
        '\u{212A}' => 'K',
        c => c.to_ascii_uppercase(),
    })
}

/// The field `key` names: itself when exact, else the field equal under folding; unknown keys as
/// they are (both decoders ignore them). A scan of a few dozen short names with the exact match
/// first measured faster than a hashed table of folded names (which allocates per key).
fn canonical(key: String) -> String {
    if FIELD_NAMES.contains(&key.as_str()) {
        return key;
    }
    FIELD_NAMES
        .iter()
        .find(|name| folded(name).eq(folded(&key)))
        .map_or(key, |name| (*name).to_owned())
}

/// `value` stored at `key` as Go stores a repeated key: an object into the object already there,
/// anything else in its place.
fn merge(into: &mut Map<String, Value>, key: String, value: Value) {
    match (into.get_mut(&key), value) {
        (Some(Value::Object(old)), Value::Object(new)) => {
            for (k, v) in new {
                merge(old, k, v);
            }
        }
        (_, value) => {
            into.insert(key, value);
        }
    }
}

/// One JSON value with its object keys canonical.
struct Folded {
    /// The keys of this object are label names.
    label_map: bool,
}

impl<'de> DeserializeSeed<'de> for Folded {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Folded {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Folded { label_map: false })? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let key = if self.label_map { key } else { canonical(key) };
            let label_map = !self.label_map && key == LABEL_MAP;
            let value = map.next_value_seed(Folded { label_map })?;
            merge(&mut out, key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(text: &str) -> Value {
        from_str(text).unwrap()
    }

    #[test]
    fn keys_match_fields_in_any_case_and_labels_stay_as_written() {
        assert_eq!(
            read(
                r#"{"ENABLE":true,"CpuReclaimThresholdPercent":5,"other":1,
                   "nodeConfigs":[{"NODESELECTOR":{"MATCHLABELS":{"Pool":"x"}}}]}"#
            ),
            json!({"enable": true, "cpuReclaimThresholdPercent": 5, "other": 1,
                   "nodeConfigs": [{"nodeSelector": {"matchLabels": {"Pool": "x"}}}]})
        );
        assert_eq!(
            read(r#"{"enable":1,"ſchedIdle":2}"#),
            json!({"enable": 1, "schedIdle": 2})
        );
    }

    #[test]
    fn a_repeated_key_keeps_the_last_value_and_merges_objects() {
        assert_eq!(
            read(r#"{"enable":true,"Enable":false}"#),
            json!({"enable": false})
        );
        assert_eq!(
            read(r#"{"clusterStrategy":{"enable":true},"ClusterStrategy":{"policy":"auto"}}"#),
            json!({"clusterStrategy": {"enable": true, "policy": "auto"}})
        );
        assert_eq!(
            read(r#"{"clusterStrategy":{"enable":true},"clusterStrategy":null}"#),
            json!({"clusterStrategy": null})
        );
    }

    #[test]
    fn syntax_errors_are_errors() {
        assert!(from_str::<Value>("{").is_err());
        assert!(from_str::<Value>("{} x").is_err());
        // Nesting is bounded (serde_json's limit), never a stack overflow.
        let deep = format!("{}{}", "{\"a\":".repeat(100_000), "}".repeat(100_000));
        assert!(from_str::<Value>(&deep).is_err());
        let deep = "[".repeat(100_000);
        assert!(from_str::<Value>(&deep).is_err());
    }

    /// Every field name `types.rs` gives serde is in [`FIELD_NAMES`], and no two names fold alike.
    #[test]
    fn the_field_names_are_those_of_the_types() {
        let source = include_str!("types.rs");
        let mut rename = None;
        let mut flatten = false;
        for line in source.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("#[serde(rename = \"") {
                rename = rest.split('"').next().map(str::to_owned);
                continue;
            }
            if line.contains("flatten") {
                flatten = true;
                continue;
            }
            if let Some(rest) = line.strip_prefix("pub ")
                && let Some((field, _)) = rest.split_once(": ")
                && field.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            {
                let camel: String = field
                    .split('_')
                    .enumerate()
                    .map(|(i, part)| {
                        if i == 0 {
                            part.to_owned()
                        } else {
                            let mut c = part.chars();
                            c.next()
                                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                                .unwrap_or_default()
                        }
                    })
                    .collect();
                let name = rename.take().unwrap_or(camel);
                if !std::mem::take(&mut flatten) {
                    assert!(FIELD_NAMES.contains(&name.as_str()), "{name} is missing");
                }
            }
        }
        for (i, a) in FIELD_NAMES.iter().enumerate() {
            for b in &FIELD_NAMES[i + 1..] {
                assert!(!folded(a).eq(folded(b)), "{a} and {b} fold alike");
            }
        }
    }
}

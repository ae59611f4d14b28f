//! A deserializer wrapper that stops a decode once the thread's meter is over its limit
//! (`counting.rs`): it asks at every value, map key and element, so the decode ends one value past
//! the limit whatever the type does with what it reads. Without a meter on the thread it only passes
//! values on.
//!
//! It wraps every deserializer, visitor and access the type is handed, down to the leaves, as
//! serde's own adapters do; a type's custom `Deserialize` (the slim pod's open objects, the
//! unread-field filter) sees the wrapper like any deserializer.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, Visitor};

use super::counting::{Meter, over_limit};
use super::estimate::decode_allowance;
use crate::serde_proxy::{each_deserialize_method, each_visit_value_method};

/// The error a decode stops with; the caller tells it from a syntax error by its meter.
pub const OVER_LIMIT: &str = "decoding stopped: the review's memory allowance is spent";

/// Decodes `T` from `deserializer`, stopping at the first value after this thread's meter is past
/// its limit.
pub fn metered<'de, T, D>(deserializer: D) -> Result<T, D::Error>
where
    T: de::Deserialize<'de>,
    D: Deserializer<'de>,
{
    T::deserialize(Metered(deserializer))
}

/// `value` as a JSON tree, built within the memory its text's estimate allows (its text written
/// first, then read under a meter): a tree of an object whose fields were kept as text
/// (`admission/open_object.rs`) is built only where a rule needs it (a patch, a differ), and a
/// shape larger as a tree than its text says is refused here as in a review's decode.
pub fn to_value_within<T: serde::Serialize + ?Sized>(
    value: &T,
) -> Result<serde_json::Value, WithinError> {
    let text = serde_json::to_vec(value).map_err(WithinError::Json)?;
    read_within(&text)
}

/// `text` read as `T` under a meter of its own allowance ([`decode_allowance`]).
pub fn read_within<T: de::DeserializeOwned>(text: &[u8]) -> Result<T, WithinError> {
    let meter = Meter::start(decode_allowance(text));
    let mut d = serde_json::Deserializer::from_slice(text);
    let read = metered(&mut d).and_then(|t| d.end().map(|()| t));
    meter.check().map_err(WithinError::OverLimit)?;
    read.map_err(WithinError::Json)
}

/// Why [`to_value_within`] or [`read_within`] gave no value.
#[derive(Debug, thiserror::Error)]
pub enum WithinError {
    #[error("it would take more memory than its text allows: {0}")]
    OverLimit(super::counting::OverLimit),
    #[error(transparent)]
    Json(serde_json::Error),
}

/// As [`metered`], for a seed.
pub fn metered_seed<'de, S, D>(seed: S, deserializer: D) -> Result<S::Value, D::Error>
where
    S: DeserializeSeed<'de>,
    D: Deserializer<'de>,
{
    seed.deserialize(Metered(deserializer))
}

fn check<E: de::Error>() -> Result<(), E> {
    if over_limit() {
        Err(E::custom(OVER_LIMIT))
    } else {
        Ok(())
    }
}

/// A deserializer whose values are checked.
struct Metered<D>(D);

macro_rules! forward {
    ($($method:ident ( $($arg:ident : $ty:ty),* )),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
            check()?;
            self.0.$method($($arg,)* Metered(visitor))
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Metered<D> {
    type Error = D::Error;

    each_deserialize_method!(forward);

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

macro_rules! pass {
    ($($method:ident ( $ty:ty )),* $(,)?) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
            self.0.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Metered<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.0.expecting(f)
    }

    each_visit_value_method!(pass);

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.0.visit_some(Metered(d))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.0.visit_newtype_struct(Metered(d))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.0.visit_seq(Metered(seq))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.0.visit_map(Metered(map))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.0.visit_enum(Metered(data))
    }
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Metered<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Metered(d))
    }
}

impl<'de, A: de::SeqAccess<'de>> de::SeqAccess<'de> for Metered<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        check()?;
        self.0.next_element_seed(Metered(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: de::MapAccess<'de>> de::MapAccess<'de> for Metered<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        check()?;
        self.0.next_key_seed(Metered(seed))
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        check()?;
        self.0.next_value_seed(Metered(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: de::EnumAccess<'de>> de::EnumAccess<'de> for Metered<A> {
    type Error = A::Error;
    type Variant = Metered<A::Variant>;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Self::Variant), A::Error> {
        check()?;
        let (value, variant) = self.0.variant_seed(Metered(seed))?;
        Ok((value, Metered(variant)))
    }
}

impl<'de, A: de::VariantAccess<'de>> de::VariantAccess<'de> for Metered<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.0.unit_variant()
    }

    fn newtype_variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<S::Value, A::Error> {
        self.0.newtype_variant_seed(Metered(seed))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.0.tuple_variant(len, Metered(visitor))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.0.struct_variant(fields, Metered(visitor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_tree_larger_than_its_text_allows_is_refused() {
        // `{"":0}` is 7 bytes of text and ~670 bytes as a tree.
        let text = format!("[{}{{\"\":0}}]", "{\"\":0},".repeat(100_000));
        let raw: Box<serde_json::value::RawValue> = serde_json::from_str(&text).unwrap();
        let e = to_value_within(&raw).unwrap_err();
        assert!(matches!(e, WithinError::OverLimit(_)), "{e}");
        let fits: serde_json::Value = read_within(br#"{"a": [1, 2, {"b": "c"}]}"#).unwrap();
        assert_eq!(fits["a"][2]["b"], "c");
    }

    fn decode<T: de::DeserializeOwned>(text: &str) -> Result<T, serde_json::Error> {
        let mut d = serde_json::Deserializer::from_str(text);
        let t = metered(&mut d)?;
        d.end()?;
        Ok(t)
    }

    /// Large when empty: what a decode of many `{}` would fill memory with.
    #[derive(serde::Deserialize, Default)]
    #[allow(dead_code)]
    struct Wide {
        a: Option<[u64; 32]>,
        b: Option<[u64; 32]>,
        c: Option<[u64; 32]>,
        d: Option<[u64; 32]>,
        e: Option<String>,
    }

    #[test]
    fn without_a_meter_it_decodes_as_serde_json_does() {
        let text = r#"{"a": [1, {"b": null}], "c": "x\n", "d": {"e": [true, 2.5]}}"#;
        let direct: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(decode::<serde_json::Value>(text).unwrap(), direct);
        let map: BTreeMap<String, Vec<u8>> = decode(r#"{"x": [1, 2]}"#).unwrap();
        assert_eq!(map["x"], [1, 2]);
        assert!(decode::<Vec<u8>>("[1,").is_err());
    }

    #[test]
    fn a_decode_stops_soon_after_its_limit() {
        // 100,000 empty objects (300 KB of text), ~1 KiB each once decoded: ~100 MiB unmetered.
        let text = format!("[{}{{}}]", "{},".repeat(100_000));
        let meter = Meter::start(4 << 20);
        let e = decode::<Vec<Wide>>(&text).err().expect("stopped");
        assert!(e.to_string().starts_with(OVER_LIMIT), "{e}");
        let peak = meter.peak();
        // A vector that doubles may take twice its size once before the next element is checked.
        assert!(peak < 3 * (4 << 20), "peak {peak}");
        assert!(meter.check().is_err());
    }

    #[test]
    fn within_its_limit_a_decode_is_untouched() {
        let text = format!("[{}{{}}]", "{},".repeat(100));
        let meter = Meter::start(4 << 20);
        assert_eq!(decode::<Vec<Wide>>(&text).unwrap().len(), 101);
        assert!(meter.check().is_ok());
    }
}

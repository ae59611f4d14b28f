//! Objects decoded without their `metadata.managedFields`: no rule reads them, the API server keeps
//! its own, and a patch never carries them. k8s-openapi's `ObjectMeta` (and so every kind but the
//! slim pod) would otherwise decode each entry's `fieldsV1` into a JSON tree, whatever its size.
//! Two readers use it: a review (`admission/review.rs`), where that tree is the one free-form shape
//! a caller could fill with millions of small values (issue 41: 8 MiB of zeros there cost a replica
//! 280 MiB before the decode budget counted values), and the cache's watches
//! (`cache/unmanaged.rs`), where it was most of what a relist decodes. Here the field is walked
//! over unread, as serde walks a field the type does not declare.
//!
//! It works as a wrapper around the JSON deserializer that looks at the keys of two maps only, the
//! object's and its `metadata`'s, and hands every other value to the type untouched.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer, Visitor};

use crate::serde_proxy::{each_deserialize_method, each_visit_value_method};

/// The field left out of `metadata`.
const MANAGED_FIELDS: &str = "managedFields";

/// Which map the wrapper is at.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    /// The object: its `metadata` value is wrapped.
    Object,
    /// `metadata`: its `managedFields` are skipped.
    Metadata,
}

/// Decodes `T` from `deserializer`, skipping `metadata.managedFields`.
pub fn without_managed_fields<'de, T, D>(deserializer: D) -> Result<T, D::Error>
where
    T: de::Deserialize<'de>,
    D: Deserializer<'de>,
{
    T::deserialize(Filtered {
        inner: deserializer,
        level: Level::Object,
    })
}

/// `Option<T>` as [`without_managed_fields`] decodes `T` (`null` is `None`); for
/// `#[serde(deserialize_with)]`.
pub fn optional_without_managed_fields<'de, T, D>(deserializer: D) -> Result<Option<T>, D::Error>
where
    T: de::Deserialize<'de>,
    D: Deserializer<'de>,
{
    struct Present<T>(T);
    impl<'de, T: de::Deserialize<'de>> de::Deserialize<'de> for Present<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            without_managed_fields(d).map(Present)
        }
    }
    Ok(Option::<Present<T>>::deserialize(deserializer)?.map(|Present(t)| t))
}

struct Filtered<D> {
    inner: D,
    level: Level,
}

macro_rules! forward {
    ($($method:ident ( $($arg:ident : $ty:ty),* )),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
            self.inner.$method($($arg,)* Filter { inner: visitor, level: self.level })
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Filtered<D> {
    type Error = D::Error;

    each_deserialize_method!(forward);

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// The type's visitor; a map it is given is filtered.
struct Filter<V> {
    inner: V,
    level: Level,
}

macro_rules! pass {
    ($($method:ident ( $ty:ty )),* $(,)?) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
            self.inner.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Filter<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(f)
    }

    each_visit_value_method!(pass);

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.inner.visit_some(Filtered {
            inner: d,
            level: self.level,
        })
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.inner.visit_newtype_struct(Filtered {
            inner: d,
            level: self.level,
        })
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.inner.visit_seq(seq)
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(FilterMap {
            inner: map,
            level: self.level,
            metadata_next: false,
        })
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.inner.visit_enum(data)
    }
}

/// The object's or its metadata's fields: keys are read first (as text), so that one can be
/// skipped before the type sees it.
struct FilterMap<A> {
    inner: A,
    level: Level,
    /// The key just handed on was the object's `metadata`.
    metadata_next: bool,
}

impl<'de, A: de::MapAccess<'de>> de::MapAccess<'de> for FilterMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let Some(key) = self.inner.next_key::<Key<'de>>()? else {
                return Ok(None);
            };
            let text = key.text();
            if self.level == Level::Metadata && text == MANAGED_FIELDS {
                self.inner.next_value::<IgnoredAny>()?;
                continue;
            }
            self.metadata_next = self.level == Level::Object && text == "metadata";
            return match key {
                Key::Borrowed(text) => seed
                    .deserialize(de::value::BorrowedStrDeserializer::<A::Error>::new(text))
                    .map(Some),
                Key::Owned(text) => {
                    let text: de::value::StringDeserializer<A::Error> = text.into_deserializer();
                    seed.deserialize(text).map(Some)
                }
            };
        }
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        if std::mem::take(&mut self.metadata_next) {
            self.inner.next_value_seed(MetadataSeed(seed))
        } else {
            self.inner.next_value_seed(seed)
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

/// A key as the JSON holds it: borrowed from the body when it has no escapes (the usual case on
/// the request path, where a key then costs no allocation), owned otherwise.
enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Key<'_> {
    fn text(&self) -> &str {
        match self {
            Key::Borrowed(text) => text,
            Key::Owned(text) => text,
        }
    }
}

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> Visitor<'de> for Text {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key::Borrowed(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key::Owned(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key::Owned(v))
            }
        }
        d.deserialize_str(Text)
    }
}

/// The `metadata` value, decoded through the wrapper at [`Level::Metadata`].
struct MetadataSeed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for MetadataSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Filtered {
            inner: d,
            level: Level::Metadata,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;

    use crate::apis::ElasticQuota;

    fn decode<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, serde_json::Error> {
        let mut d = serde_json::Deserializer::from_str(text);
        let t = without_managed_fields(&mut d)?;
        d.end()?;
        Ok(t)
    }

    fn quota_text(managed_fields: serde_json::Value) -> String {
        json!({
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": "q", "namespace": "ns", "labels": {"a": "b"},
                         "managedFields": managed_fields,
                         "annotations": {"managedFields": "kept: only metadata's own is dropped"}},
            "spec": {"max": {"cpu": "2"}, "min": {"cpu": "1"}}
        })
        .to_string()
    }

    #[test]
    fn the_object_decodes_as_without_the_wrapper_less_its_managed_fields() {
        let text = quota_text(json!([{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]));
        let filtered: ElasticQuota = decode(&text).unwrap();
        let mut whole: ElasticQuota = serde_json::from_str(&text).unwrap();
        assert!(whole.metadata.managed_fields.is_some());
        whole.metadata.managed_fields = None;
        assert_eq!(filtered, whole);
        assert_eq!(
            filtered.metadata.annotations.unwrap()["managedFields"],
            "kept: only metadata's own is dropped"
        );
    }

    #[test]
    fn managed_fields_of_any_shape_are_walked_over_not_checked() {
        // A shape the typed field would refuse is still skipped: no rule reads it.
        for shape in [
            json!(null),
            json!(7),
            json!({"x": [0, 0, 0]}),
            json!([vec![0; 64]]),
        ] {
            let quota: ElasticQuota = decode(&quota_text(shape.clone())).unwrap();
            assert_eq!(quota.metadata.managed_fields, None, "{shape}");
        }
        // A broken document is still an error, with serde_json's position.
        let broken = quota_text(json!([])).replace("\"managedFields\":[]", "\"managedFields\":[");
        assert!(decode::<ElasticQuota>(&broken).is_err());
    }

    #[test]
    fn escaped_keys_are_read_as_their_text() {
        let text = quota_text(json!([{"manager": "m"}]))
            .replace("\"managedFields\"", "\"managed\\u0046ields\"")
            .replace("\"labels\"", "\"lab\\u0065ls\"");
        let quota: ElasticQuota = decode(&text).unwrap();
        assert_eq!(quota.metadata.managed_fields, None);
        assert_eq!(quota.metadata.labels.unwrap()["a"], "b");
    }

    #[test]
    fn the_types_own_errors_come_through() {
        let e = decode::<ConfigMap>(r#"{"metadata": {"name": 7}}"#).unwrap_err();
        assert!(e.to_string().contains("invalid type: integer `7`"), "{e}");
        let e = decode::<ConfigMap>(r#"{"data": {"k": 1}}"#).unwrap_err();
        assert!(e.to_string().contains("expected a string"), "{e}");
        let none: Option<ConfigMap> = {
            let mut d = serde_json::Deserializer::from_str("null");
            optional_without_managed_fields(&mut d).unwrap()
        };
        assert_eq!(none, None);
    }
}

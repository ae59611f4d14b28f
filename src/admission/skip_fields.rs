//! Decoding that leaves out fields no plugin of an endpoint reads or writes.
//!
//! A pod's containers carry env, args, probes and mounts: most of a large pod's bytes, and most of
//! the time spent decoding it, yet no pod plugin touches them. [`from_str`] wraps serde_json's
//! deserializer so that, inside the structs named in a [`SkipFields`], those fields are stepped over
//! as text instead of being decoded (they read as absent). The wrapper only forwards everywhere
//! else. A mutating endpoint may use it only with a differ that never replaces an object whole
//! (fields absent on both sides then stay out of the patch), and decodes whole while a plugin may
//! edit any field (`Mutator::edits_any_field`).

use std::fmt;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, IgnoredAny, IntoDeserializer, MapAccess,
    SeqAccess, VariantAccess, Visitor,
};

/// Per struct name (as its `Deserialize` passes it to `deserialize_struct`), the fields to step over.
#[derive(Debug)]
pub struct SkipFields(pub &'static [(&'static str, &'static [&'static str])]);

impl SkipFields {
    fn of(&self, name: &str) -> Option<&'static [&'static str]> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }
}

/// Decodes `text` as `T`, stepping over the fields `skip` names.
pub fn from_str<T: de::DeserializeOwned>(text: &str, skip: &SkipFields) -> serde_json::Result<T> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = T::deserialize(Filter {
        inner: &mut de,
        skip,
    })?;
    de.end()?;
    Ok(value)
}

struct Filter<'s, D> {
    inner: D,
    skip: &'s SkipFields,
}

/// A visitor passed down with the fields to drop at this level (`Some` only in a named struct).
struct Wrap<'s, V> {
    visitor: V,
    skip: &'s SkipFields,
    drop: Option<&'static [&'static str]>,
}

impl<'s, V> Wrap<'s, V> {
    fn new(visitor: V, skip: &'s SkipFields) -> Self {
        Self {
            visitor,
            skip,
            drop: None,
        }
    }
}

macro_rules! forward_deserialize {
    ($($method:ident($($arg:ident: $ty:ty),*)),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(
            self,
            $($arg: $ty,)*
            visitor: V,
        ) -> Result<V::Value, Self::Error> {
            self.inner.$method($($arg,)* Wrap::new(visitor, self.skip))
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Filter<'_, D> {
    type Error = D::Error;

    forward_deserialize!(
        deserialize_any(),
        deserialize_bool(),
        deserialize_i8(),
        deserialize_i16(),
        deserialize_i32(),
        deserialize_i64(),
        deserialize_i128(),
        deserialize_u8(),
        deserialize_u16(),
        deserialize_u32(),
        deserialize_u64(),
        deserialize_u128(),
        deserialize_f32(),
        deserialize_f64(),
        deserialize_char(),
        deserialize_str(),
        deserialize_string(),
        deserialize_bytes(),
        deserialize_byte_buf(),
        deserialize_option(),
        deserialize_unit(),
        deserialize_seq(),
        deserialize_map(),
        deserialize_identifier(),
        deserialize_ignored_any(),
        deserialize_unit_struct(name: &'static str),
        deserialize_newtype_struct(name: &'static str),
        deserialize_tuple(len: usize),
        deserialize_tuple_struct(name: &'static str, len: usize),
        deserialize_enum(name: &'static str, variants: &'static [&'static str]),
    );

    /// The one method that does more than forward: a named struct may have fields to drop.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        let wrap = Wrap {
            visitor,
            skip: self.skip,
            drop: self.skip.of(name),
        };
        self.inner.deserialize_struct(name, fields, wrap)
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

macro_rules! forward_visit {
    ($($method:ident($ty:ty)),*) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
            self.visitor.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.visitor.expecting(f)
    }

    forward_visit!(
        visit_bool(bool),
        visit_i8(i8),
        visit_i16(i16),
        visit_i32(i32),
        visit_i64(i64),
        visit_i128(i128),
        visit_u8(u8),
        visit_u16(u16),
        visit_u32(u32),
        visit_u64(u64),
        visit_u128(u128),
        visit_f32(f32),
        visit_f64(f64),
        visit_char(char),
        visit_str(&str),
        visit_borrowed_str(&'de str),
        visit_string(String),
        visit_bytes(&[u8]),
        visit_borrowed_bytes(&'de [u8]),
        visit_byte_buf(Vec<u8>)
    );

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.visitor.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.visitor.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, inner: D) -> Result<Self::Value, D::Error> {
        self.visitor.visit_some(Filter {
            inner,
            skip: self.skip,
        })
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, inner: D) -> Result<Self::Value, D::Error> {
        self.visitor.visit_newtype_struct(Filter {
            inner,
            skip: self.skip,
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.visitor.visit_seq(Access {
            inner: seq,
            skip: self.skip,
            drop: None,
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.visitor.visit_map(Access {
            inner: map,
            skip: self.skip,
            drop: self.drop,
        })
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        self.visitor.visit_enum(Access {
            inner: data,
            skip: self.skip,
            drop: None,
        })
    }
}

/// A seed whose deserializer is wrapped too, so that filtering reaches nested values.
struct Seed<'s, S> {
    seed: S,
    skip: &'s SkipFields,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, inner: D) -> Result<Self::Value, D::Error> {
        self.seed.deserialize(Filter {
            inner,
            skip: self.skip,
        })
    }
}

/// Sequence, map, enum and variant access, wrapped.
struct Access<'s, A> {
    inner: A,
    skip: &'s SkipFields,
    drop: Option<&'static [&'static str]>,
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Access<'_, A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Self::Error> {
        self.inner.next_element_seed(Seed {
            seed,
            skip: self.skip,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Access<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        let Some(drop) = self.drop else {
            return self.inner.next_key_seed(seed);
        };
        let mut seed = Some(seed);
        loop {
            match self.inner.next_key_seed(Key {
                seed: &mut seed,
                drop,
            })? {
                None => return Ok(None),
                Some(Some(key)) => return Ok(Some(key)),
                // A left-out field: its value is read over without being built.
                Some(None) => {
                    self.inner.next_value::<IgnoredAny>()?;
                }
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        self.inner.next_value_seed(Seed {
            seed,
            skip: self.skip,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, 's, A: EnumAccess<'de>> EnumAccess<'de> for Access<'s, A> {
    type Error = A::Error;
    type Variant = Access<'s, A::Variant>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Self::Variant), Self::Error> {
        let (value, variant) = self.inner.variant_seed(seed)?;
        Ok((
            value,
            Access {
                inner: variant,
                skip: self.skip,
                drop: None,
            },
        ))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Access<'_, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), Self::Error> {
        self.inner.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<T::Value, Self::Error> {
        self.inner.newtype_variant_seed(Seed {
            seed,
            skip: self.skip,
        })
    }

    fn tuple_variant<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.inner.tuple_variant(len, Wrap::new(visitor, self.skip))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.inner
            .struct_variant(fields, Wrap::new(visitor, self.skip))
    }
}

/// Reads a key; `None` when it names a left-out field, else the key as the struct's seed reads it.
/// The seed is taken only for a kept key, so it survives the left-out ones.
struct Key<'k, K> {
    seed: &'k mut Option<K>,
    drop: &'static [&'static str],
}

impl<'de, K: DeserializeSeed<'de>> DeserializeSeed<'de> for Key<'_, K> {
    type Value = Option<K::Value>;

    fn deserialize<D: Deserializer<'de>>(self, inner: D) -> Result<Self::Value, D::Error> {
        inner.deserialize_str(self)
    }
}

impl<'de, K: DeserializeSeed<'de>> Visitor<'de> for Key<'_, K> {
    type Value = Option<K::Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        if self.drop.contains(&key) {
            return Ok(None);
        }
        let seed = self
            .seed
            .take()
            .ok_or_else(|| E::custom("key read twice"))?;
        seed.deserialize(key.into_deserializer()).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    const SKIP: SkipFields = SkipFields(&[("Container", &["env", "args"])]);

    #[test]
    fn named_fields_read_as_absent_and_the_rest_as_usual() {
        let pod = json!({"metadata": {"name": "p", "labels": {"env": "x"}},
            "spec": {"containers": [{"name": "c", "env": [{"name": "A", "value": "1"}],
                "args": ["--x"], "resources": {"limits": {"cpu": "1"}}}],
                "affinity": {"nodeAffinity": {}}, "priority": 5}});
        let text = pod.to_string();
        let full: Pod = serde_json::from_str(&text).unwrap();
        let slim: Pod = from_str(&text, &SKIP).unwrap();
        let mut expected = full.clone();
        let c = &mut expected.spec.as_mut().unwrap().containers[0];
        (c.env, c.args) = (None, None);
        assert_eq!(slim, expected);
        // Only inside the named struct: a label called "env" stays.
        assert_eq!(slim.metadata.labels.unwrap()["env"], "x");
        assert!(full.spec.unwrap().containers[0].env.is_some());
        // A left-out field is not type-checked either (the API server has checked it).
        let odd = r#"{"spec": {"containers": [{"name": "c", "args": {"not": "a list"}}]}}"#;
        assert!(serde_json::from_str::<Pod>(odd).is_err());
        assert!(from_str::<Pod>(odd, &SKIP).is_ok());
    }

    #[test]
    fn errors_are_serde_json_errors_in_kept_and_left_out_fields() {
        let bad_kept = r#"{"spec": {"containers": [{"name": 5}]}}"#;
        assert!(from_str::<Pod>(bad_kept, &SKIP).is_err());
        let bad_syntax = r#"{"spec": {"containers": [{"env": [}]}}"#;
        assert!(from_str::<Pod>(bad_syntax, &SKIP).is_err());
        assert!(from_str::<Pod>(r#"{"metadata": {}} trailing"#, &SKIP).is_err());
    }
}

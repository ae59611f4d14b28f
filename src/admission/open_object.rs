//! Objects as the admission rules decode them: the fields a rule reads or writes are typed, every
//! other field is kept as its JSON text ([`Undecoded`]) and never parsed ([`open_object!`]). What is
//! not read costs its bytes and no more, whatever its shape: a pod's env, volumes and probes, a
//! Reservation's pod template. Nothing is lost: the text is written back as it came, so a colocation
//! profile's patch can still edit any field, and the patch differ sees it equal on both sides. A rule
//! that needs a field not declared does not compile until it is declared (there is no reading into
//! [`Undecoded`]). `metadata.managedFields` is the one field dropped ([`Meta`]): the API server keeps
//! its own, no rule reads it, and a patch never carries it.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::de::{self, DeserializeSeed, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// Fields of a JSON object that no rule reads, as their JSON text, in the order they came.
/// Deliberately opaque: it can be compared, cloned and written back, not read. Shared, so the copy
/// the mutating chain keeps of the original object copies no text and compares equal at a glance.
#[derive(Clone, Debug, Default)]
pub struct Undecoded(Option<Arc<[Entry]>>);

/// A field's name and its value's JSON text.
pub type Entry = (Box<str>, Box<RawValue>);

impl Undecoded {
    /// The fields [`open_object!`] did not declare, as it met them.
    pub fn from_entries(entries: Vec<Entry>) -> Self {
        Self((!entries.is_empty()).then(|| Arc::from(entries)))
    }

    fn entries(&self) -> &[Entry] {
        self.0.as_deref().unwrap_or_default()
    }

    /// Writes the fields back into the object being serialized, as they came.
    pub fn write_into<M: serde::ser::SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        for (key, text) in self.entries() {
            map.serialize_entry(key, text)?;
        }
        Ok(())
    }
}

impl PartialEq for Undecoded {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.entries(), other.entries());
        std::ptr::eq(a, b)
            || a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|((k1, v1), (k2, v2))| k1 == k2 && v1.get() == v2.get())
    }
}

/// Whether a declared field is left out when written (as k8s-openapi leaves out an absent option).
pub trait Omit {
    fn omitted(&self) -> bool {
        false
    }
}
impl<T> Omit for Option<T> {
    fn omitted(&self) -> bool {
        self.is_none()
    }
}
impl<T> Omit for Vec<T> {}
impl Omit for String {}
impl Omit for Meta {}

/// An object key, borrowed from the body when it has no escapes.
pub struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

/// A struct with typed fields (each with its JSON name) and the rest of its object undecoded.
/// `null` reads as the field's default, as k8s-openapi reads it.
macro_rules! open_object {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[$field_meta:meta])* $field:ident: $ty:ty = $key:literal,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct $name {
            $($(#[$field_meta])* pub $field: $ty,)*
            pub undecoded: $crate::admission::open_object::Undecoded,
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Fields;
                impl<'de> ::serde::de::Visitor<'de> for Fields {
                    type Value = $name;
                    fn expecting(&self, f: &mut ::std::fmt::Formatter) -> ::std::fmt::Result {
                        f.write_str(concat!("a ", stringify!($name)))
                    }
                    fn visit_map<A: ::serde::de::MapAccess<'de>>(self, mut map: A) -> Result<$name, A::Error> {
                        let mut out = $name::default();
                        let mut undecoded = ::std::vec::Vec::new();
                        while let Some(key) = map.next_key_seed($crate::admission::open_object::Key)? {
                            match &*key {
                                $($key => out.$field = map.next_value::<Option<$ty>>()?.unwrap_or_default(),)*
                                _ => {
                                    let text = map.next_value::<Box<::serde_json::value::RawValue>>()?;
                                    undecoded.push((::std::boxed::Box::from(key), text));
                                }
                            }
                        }
                        if !undecoded.is_empty() {
                            out.undecoded = $crate::admission::open_object::Undecoded::from_entries(undecoded);
                        }
                        Ok(out)
                    }
                }
                deserializer.deserialize_map(Fields)
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use ::serde::ser::SerializeMap as _;
                let mut map = serializer.serialize_map(None)?;
                $(if !$crate::admission::open_object::Omit::omitted(&self.$field) {
                    map.serialize_entry($key, &self.$field)?;
                })*
                self.undecoded.write_into(&mut map)?;
                map.end()
            }
        }
    };
}
pub(crate) use open_object;

/// `kube::Resource` for an object type as a rule decodes it: a `metadata` field (an `ObjectMeta`, or
/// what derefs to one) and the kind's names.
macro_rules! slim_resource {
    ($type:ty, $scope:ident, group $group:literal, version $version:literal, kind $kind:literal, plural $plural:literal) => {
        impl ::kube::Resource for $type {
            type DynamicType = ();
            type Scope = ::kube::core::$scope;

            fn kind(_: &()) -> ::std::borrow::Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> ::std::borrow::Cow<'_, str> {
                $group.into()
            }
            fn version(_: &()) -> ::std::borrow::Cow<'_, str> {
                $version.into()
            }
            fn plural(_: &()) -> ::std::borrow::Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut ::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use slim_resource;

/// An object's metadata: `ObjectMeta` for the plugins (and [`kube::Resource`]), decoded and written
/// through [`MetaFields`] so that `managedFields` is stepped over.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Meta(pub ObjectMeta);

impl std::ops::Deref for Meta {
    type Target = ObjectMeta;
    fn deref(&self) -> &ObjectMeta {
        &self.0
    }
}

impl std::ops::DerefMut for Meta {
    fn deref_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0
    }
}

/// Every field of `ObjectMeta` but `managedFields` (serde steps over it as over any unknown key).
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct MetaFields {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

impl<'de> Deserialize<'de> for Meta {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let m = MetaFields::deserialize(deserializer)?;
        Ok(Meta(ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        }))
    }
}

impl Serialize for Meta {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

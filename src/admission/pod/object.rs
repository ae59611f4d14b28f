//! The pod as /mutate-pod and /validate-pod decode it: the fields the pod plugins read and write are
//! typed, every other field of a pod, its spec, its containers and its status is kept as its JSON
//! text ([`Undecoded`]) and never parsed. A large pod's env, args, probes, mounts and volumes are
//! most of its bytes and, decoded, most of a review's time (`just bench`: decoding them whole took
//! the 4 KiB pod review from 24 to 38 us, the 15 KiB one from 68 to 138 us).
//!
//! Nothing is lost: the text is written back as it came, so a colocation profile's patch can still
//! edit any field, and the patch differ sees it equal on both sides. A plugin that needs a field not
//! declared here does not compile until it is declared (there is no reading into [`Undecoded`]).
//! `metadata.managedFields` is the one field dropped: the API server keeps its own, no plugin reads
//! it, and a patch never carries it.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// Fields of a JSON object that no pod plugin reads, as their JSON text, in the order they came.
/// Deliberately opaque: it can be compared, cloned and written back, not read. Shared, so the copy
/// the mutating chain keeps of the original pod copies no text and compares equal at a glance.
#[derive(Clone, Debug, Default)]
pub struct Undecoded(Option<Arc<[Entry]>>);

/// A field's name and its value's JSON text.
type Entry = (Box<str>, Box<RawValue>);

impl Undecoded {
    fn entries(&self) -> &[Entry] {
        self.0.as_deref().unwrap_or_default()
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
trait Omit {
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
impl Omit for PodMeta {}

/// An object key, borrowed from the body when it has no escapes.
struct Key;

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
            pub undecoded: Undecoded,
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Fields;
                impl<'de> Visitor<'de> for Fields {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str(concat!("a ", stringify!($name)))
                    }
                    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<$name, A::Error> {
                        let mut out = $name::default();
                        let mut undecoded = Vec::new();
                        while let Some(key) = map.next_key_seed(Key)? {
                            match &*key {
                                $($key => out.$field = map.next_value::<Option<$ty>>()?.unwrap_or_default(),)*
                                _ => {
                                    let text = map.next_value::<Box<RawValue>>()?;
                                    undecoded.push((Box::from(key), text));
                                }
                            }
                        }
                        if !undecoded.is_empty() {
                            out.undecoded = Undecoded(Some(Arc::from(undecoded)));
                        }
                        Ok(out)
                    }
                }
                deserializer.deserialize_map(Fields)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(None)?;
                $(if !Omit::omitted(&self.$field) {
                    map.serialize_entry($key, &self.$field)?;
                })*
                for (key, text) in self.undecoded.entries() {
                    map.serialize_entry(key, text)?;
                }
                map.end()
            }
        }
    };
}

open_object! {
    pub struct Pod {
        #[doc = "Decoded without `managedFields`."]
        metadata: PodMeta = "metadata",
        spec: Option<PodSpec> = "spec",
        status: Option<PodStatus> = "status",
    }
}

open_object! {
    pub struct PodSpec {
        affinity: Option<Affinity> = "affinity",
        containers: Vec<Container> = "containers",
        init_containers: Option<Vec<Container>> = "initContainers",
        node_selector: Option<BTreeMap<String, String>> = "nodeSelector",
        overhead: Option<BTreeMap<String, Quantity>> = "overhead",
        preemption_policy: Option<String> = "preemptionPolicy",
        priority: Option<i32> = "priority",
        priority_class_name: Option<String> = "priorityClassName",
        scheduler_name: Option<String> = "schedulerName",
    }
}

open_object! {
    pub struct Container {
        name: String = "name",
        resources: Option<ResourceRequirements> = "resources",
        restart_policy: Option<String> = "restartPolicy",
    }
}

open_object! {
    pub struct PodStatus {
        phase: Option<String> = "phase",
        qos_class: Option<String> = "qosClass",
    }
}

/// A pod's metadata: `ObjectMeta` for the plugins (and [`kube::Resource`]), decoded and written
/// through [`MetaFields`] so that `managedFields` is stepped over.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodMeta(pub ObjectMeta);

impl std::ops::Deref for PodMeta {
    type Target = ObjectMeta;
    fn deref(&self) -> &ObjectMeta {
        &self.0
    }
}

impl std::ops::DerefMut for PodMeta {
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

impl<'de> Deserialize<'de> for PodMeta {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let m = MetaFields::deserialize(deserializer)?;
        Ok(PodMeta(ObjectMeta {
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

impl Serialize for PodMeta {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl kube::Resource for Pod {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Pod".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata.0
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata.0
    }
}

/// The pod's namespace, or the request's when the object has none (a pod created through a
/// controller often leaves it empty: the API server fills it in after admission).
pub fn pod_namespace<'a>(pod: &'a Pod, request_namespace: Option<&'a str>) -> &'a str {
    pod.metadata
        .namespace
        .as_deref()
        .filter(|ns| !ns.is_empty())
        .or(request_namespace)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod() -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"app": "a"},
                "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
            "spec": {"containers": [{"name": "c", "image": "i",
                    "env": [{"name": "X", "value": "\"quoted\" \u{e9}"}],
                    "resources": {"requests": {"cpu": "1"}}}],
                "volumes": [{"name": "v", "emptyDir": {}}], "priority": 5, "schedulerName": null},
            "status": {"phase": "Pending", "conditions": []}})
    }

    #[test]
    fn keeps_every_field_but_managed_fields_as_it_came() {
        let text = pod().to_string();
        let decoded: Pod = serde_json::from_str(&text).unwrap();
        let spec = decoded.spec.as_ref().unwrap();
        assert_eq!(spec.priority, Some(5));
        assert_eq!(spec.containers[0].name, "c");
        assert_eq!(decoded.metadata.name.as_deref(), Some("p"));
        let mut expected = pod();
        expected["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        expected["spec"]
            .as_object_mut()
            .unwrap()
            .remove("schedulerName");
        assert_eq!(serde_json::to_value(&decoded).unwrap(), expected);
        // From a Value too (a colocation profile's patch goes through one).
        let again: Pod = serde_json::from_value(serde_json::to_value(&decoded).unwrap()).unwrap();
        assert_eq!(again, decoded);
    }

    #[test]
    fn undecoded_fields_compare_by_their_text() {
        let a: Pod = serde_json::from_value(pod()).unwrap();
        let mut other = pod();
        other["spec"]["containers"][0]["env"][0]["value"] = json!("Y");
        let b: Pod = serde_json::from_value(other).unwrap();
        assert_ne!(a, b);
        assert_eq!(a, a.clone());
    }

    #[test]
    fn a_typed_field_of_the_wrong_type_is_an_error() {
        let mut bad = pod();
        bad["spec"]["containers"] = json!("not a list");
        let err = serde_json::from_value::<Pod>(bad).unwrap_err().to_string();
        assert!(err.contains("invalid type"), "{err}");
    }
}

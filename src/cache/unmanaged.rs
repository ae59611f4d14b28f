//! What the watches receive, decoded without `metadata.managedFields` (`apis::unread_fields`).
//!
//! Every store slims an object as it arrives and drops its managedFields (`slim.rs`), but
//! k8s-openapi's `ObjectMeta` would first decode each entry's `fieldsV1` into a JSON tree: for a
//! node whose kubelet patches its status, or a quota several tools apply, that tree is several times
//! the rest of the object's metadata, built for every event and every listed object only to be
//! dropped. Walked over unread instead, it costs no allocation. (It was not what a relist's peak
//! was made of, docs/scale.md: that was the cache's replaced copies, `store.rs`.)

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::watcher::Event;
use serde::de::{Deserialize, Deserializer};

use crate::apis::unread_fields::without_managed_fields;

/// `K` as a list or watch brings it, its managedFields left unread. Listed and watched exactly
/// where `K` is, with `K`'s kind of request (`PartialObjectMeta<K>` still asks for metadata only).
#[derive(Clone, Debug)]
pub struct Unmanaged<K>(pub K);

impl<'de, K: Deserialize<'de>> Deserialize<'de> for Unmanaged<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        without_managed_fields(deserializer).map(Unmanaged)
    }
}

/// In `impl<K: Resource> Resource for Wrapper<K>`: the wrapper's requests are `K`'s (its paths,
/// and metadata only when `K` asks for that), so it is listed and watched exactly where `K` is.
macro_rules! requests_of_inner {
    () => {
        type DynamicType = K::DynamicType;
        type Scope = K::Scope;

        fn kind(dt: &Self::DynamicType) -> ::std::borrow::Cow<'_, str> {
            K::kind(dt)
        }
        fn group(dt: &Self::DynamicType) -> ::std::borrow::Cow<'_, str> {
            K::group(dt)
        }
        fn version(dt: &Self::DynamicType) -> ::std::borrow::Cow<'_, str> {
            K::version(dt)
        }
        fn api_version(dt: &Self::DynamicType) -> ::std::borrow::Cow<'_, str> {
            K::api_version(dt)
        }
        fn plural(dt: &Self::DynamicType) -> ::std::borrow::Cow<'_, str> {
            K::plural(dt)
        }
        fn metadata_api() -> bool {
            K::metadata_api()
        }
        fn url_path(dt: &Self::DynamicType, namespace: Option<&str>) -> String {
            K::url_path(dt, namespace)
        }
    };
}
pub(super) use requests_of_inner;

impl<K: Resource> Resource for Unmanaged<K> {
    requests_of_inner!();

    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

/// The same event with `f` applied to its object.
pub fn map_event<A, B>(event: Event<A>, f: impl FnOnce(A) -> B) -> Event<B> {
    match event {
        Event::Apply(o) => Event::Apply(f(o)),
        Event::Delete(o) => Event::Delete(f(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(f(o)),
        Event::InitDone => Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Namespace, Node};
    use kube::core::{ObjectList, PartialObjectMeta};
    use serde_json::json;

    fn managed_fields() -> serde_json::Value {
        json!([{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}}}}])
    }

    #[test]
    fn a_listed_page_is_decoded_without_managed_fields_and_keeps_the_rest() {
        let page = json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
            "metadata": {"resourceVersion": "42", "continue": "next"},
            "items": [{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                       "metadata": {"name": "n1", "resourceVersion": "7",
                                    "labels": {"zone": "a"},
                                    "managedFields": managed_fields()}}]
        });
        let list: ObjectList<Unmanaged<PartialObjectMeta<Node>>> =
            serde_json::from_value(page).unwrap();
        assert_eq!(list.metadata.continue_.as_deref(), Some("next"));
        let node = &list.items[0].0;
        assert_eq!(node.metadata.name.as_deref(), Some("n1"));
        assert_eq!(node.metadata.labels.as_ref().unwrap()["zone"], "a");
        assert_eq!(node.metadata.managed_fields, None);
    }

    #[test]
    fn a_lenient_object_is_read_or_set_aside_without_its_managed_fields() {
        use crate::apis::ElasticQuota;
        use crate::cache::lenient::Lenient;
        let quota = |max: serde_json::Value| {
            json!({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                   "metadata": {"name": "q", "namespace": "ns", "managedFields": managed_fields()},
                   "spec": {"max": max}})
        };
        let read: Unmanaged<Lenient<ElasticQuota>> =
            serde_json::from_value(quota(json!({"cpu": "1"}))).unwrap();
        let Lenient::Read(q) = read.0 else {
            panic!("a valid quota is read")
        };
        assert_eq!(q.metadata.managed_fields, None);
        assert_eq!(q.metadata.name.as_deref(), Some("q"));
        let aside: Unmanaged<Lenient<ElasticQuota>> =
            serde_json::from_value(quota(json!("not a map"))).unwrap();
        let Lenient::Unreadable { meta, .. } = aside.0 else {
            panic!("set aside")
        };
        assert_eq!(
            (meta.name.as_deref(), meta.managed_fields.as_ref()),
            (Some("q"), None)
        );
    }

    #[test]
    fn the_request_is_the_wrapped_kinds() {
        type Meta = PartialObjectMeta<Namespace>;
        assert!(Unmanaged::<Meta>::metadata_api());
        assert!(!Unmanaged::<Namespace>::metadata_api());
        assert_eq!(
            Unmanaged::<Meta>::url_path(&(), None),
            Meta::url_path(&(), None)
        );
        assert_eq!(Unmanaged::<Namespace>::kind(&()), "Namespace");
    }

    #[test]
    fn an_event_keeps_its_kind_when_mapped() {
        let mapped = map_event(Event::Delete(2), |n| n * 10);
        assert!(matches!(mapped, Event::Delete(20)));
        assert!(matches!(
            map_event(Event::<u8>::InitDone, |n| n),
            Event::InitDone
        ));
    }
}

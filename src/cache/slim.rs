//! What the cache keeps of each kind: the fields a rule reads, nothing else.
//!
//! Objects arrive whole (managedFields, kubectl's last-applied copy, annotations of other tools);
//! most of their memory is what no rule reads. Every store runs [`Slim::slim`] on each object
//! before keeping it ([`super::store::Writer::upsert`] requires it), whether it came from a watch or
//! a state file, so a rule sees the same slim object in both. A rule that needs another field adds
//! it here, next to the reason it is kept.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::Resource;
use kube::core::{ObjectMeta, PartialObjectMeta};

use crate::apis::keys::{
    ADMISSION_LIMIT, CHILD_REQUEST, OWN_PREFIX, QUOTA_NAMESPACES, QUOTA_PREFIX,
};
use crate::apis::{
    ClusterColocationProfile, ElasticQuota, ElasticQuotaProfile, Reservation, ReservationStatus,
};

/// Drops what no rule reads of an object the cache is about to keep.
pub trait Slim {
    fn slim(&mut self);

    /// Whether two slimmed objects hold the same: the store then keeps the copy it has (a relist
    /// brings every object again, a node's heartbeat its unchanged labels), so what it keeps is not
    /// reallocated, and the allocator's pages are not scattered with long-lived copies.
    fn same(&self, other: &Self) -> bool;
}

/// kubectl's client-side apply record: a whole copy of the object as last applied.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What every kind drops: field managers and the last-applied copy.
fn without_records(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// Identity only: name, namespace, uid and resourceVersion (what the ledger compares).
fn identity(meta: &mut ObjectMeta) -> ObjectMeta {
    let meta = std::mem::take(meta);
    ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        deletion_timestamp: meta.deletion_timestamp,
        ..Default::default()
    }
}

/// Nodes and Namespaces are watched as metadata: name and labels are all a rule reads (the SLO
/// config's node selectors, the profiles' namespace selectors).
impl<K> Slim for PartialObjectMeta<K> {
    fn slim(&mut self) {
        let labels = self.metadata.labels.take();
        self.metadata = ObjectMeta {
            name: self.metadata.name.take(),
            namespace: self.metadata.namespace.take(),
            labels,
            ..Default::default()
        };
        self.types = None;
    }

    fn same(&self, other: &Self) -> bool {
        self.metadata == other.metadata
    }
}

/// The annotations a rule reads of a cached quota: the namespaces it binds (`vpod`'s reach), pod
/// admission's record and limit (the recount, a pod's quota). The quota tree reads the rest of what
/// it needs (guarantees, min) from the whole object before the store slims it; Koordinator's other
/// annotations (`runtime`, `request`, `shared-weight`) are read only on the reviewed object.
const QUOTA_ANNOTATIONS_READ: [&str; 3] = [QUOTA_NAMESPACES, CHILD_REQUEST, ADMISSION_LIMIT];

/// The quota rules read its quota labels (the tree), the annotations above and koord-webhook's
/// own, its max (pod admission) and the identity the ledger compares; nothing else of its metadata,
/// nor its min or status (the tree keeps min; `used` is checked on the reviewed quota only).
impl Slim for ElasticQuota {
    fn slim(&mut self) {
        let labels = self.metadata.labels.take().and_then(|mut l| {
            l.retain(|k, _| k.starts_with(QUOTA_PREFIX));
            (!l.is_empty()).then_some(l)
        });
        let annotations = self.metadata.annotations.take().and_then(|mut a| {
            a.retain(|k, _| {
                QUOTA_ANNOTATIONS_READ.contains(&k.as_str()) || k.starts_with(OWN_PREFIX)
            });
            (!a.is_empty()).then_some(a)
        });
        self.metadata = ObjectMeta {
            labels,
            annotations,
            ..identity(&mut self.metadata)
        };
        self.spec.min = None;
        self.status = None;
    }

    fn same(&self, other: &Self) -> bool {
        self == other
    }
}

/// A pod's reservation affinity reads the Reservation's phase and what it has free.
impl Slim for Reservation {
    fn slim(&mut self) {
        self.metadata = identity(&mut self.metadata);
        self.spec = Default::default();
        self.status = self.status.take().map(|s| ReservationStatus {
            phase: s.phase,
            allocatable: s.allocatable,
            allocated: s.allocated,
            ..Default::default()
        });
    }

    fn same(&self, other: &Self) -> bool {
        self == other
    }
}

/// Kinds read whole (profiles, the SLO ConfigMaps, priority classes): few, small objects, kept
/// without their records.
macro_rules! without_records {
    ($($kind:ty),*) => {$(
        impl Slim for $kind {
            fn slim(&mut self) {
                without_records(self.meta_mut());
            }

            fn same(&self, other: &Self) -> bool {
                self == other
            }
        }
    )*};
}
without_records!(
    ClusterColocationProfile,
    ElasticQuotaProfile,
    ConfigMap,
    PriorityClass
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_keeps_what_the_rules_read() {
        let mut q: ElasticQuota = serde_json::from_value(serde_json::json!({
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": "q", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                "labels": {"quota.scheduling.koordinator.sh/parent": "p", "team": "a"},
                "annotations": {LAST_APPLIED: "{}", "quota.scheduling.koordinator.sh/child-request": "{}",
                                "quota.scheduling.koordinator.sh/runtime": "{}",
                                "koord-webhook/child-request-recent": "[]", "other.tool/x": "y"},
                "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
            "spec": {"min": {"cpu": "1"}, "max": {"cpu": "1"}},
            "status": {"used": {"cpu": "1"}}
        }))
        .unwrap();
        q.slim();
        let m = &q.metadata;
        assert_eq!(m.managed_fields, None);
        assert_eq!(m.resource_version.as_deref(), Some("7"));
        let labels: Vec<_> = m.labels.as_ref().unwrap().keys().cloned().collect();
        assert_eq!(labels, ["quota.scheduling.koordinator.sh/parent"]);
        let kept: Vec<_> = m.annotations.as_ref().unwrap().keys().cloned().collect();
        assert_eq!(
            kept,
            [
                "koord-webhook/child-request-recent",
                "quota.scheduling.koordinator.sh/child-request"
            ]
        );
        assert!(q.spec.max.is_some());
        assert_eq!((q.spec.min, q.status), (None, None));
    }

    #[test]
    fn a_reservation_keeps_its_phase_and_resources() {
        let mut r: Reservation = serde_json::from_value(serde_json::json!({
            "apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
            "metadata": {"name": "r", "annotations": {LAST_APPLIED: "{}"}},
            "spec": {"owners": [{"object": {"name": "x"}}], "template": {"spec": {"containers": []}}},
            "status": {"phase": "Available", "allocatable": {"cpu": "2"}, "allocated": {"cpu": "1"},
                       "nodeName": "n", "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        r.slim();
        assert_eq!(r.metadata.annotations, None);
        assert!(r.spec.template.is_none() && r.spec.owners.is_empty());
        let s = r.status.unwrap();
        assert!(s.phase.is_some() && s.allocatable.is_some() && s.allocated.is_some());
        assert!(s.node_name.is_none() && s.conditions.is_none());
    }

    #[test]
    fn whole_kinds_lose_only_their_records() {
        let mut c = ConfigMap::default();
        c.metadata.annotations = Some([(LAST_APPLIED.to_owned(), "{}".to_owned())].into());
        c.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into());
        c.data = Some([("k".to_owned(), "v".to_owned())].into());
        c.slim();
        assert_eq!(c.metadata.annotations, None);
        assert!(c.metadata.labels.is_some() && c.data.is_some());
    }
}

//! The in-memory cluster view every admission plugin reads.
//!
//! One store per kind, each a kube-runtime reflector store: many readers at once, writers hold a lock
//! only for the map update, never across an await. In `review` and `serve --state` the stores are
//! filled from files ([`load`]); in cluster mode the operator's watches feed the same writers.

pub mod load;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{Store, store::Writer};
use kube::runtime::watcher;

use crate::apis::{ClusterColocationProfile, ElasticQuota, ElasticQuotaProfile, Reservation};

/// Read side: cheap to clone, shared by every request.
#[derive(Clone)]
pub struct Cache {
    pub elastic_quotas: Store<ElasticQuota>,
    pub elastic_quota_profiles: Store<ElasticQuotaProfile>,
    pub reservations: Store<Reservation>,
    pub colocation_profiles: Store<ClusterColocationProfile>,
    pub config_maps: Store<ConfigMap>,
    pub namespaces: Store<Namespace>,
    pub priority_classes: Store<PriorityClass>,
    /// Labels only: what the node conflict checks read.
    pub nodes: Store<PartialObjectMeta<Node>>,
    /// Name, namespace and labels only: what the quota checks read.
    pub pods: Store<PartialObjectMeta<Pod>>,
}

/// Write side, owned by whoever fills the cache.
#[derive(Default)]
pub struct CacheWriter {
    pub elastic_quotas: Writer<ElasticQuota>,
    pub elastic_quota_profiles: Writer<ElasticQuotaProfile>,
    pub reservations: Writer<Reservation>,
    pub colocation_profiles: Writer<ClusterColocationProfile>,
    pub config_maps: Writer<ConfigMap>,
    pub namespaces: Writer<Namespace>,
    pub priority_classes: Writer<PriorityClass>,
    pub nodes: Writer<PartialObjectMeta<Node>>,
    pub pods: Writer<PartialObjectMeta<Pod>>,
}

/// One object of a kind the cache holds.
// Short-lived (moved straight into a store), so the size spread between kinds costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum CachedObject {
    ElasticQuota(ElasticQuota),
    ElasticQuotaProfile(ElasticQuotaProfile),
    Reservation(Reservation),
    ColocationProfile(ClusterColocationProfile),
    ConfigMap(ConfigMap),
    Namespace(Namespace),
    PriorityClass(PriorityClass),
    Node(PartialObjectMeta<Node>),
    Pod(PartialObjectMeta<Pod>),
}

impl CacheWriter {
    pub fn reader(&self) -> Cache {
        Cache {
            elastic_quotas: self.elastic_quotas.as_reader(),
            elastic_quota_profiles: self.elastic_quota_profiles.as_reader(),
            reservations: self.reservations.as_reader(),
            colocation_profiles: self.colocation_profiles.as_reader(),
            config_maps: self.config_maps.as_reader(),
            namespaces: self.namespaces.as_reader(),
            priority_classes: self.priority_classes.as_reader(),
            nodes: self.nodes.as_reader(),
            pods: self.pods.as_reader(),
        }
    }

    /// Inserts or replaces one object.
    pub fn apply(&mut self, object: CachedObject) {
        fn put<K>(w: &mut Writer<K>, obj: K)
        where
            K: kube::Resource + Clone + 'static,
            K::DynamicType: Eq + std::hash::Hash + Clone,
        {
            w.apply_watcher_event(&watcher::Event::Apply(obj));
        }
        match object {
            CachedObject::ElasticQuota(o) => put(&mut self.elastic_quotas, o),
            CachedObject::ElasticQuotaProfile(o) => put(&mut self.elastic_quota_profiles, o),
            CachedObject::Reservation(o) => put(&mut self.reservations, o),
            CachedObject::ColocationProfile(o) => put(&mut self.colocation_profiles, o),
            CachedObject::ConfigMap(o) => put(&mut self.config_maps, o),
            CachedObject::Namespace(o) => put(&mut self.namespaces, o),
            CachedObject::PriorityClass(o) => put(&mut self.priority_classes, o),
            CachedObject::Node(o) => put(&mut self.nodes, o),
            CachedObject::Pod(o) => put(&mut self.pods, o),
        }
    }
}

impl Cache {
    /// An empty cache, for tests and for endpoints that read nothing.
    pub fn empty() -> Self {
        CacheWriter::default().reader()
    }

    /// Object counts per kind, for metrics and `status`.
    pub fn sizes(&self) -> [(&'static str, usize); 9] {
        [
            ("ElasticQuota", self.elastic_quotas.len()),
            ("ElasticQuotaProfile", self.elastic_quota_profiles.len()),
            ("Reservation", self.reservations.len()),
            ("ClusterColocationProfile", self.colocation_profiles.len()),
            ("ConfigMap", self.config_maps.len()),
            ("Namespace", self.namespaces.len()),
            ("PriorityClass", self.priority_classes.len()),
            ("Node", self.nodes.len()),
            ("Pod", self.pods.len()),
        ]
    }
}

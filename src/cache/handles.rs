//! The cache's two sides: [`Cache`], what every request reads (cheap to clone), and
//! [`CacheWriter`], owned by whoever fills it (the watches, or the files of `serve --state`).

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::core::PartialObjectMeta;
use kube::core::metadata::PartialObjectMetaExt;

use std::collections::BTreeMap;
use std::sync::{Arc, RwLockReadGuard};

use super::pod_index::{IndexedPod, PodIndex};
use super::quota_topology::{QuotaTopology, SharedTopology};
use super::quotas::QuotaWriter;
use super::store::{Store, Writer};
use crate::apis::{ClusterColocationProfile, ElasticQuota, ElasticQuotaProfile, Reservation};

/// Read side: cheap to clone, shared by every request.
#[derive(Clone)]
pub struct Cache {
    pub elastic_quotas: Store<ElasticQuota>,
    pub elastic_quota_profiles: Store<ElasticQuotaProfile>,
    pub reservations: Store<Reservation>,
    pub colocation_profiles: Store<ClusterColocationProfile>,
    pub config_maps: Store<ConfigMap>,
    /// Name and labels only: what the profiles' namespace selectors read.
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    pub priority_classes: Store<PriorityClass>,
    /// Name and labels only: what the node conflict checks read.
    pub nodes: Store<PartialObjectMeta<Node>>,
    /// Namespace, name and quota label only: what the quota checks read.
    pub pods: Arc<PodIndex>,
    pub quota_topology: SharedTopology,
}

/// Write side, owned by whoever fills the cache.
#[derive(Default)]
pub struct CacheWriter {
    /// The ElasticQuota store and the quota tree, written together.
    pub quotas: QuotaWriter,
    pub elastic_quota_profiles: Writer<ElasticQuotaProfile>,
    pub reservations: Writer<Reservation>,
    pub colocation_profiles: Writer<ClusterColocationProfile>,
    pub config_maps: Writer<ConfigMap>,
    pub namespaces: Writer<PartialObjectMeta<Namespace>>,
    pub priority_classes: Writer<PriorityClass>,
    pub nodes: Writer<PartialObjectMeta<Node>>,
    pub pods: Arc<PodIndex>,
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
    Pod(IndexedPod),
}

impl CacheWriter {
    pub fn reader(&self) -> Cache {
        Cache {
            elastic_quotas: self.quotas.store(),
            elastic_quota_profiles: self.elastic_quota_profiles.as_reader(),
            reservations: self.reservations.as_reader(),
            colocation_profiles: self.colocation_profiles.as_reader(),
            config_maps: self.config_maps.as_reader(),
            namespaces: self.namespaces.as_reader(),
            priority_classes: self.priority_classes.as_reader(),
            nodes: self.nodes.as_reader(),
            pods: self.pods.clone(),
            quota_topology: self.quotas.tree(),
        }
    }

    /// Inserts or replaces one object.
    pub fn apply(&mut self, object: CachedObject) {
        match object {
            CachedObject::ElasticQuota(o) => self.quotas.upsert(o),
            CachedObject::ElasticQuotaProfile(o) => self.elastic_quota_profiles.upsert(o),
            CachedObject::Reservation(o) => self.reservations.upsert(o),
            CachedObject::ColocationProfile(o) => self.colocation_profiles.upsert(o),
            CachedObject::ConfigMap(o) => self.config_maps.upsert(o),
            CachedObject::Namespace(o) => {
                self.namespaces.upsert(o.metadata.into_response_partial())
            }
            CachedObject::PriorityClass(o) => self.priority_classes.upsert(o),
            CachedObject::Node(o) => self.nodes.upsert(o),
            CachedObject::Pod(o) => self.pods.upsert(&o),
        }
    }

    /// Marks every store complete without a watch (a state loaded from files).
    pub fn mark_ready(&self) {
        self.quotas.mark_ready();
        self.elastic_quota_profiles.mark_ready();
        self.reservations.mark_ready();
        self.colocation_profiles.mark_ready();
        self.config_maps.mark_ready();
        self.namespaces.mark_ready();
        self.priority_classes.mark_ready();
        self.nodes.mark_ready();
        self.pods.mark_ready();
    }
}

impl Cache {
    pub fn topology(&self) -> RwLockReadGuard<'_, QuotaTopology> {
        self.quota_topology
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Names of pods (any namespace) bound to `quota` by label, sorted.
    pub fn pods_labelled_for_quota(&self, quota: &str) -> Vec<String> {
        self.pods.labelled_for_quota(quota)
    }

    /// Whether any pod lives in one of these namespaces.
    pub fn any_pod_in_namespaces(&self, namespaces: &[&str]) -> bool {
        self.pods.any_in_namespaces(namespaces)
    }

    /// A ConfigMap by namespace and name.
    pub fn config_map(&self, namespace: &str, name: &str) -> Option<Arc<ConfigMap>> {
        self.config_maps.get(Some(namespace), name)
    }

    /// Every cached node's name and labels, sorted by name.
    pub fn node_labels(&self) -> Vec<(String, BTreeMap<String, String>)> {
        let mut nodes: Vec<_> = self
            .nodes
            .state()
            .iter()
            .map(|n| {
                (
                    n.metadata.name.clone().unwrap_or_default(),
                    n.metadata.labels.clone().unwrap_or_default(),
                )
            })
            .collect();
        nodes.sort_by(|a, b| a.0.cmp(&b.0));
        nodes
    }

    /// Waits until every store has had its first full list.
    pub async fn wait_until_synced(&self) {
        tokio::join!(
            self.elastic_quotas.wait_until_ready(),
            self.elastic_quota_profiles.wait_until_ready(),
            self.reservations.wait_until_ready(),
            self.colocation_profiles.wait_until_ready(),
            self.config_maps.wait_until_ready(),
            self.namespaces.wait_until_ready(),
            self.priority_classes.wait_until_ready(),
            self.nodes.wait_until_ready(),
            self.pods.wait_until_ready(),
        );
    }

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

//! The ElasticQuota store and the quota tree, written by one owner: [`QuotaWriter`] applies each
//! event of the ElasticQuota watch (or each quota of the files) to both, so the tree never holds a
//! quota the store dropped nor misses one it took, and no copy of the list is kept for the tree.
//! From the watch's events as received (read, or set aside because they do not decode) it also
//! tells the tree which quotas do not decode, so that the tree rules refuse the changes that would
//! have to count them (fail closed: before, such a quota counted as absent from its siblings' sum).

use std::collections::HashSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::watcher::Event;

use super::lenient::{Lenient, SetAside};
use super::quota_topology::{QuotaInfo, SharedTopology, UnreadableQuota, write_topology};
use super::store::{Store, Writer};
use crate::apis::ElasticQuota;
use crate::apis::keys::QUOTA_PARENT;

#[derive(Default)]
pub struct QuotaWriter {
    store: Writer<ElasticQuota>,
    tree: SharedTopology,
    /// Names found unreadable since the current relist began.
    relisted: Option<HashSet<String>>,
}

impl QuotaWriter {
    /// The store, to read.
    pub fn store(&self) -> Store<ElasticQuota> {
        self.store.as_reader()
    }

    /// The tree, to read (the quota rules lay their own pending changes over it).
    pub fn tree(&self) -> SharedTopology {
        self.tree.clone()
    }

    /// One quota of a state loaded from files.
    pub fn upsert(&mut self, quota: ElasticQuota) {
        write_topology(&self.tree).upsert(QuotaInfo::from_quota(&quota));
        self.store.upsert(quota);
    }

    pub fn mark_ready(&self) {
        self.store.mark_ready();
    }

    /// One event of the ElasticQuota watch as received: what does not decode is told to the tree
    /// and set aside by `aside` (counted, reported), the rest applied to the store and the tree.
    pub fn apply(&mut self, event: Event<Lenient<ElasticQuota>>, aside: &mut SetAside) {
        match &event {
            Event::Init => self.relisted = Some(HashSet::new()),
            Event::InitDone => {
                // An unreadable quota the relist did not bring again is gone.
                if let Some(relisted) = self.relisted.take() {
                    write_topology(&self.tree).retain_unreadable(|name| relisted.contains(name));
                }
            }
            Event::InitApply(Lenient::Read(q))
            | Event::Apply(Lenient::Read(q))
            | Event::Delete(Lenient::Read(q)) => self.mark(q.meta(), None),
            Event::InitApply(Lenient::Unreadable { meta, error })
            | Event::Apply(Lenient::Unreadable { meta, error }) => self.mark(meta, Some(error)),
            Event::Delete(Lenient::Unreadable { meta, .. }) => self.mark(meta, None),
        }
        if let Some(event) = aside.event(event) {
            self.follow(event);
        }
    }

    /// The store takes the event; the tree upserts what it takes and removes what it drops
    /// (deleted, or not brought by a relist).
    fn follow(&mut self, event: Event<ElasticQuota>) {
        if let Event::Apply(q) | Event::InitApply(q) = &event {
            write_topology(&self.tree).upsert(QuotaInfo::from_quota(q));
        }
        let gone = self.store.apply(event);
        if !gone.is_empty() {
            let mut tree = write_topology(&self.tree);
            for q in gone {
                tree.remove(q.metadata.name.as_deref().unwrap_or_default());
            }
        }
    }

    /// Whether the quota `meta` names decodes (`error` when not).
    fn mark(&mut self, meta: &ObjectMeta, error: Option<&str>) {
        let name = meta.name.clone().unwrap_or_default();
        let unreadable = error.map(|error| UnreadableQuota {
            namespace: meta.namespace.clone().unwrap_or_default(),
            parent: meta
                .labels
                .as_ref()
                .and_then(|l| l.get(QUOTA_PARENT))
                .cloned()
                .unwrap_or_default(),
            error: error.to_owned(),
        });
        if unreadable.is_some()
            && let Some(relisted) = self.relisted.as_mut()
        {
            relisted.insert(name.clone());
        }
        // Every quota event passes here: the tree's write lock only when something changes.
        let known = self
            .tree
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_unreadable(&name);
        if known || unreadable.is_some() {
            write_topology(&self.tree).set_unreadable(&name, unreadable);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CacheWriter;
    use prometheus_client::metrics::family::Family;
    use tokio::sync::mpsc;

    fn aside() -> SetAside {
        SetAside::new("elasticquota", &Family::default(), mpsc::channel(8).0)
    }

    /// A quota under `parent`; its `min` a list when it decodes, a bare string when `cpu` is
    /// "broken".
    fn quota(name: &str, parent: &str, cpu: &str) -> Lenient<ElasticQuota> {
        let min = match cpu {
            "broken" => serde_json::json!("broken"),
            cpu => serde_json::json!({"cpu": cpu}),
        };
        serde_json::from_value(serde_json::json!({
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": name, "namespace": "ns", "uid": name, "resourceVersion": "1",
                         "labels": {QUOTA_PARENT: parent},
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"min": min, "max": {"cpu": "1"}}
        }))
        .unwrap()
    }

    #[test]
    fn the_tree_follows_the_store_through_a_relist() {
        let writer = CacheWriter::default();
        let cache = writer.reader();
        let (mut quotas, mut aside) = (writer.quotas, aside());
        let mut apply = |e| quotas.apply(e, &mut aside);
        apply(Event::Init);
        apply(Event::InitApply(quota("p", "", "1")));
        apply(Event::InitApply(quota("a", "p", "1")));
        apply(Event::InitApply(quota("b", "p", "1")));
        apply(Event::InitDone);
        assert_eq!(cache.topology().len(), 3);
        // Slimmed on the way in.
        let a = cache.elastic_quotas.get(Some("ns"), "a").unwrap();
        assert_eq!(a.metadata.managed_fields, None);

        // A relist that no longer brings b: gone from both at its end, not before.
        apply(Event::Init);
        apply(Event::InitApply(quota("p", "", "1")));
        apply(Event::InitApply(quota("a", "p", "1")));
        assert!(cache.topology().contains("b"));
        apply(Event::InitDone);
        assert!(!cache.topology().contains("b"));
        assert_eq!(cache.elastic_quotas.len(), 2);
        apply(Event::Delete(quota("a", "p", "1")));
        assert!(!cache.topology().contains("a"));
        assert_eq!(cache.elastic_quotas.len(), 1);
    }

    #[test]
    fn an_unreadable_quota_is_told_to_the_tree_until_it_decodes_or_a_relist_drops_it() {
        let (mut quotas, mut aside) = (QuotaWriter::default(), aside());
        let tree = quotas.tree();
        let near = || {
            tree.read()
                .unwrap()
                .unreadable_near("sibling", &["p"])
                .map(|(n, u)| (n.to_owned(), u.parent.clone()))
        };
        let mut apply = |e| quotas.apply(e, &mut aside);
        apply(Event::Init);
        apply(Event::InitApply(quota("a", "p", "broken")));
        apply(Event::InitApply(quota("b", "p", "broken")));
        apply(Event::InitDone);
        assert_eq!(near(), Some(("a".into(), "p".into())));
        // a decodes again.
        apply(Event::Apply(quota("a", "p", "1")));
        assert_eq!(near(), Some(("b".into(), "p".into())));
        // b was deleted while the watch was down: the relist does not bring it.
        apply(Event::Init);
        apply(Event::InitApply(quota("a", "p", "1")));
        apply(Event::InitDone);
        assert_eq!(near(), None);
    }
}

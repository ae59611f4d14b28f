//! The cache's pods: for each, only what the quota rules ask (namespace, name and quota label).
//!
//! A cluster has far more pods than anything else, and a reflector store keeps a whole ObjectMeta
//! per pod (about 1.4 KiB even slimmed, mostly the label map's node). This index keeps a key and
//! an interned quota name: about a tenth of that (bench/RESULTS.md, scale).

use crate::apis::meta::label;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::Event;
use tokio::sync::watch;

use crate::apis::keys::QUOTA_NAME;

/// (namespace, name)
type PodKey = (Box<str>, Box<str>);

#[derive(Default)]
struct Pods {
    by_key: HashMap<PodKey, Option<Arc<str>>>,
    /// Quota names shared by every pod that names them.
    quota_names: HashSet<Arc<str>>,
    /// A relist in progress: the pods seen so far, swapped in when it is complete.
    relisting: Option<HashMap<PodKey, Option<Arc<str>>>>,
}

impl Pods {
    fn entry(&mut self, pod: &PartialObjectMeta<Pod>) -> (PodKey, Option<Arc<str>>) {
        let meta = &pod.metadata;
        let key = (
            meta.namespace.as_deref().unwrap_or_default().into(),
            meta.name.as_deref().unwrap_or_default().into(),
        );
        let quota = label(pod, QUOTA_NAME).map(|name| match self.quota_names.get(name) {
            Some(shared) => shared.clone(),
            None => {
                let shared: Arc<str> = name.into();
                self.quota_names.insert(shared.clone());
                shared
            }
        });
        (key, quota)
    }
}

/// Shared by the cache's reader and writer.
pub struct PodIndex {
    pods: RwLock<Pods>,
    ready: watch::Sender<bool>,
    /// Deletions and completed relists seen: the leader's `child-request` recount asks whether
    /// pods went away since its last pass before it lists them all again.
    departures: AtomicU64,
}

impl Default for PodIndex {
    fn default() -> Self {
        Self {
            pods: RwLock::default(),
            ready: watch::Sender::new(false),
            departures: AtomicU64::new(0),
        }
    }
}

impl PodIndex {
    // A panic while holding the lock leaves the map whole (every update is one insert or remove).
    fn read(&self) -> RwLockReadGuard<'_, Pods> {
        self.pods.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Pods> {
        self.pods.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds or replaces one pod (a state file, or a watch's Apply).
    pub fn upsert(&self, pod: &PartialObjectMeta<Pod>) {
        let mut pods = self.write();
        let (key, quota) = pods.entry(pod);
        pods.by_key.insert(key, quota);
    }

    /// Follows a watch the way a reflector store does: a relist replaces the whole set at its end.
    pub fn apply(&self, event: &Event<PartialObjectMeta<Pod>>) {
        let mut pods = self.write();
        match event {
            Event::Apply(pod) => {
                let (key, quota) = pods.entry(pod);
                pods.by_key.insert(key, quota);
            }
            Event::Delete(pod) => {
                let (key, _) = pods.entry(pod);
                pods.by_key.remove(&key);
                self.departures.fetch_add(1, Ordering::Relaxed);
            }
            Event::Init => pods.relisting = Some(HashMap::new()),
            Event::InitApply(pod) => {
                let (key, quota) = pods.entry(pod);
                pods.relisting.get_or_insert_default().insert(key, quota);
            }
            Event::InitDone => {
                if let Some(relisted) = pods.relisting.take() {
                    pods.by_key = relisted;
                    let named: HashSet<Arc<str>> =
                        pods.by_key.values().flatten().cloned().collect();
                    pods.quota_names = named;
                    // Pods deleted while the watch was down show only as missing from the list.
                    self.departures.fetch_add(1, Ordering::Relaxed);
                }
                drop(pods);
                self.ready.send_replace(true);
            }
        }
    }

    /// Marks the index complete without a watch (a state loaded from files).
    pub fn mark_ready(&self) {
        self.ready.send_replace(true);
    }

    /// Waits for the first complete list.
    pub async fn wait_until_ready(&self) {
        let mut ready = self.ready.subscribe();
        // The sender lives as long as `self`, so this cannot fail while we borrow it.
        let _ = ready.wait_for(|r| *r).await;
    }

    /// Grows with every pod deletion and completed relist.
    pub fn departures(&self) -> u64 {
        self.departures.load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.read().by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Names of pods (any namespace) labelled with this quota, sorted.
    pub fn labelled_for_quota(&self, quota: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .read()
            .by_key
            .iter()
            .filter(|(_, q)| q.as_deref() == Some(quota))
            .map(|((_, name), _)| name.to_string())
            .collect();
        names.sort();
        names
    }

    /// Whether any pod lives in one of these namespaces.
    pub fn any_in_namespaces(&self, namespaces: &[&str]) -> bool {
        self.read()
            .by_key
            .keys()
            .any(|(ns, _)| namespaces.contains(&&**ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::ObjectMeta;
    use kube::core::metadata::PartialObjectMetaExt;

    fn pod(ns: &str, name: &str, quota: Option<&str>) -> PartialObjectMeta<Pod> {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: quota.map(|q| [(QUOTA_NAME.to_owned(), q.to_owned())].into()),
            ..Default::default()
        }
        .into_response_partial()
    }

    #[test]
    fn answers_the_quota_questions_and_follows_updates() {
        let index = PodIndex::default();
        index.upsert(&pod("a", "p2", Some("q1")));
        index.upsert(&pod("b", "p1", Some("q1")));
        index.upsert(&pod("b", "p3", None));
        assert_eq!(index.labelled_for_quota("q1"), ["p1", "p2"]);
        assert!(index.any_in_namespaces(&["x", "b"]));
        assert!(!index.any_in_namespaces(&["x"]));
        // Relabelled, then deleted.
        index.apply(&Event::Apply(pod("a", "p2", Some("q2"))));
        assert_eq!(index.labelled_for_quota("q1"), ["p1"]);
        assert_eq!(index.departures(), 0);
        index.apply(&Event::Delete(pod("b", "p1", Some("q1"))));
        assert_eq!(index.departures(), 1);
        assert!(index.labelled_for_quota("q1").is_empty());
        assert_eq!(index.len(), 2);
    }

    #[tokio::test]
    async fn a_relist_replaces_everything_when_complete() {
        let index = PodIndex::default();
        index.upsert(&pod("a", "old", Some("q")));
        index.apply(&Event::Init);
        index.apply(&Event::InitApply(pod("a", "new", Some("q"))));
        // Until the relist is done, readers see the previous set.
        assert_eq!(index.labelled_for_quota("q"), ["old"]);
        index.apply(&Event::InitDone);
        assert_eq!(index.labelled_for_quota("q"), ["new"]);
        index.wait_until_ready().await;
        let names = index.read().quota_names.len();
        assert_eq!(names, 1, "interned names follow the relist");
    }
}

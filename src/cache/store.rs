//! One kind's objects as the cache keeps them: slim ([`Slim`]) and relisted in place.
//!
//! kube-runtime's reflector store builds a relist's objects into a second map and swaps it in at the
//! end, so for the whole relist (every watch relists at once after an API-server restart) a replica
//! holds the old state and the new side by side. This store applies a relist's objects into the
//! live map as they arrive, stamped with the relist's epoch, and at its end drops what the relist did
//! not bring: at most one copy of an object lives at a time, besides the few in flight. Readers
//! see old and new objects mixed during a relist, as they see watch events arrive one by one.
//!
//! Objects are found by name first (a name's namespaces are few: one for almost every kind), which
//! also answers "every quota named N" without scanning the kind.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use kube::Resource;
use kube::runtime::watcher::Event;
use tokio::sync::watch;

use super::slim::Slim;

struct Entry<K> {
    namespace: Option<Box<str>>,
    object: Arc<K>,
    /// The relist that last brought it (0: a watch event or a file).
    epoch: u64,
}

struct Objects<K> {
    by_name: HashMap<Box<str>, Vec<Entry<K>>>,
    len: usize,
    /// The relist in progress, if any: its objects carry this epoch.
    relisting: Option<u64>,
    epochs: u64,
}

impl<K> Default for Objects<K> {
    fn default() -> Self {
        Self {
            by_name: HashMap::new(),
            len: 0,
            relisting: None,
            epochs: 0,
        }
    }
}

/// The read side: cheap to clone, shared by every request.
pub struct Store<K> {
    objects: Arc<RwLock<Objects<K>>>,
    ready: Arc<watch::Sender<bool>>,
}

impl<K> Clone for Store<K> {
    fn clone(&self) -> Self {
        Self {
            objects: self.objects.clone(),
            ready: self.ready.clone(),
        }
    }
}

impl<K> Default for Store<K> {
    fn default() -> Self {
        Self {
            objects: Arc::default(),
            ready: Arc::new(watch::Sender::new(false)),
        }
    }
}

impl<K> Store<K> {
    // A panic while holding the lock leaves the map whole (each update is one insert or removal).
    fn read(&self) -> RwLockReadGuard<'_, Objects<K>> {
        self.objects.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The object `namespace/name` (`None` for a cluster-scoped kind).
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        self.read()
            .by_name
            .get(name)?
            .iter()
            .find(|e| e.namespace.as_deref() == namespace)
            .map(|e| e.object.clone())
    }

    /// Every object of this name, whatever its namespace.
    pub fn named(&self, name: &str) -> Vec<Arc<K>> {
        self.read()
            .by_name
            .get(name)
            .map(|entries| entries.iter().map(|e| e.object.clone()).collect())
            .unwrap_or_default()
    }

    /// Every object (a copy of the pointers, in no particular order).
    pub fn state(&self) -> Vec<Arc<K>> {
        self.read()
            .by_name
            .values()
            .flatten()
            .map(|e| e.object.clone())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.read().len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits for the first complete list (or a state loaded from files).
    pub async fn wait_until_ready(&self) {
        let mut ready = self.ready.subscribe();
        // The sender lives as long as `self`, so this cannot fail while we borrow it.
        let _ = ready.wait_for(|r| *r).await;
    }

    /// Whether the first complete list has arrived.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }
}

/// The write side, owned by whoever fills the store (one watch, or the file loader).
pub struct Writer<K> {
    store: Store<K>,
}

impl<K> Default for Writer<K> {
    fn default() -> Self {
        Self {
            store: Store::default(),
        }
    }
}

impl<K: Resource + Slim> Writer<K> {
    pub fn as_reader(&self) -> Store<K> {
        self.store.clone()
    }

    fn write(&self) -> RwLockWriteGuard<'_, Objects<K>> {
        self.store
            .objects
            .write()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Inserts or replaces one object, slimmed first. An object the same as the one kept (a relist
    /// brings every object again) leaves the kept copy in place.
    pub fn upsert(&mut self, mut object: K) {
        object.slim();
        let mut objects = self.write();
        let epoch = objects.relisting.unwrap_or(0);
        // A replaced object (most events: a node's every status update) allocates no new key.
        let meta = object.meta();
        let namespace = meta.namespace.as_deref();
        let kept = objects
            .by_name
            .get_mut(meta.name.as_deref().unwrap_or_default())
            .and_then(|entries| {
                entries
                    .iter_mut()
                    .find(|e| e.namespace.as_deref() == namespace)
            });
        if let Some(entry) = kept {
            if !entry.object.same(&object) {
                entry.object = Arc::new(object);
            }
            entry.epoch = epoch;
            return;
        }
        let name: Box<str> = meta.name.as_deref().unwrap_or_default().into();
        let entry = Entry {
            namespace: namespace.map(Box::from),
            object: Arc::new(object),
            epoch,
        };
        objects.by_name.entry(name).or_default().push(entry);
        objects.len += 1;
    }

    /// Removes `namespace/name`, returning what was stored.
    pub fn remove(&mut self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        let mut objects = self.write();
        let entries = objects.by_name.get_mut(name)?;
        let at = entries
            .iter()
            .position(|e| e.namespace.as_deref() == namespace)?;
        let gone = entries.swap_remove(at).object;
        if entries.is_empty() {
            objects.by_name.remove(name);
        }
        objects.len -= 1;
        Some(gone)
    }

    /// Marks the store complete without a watch (a state loaded from files).
    pub fn mark_ready(&self) {
        self.store.ready.send_replace(true);
    }

    /// Follows one watch event; returns the objects it removed (a deletion, or at the end of a
    /// relist every object the relist did not bring).
    pub fn apply(&mut self, event: Event<K>) -> Vec<Arc<K>> {
        match event {
            Event::Apply(object) | Event::InitApply(object) => {
                self.upsert(object);
                Vec::new()
            }
            Event::Delete(object) => {
                let meta = object.meta();
                self.remove(
                    meta.namespace.as_deref(),
                    meta.name.as_deref().unwrap_or_default(),
                )
                .into_iter()
                .collect()
            }
            Event::Init => {
                let mut objects = self.write();
                objects.epochs += 1;
                objects.relisting = Some(objects.epochs);
                Vec::new()
            }
            Event::InitDone => {
                let gone = self.end_relist();
                self.mark_ready();
                gone
            }
        }
    }

    /// Drops every object the relist in progress did not bring.
    fn end_relist(&mut self) -> Vec<Arc<K>> {
        let mut objects = self.write();
        let Some(epoch) = objects.relisting.take() else {
            return Vec::new();
        };
        let mut gone = Vec::new();
        objects.by_name.retain(|_, entries| {
            entries.retain_mut(|e| {
                let keep = e.epoch == epoch;
                if !keep {
                    gone.push(e.object.clone());
                }
                e.epoch = 0;
                keep
            });
            !entries.is_empty()
        });
        objects.len -= gone.len();
        objects.by_name.shrink_to_fit();
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::core::PartialObjectMeta;

    fn cm(namespace: &str, name: &str, value: &str) -> ConfigMap {
        ConfigMap {
            metadata: kube::core::ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                ..Default::default()
            },
            data: Some([("k".to_owned(), value.to_owned())].into()),
            ..Default::default()
        }
    }

    fn value(store: &Store<ConfigMap>, namespace: &str, name: &str) -> Option<String> {
        store
            .get(Some(namespace), name)
            .and_then(|c| c.data.as_ref()?.get("k").cloned())
    }

    #[test]
    fn a_relist_replaces_in_place_and_drops_what_it_did_not_bring() {
        let mut w = Writer::default();
        let r = w.as_reader();
        w.apply(Event::Init);
        w.apply(Event::InitApply(cm("a", "x", "1")));
        w.apply(Event::InitApply(cm("b", "x", "1")));
        w.apply(Event::InitApply(cm("a", "y", "1")));
        assert!(!r.is_ready());
        assert!(w.apply(Event::InitDone).is_empty());
        assert!(r.is_ready());
        assert_eq!(r.len(), 3);
        assert_eq!(r.named("x").len(), 2);

        // A relist: x in a changes, y is gone, z is new; until its end y is still there.
        w.apply(Event::Init);
        w.apply(Event::InitApply(cm("a", "x", "2")));
        assert_eq!(value(&r, "a", "x").as_deref(), Some("2"));
        w.apply(Event::InitApply(cm("b", "x", "1")));
        w.apply(Event::InitApply(cm("a", "z", "1")));
        assert_eq!(value(&r, "a", "y").as_deref(), Some("1"));
        // An object applied during the relist is current: kept.
        w.apply(Event::Apply(cm("c", "w", "1")));
        let gone = w.apply(Event::InitDone);
        let gone: Vec<_> = gone
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(gone, ["y"]);
        assert_eq!(r.len(), 4);
        assert_eq!(value(&r, "a", "y"), None);
        assert_eq!(value(&r, "a", "z").as_deref(), Some("1"));

        // After the relist, entries carry no epoch: a later relist drops what it does not bring.
        w.apply(Event::Init);
        w.apply(Event::InitApply(cm("a", "z", "1")));
        assert_eq!(w.apply(Event::InitDone).len(), 3);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn an_unchanged_object_keeps_the_copy_already_kept() {
        let mut w = Writer::default();
        let r = w.as_reader();
        w.apply(Event::Apply(cm("a", "x", "1")));
        let kept = r.get(Some("a"), "x").unwrap();
        // A relist bringing it again, and an event that changes nothing the store keeps.
        w.apply(Event::Init);
        w.apply(Event::InitApply(cm("a", "x", "1")));
        assert!(w.apply(Event::InitDone).is_empty());
        w.apply(Event::Apply(cm("a", "x", "1")));
        assert!(Arc::ptr_eq(&kept, &r.get(Some("a"), "x").unwrap()));
        // A change replaces it; and a relist that does not bring it still drops it.
        w.apply(Event::Apply(cm("a", "x", "2")));
        assert!(!Arc::ptr_eq(&kept, &r.get(Some("a"), "x").unwrap()));
        w.apply(Event::Init);
        assert_eq!(w.apply(Event::InitDone).len(), 1);
        assert!(r.is_empty());
    }

    #[test]
    fn deletions_and_namespaces() {
        let mut w = Writer::default();
        let r = w.as_reader();
        w.apply(Event::Apply(cm("a", "x", "1")));
        w.apply(Event::Apply(cm("b", "x", "1")));
        assert_eq!(w.apply(Event::Delete(cm("a", "x", "?"))).len(), 1);
        assert!(w.apply(Event::Delete(cm("a", "x", "?"))).is_empty());
        assert_eq!(r.get(Some("a"), "x"), None);
        assert!(r.get(Some("b"), "x").is_some());
        assert_eq!(r.get(None, "x"), None);
        assert_eq!(r.len(), 1);

        let mut nodes: Writer<PartialObjectMeta<k8s_openapi::api::core::v1::Node>> =
            Writer::default();
        let mut node = PartialObjectMeta::<k8s_openapi::api::core::v1::Node>::default();
        node.metadata.name = Some("n".into());
        nodes.upsert(node);
        assert!(nodes.as_reader().get(None, "n").is_some());
    }
}

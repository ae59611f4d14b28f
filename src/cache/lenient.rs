//! Koordinator's kinds as the watches receive them, one object at a time: an object that does not
//! decode into our types (a value a newer Koordinator writes, a hand edit the CRD's schema let
//! through) is set aside by name instead of failing the whole list page. Before, one such object
//! stopped the kind's watch: a restarted replica never synced and stayed unready.
//!
//! Set aside means absent from the cache, whether it arrived in a list or a watch event (an object
//! that becomes unreadable is removed, so what the cache shows does not depend on when the replica
//! started); it is counted in `koord_webhook_cache_unreadable_objects_total` and named in a Warning
//! Event on the object. An unreadable ElasticQuota is also told to the quota tree, by the one writer
//! of the quota store and tree (`quotas.rs`), whose rules then refuse the changes that would have
//! to count it.

use std::collections::HashSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::watcher::Event;
use prometheus_client::metrics::{counter::Counter, family::Family};
use serde::de::{Deserialize, DeserializeOwned, Deserializer};
use tokio::sync::mpsc;

use super::unmanaged::requests_of_inner;
use crate::kube_events::{self, Note};
use crate::metrics::labels::KindLabels;

/// One listed or watched object: read, or kept by its metadata with the reason it did not decode.
#[derive(Clone, Debug)]
pub enum Lenient<K> {
    Read(K),
    Unreadable {
        meta: Box<ObjectMeta>,
        error: String,
    },
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        Ok(match K::deserialize(&value) {
            Ok(object) => Lenient::Read(object),
            Err(e) => Lenient::Unreadable {
                meta: Box::new(
                    value
                        .get("metadata")
                        .and_then(|m| ObjectMeta::deserialize(m).ok())
                        .unwrap_or_default(),
                ),
                error: e.to_string(),
            },
        })
    }
}

/// A `Lenient<K>` is listed and watched exactly where `K` is.
impl<K: Resource> Resource for Lenient<K> {
    requests_of_inner!();

    fn meta(&self) -> &ObjectMeta {
        match self {
            Lenient::Read(object) => object.meta(),
            Lenient::Unreadable { meta, .. } => meta,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Lenient::Read(object) => object.meta_mut(),
            Lenient::Unreadable { meta, .. } => meta,
        }
    }
}

/// An object set aside, for the Event naming it.
pub struct Unreadable {
    pub reference: k8s_openapi::api::core::v1::ObjectReference,
    pub error: String,
}

/// Turns the events of a lenient watch into the store's events, setting unreadable objects aside.
pub struct SetAside {
    kind: &'static str,
    counter: Counter,
    events: mpsc::Sender<Unreadable>,
    /// uid and resourceVersion already reported, so a relist does not repeat an Event.
    reported: HashSet<(String, String)>,
}

/// Reported versions remembered at most (then forgotten all at once: a repeat Event is harmless).
const REMEMBERED: usize = 4096;

impl SetAside {
    pub fn new(
        kind: &'static str,
        counters: &Family<KindLabels, Counter>,
        events: mpsc::Sender<Unreadable>,
    ) -> Self {
        Self {
            kind,
            counter: counters.get_or_create(&KindLabels { kind }).clone(),
            events,
            reported: HashSet::new(),
        }
    }

    /// The store's event for `event`: `None` for an unreadable object of a list (it is left out),
    /// a delete for one that arrives by watch (its last readable version must not stay behind).
    pub fn event<K>(&mut self, event: Event<Lenient<K>>) -> Option<Event<K>>
    where
        K: Resource + Default,
        K::DynamicType: Default,
    {
        match event {
            Event::Init => Some(Event::Init),
            Event::InitDone => Some(Event::InitDone),
            Event::InitApply(Lenient::Read(k)) => Some(Event::InitApply(k)),
            Event::Apply(Lenient::Read(k)) => Some(Event::Apply(k)),
            Event::Delete(Lenient::Read(k)) => Some(Event::Delete(k)),
            Event::InitApply(Lenient::Unreadable { meta, error }) => {
                self.report::<K>(&meta, error);
                None
            }
            Event::Apply(Lenient::Unreadable { meta, error }) => {
                self.report::<K>(&meta, error);
                Some(Event::Delete(placeholder(*meta)))
            }
            Event::Delete(Lenient::Unreadable { meta, .. }) => {
                Some(Event::Delete(placeholder(*meta)))
            }
        }
    }

    fn report<K>(&mut self, meta: &ObjectMeta, error: String)
    where
        K: Resource + Default,
        K::DynamicType: Default,
    {
        let version = (
            meta.uid.clone().unwrap_or_default(),
            meta.resource_version.clone().unwrap_or_default(),
        );
        if self.reported.contains(&version) {
            return;
        }
        if self.reported.len() >= REMEMBERED {
            self.reported.clear();
        }
        self.reported.insert(version);
        self.counter.inc();
        let reference = placeholder::<K>(meta.clone()).object_ref(&Default::default());
        tracing::warn!(
            kind = self.kind,
            namespace = meta.namespace.as_deref().unwrap_or_default(),
            name = meta.name.as_deref().unwrap_or_default(),
            %error,
            "object does not decode; left out of the cache"
        );
        // A full queue loses an Event, never the watch: the counter and the log still have it.
        let _ = self.events.try_send(Unreadable { reference, error });
    }
}

/// An object of kind `K` carrying only `meta`: enough for a store to find and remove it.
fn placeholder<K: Resource + Default>(meta: ObjectMeta) -> K {
    let mut object = K::default();
    *object.meta_mut() = meta;
    object
}

/// Events queued at most before the publisher catches up.
pub const QUEUED_EVENTS: usize = 64;

/// Publishes one Warning Event per unreadable object version, regarding the object.
pub async fn publish(recorder: Recorder, mut unreadable: mpsc::Receiver<Unreadable>) {
    while let Some(Unreadable { reference, error }) = unreadable.recv().await {
        // Events carry at most 1 KiB of note.
        let error: String = error.chars().take(700).collect();
        let note = format!("koord-webhook cannot read this object and leaves it out: {error}");
        let note = Note {
            type_: EventType::Warning,
            reason: "UnreadableObject",
            action: "Cache",
            note,
        };
        kube_events::record(&recorder, &reference, note).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::Reservation;

    fn decoded(json: serde_json::Value) -> Lenient<Reservation> {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn an_unreadable_object_is_left_out_of_a_list_and_removed_by_a_watch_event() {
        let (tx, mut rx) = mpsc::channel(4);
        let mut aside = SetAside::new("reservation", &Family::default(), tx);
        let bad = || {
            decoded(serde_json::json!({
                "metadata": {"name": "r", "uid": "u", "resourceVersion": "1"},
                "spec": {"template": {"spec": {"containers": "no"}}}
            }))
        };
        assert!(matches!(bad(), Lenient::Unreadable { .. }));
        assert!(aside.event(Event::InitApply(bad())).is_none());
        match aside.event(Event::Apply(bad())) {
            Some(Event::Delete(r)) => assert_eq!(r.metadata.name.as_deref(), Some("r")),
            other => panic!("expected a delete, got {other:?}"),
        }
        // One Event per version, however often it is listed.
        assert_eq!(rx.try_recv().unwrap().reference.name.as_deref(), Some("r"));
        assert!(rx.try_recv().is_err());
        let good = decoded(serde_json::json!({"metadata": {"name": "g"}, "spec": {"owners": []}}));
        assert!(matches!(
            aside.event(Event::Apply(good)),
            Some(Event::Apply(_))
        ));
    }
}

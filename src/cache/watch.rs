//! Cluster mode: kube-runtime watches fill the cache (docs/architecture.md, "A watch event"). Nodes
//! and Namespaces are watched as metadata only (an `Api<PartialObjectMeta<K>>` asks for nothing else), pods reduced to what the pod index keeps; ConfigMaps
//! only those the rules read, by name; Koordinator's kinds leniently (`lenient.rs`). Every object is
//! slimmed as it arrives and a relist is applied in place (`store.rs`). A broken watch resumes with
//! kube-runtime's backoff while the cache stays readable.

use std::fmt::Debug;

use futures::{Stream, StreamExt, future};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Config, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use super::lenient::{Lenient, SetAside, Unreadable};
use super::slim::Slim;
use super::store::Writer;
use super::{CacheWriter, IndexedPod, QuotaInfo, SharedTopology, write_topology};
use crate::apis::{ClusterColocationProfile, ElasticQuota, ElasticQuotaProfile, Reservation};
use crate::metrics::cache::CacheMetrics;
use crate::metrics::labels::KindLabels;
use prometheus_client::metrics::{counter::Counter, family::Family};
use tokio::sync::mpsc;

/// Feeds one watch into `apply` until the stream ends (never, in practice), counting broken
/// watches.
async fn drive<T, S>(
    kind: &'static str,
    stream: S,
    mut apply: impl FnMut(T) + Send,
    restarts: Family<KindLabels, Counter>,
) where
    S: Stream<Item = watcher::Result<T>> + Send,
{
    stream
        .for_each(|event| {
            match event {
                Ok(event) => apply(event),
                Err(e) => {
                    tracing::warn!(kind, error = %e, "watch failed; resuming");
                    restarts.get_or_create(&KindLabels { kind }).inc();
                }
            }
            future::ready(())
        })
        .await;
}

/// Applies events to a store.
fn into<K>(mut writer: Writer<K>) -> impl FnMut(Event<K>) + Send
where
    K: Resource + Slim + Send + Sync + 'static,
{
    move |event| {
        writer.apply(event);
    }
}

/// A watch of one of Koordinator's kinds, whose unreadable objects are set aside (`lenient.rs`).
fn watch_lenient<K>(
    client: Client,
    mut set_aside: SetAside,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: Resource + Clone + Debug + Default + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default,
{
    watch(Api::<Lenient<K>>::all(client)).filter_map(move |event| {
        future::ready(match event {
            Ok(event) => set_aside.event(event).map(Ok),
            Err(e) => Some(Err(e)),
        })
    })
}

fn watch<K>(api: Api<K>) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + use<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default,
{
    watcher::watcher(api, config()).default_backoff()
}

/// Lists in pages of [`LIST_PAGE`] objects: a page is decoded whole before its objects are slimmed,
/// and every watch relists at once after an API-server restart, so the page bounds that moment's
/// transient memory (kube-runtime's default of 500 whole quotas or pods is several MiB per watch).
fn config() -> Config {
    Config::default().page_size(LIST_PAGE)
}

const LIST_PAGE: u32 = 100;

/// One watch per ConfigMap the rules read, by field selector on its name (nothing else of its
/// namespace is listed or held), merged; each event with the index of the watch it came from.
fn named_config_maps(
    client: &Client,
    wanted: &[(String, String)],
) -> impl Stream<Item = watcher::Result<(usize, Event<ConfigMap>)>> + Send + use<> {
    let watches = wanted
        .iter()
        .enumerate()
        .map(|(source, (namespace, name))| {
            let config = config().fields(&format!("metadata.name={name}"));
            watcher::watcher(
                Api::<ConfigMap>::namespaced(client.clone(), namespace),
                config,
            )
            .default_backoff()
            .map(move |event| event.map(|e| (source, e)))
            .boxed()
        });
    futures::stream::select_all(watches)
}

/// Feeds the ConfigMap store from the named watches. Each watch holds at most one object, and a
/// reflector store's relist replaces everything it holds: so the store is reset to every watch's
/// current object on each change, once every watch has listed (it is then ready).
fn follow_named(
    mut writer: Writer<ConfigMap>,
    sources: usize,
) -> impl FnMut((usize, Event<ConfigMap>)) + Send {
    let mut current: Vec<Option<ConfigMap>> = vec![None; sources];
    let mut listing: Vec<Option<ConfigMap>> = vec![None; sources];
    let mut listed = vec![false; sources];
    move |(i, event)| {
        match event {
            Event::Apply(o) => current[i] = Some(o),
            Event::Delete(_) => current[i] = None,
            Event::Init => listing[i] = None,
            Event::InitApply(o) => listing[i] = Some(o),
            Event::InitDone => {
                current[i] = listing[i].take();
                listed[i] = true;
            }
        }
        if listed.iter().all(|l| *l) {
            writer.apply(Event::Init);
            for o in current.iter().flatten() {
                writer.apply(Event::InitApply(o.clone()));
            }
            writer.apply(Event::InitDone);
        }
    }
}

fn indexed<P>(event: &Event<P>, index_pod: impl Fn(&P) -> IndexedPod) -> Event<IndexedPod> {
    match event {
        Event::Apply(p) => Event::Apply(index_pod(p)),
        Event::Delete(p) => Event::Delete(index_pod(p)),
        Event::Init => Event::Init,
        Event::InitApply(p) => Event::InitApply(index_pod(p)),
        Event::InitDone => Event::InitDone,
    }
}

/// Feeds the quota store and keeps the topology in step with it: a quota the store takes is
/// upserted, one it drops (deleted, or not brought by a relist) removed. No copy of the list is
/// kept for the topology.
fn follow_quotas(
    mut store: Writer<ElasticQuota>,
    topology: SharedTopology,
) -> impl FnMut(Event<ElasticQuota>) + Send {
    move |event| {
        if let Event::Apply(q) | Event::InitApply(q) = &event {
            write_topology(&topology).upsert(QuotaInfo::from_quota(q));
        }
        let gone = store.apply(event);
        if !gone.is_empty() {
            let mut topology = write_topology(&topology);
            for q in gone {
                topology.remove(q.metadata.name.as_deref().unwrap_or_default());
            }
        }
    }
}

/// Starts every watch; the returned future runs them all.
///
/// Pods are watched whole as `P` (the admission's pod type: what quota evaluation reads is decoded,
/// the rest kept as text) and reduced by `index_pod` to what the pod index keeps.
pub async fn run<P>(
    client: Client,
    writer: CacheWriter,
    metrics: CacheMetrics,
    wanted_config_maps: Vec<(String, String)>,
    unreadable: mpsc::Sender<Unreadable>,
    index_pod: impl Fn(&P) -> IndexedPod + Send,
) where
    P: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let CacheWriter {
        elastic_quotas,
        elastic_quota_profiles,
        reservations,
        colocation_profiles,
        config_maps,
        namespaces,
        priority_classes,
        nodes,
        pods,
        quota_topology,
    } = writer;
    let quotas = follow_quotas(elastic_quotas, quota_topology);
    let restarts = metrics.watch_restarts;
    let m = || restarts.clone();
    let aside = |kind| SetAside::new(kind, &metrics.unreadable_objects, unreadable.clone());
    tokio::join!(
        drive(
            "elasticquota",
            watch_lenient::<ElasticQuota>(client.clone(), aside("elasticquota")),
            quotas,
            m()
        ),
        drive(
            "elasticquotaprofile",
            watch_lenient::<ElasticQuotaProfile>(client.clone(), aside("elasticquotaprofile")),
            into(elastic_quota_profiles),
            m()
        ),
        drive(
            "reservation",
            watch_lenient::<Reservation>(client.clone(), aside("reservation")),
            into(reservations),
            m()
        ),
        drive(
            "clustercolocationprofile",
            watch_lenient::<ClusterColocationProfile>(
                client.clone(),
                aside("clustercolocationprofile")
            ),
            into(colocation_profiles),
            m()
        ),
        drive(
            "configmap",
            named_config_maps(&client, &wanted_config_maps),
            follow_named(config_maps, wanted_config_maps.len()),
            m()
        ),
        drive(
            "namespace",
            watch(Api::<PartialObjectMeta<Namespace>>::all(client.clone())),
            into(namespaces),
            m()
        ),
        drive(
            "priorityclass",
            watch(Api::<PriorityClass>::all(client.clone())),
            into(priority_classes),
            m()
        ),
        drive(
            "node",
            watch(Api::<PartialObjectMeta<Node>>::all(client.clone())),
            into(nodes),
            m()
        ),
        drive(
            "pod",
            watch(Api::<P>::all(client.clone())),
            move |event| pods.apply(&indexed(&event, &index_pod)),
            m()
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(name: &str, parent: &str) -> ElasticQuota {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": name, "namespace": "ns",
                         "labels": {"quota.scheduling.koordinator.sh/parent": parent},
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"max": {"cpu": "1"}}
        }))
        .unwrap()
    }

    #[test]
    fn the_topology_follows_the_quota_store_through_a_relist() {
        let writer = CacheWriter::default();
        let cache = writer.reader();
        let mut follow = follow_quotas(writer.elastic_quotas, writer.quota_topology);
        follow(Event::Init);
        follow(Event::InitApply(quota("p", "")));
        follow(Event::InitApply(quota("a", "p")));
        follow(Event::InitApply(quota("b", "p")));
        follow(Event::InitDone);
        assert_eq!(cache.topology().len(), 3);
        // Slimmed on the way in.
        let a = cache.elastic_quotas.get(Some("ns"), "a").unwrap();
        assert_eq!(a.metadata.managed_fields, None);

        // A relist that no longer brings b: gone from both at its end, not before.
        follow(Event::Init);
        follow(Event::InitApply(quota("p", "")));
        follow(Event::InitApply(quota("a", "p")));
        assert!(cache.topology().contains("b"));
        follow(Event::InitDone);
        assert!(!cache.topology().contains("b"));
        assert_eq!(cache.elastic_quotas.len(), 2);
        follow(Event::Delete(quota("a", "p")));
        assert!(!cache.topology().contains("a"));
        assert_eq!(cache.elastic_quotas.len(), 1);
    }
}

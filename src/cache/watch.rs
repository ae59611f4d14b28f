//! Cluster mode: kube-runtime watches fill the cache (docs/architecture.md, "A watch event"). Pods and Nodes are watched
//! as metadata only; ConfigMaps only in the operator's namespace. A broken watch resumes with
//! kube-runtime's backoff while the cache stays readable.

use std::fmt::Debug;
use std::hash::Hash;

use futures::{Stream, StreamExt, future};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::{self, Config, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use super::{CacheWriter, QuotaInfo, SharedTopology, write_topology};
use crate::apis::{ClusterColocationProfile, ElasticQuota, ElasticQuotaProfile, Reservation};
use crate::metrics::KindLabels;
use crate::names::namespace;
use prometheus_client::metrics::{counter::Counter, family::Family};

/// Feeds one watch into `apply` until the stream ends (never, in practice), counting broken
/// watches.
async fn drive<K, S>(
    kind: &'static str,
    stream: S,
    mut apply: impl FnMut(&Event<K>) + Send,
    restarts: Family<KindLabels, Counter>,
) where
    S: Stream<Item = watcher::Result<Event<K>>> + Send,
{
    stream
        .for_each(|event| {
            match event {
                Ok(event) => apply(&event),
                Err(e) => {
                    tracing::warn!(kind, error = %e, "watch failed; resuming");
                    restarts.get_or_create(&KindLabels { kind }).inc();
                }
            }
            future::ready(())
        })
        .await;
}

/// Applies events to a reflector store, as kube-runtime's `reflector` does.
fn into<K>(mut writer: Writer<K>) -> impl FnMut(&Event<K>) + Send
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send,
{
    move |event| writer.apply_watcher_event(event)
}

fn watch<K>(api: Api<K>) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + use<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default,
{
    watcher::watcher(api, Config::default()).default_backoff()
}

/// Keeps the quota topology in step with ElasticQuota events (a full relist rebuilds it).
fn follow_topology(topology: SharedTopology) -> impl FnMut(&Event<ElasticQuota>) + Send {
    let mut relisted: Vec<ElasticQuota> = Vec::new();
    move |event| match event {
        Event::Apply(q) => write_topology(&topology).upsert(QuotaInfo::from_quota(q)),
        Event::Delete(q) => {
            write_topology(&topology).remove(q.metadata.name.as_deref().unwrap_or_default());
        }
        Event::Init => relisted.clear(),
        Event::InitApply(q) => relisted.push(q.clone()),
        Event::InitDone => {
            write_topology(&topology).reset(relisted.iter());
            relisted.clear();
        }
    }
}

/// Starts every watch; the returned future runs them all.
pub async fn run(client: Client, writer: CacheWriter, restarts: Family<KindLabels, Counter>) {
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
    let quotas = {
        let (mut topology, mut store) = (follow_topology(quota_topology), into(elastic_quotas));
        move |event: &Event<ElasticQuota>| {
            topology(event);
            store(event);
        }
    };
    // Only names, namespaces and labels are read: managedFields and annotations would be most of
    // the memory of a large cluster's pods.
    let node_meta =
        watch(Api::<PartialObjectMeta<Node>>::all(client.clone())).modify(super::slim_node);
    let pod_meta =
        watch(Api::<PartialObjectMeta<Pod>>::all(client.clone())).modify(super::slim_pod);
    let m = || restarts.clone();
    tokio::join!(
        drive(
            "elasticquota",
            watch(Api::<ElasticQuota>::all(client.clone())),
            quotas,
            m()
        ),
        drive(
            "elasticquotaprofile",
            watch(Api::<ElasticQuotaProfile>::all(client.clone())),
            into(elastic_quota_profiles),
            m()
        ),
        drive(
            "reservation",
            watch(Api::<Reservation>::all(client.clone())),
            into(reservations),
            m()
        ),
        drive(
            "clustercolocationprofile",
            watch(Api::<ClusterColocationProfile>::all(client.clone())),
            into(colocation_profiles),
            m()
        ),
        drive(
            "configmap",
            watch(Api::<ConfigMap>::namespaced(client.clone(), namespace())),
            into(config_maps),
            m()
        ),
        drive(
            "namespace",
            watch(Api::<Namespace>::all(client.clone())),
            into(namespaces),
            m()
        ),
        drive(
            "priorityclass",
            watch(Api::<PriorityClass>::all(client.clone())),
            into(priority_classes),
            m()
        ),
        drive("node", node_meta, into(nodes), m()),
        drive("pod", pod_meta, move |event| pods.apply(event), m()),
    );
}

//! Cluster mode: kube-runtime watches fill the cache (spec/operator.md 5). Pods and Nodes are watched
//! as metadata only; ConfigMaps only in the operator's namespace. A broken watch resumes with
//! kube-runtime's backoff while the cache stays readable.

use std::fmt::Debug;
use std::hash::Hash;

use futures::{Stream, StreamExt, future};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher::{self, Config, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use std::sync::Arc;

use super::{CacheWriter, PodIndex, QuotaInfo, QuotaTopology, SharedTopology, write_topology};
use crate::apis::{ClusterColocationProfile, ElasticQuota, ElasticQuotaProfile, Reservation};
use crate::install::NAMESPACE;
use crate::metrics::KindLabels;
use prometheus_client::metrics::{counter::Counter, family::Family};

/// Drives one reflector until the stream ends (never, in practice), counting broken watches.
async fn drive<K, S>(
    kind: &'static str,
    writer: Writer<K>,
    stream: S,
    restarts: Family<KindLabels, Counter>,
) where
    K: Resource + Clone + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone,
    S: Stream<Item = watcher::Result<Event<K>>> + Send,
{
    reflector::reflector(writer, stream)
        .for_each(|event| {
            if let Err(e) = event {
                tracing::warn!(kind, error = %e, "watch failed; resuming");
                restarts.get_or_create(&KindLabels { kind }).inc();
            }
            future::ready(())
        })
        .await;
}

fn watch<K>(api: Api<K>) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + use<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default,
{
    watcher::watcher(api, Config::default()).default_backoff()
}

/// Keeps the quota topology in step with ElasticQuota events (a full relist rebuilds it).
fn follow_topology(
    topology: SharedTopology,
) -> impl FnMut(&watcher::Result<Event<ElasticQuota>>) + Send {
    let mut relisted: Vec<ElasticQuota> = Vec::new();
    move |event| match event {
        Ok(Event::Apply(q)) => write_topology(&topology).upsert(QuotaInfo::from_quota(q)),
        Ok(Event::Delete(q)) => {
            write_topology(&topology).remove(q.metadata.name.as_deref().unwrap_or_default());
        }
        Ok(Event::Init) => relisted.clear(),
        Ok(Event::InitApply(q)) => relisted.push(q.clone()),
        Ok(Event::InitDone) => {
            *write_topology(&topology) = QuotaTopology::from_quotas(relisted.iter());
            relisted.clear();
        }
        Err(_) => {}
    }
}

/// Drives the pod index as `drive` drives a reflector.
async fn drive_pods<S>(index: Arc<PodIndex>, stream: S, restarts: Family<KindLabels, Counter>)
where
    S: Stream<Item = watcher::Result<Event<PartialObjectMeta<Pod>>>> + Send,
{
    stream
        .for_each(|event| {
            match event {
                Ok(event) => index.apply(&event),
                Err(e) => {
                    tracing::warn!(kind = "pod", error = %e, "watch failed; resuming");
                    restarts.get_or_create(&KindLabels { kind: "pod" }).inc();
                }
            }
            future::ready(())
        })
        .await;
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
    let quotas =
        watch(Api::<ElasticQuota>::all(client.clone())).inspect(follow_topology(quota_topology));
    // Only names, namespaces and labels are read: managedFields and annotations would be most of
    // the memory of a large cluster's pods.
    let node_meta =
        watch(Api::<PartialObjectMeta<Node>>::all(client.clone())).modify(super::slim_node);
    let pod_meta =
        watch(Api::<PartialObjectMeta<Pod>>::all(client.clone())).modify(super::slim_pod);
    let m = || restarts.clone();
    tokio::join!(
        drive("elasticquota", elastic_quotas, quotas, m()),
        drive(
            "elasticquotaprofile",
            elastic_quota_profiles,
            watch(Api::<ElasticQuotaProfile>::all(client.clone())),
            m()
        ),
        drive(
            "reservation",
            reservations,
            watch(Api::<Reservation>::all(client.clone())),
            m()
        ),
        drive(
            "clustercolocationprofile",
            colocation_profiles,
            watch(Api::<ClusterColocationProfile>::all(client.clone())),
            m()
        ),
        drive(
            "configmap",
            config_maps,
            watch(Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)),
            m()
        ),
        drive(
            "namespace",
            namespaces,
            watch(Api::<Namespace>::all(client.clone())),
            m()
        ),
        drive(
            "priorityclass",
            priority_classes,
            watch(Api::<PriorityClass>::all(client.clone())),
            m()
        ),
        drive("node", nodes, node_meta, m()),
        drive_pods(pods, pod_meta, m()),
    );
}

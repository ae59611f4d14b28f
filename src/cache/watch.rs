//! Cluster mode: kube-runtime watches fill the cache (docs/architecture.md, "A watch event"). Nodes
//! and Namespaces are watched as metadata only (an `Api<PartialObjectMeta<K>>` asks for nothing
//! else), pods reduced to what the pod index keeps; ConfigMaps only those the rules read, by name;
//! Koordinator's kinds leniently (`lenient.rs`). Every object is decoded without its managedFields
//! (`unmanaged.rs`) and slimmed as it arrives, and a relist is applied in place (`store.rs`). A
//! broken watch resumes with kube-runtime's backoff while the cache stays readable.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt, future};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Config, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use super::handles::CacheWriter;
use super::lenient::{Lenient, SetAside, Unreadable};
use super::pod_index::IndexedPod;
use super::slim::Slim;
use super::store::Writer;
use super::unmanaged::{Unmanaged, map_event};
use crate::apis::{ClusterColocationProfile, ElasticQuota, ElasticQuotaProfile, Reservation};
use crate::metrics::cache::CacheMetrics;
use crate::metrics::labels::KindLabels;
use prometheus_client::metrics::{counter::Counter, family::Family};
use tokio::sync::mpsc;

/// Which watches are failing, and since when: what readiness reads once the cache has synced (a
/// replica whose watches have failed for long answers from a cache that no longer follows the
/// cluster).
#[derive(Clone, Default)]
pub struct WatchHealth(Arc<Mutex<BTreeMap<&'static str, (Instant, String)>>>);

impl WatchHealth {
    fn failed(&self, kind: &'static str, error: String) {
        let mut failing = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let since = failing
            .get(kind)
            .map_or_else(Instant::now, |(since, _)| *since);
        failing.insert(kind, (since, error));
    }

    fn delivered(&self, kind: &'static str) {
        let mut failing = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !failing.is_empty() {
            failing.remove(kind);
        }
    }

    /// The watch failing the longest, if it has failed without a success for at least `bound`:
    /// its kind, for how long, and its last error.
    pub fn failing_for(&self, bound: Duration) -> Option<(&'static str, Duration, String)> {
        let failing = self.0.lock().unwrap_or_else(|p| p.into_inner());
        failing
            .iter()
            .map(|(kind, (since, error))| (*kind, since.elapsed(), error.clone()))
            .filter(|(_, failed, _)| *failed >= bound)
            .max_by_key(|(_, failed, _)| *failed)
    }
}

/// Counts broken watches and keeps which are failing.
#[derive(Clone)]
struct Failures {
    restarts: Family<KindLabels, Counter>,
    health: WatchHealth,
}

impl Failures {
    /// A client for `kind`'s watch that counts every watch the API server starts (2xx) as a
    /// success of the kind. A watch resumed after an outage brings no event until its kind
    /// changes (kube-runtime keeps bookmarks to itself), so without this a quiet kind (profiles
    /// nobody edits) would count as failing from the outage on, and every replica would turn
    /// unready `--watch-failure-bound` after an API-server restart.
    fn client(&self, client: &Client, kind: &'static str) -> Client {
        let inner = client.clone();
        let health = self.health.clone();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let (inner, health) = (inner.clone(), health.clone());
            async move {
                let watch = is_watch(request.uri());
                let response = inner.send(request).await?;
                if watch && response.status().is_success() {
                    health.delivered(kind);
                }
                Ok::<_, kube::Error>(response)
            }
        });
        Client::new(service, client.default_namespace().to_owned())
    }
}

/// Whether a request to the API server is a watch (`watch=true`, or `1`).
fn is_watch(uri: &http::Uri) -> bool {
    uri.query()
        .is_some_and(|q| q.split('&').any(|p| matches!(p, "watch=true" | "watch=1")))
}

/// Feeds one watch into `apply` until the stream ends (never, in practice), counting broken
/// watches.
async fn drive<T, S>(
    kind: &'static str,
    stream: S,
    mut apply: impl FnMut(T) + Send,
    failures: Failures,
) where
    S: Stream<Item = watcher::Result<T>> + Send,
{
    stream
        .for_each(|event| {
            match event {
                Ok(event) => {
                    failures.health.delivered(kind);
                    apply(event)
                }
                Err(e) => {
                    tracing::warn!(kind, error = %e, "watch failed; resuming");
                    failures.restarts.get_or_create(&KindLabels { kind }).inc();
                    failures.health.failed(kind, e.to_string());
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
    watch::<Lenient<K>>(client).filter_map(move |event| {
        future::ready(match event {
            Ok(event) => set_aside.event(event).map(Ok),
            Err(e) => Some(Err(e)),
        })
    })
}

/// Every object of kind `K` in the cluster, decoded without its managedFields (`unmanaged.rs`).
fn watch<K>(client: Client) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + use<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default,
{
    unwrapped(streamed_or_paged(
        Api::<Unmanaged<K>>::all(client),
        config(),
    ))
}

/// A watch whose (re)lists stream where the API server serves streaming lists (`sendInitialEvents`,
/// WatchList: on by default since Kubernetes 1.32), and come in pages of [`LIST_PAGE`] where it
/// refuses them. A streamed relist holds one object in flight, where a page holds fifty decoded
/// at once per watch, and every watch relists at once after an API-server restart; the API server
/// also serves it from its watch cache. A server without the feature (gate off, or before 1.27,
/// which refuses `resourceVersionMatch` on a watch) answers the first request 4xx: this watch then
/// lists in pages for the rest of the process.
fn streamed_or_paged<K>(
    api: Api<K>,
    config: Config,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + use<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let streamed = watcher::watcher(api.clone(), config.clone().streaming_lists())
        .default_backoff()
        .take_while(|event| {
            let refused = match event {
                Err(error) if refuses_streaming_lists(error) => {
                    tracing::info!(
                        kind = %K::kind(&Default::default()),
                        %error,
                        "the API server does not serve streaming lists; listing in pages"
                    );
                    true
                }
                _ => false,
            };
            future::ready(!refused)
        });
    let paged = futures::stream::once(future::ready(()))
        .flat_map(move |()| watcher::watcher(api.clone(), config.clone()).default_backoff());
    streamed.chain(paged)
}

/// Whether a watch error is the API server refusing a streaming list: a request it calls bad or
/// invalid (the WatchList gate off: `sendInitialEvents is forbidden`; before 1.27:
/// `resourceVersionMatch is forbidden for watch`) or a method it does not implement. Every other
/// error (unreachable, 403, 429, 5xx, an expired resourceVersion) is retried as before.
fn refuses_streaming_lists(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) => {
            matches!(status.code, 400 | 405 | 422 | 501)
        }
        _ => false,
    }
}

fn unwrapped<K>(
    stream: impl Stream<Item = watcher::Result<Event<Unmanaged<K>>>> + Send,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send {
    stream.map(|event| event.map(|event| map_event(event, |Unmanaged(object)| object)))
}

/// Where lists come in pages ([`streamed_or_paged`]), pages of [`LIST_PAGE`] objects: a page is
/// decoded whole before its objects are slimmed, and every watch relists at once after an
/// API-server restart, so the page bounds that moment's transient memory (kube-runtime's default of
/// 500 whole quotas or pods is several MiB per watch; 50 against 100 lowered the peak through a
/// restart at the S scale by a few MiB, docs/scale.md).
fn config() -> Config {
    Config::default().page_size(LIST_PAGE)
}

const LIST_PAGE: u32 = 50;

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
            let api = Api::<Unmanaged<ConfigMap>>::namespaced(client.clone(), namespace);
            unwrapped(streamed_or_paged(api, config))
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

/// Starts every watch; the returned future runs them all.
///
/// With `index_pod` (the recount of `child-request` needs each pod's charge), pods are watched
/// whole as `P` (the admission's pod type: what quota evaluation reads is decoded, the rest kept as
/// text) and reduced by `index_pod` to what the pod index keeps. Without, they are watched as
/// metadata only: the rules that read the index then (quota deletes) read labels and names, and a
/// whole-pod JSON watch is what costs the API server most of what koord-webhook costs it beside its
/// calls: every pod event encoded to JSON for us (the kubelet and the scheduler take protobuf) and
/// kept with the event while it is in the watch cache (bench/RESULTS.md, issue 45).
pub async fn run<P>(
    client: Client,
    writer: CacheWriter,
    metrics: CacheMetrics,
    wanted_config_maps: Vec<(String, String)>,
    unreadable: mpsc::Sender<Unreadable>,
    health: WatchHealth,
    index_pod: Option<impl Fn(&P) -> IndexedPod + Send>,
) where
    P: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let CacheWriter {
        mut quotas,
        elastic_quota_profiles,
        reservations,
        colocation_profiles,
        config_maps,
        namespaces,
        priority_classes,
        nodes,
        pods,
    } = writer;
    let failures = Failures {
        restarts: metrics.watch_restarts,
        health,
    };
    let m = || failures.clone();
    let c = |kind| failures.client(&client, kind);
    let aside = |kind| SetAside::new(kind, &metrics.unreadable_objects, unreadable.clone());
    tokio::join!(
        drive(
            "elasticquota",
            watch::<Lenient<ElasticQuota>>(c("elasticquota")),
            {
                let mut aside = aside("elasticquota");
                move |event| quotas.apply(event, &mut aside)
            },
            m()
        ),
        drive(
            "elasticquotaprofile",
            watch_lenient::<ElasticQuotaProfile>(
                c("elasticquotaprofile"),
                aside("elasticquotaprofile")
            ),
            into(elastic_quota_profiles),
            m()
        ),
        drive(
            "reservation",
            watch_lenient::<Reservation>(c("reservation"), aside("reservation")),
            into(reservations),
            m()
        ),
        drive(
            "clustercolocationprofile",
            watch_lenient::<ClusterColocationProfile>(
                c("clustercolocationprofile"),
                aside("clustercolocationprofile")
            ),
            into(colocation_profiles),
            m()
        ),
        drive(
            "configmap",
            named_config_maps(&c("configmap"), &wanted_config_maps),
            follow_named(config_maps, wanted_config_maps.len()),
            m()
        ),
        drive(
            "namespace",
            watch::<PartialObjectMeta<Namespace>>(c("namespace")),
            into(namespaces),
            m()
        ),
        drive(
            "priorityclass",
            watch::<PriorityClass>(c("priorityclass")),
            into(priority_classes),
            m()
        ),
        drive(
            "node",
            watch::<PartialObjectMeta<Node>>(c("node")),
            into(nodes),
            m()
        ),
        async move {
            if let Some(index_pod) = index_pod {
                let apply = move |event| pods.apply(&map_event(event, |p| index_pod(&p)));
                drive("pod", watch::<P>(c("pod")), apply, m()).await
            } else {
                let apply =
                    move |event| pods.apply(&map_event(event, |p| IndexedPod::from_meta(&p)));
                let metadata = watch::<PartialObjectMeta<Pod>>(c("pod"));
                drive("pod", metadata, apply, m()).await
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_watch_requests_count_as_a_started_watch() {
        let uri = |s: &str| s.parse::<http::Uri>().unwrap();
        assert!(is_watch(&uri("/api/v1/pods?watch=true&resourceVersion=1")));
        assert!(is_watch(&uri("/api/v1/pods?limit=50&watch=1")));
        assert!(!is_watch(&uri("/api/v1/pods?limit=50")));
        assert!(!is_watch(&uri("/api/v1/pods?watch=false")));
        assert!(!is_watch(&uri("/api/v1/namespaces/watch=true/pods")));
    }

    #[test]
    fn only_a_refused_watch_start_turns_a_watch_to_pages() {
        let start = |code: u16| {
            let status: kube::core::Status =
                serde_json::from_value(serde_json::json!({"code": code})).unwrap();
            watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(status)))
        };
        for code in [400, 405, 422, 501] {
            assert!(refuses_streaming_lists(&start(code)), "{code}");
        }
        // Unauthorised, throttled, down or restarting: retried as a streaming list.
        for code in [401, 403, 404, 410, 429, 500, 503] {
            assert!(!refuses_streaming_lists(&start(code)), "{code}");
        }
        let status: kube::core::Status =
            serde_json::from_value(serde_json::json!({"code": 422})).unwrap();
        let listed = watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status.clone())));
        assert!(!refuses_streaming_lists(&listed));
        assert!(!refuses_streaming_lists(&watcher::Error::WatchError(
            Box::new(status)
        )));
    }

    #[test]
    fn a_watch_counts_as_failing_from_its_first_error_until_its_next_event() {
        let health = WatchHealth::default();
        assert!(health.failing_for(Duration::ZERO).is_none());
        health.failed("pod", "connection refused".into());
        std::thread::sleep(Duration::from_millis(20));
        health.failed("pod", "403 forbidden".into());
        health.failed("node", "connection refused".into());
        // The longest-failing kind, with its last error; the bound not reached yet: nothing.
        let (kind, failed, error) = health.failing_for(Duration::from_millis(10)).unwrap();
        assert_eq!((kind, error.as_str()), ("pod", "403 forbidden"));
        assert!(failed >= Duration::from_millis(20));
        assert!(health.failing_for(Duration::from_secs(3600)).is_none());
        health.delivered("pod");
        assert_eq!(health.failing_for(Duration::ZERO).unwrap().0, "node");
        health.delivered("node");
        assert!(health.failing_for(Duration::ZERO).is_none());
    }
}

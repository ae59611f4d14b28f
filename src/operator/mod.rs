//! Cluster mode of `serve` (docs/architecture.md): the cache watches, leader election, the leader's
//! certificate and webhook-configuration work, and on every replica the serving pair taken from the
//! `webhook-tls` Secret and the readiness proof that the published caBundle verifies it.

pub mod certificates;
pub mod child_requests;
mod config;
pub mod flags;
pub mod leader;
pub mod leader_pass;
pub mod memory_guard;
pub mod replicas;

pub(crate) mod secrets;
pub mod webhook_keeper;
pub mod write_error;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::events::Recorder;

use crate::admission::pod::quota::evaluation::indexed_pod;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::{Notify, watch};

use crate::certs::authority;
use crate::metrics::operator::ConfigurationLabels;
use crate::names::Mode;
use crate::names::namespace;
use crate::names::{SECRET_CA, SECRET_TLS};
use crate::state::State;
pub use config::own_pod;
pub(crate) use config::reporter;
pub use config::{OperatorConfig, serving_hosts};
use leader::Leadership;

/// Runs the operator until `stop` fires; the admission server runs beside it: what every replica
/// does, and what the leader does.
pub async fn run(
    client: Client,
    config: OperatorConfig,
    state: Arc<State>,
    writer: crate::cache::CacheWriter,
    stop: watch::Receiver<bool>,
) {
    let kick = Arc::new(Notify::new());
    let leader_caches = (writer.reader(), writer.reader());
    // Each task boxed: nested in one future, their state machines overflowed a debug build's stack.
    tokio::join!(
        Box::pin(every_replica(&client, &config, &state, writer, &kick)),
        Box::pin(the_leader(
            &client,
            &config,
            &state,
            leader_caches,
            &kick,
            stop
        )),
    );
}

/// What every replica does: the cache, the serving pair, the webhook configurations and the CA
/// Secret watched (each change kicks the leader's pass), readiness, the pod entries its gates
/// need, its memory.
async fn every_replica(
    client: &Client,
    config: &OperatorConfig,
    state: &Arc<State>,
    writer: crate::cache::CacheWriter,
    kick: &Arc<Notify>,
) {
    let mode = config.desired.target.policy.mode;
    tokio::join!(
        Box::pin(follow_cluster(
            client.clone(),
            config,
            state.clone(),
            writer
        )),
        watch_serving_pair(client.clone(), state.clone(), kick.clone()),
        watch_configurations(client.clone(), mode, kick.clone()),
        watch_ca_secret(client.clone(), kick.clone()),
        Box::pin(check_readiness(
            client.clone(),
            config,
            state.clone(),
            kick.clone()
        )),
        Box::pin(keep_pod_entries_wide_for_gates(
            client.clone(),
            config,
            state.clone()
        )),
        guard_memory(client, config, state),
    );
}

/// With `--memory-limit`, the replica turns unready near it (`memory_guard.rs`), saying so in
/// Events on its own Pod.
async fn guard_memory(client: &Client, config: &OperatorConfig, state: &Arc<State>) {
    let Some(limit) = config.memory_limit else {
        return;
    };
    let recorder = Recorder::new(client.clone(), reporter(&config.identity));
    let pod = config::own_pod(&config.identity);
    memory_guard::run(limit, state.clone(), recorder, pod).await;
}

/// What the leader does: the election, then while it leads its pass (`leader_pass.rs`:
/// certificates, webhook configurations with the rollout's split and narrowing, CA rotation) and
/// the child-request recount.
async fn the_leader(
    client: &Client,
    config: &OperatorConfig,
    state: &Arc<State>,
    (pass_cache, recount_cache): (crate::cache::Cache, crate::cache::Cache),
    kick: &Arc<Notify>,
    stop: watch::Receiver<bool>,
) {
    let (leadership, election) = leader::election_if(config.leader_elect, config.lease);
    tokio::join!(
        elect(client.clone(), config, election, stop),
        Box::pin(lead(
            client.clone(),
            config,
            leadership.clone(),
            kick.clone(),
            state,
            pass_cache
        )),
        Box::pin(recount_child_requests(
            client.clone(),
            config,
            leadership,
            state,
            recount_cache
        )),
    );
}

/// The cache's watches, and readiness once they have synced and while they keep up.
async fn follow_cluster(
    client: Client,
    config: &OperatorConfig,
    state: Arc<State>,
    writer: crate::cache::CacheWriter,
) {
    let cache = writer.reader();
    let watch_health = crate::cache::watch::WatchHealth::default();
    let (unreadable, unreadable_rx) =
        tokio::sync::mpsc::channel(crate::cache::lenient::QUEUED_EVENTS);
    // Each pod's charge only for the recount (with quota admission): otherwise metadata only.
    let gates = config.desired.gates;
    let charges = gates.enabled(crate::features::Gate::EnableQuotaAdmission);
    let cache_task = crate::cache::watch::run(
        client.clone(),
        writer,
        state.metrics.cache.clone(),
        config.config_maps.clone(),
        unreadable,
        watch_health.clone(),
        charges.then_some(move |pod: &crate::admission::pod::object::Pod| indexed_pod(pod, &gates)),
    );
    tokio::spawn(crate::cache::lenient::publish(
        Recorder::new(client, reporter(&config.identity)),
        unreadable_rx,
    ));
    let cache_ready = async {
        state.readiness.set_not_ready("cache", "not synced yet");
        cache.wait_until_synced().await;
        state.readiness.set_ready("cache");
        tracing::info!(objects = ?cache.sizes(), "cache synced");
        follow_watch_health(&state, &watch_health, config.watch_failure_bound).await;
    };
    tokio::join!(cache_task, cache_ready);
}

/// The Lease, held or waited for until `stop` (nothing to elect without leader election).
async fn elect(
    client: Client,
    config: &OperatorConfig,
    election: Option<leader::Election>,
    mut stop: watch::Receiver<bool>,
) {
    match election {
        Some(election) => {
            let api: Api<Lease> = Api::namespaced(client, namespace());
            election.run(api, config.identity.clone(), stop).await
        }
        None => {
            let _ = stop.changed().await;
        }
    }
}

/// The leader's pass (`leader_pass.rs`), and the rollout it follows when the pod entries are to be
/// split: the split is held back while another pod template runs.
async fn lead(
    client: Client,
    config: &OperatorConfig,
    leadership: Leadership,
    kick: Arc<Notify>,
    state: &State,
    cache: crate::cache::Cache,
) {
    let (replicas_tx, replicas) = watch::channel(replicas::Replicas::Unread);
    let follow_replicas = async {
        if config.desired.target.qos_split {
            replicas::watch(
                client.clone(),
                config.identity.clone(),
                replicas_tx,
                kick.clone(),
            )
            .await;
        }
    };
    let pass =
        leader_pass::LeaderPass::new(client.clone(), config, leadership.clone(), cache, replicas);
    tokio::join!(
        follow_replicas,
        leader_pass::run(pass, config, leadership, kick.clone(), &state.metrics),
    );
}

/// The leader's recount of `child-request` (with quota admission; a shadow writes nothing of
/// Koordinator's).
async fn recount_child_requests(
    client: Client,
    config: &OperatorConfig,
    leadership: Leadership,
    state: &State,
    cache: crate::cache::Cache,
) {
    let gates = config.desired.gates;
    let enforcing = config.desired.target.policy.mode == Mode::Enforce;
    if !enforcing || !gates.enabled(crate::features::Gate::EnableQuotaAdmission) {
        return;
    }
    child_requests::Recount {
        client,
        cache,
        gates,
        leadership,
        quiet: config.child_request_quiet,
        metrics: state.metrics.operator.clone(),
    }
    .run()
    .await;
}

/// A replica whose gates make every pod relevant to a pod entry (docs/narrowing.md) widens that
/// entry before it reports ready, and stamps it while it runs, so a leader of other gates (a rolling
/// upgrade that turns such a gate on) cannot narrow it meanwhile: the stamp holds its narrowing for
/// `--narrow-hold`, renewed at a quarter of that.
async fn keep_pod_entries_wide_for_gates(
    client: Client,
    config: &OperatorConfig,
    state: Arc<State>,
) {
    use crate::entries::narrowing::pod::{PodEntry, Reach, every_pod};
    let gates = &config.desired.gates;
    let entries: Vec<PodEntry> = [PodEntry::Create, PodEntry::Validate]
        .into_iter()
        .filter(|e| every_pod(*e, gates))
        .collect();
    if !config.desired.target.policy.narrows() || entries.is_empty() {
        return;
    }
    let guard =
        crate::kube_ports::pod_reach::KubePodReachGuard::for_hold(client, config.narrow_hold);
    const CHECK: &str = "pod-entries";
    state.readiness.set_not_ready(
        CHECK,
        "the pod entries are not yet sent every pod, as this replica's gates need",
    );
    // Once widened, a failed renewal (an API-server restart) does not make the replica unready: the
    // last stamp holds the leader for the hold, and the renewal is retried every 2 s.
    let mut widened = false;
    loop {
        let mut failed = None;
        for entry in &entries {
            let fresh = Some(config.narrow_hold / 2);
            if let Err(e) = guard.cover_unless_fresh(*entry, &Reach::Every, fresh).await {
                failed = Some(format!("cannot widen {}: {e}", entry.entry_name()));
            }
        }
        match failed {
            None => {
                widened = true;
                state.readiness.set_ready(CHECK);
            }
            Some(reason) => {
                tracing::warn!(%reason, "pod entries not widened for this replica's gates; retrying");
                if !widened {
                    state.readiness.set_not_ready(CHECK, reason);
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
                continue;
            }
        }
        tokio::time::sleep(config.narrow_hold / 4).await;
    }
}

/// How long a deleted `webhook-tls` waits before it wakes the leader.
const DELETION_SETTLE: Duration = Duration::from_secs(1);

/// Every replica serves the pair in `webhook-tls`, swapped in memory when the Secret changes. Any
/// change wakes the leader, a deletion too (it writes the Secret again at once, not at its next
/// timer: a replica starting meanwhile would have nothing to serve).
async fn watch_serving_pair(client: Client, state: Arc<State>, kick: Arc<Notify>) {
    let api: Api<Secret> = Api::namespaced(client, namespace());
    let config = watcher::Config::default().fields(&format!("metadata.name={SECRET_TLS}"));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            // Init starts a relist; its InitDone (the Secret absent or not) is when to look.
            Ok(watcher::Event::Init) => {}
            Ok(watcher::Event::InitDone) => kick.notify_waiters(),
            // A second apart, so that both Secrets deleted together (`kubectl delete secret
            // webhook-tls webhook-ca`) are seen together: a fresh start, not a staged rotation
            // away from a CA that is gone too.
            Ok(watcher::Event::Delete(_)) => {
                tokio::time::sleep(DELETION_SETTLE).await;
                kick.notify_waiters();
            }
            Ok(watcher::Event::Apply(secret) | watcher::Event::InitApply(secret)) => {
                if let Some(tls) = secrets::read_tls(&secret) {
                    let loaded = state.resolver.current().map(|p| p.cert_pem.clone());
                    if loaded.as_deref() != Some(tls.serving.cert_pem.as_bytes()) {
                        match state.resolver.set_pem(
                            tls.serving.cert_pem.as_bytes(),
                            tls.serving.key_pem.as_bytes(),
                        ) {
                            Ok(()) => tracing::info!(
                                "serving certificate loaded from Secret {SECRET_TLS}"
                            ),
                            Err(e) => {
                                tracing::warn!(error = %e, "Secret {SECRET_TLS} holds an unusable pair")
                            }
                        }
                    }
                }
                kick.notify_waiters();
            }
            Err(e) => tracing::warn!(error = %e, "watch of Secret {SECRET_TLS} failed; resuming"),
        }
    }
}

/// Changes to `webhook-ca` (deleted, or overwritten with something unusable) wake the leader at once
/// rather than at its next timer.
async fn watch_ca_secret(client: Client, kick: Arc<Notify>) {
    let api: Api<Secret> = Api::namespaced(client, namespace());
    let config = watcher::Config::default().fields(&format!("metadata.name={SECRET_CA}"));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        if let Err(e) = event {
            tracing::warn!(error = %e, "watch of Secret {SECRET_CA} failed; resuming");
        }
        kick.notify_waiters();
    }
}

/// Changes to the webhook configurations (a blanked caBundle, a deleted configuration) wake the
/// leader and the readiness check at once.
async fn watch_configurations(client: Client, mode: Mode, kick: Arc<Notify>) {
    let by_name = |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
    // A shadow has no mutating configuration: that half never yields.
    let m = match mode.mutating_configuration() {
        Some(name) => {
            let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
            watcher::watcher(mutating, by_name(name))
                .default_backoff()
                .map(|e| e.map(|_| ()))
                .boxed()
        }
        None => futures::stream::pending().boxed(),
    };
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client);
    let v = watcher::watcher(validating, by_name(mode.validating_configuration()))
        .default_backoff()
        .map(|e| e.map(|_| ()))
        .boxed();
    let mut events = std::pin::pin!(futures::stream::select(m, v));
    while let Some(event) = events.next().await {
        if let Err(e) = event {
            tracing::warn!(error = %e, "watch of the webhook configurations failed; resuming");
        }
        kick.notify_waiters();
    }
}

/// Readiness on every replica: the pair it serves verifies against the caBundle published in both
/// configurations, for the host the API server calls.
///
/// The last bundle read is kept: a failed read (an API-server blip) changes nothing, so it cannot
/// make every replica unready at once; only a bundle read and found not to match does.
async fn check_readiness(
    client: Client,
    config: &OperatorConfig,
    state: Arc<State>,
    kick: Arc<Notify>,
) {
    let metrics = &state.metrics;
    let mode = config.desired.target.policy.mode;
    let mut last_published: Option<Result<Vec<u8>, String>> = None;
    // The configurations' resourceVersions when the bundle was last read: unchanged, the bundle
    // is too, and only their metadata is read (a kick, after a write, reads the bundle anyway).
    let mut read_at: Option<Vec<Option<String>>> = None;
    let mut was_kicked = true;
    loop {
        let kicked = kick.notified();
        let versions = webhook_keeper::published_versions(&client, mode).await.ok();
        let unchanged = !was_kicked && versions.is_some() && versions == read_at;
        if !unchanged {
            match webhook_keeper::published_bundle(&client, mode).await {
                Ok(published) => {
                    last_published = Some(published);
                    read_at = versions;
                }
                Err(e) => tracing::debug!(
                    error = %e,
                    "could not read the webhook configurations; readiness keeps the last bundle read"
                ),
            }
        }
        let verdict = match (state.resolver.current(), &last_published) {
            (None, _) => Err("no serving certificate loaded yet".to_owned()),
            (_, None) => Err("the webhook configurations have not been read yet".to_owned()),
            (_, Some(Err(e))) => Err(e.clone()),
            (Some(pair), Some(Ok(bundle))) => {
                authority::verify_serving(&pair.cert_pem, bundle, config.policy.verify_host())
            }
        };
        for (_, configuration) in config.desired.target.policy.mode.configurations() {
            metrics
                .operator
                .ca_bundle_in_sync
                .get_or_create(&ConfigurationLabels { configuration })
                .set(i64::from(verdict.is_ok()));
        }
        match verdict {
            Ok(()) => state.readiness.set_ready("certificate"),
            Err(reason) => state.readiness.set_not_ready("certificate", reason),
        }
        was_kicked = tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(2)) => false,
            _ = kicked => true,
        };
    }
}

/// Readiness after the first sync: unready (check `watches`) while a watch has failed for longer than
/// `bound` (`--watch-failure-bound`), naming it; ready again at its next success: an event, or a
/// watch the API server starts (`cache/watch.rs`).
async fn follow_watch_health(
    state: &State,
    health: &crate::cache::watch::WatchHealth,
    bound: Duration,
) {
    const CHECK: &str = "watches";
    loop {
        match health.failing_for(bound) {
            Some((kind, failed, error)) => state.readiness.set_not_ready(
                CHECK,
                format!(
                    "the {kind} watch has failed for {}s (its cache no longer follows the cluster): {error}",
                    failed.as_secs()
                ),
            ),
            None => state.readiness.set_ready(CHECK),
        }
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    }
}

//! `koord-webhook serve`: the admission server, and in cluster mode (no `--state`) the operator
//! beside it.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use anyhow::Context;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use kube::runtime::events::Recorder;

use super::resolved::{Replica, Rules};
use crate::admission::ports::{FindingSink, PodReachGuard, ProbeSecrets};
use crate::admission::{Admission, Services};
use crate::cache::{CacheWriter, load::load_state};
use crate::certs;
use crate::cli::ServeArgs;
use crate::kube_ports::own_user;
use crate::kube_ports::pod_reach::KubePodReachGuard;
use crate::kube_ports::quota::KubeQuotaStore;
use crate::kube_ports::quota_ledger::KubeLedgerStore;
use crate::kube_ports::would_deny_events::WouldDenyEvents;
use crate::metrics::operator::CertLabels;
use crate::names::Mode;
use crate::operator::{self, OperatorConfig};
use crate::server::shutdown::Stopping;
use crate::server::{self, Shared};
use crate::state::State;
use crate::tls::CertResolver;
use crate::tls::files::PairFiles;

/// Resolves when the process is asked to stop (SIGTERM or Ctrl-C).
async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

/// The outside systems the rules reach in cluster mode (`client`): quota evaluation records what
/// it admitted on the ElasticQuota itself, quota changes go through the ledger, narrowed pod
/// entries are widened before a change needs them, and shadowed refusals become Events when asked.
/// None with `--state`.
fn services(
    args: &ServeArgs,
    client: Option<&kube::Client>,
    identity: &str,
    resolver: &Arc<CertResolver>,
) -> Services {
    let Some(client) = client else {
        return Services::default();
    };
    let client = client.clone();
    let findings = args.would_deny_events.then(|| {
        let recorder = Recorder::new(client.clone(), operator::reporter(identity));
        let (sink, publish) = WouldDenyEvents::start(
            recorder,
            operator::own_pod(identity),
            WOULD_DENY_EVENT_WINDOW,
        );
        tokio::spawn(publish);
        Arc::new(sink) as Arc<dyn FindingSink>
    });
    Services {
        quota_store: Some(Arc::new(KubeQuotaStore {
            client: client.clone(),
        })),
        quota_ledger: Some(Arc::new(KubeLedgerStore {
            client: client.clone(),
        })),
        probe_secrets: Some(resolver.clone() as Arc<dyn ProbeSecrets>),
        probe_nudge: Some(Arc::default()),
        pod_reach: args.operator.entries.narrows().then(|| {
            Arc::new(KubePodReachGuard::for_hold(
                client,
                args.operator.narrow_hold,
            )) as Arc<dyn PodReachGuard>
        }),
        dice: None,
        findings,
    }
}

/// Per rule and namespace, one WouldDeny Event at once and at most one more per window.
const WOULD_DENY_EVENT_WINDOW: Duration = Duration::from_secs(60);

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let Replica {
        rules,
        operator: config,
    } = Replica::resolve(&args)?;
    let Rules { gates, settings } = rules;
    if args.state.is_none() && config.leader_elect {
        config.lease.validate().map_err(anyhow::Error::msg)?;
    }
    let resolver = Arc::new(CertResolver::new());
    let pair_files = load_serving_pair(&args, &resolver)?;

    let (cache, operator) = match &args.state {
        Some(path) => {
            let cache = load_state(path).context("--state")?.reader();
            tracing::info!(path = %path.display(), objects = ?cache.sizes(), "serving from a static cache");
            (cache, None)
        }
        None => {
            let client = kube::Client::try_default()
                .await
                .context("cannot configure a Kubernetes client (KUBECONFIG or in-cluster)")?;
            let writer = CacheWriter::default();
            let cache = writer.reader();
            (cache, Some((client, writer)))
        }
    };

    let services = services(
        &args,
        operator.as_ref().map(|(client, _)| client),
        &config.identity,
        &resolver,
    );
    let ledger_store = services
        .quota_ledger
        .clone()
        .zip(services.probe_nudge.clone());
    let client_ca = client_ca(&args)?;
    // The one composition root: the state every part shares, then each part on it.
    let state = Arc::new(State::new(cache, resolver));
    match &operator {
        _ if args.operator.entries.mode == Mode::Shadow => {}
        // `--own-user` named it: nothing to ask.
        Some(_) if settings.own_user.get().is_some() => {}
        Some((client, _)) => {
            tokio::spawn(own_user::learn(client.clone(), settings.own_user.clone()));
        }
        // No API server to ask: the installed ServiceAccount.
        None => settings
            .own_user
            .learn(crate::names::service_account_user()),
    }
    let admission = Admission::new(state.cache.clone(), gates, state.metrics.clone())
        .with_services(services)
        .with_settings(settings);
    let shared = Arc::new(
        Shared::new(state.clone(), admission, args.limits.limits()).with_client_ca(client_ca),
    );
    let addr = SocketAddr::new(args.bind_address, args.port);
    let listener = server::listen(addr).with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(%addr, gates = %gates.overrides(), "admission server listening");
    let server = server::build(listener, shared.clone())?;
    if let Some(files) = pair_files {
        watch_serving_pair(files, &state, args.tls_reload_interval);
    }
    let admission_handle = server.handle();
    let serving = tokio::spawn(server);
    let (ops, mut tasks) = start_side_ports(&args, &shared).await?;

    if let Some((record, nudge)) = ledger_store
        && gates.enabled(crate::features::Gate::ElasticValidatingWebhook)
    {
        // The API server's address, for the quota ledger (`ledger/probe.rs`).
        let config = kube::Config::infer()
            .await
            .context("cannot configure a Kubernetes client (KUBECONFIG or in-cluster)")?;
        let probes = tokio::spawn(crate::kube_ports::api_server_probe::run(
            config,
            state.resolver.clone() as Arc<dyn ProbeSecrets>,
            record,
            nudge,
            state.metrics.clone(),
        ));
        tasks.push(probes.abort_handle());
    }
    let stop_operator = operator.map(|(client, writer)| {
        let (stop, task) = start_operator(config, client, writer, &state);
        tasks.push(task);
        stop
    });

    tokio::select! {
        _ = terminated() => {}
        result = serving => {
            return result.context("server task failed")?.context("server stopped with an error");
        }
    }
    let stopping = Stopping {
        state,
        operator: stop_operator,
        admission: admission_handle,
        ops,
        tasks,
    };
    stopping.run(&args.shutdown).await;
    Ok(())
}

/// The operator (cluster mode): its stop signal and task.
fn start_operator(
    config: OperatorConfig,
    client: kube::Client,
    writer: CacheWriter,
    state: &Arc<State>,
) -> (watch::Sender<bool>, AbortHandle) {
    let (stop, stopped) = watch::channel(false);
    tracing::info!(identity = %config.identity, mode = ?config.cert_mode, "operator starting");
    let task = tokio::spawn(operator::run(
        client,
        config,
        state.clone(),
        writer,
        stopped,
    ));
    (stop, task.abort_handle())
}

/// `--client-ca-file`, re-read like the serving pair: a rotated CA is trusted without a restart.
fn client_ca(args: &ServeArgs) -> anyhow::Result<Option<Arc<crate::tls::ClientCa>>> {
    let Some(path) = &args.client_ca_file else {
        return Ok(None);
    };
    let pem =
        std::fs::read(path).with_context(|| format!("--client-ca-file {}", path.display()))?;
    let ca = Arc::new(
        crate::tls::ClientCa::from_pem(&pem)
            .with_context(|| format!("--client-ca-file {}", path.display()))?,
    );
    tokio::spawn(ca.clone().watch(path.clone(), args.tls_reload_interval));
    Ok(Some(ca))
}

/// Re-reads the serving pair's files, counting each rotation.
fn watch_serving_pair(files: PairFiles, state: &Arc<State>, interval: Duration) {
    let counted = state.clone();
    tokio::spawn(files.watch(state.resolver.clone(), interval, move || {
        counted
            .metrics
            .operator
            .cert_rotations
            .get_or_create(&CertLabels {
                certificate: "serving",
            })
            .inc();
    }));
}

/// The probe port and the operations port, each unless its address is `0` or empty: the
/// operations server's handle and the probe task, for the shutdown.
async fn start_side_ports(
    args: &ServeArgs,
    shared: &Arc<Shared>,
) -> anyhow::Result<(Option<ServerHandle>, Vec<AbortHandle>)> {
    let mut tasks = Vec::new();
    if !matches!(args.health_bind_address.as_str(), "0" | "") {
        let address = args.health_bind_address.as_str();
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("--health-bind-address {address}: cannot listen"))?;
        tracing::info!(address, "probe port listening");
        let probes = tokio::spawn(server::probes::serve(listener, shared.state.clone()));
        tasks.push(probes.abort_handle());
    }
    let ops = match args.metrics_bind_address.as_str() {
        "0" | "" => None,
        address => {
            let listener = TcpListener::bind(address)
                .with_context(|| format!("--metrics-bind-address {address}: cannot listen"))?;
            tracing::info!(
                address,
                debug = args.enable_debug_endpoints,
                "operations port listening"
            );
            let ops = server::ops::build(listener, shared.clone(), args.enable_debug_endpoints)?;
            let handle = ops.handle();
            tokio::spawn(ops);
            Some(handle)
        }
    };
    Ok((ops, tasks))
}

fn load_serving_pair(
    args: &ServeArgs,
    resolver: &CertResolver,
) -> anyhow::Result<Option<PairFiles>> {
    match (&args.tls_cert_file, &args.tls_key_file) {
        (Some(cert), Some(key)) => {
            let mut files = PairFiles::new(cert.clone(), key.clone());
            files
                .load(resolver)
                .context("--tls-cert-file/--tls-key-file")?;
            tracing::info!(cert = %cert.display(), "serving certificate loaded from files");
            return Ok(Some(files));
        }
        _ if args.state.is_none() => {
            tracing::info!("cluster mode: the serving certificate comes from Secret webhook-tls");
        }
        _ => {
            let hosts = vec![
                "localhost".to_owned(),
                "127.0.0.1".to_owned(),
                "::1".to_owned(),
            ];
            let pair = certs::self_signed(
                "koord-webhook",
                &hosts,
                Duration::from_secs(365 * 24 * 3600),
            )?;
            resolver.set_pem(pair.cert_pem.as_bytes(), pair.key_pem.as_bytes())?;
            tracing::warn!(
                ?hosts,
                "serving an in-memory self-signed certificate (no --tls-cert-file given)"
            );
        }
    }
    Ok(None)
}

//! Shared test support: an in-process admission server on an ephemeral port, and TLS clients that
//! report the certificate they were shown.

pub mod certs;
pub mod control_plane;
pub mod node;
pub mod operator;
pub mod review;
pub mod tls_client;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use koord_webhook::cache::Cache;
use koord_webhook::certs::{PemPair, self_signed};
use koord_webhook::features::FeatureGates;
use koord_webhook::server::{self, Limits, Shared};
use koord_webhook::state::State;
use koord_webhook::tls::CertResolver;

/// How many webhooks these entries of the table are registered as: an entry with a labelled part
/// is two (`--qos-split`, the default).
pub fn registered_webhooks<'a>(
    entries: impl IntoIterator<Item = &'a koord_webhook::entries::EntrySpec>,
) -> usize {
    entries
        .into_iter()
        .map(|entry| 1 + usize::from(entry.labelled_part.is_some()))
        .sum()
}

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A pod with one container whose requests and limits are `requests`.
pub fn pod(
    namespace: &str,
    name: &str,
    labels: serde_json::Value,
    requests: serde_json::Value,
) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox",
            "resources": {"requests": requests, "limits": requests}}]}}))
    .unwrap()
}

/// Asserts that the API server is the Kubernetes version the tests were asked for
/// (`KOORD_KUBERNETES`, the version matrix of docs/compatibility.md; 1.34 when unset): a matrix row
/// that ran on the wrong binaries says nothing.
pub async fn the_version_asked_for(client: &kube::Client) {
    let version = client.apiserver_version().await.unwrap();
    let asked = std::env::var("KOORD_KUBERNETES").unwrap_or_else(|_| "1.34".to_owned());
    assert_eq!(
        format!("{}.{}", version.major, version.minor),
        asked,
        "the API server is {}, not the version the tests were asked for",
        version.git_version
    );
    eprintln!("kube-apiserver {}", version.git_version);
}

/// Runs `script up DIR` (scripts/control-plane or scripts/cluster) with this process as the owner
/// its watchdog follows and `env` set, and returns the KUBECONFIG path it printed last.
pub fn start_cluster_script(
    script: &std::path::Path,
    dir: &std::path::Path,
    what: &str,
    env: &[(&str, &str)],
) -> PathBuf {
    let out = std::process::Command::new(script)
        .arg("up")
        .arg(dir)
        .env("KOORD_CP_OWNER_PID", std::process::id().to_string())
        .envs(env.iter().copied())
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("{} cannot run: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{what} did not start: {stdout}");
    stdout
        .lines()
        .last()
        .and_then(|l| l.strip_prefix("KUBECONFIG="))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no KUBECONFIG line in: {stdout}"))
}

/// The stdout of a kubectl run that must have succeeded (its output in the failure message).
pub fn succeeded(args: &[&str], out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A loopback port nothing listens on (for a child process to bind).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process that is killed and reaped when the test ends, panicking or not.
pub struct KillOnDrop(pub std::process::Child);

/// `koord-webhook serve` in file mode on 127.0.0.1:`port` (no operations or probe port): the
/// cluster from `state`, the serving pair from `cert` and `key`, then `extra` flags.
pub fn serve_files(
    port: u16,
    state: &std::path::Path,
    (cert, key): (&std::path::Path, &std::path::Path),
    extra: &[&str],
) -> KillOnDrop {
    KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
            .args([
                "serve",
                "--bind-address",
                "127.0.0.1",
                "--port",
                &port.to_string(),
            ])
            .args(["--metrics-bind-address", "0", "--health-bind-address", "0"])
            .arg("--state")
            .arg(state)
            .arg("--tls-cert-file")
            .arg(cert)
            .arg("--tls-key-file")
            .arg(key)
            .args(extra)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn new_pair(name: &str) -> PemPair {
    self_signed(
        name,
        &["localhost".into(), "127.0.0.1".into()],
        Duration::from_secs(3600),
    )
    .unwrap()
}

/// The value of `koord_webhook_admission_requests_total` for one path (0 before its first request).
pub fn requests_to(metrics: &str, path: &str) -> u64 {
    metric_sum(
        metrics,
        "koord_webhook_admission_requests_total",
        &[&format!("webhook=\"{path}\"")],
    )
}

/// The sum of the samples of `metric` (Prometheus text) whose labels include every one of `labels`.
pub fn metric_sum(metrics: &str, metric: &str, labels: &[&str]) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

pub struct TestServer {
    pub addr: SocketAddr,
    /// The plain-HTTP operations port (metrics, health, debug enabled).
    pub ops_addr: SocketAddr,
    ops_handle: actix_web::dev::ServerHandle,
    pub shared: Arc<Shared>,
    handle: actix_web::dev::ServerHandle,
}

impl TestServer {
    pub async fn start(cache: Cache, gates: FeatureGates) -> Self {
        Self::start_with(cache, gates, Limits::default()).await
    }

    pub async fn start_with(cache: Cache, gates: FeatureGates, limits: Limits) -> Self {
        koord_webhook::tls::install_default_provider();
        let resolver = Arc::new(CertResolver::new());
        let pair = new_pair("first");
        resolver
            .set_pem(pair.cert_pem.as_bytes(), pair.key_pem.as_bytes())
            .unwrap();
        // Built as `serve` builds it.
        let state = Arc::new(State::new(cache, resolver));
        let admission = koord_webhook::admission::Admission::new(
            state.cache.clone(),
            gates,
            state.metrics.clone(),
        );
        let shared = Arc::new(Shared::new(state, admission, limits));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = server::build(listener, shared.clone()).unwrap();
        let handle = server.handle();
        tokio::spawn(server);
        let ops_listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ops_addr = ops_listener.local_addr().unwrap();
        let ops = server::ops::build(ops_listener, shared.clone(), true).unwrap();
        let ops_handle = ops.handle();
        tokio::spawn(ops);
        Self {
            addr,
            ops_addr,
            ops_handle,
            shared,
            handle,
        }
    }

    pub async fn stop(self) {
        self.handle.stop(true).await;
        self.ops_handle.stop(true).await;
    }
}

/// From the API server's `/metrics`: per webhook entry whose name ends with `suffix`, how many
/// calls it made (`apiserver_admission_webhook_admission_duration_seconds_count`, every operation
/// and outcome) and how many failed open (`apiserver_admission_webhook_fail_open_count`: an error
/// that `failurePolicy: Ignore` hid, such as a response the API server could not take).
pub fn webhook_calls(
    metrics: &str,
    suffix: &str,
) -> std::collections::BTreeMap<String, (u64, u64)> {
    let mut out = std::collections::BTreeMap::<String, (u64, u64)>::new();
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let calls =
            line.starts_with("apiserver_admission_webhook_admission_duration_seconds_count{");
        let failed = line.starts_with("apiserver_admission_webhook_fail_open_count{");
        let Some(name) = line
            .split("name=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .filter(|name| (calls || failed) && name.ends_with(suffix))
        else {
            continue;
        };
        let value = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0) as u64;
        let entry = out.entry(name.to_owned()).or_default();
        if calls {
            entry.0 += value;
        } else {
            entry.1 += value;
        }
    }
    out
}

//! `koord-webhook serve` in cluster mode against a test control plane, with exactly the RBAC of
//! `manifests/`: the install file is applied, and the operator's kubeconfig impersonates its
//! ServiceAccount.

use std::net::SocketAddr;

use super::free_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

use super::control_plane::ControlPlane;
use super::tls_client::{Proto, connect, connect_plain};

pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:koordinator-system:koord-webhook";

/// Applies `manifests/install.yaml` (namespace, CRDs, RBAC, webhook configurations, ...).
pub fn install(cp: &ControlPlane) {
    apply_established(cp, "manifests/install.yaml");
}

/// Server-side applies a file or folder of the repository and waits until its CRDs are served.
pub fn apply_established(cp: &ControlPlane, relative: &str) {
    let path = format!("{}/{relative}", env!("CARGO_MANIFEST_DIR"));
    cp.kubectl_ok(&["apply", "--server-side", "-f", &path], None);
    cp.kubectl_ok(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "--all",
        ],
        None,
    );
}

/// A copy of the admin kubeconfig that acts as the operator's ServiceAccount.
pub fn impersonating_kubeconfig(cp: &ControlPlane, dir: &Path) -> PathBuf {
    kubeconfig_as(cp, dir, SERVICE_ACCOUNT, "operator.kubeconfig")
}

/// A copy of the admin kubeconfig, written to `dir/file`, that acts as `user`.
pub fn kubeconfig_as(cp: &ControlPlane, dir: &Path, user: &str, file: &str) -> PathBuf {
    let text = std::fs::read_to_string(&cp.kubeconfig).unwrap();
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    for entry in config["users"].as_sequence_mut().unwrap() {
        entry["user"]["as"] = serde_yaml::Value::from(user);
    }
    let path = dir.join(file);
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    path
}

pub struct Operator {
    child: Child,
    pub addr: SocketAddr,
    /// The plain-HTTP operations port (`/metrics`).
    pub ops_addr: SocketAddr,
    pub log: PathBuf,
}

impl Operator {
    /// Starts `serve` on a free port, calling itself at 127.0.0.1 (URL mode).
    pub fn start(kubeconfig: &Path, dir: &Path, name: &str, args: &[&str]) -> Self {
        let port = free_port();
        let ops_port = free_port();
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
            .args([
                "serve",
                "--bind-address",
                "127.0.0.1",
                "--port",
                &port.to_string(),
            ])
            .args(["--webhook-host", "127.0.0.1", "--identity", name])
            .args(["--metrics-bind-address", &format!("127.0.0.1:{ops_port}")])
            .args(["--health-bind-address", "0"])
            .args(if args.contains(&"--drain-delay") {
                &[][..]
            } else {
                &["--drain-delay", "1s"][..]
            })
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap();
        Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            ops_addr: SocketAddr::from(([127, 0, 0, 1], ops_port)),
            log,
        }
    }

    /// `/readyz`: status and body (status 0 when the server does not answer).
    pub async fn readyz(&self) -> (u16, String) {
        match connect(self.addr, Proto::Http1).await {
            Ok(mut conn) => match conn.send("GET", "/readyz", Vec::new()).await {
                Ok((status, body)) => {
                    (status.as_u16(), String::from_utf8_lossy(&body).into_owned())
                }
                Err(e) => (0, e.to_string()),
            },
            Err(e) => (0, e.to_string()),
        }
    }

    pub async fn metrics(&self) -> String {
        let mut conn = connect_plain(self.ops_addr).await.unwrap();
        String::from_utf8_lossy(&conn.get("/metrics").await.1).into_owned()
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&self, within: Duration) {
        let start = Instant::now();
        loop {
            let (status, body) = self.readyz().await;
            if status == 200 {
                return;
            }
            assert!(
                start.elapsed() < within,
                "not ready after {within:?}: {status} {body}\nlog:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, and the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal_term();
        self.child.wait().unwrap()
    }

    /// Sends SIGTERM without waiting.
    pub fn signal_term(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }

    /// Waits for the process to exit.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A control plane with koord-webhook installed, and the operator's impersonating kubeconfig.
pub struct Cluster {
    pub cp: ControlPlane,
    pub client: kube::Client,
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
}

impl Cluster {
    pub async fn start() -> Self {
        Self::start_with("").await
    }

    /// A cluster whose kube-apiserver also gets `apiserver_args` (space-separated flags).
    pub async fn start_with(apiserver_args: &str) -> Self {
        let cp = ControlPlane::start_with(apiserver_args);
        install(&cp);
        let client = cp.client().await;
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = impersonating_kubeconfig(&cp, dir.path());
        Self {
            cp,
            client,
            dir,
            kubeconfig,
        }
    }

    /// Starts the operator with this cluster's kubeconfig.
    pub fn operator(&self, name: &str, args: &[&str]) -> Operator {
        Operator::start(&self.kubeconfig, self.dir.path(), name, args)
    }
}

/// Pods created (server-side dry run) in `default` through the API server, in a loop until stopped.
pub struct Load {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(usize, Vec<String>)>,
}

impl Load {
    pub fn start(client: kube::Client) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let pods: Api<Pod> = Api::namespaced(client, "default");
            let params = PostParams {
                dry_run: true,
                ..Default::default()
            };
            let (mut ok, mut failures, mut i) = (0, Vec::new(), 0usize);
            while !flag.load(Ordering::Relaxed) {
                i += 1;
                let pod: Pod = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("load-{i}")},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
                .unwrap();
                match pods.create(&params, &pod).await {
                    Ok(_) => ok += 1,
                    Err(e) => failures.push(e.to_string()),
                }
            }
            (ok, failures)
        });
        Self { stop, task }
    }

    /// Stops the loop: the requests that succeeded, and the errors of those that failed.
    pub async fn stop(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// Polls `check` until it returns `Some`, or fails after `within` with `what`.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            start.elapsed() < within,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Through the API server, with `tests/fixtures/colocation/spark.yaml` applied: a matching pod
/// becomes a BE batch pod (priority, scheduler, batch resources), and a BE pod with a koord-prod
/// priority is denied with Koordinator's message. `within`: how long the profile may take to reach
/// the cache of every replica that answers.
pub async fn colocation_and_qos_rules_apply(client: &kube::Client, within: Duration) {
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), "spark");
    let spark = super::pod(
        "spark",
        "spark-0",
        serde_json::json!({"app": "spark"}),
        serde_json::json!({"cpu": "1", "memory": "1Gi"}),
    );
    let created = eventually(within, "the profile to apply", || async {
        let p = pods.create(&dry_run, &spark).await.ok()?;
        let labels = p.metadata.labels.clone().unwrap_or_default();
        (labels.get("koordinator.sh/qosClass").map(String::as_str) == Some("BE")).then_some(p)
    })
    .await;
    let spec = created.spec.unwrap();
    assert_eq!(spec.scheduler_name.as_deref(), Some("koord-scheduler"));
    assert_eq!(spec.priority, Some(5500));
    let requests = spec.containers[0]
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap();
    assert_eq!(requests["kubernetes.io/batch-cpu"].0, "1k");
    assert!(!requests.contains_key("cpu"));

    // QoS BE with a koord-prod priority class is rejected with the spec's message.
    let be_prod = super::pod(
        "default",
        "be-prod",
        serde_json::json!({"koordinator.sh/qosClass": "BE", "koordinator.sh/priority-class": "koord-prod"}),
        serde_json::json!({}),
    );
    let err = Api::<Pod>::namespaced(client.clone(), "default")
        .create(&dry_run, &be_prod)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "koordinator.sh/qosClass=BE and priorityClass=koord-prod cannot be used in combination"
        ),
        "{err}"
    );
}

/// The addresses the ElasticQuota ledger's record in `namespace` names as the API server's
/// (`api-servers`, written by the replicas' probes), once it names one, waiting up to `within`.
pub async fn proven_api_servers(
    client: &kube::Client,
    namespace: &str,
    within: Duration,
) -> Vec<String> {
    let config_maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client.clone(), namespace);
    eventually(
        within,
        "the ledger's record names the API server",
        || async {
            let record = config_maps
                .get_opt(koord_webhook::names::QUOTA_LEDGER)
                .await
                .ok()??;
            let proven = record.data?.get("api-servers")?.clone();
            let proven: std::collections::BTreeMap<String, i64> =
                serde_json::from_str(&proven).ok()?;
            (!proven.is_empty()).then(|| proven.into_keys().collect::<Vec<_>>())
        },
    )
    .await
}

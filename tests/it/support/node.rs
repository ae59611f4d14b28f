//! A real one-node Kubernetes cluster for one test, started through `scripts/cluster` inside a
//! network namespace of its own, with koord-webhook's image loaded into its containerd.
//!
//! Every address is inside that namespace. The test talks to the API server from there: kubectl runs
//! through `scripts/cluster exec`, and [`Node::client`] moves the calling thread into the namespace
//! first (so use it from a current-thread tokio test: every socket the runtime opens is then inside).
//! Drop takes the cluster down (also when the test panics, after printing what helps to see why); if
//! the test process is killed instead, the script's watchdog does.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};

use super::certs::{MUTATING, VALIDATING};
use super::operator::eventually;

pub const NAMESPACE: &str = "koordinator-system";
pub const NODE_NAME: &str = "koord-node";

pub struct Node {
    dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The image `manifests/install.yaml` names, and the archive `scripts/image` built it into.
pub fn image() -> (String, PathBuf) {
    let version = env!("CARGO_PKG_VERSION");
    let archive = repo(&format!("target/image/koord-webhook-{version}.oci.tar"));
    assert!(
        archive.is_file(),
        "{} is missing: scripts/test builds it (scripts/image) before the tests",
        archive.display()
    );
    (koord_webhook::install::DEFAULT_IMAGE.to_owned(), archive)
}

impl Node {
    /// Starts the cluster (about 20 s once the binaries are built) and loads the image.
    pub fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("node-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temporary directory");
        let kubeconfig = super::start_cluster_script(
            &repo("scripts/cluster"),
            dir.path(),
            "the one-node cluster (scripts/cluster up; it needs root)",
            &[],
        );
        let node = Self { dir, kubeconfig };
        let (name, archive) = image();
        node.load_image(&archive, &name);
        node
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Imports an OCI archive into the node's containerd under `name`.
    pub fn load_image(&self, archive: &Path, name: &str) {
        let status = std::process::Command::new(repo("scripts/cluster"))
            .arg("load")
            .arg(self.dir.path())
            .arg(archive)
            .arg(name)
            .status()
            .expect("scripts/cluster runs");
        assert!(status.success(), "loading {name} into the node failed");
    }

    /// Stops kube-apiserver and starts it again; returns once its /readyz answers.
    pub async fn restart_apiserver(&self) {
        self.cluster_script(&["restart-apiserver"], "restarting kube-apiserver")
            .await;
    }

    /// Replaces the cluster's Kubernetes by `version`'s in place, API server first, then the node
    /// (`scripts/cluster upgrade`); returns its log.
    pub async fn upgrade_kubernetes(&self, version: &str) -> String {
        self.cluster_script(&["upgrade", version], "upgrading Kubernetes")
            .await
    }

    /// Runs `scripts/cluster ARG0 DIR ARGS...` on this cluster; its standard error.
    async fn cluster_script(&self, args: &[&str], what: &str) -> String {
        let out = tokio::process::Command::new(repo("scripts/cluster"))
            .arg(args[0])
            .arg(self.dir.path())
            .args(&args[1..])
            .output()
            .await
            .expect("scripts/cluster runs");
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{what} failed: {log}");
        log
    }

    /// A kube client from inside the namespace. Moves the calling thread there for good.
    pub async fn client(&self) -> kube::Client {
        let netns = std::fs::read_to_string(self.dir.path().join("netns")).unwrap();
        let file = std::fs::File::open(format!("/run/netns/{}", netns.trim())).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .expect("entering the cluster's network namespace (needs root)");
        koord_webhook::tls::install_default_provider();
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        config.read_timeout = Some(Duration::from_secs(30));
        kube::Client::try_from(config).unwrap()
    }

    /// Runs a command inside the namespace with KUBECONFIG set; `stdin` piped in when given.
    pub async fn exec(&self, command: &[&str], stdin: Option<&str>) -> Output {
        use tokio::io::AsyncWriteExt;
        let mut child = tokio::process::Command::new(repo("scripts/cluster"))
            .arg("exec")
            .arg(self.dir.path())
            .args(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("scripts/cluster runs");
        let mut input = child.stdin.take().unwrap();
        input
            .write_all(stdin.unwrap_or_default().as_bytes())
            .await
            .unwrap();
        drop(input);
        child.wait_with_output().await.unwrap()
    }

    pub async fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let command: Vec<&str> = std::iter::once("kubectl")
            .chain(args.iter().copied())
            .collect();
        self.exec(&command, stdin).await
    }

    /// kubectl that must succeed; returns its stdout.
    pub async fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl(args, stdin).await;
        super::succeeded(args, &out)
    }

    /// Runs this build's `koord-webhook` with `args` inside the namespace.
    pub async fn koord_webhook(&self, args: &[&str]) -> Output {
        let command: Vec<&str> = std::iter::once(env!("CARGO_BIN_EXE_koord-webhook"))
            .chain(args.iter().copied())
            .collect();
        self.exec(&command, None).await
    }

    /// `koord-webhook status --wait` in `namespace` passes, with both replicas behind the Service.
    pub async fn wait_healthy(&self, namespace: &str) {
        let out = self
            .koord_webhook(&[
                "status",
                "--namespace",
                namespace,
                "--wait",
                "--timeout",
                "2m",
                "-o",
                "json",
            ])
            .await;
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        assert_eq!(
            out.status.code(),
            Some(0),
            "healthy in {namespace}: {status} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(status["readyEndpoints"], 2, "{status}");
    }

    /// Applies the repository's install file as the README says, unchanged.
    pub async fn install(&self) -> Output {
        let path = repo("manifests/install.yaml");
        self.kubectl(
            &["apply", "--server-side", "-f", path.to_str().unwrap()],
            None,
        )
        .await
    }

    /// The README's install (`kubectl apply --server-side -f manifests/install.yaml`, the file
    /// unchanged) passes and rolls out; then the spark colocation profile
    /// (`tests/fixtures/colocation/spark.yaml`) is applied.
    pub async fn install_with_the_spark_profile(&self) {
        let out = self.install().await;
        assert!(
            out.status.success(),
            "kubectl apply --server-side -f manifests/install.yaml failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.wait_rolled_out(Duration::from_secs(180)).await;
        let profile = super::fixture("colocation/spark.yaml");
        self.kubectl_ok(
            &["apply", "--server-side", "-f", profile.to_str().unwrap()],
            None,
        )
        .await;
    }

    /// Waits until the Deployment has rolled out `replicas` Ready Pods of the current template.
    pub async fn wait_rolled_out(&self, within: Duration) {
        self.kubectl_ok(
            &[
                "-n",
                NAMESPACE,
                "rollout",
                "status",
                "deployment/koord-webhook",
                &format!("--timeout={}s", within.as_secs()),
            ],
            None,
        )
        .await;
    }

    /// What helps to see why a test failed: the operator's Pods, their logs, the components' logs.
    fn report(&self) {
        let dir = self.dir.path();
        let run = |args: &[&str]| {
            std::process::Command::new(repo("scripts/cluster"))
                .arg("exec")
                .arg(dir)
                .args(args)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        eprintln!(
            "--- pods\n{}",
            run(&["kubectl", "get", "pods", "-A", "-o", "wide"])
        );
        eprintln!(
            "--- koord-webhook logs\n{}",
            run(&[
                "kubectl",
                "-n",
                NAMESPACE,
                "logs",
                "-l",
                "app.kubernetes.io/name=koord-webhook",
                "--tail=30",
                "--prefix"
            ])
        );
        for component in ["kubelet", "kube-apiserver", "containerd"] {
            let log = std::fs::read_to_string(dir.join(format!("logs/{component}.log")))
                .unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            eprintln!(
                "--- {component} (last lines)\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.report();
        }
        let _ = std::process::Command::new(repo("scripts/cluster"))
            .arg("down")
            .arg(self.dir.path())
            .status();
    }
}

/// Dry-run pod creates through the API server at a steady rate, each one counted: the client-side
/// view of whether admission kept working.
pub struct SteadyLoad {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl SteadyLoad {
    /// Plain pods (no profile selects them): admitted unchanged.
    pub fn start(client: kube::Client, namespace: &str, per_second: u32) -> Self {
        Self::start_with(client, namespace, per_second, serde_json::json!({}), None)
    }

    /// Koordinator pods: `app=spark` pods in the `spark` namespace, which
    /// `tests/fixtures/colocation/spark.yaml` turns into BE pods; one admitted without that
    /// mutation counts as failed too.
    pub fn start_colocated(client: kube::Client, per_second: u32) -> Self {
        Self::start_with(
            client,
            "spark",
            per_second,
            serde_json::json!({"app": "spark"}),
            Some(("koordinator.sh/qosClass", "BE")),
        )
    }

    fn start_with(
        client: kube::Client,
        namespace: &str,
        per_second: u32,
        labels: serde_json::Value,
        expect: Option<(&'static str, &'static str)>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let (flag, count) = (stop.clone(), sent.clone());
        let pods: Api<Pod> = Api::namespaced(client, namespace);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut requests = tokio::task::JoinSet::new();
            let mut i = 0usize;
            while !flag.load(Ordering::Relaxed) {
                tick.tick().await;
                i += 1;
                count.fetch_add(1, Ordering::Relaxed);
                let pods = pods.clone();
                let labels = labels.clone();
                requests.spawn(async move {
                    let pod: Pod = serde_json::from_value(serde_json::json!({
                        "metadata": {"name": format!("steady-{i}"), "labels": labels},
                        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
                    .unwrap();
                    let params = PostParams {
                        dry_run: true,
                        ..Default::default()
                    };
                    let created = match pods.create(&params, &pod).await {
                        Ok(created) => created,
                        Err(e) => return Some(e.to_string()),
                    };
                    let (key, value) = expect?;
                    let labels = created.metadata.labels.unwrap_or_default();
                    (labels.get(key).map(String::as_str) != Some(value))
                        .then(|| format!("steady-{i} admitted without {key}={value}"))
                });
            }
            let mut failures = Vec::new();
            while let Some(done) = requests.join_next().await {
                if let Some(error) = done.unwrap() {
                    failures.push(error);
                }
            }
            failures
        });
        Self { stop, sent, task }
    }

    /// Stops the load: how many creates were sent, and the errors of those that failed.
    pub async fn stop(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let failures = self.task.await.unwrap();
        (self.sent.load(Ordering::Relaxed), failures)
    }
}

pub async fn leader(client: &kube::Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    leases
        .get_opt("koord-webhook")
        .await
        .ok()??
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

pub async fn replicas(client: &kube::Client) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    pods.list(&ListParams::default().labels("app.kubernetes.io/name=koord-webhook"))
        .await
        .unwrap()
        .items
}

pub fn ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until the leader has written conditions on both pod entries.
pub async fn pod_entries_narrowed(client: &kube::Client) {
    let m: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let v: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    eventually(
        Duration::from_secs(300),
        "the leader to narrow both pod entries (--narrow-hold after the last roll)",
        || async {
            let narrowed = |entries: Vec<(String, usize)>, name: &str| {
                entries.iter().any(|(n, c)| n == name && *c > 0)
            };
            let count = |w: Option<Vec<(String, usize)>>| w.unwrap_or_default();
            let mutating = m.get(MUTATING).await.ok()?.webhooks.map(|w| {
                w.into_iter()
                    .map(|e| (e.name, e.match_conditions.unwrap_or_default().len()))
                    .collect()
            });
            let validating = v.get(VALIDATING).await.ok()?.webhooks.map(|w| {
                w.into_iter()
                    .map(|e| (e.name, e.match_conditions.unwrap_or_default().len()))
                    .collect()
            });
            (narrowed(count(mutating), "mpod-create.koordinator.sh")
                && narrowed(count(validating), "vpod.koordinator.sh"))
            .then_some(())
        },
    )
    .await;
}

//! A real kube-apiserver and etcd for one test, started through `scripts/control-plane`.
//!
//! Each instance has its own directory and ports, so test binaries run theirs side by side. Drop
//! stops it (also when the test panics); if the test process is killed instead, the script's
//! watchdog stops it when this process is gone.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

pub struct ControlPlane {
    dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/control-plane")
}

impl ControlPlane {
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// A control plane whose kube-apiserver also gets `apiserver_args` (space-separated flags).
    pub fn start_with(apiserver_args: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("koord-cp-")
            .tempdir()
            .expect("temporary directory");
        let env = [("KOORD_CP_APISERVER_ARGS", apiserver_args)];
        let kubeconfig = super::start_cluster_script(&script(), dir.path(), "control plane", &env);
        Self { dir, kubeconfig }
    }

    /// The text of kube-apiserver's own `/metrics`.
    pub async fn apiserver_metrics(&self) -> String {
        let client = self.client().await;
        let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
        client
            .request_text(request)
            .await
            .expect("kube-apiserver serves /metrics")
    }

    pub async fn client(&self) -> kube::Client {
        koord_webhook::tls::install_default_provider();
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    /// Stops kube-apiserver and starts it again (same port, same etcd): SIGTERM, and SIGKILL 10 s
    /// later if it still serves its open watches (every watch relists from the new server).
    pub fn restart_apiserver(&self) {
        self.restart_apiserver_within(Duration::from_secs(10));
    }

    /// The same, letting kube-apiserver end its open watches itself (about a minute, 63 s measured):
    /// the shape of restart that found the readiness bug of
    /// `cache_watch::a_replica_is_ready_again_once_its_watches_resume_after_an_api_server_restart`.
    pub fn restart_apiserver_gracefully(&self) {
        self.restart_apiserver_within(Duration::from_secs(120));
    }

    fn restart_apiserver_within(&self, grace: Duration) {
        let status = Command::new(script())
            .arg("restart-apiserver")
            .arg(self.dir.path())
            .env("KOORD_CP_STOP_GRACE", grace.as_secs().to_string())
            .status()
            .expect("scripts/control-plane runs");
        assert!(status.success(), "kube-apiserver did not restart");
    }

    /// Runs kubectl against this control plane, with `stdin` piped in when given.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl is installed");
        let mut input = child.stdin.take().unwrap();
        input
            .write_all(stdin.unwrap_or_default().as_bytes())
            .unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    }

    /// kubectl that must succeed; returns its stdout.
    pub fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl(args, stdin);
        super::succeeded(args, &out)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .arg("down")
            .arg(self.dir.path())
            .status();
    }
}

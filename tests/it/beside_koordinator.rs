//! koord-webhook beside Koordinator v1.8.0's own koord-manager and koord-scheduler (built from Go
//! modules by `koordinator/build components`, installed from `koordinator/manifests/`) on a real
//! one-node cluster: the README's migration from koord-manager's webhook under a steady load of pod
//! creates, every admission counted; then the components working with what koord-webhook admits;
//! then the way back to koord-manager's webhook, counted the same way.

use crate::support;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use support::node::{NAMESPACE, NODE_NAME, Node};
use support::operator::eventually;

const KOORDINATOR_INSTALL: &str = "koordinator/manifests/koordinator.yaml";
const KOORDINATOR_CONFIGURATIONS: &str = "koordinator/manifests/webhook-configurations.yaml";
const INSTALL: &str = "manifests/install.yaml";
/// The migration's first apply: everything of koord-webhook but its Service.
const ALL_BUT_THE_SERVICE: &str = "app.kubernetes.io/component!=webhook-service";
/// The calls that may fail while koord-manager's webhook server shuts down (step 3), and only as a
/// connection it closed under the API server (docs/migration.md: its HTTP/1.1 server closes the
/// keep-alive connections the API server is about to reuse, and the API server does not retry a
/// POST). Their number depends on the machine's scheduling latency, not on koord-webhook: the test
/// requires them to come from one shutdown, all within ONE_SHUTDOWN of each other, and at most
/// one per connection the API server may hold to the Service (client-go keeps up to 25 idle per
/// host). Every other failure fails the test.
const ONE_SHUTDOWN: Duration = Duration::from_secs(1);
const CONNECTIONS_HELD: usize = 25;
const CLOSED_UNDER_THE_API_SERVER: &[&str] = &["EOF", "broken pipe", "connection reset"];
/// Seen once in seven ways back, while the Service moved back to koord-manager (not yet explained:
/// docs/migration.md); allowed in that step only, from one instant as above, and counted.
const NO_ENDPOINTS: &[&str] = &["no endpoints available"];
const MANAGER_WEBHOOK_ON: &str = "--feature-gates=WebhookFramework=true";
const MANAGER_WEBHOOK_OFF: &str = "--feature-gates=WebhookFramework=false";

fn repo(path: &str) -> String {
    format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))
}

/// Builds (or finds cached) koord-manager's and koord-scheduler's images and Koordinator's CRDs.
fn components() -> PathBuf {
    let out = std::process::Command::new(repo("koordinator/build"))
        .arg("components")
        .output()
        .expect("koordinator/build runs");
    assert!(
        out.status.success(),
        "koordinator/build components failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// `kubectl apply --server-side` of `path`, with `extra` arguments (`--force-conflicts`, `-l ...`).
async fn apply(node: &Node, path: &str, extra: &[&str]) {
    let args: Vec<&str> = ["apply", "--server-side", "-f", path]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    node.kubectl_ok(&args, None).await;
}

/// What a client saw of admission while the load ran.
#[derive(Debug, Default)]
struct Counts {
    plain_sent: usize,
    koordinator_sent: usize,
    failed: Vec<(Instant, String)>,
    /// Koordinator pods (the spark profile selects them) admitted without the profile's mutation.
    unmutated: Vec<String>,
}

/// Dry-run pod creates through the API server, half plain pods in `default`, half pods the spark
/// ClusterColocationProfile selects; each answer checked.
struct AdmissionLoad {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Counts>,
}

impl AdmissionLoad {
    fn start(client: kube::Client, per_second: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut requests = tokio::task::JoinSet::new();
            let mut i = 0usize;
            let mut counts = Counts::default();
            while !flag.load(Ordering::Relaxed) {
                tick.tick().await;
                i += 1;
                let koordinator = i.is_multiple_of(2);
                let (namespace, labels) = match koordinator {
                    true => ("spark", json!({"app": "spark"})),
                    false => ("default", json!({})),
                };
                if koordinator {
                    counts.koordinator_sent += 1;
                } else {
                    counts.plain_sent += 1;
                }
                let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
                let pod = support::pod(namespace, &format!("load-{i}"), labels, json!({}));
                requests.spawn(async move {
                    let params = PostParams {
                        dry_run: true,
                        ..Default::default()
                    };
                    match pods.create(&params, &pod).await {
                        Err(e) => Err((Instant::now(), format!("{namespace}/load-{i}: {e}"))),
                        Ok(created) => Ok((!koordinator || mutated(&created))
                            .then_some(())
                            .ok_or(format!("{namespace}/load-{i} admitted unmutated"))),
                    }
                });
            }
            while let Some(done) = requests.join_next().await {
                match done.unwrap() {
                    Err(failure) => counts.failed.push(failure),
                    Ok(Err(unmutated)) => counts.unmutated.push(unmutated),
                    Ok(Ok(())) => {}
                }
            }
            counts
        });
        Self { stop, task }
    }

    /// Stops the load 3 s after the steps that began at `started`; prints the counts of `phase`
    /// and asserts that no Koordinator pod went unmutated and no admission failed, but for the
    /// failures of the named kinds within `window` that one shutdown explains (docs/migration.md).
    async fn stop_after(
        self,
        started: Instant,
        phase: &str,
        window: Option<(std::ops::Range<Instant>, &[&str])>,
    ) -> Counts {
        let took = started.elapsed();
        tokio::time::sleep(Duration::from_secs(3)).await;
        self.stop.store(true, Ordering::Relaxed);
        let counts = self.task.await.unwrap();
        eprintln!(
            "{phase}: {} plain and {} Koordinator pod creates; failed {}, admitted unmutated {}; steps took {:.1} s",
            counts.plain_sent,
            counts.koordinator_sent,
            counts.failed.len(),
            counts.unmutated.len(),
            took.as_secs_f64()
        );
        let (raced, other): (Vec<_>, Vec<_>) = counts.failed.iter().partition(|(at, error)| {
            window.as_ref().is_some_and(|(during, kinds)| {
                during.contains(at) && kinds.iter().any(|kind| error.contains(kind))
            })
        });
        eprintln!("{phase}: failed within the allowed window: {raced:?}");
        assert!(other.is_empty(), "{phase}, failed: {other:?}");
        let times = || raced.iter().map(|(at, _)| *at);
        let span = match (times().min(), times().max()) {
            (Some(first), Some(last)) => last - first,
            _ => Duration::ZERO,
        };
        assert!(
            raced.len() <= CONNECTIONS_HELD && span <= ONE_SHUTDOWN,
            "{phase}: {} failed over {span:?}, more than one shutdown: {raced:?}",
            raced.len()
        );
        assert!(
            counts.unmutated.is_empty(),
            "{phase}, unmutated: {:?}",
            counts.unmutated
        );
        counts
    }
}

/// The spark profile's mutation: BE QoS label and koord-scheduler.
fn mutated(pod: &Pod) -> bool {
    let qos = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("koordinator.sh/qosClass"));
    let scheduler = pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref());
    qos.map(String::as_str) == Some("BE") && scheduler == Some("koord-scheduler")
}

/// A dry-run spark pod comes back mutated (by whichever webhook serves).
async fn profile_applies(client: &kube::Client) -> bool {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "spark");
    let pod = support::pod("spark", "probe", json!({"app": "spark"}), json!({}));
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    matches!(pods.create(&params, &pod).await, Ok(p) if mutated(&p))
}

/// The last log lines of a Koordinator component: a component that does not start fails the test
/// with its own words.
async fn component_log(node: &Node, deployment: &str) -> String {
    let out = node
        .kubectl(
            &[
                "-n",
                NAMESPACE,
                "logs",
                &format!("deployment/{deployment}"),
                "--tail=20",
            ],
            None,
        )
        .await;
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

async fn rolled_out(node: &Node, deployment: &str, within: Duration) {
    rolled_out_in(node, NAMESPACE, deployment, within).await
}

async fn rolled_out_in(node: &Node, namespace: &str, deployment: &str, within: Duration) {
    let out = node
        .kubectl(
            &[
                "-n",
                namespace,
                "rollout",
                "status",
                &format!("deployment/{deployment}"),
                &format!("--timeout={}s", within.as_secs()),
            ],
            None,
        )
        .await;
    assert!(
        out.status.success(),
        "{deployment} did not roll out: {}\n--- its log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        component_log(node, deployment).await
    );
}

/// The node koord-scheduler binds pod `name` to within `within`; otherwise fails with its reason.
async fn bound_within(pods: &Api<Pod>, name: &str, within: Duration) -> String {
    let since = Instant::now();
    loop {
        let pod = pods.get(name).await.unwrap();
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            return node;
        }
        let conditions = pod.status.and_then(|s| s.conditions).unwrap_or_default();
        assert!(
            since.elapsed() < within,
            "{name} not bound after {within:?}: {:?}",
            conditions
                .iter()
                .map(|c| (&c.type_, &c.reason, &c.message))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A quantity in millicores (the crate's own quantity arithmetic).
fn millicores(quantity: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> u64 {
    let qty = koord_webhook::resources::quantity::Qty::try_from(quantity).unwrap();
    u64::try_from(qty.milli()).unwrap()
}

/// koord-manager's webhook on or off: its feature gate, as a user changes it (a JSON patch that
/// first checks the argument it replaces).
async fn manager_webhook(node: &Node, on: bool) {
    let (from, to) = match on {
        true => (MANAGER_WEBHOOK_OFF, MANAGER_WEBHOOK_ON),
        false => (MANAGER_WEBHOOK_ON, MANAGER_WEBHOOK_OFF),
    };
    let path = "/spec/template/spec/containers/0/args/5";
    // Without its webhook koord-manager serves no health path: ready once its metrics port listens.
    let probe = match on {
        true => json!({"httpGet": {"path": "/readyz", "port": 8000}, "periodSeconds": 2}),
        false => json!({"tcpSocket": {"port": 8080}, "periodSeconds": 2}),
    };
    let patch = json!([
        {"op": "test", "path": path, "value": from},
        {"op": "replace", "path": path, "value": to},
        {"op": "replace", "path": "/spec/template/spec/containers/0/readinessProbe", "value": probe},
    ]);
    node.kubectl_ok(
        &[
            "-n",
            NAMESPACE,
            "patch",
            "deployment/koord-manager",
            "--type=json",
            "-p",
            &patch.to_string(),
        ],
        None,
    )
    .await;
    rolled_out(node, "koord-manager", Duration::from_secs(120)).await;
    // `rollout status` returns while the old Pod still terminates; its server closes the
    // connections the API server reuses until it has stopped, which is part of this step.
    old_pods_gone(node, "koord-app=koord-manager", Duration::from_secs(60)).await;
}

/// Waits until no Pod of `selector` is terminating.
async fn old_pods_gone(node: &Node, selector: &str, within: Duration) {
    eventually(within, "the old Pods stopped", || async {
        let terminating = node
            .kubectl_ok(
                &[
                    "-n",
                    NAMESPACE,
                    "get",
                    "pods",
                    "-l",
                    selector,
                    "-o",
                    "jsonpath={.items[*].metadata.deletionTimestamp}",
                ],
                None,
            )
            .await;
        terminating.trim().is_empty().then_some(())
    })
    .await;
}

/// The Service's selector names whose Pods serve admission.
async fn service_selector(node: &Node) -> String {
    node.kubectl_ok(
        &[
            "-n",
            NAMESPACE,
            "get",
            "service/koordinator-webhook-service",
            "-o",
            "jsonpath={.spec.selector}",
        ],
        None,
    )
    .await
}

#[tokio::test(flavor = "current_thread")]
async fn migrates_from_koord_manager_and_back_under_load() {
    let built = components();
    let node = Node::start();
    for component in ["koord-manager", "koord-scheduler"] {
        node.load_image(
            &built.join(format!("images/{component}.oci.tar")),
            &format!("localhost/{component}:v1.8.0"),
        );
    }
    let client = node.client().await;

    // --- Koordinator as a user runs it: its CRDs, koord-manager with its webhook, koord-scheduler.
    let crds = built.join("crds");
    apply(&node, crds.to_str().unwrap(), &[]).await;
    for file in [KOORDINATOR_INSTALL, KOORDINATOR_CONFIGURATIONS] {
        apply(&node, &repo(file), &[]).await;
    }
    rolled_out(&node, "koord-manager", Duration::from_secs(120)).await;
    rolled_out(&node, "koord-scheduler", Duration::from_secs(120)).await;
    let profile = support::fixture("colocation/spark.yaml");
    apply(&node, profile.to_str().unwrap(), &[]).await;
    eventually(
        Duration::from_secs(60),
        "koord-manager's webhook mutating a spark pod",
        || async { profile_applies(&client).await.then_some(()) },
    )
    .await;

    // --- Step 0 of the README: a trial beside koord-manager's webhook.
    shadow_trial(&node, &client).await;

    // --- The migration, the README's steps under load.
    let load = AdmissionLoad::start(client.clone(), 20);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = Instant::now();
    // 1. koord-webhook beside koord-manager, all but the Service; it takes over koord-manager's CA.
    let take_over = ["--force-conflicts"];
    apply(
        &node,
        &repo(INSTALL),
        &["--force-conflicts", "-l", ALL_BUT_THE_SERVICE],
    )
    .await;
    rolled_out(&node, "koord-webhook", Duration::from_secs(180)).await;
    // 2. The Service moves to koord-webhook's ready replicas.
    apply(&node, &repo(INSTALL), &take_over).await;
    // 3. koord-manager's webhook off.
    let shutdown = Instant::now();
    manager_webhook(&node, false).await;
    let shutdown = shutdown..Instant::now();
    // 4. Healthy.
    node.wait_healthy(NAMESPACE).await;
    let counts = load
        .stop_after(
            started,
            "migration to koord-webhook",
            Some((shutdown, CLOSED_UNDER_THE_API_SERVER)),
        )
        .await;
    assert!(counts.koordinator_sent > 20, "{counts:?}");
    assert!(
        service_selector(&node).await.contains("koord-webhook"),
        "the Service selects koord-webhook's Pods"
    );
    // koord-webhook serves: its own entry (koord-manager has none for profiles) is in place, and
    // both webhooks shared koord-manager's CA, which the configurations still carry.
    eventually(
        Duration::from_secs(30),
        "koord-webhook's entries in the configurations",
        || async {
            let names = node
                .kubectl_ok(
                    &[
                        "get",
                        "validatingwebhookconfiguration",
                        "koordinator-validating-webhook-configuration",
                        "-o",
                        "jsonpath={.webhooks[*].name}",
                    ],
                    None,
                )
                .await;
            names
                .contains("vclustercolocationprofile.koordinator.sh")
                .then_some(())
        },
    )
    .await;
    let events = node
        .kubectl_ok(
            &[
                "-n",
                NAMESPACE,
                "get",
                "events",
                "--field-selector",
                "reason=CAAdopted",
                "-o",
                "name",
            ],
            None,
        )
        .await;
    assert!(!events.trim().is_empty(), "a CAAdopted Event");

    // --- Working together after the migration.
    be_pod_runs_on_batch_resources(&node, &client).await;
    quota_profile_and_scheduler_hold_pods_over_max(&node, &client).await;
    reservation_scheduled_and_claimed(&node, &client).await;
    amplified_node_takes_more(&node, &client).await;

    // --- The way back: koord-manager's webhook on, the Service back to it, koord-webhook removed
    // with its configurations kept for koord-manager.
    let load = AdmissionLoad::start(client.clone(), 20);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = Instant::now();
    manager_webhook(&node, true).await;
    let moving = Instant::now();
    apply(&node, &repo(KOORDINATOR_INSTALL), &take_over).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let moving = moving..Instant::now();
    let uninstall = node
        .koord_webhook(&["uninstall", "--keep-webhook-configurations"])
        .await;
    assert!(
        uninstall.status.success(),
        "koord-webhook uninstall --keep-webhook-configurations: {}",
        String::from_utf8_lossy(&uninstall.stderr)
    );
    load.stop_after(
        started,
        "way back to koord-manager",
        Some((moving, NO_ENDPOINTS)),
    )
    .await;
    assert!(
        service_selector(&node).await.contains("koord-manager"),
        "the Service selects koord-manager's Pods"
    );
    assert!(profile_applies(&client).await);
}

/// The shadow install's namespace (`manifests --mode shadow`).
const SHADOW: &str = "koord-webhook-shadow";

/// Every stored object of the kinds Koordinator's install holds, with the managers that wrote it,
/// but for the shadow's own (its namespace, its configuration, its ClusterRole's name).
async fn written_by_koord_webhook(node: &Node) -> Vec<String> {
    let text = node
        .kubectl_ok(
            &[
                "get",
                "mutatingwebhookconfigurations,validatingwebhookconfigurations,crds,secrets,\
                 configmaps,services,deployments,leases,elasticquotas,clustercolocationprofiles,nodes",
                "-A",
                "-o",
                "json",
            ],
            None,
        )
        .await;
    let list: Value = serde_json::from_str(&text).unwrap();
    let mut written = Vec::new();
    for item in list["items"].as_array().unwrap() {
        let meta = &item["metadata"];
        let (namespace, name) = (
            meta["namespace"].as_str().unwrap_or_default(),
            meta["name"].as_str().unwrap_or_default(),
        );
        if namespace == SHADOW || name == SHADOW {
            continue;
        }
        let managers = meta["managedFields"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if managers.iter().any(|m| m["manager"] == "koord-webhook") {
            written.push(format!("{} {namespace}/{name}", item["kind"]));
        }
    }
    written
}

/// The README's step 0, a trial beside koord-manager's webhook: under the load the shadow install
/// fails no admission (every Koordinator pod still mutated, by koord-manager) and writes nothing of
/// Koordinator's; a pod only its stricter gate refuses (EnablePodEnhancedValidator, off in
/// koord-manager v1.8.0) is admitted and shows as a would-be denial in `status --mode shadow` (the
/// replicas' `koord_webhook_admission_rule_results_total`); `uninstall --mode shadow` leaves
/// Koordinator as it was.
async fn shadow_trial(node: &Node, client: &kube::Client) {
    assert_eq!(written_by_koord_webhook(node).await, Vec::<String>::new());
    // Rules for EnablePodEnhancedValidator, which koord-manager v1.8.0 has off by default: every pod
    // must carry a label none of the load's pods carry.
    node.kubectl_ok(&["apply", "-f", "-"], Some(ENHANCED_VALIDATOR_RULES))
        .await;
    let load = AdmissionLoad::start(client.clone(), 20);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = Instant::now();
    let args = [
        "manifests",
        "--mode",
        "shadow",
        "--feature-gates",
        "EnablePodEnhancedValidator=true",
    ];
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
        .args(args)
        .output()
        .unwrap();
    let rendered = support::succeeded(&args, &out);
    node.kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&rendered))
        .await;
    rolled_out_in(node, SHADOW, "koord-webhook", Duration::from_secs(180)).await;
    let status = |wait: bool| {
        let mut args = vec!["status", "--mode", "shadow", "-o", "json"];
        if wait {
            args.extend(["--wait", "--timeout", "2m"]);
        }
        async move {
            let out = node.koord_webhook(&args).await;
            let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            (out.status.code(), report)
        }
    };
    let (code, report) = status(true).await;
    assert_eq!(code, Some(0), "the shadow healthy: {report}");
    assert_eq!(report["readyEndpoints"], 2, "{report}");
    // Until its replicas publish their CA (seconds after the apply), the API server's calls to the
    // new entries fail open; from healthy on, every answer must be taken.
    let api_calls = || async {
        let metrics = node.kubectl_ok(&["get", "--raw", "/metrics"], None).await;
        support::webhook_calls(&metrics, ".shadow.koord-webhook.io")
    };
    let healthy = api_calls().await;

    // A pod without the required label: koord-manager admits it, the shadow counts it.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let unlabelled = support::pod("default", "trial-1", json!({}), json!({}));
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    pods.create(&dry_run, &unlabelled)
        .await
        .expect("koord-manager admits a pod without the required label");
    let rule = eventually(
        Duration::from_secs(60),
        "the would-be denial in `status --mode shadow`",
        || async {
            let (_, report) = status(false).await;
            report["rules"]
                .as_array()?
                .iter()
                .find(|r| r["rule"] == "PodEnhancedValidator" && r["wouldDeny"].as_u64() > Some(0))
                .cloned()
        },
    )
    .await;
    assert_eq!(rule["action"], "Audit", "{rule}");
    assert_eq!(rule["denied"], 0, "{rule}");

    let counts = load
        .stop_after(started, "shadow beside koord-manager", None)
        .await;
    assert!(counts.koordinator_sent > 20, "{counts:?}");
    // The shadow was called for the load and, once healthy, every answer of its was taken.
    let calls = api_calls().await;
    eprintln!(
        "shadow beside koord-manager: the API server's calls (and fail-opens) per entry, \
         when it was healthy: {healthy:?}, at the end: {calls:?}"
    );
    let since = |entry: &str| {
        let (c0, f0) = healthy.get(entry).copied().unwrap_or_default();
        calls
            .get(entry)
            .map(|(c, f)| (c - c0, f - f0))
            .unwrap_or_default()
    };
    // Both halves of the split entry (--qos-split): koord-manager's profile has labelled the
    // pods the shadow's validating entries see, so they go to the labelled part.
    let pod_calls = since("mpod-create.shadow.koord-webhook.io").0
        + since("mpod-create-qos.shadow.koord-webhook.io").0;
    assert!(pod_calls >= 20, "{calls:?} for {counts:?}");
    for entry in calls.keys() {
        assert_eq!(
            since(entry).1,
            0,
            "{entry} failed open once healthy: {calls:?}"
        );
    }
    assert_eq!(
        written_by_koord_webhook(node).await,
        Vec::<String>::new(),
        "objects of Koordinator's written by koord-webhook"
    );
    let out = node
        .koord_webhook(&["uninstall", "--mode", "shadow", "--delete-namespace"])
        .await;
    assert!(
        out.status.success(),
        "uninstall --mode shadow: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left = node
        .kubectl_ok(
            &[
                "get",
                "validatingwebhookconfigurations,clusterroles",
                "-o",
                "name",
            ],
            None,
        )
        .await;
    assert!(!left.contains(SHADOW), "left by uninstall: {left}");
    assert!(profile_applies(client).await, "koord-manager still mutates");
    node.kubectl_ok(
        &["delete", "-f", "-", "--ignore-not-found"],
        Some(ENHANCED_VALIDATOR_RULES),
    )
    .await;
}

/// The enhanced-validator rules of the trial: every pod must be labelled `trial-team`.
const ENHANCED_VALIDATOR_RULES: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: pod-enhanced-validator-config, namespace: koordinator-system}
data:
  enable: "true"
  rules: '[{"name": "trial", "requiredLabels": ["trial-team"]}]'
"#;

/// A pod the spark profile turns into a BE pod with batch resources is bound by koord-scheduler to
/// the node, whose batch allocatable koord-manager's node-resource controller computed. No koordlet
/// runs here (it needs the host's cgroups): the test writes the NodeMetric status a koordlet would.
async fn be_pod_runs_on_batch_resources(node: &Node, client: &kube::Client) {
    let now = jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "updateTime": now,
        "nodeMetric": {"nodeUsage": {"resources": {"cpu": "500m", "memory": "1Gi"}}},
        "podsMetric": []
    }});
    eventually(
        Duration::from_secs(60),
        "koord-manager's NodeMetric for the node",
        || async {
            node.kubectl(&["get", "nodemetric", NODE_NAME], None)
                .await
                .status
                .success()
                .then_some(())
        },
    )
    .await;
    node.kubectl_ok(
        &[
            "patch",
            "nodemetric",
            NODE_NAME,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ],
        None,
    )
    .await;
    let nodes: Api<KubeNode> = Api::all(client.clone());
    let batch_cpu = eventually(
        Duration::from_secs(90),
        "kubernetes.io/batch-cpu in the node's allocatable (koord-manager's node-resource controller)",
        || async {
            let n = nodes.get(NODE_NAME).await.ok()?;
            let allocatable = n.status?.allocatable?;
            let cpu = allocatable.get("kubernetes.io/batch-cpu")?.0.clone();
            (cpu != "0").then_some(cpu)
        },
    )
    .await;
    eprintln!("node batch-cpu allocatable: {batch_cpu}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "spark");
    let pod = support::pod(
        "spark",
        "be-batch",
        json!({"app": "spark"}),
        json!({"cpu": "100m", "memory": "64Mi"}),
    );
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    let requests = serde_json::to_value(&created.spec.as_ref().unwrap().containers[0].resources)
        .unwrap_or(Value::Null);
    assert!(
        requests["requests"]["kubernetes.io/batch-cpu"].is_string(),
        "the profile moved the pod to batch resources: {requests}"
    );
    let bound = bound_within(&pods, "be-batch", Duration::from_secs(60)).await;
    assert_eq!(bound, NODE_NAME);
}

/// An ElasticQuotaProfile makes koord-manager create the root quota of a tree, through koord-webhook's
/// quota endpoints; a child quota with a max of 250m cpu under it: koord-scheduler's quota plugin
/// binds two pods of 100m and holds the third.
async fn quota_profile_and_scheduler_hold_pods_over_max(node: &Node, client: &kube::Client) {
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}},
        {"apiVersion": "quota.koordinator.sh/v1alpha1", "kind": "ElasticQuotaProfile",
         "metadata": {"name": "team-profile", "namespace": NAMESPACE},
         "spec": {"quotaName": "team-root", "resourceRatio": "0.9",
                  // A quota with children must say so (Koordinator's rule, ours too).
                  "quotaLabels": {"quota.scheduling.koordinator.sh/is-parent": "true"},
                  "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": NODE_NAME}}}},
    ]});
    node.kubectl_ok(&["apply", "-f", "-"], Some(&objects.to_string()))
        .await;
    let root = eventually(
        Duration::from_secs(60),
        "koord-manager's ElasticQuota team-root from the profile",
        || async {
            let out = node
                .kubectl(
                    &[
                        "-n",
                        NAMESPACE,
                        "get",
                        "elasticquota",
                        "team-root",
                        "-o",
                        "json",
                    ],
                    None,
                )
                .await;
            out.status
                .success()
                .then(|| serde_json::from_slice::<Value>(&out.stdout).unwrap())
        },
    )
    .await;
    let labels = &root["metadata"]["labels"];
    assert_eq!(
        labels["quota.scheduling.koordinator.sh/is-root"], "true",
        "{root}"
    );
    let tree = labels["quota.scheduling.koordinator.sh/tree-id"].clone();
    assert!(tree.is_string(), "{root}");
    let child = json!({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
        "metadata": {"name": "team-a", "namespace": "team-a", "labels": {
            "quota.scheduling.koordinator.sh/parent": "team-root",
            "quota.scheduling.koordinator.sh/tree-id": tree}},
        "spec": {"min": {"cpu": "0", "memory": "0"}, "max": {"cpu": "250m", "memory": "1Gi"}}});
    node.kubectl_ok(&["apply", "-f", "-"], Some(&child.to_string()))
        .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "team-a");
    for i in 1..=3 {
        let mut pod = support::pod(
            "team-a",
            &format!("quota-{i}"),
            json!({"quota.scheduling.koordinator.sh/name": "team-a"}),
            json!({"cpu": "100m", "memory": "32Mi"}),
        );
        pod.spec.as_mut().unwrap().scheduler_name = Some("koord-scheduler".to_owned());
        pods.create(&PostParams::default(), &pod).await.unwrap();
        if i < 3 {
            bound_within(&pods, &format!("quota-{i}"), Duration::from_secs(60)).await;
        }
    }
    // The third would take team-a over its max: held, with the scheduler's reason.
    let reason = eventually(
        Duration::from_secs(60),
        "the third pod held by the quota plugin",
        || async {
            let p = pods.get("quota-3").await.ok()?;
            assert!(
                p.spec.as_ref()?.node_name.is_none(),
                "quota-3 was bound over the quota's max"
            );
            let condition = p
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "PodScheduled")?;
            (condition.status == "False").then(|| condition.message.unwrap_or_default())
        },
    )
    .await;
    eprintln!("quota-3 held: {reason}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let third = pods.get("quota-3").await.unwrap();
    assert!(third.spec.unwrap().node_name.is_none(), "still held");
}

/// A Reservation that a ClusterColocationProfile selects by its labels is mutated by
/// `/mutate-reservation` (koord-scheduler as its scheduler), koord-scheduler makes it Available on
/// the node; with `ReservationAffinityValidation` turned on (the Deployment's environment, as a
/// user sets a gate), a pod naming a missing Reservation is refused and a pod naming this one is
/// admitted and placed into it by koord-scheduler.
async fn reservation_scheduled_and_claimed(node: &Node, client: &kube::Client) {
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-r"}},
        {"apiVersion": "config.koordinator.sh/v1alpha1", "kind": "ClusterColocationProfile",
         "metadata": {"name": "reservations"},
         "spec": {"selector": {"matchLabels": {"reserve": "demo"}},
                  "schedulerName": "koord-scheduler",
                  "labels": {"koordinator.sh/reserved-by-profile": "true"}}},
    ]});
    node.kubectl_ok(&["apply", "-f", "-"], Some(&objects.to_string()))
        .await;
    let reservation = json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
        "metadata": {"name": "reserve-demo", "labels": {"reserve": "demo"}},
        "spec": {"ttl": "1h", "allocateOnce": true,
                 "owners": [{"labelSelector": {"matchLabels": {"app": "reserved"}}}],
                 "template": {"metadata": {"namespace": "team-r"}, "spec": {"containers": [
                     {"name": "main", "image": "busybox",
                      "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}}}]}}}});
    // The profile reaches koord-webhook's cache a moment after it is stored: create once mutated.
    let created: Value = eventually(
        Duration::from_secs(20),
        "the Reservation mutated by the profile (dry run)",
        || async {
            let out = node
                .kubectl(
                    &["create", "--dry-run=server", "-o", "json", "-f", "-"],
                    Some(&reservation.to_string()),
                )
                .await;
            let object: Value = serde_json::from_slice(&out.stdout).ok()?;
            (object["spec"]["template"]["spec"]["schedulerName"] == "koord-scheduler")
                .then_some(object)
        },
    )
    .await;
    assert_eq!(
        created["metadata"]["labels"]["koordinator.sh/reserved-by-profile"], "true",
        "{created}"
    );
    node.kubectl_ok(&["create", "-f", "-"], Some(&reservation.to_string()))
        .await;
    // The Reservation's status as kubectl shows it (null while it cannot be read).
    let status = || async {
        let out = node
            .kubectl(&["get", "reservation", "reserve-demo", "-o", "json"], None)
            .await;
        serde_json::from_slice::<Value>(&out.stdout).unwrap_or_default()["status"].clone()
    };
    eventually(
        Duration::from_secs(60),
        "koord-scheduler making the Reservation Available on the node",
        || async {
            let status = status().await;
            (status["phase"] == "Available" && status["nodeName"] == NODE_NAME).then_some(())
        },
    )
    .await;

    // ReservationAffinityValidation on: a rolling update of koord-webhook.
    node.kubectl_ok(
        &[
            "-n",
            NAMESPACE,
            "set",
            "env",
            "deployment/koord-webhook",
            "KOORD_WEBHOOK_FEATURE_GATES=ReservationAffinityValidation=true",
        ],
        None,
    )
    .await;
    rolled_out(node, "koord-webhook", Duration::from_secs(180)).await;
    node.wait_healthy(NAMESPACE).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "team-r");
    let claiming = |name: &str, reservation: &str| {
        let mut pod = support::pod(
            "team-r",
            name,
            json!({"app": "reserved"}),
            json!({"cpu": "100m", "memory": "32Mi"}),
        );
        pod.metadata.annotations = Some(
            [(
                "scheduling.koordinator.sh/reservation-affinity".to_owned(),
                json!({"name": reservation}).to_string(),
            )]
            .into(),
        );
        pod.spec.as_mut().unwrap().scheduler_name = Some("koord-scheduler".to_owned());
        pod
    };
    // Replicas of the old gates answer for --drain-delay (its default, as installed) after the
    // rollout completes, but
    // each answer closes its connection (`server/drain.rs`), so the API server moves to the new
    // replicas at once: the new rule holds in every answer from then on (README, "Configure").
    // Every answer: ten refusals in a row.
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let drain_delay = koord_webhook::server::shutdown::default_drain_delay();
    let since = Instant::now();
    let (mut in_a_row, mut first) = (0, None);
    while in_a_row < 10 {
        match pods
            .create(&dry_run, &claiming("claims-nothing", "no-such"))
            .await
        {
            Err(refused) => {
                assert!(
                    refused
                        .to_string()
                        .contains("reservation no-such not found"),
                    "{refused}"
                );
                first.get_or_insert(since.elapsed());
                in_a_row += 1;
            }
            Ok(_) => {
                assert!(
                    since.elapsed() < drain_delay + Duration::from_secs(5),
                    "a pod naming a missing Reservation is refused once the old replicas have drained"
                );
                (in_a_row, first) = (0, None);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "ReservationAffinityValidation in every answer {:.1} s after the rollout (10 in a row)",
        first.unwrap().as_secs_f64()
    );
    // Created at once, while the old replicas may still drain: each closes the API server's
    // connection after every answer it gives then, so none is closed under this call when they
    // stop (`server/drain.rs`; before, a create at the very end of their drain once met an EOF).
    pods.create(
        &PostParams::default(),
        &claiming("claims-demo", "reserve-demo"),
    )
    .await
    .unwrap();
    // koord-scheduler places the pod into the Reservation: bound to its node, the Reservation's
    // current owner, and (allocateOnce) used up.
    let bound = bound_within(&pods, "claims-demo", Duration::from_secs(60)).await;
    assert_eq!(bound, NODE_NAME);
    let claimed = eventually(
        Duration::from_secs(30),
        "the Reservation naming claims-demo as its owner",
        || async {
            let status = status().await;
            (status["currentOwners"][0]["name"] == "claims-demo").then_some(status)
        },
    )
    .await;
    assert_eq!(claimed["phase"], "Succeeded", "{claimed}");
    let pod = pods.get("claims-demo").await.unwrap();
    let allocated = pod
        .metadata
        .annotations
        .unwrap_or_default()
        .remove("scheduling.koordinator.sh/reservation-allocated")
        .unwrap_or_default();
    assert!(allocated.contains("reserve-demo"), "{allocated}");
    pods.delete("claims-demo", &Default::default())
        .await
        .unwrap();
}

/// A cpu amplification ratio of 1.5 in the SLO ConfigMap: koord-manager annotates the node, the
/// kubelet's next status update passes `/mutate-node-status`, which multiplies the allocatable cpu
/// (the kubelet's own kept in `raw-allocatable`), and koord-scheduler binds a pod that fits only
/// in the amplified capacity.
async fn amplified_node_takes_more(node: &Node, client: &kube::Client) {
    let nodes: Api<KubeNode> = Api::all(client.clone());
    let cpu_of = |n: &KubeNode| -> u64 {
        let allocatable = n.status.as_ref().unwrap().allocatable.as_ref().unwrap();
        millicores(&allocatable["cpu"])
    };
    let raw = cpu_of(&nodes.get(NODE_NAME).await.unwrap());
    // In a Koordinator cluster koord-manager owns the ratio annotation (its resource-amplification
    // plugin writes it from the SLO ConfigMap and removes one it was not configured for): the
    // ratio is set where koord-manager reads it, through koord-webhook's /validate-configmap.
    let config = json!({"data": {"resource-amplification-config":
        json!({"enable": true, "resourceAmplificationRatio": {"cpu": 1.5}}).to_string()}});
    node.kubectl_ok(
        &[
            "-n",
            NAMESPACE,
            "patch",
            "configmap",
            "slo-controller-config",
            "--type=merge",
            "-p",
            &config.to_string(),
        ],
        None,
    )
    .await;
    let amplified = eventually(
        Duration::from_secs(60),
        "koord-manager's ratio annotation, then the kubelet's status amplified by /mutate-node-status",
        || async {
            let n = nodes.get(NODE_NAME).await.ok()?;
            let recorded = n
                .metadata
                .annotations
                .as_ref()?
                .contains_key("node.koordinator.sh/raw-allocatable");
            let cpu = cpu_of(&n);
            (recorded && cpu == raw * 3 / 2).then_some(cpu)
        },
    )
    .await;
    eprintln!("node cpu allocatable: {raw}m raw, {amplified}m amplified");
    let all: Api<Pod> = Api::all(client.clone());
    let used: u64 = all
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE_NAME))
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .flat_map(|p| p.spec.as_ref().unwrap().containers.iter())
        .filter_map(|c| c.resources.as_ref()?.requests.as_ref()?.get("cpu"))
        .map(millicores)
        .sum();
    // More than the kubelet's allocatable leaves free, less than the amplified one does.
    let request = raw.saturating_sub(used) + (amplified - raw) / 2;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut pod = support::pod(
        "default",
        "needs-amplified",
        json!({}),
        json!({"cpu": format!("{request}m"), "memory": "32Mi"}),
    );
    pod.spec.as_mut().unwrap().scheduler_name = Some("koord-scheduler".to_owned());
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let bound = bound_within(&pods, "needs-amplified", Duration::from_secs(60)).await;
    assert_eq!(
        bound, NODE_NAME,
        "{request}m with {used}m used of {raw}m raw"
    );
    pods.delete("needs-amplified", &Default::default())
        .await
        .unwrap();
}

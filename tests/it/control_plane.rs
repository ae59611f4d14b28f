//! Against a real kube-apiserver and etcd: the CRDs, the install manifests, and the API server
//! calling koord-webhook over TLS.

use crate::support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use koord_webhook::apis::keys::{QUOTA_PARENT, QUOTA_TREE_ID};
use koord_webhook::apis::{ElasticQuota, ElasticQuotaSpec, Reservation};

use koord_webhook::cache::load::load_state;
use koord_webhook::features::FeatureGates;
use koord_webhook::install::{WebhookTarget, render_webhook_configurations};
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::json;
use support::control_plane::ControlPlane;
use support::{TestServer, fixture};

fn root(relative: &str) -> String {
    format!("{}/{relative}", env!("CARGO_MANIFEST_DIR"))
}

fn install_crds(cp: &ControlPlane) {
    support::operator::apply_established(cp, "crds");
}

#[tokio::test]
async fn crds_serve_objects_and_the_install_manifests_pass_a_dry_run() {
    let cp = ControlPlane::start();
    install_crds(&cp);
    let client = cp.client().await;
    support::the_version_asked_for(&client).await;
    cp.kubectl_ok(&["create", "namespace", "team-a"], None);

    let quotas: Api<ElasticQuota> = Api::namespaced(client.clone(), "team-a");
    let mut quota = ElasticQuota::new(
        "q1",
        ElasticQuotaSpec {
            min: Some(
                [(
                    "cpu".to_owned(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
                )]
                .into(),
            ),
            max: Some(
                [(
                    "cpu".to_owned(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("2".into()),
                )]
                .into(),
            ),
        },
    );
    quota.metadata.namespace = Some("team-a".into());
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    let read = quotas.get("q1").await.unwrap();
    assert_eq!(read.spec, quota.spec, "read back as written");

    // The schema rejects what Koordinator's CRD rejects, and applies its defaults.
    let reservations: Api<Reservation> = Api::all(client.clone());
    let invalid: Reservation = serde_json::from_value(json!({
        "apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
        "metadata": {"name": "no-owners"},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}, "owners": []}
    }))
    .unwrap();
    let err = reservations
        .create(&PostParams::default(), &invalid)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("spec.owners"), "{err}");
    let valid = cp.kubectl_ok(
        &["create", "-o", "json", "-f", "-"],
        Some(r#"{"apiVersion":"scheduling.koordinator.sh/v1alpha1","kind":"Reservation","metadata":{"name":"r1"},
                 "spec":{"template":{"spec":{"containers":[{"name":"c","image":"i"}]}},"owners":[{"object":{"name":"p"}}]}}"#),
    );
    let valid: serde_json::Value = serde_json::from_str(&valid).unwrap();
    assert_eq!(valid["spec"]["ttl"], "24h");
    assert_eq!(valid["spec"]["allocateOnce"], true);
    assert_eq!(
        valid["spec"]["template"]["spec"]["containers"][0]["image"], "i",
        "template kept as given"
    );

    // Namespaced objects need their namespace to exist for a dry run.
    cp.kubectl_ok(&["create", "namespace", "koordinator-system"], None);
    let out = cp.kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "-f",
            &root("manifests/install.yaml"),
        ],
        None,
    );
    for object in [
        "deployment.apps/koord-webhook",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/koordinator-mutating-webhook-configuration",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/koordinator-validating-webhook-configuration",
        "role.rbac.authorization.k8s.io/koord-webhook",
        "poddisruptionbudget.policy/koord-webhook",
    ] {
        assert!(out.contains(object), "{object} missing from: {out}");
    }
}

/// A test server with `cache`, and the webhook configurations pointing at it (URL mode) applied.
async fn serve_in_url_mode(
    cp: &ControlPlane,
    cache: koord_webhook::cache::Cache,
) -> (TestServer, WebhookTarget) {
    let server = TestServer::start(cache, FeatureGates::default()).await;
    let cert = server
        .shared
        .state
        .resolver
        .current()
        .unwrap()
        .cert_pem
        .clone();
    let target = WebhookTarget::from_flags(
        Some("127.0.0.1"),
        server.addr.port(),
        &koord_webhook::install::entry_policy::EntryPolicy::default(),
    );
    let configs =
        render_webhook_configurations(&FeatureGates::default(), &target, Some(&cert)).unwrap();
    cp.kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&configs));
    (server, target)
}

#[tokio::test]
async fn the_api_server_calls_the_webhook_over_tls() {
    let cp = ControlPlane::start();
    install_crds(&cp);
    let client = cp.client().await;
    cp.kubectl_ok(&["create", "namespace", "team-a"], None);

    let cache = load_state(&fixture("state/quota-tree.yaml"))
        .unwrap()
        .reader();
    let (server, _) = serve_in_url_mode(&cp, cache).await;

    // Denied by /validate-pod, with the message users search for.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "team-a");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "reserved", "annotations": {"scheduling.koordinator.sh/reserve-pod": "true"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))
    .unwrap();
    let err = pods.create(&PostParams::default(), &pod).await.unwrap_err();
    let message = err.to_string();
    assert!(message.contains("vpod.koordinator.sh"), "{message}");
    assert!(message.contains("annotations.scheduling.koordinator.sh/reserve-pod: Forbidden: cannot set in annotations"), "{message}");

    // A pod without it is admitted (and a server-side dry run goes through the webhooks too).
    let mut plain = pod.clone();
    plain.metadata.annotations = None;
    plain.metadata.name = Some("plain".into());
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    pods.create(&dry_run, &plain).await.unwrap();
    assert!(
        pods.get_opt("plain").await.unwrap().is_none(),
        "dry run persisted nothing"
    );
    pods.create(&PostParams::default(), &plain).await.unwrap();

    // Mutated by /mutate-...-elasticquota: the tree id comes from the parent in the cache.
    let quotas: Api<ElasticQuota> = Api::namespaced(client.clone(), "team-a");
    let child = ElasticQuota {
        metadata: ObjectMeta {
            name: Some("child-a2".into()),
            namespace: Some("team-a".into()),
            labels: Some(BTreeMap::from([(
                QUOTA_PARENT.to_owned(),
                "parent-a".to_owned(),
            )])),
            ..Default::default()
        },
        spec: serde_json::from_value(
            json!({"min": {"cpu": "7"}, "max": {"cpu": "8", "memory": "8Gi"}}),
        )
        .unwrap(),
        status: None,
    };
    // Validated by /validate-...-elasticquota: 7 + child-a1's 2 CPUs exceed parent-a's min of 8.
    let err = quotas
        .create(&PostParams::default(), &child)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("checkMinQuotaSum all brothers' MinQuota > parent MinQuota, parent: parent-a"),
        "{err}"
    );
    let mut child = child;
    child.spec =
        serde_json::from_value(json!({"min": {"cpu": "6"}, "max": {"cpu": "8", "memory": "8Gi"}}))
            .unwrap();
    let created = quotas.create(&PostParams::default(), &child).await.unwrap();
    assert_eq!(
        created
            .metadata
            .labels
            .unwrap()
            .get(QUOTA_TREE_ID)
            .map(String::as_str),
        Some("tree-1")
    );

    let requests = server.shared.state.metrics.encode();
    assert!(
        requests.contains(r#"koord_webhook_admission_requests_total{webhook="/validate-pod"}"#),
        "{requests}"
    );
    server.stop().await;
}

/// Every object the chart can render is accepted by the API server: the chart with cert-manager
/// certificates, a metrics Service, a ServiceMonitor, a PrometheusRule and the dashboard ConfigMap, in a namespace of its
/// own, applied for real next to the CRDs of those kinds (taken from cert-manager's and the
/// Prometheus Operator's own modules by scripts/helm).
#[tokio::test]
async fn every_object_the_chart_renders_is_accepted_by_the_api_server() {
    let cp = ControlPlane::start();
    crate::generated::helm();
    support::operator::apply_established(&cp, "target/helm-bin/crds");
    let rendered = crate::generated::helm_template(
        "koord-elsewhere",
        &[
            "createNamespace=true",
            "certificates.mode=external",
            "metrics.serviceMonitor.enabled=true",
            "metrics.prometheusRule.enabled=true",
            "metrics.grafanaDashboard.enabled=true",
            "webhooks.excludeNamespaceLabels={koordinator.sh/exempt}",
            "networkPolicy.apiServerCIDRs={10.96.0.1/32,192.168.0.0/24}",
            "clientCA.configMap=api-client-ca",
        ],
    );
    for kind in [
        "kind: NetworkPolicy",
        "cidr: 192.168.0.0/24",
        "kind: Certificate",
        "kind: Issuer",
        "kind: ServiceMonitor",
        "kind: PrometheusRule",
        "name: koord-webhook-dashboard",
        "cert-manager.io/inject-ca-from: koord-elsewhere/koord-webhook",
        "- --cert-mode=external",
    ] {
        assert!(rendered.contains(kind), "{kind} not rendered");
    }
    let out = cp.kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&rendered));
    for object in [
        "namespace/koord-elsewhere",
        "certificate.cert-manager.io/koord-webhook",
        "issuer.cert-manager.io/koord-webhook-ca",
        "servicemonitor.monitoring.coreos.com/koord-webhook",
        "prometheusrule.monitoring.coreos.com/koord-webhook",
        "service/koord-webhook-metrics",
        "configmap/koord-webhook-dashboard",
        "resourcequota/koord-webhook-critical-pods",
        "deployment.apps/koord-webhook",
        "networkpolicy.networking.k8s.io/koord-webhook",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/koordinator-validating-webhook-configuration",
    ] {
        assert!(out.contains(object), "{object} missing from: {out}");
    }
    let service = cp.kubectl_ok(
        &[
            "get",
            "validatingwebhookconfiguration",
            "koordinator-validating-webhook-configuration",
            "-o",
            "jsonpath={.webhooks[0].clientConfig.service.namespace}",
        ],
        None,
    );
    assert_eq!(service, "koord-elsewhere");
}

/// How long the API server takes to act on a widened webhook entry (its informer on webhook
/// configurations): a narrowed `vnode` entry is widened by a write, and node updates are made until
/// the webhook sees one. Each widening must take effect (within 10 s); the delays are printed
/// (docs/narrowing.md quotes them), never asserted as timings.
#[tokio::test]
async fn widened_entries_take_effect_after_the_api_servers_informer_delay() {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Patch, PatchParams};
    use std::time::{Duration, Instant};

    let cp = ControlPlane::start();
    let client = cp.client().await;
    let (server, target) = serve_in_url_mode(&cp, koord_webhook::cache::Cache::empty()).await;
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let name = koord_webhook::names::VALIDATING_CONFIGURATION;
    let index = configurations
        .get(name)
        .await
        .unwrap()
        .webhooks
        .unwrap()
        .iter()
        .position(|w| w.name == "vnode.koordinator.sh")
        .unwrap();
    let narrowed = target.calls(
        koord_webhook::entries::ENDPOINTS
            .iter()
            .flat_map(|w| w.entries)
            .find(|e| e.name == "vnode.koordinator.sh")
            .unwrap(),
        &FeatureGates::default(),
    );
    let set_conditions = |conditions: serde_json::Value| {
        let configurations = configurations.clone();
        async move {
            let patch: json_patch::Patch = serde_json::from_value(json!([
                {"op": "add", "path": format!("/webhooks/{index}/matchConditions"), "value": conditions}
            ]))
            .unwrap();
            configurations
                .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
                .await
                .unwrap();
        }
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "informer-n1"}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let seen = || support::requests_to(&server.shared.state.metrics.encode(), "/validate-node");
    let mut tick = 0u32;
    let mut touch = || {
        tick += 1;
        let nodes = nodes.clone();
        let patch = json!({"metadata": {"annotations": {"tick": tick.to_string()}}});
        async move {
            nodes
                .patch("informer-n1", &PatchParams::default(), &Patch::Merge(patch))
                .await
                .unwrap();
        }
    };
    let mut delays = Vec::new();
    for _ in 0..5 {
        // Narrow, and wait until an annotation-only update is no longer sent.
        set_conditions(json!(narrowed.match_conditions().unwrap())).await;
        let start = Instant::now();
        loop {
            let before = seen();
            touch().await;
            if seen() == before {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "narrowing never took effect"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Widen, and time until the same update is sent again.
        set_conditions(json!([])).await;
        let widened = Instant::now();
        loop {
            let before = seen();
            touch().await;
            if seen() > before {
                break;
            }
            assert!(
                widened.elapsed() < Duration::from_secs(10),
                "a widened entry was not called within 10 s"
            );
        }
        delays.push(widened.elapsed());
    }
    delays.sort();
    eprintln!(
        "widening took effect after (min/median/max of {}): {:?} / {:?} / {:?}",
        delays.len(),
        delays[0],
        delays[delays.len() / 2],
        delays[delays.len() - 1]
    );
    server.stop().await;
}

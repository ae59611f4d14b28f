//! The Helm chart on the real node: installed into a namespace of its own, upgraded, uninstalled.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use support::certs::{MUTATING, VALIDATING};
use support::node::Node;
use support::operator::eventually;
use support::pod;

/// `koord-webhook status --wait` as a script after an install runs it: exit 0 (healthy), with both
/// replicas behind the Service.
/// `helm install` of charts/koord-webhook (into `koord-helm`, Koordinator's CRDs already there),
/// admission through it, `status` healthy; `helm upgrade` of a setting, which reaches the entries
/// while the caBundle stays; `helm uninstall`, after which nothing is left pointing at the replicas
/// and pods are created normally.
pub(super) async fn helm_install_upgrade_uninstall(node: &Node, client: &kube::Client) {
    const HELM_NS: &str = "koord-helm";
    let helm = &crate::generated::helm();
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/koord-webhook");
    let run = |args: Vec<String>| async move {
        let mut command = vec![helm.to_str().unwrap().to_owned()];
        command.extend(args);
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        let out = node.exec(&command, None).await;
        assert!(
            out.status.success(),
            "{command:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let args = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let started = std::time::Instant::now();
    run(args(&[
        "install",
        "koord-webhook",
        chart,
        "--namespace",
        HELM_NS,
        "--create-namespace",
        "--set",
        "crds.install=false",
        // A UID of the kind OpenShift's restricted SCC assigns: the chart fixes none.
        "--set",
        "podSecurityContext.runAsUser=1000700000",
        "--wait",
        "--timeout",
        "3m",
    ]))
    .await;
    node.wait_healthy(HELM_NS).await;
    installed_for_every_platform(client, HELM_NS).await;
    // `helm test`: its Pod runs `status --wait --check-admission default` with its own RBAC. (Not
    // `--logs`: Helm then asks for the logs of every test hook by name, Roles included, and fails.)
    let tested = node
        .exec(
            &[
                helm.to_str().unwrap(),
                "test",
                "koord-webhook",
                "--namespace",
                HELM_NS,
                "--timeout",
                "3m",
            ],
            None,
        )
        .await;
    if !tested.status.success() {
        // A Pod that failed stays: its report says why.
        let logs = node
            .kubectl(&["logs", "-n", HELM_NS, "koord-webhook-test"], None)
            .await;
        panic!(
            "helm test: {}{}\nits Pod's log:\n{}",
            String::from_utf8_lossy(&tested.stdout),
            String::from_utf8_lossy(&tested.stderr),
            String::from_utf8_lossy(&logs.stdout)
        );
    }
    eprintln!(
        "helm install to healthy in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let plain: Api<Pod> = Api::namespaced(client.clone(), "plain");
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let reserved: Pod = serde_json::from_value(json!({
        "metadata": {"name": "reserved", "annotations": {"scheduling.koordinator.sh/reserve-pod": "true"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))
    .unwrap();
    let denied = plain
        .create(&dry_run, &reserved)
        .await
        .unwrap_err()
        .to_string();
    assert!(denied.contains("cannot set in annotations"), "{denied}");
    let v: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let entries = v.get(VALIDATING).await.unwrap().webhooks.unwrap();
    let bundle = entries[0].client_config.ca_bundle.clone().unwrap().0;
    assert_eq!(
        entries[0].client_config.service.as_ref().unwrap().namespace,
        HELM_NS
    );

    // Upgrade one setting: it reaches every entry (and the operator's flags, so it is kept), and the
    // caBundle the operator published survives Helm's patch.
    run(args(&[
        "upgrade",
        "koord-webhook",
        chart,
        "--namespace",
        HELM_NS,
        "--reuse-values",
        "--set",
        "webhooks.timeoutSeconds=7",
        "--wait",
        "--timeout",
        "3m",
    ]))
    .await;
    let entries = eventually(
        Duration::from_secs(60),
        "timeoutSeconds 7 on every entry",
        || async {
            let entries = v.get(VALIDATING).await.unwrap().webhooks.unwrap();
            entries
                .iter()
                .all(|e| e.timeout_seconds == Some(7))
                .then_some(entries)
        },
    )
    .await;
    assert!(
        entries
            .iter()
            .all(|e| e.client_config.ca_bundle.as_ref().map(|b| &b.0) == Some(&bundle)),
        "helm upgrade kept the caBundle"
    );
    let status = node
        .koord_webhook(&[
            "status",
            "--namespace",
            HELM_NS,
            "--wait",
            "--timeout",
            "2m",
        ])
        .await;
    assert_eq!(
        status.status.code(),
        Some(0),
        "healthy after helm upgrade: {}{}",
        String::from_utf8_lossy(&status.stdout),
        String::from_utf8_lossy(&status.stderr)
    );

    // Uninstall: Helm deletes the configurations a moment before the Deployment; the leader must
    // not put them back in between (it waits, and is stopped by then).
    run(args(&[
        "uninstall",
        "koord-webhook",
        "--namespace",
        HELM_NS,
        "--wait",
        "--timeout",
        "3m",
    ]))
    .await;
    tokio::time::sleep(
        Duration::from_secs(25), // past the operator's 20 s grace before it re-creates one,
    )
    .await;
    let m: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    assert!(
        m.get_opt(MUTATING).await.unwrap().is_none(),
        "no configuration came back"
    );
    assert!(
        v.get_opt(VALIDATING).await.unwrap().is_none(),
        "no configuration came back"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), HELM_NS);
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    plain
        .create(
            &PostParams::default(),
            &pod("plain", "after-helm-uninstall", json!({}), json!({})),
        )
        .await
        .expect("a pod is created normally after helm uninstall");
}

/// The chart's Deployment runs as the UID it was given, spreads its replicas over nodes (preferred:
/// this one node runs both), and a ResourceQuota admits its critical priority class.
pub(super) async fn installed_for_every_platform(client: &kube::Client, namespace: &str) {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ResourceQuota;
    let deployment = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get("koord-webhook")
        .await
        .unwrap();
    let spec = deployment.spec.unwrap().template.spec.unwrap();
    let security = spec.security_context.unwrap();
    assert_eq!(security.run_as_user, Some(1000700000));
    assert_eq!(security.run_as_group, None);
    let anti = spec.affinity.unwrap().pod_anti_affinity.unwrap();
    let preferred = anti
        .preferred_during_scheduling_ignored_during_execution
        .unwrap();
    assert_eq!(
        preferred[0].pod_affinity_term.topology_key,
        "kubernetes.io/hostname"
    );
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
    let quota = Api::<ResourceQuota>::namespaced(client.clone(), namespace)
        .get("koord-webhook-critical-pods")
        .await
        .unwrap();
    let used = quota.status.and_then(|s| s.used).unwrap_or_default();
    assert!(
        used.get("pods").is_some_and(|q| q.0 != "0"),
        "the replicas are counted against the class's quota: {used:?}"
    );
}

//! `koord-webhook audit` through a real kube-apiserver: objects stored while no webhook ran (a BE
//! pod at koord-prod priority, a child quota whose min exceeds its max) are reported, and nothing
//! else; it runs as a user who may only read, and changes nothing.

use std::process::Command;

use serde_json::Value;

use crate::support::control_plane::ControlPlane;
use crate::support::operator::{apply_established, kubeconfig_as};

const SEED: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: koord-prod}
value: 9500
---
apiVersion: v1
kind: Pod
metadata:
  name: spark-1
  namespace: team-a
  labels: {koordinator.sh/qosClass: BE}
spec:
  priorityClassName: koord-prod
  containers: [{name: c, image: spark}]
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: team-a}
spec:
  containers: [{name: c, image: nginx}]
---
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata:
  name: parent
  namespace: team-a
  labels: {quota.scheduling.koordinator.sh/is-parent: "true"}
spec: {max: {cpu: "10"}, min: {cpu: "10"}}
---
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata:
  name: child-bad
  namespace: team-a
  labels: {quota.scheduling.koordinator.sh/parent: parent}
spec: {max: {cpu: "4"}, min: {cpu: "8"}}
---
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata:
  name: child-good
  namespace: team-a
  labels: {quota.scheduling.koordinator.sh/parent: parent}
spec: {max: {cpu: "10"}, min: {cpu: "1"}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: read-everything}
rules:
- apiGroups: ["*"]
  resources: ["*"]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: auditor-reads}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: read-everything}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: auditor}
"#;

/// Every object's kind, name and resourceVersion: a write anywhere changes one.
fn versions(cp: &ControlPlane) -> String {
    cp.kubectl_ok(
        &[
            "get",
            "pods,elasticquotas,namespaces,priorityclasses,nodes,configmaps",
            "-A",
            "-o",
            "custom-columns=KIND:.kind,NS:.metadata.namespace,NAME:.metadata.name,RV:.metadata.resourceVersion",
        ],
        None,
    )
}

#[test]
fn audit_reports_what_the_rules_would_refuse_and_writes_nothing() {
    let cp = ControlPlane::start();
    apply_established(&cp, "crds");
    cp.kubectl_ok(&["apply", "-f", "-"], Some(SEED));
    let dir = tempfile::tempdir().unwrap();
    let auditor = kubeconfig_as(&cp, dir.path(), "auditor", "auditor.kubeconfig");
    let before = versions(&cp);

    let run = |output: &str| {
        Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
            .args(["audit", "--kubeconfig"])
            .arg(&auditor)
            .args(["-o", output, "--page-size", "1"])
            .output()
            .unwrap()
    };
    let out = run("json");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "found something: {stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["objectsFound"], 2, "{report:#}");
    assert_eq!(report["checked"]["Pod"], 2, "{report:#}");
    assert_eq!(report["checked"]["ElasticQuota"], 3, "{report:#}");
    let rules = report["rules"].as_object().unwrap();
    let names: Vec<&str> = rules.keys().map(String::as_str).collect();
    assert_eq!(names, ["ColocationQoSPriority", "ElasticQuotaTreeRules"]);
    let pod = &rules["ColocationQoSPriority"]["examples"][0];
    assert_eq!(
        (pod["kind"].as_str(), pod["name"].as_str()),
        (Some("Pod"), Some("spark-1"))
    );
    let quota = &rules["ElasticQuotaTreeRules"]["examples"][0];
    assert_eq!(quota["name"], "child-bad");
    assert_eq!(
        quota["message"],
        "resourceKey cpu of quota child-bad min 8 > max 4"
    );

    let text = run("text");
    assert_eq!(text.status.code(), Some(1));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("Pod team-a/spark-1: "), "{text}");

    assert_eq!(versions(&cp), before, "audit changed a stored object");

    // Once the objects are fixed, nothing is found: exit 0.
    cp.kubectl_ok(
        &[
            "delete",
            "pod",
            "-n",
            "team-a",
            "spark-1",
            "--grace-period=0",
            "--force",
        ],
        None,
    );
    cp.kubectl_ok(
        &["delete", "elasticquota", "-n", "team-a", "child-bad"],
        None,
    );
    let clean = run("yaml");
    assert_eq!(
        clean.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&clean.stdout)
    );
    let report: Value = serde_yaml::from_slice(&clean.stdout).unwrap();
    assert_eq!(report["objectsFound"], 0);
}

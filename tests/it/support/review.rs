//! Running `koord-webhook review` (the real binary) on an AdmissionReview built in the test.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

/// The kind of object a review is about.
pub struct Kind {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub resource: &'static str,
    pub sub_resource: Option<&'static str>,
}

pub const POD: Kind = Kind {
    group: "",
    version: "v1",
    kind: "Pod",
    resource: "pods",
    sub_resource: None,
};
pub const NODE: Kind = Kind {
    group: "",
    version: "v1",
    kind: "Node",
    resource: "nodes",
    sub_resource: None,
};
pub const NODE_STATUS: Kind = Kind {
    sub_resource: Some("status"),
    ..NODE
};
pub const CONFIG_MAP: Kind = Kind {
    group: "",
    version: "v1",
    kind: "ConfigMap",
    resource: "configmaps",
    sub_resource: None,
};
pub const ELASTIC_QUOTA: Kind = Kind {
    group: "scheduling.sigs.k8s.io",
    version: "v1alpha1",
    kind: "ElasticQuota",
    resource: "elasticquotas",
    sub_resource: None,
};

/// An AdmissionReview request for `object` (and `old`, `null` when none).
pub fn admission_review(
    kind: &Kind,
    operation: &str,
    namespace: &str,
    object: Value,
    old: Value,
) -> Value {
    let mut request = json!({
        "uid": "u", "operation": operation, "userInfo": {"username": "alice"},
        "kind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
        "resource": {"group": kind.group, "version": kind.version, "resource": kind.resource},
        "name": object["metadata"]["name"].as_str().or(old["metadata"]["name"].as_str()).unwrap_or_default(),
        "object": object, "oldObject": old
    });
    if !namespace.is_empty() {
        request["namespace"] = json!(namespace);
    }
    if let Some(sub) = kind.sub_resource {
        request["subResource"] = json!(sub);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// Runs `review` with the state at `state` and returns the `response` of its output (exit 0 asserted).
pub fn review(state: &Path, path: &str, args: &[&str], request: &Value) -> Value {
    let mut child = Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
        .args([
            "review",
            "--state",
            &state.display().to_string(),
            "--path",
            path,
        ])
        .args(args)
        .args(["--request", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(request).unwrap())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout).unwrap()["response"].clone()
}

/// The message of a denied response with code 400.
pub fn denial(response: &Value) -> &str {
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["status"]["code"], 400, "{response}");
    response["status"]["message"].as_str().unwrap()
}

/// The JSON patch of an allowed response, decoded (empty when there is none).
pub fn patch(response: &Value) -> Vec<Value> {
    use base64::Engine;
    assert_eq!(response["allowed"], true, "{response}");
    match response["patch"].as_str() {
        None => Vec::new(),
        Some(p) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(p).unwrap();
            serde_json::from_slice(&bytes).unwrap()
        }
    }
}

/// Posts a quota CREATE of `quota` straight to a replica at `addr` (not through the API server,
/// which never stores it: a forged review) and asserts it was admitted into the ledger.
pub async fn forge_quota_create(addr: std::net::SocketAddr, namespace: &str, quota: Value) {
    static FORGED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let mut review = admission_review(&ELASTIC_QUOTA, "CREATE", namespace, quota, Value::Null);
    // Each forgery is a new change, as a forger would make it.
    let n = FORGED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    review["request"]["uid"] = format!("forged-{n}").into();
    let body = serde_json::to_vec(&review).unwrap();
    let mut conn = super::tls_client::connect(addr, super::tls_client::Proto::Http1)
        .await
        .unwrap();
    let (_, answer) = conn
        .post(koord_webhook::entries::VALIDATE_ELASTIC_QUOTA, body)
        .await;
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
}

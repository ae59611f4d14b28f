//! `koord-webhook review` through the real binary: its output and exit codes are a public contract.

use crate::support;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use base64::Engine;
use serde_json::Value;
use support::fixture;

fn review(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
        .arg("review")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or_default()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn state() -> String {
    fixture("state").display().to_string()
}

fn request(name: &str) -> String {
    fixture(&format!("requests/{name}")).display().to_string()
}

fn response(out: &Output) -> Value {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let review: Value = serde_json::from_slice(&out.stdout).unwrap();
    review["response"].clone()
}

#[test]
fn a_denied_request_prints_the_reason_and_exits_0() {
    let out = review(
        &[
            "--state",
            &state(),
            "--path",
            "/validate-pod",
            "--request",
            &request("validate-pod-reserve-annotation.json"),
        ],
        None,
    );
    let response = response(&out);
    assert_eq!(response["uid"], "0b4b5a48-6c8c-4b1e-9f7e-3d1c2b0a0001");
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 400);
    assert_eq!(
        response["status"]["message"],
        "annotations.scheduling.koordinator.sh/reserve-pod: Forbidden: cannot set in annotations"
    );
}

#[test]
fn an_allowed_request_with_a_patch_read_from_stdin() {
    let body = std::fs::read(request("mutate-quota-create.json")).unwrap();
    let out = review(
        &[
            "--state",
            &state(),
            "--path",
            "/mutate-scheduling-sigs-k8s-io-v1alpha1-elasticquota",
            "--request",
            "-",
        ],
        Some(&body),
    );
    let response = response(&out);
    assert_eq!(response["allowed"], true);
    let patch = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let received: Value = serde_json::from_slice(&body).unwrap();
    let mut quota = received["request"]["object"].clone();
    json_patch::patch(&mut quota, &patch).unwrap();
    // The parent's tree id is inherited and the shared weight defaults to max.
    assert_eq!(
        quota["metadata"]["labels"]["quota.scheduling.koordinator.sh/tree-id"],
        "tree-1"
    );
    assert_eq!(
        quota["metadata"]["annotations"]["quota.scheduling.koordinator.sh/shared-weight"],
        r#"{"cpu":"2","memory":"4Gi"}"#
    );
}

#[test]
fn an_allowed_request_without_changes_has_no_patch() {
    let out = review(
        &[
            "--state",
            &state(),
            "--path",
            "/validate-pod",
            "--request",
            &request("validate-pod-plain.json"),
        ],
        None,
    );
    let response = response(&out);
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none());
}

#[test]
fn a_gate_switched_off_makes_the_path_unusable() {
    let out = review(
        &[
            "--state",
            &state(),
            "--path",
            "/validate-pod",
            "--feature-gates",
            "PodValidatingWebhook=false",
            "--request",
            &request("validate-pod-plain.json"),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn unusable_input_exits_2_with_one_line() {
    let cases: Vec<(Vec<String>, &[u8], &str)> = vec![
        (
            vec![
                "--state".into(),
                state(),
                "--path".into(),
                "/validate-pod".into(),
                "--request".into(),
                "-".into(),
            ],
            b"this is not json",
            "body is not an AdmissionReview",
        ),
        (
            vec![
                "--state".into(),
                state(),
                "--path".into(),
                "/nope".into(),
                "--request".into(),
                request("validate-pod-plain.json"),
            ],
            b"",
            "no admission endpoint at /nope",
        ),
        (
            vec![
                "--state".into(),
                "/does/not/exist".into(),
                "--path".into(),
                "/validate-pod".into(),
                "--request".into(),
                request("validate-pod-plain.json"),
            ],
            b"",
            "--state: cannot read /does/not/exist",
        ),
        (
            vec![
                "--state".into(),
                state(),
                "--path".into(),
                "/validate-pod".into(),
                "--request".into(),
                "/missing.json".into(),
            ],
            b"",
            "--request: cannot read /missing.json",
        ),
        (
            vec![
                "--state".into(),
                state(),
                "--path".into(),
                "/validate-pod".into(),
                "--feature-gates".into(),
                "Bogus=true".into(),
                "--request".into(),
                request("validate-pod-plain.json"),
            ],
            b"",
            "unknown feature gate \"Bogus\"",
        ),
    ];
    for (args, stdin, expected) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = review(&args, Some(stdin));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "nothing on stdout for {args:?}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn serve_refuses_a_bad_flag_with_one_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
        .args([
            "serve",
            "--feature-gates",
            "Bogus=true",
            "--port",
            "0",
            "--metrics-bind-address",
            "0",
            "--health-bind-address",
            "0",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("koord-webhook: error: --feature-gates: unknown feature gate"),
        "{stderr}"
    );
}

/// A pod as a user has it in a file, in YAML.
const RESERVE_POD_YAML: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web-1
  namespace: team-a
  annotations:
    scheduling.koordinator.sh/reserve-pod: \"true\"
spec:
  containers:
  - name: web
    image: nginx
";

/// `review --object FILE` on /validate-pod, with `extra` flags.
fn review_object(file: &std::path::Path, extra: &[&str]) -> Output {
    let (state, file) = (state(), file.display().to_string());
    let mut args = vec![
        "--state",
        &state,
        "--path",
        "/validate-pod",
        "--object",
        &file,
    ];
    args.extend_from_slice(extra);
    review(&args, None)
}

#[test]
fn an_object_file_gets_its_review_built_and_exit_code_reports_the_denial() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pod.yaml");
    std::fs::write(&file, RESERVE_POD_YAML).unwrap();
    // Without --exit-code a denial is still an answer: exit 0, the same message as the full review.
    let denial = response(&review_object(
        &file,
        &["--user", "alice", "--group", "dev"],
    ));
    assert_eq!(denial["allowed"], false);
    assert_eq!(
        denial["status"]["message"],
        "annotations.scheduling.koordinator.sh/reserve-pod: Forbidden: cannot set in annotations"
    );
    let denied = review_object(&file, &["--exit-code"]);
    assert_eq!(denied.status.code(), Some(1), "a denial with --exit-code");
    let answer: Value = serde_json::from_slice(&denied.stdout).unwrap();
    assert_eq!(answer["response"]["allowed"], false);

    // The same pod without the annotation is allowed: exit 0 even with --exit-code.
    let plain = dir.path().join("plain.json");
    std::fs::write(
        &plain,
        r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-2", "namespace": "team-a"},
            "spec": {"containers": [{"name": "web", "image": "nginx"}]}}"#,
    )
    .unwrap();
    assert_eq!(
        response(&review_object(&plain, &["--exit-code"]))["allowed"],
        true
    );
    // A pod named by the API server (`generateName`, as every controller's) has no name yet: the
    // built review leaves it out, as the API server does, instead of writing null.
    let generated = dir.path().join("generated.json");
    std::fs::write(
        &generated,
        r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "web-", "namespace": "team-a"},
            "spec": {"containers": [{"name": "web", "image": "nginx"}]}}"#,
    )
    .unwrap();
    let out = review_object(&generated, &["--exit-code"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(response(&out)["allowed"], true);

    // The operation as AdmissionReviews and the Kubernetes docs write it, or in lower case.
    for operation in ["CREATE", "create", "Create"] {
        let out = review_object(&file, &["--operation", operation]);
        assert_eq!(out.status.code(), Some(0), "--operation {operation}");
        assert_eq!(response(&out)["allowed"], false, "--operation {operation}");
    }
    let delete = review_object(
        &file,
        &[
            "--operation",
            "DELETE",
            "--old-object",
            &file.display().to_string(),
        ],
    );
    assert_eq!(
        delete.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&delete.stderr)
    );

    // An object without kind, and --request with --object, are unusable input: exit 2, one line.
    std::fs::write(&plain, "metadata: {name: x}\n").unwrap();
    let kindless = review_object(&plain, &[]);
    assert_eq!(kindless.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&kindless.stderr);
    assert!(
        stderr.contains("apiVersion and kind") && stderr.trim().lines().count() == 1,
        "{stderr}"
    );
    assert_eq!(
        review_object(&file, &["--request", "-"]).status.code(),
        Some(2)
    );
}

//! `koord-webhook review`: answers one AdmissionReview offline with the very chain `serve` runs.
//!
//! The input is a whole AdmissionReview (`--request`), or an object (`--object`, YAML or JSON, with
//! `--old-object`, `--operation`, `--user`) around which `review` builds the AdmissionReview the API
//! server would send. Exit 0 whenever a response was produced (allowed or denied; with `--exit-code`
//! a denial exits 1), 2 with one line on stderr when the input is unusable.

use std::io::Read;

use crate::admission::Admission;
use crate::cache::load::load_state;
use serde_json::{Value, json};

use super::resolved::{OwnUserUnless, Rules};
use crate::cli::{ReviewArgs, ReviewOperation};
use crate::metrics::Metrics;

/// Input `review` cannot use; the message is the whole line printed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unusable(String);

/// Runs the review and returns the response JSON.
pub fn run(args: &ReviewArgs) -> Result<Vec<u8>, Unusable> {
    let Rules { gates, settings } = Rules::resolve(
        &args.feature_gates,
        &args.rules,
        OwnUserUnless::ServiceAccount,
    )
    .map_err(|e| Unusable(format!("{e:#}")))?;
    let cache = load_state(&args.state)
        .map_err(|e| Unusable(format!("--state: {e}")))?
        .reader();
    let body = match (&args.request, &args.object) {
        (Some(request), _) => read(request, "--request")?,
        (None, Some(object)) => build_review(args, object)?,
        // clap requires one of them.
        (None, None) => return Err(Unusable("--request or --object is required".to_owned())),
    };
    let admission = Admission::new(cache, gates, Metrics::new()).with_settings(settings);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Unusable(format!("cannot start runtime: {e}")))?;
    runtime
        .block_on(admission.review(&args.path, &body, None))
        .map_err(|e| Unusable(format!("--request: {e}")))
}

fn read(source: &str, flag: &str) -> Result<Vec<u8>, Unusable> {
    let mut body = Vec::new();
    if source == "-" {
        std::io::stdin()
            .read_to_end(&mut body)
            .map_err(|e| Unusable(format!("{flag}: cannot read standard input: {e}")))?;
    } else {
        body = std::fs::read(source)
            .map_err(|e| Unusable(format!("{flag}: cannot read {source}: {e}")))?;
    }
    Ok(body)
}

/// An object file as JSON (YAML is a superset of JSON, so one parser reads both).
fn read_object(source: &str, flag: &str) -> Result<Value, Unusable> {
    let text = read(source, flag)?;
    let object: Value = serde_yaml::from_slice(&text)
        .map_err(|e| Unusable(format!("{flag}: {source} is not YAML or JSON: {e}")))?;
    if !object.is_object() {
        return Err(Unusable(format!(
            "{flag}: {source} does not hold one object"
        )));
    }
    Ok(object)
}

/// The AdmissionReview the API server would send for this object and operation. The resource is
/// the kind's plural as Kubernetes forms it for every kind koord-webhook admits (`Pod` -> `pods`).
fn build_review(args: &ReviewArgs, object: &str) -> Result<Vec<u8>, Unusable> {
    let new = read_object(object, "--object")?;
    let old = args
        .old_object
        .as_deref()
        .map(|old| read_object(old, "--old-object"))
        .transpose()?;
    let operation = match args.operation {
        ReviewOperation::Create => "CREATE",
        ReviewOperation::Update => "UPDATE",
        ReviewOperation::Delete => "DELETE",
        ReviewOperation::Connect => "CONNECT",
    };
    let (object, old_object) = match args.operation {
        // A DELETE carries the object being deleted as its old object.
        ReviewOperation::Delete => (Value::Null, old.unwrap_or(new)),
        _ => (new, old.unwrap_or(Value::Null)),
    };
    let source = if object.is_null() {
        &old_object
    } else {
        &object
    };
    let api_version = source["apiVersion"].as_str().unwrap_or_default();
    let kind = source["kind"].as_str().unwrap_or_default();
    if api_version.is_empty() || kind.is_empty() {
        return Err(Unusable(
            "--object: the object needs apiVersion and kind".to_owned(),
        ));
    }
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = json!({"group": group, "version": version, "kind": kind});
    let gvr = json!({"group": group, "version": version,
        "resource": format!("{}s", kind.to_ascii_lowercase())});
    let mut request = json!({
        "uid": "koord-webhook-review", "kind": gvk, "resource": gvr,
        "requestKind": gvk, "requestResource": gvr,
        "operation": operation,
        "userInfo": {"username": args.user, "groups": args.groups},
        "object": object, "oldObject": old_object, "dryRun": false,
    });
    // As the API server writes them: left out when empty (a pod created with `generateName` has
    // no name yet, a cluster-scoped object no namespace).
    for field in ["name", "namespace"] {
        if let Some(value) = source["metadata"][field].as_str().filter(|v| !v.is_empty()) {
            request[field] = json!(value);
        }
    }
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": request,
    });
    serde_json::to_vec(&review).map_err(|e| Unusable(format!("--object: {e}")))
}

/// Whether a response `run` produced allows the request.
pub fn allowed(response: &[u8]) -> bool {
    serde_json::from_slice::<Value>(response)
        .is_ok_and(|r| r["response"]["allowed"] == Value::Bool(true))
}

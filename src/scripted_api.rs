//! A scripted API server for the controller's unit tests: a kube `Client` whose every request is
//! checked against the next expected step and answered from the script, so a test states exactly
//! which calls a step makes, in which order, and that it makes no others.

use std::collections::VecDeque;

use http_body_util::BodyExt;
use hyper::http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock;

/// One expected call: method, path (query excluded), and the answer.
pub struct Step {
    pub method: Method,
    pub path: String,
    pub status: StatusCode,
    pub answer: Value,
}

impl Step {
    pub fn new(method: Method, path: &str, status: StatusCode, answer: Value) -> Self {
        Self {
            method,
            path: path.to_owned(),
            status,
            answer,
        }
    }

    /// A `404 NotFound` Status, as the API server sends for a missing object.
    pub fn not_found(method: Method, path: &str) -> Self {
        Self::new(method, path, StatusCode::NOT_FOUND, status(404, "NotFound"))
    }
}

/// A Status object with `code` and `reason`.
pub fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": reason,
           "reason": reason, "code": code})
}

/// A request as the server received it.
#[derive(Debug)]
pub struct Seen {
    pub method: Method,
    pub path_and_query: String,
    pub content_type: String,
    pub body: Value,
}

/// A client, and the task that serves `script` to it; the task returns the requests it saw. It
/// fails (panics) on a request the script did not expect, and when the client is dropped with
/// steps left.
pub fn client(script: Vec<Step>) -> (Client, tokio::task::JoinHandle<Vec<Seen>>) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(async move {
        let mut handle = std::pin::pin!(handle);
        let mut script: VecDeque<Step> = script.into();
        let mut seen = Vec::new();
        while let Some((request, respond)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let request = Seen {
                method: parts.method.clone(),
                path_and_query: parts.uri.to_string(),
                content_type: parts
                    .headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned(),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            let Some(step) = script.pop_front() else {
                panic!(
                    "unexpected request: {} {}",
                    request.method, request.path_and_query
                );
            };
            assert_eq!(
                (&request.method, parts.uri.path()),
                (&step.method, step.path.as_str()),
                "request {} of the script",
                seen.len() + 1
            );
            let answer = Response::builder()
                .status(step.status)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&step.answer).unwrap()))
                .unwrap();
            respond.send_response(answer);
            seen.push(request);
        }
        assert!(
            script.is_empty(),
            "{} expected requests never came, the first: {} {}",
            script.len(),
            script[0].method,
            script[0].path
        );
        seen
    });
    (Client::new(service, "default"), server)
}

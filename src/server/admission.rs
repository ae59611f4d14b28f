//! The admission paths: method, size limit and `?timeout=` handling around [`Admission::review`].

use actix_web::http::{Method, StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use futures::StreamExt;

use super::Shared;
use crate::admission::ReviewError;
use crate::duration::parse_duration;

fn plain(status: StatusCode, message: impl Into<String>) -> HttpResponse {
    let mut body = message.into();
    body.push('\n');
    HttpResponse::build(status)
        .content_type("text/plain; charset=utf-8")
        .body(body)
}

pub async fn handle(
    req: HttpRequest,
    mut payload: web::Payload,
    shared: web::Data<Shared>,
) -> HttpResponse {
    let path = req.path();
    if super::GET_PATHS.contains(&path) {
        drain(&mut payload, shared.max_body_bytes).await;
        return HttpResponse::MethodNotAllowed()
            .insert_header((header::ALLOW, "GET"))
            .content_type("text/plain; charset=utf-8")
            .body(format!("{path} accepts GET only\n"));
    }
    if shared.admission.endpoint(path).is_none() {
        drain(&mut payload, shared.max_body_bytes).await;
        return plain(StatusCode::NOT_FOUND, format!("404 page not found: {path}"));
    }
    if req.method() != Method::POST {
        drain(&mut payload, shared.max_body_bytes).await;
        return HttpResponse::MethodNotAllowed()
            .insert_header((header::ALLOW, "POST"))
            .content_type("text/plain; charset=utf-8")
            .body(format!("{path} accepts POST only\n"));
    }

    let limit = shared.max_body_bytes;
    let too_large = || {
        plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body exceeds the limit of {limit} bytes (--max-request-bytes)"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return too_large();
    }
    let mut body = web::BytesMut::with_capacity(declared.unwrap_or(16 * 1024));
    while let Some(chunk) = payload.next().await {
        match chunk {
            Ok(chunk) if body.len() + chunk.len() > limit => return too_large(),
            Ok(chunk) => body.extend_from_slice(&chunk),
            Err(e) => {
                return plain(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read request body: {e}"),
                );
            }
        }
    }

    let api_timeout = match timeout_param(req.query_string()) {
        Ok(t) => t,
        Err(message) => return plain(StatusCode::BAD_REQUEST, message),
    };
    match shared.admission.review(path, &body, api_timeout).await {
        Ok(response) => HttpResponse::Ok()
            .content_type("application/json")
            .body(response),
        Err(ReviewError::NotFound(_)) => {
            plain(StatusCode::NOT_FOUND, format!("404 page not found: {path}"))
        }
        Err(ReviewError::Malformed(e)) => plain(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

/// Reads and drops a body we will not use, so an HTTP/1.1 connection stays reusable after an error.
async fn drain(payload: &mut web::Payload, limit: usize) {
    let mut seen = 0;
    while let Some(Ok(chunk)) = payload.next().await {
        seen += chunk.len();
        if seen > limit {
            break;
        }
    }
}

/// The API server appends `?timeout=10s` (the entry's timeoutSeconds) to every call.
fn timeout_param(query: &str) -> Result<Option<std::time::Duration>, String> {
    for pair in query.split('&') {
        if let Some(value) = pair.strip_prefix("timeout=") {
            return parse_duration(value)
                .map(Some)
                .map_err(|e| format!("bad timeout query parameter: {e}"));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn reads_the_timeout_query_parameter() {
        assert_eq!(
            timeout_param("timeout=10s"),
            Ok(Some(Duration::from_secs(10)))
        );
        assert_eq!(
            timeout_param("a=b&timeout=2500ms"),
            Ok(Some(Duration::from_millis(2500)))
        );
        assert_eq!(timeout_param(""), Ok(None));
        assert!(timeout_param("timeout=soon").is_err());
    }
}

//! One admission request over HTTP: the `?timeout=` query, the per-connection stream limit, the
//! body read within its size, time and memory limits, then [`Admission::review_at`]. Also the 404
//! and 405 answers, which read and drop the body so an HTTP/1.1 connection stays usable.
//!
//! [`Admission::review_at`]: crate::admission::Admission::review_at

use actix_web::http::{Method, StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use futures::StreamExt;

use super::limits::{BodyHold, BudgetFull, ConnectionStreams, NoRoom, decoded_estimate};
use super::shared::Shared;
use crate::admission::review::NoVerdict;
use crate::admission::{Deadline, EndpointId};
use crate::duration::parse_duration;

fn plain(status: StatusCode, message: impl Into<String>) -> HttpResponse {
    let mut body = message.into();
    body.push('\n');
    HttpResponse::build(status)
        .content_type("text/plain; charset=utf-8")
        .body(body)
}

/// Any path no route serves.
pub async fn not_found(
    req: HttpRequest,
    mut payload: web::Payload,
    shared: web::Data<Shared>,
) -> HttpResponse {
    drain(&mut payload, &shared.limits).await;
    plain(
        StatusCode::NOT_FOUND,
        format!("404 page not found: {}", req.path()),
    )
}

/// A known path asked with another method than the one it takes.
pub async fn method_not_allowed(
    req: HttpRequest,
    mut payload: web::Payload,
    shared: web::Data<Shared>,
    allowed: Method,
) -> HttpResponse {
    drain(&mut payload, &shared.limits).await;
    HttpResponse::MethodNotAllowed()
        .insert_header((header::ALLOW, allowed.as_str()))
        .content_type("text/plain; charset=utf-8")
        .body(format!("{} accepts {allowed} only\n", req.path()))
}

/// A POST to an enabled admission endpoint.
pub async fn handle(
    req: HttpRequest,
    mut payload: web::Payload,
    shared: web::Data<Shared>,
    endpoint: EndpointId,
) -> HttpResponse {
    let received = tokio::time::Instant::now();
    let api_timeout = match timeout_param(req.query_string()) {
        Ok(t) => t,
        Err(message) => {
            drain(&mut payload, &shared.limits).await;
            return plain(StatusCode::BAD_REQUEST, message);
        }
    };
    // One request at a time per HTTP/2 stream slot of this connection.
    let _stream = match req.conn_data::<ConnectionStreams>() {
        Some(streams) => match streams.0.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                return plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "too many requests in flight on this connection (at most {})",
                        shared.limits.max_streams_per_connection
                    ),
                );
            }
        },
        None => None,
    };
    let read_timeout = api_timeout.map_or(shared.limits.read_timeout, |t| {
        t.min(shared.limits.read_timeout)
    });
    let deadline = tokio::time::Instant::now() + read_timeout;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let from = req.peer_addr().map(|a| a.ip());
    let (body, held) = match read_body(&mut payload, &shared, from, declared, deadline).await {
        Ok(read) => read,
        Err(refusal) => return refusal.respond(&mut payload, &shared, deadline).await,
    };
    // The memory the review will take once decoded, from the body's shape; the body's own bytes
    // are part of it, so the read budget's hold on them ends here.
    let deadline_at = Deadline::from(received, api_timeout);
    let estimate = decoded_estimate(&body);
    let _decoding = match shared
        .decode_budget
        .take(estimate, deadline_at.instant())
        .await
    {
        Ok(permit) => permit,
        Err(NoRoom::TooLarge { estimate, budget }) => {
            return plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "decoding this review would take about {} MiB, more than the whole budget of {} MiB \
                     (--decode-memory-budget)",
                    estimate >> 20,
                    budget >> 20
                ),
            );
        }
        Err(NoRoom::Busy { budget }) => {
            return plain(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "other reviews held the decode budget of {} MiB until the deadline \
                     (--decode-memory-budget); retry",
                    budget >> 20
                ),
            );
        }
    };
    drop(held);

    match shared
        .admission
        .review_at(endpoint, &body, deadline_at)
        .await
    {
        Ok(response) => HttpResponse::Ok()
            .content_type("application/json")
            .body(response),
        Err(NoVerdict::Malformed(malformed)) => {
            plain(StatusCode::BAD_REQUEST, malformed.to_string())
        }
        // The API server applies the calling entry's failurePolicy to this.
        Err(NoVerdict::TimedOut(why)) => plain(StatusCode::GATEWAY_TIMEOUT, why),
    }
}

/// Why a body was not read whole.
enum Refusal {
    TooLarge,
    TimedOut,
    /// The caller paused longer than the idle timeout in the middle of the body.
    Stalled,
    /// The server holds its maximum of request bytes, or the caller's address its share.
    Busy(BudgetFull),
    Broken(String),
}

impl Refusal {
    async fn respond(
        self,
        payload: &mut web::Payload,
        shared: &Shared,
        deadline: tokio::time::Instant,
    ) -> HttpResponse {
        let limits = &shared.limits;
        match self {
            Refusal::TooLarge => {
                // Read the rest (and drop it) before answering: an HTTP/2 client whose stream is reset
                // while it still sends never sees the 413. Bounded by the same deadline.
                let _ = tokio::time::timeout_at(deadline, discard(payload, usize::MAX)).await;
                plain(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "request body exceeds the limit of {} bytes (--max-request-bytes)",
                        limits.max_body_bytes
                    ),
                )
            }
            Refusal::TimedOut => plain(
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive in time (--request-read-timeout, or the API \
                 server's timeout)",
            ),
            Refusal::Stalled => plain(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body stopped arriving for {:?} (--request-body-idle-timeout)",
                    limits.body_idle_timeout
                ),
            ),
            Refusal::Busy(BudgetFull::Server) => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the server holds its maximum of {} request bytes (--max-inflight-request-bytes); retry",
                    limits.max_inflight_bytes
                ),
            ),
            Refusal::Busy(BudgetFull::Address { share }) => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "requests from this client address hold its share of {share} request bytes (a \
                     quarter of --max-inflight-request-bytes); retry once they end"
                ),
            ),
            Refusal::Broken(e) => plain(
                StatusCode::BAD_REQUEST,
                format!("cannot read request body: {e}"),
            ),
        }
    }
}

/// Reads the body within the size limit, the deadline, the idle timeout between its pieces, and the
/// byte budget (the server's, and the share of the caller's address). What is returned holds the
/// body's bytes in the budget until dropped.
async fn read_body(
    payload: &mut web::Payload,
    shared: &Shared,
    from: Option<std::net::IpAddr>,
    declared: Option<usize>,
    deadline: tokio::time::Instant,
) -> Result<(web::BytesMut, Option<BodyHold>), Refusal> {
    let limit = shared.limits.max_body_bytes;
    if declared.is_some_and(|n| n > limit) {
        return Err(Refusal::TooLarge);
    }
    // One hold for all the body's bytes (merged chunk by chunk): no allocation per request.
    let mut held: Option<BodyHold> = None;
    let mut body = web::BytesMut::with_capacity(declared.unwrap_or(0).min(64 * 1024));
    loop {
        let idle_until = tokio::time::Instant::now() + shared.limits.body_idle_timeout;
        let chunk = match tokio::time::timeout_at(deadline.min(idle_until), payload.next()).await {
            Err(_elapsed) if idle_until < deadline => return Err(Refusal::Stalled),
            Err(_elapsed) => return Err(Refusal::TimedOut),
            Ok(None) => return Ok((body, held)),
            Ok(Some(Err(e))) => return Err(Refusal::Broken(e.to_string())),
            Ok(Some(Ok(chunk))) => chunk,
        };
        if body.len() + chunk.len() > limit {
            return Err(Refusal::TooLarge);
        }
        shared
            .body_budget
            .take(from, chunk.len(), &mut held)
            .map_err(Refusal::Busy)?;
        body.extend_from_slice(&chunk);
    }
}

/// Reads and drops a body we will not use, so an HTTP/1.1 connection stays reusable after an error;
/// at most the body limit, for at most the read timeout.
async fn drain(payload: &mut web::Payload, limits: &super::limits::Limits) {
    let _ =
        tokio::time::timeout(limits.read_timeout, discard(payload, limits.max_body_bytes)).await;
}

async fn discard(payload: &mut web::Payload, limit: usize) {
    let mut seen = 0usize;
    while let Some(Ok(chunk)) = payload.next().await {
        seen = seen.saturating_add(chunk.len());
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

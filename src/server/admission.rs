//! One admission request over HTTP: the `?timeout=` query, the per-connection stream limit, the
//! body read within its size, time and memory limits, then [`Admission::review_at`]. Also the 404
//! and 405 answers, sent at once without reading the body.
//!
//! [`Admission::review_at`]: crate::admission::Admission::review_at

use actix_web::http::{Method, StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use futures::StreamExt;

use super::limits::{BodyBudget, BodyHold, BudgetFull, ConnectionStreams, NoRoom};
use super::shared::Shared;
use crate::admission::review::NoVerdict;
use crate::admission::{Deadline, EndpointId};
use crate::duration::parse_duration;
use crate::memory::BodyShape;

fn plain(status: StatusCode, message: impl Into<String>) -> HttpResponse {
    let mut body = message.into();
    body.push('\n');
    HttpResponse::build(status)
        .content_type("text/plain; charset=utf-8")
        .body(body)
}

/// Any path no route serves: answered at once (see [`before_the_body`]).
pub async fn not_found(req: HttpRequest) -> HttpResponse {
    before_the_body(
        &req,
        plain(
            StatusCode::NOT_FOUND,
            format!("404 page not found: {}", req.path()),
        ),
    )
}

/// A known path asked with another method than the one it takes: answered at once.
pub async fn method_not_allowed(req: HttpRequest, allowed: Method) -> HttpResponse {
    let answer = HttpResponse::MethodNotAllowed()
        .insert_header((header::ALLOW, allowed.as_str()))
        .content_type("text/plain; charset=utf-8")
        .body(format!("{} accepts {allowed} only\n", req.path()));
    before_the_body(&req, answer)
}

/// An answer sent without reading the request's body. Waiting for a body that will not be used
/// only holds the connection (a caller could make every wrong path cost the read timeout); instead
/// the connection closes after the answer when a body was announced, so the unread bytes are never
/// taken for a next request. A request without a body keeps its connection.
fn before_the_body(req: &HttpRequest, mut answer: HttpResponse) -> HttpResponse {
    let headers = req.headers();
    let body_announced = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|n| n.as_bytes() != b"0");
    if body_announced {
        answer
            .head_mut()
            .set_connection_type(actix_http::ConnectionType::Close);
    }
    answer
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
        Err(message) => return before_the_body(&req, plain(StatusCode::BAD_REQUEST, message)),
    };
    // Within this connection's request slots (`--max-streams-per-connection`).
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
    let shape = BodyShape::of(&body);
    let estimate = shape.estimate();
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

    let review = shared
        .admission
        .review_at(endpoint, body.freeze(), shape, deadline_at);
    match crate::admission::caller::answering_for(from, review).await {
        Ok(response) => match HeldAnswer::take(response, &shared.body_budget, from) {
            Ok(answer) => HttpResponse::Ok()
                .content_type("application/json")
                .body(answer),
            Err(full) => busy(&shared.limits, full),
        },
        Err(NoVerdict::Malformed(malformed)) => {
            plain(StatusCode::BAD_REQUEST, malformed.to_string())
        }
        // The API server applies the calling entry's failurePolicy to this.
        Err(NoVerdict::TimedOut(why)) => plain(StatusCode::GATEWAY_TIMEOUT, why),
        Err(too_large @ NoVerdict::TooLarge(..)) => {
            plain(StatusCode::PAYLOAD_TOO_LARGE, too_large.to_string())
        }
    }
}

/// Why a body was not read whole.
enum Refusal {
    TooLarge,
    TimedOut,
    /// The caller paused longer than the idle timeout in the middle of the body.
    Stalled,
    /// The body arrived slower than [`MIN_UPLOAD_BYTES`] per [`UPLOAD_WINDOW`].
    TooSlow,
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
            Refusal::TooSlow => plain(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body arrived slower than {} KiB per {:?}",
                    MIN_UPLOAD_BYTES >> 10,
                    UPLOAD_WINDOW
                ),
            ),
            Refusal::Busy(full) => busy(limits, full),
            Refusal::Broken(e) => plain(
                StatusCode::BAD_REQUEST,
                format!("cannot read request body: {e}"),
            ),
        }
    }
}

/// The byte budget (the server's, or the caller's address's share) is spent.
fn busy(limits: &super::limits::Limits, full: BudgetFull) -> HttpResponse {
    match full {
        BudgetFull::Server => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the server holds its maximum of {} request bytes (--max-inflight-request-bytes); retry",
                limits.max_inflight_bytes
            ),
        ),
        BudgetFull::Address { share } => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "requests from this client address hold its share of {share} request bytes (a \
                 quarter of --max-inflight-request-bytes); retry once they end"
            ),
        ),
        BudgetFull::Reserve { per_address } => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "other client addresses hold most of --max-inflight-request-bytes; the rest is kept \
                 for addresses holding at most {per_address} request bytes; retry"
            ),
        ),
    }
}

/// Answers smaller than this are written whole at once (the connection's write buffer takes them);
/// larger ones are held in the byte budget until written.
const HELD_ANSWER_FROM: usize = 32 * 1024;
/// The pieces a large answer is handed to the connection in: the connection asks for the next
/// only when the client has read the last, so a client that reads nothing holds one piece in the
/// connection's buffer and the answer in the budget, until the write stall timeout closes it.
const ANSWER_PIECE: usize = 16 * 1024;

/// An answer whose bytes count in the byte budget (as the request's did) until the connection has
/// taken the last of them: answers held for clients that never read them are bounded with the
/// requests, not beside them.
struct HeldAnswer {
    rest: actix_web::web::Bytes,
    size: u64,
    hold: Option<BodyHold>,
}

impl HeldAnswer {
    fn take(
        answer: Vec<u8>,
        budget: &BodyBudget,
        from: Option<std::net::IpAddr>,
    ) -> Result<Self, BudgetFull> {
        let mut hold = None;
        if answer.len() >= HELD_ANSWER_FROM {
            budget.take(from, answer.len(), &mut hold)?;
        }
        Ok(Self {
            size: answer.len() as u64,
            rest: answer.into(),
            hold,
        })
    }
}

impl actix_web::body::MessageBody for HeldAnswer {
    type Error = std::convert::Infallible;

    fn size(&self) -> actix_web::body::BodySize {
        actix_web::body::BodySize::Sized(self.size)
    }

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<actix_web::web::Bytes, Self::Error>>> {
        let this = self.get_mut();
        if this.rest.is_empty() {
            this.hold = None;
            return std::task::Poll::Ready(None);
        }
        let piece = this.rest.split_to(this.rest.len().min(ANSWER_PIECE));
        if this.rest.is_empty() {
            this.hold = None;
        }
        std::task::Poll::Ready(Some(Ok(piece)))
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
    let mut last_piece = tokio::time::Instant::now();
    let mut window = UploadWindow::starting(last_piece);
    loop {
        let idle_until = last_piece + shared.limits.body_idle_timeout;
        let wake = deadline.min(idle_until).min(window.ends);
        let chunk = match tokio::time::timeout_at(wake, payload.next()).await {
            Ok(None) => return Ok((body, held)),
            Ok(Some(Err(e))) => return Err(Refusal::Broken(e.to_string())),
            Ok(Some(Ok(chunk))) => Some(chunk),
            Err(_elapsed) => None,
        };
        let now = tokio::time::Instant::now();
        match chunk {
            Some(chunk) => {
                if body.len() + chunk.len() > limit {
                    return Err(Refusal::TooLarge);
                }
                shared
                    .body_budget
                    .take(from, chunk.len(), &mut held)
                    .map_err(Refusal::Busy)?;
                body.extend_from_slice(&chunk);
                window.bytes += chunk.len();
                last_piece = now;
            }
            None if now >= deadline => return Err(Refusal::TimedOut),
            None if now >= idle_until => return Err(Refusal::Stalled),
            None => {}
        }
        window.next_if_over(now)?;
    }
}

/// The bytes a body must bring in every [`UPLOAD_WINDOW`] in which it brings any, until it ends (a
/// window with none is the idle timeout's): a caller that sends most of a body at once and then a
/// byte now and then (within the idle timeout) would otherwise hold its bytes until the read
/// deadline. The API server writes a body it holds in memory at once.
pub const MIN_UPLOAD_BYTES: usize = 64 * 1024;
pub const UPLOAD_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);

/// The bytes of a body that arrived in the current [`UPLOAD_WINDOW`].
struct UploadWindow {
    ends: tokio::time::Instant,
    bytes: usize,
}

impl UploadWindow {
    fn starting(at: tokio::time::Instant) -> Self {
        Self {
            ends: at + UPLOAD_WINDOW,
            bytes: 0,
        }
    }

    /// Once the window is over: a refusal if it brought too little, else the next window.
    fn next_if_over(&mut self, now: tokio::time::Instant) -> Result<(), Refusal> {
        if now < self.ends {
            return Ok(());
        }
        // A window with nothing in it is the idle timeout's to judge.
        if self.bytes > 0 && self.bytes < MIN_UPLOAD_BYTES {
            return Err(Refusal::TooSlow);
        }
        *self = Self::starting(now);
        Ok(())
    }
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
    use actix_web::body::MessageBody;
    use std::time::Duration;

    /// A large answer holds its bytes in the budget until the connection has taken its last piece
    /// (or drops it unread); a small one is not counted.
    #[test]
    fn a_large_answer_is_held_in_the_budget_until_written() {
        let budget = BodyBudget::new(8 << 20, 4 << 20);
        let ip = std::net::IpAddr::from([10, 0, 0, 7]);
        let small = HeldAnswer::take(vec![b'x'; 100], &budget, Some(ip)).unwrap();
        assert_eq!(budget.held_by(ip), 0);
        drop(small);
        let mut answer = HeldAnswer::take(vec![b'x'; 1 << 20], &budget, Some(ip)).unwrap();
        assert_eq!(budget.held_by(ip), 1 << 20);
        assert_eq!(answer.size(), actix_web::body::BodySize::Sized(1 << 20));
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        let mut written = 0;
        while let std::task::Poll::Ready(Some(Ok(piece))) =
            std::pin::Pin::new(&mut answer).poll_next(&mut cx)
        {
            assert!(piece.len() <= ANSWER_PIECE);
            written += piece.len();
            if written < 1 << 20 {
                assert_eq!(budget.held_by(ip), 1 << 20, "held while pieces remain");
            }
        }
        assert_eq!(written, 1 << 20);
        assert_eq!(budget.held_by(ip), 0);
        // Dropped unread (the connection closed): given back too.
        let unread = HeldAnswer::take(vec![b'x'; 5 << 20], &budget, Some(ip));
        assert!(unread.is_err(), "more than the address's share");
        let unread = HeldAnswer::take(vec![b'x'; 2 << 20], &budget, Some(ip)).unwrap();
        assert_eq!(budget.held_by(ip), 2 << 20);
        drop(unread);
        assert_eq!(budget.held_by(ip), 0);
    }

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

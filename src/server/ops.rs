//! The operations port: plain HTTP, apart from admission (as controller-runtime's
//! `--metrics-bind-address`), with `/metrics`, `/healthz`, `/readyz` and, only when enabled,
//! `/debug/elastic-quota`. Nothing here is reachable through the admission port, so whoever can
//! reach 9443 cannot read the quota tree or the metrics.
//!
//! Whoever reaches the port can hold connections on it: one address holds at most
//! [`PER_ADDRESS`], all together at most [`TOTAL`], and when all are held a connection from an
//! address that holds fewer than the busiest one ends that one's oldest (the probe listener's
//! [`FairSlots`]). A scrape, from an address that holds one connection or none, is so always
//! served at once, however many addresses hold the rest idle. Before, actix-web's
//! `max_connections` was the only total: 8 addresses × 8 idle connections filled it, and a scrape
//! waited in the listen backlog until one of theirs timed out.
//!
//! Assembled from actix-web's parts (as the admission port, `mod.rs`): `HttpServer` takes a
//! connection's slot only after accepting it, in `on_connect`, and cannot end one to make room.

use std::net::TcpListener;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_http::Protocol;
use actix_web::{App, HttpResponse, web};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use super::health;
use super::probes::{FairSlot, FairSlots};
use super::shared::Shared;
use crate::admission::elastic_quota::debug::quota_tree;
use crate::metrics::labels::KindLabels;

/// Connections one address may hold on the operations port (Prometheus keeps one per target).
pub const PER_ADDRESS: usize = 8;
/// Connections held on the operations port in all.
pub const TOTAL: usize = 64;
/// Connections actix keeps at once: more than [`TOTAL`], so that a new connection is always
/// accepted and the table decides (it is closed at once, or ends another to make room).
const ACCEPTED: usize = 4 * TOTAL;
/// A request head must arrive within this, and a connection idle this long between requests is
/// closed.
const IDLE: Duration = Duration::from_secs(5);

pub async fn metrics(shared: web::Data<Shared>) -> HttpResponse {
    let state = &shared.state;
    // The cache's sizes are read when scraped: the one place the gauge is set.
    for (kind, count) in state.cache.sizes() {
        state
            .metrics
            .cache
            .objects
            .get_or_create(&KindLabels { kind })
            .set(count as i64);
    }
    HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(state.metrics.encode())
}

pub async fn debug_elastic_quota(shared: web::Data<Shared>) -> HttpResponse {
    HttpResponse::Ok().json(quota_tree(&shared.state.cache.topology()))
}

/// Builds the operations server on a bound listener; the caller awaits (or spawns) it.
///
/// Each accepted connection takes its address's slot ([`FairSlots`]: refused, it is closed at
/// once), then is served HTTP/1.1 until it closes, idles [`IDLE`], or is ended to make room.
pub fn build(
    listener: TcpListener,
    shared: Arc<Shared>,
    debug: bool,
) -> std::io::Result<actix_web::dev::Server> {
    use actix_service::{ServiceFactoryExt as _, fn_service, map_config};
    use actix_web::rt::net::TcpStream;

    let data = web::Data::from(shared);
    let held = FairSlots::new(PER_ADDRESS, TOTAL);
    let builder = actix_server::Server::build();
    let stopping = builder.graceful_shutdown_signal();
    Ok(builder
        .workers(1)
        .max_concurrent_connections(ACCEPTED)
        .shutdown_timeout(super::shutdown::IN_FLIGHT_TIMEOUT.as_secs())
        .disable_signals()
        .listen("koord-webhook-operations", listener, move || {
            let held = held.clone();
            let slot = fn_service(move |io: TcpStream| {
                let held = held.clone();
                async move {
                    let peer = io.peer_addr().map_err(|_| ())?;
                    let (slot, ended) = held.take(peer.ip()).ok_or(())?;
                    let io = Evictable {
                        io,
                        ended: Some(ended),
                        _slot: slot,
                    };
                    Ok::<_, ()>((io, Protocol::Http1, Some(peer)))
                }
            });
            let stopping = stopping.clone();
            let http = actix_http::HttpService::build()
                .keep_alive(IDLE)
                .client_request_timeout(IDLE)
                .client_disconnect_timeout(Duration::from_secs(1))
                .graceful_shutdown_signal(move || {
                    let stopping = stopping.clone();
                    async move { stopping.notified().await }
                })
                .finish(map_config(routes(data.clone(), debug), |()| {
                    actix_web::dev::AppConfig::default()
                }));
            slot.and_then(http.map_err(|_| ()))
        })?
        .run())
}

fn routes(
    data: web::Data<Shared>,
    debug: bool,
) -> App<
    impl actix_web::dev::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    let app = App::new()
        .app_data(data)
        .route("/metrics", web::get().to(metrics))
        .route("/healthz", web::get().to(health::healthz))
        .route("/readyz", web::get().to(health::readyz));
    if debug {
        app.route("/debug/elastic-quota", web::get().to(debug_elastic_quota))
    } else {
        app
    }
}

/// A connection with its slot: once the table ends it to make room, it reads as closed by the
/// peer and takes no more writes, so actix drops it (and the slot) at once, idle or not.
struct Evictable<T> {
    io: T,
    /// Resolves when the table ends the connection; `None` once it has.
    ended: Option<oneshot::Receiver<()>>,
    _slot: FairSlot,
}

impl<T> Evictable<T> {
    /// Whether the connection was ended to make room (registers `cx` to learn it otherwise).
    fn ended(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(ended) = &mut self.ended else {
            return true;
        };
        if Pin::new(ended).poll(cx).is_ready() {
            self.ended = None;
            return true;
        }
        false
    }
}

fn ended_error() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "ended to make room for another address",
    )
}

impl<T: AsyncRead + Unpin> AsyncRead for Evictable<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.ended(cx) {
            // The end of the stream: the dispatcher closes the connection.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Evictable<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.ended(cx) {
            return Poll::Ready(Err(ended_error()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.ended(cx) {
            return Poll::Ready(Err(ended_error()));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.ended(cx) {
            return Poll::Ready(Err(ended_error()));
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, SocketAddr};
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::admission::Admission;
    use crate::cache::Cache;
    use crate::features::FeatureGates;
    use crate::state::State;
    use crate::tls::CertResolver;

    /// The operations server on a free loopback port.
    fn start() -> (SocketAddr, actix_web::dev::ServerHandle) {
        let state = Arc::new(State::new(Cache::empty(), Arc::new(CertResolver::new())));
        let admission = Admission::new(
            state.cache.clone(),
            FeatureGates::default(),
            state.metrics.clone(),
        );
        let shared = Arc::new(Shared::new(state, admission, Default::default()));
        let listener = super::super::listen(([127, 0, 0, 1], 0).into()).unwrap();
        let addr = listener.local_addr().unwrap();
        let server = build(listener, shared, false).unwrap();
        let handle = server.handle();
        tokio::spawn(server);
        (addr, handle)
    }

    async fn from(ip: [u8; 4], to: SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((IpAddr::from(ip), 0).into()).unwrap();
        socket.connect(to).await.unwrap()
    }

    /// `GET path` from `ip` on a new connection: the answer's head and body, or `None` when none
    /// came within `within`.
    async fn get(ip: [u8; 4], to: SocketAddr, path: &str, within: Duration) -> Option<String> {
        let ask = async {
            let mut conn = from(ip, to).await;
            let request = format!("GET {path} HTTP/1.1\r\nHost: pod\r\nConnection: close\r\n\r\n");
            conn.write_all(request.as_bytes()).await.ok()?;
            let mut answer = Vec::new();
            conn.read_to_end(&mut answer).await.ok()?;
            Some(String::from_utf8_lossy(&answer).into_owned())
        };
        tokio::time::timeout(within, ask).await.ok().flatten()
    }

    /// Eight addresses hold eight idle connections each (every one the port keeps): a scrape from
    /// another address is still answered at once, having ended one of theirs. Before, it waited in
    /// the listen backlog until one of theirs idled out (5 s).
    #[tokio::test]
    async fn idle_connections_from_many_addresses_leave_a_slot_for_a_scrape() {
        let (addr, server) = start();
        assert!(
            get([127, 0, 0, 1], addr, "/metrics", Duration::from_secs(5))
                .await
                .is_some_and(|a| a.starts_with("HTTP/1.1 200 OK")),
            "the port serves"
        );
        let mut idle = Vec::new();
        for a in 2..=9 {
            for _ in 0..PER_ADDRESS {
                idle.push(from([127, 0, 0, a], addr).await);
            }
        }
        // The server has taken them all (a slot each).
        tokio::time::sleep(Duration::from_millis(300)).await;

        let start = Instant::now();
        let scrape = get([127, 0, 0, 1], addr, "/metrics", Duration::from_secs(1)).await;
        let took = start.elapsed();
        let scrape = scrape.unwrap_or_else(|| panic!("no answer to a scrape within {took:?}"));
        assert!(scrape.starts_with("HTTP/1.1 200 OK"), "{scrape:?}");
        assert!(scrape.contains("# EOF"), "{scrape:?}");
        // And again, with the idle connections still held.
        let again = get([127, 0, 0, 1], addr, "/healthz", Duration::from_secs(1)).await;
        assert!(
            again.is_some_and(|a| a.starts_with("HTTP/1.1 200 OK")),
            "a second request within 1 s"
        );
        drop(idle);
        server.stop(false).await;
    }

    /// One address holds at most eight: its ninth is closed at once, unanswered, and the eight
    /// still hold their slots.
    #[tokio::test]
    async fn one_address_holds_at_most_eight() {
        let (addr, server) = start();
        let mut held = Vec::new();
        for _ in 0..PER_ADDRESS {
            held.push(from([127, 0, 0, 2], addr).await);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut ninth = from([127, 0, 0, 2], addr).await;
        let _ = ninth
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: pod\r\n\r\n")
            .await;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(2), ninth.read_to_end(&mut answer));
        assert!(
            matches!(read.await, Ok(Ok(0) | Err(_))),
            "the ninth is closed unanswered: {answer:?}"
        );
        // One of the eight asks: it is served.
        held[0]
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: pod\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(2), held[0].read_to_end(&mut answer));
        assert!(read.await.is_ok());
        assert!(answer.starts_with(b"HTTP/1.1 200 OK"), "{answer:?}");
        server.stop(false).await;
    }
}

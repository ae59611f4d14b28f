//! The HTTPS server: actix-web over rustls, admission paths plus health and readiness; and the
//! plain-HTTP operations server (`ops.rs`: metrics, health, debug).

mod admission;
mod drain;
pub mod health;
pub mod limits;
pub mod ops;
pub mod per_address;
pub mod probes;
mod shared;
pub mod shutdown;

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::Method;
use actix_web::{App, web};

use crate::tls::{self, TlsError};
use actix_http::Protocol;
use actix_tls::accept::rustls_0_23::TlsStream;
use limits::ConnectionStreams;
pub use limits::{DEFAULT_MAX_BODY_BYTES, Limits};
use per_address::{Held, PerAddress};
pub use shared::Shared;

/// Connections waiting to be accepted. std's `bind` asks for 128, which a reconnecting caller fills:
/// the API server's new connections then wait in SYN retries. The kernel caps it at
/// `net.core.somaxconn` (4096 by default).
pub const LISTEN_BACKLOG: i32 = 4096;

/// A TLS handshake must end within this. actix-tls holds at most 256 handshakes per worker at once
/// and gives each 3 s by default: a caller that opens connections and never finishes them kept
/// everyone else's waiting. The API server's handshake takes milliseconds.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);

/// TLS handshakes one client address may have in progress at once; a connection over it waits for
/// one of its address's to end (at most [`TLS_HANDSHAKE_TIMEOUT`], then it is closed), before any
/// TLS work. A handshake costs the server a key exchange and holds one of actix-tls's
/// 256 handshake places per worker for up to [`TLS_HANDSHAKE_TIMEOUT`]: without this, a few
/// addresses opening connections made everyone else's handshakes wait seconds. The API server
/// opens a handful at a time.
pub const HANDSHAKES_PER_ADDRESS: usize = 8;

/// A listener on `addr` with [`LISTEN_BACKLOG`] (address reuse as std's `bind` sets it).
pub fn listen(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// The API server keeps idle webhook connections for 90 s; closing ours sooner causes intermittent
/// "failed calling webhook" errors when it reuses one we just closed.
pub const KEEP_ALIVE: Duration = Duration::from_secs(150);

/// A path that takes one method; the others get 405 with an `Allow` header.
fn only(path: &'static str, method: Method) -> actix_web::Resource {
    web::resource(path).default_service(web::to(move |req| {
        admission::method_not_allowed(req, method.clone())
    }))
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot listen: {0}")]
    Io(#[from] std::io::Error),
}

/// The admission routes: the kubelet's probes, then one POST route per enabled endpoint; any other
/// method on a known path is a 405 naming the one it takes, any other path a 404. Metrics and
/// debug views are on the operations port only (`ops.rs`).
fn routes(
    data: web::Data<Shared>,
    endpoints: Vec<(crate::admission::EndpointId, &'static str)>,
) -> App<
    impl actix_web::dev::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    let state = data.state.clone();
    let mut app = App::new()
        .wrap_fn(move |req, service| drain::close_when_draining(&state.draining, req, service))
        .app_data(data)
        .service(only("/healthz", Method::GET).route(web::get().to(health::healthz)))
        .service(only("/readyz", Method::GET).route(web::get().to(health::readyz)));
    for (endpoint, path) in endpoints {
        app =
            app.service(only(path, Method::POST).route(web::post().to(
                move |req, payload, shared| admission::handle(req, payload, shared, endpoint),
            )));
    }
    app.default_service(web::to(admission::not_found))
}

/// Builds the server on an already bound listener; the caller awaits (or spawns) it.
///
/// Each accepted connection goes through, in order: its address's slots (`per_address.rs`: one of
/// its connections, closed at once over the cap, and a turn among its handshakes in progress:
/// before any TLS work, so one caller's reconnects cannot queue everyone else's handshakes), the TLS handshake (within [`TLS_HANDSHAKE_TIMEOUT`]), then HTTP/1.1. This is what actix-web's `HttpServer::listen_rustls_0_23` assembles, with
/// the slot in front of the handshake instead of after it (its `on_connect` runs after).
pub fn build(
    listener: TcpListener,
    shared: Arc<Shared>,
) -> Result<actix_web::dev::Server, ServerError> {
    use actix_service::{ServiceFactoryExt as _, fn_service, map_config};
    use actix_web::rt::net::TcpStream;

    let mut tls = tls::server_config(shared.state.resolver.clone(), shared.client_ca.clone())?;
    // HTTP/1.1 only: the API server calls webhooks over HTTP/1.1 (its webhook client offers
    // `http/1.1` alone by ALPN), and HTTP/2 as actix-http serves it has no limit on streams or on
    // header lists (one connection opening 200,000 streams took 620 MiB). A client offering only
    // `h2` is refused in the handshake.
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let limits = shared.limits.clone();
    let workers = limits.workers.max(1);
    let streams = limits.max_streams_per_connection.max(1);
    let endpoints: Vec<_> = shared.admission.paths().collect();
    let held = PerAddress::new(limits.max_connections_per_address);
    let handshakes = PerAddress::new(HANDSHAKES_PER_ADDRESS);
    let data = web::Data::from(shared);
    let builder = actix_server::Server::build();
    let stopping = builder.graceful_shutdown_signal();
    let server = builder
        .workers(workers)
        // Per worker in actix.
        .max_concurrent_connections(limits.max_connections.div_ceil(workers))
        .shutdown_timeout(shutdown::IN_FLIGHT_TIMEOUT.as_secs())
        // `serve` handles SIGTERM itself (`shutdown.rs`): drain first, then stop.
        .disable_signals()
        .listen("koord-webhook-admission", listener, move || {
            let (held, handshakes) = (held.clone(), handshakes.clone());
            let slot = fn_service(move |io: TcpStream| {
                let (held, handshakes) = (held.clone(), handshakes.clone());
                async move {
                    let ip = io.peer_addr().map_err(|_| ())?.ip();
                    let slot = held.take(ip).ok_or(())?;
                    // Over its address's handshakes in progress, a connection waits its turn
                    // (its own address's only), within the handshake timeout.
                    let turn_until = tokio::time::Instant::now() + TLS_HANDSHAKE_TIMEOUT;
                    let handshake = handshakes.take_waiting(ip, turn_until).await.ok_or(())?;
                    let _ = io.set_nodelay(true);
                    Ok::<_, ()>(Held::new(io, slot).handshaking(handshake))
                }
            });
            let mut handshake = actix_tls::accept::rustls_0_23::Acceptor::new(tls.clone());
            handshake.set_handshake_timeout(TLS_HANDSHAKE_TIMEOUT);
            let protocol = fn_service(|mut io: TlsStream<Held<TcpStream>>| async move {
                io.get_mut().0.handshaken();
                let peer = io.get_ref().0.peer_addr();
                Ok::<_, ()>((io, Protocol::Http1, peer))
            });
            let stopping = stopping.clone();
            let http = actix_http::HttpService::build()
                .keep_alive(KEEP_ALIVE)
                // Headers (and an HTTP/2 handshake) must arrive within this.
                .client_request_timeout(Duration::from_secs(5))
                .client_disconnect_timeout(Duration::from_secs(1))
                .graceful_shutdown_signal(move || {
                    let stopping = stopping.clone();
                    async move { stopping.notified().await }
                })
                .on_connect_ext(move |_: &TlsStream<Held<TcpStream>>, data| {
                    data.insert(ConnectionStreams(Arc::new(tokio::sync::Semaphore::new(
                        streams,
                    ))));
                })
                .finish(map_config(routes(data.clone(), endpoints.clone()), |()| {
                    actix_web::dev::AppConfig::default()
                }));
            slot.and_then(handshake.map_err(|_| ()).map_init_err(|()| ()))
                .and_then(protocol)
                .and_then(http.map_err(|_| ()))
        })?
        .run();
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 300 connections wait unaccepted on the admission listener: each completes its handshake
    /// with the kernel at once (with std's backlog of 128, the 130th waits in SYN retries).
    #[tokio::test]
    async fn the_listen_backlog_holds_a_reconnecting_callers_connections() {
        let listener = listen(([127, 0, 0, 1], 0).into()).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut waiting = Vec::new();
        for i in 0..300 {
            let connected = tokio::time::timeout(
                Duration::from_millis(500),
                tokio::net::TcpStream::connect(addr),
            )
            .await;
            assert!(
                matches!(connected, Ok(Ok(_))),
                "connection {i} waited: {connected:?}"
            );
            waiting.push(connected);
        }
        drop(listener);
    }
}

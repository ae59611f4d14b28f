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

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::Method;
use actix_web::{App, HttpServer, web};

use crate::tls::{self, TlsError};
use actix_tls::accept::rustls_0_23::TlsStream;
use limits::ConnectionStreams;
pub use limits::{DEFAULT_MAX_BODY_BYTES, Limits};
use per_address::PerAddress;
pub use shared::Shared;

/// Connections waiting to be accepted. std's `bind` asks for 128, which a reconnecting caller fills:
/// the API server's new connections then wait in SYN retries. The kernel caps it at
/// `net.core.somaxconn` (4096 by default).
pub const LISTEN_BACKLOG: i32 = 4096;

/// A TLS handshake must end within this. actix-tls holds at most 256 handshakes per worker at once
/// and gives each 3 s by default: a caller that opens connections and never finishes them kept
/// everyone else's waiting. The API server's handshake takes milliseconds.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);

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
    web::resource(path).default_service(web::to(move |req, payload, shared| {
        admission::method_not_allowed(req, payload, shared, method.clone())
    }))
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot listen: {0}")]
    Io(#[from] std::io::Error),
}

/// Builds the server on an already bound listener; the caller awaits (or spawns) it.
pub fn build(
    listener: TcpListener,
    shared: Arc<Shared>,
) -> Result<actix_web::dev::Server, ServerError> {
    let tls = tls::server_config(shared.state.resolver.clone(), shared.client_ca.clone())?;
    let limits = shared.limits.clone();
    let workers = limits.workers.max(1);
    let streams = limits.max_streams_per_connection.max(1);
    let endpoints: Vec<_> = shared.admission.paths().collect();
    let held = PerAddress::new(limits.max_connections_per_address);
    let data = web::Data::from(shared);
    let server = HttpServer::new(move || {
        // The kubelet's probes, then one POST route per enabled endpoint; any other method on a
        // known path is a 405 naming the one it takes, any other path a 404. Metrics and debug
        // views are on the operations port only (`ops.rs`).
        let state = data.state.clone();
        let mut app = App::new()
            .wrap_fn(move |req, service| drain::close_when_draining(&state.draining, req, service))
            .wrap_fn(per_address::refuse_when_full)
            .app_data(data.clone())
            .service(only("/healthz", Method::GET).route(web::get().to(health::healthz)))
            .service(only("/readyz", Method::GET).route(web::get().to(health::readyz)));
        for &(endpoint, path) in &endpoints {
            app = app.service(only(path, Method::POST).route(web::post().to(
                move |req, payload, shared| admission::handle(req, payload, shared, endpoint),
            )));
        }
        app.default_service(web::to(admission::not_found))
    })
    .on_connect(move |io, data| {
        data.insert(ConnectionStreams(Arc::new(tokio::sync::Semaphore::new(
            streams,
        ))));
        let tcp = io
            .downcast_ref::<TlsStream<actix_web::rt::net::TcpStream>>()
            .map(|tls| tls.get_ref().0);
        per_address::on_connect(&held, tcp, data);
    })
    .workers(workers)
    // Per worker in actix.
    .max_connections(limits.max_connections.div_ceil(workers))
    // Headers (and an HTTP/2 handshake) must arrive within this.
    .client_request_timeout(Duration::from_secs(5))
    .tls_handshake_timeout(TLS_HANDSHAKE_TIMEOUT)
    .keep_alive(KEEP_ALIVE)
    .tcp_nodelay(true)
    .shutdown_timeout(10)
    // `serve` handles SIGTERM itself: drain first, then stop.
    .disable_signals()
    .listen_rustls_0_23(listener, tls)?
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

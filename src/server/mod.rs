//! The HTTPS server: actix-web over rustls, admission paths plus health, readiness, metrics and debug.

mod admission;
pub mod health;
mod ops;

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{App, HttpServer, web};

use crate::admission::Admission;
use crate::tls::{self, CertResolver, TlsError};
pub use health::Readiness;

/// The API server may send a 3 MiB object twice (an UPDATE): 8 MiB leaves room for the envelope.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// The API server keeps idle webhook connections for 90 s; closing ours sooner causes intermittent
/// "failed calling webhook" errors when it reuses one we just closed.
pub const KEEP_ALIVE: Duration = Duration::from_secs(150);

/// The non-admission paths; any other method on them gets 405.
const GET_PATHS: &[&str] = &["/healthz", "/readyz", "/metrics", "/debug/elastic-quota"];

/// What the request handlers share.
pub struct Shared {
    pub admission: Admission,
    pub readiness: Readiness,
    pub resolver: Arc<CertResolver>,
    pub max_body_bytes: usize,
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
    let tls = tls::server_config(shared.resolver.clone())?;
    let data = web::Data::from(shared);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .route("/healthz", web::get().to(health::healthz))
            .route("/readyz", web::get().to(health::readyz))
            .route("/metrics", web::get().to(ops::metrics))
            .route(
                "/debug/elastic-quota",
                web::get().to(ops::debug_elastic_quota),
            )
            .default_service(web::to(admission::handle))
    })
    .keep_alive(KEEP_ALIVE)
    .tcp_nodelay(true)
    .shutdown_timeout(10)
    // `serve` handles SIGTERM itself: drain first, then stop.
    .disable_signals()
    .listen_rustls_0_23(listener, tls)?
    .run();
    Ok(server)
}

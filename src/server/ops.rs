//! The operations port: plain HTTP, apart from admission (as controller-runtime's
//! `--metrics-bind-address`), with `/metrics`, `/healthz`, `/readyz` and, only when enabled,
//! `/debug/elastic-quota`. Nothing here is reachable through the admission port, so whoever can
//! reach 9443 cannot read the quota tree or the metrics.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{App, HttpResponse, HttpServer, web};

use super::health;
use super::per_address::{self, PerAddress};
use super::shared::Shared;

/// Connections one address may hold on the operations port (Prometheus keeps one per target).
const PER_ADDRESS: usize = 8;
use crate::admission::elastic_quota::debug::quota_tree;
use crate::metrics::labels::KindLabels;

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
pub fn build(
    listener: TcpListener,
    shared: Arc<Shared>,
    debug: bool,
) -> std::io::Result<actix_web::dev::Server> {
    let data = web::Data::from(shared);
    let held = PerAddress::new(PER_ADDRESS);
    Ok(HttpServer::new(move || {
        let app = App::new()
            .wrap_fn(per_address::refuse_when_full)
            .app_data(data.clone())
            .route("/metrics", web::get().to(metrics))
            .route("/healthz", web::get().to(health::healthz))
            .route("/readyz", web::get().to(health::readyz));
        if debug {
            app.route("/debug/elastic-quota", web::get().to(debug_elastic_quota))
        } else {
            app
        }
    })
    .on_connect(move |io, data| {
        let tcp = io.downcast_ref::<actix_web::rt::net::TcpStream>();
        per_address::on_connect(&held, tcp, data);
    })
    .workers(1)
    .max_connections(64)
    // A request head within 5 s, and a connection idle 5 s between requests is closed.
    .client_request_timeout(Duration::from_secs(5))
    .keep_alive(Duration::from_secs(5))
    .shutdown_timeout(super::shutdown::IN_FLIGHT_TIMEOUT.as_secs())
    .disable_signals()
    .listen(listener)?
    .run())
}

//! `/healthz` and `/readyz` on the operations port (the probes' own listener answers the same:
//! `probes.rs`).

use actix_web::{HttpResponse, web};

use super::probes::answer;
use super::shared::Shared;

fn respond((status, body): (u16, String)) -> HttpResponse {
    let status = actix_web::http::StatusCode::from_u16(status)
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    HttpResponse::build(status)
        .content_type("text/plain")
        .body(body)
}

pub async fn healthz(shared: web::Data<Shared>) -> HttpResponse {
    respond(answer(&shared.state, "/healthz"))
}

pub async fn readyz(shared: web::Data<Shared>) -> HttpResponse {
    respond(answer(&shared.state, "/readyz"))
}

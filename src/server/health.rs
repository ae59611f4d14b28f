//! `/healthz` and `/readyz`.

use actix_web::{HttpResponse, web};

use super::Shared;

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

pub async fn readyz(shared: web::Data<Shared>) -> HttpResponse {
    let mut reasons = shared.state.readiness.reasons();
    if !shared.state.resolver.is_loaded() {
        reasons.push("certificate: no serving certificate loaded".to_owned());
    }
    if reasons.is_empty() {
        HttpResponse::Ok().content_type("text/plain").body("ok\n")
    } else {
        HttpResponse::ServiceUnavailable()
            .content_type("text/plain")
            .body(reasons.join("\n") + "\n")
    }
}

//! `/metrics` and `/debug/elastic-quota`.

use actix_web::{HttpResponse, web};

use super::Shared;
use crate::admission::elastic_quota::debug::quota_tree;
use crate::metrics::KindLabels;

pub async fn metrics(shared: web::Data<Shared>) -> HttpResponse {
    let admission = &shared.admission;
    for (kind, count) in admission.cache().sizes() {
        admission
            .metrics()
            .cache_objects
            .get_or_create(&KindLabels { kind })
            .set(count as i64);
    }
    HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(admission.metrics().encode())
}

pub async fn debug_elastic_quota(shared: web::Data<Shared>) -> HttpResponse {
    HttpResponse::Ok().json(quota_tree(&shared.admission.cache().topology()))
}

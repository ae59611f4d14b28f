//! `/healthz` and `/readyz`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use actix_web::{HttpResponse, web};

use super::Shared;

/// Named conditions that must all hold for `/readyz` to answer 200.
#[derive(Default)]
pub struct Readiness {
    failing: Mutex<BTreeMap<&'static str, String>>,
}

impl Readiness {
    pub fn set_ready(&self, check: &'static str) {
        self.lock().remove(check);
    }

    pub fn set_not_ready(&self, check: &'static str, reason: impl Into<String>) {
        self.lock().insert(check, reason.into());
    }

    /// The reasons it is not ready, one per failing condition.
    pub fn reasons(&self) -> Vec<String> {
        self.lock()
            .iter()
            .map(|(check, reason)| format!("{check}: {reason}"))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, String>> {
        self.failing.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

pub async fn readyz(shared: web::Data<Shared>) -> HttpResponse {
    let mut reasons = shared.readiness.reasons();
    if !shared.resolver.is_loaded() {
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

//! Process state: what the admission server, the operations server and the operator all read or
//! write. `serve` builds it once (the tests build theirs the same way) and hands each part an `Arc`;
//! every part keeps its own logic, and only what is shared lives here.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::cache::Cache;
use crate::metrics::Metrics;
use crate::tls::CertResolver;

pub struct State {
    /// The cluster as the rules read it (the watches own the write side).
    pub cache: Cache,
    /// One registry for every part; `/metrics` on the operations port encodes it.
    pub metrics: Metrics,
    /// What keeps `/readyz` from answering 200: the cache not synced, the certificate, shutdown.
    pub readiness: Readiness,
    /// The certificate the admission server presents; the operator swaps it.
    pub resolver: Arc<CertResolver>,
    /// Set on SIGTERM: the admission server still answers, and closes each connection after it.
    pub draining: Draining,
}

impl State {
    pub fn new(cache: Cache, resolver: Arc<CertResolver>) -> Self {
        Self {
            cache,
            metrics: Metrics::new(),
            readiness: Readiness::default(),
            resolver,
            draining: Draining::default(),
        }
    }
}

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

/// Whether this replica has been told to stop. Only ever set: a replica does not come back.
#[derive(Default)]
pub struct Draining(AtomicBool);

impl Draining {
    pub fn start(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn started(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

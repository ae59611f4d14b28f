//! Where quota evaluation reads and writes an ElasticQuota: the API server in cluster mode, memory in
//! tests. A small trait so the evaluation logic is testable without a cluster.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::BoxFuture;

use crate::apis::ElasticQuota;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Someone else changed the quota since it was read (optimistic concurrency).
    #[error("the quota was modified concurrently")]
    Conflict,
    #[error("elastic quota {0} not found")]
    NotFound(String),
    #[error("{0}")]
    Other(String),
}

pub trait QuotaStore: Send + Sync {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ElasticQuota, StoreError>>;
    /// Replaces the quota if its resourceVersion is still current.
    fn replace<'a>(
        &'a self,
        quota: &'a ElasticQuota,
    ) -> BoxFuture<'a, Result<ElasticQuota, StoreError>>;
}

/// An in-memory store with resourceVersion checks, for tests and benchmarks.
#[derive(Default)]
pub struct MemoryQuotaStore {
    quotas: Mutex<HashMap<(String, String), ElasticQuota>>,
    writes: AtomicUsize,
    /// The next N replaces fail with a conflict, as a concurrent writer would cause.
    pub inject_conflicts: AtomicUsize,
}

fn key(quota: &ElasticQuota) -> (String, String) {
    (
        quota.metadata.namespace.clone().unwrap_or_default(),
        quota.metadata.name.clone().unwrap_or_default(),
    )
}

impl MemoryQuotaStore {
    pub fn insert(&self, mut quota: ElasticQuota) {
        quota
            .metadata
            .resource_version
            .get_or_insert_with(|| "1".to_owned());
        self.quotas.lock().unwrap().insert(key(&quota), quota);
    }

    pub fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }

    pub fn current(&self, namespace: &str, name: &str) -> Option<ElasticQuota> {
        self.quotas
            .lock()
            .unwrap()
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }
}

impl QuotaStore for MemoryQuotaStore {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ElasticQuota, StoreError>> {
        let found = self
            .current(namespace, name)
            .ok_or_else(|| StoreError::NotFound(name.to_owned()));
        Box::pin(std::future::ready(found))
    }

    fn replace<'a>(
        &'a self,
        quota: &'a ElasticQuota,
    ) -> BoxFuture<'a, Result<ElasticQuota, StoreError>> {
        let result = (|| {
            let conflicts = self.inject_conflicts.load(Ordering::SeqCst);
            if conflicts > 0 {
                self.inject_conflicts.store(conflicts - 1, Ordering::SeqCst);
                return Err(StoreError::Conflict);
            }
            let mut quotas = self.quotas.lock().unwrap();
            let stored = quotas
                .get_mut(&key(quota))
                .ok_or_else(|| StoreError::NotFound(key(quota).1))?;
            if stored.metadata.resource_version != quota.metadata.resource_version {
                return Err(StoreError::Conflict);
            }
            let version: u64 = stored
                .metadata
                .resource_version
                .as_deref()
                .unwrap_or("0")
                .parse()
                .unwrap_or(0);
            let mut written = quota.clone();
            written.metadata.resource_version = Some((version + 1).to_string());
            *stored = written.clone();
            self.writes.fetch_add(1, Ordering::SeqCst);
            Ok(written)
        })();
        Box::pin(std::future::ready(result))
    }
}

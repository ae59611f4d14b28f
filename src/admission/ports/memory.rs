//! In-memory implementations of the ports, with the same concurrency rules as the API server
//! (resourceVersion checks), for tests and benchmarks.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use std::collections::BTreeMap;

use futures::future::BoxFuture;

use super::contracts::{
    Dice, LedgerRecord, LedgerStore, PendingChange, ProvenCallers, QuotaStore, StoreError,
};
use crate::apis::ElasticQuota;

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

/// The record in memory, with versions, for tests.
#[derive(Default)]
pub struct MemoryLedgerStore {
    record: std::sync::Mutex<(u64, BTreeMap<String, PendingChange>, ProvenCallers)>,
}

impl LedgerStore for MemoryLedgerStore {
    fn read(&self) -> BoxFuture<'_, Result<LedgerRecord, StoreError>> {
        let (version, last, proven) = self.record.lock().unwrap().clone();
        Box::pin(std::future::ready(Ok(LedgerRecord {
            version: version.to_string(),
            last,
            proven,
        })))
    }

    fn write<'a>(
        &'a self,
        version: &'a str,
        last: &'a BTreeMap<String, PendingChange>,
        proven: &'a ProvenCallers,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        let mut record = self.record.lock().unwrap();
        let result = if record.0.to_string() == version {
            *record = (record.0 + 1, last.clone(), proven.clone());
            Ok(record.0.to_string())
        } else {
            Err(StoreError::Conflict)
        };
        Box::pin(std::future::ready(result))
    }

    fn write_proven<'a>(
        &'a self,
        proven: &'a ProvenCallers,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let mut record = self.record.lock().unwrap();
        record.0 += 1;
        record.2 = proven.clone();
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Always the same roll (tests, demos).
pub struct FixedDice(pub u32);

impl Dice for FixedDice {
    fn roll_percent(&self) -> u32 {
        self.0
    }
}

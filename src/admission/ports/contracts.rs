//! The ports' traits and the types they carry (`mod.rs` says what the ports are for).

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::apis::ElasticQuota;
use crate::entries::narrowing::pod::{PodEntry, Reach};

/// Why a store call failed.
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

/// A refusal a shadowed rule would have given (`--rule-action`), as reported outside the response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WouldDeny {
    pub rule: &'static str,
    /// The request's namespace (empty for cluster-scoped objects).
    pub namespace: String,
    pub kind: String,
    pub name: String,
    pub message: String,
}

/// Where shadowed refusals are reported besides the metrics and the log (`--would-deny-events`).
pub trait FindingSink: Send + Sync {
    /// Called on the request path: must not wait (a full queue drops the report).
    fn would_deny(&self, finding: WouldDeny);
}

/// Where quota evaluation reads and writes an ElasticQuota's `child-request`.
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

/// The last admitted change, as the record holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingChange {
    /// The admission request's uid: what tells two changes of the same quota apart.
    pub id: String,
    pub namespace: String,
    pub name: String,
    pub operation: ChangeKind,
    /// On UPDATE, the resourceVersion of the object before the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// When the admitting replica recorded it (Unix seconds): old entries leave the record.
    #[serde(default)]
    pub at: i64,
    /// Who sent the review (the peer's address, as the admitting replica saw it): a caller none of
    /// whose changes ever shows is not waited for (`ledger/callers.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeKind {
    Create,
    Update,
    Delete,
}

/// The record: the last admitted change per key (a quota tree, a bound namespace; and the
/// record's one key older replicas read), the callers proven to be the API server, and the version
/// a conditional write must name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LedgerRecord {
    pub version: String,
    pub last: std::collections::BTreeMap<String, PendingChange>,
    /// The addresses a replica's probe was answered from (`ledger/probe.rs`), each with when it
    /// was last: what every replica reading the record knows the API server by.
    pub proven: ProvenCallers,
}

/// Callers proven to be the API server, as the record keeps them: address -> when it was last
/// proven (Unix seconds).
pub type ProvenCallers = std::collections::BTreeMap<String, i64>;

pub use crate::tls::ProbeSecret;

/// Where the probe secret comes from: the serving pair loaded now (the TLS resolver).
pub trait ProbeSecrets: Send + Sync {
    fn current(&self) -> Option<ProbeSecret>;
}

/// Where the record lives: a ConfigMap in cluster mode, memory in tests.
pub trait LedgerStore: Send + Sync {
    fn read(&self) -> BoxFuture<'_, Result<LedgerRecord, StoreError>>;
    /// Replaces the record's entries with `last` and its proven callers with `proven` if its
    /// version is still `version` ([`StoreError::Conflict`] otherwise); returns the record's new
    /// version.
    fn write<'a>(
        &'a self,
        version: &'a str,
        last: &'a std::collections::BTreeMap<String, PendingChange>,
        proven: &'a ProvenCallers,
    ) -> BoxFuture<'a, Result<String, StoreError>>;
    /// Replaces the record's proven callers whatever its version, its entries unchanged (a proof
    /// published: `ledger/probe.rs`). By default a conditional write, tried again after a
    /// conflict a few times.
    fn write_proven<'a>(
        &'a self,
        proven: &'a ProvenCallers,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut last = StoreError::Conflict;
            for _ in 0..4 {
                let record = self.read().await?;
                match self.write(&record.version, &record.last, proven).await {
                    Ok(_) => return Ok(()),
                    Err(e) => last = e,
                }
            }
            Err(last)
        })
    }
}

/// Where a replica makes a narrowed pod entry cover a change before allowing it (the webhook
/// configurations in cluster mode, memory in tests; docs/narrowing.md).
pub trait PodReachGuard: Send + Sync {
    /// Returns once the entry is sent every request `needed` names, and the API server acts on it.
    fn cover<'a>(
        &'a self,
        entry: PodEntry,
        needed: &'a Reach,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// A roll in [0, 99].
pub trait Dice: Send + Sync {
    fn roll_percent(&self) -> u32;
}

/// The operating system's randomness.
pub struct SystemDice;

impl Dice for SystemDice {
    fn roll_percent(&self) -> u32 {
        let mut bytes = [0u8; 4];
        // The system source does not fail on Linux; if it did, 0 applies the profile.
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
        u32::from_le_bytes(bytes) % 100
    }
}

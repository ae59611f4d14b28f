//! One ElasticQuota change admitted at a time, across every replica.
//!
//! Each replica checks the tree rules against its own cache, so two sibling creates that land on two
//! replicas would both pass the min-sum check. The ledger serialises them through the API server, the
//! way the API server's own ResourceQuota admission serialises on the quota object's
//! resourceVersion: one shared record (a ConfigMap in cluster mode) names the last admitted change,
//! and a replica may admit the next one only
//! 1. once that change is visible in its own cache (the watch has delivered it, and with it every
//!    change before it), or has been pending so long ([`PENDING_TIMEOUT`], on this replica's clock)
//!    that it will not happen (denied by a later admission step, or its request timed out);
//! 2. after checking the rules against that cache; and
//! 3. by replacing the record with its own change, conditional on the record's version it read. Two
//!    replicas that both passed step 2 cannot both win step 3: the loser reads again and checks
//!    against a cache that now holds the winner's change.
//!
//! A request that waits longer than [`MAX_WAIT`] gets a retryable denial (429), never a wrong
//! admission. Dry runs change nothing and skip the ledger.

use std::sync::Arc;
use std::time::Duration;

use kube::core::admission::Operation;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use crate::admission::outcome::Rejection;
use crate::admission::ports::{ChangeKind, LedgerStore, PendingChange, StoreError};
use crate::apis::ElasticQuota;
use crate::cache::Cache;

/// After this long (on the local clock, from when this replica first saw it) a change still not in
/// the cache is taken as not happening. Longer than the API server's webhook timeout (10 s).
pub const PENDING_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest a request waits for the changes before it; then a retryable denial.
pub const MAX_WAIT: Duration = Duration::from_secs(5);
/// How often a waiting request looks at its cache again.
pub const POLL: Duration = Duration::from_millis(10);

/// The ledger as admission uses it: the store, and this replica's own serialisation.
pub struct Ledger {
    store: Arc<dyn LedgerStore>,
    /// One quota change at a time per replica (so only replicas race on the record), with the
    /// last record's id and when this replica first saw it.
    local: tokio::sync::Mutex<Option<(String, Instant)>>,
    /// Timeout of each call to the store.
    call_timeout: Duration,
}

impl Ledger {
    pub fn new(store: Arc<dyn LedgerStore>) -> Self {
        Self {
            store,
            local: tokio::sync::Mutex::new(None),
            call_timeout: Duration::from_secs(2),
        }
    }

    /// Admits one change: waits for the previous one, runs `check` against the cache, records the
    /// change. `check` returns what to apply locally once the change is recorded.
    pub async fn admit<A>(
        &self,
        change: PendingChange,
        cache: &Cache,
        mut check: impl FnMut() -> Result<A, Rejection>,
    ) -> Result<A, Rejection> {
        let started = Instant::now();
        let mut seen = self.local.lock().await;
        loop {
            let record = self
                .call(self.store.read())
                .await
                .map_err(|e| unavailable(&e.to_string()))?;
            if let Some(last) = record.last.as_ref().filter(|l| l.id != change.id) {
                let first_seen = match &*seen {
                    Some((id, at)) if *id == last.id => *at,
                    _ => {
                        let now = Instant::now();
                        *seen = Some((last.id.clone(), now));
                        now
                    }
                };
                while !visible(last, cache) && first_seen.elapsed() < PENDING_TIMEOUT {
                    if started.elapsed() >= MAX_WAIT {
                        return Err(busy(last));
                    }
                    tokio::time::sleep(POLL).await;
                }
            }
            let applied = check()?;
            match self.call(self.store.write(&record.version, &change)).await {
                Ok(()) => {
                    *seen = Some((change.id.clone(), Instant::now()));
                    return Ok(applied);
                }
                // Another replica recorded a change since we read: wait for it and check again.
                Err(StoreError::Conflict) => {
                    if started.elapsed() >= MAX_WAIT {
                        return Err(busy(record.last.as_ref().unwrap_or(&change)));
                    }
                }
                Err(e) => return Err(unavailable(&e.to_string())),
            }
        }
    }

    /// A store call bounded by the call timeout.
    async fn call<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.call_timeout, call)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Other(
                    "the API server did not answer in time".to_owned(),
                ))
            })
    }
}

/// The change a request makes, as the ledger records it; `None` for what changes nothing.
pub fn change_of(
    uid: &str,
    operation: &Operation,
    object: Option<&ElasticQuota>,
    old: Option<&ElasticQuota>,
) -> Option<PendingChange> {
    let (kind, quota) = match operation {
        Operation::Create => (ChangeKind::Create, object?),
        Operation::Update => (ChangeKind::Update, old.or(object)?),
        Operation::Delete => (ChangeKind::Delete, old?),
        Operation::Connect => return None,
    };
    Some(PendingChange {
        id: uid.to_owned(),
        namespace: quota.metadata.namespace.clone().unwrap_or_default(),
        name: quota.metadata.name.clone().unwrap_or_default(),
        operation: kind,
        resource_version: match kind {
            ChangeKind::Update => quota.metadata.resource_version.clone(),
            _ => None,
        },
    })
}

/// Whether `change` has reached the cache: created, updated past the version it changed, or gone.
pub fn visible(change: &PendingChange, cache: &Cache) -> bool {
    let current = cache
        .elastic_quotas
        .get(&ObjectRef::new(&change.name).within(&change.namespace));
    match change.operation {
        ChangeKind::Create => current.is_some(),
        ChangeKind::Update => {
            current.is_none_or(|q| q.metadata.resource_version != change.resource_version)
        }
        ChangeKind::Delete => current.is_none_or(|q| q.metadata.deletion_timestamp.is_some()),
    }
}

fn busy(last: &PendingChange) -> Rejection {
    Rejection {
        code: 429,
        message: format!(
            "another ElasticQuota change ({}/{}) is still being admitted; retry in a few seconds",
            last.namespace, last.name
        ),
    }
}

fn unavailable(why: &str) -> Rejection {
    Rejection {
        code: 503,
        message: format!(
            "cannot serialise ElasticQuota changes through the API server ({why}); retry"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::ports::LedgerRecord;
    use crate::admission::ports::memory::MemoryLedgerStore;
    use crate::cache::{CacheWriter, CachedObject};
    use futures::future::BoxFuture;

    fn quota(name: &str, version: &str) -> ElasticQuota {
        let mut q: ElasticQuota = serde_json::from_value(serde_json::json!({
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": version},
            "spec": {"max": {"cpu": "1"}}}))
        .unwrap();
        q.metadata.uid = Some(format!("uid-{name}"));
        q
    }

    fn create(id: &str, name: &str) -> PendingChange {
        change_of(id, &Operation::Create, Some(&quota(name, "1")), None).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_change_waits_until_the_last_one_is_in_the_cache() {
        let mut writer = CacheWriter::default();
        let cache = writer.reader();
        let store = Arc::new(MemoryLedgerStore::default());
        let a = Ledger::new(store.clone());
        let b = Ledger::new(store.clone());
        // Replica a admits "first"; replica b's next change must wait for it.
        let checks = std::sync::atomic::AtomicUsize::new(0);
        a.admit(create("1", "first"), &cache, || Ok(()))
            .await
            .unwrap();
        let waiting = b.admit(create("2", "second"), &cache, || {
            checks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        let mut waiting = std::pin::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), &mut waiting)
                .await
                .is_err(),
            "b must not check before the first change is visible"
        );
        assert_eq!(checks.load(std::sync::atomic::Ordering::SeqCst), 0);
        writer.apply(CachedObject::ElasticQuota(quota("first", "7")));
        waiting.await.unwrap();
        assert_eq!(checks.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(store.read().await.unwrap().last.unwrap().name, "second");
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_that_never_arrives_blocks_for_a_bounded_time() {
        let cache = CacheWriter::default().reader();
        let store = Arc::new(MemoryLedgerStore::default());
        let a = Ledger::new(store.clone());
        let b = Ledger::new(store);
        a.admit(create("1", "lost"), &cache, || Ok(()))
            .await
            .unwrap();
        // Within MAX_WAIT: a retryable denial naming the change waited for.
        let denied = b
            .admit(create("2", "next"), &cache, || Ok(()))
            .await
            .unwrap_err();
        assert_eq!(denied.code, 429);
        assert!(denied.message.contains("ns/lost"), "{}", denied.message);
        // After PENDING_TIMEOUT on b's clock the lost change no longer blocks.
        tokio::time::advance(PENDING_TIMEOUT).await;
        b.admit(create("3", "next"), &cache, || Ok(()))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_losing_writer_checks_again() {
        // The store conflicts once, as when another replica wrote between our read and write.
        struct ConflictOnce(MemoryLedgerStore, std::sync::atomic::AtomicBool);
        impl LedgerStore for ConflictOnce {
            fn read(&self) -> BoxFuture<'_, Result<LedgerRecord, StoreError>> {
                self.0.read()
            }
            fn write<'a>(
                &'a self,
                version: &'a str,
                change: &'a PendingChange,
            ) -> BoxFuture<'a, Result<(), StoreError>> {
                if self.1.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    return Box::pin(std::future::ready(Err(StoreError::Conflict)));
                }
                self.0.write(version, change)
            }
        }
        let cache = CacheWriter::default().reader();
        let ledger = Ledger::new(Arc::new(ConflictOnce(
            MemoryLedgerStore::default(),
            true.into(),
        )));
        let mut checks = 0;
        ledger
            .admit(create("1", "q"), &cache, || {
                checks += 1;
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(checks, 2);
        // A rule that fails is the answer, and nothing is recorded.
        let store = Arc::new(MemoryLedgerStore::default());
        let ledger = Ledger::new(store.clone());
        let denied = ledger
            .admit(create("2", "r"), &cache, || -> Result<(), _> {
                Err(Rejection::invalid("min sum exceeds the parent"))
            })
            .await
            .unwrap_err();
        assert_eq!(denied.code, 400);
        assert_eq!(store.read().await.unwrap().last, None);
    }

    #[test]
    fn changes_become_visible_by_kind() {
        let mut writer = CacheWriter::default();
        let cache = writer.reader();
        let update = change_of(
            "u",
            &Operation::Update,
            Some(&quota("q", "5")),
            Some(&quota("q", "5")),
        )
        .unwrap();
        let delete = change_of("d", &Operation::Delete, None, Some(&quota("q", "6"))).unwrap();
        assert!(!visible(&create("c", "q"), &cache));
        assert!(visible(&delete, &cache));
        writer.apply(CachedObject::ElasticQuota(quota("q", "5")));
        assert!(visible(&create("c", "q"), &cache));
        assert!(!visible(&update, &cache), "still at the version it changed");
        assert!(!visible(&delete, &cache));
        writer.apply(CachedObject::ElasticQuota(quota("q", "6")));
        assert!(visible(&update, &cache));
    }
}

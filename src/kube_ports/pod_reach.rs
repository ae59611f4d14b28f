//! Widening a narrowed pod entry from an admitting replica: the webhook configuration is read,
//! [`admit_plan`] says what to write (the entry's conditions removed, or only the record stamped),
//! and the write is conditional on the resourceVersion read, so it cannot undo a leader's write it
//! did not see (or be undone by one: the leader's writes are conditional too).

use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

use super::errors::store_error;
use crate::admission::ports::{PodReachGuard, StoreError};
use crate::entries::narrowing::pod::{PodEntry, Reach};
use crate::entries::narrowing::record::{EntryState, admit_plan, now_ms};
use crate::names::{FIELD_MANAGER, MUTATING_CONFIGURATION, VALIDATING_CONFIGURATION};

/// Attempts when other writers keep changing the configuration in between.
const ATTEMPTS: usize = 5;
/// Timeout of each call to the API server.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

pub struct KubePodReachGuard {
    pub client: Client,
    /// An entry this replica found (or made) covering a reach this recently is taken as covering
    /// it still, and an entry stamped this recently is not stamped again: an admission writes the
    /// configuration at most once per this long per entry, however many reviews (a forged profile
    /// review every millisecond included) ask for it. A quarter of the narrowing hold, so the hold
    /// is renewed well before it runs out.
    pub fresh_for: Duration,
    recent: std::sync::Mutex<Vec<(PodEntry, tokio::time::Instant, Reach)>>,
}

impl KubePodReachGuard {
    pub fn new(client: Client, fresh_for: Duration) -> Self {
        Self {
            client,
            fresh_for,
            recent: std::sync::Mutex::default(),
        }
    }

    /// The guard of a replica whose leader narrows after `narrow_hold` (`--narrow-hold`): fresh
    /// for a quarter of it.
    pub fn for_hold(client: Client, narrow_hold: Duration) -> Self {
        Self::new(client, narrow_hold / 4)
    }

    /// Whether this replica covered `needed` on `entry` less than `fresh_for` ago.
    fn covered_recently(&self, entry: PodEntry, needed: &Reach) -> bool {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.iter().any(|(e, at, reach)| {
            *e == entry && at.elapsed() < self.fresh_for && reach.covers(needed)
        })
    }

    fn remember(&self, entry: PodEntry, reach: &Reach) {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.retain(|(e, at, _)| *e != entry && at.elapsed() < self.fresh_for);
        recent.push((entry, tokio::time::Instant::now(), reach.clone()));
    }
}

async fn timed<T>(
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .map_err(|_| {
            StoreError::Other(format!("the API server did not answer in {CALL_TIMEOUT:?}"))
        })?
        .map_err(store_error)
}

/// One read-plan-write round on configuration `name`; the time to wait after it.
async fn attempt<K>(
    client: &Client,
    name: &str,
    entry: PodEntry,
    needed: &Reach,
    fresh_for: Option<Duration>,
) -> Result<Duration, StoreError>
where
    K: kube::Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let Some(configuration) = timed(api.get_opt(name)).await? else {
        // Not installed: the API server sends nothing, so nothing can be missed.
        return Ok(Duration::ZERO);
    };
    let json =
        serde_json::to_value(&configuration).map_err(|e| StoreError::Other(e.to_string()))?;
    let state = EntryState::read(&json, entry);
    let now = now_ms();
    if let (Some(fresh), Some(written), Some(record)) = (fresh_for, state.written(), &state.record)
        && written.covers(needed)
        && now.saturating_sub(record.touched_ms) < fresh.as_millis() as u64
    {
        return Ok(Duration::ZERO);
    }
    let Some((ops, wait)) = admit_plan(&state, entry, needed, now) else {
        return Ok(Duration::ZERO);
    };
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(ops)).map_err(|e| StoreError::Other(e.to_string()))?;
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    timed(api.patch(name, &params, &Patch::<()>::Json(patch))).await?;
    Ok(wait)
}

impl PodReachGuard for KubePodReachGuard {
    fn cover<'a>(
        &'a self,
        entry: PodEntry,
        needed: &'a Reach,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            if self.covered_recently(entry, needed) {
                return Ok(());
            }
            self.cover_unless_fresh(entry, needed, Some(self.fresh_for))
                .await?;
            self.remember(entry, needed);
            Ok(())
        })
    }
}

impl KubePodReachGuard {
    /// [`PodReachGuard::cover`]; with `fresh_for`, nothing is written when the entry covers
    /// `needed` and was stamped less than that long ago (a keeper renewing its stamp).
    pub async fn cover_unless_fresh(
        &self,
        entry: PodEntry,
        needed: &Reach,
        fresh_for: Option<Duration>,
    ) -> Result<(), StoreError> {
        let mut last = StoreError::Conflict;
        for _ in 0..ATTEMPTS {
            let result = match entry {
                PodEntry::Create => {
                    attempt::<MutatingWebhookConfiguration>(
                        &self.client,
                        MUTATING_CONFIGURATION,
                        entry,
                        needed,
                        fresh_for,
                    )
                    .await
                }
                PodEntry::Validate => {
                    attempt::<ValidatingWebhookConfiguration>(
                        &self.client,
                        VALIDATING_CONFIGURATION,
                        entry,
                        needed,
                        fresh_for,
                    )
                    .await
                }
            };
            match result {
                Ok(wait) => {
                    tokio::time::sleep(wait).await;
                    return Ok(());
                }
                Err(StoreError::Conflict) => last = StoreError::Conflict,
                Err(other) => return Err(other),
            }
        }
        Err(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripted_api::{self, Step};
    use hyper::http::Method;

    const PATH: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/koordinator-mutating-webhook-configuration";

    /// Reviews that ask for what this replica covered a moment ago cost no call to the API server:
    /// a burst of forged profile reviews no longer reads (and stamps) the configuration each time.
    #[tokio::test]
    async fn a_reach_covered_a_moment_ago_is_not_read_or_written_again() {
        let (client, server) = scripted_api::client(vec![
            Step::not_found(Method::GET, PATH),
            Step::not_found(Method::GET, PATH),
        ]);
        let guard = KubePodReachGuard::new(client, Duration::from_secs(30));
        let some = Reach::Only(["ns-a".to_owned()].into());
        for _ in 0..100 {
            guard.cover(PodEntry::Create, &some).await.unwrap();
        }
        // A wider reach than the one covered is checked again.
        guard.cover(PodEntry::Create, &Reach::Every).await.unwrap();
        guard.cover(PodEntry::Create, &some).await.unwrap();
        drop(guard);
        let seen = server.await.unwrap();
        assert_eq!(
            seen.len(),
            2,
            "{:?}",
            seen.iter().map(|s| &s.path_and_query).collect::<Vec<_>>()
        );
    }
}
